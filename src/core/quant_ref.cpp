// Reference dequantization and quantization of the GGML block formats.
//
// Everything here must be bit-exact with ggml: the dequantizers feed the f32ref golden logits and the
// quantizers must reproduce the bytes llama-quantize writes. ggml's reference code is compiled without
// FMA, so a*b+c is two roundings there; the pragmas below stop the compiler from fusing them here
// (GCC fuses by default even in ISO mode once -mfma is on). Keep every expression in the same
// association order as the algorithm it reproduces: reordering changes the last bit. Never build this
// file with -ffast-math, or with clang's -ffp-contract=fast (which ignores the pragma); the
// llama-quantize bit-exactness test (tests/core/test_quant_llama.cpp) fails if that happens.
#if defined(__FAST_MATH__)
#error "quant_ref.cpp must be compiled with IEEE float semantics (no -ffast-math)"
#endif
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define PG_QUANT_AVX2 1
#endif

namespace pg {

namespace {
// The IQ4_NL levels, usable in constant expressions (the tables below are built at compile time).
constexpr int8_t kLevelValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
}  // namespace

const int8_t kIQ4NLValues[16] = {kLevelValues[0],  kLevelValues[1],  kLevelValues[2],  kLevelValues[3],
                                 kLevelValues[4],  kLevelValues[5],  kLevelValues[6],  kLevelValues[7],
                                 kLevelValues[8],  kLevelValues[9],  kLevelValues[10], kLevelValues[11],
                                 kLevelValues[12], kLevelValues[13], kLevelValues[14], kLevelValues[15]};

namespace {

// ggml treats a group whose largest magnitude is below this as all-zero.
constexpr float kGroupMaxEps = 1e-15f;

// ggml's float -> nearest int: adding 1.5·2^23 leaves round-half-even(v) in the low 22 mantissa bits.
// Identical to rint() for |v| < 2^22, and, unlike a cast, defined for any input.
inline int nearest_int(float v) {
  const float t = v + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &t, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

// Truncating float -> int that is defined for every input (NaN gives 0), for the "(int8_t)(x + 8.5f)"
// conversions of the legacy quantizers; inputs there are always in range for finite data.
inline int trunc_int(float v) {
  if (!(v > -1e9f && v < 1e9f)) return 0;
  return static_cast<int>(v);
}

inline void check_blocks(DType t, int64_t n, const char* what) {
  const auto& tr = traits(t);
  PG_CHECK(n >= 0 && n % tr.block_size == 0, std::string(what) + ": " + std::to_string(n) +
                                                 " elements is not a multiple of the " + std::string(tr.name) + " block size " +
                                                 std::to_string(tr.block_size));
}

// ---- dequantization ---------------------------------------------------------------------------

void dequant_q4_0(const BlockQ4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0x0F) - 8) * d;
      y[j + QK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequant_q4_1(const BlockQ4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
    const float d = fp16_to_f32(b[i].d), m = fp16_to_f32(b[i].m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0x0F) * d + m;
      y[j + QK4_1 / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void dequant_q5_0(const BlockQ5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
    const float d = fp16_to_f32(b[i].d);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1) << 4;
      const int h1 = static_cast<int>((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>(((b[i].qs[j] & 0x0F) | h0) - 16) * d;
      y[j + QK5_0 / 2] = static_cast<float>(((b[i].qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void dequant_q5_1(const BlockQ5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
    const float d = fp16_to_f32(b[i].d), m = fp16_to_f32(b[i].m);
    const uint32_t qh = load_u32(b[i].qh);
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int h0 = static_cast<int>((qh >> j) & 1) << 4;
      const int h1 = static_cast<int>((qh >> (j + 16)) & 1) << 4;
      y[j] = static_cast<float>((b[i].qs[j] & 0x0F) | h0) * d + m;
      y[j + QK5_1 / 2] = static_cast<float>((b[i].qs[j] >> 4) | h1) * d + m;
    }
  }
}

void dequant_q8_0(const BlockQ8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequant_q8_1(const BlockQ8_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK8_1) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < QK8_1; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void dequant_q8_k(const BlockQ8_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK_K)
    for (int j = 0; j < QK_K; ++j) y[j] = b[i].d * static_cast<float>(b[i].qs[j]);
}

void dequant_q2_k(const BlockQ2_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(b[i].d), dmin = fp16_to_f32(b[i].dmin);
    int is = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = b[i].qs + 32 * half;
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {  // two 16-element groups, each with its own scale
          const uint8_t sc = b[i].scales[is++];
          const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<float>((q[16 * part + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// The 16 signed 6-bit sub-block scales of a Q3_K block: low nibbles in bytes 0..7 (sub-blocks 0..7 in
// the low halves, 8..15 in the high halves), the 2 high bits of sub-block j in byte 8 + j%4 at bit 2·(j/4).
// Done four scales at a time on 32-bit words.
inline void q3k_scales(const uint8_t* s, int8_t* out) {
  uint32_t a0, a1, hi;
  std::memcpy(&a0, s, 4);
  std::memcpy(&a1, s + 4, 4);
  std::memcpy(&hi, s + 8, 4);
  constexpr uint32_t lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
  const uint32_t w[4] = {
      (a0 & lo4) | ((hi & lo2) << 4),
      (a1 & lo4) | (((hi >> 2) & lo2) << 4),
      ((a0 >> 4) & lo4) | (((hi >> 4) & lo2) << 4),
      ((a1 >> 4) & lo4) | (((hi >> 6) & lo2) << 4),
  };
  for (int k = 0; k < 4; ++k)
    for (int b = 0; b < 4; ++b) out[4 * k + b] = static_cast<int8_t>(static_cast<int>((w[k] >> (8 * b)) & 0xff) - 32);
}

void dequant_q3_k(const BlockQ3_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(b[i].d);
    int8_t sc[16];
    q3k_scales(b[i].scales, sc);
    int is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = b[i].qs + 32 * half;
      for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d * static_cast<float>(sc[is++]);
          for (int l = 16 * part; l < 16 * part + 16; ++l) {
            const int v = ((q[l] >> shift) & 3) - ((b[i].hmask[l] & m) ? 0 : 4);
            *y++ = dl * static_cast<float>(v);
          }
        }
      }
    }
  }
}

// Scale and min of sub-block j (0..7) of a Q4_K / Q5_K block, both 6-bit.
inline void k4_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void dequant_q4_k(const BlockQ4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(b[i].d), dmin = fp16_to_f32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < QK_K / 64; ++j, q += 32) {
      uint8_t sc, mn;
      k4_scale_min(2 * j, b[i].scales, &sc, &mn);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
      k4_scale_min(2 * j + 1, b[i].scales, &sc, &mn);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void dequant_q5_k(const BlockQ5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(b[i].d), dmin = fp16_to_f32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < QK_K / 64; ++j, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, mn;
      k4_scale_min(2 * j, b[i].scales, &sc, &mn);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(mn);
      k4_scale_min(2 * j + 1, b[i].scales, &sc, &mn);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(mn);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

void dequant_q6_k(const BlockQ6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void dequant_iq4_nl(const BlockIQ4_NL* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_NL) {
    const float d = fp16_to_f32(b[i].d);
    for (int j = 0; j < QK4_NL / 2; ++j) {
      y[j] = d * static_cast<float>(kIQ4NLValues[b[i].qs[j] & 0xF]);
      y[j + QK4_NL / 2] = d * static_cast<float>(kIQ4NLValues[b[i].qs[j] >> 4]);
    }
  }
}

void dequant_iq4_xs(const BlockIQ4_XS* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_f32(b[i].d);
    const uint8_t* qs = b[i].qs;
    for (int ib = 0; ib < QK_K / 32; ++ib, y += 32, qs += 16) {
      const int ls = ((b[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((b[i].scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * static_cast<float>(kIQ4NLValues[qs[j] & 0xF]);
        y[j + 16] = dl * static_cast<float>(kIQ4NLValues[qs[j] >> 4]);
      }
    }
  }
}

// ---- legacy 32-element quantizers (ggml's reference versions) ----------------------------------

// Signed value of largest magnitude (first one wins on ties) and that magnitude.
inline void signed_absmax(const float* x, int n, float* max, float* amax) {
  float mx = 0.f, ax = 0.f;
  for (int j = 0; j < n; ++j) {
    const float a = std::fabs(x[j]);
    if (ax < a) {
      ax = a;
      mx = x[j];
    }
  }
  *max = mx;
  *amax = ax;
}

void quant_q4_0(const float* x, BlockQ4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
    float max, amax;
    signed_absmax(x, QK4_0, &max, &amax);
    const float d = max / -8;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      // The "+ 8.5, truncate" form is ggml's rounding (ties up); reproduce it, not round().
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(trunc_int(x[j] * id + 8.5f))));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(trunc_int(x[j + QK4_0 / 2] * id + 8.5f))));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

inline void minmax(const float* x, int n, float* mn, float* mx) {
  float lo = FLT_MAX, hi = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    if (x[j] < lo) lo = x[j];
    if (x[j] > hi) hi = x[j];
  }
  *mn = lo;
  *mx = hi;
}

void quant_q4_1(const float* x, BlockQ4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_1) {
    float mn, mx;
    minmax(x, QK4_1, &mn, &mx);
    const float d = (mx - mn) / 15;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(mn);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(trunc_int((x[j] - mn) * id + 0.5f))));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(trunc_int((x[j + QK4_1 / 2] - mn) * id + 0.5f))));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quant_q5_0(const float* x, BlockQ5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK5_0) {
    float max, amax;
    signed_absmax(x, QK5_0, &max, &amax);
    const float d = max / -16;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int q0 = std::min(31, static_cast<int>(static_cast<int8_t>(trunc_int(x[j] * id + 16.5f))));
      const int q1 = std::min(31, static_cast<int>(static_cast<int8_t>(trunc_int(x[j + QK5_0 / 2] * id + 16.5f))));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK5_0 / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

void quant_q5_1(const float* x, BlockQ5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK5_1) {
    float mn, mx;
    minmax(x, QK5_1, &mn, &mx);
    const float d = (mx - mn) / 31;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_1 / 2; ++j) {
      // ggml converts straight to uint8 here (no clamp); the value is at most 31.5 for finite data.
      const int q0 = static_cast<uint8_t>(trunc_int((x[j] - mn) * id + 0.5f));
      const int q1 = static_cast<uint8_t>(trunc_int((x[j + QK5_1 / 2] - mn) * id + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
      qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK5_1 / 2);
    }
    std::memcpy(y[i].qh, &qh, 4);
  }
}

// Q8_0 / Q8_1 for model files: d = amax/127, scale by 1/d, round half away from zero.
// Same result as roundf() (the library call is slow); v - trunc(v) is exact.
inline int8_t round_away_i8(float v) {
  const float t = std::trunc(v);
  const float up = std::fabs(v - t) >= 0.5f ? 1.0f : 0.0f;  // a select, not a branch: ties are common
  const float r = t + std::copysign(up, v);
  return static_cast<int8_t>(r >= 127.f ? 127 : r <= -128.f ? -128 : r == r ? static_cast<int>(r) : 0);
}

void quant_q8_0_ref(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0.f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = round_away_i8(x[j] * id);
  }
}

void quant_q8_1_ref(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_1) {
    float amax = 0.f;
    for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) {
      y[i].qs[j] = round_away_i8(x[j] * id);
      sum += y[i].qs[j];
    }
    y[i].s = f32_to_fp16(static_cast<float>(sum) * d);
  }
}

// ---- activation converters (ggml-cpu's from_float for Q8_0 / Q8_1 / Q8_K) --------------------

// Round half to even, saturated to int8 (NaN gives -128, as the AVX2 pack does).
inline int8_t round_even_i8(float v) {
  const float r = std::nearbyint(v);
  if (!(r == r)) return -128;
  return static_cast<int8_t>(r >= 127.f ? 127 : r <= -128.f ? -128 : static_cast<int>(r));
}

// Activations: d = amax/127 but the multiplier is 127/amax (not 1/d), then round half to even.
void quant_q8_0_act_scalar(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0.f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = round_even_i8(x[j] * id);
  }
}

void quant_q8_1_act_scalar(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_1) {
    float amax = 0.f;
    for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.f ? 127.f / amax : 0.f;
    y[i].d = f32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) {
      y[i].qs[j] = round_even_i8(x[j] * id);
      sum += y[i].qs[j];
    }
    y[i].s = f32_to_fp16(d * static_cast<float>(sum));
  }
}

#if PG_QUANT_AVX2
// Rounds 32 floats times id to int8 with the current (nearest-even) rounding mode; returns the sum.
inline int q8_block_avx2(const float* x, float id, int8_t* out) {
  const __m256 mul = _mm256_set1_ps(id);
  __m256i i0 =
      _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x), mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i1 = _mm256_cvtps_epi32(
      _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8), mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i2 = _mm256_cvtps_epi32(
      _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 16), mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i i3 = _mm256_cvtps_epi32(
      _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 24), mul), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
  // packs work per 128-bit lane; the final permute restores element order.
  i0 = _mm256_packs_epi32(i0, i1);
  i2 = _mm256_packs_epi32(i2, i3);
  i0 = _mm256_packs_epi16(i0, i2);
  i0 = _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), i0);
  return _mm_cvtsi128_si32(s4);
}

inline float absmax32_avx2(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8)));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 16)));
  m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 24)));
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

void quant_q8_0_act(const float* x, BlockQ8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    const float amax = absmax32_avx2(x);
    y[i].d = f32_to_fp16(amax / 127.f);
    q8_block_avx2(x, amax != 0.f ? 127.f / amax : 0.f, y[i].qs);
  }
}

void quant_q8_1_act(const float* x, BlockQ8_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_1) {
    const float amax = absmax32_avx2(x);
    const float d = amax / 127.f;
    y[i].d = f32_to_fp16(d);
    const int sum = q8_block_avx2(x, amax != 0.f ? 127.f / amax : 0.f, y[i].qs);
    y[i].s = f32_to_fp16(d * static_cast<float>(sum));
  }
}
#else
void quant_q8_0_act(const float* x, BlockQ8_0* y, int64_t nb) { quant_q8_0_act_scalar(x, y, nb); }
void quant_q8_1_act(const float* x, BlockQ8_1* y, int64_t nb) { quant_q8_1_act_scalar(x, y, nb); }
#endif

// Q8_K (activations for the K-quants): scale from the signed extreme value, -127/max.
void quant_q8_k(const float* x, BlockQ8_K* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max = 0.f, amax = 0.f;
    for (int j = 0; j < QK_K; ++j) {
      const float a = std::fabs(x[j]);
      if (a > amax) {
        amax = a;
        max = x[j];
      }
    }
    if (amax == 0.f) {
      // ggml leaves bsums uninitialised here; zero is the only sensible value.
      std::memset(&y[i], 0, sizeof(BlockQ8_K));
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int g = 0; g < QK_K / 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += y[i].qs[16 * g + l];
      y[i].bsums[g] = static_cast<int16_t>(s);
    }
    y[i].d = 1 / iscale;
  }
}

// ---- K-quant scale searches (ggml's algorithms, same float operation order) -------------------

// Symmetric search with weights x² (ggml make_qx_quants, rmse_type 1, no importance weights).
// Writes L[i] = q + nmax with q in [-nmax, nmax-1]; returns the scale.
float search_sym_scale(int n, int nmax, const float* x, int8_t* L) {
  float max = 0.f, amax = 0.f;
  signed_absmax(x, n, &max, &amax);
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  float w[32], wx[32];  // n <= 32
  for (int i = 0; i < n; ++i) {
    w[i] = x[i] * x[i];
    wx[i] = w[i] * x[i];
  }
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.f, suml2 = 0.f;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float fl = static_cast<float>(l);
    sumlx += wx[i] * fl;
    suml2 += w[i] * fl * fl;
  }
  float scale = suml2 != 0.f ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  int8_t cand[32];
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0.f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      cand[i] = static_cast<int8_t>(l);
      const float fl = static_cast<float>(l);
      sumlx += wx[i] * fl;
      suml2 += w[i] * fl * fl;
    }
    if (suml2 > 0.f && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(cand[i] + nmax);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Symmetric search for Q3_K groups with coordinate-descent refinement (ggml make_q3_quants,
// do_rmse). Writes L[i] = q + nmax; returns the scale.
float search_q3_scale(int n, int nmax, const float* x, int8_t* L) {
  float max = 0.f, amax = 0.f;
  signed_absmax(x, n, &max, &amax);
  if (amax < kGroupMaxEps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  const float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0.f, suml2 = 0.f;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  for (int itry = 0; itry < 5; ++itry) {
    int n_changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      const float li = static_cast<float>(L[i]);
      float slx = sumlx - w * x[i] * li;
      if (slx > 0.f) {
        float sl2 = suml2 - w * li * li;
        const int new_l = std::clamp(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
        if (new_l != L[i]) {
          const float fl = static_cast<float>(new_l);
          slx += w * x[i] * fl;
          sl2 += w * fl * fl;
          if (sl2 > 0.f && slx * slx * suml2 > sumlx * sumlx * sl2) {
            L[i] = static_cast<int8_t>(new_l);
            sumlx = slx;
            suml2 = sl2;
            ++n_changed;
          }
        }
      }
    }
    if (!n_changed) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric (scale + min) search over nstep+1 trial scales, keeping the best weighted error
// (ggml make_qkx2_quants). L[i] in [0, nmax]; *the_min receives the (positive) offset.
float search_affine_scale(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, float rmin,
                          float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::memset(L, 0, static_cast<size_t>(n));
    *the_min = -min;
    return 0.f;
  }
  const float fnmax = static_cast<float>(nmax);
  float iscale = fnmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = use_mad ? std::fabs(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  uint8_t Laux[32];  // n <= 32
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + fnmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        std::memcpy(L, Laux, static_cast<size_t>(n));
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// ---- the same searches on 8 groups at once ------------------------------------------------------
//
// The K-quant quantizers run a scale search per 16- or 32-element group; the groups of a block are
// independent, so with AVX2 each of 8 lanes runs one group's search with exactly the scalar operation
// sequence (same operations, same order, per-lane selects instead of branches). Results are bit-identical
// to the scalar functions above, which remain the portable path.

#if PG_QUANT_AVX2
namespace x8 {

inline __m256 ld(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 bcast(float v) { return _mm256_set1_ps(v); }
inline __m256 sel(__m256 if_false, __m256 if_true, __m256 mask) { return _mm256_blendv_ps(if_false, if_true, mask); }
inline __m256i seli(__m256i if_false, __m256i if_true, __m256 mask) {
  return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(if_false), _mm256_castsi256_ps(if_true), mask));
}
inline __m256 fabs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
// nearest_int() on 8 lanes: the same 1.5·2^23 trick, so the same integers for any input.
inline __m256i nearest8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(_mm256_add_ps(v, _mm256_set1_ps(12582912.f)));
  return _mm256_sub_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x00400000));
}
inline __m256i clamp8(__m256i v, int lo, int hi) {
  return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_set1_epi32(lo)), _mm256_set1_epi32(hi));
}

// Transposes 8 groups of n floats (group j at src + n·j) to t[8·i + j].
inline void transpose(const float* src, int n, float* t) {
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < n; ++i) t[8 * i + j] = src[n * j + i];
}

// search_affine_scale for 8 groups; xt/wt transposed ([n][8]); Lt receives [n][8] levels.
void affine(int n, int nmax, const float* xt, const float* wt, float rmin, float rdelta, int nstep, bool use_mad, __m256i* Lt,
            __m256* scale_out, __m256* min_out) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 min = ld(xt), max = min;
  __m256 sum_w = ld(wt);
  __m256 sum_x = _mm256_mul_ps(sum_w, ld(xt));
  for (int i = 1; i < n; ++i) {
    const __m256 x = ld(xt + 8 * i), w = ld(wt + 8 * i);
    min = sel(min, x, _mm256_cmp_ps(x, min, _CMP_LT_OQ));
    max = sel(max, x, _mm256_cmp_ps(x, max, _CMP_GT_OQ));
    sum_w = _mm256_add_ps(sum_w, w);
    sum_x = _mm256_add_ps(sum_x, _mm256_mul_ps(w, x));
  }
  min = sel(min, zero, _mm256_cmp_ps(min, zero, _CMP_GT_OQ));
  const __m256 degenerate = _mm256_cmp_ps(max, min, _CMP_EQ_OQ);
  const __m256 min_degenerate = min;
  const float fnmax = static_cast<float>(nmax);
  __m256 iscale = _mm256_div_ps(bcast(fnmax), _mm256_sub_ps(max, min));
  __m256 scale = _mm256_div_ps(bcast(1.0f), iscale);
  __m256 best = zero;
  auto err = [&](__m256 sc, __m256 mn, __m256i l, __m256 x, __m256 w, __m256 acc) {
    __m256 diff = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(sc, _mm256_cvtepi32_ps(l)), mn), x);
    diff = use_mad ? fabs8(diff) : _mm256_mul_ps(diff, diff);
    return _mm256_add_ps(acc, _mm256_mul_ps(w, diff));
  };
  for (int i = 0; i < n; ++i) {
    const __m256 x = ld(xt + 8 * i);
    Lt[i] = clamp8(nearest8(_mm256_mul_ps(iscale, _mm256_sub_ps(x, min))), 0, nmax);
    best = err(scale, min, Lt[i], x, ld(wt + 8 * i), best);
  }
  __m256i Laux[32];  // n <= 32
  for (int is = 0; is <= nstep; ++is) {
    // (max - min) with the current min: an accepted trial moves min for the following ones.
    iscale = _mm256_div_ps(bcast(rmin + rdelta * static_cast<float>(is) + fnmax), _mm256_sub_ps(max, min));
    __m256 sum_l = zero, sum_l2 = zero, sum_xl = zero;
    for (int i = 0; i < n; ++i) {
      const __m256 x = ld(xt + 8 * i), w = ld(wt + 8 * i);
      Laux[i] = clamp8(nearest8(_mm256_mul_ps(iscale, _mm256_sub_ps(x, min))), 0, nmax);
      const __m256 fl = _mm256_cvtepi32_ps(Laux[i]);
      const __m256 wl = _mm256_mul_ps(w, fl);
      sum_l = _mm256_add_ps(sum_l, wl);
      sum_l2 = _mm256_add_ps(sum_l2, _mm256_mul_ps(wl, fl));
      sum_xl = _mm256_add_ps(sum_xl, _mm256_mul_ps(wl, x));
    }
    const __m256 D = _mm256_sub_ps(_mm256_mul_ps(sum_w, sum_l2), _mm256_mul_ps(sum_l, sum_l));
    const __m256 dpos = _mm256_cmp_ps(D, zero, _CMP_GT_OQ);
    if (_mm256_movemask_ps(dpos) == 0) continue;
    __m256 this_scale = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_w, sum_xl), _mm256_mul_ps(sum_x, sum_l)), D);
    __m256 this_min = _mm256_div_ps(_mm256_sub_ps(_mm256_mul_ps(sum_l2, sum_x), _mm256_mul_ps(sum_l, sum_xl)), D);
    const __m256 mpos = _mm256_cmp_ps(this_min, zero, _CMP_GT_OQ);
    this_min = sel(this_min, zero, mpos);
    this_scale = sel(this_scale, _mm256_div_ps(sum_xl, sum_l2), mpos);
    __m256 cur = zero;
    for (int i = 0; i < n; ++i) cur = err(this_scale, this_min, Laux[i], ld(xt + 8 * i), ld(wt + 8 * i), cur);
    const __m256 upd = _mm256_and_ps(dpos, _mm256_cmp_ps(cur, best, _CMP_LT_OQ));
    if (_mm256_movemask_ps(upd) == 0) continue;
    for (int i = 0; i < n; ++i) Lt[i] = seli(Lt[i], Laux[i], upd);
    best = sel(best, cur, upd);
    scale = sel(scale, this_scale, upd);
    min = sel(min, this_min, upd);
  }
  // Groups whose values are all equal (and <= 0) take the early exit: L = 0, scale 0, min unchanged.
  for (int i = 0; i < n; ++i) Lt[i] = seli(Lt[i], _mm256_setzero_si256(), degenerate);
  *scale_out = sel(scale, zero, degenerate);
  *min_out = _mm256_sub_ps(zero, sel(min, min_degenerate, degenerate));  // -min, as the scalar `-min`
}

// search_sym_scale for 8 groups; xt transposed ([n][8]); Lt receives [n][8] values L = q + nmax.
void sym(int n, int nmax, const float* xt, __m256i* Lt, __m256* scale_out) {
  const __m256 zero = _mm256_setzero_ps();
  __m256 max = zero, amax = zero;
  for (int i = 0; i < n; ++i) {
    const __m256 x = ld(xt + 8 * i), ax = fabs8(x);
    const __m256 gt = _mm256_cmp_ps(ax, amax, _CMP_GT_OQ);
    amax = sel(amax, ax, gt);
    max = sel(max, x, gt);
  }
  const __m256 tiny = _mm256_cmp_ps(amax, bcast(kGroupMaxEps), _CMP_LT_OQ);
  __m256 w[32], wx[32];  // n <= 32
  for (int i = 0; i < n; ++i) {
    const __m256 x = ld(xt + 8 * i);
    w[i] = _mm256_mul_ps(x, x);
    wx[i] = _mm256_mul_ps(w[i], x);
  }
  const __m256i bias = _mm256_set1_epi32(nmax);
  __m256 iscale = _mm256_div_ps(bcast(static_cast<float>(-nmax)), max);
  __m256 sumlx = zero, suml2 = zero;
  for (int i = 0; i < n; ++i) {
    const __m256i l = clamp8(nearest8(_mm256_mul_ps(iscale, ld(xt + 8 * i))), -nmax, nmax - 1);
    Lt[i] = _mm256_add_epi32(l, bias);
    const __m256 fl = _mm256_cvtepi32_ps(l);
    sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(wx[i], fl));
    suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], fl), fl));
  }
  __m256 scale = sel(_mm256_div_ps(sumlx, suml2), zero, _mm256_cmp_ps(suml2, zero, _CMP_EQ_OQ));
  __m256 best = _mm256_mul_ps(scale, sumlx);
  __m256i cand[32];
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = _mm256_div_ps(bcast(-(static_cast<float>(nmax) + 0.1f * static_cast<float>(is))), max);
    sumlx = suml2 = zero;
    for (int i = 0; i < n; ++i) {
      cand[i] = clamp8(nearest8(_mm256_mul_ps(iscale, ld(xt + 8 * i))), -nmax, nmax - 1);
      const __m256 fl = _mm256_cvtepi32_ps(cand[i]);
      sumlx = _mm256_add_ps(sumlx, _mm256_mul_ps(wx[i], fl));
      suml2 = _mm256_add_ps(suml2, _mm256_mul_ps(_mm256_mul_ps(w[i], fl), fl));
    }
    const __m256 upd = _mm256_and_ps(_mm256_cmp_ps(suml2, zero, _CMP_GT_OQ),
                                     _mm256_cmp_ps(_mm256_mul_ps(sumlx, sumlx), _mm256_mul_ps(best, suml2), _CMP_GT_OQ));
    if (_mm256_movemask_ps(upd) == 0) continue;
    for (int i = 0; i < n; ++i) Lt[i] = seli(Lt[i], _mm256_add_epi32(cand[i], bias), upd);
    const __m256 new_scale = _mm256_div_ps(sumlx, suml2);
    scale = sel(scale, new_scale, upd);
    best = sel(best, _mm256_mul_ps(new_scale, sumlx), upd);
  }
  for (int i = 0; i < n; ++i) Lt[i] = seli(Lt[i], _mm256_setzero_si256(), tiny);
  *scale_out = sel(scale, zero, tiny);
}

}  // namespace x8
#endif  // PG_QUANT_AVX2

// search_affine_scale over 8 consecutive groups of n (x and weights: group j at offset n·j); writes
// L[n·j + i], scales[j], mins[j].
void search_affine_scale_x8(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* scales, float* mins,
                            float rmin, float rdelta, int nstep, bool use_mad, bool simd) {
#if PG_QUANT_AVX2
  if (simd) {
    float xt[32 * 8], wt[32 * 8];  // [n][8]
    x8::transpose(x, n, xt);
    x8::transpose(weights, n, wt);
    __m256i Lt[32];
    __m256 sc, mn;
    x8::affine(n, nmax, xt, wt, rmin, rdelta, nstep, use_mad, Lt, &sc, &mn);
    _mm256_storeu_ps(scales, sc);
    _mm256_storeu_ps(mins, mn);
    for (int i = 0; i < n; ++i) {
      alignas(32) int32_t l[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(l), Lt[i]);
      for (int j = 0; j < 8; ++j) L[n * j + i] = static_cast<uint8_t>(l[j]);
    }
    return;
  }
#else
  (void)simd;
#endif
  for (int j = 0; j < 8; ++j)
    scales[j] = search_affine_scale(n, nmax, x + n * j, weights + n * j, L + n * j, &mins[j], rmin, rdelta, nstep, use_mad);
}

// search_sym_scale over 8 consecutive groups of n; writes L[n·j + i] and scales[j].
void search_sym_scale_x8(int n, int nmax, const float* x, int8_t* L, float* scales, bool simd) {
#if PG_QUANT_AVX2
  if (simd) {
    float xt[32 * 8];
    x8::transpose(x, n, xt);
    __m256i Lt[32];
    __m256 sc;
    x8::sym(n, nmax, xt, Lt, &sc);
    _mm256_storeu_ps(scales, sc);
    for (int i = 0; i < n; ++i) {
      alignas(32) int32_t l[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(l), Lt[i]);
      for (int j = 0; j < 8; ++j) L[n * j + i] = static_cast<int8_t>(l[j]);
    }
    return;
  }
#else
  (void)simd;
#endif
  for (int j = 0; j < 8; ++j) scales[j] = search_sym_scale(n, nmax, x + n * j, L + n * j);
}

// ---- K-quant block quantizers --------------------------------------------------------------------

// Packs 256 2-bit values: byte l of each 32-byte group holds elements l, l+32, l+64, l+96.
inline void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < QK_K; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

void quant_q2_k(const float* x, BlockQ2_K* y, int64_t nb, bool simd) {
  uint8_t L[QK_K];
  float mins[QK_K / 16], scales[QK_K / 16], weights[QK_K];
  const float q4scale = 15.f;
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    for (int l = 0; l < QK_K; ++l) weights[l] = std::fabs(x[l]);
    for (int h = 0; h < 2; ++h)  // 16 groups of 16, eight at a time
      search_affine_scale_x8(16, 3, x + 128 * h, weights + 128 * h, L + 128 * h, scales + 8 * h, mins + 8 * h, -0.5f, 0.1f, 15,
                             true, simd);
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0) {
      const float iscale = q4scale / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
      y[i].d = f32_to_fp16(max_scale / q4scale);
    } else {
      for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = 0;
      y[i].d = f32_to_fp16(0.f);
    }
    if (max_min > 0) {
      const float iscale = q4scale / max_min;
      for (int j = 0; j < QK_K / 16; ++j)
        y[i].scales[j] = static_cast<uint8_t>(y[i].scales[j] | (nearest_int(iscale * mins[j]) << 4));
      y[i].dmin = f32_to_fp16(max_min / q4scale);
    } else {
      y[i].dmin = f32_to_fp16(0.f);
    }
    // Re-quantize against the rounded scales actually stored.
    const float dd = fp16_to_f32(y[i].d), dm_all = fp16_to_f32(y[i].dmin);
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = dd * static_cast<float>(y[i].scales[j] & 0xF);
      if (d == 0.f) continue;
      const float dm = dm_all * static_cast<float>(y[i].scales[j] >> 4);
      for (int ii = 0; ii < 16; ++ii)
        L[16 * j + ii] = static_cast<uint8_t>(std::clamp(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
    }
    pack_2bit(L, y[i].qs);
  }
}

void quant_q3_k(const float* x, BlockQ3_K* y, int64_t nb) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, amax = 0;
    for (int j = 0; j < QK_K / 16; ++j) {
      scales[j] = search_q3_scale(16, 4, x + 16 * j, L + 16 * j);
      const float a = std::fabs(scales[j]);
      if (a > amax) {
        amax = a;
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, 12);
    if (max_scale != 0.f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < QK_K / 16; ++j) {
        const int l = std::clamp(static_cast<int>(static_cast<int8_t>(nearest_int(iscale * scales[j]))), -32, 31) + 32;
        if (j < 8)
          y[i].scales[j] = static_cast<uint8_t>(l & 0xF);
        else
          y[i].scales[j - 8] = static_cast<uint8_t>(y[i].scales[j - 8] | ((l & 0xF) << 4));
        y[i].scales[j % 4 + 8] = static_cast<uint8_t>(y[i].scales[j % 4 + 8] | ((l >> 4) << (2 * (j / 4))));
      }
      y[i].d = f32_to_fp16(1 / iscale);
    } else {
      y[i].d = f32_to_fp16(0.f);
    }
    int8_t sc[16];
    q3k_scales(y[i].scales, sc);
    const float dd = fp16_to_f32(y[i].d);
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = dd * static_cast<float>(sc[j]);
      if (d == 0.f) continue;
      for (int ii = 0; ii < 16; ++ii)
        L[16 * j + ii] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
    }
    // High bit of element j goes to hmask[j % 32], bit j / 32.
    std::memset(y[i].hmask, 0, QK_K / 8);
    uint8_t Lu[QK_K];
    for (int j = 0; j < QK_K; ++j) {
      int v = L[j];
      if (v > 3) {
        y[i].hmask[j % 32] = static_cast<uint8_t>(y[i].hmask[j % 32] | (1 << (j / 32)));
        v -= 4;
      }
      Lu[j] = static_cast<uint8_t>(v);
    }
    pack_2bit(Lu, y[i].qs);
  }
}

// Packs the 8 six-bit scales and mins of a Q4_K / Q5_K block into its 12 scale bytes.
inline void pack_k4_scales(const uint8_t* ls, const uint8_t* lm, uint8_t* s) {
  for (int j = 0; j < QK_K / 32; ++j) {
    if (j < 4) {
      s[j] = ls[j];
      s[j + 4] = lm[j];
    } else {
      s[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      s[j - 4] = static_cast<uint8_t>(s[j - 4] | ((ls[j] >> 4) << 6));
      s[j] = static_cast<uint8_t>(s[j] | ((lm[j] >> 4) << 6));
    }
  }
}

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): per-32 affine search, 6-bit scales and mins, then
// re-quantization against the stored scales. L receives values in [0, nmax].
void quant_k4_common(const float* x, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scale_bytes, uint8_t* L, int nmax, float rmin,
                     float rdelta, int nstep, bool simd) {
  float mins[QK_K / 32], scales[QK_K / 32], weights[QK_K];
  for (int j = 0; j < QK_K / 32; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[32 * j + l] = av_x + std::fabs(x[32 * j + l]);
  }
  search_affine_scale_x8(32, nmax, x, weights, L, scales, mins, rmin, rdelta, nstep, false, simd);
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < QK_K / 32; ++j) {
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  uint8_t ls[QK_K / 32], lm[QK_K / 32];
  for (int j = 0; j < QK_K / 32; ++j) {
    ls[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * scales[j])));
    lm[j] = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
  }
  pack_k4_scales(ls, lm, scale_bytes);
  *d_out = f32_to_fp16(max_scale / 63.f);
  *dmin_out = f32_to_fp16(max_min / 63.f);
  const float dd = fp16_to_f32(*d_out), dm_all = fp16_to_f32(*dmin_out);
  for (int j = 0; j < QK_K / 32; ++j) {
    uint8_t sc, m;
    k4_scale_min(j, scale_bytes, &sc, &m);
    const float d = dd * static_cast<float>(sc);
    if (d == 0.f) continue;
    const float dm = dm_all * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii)
      L[32 * j + ii] = static_cast<uint8_t>(std::clamp(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax));
  }
}

void quant_q4_k(const float* x, BlockQ4_K* y, int64_t nb, bool simd) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    quant_k4_common(x, &y[i].d, &y[i].dmin, y[i].scales, L, 15, -1.f, 0.1f, 20, simd);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < QK_K; j += 64, q += 32)
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
  }
}

void quant_q5_k(const float* x, BlockQ5_K* y, int64_t nb, bool simd) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    quant_k4_common(x, &y[i].d, &y[i].dmin, y[i].scales, L, 31, -0.5f, 0.1f, 15, simd);
    uint8_t* qh = y[i].qh;
    uint8_t* ql = y[i].qs;
    std::memset(qh, 0, QK_K / 8);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32, m1 = static_cast<uint8_t>(m1 << 2), m2 = static_cast<uint8_t>(m2 << 2)) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j], l2 = L[n + j + 32];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
    }
  }
}

void quant_q6_k(const float* x, BlockQ6_K* y, int64_t nb, bool simd) {
  int8_t L[QK_K];
  float scales[QK_K / 16];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    for (int h = 0; h < 2; ++h) search_sym_scale_x8(16, 32, x + 128 * h, L + 128 * h, scales + 8 * h, simd);
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ++ib) {
      const float a = std::fabs(scales[ib]);
      if (a > max_abs_scale) {
        max_abs_scale = a;
        max_scale = scales[ib];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = f32_to_fp16(1 / iscale);
    for (int ib = 0; ib < QK_K / 16; ++ib) y[i].scales[ib] = static_cast<int8_t>(std::min(127, nearest_int(iscale * scales[ib])));
    const float dd = fp16_to_f32(y[i].d);
    for (int j = 0; j < QK_K / 16; ++j) {
      const float d = dd * static_cast<float>(y[i].scales[j]);
      if (d == 0.f) continue;
      for (int ii = 0; ii < 16; ++ii)
        L[16 * j + ii] = static_cast<int8_t>(std::clamp(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int a = L[j + l], b = L[j + l + 32], c = L[j + l + 64], e = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((a & 0xF) | ((c & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((b & 0xF) | ((e & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6));
      }
    }
  }
}

// ---- IQ4_NL / IQ4_XS ----------------------------------------------------------------------------

// For each integer v in [-127, 113]: the index of the largest level <= v. The levels are integers, so
// for a float x in that range the largest level <= x is the one for floor(x).
struct LevelTables {
  uint8_t floor_idx[241];
  float value[16];
  constexpr LevelTables() : floor_idx(), value() {
    for (int v = -127; v <= 113; ++v) {
      int k = 0;
      while (k < 15 && kLevelValues[k + 1] <= v) ++k;
      floor_idx[v + 127] = static_cast<uint8_t>(k);
    }
    for (int k = 0; k < 16; ++k) value[k] = static_cast<float>(kLevelValues[k]);
  }
};
constexpr LevelTables kLevels;

// Index of the IQ4_NL level nearest to v, with ggml's tie rule (the lower level only when strictly
// closer). Equal to ggml's binary search for every input, but a table lookup and a branch-free choice:
// the scale searches call this hundreds of times per element and the search's branches mispredict.
inline int nearest_level(float v) {
  if (v <= kLevels.value[0]) return 0;
  if (v >= kLevels.value[15] || !(v == v)) return 15;  // NaN: where ggml's search ends up
  const int lo = kLevels.floor_idx[static_cast<int>(std::floor(v)) + 127];
  return lo + static_cast<int>(!(v - kLevels.value[lo] < kLevels.value[lo + 1] - v));
}

// Best scale of one 32-element group for the non-linear levels (ggml quantize_row_iq4_nl_impl, no
// importance weights: weights x²). ntry < 0 keeps the first guess; ntry > 0 also tries 2·ntry+1
// nearby scales. Writes the level indices of the first guess to Lb; returns the scale (0 for a zero group).
float iq4_group_scale(const float* xb, uint8_t* Lb, int ntry) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    const float ax = std::fabs(xb[j]);
    if (ax > amax) {
      amax = ax;
      max = xb[j];
    }
  }
  if (amax < kGroupMaxEps) return 0.f;
  const float v0 = static_cast<float>(kIQ4NLValues[0]);
  float d = ntry > 0 ? -max / v0 : max / v0;
  float id = 1 / d;
  float sumqx = 0, sumq2 = 0;
  for (int j = 0; j < 32; ++j) {
    const int l = nearest_level(id * xb[j]);
    Lb[j] = static_cast<uint8_t>(l);
    const float q = kLevels.value[l];
    const float w = xb[j] * xb[j];
    sumqx += w * q * xb[j];
    sumq2 += w * q * q;
  }
  d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
  float best = d * sumqx;
  for (int itry = -ntry; itry <= ntry; ++itry) {
    id = static_cast<float>(itry + kIQ4NLValues[0]) / max;
    sumqx = sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const float q = kLevels.value[nearest_level(id * xb[j])];
      const float w = xb[j] * xb[j];
      sumqx += w * q * xb[j];
      sumq2 += w * q * q;
    }
    if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
      d = sumqx / sumq2;
      best = d * sumqx;
    }
  }
  return d;
}

inline void pack_nibbles32(const uint8_t* L, uint8_t* q) {
  for (int j = 0; j < 16; ++j) q[j] = static_cast<uint8_t>(L[j] | (L[16 + j] << 4));
}

void quant_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t nb, int ntry) {
  uint8_t L[QK4_NL];
  for (int64_t i = 0; i < nb; ++i, x += QK4_NL) {
    float d = iq4_group_scale(x, L, ntry);
    if (d == 0.f && ntry <= 0) std::memset(L, 8, sizeof(L));  // zero group: level 8 (+1) is the one nearest 0
    y[i].d = f32_to_fp16(d);
    if (ntry > 0) {
      const float id = d != 0.f ? 1 / d : 0;
      for (int j = 0; j < QK4_NL; ++j) L[j] = static_cast<uint8_t>(nearest_level(id * x[j]));
    }
    pack_nibbles32(L, y[i].qs);
  }
}

void quant_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t nb) {
  uint8_t L[QK_K];
  float scales[QK_K / 32];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      scales[ib] = iq4_group_scale(x + 32 * ib, L + 32 * ib, 7);
      const float a = std::fabs(scales[ib]);
      if (a > amax_scale) {
        amax_scale = a;
        max_scale = scales[ib];
      }
    }
    y[i].scales_h = 0;
    std::memset(y[i].scales_l, 0, sizeof(y[i].scales_l));
    // The 6-bit group scales multiply d; levels are re-chosen against the unrounded d·l.
    const float d = -max_scale / 32;
    y[i].d = f32_to_fp16(d);
    const float id = d != 0.f ? 1 / d : 0.f;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
      int l = std::clamp(nearest_int(id * scales[ib]), -32, 31);
      const float dl = d * static_cast<float>(l);
      const float idl = dl != 0.f ? 1 / dl : 0.f;
      for (int j = 0; j < 32; ++j) L[32 * ib + j] = static_cast<uint8_t>(nearest_level(idl * x[32 * ib + j]));
      l += 32;
      y[i].scales_l[ib / 2] = static_cast<uint8_t>(y[i].scales_l[ib / 2] | ((l & 0xF) << (4 * (ib % 2))));
      y[i].scales_h = static_cast<uint16_t>(y[i].scales_h | ((l >> 4) << (2 * ib)));
    }
    for (int ib = 0; ib < QK_K / 32; ++ib) pack_nibbles32(L + 32 * ib, y[i].qs + 16 * ib);
  }
}

// ---- plain types --------------------------------------------------------------------------------

void f32_to_f16_row(const float* x, uint16_t* y, int64_t n, bool simd) {
  int64_t i = 0;
#if PG_QUANT_AVX2
  if (simd)
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#else
  (void)simd;
#endif
  for (; i < n; ++i) y[i] = f32_to_fp16(x[i]);
}

void quantize_impl(DType t, const float* src, void* dst, int64_t n, bool simd, bool weights) {
  const int64_t nb = n / traits(t).block_size;
  switch (t) {
    case DType::F32:
      if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16:
      f32_to_f16_row(src, static_cast<uint16_t*>(dst), n, simd);
      return;
    case DType::BF16: {
      auto* y = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q4_0:
      return quant_q4_0(src, static_cast<BlockQ4_0*>(dst), nb);
    case DType::Q4_1:
      return quant_q4_1(src, static_cast<BlockQ4_1*>(dst), nb);
    case DType::Q5_0:
      return quant_q5_0(src, static_cast<BlockQ5_0*>(dst), nb);
    case DType::Q5_1:
      return quant_q5_1(src, static_cast<BlockQ5_1*>(dst), nb);
    case DType::Q8_0:
      if (weights) return quant_q8_0_ref(src, static_cast<BlockQ8_0*>(dst), nb);
      if (simd) return quant_q8_0_act(src, static_cast<BlockQ8_0*>(dst), nb);
      return quant_q8_0_act_scalar(src, static_cast<BlockQ8_0*>(dst), nb);
    case DType::Q8_1:
      if (weights) return quant_q8_1_ref(src, static_cast<BlockQ8_1*>(dst), nb);
      if (simd) return quant_q8_1_act(src, static_cast<BlockQ8_1*>(dst), nb);
      return quant_q8_1_act_scalar(src, static_cast<BlockQ8_1*>(dst), nb);
    case DType::Q8_K:
      return quant_q8_k(src, static_cast<BlockQ8_K*>(dst), nb);
    case DType::Q2_K:
      return quant_q2_k(src, static_cast<BlockQ2_K*>(dst), nb, simd);
    case DType::Q3_K:
      return quant_q3_k(src, static_cast<BlockQ3_K*>(dst), nb);
    case DType::Q4_K:
      return quant_q4_k(src, static_cast<BlockQ4_K*>(dst), nb, simd);
    case DType::Q5_K:
      return quant_q5_k(src, static_cast<BlockQ5_K*>(dst), nb, simd);
    case DType::Q6_K:
      return quant_q6_k(src, static_cast<BlockQ6_K*>(dst), nb, simd);
    case DType::IQ4_NL:
      return quant_iq4_nl(src, static_cast<BlockIQ4_NL*>(dst), nb, weights ? 7 : -1);
    case DType::IQ4_XS:
      return quant_iq4_xs(src, static_cast<BlockIQ4_XS*>(dst), nb);
    default:
      break;
  }
  throw Error("cannot quantize to " + std::string(dtype_name(t)));
}

}  // namespace

bool can_quantize(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q8_1:
    case DType::Q8_K:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  PG_CHECK(can_quantize(t), "cannot quantize to " + std::string(dtype_name(t)));
  check_blocks(t, n, "quantize_row");
  quantize_impl(t, src, dst, n, /*simd=*/true, /*weights=*/false);
}

void quantize_row_scalar(DType t, const float* src, void* dst, int64_t n) {
  PG_CHECK(can_quantize(t), "cannot quantize to " + std::string(dtype_name(t)));
  check_blocks(t, n, "quantize_row_scalar");
  quantize_impl(t, src, dst, n, /*simd=*/false, /*weights=*/false);
}

void quantize_weights(DType t, const float* src, void* dst, int64_t n) {
  PG_CHECK(can_quantize(t), "cannot quantize weights to " + std::string(dtype_name(t)));
  check_blocks(t, n, "quantize_weights");
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(src[i]))
      throw Error("quantize_weights: element " + std::to_string(i) + " is not finite (" + std::to_string(src[i]) + ")");
  quantize_impl(t, src, dst, n, /*simd=*/true, /*weights=*/true);
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  check_blocks(t, n, "dequantize_row");
  const int64_t nb = n / traits(t).block_size;
  switch (t) {
    case DType::F32:
      if (n) std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if PG_QUANT_AVX2
      for (; i + 8 <= n; i += 8)  // exact conversion, identical to fp16_to_f32
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
#endif
      for (; i < n; ++i) dst[i] = fp16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::Q4_0:
      return dequant_q4_0(static_cast<const BlockQ4_0*>(src), dst, nb);
    case DType::Q4_1:
      return dequant_q4_1(static_cast<const BlockQ4_1*>(src), dst, nb);
    case DType::Q5_0:
      return dequant_q5_0(static_cast<const BlockQ5_0*>(src), dst, nb);
    case DType::Q5_1:
      return dequant_q5_1(static_cast<const BlockQ5_1*>(src), dst, nb);
    case DType::Q8_0:
      return dequant_q8_0(static_cast<const BlockQ8_0*>(src), dst, nb);
    case DType::Q8_1:
      return dequant_q8_1(static_cast<const BlockQ8_1*>(src), dst, nb);
    case DType::Q8_K:
      return dequant_q8_k(static_cast<const BlockQ8_K*>(src), dst, nb);
    case DType::Q2_K:
      return dequant_q2_k(static_cast<const BlockQ2_K*>(src), dst, nb);
    case DType::Q3_K:
      return dequant_q3_k(static_cast<const BlockQ3_K*>(src), dst, nb);
    case DType::Q4_K:
      return dequant_q4_k(static_cast<const BlockQ4_K*>(src), dst, nb);
    case DType::Q5_K:
      return dequant_q5_k(static_cast<const BlockQ5_K*>(src), dst, nb);
    case DType::Q6_K:
      return dequant_q6_k(static_cast<const BlockQ6_K*>(src), dst, nb);
    case DType::IQ4_NL:
      return dequant_iq4_nl(static_cast<const BlockIQ4_NL*>(src), dst, nb);
    case DType::IQ4_XS:
      return dequant_iq4_xs(static_cast<const BlockIQ4_XS*>(src), dst, nb);
    default:
      break;
  }
  throw Error("cannot dequantize " + std::string(dtype_name(t)));
}

}  // namespace pg
