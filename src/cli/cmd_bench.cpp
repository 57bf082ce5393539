// peregrine bench: prompt-processing and generation speed, with the bytes each generated token
// reads so that speed can be judged against the memory-bandwidth roofline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <random>
#include <vector>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"

namespace pg::cli {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// "512,4096" → {512, 4096}: llama-bench's list form, so one model load serves a whole table.
std::vector<int> int_list(const std::string& text, const char* flag) {
  std::vector<int> v;
  size_t p = 0;
  while (p <= text.size()) {
    const size_t q = std::min(text.find(',', p), text.size());
    const std::string item = text.substr(p, q - p);
    char* end = nullptr;
    const long x = std::strtol(item.c_str(), &end, 10);
    PG_CHECK(!item.empty() && end && *end == '\0' && x >= 0 && x <= (1 << 24),
             std::string(flag) + ": '" + item + "' is not a non-negative integer (a comma-separated list is allowed)");
    v.push_back(static_cast<int>(x));
    p = q + 1;
  }
  return v;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  ModelFlags mf;
  std::string prompts = "512", gens = "128", depths = "0";
  int reps = 3;
  double bandwidth = 0;
  Args a("bench", "Measure prompt processing (pp) and generation (tg) speed. Prints tok/s (median of -r runs), the\n"
                  "bytes read per generated token, the achieved GB/s and, given --bandwidth, the fraction of the roofline.\n"
                  "-p, -n and -d take comma-separated lists (as llama-bench): every pp and tg test runs at every depth.");
  mf.add_to(a, false);
  a.opt("-p,--n-prompt", &prompts, "prompt tokens for the pp test (0 = skip)");
  a.opt("-n,--n-gen", &gens, "generated tokens for the tg test (0 = skip)");
  a.opt("-r,--repetitions", &reps, "repetitions (the median is reported)");
  a.opt("-d,--depth", &depths, "tokens already in the KV cache before each test");
  a.opt("--bandwidth", &bandwidth, "memory bandwidth in GB/s for the roofline fraction (0 = not shown)");
  if (!a.parse(argc, argv)) return 0;
  const std::vector<int> n_prompts = int_list(prompts, "-p"), n_gens = int_list(gens, "-n"), ds = int_list(depths, "-d");
  PG_CHECK(reps > 0, "-r must be positive");
  const int max_p = *std::max_element(n_prompts.begin(), n_prompts.end()), max_n = *std::max_element(n_gens.begin(), n_gens.end());
  PG_CHECK(max_p + max_n > 0, "nothing to measure: -p and -n are all 0");
  mf.ctx = *std::max_element(ds.begin(), ds.end()) + std::max(max_p, max_n) + 1;
  auto lm = load_model(mf, false);
  const auto& c = lm.model->config();
  const auto bytes = lm.model->bytes();
  auto cache = lm.model->make_cache({1, mf.ctx, lm.kv_type});
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, c.n_vocab - 1);
  std::vector<float> logits;

  auto fill_depth = [&](int depth) {
    cache->clear(0);
    for (int p0 = 0; p0 < depth; p0 += mf.batch) {
      Batch b;
      for (int p = p0; p < std::min(depth, p0 + mf.batch); ++p) b.add(tok(rng), p, 0, false);
      lm.model->forward(b, *cache, logits);
    }
  };

  std::printf("model: %s (%s), %.3f GB file, %.3f GB of weights read per generated token\n", c.name.c_str(), c.arch.c_str(),
              bytes.file / 1e9, bytes.per_token / 1e9);
  std::printf("backend: %s, threads: %d, KV: %s, batch: %d\n", lm.backend->name().c_str(), mf.threads, mf.cache_type.c_str(), mf.batch);
  std::printf("| test | depth | t/s | ms/token | GB/s | roofline |\n|---|---:|---:|---:|---:|---:|\n");
  std::vector<std::string> notes;
  using clock = std::chrono::steady_clock;
  for (const int depth : ds) {
    for (const int n_prompt : n_prompts) {
      if (n_prompt == 0) continue;
      std::vector<double> tps;
      for (int r = 0; r < reps + 1; ++r) {  // first run warms up
        fill_depth(depth);
        Batch b;
        for (int p = 0; p < n_prompt; ++p) b.add(tok(rng), depth + p, 0, p == n_prompt - 1);
        auto t0 = clock::now();
        lm.model->forward(b, *cache, logits);
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        if (r > 0) tps.push_back(n_prompt / s);
      }
      const double t = median(tps);
      std::printf("| pp%d | %d | %.2f | %.3f | - | - |\n", n_prompt, depth, t, 1000.0 / t);
      std::fflush(stdout);
    }
    for (const int n_gen : n_gens) {
      if (n_gen == 0) continue;
      std::vector<double> tps;
      for (int r = 0; r < reps + 1; ++r) {
        fill_depth(depth);
        auto t0 = clock::now();
        int32_t next = tok(rng);
        // Greedy decoding as the engine does it: the token is picked on the backend.
        int32_t greedy = -1;
        const uint8_t only = 1;
        ForwardOptions fopt;
        fopt.argmax = &greedy;
        fopt.argmax_only = &only;
        for (int i = 0; i < n_gen; ++i) {
          Batch b;
          b.add(next, depth + i, 0, true);
          lm.model->forward(b, *cache, logits, fopt);
          next = greedy;
        }
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        if (r > 0) tps.push_back(n_gen / s);
      }
      const double t = median(tps);
      // Each step reads the weights once plus the KV cache written so far (mean depth over the run), and a
      // hybrid model's recurrent state (conv window + delta state of every linear-attention layer) is read
      // and written once.
      const double kv = static_cast<double>(cache->bytes_per_token()) * (depth + n_gen / 2.0);
      const double state = cache->recurrent() ? 2.0 * static_cast<double>(cache->recurrent()->slot_bytes()) : 0.0;
      const double per_tok = static_cast<double>(bytes.per_token) + kv + state;
      const double gbs = per_tok * t / 1e9;
      char roof[32] = "-";
      if (bandwidth > 0) std::snprintf(roof, sizeof roof, "%.1f%%", 100.0 * gbs / bandwidth);
      std::printf("| tg%d | %d | %.2f | %.3f | %.2f | %s |\n", n_gen, depth, t, 1000.0 / t, gbs, roof);
      std::fflush(stdout);
      char line[256];
      if (state > 0)
        std::snprintf(line, sizeof line, "bytes per generated token (tg%d @ %d): %.0f (weights %zu + KV %.0f + recurrent state read and written %.0f)",
                      n_gen, depth, per_tok, bytes.per_token, kv, state);
      else
        std::snprintf(line, sizeof line, "bytes per generated token (tg%d @ %d): %.0f (weights %zu + KV %.0f)", n_gen, depth, per_tok,
                      bytes.per_token, kv);
      notes.push_back(line);
    }
  }
  for (const std::string& n : notes) std::printf("%s\n", n.c_str());
  return 0;
}

}  // namespace pg::cli
