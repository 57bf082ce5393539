// peregrine bench: prompt-processing and generation speed, with the bytes each generated token
// reads so that speed can be judged against the memory-bandwidth roofline.
#include <algorithm>
#include <chrono>
#include <cstdio>
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

}  // namespace

int cmd_bench(int argc, char** argv) {
  ModelFlags mf;
  int n_prompt = 512, n_gen = 128, reps = 3, depth = 0;
  double bandwidth = 0;
  Args a("bench", "Measure prompt processing (pp) and generation (tg) speed. Prints tok/s (median of -r runs), the\n"
                  "bytes read per generated token, the achieved GB/s and, given --bandwidth, the fraction of the roofline.");
  mf.add_to(a, false);
  a.opt("-p,--n-prompt", &n_prompt, "prompt tokens for the pp test (0 = skip)");
  a.opt("-n,--n-gen", &n_gen, "generated tokens for the tg test (0 = skip)");
  a.opt("-r,--repetitions", &reps, "repetitions (the median is reported)");
  a.opt("-d,--depth", &depth, "tokens already in the KV cache before each test");
  a.opt("--bandwidth", &bandwidth, "memory bandwidth in GB/s for the roofline fraction (0 = not shown)");
  if (!a.parse(argc, argv)) return 0;
  PG_CHECK(n_prompt >= 0 && n_gen >= 0 && reps > 0 && depth >= 0, "bench sizes must be non-negative and -r positive");
  PG_CHECK(n_prompt + n_gen > 0, "nothing to measure: -p and -n are both 0");
  mf.ctx = depth + std::max(n_prompt, n_gen) + 1;
  auto lm = load_model(mf, false);
  const auto& c = lm.model->config();
  const auto bytes = lm.model->bytes();
  auto cache = lm.model->make_cache({1, mf.ctx, lm.kv_type});
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(0, c.n_vocab - 1);
  std::vector<float> logits;

  auto fill_depth = [&] {
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
  using clock = std::chrono::steady_clock;
  if (n_prompt > 0) {
    std::vector<double> tps;
    for (int r = 0; r < reps + 1; ++r) {  // first run warms up
      fill_depth();
      Batch b;
      for (int p = 0; p < n_prompt; ++p) b.add(tok(rng), depth + p, 0, p == n_prompt - 1);
      auto t0 = clock::now();
      lm.model->forward(b, *cache, logits);
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      if (r > 0) tps.push_back(n_prompt / s);
    }
    const double t = median(tps);
    std::printf("| pp%d | %d | %.2f | %.3f | - | - |\n", n_prompt, depth, t, 1000.0 / t);
  }
  if (n_gen > 0) {
    std::vector<double> tps;
    for (int r = 0; r < reps + 1; ++r) {
      fill_depth();
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
    if (state > 0)
      std::printf("bytes per generated token: %.0f (weights %zu + KV %.0f + recurrent state read and written %.0f)\n", per_tok,
                  bytes.per_token, kv, state);
    else
      std::printf("bytes per generated token: %.0f (weights %zu + KV %.0f)\n", per_tok, bytes.per_token, kv);
  }
  return 0;
}

}  // namespace pg::cli
