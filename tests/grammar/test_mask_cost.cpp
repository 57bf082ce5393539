// Per-step cost of the allowed-token mask on a 151 936-token vocabulary (Qwen3's), for JSON-schema
// grammars of several nesting depths, along tokenized sampled instances: the first instance of each
// grammar starts with a cold window cache, the later ones reuse it (as a server reusing the compiled
// grammar across requests would). Prints median / p99; fails if the warm median is not well under a
// millisecond.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "core/error.h"
#include "grammar/grammar.h"
#include "schema_corpus.h"
#include "tok_testutil.h"
#include <ctime>

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
          std::printf("  slow warm step (%.2f ms, %zu stacks) after %zu tokens: %s\n", ms, m.n_stacks(), k, nlohmann::json(tok.decode(prefix).substr(0, 200)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
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

namespace {
// CPU time of this thread (the machine running the tests is shared: wall time would measure the load).
double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}
}  // namespace

// The whole 432-schema corpus on Qwen3's vocabulary: per decode step, the mask of the state the
// step starts in, along one tokenized random instance of each schema. Three set-ups:
//   before: a fresh matcher per request, trie walked node by node (the state on main before this work);
//   skip:   the same, with whole-subtree acceptance where the state loops (string interiors);
//   after:  compile_cached: the grammar's mask cache is shared by requests and warmed at compile time
//           (on the HTTP thread, reported separately), plus subtree acceptance.
TEST(MaskCost, CorpusPerStepOnQwenVocabulary) {
  const auto& tok = pg::test::cached_vocab("testdata/tokenizer/ggml-vocab-qwen3.gguf");
  auto vocab = Vocab::from_tokenizer(tok);
  auto corpus = pg::test::schema_corpus();
  // PG_MASK_FULL=1: every schema (the documented numbers); CI: every 4th.
  const char* full = std::getenv("PG_MASK_FULL");
  const size_t stride = full && *full == '1' ? 1 : 4;
  struct Case {
    std::shared_ptr<const Grammar> g;
    std::string gbnf;
    std::vector<int32_t> ids;
  };
  std::vector<Case> cases;
  std::mt19937_64 rng(11);
  for (size_t i = 0; i < corpus.size(); i += stride) {
    Case c;
    try {
      c.gbnf = json_schema_to_gbnf(corpus[i].second.dump());
    } catch (const pg::Error&) {
      continue;  // the few corpus schemas the converter refuses (test_json_schema checks which)
    }
    c.g = Grammar::parse(c.gbnf);
    std::string text;
    if (!c.g->sample(rng, text, 8, 4096)) continue;
    c.ids = tok.encode(text, false, false);
    cases.push_back(std::move(c));
  }
  auto run = [&](const char* name, bool skip, bool cached) -> double {
    set_subtree_skip(skip);
    std::vector<double> steps, warm;
    TokenMask mask;
    for (auto& c : cases) {
      std::shared_ptr<const Compiled> comp;
      std::optional<Matcher> m;
      if (cached) {
        const double t0 = cpu_ms();
        // A vocabulary object of its own per run keeps the cache keys of the runs apart.
        comp = compile_cached(c.gbnf + "\n# " + name, vocab);
        warm.push_back(cpu_ms() - t0);
        m.emplace(comp->proto.clone());
      } else {
        m.emplace(c.g, vocab);
      }
      for (int32_t id : c.ids) {
        const double t0 = cpu_ms();
        m->allowed_tokens(mask);
        steps.push_back(cpu_ms() - t0);
        if (!mask_test(mask, id) || !m->accept_token(id)) {
          ADD_FAILURE() << "token " << id << " of a sampled instance refused";
          break;
        }
      }
    }
    double sum = 0;
    for (double x : steps) sum += x;
    std::printf("%-6s %zu schemas, %zu steps: per step p50 %.4f ms p99 %.3f ms max %.3f ms mean %.4f ms", name, cases.size(), steps.size(),
                pct(steps, 0.5), pct(steps, 0.99), pct(steps, 1.0), sum / static_cast<double>(steps.size()));
    if (!warm.empty()) std::printf(" | compile+warm per schema p50 %.2f ms max %.2f ms", pct(warm, 0.5), pct(warm, 1.0));
    std::printf("\n");
    return pct(steps, 0.99);
  };
  const double before = run("before", false, false);
  run("skip", true, false);
  const double after = run("after", true, true);
  set_subtree_skip(true);
  EXPECT_LT(after, before);
  EXPECT_LT(after, 1.0) << "p99 mask cost per step (CPU ms) with the warmed cache";
}
