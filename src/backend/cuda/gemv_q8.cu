// Decode GEMV, default mode: y (n ≤ 8, M) = x (n, K) · Wᵀ with the activations quantized to 8 bits per
// value (one FP32 scale per 32) and integer dot products (dp4a) against the packed weight quants.
// Types: Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, IQ4_XS (8-bit activations) and F16/BF16 (FP32 activations).
//
// Why this kernel won over gemv.cu (FP32 activations, cp.async staging through shared memory) for decode:
// the H200 must consume ~29 Q4_K weights per SM clock to stay at memory bandwidth. FP32 activations cost
// 4 bytes of L1 traffic and ~3 instructions per weight (and the staging added shared-memory traffic),
// which capped Q4_K at ~23 % of bandwidth on an 8B FFN matrix; here a weight costs ~1 instruction and one
// byte of activation traffic, and every lane keeps kUnroll independent 16-byte weight loads in flight
// straight from global memory.
//
// Layout of the work: one warp per weight row (4 rows per block; one-row batches: two rows per warp); the
// row is cut into pieces of 32 weights (64 for Q4_K and Q6_K: quant_dot.cuh), lane l takes pieces l, l+32,
// …; all kUnrollOf<T> pieces' loads (kUnroll 32-weight units) are issued before any is used. Lanes of a
// K-quant read one superblock's quants as consecutive pieces, so each warp load instruction covers whole
// superblocks. The one-row kernels stage the activation row in shared memory (stage_act). Reduction: warp
// shuffles, fixed order (deterministic). Grouped mode (MoE decode): grid row g uses expert ids[g] and
// activation row g/x_div.
//
// Numerics: the activations are rounded exactly as the CPU backend's default mode (and llama.cpp's CPU
// backend) rounds them — q8_0 per 32 values for the 32-value block types, q8_K per 256 for the K-quants
// (act_quant_kernel below) — ~0.5 % relative error per product sum, the same on both backends.
// Exact mode never comes here.
#include <algorithm>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/glu_act.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/quant_dot.cuh"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // one warp per weight row

struct FastParams {
  const uint8_t* w;
  size_t row_bytes;
  int64_t M, K;
  int n_pieces;       // K/32 (8-bit kernels: 32-weight units, pieces<T>() of them are pieces); K/8 (F16/BF16)
  const int8_t* xq;   // (x_rows, K) quantized activations (8-bit kernels)
  const float* xd;    // (x_rows, K/32) their scales
  const int32_t* xs;  // (x_rows, K/32) their sums per 32 values
  const float* x;     // (x_rows, x_stride) FP32 activations (F16/BF16 kernels)
  int64_t x_stride;
  float* y;
  int64_t y_stride;
  int n;
  const int32_t* expert_ids;
  size_t expert_bytes;
  int x_div;
  int g_base;
  bool pdl;  // host side: launch with programmatic dependent launch (gemv_q8_kernel only)
};

// grid_wait / grid_launch_dependents: pdl.cuh (programmatic dependent launch).
// Weight decoders (K4, K5, K6, B8, B4, XS4), ActRows and the load/dp4a helpers: quant_dot.cuh.
using namespace wq;

template <int NA>
__device__ __forceinline__ void store_rows(const FastParams& p, int64_t row, int a0, float (&acc)[NA], int lane) {
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const float s = warp_sum(acc[a]);
    const int arow = a0 + a;
    if (lane == 0 && (p.expert_ids ? a == 0 : arow < p.n)) p.y[static_cast<int64_t>(arow) * p.y_stride + row] = s;
  }
}

// Resolves this warp's weight row, and the activation rows it serves (first output row a0).
__device__ __forceinline__ const uint8_t* warp_row(const FastParams& p, int64_t row, int g, int& a0, int& xrow0) {
  const uint8_t* w = p.w + static_cast<size_t>(row) * p.row_bytes;
  if (p.expert_ids) {
    w += static_cast<size_t>(p.expert_ids[g]) * p.expert_bytes;
    a0 = g;
    xrow0 = g / p.x_div;
  } else {
    a0 = xrow0 = g;  // times NA by the caller
  }
  return w;
}

// LPR = lanes per weight row (32: one row per warp; 16 or 8: 2 or 4 rows per warp, each lane with 2 or 4
// times the pieces in flight). The default is 32; the others are candidates measured by pg_cuda_bench
// (CudaOptions::gemv_lanes selects one).
template <class T, int NA, int LPR>
__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_q8_kernel(const FastParams p) {
  constexpr int kRowsPerWarp = 32 / LPR, U = kUnrollOf<T> * kRowsPerWarp;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int sub = lane % LPR;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp) * kRowsPerWarp + lane / LPR;
  grid_launch_dependents();
  if (LPR == 32 && row >= p.M) {
    grid_wait();  // every thread waits (see grid_wait), even one with nothing to do
    return;
  }
  const bool active = row < p.M;  // lanes of a row past the end still take part in the shuffles below
  const int g = static_cast<int>(blockIdx.y) + p.g_base;
  // Grouped mode reads expert ids that the router kernel wrote: wait first. Otherwise the first round of
  // weight loads (read-only data) is issued before the wait, overlapping the previous kernel's tail.
  if (p.expert_ids) grid_wait();
  int a0, xr0;
  const uint8_t* w = warp_row(p, active ? row : 0, p.expert_ids ? g : g * NA, a0, xr0);
  ActRows<NA> x;
  const int64_t nd = p.K / 32;
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const int64_t xr = p.expert_ids ? xr0 : min(xr0 + a, p.n - 1);
    x.q[a] = p.xq + xr * p.K;
    x.d[a] = p.xd + xr * nd;
    x.s[a] = p.xs + xr * nd;
  }
  float acc[NA];
#pragma unroll
  for (int a = 0; a < NA; ++a) acc[a] = 0.0f;
  const int np = active ? pieces<T>(p.n_pieces) : 0;
  typename T::Raw r[U];
  int base = sub;
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + LPR * u < np) r[u] = T::load(w, base + LPR * u);
  if (!p.expert_ids) grid_wait();
  while (base < np) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + LPR * u < np) T::template dot<NA>(r[u], base + LPR * u, x, acc);
    base += LPR * U;
    if (base >= np) break;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + LPR * u < np) r[u] = T::load(w, base + LPR * u);
  }
  if constexpr (LPR == 32) {
    store_rows<NA>(p, row, a0, acc, lane);
  } else {
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      float s = acc[a];
#pragma unroll
      for (int o = LPR / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      const int arow = a0 + a;
      if (active && sub == 0 && (p.expert_ids ? a == 0 : arow < p.n)) p.y[static_cast<int64_t>(arow) * p.y_stride + row] = s;
    }
  }
}

// Two weight rows per warp (CudaOptions::gemv_rows_per_warp = 2; one-row batches of the non-grouped
// 8-bit kernel only): a lane holds the same pieces of two adjacent rows, so each activation piece it loads
// from L1 serves both rows (the activation and scale loads of the second dot are the first's, merged by the
// compiler) and twice the weight bytes are in flight per lane. Each row's sum is formed in the same order
// as gemv_q8_kernel<T, NA, 32>: results are bit-identical to it.
//
// rw2_sums is that loop for any two rows w0, w1 (k32 = K/32 weight units each) of one weight type against the same
// activations: the two-row kernel gives it adjacent rows of one matrix, the fused GLU kernel row i of
// gate and row i of up, the grouped kernel two rows of one of several matrices. Because every caller runs
// this one function, each row's per-lane partial sums acc0/acc1 (reduced by the caller with warp_sum)
// are formed in the same order everywhere. It issues the first round of weight loads, then ready() —
// grid_wait() (PDL: every thread of the warp must reach it; activations are only read after it), followed
// for staged activations by the block's copy of them (stage_act) — then the dots.
//
// Staged activations (S = true; CudaOptions::gemv_stage_x): the block copies its one activation row into
// shared memory once (stage_act, XOR-swizzled chunks) and the warps read it from there. Why: Nsight put the
// one-row kernels at 78-85 % of L1/TEX throughput with DRAM at 36-57 % (Q4_K GLU 12288×4096, Q6_K
// 4096×12288): every lane's 16-byte activation loads sit 32-64 bytes apart, so each warp load touched 8-16
// cache lines for 512 useful bytes, and the 4 warps of a block each read the whole row again. Same bytes,
// same sums: bit-identical. Warps without rows (past M) still take part in the copy and its barrier.
template <class T, int NA, class X, class Ready>
__device__ __forceinline__ void rw2_sums(const uint8_t* w0, const uint8_t* w1, const X& x, int k32, int lane, float (&acc0)[NA],
                                         float (&acc1)[NA], Ready ready) {
  constexpr int U = kUnrollOf<T>;
  const int np = pieces<T>(k32);
#pragma unroll
  for (int a = 0; a < NA; ++a) acc0[a] = acc1[a] = 0.0f;
  typename T::Raw r0[U], r1[U];
  int base = lane;
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (base + 32 * u < np) r0[u] = T::load(w0, base + 32 * u), r1[u] = T::load(w1, base + 32 * u);
  ready();
  while (base < np) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + 32 * u < np) dot_pair<T, NA>(r0[u], r1[u], base + 32 * u, x, acc0, acc1);
    base += 32 * U;
    if (base >= np) break;
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + 32 * u < np) r0[u] = T::load(w0, base + 32 * u), r1[u] = T::load(w1, base + 32 * u);
  }
}

// The staging area of one activation row of K values (ActSmem): q (K int8) at 0, d (K/32 FP32) at
// stage_d_off, s (K/32 int32) at stage_s_off; stage_bytes in all (dynamic shared memory).
constexpr size_t stage_d_off(int64_t K) { return static_cast<size_t>(K); }
constexpr size_t stage_s_off(int64_t K) { return stage_d_off(K) + 4 * static_cast<size_t>(K / 32); }
constexpr size_t stage_bytes(int64_t K) { return stage_s_off(K) + 4 * static_cast<size_t>(K / 32); }
constexpr int64_t kStageMaxK = 38912;  // stage_bytes ≤ 48 KB: no opt-in needed on any architecture
// Blocks per SM the staged kernels of T keep: 5 (≤ 102 registers) for Q4_K / Q6_K, which ptxas otherwise
// gave 121-128 registers (4 blocks per SM instead of the global-memory kernels' 5) at no spill; 4 for Q5_K
// and Q8_0, which spill at 5 (ptxas -v).
template <class T>
constexpr int kStageMinBlocks = std::is_same_v<T, K5> || std::is_same_v<T, B8> ? 4 : 5;

// The ActSmem view of a block's staging area (before or after the copy).
__device__ __forceinline__ ActSmem act_smem(const uint8_t* smem, int64_t K) {
  return {reinterpret_cast<const int8_t*>(smem), reinterpret_cast<const float*>(smem + stage_d_off(K)),
          reinterpret_cast<const int32_t*>(smem + stage_s_off(K))};
}
// Block-wide copy of one activation row — q (K) int8, d and s (K/32) — into the staging area, q by 16-byte
// chunks at act_swz positions (K % 128 == 0: the swizzle permutes chunks within groups of 8). Every thread
// of the block calls it: it ends with __syncthreads().
__device__ __forceinline__ void stage_act(const int8_t* q, const float* d, const int32_t* s, int64_t K, uint8_t* smem) {
  int8_t* sq = reinterpret_cast<int8_t*>(smem);
  float* sd = reinterpret_cast<float*>(smem + stage_d_off(K));
  int32_t* ss = reinterpret_cast<int32_t*>(smem + stage_s_off(K));
  for (int64_t c = threadIdx.x; c < K / 16; c += blockDim.x) *reinterpret_cast<int4*>(sq + 16 * act_swz(c)) = ld_q8x16(q + 16 * c);
  for (int64_t i = threadIdx.x; i < K / 32; i += blockDim.x) sd[i] = d[i], ss[i] = s[i];
  __syncthreads();
}

// rw2_sums of two rows against one activation row x (K values, k32 = K/32), its activations staged in
// shared memory (S) or read from global memory. live = false (staged only): the warp has no rows but still
// copies and meets the barrier; its sums are zero and must not be stored.
template <class T, bool S>
__device__ __forceinline__ void rw2_sums_row(const uint8_t* w0, const uint8_t* w1, const ActRows<1>& x, int64_t K, int k32, bool live, int lane,
                                             float (&acc0)[1], float (&acc1)[1]) {
  if constexpr (S) {
    extern __shared__ __align__(16) uint8_t smem[];
    rw2_sums<T, 1>(w0, w1, act_smem(smem, K), live ? k32 : 0, lane, acc0, acc1, [&] {
      grid_wait();
      stage_act(x.q[0], x.d[0], x.s[0], K, smem);
    });
  } else {
    rw2_sums<T, 1>(w0, w1, x, k32, lane, acc0, acc1, [] { grid_wait(); });
  }
}

template <class T, int NA, bool S>
__global__ void __launch_bounds__(kRowsPerBlock * 32, S ? kStageMinBlocks<T> : 1) gemv_q8_rw2_kernel(const FastParams p) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp) * 2;
  grid_launch_dependents();
  if (!S && row0 >= p.M) {
    grid_wait();
    return;
  }
  const bool live = row0 < p.M;          // warp-uniform; false only when S (the warp still stages)
  const bool has1 = live && row0 + 1 < p.M;  // warp-uniform
  const int g = static_cast<int>(blockIdx.y) + p.g_base;
  int a0, xr0;
  const uint8_t* w0 = warp_row(p, live ? row0 : 0, g * NA, a0, xr0);
  const uint8_t* w1 = has1 ? w0 + p.row_bytes : w0;
  ActRows<NA> x;
  const int64_t nd = p.K / 32;
#pragma unroll
  for (int a = 0; a < NA; ++a) {
    const int64_t xr = min(xr0 + a, p.n - 1);
    x.q[a] = p.xq + xr * p.K;
    x.d[a] = p.xd + xr * nd;
    x.s[a] = p.xs + xr * nd;
  }
  float acc0[NA], acc1[NA];
  if constexpr (NA == 1) {
    rw2_sums_row<T, S>(w0, w1, x, p.K, p.n_pieces, live, lane, acc0, acc1);
    if (!live) return;
  } else {
    static_assert(!S, "one staged activation row");
    rw2_sums<T, NA>(w0, w1, x, p.n_pieces, lane, acc0, acc1, [] { grid_wait(); });
  }
  store_rows<NA>(p, row0, a0, acc0, lane);
  if (has1) store_rows<NA>(p, row0 + 1, a0, acc1, lane);
}

// Fused decode FFN (CudaOptions::fuse_glu): y (1, M) = act(x·Gᵀ) ⊙ (x·Uᵀ) for gate G and up U (M, K) of
// one type and layout, one activation row, in one launch after the act-quant. Contract:
//  - p.w = G, w_up = U, both p.row_bytes per row; p.xq (K) int8 / p.xd (K/32) the quantize_q8 activations
//    of x; p.y (M) receives the GLU output (nothing else is written; the up product never leaves registers).
//  - a warp owns row i of G and row i of U (4 per block): rw2_sums gives both rows the per-lane sums of the
//    two-row kernel, warp_sum reduces them as store_rows does, and glu_act is elementwise.cu's glu
//    expression, so y is bit-identical to gemv_q8_rw2_kernel (or gemv_q8_kernel) on G and U + glu_kernel.
//  - PDL as gemv_q8_rw2_kernel: weight loads before grid_wait, every thread waits, even past the end.
template <class T, int ACT, bool S>
__global__ void __launch_bounds__(kRowsPerBlock * 32, S ? kStageMinBlocks<T> : 1) gemv_q8_glu_kernel(const FastParams p, const uint8_t* __restrict__ w_up) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp;
  grid_launch_dependents();
  if (!S && row >= p.M) {
    grid_wait();
    return;
  }
  const bool live = row < p.M;  // warp-uniform; false only when S (the warp still stages)
  const size_t off = static_cast<size_t>(live ? row : 0) * p.row_bytes;
  ActRows<1> x;
  x.q[0] = p.xq;
  x.d[0] = p.xd;
  x.s[0] = p.xs;
  float acc_g[1], acc_u[1];
  rw2_sums_row<T, S>(p.w + off, w_up + off, x, p.K, p.n_pieces, live, lane, acc_g, acc_u);
  if (!live) return;
  const float g = warp_sum(acc_g[0]), u = warp_sum(acc_u[0]);
  if (lane == 0) p.y[row] = glu_act(g, u, ACT);
}

// Grouped decode GEMV (CudaOptions::fuse_qkv): y_j (1, M_j) = x·W_jᵀ for up to kGemvMultiMax matrices W_j
// (M_j, K) of one type and K sharing one activation row (q/k/v, the DeltaNet input projections), in one
// launch. Contract:
//  - xq (K) / xd (K/32): the quantize_q8 activations; n_pieces = K/32; w[j], row_bytes[j], M[j], y[j] per
//    matrix; pair_end[j] = Σ_{i ≤ j} ceil(M_i/2): matrix j owns the warps [pair_end[j−1], pair_end[j]) of
//    the grid (4 per block), each two adjacent rows of it (the last one row when M_j is odd), so a row
//    pair never straddles two matrices.
//  - every row is summed by rw2_sums + warp_sum exactly as gemv_q8_rw2_kernel sums it: y_j is
//    bit-identical to one gemv_fast launch per matrix.
//  - PDL as gemv_q8_rw2_kernel.
constexpr int kMultiMax = 4;
struct MultiParams {
  const int8_t* xq;   // (K)
  const float* xd;    // (K/32)
  const int32_t* xs;  // (K/32) Σq per 32
  int64_t K;
  int n_pieces;       // K/32
  int count;         // matrices, 1..kMultiMax
  const uint8_t* w[kMultiMax];    // (M_j, row_bytes_j) bytes
  size_t row_bytes[kMultiMax];
  int64_t M[kMultiMax];
  float* y[kMultiMax];            // (M_j)
  int64_t pair_end[kMultiMax];    // cumulative warps
  int64_t warps;                  // pair_end[count − 1]: the warps with work
  bool pdl;                       // host side
};

template <class T, bool S>
__global__ void __launch_bounds__(kRowsPerBlock * 32, S ? kStageMinBlocks<T> : 1) gemv_q8_multi_kernel(const MultiParams p) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t gw0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp;
  grid_launch_dependents();
  if (!S && gw0 >= p.warps) {
    grid_wait();
    return;
  }
  const bool live = gw0 < p.warps;  // warp-uniform; false only when S (the warp still stages)
  const int64_t gw = live ? gw0 : 0;
  // The matrix of this warp, selected with static indices only (no dynamically indexed parameter array,
  // which would be copied to local memory).
  const uint8_t* w = p.w[0];
  size_t rb = p.row_bytes[0];
  int64_t M = p.M[0], first = 0;
  float* y = p.y[0];
#pragma unroll
  for (int j = 1; j < kMultiMax; ++j)
    if (j < p.count && gw >= p.pair_end[j - 1]) w = p.w[j], rb = p.row_bytes[j], M = p.M[j], y = p.y[j], first = p.pair_end[j - 1];
  const int64_t row0 = (gw - first) * 2;
  const bool has1 = row0 + 1 < M;  // warp-uniform
  const uint8_t* w0 = w + static_cast<size_t>(row0) * rb;
  const uint8_t* w1 = has1 ? w0 + rb : w0;
  ActRows<1> x;
  x.q[0] = p.xq;
  x.d[0] = p.xd;
  x.s[0] = p.xs;
  float acc0[1], acc1[1];
  rw2_sums_row<T, S>(w0, w1, x, p.K, p.n_pieces, live, lane, acc0, acc1);
  if (!live) return;
  const float s0 = warp_sum(acc0[0]), s1 = warp_sum(acc1[0]);
  if (lane == 0) {
    y[row0] = s0;
    if (has1) y[row0 + 1] = s1;
  }
}

// F16/BF16 weights with FP32 activations: a piece is 8 weights (16 bytes).
template <bool BF, int NA>
__global__ void __launch_bounds__(kRowsPerBlock * 32) gemv_half_kernel(const FastParams p) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp;
  if (row >= p.M) return;
  const int g = static_cast<int>(blockIdx.y) + p.g_base;
  int a0, xr0;
  const uint8_t* w = warp_row(p, row, p.expert_ids ? g : g * NA, a0, xr0);
  const float* x[NA];
#pragma unroll
  for (int a = 0; a < NA; ++a) x[a] = p.x + (p.expert_ids ? xr0 : min(xr0 + a, p.n - 1)) * p.x_stride;
  float acc[NA];
#pragma unroll
  for (int a = 0; a < NA; ++a) acc[a] = 0.0f;
  constexpr int U = 2 * kUnroll;
  for (int base = lane; base < p.n_pieces; base += 32 * U) {
    uint4 r[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (base + 32 * u < p.n_pieces) r[u] = ldg128(w + static_cast<size_t>(base + 32 * u) * 16);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int pi = base + 32 * u;
      if (pi >= p.n_pieces) break;
      const uint32_t q[4] = {r[u].x, r[u].y, r[u].z, r[u].w};
      float wv[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (BF) {
          wv[2 * i] = __uint_as_float(q[i] << 16), wv[2 * i + 1] = __uint_as_float(q[i] & 0xffff0000u);
        } else {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&q[i]));
          wv[2 * i] = f.x, wv[2 * i + 1] = f.y;
        }
      }
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        const float4 x0 = __ldg(reinterpret_cast<const float4*>(x[a] + 8 * static_cast<int64_t>(pi)));
        const float4 x1 = __ldg(reinterpret_cast<const float4*>(x[a] + 8 * static_cast<int64_t>(pi) + 4));
        float s = wv[0] * x0.x;
        s = fmaf(wv[1], x0.y, s), s = fmaf(wv[2], x0.z, s), s = fmaf(wv[3], x0.w, s);
        s = fmaf(wv[4], x1.x, s), s = fmaf(wv[5], x1.y, s), s = fmaf(wv[6], x1.z, s), s = fmaf(wv[7], x1.w, s);
        acc[a] += s;
      }
    }
  }
  store_rows<NA>(p, row, a0, acc, lane);
}

// ---- activation quantization (the CPU default mode's rounding, i.e. ggml-cpu's from_float) -------------
//
// One warp per 256 activations, lane l holding values 8l..8l+7. Two roundings, chosen by the weight type
// exactly as the CPU's vec_dot_type() does:
//  - kActQ8_0 (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL; Q8_1 has the same quants): per 32 values
//    d = fp16(amax/127), q = round-half-even(x·127/amax) saturated to int8 (quant_q8_0_act_scalar);
//  - kActQ8_K (the K-quants, IQ4_XS): per 256 values, max = the value of largest magnitude (the first
//    one on ties), iscale = −127/max, q = min(127, round-half-even(iscale·x)), d = 1/iscale (quant_q8_k).
// Identical quants and scales on both backends mean CUDA-vs-CPU differences in default mode come only
// from summation order (they did not before: 32-value FP32 scales for every type drifted 0.14 in logits).
// Outputs: int8 quants with one FP32 scale per 32 (a Q8_K scale repeated 8 times, so the dot kernels
// above stay per-32), or the dequantized values q·d as FP32 (the FP32 GEMV) or FP16 (the GEMM's tile
// input), so every matmul of default mode sees the same rounded activations.
enum ActOut { kOutQ8, kOutF32, kOutF16 };
static_assert(aq::kQ8_0 == kActQ8_0 && aq::kQ8_K == kActQ8_K, "act_quant.cuh's mode numbers follow kernels.h");

template <int MODE, int OUT>
__global__ void __launch_bounds__(128) act_quant_kernel(const float* __restrict__ x, int64_t x_stride, const int32_t* __restrict__ x_rows,
                                                        int n, int64_t K, void* __restrict__ out, float* __restrict__ d_out,
                                                        int32_t* __restrict__ s_out, uint4* __restrict__ split_out) {
  grid_wait();  // PDL (pdl.cuh): launched with the attribute in a decode step
  const int lane = static_cast<int>(threadIdx.x & 31);
  grid_launch_dependents();  // a GEMV launched after this with PDL may start streaming its weights
  const int64_t chunks = (K + 255) / 256;
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (wid >= n * chunks) return;  // whole warps only: the shuffles below need every lane
  const int64_t r = wid / chunks, e0 = (wid % chunks) * 256 + 8 * lane;
  const bool live = e0 < K;  // Q8_0 rows need not be a multiple of 256 long (K is a multiple of 32)
  const float* src = x + static_cast<int64_t>(x_rows ? x_rows[r] : r) * x_stride + e0;
  float v[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) v[j] = live ? src[j] : 0.0f;
  // The rounding itself is act_quant.cuh's (shared with the RMSNorm kernels that quantize their output).
  if constexpr (OUT == kOutQ8) {
    aq::quantize_store_q8<MODE>(v, lane, r, K, e0, live, static_cast<int8_t*>(out), d_out, s_out, MODE == kActQ8_K ? split_out : nullptr);
    return;
  }
  int q[8];
  float d;
  aq::quantize_warp<MODE>(v, e0, q, d);
  if (!live) return;
  if constexpr (OUT == kOutF32) {
    float* o = static_cast<float*>(out) + r * K + e0;
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = __fmul_rn(static_cast<float>(q[j]), d);
  } else {
    constexpr float kMax = 65504.0f;
    uint32_t h[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float a = fminf(fmaxf(__fmul_rn(static_cast<float>(q[2 * j]), d), -kMax), kMax);
      const float b = fminf(fmaxf(__fmul_rn(static_cast<float>(q[2 * j + 1]), d), -kMax), kMax);
      h[j] = static_cast<uint32_t>(__half_as_ushort(__float2half_rn(a))) | (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(b))) << 16);
    }
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + r * K + e0) = make_uint4(h[0], h[1], h[2], h[3]);
  }
}

template <int OUT>
void launch_act_quant(int mode, const float* x, int64_t x_stride, const int32_t* x_rows, int64_t n, int64_t K, void* out, float* d,
                      cudaStream_t stream, int32_t* sums = nullptr, uint4* split = nullptr) {
  PG_CHECK(K % 32 == 0 && (mode != kActQ8_K || K % 256 == 0), "activation quantization: K=" + std::to_string(K) + " is not a multiple of the block");
  const int64_t warps = n * ((K + 255) / 256);
  if (warps == 0) return;
  const auto blocks = static_cast<unsigned>((warps + 3) / 4);
  if (mode == kActQ8_K)
    launch(act_quant_kernel<kActQ8_K, OUT>, blocks, 128, 0, stream, x, x_stride, x_rows, static_cast<int>(n), K, out, d, sums, split);
  else
    launch(act_quant_kernel<kActQ8_0, OUT>, blocks, 128, 0, stream, x, x_stride, x_rows, static_cast<int>(n), K, out, d, sums, split);
  check_launch("act_quant");
}

// ---- MMQ: integer tensor cores for 2..64 activation rows ---------------------------------------------------
//
// y (n ≤ 64, M) = x · Wᵀ on mma.sync.m16n8k16.s8 with the 8-bit activations above and the weights' integer
// quants unpacked in registers: the dot products of each scale group are exact integers (as on the CPU,
// and unlike the FP16 GEMM), so a verification batch of 22 rows gives the same numbers as 22 single-row
// steps up to float summation order. Why not the dp4a GEMV: at 8+ rows it is bound by its dp4a and scale
// instructions (8 rows cost ~2.6× one row on the H200); one mma does 2048 multiply-adds.
//
// Work: a warp owns 16 weight rows (one m16 tile) × all activation rows (NT n8 tiles), a block 4 warps
// (64 rows); grid.y splits K (partials reduced in a fixed order by mmq_reduce_kernel, so results do not
// depend on timing). Per 256 values ("superblock": one Q4_K/Q5_K/Q6_K block, or 8 Q8_0/Q4_0 blocks)
// a thread loads its A words straight from global memory (all loads of a superblock issued before use),
// its B words from the quantized activations (L1/L2-resident), and keeps per-superblock integer sums of
// scale·dot; the FP32 accumulator is touched once per superblock (K-quants) or per 32 values (Q8_0/Q4_0).
// Fragment layout (PTX ISA, m16n8k16 .s8): A row g / g+8, k = 4t..4t+3; B k = 4t..4t+3, column g;
// C rows g, g+8 × columns 2t, 2t+1 (g = lane/4, t = lane%4). Within a scale group the k order is free, so
// for the 32-value groups thread t takes values 8t..8t+7 of the group (one 8-byte load per row) — B uses
// the same order.
constexpr int kMmqWarps = 4;
// Grouped MMQ (mmq_multi): up to kMmqMaxSegs products of the same activations, weight type, K and split
// plan in one launch over their concatenated 16-row tiles; each segment's outputs are bit-identical to its
// own mmq launch (same tiles, same K slices, same reduction order).
constexpr int kMmqMaxSegs = 4;

struct MmqParams {
  const uint8_t* w[kMmqMaxSegs];  // segment s: (M[s], K) weight rows, row_bytes apart
  float* y[kMmqMaxSegs];          // segment s: (n, y_stride[s]) when grid.y == 1
  int64_t y_stride[kMmqMaxSegs];
  int64_t M[kMmqMaxSegs];
  int tile0[kMmqMaxSegs + 1];     // first 16-row tile of segment s (prefix sums of ⌈M/16⌉); tile0[n_seg] = all tiles
  int64_t part_off[kMmqMaxSegs];  // segment s's partials: part + part_off[s], (grid.y, n, M[s])
  int n_seg;
  size_t row_bytes;
  int n_sb;            // superblocks (256 values) per row
  int sb_per_split;    // superblocks per grid.y slice
  const int8_t* xq;    // (n, K)
  const float* xd;     // (n, K/32)
  const int32_t* xs;   // (n, K/32) Σq
  const uint4* xsplit; // (n, K/256) Σq split for the min-term mma (q8_K only)
  int64_t K;
  int n;
  float* part;         // split-K partials when grid.y > 1 (mmq_part_bytes)
};

// The segment of a warp's 16-row tile and its first row in that segment; tiles past the last segment
// belong to it (their rows clamp to its last row: computed, never stored).
struct MmqTile {
  int seg;
  int64_t m0;
};
__device__ __forceinline__ MmqTile mmq_tile(const MmqParams& p, int tile) {
  int s = 0;
#pragma unroll
  for (int i = 1; i < kMmqMaxSegs; ++i)
    if (i < p.n_seg && tile >= p.tile0[i]) s = i;
  return {s, static_cast<int64_t>(tile - p.tile0[s]) * 16};
}

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
               : "r"(a0), "r"(a1), "r"(b));
}
__device__ __forceinline__ uint2 ldg64(const uint8_t* p) { return __ldg(reinterpret_cast<const uint2*>(p)); }
__device__ __forceinline__ uint2 ldg64a2(const uint8_t* p) { return make_uint2(ldg32a2(p), ldg32a2(p + 4)); }

// Q4_K/Q5_K: kBytes of one 256-value superblock; load(block, t) fetches a thread's quants of one
// superblock of one weight row (alignment: 16, checked by mmq_supported through gemv_fast_q8); a(raw, u,
// s) is the A word of 32-value group u, k16 step s.
struct MqK4 {  // Q4_K, group u = sub-block u; thread t: values 8t..8t+7 of the group
  static constexpr int kBytes = 144;
  struct Raw {
    uint4 hd;
    uint2 q[4];  // qs bytes [32p + 8t, +8): low nibbles group 2p, high nibbles group 2p+1
  };
  __device__ static Raw load(const uint8_t* b, int t) {
    Raw r;
    r.hd = ldg128(b);
#pragma unroll
    for (int p = 0; p < 4; ++p) r.q[p] = ldg64(b + 16 + 32 * p + 8 * t);
    return r;
  }
  __device__ static uint32_t a(const Raw& r, int u, int s) {
    const uint32_t w = s ? r.q[u >> 1].y : r.q[u >> 1].x;
    return (w >> (4 * (u & 1))) & 0x0F0F0F0Fu;
  }
  __device__ static float d(const Raw& r) { return h2f(r.hd.x); }
  __device__ static float dmin(const Raw& r) { return h2f(r.hd.x >> 16); }
};
struct MqK5 {  // Q5_K: as Q4_K plus the 5th bit of value l of group u in bit u of qh[l]
  static constexpr int kBytes = 176;
  struct Raw {
    uint4 hd;
    uint2 qh;    // qh bytes [8t, +8)
    uint2 q[4];  // qs bytes [32p + 8t, +8)
  };
  __device__ static Raw load(const uint8_t* b, int t) {
    Raw r;
    r.hd = ldg128(b);
    r.qh = ldg64(b + 16 + 8 * t);
#pragma unroll
    for (int p = 0; p < 4; ++p) r.q[p] = ldg64(b + 48 + 32 * p + 8 * t);
    return r;
  }
  __device__ static uint32_t a(const Raw& r, int u, int s) {
    const uint32_t w = s ? r.q[u >> 1].y : r.q[u >> 1].x, h = s ? r.qh.y : r.qh.x;
    return ((w >> (4 * (u & 1))) & 0x0F0F0F0Fu) | (((h >> u) & 0x01010101u) << 4);
  }
  __device__ static float d(const Raw& r) { return h2f(r.hd.x); }
  __device__ static float dmin(const Raw& r) { return h2f(r.hd.x >> 16); }
};

template <int NT>
struct MmqAcc {
  float f[NT][4];
};

// Where a superblock's activation operands come from. row: activation row 0..8·NT−1; off: byte offset
// inside the superblock's 256 values; j: its 32-value group (q8_0 scale index; q8_K repeats one scale).
// Global: the q8 scratch through L1, rows clamped to n − 1 (mmq_kernel). Stage: the block's shared-memory
// copy of the superblock (mmq_staged_kernel), whose rows past n − 1 hold row n − 1's bytes — the same
// values, so both sources give the same bits.
struct MmqGlobalSrc {
  const MmqParams& p;
  int sb;
  __device__ int64_t row(int r) const { return min(r, p.n - 1); }
  __device__ uint2 b64(int r, int off) const { return ldg64(reinterpret_cast<const uint8_t*>(p.xq + row(r) * p.K + sb * 256 + off)); }
  __device__ uint32_t b32(int r, int off) const { return __ldg(reinterpret_cast<const uint32_t*>(p.xq + row(r) * p.K + sb * 256 + off)); }
  __device__ float xd(int r, int j) const { return __ldg(p.xd + row(r) * (p.K / 32) + sb * 8 + j); }
  __device__ uint4 split(int r) const { return __ldg(p.xsplit + row(r) * (p.K / 256) + sb); }
};
// One stage: q (8·NT, RS) int8 (256 values of each row, then padding), d (8·NT, 8) FP32, s (8·NT) uint4.
// RS is chosen so the fragment reads are free of bank conflicts: 8-byte reads (lanes g·RS + 8t + 32u, a
// half-warp g = 0..3 × t = 0..3) need RS ≡ 32 (mod 128), 288; Q6_K's 4-byte reads (a warp, g = 0..7 ×
// t = 0..3, at g·RS + 4t) need RS ≡ 16 (mod 128), 272.
template <int RS>
struct MmqStageSrc {
  const uint8_t* q;
  const float* d;
  const uint4* s;
  __device__ uint2 b64(int r, int off) const { return *reinterpret_cast<const uint2*>(q + r * RS + off); }
  __device__ uint32_t b32(int r, int off) const { return *reinterpret_cast<const uint32_t*>(q + r * RS + off); }
  __device__ float xd(int r, int j) const { return d[r * 8 + j]; }
  __device__ uint4 split(int r) const { return s[r]; }
};

// Weights of one superblock of a thread's two rows (g and g + 8 of its warp's m16 tile), loaded by
// mmq_load_* before they are used by mmq_sb_* (the staged kernel issues them before its barrier).
template <class T>
struct MmqWK {
  typename T::Raw r0, r1;
};
template <class T>
__device__ __forceinline__ MmqWK<T> mmq_load_kquant(const uint8_t* w0, const uint8_t* w1, int sb, int t) {
  return {T::load(w0 + static_cast<size_t>(sb) * T::kBytes, t), T::load(w1 + static_cast<size_t>(sb) * T::kBytes, t)};
}

// Q4_K / Q5_K: acc += xd·(d·Σ_u sc_u·c_u − dmin·Σ_u m_u·xsum_u) per superblock (xd is per superblock: q8_K).
// The 6-bit scales and mins of all 8 groups are unpacked as bytes with a few word operations; the min
// term Σ_u m_u·xsum_u is itself an integer matrix product (16 rows × 8 groups · 8 groups × 8 columns),
// done by two more mma with the block sums split as 64·h + l (scratch_split) so both operands fit int8.
template <class T, int NT, class Src>
__device__ __forceinline__ void mmq_sb_kquant(const MmqWK<T>& w, const Src& src, int g, int t, MmqAcc<NT>& acc) {
  const typename T::Raw& r0 = w.r0;
  const typename T::Raw& r1 = w.r1;
  // Bytes j of sc[0] / sc[1]: scales of groups j / 4 + j; m[0] / m[1] the mins (get_scale_min_k4).
  auto unpack = [](const uint4& hd, uint32_t (&sc)[2], uint32_t (&m)[2]) {
    sc[0] = hd.y & 0x3f3f3f3fu;
    m[0] = hd.z & 0x3f3f3f3fu;
    sc[1] = (hd.w & 0x0f0f0f0fu) | ((hd.y >> 2) & 0x30303030u);
    m[1] = ((hd.w >> 4) & 0x0f0f0f0fu) | ((hd.z >> 2) & 0x30303030u);
  };
  uint32_t sc0[2], m0[2], sc1[2], m1[2];
  unpack(r0.hd, sc0, m0);
  unpack(r1.hd, sc1, m1);
  int isum[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) isum[nt][i] = 0;
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int s0 = static_cast<int>((sc0[u >> 2] >> (8 * (u & 3))) & 0xff), s1 = static_cast<int>((sc1[u >> 2] >> (8 * (u & 3))) & 0xff);
    const uint32_t a00 = T::a(r0, u, 0), a10 = T::a(r1, u, 0), a01 = T::a(r0, u, 1), a11 = T::a(r1, u, 1);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint2 b = src.b64(8 * nt + g, 32 * u + 8 * t);
      int c[4] = {0, 0, 0, 0};
      mma_s8(c, a00, a10, b.x);
      mma_s8(c, a01, a11, b.y);
      isum[nt][0] += s0 * c[0], isum[nt][1] += s0 * c[1], isum[nt][2] += s1 * c[2], isum[nt][3] += s1 * c[3];
    }
  }
  // Min terms: A = the mins (k = group: t = 0 holds groups 0..3, t = 1 groups 4..7, t ≥ 2 zero padding).
  const uint32_t am0 = t < 2 ? m0[t] : 0u, am1 = t < 2 ? m1[t] : 0u;
  const float d0 = T::d(r0), d1 = T::d(r1), n0 = T::dmin(r0), n1 = T::dmin(r1);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint4 sp = src.split(8 * nt + g);
    int ch[4] = {0, 0, 0, 0}, cl[4] = {0, 0, 0, 0};
    mma_s8(ch, am0, am1, t == 0 ? sp.x : t == 1 ? sp.y : 0u);
    mma_s8(cl, am0, am1, t == 0 ? sp.z : t == 1 ? sp.w : 0u);
    const float x0 = src.xd(8 * nt + 2 * t, 0), x1 = src.xd(8 * nt + 2 * t + 1, 0);
    acc.f[nt][0] += x0 * (d0 * static_cast<float>(isum[nt][0]) - n0 * static_cast<float>(64 * ch[0] + cl[0]));
    acc.f[nt][1] += x1 * (d0 * static_cast<float>(isum[nt][1]) - n0 * static_cast<float>(64 * ch[1] + cl[1]));
    acc.f[nt][2] += x0 * (d1 * static_cast<float>(isum[nt][2]) - n1 * static_cast<float>(64 * ch[2] + cl[2]));
    acc.f[nt][3] += x1 * (d1 * static_cast<float>(isum[nt][3]) - n1 * static_cast<float>(64 * ch[3] + cl[3]));
  }
}

// Q6_K: 16-value scale groups, so the standard k order (step s = values 16s + 4t..) with 4-byte loads.
// Group u (32 values) = half hf = u/4, w = u%4: ql bytes 64hf + 32(w&1) + l (nibble w>>1), qh bytes
// 32hf + l (bits 2w), scale sc[8hf + 2w + s]; values q − 32.
struct MmqW6 {
  uint32_t ql[2][2][2][2], qh[2][2][2];  // [row][hf][w&1][s], [row][hf][s]
  uint32_t scw0[4], scw1[4];
  float d0, d1;
};
__device__ __forceinline__ MmqW6 mmq_load_q6k(const uint8_t* w0, const uint8_t* w1, int sb, int t) {
  const uint8_t* b0 = w0 + static_cast<size_t>(sb) * 210;
  const uint8_t* b1 = w1 + static_cast<size_t>(sb) * 210;
  MmqW6 w;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int s = 0; s < 2; ++s) {
#pragma unroll
      for (int lo = 0; lo < 2; ++lo) {
        w.ql[0][hf][lo][s] = ldg32a2(b0 + 64 * hf + 32 * lo + 16 * s + 4 * t);
        w.ql[1][hf][lo][s] = ldg32a2(b1 + 64 * hf + 32 * lo + 16 * s + 4 * t);
      }
      w.qh[0][hf][s] = ldg32a2(b0 + 128 + 32 * hf + 16 * s + 4 * t);
      w.qh[1][hf][s] = ldg32a2(b1 + 128 + 32 * hf + 16 * s + 4 * t);
    }
#pragma unroll
  for (int i = 0; i < 4; ++i) w.scw0[i] = ldg32a2(b0 + 192 + 4 * i), w.scw1[i] = ldg32a2(b1 + 192 + 4 * i);
  w.d0 = h2f(__ldg(reinterpret_cast<const uint16_t*>(b0 + 208))), w.d1 = h2f(__ldg(reinterpret_cast<const uint16_t*>(b1 + 208)));
  return w;
}
template <int NT, class Src>
__device__ __forceinline__ void mmq_sb_q6k(const MmqW6& w, const Src& src, int g, int t, MmqAcc<NT>& acc) {
  int isum[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) isum[nt][i] = 0;
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int hf = u >> 2, q = u & 3;
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int si = 8 * hf + 2 * q + s;
      const int sc0 = static_cast<int8_t>((w.scw0[si >> 2] >> (8 * (si & 3))) & 0xff);
      const int sc1 = static_cast<int8_t>((w.scw1[si >> 2] >> (8 * (si & 3))) & 0xff);
      const uint32_t a0 = __vsub4(((w.ql[0][hf][q & 1][s] >> (4 * (q >> 1))) & 0x0F0F0F0Fu) | (((w.qh[0][hf][s] >> (2 * q)) & 0x03030303u) << 4), 0x20202020u);
      const uint32_t a1 = __vsub4(((w.ql[1][hf][q & 1][s] >> (4 * (q >> 1))) & 0x0F0F0F0Fu) | (((w.qh[1][hf][s] >> (2 * q)) & 0x03030303u) << 4), 0x20202020u);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t b = src.b32(8 * nt + g, 32 * u + 16 * s + 4 * t);
        int c[4] = {0, 0, 0, 0};
        mma_s8(c, a0, a1, b);
        isum[nt][0] += sc0 * c[0], isum[nt][1] += sc0 * c[1], isum[nt][2] += sc1 * c[2], isum[nt][3] += sc1 * c[3];
      }
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float x0 = src.xd(8 * nt + 2 * t, 0), x1 = src.xd(8 * nt + 2 * t + 1, 0);
    acc.f[nt][0] += x0 * w.d0 * static_cast<float>(isum[nt][0]);
    acc.f[nt][1] += x1 * w.d0 * static_cast<float>(isum[nt][1]);
    acc.f[nt][2] += x0 * w.d1 * static_cast<float>(isum[nt][2]);
    acc.f[nt][3] += x1 * w.d1 * static_cast<float>(isum[nt][3]);
  }
}

// Q8_0 / Q4_0 (32-value blocks, FP16 scale each; activations q8_0, scale per 32): acc += d_w·d_x·c per block.
// Q8_0 thread t: qs bytes [8t, +8) of the block; Q4_0: nibbles of qs bytes [8(t&1), +8), low (values
// 0..15) for t < 2, high (16..31) for t ≥ 2, minus 8.
struct MmqWL {
  uint2 q[2][8];
  uint32_t dh[2][8];
};
template <bool Q4>
__device__ __forceinline__ MmqWL mmq_load_legacy(const uint8_t* w0, const uint8_t* w1, int sb, int t) {
  constexpr int kB = Q4 ? 18 : 34;
  MmqWL w;
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const uint8_t* b0 = w0 + (static_cast<size_t>(sb) * 8 + u) * kB;
    const uint8_t* b1 = w1 + (static_cast<size_t>(sb) * 8 + u) * kB;
    const int off = Q4 ? 2 + 8 * (t & 1) : 2 + 8 * t;
    w.q[0][u] = ldg64a2(b0 + off), w.q[1][u] = ldg64a2(b1 + off);
    w.dh[0][u] = __ldg(reinterpret_cast<const uint16_t*>(b0)), w.dh[1][u] = __ldg(reinterpret_cast<const uint16_t*>(b1));
  }
  return w;
}
template <bool Q4, int NT, class Src>
__device__ __forceinline__ void mmq_sb_legacy(const MmqWL& w, const Src& src, int g, int t, MmqAcc<NT>& acc) {
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    uint32_t a[2][2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      a[r][0] = w.q[r][u].x, a[r][1] = w.q[r][u].y;
      if constexpr (Q4) {
        const int sh = 4 * (t >> 1);
        a[r][0] = __vsub4((a[r][0] >> sh) & 0x0F0F0F0Fu, 0x08080808u);
        a[r][1] = __vsub4((a[r][1] >> sh) & 0x0F0F0F0Fu, 0x08080808u);
      }
    }
    const float dw0 = h2f(w.dh[0][u]), dw1 = h2f(w.dh[1][u]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint2 b = src.b64(8 * nt + g, 32 * u + 8 * t);
      int c[4] = {0, 0, 0, 0};
      mma_s8(c, a[0][0], a[1][0], b.x);
      mma_s8(c, a[0][1], a[1][1], b.y);
      const float x0 = src.xd(8 * nt + 2 * t, u), x1 = src.xd(8 * nt + 2 * t + 1, u);
      acc.f[nt][0] += (dw0 * x0) * static_cast<float>(c[0]);
      acc.f[nt][1] += (dw0 * x1) * static_cast<float>(c[1]);
      acc.f[nt][2] += (dw1 * x0) * static_cast<float>(c[2]);
      acc.f[nt][3] += (dw1 * x1) * static_cast<float>(c[3]);
    }
  }
}

enum MmqType { kMqQ4K, kMqQ5K, kMqQ6K, kMqQ8_0, kMqQ4_0 };

// One type's weight load and superblock product, for both kernels.
template <int TY>
__device__ __forceinline__ auto mmq_load(const uint8_t* w0, const uint8_t* w1, int sb, int t) {
  if constexpr (TY == kMqQ4K) return mmq_load_kquant<MqK4>(w0, w1, sb, t);
  else if constexpr (TY == kMqQ5K) return mmq_load_kquant<MqK5>(w0, w1, sb, t);
  else if constexpr (TY == kMqQ6K) return mmq_load_q6k(w0, w1, sb, t);
  else return mmq_load_legacy<TY == kMqQ4_0>(w0, w1, sb, t);
}
template <int TY, int NT, class W, class Src>
__device__ __forceinline__ void mmq_superblock(const W& w, const Src& src, int g, int t, MmqAcc<NT>& acc) {
  if constexpr (TY == kMqQ4K) mmq_sb_kquant<MqK4, NT>(w, src, g, t, acc);
  else if constexpr (TY == kMqQ5K) mmq_sb_kquant<MqK5, NT>(w, src, g, t, acc);
  else if constexpr (TY == kMqQ6K) mmq_sb_q6k<NT>(w, src, g, t, acc);
  else mmq_sb_legacy<TY == kMqQ4_0, NT>(w, src, g, t, acc);
}

// Stores a warp's 16 rows × 8·NT columns of segment `seg`: into y when the K range is whole, else into its
// partial slice.
template <int NT>
__device__ __forceinline__ void mmq_store(const MmqParams& p, const MmqAcc<NT>& acc, int seg, int64_t m0, int g, int t) {
  const int z = static_cast<int>(blockIdx.y);
  const int64_t M = p.M[seg];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t m = m0 + g + 8 * (i >> 1);
      const int a = 8 * nt + 2 * t + (i & 1);
      if (m >= M || a >= p.n) continue;
      if (gridDim.y == 1)
        p.y[seg][static_cast<int64_t>(a) * p.y_stride[seg] + m] = acc.f[nt][i];
      else
        p.part[p.part_off[seg] + (static_cast<int64_t>(z) * p.n + a) * M + m] = acc.f[nt][i];
    }
}

// No PDL here: launched with it (grid_wait first, launch_dependents at the start) the qwen3-8b 22-row verify
// forward took 8.14 ms against 7.47 without (H200, 2026-12-04), 8 rows 5.31 vs 5.25, 32 rows 9.87 vs 8.98.
template <int TY, int NT>
__global__ void __launch_bounds__(kMmqWarps * 32) mmq_kernel(const MmqParams p) {
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2, t = lane & 3;
  const int tile = static_cast<int>(blockIdx.x) * kMmqWarps + warp;
  if (tile >= p.tile0[p.n_seg]) return;
  const MmqTile tl = mmq_tile(p, tile);
  const int64_t M = p.M[tl.seg];
  const int64_t r0 = min(tl.m0 + g, M - 1), r1 = min(tl.m0 + g + 8, M - 1);  // rows past M compute garbage, never stored
  const uint8_t* w0 = p.w[tl.seg] + static_cast<size_t>(r0) * p.row_bytes;
  const uint8_t* w1 = p.w[tl.seg] + static_cast<size_t>(r1) * p.row_bytes;
  MmqAcc<NT> acc;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc.f[nt][i] = 0.0f;
  const int z = static_cast<int>(blockIdx.y);
  const int sb0 = z * p.sb_per_split, sb1 = min(p.n_sb, sb0 + p.sb_per_split);
  for (int sb = sb0; sb < sb1; ++sb) mmq_superblock<TY, NT>(mmq_load<TY>(w0, w1, sb, t), MmqGlobalSrc{p, sb}, g, t, acc);
  mmq_store<NT>(p, acc, tl.seg, tl.m0, g, t);
}

// ---- MMQ with the activations staged in shared memory (MatmulArgs::mmq_staged, CudaOptions::mmq_staged) ----
//
// mmq_kernel has every warp read its B fragments (the activation rows, 8 of them × 8 bytes per load) from
// global memory: each warp-wide load touches 8 cache lines, the same bytes again for each of the block's 4
// warps. Nsight (2026-12-04, H200, Q4_K 12288×4096, 22 rows): L1/TEX throughput 79 %, DRAM 17 %, 0.36 issued
// warps per scheduler, the top stalls waiting on L1TEX for the weights and the activations. Here the block
// copies each superblock's activation slice — 8·NT rows × 256 int8, their scales and (q8_K) split sums —
// into shared memory once (cp.async, a 2-stage ring: superblock sb + 1 streams in while sb is computed),
// and the warps read their fragments from there without bank conflicts (MmqStageSrc). A thread's weights
// of superblock sb are requested before the barrier that makes its stage visible, so their latency
// overlaps the wait. Same loads of the same bytes, same arithmetic in the same order: bit-identical to
// mmq_kernel (CudaOps.MmqStagedBitIdentical).
constexpr int kMmqStages = 2;
template <int TY>
constexpr int mmq_stage_rs() { return TY == kMqQ6K ? 272 : 288; }
template <int TY, int NT>
constexpr int mmq_stage_bytes() { return 8 * NT * (mmq_stage_rs<TY>() + 32 + 16); }

// Issues the cp.async copies of superblock sb's activation slice into stage st (all threads of the block).
// Rows ≥ n copy row n − 1. Sources are 16-byte aligned: the scratch is, K % 256 == 0, and d / split start
// at 16-byte boundaries (scratch_d / scratch_split).
template <int TY, int NT>
__device__ __forceinline__ void mmq_fill_stage(const MmqParams& p, uint8_t* st, int sb) {
  constexpr int NR = 8 * NT, RS = mmq_stage_rs<TY>();
  constexpr bool kq = TY == kMqQ4K || TY == kMqQ5K;  // q8_K activations: the split sums of the min term
  constexpr int kChunks = NR * (16 + 2 + (kq ? 1 : 0));
  const int64_t nb32 = p.K / 32, nsb = p.K / 256;
  for (int c = static_cast<int>(threadIdx.x); c < kChunks; c += kMmqWarps * 32) {
    if (c < NR * 16) {
      const int r = c >> 4, k = c & 15;
      const int64_t src = min(r, p.n - 1);
      cp_async16(st + r * RS + 16 * k, p.xq + src * p.K + sb * 256 + 16 * k);
    } else if (c < NR * 18) {
      const int r = (c - NR * 16) >> 1, k = (c - NR * 16) & 1;
      const int64_t src = min(r, p.n - 1);
      cp_async16(st + NR * RS + r * 32 + 16 * k, p.xd + src * nb32 + sb * 8 + 4 * k);
    } else {
      const int r = c - NR * 18;
      const int64_t src = min(r, p.n - 1);
      cp_async16(st + NR * RS + NR * 32 + r * 16, p.xsplit + src * nsb + sb);
    }
  }
}

template <int TY, int NT>
__global__ void __launch_bounds__(kMmqWarps * 32) mmq_staged_kernel(const MmqParams p) {
  extern __shared__ uint4 mmq_smem[];  // kMmqStages × mmq_stage_bytes<TY, NT>()
  constexpr int NR = 8 * NT, RS = mmq_stage_rs<TY>(), SB = mmq_stage_bytes<TY, NT>();
  uint8_t* sm = reinterpret_cast<uint8_t*>(mmq_smem);
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int g = lane >> 2, t = lane & 3;
  // No early exit: every thread copies stages and meets the barriers; rows past M compute garbage, never stored.
  const int tile = static_cast<int>(blockIdx.x) * kMmqWarps + warp;
  const MmqTile tl = mmq_tile(p, tile);
  const int64_t M = p.M[tl.seg];
  const int64_t r0 = min(tl.m0 + g, M - 1), r1 = min(tl.m0 + g + 8, M - 1);
  const uint8_t* w0 = p.w[tl.seg] + static_cast<size_t>(r0) * p.row_bytes;
  const uint8_t* w1 = p.w[tl.seg] + static_cast<size_t>(r1) * p.row_bytes;
  MmqAcc<NT> acc;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc.f[nt][i] = 0.0f;
  const int z = static_cast<int>(blockIdx.y);
  const int sb0 = z * p.sb_per_split, sb1 = min(p.n_sb, sb0 + p.sb_per_split);
  mmq_fill_stage<TY, NT>(p, sm, sb0);
  cp_async_commit();
  for (int sb = sb0, i = 0; sb < sb1; ++sb, ++i) {
    const auto w = mmq_load<TY>(w0, w1, sb, t);  // in flight across the wait below
    if (sb + 1 < sb1) mmq_fill_stage<TY, NT>(p, sm + ((i + 1) % kMmqStages) * SB, sb + 1);
    cp_async_commit();
    cp_async_wait<1>();  // stage i has landed (this thread's copies) ...
    __syncthreads();     // ... and everyone's
    const uint8_t* st = sm + (i % kMmqStages) * SB;
    mmq_superblock<TY, NT>(w, MmqStageSrc<RS>{st, reinterpret_cast<const float*>(st + NR * RS), reinterpret_cast<const uint4*>(st + NR * RS + NR * 32)},
                           g, t, acc);
    __syncthreads();  // stage i is read before iteration i + 1 refills it
  }
  if (tile < p.tile0[p.n_seg] && tl.m0 < M) mmq_store<NT>(p, acc, tl.seg, tl.m0, g, t);
}

// y_s (n, M_s) = Σ_z part_s[z] in slice order (deterministic), for every segment s; with glu ≥ 0 (mmq_multi
// of gate and up) segment 0 gets act(Σ gate)·(Σ up) (glu_act: the glu kernel's expression, so bit-identical to
// the composition) and segment 1 the up sums. Element i of the flattened (segment, row, column) space.
__global__ void mmq_reduce_kernel(const MmqParams p, int splits, int glu) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int n_out = glu >= 0 ? 1 : p.n_seg;  // GLU: one element per (row, column) of gate, both sums read
  int s = 0;
  for (; s < n_out; ++s) {
    const int64_t e = static_cast<int64_t>(p.n) * p.M[s];
    if (i < e) break;
    i -= e;
  }
  if (s >= n_out) return;
  const int64_t M = p.M[s], a = i / M, m = i % M;
  auto sum = [&](int seg) {
    const float* part = p.part + p.part_off[seg] + i;
    float v = 0.0f;
    for (int z = 0; z < splits; ++z) v += part[static_cast<int64_t>(z) * p.n * M];
    return v;
  };
  if (glu < 0) {
    p.y[s][a * p.y_stride[s] + m] = sum(s);
  } else {
    const float gv = sum(0), uv = sum(1);
    p.y[1][a * p.y_stride[1] + m] = uv;
    p.y[0][a * p.y_stride[0] + m] = glu_act(gv, uv, glu);
  }
}

int mmq_type(DType t) {
  switch (t) {
    case DType::Q4_K: return kMqQ4K;
    case DType::Q5_K: return kMqQ5K;
    case DType::Q6_K: return kMqQ6K;
    case DType::Q8_0: return kMqQ8_0;
    case DType::Q4_0: return kMqQ4_0;
    default: return -1;
  }
}

struct MmqPlan {
  int splits, sb_per_split, blocks_x;
};
MmqPlan mmq_plan(const MatmulArgs& a, int n_sm) {
  MmqPlan pl{};
  const int n_sb = static_cast<int>(a.K / 256);
  pl.blocks_x = static_cast<int>(ceil_div(ceil_div(a.M, int64_t{16}), int64_t{kMmqWarps}));
  int want = std::max(1, std::min({8, n_sb, ceil_div(4 * n_sm, pl.blocks_x)}));
  pl.sb_per_split = ceil_div(n_sb, want);
  pl.splits = ceil_div(n_sb, pl.sb_per_split);
  return pl;
}

template <int TY, int NT>
void mmq_launch_nt(const MmqParams& p, dim3 grid, cudaStream_t stream, bool staged) {
  if (staged)
    mmq_staged_kernel<TY, NT><<<grid, kMmqWarps * 32, kMmqStages * mmq_stage_bytes<TY, NT>(), stream>>>(p);
  else
    mmq_kernel<TY, NT><<<grid, kMmqWarps * 32, 0, stream>>>(p);
}
template <int TY>
void mmq_launch_t(const MmqParams& p, int nt, dim3 grid, cudaStream_t stream, bool staged) {
  switch (nt) {
    case 1: mmq_launch_nt<TY, 1>(p, grid, stream, staged); break;
    case 2: mmq_launch_nt<TY, 2>(p, grid, stream, staged); break;
    case 3: mmq_launch_nt<TY, 3>(p, grid, stream, staged); break;
    case 4: mmq_launch_nt<TY, 4>(p, grid, stream, staged); break;
    case 5:
    case 6: mmq_launch_nt<TY, 6>(p, grid, stream, staged); break;
    default: mmq_launch_nt<TY, 8>(p, grid, stream, staged); break;
  }
}

int64_t activation_rows(const MatmulArgs& a) { return a.expert_ids ? (a.n + std::max(1, a.x_div) - 1) / std::max(1, a.x_div) : a.n; }

// pdl: launch with programmatic stream serialization (only kernels that call grid_wait as required).
template <class K>
void launch_rows(K kernel, const FastParams& p, int groups, cudaStream_t stream, int rows_per_warp = 1, bool pdl = false, size_t smem = 0) {
  for (int g0 = 0; g0 < groups; g0 += 65535) {
    FastParams q = p;
    q.g_base = g0;
    const dim3 grid(static_cast<unsigned>(ceil_div(p.M, kRowsPerBlock * rows_per_warp)), static_cast<unsigned>(std::min(65535, groups - g0)));
    launch_pdl(pdl, kernel, grid, dim3(kRowsPerBlock * 32), smem, stream, q);
    check_launch("gemv_fast");
  }
}

// Activation rows per grid row for n rows: 1, 2, 4 or 8.
int rows_per_group(int n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

template <template <int> class Launch>
void by_rows(const MatmulArgs& a, FastParams& p, cudaStream_t stream) {
  if (a.expert_ids) return Launch<1>::run(p, a.n, stream);
  const int na = rows_per_group(a.n), groups = ceil_div(a.n, na);
  switch (na) {
    case 1: return Launch<1>::run(p, groups, stream);
    case 2: return Launch<2>::run(p, groups, stream);
    case 4: return Launch<4>::run(p, groups, stream);
    default: return Launch<8>::run(p, groups, stream);
  }
}

template <class T, int LPR>
struct LaunchQ8 {
  template <int NA>
  struct L {
    static void run(const FastParams& p, int groups, cudaStream_t s) { launch_rows(gemv_q8_kernel<T, NA, LPR>, p, groups, s, 32 / LPR, p.pdl); }
  };
};
// stage: the staged-activation kernel (one activation row; stage_ok).
template <class T>
struct LaunchQ8Rw2 {
  template <int NA>
  struct L {
    static void run(const FastParams& p, int groups, cudaStream_t s, bool stage = false) {
      if (stage)
        launch_rows(gemv_q8_rw2_kernel<T, NA, true>, p, groups, s, 2, p.pdl, stage_bytes(p.K));
      else
        launch_rows(gemv_q8_rw2_kernel<T, NA, false>, p, groups, s, 2, p.pdl);
    }
  };
};
template <bool BF>
struct LaunchHalf {
  template <int NA>
  struct L {
    static void run(const FastParams& p, int groups, cudaStream_t s) { launch_rows(gemv_half_kernel<BF, NA>, p, groups, s); }
  };
};

// One launch of kernel(args...) on `grid` blocks of kRowsPerBlock warps, with programmatic stream
// serialization when pdl (the kernel must call grid_wait as gemv_q8_rw2_kernel does).
template <class... P, class... A>
void launch_fast(void (*kernel)(P...), dim3 grid, bool pdl, cudaStream_t stream, const char* what, size_t smem, A&&... args) {
  launch_pdl(pdl, kernel, grid, dim3(kRowsPerBlock * 32), smem, stream, std::forward<A>(args)...);
  check_launch(what);
}

// Whether a one-row GEMV of a (the rw2 / GLU / grouped kernels) stages its
// activations (MatmulArgs::stage_x). Alone, staging wins on Q8_0/Q4_0 at every decode shape (pg_cuda_bench,
// H200, 2026-12-04, µs staged vs not: 4096×12288 26.4 vs 32.5, 151936×4096 187 vs 215) and on tall K-quant
// matrices (Q4_K 151936×4096 91.5 vs 98.1), and loses ~2 µs on 8B-sized K-quant ones (Q4_K 12288×4096
// 21.4 vs 18.9); in the model, with graphs and PDL, that loss does not show (qwen3-8b Q4_K_M 357.1 vs 358.0
// tok/s) while qwen35-27b gains (122.3 vs 112.6) and qwen3-8b Q8_0 (278.1 vs 256.0): stage everywhere.
bool stage_ok(const MatmulArgs& a) { return a.stage_x && a.K % 128 == 0 && a.K <= kStageMaxK; }

bool aligned(const MatmulArgs& a, size_t align) {
  return reinterpret_cast<uintptr_t>(a.w) % align == 0 && a.row_bytes % align == 0 && a.expert_bytes % align == 0;
}

FastParams make_params(const MatmulArgs& a) {
  FastParams p{};
  p.w = static_cast<const uint8_t*>(a.w);
  p.row_bytes = a.row_bytes;
  p.M = a.M;
  p.K = a.K;
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.y = a.y;
  p.y_stride = a.y_stride;
  p.n = a.n;
  p.expert_ids = a.expert_ids;
  p.expert_bytes = a.expert_bytes;
  p.x_div = std::max(1, a.x_div);
  p.pdl = a.pdl;
  return p;
}

// The persistent pipelined one-row GEMV (CudaOptions::gemv_pipe): kernel and launcher.
#include "backend/cuda/gemv_pipe.cuh"

}  // namespace

size_t gemv_fast_scratch_bytes(const MatmulArgs& a) {
  if (a.type == DType::F16 || a.type == DType::BF16) return 0;
  const int64_t rows = activation_rows(a);
  return static_cast<size_t>(rows * a.K) + 2 * static_cast<size_t>(rows * (a.K / 32)) * sizeof(float) + static_cast<size_t>(rows * (a.K / 256)) * 16 + 32;
}

namespace {
// Scratch layout: q (rows, K) int8, then d (rows, K/32) F32 at the next 16-byte boundary, then Σq (rows, K/32) int32.
int8_t* scratch_q(void* s) { return static_cast<int8_t*>(s); }
float* scratch_d(const MatmulArgs& a, void* s) {
  return reinterpret_cast<float*>(static_cast<uint8_t*>(s) + ((static_cast<size_t>(activation_rows(a) * a.K) + 15) & ~size_t{15}));
}
// Then Σq per 32 values, (rows, K/32) int32, right after the scales; then (q8_K only) the same sums split
// for MMQ, (rows, K/256) uint4, at the next 16-byte boundary.
int32_t* scratch_s(const MatmulArgs& a, void* s) { return reinterpret_cast<int32_t*>(scratch_d(a, s) + activation_rows(a) * (a.K / 32)); }
uint4* scratch_split(const MatmulArgs& a, void* s) {
  const auto p = reinterpret_cast<uintptr_t>(scratch_s(a, s) + activation_rows(a) * (a.K / 32));
  return reinterpret_cast<uint4*>((p + 15) & ~uintptr_t{15});
}
MatmulArgs layout_args(int64_t rows, int64_t K) {
  MatmulArgs a;
  a.type = DType::Q8_0;  // any 8-bit-activation type: the layout depends on rows and K only
  a.n = static_cast<int>(rows);
  a.K = K;
  return a;
}
}  // namespace

size_t q8_scratch_bytes(int64_t rows, int64_t K) { return gemv_fast_scratch_bytes(layout_args(rows, K)); }

Q8Scratch q8_scratch(void* scratch, int64_t rows, int64_t K) {
  const MatmulArgs a = layout_args(rows, K);
  return {scratch_q(scratch), scratch_d(a, scratch), scratch_s(a, scratch), K % 256 == 0 ? scratch_split(a, scratch) : nullptr};
}

bool gemv_fast_q8(const MatmulArgs& a) {
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || a.x_stride % 4 != 0) return false;
  bool ok = false;
  wq::dispatch(a.type, [&]<class T>() { ok = a.K % kBlockValues<T> == 0 && aligned(a, T::kAlign); });
  return ok;
}

bool gemv_pipe_supported(const MatmulArgs& a) { return gemv_fast_q8(a) && pipe_supported(a); }

void quantize_q8(const MatmulArgs& a, void* scratch, cudaStream_t stream) {
  launch_act_quant<kOutQ8>(act_quant_mode(a.type), a.x, a.x_stride, nullptr, activation_rows(a), a.K, scratch_q(scratch), scratch_d(a, scratch),
                           stream, scratch_s(a, scratch), act_quant_mode(a.type) == kActQ8_K && a.K % 256 == 0 ? scratch_split(a, scratch) : nullptr);
}

int act_quant_mode(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::IQ4_NL:
      return kActQ8_0;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return kActQ8_K;
    default:
      return kActNone;
  }
}

void act_quant_f32(int mode, const float* x, int64_t x_stride, int64_t n, int64_t K, float* out, cudaStream_t stream) {
  launch_act_quant<kOutF32>(mode, x, x_stride, nullptr, n, K, out, nullptr, stream);
}

void act_quant_f16(int mode, const float* x, int64_t x_stride, const int32_t* x_rows, int64_t n, int64_t K, uint16_t* out,
                   cudaStream_t stream) {
  launch_act_quant<kOutF16>(mode, x, x_stride, x_rows, n, K, out, nullptr, stream);
}

bool gemv_fast(const MatmulArgs& a, void* scratch, cudaStream_t stream, bool x_quantized) {
  if (a.n <= 0 || a.M <= 0) return true;
  if (reinterpret_cast<uintptr_t>(a.x) % 16 != 0 || a.x_stride % 4 != 0) return false;
  if (a.type == DType::F16 || a.type == DType::BF16) {
    if (a.K % 8 != 0 || !aligned(a, 16)) return false;
    FastParams p = make_params(a);
    p.n_pieces = static_cast<int>(a.K / 8);
    if (a.type == DType::BF16)
      by_rows<LaunchHalf<true>::L>(a, p, stream);
    else
      by_rows<LaunchHalf<false>::L>(a, p, stream);
    return true;
  }
  if (!gemv_fast_q8(a)) return false;
  PG_CHECK(scratch != nullptr, "gemv_fast: no scratch for the quantized activations");
  if (!x_quantized) quantize_q8(a, scratch, stream);
  wq::dispatch(a.type, [&]<class T>() {
    FastParams p = make_params(a);
    p.n_pieces = static_cast<int>(a.K / 32);
    p.xq = scratch_q(scratch);
    p.xd = scratch_d(a, scratch);
    p.xs = scratch_s(a, scratch);
    if (pipe_ok<T>(a)) {
      const MatmulArgs* one = &a;
      pipe_rows<T>(&one, 1, p.xq, p.xd, stream);
      return;
    }
    if (a.rows_per_warp == 2 && a.lanes == 32 && !a.expert_ids && a.n == 1) {
      LaunchQ8Rw2<T>::template L<1>::run(p, 1, stream, stage_ok(a));
      return;
    }
    switch (a.lanes) {
      case 8: by_rows<LaunchQ8<T, 8>::template L>(a, p, stream); break;
      case 16: by_rows<LaunchQ8<T, 16>::template L>(a, p, stream); break;
      default: by_rows<LaunchQ8<T, 32>::template L>(a, p, stream); break;
    }
  });
  return true;
}

bool gemv_glu_supported(const MatmulArgs& g, const MatmulArgs& u) {
  return g.n == 1 && u.n == 1 && !g.expert_ids && !u.expert_ids && g.lanes == 32 && u.lanes == 32 && g.type == u.type && g.K == u.K &&
         g.M == u.M && g.row_bytes == u.row_bytes && g.x == u.x && gemv_fast_q8(g) && gemv_fast_q8(u);
}

void gemv_glu(const MatmulArgs& g, const MatmulArgs& u, int act, void* scratch, cudaStream_t stream, bool x_quantized) {
  PG_CHECK(gemv_glu_supported(g, u), "gemv_glu: unsupported pair of matmuls");
  PG_CHECK(act == 0 || act == 1, "gemv_glu: unknown activation");
  if (g.M <= 0) return;
  PG_CHECK(scratch != nullptr, "gemv_glu: no scratch for the quantized activations");
  if (!x_quantized) quantize_q8(g, scratch, stream);
  wq::dispatch(g.type, [&]<class T>() {
    FastParams p = make_params(g);
    p.n_pieces = static_cast<int>(g.K / 32);
    p.xq = scratch_q(scratch);
    p.xd = scratch_d(g, scratch);
    p.xs = scratch_s(g, scratch);
    if (pipe_ok<T>(g) && pipe_ok<T>(u)) {
      pipe_glu<T>(g, u, act, p.xq, p.xd, stream);
      return;
    }
    const dim3 grid(static_cast<unsigned>(ceil_div(g.M, kRowsPerBlock)));
    const auto* wu = static_cast<const uint8_t*>(u.w);
    const bool st = stage_ok(g);
    const size_t smem = st ? stage_bytes(g.K) : 0;
    if (act == 0)
      launch_fast(st ? gemv_q8_glu_kernel<T, 0, true> : gemv_q8_glu_kernel<T, 0, false>, grid, g.pdl, stream, "gemv_glu", smem, p, wu);
    else
      launch_fast(st ? gemv_q8_glu_kernel<T, 1, true> : gemv_q8_glu_kernel<T, 1, false>, grid, g.pdl, stream, "gemv_glu", smem, p, wu);
  });
}

bool gemv_multi_compatible(const MatmulArgs& a, const MatmulArgs& b) {
  return a.n == 1 && b.n == 1 && !a.expert_ids && !b.expert_ids && a.lanes == 32 && b.lanes == 32 && a.type == b.type && a.K == b.K &&
         a.x == b.x && gemv_fast_q8(a) && gemv_fast_q8(b);
}

void gemv_multi(const MatmulArgs* const* a, int count, void* scratch, cudaStream_t stream, bool x_quantized) {
  if (count <= 0) return;
  for (int j = 1; j < count; ++j) PG_CHECK(gemv_multi_compatible(*a[0], *a[j]), "gemv_multi: incompatible matmuls");
  PG_CHECK(gemv_fast_q8(*a[0]) && a[0]->n == 1 && !a[0]->expert_ids, "gemv_multi: unsupported matmul");
  PG_CHECK(scratch != nullptr, "gemv_multi: no scratch for the quantized activations");
  if (!x_quantized) quantize_q8(*a[0], scratch, stream);
  wq::dispatch(a[0]->type, [&]<class T>() {
    bool pipe = true;
    for (int j = 0; j < count; ++j) pipe = pipe && pipe_ok<T>(*a[j]);
    if (pipe) {
      pipe_rows<T>(a, count, scratch_q(scratch), scratch_d(*a[0], scratch), stream);
      return;
    }
    for (int j0 = 0; j0 < count; j0 += kMultiMax) {
      MultiParams p{};
      p.xq = scratch_q(scratch);
      p.xd = scratch_d(*a[0], scratch);
      p.xs = scratch_s(*a[0], scratch);
      p.K = a[0]->K;
      p.n_pieces = static_cast<int>(a[0]->K / 32);
      p.count = std::min(kMultiMax, count - j0);
      p.pdl = a[0]->pdl;
      int64_t warps = 0;
      for (int j = 0; j < p.count; ++j) {
        const MatmulArgs& m = *a[j0 + j];
        p.w[j] = static_cast<const uint8_t*>(m.w);
        p.row_bytes[j] = m.row_bytes;
        p.M[j] = m.M;
        p.y[j] = m.y;
        warps += (std::max<int64_t>(m.M, 0) + 1) / 2;
        p.pair_end[j] = warps;
      }
      p.warps = warps;
      if (warps == 0) continue;
      const dim3 grid(static_cast<unsigned>(ceil_div(warps, kRowsPerBlock)));
      const bool st = stage_ok(*a[0]);
      launch_fast(st ? gemv_q8_multi_kernel<T, true> : gemv_q8_multi_kernel<T, false>, grid, p.pdl, stream, "gemv_multi",
                  st ? stage_bytes(p.K) : 0, p);
    }
  });
}

bool mmq_supported(const MatmulArgs& a) {
  if (a.expert_ids || a.n < 1 || a.n > kMmqMaxRows || a.K % 256 != 0 || mmq_type(a.type) < 0) return false;
  return gemv_fast_q8(a);  // same activation layout and weight alignment rules
}

bool mmq_multi_compatible(const MatmulArgs& a, const MatmulArgs& b, int n_sm) {
  if (!mmq_supported(a) || !mmq_supported(b)) return false;
  const MmqPlan pa = mmq_plan(a, n_sm), pb = mmq_plan(b, n_sm);
  return mmq_type(a.type) == mmq_type(b.type) && a.K == b.K && a.n == b.n && a.x == b.x && a.x_stride == b.x_stride &&
         a.row_bytes == b.row_bytes && pa.sb_per_split == pb.sb_per_split && pa.splits == pb.splits;
}

size_t mmq_part_bytes(const MatmulArgs& a, int n_sm) {
  const MmqPlan pl = mmq_plan(a, n_sm);
  return pl.splits > 1 ? static_cast<size_t>(pl.splits) * static_cast<size_t>(a.n) * static_cast<size_t>(a.M) * sizeof(float) : 0;
}

size_t mmq_multi_part_bytes(const MatmulArgs* const* a, int count, int n_sm) {
  size_t b = 0;
  for (int i = 0; i < count; ++i) b += mmq_part_bytes(*a[i], n_sm);
  return b;
}

int mmq_splits(const MatmulArgs& a, int n_sm) { return mmq_plan(a, n_sm).splits; }

void mmq_multi(const MatmulArgs* const* a, int count, void* scratch, void* part, int n_sm, cudaStream_t stream, bool x_quantized, int glu) {
  PG_CHECK(count >= 1 && count <= kMmqMaxSegs, "mmq: 1.." + std::to_string(kMmqMaxSegs) + " products per launch");
  const MatmulArgs& a0 = *a[0];
  if (a0.n <= 0) return;
  for (int i = 0; i < count; ++i) {
    PG_CHECK(mmq_supported(*a[i]) && a[i]->M > 0, "mmq: unsupported matmul");
    PG_CHECK(i == 0 || mmq_multi_compatible(a0, *a[i], n_sm), "mmq: products of one launch need one type, K, activation and split plan");
  }
  PG_CHECK(glu < 0 || (count == 2 && a[0]->M == a[1]->M), "mmq: the GLU epilogue takes gate and up of one shape");
  const MmqPlan pl = mmq_plan(a0, n_sm);
  PG_CHECK(glu < 0 || pl.splits > 1, "mmq: the GLU epilogue needs split-K partials (mmq_splits > 1)");
  if (!x_quantized) quantize_q8(a0, scratch, stream);
  MmqParams p{};
  p.n_seg = count;
  p.row_bytes = a0.row_bytes;
  int64_t off = 0;
  int tiles = 0, blocks_x = 0;
  for (int i = 0; i < count; ++i) {
    p.w[i] = static_cast<const uint8_t*>(a[i]->w);
    p.y[i] = a[i]->y;
    p.y_stride[i] = a[i]->y_stride;
    p.M[i] = a[i]->M;
    p.tile0[i] = tiles;
    p.part_off[i] = off;
    tiles += static_cast<int>(ceil_div(a[i]->M, int64_t{16}));
    off += static_cast<int64_t>(pl.splits) * a0.n * a[i]->M;
  }
  p.tile0[count] = tiles;
  blocks_x = ceil_div(tiles, kMmqWarps);
  p.n_sb = static_cast<int>(a0.K / 256);
  p.sb_per_split = pl.sb_per_split;
  p.xq = scratch_q(scratch);
  p.xd = scratch_d(a0, scratch);
  p.xs = scratch_s(a0, scratch);
  p.xsplit = scratch_split(a0, scratch);
  p.K = a0.K;
  p.n = a0.n;
  PG_CHECK(pl.splits == 1 || part != nullptr, "mmq: no scratch for the split-K partials");
  p.part = static_cast<float*>(part);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(pl.splits));
  const int nt = ceil_div(a0.n, 8);
  switch (mmq_type(a0.type)) {
    case kMqQ4K: mmq_launch_t<kMqQ4K>(p, nt, grid, stream, a0.mmq_staged); break;
    case kMqQ5K: mmq_launch_t<kMqQ5K>(p, nt, grid, stream, a0.mmq_staged); break;
    case kMqQ6K: mmq_launch_t<kMqQ6K>(p, nt, grid, stream, a0.mmq_staged); break;
    case kMqQ8_0: mmq_launch_t<kMqQ8_0>(p, nt, grid, stream, a0.mmq_staged); break;
    default: mmq_launch_t<kMqQ4_0>(p, nt, grid, stream, a0.mmq_staged); break;
  }
  check_launch("mmq");
  if (pl.splits > 1) {
    int64_t total = 0;
    for (int i = 0; i < (glu >= 0 ? 1 : count); ++i) total += static_cast<int64_t>(a0.n) * a[i]->M;
    mmq_reduce_kernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(p, pl.splits, glu);
    check_launch("mmq reduce");
  }
}

void mmq(const MatmulArgs& a, void* scratch, void* part, int n_sm, cudaStream_t stream, bool x_quantized) {
  if (a.n <= 0 || a.M <= 0) return;
  const MatmulArgs* one = &a;
  mmq_multi(&one, 1, scratch, part, n_sm, stream, x_quantized, -1);
}

}  // namespace pg::cuda
