// Dot products of one weight row with one activation row already converted to vec_dot_type().
//
// Every quantized kernel sums integer products exactly inside a block (or a 256-element super-block)
// and only then scales by the float block factors, as ggml does; so the scalar and the AVX2 versions
// differ from ggml's (and from each other) only in the order of the float additions across blocks.
#include "core/quant_dot.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PG_DOT_AVX2 1
#endif

namespace pg {

namespace {

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if PG_DOT_AVX2
// The F16C conversion is exact, like fp16_to_f32, and avoids its branches in every block of every dot.
inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
#else
inline float h2f(uint16_t h) { return fp16_to_f32(h); }
#endif

// ---- scalar kernels ---------------------------------------------------------------------------

float dot_f32_scalar(int64_t n, const float* w, const float* x) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(w[i] * x[i]);
  return static_cast<float>(s);
}

float dot_f16_scalar(int64_t n, const uint16_t* w, const uint16_t* x) {
  double s = 0;  // products of two halves are exact in float
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(fp16_to_f32(w[i]) * fp16_to_f32(x[i]));
  return static_cast<float>(s);
}

float dot_bf16_scalar(int64_t n, const uint16_t* w, const uint16_t* x) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(bf16_to_f32(w[i]) * bf16_to_f32(x[i]));
  return static_cast<float>(s);
}

float dot_q4_0_scalar(int64_t nb, const BlockQ4_0* w, const BlockQ8_0* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) sumi += ((w[i].qs[j] & 0xF) - 8) * x[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
    s += static_cast<float>(sumi) * h2f(w[i].d) * h2f(x[i].d);
  }
  return s;
}

float dot_q4_1_scalar(int64_t nb, const BlockQ4_1* w, const BlockQ8_1* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j) sumi += (w[i].qs[j] & 0xF) * x[i].qs[j] + (w[i].qs[j] >> 4) * x[i].qs[j + 16];
    s += (h2f(w[i].d) * h2f(x[i].d)) * static_cast<float>(sumi) + h2f(w[i].m) * h2f(x[i].s);
  }
  return s;
}

float dot_q5_0_scalar(int64_t nb, const BlockQ5_0* w, const BlockQ8_0* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_u32(w[i].qh);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int v0 = ((w[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
      const int v1 = ((w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
      sumi += v0 * x[i].qs[j] + v1 * x[i].qs[j + 16];
    }
    s += (h2f(w[i].d) * h2f(x[i].d)) * static_cast<float>(sumi);
  }
  return s;
}

float dot_q5_1_scalar(int64_t nb, const BlockQ5_1* w, const BlockQ8_1* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint32_t qh = load_u32(w[i].qh);
    int sumi = 0;
    for (int j = 0; j < 16; ++j) {
      const int v0 = (w[i].qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int v1 = (w[i].qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      sumi += v0 * x[i].qs[j] + v1 * x[i].qs[j + 16];
    }
    s += (h2f(w[i].d) * h2f(x[i].d)) * static_cast<float>(sumi) + h2f(w[i].m) * h2f(x[i].s);
  }
  return s;
}

float dot_q8_0_scalar(int64_t nb, const BlockQ8_0* w, const BlockQ8_0* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += w[i].qs[j] * x[i].qs[j];
    s += static_cast<float>(sumi) * (h2f(w[i].d) * h2f(x[i].d));
  }
  return s;
}

float dot_iq4_nl_scalar(int64_t nb, const BlockIQ4_NL* w, const BlockQ8_0* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int sumi = 0;
    for (int j = 0; j < 16; ++j)
      sumi += x[i].qs[j] * kIQ4NLValues[w[i].qs[j] & 0xF] + x[i].qs[j + 16] * kIQ4NLValues[w[i].qs[j] >> 4];
    s += (h2f(x[i].d) * h2f(w[i].d)) * static_cast<float>(sumi);
  }
  return s;
}

// Q3_K's 16 signed 6-bit sub-block scales: low nibbles in bytes 0..7 (sub-blocks 0..7 in the low halves,
// 8..15 in the high halves), the 2 high bits of sub-block j in byte 8 + j%4 at bit 2·(j/4). Produces the
// unsigned 6-bit values (scale + 32), four per 32-bit word, little-endian: word k holds sub-blocks 4k..4k+3.
inline void q3k_scale_words(const uint8_t* s, uint32_t* w) {
  uint32_t a0, a1, hi;
  std::memcpy(&a0, s, 4);
  std::memcpy(&a1, s + 4, 4);
  std::memcpy(&hi, s + 8, 4);
  constexpr uint32_t lo4 = 0x0f0f0f0f, lo2 = 0x03030303;
  w[0] = (a0 & lo4) | ((hi & lo2) << 4);
  w[1] = (a1 & lo4) | (((hi >> 2) & lo2) << 4);
  w[2] = ((a0 >> 4) & lo4) | (((hi >> 4) & lo2) << 4);
  w[3] = ((a1 >> 4) & lo4) | (((hi >> 6) & lo2) << 4);
}

inline void q3k_scales(const uint8_t* s, int8_t* out) {
  uint32_t w[4];
  q3k_scale_words(s, w);
  for (int k = 0; k < 4; ++k)
    for (int b = 0; b < 4; ++b) out[4 * k + b] = static_cast<int8_t>(static_cast<int>((w[k] >> (8 * b)) & 0xff) - 32);
}

// Q4_K / Q5_K: the 8 six-bit scales and mins.
inline void k4_scales(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = q[j] & 63;
    mn[j] = q[j + 4] & 63;
  }
  for (int j = 4; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    mn[j] = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

float dot_q2_k_scalar(int64_t nb, const BlockQ2_K* w, const BlockQ8_K* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* sc = w[i].scales;
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += x[i].bsums[j] * (sc[j] >> 4);
    int isum = 0;
    const int8_t* q8 = x[i].qs;
    // 128 elements per 32 bytes: element 32·j + l of a half sits in bits 2j..2j+1 of byte l.
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q2 = w[i].qs + 32 * half;
      for (int j = 0; j < 4; ++j, q8 += 32) {
        int s0 = 0, s1 = 0;
        for (int l = 0; l < 16; ++l) s0 += q8[l] * ((q2[l] >> (2 * j)) & 3);
        for (int l = 16; l < 32; ++l) s1 += q8[l] * ((q2[l] >> (2 * j)) & 3);
        const int g = 8 * half + 2 * j;
        isum += (sc[g] & 0xF) * s0 + (sc[g + 1] & 0xF) * s1;
      }
    }
    const float dall = x[i].d * h2f(w[i].d), dmin = x[i].d * h2f(w[i].dmin);
    s += dall * static_cast<float>(isum) - dmin * static_cast<float>(summs);
  }
  return s;
}

float dot_q3_k_scalar(int64_t nb, const BlockQ3_K* w, const BlockQ8_K* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int8_t sc[16];
    q3k_scales(w[i].scales, sc);
    int isum = 0;
    const int8_t* q8 = x[i].qs;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q3 = w[i].qs + 32 * half;
      for (int j = 0; j < 4; ++j, q8 += 32) {
        const int bit = 4 * half + j;  // high bit of these 32 elements: bit `bit` of hmask[l]
        int s0 = 0, s1 = 0;
        for (int l = 0; l < 32; ++l) {
          const int v = ((q3[l] >> (2 * j)) & 3) - (((w[i].hmask[l] >> bit) & 1) ? 0 : 4);
          (l < 16 ? s0 : s1) += v * q8[l];
        }
        isum += sc[8 * half + 2 * j] * s0 + sc[8 * half + 2 * j + 1] * s1;
      }
    }
    s += (h2f(w[i].d) * x[i].d) * static_cast<float>(isum);
  }
  return s;
}

float dot_q4_k_scalar(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t sc[8], mn[8];
    k4_scales(w[i].scales, sc, mn);
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += x[i].bsums[j] * mn[j / 2];
    int isum = 0;
    for (int j = 0; j < 4; ++j) {
      int lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l) {
        lo += (w[i].qs[32 * j + l] & 0xF) * x[i].qs[64 * j + l];
        hi += (w[i].qs[32 * j + l] >> 4) * x[i].qs[64 * j + 32 + l];
      }
      isum += sc[2 * j] * lo + sc[2 * j + 1] * hi;
    }
    const float d = h2f(w[i].d) * x[i].d, dmin = h2f(w[i].dmin) * x[i].d;
    s += d * static_cast<float>(isum) - dmin * static_cast<float>(summs);
  }
  return s;
}

float dot_q5_k_scalar(int64_t nb, const BlockQ5_K* w, const BlockQ8_K* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t sc[8], mn[8];
    k4_scales(w[i].scales, sc, mn);
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += x[i].bsums[j] * mn[j / 2];
    int isum = 0;
    for (int j = 0; j < 4; ++j) {
      int lo = 0, hi = 0;
      for (int l = 0; l < 32; ++l) {
        const int vl = (w[i].qs[32 * j + l] & 0xF) | (((w[i].qh[l] >> (2 * j)) & 1) << 4);
        const int vh = (w[i].qs[32 * j + l] >> 4) | (((w[i].qh[l] >> (2 * j + 1)) & 1) << 4);
        lo += vl * x[i].qs[64 * j + l];
        hi += vh * x[i].qs[64 * j + 32 + l];
      }
      isum += sc[2 * j] * lo + sc[2 * j + 1] * hi;
    }
    const float d = h2f(w[i].d) * x[i].d, dmin = h2f(w[i].dmin) * x[i].d;
    s += d * static_cast<float>(isum) - dmin * static_cast<float>(summs);
  }
  return s;
}

float dot_q6_k_scalar(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w[i].ql + 64 * half;
      const uint8_t* qh = w[i].qh + 32 * half;
      const int8_t* q8 = x[i].qs + 128 * half;
      const int8_t* sc = w[i].scales + 8 * half;
      int g[8] = {};  // per 16-element group sums
      for (int l = 0; l < 32; ++l) {
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        const int is = l / 16;
        g[is + 0] += q1 * q8[l];
        g[is + 2] += q2 * q8[l + 32];
        g[is + 4] += q3 * q8[l + 64];
        g[is + 6] += q4 * q8[l + 96];
      }
      for (int k = 0; k < 8; ++k) isum += sc[k] * g[k];
    }
    s += (h2f(w[i].d) * x[i].d) * static_cast<float>(isum);
  }
  return s;
}

float dot_iq4_xs_scalar(int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* x) {
  float s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((w[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((w[i].scales_h >> (2 * ib)) & 3) << 4);
      const uint8_t* qs = w[i].qs + 16 * ib;
      const int8_t* q8 = x[i].qs + 32 * ib;
      int g = 0;
      for (int j = 0; j < 16; ++j) g += q8[j] * kIQ4NLValues[qs[j] & 0xF] + q8[j + 16] * kIQ4NLValues[qs[j] >> 4];
      isum += (ls - 32) * g;
    }
    s += (h2f(w[i].d) * x[i].d) * static_cast<float>(isum);
  }
  return s;
}

// Prepared activation rows of the 32-element types carry, after their blocks (at x_side_offset), the
// block scales d (and for Q8_1 the sums s) widened to F32: the same values h2f gives, read without a
// conversion per weight row.
constexpr size_t x_side_offset(int64_t nb, size_t block_bytes) { return (static_cast<size_t>(nb) * block_bytes + 31) / 32 * 32; }

#if PG_DOT_AVX2
// ---- AVX2 kernels -------------------------------------------------------------------------------

inline float hsum_ps(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline int hsum_epi32(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(1, 0, 3, 2)));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

inline __m256i loadu256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m128i loadu128(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// 16 packed bytes -> 32 nibbles: low nibbles in bytes 0..15, high nibbles in 16..31 (the order of the
// 32-element legacy blocks).
inline __m256i nibbles32(const uint8_t* p) {
  const __m128i raw = loadu128(p);
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
}

// Byte i = 0xFF when bit i of bits is set.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i shuf =
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
}

// Pairwise sums of signed a × signed b as 8 int32. b must not hold -128 (activations never do).
inline __m256i dot_i8(__m256i a, __m256i b) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
  return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

// Pairwise sums of unsigned a × signed b as 8 int32.
inline __m256i dot_u8(__m256i a, __m256i b) { return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)); }

// Scale vector for the 32 bytes of one maddubs: its 16 int16 pair sums belong to two 16-element groups;
// lanes 0..7 get scales[2p], lanes 8..15 get scales[2p+1] (scales: 16 int8).
inline __m256i group_scales(__m128i scales, int p) {
  const __m128i idx = _mm_or_si128(_mm_set_epi64x(0x0101010101010101LL, 0), _mm_set1_epi8(static_cast<char>(2 * p)));
  return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, idx));
}

float dot_f32_avx2(int64_t n, const float* w, const float* x) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a0);
  double s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += static_cast<double>(w[i] * x[i]);
  return static_cast<float>(s);
}

inline __m256 load_f16x8(const uint16_t* p) { return _mm256_cvtph_ps(loadu128(p)); }
inline __m256 load_bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(loadu128(p)), 16));
}

template <__m256 (*Load)(const uint16_t*), float (*ToF32)(uint16_t)>
float dot_half_avx2(int64_t n, const uint16_t* w, const uint16_t* x) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(Load(w + i), Load(x + i), a0);
    a1 = _mm256_fmadd_ps(Load(w + i + 8), Load(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(Load(w + i + 16), Load(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(Load(w + i + 24), Load(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(Load(w + i), Load(x + i), a0);
  double s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += static_cast<double>(ToF32(w[i]) * ToF32(x[i]));
  return static_cast<float>(s);
}

float dot_q4_0_avx2(int64_t nb, const BlockQ4_0* w, const BlockQ8_0* x) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i off = _mm256_set1_epi8(8);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = _mm256_sub_epi8(nibbles32(w[i].qs), off);
    const __m256 p = _mm256_cvtepi32_ps(dot_i8(q, loadu256(x[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
  }
  return hsum_ps(acc);
}

float dot_q4_1_avx2(int64_t nb, const BlockQ4_1* w, const BlockQ8_1* x) {
  __m256 acc = _mm256_setzero_ps();
  float summ = 0;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256 p = _mm256_cvtepi32_ps(dot_u8(nibbles32(w[i].qs), loadu256(x[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
    summ += h2f(w[i].m) * h2f(x[i].s);
  }
  return hsum_ps(acc) + summ;
}

float dot_q5_0_avx2(int64_t nb, const BlockQ5_0* w, const BlockQ8_0* x) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i b4 = _mm256_set1_epi8(0x10), off = _mm256_set1_epi8(16);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i hi = _mm256_and_si256(bits_to_bytes(load_u32(w[i].qh)), b4);
    const __m256i q = _mm256_sub_epi8(_mm256_or_si256(nibbles32(w[i].qs), hi), off);
    const __m256 p = _mm256_cvtepi32_ps(dot_i8(q, loadu256(x[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
  }
  return hsum_ps(acc);
}

float dot_q5_1_avx2(int64_t nb, const BlockQ5_1* w, const BlockQ8_1* x) {
  __m256 acc = _mm256_setzero_ps();
  float summ = 0;
  const __m256i b4 = _mm256_set1_epi8(0x10);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i hi = _mm256_and_si256(bits_to_bytes(load_u32(w[i].qh)), b4);
    const __m256i q = _mm256_or_si256(nibbles32(w[i].qs), hi);
    const __m256 p = _mm256_cvtepi32_ps(dot_u8(q, loadu256(x[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
    summ += h2f(w[i].m) * h2f(x[i].s);
  }
  return hsum_ps(acc) + summ;
}

float dot_q8_0_avx2(int64_t nb, const BlockQ8_0* w, const BlockQ8_0* x) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256 p = _mm256_cvtepi32_ps(dot_i8(loadu256(w[i].qs), loadu256(x[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
  }
  return hsum_ps(acc);
}

inline __m256i iq4_table() { return _mm256_broadcastsi128_si256(loadu128(kIQ4NLValues)); }

float dot_iq4_nl_avx2(int64_t nb, const BlockIQ4_NL* w, const BlockQ8_0* x) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i table = iq4_table();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = _mm256_shuffle_epi8(table, nibbles32(w[i].qs));
    const __m256 p = _mm256_cvtepi32_ps(dot_i8(q, loadu256(x[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * h2f(x[i].d)), p, acc);
  }
  return hsum_ps(acc);
}

// Σ bsums[g] · mins[g/2] for the 8 mins of a Q4_K / Q5_K block.
inline int k4_min_sum(const uint8_t* mn, const int16_t* bsums) {
  const __m128i m8 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn)));
  const __m256i m16 = _mm256_set_m128i(_mm_unpackhi_epi16(m8, m8), _mm_unpacklo_epi16(m8, m8));
  return hsum_epi32(_mm256_madd_epi16(loadu256(bsums), m16));
}

float dot_q2_k_avx2(int64_t nb, const BlockQ2_K* w, const BlockQ8_K* x) {
  __m256 acc = _mm256_setzero_ps();
  float summ = 0;
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i sc8 = loadu128(w[i].scales);
    const __m128i scl = _mm_and_si128(sc8, _mm_set1_epi8(0x0F));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F)));
    const int summs = hsum_epi32(_mm256_madd_epi16(loadu256(x[i].bsums), mins));
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q = loadu256(w[i].qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i p = _mm256_maddubs_epi16(v, loadu256(x[i].qs + 128 * half + 32 * j));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, group_scales(scl, 4 * half + j)));
      }
    }
    const float dall = x[i].d * h2f(w[i].d), dmin = x[i].d * h2f(w[i].dmin);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(isum), acc);
    summ += dmin * static_cast<float>(summs);
  }
  return hsum_ps(acc) - summ;
}

float dot_q3_k_avx2(int64_t nb, const BlockQ3_K* w, const BlockQ8_K* x) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t words[4];
    q3k_scale_words(w[i].scales, words);
    const __m128i sc8 = _mm_sub_epi8(loadu128(words), _mm_set1_epi8(32));
    // Values are used as unsigned q+4 in 0..7; the 4·Σ scale·bsum term removes the offset.
    const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), loadu256(x[i].bsums));
    const __m256i hb = loadu256(w[i].hmask);
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q = loadu256(w[i].qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const int t = 4 * half + j;
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i h = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, t), one), 2);
        const __m256i p = _mm256_maddubs_epi16(_mm256_or_si256(lo, h), loadu256(x[i].qs + 32 * t));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, group_scales(sc8, t)));
      }
    }
    isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 2));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * x[i].d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum_ps(acc);
}

float dot_q4_k_avx2(int64_t nb, const BlockQ4_K* w, const BlockQ8_K* x) {
  __m256 acc = _mm256_setzero_ps();
  float summ = 0;
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t sc[8], mn[8];
    k4_scales(w[i].scales, sc, mn);
    const int summs = k4_min_sum(mn, x[i].bsums);
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = loadu256(w[i].qs + 32 * j);
      const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i pl = _mm256_maddubs_epi16(lo, loadu256(x[i].qs + 64 * j));
      const __m256i ph = _mm256_maddubs_epi16(hi, loadu256(x[i].qs + 64 * j + 32));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pl, _mm256_set1_epi16(sc[2 * j])));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(ph, _mm256_set1_epi16(sc[2 * j + 1])));
    }
    const float d = h2f(w[i].d) * x[i].d, dmin = h2f(w[i].dmin) * x[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    summ += dmin * static_cast<float>(summs);
  }
  return hsum_ps(acc) - summ;
}

float dot_q5_k_avx2(int64_t nb, const BlockQ5_K* w, const BlockQ8_K* x) {
  __m256 acc = _mm256_setzero_ps();
  float summ = 0;
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i) {
    uint8_t sc[8], mn[8];
    k4_scales(w[i].scales, sc, mn);
    const int summs = k4_min_sum(mn, x[i].bsums);
    const __m256i hb = loadu256(w[i].qh);
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = loadu256(w[i].qs + 32 * j);
      const __m256i hl = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4);
      const __m256i hh = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hl);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hh);
      const __m256i pl = _mm256_maddubs_epi16(lo, loadu256(x[i].qs + 64 * j));
      const __m256i ph = _mm256_maddubs_epi16(hi, loadu256(x[i].qs + 64 * j + 32));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pl, _mm256_set1_epi16(sc[2 * j])));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(ph, _mm256_set1_epi16(sc[2 * j + 1])));
    }
    const float d = h2f(w[i].d) * x[i].d, dmin = h2f(w[i].dmin) * x[i].d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
    summ += dmin * static_cast<float>(summs);
  }
  return hsum_ps(acc) - summ;
}

float dot_q6_k_avx2(int64_t nb, const BlockQ6_K* w, const BlockQ8_K* x) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i sc8 = loadu128(w[i].scales);
    // Values are used as unsigned q+32 in 0..63; the 32·Σ scale·bsum term removes the offset.
    const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8), loadu256(x[i].bsums));
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i l0 = loadu256(w[i].ql + 64 * half), l1 = loadu256(w[i].ql + 64 * half + 32);
      const __m256i qh = loadu256(w[i].qh + 32 * half);
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4)),
      };
      for (int k = 0; k < 4; ++k) {
        const __m256i p = _mm256_maddubs_epi16(q[k], loadu256(x[i].qs + 128 * half + 32 * k));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, group_scales(sc8, 4 * half + k)));
      }
    }
    isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(corr, 5));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * x[i].d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum_ps(acc);
}

float dot_iq4_xs_avx2(int64_t nb, const BlockIQ4_XS* w, const BlockQ8_K* x) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i table = iq4_table();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i isum = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((w[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((w[i].scales_h >> (2 * ib)) & 3) << 4);
      const __m256i q = _mm256_shuffle_epi8(table, nibbles32(w[i].qs + 16 * ib));
      const __m256i y = loadu256(x[i].qs + 32 * ib);
      const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(static_cast<int16_t>(ls - 32))));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(w[i].d) * x[i].d), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum_ps(acc);
}

// ---- AVX2 tile kernels: one weight row × R activation rows ------------------------------------------
//
// Each mirrors the vec_dot kernel of its type above: the weight block is decoded once, and every
// activation row keeps its own accumulators, fed the same values in the same order, so each result is
// bit-identical to vec_dot for that pair. Sharing the decode (and the scale unpacking, and keeping the
// row's bytes in registers) is what makes prefill faster; the per-row work is unchanged. They replaced
// vec_dot per pair in the matmul because (pg_cpu_gemm_bench: one thread, in = 2048, 64 activation rows)
// they run 2.1x faster on Q4_K/Q5_K, 1.75x on Q6_K, 1.9x on IQ4_XS, 2.9x on Q3_K, 1.5x on Q2_K, 1.8-2.2x on
// the 32-element types (with the F32 scales of the prepared rows) and, through tile_float2, 1.9x on F16.

// The 32 weights of a legacy block as bytes, and how they multiply an activation block.
struct DecQ4_0 {
  using W = BlockQ4_0;
  using X = BlockQ8_0;
  static constexpr bool kSigned = true, kMin = false;
  static __m256i q(const W& b) { return _mm256_sub_epi8(nibbles32(b.qs), _mm256_set1_epi8(8)); }
};
struct DecQ4_1 {
  using W = BlockQ4_1;
  using X = BlockQ8_1;
  static constexpr bool kSigned = false, kMin = true;
  static __m256i q(const W& b) { return nibbles32(b.qs); }
};
struct DecQ5_0 {
  using W = BlockQ5_0;
  using X = BlockQ8_0;
  static constexpr bool kSigned = true, kMin = false;
  static __m256i q(const W& b) {
    const __m256i hi = _mm256_and_si256(bits_to_bytes(load_u32(b.qh)), _mm256_set1_epi8(0x10));
    return _mm256_sub_epi8(_mm256_or_si256(nibbles32(b.qs), hi), _mm256_set1_epi8(16));
  }
};
struct DecQ5_1 {
  using W = BlockQ5_1;
  using X = BlockQ8_1;
  static constexpr bool kSigned = false, kMin = true;
  static __m256i q(const W& b) {
    return _mm256_or_si256(nibbles32(b.qs), _mm256_and_si256(bits_to_bytes(load_u32(b.qh)), _mm256_set1_epi8(0x10)));
  }
};
struct DecQ8_0 {
  using W = BlockQ8_0;
  using X = BlockQ8_0;
  static constexpr bool kSigned = true, kMin = false;
  static __m256i q(const W& b) { return loadu256(b.qs); }
};
struct DecIQ4_NL {
  using W = BlockIQ4_NL;
  using X = BlockQ8_0;
  static constexpr bool kSigned = true, kMin = false;
  static __m256i q(const W& b) { return _mm256_shuffle_epi8(iq4_table(), nibbles32(b.qs)); }
};

template <class D, int R>
void tile_legacy(int64_t nb, const void* wv, const void* const* xv, float* out) {
  const auto* w = static_cast<const typename D::W*>(wv);
  const typename D::X* x[R];
  const float* xd[R];  // (nb) F32 block scales of row r
  const float* xs[R];  // (nb) F32 block sums of row r (Q8_1)
  const size_t side = x_side_offset(nb, sizeof(typename D::X));
  for (int r = 0; r < R; ++r) {
    x[r] = static_cast<const typename D::X*>(xv[r]);
    xd[r] = reinterpret_cast<const float*>(static_cast<const uint8_t*>(xv[r]) + side);
    xs[r] = xd[r] + nb;
  }
  __m256 acc[R];
  float summ[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    summ[r] = 0;
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i q = D::q(w[i]);
    const __m256i qa = D::kSigned ? _mm256_sign_epi8(q, q) : q;  // |q| for the signed form of dot_i8
    const float wd = h2f(w[i].d);
    const __m256 wdv = _mm256_set1_ps(wd);
    for (int r = 0; r < R; ++r) {
      const __m256i y = loadu256(x[r][i].qs);
      const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(qa, D::kSigned ? _mm256_sign_epi8(y, q) : y), ones);
      acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(wdv, _mm256_broadcast_ss(xd[r] + i)), _mm256_cvtepi32_ps(p), acc[r]);
      if constexpr (D::kMin) summ[r] += h2f(w[i].m) * xs[r][i];
    }
  }
  for (int r = 0; r < R; ++r) out[r] = D::kMin ? hsum_ps(acc[r]) + summ[r] : hsum_ps(acc[r]);
}

// ---- AVX-512 VNNI tiles for the signed 32-element types (Q8_0, Q4_0, Q5_0, IQ4_NL) ----------------
//
// Built for x86-64-v3 like the rest, these few functions carry their own target and run only where the
// CPU reports AVX-512 VNNI (gemm_rows checks once). A zmm holds one 32-byte weight block twice and the
// blocks of two activation rows, so one vpdpbusd does the integer work of two (weight, activation) pairs
// and each pair keeps its own 8-lane float accumulator in one half of a zmm. That is what keeps every
// result bit-identical to vec_dot: lane k of a half receives, block after block, the exact integer sum
// of bytes 4k..4k+3 (what maddubs + madd give), converted, times the same float h2f(w.d)·x.d, fused-added
// in the same block order; the final sum of the 8 lanes is hsum_ps's tree (see hsum_halves8).
// vpdpbusd multiplies unsigned by signed bytes, so the activations (never -128) are shifted to x + 128
// and 128·Σq per 4-byte group is taken off again; both are exact in int32.
// The tiles are RW weight rows × 2P activation rows; the register budget (32 zmm: RW·P accumulators,
// P activation pairs and their P scale vectors) allows 4 × 8.
#if defined(__GNUC__)  // GCC and Clang: target attributes and __builtin_cpu_supports
#define PG_VNNI 1
#define PG_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))
// GCC 12's AVX-512 headers build results on _mm512_undefined_*() (a self-initialised variable), which
// -Wuninitialized reports wherever those intrinsics are inlined; nothing here reads an undefined value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC's flow-sensitive variant; clang has no such warning (and -Werror rejects the name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

bool cpu_has_vnni() {
  __builtin_cpu_init();  // callable from static initialisers (g_use_vnni), before libgcc's own constructor
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                         __builtin_cpu_supports("avx512vnni");
  return ok;
}

// The 16 half sums of 8 accumulators in one pass: out[2v + h] = the sum of the 8 lanes of half h of v[v]
// in hsum_ps's order, ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) (float addition is commutative, so a+b and
// b+a agree in every bit), for 21 shuffles and adds instead of 6 per accumulator and a scalar extraction.
// Step 1 adds 128-bit chunk pairs (lanes l, l+4: r_k = l_k + l_{k+4}) of two accumulators into one
// vector, step 2 adds r0+r2 and r1+r3 of two such, step 3 adds those two sums; lane 4c + m of the result
// is then out[4m + c], a 4×4 transpose that one permute undoes.
PG_VNNI_TARGET inline void hsum_halves8(const __m512* v, float* out) {
  __m512 u[4];
  for (int k = 0; k < 4; ++k)
    u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 x = _mm512_add_ps(_mm512_shuffle_ps(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)), _mm512_shuffle_ps(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(w, x, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(w, x, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i tr = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(tr, f));
}

// hsum_halves8 over N accumulators: out[2v + h] for v < N (N ≤ 8 pads with zeros).
template <int N>
PG_VNNI_TARGET inline void hsum_halves_n(const __m512* v, float* out) {
  for (int g = 0; g < N; g += 8) {
    if (N - g >= 8) {
      hsum_halves8(v + g, out + 2 * g);
      continue;
    }
    __m512 pad[8];
    for (int k = 0; k < 8; ++k) pad[k] = g + k < N ? v[g + k] : _mm512_setzero_ps();
    float tmp[16];
    hsum_halves8(pad, tmp);
    for (int k = 0; k < 2 * (N - g); ++k) out[2 * g + k] = tmp[k];
  }
}

// out[a·2P + b] = vec_dot(w row a, x row b) for a < RW, b < 2P. wv: RW weight rows of nb blocks; xv: 2P
// prepared activation rows (blocks, then F32 scales at x_side_offset).
template <class D, int RW, int P>
PG_VNNI_TARGET void tile_vnni(int64_t nb, const void* const* wv, const void* const* xv, float* out) {
  static_assert(!D::kMin && D::kSigned, "the VNNI tiles cover the signed types without a min");
  const typename D::W* w[RW];
  const typename D::X* x[2 * P];
  const float* xd[2 * P];  // (nb) F32 block scales of activation row b
  const size_t side = x_side_offset(nb, sizeof(typename D::X));
  for (int a = 0; a < RW; ++a) w[a] = static_cast<const typename D::W*>(wv[a]);
  for (int b = 0; b < 2 * P; ++b) {
    x[b] = static_cast<const typename D::X*>(xv[b]);
    xd[b] = reinterpret_cast<const float*>(static_cast<const uint8_t*>(xv[b]) + side);
  }
  __m512 acc[RW][P];  // halves: (a, 2p), (a, 2p + 1)
  for (int a = 0; a < RW; ++a)
    for (int p = 0; p < P; ++p) acc[a][p] = _mm512_setzero_ps();
  const __m512i c80 = _mm512_set1_epi8(static_cast<char>(0x80)), zero = _mm512_setzero_si512();
  for (int64_t i = 0; i < nb; ++i) {
    __m512i xu[P];  // activation rows 2p (low half) and 2p+1 (high half) of block i, + 128 as unsigned bytes
    __m512 xs[P];   // their F32 block scales, each over its half
    for (int p = 0; p < P; ++p) {
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(x[2 * p][i].qs)), loadu256(x[2 * p + 1][i].qs), 1);
      xu[p] = _mm512_xor_si512(v, c80);
      xs[p] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_broadcast_ss(xd[2 * p] + i)), _mm256_broadcast_ss(xd[2 * p + 1] + i), 1);
    }
    for (int a = 0; a < RW; ++a) {
      const __m512i q = _mm512_broadcast_i64x4(D::q(w[a][i]));
      const __m512i neg = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c80, q));  // -128·Σq per 4-byte group
      const __m512 wd = _mm512_set1_ps(h2f(w[a][i].d));
      for (int p = 0; p < P; ++p) {
        const __m512i s = _mm512_dpbusd_epi32(neg, xu[p], q);  // Σ x·q per 4-byte group, both rows
        acc[a][p] = _mm512_fmadd_ps(_mm512_mul_ps(wd, xs[p]), _mm512_cvtepi32_ps(s), acc[a][p]);
      }
    }
  }
  // Accumulator a·P + p, half h is out[2(a·P + p) + h] = out[a·2P + 2p + h].
  hsum_halves_n<RW * P>(&acc[0][0], out);
}

// One activation row (decode): the zmm halves hold two weight rows instead, against the row's block
// broadcast to both. out[a] = vec_dot(w row a, x) for a < 2·RP.
template <class D, int RP>
PG_VNNI_TARGET void tile_vnni_1(int64_t nb, const void* const* wv, const void* xv, float* out) {
  const typename D::W* w[2 * RP];
  for (int a = 0; a < 2 * RP; ++a) w[a] = static_cast<const typename D::W*>(wv[a]);
  const auto* x = static_cast<const typename D::X*>(xv);
  const float* xd = reinterpret_cast<const float*>(static_cast<const uint8_t*>(xv) + x_side_offset(nb, sizeof(typename D::X)));
  __m512 acc[RP];
  for (int p = 0; p < RP; ++p) acc[p] = _mm512_setzero_ps();
  const __m512i c80 = _mm512_set1_epi8(static_cast<char>(0x80)), zero = _mm512_setzero_si512();
  for (int64_t i = 0; i < nb; ++i) {
    const __m512i xu = _mm512_xor_si512(_mm512_broadcast_i64x4(loadu256(x[i].qs)), c80);  // x + 128, both halves
    const __m512 xs = _mm512_set1_ps(xd[i]);
    for (int p = 0; p < RP; ++p) {
      const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(D::q(w[2 * p][i])), D::q(w[2 * p + 1][i]), 1);
      const __m512i neg = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c80, q));
      const __m512 wd = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(h2f(w[2 * p][i].d))),
                                           _mm256_set1_ps(h2f(w[2 * p + 1][i].d)), 1);
      const __m512i s = _mm512_dpbusd_epi32(neg, xu, q);
      acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(wd, xs), _mm512_cvtepi32_ps(s), acc[p]);
    }
  }
  hsum_halves_n<RP>(acc, out);
}

constexpr int kVnniW = 4, kVnniP = 4;  // weight rows × activation-row pairs of the largest tile
constexpr int kVnni1P = 8;             // weight-row pairs of the one-row tile
using VnniFn = void (*)(int64_t nb, const void* const* w, const void* const* x, float* out);

template <class D>
struct Vnni {
  static constexpr VnniFn kFn[kVnniP] = {tile_vnni<D, kVnniW, 1>, tile_vnni<D, kVnniW, 2>, tile_vnni<D, kVnniW, 3>,
                                         tile_vnni<D, kVnniW, 4>};
  // gemm_rows for weight type D::W: tiles of 4 weight rows × up to 8 activation rows; a partial tile
  // repeats its last weight (activation) row and drops the repeated results.
  static void run(int64_t n, const uint8_t* wp, size_t w_stride, int64_t n_w, const void* const* x, int64_t n_x, float* y,
                  int64_t y_stride) {
    const int64_t nb = n / 32;
    if (n_x == 1) {
      const void* w1[2 * kVnni1P];
      float o1[2 * kVnni1P];
      for (int64_t i = 0; i < n_w; i += 2 * kVnni1P) {
        const int rw = static_cast<int>(std::min<int64_t>(2 * kVnni1P, n_w - i));
        for (int a = 0; a < 2 * kVnni1P; ++a) w1[a] = wp + static_cast<size_t>(i + std::min(a, rw - 1)) * w_stride;
        tile_vnni_1<D, kVnni1P>(nb, w1, x[0], o1);
        for (int a = 0; a < rw; ++a) y[i + a] = o1[a];
      }
      return;
    }
    const void* wr[kVnniW];
    const void* xr[2 * kVnniP];
    float out[kVnniW * 2 * kVnniP];
    for (int64_t j = 0; j < n_x; j += 2 * kVnniP) {
      const int rx = static_cast<int>(std::min<int64_t>(2 * kVnniP, n_x - j));
      const int p = (rx + 1) / 2;
      for (int b = 0; b < 2 * p; ++b) xr[b] = x[j + std::min(b, rx - 1)];
      const VnniFn fn = kFn[p - 1];
      for (int64_t i = 0; i < n_w; i += kVnniW) {
        const int rw = static_cast<int>(std::min<int64_t>(kVnniW, n_w - i));
        for (int a = 0; a < kVnniW; ++a) wr[a] = wp + static_cast<size_t>(i + std::min(a, rw - 1)) * w_stride;
        fn(nb, wr, xr, out);
        for (int a = 0; a < rw; ++a)
          for (int b = 0; b < rx; ++b) y[(j + b) * y_stride + i + a] = out[a * 2 * p + b];
      }
    }
  }
};
#pragma GCC diagnostic pop
#endif
// Q4_K / Q5_K scales and mins without a scalar loop: the 8 six-bit scales as int16 in both 128-bit
// halves of *sc (for k4_scale's shuffles) and the 8 mins, each twice, as the 16 int16 of *m16 (for the
// bsums madd). Same values as k4_scales; four word operations instead of sixteen byte ones.
inline void k4_scale_vectors(const uint8_t* q, __m256i* sc, __m256i* m16) {
  uint32_t a[3];
  std::memcpy(a, q, 12);
  const uint32_t sc_lo = a[0] & 0x3f3f3f3fu, mn_lo = a[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (a[2] & 0x0f0f0f0fu) | ((a[0] >> 2) & 0x30303030u);
  const uint32_t mn_hi = ((a[2] >> 4) & 0x0f0f0f0fu) | ((a[1] >> 2) & 0x30303030u);
  const __m128i v =
      _mm_set_epi32(static_cast<int>(mn_hi), static_cast<int>(mn_lo), static_cast<int>(sc_hi), static_cast<int>(sc_lo));
  *sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(v));
  const __m128i mn = _mm_unpackhi_epi64(v, v);
  *m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
}

// Scale k (0..7) of k4_scale_vectors' *sc broadcast to all 16 int16 lanes.
inline __m256i k4_scale(__m256i sc, int k) {
  const __m256i idx = _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * k));
  return _mm256_shuffle_epi8(sc, idx);
}

#if PG_DOT_AVX2 && PG_VNNI
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)  // GCC's flow-sensitive variant; clang has no such warning (and -Werror rejects the name)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// Q4_K on the VNNI path: a zmm holds one 32-byte chunk of nibbles twice and the matching activation
// bytes of two rows; maddubs gives vec_dot's int16 pair sums and vpdpwssd multiplies them by the
// sub-block scale and adds pairs into the int32 lanes, the same integers madd + add give (all exact), so
// the float steps — one fused add per super-block with wd·x.d, the min term summed per pair in scalar —
// and the result are tile_q4_k's. Tiles of RW weight rows × 2P activation rows (16 int32 and 8 float
// accumulators at 2 × 8).
template <int RW, int P>
PG_VNNI_TARGET void tile_vnni_q4_k(int64_t nb, const void* const* wv, const void* const* xv, float* out) {
  const BlockQ4_K* w[RW];
  const BlockQ8_K* x[2 * P];
  for (int a = 0; a < RW; ++a) w[a] = static_cast<const BlockQ4_K*>(wv[a]);
  for (int b = 0; b < 2 * P; ++b) x[b] = static_cast<const BlockQ8_K*>(xv[b]);
  __m512 acc[RW][P];  // halves: (a, 2p), (a, 2p + 1)
  float summ[RW][2 * P];
  for (int a = 0; a < RW; ++a) {
    for (int p = 0; p < P; ++p) acc[a][p] = _mm512_setzero_ps();
    for (int b = 0; b < 2 * P; ++b) summ[a][b] = 0;
  }
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i) {
    __m256i scv[RW], m16[RW];
    for (int a = 0; a < RW; ++a) k4_scale_vectors(w[a][i].scales, &scv[a], &m16[a]);
    __m512i isum[RW][P];
    for (int a = 0; a < RW; ++a)
      for (int p = 0; p < P; ++p) isum[a][p] = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      __m512i xl[P], xh[P];  // activation bytes 64j.. and 64j+32.. of rows 2p, 2p+1
      for (int p = 0; p < P; ++p) {
        xl[p] = _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(x[2 * p][i].qs + 64 * j)), loadu256(x[2 * p + 1][i].qs + 64 * j), 1);
        xh[p] = _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(x[2 * p][i].qs + 64 * j + 32)),
                                   loadu256(x[2 * p + 1][i].qs + 64 * j + 32), 1);
      }
      for (int a = 0; a < RW; ++a) {
        const __m512i q = _mm512_broadcast_i64x4(loadu256(w[a][i].qs + 32 * j));
        const __m512i lo = _mm512_and_si512(q, m4), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
        const __m512i sl = _mm512_broadcast_i64x4(k4_scale(scv[a], 2 * j)), sh = _mm512_broadcast_i64x4(k4_scale(scv[a], 2 * j + 1));
        for (int p = 0; p < P; ++p) {
          isum[a][p] = _mm512_dpwssd_epi32(isum[a][p], _mm512_maddubs_epi16(lo, xl[p]), sl);
          isum[a][p] = _mm512_dpwssd_epi32(isum[a][p], _mm512_maddubs_epi16(hi, xh[p]), sh);
        }
      }
    }
    for (int a = 0; a < RW; ++a) {
      const float wd = h2f(w[a][i].d), wm = h2f(w[a][i].dmin);
      for (int p = 0; p < P; ++p) {
        const __m512 s = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(wd * x[2 * p][i].d)),
                                            _mm256_set1_ps(wd * x[2 * p + 1][i].d), 1);
        acc[a][p] = _mm512_fmadd_ps(s, _mm512_cvtepi32_ps(isum[a][p]), acc[a][p]);
      }
      for (int b = 0; b < 2 * P; ++b) {
        const int summs = hsum_epi32(_mm256_madd_epi16(loadu256(x[b][i].bsums), m16[a]));
        summ[a][b] += (wm * x[b][i].d) * static_cast<float>(summs);
      }
    }
  }
  hsum_halves_n<RW * P>(&acc[0][0], out);
  for (int a = 0; a < RW; ++a)
    for (int b = 0; b < 2 * P; ++b) out[a * 2 * P + b] -= summ[a][b];
}

// Q6_K on the VNNI path, the same way as Q4_K: maddubs on the 6-bit values (vec_dot's int16 pair sums),
// vpdpwssd by the 16-element group scales, then tile_q6_k's bsums correction and float steps per half.
template <int RW, int P>
PG_VNNI_TARGET void tile_vnni_q6_k(int64_t nb, const void* const* wv, const void* const* xv, float* out) {
  const BlockQ6_K* w[RW];
  const BlockQ8_K* x[2 * P];
  for (int a = 0; a < RW; ++a) w[a] = static_cast<const BlockQ6_K*>(wv[a]);
  for (int b = 0; b < 2 * P; ++b) x[b] = static_cast<const BlockQ8_K*>(xv[b]);
  __m512 acc[RW][P];  // halves: (a, 2p), (a, 2p + 1)
  for (int a = 0; a < RW; ++a)
    for (int p = 0; p < P; ++p) acc[a][p] = _mm512_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i) {
    __m512i isum[RW][P];
    for (int a = 0; a < RW; ++a)
      for (int p = 0; p < P; ++p) isum[a][p] = _mm512_setzero_si512();
    for (int half = 0; half < 2; ++half) {
      for (int k = 0; k < 4; ++k) {
        __m512i xq[P];  // activation bytes 128·half + 32k.. of rows 2p, 2p+1
        for (int p = 0; p < P; ++p)
          xq[p] = _mm512_inserti64x4(_mm512_castsi256_si512(loadu256(x[2 * p][i].qs + 128 * half + 32 * k)),
                                     loadu256(x[2 * p + 1][i].qs + 128 * half + 32 * k), 1);
        for (int a = 0; a < RW; ++a) {
          const __m256i l = loadu256(w[a][i].ql + 64 * half + 32 * (k & 1)), qh = loadu256(w[a][i].qh + 32 * half);
          const __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l, k >= 2 ? 4 : 0), m4),
                                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m3), 4));
          const __m512i qz = _mm512_broadcast_i64x4(q);
          const __m512i gs = _mm512_broadcast_i64x4(group_scales(loadu128(w[a][i].scales), 4 * half + k));
          for (int p = 0; p < P; ++p) isum[a][p] = _mm512_dpwssd_epi32(isum[a][p], _mm512_maddubs_epi16(qz, xq[p]), gs);
        }
      }
    }
    for (int a = 0; a < RW; ++a) {
      const __m256i sc16 = _mm256_cvtepi8_epi16(loadu128(w[a][i].scales));
      const float wd = h2f(w[a][i].d);
      for (int p = 0; p < P; ++p) {
        const __m512i corr = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_madd_epi16(sc16, loadu256(x[2 * p][i].bsums))),
                                                _mm256_madd_epi16(sc16, loadu256(x[2 * p + 1][i].bsums)), 1);
        const __m512i s = _mm512_sub_epi32(isum[a][p], _mm512_slli_epi32(corr, 5));
        const __m512 sv = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(wd * x[2 * p][i].d)),
                                             _mm256_set1_ps(wd * x[2 * p + 1][i].d), 1);
        acc[a][p] = _mm512_fmadd_ps(sv, _mm512_cvtepi32_ps(s), acc[a][p]);
      }
    }
  }
  hsum_halves_n<RW * P>(&acc[0][0], out);
}

template <int RW, int P>
struct TQ4K {
  static void run(int64_t nb, const void* const* w, const void* const* x, float* out) { tile_vnni_q4_k<RW, P>(nb, w, x, out); }
};
template <int RW, int P>
struct TQ6K {
  static void run(int64_t nb, const void* const* w, const void* const* x, float* out) { tile_vnni_q6_k<RW, P>(nb, w, x, out); }
};

constexpr int kVnniKW = 2;  // weight rows of the K-quant tiles
template <template <int, int> class T>
struct VnniK {
  static constexpr VnniFn kFn[kVnniP] = {T<kVnniKW, 1>::run, T<kVnniKW, 2>::run, T<kVnniKW, 3>::run, T<kVnniKW, 4>::run};
  // Two or more activation rows (one row keeps the AVX2 kernel); partial tiles as in Vnni::run.
  static void run(int64_t n, const uint8_t* wp, size_t w_stride, int64_t n_w, const void* const* x, int64_t n_x, float* y,
                  int64_t y_stride) {
    const int64_t nb = n / 256;
    const void* wr[kVnniKW];
    const void* xr[2 * kVnniP];
    float out[kVnniKW * 2 * kVnniP];
    for (int64_t j = 0; j < n_x; j += 2 * kVnniP) {
      const int rx = static_cast<int>(std::min<int64_t>(2 * kVnniP, n_x - j));
      const int p = (rx + 1) / 2;
      for (int b = 0; b < 2 * p; ++b) xr[b] = x[j + std::min(b, rx - 1)];
      const VnniFn fn = kFn[p - 1];
      for (int64_t i = 0; i < n_w; i += kVnniKW) {
        const int rw = static_cast<int>(std::min<int64_t>(kVnniKW, n_w - i));
        for (int a = 0; a < kVnniKW; ++a) wr[a] = wp + static_cast<size_t>(i + std::min(a, rw - 1)) * w_stride;
        fn(nb, wr, xr, out);
        for (int a = 0; a < rw; ++a)
          for (int b = 0; b < rx; ++b) y[(j + b) * y_stride + i + a] = out[a * 2 * p + b];
      }
    }
  }
};
#pragma GCC diagnostic pop
#endif

template <int R>
void tile_q4_k(int64_t nb, const void* wv, const void* const* xv, float* out) {
  const auto* w = static_cast<const BlockQ4_K*>(wv);
  const BlockQ8_K* x[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const BlockQ8_K*>(xv[r]);
  __m256 acc[R];
  float summ[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    summ[r] = 0;
  }
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i) {
    __m256i scv, m16;
    k4_scale_vectors(w[i].scales, &scv, &m16);
    __m256i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = loadu256(w[i].qs + 32 * j);
      const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      const __m256i sl = k4_scale(scv, 2 * j), sh = k4_scale(scv, 2 * j + 1);
      for (int r = 0; r < R; ++r) {
        const __m256i pl = _mm256_maddubs_epi16(lo, loadu256(x[r][i].qs + 64 * j));
        const __m256i ph = _mm256_maddubs_epi16(hi, loadu256(x[r][i].qs + 64 * j + 32));
        isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh)));
      }
    }
    const float wd = h2f(w[i].d), wm = h2f(w[i].dmin);
    for (int r = 0; r < R; ++r) {
      const int summs = hsum_epi32(_mm256_madd_epi16(loadu256(x[r][i].bsums), m16));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * x[r][i].d), _mm256_cvtepi32_ps(isum[r]), acc[r]);
      summ[r] += (wm * x[r][i].d) * static_cast<float>(summs);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_ps(acc[r]) - summ[r];
}

template <int R>
void tile_q5_k(int64_t nb, const void* wv, const void* const* xv, float* out) {
  const auto* w = static_cast<const BlockQ5_K*>(wv);
  const BlockQ8_K* x[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const BlockQ8_K*>(xv[r]);
  __m256 acc[R];
  float summ[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    summ[r] = 0;
  }
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i) {
    __m256i scv, m16;
    k4_scale_vectors(w[i].scales, &scv, &m16);
    const __m256i hb = loadu256(w[i].qh);
    __m256i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      const __m256i q = loadu256(w[i].qs + 32 * j);
      const __m256i hl = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4);
      const __m256i hh = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hl);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hh);
      const __m256i sl = k4_scale(scv, 2 * j), sh = k4_scale(scv, 2 * j + 1);
      for (int r = 0; r < R; ++r) {
        const __m256i pl = _mm256_maddubs_epi16(lo, loadu256(x[r][i].qs + 64 * j));
        const __m256i ph = _mm256_maddubs_epi16(hi, loadu256(x[r][i].qs + 64 * j + 32));
        isum[r] = _mm256_add_epi32(isum[r], _mm256_add_epi32(_mm256_madd_epi16(pl, sl), _mm256_madd_epi16(ph, sh)));
      }
    }
    const float wd = h2f(w[i].d), wm = h2f(w[i].dmin);
    for (int r = 0; r < R; ++r) {
      const int summs = hsum_epi32(_mm256_madd_epi16(loadu256(x[r][i].bsums), m16));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * x[r][i].d), _mm256_cvtepi32_ps(isum[r]), acc[r]);
      summ[r] += (wm * x[r][i].d) * static_cast<float>(summs);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_ps(acc[r]) - summ[r];
}

template <int R>
void tile_q6_k(int64_t nb, const void* wv, const void* const* xv, float* out) {
  const auto* w = static_cast<const BlockQ6_K*>(wv);
  const BlockQ8_K* x[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const BlockQ8_K*>(xv[r]);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i sc8 = loadu128(w[i].scales);
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    __m256i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i l0 = loadu256(w[i].ql + 64 * half), l1 = loadu256(w[i].ql + 64 * half + 32);
      const __m256i qh = loadu256(w[i].qh + 32 * half);
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4)),
      };
      for (int k = 0; k < 4; ++k) {
        const __m256i gs = group_scales(sc8, 4 * half + k);
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_maddubs_epi16(q[k], loadu256(x[r][i].qs + 128 * half + 32 * k));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, gs));
        }
      }
    }
    const float wd = h2f(w[i].d);
    for (int r = 0; r < R; ++r) {
      const __m256i corr = _mm256_madd_epi16(sc16, loadu256(x[r][i].bsums));
      const __m256i s = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(corr, 5));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * x[r][i].d), _mm256_cvtepi32_ps(s), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_ps(acc[r]);
}

template <int R>
void tile_q2_k(int64_t nb, const void* wv, const void* const* xv, float* out) {
  const auto* w = static_cast<const BlockQ2_K*>(wv);
  const BlockQ8_K* x[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const BlockQ8_K*>(xv[r]);
  __m256 acc[R];
  float summ[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    summ[r] = 0;
  }
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i sc8 = loadu128(w[i].scales);
    const __m128i scl = _mm_and_si128(sc8, _mm_set1_epi8(0x0F));
    const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F)));
    __m256i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q = loadu256(w[i].qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i gs = group_scales(scl, 4 * half + j);
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_maddubs_epi16(v, loadu256(x[r][i].qs + 128 * half + 32 * j));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, gs));
        }
      }
    }
    const float wd = h2f(w[i].d), wm = h2f(w[i].dmin);
    for (int r = 0; r < R; ++r) {
      const int summs = hsum_epi32(_mm256_madd_epi16(loadu256(x[r][i].bsums), mins));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(x[r][i].d * wd), _mm256_cvtepi32_ps(isum[r]), acc[r]);
      summ[r] += (x[r][i].d * wm) * static_cast<float>(summs);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_ps(acc[r]) - summ[r];
}

template <int R>
void tile_q3_k(int64_t nb, const void* wv, const void* const* xv, float* out) {
  const auto* w = static_cast<const BlockQ3_K*>(wv);
  const BlockQ8_K* x[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const BlockQ8_K*>(xv[r]);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t words[4];
    q3k_scale_words(w[i].scales, words);
    const __m128i sc8 = _mm_sub_epi8(loadu128(words), _mm_set1_epi8(32));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
    const __m256i hb = loadu256(w[i].hmask);
    __m256i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const __m256i q = loadu256(w[i].qs + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const int t = 4 * half + j;
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * j), m3);
        const __m256i h = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, t), one), 2);
        const __m256i v = _mm256_or_si256(lo, h);
        const __m256i gs = group_scales(sc8, t);
        for (int r = 0; r < R; ++r) {
          const __m256i p = _mm256_maddubs_epi16(v, loadu256(x[r][i].qs + 32 * t));
          isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, gs));
        }
      }
    }
    const float wd = h2f(w[i].d);
    for (int r = 0; r < R; ++r) {
      const __m256i corr = _mm256_madd_epi16(sc16, loadu256(x[r][i].bsums));
      const __m256i si = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(corr, 2));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * x[r][i].d), _mm256_cvtepi32_ps(si), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_ps(acc[r]);
}

template <int R>
void tile_iq4_xs(int64_t nb, const void* wv, const void* const* xv, float* out) {
  const auto* w = static_cast<const BlockIQ4_XS*>(wv);
  const BlockQ8_K* x[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const BlockQ8_K*>(xv[r]);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i table = iq4_table();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = ((w[i].scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((w[i].scales_h >> (2 * ib)) & 3) << 4);
      const __m256i q = _mm256_shuffle_epi8(table, nibbles32(w[i].qs + 16 * ib));
      const __m256i qa = _mm256_sign_epi8(q, q);
      const __m256i sc = _mm256_set1_epi16(static_cast<int16_t>(ls - 32));
      for (int r = 0; r < R; ++r) {
        const __m256i y = loadu256(x[r][i].qs + 32 * ib);
        const __m256i p = _mm256_maddubs_epi16(qa, _mm256_sign_epi8(y, q));
        isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(p, sc));
      }
    }
    const float wd = h2f(w[i].d);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(wd * x[r][i].d), _mm256_cvtepi32_ps(isum[r]), acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = hsum_ps(acc[r]);
}

// F32 / F16 / BF16 weights against F32 activations (for F16/BF16: the exactly converted F16/BF16
// rounding of the input, so every product equals dot_half_avx2's). Four accumulators per row, fed as
// dot_f32_avx2 / dot_half_avx2 feed theirs.
struct WF32 {
  using T = float;
  static __m256 load(const float* p) { return _mm256_loadu_ps(p); }
  static float one(float v) { return v; }
};
struct WF16 {
  using T = uint16_t;
  static __m256 load(const uint16_t* p) { return load_f16x8(p); }
  static float one(uint16_t v) { return h2f(v); }
};
struct WBF16 {
  using T = uint16_t;
  static __m256 load(const uint16_t* p) { return load_bf16x8(p); }
  static float one(uint16_t v) { return bf16_to_f32(v); }
};

template <class L, int R>
void tile_float(int64_t n, const void* wv, const void* const* xv, float* out) {
  const auto* w = static_cast<const typename L::T*>(wv);
  const float* x[R];
  for (int r = 0; r < R; ++r) x[r] = static_cast<const float*>(xv[r]);
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int k = 0; k < 4; ++k) a[r][k] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int k = 0; k < 4; ++k) {
      const __m256 wk = L::load(w + i + 8 * k);
      for (int r = 0; r < R; ++r) a[r][k] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x[r] + i + 8 * k), a[r][k]);
    }
  for (; i + 8 <= n; i += 8) {
    const __m256 wk = L::load(w + i);
    for (int r = 0; r < R; ++r) a[r][0] = _mm256_fmadd_ps(wk, _mm256_loadu_ps(x[r] + i), a[r][0]);
  }
  for (int r = 0; r < R; ++r) {
    double s = hsum_ps(_mm256_add_ps(_mm256_add_ps(a[r][0], a[r][1]), _mm256_add_ps(a[r][2], a[r][3])));
    for (int64_t j = i; j < n; ++j) s += static_cast<double>(L::one(w[j]) * x[r][j]);
    out[r] = static_cast<float>(s);
  }
}

// RW weight rows × RX activation rows of a float type. vec_dot's four accumulators per pair do not fit in
// registers for more than three pairs, so this runs one pass per accumulator k (elements 8k..8k+7 of
// every 32): RW·RX accumulators, each weight and activation load shared by RX (RW) FMAs, and each pair's
// four partial vectors combined at the end exactly as dot_f32_avx2 / dot_half_avx2 combine theirs.
template <class L, int RW, int RX>
void tile_float2(int64_t n, const void* const* wv, const void* const* xv, float* out) {
  const typename L::T* w[RW];
  const float* x[RX];
  for (int a = 0; a < RW; ++a) w[a] = static_cast<const typename L::T*>(wv[a]);
  for (int b = 0; b < RX; ++b) x[b] = static_cast<const float*>(xv[b]);
  __m256 part[4][RW][RX];  // accumulator k of every pair
  for (int k = 0; k < 4; ++k)
    for (int a = 0; a < RW; ++a)
      for (int b = 0; b < RX; ++b) part[k][a][b] = _mm256_setzero_ps();
  const int64_t n32 = n / 32 * 32, n8 = n / 8 * 8;
  // The rows are walked in spans of KC elements, four passes per span, so that the span's slice of the
  // RW + RX rows stays in L1 for the passes after the first; each accumulator's chain is unchanged.
  // KC = 512 (one thread, F16, 64 rows): 61 GMAC/s at n = 2048 and 54 at n = 8192, against 56 and 23
  // with whole-row passes, whose 7 rows no longer fit L1 at n = 8192 (the FFN down projection).
  constexpr int64_t KC = 512;
  for (int64_t i0 = 0; i0 < n32; i0 += KC) {
    const int64_t i1 = std::min(n32, i0 + KC);
    for (int k = 0; k < 4; ++k) {
      __m256 c[RW][RX];
      for (int a = 0; a < RW; ++a)
        for (int b = 0; b < RX; ++b) c[a][b] = part[k][a][b];
      for (int64_t i = i0 + 8 * k; i < i1; i += 32) {
        __m256 wk[RW];
        for (int a = 0; a < RW; ++a) wk[a] = L::load(w[a] + i);
        for (int b = 0; b < RX; ++b) {
          const __m256 xk = _mm256_loadu_ps(x[b] + i);
          for (int a = 0; a < RW; ++a) c[a][b] = _mm256_fmadd_ps(wk[a], xk, c[a][b]);
        }
      }
      for (int a = 0; a < RW; ++a)
        for (int b = 0; b < RX; ++b) part[k][a][b] = c[a][b];
    }
  }
  for (int64_t i = n32; i < n8; i += 8) {  // vec_dot puts the 8-element remainder into a0
    __m256 wk[RW];
    for (int a = 0; a < RW; ++a) wk[a] = L::load(w[a] + i);
    for (int b = 0; b < RX; ++b) {
      const __m256 xk = _mm256_loadu_ps(x[b] + i);
      for (int a = 0; a < RW; ++a) part[0][a][b] = _mm256_fmadd_ps(wk[a], xk, part[0][a][b]);
    }
  }
  for (int a = 0; a < RW; ++a)
    for (int b = 0; b < RX; ++b) {
      double s = hsum_ps(_mm256_add_ps(_mm256_add_ps(part[0][a][b], part[1][a][b]), _mm256_add_ps(part[2][a][b], part[3][a][b])));
      for (int64_t j = n8; j < n; ++j) s += static_cast<double>(L::one(w[a][j]) * x[b][j]);
      out[a * RX + b] = static_cast<float>(s);
    }
}
#endif  // PG_DOT_AVX2

void check_dot(DType t, int64_t n) {
  const auto& tr = traits(t);
  PG_CHECK(n >= 0 && n % tr.block_size == 0, "vec_dot: " + std::to_string(n) + " elements is not a multiple of the " +
                                                 std::string(tr.name) + " block size " + std::to_string(tr.block_size));
}

[[noreturn]] void no_dot(DType t) { throw Error("no dot product for weight type " + std::string(dtype_name(t))); }

template <class W, class X>
struct Rows {
  const W* w;
  const X* x;
};
template <class W, class X>
Rows<W, X> as(const void* w, const void* x) {
  return {static_cast<const W*>(w), static_cast<const X*>(x)};
}

}  // namespace

DType vec_dot_type(DType t) {
  switch (t) {
    case DType::F32:
      return DType::F32;
    case DType::F16:
      return DType::F16;
    case DType::BF16:
      return DType::BF16;
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
    case DType::IQ4_NL:
      return DType::Q8_0;
    case DType::Q4_1:
    case DType::Q5_1:
      return DType::Q8_1;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return DType::Q8_K;
    default:
      no_dot(t);
  }
}

float vec_dot_scalar(DType t, int64_t n, const void* w, const void* x) {
  check_dot(t, n);
  const int64_t nb = n / traits(t).block_size;
  switch (t) {
    case DType::F32:
      return dot_f32_scalar(n, static_cast<const float*>(w), static_cast<const float*>(x));
    case DType::F16:
      return dot_f16_scalar(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x));
    case DType::BF16:
      return dot_bf16_scalar(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x));
    case DType::Q4_0: {
      auto r = as<BlockQ4_0, BlockQ8_0>(w, x);
      return dot_q4_0_scalar(nb, r.w, r.x);
    }
    case DType::Q4_1: {
      auto r = as<BlockQ4_1, BlockQ8_1>(w, x);
      return dot_q4_1_scalar(nb, r.w, r.x);
    }
    case DType::Q5_0: {
      auto r = as<BlockQ5_0, BlockQ8_0>(w, x);
      return dot_q5_0_scalar(nb, r.w, r.x);
    }
    case DType::Q5_1: {
      auto r = as<BlockQ5_1, BlockQ8_1>(w, x);
      return dot_q5_1_scalar(nb, r.w, r.x);
    }
    case DType::Q8_0: {
      auto r = as<BlockQ8_0, BlockQ8_0>(w, x);
      return dot_q8_0_scalar(nb, r.w, r.x);
    }
    case DType::IQ4_NL: {
      auto r = as<BlockIQ4_NL, BlockQ8_0>(w, x);
      return dot_iq4_nl_scalar(nb, r.w, r.x);
    }
    case DType::Q2_K: {
      auto r = as<BlockQ2_K, BlockQ8_K>(w, x);
      return dot_q2_k_scalar(nb, r.w, r.x);
    }
    case DType::Q3_K: {
      auto r = as<BlockQ3_K, BlockQ8_K>(w, x);
      return dot_q3_k_scalar(nb, r.w, r.x);
    }
    case DType::Q4_K: {
      auto r = as<BlockQ4_K, BlockQ8_K>(w, x);
      return dot_q4_k_scalar(nb, r.w, r.x);
    }
    case DType::Q5_K: {
      auto r = as<BlockQ5_K, BlockQ8_K>(w, x);
      return dot_q5_k_scalar(nb, r.w, r.x);
    }
    case DType::Q6_K: {
      auto r = as<BlockQ6_K, BlockQ8_K>(w, x);
      return dot_q6_k_scalar(nb, r.w, r.x);
    }
    case DType::IQ4_XS: {
      auto r = as<BlockIQ4_XS, BlockQ8_K>(w, x);
      return dot_iq4_xs_scalar(nb, r.w, r.x);
    }
    default:
      no_dot(t);
  }
}

bool vec_dot_has_simd(DType t) {
#if PG_DOT_AVX2
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::IQ4_NL:
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
#else
  (void)t;
  return false;
#endif
}

float vec_dot(DType t, int64_t n, const void* w, const void* x) {
#if PG_DOT_AVX2
  check_dot(t, n);
  const int64_t nb = n / traits(t).block_size;
  switch (t) {
    case DType::F32:
      return dot_f32_avx2(n, static_cast<const float*>(w), static_cast<const float*>(x));
    case DType::F16:
      return dot_half_avx2<load_f16x8, fp16_to_f32>(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x));
    case DType::BF16:
      return dot_half_avx2<load_bf16x8, bf16_to_f32>(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x));
    case DType::Q4_0: {
      auto r = as<BlockQ4_0, BlockQ8_0>(w, x);
      return dot_q4_0_avx2(nb, r.w, r.x);
    }
    case DType::Q4_1: {
      auto r = as<BlockQ4_1, BlockQ8_1>(w, x);
      return dot_q4_1_avx2(nb, r.w, r.x);
    }
    case DType::Q5_0: {
      auto r = as<BlockQ5_0, BlockQ8_0>(w, x);
      return dot_q5_0_avx2(nb, r.w, r.x);
    }
    case DType::Q5_1: {
      auto r = as<BlockQ5_1, BlockQ8_1>(w, x);
      return dot_q5_1_avx2(nb, r.w, r.x);
    }
    case DType::Q8_0: {
      auto r = as<BlockQ8_0, BlockQ8_0>(w, x);
      return dot_q8_0_avx2(nb, r.w, r.x);
    }
    case DType::IQ4_NL: {
      auto r = as<BlockIQ4_NL, BlockQ8_0>(w, x);
      return dot_iq4_nl_avx2(nb, r.w, r.x);
    }
    case DType::Q2_K: {
      auto r = as<BlockQ2_K, BlockQ8_K>(w, x);
      return dot_q2_k_avx2(nb, r.w, r.x);
    }
    case DType::Q3_K: {
      auto r = as<BlockQ3_K, BlockQ8_K>(w, x);
      return dot_q3_k_avx2(nb, r.w, r.x);
    }
    case DType::Q4_K: {
      auto r = as<BlockQ4_K, BlockQ8_K>(w, x);
      return dot_q4_k_avx2(nb, r.w, r.x);
    }
    case DType::Q5_K: {
      auto r = as<BlockQ5_K, BlockQ8_K>(w, x);
      return dot_q5_k_avx2(nb, r.w, r.x);
    }
    case DType::Q6_K: {
      auto r = as<BlockQ6_K, BlockQ8_K>(w, x);
      return dot_q6_k_avx2(nb, r.w, r.x);
    }
    case DType::IQ4_XS: {
      auto r = as<BlockIQ4_XS, BlockQ8_K>(w, x);
      return dot_iq4_xs_avx2(nb, r.w, r.x);
    }
    default:
      no_dot(t);
  }
#else
  return vec_dot_scalar(t, n, w, x);
#endif
}

// ---- tiles ------------------------------------------------------------------------------------------

namespace {

using TileFn = void (*)(int64_t nb_or_n, const void* w, const void* const* x, float* out);

// Kernels for 1..4 activation rows of one weight type; `per_block` counts blocks (else elements).
using Tile2Fn = void (*)(int64_t n, const void* const* w, const void* const* x, float* out);
// Weight rows × activation rows of the 2-D float tiles. 3×4 won on F16 (in=2048, 64 rows, one thread):
// 54 GMAC/s against 34 for 1×3 tile_float, 52 for 3×3, 51 for 5×2, 36 for 4×3 and 34 for 2×4 (spills).
constexpr int kTile2W = 3, kTile2X = 4;

struct TileSet {
  TileFn fn[4] = {};
  bool per_block = true;
  int max_rows = 4;              // activation rows per weight-row pass (register pressure decides)
  const Tile2Fn* fn2 = nullptr;  // [(rw-1)·kTile2X + rx-1]: 2-D tiles, used for more than one activation row
};

#if PG_DOT_AVX2
template <template <int> class K>
constexpr TileSet tile_set(bool per_block = true, int max_rows = 4) {
  return {{K<1>::run, K<2>::run, K<3>::run, K<4>::run}, per_block, max_rows};
}
template <class D>
struct Legacy {
  template <int R>
  struct K {
    static void run(int64_t nb, const void* w, const void* const* x, float* out) { tile_legacy<D, R>(nb, w, x, out); }
  };
};
#define PG_TILE_K(name, fn)                                                                                \
  template <int R>                                                                                         \
  struct name {                                                                                            \
    static void run(int64_t nb, const void* w, const void* const* x, float* out) { fn<R>(nb, w, x, out); } \
  };
PG_TILE_K(KQ4K, tile_q4_k)
PG_TILE_K(KQ5K, tile_q5_k)
PG_TILE_K(KQ6K, tile_q6_k)
PG_TILE_K(KQ2K, tile_q2_k)
PG_TILE_K(KQ3K, tile_q3_k)
PG_TILE_K(KIQ4XS, tile_iq4_xs)
#undef PG_TILE_K
template <class L>
struct Float {
  template <int R>
  struct K {
    static void run(int64_t n, const void* w, const void* const* x, float* out) { tile_float<L, R>(n, w, x, out); }
  };
  template <int... I>
  static constexpr std::array<Tile2Fn, sizeof...(I)> table2(std::integer_sequence<int, I...>) {
    return {tile_float2<L, I / kTile2X + 1, I % kTile2X + 1>...};
  }
  static constexpr std::array<Tile2Fn, kTile2W* kTile2X> kTiles2 = table2(std::make_integer_sequence<int, kTile2W * kTile2X>{});
  static TileSet set() {
    TileSet ts = tile_set<K>(false, 3);
    ts.fn2 = kTiles2.data();
    return ts;
  }
};
#endif

// The tile kernels of t; empty (fn[0] == nullptr) where gemm_rows falls back to vec_dot per pair.
TileSet tiles_for(DType t) {
#if PG_DOT_AVX2
  switch (t) {
    // Float types: 2-D tiles for several activation rows; tile_float (three rows at most: with four, its
    // 16 accumulators spill) for one row and as the reference of tile_float2.
    case DType::F32:
      return Float<WF32>::set();
    case DType::F16:
      return Float<WF16>::set();
    case DType::BF16:
      return Float<WBF16>::set();
    case DType::Q4_0:
      return tile_set<Legacy<DecQ4_0>::K>();
    case DType::Q4_1:
      return tile_set<Legacy<DecQ4_1>::K>();
    case DType::Q5_0:
      return tile_set<Legacy<DecQ5_0>::K>();
    case DType::Q5_1:
      return tile_set<Legacy<DecQ5_1>::K>();
    case DType::Q8_0:
      return tile_set<Legacy<DecQ8_0>::K>();
    case DType::IQ4_NL:
      return tile_set<Legacy<DecIQ4_NL>::K>();
    case DType::Q4_K:
      return tile_set<KQ4K>();
    case DType::Q5_K:
      return tile_set<KQ5K>();
    case DType::Q6_K:
      return tile_set<KQ6K>();
    case DType::Q2_K:
      return tile_set<KQ2K>();
    case DType::Q3_K:
      return tile_set<KQ3K>();
    case DType::IQ4_XS:
      return tile_set<KIQ4XS>();
    default:
      return {};
  }
#else
  (void)t;
  return {};
#endif
}

}  // namespace

DType gemm_x_type(DType t) {
  if ((t == DType::F16 || t == DType::BF16) && tiles_for(t).fn[0]) return DType::F32;
  return vec_dot_type(t);
}

namespace {
// The 32-element activation types whose prepared rows carry F32 scales (see tile_legacy).
bool has_x_side(DType t) {
  const DType vt = vec_dot_type(t);
  return (vt == DType::Q8_0 || vt == DType::Q8_1) && tiles_for(t).fn[0] != nullptr;
}
}  // namespace

size_t gemm_x_row_bytes(DType t, int64_t n) {
  const DType xt = gemm_x_type(t);
  if (!has_x_side(t)) return row_bytes(xt, n);
  const int64_t nb = n / traits(xt).block_size;
  const size_t side = (xt == DType::Q8_1 ? 2 : 1) * static_cast<size_t>(nb) * sizeof(float);
  return (x_side_offset(nb, traits(xt).type_size) + side + 31) / 32 * 32;
}

void gemm_prepare_x(DType t, const float* x, void* dst, int64_t n) {
  const DType xt = gemm_x_type(t), vt = vec_dot_type(t);
  if (xt == vt) {
    if (xt == DType::F32) {
      std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
    } else {
      quantize_row(vt, x, dst, n);
      if (has_x_side(t)) {
        const int64_t nb = n / traits(vt).block_size;
        const size_t bb = traits(vt).type_size;
        auto* base = static_cast<uint8_t*>(dst);
        float* d = reinterpret_cast<float*>(base + x_side_offset(nb, bb));  // (nb) scales, then (nb) sums for Q8_1
        for (int64_t i = 0; i < nb; ++i) {
          uint16_t h[2];  // d, s: the first two fields of BlockQ8_0 / BlockQ8_1
          std::memcpy(h, base + static_cast<size_t>(i) * bb, sizeof h);
          d[i] = fp16_to_f32(h[0]);
          if (vt == DType::Q8_1) d[nb + i] = fp16_to_f32(h[1]);
        }
      }
    }
    return;
  }
  // F16 / BF16 weights: round through the half format (quantize_row's rounding), then widen exactly.
  float* out = static_cast<float*>(dst);
  uint16_t half[256];  // one chunk of the rounded row
  for (int64_t i0 = 0; i0 < n; i0 += 256) {
    const int64_t m = std::min<int64_t>(256, n - i0);
    quantize_row(vt, x + i0, half, m);
    for (int64_t i = 0; i < m; ++i) out[i0 + i] = vt == DType::F16 ? fp16_to_f32(half[i]) : bf16_to_f32(half[i]);
  }
}

bool gemm_has_tiles(DType t) { return tiles_for(t).fn[0] != nullptr; }

namespace {
#if PG_DOT_AVX2 && PG_VNNI
std::atomic<bool> g_use_vnni{cpu_has_vnni()};
#else
std::atomic<bool> g_use_vnni{false};
#endif
}  // namespace

bool gemm_enable_vnni(bool on) {
#if PG_DOT_AVX2 && PG_VNNI
  on = on && cpu_has_vnni();
#else
  on = false;
#endif
  return g_use_vnni.exchange(on, std::memory_order_relaxed);
}

void gemm_rows(DType t, int64_t n, const void* w, size_t w_stride, int64_t n_w, const void* const* x, int64_t n_x, float* y,
               int64_t y_stride) {
  if (n_w <= 0 || n_x <= 0) return;
  const auto* wp = static_cast<const uint8_t*>(w);
  const TileSet ts = tiles_for(t);
  if (!ts.fn[0]) {
    for (int64_t j = 0; j < n_x; ++j)
      for (int64_t i = 0; i < n_w; ++i) y[j * y_stride + i] = vec_dot(t, n, wp + static_cast<size_t>(i) * w_stride, x[j]);
    return;
  }
  check_dot(t, n);
#if PG_DOT_AVX2 && PG_VNNI
  if (g_use_vnni.load(std::memory_order_relaxed)) {
    switch (t) {
      case DType::Q8_0:
        return Vnni<DecQ8_0>::run(n, wp, w_stride, n_w, x, n_x, y, y_stride);
      case DType::Q4_0:
        return Vnni<DecQ4_0>::run(n, wp, w_stride, n_w, x, n_x, y, y_stride);
      case DType::Q5_0:
        return Vnni<DecQ5_0>::run(n, wp, w_stride, n_w, x, n_x, y, y_stride);
      case DType::IQ4_NL:
        return Vnni<DecIQ4_NL>::run(n, wp, w_stride, n_w, x, n_x, y, y_stride);
      case DType::Q4_K:
        if (n_x > 1) return VnniK<TQ4K>::run(n, wp, w_stride, n_w, x, n_x, y, y_stride);
        break;
      case DType::Q6_K:
        if (n_x > 1) return VnniK<TQ6K>::run(n, wp, w_stride, n_w, x, n_x, y, y_stride);
        break;
      default:
        break;
    }
  }
#endif
  if (n_x > 1 && ts.fn2) {
    constexpr int RW = kTile2W, RX = kTile2X;
    const void* wr[RW];
    float out2[RW * RX];
    for (int64_t j = 0; j < n_x; j += RX) {
      const int rx = static_cast<int>(std::min<int64_t>(RX, n_x - j));
      for (int64_t i = 0; i < n_w; i += RW) {
        const int rw = static_cast<int>(std::min<int64_t>(RW, n_w - i));
        for (int a = 0; a < rw; ++a) wr[a] = wp + static_cast<size_t>(i + a) * w_stride;
        ts.fn2[(rw - 1) * RX + (rx - 1)](n, wr, x + j, out2);
        for (int a = 0; a < rw; ++a)
          for (int b = 0; b < rx; ++b) y[(j + b) * y_stride + i + a] = out2[a * rx + b];
      }
    }
    return;
  }
  const int64_t len = ts.per_block ? n / traits(t).block_size : n;
  float out[4];
  for (int64_t j = 0; j < n_x; j += ts.max_rows) {
    const int r = static_cast<int>(std::min<int64_t>(ts.max_rows, n_x - j));
    const TileFn fn = ts.fn[r - 1];
    for (int64_t i = 0; i < n_w; ++i) {
      fn(len, wp + static_cast<size_t>(i) * w_stride, x + j, out);
      for (int k = 0; k < r; ++k) y[(j + k) * y_stride + i] = out[k];
    }
  }
}

}  // namespace pg
