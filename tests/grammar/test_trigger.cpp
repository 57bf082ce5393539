// Lazy-grammar triggers (grammar/trigger.*): where the grammar starts for each kind (llama.cpp's
// semantics), words and patterns split across tokens, pattern_full against the whole text, token
// triggers, the regex subset and its refusals, and the incremental watch agreeing with a re-scan of
// the whole text (std::regex, ECMAScript) after every token on random texts.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <regex>

#include "core/error.h"
#include "grammar/trigger.h"

namespace pg::grammar {
namespace {

using K = TriggerSpec::Kind;

TriggerSpec word(std::string w) { return {K::Word, std::move(w), -1}; }
TriggerSpec pat(std::string p) { return {K::Pattern, std::move(p), -1}; }
TriggerSpec full(std::string p) { return {K::PatternFull, std::move(p), -1}; }
TriggerSpec tok(int32_t id) { return {K::Token, "", id}; }

// Feeds pieces (token ids 1000 + index, never a trigger token unless given); returns {token index
// that fired, start offset} or {-1, npos}.
std::pair<int, size_t> run(std::vector<TriggerSpec> specs, const std::vector<std::string>& pieces, std::vector<int32_t> ids = {}) {
  TriggerWatch w(Triggers::compile(std::move(specs)));
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int32_t id = i < ids.size() ? ids[i] : static_cast<int32_t>(1000 + i);
    const size_t at = w.push(id, pieces[i]);
    if (at != TriggerWatch::npos) {
      EXPECT_TRUE(w.fired());
      EXPECT_EQ(w.push(7, "more"), TriggerWatch::npos);  // done: nothing fires twice
      return {static_cast<int>(i), at};
    }
  }
  EXPECT_FALSE(w.fired());
  return {-1, TriggerWatch::npos};
}

TEST(Trigger, WordSplitAcrossTokensStartsAtTheWord) {
  // "<tool_call>" over three tokens; the grammar starts at '<' (offset 9 of "I'll call<tool_call>").
  auto r = run({word("<tool_call>")}, {"I'll call", "<tool", "_ca", "ll>\n{"});
  EXPECT_EQ(r.first, 3);
  EXPECT_EQ(r.second, 9u);
  // A partial word never fires; the first occurrence counts.
  EXPECT_EQ(run({word("<tool_call>")}, {"<tool", "_cal", "l", " x"}).first, -1);
  EXPECT_EQ(run({word("ab")}, {"xaab", "ab"}), std::make_pair(0, size_t{2}));
  // Regex metacharacters in a word are literal.
  EXPECT_EQ(run({word("a.b")}, {"axb a.b"}).second, 4u);
  EXPECT_EQ(run({word("[TOOL_CALLS]")}, {"x[TOOL_", "CALLS]"}).second, 1u);
}

TEST(Trigger, PatternStartsAtTheFirstNonEmptyGroup) {
  // llama.cpp's tool-call patterns: the group marks where the grammar starts.
  auto r = run({pat("[\\s\\S]*?(<tool_call>)[\\s\\S]*")}, {"think first ", "<tool_call>", "\n"});
  EXPECT_EQ(r.first, 1);
  EXPECT_EQ(r.second, 12u);
  // No group: the match start.
  EXPECT_EQ(run({pat("\\{\\s*\"name\"")}, {"ok { ", " \"na", "me\": 1"}), std::make_pair(2, size_t{3}));
  // The first group that matched something: the empty group 1 is passed over.
  EXPECT_EQ(run({pat("(x?)(ab)")}, {"zzab"}).second, 2u);
  // Alternation in a group, lazy and greedy quantifiers.
  EXPECT_EQ(run({pat("a(b+?)")}, {"cab", "bb"}), std::make_pair(0, size_t{2}));
  EXPECT_EQ(run({pat("(<f=\\w+>)")}, {"<f=", "x1>"}).second, 0u);
  // ^ anchors at the start of the text: "x" not at the start never fires.
  EXPECT_EQ(run({pat("^x")}, {"ax", "x"}).first, -1);
  EXPECT_EQ(run({pat("^\\s*(\\{)")}, {"  ", "{\"a"}), std::make_pair(1, size_t{2}));
  // $ holds at each token boundary (the text so far ends there).
  EXPECT_EQ(run({pat("ab$")}, {"xa", "b"}), std::make_pair(1, size_t{1}));
}

TEST(Trigger, PatternFullMustMatchTheWholeTextSoFar) {
  // Matches only while the whole text is in the language: "hello <tool_call>" fires, but the same
  // opening inside a longer text only if the pattern allows the rest.
  EXPECT_EQ(run({full("(<tool_call>)[\\s\\S]*")}, {"<tool", "_call>", "{"}), std::make_pair(1, size_t{0}));
  EXPECT_EQ(run({full("(<tool_call>)[\\s\\S]*")}, {"x", "<tool_call>"}).first, -1);  // not at the start
  EXPECT_EQ(run({full("[\\s\\S]*?(<tool_call>)[\\s\\S]*")}, {"x", "<tool_call>"}), std::make_pair(1, size_t{1}));
  // Checked at token boundaries only: "ab" is a prefix of the text "abc" at no boundary.
  EXPECT_EQ(run({full("ab")}, {"abc"}).first, -1);
  EXPECT_EQ(run({full("ab")}, {"a", "b", "c"}).first, 1);
  // Once dead (the text left the language) it never fires again.
  EXPECT_EQ(run({full("a+")}, {"b", "a"}).first, -1);
}

TEST(Trigger, TokenTriggerStartsAtTheTokenText) {
  EXPECT_EQ(run({tok(42)}, {"abc", "<|python_tag|>", "x"}, {1, 42, 2}), std::make_pair(1, size_t{3}));
  EXPECT_EQ(run({tok(42)}, {"abc", "def"}, {1, 2}).first, -1);
  // Token triggers are checked before the others (llama.cpp's order).
  TriggerWatch w(Triggers::compile({word("b"), tok(5)}));
  EXPECT_EQ(w.push(5, "ab"), 0u);
  EXPECT_EQ(w.fired_index(), 1);
}

TEST(Trigger, NeverMatchedStaysArmed) {
  TriggerWatch w(Triggers::compile({word("<tool_call>"), pat("\\[TOOL_CALLS\\]"), full("\\{[\\s\\S]*")}));
  for (int i = 0; i < 2000; ++i) EXPECT_EQ(w.push(i, "<tool call> [TOOL CALLS] "), TriggerWatch::npos);
  EXPECT_FALSE(w.fired());
}

TEST(Trigger, RefusalsNameTheProblem) {
  auto err = [](std::vector<TriggerSpec> s) {
    try {
      (void)Triggers::compile(std::move(s));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(err({word("")}), "trigger 0: empty word");
  EXPECT_EQ(err({word("a"), pat("a(b")}), "trigger 1: regex: missing ')' at offset 3");
  EXPECT_NE(err({pat("(?=a)")}).find("lookahead"), std::string::npos);
  EXPECT_NE(err({pat("(?<=a)b")}).find("lookbehind"), std::string::npos);
  EXPECT_NE(err({pat("(?<n>a)")}).find("named groups"), std::string::npos);
  EXPECT_NE(err({pat("(a)\\1")}).find("back-references"), std::string::npos);
  EXPECT_NE(err({pat("\\bword")}).find("word boundaries"), std::string::npos);
  EXPECT_NE(err({pat("*a")}).find("nothing to repeat"), std::string::npos);
  EXPECT_NE(err({pat("a{3,2}")}).find("n < m"), std::string::npos);
  EXPECT_NE(err({pat("[b-a]")}).find("reversed range"), std::string::npos);
  EXPECT_NE(err({pat("[^é]")}).find("negated class"), std::string::npos);
  EXPECT_NE(err({pat("(a{1000}){1000}")}).find("too large"), std::string::npos);
  EXPECT_NE(err({pat("a)")}).find("unbalanced"), std::string::npos);
  EXPECT_NE(err({pat("[abc")}).find("unterminated"), std::string::npos);
  EXPECT_EQ(err({tok(-1)}), "trigger 0: token id must be >= 0");
  EXPECT_EQ(err({pat("a{,2}")}), "no error");  // not a quantifier: literal text, as ECMAScript's annex B
}

// The incremental watch against std::regex on the whole text after every token (what llama.cpp
// does), on random texts over a small alphabet so matches are frequent: same token, same start.
TEST(Trigger, IncrementalWatchEqualsRescanningTheWholeText) {
  const std::vector<std::pair<K, std::string>> pats = {
      {K::Pattern, "ab"},           {K::Pattern, "a(b|c)+?d"},  {K::Pattern, "[\\s\\S]*?(<ab>)[\\s\\S]*"},
      {K::Pattern, "(c*)(ba{2,3})"}, {K::Pattern, "^a*b"},      {K::Pattern, "d$"},
      {K::Pattern, "(?:ab|ba)c"},    {K::PatternFull, "[abc<>]*d"}, {K::PatternFull, "(a|b)*?(<)[\\s\\S]*"},
      {K::PatternFull, "a?b?c?"},    {K::Word, "<ab>"},         {K::Pattern, "a.c"},
  };
  std::mt19937 rng(7);
  const std::string alpha = "abcd<> \n";
  int fired = 0, runs = 0;
  for (const auto& [kind, p] : pats) {
    std::string re_text = p;
    if (kind == K::Word) re_text = "<ab>";
    const std::regex re(re_text, std::regex::ECMAScript);
    for (int trial = 0; trial < 150; ++trial, ++runs) {
      TriggerWatch w(Triggers::compile({{kind, p, -1}}));
      std::string text;
      size_t want = std::string::npos, got = std::string::npos;
      int want_at = -1, got_at = -1;
      for (int t = 0; t < 12 && (want_at < 0 || got_at < 0); ++t) {
        std::string piece;
        const int len = 1 + static_cast<int>(rng() % 3);
        for (int k = 0; k < len; ++k) piece += alpha[rng() % alpha.size()];
        text += piece;
        if (want_at < 0) {
          std::smatch m;
          const bool ok = kind == K::PatternFull ? std::regex_match(text, m, re) : std::regex_search(text, m, re);
          if (ok) {
            want_at = t;
            want = static_cast<size_t>(m.position(0));
            for (size_t g = 1; g < m.size(); ++g)
              if (m.length(static_cast<int>(g)) > 0) {
                want = static_cast<size_t>(m.position(static_cast<int>(g)));
                break;
              }
          }
        }
        if (got_at < 0) {
          const size_t at = w.push(1000 + t, piece);
          if (at != TriggerWatch::npos) {
            got_at = t;
            got = at;
          }
        }
      }
      ASSERT_EQ(got_at, want_at) << "pattern " << p << " text " << text;
      ASSERT_EQ(got, want) << "pattern " << p << " text " << text;
      fired += got_at >= 0;
    }
  }
  // The check means something: most runs fire, some do not.
  EXPECT_GT(fired, runs / 8);
  EXPECT_LT(fired, runs);
}

// Random pattern text (metacharacters included): compiles or is a pg::Error, never crashes; a compiled
// one watched over random text fires with a start inside the text, and a pattern_full / pattern
// that fires agrees with find_start on the same text.
TEST(Trigger, RandomPatternsNeverCrash) {
  std::mt19937 rng(11);
  const std::string meta = "ab<>()[]{}|*+?^$.\\-,:0123sSdwn";
  int compiled = 0, fired = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string p;
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) p += meta[rng() % meta.size()];
    const K kind = rng() % 2 ? K::Pattern : K::PatternFull;
    std::shared_ptr<const Triggers> t;
    try {
      t = Triggers::compile({{kind, p, -1}});
    } catch (const Error&) {
      continue;
    }
    ++compiled;
    TriggerWatch w(t);
    for (int k = 0; k < 8; ++k) {
      std::string piece;
      for (int j = 0; j < 3; ++j) piece += "ab<>{}1 \n"[rng() % 9];
      const size_t at = w.push(k, piece);
      if (at != TriggerWatch::npos) {
        ASSERT_LE(at, w.text().size()) << p;
        ++fired;
        break;
      }
    }
  }
  EXPECT_GT(compiled, 300);
  EXPECT_GT(fired, 50);
}

// The armed phase's cost per token (docs/structured-output.md): the triggers the server uses for
// tool calls under "auto" and llama.cpp's search pattern, over 8 000 tokens of prose that never
// fires. The watch must not re-scan the output: the last 2 000 tokens cost about what the first
// 2 000 do (a re-scan would make them ~7x dearer).
TEST(Trigger, ArmedPhaseCostPerTokenIsFlat) {
  const std::vector<std::pair<const char*, std::vector<TriggerSpec>>> sets = {
      {"hermes / qwen3-coder: word <tool_call>", {word("<tool_call>")}},
      {"llama 3: pattern_full + word", {full("\\s*(\\{\\s*\"name\"\\s*:)[\\s\\S]*"), word("<|python_tag|>")}},
      {"search pattern [\\s\\S]*?(<tool_call>)[\\s\\S]*", {pat("[\\s\\S]*?(<tool_call>)[\\s\\S]*")}},
  };
  const char* words[] = {" the", " tool", " call", " is", " <", "tool", "_", "call", " not", " here", ",", " {\"", "name", "\n"};
  for (const auto& [name, specs] : sets) {
    TriggerWatch w(Triggers::compile(specs));
    constexpr int kN = 8000, kQ = 2000;
    double first = 0, last = 0;
    for (int i = 0; i < kN; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      ASSERT_EQ(w.push(i, words[i % 14]), TriggerWatch::npos);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i < kQ) first += us;
      if (i >= kN - kQ) last += us;
    }
    std::printf("%s: %.3f us/token (first %d tokens), %.3f us/token (last %d)\n", name, first / kQ, kQ, last / kQ, kQ);
    EXPECT_LT(last, 3 * first + 2000) << name;  // flat (2 ms of slack for a loaded machine)
  }
}

}  // namespace
}  // namespace pg::grammar
