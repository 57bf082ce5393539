// Device-side encoders of the KV-cache element types (core/kv_quant.h): one call encodes one unit of one
// head — a 32-value block for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, a 128-value group (4 blocks) for TQ3_0, one value
// for F32/F16/BF16 — into the cache's bytes.
//
// Contract: the bytes are identical to core's kv_quantize_row (quantize_row = ggml-cpu's from_float for
// the GGML block types, tq3_quantize for TQ3_0) for every finite input. Each encoder is a line-by-line
// port of the CPU reference in the same operation order: products and sums use __fmul_rn/__fadd_rn/
// __fsub_rn/__fdiv_rn (and the double forms for TQ3_0's norms) so that nvcc cannot contract them into
// FMAs that round differently, the sums over a group run sequentially in the CPU's index order (one
// thread per unit), and fp16/bf16 rounding is the integer algorithm of core/fp16.h. That is why one thread
// encodes a whole unit instead of a warp: a parallel reduction would change the double sums' rounding.
// Non-finite input gives unspecified bytes (as on the CPU), never an out-of-range write.
//
// Compiled for the host too (PG_CUDA_HOST_SHIM, tests/cuda/test_cuda_decoders.cpp), where the bytes are
// compared with core's quantizer without a GPU.
#pragma once
#include "backend/cuda/common.cuh"

namespace pg::cuda {

// core/fp16.h's f32_to_fp16 (IEEE round to nearest even, NaN → sign|0x7e00), in integer operations.
__device__ __forceinline__ uint32_t kvq_f32_to_f16(float f) {
  const uint32_t x = __float_as_uint(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u);
  if (ax >= 0x477ff000u) return sign | 0x7c00u;
  if (ax < 0x38800000u) {
    if (ax < 0x33000000u) return sign;
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | r;
  }
  uint32_t r = (ax >> 13) - (112u << 10);
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1))) ++r;
  return sign | r;
}

// core/fp16.h's f32_to_bf16 (round to nearest even, quiet NaN as ggml).
__device__ __forceinline__ uint32_t kvq_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return ((u >> 16) | 64u) & 0xffffu;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

// quant_ref.cpp's trunc_int: a truncating conversion defined for every input (NaN and huge values → 0).
__device__ __forceinline__ int kvq_trunc_int(float v) { return (v > -1e9f && v < 1e9f) ? __float2int_rz(v) : 0; }

__device__ __forceinline__ void kvq_put16(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>((v >> 8) & 0xff);
}

// ---- GGML 32-value blocks: x (32 floats) → one block at y ----------------------------------------------

// One Q8_0 quant: v = x·(127/amax) rounded half to even, saturated, NaN → −128 (as the AVX2 pack does).
__device__ __forceinline__ uint8_t kvq_q8_quant(float v) {
  int q;
  if (!(v == v))
    q = -128;
  else {
    const float r = rintf(v);
    q = r >= 127.0f ? 127 : r <= -128.0f ? -128 : static_cast<int>(r);
  }
  return static_cast<uint8_t>(q & 0xff);
}

// Q8_0 as ggml-cpu's from_float (activation rule): d = amax/127, multiplier 127/amax, round half to
// even, saturated (kvq_q8_quant). y: 34 bytes.
__device__ __forceinline__ void kvq_encode_q8_0(const float (&x)[32], uint8_t* y) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(x[j]));
  const float d = __fdiv_rn(amax, 127.0f);
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  kvq_put16(y, kvq_f32_to_f16(d));
#pragma unroll
  for (int j = 0; j < 32; ++j) y[2 + j] = kvq_q8_quant(__fmul_rn(x[j], id));
}

// The signed value of largest magnitude (the first one on ties) and that magnitude (quant_ref's signed_absmax).
__device__ __forceinline__ void kvq_signed_absmax(const float (&x)[32], float& mx, float& ax) {
  mx = 0.0f, ax = 0.0f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    const float a = fabsf(x[j]);
    if (ax < a) ax = a, mx = x[j];
  }
}
__device__ __forceinline__ void kvq_minmax(const float (&x)[32], float& mn, float& mx) {
  mn = 3.402823466e+38f, mx = -3.402823466e+38f;
#pragma unroll
  for (int j = 0; j < 32; ++j) {
    if (x[j] < mn) mn = x[j];
    if (x[j] > mx) mx = x[j];
  }
}

// Q4_0: d = max/−8, q = min(15, (int8)trunc(x·id + 8.5)). y: 18 bytes.
__device__ __forceinline__ void kvq_encode_q4_0(const float (&x)[32], uint8_t* y) {
  float mx, ax;
  kvq_signed_absmax(x, mx, ax);
  const float d = __fdiv_rn(mx, -8.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  kvq_put16(y, kvq_f32_to_f16(d));
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int q0 = min(15, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(x[j], id), 8.5f)))));
    const int q1 = min(15, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(x[j + 16], id), 8.5f)))));
    y[2 + j] = static_cast<uint8_t>((q0 | (q1 << 4)) & 0xff);
  }
}

// Q4_1: d = (max − min)/15, m = min, q = min(15, (int8)trunc((x − m)·id + 0.5)). y: 20 bytes.
__device__ __forceinline__ void kvq_encode_q4_1(const float (&x)[32], uint8_t* y) {
  float mn, mx;
  kvq_minmax(x, mn, mx);
  const float d = __fdiv_rn(__fsub_rn(mx, mn), 15.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  kvq_put16(y, kvq_f32_to_f16(d));
  kvq_put16(y + 2, kvq_f32_to_f16(mn));
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int q0 = min(15, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(__fsub_rn(x[j], mn), id), 0.5f)))));
    const int q1 =
        min(15, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(__fsub_rn(x[j + 16], mn), id), 0.5f)))));
    y[4 + j] = static_cast<uint8_t>((q0 | (q1 << 4)) & 0xff);
  }
}

// Q5_0: d = max/−16, q = min(31, (int8)trunc(x·id + 16.5)), 5th bits in qh (little-endian word). y: 22 bytes.
__device__ __forceinline__ void kvq_encode_q5_0(const float (&x)[32], uint8_t* y) {
  float mx, ax;
  kvq_signed_absmax(x, mx, ax);
  const float d = __fdiv_rn(mx, -16.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  kvq_put16(y, kvq_f32_to_f16(d));
  uint32_t qh = 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int q0 = min(31, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(x[j], id), 16.5f)))));
    const int q1 = min(31, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(x[j + 16], id), 16.5f)))));
    y[6 + j] = static_cast<uint8_t>(((q0 & 0x0F) | ((q1 & 0x0F) << 4)) & 0xff);
    qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) y[2 + i] = static_cast<uint8_t>((qh >> (8 * i)) & 0xff);
}

// Q5_1: d = (max − min)/31, m = min, q = (uint8)trunc((x − m)·id + 0.5) (no clamp, as ggml). y: 24 bytes.
__device__ __forceinline__ void kvq_encode_q5_1(const float (&x)[32], uint8_t* y) {
  float mn, mx;
  kvq_minmax(x, mn, mx);
  const float d = __fdiv_rn(__fsub_rn(mx, mn), 31.0f);
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  kvq_put16(y, kvq_f32_to_f16(d));
  kvq_put16(y + 2, kvq_f32_to_f16(mn));
  uint32_t qh = 0;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int q0 = static_cast<uint8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(__fsub_rn(x[j], mn), id), 0.5f)) & 0xff);
    const int q1 = static_cast<uint8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(__fsub_rn(x[j + 16], mn), id), 0.5f)) & 0xff);
    y[8 + j] = static_cast<uint8_t>(((q0 & 0x0F) | ((q1 & 0x0F) << 4)) & 0xff);
    qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + 16);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) y[4 + i] = static_cast<uint8_t>((qh >> (8 * i)) & 0xff);
}

// ---- TQ3_0: x (128 floats, one group; overwritten) → 4 blocks (56 bytes) at y ---------------------------
// core's tq3_quantize: n = ‖x‖₂ in double (sequential sum), u = R(x/n) with R = s2 ⊙ H(s1 ⊙ ·)/√128,
// idx = number of decision mids below u, stored norm = fp16(n / ‖c[idx]‖₂) (sequential double sum).
__device__ __forceinline__ void kvq_encode_tq3_0(float (&x)[128], uint8_t* y) {
  double ss = 0.0;
#pragma unroll
  for (int i = 0; i < 128; ++i) ss = __dadd_rn(ss, __dmul_rn(static_cast<double>(x[i]), static_cast<double>(x[i])));
  const double nrm = __dsqrt_rn(ss);
  const float inv = nrm > 0.0 ? __double2float_rn(__ddiv_rn(1.0, nrm)) : 0.0f;
  // u = x·inv, then the sign flips s1 (multiplying by ±1 is exact, so a negation is the same value).
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    const float u = __fmul_rn(x[i], inv);
    x[i] = tq3_sign_neg(0, i) ? -u : u;
  }
  // Unnormalised Walsh–Hadamard butterflies, natural order (core's fwht128: each stage's pairs are disjoint,
  // so the order inside a stage does not change any value).
#pragma unroll
  for (int len = 1; len < 128; len <<= 1)
#pragma unroll
    for (int i = 0; i < 128; i += 2 * len)
#pragma unroll
      for (int j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = __fadd_rn(a, b);
        x[j + len] = __fsub_rn(a, b);
      }
  // x·(s2·(1/√128)): s2·k is ±k exactly, and u·(−k) = −(u·k) under round to nearest even.
  const float mids[7] = {-0.154259f, -0.091775f, -0.043589f, 0.0f, 0.043589f, 0.091775f, 0.154259f};
  // Per block b: its 8 qs bytes as words qs[2b], qs[2b + 1] (16 two-bit parts each), its 4 sign bytes as sg[b].
  uint32_t qs[8] = {0, 0, 0, 0, 0, 0, 0, 0}, sg[4] = {0, 0, 0, 0};
  double cs = 0.0;
#pragma unroll
  for (int i = 0; i < 128; ++i) {
    const float p = __fmul_rn(x[i], kTq3InvSqrt128);
    const float u = tq3_sign_neg(1, i) ? -p : p;
    uint32_t k = 0;
#pragma unroll
    for (int m = 0; m < 7; ++m) k += u > mids[m] ? 1u : 0u;
    const double c = static_cast<double>(tq3_centroid(k));
    cs = __dadd_rn(cs, __dmul_rn(c, c));
    qs[i >> 4] |= (k & 3u) << (2 * (i & 15));
    sg[i >> 5] |= (k >> 2) << (i & 31);
  }
  const uint32_t norm = kvq_f32_to_f16(__double2float_rn(__ddiv_rn(nrm, __dsqrt_rn(cs))));
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    uint8_t* blk = y + 14 * b;
    kvq_put16(blk, norm);
#pragma unroll
    for (int w = 0; w < 2; ++w)
#pragma unroll
      for (int k = 0; k < 4; ++k) blk[2 + 4 * w + k] = static_cast<uint8_t>((qs[2 * b + w] >> (8 * k)) & 0xff);
#pragma unroll
    for (int k = 0; k < 4; ++k) blk[10 + k] = static_cast<uint8_t>((sg[b] >> (8 * k)) & 0xff);
  }
}

// ---- one unit of one head --------------------------------------------------------------------------------

// Values per encoding unit: 1 (F32/F16/BF16), 32 (GGML blocks), 128 (TQ3_0); 0 for a type that is no KV type.
__device__ __forceinline__ int kvq_unit_elems(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16: return 1;
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1: return 32;
    case DType::TQ3_0: return 128;
    default: return 0;
  }
}
// Bytes per encoding unit (4, 2, 2, 34, 18, 20, 22, 24, 56).
__device__ __forceinline__ int kvq_unit_bytes(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16:
    case DType::BF16: return 2;
    case DType::Q8_0: return 34;
    case DType::Q4_0: return 18;
    case DType::Q4_1: return 20;
    case DType::Q5_0: return 22;
    case DType::Q5_1: return 24;
    case DType::TQ3_0: return 56;
    default: return 0;
  }
}

// Encodes unit u of one head: src (head_dim) floats of the head, zero beyond head_dim (the padding of
// core/kv_quant.h's layout: a head is rounded up to whole blocks / groups); head: the head's bytes
// (kv_head_bytes). F32 needs head 4-byte aligned and F16/BF16 2-byte aligned (true for cache rows).
__device__ __forceinline__ void kvq_encode_unit(DType t, const float* src, int head_dim, int u, uint8_t* head) {
  if (t == DType::F32) {
    reinterpret_cast<float*>(head)[u] = src[u];
    return;
  }
  if (t == DType::F16 || t == DType::BF16) {
    reinterpret_cast<uint16_t*>(head)[u] = static_cast<uint16_t>(t == DType::F16 ? kvq_f32_to_f16(src[u]) : kvq_f32_to_bf16(src[u]));
    return;
  }
  if (t == DType::TQ3_0) {
    float x[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) x[i] = 128 * u + i < head_dim ? src[128 * u + i] : 0.0f;
    kvq_encode_tq3_0(x, head + 56 * u);
    return;
  }
  float x[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) x[i] = 32 * u + i < head_dim ? src[32 * u + i] : 0.0f;
  uint8_t* y = head + kvq_unit_bytes(t) * u;
  switch (t) {
    case DType::Q8_0: kvq_encode_q8_0(x, y); break;
    case DType::Q4_0: kvq_encode_q4_0(x, y); break;
    case DType::Q4_1: kvq_encode_q4_1(x, y); break;
    case DType::Q5_0: kvq_encode_q5_0(x, y); break;
    case DType::Q5_1: kvq_encode_q5_1(x, y); break;
    default: break;
  }
}

// ---- TQ3_0 rotation of a vector in shared memory, by nt cooperating threads ------------------------------
// In place over x (n floats, n % 128 == 0), per 128-group: R (inverse = false: s2 ⊙ H(s1 ⊙ x)/√128) or R⁻¹
// (s1 ⊙ H(s2 ⊙ x)/√128), operation by operation as core's rotate_group, so the result is bit-identical to
// tq3_rotate / tq3_rotate_inverse. Thread tid of nt takes butterflies tid, tid + nt, …; sync() must be a
// barrier over the nt threads (__syncthreads for a block, __syncwarp for a warp), and every one of them calls
// this. With nt = 1 and a no-op sync it runs serially (the host test does that).
template <class Sync>
__device__ __forceinline__ void tq3_rotate_par(float* x, int n, bool inverse, int tid, int nt, Sync sync) {
  for (int i = tid; i < n; i += nt)
    if (tq3_sign_neg(inverse ? 1 : 0, i & 127)) x[i] = -x[i];
  sync();
  for (int len = 1; len < 128; len <<= 1) {
    for (int b = tid; b < n / 2; b += nt) {
      // Butterfly t (0..63) of group b / 64 pairs j and j + len, j = the t-th index whose bit `len` is clear.
      const int t = b & 63, j = (b >> 6) * 128 + (t / len) * 2 * len + t % len;
      const float a = x[j], c = x[j + len];
      x[j] = __fadd_rn(a, c);
      x[j + len] = __fsub_rn(a, c);
    }
    sync();
  }
  for (int i = tid; i < n; i += nt) {
    const float v = __fmul_rn(x[i], kTq3InvSqrt128);
    x[i] = tq3_sign_neg(inverse ? 0 : 1, i & 127) ? -v : v;
  }
  sync();
}

// ---- decoding a head for attention tiles ----------------------------------------------------------------

__device__ __forceinline__ bool kvq_plain(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

// Stored values [e·u, e·u + e) of one head (e = 8 for F32/F16/BF16, 16 for block types) → f[0..e).
// head: the head's first byte; F32/F16/BF16 heads are 16-byte aligned (head_dim % 8 == 0).
__device__ __forceinline__ void kvq_load(DType t, const uint8_t* head, int u, float (&f)[16]) {
  switch (t) {
    case DType::F32: {
      const float4* p = reinterpret_cast<const float4*>(head) + 2 * u;
      const float4 x = p[0], y = p[1];
      f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w, f[4] = y.x, f[5] = y.y, f[6] = y.z, f[7] = y.w;
      break;
    }
    case DType::F16:
    case DType::BF16: {
      const uint4 v = reinterpret_cast<const uint4*>(head)[u];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      const bool bf = t == DType::BF16;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        f[2 * i] = bf ? bf2f(w[i]) : h2f(w[i]);
        f[2 * i + 1] = bf ? bf2f(w[i] >> 16) : h2f(w[i] >> 16);
      }
      break;
    }
    case DType::Q8_0: QQ8_0::run(head + QQ8_0::kBytes * (u >> 1), u & 1, f); break;
    case DType::Q4_0: QQ4_0::run(head + QQ4_0::kBytes * (u >> 1), u & 1, f); break;
    case DType::Q4_1: QQ4_1::run(head + QQ4_1::kBytes * (u >> 1), u & 1, f); break;
    case DType::Q5_0: QQ5_0::run(head + QQ5_0::kBytes * (u >> 1), u & 1, f); break;
    case DType::Q5_1: QQ5_1::run(head + QQ5_1::kBytes * (u >> 1), u & 1, f); break;
    case DType::TQ3_0: QTQ3_0::run(head + QTQ3_0::kBytes * (u >> 1), u & 1, f); break;
    default:
#pragma unroll
      for (int i = 0; i < 16; ++i) f[i] = 0.0f;
  }
}

}  // namespace pg::cuda
