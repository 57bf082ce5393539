// pg_cuda_verify_bench — the cost of one speculative verification forward on the GPU (issue 10 §6).
//
//   pg_cuda_verify_bench -m MODEL [--depth D] [--rows 1,4,8,16,22,32,64] [--reps R] [--tau 8.31]
//
// Fills D committed positions, then times (median of R, after a warm-up) one AR decode step and, per row
// count N, one tree-shaped forward of N rows exactly as the scheduler verifies a DDTree: greedy argmax of
// every row computed on the device (no logits copied), tree-masked attention, recurrent capture for hybrid
// models; the tree is dropped afterwards so every forward sees the same committed length. The tree is a
// spine of up to 8 nodes (the drafter's chain) with the remaining nodes as siblings hung on the spine
// round-robin (DDTree's best-first shape). Prints per N the time, the ratio to one AR step, and the
// PROJECTED tok/s at a mean accepted length τ (default 8.31, the reference's published figure): τ tokens
// per verify forward, drafter cost not counted — a projection, not a measurement. Beside it, the same
// row count as a chain forward (causal rows, all argmax, cut back with truncate afterwards).
// With PEREGRINE_CUDA_PROFILE=1 (CUDA events around every op, graphs off) it also prints, for the AR step and
// each tree forward, the device time per op (summed over the timed repetitions, divided by them): where a
// verify forward's extra time goes, op by op.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"

using namespace pg;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int> int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::stoi(item));
  return v;
}

// Prints the ops drained from the backend's profiler as one table, per forward (reps forwards were timed).
void print_profile(Backend& be, const char* what, int reps) {
  std::vector<Backend::OpTime> ops = be.profile_take();
  if (ops.empty()) return;
  std::sort(ops.begin(), ops.end(), [](const Backend::OpTime& a, const Backend::OpTime& b) { return a.ms > b.ms; });
  double total = 0.0;
  for (const auto& t : ops) total += t.ms;
  std::printf("ops of %s (device time per forward, CUDA events around each op, graphs off): %.1f us in ops\n| op | calls | us | %% |\n|---|---:|---:|---:|\n",
              what, total * 1000.0 / reps);
  for (size_t i = 0; i < ops.size() && i < 40; ++i)
    std::printf("| %s | %.1f | %.1f | %.1f |\n", ops[i].key.c_str(), static_cast<double>(ops[i].calls) / reps, ops[i].ms * 1000.0 / reps,
                100.0 * ops[i].ms / total);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_path, rows_s = "1,4,8,16,22,32,64";
  int depth = 512, reps = 5;
  double tau = 8.31;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", a.c_str());
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "-m") model_path = val();
    else if (a == "--depth") depth = std::stoi(val());
    else if (a == "--rows") rows_s = val();
    else if (a == "--reps") reps = std::stoi(val());
    else if (a == "--tau") tau = std::stod(val());
    else {
      std::fprintf(stderr, "usage: pg_cuda_verify_bench -m MODEL [--depth D] [--rows LIST] [--reps R] [--tau T]\n");
      return 1;
    }
  }
  try {
    PG_CHECK(!model_path.empty(), "-m MODEL is required");
    PG_CHECK(reps > 0 && depth >= 1, "--reps and --depth must be positive");
    const std::vector<int> rows = int_list(rows_s);
    const int max_rows = *std::max_element(rows.begin(), rows.end());
    PG_CHECK(max_rows >= 1 && max_rows <= 127, "--rows: 1..127 rows");
    auto be = create_cuda_backend(0);
    auto model = Model::load(model_path, *be);
    const auto& c = model->config();
    const bool hybrid = c.has_recurrent();
    const int n_ctx = depth + reps * 2 + max_rows + 64;
    auto cache = model->make_cache({1, n_ctx, DType::F16, 64, 0, hybrid ? max_rows : 0});
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> tok(0, c.n_vocab - 1);
    std::vector<float> logits;
    for (int p0 = 0; p0 < depth; p0 += 512) {
      Batch b;
      for (int p = p0; p < std::min(depth, p0 + 512); ++p) b.add(tok(rng), p, 0, p == depth - 1);
      model->forward(b, *cache, logits);
    }
    be->synchronize();
    be->profile_take();  // the fill is not a verify forward
    using clock = std::chrono::steady_clock;
    std::vector<int32_t> greedy(static_cast<size_t>(max_rows));
    std::vector<uint8_t> only(static_cast<size_t>(max_rows), 1);
    ForwardOptions fo;
    fo.argmax = greedy.data();
    fo.argmax_only = only.data();
    fo.capture = hybrid;  // as the scheduler's verify forwards of hybrids
    // One AR step (1 row, chain): the engine's greedy decode.
    std::vector<double> ar;
    int32_t next = tok(rng);
    for (int r = 0; r < reps + 2; ++r) {
      Batch b;
      b.add(next, cache->seq_len(0), 0, true);
      ForwardOptions f1;
      f1.argmax = greedy.data();
      f1.argmax_only = only.data();
      const auto t0 = clock::now();
      model->forward(b, *cache, logits, f1);
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      next = greedy[0];
      if (r >= 2) ar.push_back(s);
    }
    const double t_ar = median(ar);
    print_profile(*be, "the AR step (1 row)", reps + 2);
    std::printf("model: %s (%s), CUDA %s, committed depth %d, median of %d\n", c.name.c_str(), c.arch.c_str(), be->name().c_str(),
                cache->seq_len(0), reps);
    std::printf("AR step (1 row): %.3f ms = %.1f tok/s\n", t_ar * 1e3, 1.0 / t_ar);
    std::printf("| rows | tree ms | x AR step | projected tok/s at tau %.2f (projection) | chain ms (same rows, all argmax) |\n|---:|---:|---:|---:|---:|\n",
                tau);
    for (const int n : rows) {
      // The same row count as a chain (rows at consecutive positions, causal), cut back afterwards:
      // separates what the tree costs from what the row count costs.
      std::vector<double> tc;
      for (int r = 0; r < reps + 2; ++r) {
        Batch b;
        const int len = cache->seq_len(0);
        for (int i = 0; i < n; ++i) b.add(tok(rng), len + i, 0, true);
        const auto t0 = clock::now();
        model->forward(b, *cache, logits, fo);
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        cache->truncate(0, len);
        if (r >= 2) tc.push_back(s);
      }
      be->profile_take();  // the chain forwards are not profiled
      std::vector<double> ts;
      for (int r = 0; r < reps + 2; ++r) {  // two warm-ups: eager, then recording where graphs apply
        Batch b;
        const int len = cache->seq_len(0);
        std::vector<int> d(static_cast<size_t>(n));
        const int spine = std::min(n, 8);
        for (int i = 0; i < n; ++i) {
          // Spine node i hangs on i-1; extra node i is a sibling of spine node k+1 (hung on spine node k).
          const int parent = i == 0 ? -1 : i < spine ? i - 1 : (i - spine) % (spine - 1);
          d[static_cast<size_t>(i)] = parent < 0 ? 0 : d[static_cast<size_t>(parent)] + 1;
          b.add_tree(tok(rng), len + d[static_cast<size_t>(i)], 0, parent, true);
        }
        const auto t0 = clock::now();
        model->forward(b, *cache, logits, fo);
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        cache->drop_tree(0);
        if (r >= 2) ts.push_back(s);
      }
      const double t = median(ts);
      std::printf("| %d | %.3f | %.2fx | %.1f | %.3f |\n", n, t * 1e3, t / t_ar, tau / t, median(tc) * 1e3);
      std::fflush(stdout);
      const std::string what = "the " + std::to_string(n) + "-row tree forward";
      print_profile(*be, what.c_str(), reps + 2);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
