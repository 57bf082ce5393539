// Attention over the paged KV cache: flash-attention style (online softmax, one pass over the keys),
// split-K over the key range ("flash decoding") with a combine kernel when one pass per head would
// leave the GPU idle, FP32 arithmetic.
//
// One block handles BQ consecutive batch rows × HP query heads that share one KV head (GQA), over one
// split of the key range. Keys stream through shared memory 32 at a time (converted to FP32 once, then
// read by every (row, head) pair of the block); lane j of a warp owns key j for the scores and
// dimension j (+32i) for the output accumulator. Rows of different sequences in one tile are handled in
// separate passes. Positions, sequence slots and the block table are read on the device, so a decode
// step's launches do not depend on host-side lengths except through the grid size (README.md: graphs).
// The KV element type is a template parameter (F32, F16); every other KV type pair (core/kv_quant.h) takes
// attn_kvq_kernel below, which decodes the cache's own blocks into the same tiles.
// Token trees (speculative verification): a row with a tree mask sees [begin, kv_len[r]) plus the draft
// positions kv_len[r] + j of its mask bits (backend.h: AttentionBatch); the same tiles and softmax serve
// it, keys outside the row's set are masked like keys past a causal row's end.
// Speed notes: decode reads each cached K/V row once per KV head (bandwidth-bound, as it should be);
// prefill is SIMT FP32 and re-reads K/V once per tile of BQ rows — a tensor-core (mma) tile path is the
// next step for long prompts.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "core/error.h"
#include "core/kv_quant.h"

namespace pg::cuda {
namespace {

constexpr int kKeys = 32;   // keys per tile (one per lane)
constexpr int kMaxPW = 4;   // (row, head) pairs per warp
constexpr int kMaxP = 32;   // pairs per block

struct AttnParams {
  AttentionArgs a;
  int bq, hp, head_splits, n_splits, split_target;
  float* part_acc;  // (n_splits, n, n_head, head_dim)
  float* part_ml;   // (n_splits, n, n_head, 2)
};

template <bool F16>
struct KvElem;
template <>
struct KvElem<false> {
  static constexpr int kPerVec = 4;  // elements per 16-byte vector
  __device__ static void to_f32(const uint4& v, float (&o)[8]) {
    o[0] = __uint_as_float(v.x), o[1] = __uint_as_float(v.y), o[2] = __uint_as_float(v.z), o[3] = __uint_as_float(v.w);
  }
};
template <>
struct KvElem<true> {
  static constexpr int kPerVec = 8;
  __device__ static void to_f32(const uint4& v, float (&o)[8]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      o[2 * i] = h2f(w[i]);
      o[2 * i + 1] = h2f(w[i] >> 16);
    }
  }
};

// q·k over n (a multiple of 8) shared-memory values in four independent FMA chains: one chain of n dependent
// FMAs was the score's latency (n = 128: ~4 cycles each, per key tile and head).
__device__ __forceinline__ float dot_smem(const float* q, const float* k, int n) {
  float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
  for (int d = 0; d < n; d += 4) {
    a0 = fmaf(q[d], k[d], a0);
    a1 = fmaf(q[d + 1], k[d + 1], a1);
    a2 = fmaf(q[d + 2], k[d + 2], a2);
    a3 = fmaf(q[d + 3], k[d + 3], a3);
  }
  return (a0 + a1) + (a2 + a3);
}

// Split z takes its share of this pass's keys [lo, hi): chunks of max(64, ⌈(hi − lo) / target⌉) keys in whole
// tiles, so that the partition depends only on the range and the plan's split target (the SM count and head
// layout), not on the grid. The range is read on the device: a grid sized for a graph's bucket (make_plan)
// spreads the actual keys like an eager launch of the exact length does, and both produce the same bits
// (sizing the chunks by the bucket left most splits empty and a few walking the whole context). The grid
// always has ⌈(hi − lo) / chunk⌉ ≤ min(target, ⌈max_kv / 64⌉) splits; the ones past the range stay empty.
__device__ __forceinline__ void split_range(int& lo, int& hi, int z, int n_splits, int target) {
  if (n_splits <= 1 || hi <= lo) return;
  const int chunk = max(64, (((hi - lo) + target - 1) / target + kKeys - 1) / kKeys * kKeys);
  const int slo = lo + z * chunk;
  hi = min(hi, slo + chunk);
  lo = slo;
}

template <int DMAX, bool F16>
__global__ void __launch_bounds__(256) attn_kernel(const AttnParams P) {
  const AttentionArgs& p = P.a;
  constexpr int NI = DMAX / 32;  // accumulator elements per lane
  extern __shared__ __align__(16) float sm[];
  __shared__ int sh_seq[kMaxP], sh_pos[kMaxP], sh_end[kMaxP], sh_hi[kMaxP], sh_cell[kKeys];
  __shared__ uint32_t sh_mask[kMaxP][kAttnMaskWords];  // tree rows: visible draft positions end + j

  const int hd = p.head_dim;
  const int nw = static_cast<int>(blockDim.x >> 5), warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int r0 = static_cast<int>(blockIdx.x) * P.bq;
  const int nr = min(P.bq, p.n - r0);
  const int group = p.n_head / p.n_head_kv;
  const int kvh = static_cast<int>(blockIdx.y) / P.head_splits;
  const int h0 = kvh * group + (static_cast<int>(blockIdx.y) % P.head_splits) * P.hp;
  const int npairs = nr * P.hp;
  const int z = static_cast<int>(blockIdx.z);

  float* qs = sm;                        // (npairs, hd)
  float* ks = qs + P.bq * P.hp * hd;     // (kKeys, hd + 1)
  float* vs = ks + kKeys * (hd + 1);     // (kKeys, hd)

  // Row i sees [begin, end) and, with a tree mask, end + j for its mask bits j; hi bounds both.
  for (int i = static_cast<int>(threadIdx.x); i < nr; i += blockDim.x) {
    sh_seq[i] = p.seq[r0 + i];
    const int pos = p.positions[r0 + i];
    sh_pos[i] = pos;
    const int end = p.tree_mask ? p.kv_len[r0 + i] : pos + 1;
    int hi = end;
#pragma unroll
    for (int w = 0; w < kAttnMaskWords; ++w) {
      const uint32_t m = p.tree_mask ? p.tree_mask[static_cast<int64_t>(r0 + i) * kAttnMaskWords + w] : 0u;
      sh_mask[i][w] = m;
      if (m) hi = end + 32 * w + 32 - __clz(static_cast<int>(m));  // one past the highest set bit
    }
    sh_end[i] = end;
    sh_hi[i] = hi;
  }
  for (int idx = static_cast<int>(threadIdx.x); idx < npairs * hd; idx += blockDim.x) {
    const int pi = idx / hd, d = idx % hd;
    const int r = pi / P.hp, hh = pi % P.hp;
    qs[idx] = p.q[static_cast<int64_t>(r0 + r) * p.q_stride + static_cast<int64_t>(h0 + hh) * hd + d];
  }
  __syncthreads();

  float m[kMaxPW], l[kMaxPW], acc[kMaxPW][NI];
#pragma unroll
  for (int j = 0; j < kMaxPW; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < NI; ++i) acc[j][i] = 0.0f;
  }

  const int64_t kv_w = static_cast<int64_t>(p.n_head_kv) * hd;
  const auto* kc = static_cast<const uint8_t*>(p.k);
  const auto* vc = static_cast<const uint8_t*>(p.v);
  constexpr int esize = F16 ? 2 : 4;
  const int vpr = hd / KvElem<F16>::kPerVec;  // 16-byte vectors per key row

  uint32_t remaining = nr >= 32 ? 0xffffffffu : ((1u << nr) - 1u);
  while (remaining) {
    const int s = sh_seq[__ffs(remaining) - 1];
    uint32_t pass = 0;
    int lo = 0x7fffffff, hi = 0;
    for (int i = 0; i < nr; ++i)
      if (((remaining >> i) & 1) && sh_seq[i] == s) {
        pass |= 1u << i;
        const int begin = p.sliding_window > 0 ? max(0, sh_pos[i] + 1 - p.sliding_window) : 0;
        lo = min(lo, begin);
        hi = max(hi, sh_hi[i]);
      }
    remaining &= ~pass;
    split_range(lo, hi, z, P.n_splits, P.split_target);
    const int32_t* table = p.block_table + static_cast<int64_t>(s) * p.max_blocks;
    // Latency, not bandwidth, bounds a decode block (a few warps per SM walking its split tile by tile):
    // the cells of the next tile are looked up while this one is consumed, and each thread issues all of
    // its 16-byte K/V loads of a tile before the first conversion (kBatch in flight, not one).
    const auto cell_of = [&](int kp) { return kp < hi ? table[kp / p.block_size] * p.block_size + kp % p.block_size : -1; };
    int next_cell = threadIdx.x < kKeys ? cell_of(lo + static_cast<int>(threadIdx.x)) : -1;
    const int n_items = 2 * kKeys * vpr;  // 16-byte vectors of one K and one V tile
    for (int kt = lo; kt < hi; kt += kKeys) {
      __syncthreads();  // previous tile fully consumed
      if (threadIdx.x < kKeys) sh_cell[threadIdx.x] = next_cell;
      __syncthreads();
      constexpr int kBatch = 8;
      for (int i0 = static_cast<int>(threadIdx.x); i0 < n_items; i0 += kBatch * static_cast<int>(blockDim.x)) {
        uint4 raw[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int idx = i0 + b * static_cast<int>(blockDim.x);
          raw[b] = make_uint4(0u, 0u, 0u, 0u);  // all-zero bits are 0.0 in F32 and F16: masked keys
          if (idx < n_items) {
            const int which = idx / (kKeys * vpr), rem = idx % (kKeys * vpr), key = rem / vpr, vi = rem % vpr;
            const int cell = sh_cell[key];
            if (cell >= 0)
              raw[b] = *reinterpret_cast<const uint4*>((which ? vc : kc) +
                                                       (static_cast<int64_t>(cell) * kv_w + static_cast<int64_t>(kvh) * hd) * esize + vi * 16);
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int idx = i0 + b * static_cast<int>(blockDim.x);
          if (idx >= n_items) break;
          const int which = idx / (kKeys * vpr), rem = idx % (kKeys * vpr), key = rem / vpr, vi = rem % vpr;
          float f[8];
          KvElem<F16>::to_f32(raw[b], f);
          float* dst = which ? vs + key * hd : ks + key * (hd + 1);
#pragma unroll
          for (int e = 0; e < KvElem<F16>::kPerVec; ++e) dst[vi * KvElem<F16>::kPerVec + e] = f[e];
        }
      }
      if (threadIdx.x < kKeys) next_cell = cell_of(kt + kKeys + static_cast<int>(threadIdx.x));
      __syncthreads();

      const int kp = kt + lane;
#pragma unroll
      for (int j = 0; j < kMaxPW; ++j) {
        const int pi = warp + nw * j;
        if (pi >= npairs) break;
        const int ri = pi / P.hp;
        if (!((pass >> ri) & 1)) continue;
        const int end = sh_end[ri];
        const int begin = p.sliding_window > 0 ? max(0, sh_pos[ri] + 1 - p.sliding_window) : 0;
        bool valid = kp < hi && kp >= begin;
        if (valid && kp >= end) {  // past the contiguous range: a draft position of this row's tree?
          const int j = kp - end;
          valid = j < 32 * kAttnMaskWords && ((sh_mask[ri][j >> 5] >> (j & 31)) & 1u);
        }
        const float* qv = qs + pi * hd;
        const float* kv = ks + lane * (hd + 1);
        float sc = dot_smem(qv, kv, hd);
        sc *= p.scale;
        if (p.softcap > 0.0f) sc = p.softcap * tanhf(sc / p.softcap);
        sc = valid ? sc : -INFINITY;
        const float mt = warp_max(sc);
        if (mt == -INFINITY) continue;
        const float mn = fmaxf(m[j], mt);
        const float corr = expf(m[j] - mn);
        const float pr = valid ? expf(sc - mn) : 0.0f;
        l[j] = l[j] * corr + warp_sum(pr);
#pragma unroll
        for (int i = 0; i < NI; ++i) acc[j][i] *= corr;
        for (int jj = 0; jj < kKeys; ++jj) {
          const float pj = __shfl_sync(0xffffffffu, pr, jj);
          if (pj == 0.0f) continue;
          const float* vr = vs + jj * hd;
#pragma unroll
          for (int i = 0; i < NI; ++i) {
            const int d = lane + 32 * i;
            if (d < hd) acc[j][i] = fmaf(pj, vr[d], acc[j][i]);
          }
        }
        m[j] = mn;
      }
    }
  }

  // Results: final output (one split) or this split's partial (acc, m, l).
#pragma unroll
  for (int j = 0; j < kMaxPW; ++j) {
    const int pi = warp + nw * j;
    if (pi >= npairs) break;
    const int r = r0 + pi / P.hp, h = h0 + pi % P.hp;
    if (P.n_splits == 1) {
      const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
      float* o = p.out + static_cast<int64_t>(r) * p.out_stride + static_cast<int64_t>(h) * hd;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) o[d] = acc[j][i] * inv;
      }
    } else {
      const int64_t slot = (static_cast<int64_t>(z) * p.n + r) * p.n_head + h;
      float* o = P.part_acc + slot * hd;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) o[d] = acc[j][i];
      }
      if (lane == 0) {
        P.part_ml[2 * slot] = m[j];
        P.part_ml[2 * slot + 1] = l[j];
      }
    }
  }
}

// Merge weights of the split partials of one (row, head), in shared memory: w[z] = exp(m_z − M) for the
// splits that saw a key (l_z > 0), else 0; returns 1 / Σ_z w_z·l_z (0 when none did). The splits' (m, l)
// are read by all threads at once and L is summed in split order by every thread: a serial loop over the
// splits by each thread (one dependent L2 read per split, ~130 of them per decode head) made this combine
// cost more than the attention itself. One non-empty split gives w = 1: the one-split path's bits.
// Shared memory: wm, wl (n_splits floats each).
__device__ float combine_weights(const float* part_ml, int n_splits, int64_t per_split, int64_t rh, float* wm, float* wl) {
  __shared__ float red[32];
  float mx = -INFINITY;
  for (int z = static_cast<int>(threadIdx.x); z < n_splits; z += static_cast<int>(blockDim.x)) {
    const float mz = part_ml[2 * (z * per_split + rh)], lz = part_ml[2 * (z * per_split + rh) + 1];
    wm[z] = lz > 0.0f ? mz : -INFINITY;
    wl[z] = lz;
    mx = fmaxf(mx, wm[z]);
  }
  mx = warp_max(mx);
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5), nw = static_cast<int>((blockDim.x + 31) >> 5);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < nw; ++i) M = fmaxf(M, red[i]);
  for (int z = static_cast<int>(threadIdx.x); z < n_splits; z += static_cast<int>(blockDim.x))
    wm[z] = wl[z] > 0.0f ? expf(wm[z] - M) : 0.0f;
  __syncthreads();
  float L = 0.0f;
  for (int z = 0; z < n_splits; ++z) L += wl[z] > 0.0f ? wl[z] * wm[z] : 0.0f;
  return L > 0.0f ? 1.0f / L : 0.0f;
}

// Merges the split partials of one (row, head) per block. Dynamic shared memory: 2·n_splits floats.
__global__ void attn_combine_kernel(const float* part_acc, const float* part_ml, int n_splits, int n, int n_head, int hd, float* out,
                                    int64_t out_stride) {
  extern __shared__ __align__(16) float cw[];  // (2, n_splits): merge weights, then the splits' l
  const int64_t rh = blockIdx.x;
  const int r = static_cast<int>(rh / n_head), h = static_cast<int>(rh % n_head);
  const int64_t per_split = static_cast<int64_t>(n) * n_head;
  const float inv = combine_weights(part_ml, n_splits, per_split, rh, cw, cw + n_splits);
  for (int d = static_cast<int>(threadIdx.x); d < hd; d += blockDim.x) {
    float s = 0.0f;
#pragma unroll 8
    for (int z = 0; z < n_splits; ++z)
      if (cw[z] != 0.0f) s += part_acc[(z * per_split + rh) * hd + d] * cw[z];
    out[static_cast<int64_t>(r) * out_stride + static_cast<int64_t>(h) * hd + d] = s * inv;
  }
}

// ---- typed caches: any pair of KV types (core/kv_quant.h) ------------------------------------------------
// The same blocking, tiling, masking and online softmax as attn_kernel, with three differences (the F32/F32
// and F16/F16 pairs never come here: they keep attn_kernel):
//  - K and V tiles are decoded from the cache's own bytes (16 values per thread and step for the block types
//    with common.cuh's decoders, bit-identical to core's dequantizers; 8 for F32/F16/BF16) straight into the
//    FP32 shared-memory tiles: no dequantized copy of the cache exists anywhere.
//  - Widths: each head is stored as wk (K) / wv (V) values, head_dim rounded up to the type's block (32) or
//    TQ3_0 group (128). The query is zero-padded to wk, so padding keys contribute nothing; outputs keep
//    head_dim values.
//  - TQ3_0 stores values in the rotated domain R(x). A TQ3_0 K rotates the query once per block (q·k =
//    R(q)·R(k), R orthogonal); a TQ3_0 V accumulates Σ p·R(v) = R(Σ p·v) and un-rotates the final output
//    once (in this kernel with one split, else in attn_kvq_combine_kernel after the merge).
// Run on the H200 since 2026-12-02: tests/cuda/test_cuda_kv_types.cpp (CUDA vs CPU ≤ 6e-6 on the tiny models).

struct KvqParams {
  AttentionArgs a;
  int bq, hp, head_splits, n_splits, split_target;
  int wk, wv;                      // stored values per K / V head
  size_t k_head_bytes, v_head_bytes;
  int staged;                      // 1: tiles staged as raw 32-bit words in shared memory (make_kvq_plan)
  float* part_acc;                 // (n_splits, n, n_head, wv), rotated domain for a TQ3_0 V
  float* part_ml;                  // (n_splits, n, n_head, 2)
};

// kvq_plain / kvq_load (the per-type tile decoders): kv_quant.cuh.

// TQ3_0 rotations of shared-memory vectors by the whole block / one warp: kv_quant.cuh's tq3_rotate_par.
__device__ __forceinline__ void tq3_rotate_block(float* x, int n, bool inverse) {
  tq3_rotate_par(x, n, inverse, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), [] { __syncthreads(); });
}
__device__ __forceinline__ void tq3_rotate_warp(float* x, int n, bool inverse, int lane) {
  tq3_rotate_par(x, n, inverse, lane, 32, [] { __syncwarp(); });
}

template <int DMAX>
__global__ void __launch_bounds__(256) attn_kvq_kernel(const KvqParams P) {
  const AttentionArgs& p = P.a;
  constexpr int NI = DMAX / 32;  // accumulator elements per lane (over the wv stored V values)
  extern __shared__ __align__(16) float sm[];
  __shared__ int sh_seq[kMaxP], sh_pos[kMaxP], sh_end[kMaxP], sh_hi[kMaxP], sh_cell[kKeys];
  __shared__ uint32_t sh_mask[kMaxP][kAttnMaskWords];

  const int hd = p.head_dim, wk = P.wk, wv = P.wv;
  const DType kt = p.k_type, vt = p.v_type;
  const bool rot_v = vt == DType::TQ3_0;
  const int nw = static_cast<int>(blockDim.x >> 5), warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int r0 = static_cast<int>(blockIdx.x) * P.bq;
  const int nr = min(P.bq, p.n - r0);
  const int group = p.n_head / p.n_head_kv;
  const int kvh = static_cast<int>(blockIdx.y) / P.head_splits;
  const int h0 = kvh * group + (static_cast<int>(blockIdx.y) % P.head_splits) * P.hp;
  const int npairs = nr * P.hp;
  const int z = static_cast<int>(blockIdx.z);

  float* qs = sm;                     // (bq·hp, wk): zero-padded queries, rotated for a TQ3_0 K
  float* ks = qs + P.bq * P.hp * wk;  // (kKeys, wk + 1)
  float* vs = ks + kKeys * (wk + 1);  // (kKeys, wv)
  float* os = vs + kKeys * wv;        // (nw, wv), TQ3_0 V only: a warp's output before un-rotation
  // (kKeys, kwords + vwords) 32-bit words: the tile's K and V heads as stored, staged when the head and
  // row sizes are multiples of 4 bytes (every type at head_dim % 32 == 0), so that the block-type decoders
  // read shared memory instead of issuing one dependent byte-sized global load after another.
  // Each head starts on a 16-byte boundary (kstride, hw: multiples of 4 words): the F32/F16/BF16 decoders
  // read 16-byte vectors.
  const bool staged = P.staged != 0;
  const int kwords = staged ? static_cast<int>(P.k_head_bytes / 4) : 0, vwords = staged ? static_cast<int>(P.v_head_bytes / 4) : 0;
  const int kstride = (kwords + 3) & ~3, vstride = (vwords + 3) & ~3;
  uint32_t* raw = reinterpret_cast<uint32_t*>(os + (rot_v ? nw * wv : 0));

  for (int i = static_cast<int>(threadIdx.x); i < nr; i += blockDim.x) {
    sh_seq[i] = p.seq[r0 + i];
    const int pos = p.positions[r0 + i];
    sh_pos[i] = pos;
    const int end = p.tree_mask ? p.kv_len[r0 + i] : pos + 1;
    int hi = end;
#pragma unroll
    for (int w = 0; w < kAttnMaskWords; ++w) {
      const uint32_t m = p.tree_mask ? p.tree_mask[static_cast<int64_t>(r0 + i) * kAttnMaskWords + w] : 0u;
      sh_mask[i][w] = m;
      if (m) hi = end + 32 * w + 32 - __clz(static_cast<int>(m));
    }
    sh_end[i] = end;
    sh_hi[i] = hi;
  }
  for (int idx = static_cast<int>(threadIdx.x); idx < npairs * wk; idx += blockDim.x) {
    const int pi = idx / wk, d = idx % wk;
    const int r = pi / P.hp, hh = pi % P.hp;
    qs[idx] = d < hd ? p.q[static_cast<int64_t>(r0 + r) * p.q_stride + static_cast<int64_t>(h0 + hh) * hd + d] : 0.0f;
  }
  __syncthreads();
  if (kt == DType::TQ3_0) tq3_rotate_block(qs, npairs * wk, false);  // uniform over the block

  float m[kMaxPW], l[kMaxPW], acc[kMaxPW][NI];
#pragma unroll
  for (int j = 0; j < kMaxPW; ++j) {
    m[j] = -INFINITY;
    l[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < NI; ++i) acc[j][i] = 0.0f;
  }

  const auto* kc = static_cast<const uint8_t*>(p.k);
  const auto* vc = static_cast<const uint8_t*>(p.v);
  const int ek = kvq_plain(kt) ? 8 : 16, ev = kvq_plain(vt) ? 8 : 16;  // values per decode step
  const int uk = wk / ek, uv = wv / ev, upk = uk + uv;                  // decode steps per key

  uint32_t remaining = nr >= 32 ? 0xffffffffu : ((1u << nr) - 1u);
  while (remaining) {
    const int s = sh_seq[__ffs(remaining) - 1];
    uint32_t pass = 0;
    int lo = 0x7fffffff, hi = 0;
    for (int i = 0; i < nr; ++i)
      if (((remaining >> i) & 1) && sh_seq[i] == s) {
        pass |= 1u << i;
        const int begin = p.sliding_window > 0 ? max(0, sh_pos[i] + 1 - p.sliding_window) : 0;
        lo = min(lo, begin);
        hi = max(hi, sh_hi[i]);
      }
    remaining &= ~pass;
    split_range(lo, hi, z, P.n_splits, P.split_target);
    const int32_t* table = p.block_table + static_cast<int64_t>(s) * p.max_blocks;
    // As attn_kernel: the next tile's cells are looked up while this one is consumed.
    const auto cell_of = [&](int kp) { return kp < hi ? table[kp / p.block_size] * p.block_size + kp % p.block_size : -1; };
    int next_cell = threadIdx.x < kKeys ? cell_of(lo + static_cast<int>(threadIdx.x)) : -1;
    const int hw = kstride + vstride, n_words = kKeys * hw;
    for (int kt0 = lo; kt0 < hi; kt0 += kKeys) {
      __syncthreads();
      if (threadIdx.x < kKeys) sh_cell[threadIdx.x] = next_cell;
      __syncthreads();
      if (staged) {  // raw words of the tile, kBatch loads in flight per thread
        constexpr int kBatch = 8;
        for (int i0 = static_cast<int>(threadIdx.x); i0 < n_words; i0 += kBatch * static_cast<int>(blockDim.x)) {
          uint32_t w[kBatch];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const int idx = i0 + b * static_cast<int>(blockDim.x);
            w[b] = 0u;
            if (idx < n_words) {
              const int key = idx / hw, wi = idx % hw, cell = sh_cell[key];
              if (cell >= 0 && wi < kwords)
                w[b] = reinterpret_cast<const uint32_t*>(kc + static_cast<size_t>(cell) * p.k_row_bytes + static_cast<size_t>(kvh) * P.k_head_bytes)[wi];
              else if (cell >= 0 && wi >= kstride && wi - kstride < vwords)
                w[b] = reinterpret_cast<const uint32_t*>(vc + static_cast<size_t>(cell) * p.v_row_bytes +
                                                         static_cast<size_t>(kvh) * P.v_head_bytes)[wi - kstride];
            }
          }
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const int idx = i0 + b * static_cast<int>(blockDim.x);
            if (idx < n_words) raw[idx] = w[b];
          }
        }
        __syncthreads();
      }
      if (threadIdx.x < kKeys) next_cell = cell_of(kt0 + kKeys + static_cast<int>(threadIdx.x));
      for (int idx = static_cast<int>(threadIdx.x); idx < kKeys * upk; idx += blockDim.x) {
        const int key = idx / upk, u0 = idx % upk;
        const bool is_v = u0 >= uk;
        const int u = is_v ? u0 - uk : u0, e = is_v ? ev : ek;
        const int cell = sh_cell[key];
        float f[16];
        if (cell >= 0) {
          const uint8_t* head = staged ? reinterpret_cast<const uint8_t*>(raw + key * hw + (is_v ? kstride : 0))
                                : is_v ? vc + static_cast<size_t>(cell) * p.v_row_bytes + static_cast<size_t>(kvh) * P.v_head_bytes
                                       : kc + static_cast<size_t>(cell) * p.k_row_bytes + static_cast<size_t>(kvh) * P.k_head_bytes;
          kvq_load(is_v ? vt : kt, head, u, f);
        } else {
#pragma unroll
          for (int i = 0; i < 16; ++i) f[i] = 0.0f;
        }
        float* dst = is_v ? vs + key * wv + u * e : ks + key * (wk + 1) + u * e;
#pragma unroll
        for (int i = 0; i < 16; ++i)
          if (i < e) dst[i] = f[i];
      }
      __syncthreads();

      const int kp = kt0 + lane;
#pragma unroll
      for (int j = 0; j < kMaxPW; ++j) {
        const int pi = warp + nw * j;
        if (pi >= npairs) break;
        const int ri = pi / P.hp;
        if (!((pass >> ri) & 1)) continue;
        const int end = sh_end[ri];
        const int begin = p.sliding_window > 0 ? max(0, sh_pos[ri] + 1 - p.sliding_window) : 0;
        bool valid = kp < hi && kp >= begin;
        if (valid && kp >= end) {
          const int jj = kp - end;
          valid = jj < 32 * kAttnMaskWords && ((sh_mask[ri][jj >> 5] >> (jj & 31)) & 1u);
        }
        const float* qv = qs + pi * wk;
        const float* kv = ks + lane * (wk + 1);
        float sc = dot_smem(qv, kv, wk);
        sc *= p.scale;
        if (p.softcap > 0.0f) sc = p.softcap * tanhf(sc / p.softcap);
        sc = valid ? sc : -INFINITY;
        const float mt = warp_max(sc);
        if (mt == -INFINITY) continue;
        const float mn = fmaxf(m[j], mt);
        const float corr = expf(m[j] - mn);
        const float pr = valid ? expf(sc - mn) : 0.0f;
        l[j] = l[j] * corr + warp_sum(pr);
#pragma unroll
        for (int i = 0; i < NI; ++i) acc[j][i] *= corr;
        for (int jj = 0; jj < kKeys; ++jj) {
          const float pj = __shfl_sync(0xffffffffu, pr, jj);
          if (pj == 0.0f) continue;
          const float* vr = vs + jj * wv;
#pragma unroll
          for (int i = 0; i < NI; ++i) {
            const int d = lane + 32 * i;
            if (d < wv) acc[j][i] = fmaf(pj, vr[d], acc[j][i]);
          }
        }
        m[j] = mn;
      }
    }
  }

#pragma unroll
  for (int j = 0; j < kMaxPW; ++j) {
    const int pi = warp + nw * j;
    if (pi >= npairs) break;
    const int r = r0 + pi / P.hp, h = h0 + pi % P.hp;
    if (P.n_splits == 1) {
      const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
      float* o = p.out + static_cast<int64_t>(r) * p.out_stride + static_cast<int64_t>(h) * hd;
      if (rot_v) {  // warp-uniform
        float* y = os + warp * wv;
#pragma unroll
        for (int i = 0; i < NI; ++i) {
          const int d = lane + 32 * i;
          if (d < wv) y[d] = acc[j][i] * inv;
        }
        __syncwarp();
        tq3_rotate_warp(y, wv, true, lane);
        for (int d = lane; d < hd; d += 32) o[d] = y[d];
        __syncwarp();
      } else {
#pragma unroll
        for (int i = 0; i < NI; ++i) {
          const int d = lane + 32 * i;
          if (d < hd) o[d] = acc[j][i] * inv;
        }
      }
    } else {
      const int64_t slot = (static_cast<int64_t>(z) * p.n + r) * p.n_head + h;
      float* o = P.part_acc + slot * wv;
#pragma unroll
      for (int i = 0; i < NI; ++i) {
        const int d = lane + 32 * i;
        if (d < wv) o[d] = acc[j][i];
      }
      if (lane == 0) {
        P.part_ml[2 * slot] = m[j];
        P.part_ml[2 * slot + 1] = l[j];
      }
    }
  }
}

// Merges the split partials (wv values each) of one (row, head) per block, un-rotates them for a TQ3_0 V,
// and writes the first hd values. Dynamic shared memory: wv floats.
__global__ void attn_kvq_combine_kernel(const float* part_acc, const float* part_ml, int n_splits, int n, int n_head, int hd, int wv,
                                        bool rot_v, float* out, int64_t out_stride) {
  extern __shared__ __align__(16) float y[];  // (wv) the merged output, then (2, n_splits) merge weights and l
  float* cw = y + wv;
  const int64_t rh = blockIdx.x;
  const int r = static_cast<int>(rh / n_head), h = static_cast<int>(rh % n_head);
  const int64_t per_split = static_cast<int64_t>(n) * n_head;
  const float inv = combine_weights(part_ml, n_splits, per_split, rh, cw, cw + n_splits);
  for (int d = static_cast<int>(threadIdx.x); d < wv; d += blockDim.x) {
    float s = 0.0f;
#pragma unroll 8
    for (int z = 0; z < n_splits; ++z)
      if (cw[z] != 0.0f) s += part_acc[(z * per_split + rh) * wv + d] * cw[z];
    y[d] = s * inv;
  }
  __syncthreads();
  if (rot_v) tq3_rotate_block(y, wv, true);
  for (int d = static_cast<int>(threadIdx.x); d < hd; d += blockDim.x) out[static_cast<int64_t>(r) * out_stride + static_cast<int64_t>(h) * hd + d] = y[d];
}

struct Plan {
  int hp, head_splits, bq, nw, n_row_tiles, n_splits, split_target, dmax;
  size_t smem;
};

Plan make_plan(const AttentionArgs& a, int n_sm) {
  PG_CHECK(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0, "attention: n_head must be a multiple of n_head_kv");
  PG_CHECK(a.head_dim > 0 && a.head_dim <= 256 && a.head_dim % 8 == 0, "attention: head_dim " + std::to_string(a.head_dim) +
                                                                            " unsupported on CUDA (multiple of 8, at most 256)");
  Plan pl{};
  const int g = a.n_head / a.n_head_kv;
  pl.hp = g;
  while (pl.hp > kMaxP) {  // largest divisor of the group size that fits a block
    int d = pl.hp - 1;
    while (g % d) --d;
    pl.hp = d;
  }
  pl.head_splits = g / pl.hp;
  pl.bq = std::max(1, std::min(kMaxP / pl.hp, a.n));
  const int pairs = pl.bq * pl.hp;
  pl.nw = std::min(8, pairs);
  pl.n_row_tiles = ceil_div(a.n, pl.bq);
  const int base = pl.n_row_tiles * a.n_head_kv * pl.head_splits;
  // Graph-captured steps size the grid for a fixed capacity; blocks past a row's length exit early.
  int max_kv = std::max(1, a.max_kv_len);
  if (a.kv_capacity > 0) {
    int cap = 64;
    while (cap < a.kv_capacity) cap *= 2;
    max_kv = std::max(max_kv, cap);
  }
  // Enough blocks for ~8 per SM: decode blocks are latency-bound, more in flight hide more of it.
  const int want = std::max(1, ceil_div(8 * n_sm, base));
  pl.split_target = want;
  pl.n_splits = std::max(1, std::min(want, ceil_div(max_kv, 64)));
  pl.dmax = a.head_dim <= 64 ? 64 : a.head_dim <= 128 ? 128 : 256;
  pl.smem = static_cast<size_t>(pairs * a.head_dim + kKeys * (a.head_dim + 1) + kKeys * a.head_dim) * sizeof(float);
  return pl;
}

template <int DMAX, bool F16>
void launch(const AttnParams& P, const Plan& pl, cudaStream_t stream) {
  auto kernel = attn_kernel<DMAX, F16>;
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(kernel), static_cast<int>(pl.smem));
  const dim3 grid(static_cast<unsigned>(pl.n_row_tiles), static_cast<unsigned>(P.a.n_head_kv * pl.head_splits),
                  static_cast<unsigned>(pl.n_splits));
  kernel<<<grid, pl.nw * 32, pl.smem, stream>>>(P);
  check_launch("attention");
}

// The typed path's widths and shared memory on top of make_plan's blocking (which depends only on the
// head counts, rows and lengths).
struct KvqPlan {
  Plan pl;
  int wk, wv;
  bool staged;
};
KvqPlan make_kvq_plan(const AttentionArgs& a, int n_sm) {
  KvqPlan kp{make_plan(a, n_sm), 0, 0, false};
  PG_CHECK(is_kv_type(a.k_type) && is_kv_type(a.v_type), "attention: " + kv_type_name(a.k_type) + "/" + kv_type_name(a.v_type) +
                                                            " is not a KV cache type pair (accepted: " + kv_type_list() + ")");
  kp.wk = kv_head_width(a.k_type, a.head_dim);
  kp.wv = kv_head_width(a.v_type, a.head_dim);
  PG_CHECK(kp.wk <= 256 && kp.wv <= 256, "attention: head_dim " + std::to_string(a.head_dim) + " stores more than 256 values per head as " +
                                             kv_type_name(a.k_type) + "/" + kv_type_name(a.v_type) + " (the CUDA limit)");
  PG_CHECK(a.k_row_bytes == kv_row_bytes(a.k_type, a.n_head_kv, a.head_dim) && a.v_row_bytes == kv_row_bytes(a.v_type, a.n_head_kv, a.head_dim),
           "attention: cache row bytes do not match the KV layout of n_head_kv·head_dim");
  const int w = std::max(kp.wk, kp.wv);
  kp.pl.dmax = w <= 64 ? 64 : w <= 128 ? 128 : 256;
  const int pairs = kp.pl.bq * kp.pl.hp;
  kp.pl.smem = static_cast<size_t>(pairs * kp.wk + kKeys * (kp.wk + 1) + kKeys * kp.wv + (a.v_type == DType::TQ3_0 ? kp.pl.nw * kp.wv : 0)) *
               sizeof(float);
  const size_t kb = kv_head_bytes(a.k_type, a.head_dim), vb = kv_head_bytes(a.v_type, a.head_dim);
  kp.staged = kb % 4 == 0 && vb % 4 == 0 && a.k_row_bytes % 4 == 0 && a.v_row_bytes % 4 == 0;
  if (kp.staged) kp.pl.smem += static_cast<size_t>(kKeys) * 16 * ((kb + 15) / 16 + (vb + 15) / 16);  // heads on 16-byte boundaries
  return kp;
}

template <int DMAX>
void launch_kvq(const KvqParams& P, const Plan& pl, cudaStream_t stream) {
  auto kernel = attn_kvq_kernel<DMAX>;
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(kernel), static_cast<int>(pl.smem));
  const dim3 grid(static_cast<unsigned>(pl.n_row_tiles), static_cast<unsigned>(P.a.n_head_kv * pl.head_splits),
                  static_cast<unsigned>(pl.n_splits));
  kernel<<<grid, pl.nw * 32, pl.smem, stream>>>(P);
  check_launch("attention (typed KV)");
}

void attention_kvq(const AttentionArgs& a, void* scratch, int n_sm, cudaStream_t stream) {
  const KvqPlan kp = make_kvq_plan(a, n_sm);
  const Plan& pl = kp.pl;
  PG_CHECK(pl.n_row_tiles <= 0x7fffffff && pl.n_splits <= 65535 && a.n_head_kv * pl.head_splits <= 65535, "attention: batch too large");
  KvqParams P{};
  P.a = a;
  P.bq = pl.bq;
  P.hp = pl.hp;
  P.head_splits = pl.head_splits;
  P.n_splits = pl.n_splits;
  P.split_target = pl.split_target;
  P.wk = kp.wk;
  P.wv = kp.wv;
  P.k_head_bytes = kv_head_bytes(a.k_type, a.head_dim);
  P.v_head_bytes = kv_head_bytes(a.v_type, a.head_dim);
  P.staged = kp.staged ? 1 : 0;
  if (pl.n_splits > 1) {
    PG_CHECK(scratch != nullptr, "attention: missing split scratch");
    P.part_acc = static_cast<float*>(scratch);
    P.part_ml = P.part_acc + static_cast<size_t>(pl.n_splits) * a.n * a.n_head * kp.wv;
  }
  switch (pl.dmax) {
    case 64: launch_kvq<64>(P, pl, stream); break;
    case 128: launch_kvq<128>(P, pl, stream); break;
    default: launch_kvq<256>(P, pl, stream); break;
  }
  if (pl.n_splits > 1) {
    const int threads = std::min(256, ceil_div(kp.wv, 32) * 32);
    attn_kvq_combine_kernel<<<static_cast<unsigned>(static_cast<int64_t>(a.n) * a.n_head), threads,
                              static_cast<size_t>(kp.wv + 2 * pl.n_splits) * sizeof(float), stream>>>(P.part_acc, P.part_ml, pl.n_splits, a.n, a.n_head, a.head_dim, kp.wv, a.v_type == DType::TQ3_0, a.out,
                                        a.out_stride);
    check_launch("attention combine (typed KV)");
  }
}

}  // namespace

size_t attention_scratch_bytes(const AttentionArgs& a, int n_sm) {
  if (a.typed) {
    const KvqPlan kp = make_kvq_plan(a, n_sm);
    if (kp.pl.n_splits <= 1) return 0;
    return static_cast<size_t>(kp.pl.n_splits) * static_cast<size_t>(a.n) * static_cast<size_t>(a.n_head) *
           static_cast<size_t>(kp.wv + 2) * sizeof(float);
  }
  const Plan pl = make_plan(a, n_sm);
  if (pl.n_splits <= 1) return 0;
  return static_cast<size_t>(pl.n_splits) * static_cast<size_t>(a.n) * static_cast<size_t>(a.n_head) *
         static_cast<size_t>(a.head_dim + 2) * sizeof(float);
}

void attention(const AttentionArgs& a, void* scratch, int n_sm, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.typed) return attention_kvq(a, scratch, n_sm, stream);
  const Plan pl = make_plan(a, n_sm);
  PG_CHECK(pl.n_row_tiles <= 0x7fffffff && pl.n_splits <= 65535 && a.n_head_kv * pl.head_splits <= 65535, "attention: batch too large");
  AttnParams P{};
  P.a = a;
  P.bq = pl.bq;
  P.hp = pl.hp;
  P.head_splits = pl.head_splits;
  P.n_splits = pl.n_splits;
  P.split_target = pl.split_target;
  if (pl.n_splits > 1) {
    PG_CHECK(scratch != nullptr, "attention: missing split scratch");
    P.part_acc = static_cast<float*>(scratch);
    P.part_ml = P.part_acc + static_cast<size_t>(pl.n_splits) * a.n * a.n_head * a.head_dim;
  }
  switch (pl.dmax * 2 + (a.kv_f16 ? 1 : 0)) {
    case 128: launch<64, false>(P, pl, stream); break;
    case 129: launch<64, true>(P, pl, stream); break;
    case 256: launch<128, false>(P, pl, stream); break;
    case 257: launch<128, true>(P, pl, stream); break;
    case 512: launch<256, false>(P, pl, stream); break;
    default: launch<256, true>(P, pl, stream); break;
  }
  if (pl.n_splits > 1) {
    const int threads = std::min(256, ceil_div(a.head_dim, 32) * 32);
    attn_combine_kernel<<<static_cast<unsigned>(static_cast<int64_t>(a.n) * a.n_head), threads,
                          static_cast<size_t>(2 * pl.n_splits) * sizeof(float), stream>>>(
        P.part_acc, P.part_ml, pl.n_splits, a.n, a.n_head, a.head_dim, a.out, a.out_stride);
    check_launch("attention combine");
  }
}

}  // namespace pg::cuda
