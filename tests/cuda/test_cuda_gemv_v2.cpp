// The v2 one-row GEMV's lane tasks (backend/cuda/gemv_v2_tasks.cuh: Q4_K, Q5_K, Q6_K, Q8_0), compiled for
// the host, against dequantize_row: for every row of random quantized weights, Σ over the row's tasks of
// dot(load(row, t), t) must equal Σ_k w_k·xq_k·xd_k (double reference on the dequantized weights) up to
// FP32 rounding. This checks the task layouts (which quants, scales, mins and activations a task pairs),
// the Q6_K word realignment at both superblock parities and the Σx shortcut of the Q4_K/Q5_K min term,
// without a GPU; the lane/round driver, PDL and the kernel's speed are checked on the device
// (CudaOps.GemvV2MatchesCpuAndV1, pg_cuda_bench).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/common.cuh"  // with PG_CUDA_HOST_SHIM: tests/cuda/cuda_host_shim.h

// The device intrinsics the tasks use beyond cuda_host_shim.h, with the device semantics.
struct alignas(16) int4 {
  int x, y, z, w;
};
struct alignas(8) int2 {
  int x, y;
};
inline uint4 __ldg(const uint4* p) { return *p; }
inline uint32_t __ldg(const uint32_t* p) { return *p; }
inline uint16_t __ldg(const uint16_t* p) { return *p; }
inline int __dp4a(int a, int b, int c) {  // signed bytes × signed bytes + c
  for (int i = 0; i < 4; ++i) c += static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i)) * static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
  return c;
}
inline uint32_t __vsub4(uint32_t a, uint32_t b) {  // per-byte a − b modulo 256
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>(static_cast<uint8_t>((a >> (8 * i)) - (b >> (8 * i)))) << (8 * i);
  return r;
}
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t sh) {
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (sh & 31));
}

#include "backend/cuda/gemv_v2_tasks.cuh"
#include "core/quant.h"

namespace pg {
namespace {

// Worst relative error (|got − ref| / Σ|terms|) over M random rows of type t, width K.
template <class T>
double task_error(DType t, int64_t K, int64_t M) {
  std::mt19937 rng(7u + static_cast<uint32_t>(K));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const size_t rb = row_bytes(t, K);
  std::vector<uint4> store((rb * static_cast<size_t>(M) + 15) / 16 + 1);  // 16-byte aligned rows start
  auto* w = reinterpret_cast<uint8_t*>(store.data());
  std::vector<float> f(static_cast<size_t>(K));
  for (int64_t r = 0; r < M; ++r) {
    for (auto& v : f) v = 0.1f * nd(rng);
    quantize_row(t, f.data(), w + static_cast<size_t>(r) * rb, K);
  }
  // Activations as act_quant_kernel leaves them: int8 quants, a scale per 32 (q8_K: equal across a
  // superblock), Σq per 32.
  std::vector<int4> xstore(static_cast<size_t>(K / 16));
  auto* xq = reinterpret_cast<int8_t*>(xstore.data());
  std::vector<float> xd(static_cast<size_t>(K / 32));
  std::vector<int2> xsstore(static_cast<size_t>(K / 64));
  auto* xs = reinterpret_cast<int32_t*>(xsstore.data());
  std::uniform_int_distribution<int> qi(-127, 127);
  for (int64_t k = 0; k < K; ++k) xq[k] = static_cast<int8_t>(qi(rng));
  const bool q8k = t != DType::Q8_0;
  for (int64_t b = 0; b < K / 32; ++b) {
    xd[static_cast<size_t>(b)] = 0.01f * static_cast<float>(1 + (q8k ? b / 8 : b) % 5);
    int s = 0;
    for (int i = 0; i < 32; ++i) s += xq[32 * b + i];
    xs[b] = s;
  }
  cuda::v2::V2Params p{};
  p.w = w;
  p.row_bytes = rb;
  p.M = M;
  p.K = K;
  p.n_tasks = static_cast<int>(K / T::kWeights);
  p.xq = xq;
  p.xd = xd.data();
  p.xs = xs;
  double worst = 0.0;
  std::vector<float> deq(static_cast<size_t>(K));
  for (int64_t r = 0; r < M; ++r) {
    const uint8_t* row = w + static_cast<size_t>(r) * rb;
    double got = 0.0;
    for (int tk = 0; tk < p.n_tasks; ++tk) got += T::dot(T::load(row, tk), tk, p);
    dequantize_row(t, row, deq.data(), K);
    double ref = 0.0, mag = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double term = static_cast<double>(deq[static_cast<size_t>(k)]) * xq[k] * xd[static_cast<size_t>(k / 32)];
      ref += term;
      mag += std::fabs(term);
    }
    worst = std::max(worst, std::fabs(got - ref) / mag);
  }
  return worst;
}

TEST(CudaGemvV2Tasks, MatchDequantizedRows) {
  // 1e-6 of Σ|terms|: FP32 rounding of a few hundred task sums; a wrong pairing of quants, scales, mins
  // or activations is off by percents.
  for (const int64_t K : {256, 512, 2048, 4352}) {
    SCOPED_TRACE("K=" + std::to_string(K));
    EXPECT_LE(task_error<cuda::v2::V2K4>(DType::Q4_K, K, 9), 1e-6);
    EXPECT_LE(task_error<cuda::v2::V2K5>(DType::Q5_K, K, 9), 1e-6);
    EXPECT_LE(task_error<cuda::v2::V2B8>(DType::Q8_0, K, 9), 1e-6);
    if (K % 512 == 0) {  // superblocks at word offsets 0 and 2
      EXPECT_LE(task_error<cuda::v2::V2K6>(DType::Q6_K, K, 9), 1e-6);
    }
  }
}

}  // namespace
}  // namespace pg
