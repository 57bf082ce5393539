// Prefill attention on tensor cores (FA2 form) over the paged KV cache: F16, or any typed pair without F32
// (q8_0, q4_0, q4_1, q5_0, q5_1, bf16, tq3_0, mixed), read in the cache's own blocks. CudaOptions::
// fa_prefill_min_rows (default 32) selects it (typed caches also need CudaOptions::fa_prefill_typed);
// tests/cuda/test_cuda_attention_prefill.cpp proves it on the device (F16: passed on the H200, 2026-12-02;
// README.md: Attention). The typed path was written without device time: NOT YET RUN ON A GPU (its code
// runs in the host emulation below), hence off by default.
//
// Contract (attention_prefill): out (n, n_head·head_dim) FP32 = softmax(scale·q·kᵀ, soft-capped, masked)·v
// for causal rows — row r sees the keys of its sequence at logical positions [begin, positions[r]] with
// begin = 0 or, with a sliding window w, positions[r] + 1 − w — read through the block table exactly as
// attention.cu does (cell = table[seq][p / block_size]·block_size + p % block_size). Tree rows
// (tree_mask set: verification) see [begin, kv_len[r]) plus kv_len[r] + j for their mask bits j, as attention.cu. KV F16/F16 or typed (fa_typed_ok); head_dim 64, 128 or 256; n_head /
// n_head_kv ≤ 64.
//
// Layout: one block = 4 warps = 64 query rows of one KV head, a query row being a (batch row, head)
// pair: rows_per_block(g) = 64 / g consecutive batch rows × the g query heads of the KV head (GQA: the
// K/V tiles are read once for all of them). Warp w owns query rows 16w..16w+15 (one m16 tile): its Q
// fragments (FP32 → ×scale → FP16) stay in registers for the whole key loop. K and V tiles of BN keys
// (64; 32 at head 256, for registers) stream through shared memory with cp.async, double-buffered: the
// copy of tile t+1 is in flight while tile t is multiplied. Per tile and warp: S (16×BN) = Q·Kᵀ with
// mma.m16n8k16 (FP16 in, FP32 accumulate; K fragments by ldmatrix), then soft-cap, mask, online softmax
// in FP32 in base 2 (running max m and sum l per row; a quad of lanes shares a row), P rounded to FP16
// straight from the score registers into A fragments, O (16×D) += P·V (V fragments by ldmatrix.trans).
// Rows of different sequences in one tile run as separate passes over their own keys (rows outside the
// pass are masked), like attention.cu. When the grid is small (few rows at long depth) the key range is
// split over blockIdx.z and a combine kernel merges (m, l, O) partials: the grid has split_plan's n_splits
// (sized for the graph bucket), each split takes split_range's share of the pass's ACTUAL key range (read on
// the device), so splits past the real length exit at once and graph replay and eager give the same bits.
// Decode / verification calls (CudaOptions::fa_decode) use the same kernel: a block of 64 query rows holds
// 64/g batch rows × g heads, so one decode row fills g of the 64 MMA rows (still faster than attention.cu
// at g = 4..8 on the H200; a 16-row variant is future work).
//
// Typed caches (issue 12: attention reads each type directly, no dequantized copy of the cache): separate
// instantiations (TYPED = true; the F16 ones compile to the same code as before). Per tile, the raw bytes
// of each key's head (k_head_bytes: whole blocks) are cp.async-copied into one of two staging stages (tile
// t+1 in flight while t is used), then decoded by the whole block with kv_quant.cuh's kvq_load (the
// decoders of attn_kvq_kernel, values bit-identical to core's dequantizers) and rounded to FP16 into one
// K and one V tile of the usual layout; the mma code is the same. Head widths are the types' (DK = wk,
// DV = wv: head_dim rounded up to 32 or to TQ3_0's 128-value group, so only TQ3_0 at head 64 pads). TQ3_0
// stores R(x) (core/kv_quant.h): a TQ3_0 K rotates the block's 64 query rows once in shared memory before
// the key loop (q·k = R(q)·R(k), padding zero); a TQ3_0 V accumulates R(Σ p·v) and un-rotates once — the
// block's normalised rows in shared memory at the end, or, with split-K, fa_combine_typed_kernel after the
// merge. Shared memory: typed_smem_bytes (q8_0 at head 128: 70 KB, like F16's 68 KB).
//
// Numerics vs the FP32 kernel: q and p rounded to FP16 (relative 2⁻¹¹ each, random), l summed from the
// rounded p (so the weights used and the normalisation agree), exp2 of base-2 scores; typed caches also
// round the decoded K/V values to FP16 (the CPU uses them in FP32; BF16 values beyond the FP16 range
// would overflow, K/V never come near it). Expected relative output error ~3e-4 (typed 2.5e-4..5.1e-4 in the
// emulation), bounded at 2e-3 by the tests.
//
// Host emulation: with PG_CUDA_HOST_SHIM this file compiles with the host compiler against
// tests/cuda/cuda_thread_shim.h (one host thread per CUDA thread, the warp intrinsics, ldmatrix, mma and
// cp.async emulated per their PTX definitions, cp.async copies landing only at cp.async.wait_group), so
// tests/cuda/test_cuda_fa_emulated.cpp runs this kernel code itself — passes, masks, pipeline, softmax,
// split-K and the host plan — against the CPU backend without a GPU. Only the intrinsics differ.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "backend/cuda/attention_prefill.cuh"
#include "backend/cuda/kernels.h"
#include "core/error.h"
#include "core/kv_quant.h"
#ifdef PG_CUDA_HOST_SHIM
#include "cuda_thread_shim.h"  // namespace pg::cuda::host_emu: the emulated intrinsics
#define PG_FA_NAMESPACE pg::cuda::host_emu
#define PG_FA_LAUNCH(kernel, grid, block, smem, stream, ...) ::pg::cuda::host_emu::shim::launch(grid, block, smem, [&] { kernel(__VA_ARGS__); })
namespace pg::cuda::host_emu {
inline void grid_wait() {}  // PDL (pdl.cuh) has nothing to emulate: one kernel at a time
inline void grid_launch_dependents() {}
}  // namespace pg::cuda::host_emu
#else
#include <cuda_fp16.h>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/launch.h"
#define PG_FA_NAMESPACE pg::cuda
#include "backend/cuda/pdl.cuh"
#define PG_FA_LAUNCH(kernel, grid, block, smem, stream, ...) ::pg::cuda::launch(kernel, grid, block, smem, stream, __VA_ARGS__)
#endif
// The typed-KV tile decoders (kvq_load, bit-identical to core's dequantizers) and the TQ3_0 rotation, in
// pg::cuda (the host emulation's namespace sits inside it, so they resolve the same way in both builds).
#include "backend/cuda/kv_quant.cuh"

namespace PG_FA_NAMESPACE {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

struct FaParams {
  AttentionArgs a;
  int br;          // batch rows per block (fa::rows_per_block)
  int n_splits, split_target;  // fa::split_plan: splits in the grid; the target split_range divides a pass by
  int split_min_keys;          // fa::split_plan's chunk floor (SplitPlan::min_keys)
  float* part_acc;  // (n_splits, n, n_head, DV) unnormalised O of each split (rotated domain for a TQ3_0 V)
  float* part_ml;   // (n_splits, n, n_head, 2): running max (base 2) and sum of each split
  // Fused combine (AttentionArgs::fa_counters; not with a TQ3_0 V): (n_row_tiles, n_head_kv) arrival counts of
  // the splits, zero between launches; the last split of a (row tile, KV head) to arrive merges the partials
  // itself (no fa_combine_kernel launch) and resets its count. Null: the combine kernel runs.
  int* counters;
  // Typed caches only (TYPED kernels): bytes of one stored head, their pitch in the staging buffer (rounded
  // up to 16 so every staged head is 16-byte aligned, as the decoders' block alignment assumes), and the
  // cp.async unit (16, 8 or 4: divides the row bytes, the head bytes and the cache's base address).
  int k_head_bytes, v_head_bytes, k_pitch, v_pitch, k_unit, v_unit;
};

#ifndef PG_CUDA_HOST_SHIM
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_h2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);  // .x (low 16 bits) = lo: the lower column
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float2 unpack_h2(uint32_t u) { return __half22float2(*reinterpret_cast<const __half2*>(&u)); }
#endif  // the host shim defines the same helpers

// Typed-KV shared memory (TYPED kernels, host and device): one F16 K tile (BN, DK + 8) and one F16 V tile
// (BN, DV + 8) that the mma path reads, then 2 stages of raw cache bytes (BN heads of K at k_pitch, BN of V
// at v_pitch) that cp.async fills; the query (64, DK) FP32 of a TQ3_0 K and the output (64, DV) FP32 of a
// TQ3_0 V are rotated in the same memory before / after the key loop.
PG_FA_HD int typed_tile_halves(int dk, int dv, int bn) { return bn * (fa::tile_pitch(dk) + fa::tile_pitch(dv)); }
PG_FA_HD int typed_smem_bytes(int dk, int dv, int bn, int k_pitch, int v_pitch, bool rot_k, bool rot_v) {
  int b = typed_tile_halves(dk, dv, bn) * 2 + 2 * bn * (k_pitch + v_pitch);
  if (rot_k && fa::kTileM * dk * 4 > b) b = fa::kTileM * dk * 4;
  if (rot_v && fa::kTileM * dv * 4 > b) b = fa::kTileM * dv * 4;
  return b;
}

// Block-wide TQ3_0 rotation of shared-memory rows (kv_quant.cuh's tq3_rotate_par; every thread calls it).
__device__ __forceinline__ void fa_rotate_block(float* x, int n, bool inverse) {
  tq3_rotate_par(x, n, inverse, static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), [] { __syncthreads(); });
}

// DK: values per K head the scores run over (= head_dim for F16; kv_head_width of the K type when TYPED);
// DV: values per V head accumulated (the same for V); BN: keys per tile; TYPED: the cache holds other types
// than F16/F16 (AttentionArgs::typed), decoded tile by tile into the F16 tiles (the F16 instantiations have
// none of that code). Grid (row tiles, n_head_kv, n_splits), 128 threads.
// The split merge of one (row, head) rh, shared by both combine kernels (base-2 maxima), block-parallel
// like attention.cu's combine_weights: the splits' (m, l) are read by all threads at once into shared
// memory (a serial loop of dependent L2 reads per split, ~30 splits per decode head, cost more than the
// attention of a short split), then every thread takes M = the largest maximum of the splits that saw a
// key and L in split order from shared memory (the same bits in every thread and for every grid size:
// empty splits weigh 0 and add nothing). Writes w[z] = 2^(m_z − M) (0 for an empty split) and returns
// 1 / Σ l_z·w_z (0 when no split saw a key). Shared memory: w, wl (n_splits floats each). Every thread calls it.
__device__ __forceinline__ float fa_merge_weights(const float* part_ml, int n_splits, int64_t per_split, int64_t rh, float* w, float* wl) {
  for (int z = static_cast<int>(threadIdx.x); z < n_splits; z += static_cast<int>(blockDim.x)) {
    const float lz = part_ml[2 * (z * per_split + rh) + 1];
    w[z] = lz > 0.0f ? part_ml[2 * (z * per_split + rh)] : -INFINITY;
    wl[z] = lz;
  }
  __syncthreads();
  float M = -INFINITY;
  for (int z = 0; z < n_splits; ++z) M = fmaxf(M, w[z]);
  __syncthreads();  // every thread has read the maxima before they become weights
  for (int z = static_cast<int>(threadIdx.x); z < n_splits; z += static_cast<int>(blockDim.x)) w[z] = wl[z] > 0.0f ? exp2f(w[z] - M) : 0.0f;
  __syncthreads();
  float L = 0.0f;
  for (int z = 0; z < n_splits; ++z)
    if (wl[z] > 0.0f) L += wl[z] * w[z];
  return L > 0.0f ? 1.0f / L : 0.0f;
}
// ... and Σ_z acc_z[d]·w_z over the partials of `width` values per (row, head).
__device__ __forceinline__ float fa_merge_value(const float* part_acc, const float* w, int n_splits, int64_t per_split, int64_t rh,
                                                int width, int d) {
  float s = 0.0f;
  for (int z = 0; z < n_splits; ++z)
    if (w[z] != 0.0f) s += part_acc[(z * per_split + rh) * width + d] * w[z];
  return s;
}

template <int DK, int DV, int BN, bool TYPED>
__global__ void __launch_bounds__(fa::kThreads) fa_prefill_kernel(const FaParams P) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const AttentionArgs& p = P.a;
  static_assert(TYPED || DK == DV, "an F16/F16 cache has one head width");
  constexpr int LDK = fa::tile_pitch(DK);  // halves per K tile row
  constexpr int LDV = fa::tile_pitch(DV);  // halves per V tile row
  constexpr int KS = DK / 16;              // k-steps of Q·Kᵀ
  constexpr int NT = BN / 8;               // score n-tiles (8 keys each)
  constexpr int DT = DV / 8;               // output n-tiles (8 dims each)
  constexpr int CPR = DK / 8;              // 16-byte chunks per F16 K/V row
  static_assert(TYPED || fa::smem_bytes(DK) == 2 * 2 * BN * LDK * 2, "smem accounting");
  // F16: [stage][K | V] tiles, each (BN keys, LDK halves). TYPED: typed_smem_bytes' layout.
#ifdef PG_CUDA_HOST_SHIM
  uint16_t* const fa_sm = shim::dynamic_smem<uint16_t>();
#else
  extern __shared__ __align__(16) uint16_t fa_sm[];
#endif
  // Per local batch row: sequence, visible [begin, end), one past the highest visible key (hi = end without
  // a tree), and the tree mask words (zero without a tree).
  __shared__ int sh_seq[fa::kTileM], sh_begin[fa::kTileM], sh_end[fa::kTileM], sh_hi[fa::kTileM];
  __shared__ uint32_t sh_mask[fa::kTileM][kAttnMaskWords];

  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int group = p.n_head / p.n_head_kv;
  const int hd = p.head_dim;  // DK == DV == hd except for a TQ3_0 K or V at head_dim 64 (padded to 128)
  const int br = P.br;
  // Row tiles in reverse launch order: the last rows of a causal chunk see the most keys, so starting them
  // first leaves the short blocks for the tail of the grid (longest-first scheduling).
  const int r0 = static_cast<int>(gridDim.x - 1 - blockIdx.x) * br;
  const int nr = min(br, p.n - r0);
  const int kvh = static_cast<int>(blockIdx.y);
  const int z = static_cast<int>(blockIdx.z);
  const bool rot_k = TYPED && p.k_type == DType::TQ3_0, rot_v = TYPED && p.v_type == DType::TQ3_0;  // block-uniform
  // Key-split mode (block-uniform): when the block's query rows fit one m16 tile (decode: 1 row × g heads;
  // short chains), every warp holds those same rows and takes its own quarter of each 64-key tile; the four
  // (m, l, O) are merged in shared memory after the key loop. Why: otherwise one warp did all the
  // multiplications of the tile while three waited at its barriers (ncu, qwen3-8b decode: 18 µs per call at
  // depth 0, 24 µs at 4096, issue every 5.5 cycles per scheduler). Only for 64-key tiles (head ≤ 128).
  // (The merge needs (4 × 16) m and l plus 4 warps' O fragments in the first K + V tile pair's bytes, which
  // every layout has; a TQ3_0-padded K at head 64 with a 128-wide V does not fit and keeps one warp.)
  constexpr int kMergeBytes = (2 * fa::kWarps * fa::kRowsPerWarp + fa::kWarps * DT * 4 * 32) * 4;
  constexpr bool kKsplitOk = BN == 64 && kMergeBytes <= BN * (LDK + LDV) * 2;
  const bool ksplit = kKsplitOk && nr * group <= fa::kRowsPerWarp;
  const int mwarp = ksplit ? 0 : warp;  // the warp whose m16 rows this warp computes

  for (int i = tid; i < nr; i += fa::kThreads) {
    sh_seq[i] = p.seq[r0 + i];
    fa::row_bounds(p.positions[r0 + i], p.sliding_window, sh_begin[i], sh_end[i]);
    for (int w = 0; w < kAttnMaskWords; ++w)
      sh_mask[i][w] = p.tree_mask ? p.tree_mask[static_cast<int64_t>(r0 + i) * kAttnMaskWords + w] : 0u;
    if (p.tree_mask) sh_end[i] = p.kv_len[r0 + i];  // (begin stays the window's, from positions, as attention.cu)
    sh_hi[i] = fa::tree_hi(sh_end[i], sh_mask[i], kAttnMaskWords);
  }

  // This lane's two query rows (C rows g and g+8 of the warp's tile): batch row, head, validity.
  int q_row[2], q_head[2], q_lrow[2];
  bool q_ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int m = mwarp * fa::kRowsPerWarp + fa::c_row(lane, 2 * i);
    int rl = 0, g = 0;
    fa::pair_of(m, group, rl, g);
    q_ok[i] = m < br * group && rl < nr;
    q_lrow[i] = rl;
    q_row[i] = r0 + rl;
    q_head[i] = kvh * group + g;
  }
  // Q fragments (A operand, rows a_row = C rows), pre-scaled: scores come out as scale·q·k.
  uint32_t qf[KS][4];
  if (rot_k) {
    // A TQ3_0 K holds R(k): the scores need R(q) (q·k = R(q)·R(k)). The block's 64 query rows, zero-padded
    // to DK, are rotated once in shared memory (before any tile is loaded there), then fragmented as below.
    float* qs = reinterpret_cast<float*>(fa_sm);  // (kTileM, DK)
    for (int idx = tid; idx < fa::kTileM * DK; idx += fa::kThreads) {
      const int m = idx / DK, d = idx - m * DK;
      int rl = 0, g = 0;
      fa::pair_of(m, group, rl, g);
      const bool ok = m < br * group && rl < nr && d < hd;
      qs[idx] = ok ? p.q[static_cast<int64_t>(r0 + rl) * p.q_stride + static_cast<int64_t>(kvh * group + g) * hd + d] : 0.0f;
    }
    __syncthreads();
    fa_rotate_block(qs, fa::kTileM * DK, false);  // ends with a barrier: the rotated rows are visible
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float* qr = qs + (mwarp * fa::kRowsPerWarp + fa::a_row(lane, r)) * DK + ks * 16;
        qf[ks][r] = pack_h2(qr[fa::a_col(lane, r, 0)] * p.scale, qr[fa::a_col(lane, r, 1)] * p.scale);
      }
  } else {
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int i = r & 1;  // a_row(lane, r) is C row g (r even) or g+8 (r odd)
        float v0 = 0.0f, v1 = 0.0f;
        if (q_ok[i]) {  // (here DK == head_dim: only a TQ3_0 K pads the head)
          const float* qp = p.q + static_cast<int64_t>(q_row[i]) * p.q_stride + static_cast<int64_t>(q_head[i]) * DK + ks * 16;
          v0 = qp[fa::a_col(lane, r, 0)] * p.scale;
          v1 = qp[fa::a_col(lane, r, 1)] * p.scale;
        }
        qf[ks][r] = pack_h2(v0, v1);
      }
  }

  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};
  __syncthreads();  // row data visible; the rotated query's shared memory read by every thread

  uint64_t remaining = nr >= 64 ? ~0ull : ((1ull << nr) - 1ull);
  while (remaining) {
    const int s = sh_seq[__ffsll(static_cast<long long>(remaining)) - 1];
    uint64_t pass = 0;
    int lo = 0x7fffffff, hi = 0;
    for (int i = 0; i < nr; ++i)
      if (((remaining >> i) & 1ull) && sh_seq[i] == s) {
        pass |= 1ull << i;
        lo = min(lo, sh_begin[i]);
        hi = max(hi, sh_hi[i]);
      }
    remaining &= ~pass;
    // This split's share of the pass's actual keys (a grid sized for a graph bucket: the surplus splits
    // get an empty range here and skip the pass).
    fa::split_range(lo, hi, z, P.n_splits, P.split_target, P.split_min_keys);
    if (lo >= hi) continue;  // uniform over the block: every thread computed the same lo, hi

    // Per lane row: visible [rb, re) inside this pass and split (empty for rows outside the pass); the keys
    // of [rb, fe) are all visible, those of [fe, re) only where the row's tree mask has the bit (fe = re
    // without a tree).
    // (The tree test re-reads end and the mask from shared memory: registers are short at head 256.)
    int rb[2], re[2], fe[2];
    bool in_pass[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      in_pass[i] = q_ok[i] && ((pass >> q_lrow[i]) & 1ull);
      rb[i] = in_pass[i] ? max(sh_begin[q_lrow[i]], lo) : 0;
      re[i] = in_pass[i] ? min(sh_hi[q_lrow[i]], hi) : 0;
      if (re[i] <= rb[i]) rb[i] = re[i] = 0, in_pass[i] = false;
      fe[i] = in_pass[i] ? min(sh_end[q_lrow[i]], re[i]) : 0;
    }
    const bool tree = p.tree_mask != nullptr;
    // Warp bounds: tiles outside [wlo, whi) are skipped; inside [wfull_lo, wfull_hi) no mask is needed
    // when every row of the warp is in the pass.
    int wlo = 0x7fffffff, whi = 0, wfb = 0, wfe = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (in_pass[i]) wlo = min(wlo, rb[i]), whi = max(whi, re[i]), wfb = max(wfb, rb[i]), wfe = min(wfe, fe[i]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, off));
      whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, off));
      wfb = max(wfb, __shfl_xor_sync(0xffffffffu, wfb, off));
      wfe = min(wfe, __shfl_xor_sync(0xffffffffu, wfe, off));
    }
    const bool warp_all = __all_sync(0xffffffffu, in_pass[0] && in_pass[1]);

    const int32_t* table = p.block_table + static_cast<int64_t>(s) * p.max_blocks;
    const auto cell_of = [&](int kp) {
      return static_cast<int64_t>(table[kp / p.block_size]) * p.block_size + kp % p.block_size;
    };

    // Multiplies tile kt (K at kt_s, V at vt_s: F16, pitches LDK / LDV) into this warp's rows.
    auto consume = [&](int kt, const uint16_t* kt_s, const uint16_t* vt_s) {
      // S = (scale·Q)·Kᵀ: 16 rows × BN keys.
      float sc[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks)
#pragma unroll
        for (int nj = 0; nj < NT / 2; ++nj) {
          if (ksplit && nj != warp) continue;  // key-split: keys 16·warp.. of the tile only
          uint32_t b[4];
          ldsm_x4(b, kt_s + (nj * 16 + fa::k_ld_key(lane)) * LDK + ks * 16 + fa::k_ld_dim(lane));
          mma_f16(sc[2 * nj], qf[ks], b[0], b[1]);
          mma_f16(sc[2 * nj + 1], qf[ks], b[2], b[3]);
        }
      // Soft-cap, base 2, mask; online softmax per row (the quad of lanes 4g..4g+3 holds row g).
      const bool full = warp_all && kt >= wfb && kt + BN <= wfe;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          if (ksplit && (j >> 1) != warp) {  // another warp's keys
            sc[j][e] = -INFINITY;
            continue;
          }
          float v = sc[j][e];
          if (p.softcap > 0.0f) v = p.softcap * tanhf(v / p.softcap);
          v *= kLog2e;
          if (!full) {
            const int i = e >> 1, kp = kt + 8 * j + fa::c_col(lane, e);
            if (kp < rb[i] || kp >= re[i] ||
                (tree && kp >= sh_end[q_lrow[i]] && !fa::tree_visible(kp, sh_end[q_lrow[i]], sh_mask[q_lrow[i]], kAttnMaskWords)))
              v = -INFINITY;
          }
          sc[j][e] = v;
        }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(sc[j][2 * i], sc[j][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m_run[i], mx);
        const float ref = mn == -INFINITY ? 0.0f : mn;  // a row with nothing visible yet stays at 0
        const float corr = exp2f(m_run[i] - ref);
        m_run[i] = mn;
        l_run[i] *= corr;
#pragma unroll
        for (int d = 0; d < DT; ++d) o[d][2 * i] *= corr, o[d][2 * i + 1] *= corr;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          if (ksplit && (j >> 1) != warp) {
            sc[j][2 * i] = sc[j][2 * i + 1] = 0.0f;
            continue;
          }
          sc[j][2 * i] = exp2f(sc[j][2 * i] - ref);
          sc[j][2 * i + 1] = exp2f(sc[j][2 * i + 1] - ref);
        }
      }
      // O += P·V, P in FP16 from the score registers; l sums the rounded weights that are used.
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        if (ksplit && kk != warp) continue;  // the other keys' weights are zero in this warp
        uint32_t pa[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const float* t4 = sc[fa::p_tile(kk, r)];
          pa[r] = pack_h2(t4[fa::p_elem(r, 0)], t4[fa::p_elem(r, 1)]);
          const float2 back = unpack_h2(pa[r]);
          l_run[r & 1] += back.x + back.y;  // register r holds row g (r even) or g+8 (r odd)
        }
#pragma unroll
        for (int dj = 0; dj < DV / 16; ++dj) {
          uint32_t b[4];
          ldsm_x4_trans(b, vt_s + (kk * 16 + fa::v_ld_key(lane)) * LDV + dj * 16 + fa::v_ld_dim(lane));
          mma_f16(o[2 * dj], pa, b[0], b[1]);
          mma_f16(o[2 * dj + 1], pa, b[2], b[3]);
        }
      }
    };

    const int n_tiles = (hi - lo + BN - 1) / BN;
    if constexpr (!TYPED) {
      const int64_t kv_w = static_cast<int64_t>(p.n_head_kv) * DK;  // halves per cache row
      const auto* kc = static_cast<const uint16_t*>(p.k) + static_cast<int64_t>(kvh) * DK;
      const auto* vc = static_cast<const uint16_t*>(p.v) + static_cast<int64_t>(kvh) * DK;
      uint16_t* const ks_base = fa_sm;  // stage s: K at (2s)·BN·LD, V at (2s+1)·BN·LD
      // Issues the cp.async copies of the K and V rows of keys kt..kt+BN−1 into stage st (zeros past hi).
      auto load_tile = [&](int kt, int st) {
        uint16_t* kd = ks_base + (2 * st) * BN * LDK;
        uint16_t* vd = kd + BN * LDK;
        static_assert(BN * CPR % fa::kThreads == 0, "whole copy rounds");
#pragma unroll
        for (int it = 0; it < BN * CPR / fa::kThreads; ++it) {
          const int idx = tid + it * fa::kThreads;
          const int key = idx / CPR, c = idx - key * CPR;
          const int kp = kt + key;
          const bool ok = kp < hi;
          const int64_t cell = ok ? cell_of(kp) : 0;
          const int64_t off = cell * kv_w + c * 8;
          cp_async16_zfill(kd + key * LDK + c * 8, kc + off, ok ? 16 : 0);
          cp_async16_zfill(vd + key * LDK + c * 8, vc + off, ok ? 16 : 0);
        }
        cp_async_commit();
      };

      load_tile(lo, 0);
      for (int t = 0; t < n_tiles; ++t) {
        const int kt = lo + t * BN;
        if (t + 1 < n_tiles) {
          load_tile(kt + BN, (t + 1) & 1);
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();  // tile t visible to every warp
        if (kt < whi && kt + BN > wlo) {
          const uint16_t* kt_s = ks_base + (2 * (t & 1)) * BN * LDK;
          consume(kt, kt_s, kt_s + BN * LDK);
        }
        __syncthreads();  // stage t & 1 fully consumed before iteration t + 1 refills it
      }
    } else {
      // Typed cache: the raw bytes of each key's head (the cache's own blocks, no dequantized copy anywhere)
      // stream through two staging stages with cp.async, tile t+1 in flight while tile t is decoded and
      // multiplied; the decode (kv_quant.cuh's kvq_load: 16 values per step for the block types, 8 for
      // F16/BF16; values bit-identical to core's dequantizers) rounds them to FP16 into the single F16 K/V
      // tiles, which the same mma code as above reads. Keys past hi decode as zeros (finite: p = 0 there).
      uint16_t* const k_tile = fa_sm;
      uint16_t* const v_tile = fa_sm + BN * LDK;
      uint8_t* const raw = reinterpret_cast<uint8_t*>(fa_sm + typed_tile_halves(DK, DV, BN));
      const int stage_bytes = BN * (P.k_pitch + P.v_pitch);
      const auto* kc = static_cast<const uint8_t*>(p.k) + static_cast<int64_t>(kvh) * P.k_head_bytes;
      const auto* vc = static_cast<const uint8_t*>(p.v) + static_cast<int64_t>(kvh) * P.v_head_bytes;
      const int kn = P.k_head_bytes / P.k_unit, vn = P.v_head_bytes / P.v_unit;  // copies per head
      const DType kty = p.k_type, vty = p.v_type;
      // Decode steps per key: 16 values for the block types, 8 for F16/BF16 (one 16-byte load).
      const int ek = kvq_plain(kty) ? 8 : 16, ev = kvq_plain(vty) ? 8 : 16;
      const int uk = DK / ek, uv = DV / ev;
      auto copy = [](uint8_t* dst, const uint8_t* src, int unit) {
        if (unit == 16)
          cp_async16(dst, src);
        else if (unit == 8)
          cp_async8(dst, src);
        else
          cp_async4(dst, src);
      };
      auto load_raw = [&](int kt, int st) {
        uint8_t* kd = raw + st * stage_bytes;
        uint8_t* vd = kd + BN * P.k_pitch;
        for (int idx = tid; idx < BN * kn; idx += fa::kThreads) {
          const int key = idx / kn, c = idx - key * kn;
          if (kt + key < hi)
            copy(kd + key * P.k_pitch + c * P.k_unit, kc + cell_of(kt + key) * static_cast<int64_t>(p.k_row_bytes) + c * P.k_unit,
                 P.k_unit);
        }
        for (int idx = tid; idx < BN * vn; idx += fa::kThreads) {
          const int key = idx / vn, c = idx - key * vn;
          if (kt + key < hi)
            copy(vd + key * P.v_pitch + c * P.v_unit, vc + cell_of(kt + key) * static_cast<int64_t>(p.v_row_bytes) + c * P.v_unit,
                 P.v_unit);
        }
        cp_async_commit();
      };
      // Staged heads (BN at `pitch`) of type t → F16 tile rows (BN at ld halves), u_per decode steps of e
      // values per key. K and V run as separate loops, so a warp never mixes the two types' decoders.
      auto decode = [&](int kt, DType t, const uint8_t* src, int pitch, int u_per, int e, uint16_t* tile, int ld) {
        for (int idx = tid; idx < BN * u_per; idx += fa::kThreads) {
          const int key = idx / u_per, u = idx - key * u_per;
          float f[16];
          if (kt + key < hi) {
            kvq_load(t, src + key * pitch, u, f);
          } else {
#pragma unroll
            for (int i = 0; i < 16; ++i) f[i] = 0.0f;
          }
          uint32_t w[8];
#pragma unroll
          for (int i = 0; i < 8; ++i) w[i] = pack_h2(f[2 * i], f[2 * i + 1]);
          uint4* dst = reinterpret_cast<uint4*>(tile + key * ld + u * e);  // 16-byte aligned: ld·2 and e·2 are multiples of 16
          dst[0] = uint4{w[0], w[1], w[2], w[3]};
          if (e == 16) dst[1] = uint4{w[4], w[5], w[6], w[7]};
        }
      };

      load_raw(lo, 0);
      for (int t = 0; t < n_tiles; ++t) {
        const int kt = lo + t * BN;
        // Stage (t+1) & 1 last held tile t−1, decoded before the previous iteration's second barrier.
        if (t + 1 < n_tiles) {
          load_raw(kt + BN, (t + 1) & 1);
          cp_async_wait<1>();
        } else {
          cp_async_wait<0>();
        }
        __syncthreads();  // raw tile t visible to every thread; every warp done with the F16 tiles of t−1
        const uint8_t* kr = raw + (t & 1) * stage_bytes;
        decode(kt, kty, kr, P.k_pitch, uk, ek, k_tile, LDK);
        decode(kt, vty, kr + BN * P.k_pitch, P.v_pitch, uv, ev, v_tile, LDV);
        __syncthreads();  // F16 tiles of t visible
        if (kt < whi && kt + BN > wlo) consume(kt, k_tile, v_tile);
      }
    }
  }

  // Results: the row sum over the quad, then the final output (one split) or this split's partial.
  float l_fin[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float l = l_run[i];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    l_fin[i] = l;
  }
  if (ksplit) {
    // Merge the four warps' states of the same rows (fixed order w = 0..3): warp 0 ends with (m, l, O) as if
    // it had seen every key; the others hold nothing (zeros, invalid rows) for the output code below.
    float* ms = reinterpret_cast<float*>(fa_sm);  // (4 warps, 16 rows) running max, base 2
    float* ls = ms + 4 * fa::kRowsPerWarp;        // (4, 16) row sums
    float* os = ls + 4 * fa::kRowsPerWarp;        // (4 warps, DT·4 values, 32 lanes): lane-minor, conflict-free
    __syncthreads();  // every warp done with the last tiles
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if ((lane & 3) == 0) {
        ms[warp * fa::kRowsPerWarp + fa::c_row(lane, 2 * i)] = m_run[i];
        ls[warp * fa::kRowsPerWarp + fa::c_row(lane, 2 * i)] = l_fin[i];
      }
#pragma unroll
    for (int d = 0; d < DT; ++d)
#pragma unroll
      for (int e = 0; e < 4; ++e) os[(warp * DT * 4 + d * 4 + e) * 32 + lane] = o[d][e];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = fa::c_row(lane, 2 * i);
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < fa::kWarps; ++w) mx = fmaxf(mx, ms[w * fa::kRowsPerWarp + row]);
        const float ref = mx == -INFINITY ? 0.0f : mx;
        float c[fa::kWarps], l = 0.0f;
#pragma unroll
        for (int w = 0; w < fa::kWarps; ++w) {
          c[w] = exp2f(ms[w * fa::kRowsPerWarp + row] - ref);
          l += ls[w * fa::kRowsPerWarp + row] * c[w];
        }
        m_run[i] = mx;
        l_fin[i] = l;
#pragma unroll
        for (int d = 0; d < DT; ++d)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float acc = 0.0f;
#pragma unroll
            for (int w = 0; w < fa::kWarps; ++w) acc += os[(w * DT * 4 + d * 4 + 2 * i + h) * 32 + lane] * c[w];
            o[d][2 * i + h] = acc;
          }
      }
    } else {
#pragma unroll
      for (int i = 0; i < 2; ++i) q_ok[i] = false, l_fin[i] = 0.0f, m_run[i] = -INFINITY;
#pragma unroll
      for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    }
  }
  if (rot_v && P.n_splits == 1) {
    // A TQ3_0 V accumulated Σ p·R(v) = R(Σ p·v): the block's normalised rows (64, DV) are un-rotated once in
    // shared memory, then the first head_dim values of each row written out.
    float* ys = reinterpret_cast<float*>(fa_sm);
    __syncthreads();  // every warp done with the last tiles
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float inv = l_fin[i] > 0.0f ? 1.0f / l_fin[i] : 0.0f;
      float* y = ys + (warp * fa::kRowsPerWarp + fa::c_row(lane, 2 * i)) * DV;
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        y[8 * d + fa::c_col(lane, 0)] = o[d][2 * i] * inv;
        y[8 * d + fa::c_col(lane, 1)] = o[d][2 * i + 1] * inv;
      }
    }
    __syncthreads();
    fa_rotate_block(ys, fa::kTileM * DV, true);
    for (int idx = tid; idx < fa::kTileM * hd; idx += fa::kThreads) {
      const int m = idx / hd, d = idx - m * hd;
      int rl = 0, g = 0;
      fa::pair_of(m, group, rl, g);
      if (m < br * group && rl < nr)
        p.out[static_cast<int64_t>(r0 + rl) * p.out_stride + static_cast<int64_t>(kvh * group + g) * hd + d] = ys[m * DV + d];
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = l_fin[i];
    if (!q_ok[i]) continue;
    if (P.n_splits == 1) {  // (no TQ3_0 V here: DV == head_dim)
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      float* out = p.out + static_cast<int64_t>(q_row[i]) * p.out_stride + static_cast<int64_t>(q_head[i]) * DV;
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        out[8 * d + fa::c_col(lane, 0)] = o[d][2 * i] * inv;
        out[8 * d + fa::c_col(lane, 1)] = o[d][2 * i + 1] * inv;
      }
    } else {
      const int64_t slot = (static_cast<int64_t>(z) * p.n + q_row[i]) * p.n_head + q_head[i];
      float* out = P.part_acc + slot * DV;
#pragma unroll
      for (int d = 0; d < DT; ++d) {
        out[8 * d + fa::c_col(lane, 0)] = o[d][2 * i];
        out[8 * d + fa::c_col(lane, 1)] = o[d][2 * i + 1];
      }
      if ((lane & 3) == 0) {
        P.part_ml[2 * slot] = m_run[i];
        P.part_ml[2 * slot + 1] = l;
      }
    }
  }
  if (P.counters != nullptr && P.n_splits > 1) {
    // Fused combine: the last split of this (row tile, KV head) to finish merges every split's partials for the
    // block's rows, with the combine kernel's own functions (same order, same bits), and resets the count for
    // the next launch (graph replay). The fences order this block's partial stores before its arrival, and the
    // arrivals before the last block's loads (the threadfence-reduction pattern). Block-uniform from here on.
    __shared__ int sh_last;
    __threadfence();
    __syncthreads();
    const int64_t tile = static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
    if (tid == 0) sh_last = atomicAdd(&P.counters[tile], 1) == P.n_splits - 1;
    __syncthreads();
    if (!sh_last) return;
    __threadfence();
    float* const cw = reinterpret_cast<float*>(fa_sm);  // (2, n_splits) merge weights and the splits' l
    const int64_t per_split = static_cast<int64_t>(p.n) * p.n_head;
    for (int m = 0; m < br * group; ++m) {
      int rl = 0, g = 0;
      fa::pair_of(m, group, rl, g);
      if (rl >= nr) continue;
      const int64_t rh = static_cast<int64_t>(r0 + rl) * p.n_head + kvh * group + g;
      const float inv = fa_merge_weights(P.part_ml, P.n_splits, per_split, rh, cw, cw + P.n_splits);
      for (int d = tid; d < hd; d += fa::kThreads)
        p.out[static_cast<int64_t>(r0 + rl) * p.out_stride + static_cast<int64_t>(kvh * group + g) * hd + d] =
            fa_merge_value(P.part_acc, cw, P.n_splits, per_split, rh, DV, d) * inv;
      __syncthreads();  // cw is rewritten for the next row
    }
    if (tid == 0) P.counters[tile] = 0;
  }
}

// Merges the split partials of one (row, head) per block (base-2 maxima). Dynamic shared memory:
// 2·n_splits floats (fa_merge_weights).
__global__ void fa_combine_kernel(const float* part_acc,  // (n_splits, n, n_head, hd)
                                  const float* part_ml,   // (n_splits, n, n_head, 2)
                                  int n_splits, int n, int n_head, int hd,
                                  float* out,  // (n, out_stride), heads at h·hd
                                  int64_t out_stride) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
#ifdef PG_CUDA_HOST_SHIM
  float* const cw = shim::dynamic_smem<float>();
#else
  extern __shared__ __align__(16) float cw[];  // (2, n_splits): merge weights, then the splits' l
#endif
  const int64_t rh = blockIdx.x;
  const int r = static_cast<int>(rh / n_head), h = static_cast<int>(rh % n_head);
  const int64_t per_split = static_cast<int64_t>(n) * n_head;
  const float inv = fa_merge_weights(part_ml, n_splits, per_split, rh, cw, cw + n_splits);
  for (int d = static_cast<int>(threadIdx.x); d < hd; d += blockDim.x) {
    const float s = fa_merge_value(part_acc, cw, n_splits, per_split, rh, hd, d);
    out[static_cast<int64_t>(r) * out_stride + static_cast<int64_t>(h) * hd + d] = s * inv;
  }
}

// The typed form of fa_combine_kernel: partials of wv values (the V type's head width) per (row, head),
// merged into shared memory, un-rotated there for a TQ3_0 V (R⁻¹ once, after the merge: the partials are
// all in the rotated domain), the first hd values written. Dynamic shared memory: wv + 2·n_splits floats.
__global__ void fa_combine_typed_kernel(const float* part_acc,  // (n_splits, n, n_head, wv)
                                        const float* part_ml,   // (n_splits, n, n_head, 2)
                                        int n_splits, int n, int n_head, int hd, int wv, bool rot_v,
                                        float* out,  // (n, out_stride), heads at h·hd
                                        int64_t out_stride) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
#ifdef PG_CUDA_HOST_SHIM
  float* const y = shim::dynamic_smem<float>();
#else
  extern __shared__ __align__(16) float y[];  // (wv) merged output, then (2, n_splits) merge weights and l
#endif
  float* const cw = y + wv;
  const int64_t rh = blockIdx.x;
  const int r = static_cast<int>(rh / n_head), h = static_cast<int>(rh % n_head);
  const int64_t per_split = static_cast<int64_t>(n) * n_head;
  const float inv = fa_merge_weights(part_ml, n_splits, per_split, rh, cw, cw + n_splits);
  for (int d = static_cast<int>(threadIdx.x); d < wv; d += blockDim.x) {
    const float s = fa_merge_value(part_acc, cw, n_splits, per_split, rh, wv, d);
    y[d] = s * inv;
  }
  __syncthreads();
  if (rot_v) fa_rotate_block(y, wv, true);  // (block-uniform)
  for (int d = static_cast<int>(threadIdx.x); d < hd; d += blockDim.x)
    out[static_cast<int64_t>(r) * out_stride + static_cast<int64_t>(h) * hd + d] = y[d];
}

struct FaPlan {
  int br, n_row_tiles, bn;
  fa::SplitPlan split;
  // Stored values per K / V head (head_dim for F16/F16; kv_head_width when typed) and, typed only, the
  // staging pitches, copy units and dynamic shared memory (typed_smem_bytes).
  int dk, dv;
  int k_pitch = 0, v_pitch = 0, k_unit = 0, v_unit = 0, smem = 0;
};

// Largest cp.async unit (16, 8, 4) dividing every value; 0 when none does (not even 4 bytes).
int copy_unit_of(std::initializer_list<uint64_t> values) {
  for (int u : {16, 8, 4}) {
    bool ok = true;
    for (uint64_t v : values) ok = ok && v % static_cast<uint64_t>(u) == 0;
    if (ok) return u;
  }
  return 0;
}

FaPlan fa_plan(const AttentionArgs& a, int n_sm) {
  FaPlan pl{};
  const int group = a.n_head / a.n_head_kv;
  pl.br = fa::rows_per_block(group);
  pl.n_row_tiles = (a.n + pl.br - 1) / pl.br;
  pl.dk = a.typed ? kv_head_width(a.k_type, a.head_dim) : a.head_dim;
  pl.dv = a.typed ? kv_head_width(a.v_type, a.head_dim) : a.head_dim;
  pl.bn = fa::keys_per_tile(std::max(pl.dk, pl.dv));
  if (a.typed) {
    const size_t kb = kv_head_bytes(a.k_type, a.head_dim), vb = kv_head_bytes(a.v_type, a.head_dim);
    pl.k_pitch = static_cast<int>((kb + 15) / 16 * 16);
    pl.v_pitch = static_cast<int>((vb + 15) / 16 * 16);
    pl.k_unit = copy_unit_of({kb, a.k_row_bytes, reinterpret_cast<uintptr_t>(a.k)});
    pl.v_unit = copy_unit_of({vb, a.v_row_bytes, reinterpret_cast<uintptr_t>(a.v)});
    pl.smem = typed_smem_bytes(pl.dk, pl.dv, pl.bn, pl.k_pitch, pl.v_pitch, a.k_type == DType::TQ3_0, a.v_type == DType::TQ3_0);
  } else {
    pl.smem = fa::smem_bytes(a.head_dim);
  }
  int max_kv = std::max(1, a.max_kv_len);
  if (a.kv_capacity > 0) {  // graph-captured shapes: the grid serves every length up to the capacity
    int cap = 64;
    while (cap < a.kv_capacity) cap *= 2;
    max_kv = std::max(max_kv, cap);
  }
  pl.split = fa::split_plan(pl.n_row_tiles * a.n_head_kv, max_kv, n_sm, a.fa_blocks_per_sm, a.fa_min_split_keys);
  return pl;
}

template <int DK, int DV, bool TYPED>
void fa_launch(const FaParams& P, const FaPlan& pl, cudaStream_t stream) {
  constexpr int BN = fa::keys_per_tile(DK > DV ? DK : DV);
  auto kernel = fa_prefill_kernel<DK, DV, BN, TYPED>;
  const int smem = TYPED ? pl.smem : fa::smem_bytes(DK);
#ifndef PG_CUDA_HOST_SHIM
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(kernel), smem);
#endif
  const dim3 grid(static_cast<unsigned>(pl.n_row_tiles), static_cast<unsigned>(P.a.n_head_kv), static_cast<unsigned>(pl.split.n_splits));
  PG_FA_LAUNCH(kernel, grid, fa::kThreads, smem, stream, P);
  check_launch("attention_prefill");
}

// Typed caches the kernel reads: every KV type but F32 (FP32 values would be rounded to FP16 tiles, and an
// F32 head's staging would not fit the shared memory at head 256), head widths 64/128/256 after padding.
bool fa_typed_ok(const AttentionArgs& a) {
  for (DType t : {a.k_type, a.v_type})
    if (!is_kv_type(t) || t == DType::F32) return false;
  const int wk = kv_head_width(a.k_type, a.head_dim), wv = kv_head_width(a.v_type, a.head_dim);
  const auto ok_w = [](int w) { return w == 64 || w == 128 || w == 256; };
  // cp.async needs 4-byte aligned heads (true for every KV type at head_dim 64/128/256; checked, not assumed).
  return ok_w(wk) && ok_w(wv) &&
         copy_unit_of({kv_head_bytes(a.k_type, a.head_dim), a.k_row_bytes, reinterpret_cast<uintptr_t>(a.k)}) > 0 &&
         copy_unit_of({kv_head_bytes(a.v_type, a.head_dim), a.v_row_bytes, reinterpret_cast<uintptr_t>(a.v)}) > 0;
}

// (Named apart from attention_prefill_supported so that the host emulation's copy of this file, in
// another namespace, never meets the CUDA library's through argument-dependent lookup.)
bool fa_supported(const AttentionArgs& a) {
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0) return false;
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) return false;
  if (a.n_head / a.n_head_kv > fa::kMaxGroup) return false;
  return a.typed ? fa_typed_ok(a) : a.kv_f16;
}

}  // namespace

bool attention_prefill_supported(const AttentionArgs& a) { return fa_supported(a); }

size_t attention_prefill_scratch_bytes(const AttentionArgs& a, int n_sm) {
  if (a.n <= 0 || !fa_supported(a)) return 0;
  const FaPlan pl = fa_plan(a, n_sm);
  if (pl.split.n_splits <= 1) return 0;
  // part_acc (n_splits, n, n_head, dv) + part_ml (n_splits, n, n_head, 2), FP32.
  return static_cast<size_t>(pl.split.n_splits) * static_cast<size_t>(a.n) * static_cast<size_t>(a.n_head) *
         static_cast<size_t>(pl.dv + 2) * sizeof(float);
}

void attention_prefill(const AttentionArgs& a, void* scratch, int n_sm, cudaStream_t stream) {
  if (a.n <= 0) return;
  PG_CHECK(fa_supported(a),
           "attention_prefill: unsupported shape (F16 KV or a typed pair without F32, head_dim 64/128/256, GQA ≤ 64)");
  if (a.typed)
    PG_CHECK(a.k_row_bytes == kv_row_bytes(a.k_type, a.n_head_kv, a.head_dim) &&
                 a.v_row_bytes == kv_row_bytes(a.v_type, a.n_head_kv, a.head_dim),
             "attention_prefill: cache row bytes do not match the " + kv_type_name(a.k_type) + "/" + kv_type_name(a.v_type) +
                 " layout of n_head_kv·head_dim");
  const FaPlan pl = fa_plan(a, n_sm);
  PG_CHECK(a.n_head_kv <= 65535 && pl.split.n_splits <= 65535, "attention_prefill: batch too large");
  FaParams P{};
  P.a = a;
  P.br = pl.br;
  P.n_splits = pl.split.n_splits;
  P.split_target = pl.split.target;
  P.split_min_keys = pl.split.min_keys;
  if (a.typed) {
    P.k_head_bytes = static_cast<int>(kv_head_bytes(a.k_type, a.head_dim));
    P.v_head_bytes = static_cast<int>(kv_head_bytes(a.v_type, a.head_dim));
    P.k_pitch = pl.k_pitch, P.v_pitch = pl.v_pitch, P.k_unit = pl.k_unit, P.v_unit = pl.v_unit;
  }
  if (P.n_splits > 1) {
    PG_CHECK(scratch != nullptr, "attention_prefill: missing split scratch");
    P.part_acc = static_cast<float*>(scratch);
    P.part_ml = P.part_acc + static_cast<size_t>(P.n_splits) * a.n * a.n_head * pl.dv;
    // The kernel merges the splits itself when the caller gave enough zeroed counters (not for a TQ3_0 V,
    // whose merge ends in the un-rotation of fa_combine_typed_kernel).
    if (a.fa_counters != nullptr && a.v_type != DType::TQ3_0 &&
        static_cast<int64_t>(pl.n_row_tiles) * a.n_head_kv <= a.fa_counters_len)
      P.counters = a.fa_counters;
  }
  if (!a.typed) {
    switch (a.head_dim) {
      case 64: fa_launch<64, 64, false>(P, pl, stream); break;
      case 128: fa_launch<128, 128, false>(P, pl, stream); break;
      default: fa_launch<256, 256, false>(P, pl, stream); break;
    }
  } else {
    // Padding arises only for TQ3_0 at head_dim 64 (a 128-value group): (128, 64) and (64, 128).
    switch (pl.dk * 1000 + pl.dv) {
      case 64064: fa_launch<64, 64, true>(P, pl, stream); break;
      case 128128: fa_launch<128, 128, true>(P, pl, stream); break;
      case 256256: fa_launch<256, 256, true>(P, pl, stream); break;
      case 128064: fa_launch<128, 64, true>(P, pl, stream); break;
      case 64128: fa_launch<64, 128, true>(P, pl, stream); break;
      default: PG_CHECK(false, "attention_prefill: head widths " + std::to_string(pl.dk) + "/" + std::to_string(pl.dv) + " have no kernel");
    }
  }
  if (P.n_splits > 1 && P.counters == nullptr) {
    const dim3 grid(static_cast<unsigned>(static_cast<int64_t>(a.n) * a.n_head));
    if (!a.typed) {
      const int threads = std::min(256, (a.head_dim + 31) / 32 * 32);
      PG_FA_LAUNCH(fa_combine_kernel, grid, threads, static_cast<size_t>(2 * P.n_splits) * sizeof(float), stream, P.part_acc, P.part_ml, P.n_splits, a.n, a.n_head, a.head_dim, a.out,
                   a.out_stride);
    } else {
      const int threads = std::min(256, (pl.dv + 31) / 32 * 32);
      const bool rot_v = a.v_type == DType::TQ3_0;
      PG_FA_LAUNCH(fa_combine_typed_kernel, grid, threads, static_cast<size_t>(pl.dv + 2 * P.n_splits) * sizeof(float), stream, P.part_acc, P.part_ml,
                   P.n_splits, a.n, a.n_head, a.head_dim, pl.dv, rot_v, a.out, a.out_stride);
    }
    check_launch("attention_prefill combine");
  }
}

}  // namespace PG_FA_NAMESPACE
