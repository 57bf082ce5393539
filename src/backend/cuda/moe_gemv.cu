// MoE decode with fewer launches (CudaOptions::moe_fused): for decode-sized batches the default moe_ffn
// runs act_quant + grouped gate GEMV, act_quant + grouped up GEMV, glu, act_quant + grouped down GEMV into
// T (E, d), moe_combine. Here: act_quant(x), moe_gate_up_kernel (gate and up dots + GLU in one warp),
// act_quant(G), moe_down_combine_kernel (down dots + weighted combine, no T buffer).
//
// Bit-identity with the default path: every dot is summed in the order of gemv_q8.cu's one-row-per-warp
// kernel (gemv_q8_kernel<T, 1, 32>): lane l accumulates pieces l, l+32, ... starting from 0.0f, loads
// kUnroll pieces ahead, then warp_sum. GLU is glu_act (glu_act.cuh), the combine is moe_combine_kernel's
// loop (ascending expert id, FP32 `s += w·t`). The weight decoders below are copies of gemv_q8.cu's K4,
// K5, K6, B8 (they live in that file's anonymous namespace); tests/cuda/test_cuda_moe_fused.cpp memcmps
// the results against the default path so a divergence of the copies shows up.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/glu_act.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_gemv.h"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int kRowsPerBlock = 4;  // one warp per output row, as gemv_q8.cu
constexpr int kUnroll = 4;        // pieces per lane with loads in flight, as gemv_q8.cu
constexpr int kMaxK = 32;
constexpr int kDownBatch = 4;  // moe_down_combine_kernel: entries whose weight loads are in flight together

// ---- copied from gemv_q8.cu (keep in sync) ----
__device__ __forceinline__ int4 ld_q8x16(const int8_t* p) { return *reinterpret_cast<const int4*>(p); }
__device__ __forceinline__ uint32_t ldg32a2(const uint8_t* p) {
  return static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(p))) |
         (static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(p + 2))) << 16);
}
__device__ __forceinline__ uint4 ldg128(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ int dp4(uint32_t a, int b, int c) { return __dp4a(static_cast<int>(a), b, c); }
__device__ __forceinline__ int sum4(const int4& v) {
  return __dp4a(0x01010101, v.x, __dp4a(0x01010101, v.y, __dp4a(0x01010101, v.z, __dp4a(0x01010101, v.w, 0))));
}
__device__ __forceinline__ int dot16(const uint32_t (&q)[4], const int4& x) {
  return dp4(q[3], x.w, dp4(q[2], x.z, dp4(q[1], x.y, dp4(q[0], x.x, 0))));
}

// Activation pointers of the NA rows a warp serves.
template <int NA>
struct ActRows {
  const int8_t* q[NA];  // (K)
  const float* d[NA];   // (K/32)
};

// Every weight type below: kBytes per block of kPieces pieces (32 weights each), kAlign = the alignment
// its loads need of the row start, row_bytes and expert_bytes. load() issues the piece's global loads;
// dot() adds Σ w·x over the piece for each activation row.

// Q4_K: 144 B = [d, dmin (f16), scales (12 B, 6-bit sc/m per 32)] [qs 128 B]. Piece p (0..7) is qs bytes
// [16p, 16p+16): low nibbles = sub-block 2j positions 16h.., high nibbles = sub-block 2j+1 (j=p/2, h=p%2).
struct K4 {
  static constexpr int kBytes = 144, kPieces = 8, kAlign = 16;
  struct Raw {
    uint4 q, hd;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    const uint8_t* b = row + static_cast<size_t>(pi >> 3) * kBytes;
    return {ldg128(b + 16 + 16 * (pi & 7)), ldg128(b)};
  }
  // 6-bit scale and min of sub-block is (0..7) from the 12 scale bytes.
  __device__ static void scale_min(const uint4& hd, int is, int& sc, int& m) {
    const uint32_t s0 = hd.y, s1 = hd.z, s2 = hd.w;
    if (is < 4) {
      sc = static_cast<int>(byte12(s0, s1, s2, is) & 63);
      m = static_cast<int>(byte12(s0, s1, s2, is + 4) & 63);
    } else {
      sc = static_cast<int>((byte12(s0, s1, s2, is + 4) & 0xF) | ((byte12(s0, s1, s2, is - 4) >> 6) << 4));
      m = static_cast<int>((byte12(s0, s1, s2, is + 4) >> 4) | ((byte12(s0, s1, s2, is) >> 6) << 4));
    }
  }
  template <int NA>
  __device__ static void dot(const Raw& r, int pi, const ActRows<NA>& x, float (&acc)[NA]) {
    const int p = pi & 7, j = p >> 1;
    const int64_t e = static_cast<int64_t>(pi >> 3) * 256 + 64 * j + 16 * (p & 1);  // first activation
    uint32_t lo[4], hi[4];
    const uint32_t q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) lo[i] = q[i] & 0x0F0F0F0Fu, hi[i] = (q[i] >> 4) & 0x0F0F0F0Fu;
    pair_dot<NA>(lo, hi, r.hd, j, e, x, acc);
  }
  // The piece's two 16-value runs: lo of sub-block 2j, hi of sub-block 2j+1 (quants 0..31, unsigned),
  // each scaled as d·sc·Σq·x − dmin·m·Σx. Shared by Q4_K and Q5_K (same header layout).
  template <int NA>
  __device__ static void pair_dot(const uint32_t (&lo)[4], const uint32_t (&hi)[4], const uint4& hd, int j, int64_t e,
                                  const ActRows<NA>& x, float (&acc)[NA]) {
    int sc0, m0, sc1, m1;
    scale_min(hd, 2 * j, sc0, m0);
    scale_min(hd, 2 * j + 1, sc1, m1);
    const float d = h2f(hd.x), dmin = h2f(hd.x >> 16);
    const float a0 = d * static_cast<float>(sc0), b0 = dmin * static_cast<float>(m0);
    const float a1 = d * static_cast<float>(sc1), b1 = dmin * static_cast<float>(m1);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int4 xa = ld_q8x16(x.q[a] + e), xb = ld_q8x16(x.q[a] + e + 32);
      const float da = x.d[a][e >> 5], db = x.d[a][(e >> 5) + 1];
      acc[a] += da * (a0 * static_cast<float>(dot16(lo, xa)) - b0 * static_cast<float>(sum4(xa))) +
                db * (a1 * static_cast<float>(dot16(hi, xb)) - b1 * static_cast<float>(sum4(xb)));
    }
  }
};

// Q5_K: 176 B = [d, dmin, scales (12 B)] [qh 32 B] [qs 128 B]; as Q4_K plus the 5th bit of position l of
// sub-block s in bit s of qh[l].
struct K5 {
  static constexpr int kBytes = 176, kPieces = 8, kAlign = 16;
  struct Raw {
    uint4 q, hd, qh;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    const uint8_t* b = row + static_cast<size_t>(pi >> 3) * kBytes;
    const int p = pi & 7;
    return {ldg128(b + 48 + 16 * p), ldg128(b), ldg128(b + 16 + 16 * (p & 1))};
  }
  template <int NA>
  __device__ static void dot(const Raw& r, int pi, const ActRows<NA>& x, float (&acc)[NA]) {
    const int p = pi & 7, j = p >> 1;
    const int64_t e = static_cast<int64_t>(pi >> 3) * 256 + 64 * j + 16 * (p & 1);
    uint32_t lo[4], hi[4];
    const uint32_t q[4] = {r.q.x, r.q.y, r.q.z, r.q.w}, h[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = (q[i] & 0x0F0F0F0Fu) | (((h[i] >> (2 * j)) & 0x01010101u) << 4);
      hi[i] = ((q[i] >> 4) & 0x0F0F0F0Fu) | (((h[i] >> (2 * j + 1)) & 0x01010101u) << 4);
    }
    K4::pair_dot<NA>(lo, hi, r.hd, j, e, x, acc);
  }
};

// Q6_K: 210 B = [ql 128 B] [qh 64 B] [scales 16 × int8] [d f16]; 2-byte aligned only. Piece p: half
// hf = p/4, pair = p/2 % 2, lq = p % 2 reads ql[16p, 16p+16) and qh[32hf + 16lq, +16): the low nibbles
// (+ qh bits 2·pair) are weights 128hf + 32pair + 16lq + i, the high nibbles (+ qh bits 4 + 2·pair) the
// same positions + 64; values are q − 32.
struct K6 {
  static constexpr int kBytes = 210, kPieces = 8, kAlign = 2;
  struct Raw {
    uint32_t ql[4], qh[4], sc, d;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    const uint8_t* b = row + static_cast<size_t>(pi >> 3) * kBytes;
    const int p = pi & 7, hf = p >> 2, pair = (p >> 1) & 1, lq = p & 1;
    Raw r;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      r.ql[i] = ldg32a2(b + 16 * p + 4 * i);
      r.qh[i] = ldg32a2(b + 128 + 32 * hf + 16 * lq + 4 * i);
    }
    const int s = 8 * hf + lq + 2 * pair;
    r.sc = static_cast<uint32_t>(__ldg(b + 192 + s)) | (static_cast<uint32_t>(__ldg(b + 196 + s)) << 8);
    r.d = __ldg(reinterpret_cast<const uint16_t*>(b + 208));
    return r;
  }
  template <int NA>
  __device__ static void dot(const Raw& r, int pi, const ActRows<NA>& x, float (&acc)[NA]) {
    const int p = pi & 7, hf = p >> 2, pair = (p >> 1) & 1, lq = p & 1;
    const int64_t e = static_cast<int64_t>(pi >> 3) * 256 + 128 * hf + 32 * pair + 16 * lq;
    uint32_t qa[4], qb[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      qa[i] = (r.ql[i] & 0x0F0F0F0Fu) | (((r.qh[i] >> (2 * pair)) & 0x03030303u) << 4);
      qb[i] = ((r.ql[i] >> 4) & 0x0F0F0F0Fu) | (((r.qh[i] >> (4 + 2 * pair)) & 0x03030303u) << 4);
    }
    const float d = h2f(r.d);
    const float sa = d * static_cast<float>(static_cast<int8_t>(r.sc & 0xff));
    const float sb = d * static_cast<float>(static_cast<int8_t>((r.sc >> 8) & 0xff));
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int4 xa = ld_q8x16(x.q[a] + e), xb = ld_q8x16(x.q[a] + e + 64);
      const float da = x.d[a][e >> 5], db = x.d[a][(e >> 5) + 2];
      acc[a] += da * sa * static_cast<float>(dot16(qa, xa) - 32 * sum4(xa)) + db * sb * static_cast<float>(dot16(qb, xb) - 32 * sum4(xb));
    }
  }
};

// Q8_0: 34 B = [d f16] [32 × int8]; one piece per block, 2-byte aligned.
struct B8 {
  static constexpr int kBytes = 34, kPieces = 1, kAlign = 2;
  struct Raw {
    uint32_t q[8], d;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    const uint8_t* b = row + static_cast<size_t>(pi) * kBytes;
    Raw r;
#pragma unroll
    for (int i = 0; i < 8; ++i) r.q[i] = ldg32a2(b + 2 + 4 * i);
    r.d = __ldg(reinterpret_cast<const uint16_t*>(b));
    return r;
  }
  template <int NA>
  __device__ static void dot(const Raw& r, int pi, const ActRows<NA>& x, float (&acc)[NA]) {
    const int64_t e = static_cast<int64_t>(pi) * 32;
    const float d = h2f(r.d);
    const uint32_t q0[4] = {r.q[0], r.q[1], r.q[2], r.q[3]}, q1[4] = {r.q[4], r.q[5], r.q[6], r.q[7]};
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int4 xa = ld_q8x16(x.q[a] + e), xb = ld_q8x16(x.q[a] + e + 16);
      acc[a] += d * x.d[a][pi] * static_cast<float>(dot16(q0, xa) + dot16(q1, xb));
    }
  }
};

// ---- end of the copy ----

// One row's dot against one activation row, in gemv_q8_kernel<T, 1, 32>'s order; returns the warp sum in
// every lane. w: the row (n_pieces pieces); x: its 8-bit activations.
template <class T>
__device__ __forceinline__ float row_dot(const uint8_t* w, const ActRows<1>& x, int np, int lane) {
  float acc[1] = {0.0f};
  typename T::Raw r[kUnroll];
  int base = lane;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (base + 32 * u < np) r[u] = T::load(w, base + 32 * u);
  while (base < np) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + 32 * u < np) T::template dot<1>(r[u], base + 32 * u, x, acc);
    base += 32 * kUnroll;
    if (base >= np) break;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
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
  const int np = p.n_pieces;
  float ag[1] = {0.0f}, au[1] = {0.0f};
  typename T::Raw rg[kUnroll], ru[kUnroll];
  int base = lane;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    if (base + 32 * u < np) rg[u] = T::load(wg, base + 32 * u), ru[u] = T::load(wu, base + 32 * u);
  while (base < np) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + 32 * u < np) {
        T::template dot<1>(rg[u], base + 32 * u, x, ag);
        T::template dot<1>(ru[u], base + 32 * u, x, au);
      }
    base += 32 * kUnroll;
    if (base >= np) break;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
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
  if (p.n_pieces <= 32) {
    // Rows of at most 32 pieces (qwen3-30b-a3b: ff 768 = 24 pieces): one piece per lane per entry, so the
    // single loop of row_dot would serialize k load latencies. Issue the loads of kDownBatch entries first,
    // then form each dot exactly as row_dot does (acc from 0.0f, one dot call, warp_sum).
    const bool live = lane < p.n_pieces;
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
    const float dv = row_dot<T>(w, x, p.n_pieces, lane);
    s += wts[jj] * dv;
  }
  if (lane == 0) p.out[static_cast<int64_t>(t) * p.d + row] = s;
}

template <class F>
bool dispatch4(DType t, F&& f) {
  switch (t) {
    case DType::Q4_K: f.template operator()<K4>(); return true;
    case DType::Q5_K: f.template operator()<K5>(); return true;
    case DType::Q6_K: f.template operator()<K6>(); return true;
    case DType::Q8_0: f.template operator()<B8>(); return true;
    default: return false;
  }
}

}  // namespace

bool moe_fused_type(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0; }

void moe_gate_up(DType type, const MoeGateUpParams& p, int act, bool pdl, cudaStream_t stream) {
  PG_CHECK(act == 0 || act == 1, "moe_gate_up: unknown activation");
  PG_CHECK(p.E <= 65535, "moe_gate_up: too many entries");
  if (p.E <= 0 || p.ff <= 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(p.ff, int64_t{kRowsPerBlock})), static_cast<unsigned>(p.E));
  const bool ok = dispatch4(type, [&]<class T>() {
    PG_CHECK(p.K % (32 * T::kPieces) == 0 && reinterpret_cast<uintptr_t>(p.gate) % T::kAlign == 0 && p.row_bytes % T::kAlign == 0,
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
  const bool ok = dispatch4(type, [&]<class T>() {
    PG_CHECK(p.ff % (32 * T::kPieces) == 0 && reinterpret_cast<uintptr_t>(p.down) % T::kAlign == 0 && p.row_bytes % T::kAlign == 0,
             "moe_down_combine: layout unsupported");
    launch_pdl(pdl, moe_down_combine_kernel<T>, grid, dim3(kRowsPerBlock * 32), 0, stream, p); });
  PG_CHECK(ok, "moe_down_combine: unsupported type");
  check_launch("moe_down_combine");
}

}  // namespace pg::cuda
