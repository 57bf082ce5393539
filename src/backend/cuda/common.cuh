// Device helpers shared by the kernels: loads at a known alignment, warp reductions, and one decoder per
// GGUF weight type.
//
// Decoders. Every weight type is seen as blocks of kElems elements, kBytes bytes each (plain F32/F16/BF16
// as virtual blocks of 32). Two decoders per type:
//  - run(b, r, w): the 16 elements [16r, 16r+16) of the block at b, in natural order (GEMM, get_rows);
//  - chunk(b, c, w, off0, off1): 32 elements, w[0..15] at block offsets off0.., w[16..31] at off1..; the
//    chunks of a block partition it and are chosen so that one chunk's two runs share their bytes (the
//    low and high nibbles of the same 16 bytes, say), which is what the GEMV's inner loop reads.
// Dequantized values are bit-identical to core/quant_ref.cpp's dequantize_row: products and sums use
// __fmul_rn/__fadd_rn so the compiler cannot fuse them into FMAs that round differently.
// `b` is a generic pointer (shared or global memory); kAlign is the alignment every block of the type
// has inside a 16-byte aligned array of blocks, and the loads below never assume more.
#pragma once
#ifdef PG_CUDA_HOST_SHIM
// Host compilation of the decoders for tests/cuda/test_cuda_decoders.cpp (no GPU needed).
#include "cuda_host_shim.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include <cstdint>

#include "core/dtype.h"

namespace pg::cuda {

__device__ __forceinline__ float h2f(uint32_t h) { return __half2float(__ushort_as_half(static_cast<unsigned short>(h & 0xffff))); }
__device__ __forceinline__ float bf2f(uint32_t h) { return __uint_as_float((h & 0xffff) << 16); }

__device__ __forceinline__ uint32_t ld16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t ld32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t ld32a2(const uint8_t* p) { return ld16(p) | (ld16(p + 2) << 16); }

// 16 bytes at p (aligned to A) into 4 little-endian words.
template <int A>
__device__ __forceinline__ void ld128(const uint8_t* p, uint32_t (&v)[4]) {
  if constexpr (A >= 16) {
    const uint4 t = *reinterpret_cast<const uint4*>(p);
    v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
  } else if constexpr (A >= 8) {
    const uint2 a = *reinterpret_cast<const uint2*>(p), b = *reinterpret_cast<const uint2*>(p + 8);
    v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
  } else if constexpr (A >= 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = ld32(p + 4 * i);
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = ld32a2(p + 4 * i);
  }
}

// Exact float of a small integer (|v| < 2^22) with an integer add and a float add: the conversion
// instruction (I2F) runs at a quarter of the FP32 rate on sm_80/sm_90 and would cap the GEMV.
__device__ __forceinline__ float i2f(int v) { return __int_as_float(0x4B400000 + v) - 12582912.0f; }
// Exact float of byte k (0..3, compile-time) of w, as an unsigned 0..255: one byte permute + one add.
__device__ __forceinline__ float byte_f(uint32_t w, int k) {
  return __int_as_float(__byte_perm(w, 0x4B000000u, static_cast<uint32_t>(k) | 0x7540u)) - 8388608.0f;
}
// Bits 0..3 of b spread to bit 0 of each byte (for the 5th quant bit of Q5_0/Q5_1).
__device__ __forceinline__ uint32_t spread4(uint32_t b) { return ((b & 15) * 0x00204081u) & 0x01010101u; }

// Byte i (compile-time after unrolling) of a 16-byte group.
__device__ __forceinline__ uint32_t byte_of(const uint32_t (&v)[4], int i) { return (v[i >> 2] >> ((i & 3) * 8)) & 0xff; }
// Byte k (run-time, 0..11) of 12 bytes held in 3 words, without indexing a register array.
__device__ __forceinline__ uint32_t byte12(uint32_t s0, uint32_t s1, uint32_t s2, int k) {
  const uint32_t w = k < 4 ? s0 : (k < 8 ? s1 : s2);
  return (w >> ((k & 3) * 8)) & 0xff;
}

// The 16 IQ4_NL levels {-127,-104,-83,-65,-49,-35,-22,-10,1,13,25,38,53,69,89,113} as int8 bytes, looked
// up with byte permutes so that no memory table is needed.
__device__ __forceinline__ float iq4nl_level(uint32_t v) {
  const uint32_t lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, v & 7);
  const uint32_t hi = __byte_perm(0x26190D01u, 0x71594535u, v & 7);
  return i2f(static_cast<int8_t>((v & 8 ? hi : lo) & 0xff));
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Fused chunk dot for the GEMV: for every activation row a, acc[a] += Σ w·x over the chunk, where
// x[a][0..15] are the activations at the chunk's offset off0 and x[a][16..31] at off1, and xs[a][0..1]
// their two run sums. Quants are summed as exact integers-in-float (q·x), then scaled once per run:
// d·Σq·x − m·Σx — 3 instructions per weight (byte permute, add, FMA) instead of a dequantization.
// lo/hi: 4 words holding the 16 run-0 / run-1 quant values (0..255 each, one per byte).
template <int NA>
__device__ __forceinline__ void dot_runs(const uint32_t (&lo)[4], const uint32_t (&hi)[4], const float (&x)[NA][32], float (&s0)[NA],
                                         float (&s1)[NA]) {
#pragma unroll
  for (int a = 0; a < NA; ++a) s0[a] = s1[a] = 0.0f;
#pragma unroll
  for (int w = 0; w < 4; ++w)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float fl = byte_f(lo[w], k), fh = byte_f(hi[w], k);
#pragma unroll
      for (int a = 0; a < NA; ++a) {
        s0[a] = fmaf(fl, x[a][4 * w + k], s0[a]);
        s1[a] = fmaf(fh, x[a][16 + 4 * w + k], s1[a]);
      }
    }
}

// ---- decoders ---------------------------------------------------------------------------------------

struct QF32 {
  static constexpr int kBytes = 128, kElems = 32, kAlign = 16;
  static constexpr bool kPlain = true;
  static constexpr bool kDot = false;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 0, off1 = 16; }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const float4* p = reinterpret_cast<const float4*>(b + 64 * r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 t = p[i];
      w[4 * i] = t.x, w[4 * i + 1] = t.y, w[4 * i + 2] = t.z, w[4 * i + 3] = t.w;
    }
  }
};

template <bool BF>
struct QHalf {
  static constexpr int kBytes = 64, kElems = 32, kAlign = 16;
  static constexpr bool kPlain = true;
  static constexpr bool kDot = false;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 0, off1 = 16; }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    uint32_t v[8];
    ld128<16>(b + 32 * r, reinterpret_cast<uint32_t(&)[4]>(v[0]));
    ld128<16>(b + 32 * r + 16, reinterpret_cast<uint32_t(&)[4]>(v[4]));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      w[2 * i] = BF ? bf2f(v[i]) : h2f(v[i]);
      w[2 * i + 1] = BF ? bf2f(v[i] >> 16) : h2f(v[i] >> 16);
    }
  }
};
using QF16 = QHalf<false>;
using QBF16 = QHalf<true>;

struct QQ4_0 {
  static constexpr int kBytes = 18, kElems = 32, kAlign = 2;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = true;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 0, off1 = 16; }
  template <int NA>
  __device__ static void dot(const uint8_t* b, int, const float (&x)[NA][32], const float (&xs)[NA][2], float (&acc)[NA]) {
    const float d = h2f(ld16(b));
    uint32_t q[4], lo[4], hi[4];
    ld128<kAlign>(b + 2, q);
#pragma unroll
    for (int w = 0; w < 4; ++w) lo[w] = q[w] & 0x0F0F0F0Fu, hi[w] = (q[w] >> 4) & 0x0F0F0F0Fu;
    float s0[NA], s1[NA];
    dot_runs<NA>(lo, hi, x, s0, s1);
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[a] += d * ((s0[a] + s1[a]) - 8.0f * (xs[a][0] + xs[a][1]));
  }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const float d = h2f(ld16(b));
    uint32_t q[4];
    ld128<kAlign>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = __fmul_rn(i2f(static_cast<int>((byte_of(q, i) >> (4 * r)) & 15) - 8), d);
  }
  __device__ static void chunk(const uint8_t* b, int, float (&w)[32], int& off0, int& off1) {
    const float d = h2f(ld16(b));
    uint32_t q[4];
    ld128<kAlign>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[i] = __fmul_rn(i2f(static_cast<int>(byte_of(q, i) & 15) - 8), d);
      w[16 + i] = __fmul_rn(i2f(static_cast<int>(byte_of(q, i) >> 4) - 8), d);
    }
    off0 = 0, off1 = 16;
  }
};

struct QQ4_1 {
  static constexpr int kBytes = 20, kElems = 32, kAlign = 4;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = true;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 0, off1 = 16; }
  template <int NA>
  __device__ static void dot(const uint8_t* b, int, const float (&x)[NA][32], const float (&xs)[NA][2], float (&acc)[NA]) {
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), m = h2f(dm >> 16);
    uint32_t q[4], lo[4], hi[4];
    ld128<kAlign>(b + 4, q);
#pragma unroll
    for (int w = 0; w < 4; ++w) lo[w] = q[w] & 0x0F0F0F0Fu, hi[w] = (q[w] >> 4) & 0x0F0F0F0Fu;
    float s0[NA], s1[NA];
    dot_runs<NA>(lo, hi, x, s0, s1);
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[a] += d * (s0[a] + s1[a]) + m * (xs[a][0] + xs[a][1]);
  }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), m = h2f(dm >> 16);
    uint32_t q[4];
    ld128<kAlign>(b + 4, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = __fadd_rn(__fmul_rn(i2f(static_cast<int>((byte_of(q, i) >> (4 * r)) & 15)), d), m);
  }
  __device__ static void chunk(const uint8_t* b, int, float (&w)[32], int& off0, int& off1) {
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), m = h2f(dm >> 16);
    uint32_t q[4];
    ld128<kAlign>(b + 4, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[i] = __fadd_rn(__fmul_rn(i2f(static_cast<int>(byte_of(q, i) & 15)), d), m);
      w[16 + i] = __fadd_rn(__fmul_rn(i2f(static_cast<int>(byte_of(q, i) >> 4)), d), m);
    }
    off0 = 0, off1 = 16;
  }
};

struct QQ5_0 {
  static constexpr int kBytes = 22, kElems = 32, kAlign = 2;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = true;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 0, off1 = 16; }
  template <int NA>
  __device__ static void dot(const uint8_t* b, int, const float (&x)[NA][32], const float (&xs)[NA][2], float (&acc)[NA]) {
    const float d = h2f(ld16(b));
    const uint32_t qh = ld32a2(b + 2);
    uint32_t q[4], lo[4], hi[4];
    ld128<kAlign>(b + 6, q);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      lo[w] = (q[w] & 0x0F0F0F0Fu) | (spread4(qh >> (4 * w)) << 4);
      hi[w] = ((q[w] >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * w)) << 4);
    }
    float s0[NA], s1[NA];
    dot_runs<NA>(lo, hi, x, s0, s1);
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[a] += d * ((s0[a] + s1[a]) - 16.0f * (xs[a][0] + xs[a][1]));
  }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const float d = h2f(ld16(b));
    const uint32_t qh = ld32a2(b + 2) >> (16 * r);
    uint32_t q[4];
    ld128<kAlign>(b + 6, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int v = static_cast<int>(((byte_of(q, i) >> (4 * r)) & 15) | (((qh >> i) & 1) << 4));
      w[i] = __fmul_rn(i2f(v - 16), d);
    }
  }
  __device__ static void chunk(const uint8_t* b, int, float (&w)[32], int& off0, int& off1) {
    const float d = h2f(ld16(b));
    const uint32_t qh = ld32a2(b + 2);
    uint32_t q[4];
    ld128<kAlign>(b + 6, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int v0 = static_cast<int>((byte_of(q, i) & 15) | (((qh >> i) & 1) << 4));
      const int v1 = static_cast<int>((byte_of(q, i) >> 4) | (((qh >> (i + 16)) & 1) << 4));
      w[i] = __fmul_rn(i2f(v0 - 16), d);
      w[16 + i] = __fmul_rn(i2f(v1 - 16), d);
    }
    off0 = 0, off1 = 16;
  }
};

struct QQ5_1 {
  static constexpr int kBytes = 24, kElems = 32, kAlign = 8;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = true;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 0, off1 = 16; }
  template <int NA>
  __device__ static void dot(const uint8_t* b, int, const float (&x)[NA][32], const float (&xs)[NA][2], float (&acc)[NA]) {
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), m = h2f(dm >> 16);
    const uint32_t qh = ld32(b + 4);
    uint32_t q[4], lo[4], hi[4];
    ld128<kAlign>(b + 8, q);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      lo[w] = (q[w] & 0x0F0F0F0Fu) | (spread4(qh >> (4 * w)) << 4);
      hi[w] = ((q[w] >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * w)) << 4);
    }
    float s0[NA], s1[NA];
    dot_runs<NA>(lo, hi, x, s0, s1);
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[a] += d * (s0[a] + s1[a]) + m * (xs[a][0] + xs[a][1]);
  }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), m = h2f(dm >> 16);
    const uint32_t qh = ld32(b + 4) >> (16 * r);
    uint32_t q[4];
    ld128<kAlign>(b + 8, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t v = ((byte_of(q, i) >> (4 * r)) & 15) | (((qh >> i) & 1) << 4);
      w[i] = __fadd_rn(__fmul_rn(i2f(static_cast<int>(v)), d), m);
    }
  }
  __device__ static void chunk(const uint8_t* b, int, float (&w)[32], int& off0, int& off1) {
    const uint32_t dm = ld32(b);
    const float d = h2f(dm), m = h2f(dm >> 16);
    const uint32_t qh = ld32(b + 4);
    uint32_t q[4];
    ld128<kAlign>(b + 8, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t v0 = (byte_of(q, i) & 15) | (((qh >> i) & 1) << 4);
      const uint32_t v1 = (byte_of(q, i) >> 4) | (((qh >> (i + 16)) & 1) << 4);
      w[i] = __fadd_rn(__fmul_rn(i2f(static_cast<int>(v0)), d), m);
      w[16 + i] = __fadd_rn(__fmul_rn(i2f(static_cast<int>(v1)), d), m);
    }
    off0 = 0, off1 = 16;
  }
};

struct QQ8_0 {
  static constexpr int kBytes = 34, kElems = 32, kAlign = 2;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = true;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 0, off1 = 16; }
  // Signed bytes biased by +128 (xor 0x80) to 0..255, the bias removed with the run sums.
  template <int NA>
  __device__ static void dot(const uint8_t* b, int, const float (&x)[NA][32], const float (&xs)[NA][2], float (&acc)[NA]) {
    const float d = h2f(ld16(b));
    uint32_t lo[4], hi[4];
    ld128<kAlign>(b + 2, lo);
    ld128<kAlign>(b + 18, hi);
#pragma unroll
    for (int w = 0; w < 4; ++w) lo[w] ^= 0x80808080u, hi[w] ^= 0x80808080u;
    float s0[NA], s1[NA];
    dot_runs<NA>(lo, hi, x, s0, s1);
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[a] += d * ((s0[a] + s1[a]) - 128.0f * (xs[a][0] + xs[a][1]));
  }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const float d = h2f(ld16(b));
    uint32_t q[4];
    ld128<kAlign>(b + 2 + 16 * r, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = __fmul_rn(i2f(static_cast<int8_t>(byte_of(q, i))), d);
  }
  __device__ static void chunk(const uint8_t* b, int, float (&w)[32], int& off0, int& off1) {
    const float d = h2f(ld16(b));
    uint32_t q[4], q2[4];
    ld128<kAlign>(b + 2, q);
    ld128<kAlign>(b + 18, q2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[i] = __fmul_rn(i2f(static_cast<int8_t>(byte_of(q, i))), d);
      w[16 + i] = __fmul_rn(i2f(static_cast<int8_t>(byte_of(q2, i))), d);
    }
    off0 = 0, off1 = 16;
  }
};

struct QIQ4_NL {
  static constexpr int kBytes = 18, kElems = 32, kAlign = 2;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = false;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 0, off1 = 16; }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const float d = h2f(ld16(b));
    uint32_t q[4];
    ld128<kAlign>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = __fmul_rn(d, iq4nl_level(byte_of(q, i) >> (4 * r)));
  }
  __device__ static void chunk(const uint8_t* b, int, float (&w)[32], int& off0, int& off1) {
    const float d = h2f(ld16(b));
    uint32_t q[4];
    ld128<kAlign>(b + 2, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[i] = __fmul_rn(d, iq4nl_level(byte_of(q, i)));
      w[16 + i] = __fmul_rn(d, iq4nl_level(byte_of(q, i) >> 4));
    }
    off0 = 0, off1 = 16;
  }
};

struct QIQ4_XS {
  static constexpr int kBytes = 136, kElems = 256, kAlign = 8;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = false;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 32 * c, off1 = 32 * c + 16; }
  // Scale of 32-element group ib.
  __device__ static float group_scale(const uint8_t* b, int ib) {
    const uint32_t h = ld32(b), sl = ld32(b + 4);
    const uint32_t ls = ((sl >> (8 * (ib >> 1) + 4 * (ib & 1))) & 15) | (((h >> (16 + 2 * ib)) & 3) << 4);
    return __fmul_rn(h2f(h), i2f(static_cast<int>(ls) - 32));
  }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const int ib = r >> 1;
    const float dl = group_scale(b, ib);
    uint32_t q[4];
    ld128<kAlign>(b + 8 + 16 * ib, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = __fmul_rn(dl, iq4nl_level(byte_of(q, i) >> (4 * (r & 1))));
  }
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[32], int& off0, int& off1) {
    const float dl = group_scale(b, c);
    uint32_t q[4];
    ld128<kAlign>(b + 8 + 16 * c, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[i] = __fmul_rn(dl, iq4nl_level(byte_of(q, i)));
      w[16 + i] = __fmul_rn(dl, iq4nl_level(byte_of(q, i) >> 4));
    }
    off0 = 32 * c, off1 = 32 * c + 16;
  }
};

struct QQ2_K {
  static constexpr int kBytes = 84, kElems = 256, kAlign = 4;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = false;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 32 * c, off1 = 32 * c + 16; }
  // Run r = elements [16r, 16r+16): scale byte r, quant bytes 16·(2·half + part) of qs, shift 2·si.
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const uint32_t dd = ld32(b + 80);
    const float d = h2f(dd), dmin = h2f(dd >> 16);
    const uint32_t sc = b[r];
    const float dl = __fmul_rn(d, i2f(static_cast<int>(sc & 15))), ml = __fmul_rn(dmin, i2f(static_cast<int>(sc >> 4)));
    const int half = r >> 3, si = (r >> 1) & 3, part = r & 1;
    uint32_t q[4];
    ld128<kAlign>(b + 16 + 32 * half + 16 * part, q);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = __fsub_rn(__fmul_rn(dl, i2f(static_cast<int>((byte_of(q, i) >> (2 * si)) & 3))), ml);
  }
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[32], int& off0, int& off1) {
    run(b, 2 * c, reinterpret_cast<float(&)[16]>(w[0]));
    run(b, 2 * c + 1, reinterpret_cast<float(&)[16]>(w[16]));
    off0 = 32 * c, off1 = 32 * c + 16;
  }
};

struct QQ3_K {
  static constexpr int kBytes = 110, kElems = 256, kAlign = 2;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = false;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 32 * c, off1 = 32 * c + 16; }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const float d = h2f(ld16(b + 108));
    const uint8_t* s = b + 96;
    const int lo = r < 8 ? (s[r] & 15) : (s[r - 8] >> 4);
    const int hi = (s[8 + (r & 3)] >> (2 * (r >> 2))) & 3;
    const float dl = __fmul_rn(d, i2f((lo | (hi << 4)) - 32));
    const int half = r >> 3, si = (r >> 1) & 3, part = r & 1;
    const int mbit = 4 * half + si;
    uint32_t q[4], hm[4];
    ld128<kAlign>(b + 32 + 32 * half + 16 * part, q);
    ld128<kAlign>(b + 16 * part, hm);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int v = static_cast<int>((byte_of(q, i) >> (2 * si)) & 3) - (((byte_of(hm, i) >> mbit) & 1) ? 0 : 4);
      w[i] = __fmul_rn(dl, i2f(static_cast<int>(v)));
    }
  }
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[32], int& off0, int& off1) {
    run(b, 2 * c, reinterpret_cast<float(&)[16]>(w[0]));
    run(b, 2 * c + 1, reinterpret_cast<float(&)[16]>(w[16]));
    off0 = 32 * c, off1 = 32 * c + 16;
  }
};

// Q4_K / Q5_K: scale and min of sub-block j (0..7), 6 bits each, from the 12 scale bytes (3 words).
__device__ __forceinline__ void k4_scale_min(uint32_t s0, uint32_t s1, uint32_t s2, int j, float d, float dmin, float& dl,
                                             float& ml) {
  uint32_t sc, mn;
  if (j < 4) {
    sc = byte12(s0, s1, s2, j) & 63;
    mn = byte12(s0, s1, s2, j + 4) & 63;
  } else {
    sc = (byte12(s0, s1, s2, j + 4) & 15) | ((byte12(s0, s1, s2, j - 4) >> 6) << 4);
    mn = (byte12(s0, s1, s2, j + 4) >> 4) | ((byte12(s0, s1, s2, j) >> 6) << 4);
  }
  dl = __fmul_rn(d, i2f(static_cast<int>(sc)));
  ml = __fmul_rn(dmin, i2f(static_cast<int>(mn)));
}

struct QQ4_K {
  static constexpr int kBytes = 144, kElems = 256, kAlign = 16;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = true;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 64 * (c >> 1) + 16 * (c & 1), off1 = off0 + 32; }
  template <int NA>
  __device__ static void dot(const uint8_t* b, int c, const float (&x)[NA][32], const float (&xs)[NA][2], float (&acc)[NA]) {
    uint32_t hd[4], q[4], lo[4], hi[4];
    ld128<16>(b, hd);
    const int j = c >> 1, h = c & 1;
    ld128<16>(b + 16 + 32 * j + 16 * h, q);
    const float d = h2f(hd[0]), dmin = h2f(hd[0] >> 16);
    float d1, m1, d2, m2;
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j, d, dmin, d1, m1);
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j + 1, d, dmin, d2, m2);
#pragma unroll
    for (int w = 0; w < 4; ++w) lo[w] = q[w] & 0x0F0F0F0Fu, hi[w] = (q[w] >> 4) & 0x0F0F0F0Fu;
    float s0[NA], s1[NA];
    dot_runs<NA>(lo, hi, x, s0, s1);
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[a] += (d1 * s0[a] - m1 * xs[a][0]) + (d2 * s1[a] - m2 * xs[a][1]);
  }
  // Run r: 64-group j = r/4, nibble (r/2)&1 (sub-block 2j+nibble), byte half r&1 of the group's 32 bytes.
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    uint32_t hd[4], q[4];
    ld128<16>(b, hd);
    const int j = r >> 2, nib = (r >> 1) & 1, h = r & 1;
    ld128<16>(b + 16 + 32 * j + 16 * h, q);
    float dl, ml;
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j + nib, h2f(hd[0]), h2f(hd[0] >> 16), dl, ml);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = __fsub_rn(__fmul_rn(dl, i2f(static_cast<int>((byte_of(q, i) >> (4 * nib)) & 15))), ml);
  }
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[32], int& off0, int& off1) {
    uint32_t hd[4], q[4];
    ld128<16>(b, hd);
    const int j = c >> 1, h = c & 1;
    ld128<16>(b + 16 + 32 * j + 16 * h, q);
    const float d = h2f(hd[0]), dmin = h2f(hd[0] >> 16);
    float d1, m1, d2, m2;
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j, d, dmin, d1, m1);
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j + 1, d, dmin, d2, m2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      w[i] = __fsub_rn(__fmul_rn(d1, i2f(static_cast<int>(byte_of(q, i) & 15))), m1);
      w[16 + i] = __fsub_rn(__fmul_rn(d2, i2f(static_cast<int>(byte_of(q, i) >> 4))), m2);
    }
    off0 = 64 * j + 16 * h, off1 = 64 * j + 32 + 16 * h;
  }
};

struct QQ5_K {
  static constexpr int kBytes = 176, kElems = 256, kAlign = 16;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = true;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 64 * (c >> 1) + 16 * (c & 1), off1 = off0 + 32; }
  template <int NA>
  __device__ static void dot(const uint8_t* b, int c, const float (&x)[NA][32], const float (&xs)[NA][2], float (&acc)[NA]) {
    uint32_t hd[4], q[4], qh[4], lo[4], hi[4];
    ld128<16>(b, hd);
    const int j = c >> 1, h = c & 1;
    ld128<16>(b + 48 + 32 * j + 16 * h, q);
    ld128<16>(b + 16 + 16 * h, qh);
    const float d = h2f(hd[0]), dmin = h2f(hd[0] >> 16);
    float d1, m1, d2, m2;
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j, d, dmin, d1, m1);
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j + 1, d, dmin, d2, m2);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      lo[w] = (q[w] & 0x0F0F0F0Fu) | (((qh[w] >> (2 * j)) & 0x01010101u) << 4);
      hi[w] = ((q[w] >> 4) & 0x0F0F0F0Fu) | (((qh[w] >> (2 * j + 1)) & 0x01010101u) << 4);
    }
    float s0[NA], s1[NA];
    dot_runs<NA>(lo, hi, x, s0, s1);
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[a] += (d1 * s0[a] - m1 * xs[a][0]) + (d2 * s1[a] - m2 * xs[a][1]);
  }
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    uint32_t hd[4], q[4], qh[4];
    ld128<16>(b, hd);
    const int j = r >> 2, nib = (r >> 1) & 1, h = r & 1;
    ld128<16>(b + 48 + 32 * j + 16 * h, q);
    ld128<16>(b + 16 + 16 * h, qh);
    float dl, ml;
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j + nib, h2f(hd[0]), h2f(hd[0] >> 16), dl, ml);
    const int u = 2 * j + nib;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t v = ((byte_of(q, i) >> (4 * nib)) & 15) + (((byte_of(qh, i) >> u) & 1) ? 16 : 0);
      w[i] = __fsub_rn(__fmul_rn(dl, i2f(static_cast<int>(v))), ml);
    }
  }
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[32], int& off0, int& off1) {
    uint32_t hd[4], q[4], qh[4];
    ld128<16>(b, hd);
    const int j = c >> 1, h = c & 1;
    ld128<16>(b + 48 + 32 * j + 16 * h, q);
    ld128<16>(b + 16 + 16 * h, qh);
    const float d = h2f(hd[0]), dmin = h2f(hd[0] >> 16);
    float d1, m1, d2, m2;
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j, d, dmin, d1, m1);
    k4_scale_min(hd[1], hd[2], hd[3], 2 * j + 1, d, dmin, d2, m2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t v0 = (byte_of(q, i) & 15) + (((byte_of(qh, i) >> (2 * j)) & 1) ? 16 : 0);
      const uint32_t v1 = (byte_of(q, i) >> 4) + (((byte_of(qh, i) >> (2 * j + 1)) & 1) ? 16 : 0);
      w[i] = __fsub_rn(__fmul_rn(d1, i2f(static_cast<int>(v0))), m1);
      w[16 + i] = __fsub_rn(__fmul_rn(d2, i2f(static_cast<int>(v1))), m2);
    }
    off0 = 64 * j + 16 * h, off1 = 64 * j + 32 + 16 * h;
  }
};

struct QQ6_K {
  static constexpr int kBytes = 210, kElems = 256, kAlign = 2;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = true;  // has a fused chunk_dot for the GEMV
  __device__ static void offsets(int c, int& off0, int& off1) { off0 = 128 * (c >> 2) + 32 * ((c >> 1) & 1) + 16 * (c & 1), off1 = off0 + 64; }
  template <int NA>
  __device__ static void dot(const uint8_t* b, int c, const float (&x)[NA][32], const float (&xs)[NA][2], float (&acc)[NA]) {
    const int half = c >> 2, q = (c >> 1) & 1, g = c & 1;
    const float d = h2f(ld16(b + 208));
    const float dl0 = d * i2f(static_cast<int8_t>(b[192 + 8 * half + g + 2 * q]));
    const float dl1 = d * i2f(static_cast<int8_t>(b[192 + 8 * half + g + 2 * q + 4]));
    uint32_t ql[4], qh[4], lo[4], hi[4];
    ld128<kAlign>(b + 64 * half + 32 * q + 16 * g, ql);
    ld128<kAlign>(b + 128 + 32 * half + 16 * g, qh);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t h = qh[w] >> (2 * q);
      lo[w] = (ql[w] & 0x0F0F0F0Fu) | ((h & 0x03030303u) << 4);
      hi[w] = ((ql[w] >> 4) & 0x0F0F0F0Fu) | (((h >> 4) & 0x03030303u) << 4);
    }
    float s0[NA], s1[NA];
    dot_runs<NA>(lo, hi, x, s0, s1);
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[a] += dl0 * (s0[a] - 32.0f * xs[a][0]) + dl1 * (s1[a] - 32.0f * xs[a][1]);
  }
  // Run r: half r/8 (128 elements), quarter (r/2)&3 of the half, 16-element group r&1 of the quarter.
  // Quarters 0/2 take the low/high nibbles of ql[l], 1/3 those of ql[l+32]; qh bits 2·quarter.
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const int half = r >> 3, quarter = (r >> 1) & 3, g = r & 1;
    const float d = h2f(ld16(b + 208));
    const int sc = static_cast<int8_t>(b[192 + 8 * half + g + 2 * quarter]);
    const float dl = __fmul_rn(d, i2f(static_cast<int>(sc)));
    uint32_t ql[4], qh[4];
    ld128<kAlign>(b + 64 * half + 32 * (quarter & 1) + 16 * g, ql);
    ld128<kAlign>(b + 128 + 32 * half + 16 * g, qh);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int v = static_cast<int>(((byte_of(ql, i) >> (4 * (quarter >> 1))) & 15) | (((byte_of(qh, i) >> (2 * quarter)) & 3) << 4)) - 32;
      w[i] = __fmul_rn(dl, i2f(static_cast<int>(v)));
    }
  }
  // Chunk c: half c/4, quarters q = (c/2)&1 and q+2 (same ql and qh bytes), group c&1.
  __device__ static void chunk(const uint8_t* b, int c, float (&w)[32], int& off0, int& off1) {
    const int half = c >> 2, q = (c >> 1) & 1, g = c & 1;
    const float d = h2f(ld16(b + 208));
    const float dl0 = __fmul_rn(d, i2f(static_cast<int8_t>(b[192 + 8 * half + g + 2 * q])));
    const float dl1 = __fmul_rn(d, i2f(static_cast<int8_t>(b[192 + 8 * half + g + 2 * q + 4])));
    uint32_t ql[4], qh[4];
    ld128<kAlign>(b + 64 * half + 32 * q + 16 * g, ql);
    ld128<kAlign>(b + 128 + 32 * half + 16 * g, qh);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t h = byte_of(qh, i) >> (2 * q);
      const int v0 = static_cast<int>((byte_of(ql, i) & 15) | ((h & 3) << 4)) - 32;
      const int v1 = static_cast<int>((byte_of(ql, i) >> 4) | (((h >> 4) & 3) << 4)) - 32;
      w[i] = __fmul_rn(dl0, i2f(static_cast<int>(v0)));
      w[16 + i] = __fmul_rn(dl1, i2f(static_cast<int>(v1)));
    }
    off0 = 128 * half + 32 * q + 16 * g, off1 = off0 + 64;
  }
};

// ---- KV-cache block types (core/kv_quant.h) ---------------------------------------------------------
// TQ3_0: 14-byte blocks of 32 values (fp16 norm, qs[8] low 2 bits, signs[4] high bit of each 3-bit index),
// decoded in the *rotated* domain (centroid · norm), bit-identical to core's tq3_dequantize. Only the KV
// kernels (attention over a TQ3_0 cache) use it; it is no weight type, so dispatch_type does not list it.

// The 8 Lloyd–Max centroids of core/kv_quant.cpp (kTq3Centroids), by index, without a memory table:
// index k = low2 + 4·hi; the negative half (hi = 0) mirrors the positive one, so |c| is chosen by
// m = low2 (hi = 1) or 3 − low2 (hi = 0) and the sign by hi (negation is exact).
__device__ __forceinline__ float tq3_centroid(uint32_t k) {
  const uint32_t m = (k & 4) ? (k & 3) : (3 - (k & 3));
  const float a = (m & 1) ? ((m & 2) ? 0.190685f : 0.065717f) : ((m & 2) ? 0.117832f : 0.021460f);
  return (k & 4) ? a : -a;
}

// The fixed TQ3_0 sign vectors as bit words (bit b of word w set = entry 32w + b is −1): s1 (which = 0)
// and s2 (which = 1). tests/cuda/test_cuda_decoders.cpp checks them against core's tq3_signs().
__device__ __forceinline__ uint32_t tq3_sign_word(int which, int w) {
  const uint32_t s1 = w == 0 ? 0x6eaf644eu : w == 1 ? 0x4feb7d1cu : w == 2 ? 0xb96fcbaau : 0xdf863153u;
  const uint32_t s2 = w == 0 ? 0x300de63du : w == 1 ? 0x5ad0ef84u : w == 2 ? 0x8213e45fu : 0x4a57c6a6u;
  return which ? s2 : s1;
}
// True when entry i (0..127) of sign vector `which` is −1.
__device__ __forceinline__ bool tq3_sign_neg(int which, int i) { return (tq3_sign_word(which, (i >> 5) & 3) >> (i & 31)) & 1u; }
// 1/√128 as core's kInvSqrt128 (the rotation's only scaling).
constexpr float kTq3InvSqrt128 = 0.08838834764831845f;

struct QTQ3_0 {
  static constexpr int kBytes = 14, kElems = 32, kAlign = 2;
  static constexpr bool kPlain = false;
  static constexpr bool kDot = false;
  // Elements [16r, 16r + 16): their 2-bit parts are bytes 4r..4r+3 of qs, their high bits bytes 2r, 2r+1 of signs.
  __device__ static void run(const uint8_t* b, int r, float (&w)[16]) {
    const float d = h2f(ld16(b));
    const uint32_t q = ld32a2(b + 2 + 4 * r);
    const uint32_t s = ld16(b + 10 + 2 * r);
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i] = __fmul_rn(tq3_centroid(((q >> (2 * i)) & 3) | (((s >> i) & 1) << 2)), d);
  }
};

// Plain types: a chunk is the whole 32-element virtual block.
template <class Q>
__device__ __forceinline__ void plain_chunk(const uint8_t* b, float (&w)[32], int& off0, int& off1) {
  Q::run(b, 0, reinterpret_cast<float(&)[16]>(w[0]));
  Q::run(b, 1, reinterpret_cast<float(&)[16]>(w[16]));
  off0 = 0, off1 = 16;
}

template <class Q>
__device__ __forceinline__ void decode_chunk(const uint8_t* b, int c, float (&w)[32], int& off0, int& off1) {
  if constexpr (Q::kPlain)
    plain_chunk<Q>(b, w, off0, off1);
  else
    Q::chunk(b, c, w, off0, off1);
}

// Calls f.template operator()<Q>() with the decoder of type t; returns false for unsupported types.
template <class F>
bool dispatch_type(DType t, F&& f) {
  switch (t) {
    case DType::F32: f.template operator()<QF32>(); return true;
    case DType::F16: f.template operator()<QF16>(); return true;
    case DType::BF16: f.template operator()<QBF16>(); return true;
    case DType::Q4_0: f.template operator()<QQ4_0>(); return true;
    case DType::Q4_1: f.template operator()<QQ4_1>(); return true;
    case DType::Q5_0: f.template operator()<QQ5_0>(); return true;
    case DType::Q5_1: f.template operator()<QQ5_1>(); return true;
    case DType::Q8_0: f.template operator()<QQ8_0>(); return true;
    case DType::IQ4_NL: f.template operator()<QIQ4_NL>(); return true;
    case DType::IQ4_XS: f.template operator()<QIQ4_XS>(); return true;
    case DType::Q2_K: f.template operator()<QQ2_K>(); return true;
    case DType::Q3_K: f.template operator()<QQ3_K>(); return true;
    case DType::Q4_K: f.template operator()<QQ4_K>(); return true;
    case DType::Q5_K: f.template operator()<QQ5_K>(); return true;
    case DType::Q6_K: f.template operator()<QQ6_K>(); return true;
    default: return false;
  }
}

inline int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace pg::cuda
