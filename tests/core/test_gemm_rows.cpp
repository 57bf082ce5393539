// gemm_rows (the CPU matmul's multi-row kernels) must give exactly vec_dot's result for every pair:
// the golden tests' bit-exactness rests on it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/quant.h"
#include "core/quant_dot.h"

namespace pg {
namespace {

TEST(GemmRows, BitIdenticalToVecDotForEveryType) {
  const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1,   DType::Q5_0,  DType::Q5_1, DType::Q8_0,
                         DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int checked = 0;
  for (DType t : types) {
    for (int64_t n : {256, 768}) {
      for (int64_t n_x : {1, 3, 5, 9}) {
        const int64_t n_w = 7;
        const size_t w_row = row_bytes(t, n);
        std::vector<float> wf(static_cast<size_t>(n));
        std::vector<uint8_t> w(w_row * static_cast<size_t>(n_w));
        for (int64_t r = 0; r < n_w; ++r) {
          for (auto& v : wf) v = nd(rng) * 0.1f;
          quantize_weights(t, wf.data(), w.data() + static_cast<size_t>(r) * w_row, n);
        }
        std::vector<std::vector<float>> xf(static_cast<size_t>(n_x), std::vector<float>(static_cast<size_t>(n)));
        std::vector<std::vector<uint8_t>> prep(static_cast<size_t>(n_x)), vd(static_cast<size_t>(n_x));
        std::vector<const void*> xp;
        const DType vt = vec_dot_type(t);
        for (int64_t j = 0; j < n_x; ++j) {
          for (auto& v : xf[static_cast<size_t>(j)]) v = nd(rng);
          prep[static_cast<size_t>(j)].resize(gemm_x_row_bytes(t, n));
          gemm_prepare_x(t, xf[static_cast<size_t>(j)].data(), prep[static_cast<size_t>(j)].data(), n);
          xp.push_back(prep[static_cast<size_t>(j)].data());
          vd[static_cast<size_t>(j)].resize(row_bytes(vt, n));
          quantize_row(vt, xf[static_cast<size_t>(j)].data(), vd[static_cast<size_t>(j)].data(), n);
        }
        std::vector<float> y(static_cast<size_t>(n_w * n_x));
        gemm_rows(t, n, w.data(), w_row, n_w, xp.data(), n_x, y.data(), n_w);
        for (int64_t j = 0; j < n_x; ++j)
          for (int64_t i = 0; i < n_w; ++i) {
            const float ref = vec_dot(t, n, w.data() + static_cast<size_t>(i) * w_row, vd[static_cast<size_t>(j)].data());
            const float got = y[static_cast<size_t>(j * n_w + i)];
            ASSERT_EQ(std::memcmp(&ref, &got, sizeof(float)), 0)
                << dtype_name(t) << " n=" << n << " row " << i << " x " << j << ": " << got << " vs " << ref;
            ++checked;
          }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// The register-blocked tiles (AVX-512 VNNI where the CPU has it: 4 weight rows × up to 8 activation rows,
// 2 × 8 for Q4_K and Q6_K, partial tiles padded) at every row count a speculative verify forward uses, on
// the demo draft's width (192 = 6 blocks; one super-block for the K-quants) and a wider one, with weight
// counts that leave partial weight tiles. Q8_0 weights include -128 (llama-quantize never writes it; a
// file may) and activations at ±127.
void check_one_to_64_rows();

TEST(GemmRows, RegisterTilesBitIdenticalForOneTo64Rows) { check_one_to_64_rows(); }

// The same with the AVX-512 VNNI tiles off: the AVX2 tiles that CPUs without VNNI run.
TEST(GemmRows, Avx2TilesBitIdenticalForOneTo64Rows) {
  const bool was = gemm_enable_vnni(false);
  check_one_to_64_rows();
  gemm_enable_vnni(was);
}

void check_one_to_64_rows() {
  const DType types[] = {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::IQ4_NL, DType::Q4_K, DType::Q6_K};
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  int checked = 0;
  for (DType t : types) {
    for (int64_t n0 : {192, 1024}) {
      const int64_t n = n0 % traits(t).block_size == 0 ? n0 : 256;  // K-quants: one super-block for the narrow case
      for (int64_t n_w : {1, 5, 13}) {
        const size_t w_row = row_bytes(t, n);
        std::vector<float> wf(static_cast<size_t>(n));
        std::vector<uint8_t> w(w_row * static_cast<size_t>(n_w));
        for (int64_t r = 0; r < n_w; ++r) {
          for (auto& v : wf) v = nd(rng) * 0.1f;
          uint8_t* row = w.data() + static_cast<size_t>(r) * w_row;
          quantize_weights(t, wf.data(), row, n);
          if (t == DType::Q8_0) {
            auto* b = reinterpret_cast<BlockQ8_0*>(row);
            b[0].qs[r % 32] = -128;
            b[n / 32 - 1].qs[31 - r % 32] = -128;
          }
        }
        const int64_t max_x = 64;
        std::vector<std::vector<float>> xf(static_cast<size_t>(max_x), std::vector<float>(static_cast<size_t>(n)));
        std::vector<std::vector<uint8_t>> prep(static_cast<size_t>(max_x)), vd(static_cast<size_t>(max_x));
        std::vector<const void*> xp;
        const DType vt = vec_dot_type(t);
        for (int64_t j = 0; j < max_x; ++j) {
          auto& x = xf[static_cast<size_t>(j)];
          for (auto& v : x) v = nd(rng);
          x[static_cast<size_t>(j % n)] = 40.0f;  // the block maximum: quantizes to 127 (and -127 below)
          x[static_cast<size_t>((j + 7) % n)] = -40.0f;
          prep[static_cast<size_t>(j)].resize(gemm_x_row_bytes(t, n));
          gemm_prepare_x(t, x.data(), prep[static_cast<size_t>(j)].data(), n);
          xp.push_back(prep[static_cast<size_t>(j)].data());
          vd[static_cast<size_t>(j)].resize(row_bytes(vt, n));
          quantize_row(vt, x.data(), vd[static_cast<size_t>(j)].data(), n);
        }
        for (int64_t n_x = 1; n_x <= max_x; ++n_x) {
          // y_stride > n_w: results land in their own columns and nothing writes past them.
          const int64_t y_stride = n_w + 3;
          std::vector<float> y(static_cast<size_t>(n_x * y_stride), -1.0f);
          gemm_rows(t, n, w.data(), w_row, n_w, xp.data(), n_x, y.data(), y_stride);
          for (int64_t j = 0; j < n_x; ++j) {
            for (int64_t i = 0; i < n_w; ++i) {
              const float ref = vec_dot(t, n, w.data() + static_cast<size_t>(i) * w_row, vd[static_cast<size_t>(j)].data());
              const float got = y[static_cast<size_t>(j * y_stride + i)];
              ASSERT_EQ(std::memcmp(&ref, &got, sizeof(float)), 0) << dtype_name(t) << " n=" << n << " n_w=" << n_w << " n_x=" << n_x
                                                                   << " row " << i << " x " << j << ": " << got << " vs " << ref;
              ++checked;
            }
            for (int64_t i = n_w; i < y_stride; ++i) ASSERT_EQ(y[static_cast<size_t>(j * y_stride + i)], -1.0f) << "wrote past n_w";
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 100000);
}

}  // namespace
}  // namespace pg
