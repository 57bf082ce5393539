// The index arithmetic of the cuBLASLt prefill GEMM (CudaOptions::gemm_cublas), on the host, no GPU:
//  - dequant.cuh's dequant_run (the per-thread work of gemm_cublas.cu's dequantization kernel) run over every
//    run of a multi-row matrix of every GEMM weight type covers each output element exactly once, at the
//    offset of its (row, column), with dequantize_row's value;
//  - gemm_cublas_layout.h's column-major description of y = x·Wᵀ, run through a literal implementation of
//    cuBLAS's GEMM semantics, gives the row-major product, with padded weight rows, odd M and strided y (and
//    leaves y's padding alone);
//  - pointer_alignment.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemm_cublas_layout.h"
#include "core/quant.h"

namespace pg {
namespace {

template <class Q>
void check_dequant_runs(DType t) {
  SCOPED_TRACE(std::string(dtype_name(t)));
  const int64_t K = 512, M = 7;  // 2 K-quant blocks or 16 32-element blocks per row
  const size_t rb = row_bytes(t, K);
  std::mt19937 rng(static_cast<uint32_t>(t) + 3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> f(static_cast<size_t>(K));
  // 16-byte aligned matrix, as in device memory (the decoders' loads assume it).
  std::vector<uint8_t> store(rb * static_cast<size_t>(M) + 16);
  uint8_t* w = store.data() + (16 - reinterpret_cast<uintptr_t>(store.data()) % 16) % 16;
  std::vector<float> ref(static_cast<size_t>(M * K));
  for (int64_t m = 0; m < M; ++m) {
    for (auto& v : f) v = nd(rng);
    quantize_row(t, f.data(), w + rb * static_cast<size_t>(m), K);
    dequantize_row(t, w + rb * static_cast<size_t>(m), ref.data() + m * K, K);
  }
  std::vector<float> out(static_cast<size_t>(M * K), std::nanf(""));
  std::vector<int> written(out.size(), 0);
  const int64_t runs_per_row = K / 16;
  for (int64_t i = 0; i < M * runs_per_row; ++i) {
    float v[16];
    const int64_t o = cuda::dequant_run<Q>(w, rb, runs_per_row, i, v);
    ASSERT_EQ(o, 16 * i) << "run " << i << ": runs must be consecutive 16-element pieces of the output";
    ASSERT_TRUE(o >= 0 && o + 16 <= M * K);
    for (int e = 0; e < 16; ++e) {
      out[static_cast<size_t>(o + e)] = v[e];
      ++written[static_cast<size_t>(o + e)];
    }
  }
  size_t mismatches = 0, coverage = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    mismatches += std::memcmp(&out[i], &ref[i], 4) != 0;
    coverage += written[i] != 1;
  }
  EXPECT_EQ(coverage, 0u) << "elements not written exactly once";
  EXPECT_EQ(mismatches, 0u) << "elements differing from dequantize_row";
}

TEST(CudaGemmCublasHost, DequantRunsCoverMatrixBitExact) {
  const DType types[] = {DType::F16,    DType::BF16,   DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                         DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};
  int n = 0;
  for (DType t : types) {
    const bool ok = cuda::dispatch_type(t, [&]<class Q>() { check_dequant_runs<Q>(t); });
    EXPECT_TRUE(ok) << dtype_name(t);
    n += ok;
  }
  EXPECT_EQ(n, 14);
}

// cuBLAS's definition, literally: D[i + j·ldd] = Σ_l op(A)[i, l] · op(B)[l, j] (column-major), with op(A)[i, l] =
// A[l + i·lda] when transposed, else A[i + l·lda]; likewise B.
void cublas_reference(const cuda::CublasGemmShape& s, const float* A, const float* B, float* D) {
  for (int64_t j = 0; j < s.n; ++j)
    for (int64_t i = 0; i < s.m; ++i) {
      double acc = 0;
      for (int64_t l = 0; l < s.k; ++l) {
        const float a = s.trans_a ? A[l + i * s.lda] : A[i + l * s.lda];
        const float b = s.trans_b ? B[j + l * s.ldb] : B[l + j * s.ldb];
        acc += static_cast<double>(a) * b;
      }
      D[i + j * s.ldd] = static_cast<float>(acc);
    }
}

TEST(CudaGemmCublasHost, LayoutGivesRowMajorProduct) {
  struct Case {
    int64_t M, K, n, w_pad, y_pad;
  };
  const Case cases[] = {{5, 32, 3, 0, 0}, {7, 64, 9, 8, 3}, {1, 32, 4, 0, 1}, {13, 96, 1, 32, 0}, {33, 32, 65, 16, 7}};
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> small(-8, 8);  // integers: every sum is exact, so the comparison is exact
  for (const Case& c : cases) {
    SCOPED_TRACE("M=" + std::to_string(c.M) + " K=" + std::to_string(c.K) + " n=" + std::to_string(c.n) + " w_pad=" + std::to_string(c.w_pad) +
                 " y_pad=" + std::to_string(c.y_pad));
    const int64_t w_ld = c.K + c.w_pad, y_stride = c.M + c.y_pad;
    std::vector<float> W(static_cast<size_t>(c.M * w_ld)), X(static_cast<size_t>(c.n * c.K));
    for (auto& v : W) v = static_cast<float>(small(rng));
    for (auto& v : X) v = static_cast<float>(small(rng));
    const cuda::CublasGemmShape s = cuda::cublas_gemm_shape(c.M, c.K, c.n, w_ld, y_stride);
    // cuBLAS's own argument checks: leading dimensions cover the stored rows of each operand.
    EXPECT_GE(s.lda, s.trans_a ? s.k : s.m);
    EXPECT_GE(s.ldb, s.trans_b ? s.n : s.k);
    EXPECT_GE(s.ldd, s.m);
    const float kPad = -1234.0f;
    std::vector<float> Y(static_cast<size_t>(c.n * y_stride), kPad);
    cublas_reference(s, W.data(), X.data(), Y.data());
    size_t bad = 0, pad_written = 0;
    for (int64_t i = 0; i < c.n; ++i) {
      for (int64_t m = 0; m < c.M; ++m) {
        float want = 0;
        for (int64_t k = 0; k < c.K; ++k) want += X[static_cast<size_t>(i * c.K + k)] * W[static_cast<size_t>(m * w_ld + k)];
        bad += Y[static_cast<size_t>(i * y_stride + m)] != want;
      }
      for (int64_t m = c.M; m < y_stride; ++m) pad_written += Y[static_cast<size_t>(i * y_stride + m)] != kPad;
    }
    EXPECT_EQ(bad, 0u) << "y (n, M) != x·Wᵀ";
    EXPECT_EQ(pad_written, 0u) << "padding between output rows written";
  }
}

TEST(CudaGemmCublasHost, PointerAlignment) {
  alignas(256) static uint8_t buf[512];
  EXPECT_EQ(cuda::pointer_alignment(buf), 256u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 4), 4u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 48), 16u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 128), 128u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 2), 2u);
  EXPECT_EQ(cuda::pointer_alignment(buf + 256, 64), 64u);
  EXPECT_EQ(cuda::pointer_alignment(nullptr), 256u);
}

}  // namespace
}  // namespace pg
