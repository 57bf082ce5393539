// MoE decode with fewer launches (CudaOptions::moe_fused): for decode-sized batches the default moe_ffn
// runs act_quant + grouped gate GEMV, act_quant + grouped up GEMV, glu, act_quant + grouped down GEMV into
// T (E, d), moe_combine. Here: act_quant(x), moe_gate_up_kernel (gate and up dots + GLU in one warp),
// act_quant(G), moe_down_combine_kernel (down dots + weighted combine, no T buffer).
//
// Bit-identity with the default path: every dot is summed in the order of gemv_q8.cu's one-row-per-warp
// kernel (gemv_q8_kernel<T, 1, 32>): lane l accumulates pieces l, l+32, ... starting from 0.0f, loads
// kUnrollOf<T> pieces ahead (quant_dot.cuh), then warp_sum. GLU is glu_act (glu_act.cuh), the combine is moe_combine_kernel's
// loop (ascending expert id, FP32 `s += w·t`). The weight decoders are gemv_q8.cu's (quant_dot.cuh);
// tests/cuda/test_cuda_moe_fused.cpp memcmps the results against the default path.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/glu_act.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_gemv.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quant_dot.cuh"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // one warp per output row, as gemv_q8.cu
constexpr int kMaxK = 32;
constexpr int kDownBatch = 4;  // moe_down_combine_kernel: entries whose weight loads are in flight together

using namespace wq;  // the weight decoders, shared with gemv_q8.cu (quant_dot.cuh)

// One row's dot against one activation row, in gemv_q8_kernel<T, 1, 32>'s order; returns the warp sum in
// every lane. w: the row (np pieces of T); x: its 8-bit activations.
template <class T>
__device__ __forceinline__ float row_dot(const uint8_t* w, const ActRows<1>& x, int np, int lane) {
  constexpr int U = kUnrollOf<T>;  // pieces per lane in flight (quant_dot.cuh)
  float acc[1] = {0.0f};
  typename T::Raw r[U];
  int base = lane;
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + 32 * u < np) r[u] = T::load(w, base + 32 * u);
  while (base < np) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + 32 * u < np) T::template dot<1>(r[u], base + 32 * u, x, acc);
    base += 32 * U;
    if (base >= np) break;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + 32 * u < np) r[u] = T::load(w, base + 32 * u);
  }
  return warp_sum(acc[0]);
}

// Kernel 1 contract: grid (ceil(ff/4), E), 4 warps per block; warp = ff row `row` of routed entry g
// (blockIdx.y). G (E, ff) [g, row] = glu_act(dot(gate_{ids[g]}[row], xq[g/k]), dot(up_{ids[g]}[row], xq[g/k])).
// xq (n, K) int8 / xd (n, K/32) FP32: x quantized by quantize_q8. The gate and up rows of one warp share
// the activation loads (both dots are the same loop as row_dot, interleaved).
template <class T, int ACT>
__global__ void __launch_bounds__(kRowsPerBlock * 32) moe_gate_up_kernel(const MoeGateUpParams p) {
  grid_wait();  // PDL: the expert ids and activations come from earlier kernels
  grid_launch_dependents();
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp;
  if (row >= p.ff) return;
  const int g = static_cast<int>(blockIdx.y);
  const size_t e = static_cast<size_t>(p.ids[g]);
  const uint8_t* wg = p.gate + e * p.gate_expert_bytes + static_cast<size_t>(row) * p.row_bytes;  // (row_bytes)
  const uint8_t* wu = p.up + e * p.up_expert_bytes + static_cast<size_t>(row) * p.row_bytes;      // (row_bytes)
  ActRows<1> x;
  const int64_t xr = g / p.k;
  x.q[0] = p.xq + xr * p.K;
  x.d[0] = p.xd + xr * (p.K / 32);
  x.s[0] = p.xs + xr * (p.K / 32);
  const int np = pieces<T>(p.n_pieces);
  constexpr int U = kUnrollOf<T>;
  float ag[1] = {0.0f}, au[1] = {0.0f};
  typename T::Raw rg[U], ru[U];
  int base = lane;
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + 32 * u < np) rg[u] = T::load(wg, base + 32 * u), ru[u] = T::load(wu, base + 32 * u);
  while (base < np) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + 32 * u < np) dot_pair<T, 1>(rg[u], ru[u], base + 32 * u, x, ag, au);
    base += 32 * U;
    if (base >= np) break;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + 32 * u < np) rg[u] = T::load(wg, base + 32 * u), ru[u] = T::load(wu, base + 32 * u);
  }
  const float gs = warp_sum(ag[0]), us = warp_sum(au[0]);
  if (lane == 0) p.G[static_cast<int64_t>(g) * p.ff + row] = glu_act(gs, us, ACT);
}

// Kernel 2 contract: grid (ceil(d/4), n), 4 warps per block; warp = output column `row` of token t
// (blockIdx.y). out (n, d) [t, row] = Σ_j w[t, jj]·dot(down_{ids[t, jj]}[row], gq[t·k + jj]) over the
// token's k entries jj in ascending expert id (moe_combine_kernel's order and FP32 accumulation; each dot as
// the grouped down GEMV sums it). gq (E, ff) int8 / gd (E, ff/32): G quantized by quantize_q8.
template <class T>
__global__ void __launch_bounds__(kRowsPerBlock * 32, 5) moe_down_combine_kernel(const MoeDownParams p) {
  grid_wait();  // PDL: G, ids and weights come from earlier kernels
  grid_launch_dependents();
  __shared__ int order[kMaxK];
  const int t = static_cast<int>(blockIdx.y);
  const int32_t* ids = p.ids + static_cast<int64_t>(t) * p.k;   // (k)
  const float* wts = p.weights + static_cast<int64_t>(t) * p.k;  // (k)
  if (threadIdx.x == 0) {
    // The insertion sort of moe_combine_kernel (same order on equal ids).
    for (int j = 0; j < p.k; ++j) order[j] = j;
    for (int a = 1; a < p.k; ++a)
      for (int b = a; b > 0 && ids[order[b]] < ids[order[b - 1]]; --b) {
        const int tmp = order[b];
        order[b] = order[b - 1];
        order[b - 1] = tmp;
      }
  }
  __syncthreads();
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp;
  if (row >= p.d) return;
  float s = 0.0f;
  const int np = pieces<T>(p.n_pieces);
  if (np <= 32) {
    // Rows of at most 32 pieces (qwen3-30b-a3b: ff 768 = 24 pieces, 12 of Q4_K): one piece per lane per entry, so the
    // single loop of row_dot would serialize k load latencies. Issue the loads of kDownBatch entries first,
    // then form each dot exactly as row_dot does (acc from 0.0f, one dot call, warp_sum).
    const bool live = lane < np;
    for (int j0 = 0; j0 < p.k; j0 += kDownBatch) {
      typename T::Raw r[kDownBatch];
#pragma unroll
      for (int b = 0; b < kDownBatch; ++b)
        if (j0 + b < p.k && live)
          r[b] = T::load(p.down + static_cast<size_t>(ids[order[j0 + b]]) * p.expert_bytes + static_cast<size_t>(row) * p.row_bytes, lane);
#pragma unroll
      for (int b = 0; b < kDownBatch; ++b) {
        if (j0 + b >= p.k) break;  // warp-uniform
        const int jj = order[j0 + b];
        const int64_t ent = static_cast<int64_t>(t) * p.k + jj;
        ActRows<1> x;
        x.q[0] = p.gq + ent * p.ff;
        x.d[0] = p.gd + ent * (p.ff / 32);
        x.s[0] = p.gs + ent * (p.ff / 32);
        float acc[1] = {0.0f};
        if (live) T::template dot<1>(r[b], lane, x, acc);
        const float dv = warp_sum(acc[0]);
        s += wts[jj] * dv;
      }
    }
    if (lane == 0) p.out[static_cast<int64_t>(t) * p.d + row] = s;
    return;
  }
  for (int j = 0; j < p.k; ++j) {
    const int jj = order[j];
    const int64_t ent = static_cast<int64_t>(t) * p.k + jj;
    const uint8_t* w = p.down + static_cast<size_t>(ids[jj]) * p.expert_bytes + static_cast<size_t>(row) * p.row_bytes;
    ActRows<1> x;
    x.q[0] = p.gq + ent * p.ff;
    x.d[0] = p.gd + ent * (p.ff / 32);
    x.s[0] = p.gs + ent * (p.ff / 32);
    const float dv = row_dot<T>(w, x, np, lane);
    s += wts[jj] * dv;
  }
  if (lane == 0) p.out[static_cast<int64_t>(t) * p.d + row] = s;
}

}  // namespace

bool moe_fused_type(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0; }

void moe_gate_up(DType type, const MoeGateUpParams& p, int act, bool pdl, cudaStream_t stream) {
  PG_CHECK(act == 0 || act == 1, "moe_gate_up: unknown activation");
  PG_CHECK(p.E <= 65535, "moe_gate_up: too many entries");
  if (p.E <= 0 || p.ff <= 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.ff, int64_t{kRowsPerBlock})), static_cast<unsigned>(p.E));
  const bool ok = wq::dispatch<wq::WqSet::kKQuantsQ8>(type, [&]<class T>() {
    PG_CHECK(p.K % kBlockValues<T> == 0 && reinterpret_cast<uintptr_t>(p.gate) % T::kAlign == 0 && p.row_bytes % T::kAlign == 0,
             "moe_gate_up: layout unsupported");
    if (act == 0)
      launch_pdl(pdl, moe_gate_up_kernel<T, 0>, grid, dim3(kRowsPerBlock * 32), 0, stream, p);
    else
      launch_pdl(pdl, moe_gate_up_kernel<T, 1>, grid, dim3(kRowsPerBlock * 32), 0, stream, p);
  });
  PG_CHECK(ok, "moe_gate_up: unsupported type");
  check_launch("moe_gate_up");
}

void moe_down_combine(DType type, const MoeDownParams& p, bool pdl, cudaStream_t stream) {
  PG_CHECK(p.k >= 1 && p.k <= kMaxK, "moe_down_combine: k unsupported");
  PG_CHECK(p.n <= 65535, "moe_down_combine: too many rows");
  if (p.n <= 0 || p.d <= 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.d, int64_t{kRowsPerBlock})), static_cast<unsigned>(p.n));
  const bool ok = wq::dispatch<wq::WqSet::kKQuantsQ8>(type, [&]<class T>() {
    PG_CHECK(p.ff % kBlockValues<T> == 0 && reinterpret_cast<uintptr_t>(p.down) % T::kAlign == 0 && p.row_bytes % T::kAlign == 0,
             "moe_down_combine: layout unsupported");
    launch_pdl(pdl, moe_down_combine_kernel<T>, grid, dim3(kRowsPerBlock * 32), 0, stream, p); });
  PG_CHECK(ok, "moe_down_combine: unsupported type");
  check_launch("moe_down_combine");
}

}  // namespace pg::cuda
