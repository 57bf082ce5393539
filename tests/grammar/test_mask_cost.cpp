// Per-step cost of the allowed-token mask on a 151 936-token vocabulary (Qwen3's), for JSON-schema
// grammars of several nesting depths, along tokenized sampled instances: the first instance of each
// grammar starts with a cold window cache, the later ones reuse it (as a server reusing the compiled
// grammar across requests would). Prints median / p99; fails if the warm median is not well under a
// millisecond.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "grammar/grammar.h"
#include "tok_testutil.h"

using namespace pg::grammar;

namespace {

std::string nested_schema(int depth) {
  std::string leaf = R"({"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"},"ok":{"type":"boolean"},"tags":{"type":"array","items":{"type":"string"}}},"required":["id","name"]})";
  for (int d = 1; d < depth; ++d) {
    leaf = R"({"type":"object","properties":{"title":{"type":"string"},"n":{"type":"number"},"child":)" + leaf +
           R"(,"kind":{"enum":["alpha","beta","gamma"]}},"required":["title","child"]})";
  }
  return leaf;
}

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

TEST(MaskCost, QwenVocabularyJsonSchemaDepths) {
  const auto& tok = pg::test::cached_vocab("testdata/tokenizer/ggml-vocab-qwen3.gguf");
  auto vocab = Vocab::from_tokenizer(tok);
  std::printf("vocab %d tokens, trie %zu nodes\n", vocab->n_vocab(), vocab->n_trie_nodes());
  ASSERT_GE(vocab->n_vocab(), 151000);
  std::mt19937_64 rng(5);
  double worst_warm_median = 0;
  for (int depth : {1, 3, 6}) {
    auto g = Grammar::parse(json_schema_to_gbnf(nested_schema(depth)));
    Matcher proto(g, vocab);
    std::vector<double> cold, warm, acc;
    int slow_shown = 0;
    for (int inst = 0; inst < 6; ++inst) {
      std::string s;
      ASSERT_TRUE(g->sample(rng, s, 10));
      auto ids = tok.encode(s, false, false);
      Matcher m = proto.clone();
      TokenMask mask;
      for (size_t k = 0; k < ids.size(); ++k) {
        auto t0 = std::chrono::steady_clock::now();
        m.allowed_tokens(mask);
        auto t1 = std::chrono::steady_clock::now();
        ASSERT_TRUE(mask_test(mask, ids[k])) << s << " token " << k;
        ASSERT_TRUE(m.accept_token(ids[k]));
        auto t2 = std::chrono::steady_clock::now();
        const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        (inst == 0 ? cold : warm).push_back(ms);
        if (inst > 0 && ms > 2.0 && ++slow_shown <= 3) {
          std::vector<int32_t> prefix(ids.begin(), ids.begin() + static_cast<long>(k));
          std::printf("  slow warm step (%.2f ms, %zu stacks) after %zu tokens: %s\n", ms, m.n_stacks(), k, nlohmann::json(tok.decode(prefix).substr(0, 200)).dump().c_str());
        }
        acc.push_back(std::chrono::duration<double, std::milli>(t2 - t1).count());
      }
      ASSERT_TRUE(m.can_end());
    }
    auto st = proto.cache_stats();
    std::printf("depth %d: %zu cold steps median %.3f ms p99 %.3f ms | %zu warm steps median %.3f ms p99 %.3f ms max %.3f ms | accept median %.4f ms | cache %llu hits %llu misses\n",
                depth, cold.size(), pct(cold, 0.5), pct(cold, 0.99), warm.size(), pct(warm, 0.5), pct(warm, 0.99), pct(warm, 1.0),
                pct(acc, 0.5), static_cast<unsigned long long>(st.hits), static_cast<unsigned long long>(st.misses));
    worst_warm_median = std::max(worst_warm_median, pct(warm, 0.5));
  }
  EXPECT_LT(worst_warm_median, 1.0);

  // The worst case, a cache miss inside a JSON string (nearly every token is allowed, so the walk
  // visits nearly the whole trie): a fresh matcher (empty cache) each time.
  auto g = Grammar::parse(json_schema_to_gbnf(nested_schema(3)));
  std::vector<double> miss;
  for (int r = 0; r < 21; ++r) {
    Matcher m(g, vocab);
    ASSERT_TRUE(m.accept_bytes("{\"title\":\"ab"));
    TokenMask mask;
    auto t0 = std::chrono::steady_clock::now();
    m.allowed_tokens(mask);
    miss.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    size_t n = 0;
    for (int32_t t = 0; t < vocab->n_vocab(); ++t) n += mask_test(mask, t);
    if (r == 0) std::printf("string state: %zu tokens allowed\n", n);
  }
  std::printf("cache miss inside a string: median %.3f ms, min %.3f ms\n", pct(miss, 0.5), pct(miss, 0.0));
}
