// Weight decoders of the 8-bit-activation dot kernels (gemv_q8.cu, its pipelined variant gemv_pipe.cuh, and
// moe_gemv.cu's fused MoE decode): one struct per weight type with load() (a piece's global loads, 32
// weights) and dot() (Σ w·x of the piece against NA rows of q8 activations, dp4a). One copy, so the MoE
// kernels' bit-identity with the default grouped GEMV (summation order, rounding) holds by construction.
//
// Every weight type: kBytes per block of kPieces pieces of kWeights weights each (32, or 64 for Q4_K), kAlign =
// the alignment its loads need of the row start, row_bytes and expert_bytes. Activations: q8_0 per 32 values
// for the 32-value block types, q8_K per 256 for the K-quants (act_quant.cuh), as in the CPU backend's default
// mode. The kernels' n_pieces parameters count 32-weight units (K/32); pieces<T>() converts.
#pragma once

#include <cstdint>

#include "backend/cuda/common.cuh"

namespace pg::cuda::wq {

__device__ __forceinline__ int4 ld_q8x16(const int8_t* p) { return *reinterpret_cast<const int4*>(p); }
__device__ __forceinline__ uint32_t ldg32a2(const uint8_t* p) {
  return static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(p))) |
         (static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(p + 2))) << 16);
}
__device__ __forceinline__ uint4 ldg128(const uint8_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
// W consecutive 32-bit words from a 2-byte-aligned address p: the little-endian words ldg32a2 assembles from
// two 16-bit loads each, here from the W + 1 aligned words that hold them and a funnel shift by p % 4 bytes;
// GLOBAL: p is global memory (read-only path), else shared (gemv_pipe.cuh's copies of the rows).
// Why: the 2-byte-aligned block types (Q6_K 210 B, Q8_0 34 B, Q4_0 18 B) took two load instructions per word
// (19 per Q6_K piece: 13 now). The aligned words may reach 2 bytes before p and 2 past p + 4W: inside the
// block row, or within the 16 bytes of slack every device buffer has (CudaBackend::alloc).
template <int W, bool GLOBAL = true>
__device__ __forceinline__ void ld_words_a2(const uint8_t* p, uint32_t (&out)[W]) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
  const uint32_t sh = static_cast<uint32_t>(a & 2) * 8;  // 0 or 16
  uint32_t w[W + 1];
#pragma unroll
  for (int i = 0; i <= W; ++i) w[i] = GLOBAL ? __ldg(base + i) : base[i];
#pragma unroll
  for (int i = 0; i < W; ++i) out[i] = __funnelshift_r(w[i], w[i + 1], sh);
}
__device__ __forceinline__ int dp4(uint32_t a, int b, int c) { return __dp4a(static_cast<int>(a), b, c); }
__device__ __forceinline__ int sum4(const int4& v) {
  return __dp4a(0x01010101, v.x, __dp4a(0x01010101, v.y, __dp4a(0x01010101, v.z, __dp4a(0x01010101, v.w, 0))));
}
__device__ __forceinline__ int dot16(const uint32_t (&q)[4], const int4& x) {
  return dp4(q[3], x.w, dp4(q[2], x.z, dp4(q[1], x.y, dp4(q[0], x.x, 0))));
}
// Σ of the 4 products of a's bytes read as unsigned (0..255) with b's as signed, plus c (PTX dp4a.u32.s32).
// Why: Q4_K's high nibbles enter masked in place (q & 0xF0F0F0F0 = 16·nibble) with no shift per word.
__device__ __forceinline__ int dp4us(uint32_t a, int b, int c) {
#ifdef PG_CUDA_HOST_SHIM
  for (int i = 0; i < 4; ++i) c += static_cast<int>((a >> (8 * i)) & 0xffu) * static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
  return c;
#else
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
#endif
}

// Activation pointers of the NA rows a warp serves (the quantize_q8 scratch layout, act_quant.cuh). The
// decoders read activations only through q16 / dv / s2, so a staged copy (ActSmem) can stand in for them.
template <int NA>
struct ActRows {
  const int8_t* q[NA];   // (K)
  const float* d[NA];    // (K/32)
  const int32_t* s[NA];  // (K/32) Σq per 32 values (read by K4 only)
  __device__ int4 q16(int a, int64_t off) const { return ld_q8x16(q[a] + off); }  // off % 16 == 0
  __device__ float dv(int a, int64_t i) const { return d[a][i]; }
  __device__ int2 s2(int a, int64_t i) const { return *reinterpret_cast<const int2*>(s[a] + i); }  // i even
};

// One activation row staged in shared memory by a block (gemv_q8.cu's one-row kernels): q (K) int8 whose
// 16-byte chunk c is stored at chunk act_swz(c), d and s (K/32) as in the scratch. Why the swizzle: a lane
// reads 16-byte chunks at a stride of 2 (32-weight pieces), 4 (Q4_K) or 2..16 (Q6_K) chunks, which puts 4-8
// lanes of a quarter warp on the same banks; XOR-ing the chunk's bank group (c mod 8) with c / 8 spreads
// them (conflict-free for strides 2 and 4). Same bytes as ActRows: every dot gives the same bits.
__device__ __forceinline__ int64_t act_swz(int64_t c) { return c ^ ((c >> 3) & 7); }
struct ActSmem {
  const int8_t* q;   // (K) swizzled
  const float* d;    // (K/32)
  const int32_t* s;  // (K/32)
  __device__ int4 q16(int, int64_t off) const { return *reinterpret_cast<const int4*>(q + 16 * act_swz(off >> 4)); }
  __device__ float dv(int, int64_t i) const { return d[i]; }
  __device__ int2 s2(int, int64_t i) const { return *reinterpret_cast<const int2*>(s + i); }
};

// A row of k32 = K/32 weight units holds pieces<T>(k32) pieces of decoder T.
template <class T>
__host__ __device__ constexpr int pieces(int k32) {
  return k32 / (T::kWeights / 32);
}
// The one-row kernels (gemv_q8.cu, moe_gemv.cu) keep kUnroll 32-weight units of weight loads in flight per
// lane: kUnrollOf<T> pieces of T (Q4_K's / Q6_K's 64-weight pieces count two units).
constexpr int kUnroll = 4;
template <class T>
constexpr int kUnrollOf = kUnroll * 32 / T::kWeights;
// Values per block of T: K must be a multiple of it.
template <class T>
constexpr int kBlockValues = T::kWeights * T::kPieces;

// Q4_K: 144 B = [d, dmin (f16)] [scales: 12 B, 6-bit scale and min per 32-value sub-block] [qs 128 B]. Piece p
// (0..3) is qs bytes [32p, 32p+32): low nibbles = sub-block 2p (weights 64p..64p+31), high nibbles = sub-block
// 2p+1 (64p+32..64p+63), the layout of dequantize_row_q4_K. Its dot: the two integer sums Σq·x, scaled and
// offset in integers (sc0·Σ0 + sc1·Σ1, m0·Σx0 + m1·Σx1 with Σx from the activations' per-32 sums), then one
// float expression; the q8_K scale is one per 256, so d[e/32] serves both sub-blocks.
// Why 64-weight pieces: a 32-weight piece decoded each scale pair, converted four integers and ran the 8
// dp4a of Σx itself for half as many weights (~3.9 PTX instructions per weight in the fused GLU kernel: the
// one-row GEMV was issue-bound, at ~60 % of the copy bandwidth on a 340 MB matrix).
struct K4 {
  static constexpr int kBytes = 144, kPieces = 4, kWeights = 64, kAlign = 16;
  struct Raw {
    uint4 q0, q1, hd;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    const uint8_t* b = row + static_cast<size_t>(pi >> 2) * kBytes;
    const int p = pi & 3;
    return {ldg128(b + 16 + 32 * p), ldg128(b + 32 + 32 * p), ldg128(b)};
  }
  // Bytes [sc0, sc1, m0, m1]: the 6-bit scales and mins of sub-blocks 2p and 2p+1 (get_scale_min_k4), from the
  // 12 scale bytes s0..s2 = hd.y..hd.w. Sub-blocks 0..3: sc = s0 byte & 63, m = s1 byte & 63; 4..7: low 4
  // bits from s2's byte (sc: low nibble, m: high nibble), bits 4..5 from bits 6..7 of s0's (sc) / s1's (m).
  __device__ static uint32_t scales(const uint4& hd, int p) {
    const uint32_t b = 2u * static_cast<uint32_t>(p & 1);
    const uint32_t h = __byte_perm(hd.y, hd.z, b | (b + 1) << 4 | (b + 4) << 8 | (b + 5) << 12);  // [s0.b s0.b+1 s1.b s1.b+1]
    const uint32_t l = __byte_perm(hd.w, 0u, b | (b + 1) << 4 | b << 8 | (b + 1) << 12);        // [s2.b s2.b+1 s2.b s2.b+1]
    return p < 2 ? (h & 0x3f3f3f3fu) : ((l & 0x0f0fu) | ((l >> 4) & 0x0f0f0000u) | ((h >> 2) & 0x30303030u));
  }
  template <int NA, class X>
  __device__ static void dot(const Raw& r, int pi, const X& x, float (&acc)[NA]) {
    const int p = pi & 3;
    const int64_t e = static_cast<int64_t>(pi >> 2) * 256 + 64 * p;  // first activation
    const uint32_t q[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) lo[i] = q[i] & 0x0F0F0F0Fu, hi[i] = q[i] & 0xF0F0F0F0u;
    const uint32_t w = scales(r.hd, p);
    const int sc0 = static_cast<int>(w & 0xff), sc1 = static_cast<int>((w >> 8) & 0xff);
    const int m0 = static_cast<int>((w >> 16) & 0xff), m1 = static_cast<int>(w >> 24);
    const float d = h2f(r.hd.x), dmin = h2f(r.hd.x >> 16);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int4 x0 = x.q16(a, e), x1 = x.q16(a, e + 16), x2 = x.q16(a, e + 32), x3 = x.q16(a, e + 48);
      int s0 = dp4(lo[3], x0.w, dp4(lo[2], x0.z, dp4(lo[1], x0.y, dp4(lo[0], x0.x, 0))));
      s0 = dp4(lo[7], x1.w, dp4(lo[6], x1.z, dp4(lo[5], x1.y, dp4(lo[4], x1.x, s0))));
      int s1 = dp4us(hi[3], x2.w, dp4us(hi[2], x2.z, dp4us(hi[1], x2.y, dp4us(hi[0], x2.x, 0))));
      s1 = dp4us(hi[7], x3.w, dp4us(hi[6], x3.z, dp4us(hi[5], x3.y, dp4us(hi[4], x3.x, s1))));
      const int2 xs = x.s2(a, e >> 5);  // Σx of the two sub-blocks
      const int t1 = sc0 * s0 + sc1 * (s1 >> 4), t2 = m0 * xs.x + m1 * xs.y;  // |t1| < 2^23: exact in FP32
      acc[a] += x.dv(a, e >> 5) * (d * static_cast<float>(t1) - dmin * static_cast<float>(t2));
    }
  }
};

// Q5_K: 176 B = [d, dmin, scales (12 B)] [qh 32 B] [qs 128 B]; as Q4_K plus the 5th bit of position l of
// sub-block s in bit s of qh[l].
struct K5 {
  static constexpr int kBytes = 176, kPieces = 8, kWeights = 32, kAlign = 16;
  struct Raw {
    uint4 q, hd, qh;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    const uint8_t* b = row + static_cast<size_t>(pi >> 3) * kBytes;
    const int p = pi & 7;
    return {ldg128(b + 48 + 16 * p), ldg128(b), ldg128(b + 16 + 16 * (p & 1))};
  }
  template <int NA, class X>
  __device__ static void dot(const Raw& r, int pi, const X& x, float (&acc)[NA]) {
    const int p = pi & 7, j = p >> 1;
    const int64_t e = static_cast<int64_t>(pi >> 3) * 256 + 64 * j + 16 * (p & 1);
    uint32_t lo[4], hi[4];
    const uint32_t q[4] = {r.q.x, r.q.y, r.q.z, r.q.w}, h[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = (q[i] & 0x0F0F0F0Fu) | (((h[i] >> (2 * j)) & 0x01010101u) << 4);
      hi[i] = ((q[i] >> 4) & 0x0F0F0F0Fu) | (((h[i] >> (2 * j + 1)) & 0x01010101u) << 4);
    }
    pair_dot<NA>(lo, hi, r.hd, j, e, x, acc);
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
  // The piece's two 16-value runs: lo of sub-block 2j, hi of sub-block 2j+1 (quants 0..31, unsigned),
  // each scaled as d·sc·Σq·x − dmin·m·Σx.
  template <int NA, class X>
  __device__ static void pair_dot(const uint32_t (&lo)[4], const uint32_t (&hi)[4], const uint4& hd, int j, int64_t e, const X& x,
                                  float (&acc)[NA]) {
    int sc0, m0, sc1, m1;
    scale_min(hd, 2 * j, sc0, m0);
    scale_min(hd, 2 * j + 1, sc1, m1);
    const float d = h2f(hd.x), dmin = h2f(hd.x >> 16);
    const float a0 = d * static_cast<float>(sc0), b0 = dmin * static_cast<float>(m0);
    const float a1 = d * static_cast<float>(sc1), b1 = dmin * static_cast<float>(m1);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int4 xa = x.q16(a, e), xb = x.q16(a, e + 32);
      const float da = x.dv(a, e >> 5), db = x.dv(a, (e >> 5) + 1);
      acc[a] += da * (a0 * static_cast<float>(dot16(lo, xa)) - b0 * static_cast<float>(sum4(xa))) +
                db * (a1 * static_cast<float>(dot16(hi, xb)) - b1 * static_cast<float>(sum4(xb)));
    }
  }
};

// Q6_K: 210 B = [ql 128 B] [qh 64 B] [scales 16 × int8] [d f16]; 2-byte aligned only. Piece P (0..3): half
// hf = P/2, lq = P%2 reads ql0 = ql[64hf + 16lq, +16), ql1 = ql[64hf + 32 + 16lq, +16), qh[32hf + 16lq, +16)
// and the scales 8hf + lq + {0, 2, 4, 6}: its four 16-weight runs start at weight 128hf + 16lq + {0, 32, 64, 96}
// (ql0 low nibbles + qh bits 0-1, ql1 low + bits 2-3, ql0 high + bits 4-5, ql1 high + bits 6-7; values
// q − 32), the layout of dequantize_row_q6_K. Its dot: per run Σq·x − 32·Σx in integers, scaled by the run's
// int8 scale and summed in integers, then one float expression (the q8_K scale is one per 256).
// Why 64-weight pieces: the qh bytes serve both ql halves (one load instead of two), and one integer sum per
// piece replaces two float scale products per 32 weights (~7.5 PTX instructions per weight before: the
// one-row GEMV of the output matrix streamed at ~2.2 TB/s). dot2 forms two rows' sums against the same
// activations with their Σx once; each row's integers are dot()'s, so the results are identical.
struct K6 {
  static constexpr int kBytes = 210, kPieces = 4, kWeights = 64, kAlign = 2;
  struct Raw {
    uint32_t ql0[4], ql1[4], qh[4], sc, d;  // sc: the 4 run scales as bytes [s0 s2 s4 s6] (+ 8hf + lq)
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    const uint8_t* b = row + static_cast<size_t>(pi >> 2) * kBytes;
    const int hf = (pi >> 1) & 1, lq = pi & 1;
    Raw r;
    ld_words_a2<4>(b + 64 * hf + 16 * lq, r.ql0);
    ld_words_a2<4>(b + 64 * hf + 32 + 16 * lq, r.ql1);
    ld_words_a2<4>(b + 128 + 32 * hf + 16 * lq, r.qh);
    uint32_t sw[2];
    ld_words_a2<2>(b + 192 + 8 * hf, sw);
    const uint32_t l = static_cast<uint32_t>(lq);
    r.sc = __byte_perm(sw[0], sw[1], l | (l + 2) << 4 | (l + 4) << 8 | (l + 6) << 12);
    r.d = __ldg(reinterpret_cast<const uint16_t*>(b + 208));
    return r;
  }
  // The four runs' quants (0..63) as bytes: q[k] = run k.
  __device__ static void unpack(const Raw& r, uint32_t (&q)[4][4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t h = r.qh[i];
      q[0][i] = (r.ql0[i] & 0x0F0F0F0Fu) | ((h << 4) & 0x30303030u);
      q[1][i] = (r.ql1[i] & 0x0F0F0F0Fu) | ((h << 2) & 0x30303030u);
      q[2][i] = ((r.ql0[i] >> 4) & 0x0F0F0F0Fu) | (h & 0x30303030u);
      q[3][i] = ((r.ql1[i] >> 4) & 0x0F0F0F0Fu) | ((h >> 2) & 0x30303030u);
    }
  }
  __device__ static int64_t first(int pi) { return static_cast<int64_t>(pi >> 2) * 256 + 128 * ((pi >> 1) & 1) + 16 * (pi & 1); }
  // Σ_k sc_k·(Σq_k·x_k − 32·Σx_k) of one row; x32[k] = 32·Σx_k.
  __device__ static int isum(const uint32_t (&q)[4][4], uint32_t sc, const int4 (&xv)[4], const int (&x32)[4]) {
    int t = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) t += static_cast<int>(static_cast<int8_t>((sc >> (8 * k)) & 0xff)) * (dot16(q[k], xv[k]) - x32[k]);
    return t;
  }
  template <class X>
  __device__ static void load_x(const X& x, int a, int64_t e, int4 (&xv)[4], int (&x32)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) xv[k] = x.q16(a, e + 32 * k), x32[k] = 32 * sum4(xv[k]);
  }
  template <int NA, class X>
  __device__ static void dot(const Raw& r, int pi, const X& x, float (&acc)[NA]) {
    const int64_t e = first(pi);
    uint32_t q[4][4];
    unpack(r, q);
    const float d = h2f(r.d);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      int4 xv[4];
      int x32[4];
      load_x(x, a, e, xv, x32);
      acc[a] += x.dv(a, e >> 5) * (d * static_cast<float>(isum(q, r.sc, xv, x32)));
    }
  }
  template <int NA, class X>
  __device__ static void dot2(const Raw& r0, const Raw& r1, int pi, const X& x, float (&acc0)[NA], float (&acc1)[NA]) {
    const int64_t e = first(pi);
    uint32_t q0[4][4], q1[4][4];
    unpack(r0, q0);
    unpack(r1, q1);
    const float d0 = h2f(r0.d), d1 = h2f(r1.d);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      int4 xv[4];
      int x32[4];
      load_x(x, a, e, xv, x32);
      const float dx = x.dv(a, e >> 5);
      acc0[a] += dx * (d0 * static_cast<float>(isum(q0, r0.sc, xv, x32)));
      acc1[a] += dx * (d1 * static_cast<float>(isum(q1, r1.sc, xv, x32)));
    }
  }
};

// A 2-byte-aligned [d f16][W words] block (Q8_0, Q4_0): its scale bits and quant words.
template <int W>
__device__ __forceinline__ void ld_d_q(const uint8_t* b, uint32_t& d, uint32_t (&q)[W]) {
  ld_words_a2<W>(b + 2, q);
  d = __ldg(reinterpret_cast<const uint16_t*>(b));
}

// Q8_0: 34 B = [d f16] [32 × int8]; one piece per block, 2-byte aligned.
struct B8 {
  static constexpr int kBytes = 34, kPieces = 1, kWeights = 32, kAlign = 2;
  struct Raw {
    uint32_t q[8], d;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    Raw r;
    ld_d_q(row + static_cast<size_t>(pi) * kBytes, r.d, r.q);
    return r;
  }
  template <int NA, class X>
  __device__ static void dot(const Raw& r, int pi, const X& x, float (&acc)[NA]) {
    const int64_t e = static_cast<int64_t>(pi) * 32;
    const float d = h2f(r.d);
    const uint32_t q0[4] = {r.q[0], r.q[1], r.q[2], r.q[3]}, q1[4] = {r.q[4], r.q[5], r.q[6], r.q[7]};
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int4 xa = x.q16(a, e), xb = x.q16(a, e + 16);
      acc[a] += d * x.dv(a, pi) * static_cast<float>(dot16(q0, xa) + dot16(q1, xb));
    }
  }
};

// Q4_0: 18 B = [d f16] [qs 16 B]: low nibbles are weights 0..15, high nibbles 16..31, values q − 8.
struct B4 {
  static constexpr int kBytes = 18, kPieces = 1, kWeights = 32, kAlign = 2;
  struct Raw {
    uint32_t q[4], d;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    Raw r;
    ld_d_q(row + static_cast<size_t>(pi) * kBytes, r.d, r.q);
    return r;
  }
  template <int NA, class X>
  __device__ static void dot(const Raw& r, int pi, const X& x, float (&acc)[NA]) {
    const int64_t e = static_cast<int64_t>(pi) * 32;
    const float d = h2f(r.d);
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) lo[i] = r.q[i] & 0x0F0F0F0Fu, hi[i] = (r.q[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int4 xa = x.q16(a, e), xb = x.q16(a, e + 16);
      acc[a] += d * x.dv(a, pi) * static_cast<float>(dot16(lo, xa) + dot16(hi, xb) - 8 * (sum4(xa) + sum4(xb)));
    }
  }
};

// The IQ4_NL levels of 4 nibble indices (one per byte, 0..15) as 4 int8 bytes, by byte permutes.
__device__ __forceinline__ uint32_t iq4_levels4(uint32_t v) {
  const uint32_t sel = (v & 7u) | ((v >> 4) & 0x70u) | ((v >> 8) & 0x700u) | ((v >> 12) & 0x7000u);
  const uint32_t lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, sel);
  const uint32_t hi = __byte_perm(0x26190D01u, 0x71594535u, sel);
  const uint32_t m = ((v >> 3) & 0x01010101u) * 0xFFu;
  return (lo & ~m) | (hi & m);
}

// IQ4_XS: 136 B = [d f16] [scales_h u16] [scales_l 4 B] [qs 128 B]; 8-byte aligned. Piece = sub-block ib:
// qs[16ib, +16), low nibbles weights 0..15, high 16..31, levels from the IQ4_NL table, scale d·(ls − 32).
struct XS4 {
  static constexpr int kBytes = 136, kPieces = 8, kWeights = 32, kAlign = 8;
  struct Raw {
    uint2 q0, q1, hd;
  };
  __device__ static Raw load(const uint8_t* row, int pi) {
    const uint8_t* b = row + static_cast<size_t>(pi >> 3) * kBytes;
    const uint8_t* qs = b + 8 + 16 * (pi & 7);
    return {__ldg(reinterpret_cast<const uint2*>(qs)), __ldg(reinterpret_cast<const uint2*>(qs + 8)),
            __ldg(reinterpret_cast<const uint2*>(b))};
  }
  template <int NA, class X>
  __device__ static void dot(const Raw& r, int pi, const X& x, float (&acc)[NA]) {
    const int ib = pi & 7;
    const int64_t e = static_cast<int64_t>(pi) * 32;
    const int ls = static_cast<int>(((r.hd.y >> (4 * ib)) & 0xF) | (((r.hd.x >> (16 + 2 * ib)) & 3) << 4));
    const float dl = h2f(r.hd.x) * static_cast<float>(ls - 32);
    const uint32_t q[4] = {r.q0.x, r.q0.y, r.q1.x, r.q1.y};
    uint32_t lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) lo[i] = iq4_levels4(q[i] & 0x0F0F0F0Fu), hi[i] = iq4_levels4((q[i] >> 4) & 0x0F0F0F0Fu);
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const int4 xa = x.q16(a, e), xb = x.q16(a, e + 16);
      acc[a] += dl * x.dv(a, pi) * static_cast<float>(dot16(lo, xa) + dot16(hi, xb));
    }
  }
};

// Two rows' pieces pi against the same activations: T::dot2 where the decoder has one (it shares the
// activation-only work), else two dot calls. Either way each row's acc gets dot()'s exact value.
template <class T, int NA, class X>
__device__ __forceinline__ void dot_pair(const typename T::Raw& r0, const typename T::Raw& r1, int pi, const X& x, float (&acc0)[NA],
                                         float (&acc1)[NA]) {
  if constexpr (requires { T::template dot2<NA>(r0, r1, pi, x, acc0, acc1); }) {
    T::template dot2<NA>(r0, r1, pi, x, acc0, acc1);
  } else {
    T::template dot<NA>(r0, pi, x, acc0);
    T::template dot<NA>(r1, pi, x, acc1);
  }
}

// The weight types a kernel family instantiates.
enum class WqSet {
  kAll,         // every decoder above
  kKQuantsQ8,   // Q4_K, Q5_K, Q6_K, Q8_0 (the pipelined and fused-MoE kernels)
};

// Calls f.template operator()<T>() with the decoder of type t; false when t is not in S.
template <WqSet S = WqSet::kAll, class F>
bool dispatch(DType t, F&& f) {
  switch (t) {
    case DType::Q4_K: f.template operator()<K4>(); return true;
    case DType::Q5_K: f.template operator()<K5>(); return true;
    case DType::Q6_K: f.template operator()<K6>(); return true;
    case DType::Q8_0: f.template operator()<B8>(); return true;
    default: break;
  }
  if constexpr (S == WqSet::kAll) {
    switch (t) {
      case DType::Q4_0: f.template operator()<B4>(); return true;
      case DType::IQ4_XS: f.template operator()<XS4>(); return true;
      default: break;
    }
  }
  return false;
}

}  // namespace pg::cuda::wq
