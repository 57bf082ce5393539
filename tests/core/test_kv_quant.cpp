// KV-cache element formats (core/kv_quant): the type list and its errors, the per-head layout, the row
// codecs of every KV type, and TQ3_0 — its pinned sign tables, the rotation against the explicit
// Hadamard matrix, the quantizer against an independent brute-force one, the block packing, and
// robustness on arbitrary bytes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/kv_quant.h"
#include "core/quant.h"
#include "gguf/synth.h"

namespace pg {
namespace {

const std::vector<DType> kKv = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0,
                                DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::TQ3_0};

std::string type_param_name(const testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); }

std::vector<float> gaussian(size_t n, uint32_t seed, float sd = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// ---- types, names, ids --------------------------------------------------------------------------

TEST(KvTypes, NamesParseAndErrors) {
  for (DType t : kKv) {
    EXPECT_TRUE(is_kv_type(t));
    EXPECT_EQ(parse_kv_type(kv_type_name(t)), t);
  }
  EXPECT_EQ(parse_kv_type("TQ3_0"), DType::TQ3_0);
  EXPECT_EQ(parse_kv_type("Q8_0"), DType::Q8_0);
  EXPECT_EQ(kv_type_list(), "f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, tq3_0");
  // A weight-only type and nonsense: a clear error naming the accepted types.
  for (const char* bad : {"q4_k", "q8_1", "iq4_nl", "fp8", "", "tq3"}) {
    try {
      parse_kv_type(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("accepted: f32, f16"), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(is_kv_type(DType::Q4_K));
  EXPECT_THROW(check_kv_types(DType::Q4_K, DType::F16, 128), Error);
  EXPECT_THROW(check_kv_types(DType::F16, DType::IQ4_XS, 128), Error);
  EXPECT_THROW(check_kv_types(DType::F16, DType::F16, 0), Error);
  EXPECT_THROW(check_kv_types(DType::F16, DType::F16, kKvMaxHeadDim + 1), Error);
  for (DType k : kKv)
    for (DType v : kKv) EXPECT_NO_THROW(check_kv_types(k, v, 128));
}

TEST(KvTypes, Tq3IdIsInternal) {
  // Not a GGUF type: the file lookup rejects the id, and GGML's TQ3_0 id (42, the fork's) stays unknown.
  EXPECT_GE(static_cast<uint32_t>(DType::TQ3_0), kFirstInternalDTypeId);
  EXPECT_FALSE(dtype_traits(static_cast<uint32_t>(DType::TQ3_0)).has_value());
  EXPECT_FALSE(dtype_traits(42).has_value());
  EXPECT_EQ(dtype_from_name("tq3_0"), DType::TQ3_0);
  EXPECT_FALSE(traits(DType::TQ3_0).supported);  // not a weight type
  EXPECT_FALSE(can_quantize(DType::TQ3_0));
  EXPECT_EQ(row_bytes(DType::TQ3_0, 128), 56u);
}

// ---- layout -----------------------------------------------------------------------------------------

TEST(KvLayout, WidthsBytesBits) {
  EXPECT_EQ(kv_head_bytes(DType::F16, 128), 256u);
  EXPECT_EQ(kv_head_bytes(DType::Q8_0, 128), 136u);
  EXPECT_EQ(kv_head_bytes(DType::Q4_0, 128), 72u);
  EXPECT_EQ(kv_head_bytes(DType::TQ3_0, 128), 56u);
  EXPECT_DOUBLE_EQ(kv_bits_per_value(DType::TQ3_0, 256), 3.5);
  EXPECT_DOUBLE_EQ(kv_bits_per_value(DType::Q4_0, 128), 4.5);
  EXPECT_DOUBLE_EQ(kv_bits_per_value(DType::Q8_0, 64), 8.5);
  EXPECT_DOUBLE_EQ(kv_bits_per_value(DType::BF16, 80), 16.0);
  // Padding: stories260K (head_dim 8), a 64-dim head under TQ3_0, an 80-dim head under Q4_0.
  EXPECT_EQ(kv_head_width(DType::Q8_0, 8), 32);
  EXPECT_EQ(kv_head_width(DType::F16, 8), 8);
  EXPECT_EQ(kv_head_width(DType::TQ3_0, 64), 128);
  EXPECT_DOUBLE_EQ(kv_bits_per_value(DType::TQ3_0, 64), 7.0);
  EXPECT_EQ(kv_head_width(DType::Q4_0, 80), 96);
  // Row = heads × head bytes: qwen3-8b (8 KV heads × 128) and qwen35-27b (4 × 256).
  EXPECT_EQ(kv_row_bytes(DType::F16, 8, 128), 2048u);
  EXPECT_EQ(kv_row_bytes(DType::TQ3_0, 4, 256), 448u);
  EXPECT_EQ(kv_row_bytes(DType::Q8_0, 4, 256), 1088u);
  EXPECT_THROW(kv_row_bytes(DType::F16, 0, 128), Error);
  EXPECT_THROW(kv_head_width(DType::Q6_K, 128), Error);
}

// The K/V row widths of real models need no padding: every `gguf synth` preset (published configs of
// llama 3, qwen3, qwen3moe, qwen35, ...) has head_dim a multiple of 32, and the qwen3 / qwen35 ones a
// multiple of 128 (tq3_0's group), so their rows are exactly n_head_kv whole-block heads.
TEST(KvLayout, RealModelHeadsNeedNoPadding) {
  int n = 0;
  for (const auto& name : gguf::synth_preset_names()) {
    const auto cfg = gguf::synth_preset(name);
    const int hd = static_cast<int>(cfg.head_dim_or_default());
    ASSERT_GT(hd, 0) << name;
    for (DType t : {DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1})
      EXPECT_EQ(kv_head_width(t, hd), hd) << name << " " << dtype_name(t);
    if (cfg.arch.rfind("qwen3", 0) == 0) {
      EXPECT_EQ(kv_head_width(DType::TQ3_0, hd), hd) << name;
    }
    EXPECT_EQ(kv_row_bytes(DType::Q8_0, static_cast<int>(cfg.n_head_kv), hd),
              row_bytes(DType::Q8_0, cfg.n_head_kv * hd)) << name;
    ++n;
  }
  EXPECT_GE(n, 5);
}

// ---- row codecs of every type ------------------------------------------------------------------------

class KvCodec : public testing::TestWithParam<DType> {};

// Round trip through kv_quantize_row / kv_decode_row for several shapes (with and without padding):
// relative RMS error within the type's class, and the real values do not depend on the padding.
TEST_P(KvCodec, RoundTripWithinTypeBound) {
  const DType t = GetParam();
  // Bound on ‖x̂ − x‖ / ‖x‖ for Gaussian data: exact for F32, half/bf16 rounding, then 8, 5, 4 bits and TQ3.
  const double bound = t == DType::F32    ? 0.0
                       : t == DType::F16  ? 5e-4
                       : t == DType::BF16 ? 4e-3
                       : t == DType::Q8_0 ? 0.01
                       : (t == DType::Q5_0 || t == DType::Q5_1) ? 0.06
                       : (t == DType::Q4_0 || t == DType::Q4_1) ? 0.12
                                                                : 0.20;  // TQ3_0: measured ~0.17
  for (auto [nh, hd] : {std::pair{8, 128}, {4, 256}, {2, 64}, {3, 8}, {2, 80}, {1, 200}}) {
    const auto x = gaussian(static_cast<size_t>(nh) * hd, 7u + static_cast<uint32_t>(hd));
    std::vector<uint8_t> q(kv_row_bytes(t, nh, hd));
    kv_quantize_row(t, x.data(), nh, hd, q.data());
    std::vector<float> y(x.size());
    kv_decode_row(t, q.data(), nh, hd, y.data());
    double e2 = 0, x2 = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      e2 += (y[i] - x[i]) * static_cast<double>(y[i] - x[i]);
      x2 += static_cast<double>(x[i]) * x[i];
    }
    EXPECT_LE(std::sqrt(e2 / x2), bound) << dtype_name(t) << " nh=" << nh << " hd=" << hd;
    if (t != DType::TQ3_0) {
      // Each head alone (padded by hand) decodes to the same values: heads are independent blocks.
      const int w = kv_head_width(t, hd);
      for (int h = 0; h < nh; ++h) {
        std::vector<float> padded(static_cast<size_t>(w), 0.0f), back(static_cast<size_t>(w));
        std::copy(x.begin() + h * hd, x.begin() + (h + 1) * hd, padded.begin());
        std::vector<uint8_t> qb(row_bytes(t, w));
        quantize_row(t, padded.data(), qb.data(), w);
        EXPECT_EQ(0, std::memcmp(qb.data(), q.data() + h * kv_head_bytes(t, hd), qb.size())) << "head " << h;
        kv_dequantize_head(t, q.data() + h * kv_head_bytes(t, hd), hd, back.data());
        // Padding decodes to zero for the symmetric types, to within one step for the affine ones (Q4_1 /
        // Q5_1 do not represent 0 exactly). Either way it never counts: the query's padding is zero and
        // the output's is dropped.
        const bool affine = t == DType::Q4_1 || t == DType::Q5_1;
        for (int d = hd; d < w; ++d)
          if (affine)
            EXPECT_LT(std::fabs(back[d]), 0.5f) << "padding";
          else
            EXPECT_EQ(back[d], 0.0f) << "padding decodes to zero";
      }
    }
  }
}

// Without padding, a row is exactly GGML's bytes of the whole row (quantize_row = ggml-cpu from_float).
TEST_P(KvCodec, UnpaddedRowIsGgmlBytes) {
  const DType t = GetParam();
  if (t == DType::TQ3_0) GTEST_SKIP() << "TQ3_0 is our own format, tested below";
  const auto x = gaussian(8 * 128, 11);
  std::vector<uint8_t> a(kv_row_bytes(t, 8, 128)), b(row_bytes(t, 8 * 128));
  ASSERT_EQ(a.size(), b.size());
  kv_quantize_row(t, x.data(), 8, 128, a.data());
  quantize_row(t, x.data(), b.data(), 8 * 128);
  EXPECT_EQ(a, b);
}

// Arbitrary bytes never crash a decoder; blocks with a finite scale decode to finite values.
TEST_P(KvCodec, ArbitraryBytesDecode) {
  const DType t = GetParam();
  std::mt19937 rng(99);
  for (int hd : {8, 64, 80, 128, 256}) {
    const int nh = 3;
    std::vector<uint8_t> q(kv_row_bytes(t, nh, hd));
    std::vector<float> head(static_cast<size_t>(kv_head_width(t, hd))), row(static_cast<size_t>(nh) * hd);
    for (int it = 0; it < 200; ++it) {
      for (auto& b : q) b = static_cast<uint8_t>(rng());
      if (it % 4 == 0)  // every 4th: plant infinities and NaNs in fp16 scale / value positions
        for (size_t i = 0; i + 1 < q.size(); i += 14) q[i + 1] = (it % 8 == 0) ? 0x7C : 0xFE;
      for (int h = 0; h < nh; ++h) kv_dequantize_head(t, q.data() + h * kv_head_bytes(t, hd), hd, head.data());
      kv_decode_row(t, q.data(), nh, hd, row.data());
    }
  }
  // A finite-norm TQ3_0 block of random indices decodes to finite values of magnitude <= 0.190685·norm.
  if (t == DType::TQ3_0) {
    BlockTQ3_0 b[4];
    for (auto& blk : b) {
      auto* p = reinterpret_cast<uint8_t*>(&blk);
      for (size_t i = 0; i < sizeof blk; ++i) p[i] = static_cast<uint8_t>(rng());
      blk.norm = f32_to_fp16(3.0f);
    }
    float y[128];
    tq3_dequantize(b, y, 128);
    for (float v : y) EXPECT_TRUE(std::isfinite(v) && std::fabs(v) <= 0.190685f * 3.0f + 1e-6f);
  }
}

// Non-finite input quantizes without crashing (values are unspecified).
TEST_P(KvCodec, NonFiniteInputDoesNotCrash) {
  const DType t = GetParam();
  auto x = gaussian(2 * 128, 5);
  x[3] = NAN;
  x[130] = INFINITY;
  x[200] = -INFINITY;
  std::vector<uint8_t> q(kv_row_bytes(t, 2, 128));
  kv_quantize_row(t, x.data(), 2, 128, q.data());
  std::vector<float> y(x.size());
  kv_decode_row(t, q.data(), 2, 128, y.data());
  SUCCEED();
}

INSTANTIATE_TEST_SUITE_P(AllKvTypes, KvCodec, testing::ValuesIn(kKv), type_param_name);

// ---- TQ3_0 -------------------------------------------------------------------------------------------

// The sign tables are part of the format (cached and on-disk bytes depend on them). Bit i of the words
// is set where entry i is -1; the words were computed from the documented LCG rule by a separate
// Python script, not by this code.
TEST(Tq3, SignTablesPinned) {
  const uint32_t want[2][4] = {{0x6eaf644e, 0x4feb7d1c, 0xb96fcbaa, 0xdf863153},
                               {0x300de63d, 0x5ad0ef84, 0x8213e45f, 0x4a57c6a6}};
  for (int t = 0; t < 2; ++t) {
    const float* s = tq3_signs(t);
    for (int w = 0; w < 4; ++w) {
      uint32_t got = 0;
      for (int b = 0; b < 32; ++b) {
        const float v = s[w * 32 + b];
        ASSERT_TRUE(v == 1.0f || v == -1.0f);
        got |= static_cast<uint32_t>(v < 0) << b;
      }
      EXPECT_EQ(got, want[t][w]) << "table " << t << " word " << w;
    }
  }
  EXPECT_THROW(tq3_signs(2), Error);
}

TEST(Tq3, CodebookIsSortedWithMidpoints) {
  for (int i = 0; i < 7; ++i) {
    EXPECT_LT(kTq3Centroids[i], kTq3Centroids[i + 1]);
    EXPECT_NEAR(kTq3Mids[i], 0.5f * (kTq3Centroids[i] + kTq3Centroids[i + 1]), 1e-6f);
  }
}

// The rotation is s2 ⊙ H(s1 ⊙ x)/√128 with the Sylvester Hadamard matrix H[i][j] = (-1)^popcount(i&j):
// checked against that matrix in double, plus orthogonality (inverse, norm and dot products kept).
TEST(Tq3, RotationIsTheOrthogonalHadamardProduct) {
  const auto x = gaussian(256, 3), y = gaussian(256, 4);
  std::vector<float> rx = x, ry = y;
  tq3_rotate(rx.data(), 256);
  tq3_rotate(ry.data(), 256);
  const float* s1 = tq3_signs(0);
  const float* s2 = tq3_signs(1);
  for (int g = 0; g < 2; ++g)
    for (int i = 0; i < 128; ++i) {
      double v = 0;
      for (int j = 0; j < 128; ++j)
        v += ((std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0) * s1[j] * x[g * 128 + j];
      v *= s2[i] / std::sqrt(128.0);
      EXPECT_NEAR(rx[g * 128 + i], v, 1e-5) << g << "," << i;
    }
  double dx = 0, drx = 0, nx = 0, nrx = 0;
  for (int i = 0; i < 256; ++i) {
    dx += static_cast<double>(x[i]) * y[i];
    drx += static_cast<double>(rx[i]) * ry[i];
    nx += static_cast<double>(x[i]) * x[i];
    nrx += static_cast<double>(rx[i]) * rx[i];
  }
  EXPECT_NEAR(drx, dx, 1e-4);
  EXPECT_NEAR(nrx, nx, 1e-3);
  tq3_rotate_inverse(rx.data(), 256);
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(rx[i], x[i], 1e-5);
  EXPECT_THROW(tq3_rotate(rx.data(), 100), Error);
  EXPECT_THROW(tq3_rotate_inverse(rx.data(), 129), Error);
}

// The quantizer against a brute-force one written from the format description: rotate in double,
// nearest centroid by distance (not through the mids), corrected norm; bytes must match.
TEST(Tq3, QuantizerMatchesBruteForce) {
  const float* s1 = tq3_signs(0);
  const float* s2 = tq3_signs(1);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    auto x = gaussian(128, 100 + seed, seed % 2 ? 1.0f : 30.0f);
    if (seed % 3 == 0) x[seed] *= 25.0f;  // an outlier channel
    double n2 = 0;
    for (float v : x) n2 += static_cast<double>(v) * v;
    const double n = std::sqrt(n2);
    int idx[128];
    double c2 = 0;
    for (int i = 0; i < 128; ++i) {
      double u = 0;
      for (int j = 0; j < 128; ++j) u += ((std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0) * s1[j] * x[j] / n;
      u *= s2[i] / std::sqrt(128.0);
      int best = 0;
      for (int k = 1; k < 8; ++k)
        if (std::fabs(u - kTq3Centroids[k]) < std::fabs(u - kTq3Centroids[best])) best = k;
      idx[i] = best;
      c2 += static_cast<double>(kTq3Centroids[best]) * kTq3Centroids[best];
    }
    BlockTQ3_0 got[4];
    tq3_quantize(x.data(), got, 128);
    // A value within float rounding of a decision mid could go either way; none does for these seeds.
    int differ = 0;
    for (int i = 0; i < 128; ++i) {
      const BlockTQ3_0& b = got[i / 32];
      const int j = i % 32;
      const int k = ((b.qs[j / 4] >> (2 * (j % 4))) & 3) | (((b.signs[j / 8] >> (j % 8)) & 1) << 2);
      differ += k != idx[i];
    }
    EXPECT_EQ(differ, 0) << "seed " << seed;
    const float want_norm = static_cast<float>(n / std::sqrt(c2));
    for (int b = 0; b < 4; ++b) EXPECT_EQ(got[b].norm, f32_to_fp16(want_norm)) << "norm stored in every block";
    // The decoded group keeps the input's norm (up to the fp16 rounding of the stored norm).
    float y[128];
    tq3_dequantize(got, y, 128);
    double y2 = 0;
    for (float v : y) y2 += static_cast<double>(v) * v;
    EXPECT_NEAR(std::sqrt(y2) / n, 1.0, 1e-3);
  }
}

// Packing: element j's index is low2 at bits 2(j%4) of qs[j/4] plus 4 × bit j%8 of signs[j/8].
TEST(Tq3, BlockPacking) {
  BlockTQ3_0 b{};
  b.norm = f32_to_fp16(2.0f);
  for (int j = 0; j < 32; ++j) {
    const int k = (j * 5 + 3) % 8;
    b.qs[j / 4] |= static_cast<uint8_t>((k & 3) << (2 * (j % 4)));
    b.signs[j / 8] |= static_cast<uint8_t>((k >> 2) << (j % 8));
  }
  float y[32];
  tq3_dequantize(&b, y, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], kTq3Centroids[(j * 5 + 3) % 8] * 2.0f) << j;
  // Hand-checked bytes: element 0 index 3 -> qs[0] bits 0-1 = 3, signs bit 0 = 0; element 1 index 0.
  EXPECT_EQ(b.qs[0] & 0x0F, 0x03);
  EXPECT_EQ(b.signs[0] & 0x03, 0x00);
  EXPECT_THROW(tq3_dequantize(&b, y, 31), Error);
  EXPECT_THROW(tq3_quantize(y, &b, 32), Error);
}

TEST(Tq3, ZeroGroupStaysZero) {
  std::vector<float> x(128, 0.0f), y(128, 1.0f);
  BlockTQ3_0 b[4];
  tq3_quantize(x.data(), b, 128);
  tq3_dequantize(b, y.data(), 128);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// Dot products survive the rotation: q·k ≈ R(q)·deq(tq3(k)) within the quantization error, and that
// is the same number as q·decode_row(k) (decode_row un-rotates).
TEST(Tq3, RotatedQueryDotsTheRotatedKey) {
  const auto q = gaussian(256, 21), k = gaussian(256, 22);
  std::vector<uint8_t> kq(kv_row_bytes(DType::TQ3_0, 1, 256));
  kv_quantize_row(DType::TQ3_0, k.data(), 1, 256, kq.data());
  std::vector<float> kr(256), kd(256), rq = q;
  kv_dequantize_head(DType::TQ3_0, kq.data(), 256, kr.data());
  kv_decode_row(DType::TQ3_0, kq.data(), 1, 256, kd.data());
  tq3_rotate(rq.data(), 256);
  double rot = 0, dec = 0, exact = 0, qn = 0, kn = 0;
  for (int i = 0; i < 256; ++i) {
    rot += static_cast<double>(rq[i]) * kr[i];
    dec += static_cast<double>(q[i]) * kd[i];
    exact += static_cast<double>(q[i]) * k[i];
    qn += static_cast<double>(q[i]) * q[i];
    kn += static_cast<double>(k[i]) * k[i];
  }
  EXPECT_NEAR(rot, dec, 1e-3);
  EXPECT_LT(std::fabs(rot - exact), 0.25 * std::sqrt(qn * kn) / std::sqrt(16.0));  // error << ‖q‖‖k‖
}

}  // namespace
}  // namespace pg
