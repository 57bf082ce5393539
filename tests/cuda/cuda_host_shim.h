// Host stand-ins for the CUDA intrinsics that backend/cuda/common.cuh's decoders use, so that the
// decoders compile with the host compiler and can be checked against core/quant_ref.cpp without a GPU
// (tests/cuda/test_cuda_decoders.cpp). Each has the device intrinsic's exact semantics for the inputs
// the decoders pass (IEEE round-to-nearest products and sums, byte permutes, fp16 conversion).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"

#define __device__
#ifndef __host__
#define __host__
#endif
#define __forceinline__ inline

// Vector types with CUDA's alignment (the decoders load through them). A file that already has the
// toolkit's host definitions (cuda_runtime_api.h: tests/cuda/cuda_thread_shim.h's users) keeps those.
#ifndef __VECTOR_TYPES_H__
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
struct alignas(8) uint2 {
  uint32_t x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) int4 {
  int32_t x, y, z, w;
};
struct alignas(8) int2 {
  int32_t x, y;
};
#endif

struct pg_host_half {
  uint16_t bits;
};
inline pg_host_half __ushort_as_half(unsigned short b) { return {b}; }
inline float __half2float(pg_host_half h) { return pg::fp16_to_f32(h.bits); }
inline float __uint_as_float(uint32_t u) { return pg::bits_to_f32(u); }
inline float __int_as_float(int32_t u) { return pg::bits_to_f32(static_cast<uint32_t>(u)); }

// volatile keeps the host compiler from contracting a product and a sum into one FMA.
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float __fsub_rn(float a, float b) {
  volatile float r = a - b;
  return r;
}

inline uint32_t __float_as_uint(float f) { return pg::f32_to_bits(f); }
inline float __fdiv_rn(float a, float b) {
  volatile float r = a / b;
  return r;
}
inline double __dadd_rn(double a, double b) {
  volatile double r = a + b;
  return r;
}
inline double __dmul_rn(double a, double b) {
  volatile double r = a * b;
  return r;
}
inline double __ddiv_rn(double a, double b) {
  volatile double r = a / b;
  return r;
}
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline float __double2float_rn(double a) { return static_cast<float>(a); }
inline int __float2int_rz(float a) { return static_cast<int>(a); }  // callers keep |a| < 1e9
inline int min(int a, int b) { return a < b ? a : b; }

// Byte k of the 8-byte value {y:x} for each selector nibble (mode bits ignored: the decoders use none).
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}

// For backend/cuda/quant_dot.cuh (tests/cuda/test_cuda_quant_dot.cpp): a read-only load is a plain load; the
// low word of {hi:lo} >> (shift mod 32); four signed byte products summed into c.
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
inline uint32_t __funnelshift_r(uint32_t lo, uint32_t hi, uint32_t shift) {
  return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (shift & 31));
}
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i)) * static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
  return c;
}

// Warp shuffles have no host meaning; declared so the header parses (never called on the host).
template <typename T>
T __shfl_xor_sync(unsigned, T v, int);
template <typename T>
T __shfl_sync(unsigned, T v, int);

// For backend/cuda/act_quant.cuh (tests/cuda/test_cuda_act_quant.cpp): round half to even under the
// default rounding mode, as the device's cvt.rni / cvt.rn.f16 (callers keep |a| within int range).
inline int __float2int_rn(float a) { return static_cast<int>(std::nearbyint(a)); }
inline pg_host_half __float2half_rn(float f) { return {pg::f32_to_fp16(f)}; }
