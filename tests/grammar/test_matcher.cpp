// Token-level matching: the fast mask equals simulation of every token, token splits of one string
// are accepted identically, clones roll back, EOG only where the grammar can end.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "grammar/grammar.h"
#include "tok_testutil.h"

using namespace pg::grammar;

namespace {

const char* kSchema = R"({"type":"object","properties":{
  "name":{"type":"string","maxLength":12},
  "age":{"type":"integer","minimum":0,"maximum":150},
  "tags":{"type":"array","items":{"enum":["a","b c","d\"e"]},"maxItems":3},
  "nested":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":["boolean","null"]}},"required":["x"]},
  "note":{"type":"string","pattern":"^[a-z]+-[0-9]{2}$"}},
  "required":["name","age"]})";

// A random segmentation of s into vocabulary pieces (any token whose piece is a prefix of the rest);
// empty when s cannot be covered.
std::vector<int32_t> random_split(const Vocab& v, const std::string& s, std::mt19937_64& rng) {
  std::vector<int32_t> out;
  size_t i = 0;
  while (i < s.size()) {
    std::vector<std::pair<int32_t, size_t>> cands;
    uint32_t node = 0;
    for (size_t k = i; k < s.size(); ++k) {
      const auto& nd = v.nodes_[node];
      uint32_t next = UINT32_MAX;
      for (uint32_t e = 0; e < nd.n_edges; ++e) {
        if (v.edges_[nd.first_edge + e].byte == static_cast<uint8_t>(s[k])) next = v.edges_[nd.first_edge + e].child;
      }
      if (next == UINT32_MAX) break;
      node = next;
      for (uint32_t t = 0; t < v.nodes_[node].n_tokens; ++t) cands.push_back({v.token_at_[v.nodes_[node].first_token + t], k + 1 - i});
    }
    if (cands.empty()) return {};
    auto c = cands[std::uniform_int_distribution<size_t>(0, cands.size() - 1)(rng)];
    out.push_back(c.first);
    i += c.second;
  }
  return out;
}

struct Fixture {
  std::shared_ptr<const Grammar> g;
  std::shared_ptr<const Vocab> v;
};

Fixture make(const std::string& vocab_rel) {
  const auto& tok = pg::test::cached_vocab(vocab_rel);
  return {Grammar::parse(json_schema_to_gbnf(kSchema)), Vocab::from_tokenizer(tok)};
}

}  // namespace

TEST(Matcher, MaskEqualsBruteForceAlongSampledPaths) {
  auto f = make("testdata/models/stories260K.gguf");
  ASSERT_EQ(f.v->n_vocab(), 512);
  std::mt19937_64 rng(7);
  size_t steps = 0, compared_invalid = 0;
  for (int inst = 0; inst < 30; ++inst) {
    std::string s;
    ASSERT_TRUE(f.g->sample(rng, s));
    auto toks = random_split(*f.v, s, rng);
    if (toks.empty()) continue;  // a byte the 512-token vocabulary cannot spell
    Matcher m(f.g, f.v);
    for (size_t k = 0; k <= toks.size(); ++k) {
      TokenMask fast, brute;
      m.allowed_tokens(fast);
      m.allowed_tokens_brute(brute);
      ASSERT_EQ(fast, brute) << "instance " << s << " step " << k;
      ++steps;
      if (k == toks.size()) break;
      ASSERT_TRUE(mask_test(fast, toks[k])) << s;
      ASSERT_TRUE(m.accept_token(toks[k]));
    }
    EXPECT_TRUE(m.can_end()) << s;
    // Also a state reached by a wrong token: a rejected token leaves the state unchanged.
    Matcher m2(f.g, f.v);
    TokenMask before, after;
    m2.allowed_tokens(before);
    for (int32_t t = 0; t < f.v->n_vocab(); ++t) {
      if (!mask_test(before, t)) {
        EXPECT_FALSE(m2.accept_token(t));
        ++compared_invalid;
      }
    }
    m2.allowed_tokens(after);
    EXPECT_EQ(before, after);
  }
  EXPECT_GT(steps, 300u);
  EXPECT_GT(compared_invalid, 1000u);
}

TEST(Matcher, MaskEqualsBruteForceOnLargeVocab) {
  // A 32 000-token SentencePiece vocabulary (byte tokens, ▁ pieces): fewer steps, same check.
  auto f = make("testdata/tokenizer/ggml-vocab-llama-spm.gguf");
  std::mt19937_64 rng(11);
  size_t steps = 0;
  for (int inst = 0; inst < 3; ++inst) {
    std::string s;
    ASSERT_TRUE(f.g->sample(rng, s));
    auto toks = random_split(*f.v, s, rng);
    ASSERT_FALSE(toks.empty()) << s;
    Matcher m(f.g, f.v);
    for (size_t k = 0; k < toks.size(); k += 1) {
      if (k % 3 == 0) {
        TokenMask fast, brute;
        m.allowed_tokens(fast);
        m.allowed_tokens_brute(brute);
        ASSERT_EQ(fast, brute) << s << " step " << k;
        ++steps;
      }
      ASSERT_TRUE(m.accept_token(toks[k]));
    }
  }
  EXPECT_GT(steps, 10u);
}

TEST(Matcher, TokenSplitsAcceptIdentically) {
  auto f = make("testdata/tokenizer/ggml-vocab-llama-spm.gguf");
  std::mt19937_64 rng(3);
  int valid = 0, invalid = 0;
  for (int inst = 0; inst < 40; ++inst) {
    std::string s;
    ASSERT_TRUE(f.g->sample(rng, s));
    std::string bad = s;
    bad[std::uniform_int_distribution<size_t>(0, bad.size() - 1)(rng)] = static_cast<char>("x}\"]0,"[inst % 6]);
    for (const std::string* str : {&s, &bad}) {
      Matcher whole(f.g, f.v);
      bool ok_bytes = whole.accept_bytes(*str) && whole.can_end();
      if (str == &s) {
        EXPECT_TRUE(ok_bytes) << s;
      }
      for (int split = 0; split < 8; ++split) {
        auto toks = random_split(*f.v, *str, rng);
        ASSERT_FALSE(toks.empty());
        Matcher m(f.g, f.v);
        bool ok = true;
        for (int32_t t : toks) ok = ok && m.accept_token(t);
        ok = ok && m.can_end();
        EXPECT_EQ(ok, ok_bytes) << *str << " split " << split;
      }
      (ok_bytes ? valid : invalid)++;
    }
  }
  EXPECT_GE(valid, 40);
  EXPECT_GT(invalid, 10);
}

TEST(Matcher, CloneRollsBackAndEogOnlyAtEnd) {
  const auto& tok = pg::test::cached_vocab("testdata/models/stories260K.gguf");
  auto v = Vocab::from_tokenizer(tok);
  auto g = Grammar::parse("root ::= \"ab\" [c]?\n");
  Matcher m(g, v);
  TokenMask mask;
  m.allowed_tokens(mask);
  for (int32_t e : tok.eog_ids()) EXPECT_FALSE(mask_test(mask, e));
  Matcher snap = m.clone();
  ASSERT_TRUE(m.accept_bytes("ab"));
  EXPECT_TRUE(m.can_end());
  m.allowed_tokens(mask);
  for (int32_t e : tok.eog_ids()) EXPECT_TRUE(mask_test(mask, e));
  EXPECT_FALSE(m.accept_bytes("d"));  // rejected: unchanged
  EXPECT_TRUE(m.can_end());
  ASSERT_TRUE(m.accept_token(tok.eos()));
  EXPECT_TRUE(m.done());
  EXPECT_FALSE(m.accept_bytes("c"));
  // The snapshot is untouched.
  EXPECT_FALSE(snap.can_end());
  EXPECT_TRUE(snap.accept_bytes("abc"));
  EXPECT_THROW(snap.accept_token(100000), pg::Error);
}
