// Dot products of one weight row with one activation row already converted to vec_dot_type().
//
// Every quantized kernel sums integer products exactly inside a block (or a 256-element super-block)
// and only then scales by the float block factors, as ggml does; so the scalar and the AVX2 versions
// differ from ggml's (and from each other) only in the order of the float additions across blocks.
#include <cmath>
#include <cstring>
#include <string>

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

inline float h2f(uint16_t h) { return fp16_to_f32(h); }

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
    for (int j = 0; j < 16; ++j)
      sumi += ((w[i].qs[j] & 0xF) - 8) * x[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * x[i].qs[j + 16];
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

// Q3_K's 16 signed 6-bit sub-block scales (low nibbles in bytes 0..7, high bit pairs in 8..11).
inline void q3k_scales(const uint8_t* s, int8_t* out) {
  for (int j = 0; j < 16; ++j) {
    const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    const int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((lo | (hi << 4)) - 32);
  }
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
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += x[i].bsums[j] * (w[i].scales[j] >> 4);
    int isum = 0;
    for (int e = 0; e < QK_K; ++e) {
      // element e: byte (e/128)*32 + e%32, bits 2*((e%128)/32); scale e/16
      const int q = (w[i].qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      isum += (w[i].scales[e / 16] & 0xF) * q * x[i].qs[e];
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
    for (int g = 0; g < 16; ++g) {
      int gs = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) {
        const int q2 = (w[i].qs[(e / 128) * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const int hb = (w[i].hmask[e % 32] >> (e / 32)) & 1;
        gs += (q2 - (hb ? 0 : 4)) * x[i].qs[e];
      }
      isum += sc[g] * gs;
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
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                                        3, 3, 3, 3, 3);
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
inline __m256i dot_u8(__m256i a, __m256i b) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

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
    alignas(16) int8_t sc[16];
    q3k_scales(w[i].scales, sc);
    const __m128i sc8 = _mm_load_si128(reinterpret_cast<const __m128i*>(sc));
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
    case DType::F32: return DType::F32;
    case DType::F16: return DType::F16;
    case DType::BF16: return DType::BF16;
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::Q8_0:
    case DType::IQ4_NL: return DType::Q8_0;
    case DType::Q4_1:
    case DType::Q5_1: return DType::Q8_1;
    case DType::Q2_K:
    case DType::Q3_K:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::IQ4_XS: return DType::Q8_K;
    default: no_dot(t);
  }
}

float vec_dot_scalar(DType t, int64_t n, const void* w, const void* x) {
  check_dot(t, n);
  const int64_t nb = n / traits(t).block_size;
  switch (t) {
    case DType::F32: return dot_f32_scalar(n, static_cast<const float*>(w), static_cast<const float*>(x));
    case DType::F16: return dot_f16_scalar(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x));
    case DType::BF16: return dot_bf16_scalar(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x));
    case DType::Q4_0: { auto r = as<BlockQ4_0, BlockQ8_0>(w, x); return dot_q4_0_scalar(nb, r.w, r.x); }
    case DType::Q4_1: { auto r = as<BlockQ4_1, BlockQ8_1>(w, x); return dot_q4_1_scalar(nb, r.w, r.x); }
    case DType::Q5_0: { auto r = as<BlockQ5_0, BlockQ8_0>(w, x); return dot_q5_0_scalar(nb, r.w, r.x); }
    case DType::Q5_1: { auto r = as<BlockQ5_1, BlockQ8_1>(w, x); return dot_q5_1_scalar(nb, r.w, r.x); }
    case DType::Q8_0: { auto r = as<BlockQ8_0, BlockQ8_0>(w, x); return dot_q8_0_scalar(nb, r.w, r.x); }
    case DType::IQ4_NL: { auto r = as<BlockIQ4_NL, BlockQ8_0>(w, x); return dot_iq4_nl_scalar(nb, r.w, r.x); }
    case DType::Q2_K: { auto r = as<BlockQ2_K, BlockQ8_K>(w, x); return dot_q2_k_scalar(nb, r.w, r.x); }
    case DType::Q3_K: { auto r = as<BlockQ3_K, BlockQ8_K>(w, x); return dot_q3_k_scalar(nb, r.w, r.x); }
    case DType::Q4_K: { auto r = as<BlockQ4_K, BlockQ8_K>(w, x); return dot_q4_k_scalar(nb, r.w, r.x); }
    case DType::Q5_K: { auto r = as<BlockQ5_K, BlockQ8_K>(w, x); return dot_q5_k_scalar(nb, r.w, r.x); }
    case DType::Q6_K: { auto r = as<BlockQ6_K, BlockQ8_K>(w, x); return dot_q6_k_scalar(nb, r.w, r.x); }
    case DType::IQ4_XS: { auto r = as<BlockIQ4_XS, BlockQ8_K>(w, x); return dot_iq4_xs_scalar(nb, r.w, r.x); }
    default: no_dot(t);
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
    case DType::IQ4_XS: return true;
    default: return false;
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
    case DType::F32: return dot_f32_avx2(n, static_cast<const float*>(w), static_cast<const float*>(x));
    case DType::F16:
      return dot_half_avx2<load_f16x8, fp16_to_f32>(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x));
    case DType::BF16:
      return dot_half_avx2<load_bf16x8, bf16_to_f32>(n, static_cast<const uint16_t*>(w), static_cast<const uint16_t*>(x));
    case DType::Q4_0: { auto r = as<BlockQ4_0, BlockQ8_0>(w, x); return dot_q4_0_avx2(nb, r.w, r.x); }
    case DType::Q4_1: { auto r = as<BlockQ4_1, BlockQ8_1>(w, x); return dot_q4_1_avx2(nb, r.w, r.x); }
    case DType::Q5_0: { auto r = as<BlockQ5_0, BlockQ8_0>(w, x); return dot_q5_0_avx2(nb, r.w, r.x); }
    case DType::Q5_1: { auto r = as<BlockQ5_1, BlockQ8_1>(w, x); return dot_q5_1_avx2(nb, r.w, r.x); }
    case DType::Q8_0: { auto r = as<BlockQ8_0, BlockQ8_0>(w, x); return dot_q8_0_avx2(nb, r.w, r.x); }
    case DType::IQ4_NL: { auto r = as<BlockIQ4_NL, BlockQ8_0>(w, x); return dot_iq4_nl_avx2(nb, r.w, r.x); }
    case DType::Q2_K: { auto r = as<BlockQ2_K, BlockQ8_K>(w, x); return dot_q2_k_avx2(nb, r.w, r.x); }
    case DType::Q3_K: { auto r = as<BlockQ3_K, BlockQ8_K>(w, x); return dot_q3_k_avx2(nb, r.w, r.x); }
    case DType::Q4_K: { auto r = as<BlockQ4_K, BlockQ8_K>(w, x); return dot_q4_k_avx2(nb, r.w, r.x); }
    case DType::Q5_K: { auto r = as<BlockQ5_K, BlockQ8_K>(w, x); return dot_q5_k_avx2(nb, r.w, r.x); }
    case DType::Q6_K: { auto r = as<BlockQ6_K, BlockQ8_K>(w, x); return dot_q6_k_avx2(nb, r.w, r.x); }
    case DType::IQ4_XS: { auto r = as<BlockIQ4_XS, BlockQ8_K>(w, x); return dot_iq4_xs_avx2(nb, r.w, r.x); }
    default: no_dot(t);
  }
#else
  return vec_dot_scalar(t, n, w, x);
#endif
}

}  // namespace pg
