// Lane tasks of the v2 one-row decode GEMV (gemv_q8.cu, gemv_v2_kernel; CudaOptions::gemv_kernel = 2).
// A task is a fixed run of one weight row: load(row, t) issues its global loads (all before any use),
// dot(raw, t, p) returns Σ w·x over it in FP32 from exact integer dot products against the 8-bit
// activations of act_quant_kernel (q8_K for the K-quants: one scale per superblock, repeated per 32;
// q8_0 for Q8_0). kWeights = weights per task, kLpr = lanes per weight row, kU = tasks per lane per
// round. Device code that also compiles on the host with tests/cuda/cuda_host_shim.h plus the few
// intrinsics tests/cuda/test_cuda_gemv_v2.cpp defines (__ldg, __dp4a, __vsub4, __funnelshift_r, int4/int2).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace pg::cuda::v2 {

__device__ __forceinline__ uint4 ldg128(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ int4 ld_q8x16(const int8_t* p) { return *reinterpret_cast<const int4*>(p); }
__device__ __forceinline__ int dp4(uint32_t a, int b, int c) { return __dp4a(static_cast<int>(a), b, c); }
__device__ __forceinline__ int dot16(const uint32_t (&q)[4], const int4& x) {
  return dp4(q[3], x.w, dp4(q[2], x.z, dp4(q[1], x.y, dp4(q[0], x.x, 0))));
}

struct V2Params {
  const uint8_t* w;   // (M, row_bytes) weight rows
  size_t row_bytes;
  int64_t M, K;
  int n_tasks;        // tasks per row
  const int8_t* xq;   // (K) quantized activations
  const float* xd;    // (K/32) their scales
  const int32_t* xs;  // (K/32) Σq per 32 values
  float* y;           // (M) output row
};

struct V2K4 {
  static constexpr int kWeights = 64, kLpr = 32, kU = 2;
  struct Raw {
    uint4 q0, q1, hd;
  };
  __device__ static Raw load(const uint8_t* row, int t) {
    const uint8_t* b = row + static_cast<size_t>(t >> 2) * 144;
    const uint8_t* qs = b + 16 + 32 * (t & 3);
    return {ldg128(qs), ldg128(qs + 16), ldg128(b)};
  }
  __device__ static float dot(const Raw& r, int t, const V2Params& p) {
    const uint32_t q[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) lo[i] = q[i] & 0x0F0F0F0Fu, hi[i] = (q[i] >> 4) & 0x0F0F0F0Fu;
    return finish(lo, hi, r.hd, t, p);
  }
  // The task's sum from its unsigned quants (lo: sub-block 2j, hi: 2j+1, 32 values each as bytes), shared
  // with Q5_K (same header).
  __device__ static float finish(const uint32_t (&lo)[8], const uint32_t (&hi)[8], const uint4& hd, int t, const V2Params& p) {
    const int j = t & 3;
    const int64_t e = static_cast<int64_t>(t) * 64;  // first activation: 256·sb + 64·j
    // 6-bit scales / mins of the 8 sub-blocks as bytes (get_scale_min_k4): word 0 = groups 0..3, 1 = 4..7.
    const uint32_t scw = (j < 2) ? (hd.y & 0x3f3f3f3fu) : ((hd.w & 0x0f0f0f0fu) | ((hd.y >> 2) & 0x30303030u));
    const uint32_t mw = (j < 2) ? (hd.z & 0x3f3f3f3fu) : (((hd.w >> 4) & 0x0f0f0f0fu) | ((hd.z >> 2) & 0x30303030u));
    const int sh = 16 * (j & 1);
    const int sc0 = static_cast<int>((scw >> sh) & 0xff), sc1 = static_cast<int>((scw >> (sh + 8)) & 0xff);
    const int m0 = static_cast<int>((mw >> sh) & 0xff), m1 = static_cast<int>((mw >> (sh + 8)) & 0xff);
    const int8_t* xq = p.xq + e;
    const int4 x0 = ld_q8x16(xq), x1 = ld_q8x16(xq + 16), x2 = ld_q8x16(xq + 32), x3 = ld_q8x16(xq + 48);
    const uint32_t la[4] = {lo[0], lo[1], lo[2], lo[3]}, lb[4] = {lo[4], lo[5], lo[6], lo[7]};
    const uint32_t ha[4] = {hi[0], hi[1], hi[2], hi[3]}, hb[4] = {hi[4], hi[5], hi[6], hi[7]};
    const int dlo = dot16(la, x0) + dot16(lb, x1);  // sub-block 2j · x[e, e+32)
    const int dhi = dot16(ha, x2) + dot16(hb, x3);  // sub-block 2j+1 · x[e+32, e+64)
    const int2 s = *reinterpret_cast<const int2*>(p.xs + (e >> 5));
    const int isum = sc0 * dlo + sc1 * dhi, msum = m0 * s.x + m1 * s.y;
    return p.xd[e >> 5] * (h2f(hd.x) * static_cast<float>(isum) - h2f(hd.x >> 16) * static_cast<float>(msum));
  }
};

// Q5_K task: as Q4_K (qs at byte 48 of the 176-byte block) plus the 5th bits: qh byte l holds bit u for
// value l of sub-block u, so a task reads all 32 qh bytes (two more 16-byte loads, shared in L1 by the
// superblock's 4 lanes) and takes bits 2j (low nibbles) and 2j+1 (high).
struct V2K5 {
  static constexpr int kWeights = 64, kLpr = 32, kU = 2;
  struct Raw {
    uint4 q0, q1, hd, h0, h1;
  };
  __device__ static Raw load(const uint8_t* row, int t) {
    const uint8_t* b = row + static_cast<size_t>(t >> 2) * 176;
    const uint8_t* qs = b + 48 + 32 * (t & 3);
    return {ldg128(qs), ldg128(qs + 16), ldg128(b), ldg128(b + 16), ldg128(b + 32)};
  }
  __device__ static float dot(const Raw& r, int t, const V2Params& p) {
    const int j = t & 3;
    const uint32_t q[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
    const uint32_t h[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      lo[i] = (q[i] & 0x0F0F0F0Fu) | (((h[i] >> (2 * j)) & 0x01010101u) << 4);
      hi[i] = ((q[i] >> 4) & 0x0F0F0F0Fu) | (((h[i] >> (2 * j + 1)) & 0x01010101u) << 4);
    }
    return V2K4::finish(lo, hi, r.hd, t, p);
  }
};

struct V2B8 {
  static constexpr int kWeights = 256, kLpr = 16, kU = 1;
  struct Raw {
    uint4 v[17];  // 272 bytes: 8 blocks of [d f16][32 × int8]
  };
  __device__ static Raw load(const uint8_t* row, int t) {
    const uint8_t* b = row + static_cast<size_t>(t) * 272;
    Raw r;
#pragma unroll
    for (int i = 0; i < 17; ++i) r.v[i] = ldg128(b + 16 * i);
    return r;
  }
  __device__ static float dot(const Raw& r, int t, const V2Params& p) {
    uint32_t w[68];
#pragma unroll
    for (int i = 0; i < 17; ++i) w[4 * i] = r.v[i].x, w[4 * i + 1] = r.v[i].y, w[4 * i + 2] = r.v[i].z, w[4 * i + 3] = r.v[i].w;
    const int64_t e = static_cast<int64_t>(t) * 256;
    float acc = 0.0f;
#pragma unroll
    for (int b = 0; b < 8; ++b) {
      // Block b: d at byte 34b, quants at 34b + 2 (4-aligned for odd b, 2 mod 4 for even b).
      const int qb = 34 * b + 2, wi = qb >> 2;
      uint32_t q[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = (qb & 3) ? __funnelshift_r(w[wi + i], w[wi + i + 1], 16) : w[wi + i];
      const uint32_t dw = ((34 * b) & 3) ? (w[(34 * b) >> 2] >> 16) : (w[(34 * b) >> 2] & 0xffffu);
      const int8_t* xq = p.xq + e + 32 * b;
      const uint32_t q0[4] = {q[0], q[1], q[2], q[3]}, q1[4] = {q[4], q[5], q[6], q[7]};
      const int s = dot16(q0, ld_q8x16(xq)) + dot16(q1, ld_q8x16(xq + 16));
      acc += h2f(dw) * p.xd[(e >> 5) + b] * static_cast<float>(s);
    }
    return acc;
  }
};

// Q6_K task = one 128-weight half hf of a superblock (t = 2·sb + hf): ql bytes [64hf, +64) (low nibbles =
// weights 0..63 of the half, high = 64..127), qh bytes [128 + 32hf, +32) (byte k%32, 2 bits per weight),
// 8 int8 scales per 16 weights, d. Rows are 210·K/256 bytes: with K % 512 == 0 and a 4-byte aligned matrix
// every superblock starts 0 or 2 bytes past a 4-byte boundary, so the task is read as 30 aligned 4-byte
// words (kernel 1: 76 loads, most of 2 bytes) and realigned with funnel shifts; the extra word of each
// field is only read for an odd start (it would pass the matrix end on the last superblock otherwise).
struct V2K6 {
  static constexpr int kWeights = 128, kLpr = 32, kU = 1;
  struct Raw {
    uint32_t ql[17], qh[9], sc[3], d, m;
  };
  __device__ static Raw load(const uint8_t* row, int t) {
    const uint8_t* b = row + static_cast<size_t>(t >> 1) * 210;
    const int hf = t & 1;
    Raw r;
    r.m = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(b) & 3);  // 0 or 2
    const uint32_t* a = reinterpret_cast<const uint32_t*>(b - r.m);
#pragma unroll
    for (int i = 0; i < 16; ++i) r.ql[i] = __ldg(a + 16 * hf + i);
#pragma unroll
    for (int i = 0; i < 8; ++i) r.qh[i] = __ldg(a + 32 + 8 * hf + i);
    r.sc[0] = __ldg(a + 48 + 2 * hf), r.sc[1] = __ldg(a + 49 + 2 * hf);
    r.ql[16] = r.qh[8] = r.sc[2] = 0u;
    if (r.m) r.ql[16] = __ldg(a + 16 * hf + 16), r.qh[8] = __ldg(a + 40 + 8 * hf), r.sc[2] = __ldg(a + 50 + 2 * hf);
    r.d = __ldg(reinterpret_cast<const uint16_t*>(b + 208));
    return r;
  }
  __device__ static float dot(const Raw& r, int t, const V2Params& p) {
    const int sh = static_cast<int>(8 * r.m);
    uint32_t ql[16], qh[8];
#pragma unroll
    for (int i = 0; i < 16; ++i) ql[i] = __funnelshift_r(r.ql[i], r.ql[i + 1], sh);
#pragma unroll
    for (int i = 0; i < 8; ++i) qh[i] = __funnelshift_r(r.qh[i], r.qh[i + 1], sh);
    const uint32_t sw[2] = {__funnelshift_r(r.sc[0], r.sc[1], sh), __funnelshift_r(r.sc[1], r.sc[2], sh)};
    const int64_t e = static_cast<int64_t>(t) * 128;  // first activation of the half
    const int8_t* xq = p.xq + e;
    int isum = 0;
#pragma unroll
    for (int g = 0; g < 8; ++g) {
      // Group g of 16 weights: ql words 4(g%4).., low nibbles for g < 4, high for g ≥ 4; qh bits
      // 2·(g%4 / 2) (+4 for the high nibbles) of qh word (4(g%4) + i) % 8.
      uint32_t v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int wi = 4 * (g & 3) + i;
        const int qs = 2 * (wi >> 3) + (g >= 4 ? 4 : 0);
        const uint32_t lo = g >= 4 ? (ql[wi] >> 4) & 0x0F0F0F0Fu : ql[wi] & 0x0F0F0F0Fu;
        v[i] = __vsub4(lo | (((qh[wi & 7] >> qs) & 0x03030303u) << 4), 0x20202020u);
      }
      const int4 x = ld_q8x16(xq + 16 * g);
      const int s = dp4(v[3], x.w, dp4(v[2], x.z, dp4(v[1], x.y, dp4(v[0], x.x, 0))));
      isum += static_cast<int>(static_cast<int8_t>((sw[g >> 2] >> (8 * (g & 3))) & 0xff)) * s;
    }
    return p.xd[e >> 5] * h2f(r.d) * static_cast<float>(isum);
  }
};

}  // namespace pg::cuda::v2
