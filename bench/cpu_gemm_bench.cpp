// The CPU matmul kernels in isolation: checks that gemm_rows (one decoded weight block shared by up to
// four activation rows) gives bit-identical results to vec_dot per pair, then times both.
//
//   pg_cpu_gemm_bench [--types q4_k,q8_0,...] [--in N] [--out N] [--rows N] [--reps N] [--vnni 0|1]
//
// --vnni 0 turns the AVX-512 VNNI tiles off (gemm_enable_vnni) to time the AVX2 tiles on a VNNI machine.
//
// Types whose block size does not divide --in are skipped (--in 2056 exercises the float tails).
//
// Weights are random rows quantized the way llama-quantize does; activations are random and prepared
// with gemm_prepare_x (vec_dot gets the same rows through quantize_row). Single-threaded: it measures
// the kernels, not the thread pool. Exit status 1 when any result differs in any bit.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/quant.h"
#include "core/quant_dot.h"

namespace {

using clock_type = std::chrono::steady_clock;

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock_type::now();
    f();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return best;
}

int run(int argc, char** argv) {
  std::string types = "f32,f16,bf16,q4_0,q4_1,q5_0,q5_1,q8_0,iq4_nl,q2_k,q3_k,q4_k,q5_k,q6_k,iq4_xs";
  int64_t in = 2048, out = 256, rows = 64;
  int reps = 5;
  auto number = [](const char* s, int64_t* v) {
    char* end = nullptr;
    const long long x = std::strtoll(s, &end, 10);
    if (end == s || *end != '\0' || x <= 0 || x > (1LL << 24)) return false;
    *v = x;
    return true;
  };
  int64_t reps64 = reps;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    bool ok = i + 1 < argc;
    if (ok && a == "--types") {
      types = argv[i + 1];
    } else if (ok && a == "--in") {
      ok = number(argv[i + 1], &in);
    } else if (ok && a == "--out") {
      ok = number(argv[i + 1], &out);
    } else if (ok && a == "--rows") {
      ok = number(argv[i + 1], &rows);
    } else if (ok && a == "--reps") {
      ok = number(argv[i + 1], &reps64);
    } else if (ok && a == "--vnni") {
      const std::string v = argv[i + 1];
      ok = v == "0" || v == "1";
      if (ok) pg::gemm_enable_vnni(v == "1");
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "usage: %s [--types q4_k,q8_0,...] [--in N] [--out N] [--rows N] [--reps N] [--vnni 0|1] (N: 1..16777216)\n",
                   argv[0]);
      return 2;
    }
  }
  reps = static_cast<int>(reps64);
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> wf(static_cast<size_t>(in * out)), xf(static_cast<size_t>(in * rows));
  for (auto& v : wf) v = nd(rng);
  for (auto& v : xf) v = nd(rng);

  bool all_same = true;
  std::printf("in %lld, out %lld, activation rows %lld (times: best of %d, one thread)\n", static_cast<long long>(in),
              static_cast<long long>(out), static_cast<long long>(rows), reps);
  std::printf("| type | tiles | bit-identical | vec_dot GMAC/s | gemm_rows GMAC/s | speed-up |\n|---|---|---|---:|---:|---:|\n");
  std::stringstream ss(types);
  for (std::string name; std::getline(ss, name, ',');) {
    const auto t = pg::dtype_from_name(name);
    if (!t) {
      std::fprintf(stderr, "unknown type %s\n", name.c_str());
      return 2;
    }
    if (in % pg::traits(*t).block_size != 0) {
      std::printf("| %s | - | skipped: --in is not a multiple of the block size | | | |\n", name.c_str());
      continue;
    }
    const size_t wrow = pg::row_bytes(*t, in);
    std::vector<uint8_t> w(wrow * static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) pg::quantize_weights(*t, wf.data() + o * in, w.data() + static_cast<size_t>(o) * wrow, in);
    const pg::DType vt = pg::vec_dot_type(*t);
    const size_t qrow = pg::row_bytes(vt, in), grow = pg::gemm_x_row_bytes(*t, in);
    std::vector<uint8_t> xq(qrow * static_cast<size_t>(rows)), xg(grow * static_cast<size_t>(rows));
    std::vector<const void*> xp(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      pg::quantize_row(vt, xf.data() + r * in, xq.data() + static_cast<size_t>(r) * qrow, in);
      pg::gemm_prepare_x(*t, xf.data() + r * in, xg.data() + static_cast<size_t>(r) * grow, in);
      xp[static_cast<size_t>(r)] = xg.data() + static_cast<size_t>(r) * grow;
    }
    std::vector<float> y_ref(static_cast<size_t>(rows * out)), y(static_cast<size_t>(rows * out));
    auto run_ref = [&] {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o)
          y_ref[static_cast<size_t>(r * out + o)] =
              pg::vec_dot(*t, in, w.data() + static_cast<size_t>(o) * wrow, xq.data() + static_cast<size_t>(r) * qrow);
    };
    auto run_gemm = [&] { pg::gemm_rows(*t, in, w.data(), wrow, out, xp.data(), rows, y.data(), out); };
    const double s_ref = best_seconds(reps, run_ref), s_gemm = best_seconds(reps, run_gemm);
    const bool same = std::memcmp(y.data(), y_ref.data(), y.size() * sizeof(float)) == 0;
    all_same = all_same && same;
    const double macs = static_cast<double>(in) * static_cast<double>(out) * static_cast<double>(rows);
    std::printf("| %s | %s | %s | %.2f | %.2f | %.2fx |\n", name.c_str(), pg::gemm_has_tiles(*t) ? "yes" : "no",
                same ? "yes" : "NO", macs / s_ref / 1e9, macs / s_gemm / 1e9, s_ref / s_gemm);
  }
  return all_same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // e.g. a type without a dot product
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
