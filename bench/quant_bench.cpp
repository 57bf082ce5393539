// Micro-benchmark of the CPU quantization kernels (not built by default, not a test):
// quantize_weights / quantize_row / dequantize_row throughput per type, and vec_dot (SIMD and scalar)
// over a weight matrix that does not fit in L2, in weight GB/s. Times are thread CPU time.
//
// Build (after building pg_core in build-dir):
//   g++ -std=c++20 -O3 -mavx2 -mfma -mf16c -mbmi2 -Isrc bench/quant_bench.cpp build-dir/src/core/libpg_core.a -o quant_bench
// Run: ./quant_bench [million-elements-for-quantizers, default 4]
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/quant.h"

namespace {

// Thread CPU time, so that numbers stay meaningful on a shared, busy machine.
double now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double seconds_since(double t0) { return now() - t0; }

volatile float g_sink;

}  // namespace

int main(int argc, char** argv) {
  using pg::DType;
  const int64_t nq = (argc > 1 ? std::atoll(argv[1]) : 4) * 1024 * 1024;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(nq));
  for (auto& v : x) v = nd(rng);

  const DType types[] = {DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,   DType::Q5_1,
                         DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};
  std::printf("%-7s %12s %12s %12s | %10s %10s %10s\n", "type", "qweights", "qrow", "dequant", "dot GB/s", "scalar", "Mrow/s");
  for (DType t : types) {
    std::vector<uint8_t> q(pg::row_bytes(t, nq));
    std::vector<float> back(static_cast<size_t>(nq), 0.f);
    pg::quantize_row(t, x.data(), q.data(), nq);  // touch the output pages first
    double t0 = now();
    pg::quantize_row(t, x.data(), q.data(), nq);
    const double tr = seconds_since(t0);
    t0 = now();
    pg::quantize_weights(t, x.data(), q.data(), nq);
    const double tw = seconds_since(t0);
    t0 = now();
    pg::dequantize_row(t, q.data(), back.data(), nq);
    const double td = seconds_since(t0);

    // Dot products: 4096 x 4096 matrix (memory-bound like decode).
    constexpr int64_t n = 4096, rows = 4096;
    const DType vt = pg::vec_dot_type(t);
    std::vector<uint8_t> w(pg::row_bytes(t, n) * rows);
    for (int64_t r = 0; r < rows; ++r) pg::quantize_row(t, x.data() + (r * n) % (nq - n), w.data() + r * pg::row_bytes(t, n), n);
    std::vector<uint8_t> xq(pg::row_bytes(vt, n));
    pg::quantize_row(vt, x.data(), xq.data(), n);
    float acc = 0;
    int reps = 0;
    t0 = now();
    do {
      for (int64_t r = 0; r < rows; ++r) acc += pg::vec_dot(t, n, w.data() + r * pg::row_bytes(t, n), xq.data());
      ++reps;
    } while (seconds_since(t0) < 0.3);
    const double tdot = seconds_since(t0) / reps;
    t0 = now();
    for (int64_t r = 0; r < rows; ++r) acc += pg::vec_dot_scalar(t, n, w.data() + r * pg::row_bytes(t, n), xq.data());
    const double tdot_s = seconds_since(t0);
    g_sink = acc;
    const double mel = static_cast<double>(nq) / 1e6;
    std::printf("%-7s %9.1f M/s %9.1f M/s %9.1f M/s | %10.2f %10.2f %10.1f\n", std::string(pg::dtype_name(t)).c_str(), mel / tw,
                mel / tr, mel / td, static_cast<double>(w.size()) / tdot / 1e9, static_cast<double>(w.size()) / tdot_s / 1e9,
                rows / tdot / 1e6);
  }
  return 0;
}
