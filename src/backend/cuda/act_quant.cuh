// The default mode's 8-bit activation rounding (the CPU backend's from_float for q8_0 and q8_K), in one
// place for every kernel that writes 8-bit activations: act_quant_kernel (gemv_q8.cu) and the RMSNorm
// kernels that quantize their own output (elementwise.cu, CudaOptions::fuse_norm_quant). Both call the
// same functions below, so their bytes are identical by construction; tests/cuda/test_cuda_act_quant.cpp
// compiles this header for the host and compares it with core's quantize_row(Q8_0 / Q8_K).
//
// Work unit: one warp quantizes 256 consecutive activations of a row, lane l holding values 8l..8l+7
// (e0 = the row index of its first value; lanes past the row end hold zeros and are not "live").
//  - kActQ8_0: per 32 values (4 lanes) d = fp16(amax/127), q = round-half-even(x·(127/amax)) saturated to
//    int8, NaN → −128 (quant_q8_0_act_scalar);
//  - kActQ8_K: per 256 values, max = the value of largest magnitude (the first one on ties),
//    iscale = −127/max, q = min(127, round-half-even(iscale·x)), d = 1/iscale; all zero when max is 0
//    (quant_q8_k).
// The reductions (max, index of the max, Σq) are order-independent (max with a first-index tie rule,
// integer sums), so the shuffle butterfly below and any other reduction order give the same result; the
// per-lane parts are split out (lane_* / finish_*) so that the host test runs them per emulated lane.
//
// Scratch layout written by store_q8 (what the dp4a GEMV, the fused GEMVs and MMQ read; gemv_q8.cu
// gemv_fast_scratch_bytes / q8_scratch): q (rows, K) int8; d (rows, K/32) FP32 (a q8_K scale repeated 8
// times so the dot kernels stay per 32); Σq (rows, K/32) int32; for q8_K also the block sums split as
// Σq = 64·h + l (h in −64..63, l in 0..63) per 256 values, (rows, K/256) uint4 = bytes
// [h0..h3][h4..h7][l0..l3][l4..l7] (MMQ's min terms as int8 tensor-core operands).
#pragma once
#ifdef PG_CUDA_HOST_SHIM
#include "cuda_host_shim.h"
#else
#include <cuda_fp16.h>
#endif

#include <math.h>

#include <cstdint>

namespace pg::cuda::aq {

// The two roundings (the values of kernels.h's kActQ8_0 / kActQ8_K; this header does not include kernels.h so
// that it compiles on the host without the CUDA toolkit; gemv_q8.cu checks that they agree).
constexpr int kQ8_0 = 1, kQ8_K = 2;

// ---- per-lane parts (host-testable) ---------------------------------------------------------------------

// q8_0: |max| of the lane's 8 values.
__device__ __forceinline__ float lane_amax(const float (&v)[8]) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(v[j]));
  return amax;
}

// q8_0: the lane's quants and its block's scale from the block's amax (the 4 lanes' maximum).
__device__ __forceinline__ void finish_q8_0(const float (&v)[8], float amax, int (&q)[8], float& d) {
  d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float t = rintf(__fmul_rn(v[j], id));
    q[j] = t != t ? -128 : static_cast<int>(fminf(fmaxf(t, -128.0f), 127.0f));
  }
}

// q8_K: the lane's value of largest magnitude (amax = its magnitude, mx = the signed value, idx = its row
// index; the first one on ties; idx = INT_MAX when every value is zero).
struct MaxState {
  float amax, mx;
  int idx;
};
__device__ __forceinline__ MaxState lane_max(const float (&v)[8], int64_t e0) {
  MaxState s{0.0f, 0.0f, 0x7fffffff};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float a = fabsf(v[j]);
    if (a > s.amax) s.amax = a, s.mx = v[j], s.idx = static_cast<int>(e0) + j;
  }
  return s;
}
// Merge of two lanes' states: the larger magnitude, the lower index on ties (so: the first in the row).
__device__ __forceinline__ MaxState merge_max(MaxState a, MaxState o) {
  if (o.amax > a.amax || (o.amax == a.amax && o.idx < a.idx)) a = o;
  return a;
}
// q8_K: the lane's quants and the block's scale from the block's merged state.
__device__ __forceinline__ void finish_q8_k(const float (&v)[8], const MaxState& s, int (&q)[8], float& d) {
  if (s.amax == 0.0f) {
    d = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = 0;
  } else {
    const float iscale = __fdiv_rn(-127.0f, s.mx);
#pragma unroll
    for (int j = 0; j < 8; ++j) q[j] = min(127, __float2int_rn(__fmul_rn(iscale, v[j])));
    d = __fdiv_rn(1.0f, iscale);
  }
}

__device__ __forceinline__ int lane_qsum(const int (&q)[8]) {
  int s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += q[j];
  return s;
}

// The 8 block sums of one 256-value unit (sums[u] = Σq of values 32u..32u+31) as MMQ's split operand.
__device__ __forceinline__ uint4 pack_split(const int (&sums)[8]) {
  uint32_t hw[2] = {0, 0}, lw[2] = {0, 0};
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    hw[u >> 2] |= (static_cast<uint32_t>(sums[u] >> 6) & 0xffu) << (8 * (u & 3));
    lw[u >> 2] |= (static_cast<uint32_t>(sums[u] & 63)) << (8 * (u & 3));
  }
  return uint4{hw[0], hw[1], lw[0], lw[1]};
}

// ---- the warp routine (device only: shuffles) -----------------------------------------------------------

// One warp, 256 values (lane l: v = values e0..e0+7, e0 = 256·unit + 8l; zeros past the row end): q and d of
// this lane's values in the rounding MODE. Every lane must take part (full-mask shuffles).
template <int MODE>
__device__ __forceinline__ void quantize_warp(const float (&v)[8], int64_t e0, int (&q)[8], float& d) {
  if constexpr (MODE == kQ8_K) {
    MaxState s = lane_max(v, e0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      MaxState t;
      t.amax = __shfl_xor_sync(0xffffffffu, s.amax, o);
      t.mx = __shfl_xor_sync(0xffffffffu, s.mx, o);
      t.idx = __shfl_xor_sync(0xffffffffu, s.idx, o);
      s = merge_max(s, t);
    }
    finish_q8_k(v, s, q, d);
  } else {
    float amax = lane_amax(v);
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));  // the 4 lanes of one 32-value block
    finish_q8_0(v, amax, q, d);
  }
}

// Σq of this lane's 32-value block (the 4 lanes of the block), in every lane. Every lane takes part.
__device__ __forceinline__ int block_qsum(const int (&q)[8]) {
  int qs = lane_qsum(q);
  qs += __shfl_xor_sync(0xffffffffu, qs, 1);
  qs += __shfl_xor_sync(0xffffffffu, qs, 2);
  return qs;
}

// Quantizes one warp's 256 values (as quantize_warp) and writes them into the scratch layout above:
// row r of a (rows, K) activation, e0 = 256·unit + 8·lane, live = e0 < K. Buffers: q_out (rows, K) int8,
// d_out (rows, K/32) FP32, s_out (rows, K/32) int32 or null, split_out (rows, ceil(K/256)) uint4 or null
// (q8_K only). Every lane takes part.
template <int MODE>
__device__ __forceinline__ void quantize_store_q8(const float (&v)[8], int lane, int64_t r, int64_t K, int64_t e0, bool live, int8_t* q_out,
                                                  float* d_out, int32_t* s_out, uint4* split_out) {
  int q[8];
  float d;
  quantize_warp<MODE>(v, e0, q, d);
  const int qs = block_qsum(q);
  if constexpr (MODE == kQ8_K) {
    if (split_out) {
      int sums[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) sums[u] = __shfl_sync(0xffffffffu, qs, 4 * u);
      if (lane == 0) split_out[r * ((K + 255) / 256) + e0 / 256] = pack_split(sums);
    }
  }
  if (!live) return;
  uint32_t w0 = 0, w1 = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    w0 |= (static_cast<uint32_t>(q[j]) & 0xffu) << (8 * j);
    w1 |= (static_cast<uint32_t>(q[4 + j]) & 0xffu) << (8 * j);
  }
  *reinterpret_cast<uint2*>(q_out + r * K + e0) = uint2{w0, w1};
  if ((lane & 3) == 0) {
    d_out[r * (K / 32) + e0 / 32] = d;
    if (s_out) s_out[r * (K / 32) + e0 / 32] = qs;
  }
}

}  // namespace pg::cuda::aq
