// backend/cuda/act_quant.cuh (the 8-bit activation rounding shared by act_quant_kernel and the quantizing
// RMSNorm kernels, CudaOptions::fuse_norm_quant) compiled for the host through cuda_host_shim.h, against
// core's quantize_row(Q8_0 / Q8_K), the CPU backend's default-mode activation rounding: quants, scales and
// block sums must be byte-equal on random rows and on edge rows (ties, zeros, the largest magnitude
// negative, equal magnitudes of both signs, huge and subnormal values). The warp's shuffle butterflies are
// emulated lane by lane with the header's own per-lane and merge functions, in the device's order.
// Needs no GPU (runs in CI).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cuda/act_quant.cuh"
#include "core/fp16.h"
#include "core/quant.h"

namespace pg {
namespace {

namespace aq = cuda::aq;

// One 256-value unit as one emulated warp: quants, per-32 scales and Σq of every lane (the device's
// quantize_warp + block_qsum), and the MMQ split word (q8_K).
struct UnitOut {
  int q[256];
  float d[8];
  int qs[8];
  uint4 split;
};

template <int MODE>
UnitOut emulate_unit(const float* x, int64_t e_unit0, int live_values) {
  float v[32][8];
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < 8; ++j) v[l][j] = 8 * l + j < live_values ? x[8 * l + j] : 0.0f;
  int q[32][8];
  float d[32];
  if constexpr (MODE == aq::kQ8_K) {
    aq::MaxState s[32];
    for (int l = 0; l < 32; ++l) s[l] = aq::lane_max(v[l], e_unit0 + 8 * l);
    for (int o = 16; o > 0; o >>= 1) {  // __shfl_xor_sync butterfly: every lane merges its partner's old state
      aq::MaxState t[32];
      for (int l = 0; l < 32; ++l) t[l] = aq::merge_max(s[l], s[l ^ o]);
      for (int l = 0; l < 32; ++l) s[l] = t[l];
    }
    for (int l = 0; l < 32; ++l) aq::finish_q8_k(v[l], s[l], q[l], d[l]);
  } else {
    float a[32];
    for (int l = 0; l < 32; ++l) a[l] = aq::lane_amax(v[l]);
    for (int o = 1; o <= 2; o <<= 1) {
      float t[32];
      for (int l = 0; l < 32; ++l) t[l] = fmaxf(a[l], a[l ^ o]);
      for (int l = 0; l < 32; ++l) a[l] = t[l];
    }
    for (int l = 0; l < 32; ++l) aq::finish_q8_0(v[l], a[l], q[l], d[l]);
  }
  UnitOut u{};
  int sums[8];
  for (int b = 0; b < 8; ++b) {
    int s = 0;
    for (int k = 0; k < 4; ++k) s += aq::lane_qsum(q[4 * b + k]);
    sums[b] = s;
    u.qs[b] = s;
    u.d[b] = d[4 * b];
    for (int k = 1; k < 4; ++k) EXPECT_EQ(std::memcmp(&d[4 * b + k], &d[4 * b], 4), 0) << "lanes of one block disagree on d";
  }
  for (int l = 0; l < 32; ++l)
    for (int j = 0; j < 8; ++j) u.q[8 * l + j] = q[l][j];
  u.split = aq::pack_split(sums);
  return u;
}

// Byte comparison of a row (n a multiple of 32) with quantize_row(Q8_0); returns the mismatches.
size_t check_q8_0(const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<BlockQ8_0> ref(static_cast<size_t>(n / 32)), ref_s(static_cast<size_t>(n / 32));
  quantize_row(DType::Q8_0, x.data(), ref.data(), n);
  quantize_row_scalar(DType::Q8_0, x.data(), ref_s.data(), n);
  size_t bad = 0;
  for (int64_t e = 0; e < n; e += 256) {
    const int live = static_cast<int>(std::min<int64_t>(256, n - e));
    const UnitOut u = emulate_unit<aq::kQ8_0>(x.data() + e, e, live);
    for (int b = 0; b < live / 32; ++b) {
      const BlockQ8_0& r = ref[static_cast<size_t>((e + 32 * b) / 32)];
      const BlockQ8_0& rs = ref_s[static_cast<size_t>((e + 32 * b) / 32)];
      const float rd = fp16_to_f32(r.d);
      bad += std::memcmp(&u.d[b], &rd, 4) != 0;
      bad += r.d != rs.d;
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        bad += u.q[32 * b + j] != r.qs[j];
        bad += r.qs[j] != rs.qs[j];
        sum += r.qs[j];
      }
      bad += u.qs[b] != sum;
    }
  }
  return bad;
}

size_t check_q8_k(const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<BlockQ8_K> ref(static_cast<size_t>(n / 256));
  quantize_row(DType::Q8_K, x.data(), ref.data(), n);
  size_t bad = 0;
  for (int64_t e = 0; e < n; e += 256) {
    const UnitOut u = emulate_unit<aq::kQ8_K>(x.data() + e, e, 256);
    const BlockQ8_K& r = ref[static_cast<size_t>(e / 256)];
    for (int b = 0; b < 8; ++b) {
      bad += std::memcmp(&u.d[b], &r.d, 4) != 0;
      bad += u.qs[b] != r.bsums[2 * b] + r.bsums[2 * b + 1];
    }
    for (int j = 0; j < 256; ++j) bad += u.q[j] != r.qs[j];
    // The split operand decodes back to the block sums: Σq = 64·h + l, h signed byte, l in 0..63.
    const uint32_t hw[2] = {u.split.x, u.split.y}, lw[2] = {u.split.z, u.split.w};
    for (int b = 0; b < 8; ++b) {
      const int h = static_cast<int8_t>((hw[b >> 2] >> (8 * (b & 3))) & 0xff);
      const int l = static_cast<int>((lw[b >> 2] >> (8 * (b & 3))) & 0xff);
      bad += l > 63 || 64 * h + l != u.qs[b];
    }
  }
  return bad;
}

std::vector<float> random_row(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  for (int i = 0; i < 6; ++i) x[rng() % x.size()] *= 30.0f;  // outliers move the scales
  return x;
}

TEST(CudaActQuant, RandomRowsMatchCpu) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    const float scale = seed % 3 == 0 ? 1e-3f : seed % 3 == 1 ? 1.0f : 40.0f;
    const auto x = random_row(4096, seed, scale);
    EXPECT_EQ(check_q8_0(x), 0u) << "seed " << seed;
    EXPECT_EQ(check_q8_k(x), 0u) << "seed " << seed;
  }
  // q8_0 rows that end inside a 256-value unit (the kernels' non-live lanes).
  for (int64_t n : {32, 96, 160, 4096 + 224}) EXPECT_EQ(check_q8_0(random_row(n, 7, 1.0f)), 0u) << n;
}

TEST(CudaActQuant, EdgeRowsMatchCpu) {
  std::vector<std::vector<float>> rows;
  // Ties: amax 127 makes the q8_0 multiplier and the q8_K iscale ±1, so k + 0.5 rounds half to even.
  {
    std::vector<float> x(512);
    for (size_t i = 0; i < x.size(); ++i) x[i] = (static_cast<int>(i % 254) - 127) + 0.5f;
    for (size_t i = 0; i < x.size(); i += 32) x[i] = 127.0f;  // every 32-block's amax
    rows.push_back(x);
    for (size_t i = 0; i < x.size(); i += 32) x[i] = -127.0f;  // signed max negative: iscale = +1
    rows.push_back(x);
  }
  rows.push_back(std::vector<float>(512, 0.0f));  // all zeros (q8_K: d = 0, quants 0)
  {
    std::vector<float> x = random_row(1024, 3, 1.0f);
    for (int i = 256; i < 512; ++i) x[static_cast<size_t>(i)] = 0.0f;  // one zero unit among live ones
    for (int i = 0; i < 32; ++i) x[static_cast<size_t>(600 + i)] = 0.0f;  // one zero 32-block
    x[10] = -1000.0f;  // largest magnitude negative, first
    x[100] = 1000.0f;  // the same magnitude later: the first wins (q8_K), 127 saturates at min(127, ·)
    x[700] = 500.0f;
    x[800] = -500.0f;  // equal magnitudes, positive first
    x[900] = -std::numeric_limits<float>::max();  // the largest magnitude negative float
    rows.push_back(x);
  }
  {
    // Tiny values, and subnormal ones inside blocks of normal amax (they round to 0). A block whose amax is
    // itself subnormal has an infinite multiplier 127/amax: unspecified (the CPU's AVX2 and scalar paths
    // already disagree there), not tested.
    std::vector<float> x = random_row(512, 5, 1e-30f);
    for (int i = 1; i < 512; i += 7) x[static_cast<size_t>(i)] = (i % 2 ? 1.0f : -1.0f) * 1e-40f;
    rows.push_back(x);
    std::vector<float> y = random_row(512, 6, 1e30f);  // huge values (q8_0: d rounds to FP16 inf)
    y[3] = 3e38f;
    y[300] = -3e38f;
    rows.push_back(y);
  }
  {
    std::vector<float> x(256, -0.0f);  // negative zeros
    x[17] = -2.5f;
    x[200] = 2.5f;
    rows.push_back(x);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(check_q8_0(rows[i]), 0u) << "edge row " << i;
    EXPECT_EQ(check_q8_k(rows[i]), 0u) << "edge row " << i;
  }
}

// The tests above can fail: a deliberately different rounding (round half away from zero) is caught.
TEST(CudaActQuant, CheckDetectsAWrongRounding) {
  std::vector<float> x(256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (static_cast<int>(i % 100) - 50) + 0.5f;
  x[0] = 127.0f;
  std::vector<BlockQ8_K> ref(1);
  quantize_row(DType::Q8_K, x.data(), ref.data(), 256);
  const UnitOut u = emulate_unit<aq::kQ8_K>(x.data(), 0, 256);
  int diff_away = 0, diff_even = 0;
  for (int j = 0; j < 256; ++j) {
    const float t = -x[static_cast<size_t>(j)];  // iscale = −127/127 = −1
    diff_away += static_cast<int>(std::round(t)) != ref[0].qs[j];
    diff_even += u.q[j] != ref[0].qs[j];
  }
  EXPECT_GT(diff_away, 0);
  EXPECT_EQ(diff_even, 0);
}

}  // namespace
}  // namespace pg
