// Quantization and dot-product tests: the golden single-kernel references of shared/golden/kernels
// (activation bytes and W·x values from ggml-cpu), scalar-vs-SIMD agreement, quantize/dequantize
// round trips, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"
#include "gguf/gguf.h"
#include "testutil.h"

namespace pg {
namespace {

using test::read_bytes;
using test::read_f32;
using test::read_text;
using test::shared_path;

// Every weight type with a dot product.
const std::vector<DType> kDotTypes = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,   DType::Q4_1,
                                      DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,   DType::Q3_K,
                                      DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

std::string type_param_name(const testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); }

// ---- golden kernels (shared/golden/kernels, README §7) --------------------------------------------

// Where each kernel case's weight matrix comes from (README §7 / manifest.json "kernels").
struct WeightSource {
  const char* type;
  const char* file;    // under golden/
  const char* tensor;  // empty: raw row-major blocks in `file`
};
const WeightSource kKernelSources[] = {
    {"F16", "models/tiny-llama-f16.gguf", "blk.0.ffn_down.weight"},
    {"BF16", "kernels/BF16.weight.bin", ""},
    {"Q8_0", "models/tiny-llama-Q8_0.gguf", "blk.0.ffn_down.weight"},
    {"Q4_0", "models/tiny-llama-Q4_0.gguf", "blk.0.ffn_down.weight"},
    {"Q4_1", "models/tiny-llama-Q4_1.gguf", "blk.0.ffn_down.weight"},
    {"Q5_0", "models/tiny-llama-Q5_0.gguf", "blk.0.ffn_down.weight"},
    {"Q5_1", "models/tiny-llama-Q5_1.gguf", "blk.0.ffn_down.weight"},
    {"Q2_K", "models/tiny-llama-Q2_K.gguf", "blk.0.ffn_gate.weight"},
    {"Q3_K", "models/tiny-llama-Q2_K.gguf", "blk.0.ffn_down.weight"},
    {"Q4_K", "models/tiny-llama-Q4_K_M.gguf", "blk.0.ffn_down.weight"},
    {"Q5_K", "models/tiny-llama-Q5_K_M.gguf", "blk.0.ffn_down.weight"},
    {"Q6_K", "models/tiny-llama-Q6_K.gguf", "blk.0.ffn_down.weight"},
    {"IQ4_NL", "kernels/IQ4_NL.weight.bin", ""},
    {"IQ4_XS", "models/tiny-llama-IQ4_XS.gguf", "blk.0.ffn_down.weight"},
};

struct KernelMeta {
  DType wt, vt;
  int64_t n_in, rows, act_row_bytes;
};

KernelMeta read_meta(const std::string& name) {
  std::istringstream ss(read_text(shared_path("golden/kernels/" + name + ".meta")));
  std::string w, v;
  KernelMeta m{};
  ss >> w >> v >> m.n_in >> m.rows >> m.act_row_bytes;
  if (ss.fail()) throw std::runtime_error("bad meta for " + name);
  auto wt = dtype_from_name(w), vt = dtype_from_name(v);
  if (!wt || !vt) throw std::runtime_error("unknown type in meta of " + name);
  m.wt = *wt;
  m.vt = *vt;
  return m;
}

std::vector<uint8_t> load_kernel_weights(const std::string& name, const KernelMeta& m) {
  const size_t bytes = row_bytes(m.wt, m.n_in) * static_cast<size_t>(m.rows);
  for (const auto& s : kKernelSources) {
    if (name != s.type) continue;
    if (!*s.tensor) {
      auto w = read_bytes(shared_path(std::string("golden/") + s.file));
      EXPECT_EQ(w.size(), bytes) << s.file;
      return w;
    }
    auto f = gguf::File::open(shared_path(std::string("golden/") + s.file).string());
    const auto* t = f->find_tensor(s.tensor);
    if (!t) throw std::runtime_error(std::string("missing tensor ") + s.tensor + " in " + s.file);
    EXPECT_EQ(t->type, m.wt) << s.file << " " << s.tensor;
    EXPECT_EQ(t->ne[0], m.n_in);
    EXPECT_EQ(t->ne[1], m.rows);
    EXPECT_EQ(t->nbytes, bytes);
    return std::vector<uint8_t>(t->data, t->data + std::min<uint64_t>(t->nbytes, bytes));
  }
  throw std::runtime_error("no weight source for kernel case " + name);
}

// Fp16 field at byte offset `off` of each block of a Q?_1-style row.
float block_half(const uint8_t* row, size_t block_bytes, int64_t b, size_t off) {
  uint16_t h;
  std::memcpy(&h, row + static_cast<size_t>(b) * block_bytes + off, 2);
  return fp16_to_f32(h);
}

class GoldenKernel : public testing::TestWithParam<const char*> {};

// Tolerance of a dot product, relative to S = Σ|w_i·x_i| (+ Σ|m·s| for Q4_1/Q5_1): float32 sums of
// a few hundred terms in different orders differ by a few 1e-8·S; 1e-6·S leaves a wide margin while
// still catching any wrong term (one element of a 512-long row is ~2e-3·S).
constexpr double kDotRelTol = 1e-6;

TEST_P(GoldenKernel, ActivationBytesAndDotProductsMatchGgml) {
  const std::string name = GetParam();
  const KernelMeta m = read_meta(name);
  ASSERT_EQ(std::string(dtype_name(m.wt)), name);
  EXPECT_EQ(vec_dot_type(m.wt), m.vt);
  ASSERT_EQ(row_bytes(m.vt, m.n_in), static_cast<size_t>(m.act_row_bytes));

  const auto x = read_f32(shared_path("golden/kernels/x.f32"));                   // [4][512]
  const auto xq = read_bytes(shared_path("golden/kernels/" + name + ".xq.bin"));  // [4][act_row_bytes]
  const auto y = read_f32(shared_path("golden/kernels/" + name + ".y.f32"));      // [4][rows]
  ASSERT_EQ(x.size(), 4u * 512);
  ASSERT_EQ(xq.size(), 4u * static_cast<size_t>(m.act_row_bytes));
  ASSERT_EQ(y.size(), 4u * static_cast<size_t>(m.rows));
  const auto w = load_kernel_weights(name, m);
  ASSERT_EQ(w.size(), row_bytes(m.wt, m.n_in) * static_cast<size_t>(m.rows));

  // (a) activation conversion reproduces ggml-cpu's bytes exactly, SIMD and scalar.
  std::vector<uint8_t> q(static_cast<size_t>(m.act_row_bytes)), qs(q.size());
  for (int k = 0; k < 4; ++k) {
    quantize_row(m.vt, x.data() + 512 * k, q.data(), m.n_in);
    quantize_row_scalar(m.vt, x.data() + 512 * k, qs.data(), m.n_in);
    const uint8_t* ref = xq.data() + static_cast<size_t>(k) * m.act_row_bytes;
    size_t bad = 0, bad_s = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      bad += q[i] != ref[i];
      bad_s += qs[i] != ref[i];
    }
    EXPECT_EQ(bad, 0u) << name << " activation row " << k << ": " << bad << " of " << q.size() << " bytes differ";
    EXPECT_EQ(bad_s, 0u) << name << " activation row " << k << " (scalar): " << bad_s << " bytes differ";
  }

  // (b) vec_dot over every row reproduces ggml's y; (c) the scalar path agrees; and ggml's y agrees
  // with a float64 dot of our dequantized rows (checks the dequantizers).
  const size_t wrow = row_bytes(m.wt, m.n_in);
  const bool is_1 = m.wt == DType::Q4_1 || m.wt == DType::Q5_1;
  const size_t wblock = traits(m.wt).type_size, xblock = traits(m.vt).type_size;
  std::vector<float> wf(static_cast<size_t>(m.n_in)), xf(static_cast<size_t>(m.n_in));
  double max_simd = 0, max_scalar = 0, max_f64 = 0, max_simd_vs_scalar = 0;
  for (int k = 0; k < 4; ++k) {
    const uint8_t* xr = xq.data() + static_cast<size_t>(k) * m.act_row_bytes;
    dequantize_row(m.vt, xr, xf.data(), m.n_in);
    for (int64_t r = 0; r < m.rows; ++r) {
      const uint8_t* wr = w.data() + static_cast<size_t>(r) * wrow;
      dequantize_row(m.wt, wr, wf.data(), m.n_in);
      double exact = 0, scale = 0;
      for (int64_t i = 0; i < m.n_in; ++i) {
        exact += static_cast<double>(wf[i]) * xf[i];
        scale += std::fabs(static_cast<double>(wf[i]) * xf[i]);
      }
      if (is_1) {
        // ggml folds the min through s = fp16(d·Σq) instead of Σ(d·q): use the same form.
        for (int64_t b = 0; b < m.n_in / 32; ++b) {
          const double mw = block_half(wr, wblock, b, 2), s = block_half(xr, xblock, b, 2);
          double sx = 0;
          for (int i = 0; i < 32; ++i) sx += xf[32 * b + i];
          exact += mw * (s - sx);
          scale += std::fabs(mw * s);
        }
      }
      const double ref = y[static_cast<size_t>(k * m.rows + r)];
      const double got = vec_dot(m.wt, m.n_in, wr, xr);
      const double got_s = vec_dot_scalar(m.wt, m.n_in, wr, xr);
      const double denom = scale > 0 ? scale : 1e-30;
      max_simd = std::max(max_simd, std::fabs(got - ref) / denom);
      max_scalar = std::max(max_scalar, std::fabs(got_s - ref) / denom);
      max_f64 = std::max(max_f64, std::fabs(exact - ref) / denom);
      max_simd_vs_scalar = std::max(max_simd_vs_scalar, std::fabs(got - got_s) / denom);
      ASSERT_LE(std::fabs(got - ref), kDotRelTol * scale)
          << name << " row " << r << " x" << k << " simd " << got << " ggml " << ref;
      ASSERT_LE(std::fabs(got_s - ref), kDotRelTol * scale) << name << " row " << r << " x" << k << " scalar " << got_s;
      ASSERT_LE(std::fabs(exact - ref), kDotRelTol * scale) << name << " row " << r << " x" << k << " f64 " << exact;
    }
  }
  std::printf("[ kernel   ] %-6s max |err|/S: simd %.2e  scalar %.2e  simd-scalar %.2e  f64(dequant)-ggml %.2e%s\n", name.c_str(),
              max_simd, max_scalar, max_simd_vs_scalar, max_f64, vec_dot_has_simd(m.wt) ? "" : " (no simd)");
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenKernel,
                         testing::Values("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                                         "Q6_K", "IQ4_NL", "IQ4_XS"),
                         [](const testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

TEST(GoldenKernel, EveryKernelCaseIsCovered) {
  // A new golden case without a weight source above should fail here, not be silently ignored.
  std::vector<std::string> metas;
  for (const auto& e : std::filesystem::directory_iterator(shared_path("golden/kernels")))
    if (e.path().extension() == ".meta") metas.push_back(e.path().stem().string());
  EXPECT_EQ(metas.size(), std::size(kKernelSources));
  for (const auto& n : metas) {
    bool found = false;
    for (const auto& s : kKernelSources) found |= n == s.type;
    EXPECT_TRUE(found) << "kernel case " << n << " has no weight source in this test";
  }
}

// ---- scalar vs SIMD on random data --------------------------------------------------------------

// Fills a row of blocks with random bytes, then puts sane fp16 values into the scale fields, so every
// quant bit pattern is exercised without NaN/Inf scales.
void random_blocks(DType t, uint8_t* p, int64_t n, std::mt19937& rng) {
  const auto& tr = traits(t);
  const size_t nb = static_cast<size_t>(n / tr.block_size);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> sc(-0.05f, 0.05f);
  for (size_t i = 0; i < nb * tr.type_size; ++i) p[i] = static_cast<uint8_t>(byte(rng));
  auto put = [&](size_t block, size_t off, float v) {
    const uint16_t h = t == DType::BF16 ? f32_to_bf16(v) : f32_to_fp16(v);
    std::memcpy(p + block * tr.type_size + off, &h, 2);
  };
  for (size_t b = 0; b < nb; ++b) {
    switch (t) {
      case DType::F32: {
        const float v = sc(rng) * 40;
        std::memcpy(p + 4 * b, &v, 4);
        break;
      }
      case DType::F16:
      case DType::BF16:
        put(b, 0, sc(rng) * 40);
        break;
      case DType::Q4_1:
      case DType::Q5_1:
      case DType::Q4_K:
      case DType::Q5_K:
        put(b, 0, sc(rng));
        put(b, 2, sc(rng));
        break;
      case DType::Q2_K:
        put(b, offsetof(BlockQ2_K, d), sc(rng));
        put(b, offsetof(BlockQ2_K, dmin), sc(rng));
        break;
      case DType::Q3_K:
        put(b, offsetof(BlockQ3_K, d), sc(rng));
        break;
      case DType::Q6_K:
        put(b, offsetof(BlockQ6_K, d), sc(rng));
        break;
      default:
        put(b, 0, sc(rng));
        break;  // Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS: d first
    }
  }
}

std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sigma);
  std::vector<float> v(n);
  for (auto& e : v) e = nd(rng);
  return v;
}

class DotPaths : public testing::TestWithParam<DType> {};

TEST_P(DotPaths, SimdAgreesWithScalar) {
  const DType t = GetParam();
  const DType vt = vec_dot_type(t);
  constexpr int64_t n = 2048;  // a multiple of every block size
  std::mt19937 rng(1234 + static_cast<uint32_t>(t));
  std::vector<uint8_t> w(row_bytes(t, n)), xq(row_bytes(vt, n));
  std::vector<float> wf(n), xf(n);
  double worst = 0;
  for (int trial = 0; trial < 40; ++trial) {
    // Alternate random raw blocks with weights produced by the quantizer from Gaussian data.
    if (trial % 2 == 0) {
      random_blocks(t, w.data(), n, rng);
    } else {
      const auto src = gaussian(n, 99 + trial);
      quantize_weights(t, src.data(), w.data(), n);
    }
    auto xs = gaussian(n, 7 + trial, trial % 3 == 0 ? 0.01f : 1.f);
    if (trial % 5 == 0) xs[static_cast<size_t>(trial * 37) % n] = 60.f;  // outlier
    quantize_row(vt, xs.data(), xq.data(), n);
    dequantize_row(t, w.data(), wf.data(), n);
    dequantize_row(vt, xq.data(), xf.data(), n);
    double scale = 0;
    for (int64_t i = 0; i < n; ++i) scale += std::fabs(static_cast<double>(wf[i]) * xf[i]);
    if (t == DType::Q4_1 || t == DType::Q5_1) {
      for (int64_t b = 0; b < n / 32; ++b)
        scale += std::fabs(block_half(w.data(), traits(t).type_size, b, 2) * block_half(xq.data(), traits(vt).type_size, b, 2));
    }
    const double a = vec_dot(t, n, w.data(), xq.data());
    const double s = vec_dot_scalar(t, n, w.data(), xq.data());
    ASSERT_TRUE(std::isfinite(a) && std::isfinite(s));
    ASSERT_LE(std::fabs(a - s), kDotRelTol * scale) << dtype_name(t) << " trial " << trial << ": simd " << a << " scalar " << s;
    worst = std::max(worst, std::fabs(a - s) / (scale > 0 ? scale : 1));
  }
  std::printf("[ dot      ] %-6s simd vs scalar max |diff|/S = %.2e%s\n", std::string(dtype_name(t)).c_str(), worst,
              vec_dot_has_simd(t) ? "" : " (no simd in this build: same code)");
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DotPaths, testing::ValuesIn(kDotTypes), type_param_name);

TEST(DotPaths, OddLengthsUseTheTailsCorrectly) {
  // Plain types accept any n: check the SIMD tails against a float64 sum.
  for (int64_t n : {1, 7, 8, 9, 31, 33, 100}) {
    const auto a = gaussian(static_cast<size_t>(n), 5), b = gaussian(static_cast<size_t>(n), 6);
    std::vector<uint16_t> ah(n), bh(n), ab(n), bb(n);
    quantize_row(DType::F16, a.data(), ah.data(), n);
    quantize_row(DType::F16, b.data(), bh.data(), n);
    quantize_row(DType::BF16, a.data(), ab.data(), n);
    quantize_row(DType::BF16, b.data(), bb.data(), n);
    double e32 = 0, e16 = 0, eb = 0, s = 0;
    for (int64_t i = 0; i < n; ++i) {
      e32 += static_cast<double>(a[i]) * b[i];
      e16 += static_cast<double>(fp16_to_f32(ah[i])) * fp16_to_f32(bh[i]);
      eb += static_cast<double>(bf16_to_f32(ab[i])) * bf16_to_f32(bb[i]);
      s += std::fabs(static_cast<double>(a[i]) * b[i]);
    }
    EXPECT_NEAR(vec_dot(DType::F32, n, a.data(), b.data()), e32, 1e-6 * s) << n;
    EXPECT_NEAR(vec_dot(DType::F16, n, ah.data(), bh.data()), e16, 1e-6 * s) << n;
    EXPECT_NEAR(vec_dot(DType::BF16, n, ab.data(), bb.data()), eb, 1e-6 * s) << n;
  }
}

// ---- dequantization: exact float operation order ------------------------------------------------

// One float32 operation, rounded once: done in double (exact for these operands, or correctly rounded
// twice with p' >= 2p+2, which equals rounding once), so no FMA can be formed whatever the compiler flags.
float mul(float a, float b) { return static_cast<float>(static_cast<double>(a) * b); }
float sub(float a, float b) { return static_cast<float>(static_cast<double>(a) - b); }
float add(float a, float b) { return static_cast<float>(static_cast<double>(a) + b); }

float h16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}
float nib(const uint8_t* qs, int e) { return static_cast<float>(e < 16 ? (qs[e] & 0xF) : (qs[e - 16] >> 4)); }

// Element e of one block, written from the format description (ggml's dequantization expressions):
// the result must equal dequantize_row bit for bit.
float element(DType t, const uint8_t* b, int e) {
  switch (t) {
    case DType::Q4_0:
      return mul(nib(b + 2, e) - 8, h16(b));
    case DType::Q4_1:
      return add(mul(nib(b + 4, e), h16(b)), h16(b + 2));
    case DType::Q5_0:
    case DType::Q5_1: {
      const bool one = t == DType::Q5_1;
      uint32_t qh;
      std::memcpy(&qh, b + (one ? 4 : 2), 4);
      const float v = nib(b + (one ? 8 : 6), e) + static_cast<float>(((qh >> e) & 1) << 4);
      return one ? add(mul(v, h16(b)), h16(b + 2)) : mul(v - 16, h16(b));
    }
    case DType::Q8_0:
      return mul(static_cast<float>(static_cast<int8_t>(b[2 + e])), h16(b));
    case DType::Q8_K: {
      float d;
      std::memcpy(&d, b, 4);
      return mul(d, static_cast<float>(static_cast<int8_t>(b[4 + e])));
    }
    case DType::Q2_K: {
      const auto* k = reinterpret_cast<const BlockQ2_K*>(b);
      const int q = (k->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const int sc = k->scales[e / 16];
      return sub(mul(mul(fp16_to_f32(k->d), static_cast<float>(sc & 15)), static_cast<float>(q)),
                 mul(fp16_to_f32(k->dmin), static_cast<float>(sc >> 4)));
    }
    case DType::Q3_K: {
      const auto* k = reinterpret_cast<const BlockQ3_K*>(b);
      const int q = (k->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      const int hb = (k->hmask[e % 32] >> (e / 32)) & 1;
      const int j = e / 16;
      const int lo = j < 8 ? (k->scales[j] & 15) : (k->scales[j - 8] >> 4);
      const int sc = (lo | (((k->scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32;
      return mul(mul(fp16_to_f32(k->d), static_cast<float>(sc)), static_cast<float>(q - (hb ? 0 : 4)));
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool five = t == DType::Q5_K;
      const uint8_t* s = b + 4;  // scales follow d, dmin in both
      const uint8_t* qs = five ? b + 16 + 32 : b + 16;
      const int j = e / 32;
      int sc, m;
      if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
      } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      }
      const uint8_t byte = qs[32 * (e / 64) + e % 32];
      int q = (e % 64) < 32 ? (byte & 15) : (byte >> 4);
      if (five) q += ((b[16 + e % 32] >> (e / 32)) & 1) << 4;
      return sub(mul(mul(h16(b), static_cast<float>(sc)), static_cast<float>(q)), mul(h16(b + 2), static_cast<float>(m)));
    }
    case DType::Q6_K: {
      const auto* k = reinterpret_cast<const BlockQ6_K*>(b);
      const int h = e / 128, l = e % 32, part = (e % 128) / 32;
      const uint8_t lb = k->ql[64 * h + 32 * (part & 1) + l];
      const int low = part < 2 ? (lb & 15) : (lb >> 4);
      const int q = (low | (((k->qh[32 * h + l] >> (2 * part)) & 3) << 4)) - 32;
      return mul(mul(fp16_to_f32(k->d), static_cast<float>(k->scales[e / 16])), static_cast<float>(q));
    }
    case DType::IQ4_NL:
      return mul(h16(b), static_cast<float>(kIQ4NLValues[static_cast<int>(nib(b + 2, e))]));
    case DType::IQ4_XS: {
      const auto* k = reinterpret_cast<const BlockIQ4_XS*>(b);
      const int ib = e / 32;
      const int ls = ((k->scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((k->scales_h >> (2 * ib)) & 3) << 4);
      const float v = static_cast<float>(kIQ4NLValues[static_cast<int>(nib(k->qs + 16 * ib, e % 32))]);
      return mul(mul(fp16_to_f32(k->d), static_cast<float>(ls - 32)), v);
    }
    default:
      throw std::runtime_error("no element formula");
  }
}

TEST(Dequantize, BitExactWithElementFormulas) {
  constexpr int64_t n = 4096;
  std::mt19937 rng(77);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_K, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS}) {
    const auto& tr = traits(t);
    std::vector<uint8_t> q(row_bytes(t, n));
    std::vector<float> y(n);
    for (int trial = 0; trial < 6; ++trial) {
      if (t == DType::Q8_K) {
        quantize_row(t, gaussian(n, 500 + trial).data(), q.data(), n);
      } else if (trial % 2) {
        quantize_weights(t, gaussian(n, 600 + trial).data(), q.data(), n);
      } else {
        random_blocks(t, q.data(), n, rng);
      }
      dequantize_row(t, q.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const uint8_t* blk = q.data() + static_cast<size_t>(i / tr.block_size) * tr.type_size;
        const float want = element(t, blk, static_cast<int>(i % tr.block_size));
        ASSERT_EQ(f32_to_bits(y[i]), f32_to_bits(want)) << dtype_name(t) << " element " << i << ": " << y[i] << " vs " << want;
      }
    }
  }
  // Plain types: exact conversions.
  for (uint32_t h = 0; h < 65536; h += 7) {
    const uint16_t hv = static_cast<uint16_t>(h);
    float f;
    dequantize_row(DType::F16, &hv, &f, 1);
    EXPECT_EQ(f32_to_bits(f), f32_to_bits(fp16_to_f32(hv)));
    dequantize_row(DType::BF16, &hv, &f, 1);
    EXPECT_EQ(f32_to_bits(f), h << 16);
  }
}

// ---- activation converters ---------------------------------------------------------------------

// Inputs that reach every branch of the scale searches: zero, constant (negative: the affine search's
// early exit) and sparse groups, exact rounding ties, outliers, and groups of wildly different scale.
std::vector<float> adversarial_row(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t g = 0; g < n / 16; ++g) {
    float* p = x.data() + 16 * g;
    const int kind = static_cast<int>(u(rng) * 9);
    const float mag = std::pow(10.f, -4.f + 6.f * u(rng));
    for (int i = 0; i < 16; ++i) {
      switch (kind) {
        case 0:
          p[i] = 0.f;
          break;
        case 1:
          p[i] = -0.75f * mag;
          break;
        case 2:
          p[i] = 0.5f * mag;
          break;
        case 3:
          p[i] = u(rng) < 0.85f ? 0.f : nd(rng) * mag;
          break;
        case 4:
          p[i] = static_cast<float>(static_cast<int>(u(rng) * 16) - 8) * 0.5f;
          break;  // ties
        case 5:
          p[i] = (i == 5 ? 50.f : 0.01f) * nd(rng);
          break;
        case 6:
          p[i] = nd(rng) * nd(rng) * nd(rng) * mag;
          break;
        default:
          p[i] = nd(rng) * mag;
          break;
      }
    }
  }
  return x;
}

TEST(QuantizeRow, SimdAndScalarGiveIdenticalBytes) {
  // The vectorised paths (activation converters, F16, and the K-quant scale searches that run 8 groups
  // per AVX2 register) must produce exactly the scalar bytes.
  constexpr int64_t n = 8192;
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q8_1, DType::Q8_K, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS}) {
    for (uint32_t seed = 0; seed < 12; ++seed) {
      auto x = seed % 3 == 0 ? gaussian(n, seed, seed % 2 ? 1e-3f : 3.f) : adversarial_row(n, seed);
      // Exact ties for the 127/amax multiplier: a block holding ±127 and k + 0.5 values.
      for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = j == 0 ? 127.f : static_cast<float>(j % 20) - 9.5f;
      std::vector<uint8_t> a(row_bytes(t, n)), b(a.size());
      quantize_row(t, x.data(), a.data(), n);
      quantize_row_scalar(t, x.data(), b.data(), n);
      ASSERT_EQ(a, b) << dtype_name(t) << " seed " << seed;
    }
  }
}

TEST(ActivationQuant, Q8RulesFromGoldenReadme) {
  // Q8_0: d = amax/127, q = round_half_even(x·127/amax).
  std::vector<float> x(32, 0.f);
  x[0] = 127.f;
  x[1] = 2.5f;   // tie -> 2
  x[2] = 3.5f;   // tie -> 4
  x[3] = -2.5f;  // tie -> -2
  x[4] = -127.f;
  BlockQ8_0 b0;
  quantize_row(DType::Q8_0, x.data(), &b0, 32);
  EXPECT_EQ(fp16_to_f32(b0.d), 1.f);
  EXPECT_EQ(b0.qs[0], 127);
  EXPECT_EQ(b0.qs[1], 2);
  EXPECT_EQ(b0.qs[2], 4);
  EXPECT_EQ(b0.qs[3], -2);
  EXPECT_EQ(b0.qs[4], -127);
  // Model-file Q8_0 (llama-quantize) rounds ties away from zero instead.
  BlockQ8_0 bw;
  quantize_weights(DType::Q8_0, x.data(), &bw, 32);
  EXPECT_EQ(bw.qs[1], 3);
  EXPECT_EQ(bw.qs[3], -3);
  // Q8_1: s = fp16(d·Σq).
  BlockQ8_1 b1;
  quantize_row(DType::Q8_1, x.data(), &b1, 32);
  EXPECT_EQ(fp16_to_f32(b1.s), 127.f + 2 + 4 - 2 - 127);
  // Q8_K: scale from the signed extreme (first of equal magnitudes), q = min(127, ...), bsums.
  std::vector<float> xk(256, 0.f);
  xk[3] = -4.f;
  xk[10] = 4.f;
  xk[20] = 1.f;
  BlockQ8_K bk;
  quantize_row(DType::Q8_K, xk.data(), &bk, 256);
  EXPECT_FLOAT_EQ(bk.d, 4.f / 127.f);  // d = 1/iscale = -max/127 with max = -4
  EXPECT_EQ(bk.qs[3], -127);
  EXPECT_EQ(bk.qs[10], 127);
  EXPECT_EQ(bk.bsums[0], 0);
  EXPECT_EQ(bk.bsums[1], 32);  // round(1·127/4) = 31.75 -> 32
  // All-zero Q8_K block: d = 0, q = 0, bsums zero.
  std::vector<float> z(256, 0.f);
  std::memset(&bk, 0xAB, sizeof bk);
  quantize_row(DType::Q8_K, z.data(), &bk, 256);
  EXPECT_EQ(bk.d, 0.f);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(bk.qs[j], 0);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(bk.bsums[j], 0);
}

// ---- quantize -> dequantize round trips ---------------------------------------------------------

struct RoundTripBound {
  DType t;
  double rel_rmse;  // bound on RMSE(x - deq(q(x))) / RMS(x) for N(0,1) data
};
// Bounds are ~1.15x what ggml's algorithms reach on this N(0,1) data (the measured values are printed;
// quantize_row and quantize_weights only differ for Q8_0/Q8_1 ties and IQ4_NL's scale search).
const RoundTripBound kRoundTrip[] = {
    {DType::F16, 2.4e-4},    {DType::BF16, 1.9e-3},   {DType::Q8_0, 6.2e-3},  {DType::Q8_1, 6.2e-3},
    {DType::Q8_K, 8.0e-3},   {DType::Q6_K, 2.05e-2},  {DType::Q5_0, 4.9e-2},  {DType::Q5_1, 4.4e-2},
    {DType::Q5_K, 4.2e-2},   {DType::Q4_0, 9.9e-2},   {DType::Q4_1, 9.0e-2},  {DType::Q4_K, 8.2e-2},
    {DType::IQ4_NL, 9.1e-2}, {DType::IQ4_XS, 8.9e-2}, {DType::Q3_K, 1.74e-1}, {DType::Q2_K, 3.45e-1},
};

class RoundTrip : public testing::TestWithParam<RoundTripBound> {};

TEST_P(RoundTrip, ErrorWithinBound) {
  const auto [t, bound] = GetParam();
  constexpr int64_t n = 256 * 256;
  const auto x = gaussian(n, 42);
  std::vector<uint8_t> q(row_bytes(t, n));
  std::vector<float> back(n);
  for (bool weights : {true, false}) {
    if (weights)
      quantize_weights(t, x.data(), q.data(), n);
    else
      quantize_row(t, x.data(), q.data(), n);
    dequantize_row(t, q.data(), back.data(), n);
    double e2 = 0, x2 = 0;
    for (int64_t i = 0; i < n; ++i) {
      e2 += (static_cast<double>(back[i]) - x[i]) * (static_cast<double>(back[i]) - x[i]);
      x2 += static_cast<double>(x[i]) * x[i];
    }
    const double rel = std::sqrt(e2 / x2);
    EXPECT_LE(rel, bound) << dtype_name(t) << (weights ? " quantize_weights" : " quantize_row");
    std::printf("[ roundtrip] %-6s %-16s rel RMSE %.3e (bound %.1e)\n", std::string(dtype_name(t)).c_str(),
                weights ? "quantize_weights" : "quantize_row", rel, bound);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, RoundTrip, testing::ValuesIn(kRoundTrip),
                         [](const testing::TestParamInfo<RoundTripBound>& i) { return std::string(dtype_name(i.param.t)); });

TEST(RoundTrip, LegacyTypesStayWithinOneStepPerElement) {
  // Per element: |x - deq| <= 0.5 step (1 step where the ±max clamp bites for Q4_0/Q5_0), plus the
  // rounding of the stored fp16 scale / min.
  constexpr int64_t n = 32 * 512;
  const auto x = gaussian(n, 3);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0}) {
    std::vector<uint8_t> q(row_bytes(t, n));
    std::vector<float> back(n);
    quantize_weights(t, x.data(), q.data(), n);
    dequantize_row(t, q.data(), back.data(), n);
    const size_t bs = traits(t).type_size;
    for (int64_t b = 0; b < n / 32; ++b) {
      const double d = std::fabs(block_half(q.data(), bs, b, 0));
      const bool has_min = t == DType::Q4_1 || t == DType::Q5_1;
      const double mn = has_min ? std::fabs(block_half(q.data(), bs, b, 2)) : 0;
      const double steps = (t == DType::Q4_0 || t == DType::Q5_0) ? 1.0 : 0.5;
      const double qmax = t == DType::Q8_0 ? 127 : t == DType::Q4_0 || t == DType::Q4_1 ? 16 : 32;
      const double allow = steps * d + qmax * d * std::ldexp(1.0, -10) + mn * std::ldexp(1.0, -10) + 1e-7;
      for (int i = 0; i < 32; ++i) {
        const size_t k = static_cast<size_t>(32 * b + i);
        ASSERT_LE(std::fabs(static_cast<double>(back[k]) - x[k]), allow) << dtype_name(t) << " element " << k;
      }
    }
  }
}

TEST(RoundTrip, DegenerateBlocks) {
  // All zeros, constants, one outlier, tiny (fp16-subnormal) values: finite, zeros stay zero,
  // constants come back close.
  constexpr int64_t n = 512;
  std::vector<std::vector<float>> inputs;
  inputs.emplace_back(n, 0.f);
  inputs.emplace_back(n, 0.75f);
  inputs.emplace_back(n, -3.f);
  {
    std::vector<float> v(n, 0.01f);
    v[17] = 1000.f;
    inputs.push_back(v);
  }
  inputs.push_back(gaussian(n, 8, 1e-6f));
  inputs.push_back(gaussian(n, 9, 1e-30f));
  for (DType t : {DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1,
                  DType::Q8_K, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS}) {
    for (size_t c = 0; c < inputs.size(); ++c) {
      std::vector<uint8_t> q(row_bytes(t, n));
      std::vector<float> back(n);
      for (bool weights : {true, false}) {
        if (weights)
          quantize_weights(t, inputs[c].data(), q.data(), n);
        else
          quantize_row(t, inputs[c].data(), q.data(), n);
        dequantize_row(t, q.data(), back.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_TRUE(std::isfinite(back[i])) << dtype_name(t) << " case " << c;
          if (c == 0) {
            ASSERT_EQ(back[i], 0.f) << dtype_name(t);
          }
          if (c == 1 || c == 2) {
            ASSERT_NEAR(back[i], inputs[c][i], 0.2 * std::fabs(inputs[c][i])) << dtype_name(t) << " case " << c;
          }
        }
      }
    }
  }
}

// ---- API contract -------------------------------------------------------------------------------

TEST(QuantApi, VecDotTypeTable) {
  EXPECT_EQ(vec_dot_type(DType::F32), DType::F32);
  EXPECT_EQ(vec_dot_type(DType::F16), DType::F16);
  EXPECT_EQ(vec_dot_type(DType::BF16), DType::BF16);
  for (DType t : {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::IQ4_NL}) EXPECT_EQ(vec_dot_type(t), DType::Q8_0);
  for (DType t : {DType::Q4_1, DType::Q5_1}) EXPECT_EQ(vec_dot_type(t), DType::Q8_1);
  for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS})
    EXPECT_EQ(vec_dot_type(t), DType::Q8_K);
  EXPECT_THROW(vec_dot_type(DType::IQ2_XXS), Error);
  EXPECT_THROW(vec_dot_type(DType::I32), Error);
}

TEST(QuantApi, IQ4NLTable) {
  const int8_t expect[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(kIQ4NLValues[i], expect[i]);
}

TEST(QuantApi, CanQuantize) {
  for (DType t :
       {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q8_1,
        DType::Q8_K, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS})
    EXPECT_TRUE(can_quantize(t)) << dtype_name(t);
  for (DType t : {DType::IQ2_XXS, DType::IQ1_S, DType::I8, DType::I32, DType::F64, DType::TQ1_0, DType::MXFP4})
    EXPECT_FALSE(can_quantize(t)) << dtype_name(t);
}

TEST(QuantApi, BadInputThrows) {
  std::vector<float> x(512, 1.f);
  std::vector<uint8_t> buf(4096);
  EXPECT_THROW(quantize_row(DType::Q4_0, x.data(), buf.data(), 33), Error);
  EXPECT_THROW(quantize_row(DType::Q4_K, x.data(), buf.data(), 128), Error);
  EXPECT_THROW(quantize_row(DType::Q4_0, x.data(), buf.data(), -32), Error);
  EXPECT_THROW(quantize_row(DType::IQ2_XXS, x.data(), buf.data(), 256), Error);
  EXPECT_THROW(quantize_weights(DType::I32, x.data(), buf.data(), 32), Error);
  EXPECT_THROW(dequantize_row(DType::Q6_K, buf.data(), x.data(), 100), Error);
  EXPECT_THROW(dequantize_row(DType::IQ3_S, buf.data(), x.data(), 256), Error);
  EXPECT_THROW(dequantize_row(DType::I8, buf.data(), x.data(), 16), Error);
  EXPECT_THROW(vec_dot(DType::Q8_0, 48, buf.data(), buf.data()), Error);
  EXPECT_THROW(vec_dot(DType::IQ2_XS, 256, buf.data(), buf.data()), Error);
  EXPECT_THROW(vec_dot_scalar(DType::Q5_K, 100, buf.data(), buf.data()), Error);
  x[5] = std::nanf("");
  EXPECT_THROW(quantize_weights(DType::Q4_K, x.data(), buf.data(), 256), Error);
  x[5] = INFINITY;
  EXPECT_THROW(quantize_weights(DType::Q8_0, x.data(), buf.data(), 256), Error);
  // Zero elements is a no-op.
  EXPECT_NO_THROW(quantize_row(DType::Q4_K, x.data(), buf.data(), 0));
  EXPECT_EQ(vec_dot(DType::Q4_K, 0, buf.data(), buf.data()), 0.f);
}

TEST(QuantApi, NonFiniteActivationsDoNotCrash) {
  // Activations are not validated (hot path), but NaN/Inf must not crash or hang.
  std::vector<float> x(512, 0.5f);
  x[3] = std::nanf("");
  x[300] = -INFINITY;
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q8_1, DType::Q8_K, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS}) {
    std::vector<uint8_t> q(row_bytes(t, 512));
    std::vector<float> back(512);
    quantize_row(t, x.data(), q.data(), 512);
    quantize_row_scalar(t, x.data(), q.data(), 512);
    dequantize_row(t, q.data(), back.data(), 512);
  }
}

}  // namespace
}  // namespace pg
