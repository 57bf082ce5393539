#include "backend/cpu/kv_attn.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/kv_quant.h"
#include "core/quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PG_KV_AVX2 1
#endif

namespace pg {
namespace {

// Per-key scratch: one decoded head (f32), the largest stored width.
constexpr int kMaxWidth = kKvMaxHeadDim;

void check_args(DType t, int head_dim, int nq, int len) {
  PG_CHECK(is_kv_type(t), "KV attention: " + std::string(dtype_name(t)) + " is not a KV cache type (accepted: " +
                              kv_type_list() + ")");
  PG_CHECK(head_dim >= 1 && head_dim <= kKvMaxHeadDim, "KV attention: head_dim " + std::to_string(head_dim) +
                                                           " is outside 1.." + std::to_string(kKvMaxHeadDim));
  PG_CHECK(nq >= 1 && len >= 0, "KV attention: nq must be >= 1 and len >= 0");
}

#if PG_KV_AVX2

inline void store8(float* y, __m256 v) { _mm256_storeu_ps(y, v); }
inline __m256 i8x8_to_f(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }
inline __m256 u8x8_to_f(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)); }

// Each decoder writes n values (n a multiple of the type's block) exactly as core's reference dequantizer
// computes them: the same products (and the same FMA-or-not for the affine types, see Q4_1), so the SIMD
// and scalar paths decode to identical floats and differ only in dot-product summation order.

void dec_q8_0(const uint8_t* src, float* y, int n) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(src);
  for (int i = 0; i < n / QK8_0; ++i, y += QK8_0) {
    const __m256 d = _mm256_set1_ps(fp16_to_f32(b[i].d));
    for (int k = 0; k < 4; ++k)
      store8(y + 8 * k, _mm256_mul_ps(i8x8_to_f(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b[i].qs + 8 * k))), d));
  }
}

// The 16 packed bytes of a 4-bit block -> low nibbles (values 0..15) and high nibbles (values 16..31).
inline void nibbles(const uint8_t* qs, __m128i* lo, __m128i* hi) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  *lo = _mm_and_si128(raw, m4);
  *hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
}

void dec_q4_0(const uint8_t* src, float* y, int n) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(src);
  const __m128i eight = _mm_set1_epi8(8);
  for (int i = 0; i < n / QK4_0; ++i, y += QK4_0) {
    const __m256 d = _mm256_set1_ps(fp16_to_f32(b[i].d));
    __m128i lo, hi;
    nibbles(b[i].qs, &lo, &hi);
    lo = _mm_sub_epi8(lo, eight);
    hi = _mm_sub_epi8(hi, eight);
    store8(y, _mm256_mul_ps(i8x8_to_f(lo), d));
    store8(y + 8, _mm256_mul_ps(i8x8_to_f(_mm_srli_si128(lo, 8)), d));
    store8(y + 16, _mm256_mul_ps(i8x8_to_f(hi), d));
    store8(y + 24, _mm256_mul_ps(i8x8_to_f(_mm_srli_si128(hi, 8)), d));
  }
}

void dec_q4_1(const uint8_t* src, float* y, int n) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(src);
  for (int i = 0; i < n / QK4_1; ++i, y += QK4_1) {
    const __m256 d = _mm256_set1_ps(fp16_to_f32(b[i].d)), m = _mm256_set1_ps(fp16_to_f32(b[i].m));
    __m128i lo, hi;
    nibbles(b[i].qs, &lo, &hi);
    store8(y, _mm256_fmadd_ps(u8x8_to_f(lo), d, m));
    store8(y + 8, _mm256_fmadd_ps(u8x8_to_f(_mm_srli_si128(lo, 8)), d, m));
    store8(y + 16, _mm256_fmadd_ps(u8x8_to_f(hi), d, m));
    store8(y + 24, _mm256_fmadd_ps(u8x8_to_f(_mm_srli_si128(hi, 8)), d, m));
  }
}

// Bit 4 of values p..p+7 of a Q5 block: bit (p + lane) of qh, as 0 or 16 per 32-bit lane.
inline __m256i q5_high(uint32_t qh, int p) {
  const __m256i sh = _mm256_add_epi32(_mm256_set1_epi32(p), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh)), sh), _mm256_set1_epi32(1));
  return _mm256_slli_epi32(bit, 4);
}

// Values p..p+7 of a Q5 block as int32: nibble | high bit (unsigned 0..31).
inline __m256i q5_values(__m128i nib8, uint32_t qh, int p) {
  return _mm256_or_si256(_mm256_cvtepu8_epi32(nib8), q5_high(qh, p));
}

void dec_q5_0(const uint8_t* src, float* y, int n) {
  const auto* b = reinterpret_cast<const BlockQ5_0*>(src);
  const __m256i sixteen = _mm256_set1_epi32(16);
  for (int i = 0; i < n / QK5_0; ++i, y += QK5_0) {
    const __m256 d = _mm256_set1_ps(fp16_to_f32(b[i].d));
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    __m128i lo, hi;
    nibbles(b[i].qs, &lo, &hi);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k) {
      const __m256i v = _mm256_sub_epi32(q5_values(parts[k], qh, 8 * k), sixteen);
      store8(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(v), d));
    }
  }
}

void dec_q5_1(const uint8_t* src, float* y, int n) {
  const auto* b = reinterpret_cast<const BlockQ5_1*>(src);
  for (int i = 0; i < n / QK5_1; ++i, y += QK5_1) {
    const __m256 d = _mm256_set1_ps(fp16_to_f32(b[i].d)), m = _mm256_set1_ps(fp16_to_f32(b[i].m));
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    __m128i lo, hi;
    nibbles(b[i].qs, &lo, &hi);
    const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k)
      store8(y + 8 * k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q5_values(parts[k], qh, 8 * k)), d, m));
  }
}

// TQ3_0: the 3-bit index of each lane looks the centroid up with one permute.
void dec_tq3_0(const uint8_t* src, float* y, int n) {
  const auto* b = reinterpret_cast<const BlockTQ3_0*>(src);
  const __m256 cent = _mm256_loadu_ps(kTq3Centroids);
  const __m256i sh2 = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14), sh1 = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i three = _mm256_set1_epi32(3), one = _mm256_set1_epi32(1);
  for (int i = 0; i < n / kTq3Block; ++i, y += kTq3Block) {
    const __m256 d = _mm256_set1_ps(fp16_to_f32(b[i].norm));
    for (int k = 0; k < 4; ++k) {
      uint16_t lo2;  // the 2-bit fields of values 8k..8k+7
      std::memcpy(&lo2, b[i].qs + 2 * k, 2);
      const __m256i low = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(lo2), sh2), three);
      const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b[i].signs[k]), sh1), one);
      const __m256i idx = _mm256_or_si256(low, _mm256_slli_epi32(high, 2));
      store8(y + 8 * k, _mm256_mul_ps(_mm256_permutevar8x32_ps(cent, idx), d));
    }
  }
}

void dec_f16(const uint8_t* src, float* y, int n) {
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  int i = 0;
  for (; i + 8 <= n; i += 8) store8(y + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
  for (; i < n; ++i) y[i] = fp16_to_f32(h[i]);
}

void dec_bf16(const uint8_t* src, float* y, int n) {
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    store8(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
  }
  for (; i < n; ++i) y[i] = bf16_to_f32(h[i]);
}

using Decoder = void (*)(const uint8_t*, float*, int);

Decoder simd_decoder(DType t) {
  switch (t) {
    case DType::F16: return dec_f16;
    case DType::BF16: return dec_bf16;
    case DType::Q8_0: return dec_q8_0;
    case DType::Q4_0: return dec_q4_0;
    case DType::Q4_1: return dec_q4_1;
    case DType::Q5_0: return dec_q5_0;
    case DType::Q5_1: return dec_q5_1;
    case DType::TQ3_0: return dec_tq3_0;
    default: return nullptr;  // F32 needs no decode
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// out[g] = q[g]·k over n floats for NG query heads at once: per head two 8-lane accumulators, then the
// tail in order. The heads' FMA chains are independent, so interleaving them hides part of the FMA latency
// that one head's chain alone is bound by (measured 10-25 % faster than one head at a time at hd 128 with
// 4 heads: the decode and the buffer round trip are the larger cost); each head's sum is formed exactly
// as a single-head loop would form it.
template <int NG>
inline void dot_heads(const float* const* q, const float* k, int n, float* out) {
  __m256 a0[NG], a1[NG];
  for (int g = 0; g < NG; ++g) a0[g] = a1[g] = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 k0 = _mm256_loadu_ps(k + i), k1 = _mm256_loadu_ps(k + i + 8);
    for (int g = 0; g < NG; ++g) {
      a0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + i), k0, a0[g]);
      a1[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + i + 8), k1, a1[g]);
    }
  }
  if (i + 8 <= n) {
    const __m256 k0 = _mm256_loadu_ps(k + i);
    for (int g = 0; g < NG; ++g) a0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + i), k0, a0[g]);
    i += 8;
  }
  for (int g = 0; g < NG; ++g) {
    float s = hsum(_mm256_add_ps(a0[g], a1[g]));
    for (int d = i; d < n; ++d) s = std::fma(q[g][d], k[d], s);
    out[g] = s;
  }
}

// acc += w·v over n floats; element-wise FMAs, the same operation per element as the scalar form.
inline void axpy_f32(float w, const float* v, float* acc, int n) {
  const __m256 wv = _mm256_set1_ps(w);
  int i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(wv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
  for (; i < n; ++i) acc[i] = std::fma(w, v[i], acc[i]);
}

#endif  // PG_KV_AVX2

}  // namespace

bool kv_attn_has_simd(DType t) {
#if PG_KV_AVX2
  return is_kv_type(t);
#else
  (void)t;
  return false;
#endif
}

void kv_prepare_query(DType k, int head_dim, const float* q, float* qp) {
  const int w = kv_head_width(k, head_dim);
  std::copy(q, q + head_dim, qp);
  std::fill(qp + head_dim, qp + w, 0.0f);
  if (k == DType::TQ3_0) tq3_rotate(qp, w);
}

void kv_scores_scalar(DType k, int head_dim, const float* qp, int nq, const uint8_t* k_base, const size_t* k_offs,
                      int len, float* scores) {
  check_args(k, head_dim, nq, len);
  const int w = kv_head_width(k, head_dim);
  float kr[kMaxWidth];  // (w) key j decoded
  for (int j = 0; j < len; ++j) {
    kv_dequantize_head(k, k_base + k_offs[j], head_dim, kr);
    for (int g = 0; g < nq; ++g) {
      const float* q = qp + static_cast<size_t>(g) * w;
      float s = 0;
      for (int d = 0; d < w; ++d) s = std::fma(q[d], kr[d], s);
      scores[static_cast<size_t>(g) * len + j] = s;
    }
  }
}

void kv_accumulate_scalar(DType v, int head_dim, const float* w, int nq, const uint8_t* v_base, const size_t* v_offs,
                          int len, float* acc) {
  check_args(v, head_dim, nq, len);
  const int wd = kv_head_width(v, head_dim);
  float vr[kMaxWidth];  // (wd) value j decoded
  for (int j = 0; j < len; ++j) {
    kv_dequantize_head(v, v_base + v_offs[j], head_dim, vr);
    for (int g = 0; g < nq; ++g) {
      const float wj = w[static_cast<size_t>(g) * len + j];
      float* a = acc + static_cast<size_t>(g) * wd;
      for (int d = 0; d < wd; ++d) a[d] = std::fma(wj, vr[d], a[d]);
    }
  }
}

void kv_scores(DType k, int head_dim, const float* qp, int nq, const uint8_t* k_base, const size_t* k_offs, int len,
               float* scores) {
#if PG_KV_AVX2
  check_args(k, head_dim, nq, len);
  const int w = kv_head_width(k, head_dim);
  const Decoder dec = simd_decoder(k);
  alignas(32) float kr[kMaxWidth];  // (w) key j decoded
  for (int j = 0; j < len; ++j) {
    const uint8_t* src = k_base + k_offs[j];
    const float* row = kr;
    if (dec)
      dec(src, kr, w);
    else
      row = reinterpret_cast<const float*>(src);  // F32: read in place (cells are 4-byte aligned)
    for (int g0 = 0; g0 < nq; g0 += 4) {
      const int ng = std::min(4, nq - g0);
      const float* q[4];
      float s[4];
      for (int g = 0; g < ng; ++g) q[g] = qp + static_cast<size_t>(g0 + g) * w;
      if (ng == 4) dot_heads<4>(q, row, w, s);
      if (ng == 3) dot_heads<3>(q, row, w, s);
      if (ng == 2) dot_heads<2>(q, row, w, s);
      if (ng == 1) dot_heads<1>(q, row, w, s);
      for (int g = 0; g < ng; ++g) scores[static_cast<size_t>(g0 + g) * len + j] = s[g];
    }
  }
#else
  kv_scores_scalar(k, head_dim, qp, nq, k_base, k_offs, len, scores);
#endif
}

void kv_accumulate(DType v, int head_dim, const float* w, int nq, const uint8_t* v_base, const size_t* v_offs, int len,
                   float* acc) {
#if PG_KV_AVX2
  check_args(v, head_dim, nq, len);
  const int wd = kv_head_width(v, head_dim);
  const Decoder dec = simd_decoder(v);
  alignas(32) float vr[kMaxWidth];  // (wd) value j decoded
  for (int j = 0; j < len; ++j) {
    const uint8_t* src = v_base + v_offs[j];
    const float* row = vr;
    if (dec)
      dec(src, vr, wd);
    else
      row = reinterpret_cast<const float*>(src);
    for (int g = 0; g < nq; ++g)
      axpy_f32(w[static_cast<size_t>(g) * len + j], row, acc + static_cast<size_t>(g) * wd, wd);
  }
#else
  kv_accumulate_scalar(v, head_dim, w, nq, v_base, v_offs, len, acc);
#endif
}

void kv_finish_output(DType v, int head_dim, float* acc, float scale, float* out) {
  const int wd = kv_head_width(v, head_dim);
  if (v == DType::TQ3_0) tq3_rotate_inverse(acc, wd);  // linear, so scaling before or after is the same
  for (int d = 0; d < head_dim; ++d) out[d] = acc[d] * scale;
}

void kv_attention_head(DType k, DType v, int head_dim, const float* q, const uint8_t* k_base, const size_t* k_offs,
                       const uint8_t* v_base, const size_t* v_offs, int len, float scale, float* out) {
  check_kv_types(k, v, head_dim);
  PG_CHECK(len >= 1, "kv_attention_head: no keys");
  alignas(32) float qp[kMaxWidth];
  kv_prepare_query(k, head_dim, q, qp);
  std::vector<float> sc(static_cast<size_t>(len));  // (len) scores, then unnormalised probabilities
  kv_scores(k, head_dim, qp, 1, k_base, k_offs, len, sc.data());
  float mx = -INFINITY;
  for (float& s : sc) mx = std::max(mx, s *= scale);
  double sum = 0;
  for (float& s : sc) sum += (s = std::exp(s - mx));
  alignas(32) float acc[kMaxWidth] = {};
  kv_accumulate(v, head_dim, sc.data(), 1, v_base, v_offs, len, acc);
  kv_finish_output(v, head_dim, acc, static_cast<float>(1.0 / sum), out);
}

}  // namespace pg
