#include "core/kv_quant.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"

namespace pg {
namespace {

constexpr std::array kKvTypes = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                                 DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0};

// ---- TQ3_0 sign tables ---------------------------------------------------------------------------
// The rule (fixed forever: cached and on-disk KV bytes depend on it): Knuth's MMIX LCG
//   state <- state · 6364136223846793005 + 1442695040888963407 (mod 2^64), seed 0x9E3779B97F4A7C15,
// stepped 256 times; draw i is -1 when bit 63 of the state after step i + 1 is set, else +1.
// s1 = draws 0..127, s2 = draws 128..255. (The top bit of an LCG mod 2^64 is its best-mixed bit; the
// low bits have short periods and are not used.) tests/core/test_kv_quant.cpp pins the result.
constexpr std::array<float, 2 * kTq3Group> make_signs() {
  std::array<float, 2 * kTq3Group> s{};
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < s.size(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    s[i] = (state >> 63) ? -1.0f : 1.0f;
  }
  return s;
}
constexpr std::array<float, 2 * kTq3Group> kSigns = make_signs();

// 1/√128, rounded once: the FWHT's butterflies are exact sums, this is the only scaling.
constexpr float kInvSqrt128 = 0.08838834764831845f;

// Unnormalised 128-point Walsh–Hadamard transform in place (natural order, 7 butterfly stages). H is
// symmetric and H·H = 128·I, which is why the same routine serves the rotation and its inverse.
inline void fwht128(float* x) {
  for (int len = 1; len < kTq3Group; len <<= 1)
    for (int i = 0; i < kTq3Group; i += 2 * len)
      for (int j = i; j < i + len; ++j) {
        const float a = x[j], b = x[j + len];
        x[j] = a + b;
        x[j + len] = a - b;
      }
}

// x <- s_out ⊙ H(s_in ⊙ x) / √128 over one group.
inline void rotate_group(float* x, const float* s_in, const float* s_out) {
  for (int i = 0; i < kTq3Group; ++i) x[i] *= s_in[i];
  fwht128(x);
  for (int i = 0; i < kTq3Group; ++i) x[i] *= s_out[i] * kInvSqrt128;
}

void check_groups(int64_t n, const char* what) {
  PG_CHECK(n >= 0 && n % kTq3Group == 0,
           std::string(what) + ": " + std::to_string(n) + " values is not a multiple of the TQ3_0 group of 128");
}

}  // namespace

// Lloyd–Max levels of an 8-level quantizer for N(0, 1/128) — the distribution of one coordinate of a
// randomly rotated unit vector in 128 dimensions — as the reference stores them, and their midpoints.
const float kTq3Centroids[8] = {-0.190685f, -0.117832f, -0.065717f, -0.021460f,
                                0.021460f,  0.065717f,  0.117832f,  0.190685f};
const float kTq3Mids[7] = {-0.154259f, -0.091775f, -0.043589f, 0.0f, 0.043589f, 0.091775f, 0.154259f};

const float* tq3_signs(int which) {
  PG_CHECK(which == 0 || which == 1, "tq3_signs: which must be 0 (s1) or 1 (s2)");
  return kSigns.data() + which * kTq3Group;
}

void tq3_rotate(float* x, int64_t n) {
  check_groups(n, "tq3_rotate");
  for (int64_t g = 0; g < n; g += kTq3Group) rotate_group(x + g, kSigns.data(), kSigns.data() + kTq3Group);
}

void tq3_rotate_inverse(float* x, int64_t n) {
  check_groups(n, "tq3_rotate_inverse");
  for (int64_t g = 0; g < n; g += kTq3Group) rotate_group(x + g, kSigns.data() + kTq3Group, kSigns.data());
}

void tq3_quantize(const float* x, BlockTQ3_0* y, int64_t n) {
  check_groups(n, "tq3_quantize");
  for (int64_t g = 0; g < n; g += kTq3Group, x += kTq3Group, y += kTq3Group / kTq3Block) {
    // The norm in double: a sum of 128 squares in float loses bits, and the corrected norm below is
    // divided by a sum of squares too.
    double ss = 0;
    for (int i = 0; i < kTq3Group; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double nrm = std::sqrt(ss);
    float u[kTq3Group];
    const float inv = nrm > 0 ? static_cast<float>(1.0 / nrm) : 0.0f;  // an all-zero group stays zero
    for (int i = 0; i < kTq3Group; ++i) u[i] = x[i] * inv;
    rotate_group(u, kSigns.data(), kSigns.data() + kTq3Group);
    uint8_t idx[kTq3Group];
    double cs = 0;
    for (int i = 0; i < kTq3Group; ++i) {
      // Count of mids below u: the nearest centroid (ties to the lower one; NaN -> 0, still a valid index).
      int k = 0;
      for (float m : kTq3Mids) k += u[i] > m;
      idx[i] = static_cast<uint8_t>(k);
      cs += static_cast<double>(kTq3Centroids[k]) * kTq3Centroids[k];
    }
    // ‖c[idx]‖ >= √128 · 0.02146 > 0, so the division is always defined.
    const uint16_t norm = f32_to_fp16(static_cast<float>(nrm / std::sqrt(cs)));
    for (int b = 0; b < kTq3Group / kTq3Block; ++b) {
      BlockTQ3_0& blk = y[b];
      blk.norm = norm;
      std::memset(blk.qs, 0, sizeof blk.qs);
      std::memset(blk.signs, 0, sizeof blk.signs);
      for (int j = 0; j < kTq3Block; ++j) {
        const int k = idx[b * kTq3Block + j];
        blk.qs[j / 4] |= static_cast<uint8_t>((k & 3) << (2 * (j % 4)));
        blk.signs[j / 8] |= static_cast<uint8_t>((k >> 2) << (j % 8));
      }
    }
  }
}

void tq3_dequantize(const BlockTQ3_0* y, float* x, int64_t n) {
  PG_CHECK(n >= 0 && n % kTq3Block == 0,
           "tq3_dequantize: " + std::to_string(n) + " values is not a multiple of the TQ3_0 block of 32");
  for (int64_t b = 0; b < n / kTq3Block; ++b, x += kTq3Block) {
    const float d = fp16_to_f32(y[b].norm);
    for (int j = 0; j < kTq3Block; ++j) {
      const int k = ((y[b].qs[j / 4] >> (2 * (j % 4))) & 3) | (((y[b].signs[j / 8] >> (j % 8)) & 1) << 2);
      x[j] = kTq3Centroids[k] * d;
    }
  }
}

// ---- types -----------------------------------------------------------------------------------------

bool is_kv_type(DType t) { return std::find(kKvTypes.begin(), kKvTypes.end(), t) != kKvTypes.end(); }

std::string kv_type_name(DType t) {
  std::string s(dtype_name(t));
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string kv_type_list() {
  std::string s;
  for (DType t : kKvTypes) s += (s.empty() ? "" : ", ") + kv_type_name(t);
  return s;
}

DType parse_kv_type(std::string_view name) {
  const auto t = dtype_from_name(name);
  PG_CHECK(t && is_kv_type(*t),
           "unknown KV cache type '" + std::string(name) + "' (accepted: " + kv_type_list() + ")");
  return *t;
}

int kv_head_granule(DType t) {
  PG_CHECK(is_kv_type(t), std::string(dtype_name(t)) + " is not a KV cache type (accepted: " + kv_type_list() + ")");
  return t == DType::TQ3_0 ? kTq3Group : static_cast<int>(traits(t).block_size);
}

int kv_head_width(DType t, int head_dim) {
  const int g = kv_head_granule(t);
  PG_CHECK(head_dim >= 1 && head_dim <= kKvMaxHeadDim,
           "head_dim " + std::to_string(head_dim) + " is outside 1.." + std::to_string(kKvMaxHeadDim));
  return (head_dim + g - 1) / g * g;
}

size_t kv_head_bytes(DType t, int head_dim) { return row_bytes(t, kv_head_width(t, head_dim)); }

size_t kv_row_bytes(DType t, int n_head_kv, int head_dim) {
  PG_CHECK(n_head_kv >= 1, "n_head_kv must be at least 1");
  return static_cast<size_t>(n_head_kv) * kv_head_bytes(t, head_dim);
}

double kv_bits_per_value(DType t, int head_dim) { return 8.0 * static_cast<double>(kv_head_bytes(t, head_dim)) / head_dim; }

void check_kv_types(DType k, DType v, int head_dim) {
  PG_CHECK(is_kv_type(k), "K cache type " + kv_type_name(k) + " is not a KV cache type (accepted: " + kv_type_list() + ")");
  PG_CHECK(is_kv_type(v), "V cache type " + kv_type_name(v) + " is not a KV cache type (accepted: " + kv_type_list() + ")");
  PG_CHECK(head_dim >= 1 && head_dim <= kKvMaxHeadDim, "head_dim " + std::to_string(head_dim) +
                                                           " is outside the 1.." + std::to_string(kKvMaxHeadDim) +
                                                           " the KV cache kernels support");
}

// ---- row codecs ----------------------------------------------------------------------------------

void kv_quantize_row(DType t, const float* src, int n_head_kv, int head_dim, void* dst) {
  const int w = kv_head_width(t, head_dim);
  const size_t hb = kv_head_bytes(t, head_dim);
  auto* out = static_cast<uint8_t*>(dst);
  if (t != DType::TQ3_0 && w == head_dim) {  // no padding: the row is one run of blocks
    quantize_row(t, src, out, static_cast<int64_t>(n_head_kv) * head_dim);
    return;
  }
  float pad[kKvMaxHeadDim + kTq3Group];  // one head, zero tail
  for (int h = 0; h < n_head_kv; ++h) {
    const float* s = src + static_cast<int64_t>(h) * head_dim;
    if (w != head_dim) {
      std::copy(s, s + head_dim, pad);
      std::fill(pad + head_dim, pad + w, 0.0f);
      s = pad;
    }
    if (t == DType::TQ3_0)
      tq3_quantize(s, reinterpret_cast<BlockTQ3_0*>(out + h * hb), w);
    else
      quantize_row(t, s, out + h * hb, w);
  }
}

void kv_dequantize_head(DType t, const void* src, int head_dim, float* dst) {
  const int w = kv_head_width(t, head_dim);
  if (t == DType::TQ3_0)
    tq3_dequantize(static_cast<const BlockTQ3_0*>(src), dst, w);
  else
    dequantize_row(t, src, dst, w);
}

void kv_decode_row(DType t, const void* src, int n_head_kv, int head_dim, float* dst) {
  const int w = kv_head_width(t, head_dim);
  const size_t hb = kv_head_bytes(t, head_dim);
  const auto* in = static_cast<const uint8_t*>(src);
  float tmp[kKvMaxHeadDim + kTq3Group];
  for (int h = 0; h < n_head_kv; ++h) {
    kv_dequantize_head(t, in + h * hb, head_dim, tmp);
    if (t == DType::TQ3_0) tq3_rotate_inverse(tmp, w);
    std::copy(tmp, tmp + head_dim, dst + static_cast<int64_t>(h) * head_dim);
  }
}

}  // namespace pg
