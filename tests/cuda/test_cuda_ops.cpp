// Every CUDA op against the CPU reference backend in exact-F32 mode, on random inputs of several shapes
// (odd sizes included). Bounds, as relative norm error ‖cuda − cpu‖/‖cpu‖ unless stated:
//  - FP32 paths (GEMV, exact mode, norms, attention, RoPE, element-wise): ≤ 2e-5 — both sides compute in
//    FP32 on bit-identical dequantized weights; only the summation order differs.
//  - tensor-core GEMM (n > 8, fast mode): ≤ 2e-3 (activations and dequantized weights rounded to FP16,
//    relative 2⁻¹¹ each), BF16 weights ≤ 6e-3 (activations rounded to BF16, 2⁻⁸). The cuBLASLt route of
//    the same GEMM (CudaOptions::gemm_cublas) multiplies the same 16-bit operands: ≤ 2e-5 against it.
//  - default-mode GEMV (n ≤ 8) for Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, IQ4_XS: ≤ 1.5e-2 (4e-2 with fewer than 64
//    outputs, where the norm ratio rests on a few dot products; measured up to 1.8e-2 at 3) — activations
//    are quantized to 8 bits per value (scale per 32), ~0.5 % relative error per product sum, as the
//    CPU's default mode does; F16/BF16 keep FP32 activations (2e-5).
//  - get_rows: bit-identical (the decoders reproduce dequantize_row exactly).
//  - GELU: ≤ 1e-3 (its FP16 output rounding can flip where tanhf differs by an ulp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cuda/gemm_cublas.h"
#include "core/fp16.h"
#include "core/quant.h"
#include "cuda_test_util.h"

namespace pg {
namespace {

using test::compare;
using test::ErrStats;
using test::fetch;
using test::make_tensor;
using test::randn;

bool q8_activations(DType t) {
  return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0 || t == DType::Q4_0 || t == DType::IQ4_XS;
}

const DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,   DType::Q4_1,   DType::Q5_0, DType::Q5_1, DType::Q8_0,
                              DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// Row-quantized random weights (M, K) of type t.
std::vector<uint8_t> make_weights(DType t, int64_t K, int64_t M, uint32_t seed) {
  const auto f = randn(static_cast<size_t>(K * M), seed, 0.1f);
  const size_t rb = row_bytes(t, K);
  std::vector<uint8_t> w(rb * static_cast<size_t>(M));
  for (int64_t r = 0; r < M; ++r) quantize_row(t, f.data() + r * K, w.data() + static_cast<size_t>(r) * rb, K);
  return w;
}

Tensor make_weight(Backend& be, DType t, int64_t K, int64_t M, int64_t n_exp, const std::vector<uint8_t>& bytes) {
  const int64_t ne[4] = {K, M, n_exp, 1};
  return be.load_weight(t, ne, bytes.data());
}

TEST(CudaOps, MatmulEveryWeightType) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  const int ns[] = {1, 2, 3, 4, 5, 8, 9, 40, 130};
  int checked = 0;
  for (DType t : kWeightTypes) {
    const bool kquant = traits(t).block_size == 256;
    // K: 16-byte-aligned rows and odd layouts (96 elements of a 32-block type: 3 blocks per row, so the
    // 2-byte copy path); M: odd counts that leave partial row groups and tiles.
    std::vector<std::pair<int64_t, int64_t>> shapes =
        kquant ? std::vector<std::pair<int64_t, int64_t>>{{256, 67}, {1280, 300}, {512, 1}, {10240, 9}}
               : std::vector<std::pair<int64_t, int64_t>>{{96, 67}, {512, 300}, {1024, 5}, {8192, 6}};
    for (auto [K, M] : shapes) {
      const auto wb = make_weights(t, K, M, 7u + static_cast<uint32_t>(K + M));
      Tensor wc = make_weight(*cpu, t, K, M, 1, wb);
      Tensor wg = make_weight(*gpu, t, K, M, 1, wb);
      for (int n : ns) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " K=" + std::to_string(K) + " M=" + std::to_string(M) + " n=" + std::to_string(n));
        const auto x = randn(static_cast<size_t>(n * K), static_cast<uint32_t>(n * 31 + K));
        Tensor xc = make_tensor(*cpu, DType::F32, K, n, x.data());
        Tensor xg = make_tensor(*gpu, DType::F32, K, n, x.data());
        Tensor yc = cpu->alloc(DType::F32, M, n);
        cpu->matmul(wc, xc, yc);
        const auto ref = fetch(*cpu, yc);
        const std::vector<float> poison(static_cast<size_t>(n * M), std::nanf(""));
        for (bool exact : {true, false}) {
          // Default mode rounds the activations of every quantized type to 8 bits (as the CPU's default
          // mode does), so against the exact CPU it carries that error at every row count.
          const bool quantized = t != DType::F32 && t != DType::F16 && t != DType::BF16;
          const bool q8 = !exact && quantized;
          // The 8-bit-activation GEMV in each lanes-per-row layout (CudaOptions::gemv_lanes).
          for (int lanes : q8 && n <= 8 && q8_activations(t) ? std::vector<int>{32, 16, 8} : std::vector<int>{32}) {
            CudaOptions o;
            o.exact_f32 = exact;
            o.gemv_lanes = lanes;
            gpu->set_options(o);
            Tensor yg = make_tensor(*gpu, DType::F32, M, n, poison.data());
            gpu->matmul(wg, xg, yg);
            const ErrStats e = compare(fetch(*gpu, yg), ref);
            const bool tc = !exact && n > 8 && !quantized && t != DType::F32;
            // With few outputs (M·n < 64) the norm ratio rests on a handful of dot products: looser.
            const double q8_bound = M * n >= 64 ? 1.5e-2 : 4e-2;
            const double bound = q8 ? q8_bound : !tc ? 2e-5 : t == DType::BF16 ? 6e-3 : 2e-3;
            const std::string mode = exact ? "exact" : "fast, lanes " + std::to_string(lanes);
            EXPECT_EQ(e.bad, 0u) << mode << ": unwritten or non-finite outputs";
            EXPECT_LE(e.rel, bound) << mode << " max_abs " << e.max_abs;
            gpu->free(yg);
            ++checked;
          }
        }
        cpu->free(xc);
        cpu->free(yc);
        gpu->free(xg);
      }
      gpu->free(wg);
    }
  }
  EXPECT_GT(checked, 500);
}

// Default mode against the CPU's default mode (which reproduces llama.cpp's CPU rounding): the same
// 8-bit activations (q8_0 per 32 for the 32-value block types, q8_K per 256 for the K-quants and IQ4_XS)
// on both sides, so the GEMV paths (n ≤ 8: the dp4a kernels, and the FP32 GEMV on the rounded
// activations for the other types; both in groups of 8 rows up to 64) and MMQ (2..64 rows on integer
// tensor cores: exact integer dot products per scale group) differ only by summation order (≤ 2e-5).
// This is the test that the earlier 32-value FP32-scale quantization failed (~1 % off the CPU for the
// K-quants), and that the FP16 GEMM would fail at 9..64 rows (~5e-4).
TEST(CudaOps, MatmulDefaultModeMatchesCpuDefault) {
  PG_REQUIRE_GPU();
  CpuOptions co;
  co.n_threads = 2;
  auto cpu = std::make_unique<CpuBackend>(co);
  auto gpu = test::make_cuda(false);
  const int ns[] = {1, 2, 3, 5, 8, 9, 16, 22, 33, 64};
  for (DType t : kWeightTypes) {
    if (t == DType::F32 || t == DType::F16 || t == DType::BF16) continue;  // no 8-bit activations
    const bool kquant = traits(t).block_size == 256;
    const std::pair<int64_t, int64_t> shapes[] = {kquant ? std::pair<int64_t, int64_t>{1280, 300} : std::pair<int64_t, int64_t>{512, 300},
                                                  kquant ? std::pair<int64_t, int64_t>{4096, 67} : std::pair<int64_t, int64_t>{96, 67}};
    for (auto [K, M] : shapes) {
      const auto wb = make_weights(t, K, M, 3u + static_cast<uint32_t>(K));
      Tensor wc = make_weight(*cpu, t, K, M, 1, wb);
      Tensor wg = make_weight(*gpu, t, K, M, 1, wb);
      for (int n : ns) {
        auto x = randn(static_cast<size_t>(n * K), static_cast<uint32_t>(n * 17 + K));
        x[0] = -4.0f, x[1] = 4.0f;  // equal magnitudes of opposite sign: q8_K takes the first as its max
        Tensor xc = make_tensor(*cpu, DType::F32, K, n, x.data()), xg = make_tensor(*gpu, DType::F32, K, n, x.data());
        Tensor yc = cpu->alloc(DType::F32, M, n);
        cpu->matmul(wc, xc, yc);
        const auto ref = fetch(*cpu, yc);
        // MMQ (integer tensor cores) from its default row count (2) and from 9 rows; off (0): the GEMV.
        for (int mmq_min : {2, 9, 0}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " K=" + std::to_string(K) + " M=" + std::to_string(M) + " n=" + std::to_string(n) +
                       " mmq_min_rows=" + std::to_string(mmq_min));
          CudaOptions o;
          o.mmq_min_rows = mmq_min;
          gpu->set_options(o);
          Tensor yg = gpu->alloc(DType::F32, M, n);
          gpu->matmul(wg, xg, yg);
          const ErrStats e = compare(fetch(*gpu, yg), ref);
          // Q4_1/Q5_1: the CPU's q8_1 activations carry their block sums in FP16 (the min term), which the
          // CUDA side (the FP32 GEMV on q·d) does exactly: 2⁻¹¹ relative on that term.
          const bool legacy = t == DType::Q8_0 || t == DType::Q4_0;  // MMQ from 9 rows only
          const bool mmq = mmq_min > 0 && n >= (legacy ? std::max(mmq_min, 9) : mmq_min) && n <= 64 && K % 256 == 0 &&
                           (t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || legacy);
          const bool q8_1 = t == DType::Q4_1 || t == DType::Q5_1;
          EXPECT_EQ(e.bad, 0u);
          EXPECT_LE(e.rel, q8_1 ? 2e-3 : 2e-5) << "max_abs " << e.max_abs << (mmq ? " (MMQ)" : "");
          gpu->free(yg);
        }
        for (Tensor* p : {&xc, &yc}) cpu->free(*p);
        gpu->free(xg);
      }
      gpu->free(wg);
    }
  }
}

// ---- the cuBLASLt prefill GEMM (CudaOptions::gemm_cublas, gemm_cublas.cu) ----------------------------------
// Its operands are gemm.cu's, bit for bit (the activation conversion is shared; the whole-matrix dequantization
// rounds the same decoders' values the same way), so against the tensor-core kernel only the FP32 summation
// order differs: ≤ 2e-5, as between the FP32 paths above. A wrong layout, transpose, stride or dequantized value
// is off by O(1). Against the exact CPU it keeps the GEMM's bounds (header comment).

const DType kGemmTypes[] = {DType::F16,    DType::BF16,   DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0,
                            DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K};

cuda::MatmulArgs gemm_args(DType t, const Tensor& w, int64_t K, int64_t M, const float* x, int64_t x_stride, float* y, int64_t y_stride, int n) {
  cuda::MatmulArgs a;
  a.type = t;
  a.w = w.data;
  a.row_bytes = row_bytes(t, K);
  a.K = K;
  a.M = M;
  a.x = x;
  a.x_stride = x_stride;
  a.y = y;
  a.y_stride = y_stride;
  a.n = n;
  a.act_quant = cuda::act_quant_mode(t);  // default mode, as CudaBackend::matmul sets it for the GEMM
  return a;
}

// The dequantization kernel against core's dequantize_row rounded to FP16 (F16/BF16: the stored bits): every
// element of a matrix with an odd row count, bit for bit.
TEST(CudaGemmCublas, DequantBitExactEveryType) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  for (DType t : kGemmTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t K = 512, M = 37;
    const auto wb = make_weights(t, K, M, 41);
    Tensor wg = make_weight(*gpu, t, K, M, 1, wb);
    Tensor out = gpu->alloc(DType::F16, K, M);  // (M, K) 16-bit
    const cuda::MatmulArgs a = gemm_args(t, wg, K, M, nullptr, K, nullptr, M, 1);
    ASSERT_TRUE(cuda::gemm_cublas_supported(a));
    cuda::dequant_f16(a, static_cast<uint16_t*>(out.data), gpu->stream());
    std::vector<uint16_t> got(static_cast<size_t>(M * K));
    gpu->download(out, got.data(), got.size() * 2);
    const size_t rb = row_bytes(t, K);
    std::vector<float> row(static_cast<size_t>(K));
    size_t bad = 0;
    for (int64_t m = 0; m < M; ++m) {
      const uint8_t* src = wb.data() + rb * static_cast<size_t>(m);
      dequantize_row(t, src, row.data(), K);
      for (int64_t k = 0; k < K; ++k) {
        uint16_t want;
        if (t == DType::F16 || t == DType::BF16)
          std::memcpy(&want, src + 2 * k, 2);  // the stored bits, as gemm.cu copies them
        else
          want = f32_to_fp16(row[static_cast<size_t>(k)]);
        bad += got[static_cast<size_t>(m * K + k)] != want;
      }
    }
    EXPECT_EQ(bad, 0u) << "16-bit weights differing from dequantize_row rounded to FP16";
    gpu->free(out);
    gpu->free(wg);
  }
}

// Through CudaBackend::matmul: the cuBLASLt route (gemm_cublas, from 65 rows) against the tensor-core kernel
// (option off) and the exact CPU, for every GEMM weight type, an odd output count and row counts around the
// default threshold; the routing itself is checked by the call counter (65 rows stay on the kernel at the
// default gemm_cublas_min_rows of 256).
TEST(CudaGemmCublas, MatchesGemmKernelAndCpu) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  const int ns[] = {65, 300, 512, 1000};
  for (DType t : kGemmTypes) {
    const int64_t K = traits(t).block_size == 256 ? 1280 : 512, M = 301;
    const auto wb = make_weights(t, K, M, 5u + static_cast<uint32_t>(t));
    Tensor wc = make_weight(*cpu, t, K, M, 1, wb), wg = make_weight(*gpu, t, K, M, 1, wb);
    for (int n : ns) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " K=" + std::to_string(K) + " M=" + std::to_string(M) + " n=" + std::to_string(n));
      const auto x = randn(static_cast<size_t>(n * K), static_cast<uint32_t>(n * 13 + K));
      Tensor xc = make_tensor(*cpu, DType::F32, K, n, x.data()), xg = make_tensor(*gpu, DType::F32, K, n, x.data());
      Tensor yc = cpu->alloc(DType::F32, M, n);
      cpu->matmul(wc, xc, yc);
      const auto ref = fetch(*cpu, yc);
      const std::vector<float> poison(static_cast<size_t>(n * M), std::nanf(""));
      std::vector<float> res[2];
      for (int on = 0; on < 2; ++on) {
        CudaOptions o;
        o.gemm_cublas = on != 0;
        o.gemm_cublas_min_rows = 65;
        gpu->set_options(o);
        Tensor yg = make_tensor(*gpu, DType::F32, M, n, poison.data());
        const int64_t c0 = gpu->gemm_cublas_calls();
        gpu->matmul(wg, xg, yg);
        res[on] = fetch(*gpu, yg);
        EXPECT_EQ(gpu->gemm_cublas_calls() - c0, on) << (on ? "the cuBLASLt path did not run" : "the cuBLASLt path ran while off");
        gpu->free(yg);
      }
      const ErrStats vs_gemm = compare(res[1], res[0]), vs_cpu = compare(res[1], ref);
      EXPECT_EQ(vs_gemm.bad, 0u) << "unwritten or non-finite outputs";
      EXPECT_LE(vs_gemm.rel, 2e-5) << "vs the tensor-core kernel, max_abs " << vs_gemm.max_abs;
      const bool quantized = t != DType::F16 && t != DType::BF16;
      EXPECT_LE(vs_cpu.rel, quantized ? 1.5e-2 : t == DType::BF16 ? 6e-3 : 2e-3) << "vs the exact CPU, max_abs " << vs_cpu.max_abs;
      if (n == 65) {  // the default threshold (256) keeps 65 rows on the kernel
        CudaOptions o;
        o.gemm_cublas = true;
        gpu->set_options(o);
        Tensor yg = gpu->alloc(DType::F32, M, n);
        const int64_t c0 = gpu->gemm_cublas_calls();
        gpu->matmul(wg, xg, yg);
        gpu->synchronize();
        EXPECT_EQ(gpu->gemm_cublas_calls(), c0) << "65 rows took cuBLASLt below gemm_cublas_min_rows";
        gpu->free(yg);
      }
      cpu->free(xc);
      cpu->free(yc);
      gpu->free(xg);
    }
    gpu->free(wg);
  }
}

// The launchers directly, with strided activations (x_stride > K) and outputs (y_stride > M, odd, and y one float
// past an aligned address: cuBLASLt's alignment preferences must follow the pointers): cuda::gemm and
// gemm_cublas write the same values, and neither touches the padding between output rows.
TEST(CudaGemmCublas, StridedMatchesGemmKernel) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  cuda::CublasGemm* h = cuda::cublas_gemm_create();
  struct Case {
    DType t;
    int64_t K, M;
    int n;
    int64_t x_pad, y_pad, y_off;
  };
  const Case cases[] = {{DType::Q4_K, 1024, 333, 300, 32, 7, 1},  {DType::Q6_K, 512, 129, 512, 4, 3, 0},
                        {DType::Q8_0, 416, 77, 200, 8, 1, 1},     {DType::F16, 288, 95, 130, 12, 5, 1},
                        {DType::BF16, 256, 64, 97, 4, 0, 0},      {DType::IQ4_XS, 768, 200, 333, 0, 11, 3}};
  const float kSentinel = 12345.0f;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " K=" + std::to_string(c.K) + " M=" + std::to_string(c.M) + " n=" + std::to_string(c.n) +
                 " x_pad=" + std::to_string(c.x_pad) + " y_pad=" + std::to_string(c.y_pad) + " y_off=" + std::to_string(c.y_off));
    const auto wb = make_weights(c.t, c.K, c.M, 77);
    Tensor wg = make_weight(*gpu, c.t, c.K, c.M, 1, wb);
    const int64_t xs = c.K + c.x_pad, ys = c.M + c.y_pad;
    const auto x = randn(static_cast<size_t>(c.n * xs), 91);
    Tensor xg = make_tensor(*gpu, DType::F32, xs, c.n, x.data());
    const int64_t y_len = c.y_off + ys * c.n;
    const std::vector<float> fill(static_cast<size_t>(y_len), kSentinel);
    void *xh = nullptr, *whs = nullptr, *lt_ws = nullptr;
    ASSERT_EQ(cudaMalloc(&xh, cuda::gemm_scratch_bytes(c.n, c.K)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&whs, std::max<size_t>(cuda::gemm_cublas_weight_bytes(gemm_args(c.t, wg, c.K, c.M, nullptr, xs, nullptr, ys, c.n)), 16)),
              cudaSuccess);
    ASSERT_EQ(cudaMalloc(&lt_ws, cuda::kCublasWorkspaceBytes), cudaSuccess);
    std::vector<float> res[2];
    for (int path = 0; path < 2; ++path) {
      Tensor yg = make_tensor(*gpu, DType::F32, y_len, 1, fill.data());
      const cuda::MatmulArgs a = gemm_args(c.t, wg, c.K, c.M, xg.as<float>(), xs, yg.as<float>() + c.y_off, ys, c.n);
      if (path == 0) {
        cuda::gemm(a, nullptr, nullptr, xh, gpu->stream());
      } else {
        ASSERT_TRUE(cuda::gemm_cublas_supported(a));
        ASSERT_TRUE(cuda::gemm_cublas(*h, a, xh, whs, lt_ws, cuda::kCublasWorkspaceBytes, gpu->stream())) << "no cuBLASLt algorithm";
      }
      res[path] = fetch(*gpu, yg);
      gpu->free(yg);
    }
    size_t touched = 0;
    std::vector<float> got, want;
    for (int64_t i = 0; i < y_len; ++i) {
      const int64_t r = i - c.y_off, col = r >= 0 ? r % ys : -1;
      if (r < 0 || col >= c.M) {  // before y or padding between rows: untouched by both
        touched += res[0][static_cast<size_t>(i)] != kSentinel || res[1][static_cast<size_t>(i)] != kSentinel;
      } else {
        want.push_back(res[0][static_cast<size_t>(i)]);
        got.push_back(res[1][static_cast<size_t>(i)]);
      }
    }
    EXPECT_EQ(touched, 0u) << "padding written";
    const ErrStats e = compare(got, want);
    EXPECT_EQ(e.bad, 0u);
    EXPECT_LE(e.rel, 2e-5) << "max_abs " << e.max_abs;
    // The tensor-core result itself is sane (not the sentinel everywhere, so the comparison means something).
    size_t sentinels = 0;
    for (float v : want) sentinels += v == kSentinel;
    EXPECT_EQ(sentinels, 0u);
    cudaFree(xh);
    cudaFree(whs);
    cudaFree(lt_ws);
    gpu->free(xg);
    gpu->free(wg);
  }
  cuda::cublas_gemm_destroy(h);
}

TEST(CudaOps, GetRowsEveryTypeBitExact) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  const std::vector<int32_t> ids = {0, 49, 7, 7, 23, 1};
  for (DType t : kWeightTypes) {
    SCOPED_TRACE(std::string(dtype_name(t)));
    const int64_t d = traits(t).block_size == 256 ? 512 : (t == DType::F32 || t == DType::F16 || t == DType::BF16) ? 100 : 96;
    const auto wb = make_weights(t, d, 50, 99);
    Tensor tc = make_weight(*cpu, t, d, 50, 1, wb), tg = make_weight(*gpu, t, d, 50, 1, wb);
    const int n = static_cast<int>(ids.size());
    Tensor ic = make_tensor(*cpu, DType::I32, n, 1, ids.data()), ig = make_tensor(*gpu, DType::I32, n, 1, ids.data());
    Tensor oc = cpu->alloc(DType::F32, d, n), og = gpu->alloc(DType::F32, d, n);
    cpu->get_rows(tc, ic, oc);
    gpu->get_rows(tg, ig, og);
    const auto a = fetch(*gpu, og), b = fetch(*cpu, oc);
    ASSERT_EQ(a.size(), b.size());
    size_t diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff += std::memcmp(&a[i], &b[i], 4) != 0;
    EXPECT_EQ(diff, 0u) << "elements differing from dequantize_row";
    gpu->free(tg);
  }
}

TEST(CudaOps, GetRowsOutOfRangeIdGivesNaN) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const auto wb = make_weights(DType::Q8_0, 64, 4, 5);
  Tensor tg = make_weight(*gpu, DType::Q8_0, 64, 4, 1, wb);
  const std::vector<int32_t> ids = {1, 4, -1};
  Tensor ig = make_tensor(*gpu, DType::I32, 3, 1, ids.data());
  Tensor og = gpu->alloc(DType::F32, 64, 3);
  gpu->get_rows(tg, ig, og);
  const auto v = fetch(*gpu, og);
  EXPECT_TRUE(std::isfinite(v[0]));
  EXPECT_TRUE(std::isnan(v[64]) && std::isnan(v[128]));
}

TEST(CudaOps, RmsNorm) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  // (d ≤ 16 values per thread takes the register kernel, 4 / 8 / 16 per thread; 10 000 the loop kernel.)
  const std::pair<int64_t, int64_t> shapes[] = {{1, 4096}, {7, 100}, {33, 64}, {4, 5000}, {130, 128}, {3, 8192}, {2, 10000}, {5, 33}};
  for (auto [rows, d] : shapes) {
    for (int wmode = 0; wmode < 3; ++wmode) {  // F32 weight, F16 weight, none
      for (bool inplace : {false, true}) {
        SCOPED_TRACE("rows=" + std::to_string(rows) + " d=" + std::to_string(d) + " w=" + std::to_string(wmode) + " inplace=" + std::to_string(inplace));
        const auto x = randn(static_cast<size_t>(rows * d), static_cast<uint32_t>(rows + d), 3.0f);
        auto wf = randn(static_cast<size_t>(d), 11u);
        std::vector<uint16_t> wh(wf.size());
        for (size_t i = 0; i < wf.size(); ++i) quantize_row(DType::F16, &wf[i], &wh[i], 1);
        Tensor xc = make_tensor(*cpu, DType::F32, d, rows, x.data()), xg = make_tensor(*gpu, DType::F32, d, rows, x.data());
        Tensor wc, wg;
        if (wmode == 0) wc = make_tensor(*cpu, DType::F32, d, 1, wf.data()), wg = make_tensor(*gpu, DType::F32, d, 1, wf.data());
        if (wmode == 1) wc = make_tensor(*cpu, DType::F16, d, 1, wh.data()), wg = make_tensor(*gpu, DType::F16, d, 1, wh.data());
        Tensor yc = inplace ? xc : cpu->alloc(DType::F32, d, rows), yg = inplace ? xg : gpu->alloc(DType::F32, d, rows);
        cpu->rms_norm(xc, wc, yc, 1e-6f);
        gpu->rms_norm(xg, wg, yg, 1e-6f);
        const ErrStats e = compare(fetch(*gpu, yg), fetch(*cpu, yc));
        EXPECT_EQ(e.bad, 0u);
        EXPECT_LE(e.rel, 2e-6);
      }
    }
  }
}

TEST(CudaOps, ElementWise) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  for (int64_t n : {1, 37, 4096, 100003}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto a = randn(static_cast<size_t>(n), 1, 4.0f), b = randn(static_cast<size_t>(n), 2, 4.0f);
    auto twin = [&](const std::vector<float>& v) {
      return std::make_pair(make_tensor(*cpu, DType::F32, n, 1, v.data()), make_tensor(*gpu, DType::F32, n, 1, v.data()));
    };
    auto check = [&](const char* what, const Tensor& c, const Tensor& g, double bound) {
      const ErrStats e = compare(fetch(*gpu, g), fetch(*cpu, c));
      EXPECT_EQ(e.bad, 0u) << what;
      EXPECT_LE(e.rel, bound) << what << " max_abs " << e.max_abs;
    };
    {
      auto [ac, ag] = twin(a);
      auto [bc, bg] = twin(b);
      cpu->add(ac, bc, ac);  // aliasing y = a
      gpu->add(ag, bg, ag);
      check("add", ac, ag, 0);
      cpu->scale(ac, 0.37f);
      gpu->scale(ag, 0.37f);
      check("scale", ac, ag, 0);
      cpu->mul_sigmoid(ac, bc);
      gpu->mul_sigmoid(ag, bg);
      check("mul_sigmoid", ac, ag, 2e-6);
      cpu->softcap(ac, 1.5f);
      gpu->softcap(ag, 1.5f);
      check("softcap", ac, ag, 2e-6);
    }
    for (Activation act : {Activation::Silu, Activation::GeluTanh}) {
      auto [gc, gg] = twin(a);
      auto [uc, ug] = twin(b);
      Tensor yc = cpu->alloc(DType::F32, n, 1), yg = gpu->alloc(DType::F32, n, 1);
      cpu->glu(gc, uc, yc, act);
      gpu->glu(gg, ug, yg, act);
      check(act == Activation::Silu ? "glu silu" : "glu gelu", yc, yg, act == Activation::Silu ? 2e-6 : 1e-3);
    }
  }
  // add_bias (F32 and F16 bias) and gather_cols on 2-D shapes.
  const int64_t rows = 9, d = 48;
  const auto y = randn(static_cast<size_t>(rows * d), 3), bias = randn(static_cast<size_t>(d), 4);
  std::vector<uint16_t> bh(bias.size());
  quantize_row(DType::F16, bias.data(), bh.data(), d);
  for (bool f16 : {false, true}) {
    Tensor yc = make_tensor(*cpu, DType::F32, d, rows, y.data()), yg = make_tensor(*gpu, DType::F32, d, rows, y.data());
    Tensor bc = f16 ? make_tensor(*cpu, DType::F16, d, 1, bh.data()) : make_tensor(*cpu, DType::F32, d, 1, bias.data());
    Tensor bg = f16 ? make_tensor(*gpu, DType::F16, d, 1, bh.data()) : make_tensor(*gpu, DType::F32, d, 1, bias.data());
    cpu->add_bias(yc, bc);
    gpu->add_bias(yg, bg);
    EXPECT_EQ(compare(fetch(*gpu, yg), fetch(*cpu, yc)).rel, 0.0) << "add_bias f16=" << f16;
  }
  const auto src = randn(static_cast<size_t>(rows * 96), 5);
  for (int col0 : {0, 16}) {  // (rows, 3 groups of 32) → (rows, 3 × 16)
    Tensor sc = make_tensor(*cpu, DType::F32, 96, rows, src.data()), sg = make_tensor(*gpu, DType::F32, 96, rows, src.data());
    Tensor dc = cpu->alloc(DType::F32, 48, rows), dg = gpu->alloc(DType::F32, 48, rows);
    cpu->gather_cols(sc, 32, col0, dc);
    gpu->gather_cols(sg, 32, col0, dg);
    EXPECT_EQ(compare(fetch(*gpu, dg), fetch(*cpu, dc)).rel, 0.0) << "gather_cols col0=" << col0;
  }
}

// argmax_rows: the CPU's rule exactly (ties to the lowest column, NaN never wins, NaN in column 0 → 0) on
// vocabulary-sized rows with planted ties, NaNs and infinities.
TEST(CudaOps, ArgmaxRowsMatchesCpu) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  // 151 936: rows 16-byte aligned (the float4 path); 151 937: every other row misaligned (scalar path) and
  // a tail past the last float4; 1 000: the small-row launch.
  for (const int64_t V : {int64_t{151936}, int64_t{151937}, int64_t{1000}}) {
    SCOPED_TRACE("V = " + std::to_string(V));
    const int64_t rows = 7;
    auto x = randn(static_cast<size_t>(V * rows), 9);
    x[static_cast<size_t>(0 * V + 500)] = 50, x[static_cast<size_t>(0 * V + V - 3)] = 50;     // tie: 500
    x[static_cast<size_t>(1 * V + 0)] = std::nanf("");                                       // → 0
    x[static_cast<size_t>(2 * V + 7)] = std::nanf(""), x[static_cast<size_t>(2 * V + 8)] = 60;  // → 8
    x[static_cast<size_t>(3 * V + V - 1)] = INFINITY;                                        // last column
    for (int64_t i = 0; i < V; ++i) x[static_cast<size_t>(4 * V + i)] = -INFINITY;           // → 0
    x[static_cast<size_t>(5 * V + V - 2)] = 70, x[static_cast<size_t>(5 * V + V - 1)] = 70;   // tie in the tail: V − 2
    Tensor xc = make_tensor(*cpu, DType::F32, V, rows, x.data()), xg = make_tensor(*gpu, DType::F32, V, rows, x.data());
    Tensor ic = cpu->alloc(DType::I32, rows, 1), ig = gpu->alloc(DType::I32, rows, 1);
    cpu->argmax_rows(xc, ic);
    gpu->argmax_rows(xg, ig);
    std::vector<int32_t> a(static_cast<size_t>(rows)), b(static_cast<size_t>(rows));
    cpu->download(ic, a.data(), a.size() * 4);
    gpu->download(ig, b.data(), b.size() * 4);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a[0], 500);
    EXPECT_EQ(a[1], 0);
    EXPECT_EQ(a[2], 8);
    EXPECT_EQ(a[3], V - 1);
    EXPECT_EQ(a[4], 0);
    EXPECT_EQ(a[5], V - 2);
  }
}

// add_rms_norm: the fused residual step equals add then rms_norm bit for bit (x and y), for the row widths
// of every norm launch shape (32 / 128 / 512 threads), with and without a weight.
TEST(CudaOps, AddRmsNormEqualsAddThenRmsNorm) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  for (const int64_t d : {int64_t{64}, int64_t{896}, int64_t{4096}, int64_t{5120}}) {
    for (const bool with_w : {true, false}) {
      SCOPED_TRACE("d = " + std::to_string(d) + (with_w ? " with weight" : " no weight"));
      const int64_t rows = 5;
      auto xv = randn(static_cast<size_t>(d * rows), 21), rv = randn(static_cast<size_t>(d * rows), 22), wv = randn(static_cast<size_t>(d), 23);
      Tensor x1 = make_tensor(*gpu, DType::F32, d, rows, xv.data()), x2 = make_tensor(*gpu, DType::F32, d, rows, xv.data());
      Tensor r = make_tensor(*gpu, DType::F32, d, rows, rv.data());
      Tensor w = with_w ? make_tensor(*gpu, DType::F32, d, 1, wv.data()) : Tensor{};
      Tensor y1 = gpu->alloc(DType::F32, d, rows), y2 = gpu->alloc(DType::F32, d, rows);
      gpu->add(x1, r, x1);
      gpu->rms_norm(x1, w, y1, 1e-6f);
      gpu->add_rms_norm(x2, r, w, y2, 1e-6f);
      std::vector<float> a(static_cast<size_t>(d * rows)), b(a.size()), c(a.size()), e(a.size());
      gpu->download(x1, a.data(), a.size() * 4);
      gpu->download(x2, b.data(), b.size() * 4);
      gpu->download(y1, c.data(), c.size() * 4);
      gpu->download(y2, e.data(), e.size() * 4);
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4));
      EXPECT_EQ(0, std::memcmp(c.data(), e.data(), c.size() * 4));
    }
  }
}

// topk_rows: the CPU's rule exactly (descending, ties to the lower column, NaN never chosen, fewer valid
// values than k padded with the last one) and its log-softmax values, on vocabulary-sized rows with
// planted ties, ±0, infinities and NaNs, and on a short row with mostly NaNs.
TEST(CudaOps, TopkRowsMatchesCpu) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  struct Case {
    int64_t cols, rows;
  };
  for (const Case c : {Case{151936, 6}, Case{100, 3}, Case{248320, 2}}) {
    auto x = randn(static_cast<size_t>(c.cols * c.rows), static_cast<uint32_t>(c.cols));
    // Row 0: many exact ties (values rounded to 1/4), so the k-th value is shared by many columns.
    for (int64_t i = 0; i < c.cols; ++i) x[static_cast<size_t>(i)] = std::round(x[static_cast<size_t>(i)] * 4.0f) / 4.0f;
    if (c.rows > 1) {  // row 1: NaNs, infinities, ±0 among the winners
      float* r = x.data() + c.cols;
      r[3] = std::nanf(""), r[4] = INFINITY, r[5] = 30.0f, r[6] = 30.0f, r[c.cols - 1] = 30.0f, r[7] = std::nanf("");
      for (int64_t i = 10; i < c.cols; i += 7) r[i] = -INFINITY;
    }
    if (c.cols == 100) {  // row 2: only 30 non-NaN values (k = 64 pads), some of them −0 and +0
      float* r = x.data() + 2 * c.cols;
      for (int64_t i = 0; i < 70; ++i) r[i * 10 / 7] = std::nanf("");
      r[99] = 0.0f, r[98] = -0.0f;
    }
    Tensor xc = make_tensor(*cpu, DType::F32, c.cols, c.rows, x.data()), xg = make_tensor(*gpu, DType::F32, c.cols, c.rows, x.data());
    for (int k : {1, 2, 7, 40, 64}) {
      SCOPED_TRACE("cols " + std::to_string(c.cols) + " k " + std::to_string(k));
      Tensor ic = cpu->alloc(DType::I32, k, c.rows), ig = gpu->alloc(DType::I32, k, c.rows);
      Tensor lc = cpu->alloc(DType::F32, k, c.rows), lg = gpu->alloc(DType::F32, k, c.rows);
      cpu->topk_rows(xc, k, ic, lc);
      gpu->topk_rows(xg, k, ig, lg);
      std::vector<int32_t> a(static_cast<size_t>(k * c.rows)), b(a.size());
      cpu->download(ic, a.data(), a.size() * 4);
      gpu->download(ig, b.data(), b.size() * 4);
      EXPECT_EQ(a, b);
      const auto la = fetch(*cpu, lc), lb = fetch(*gpu, lg);
      for (size_t i = 0; i < la.size(); ++i) {
        if (std::isnan(la[i]) && std::isnan(lb[i])) continue;
        EXPECT_NEAR(la[i], lb[i], 1e-5) << "entry " << i;
      }
      for (Tensor* t : {&ic, &lc}) cpu->free(*t);
      for (Tensor* t : {&ig, &lg}) gpu->free(*t);
    }
    EXPECT_THROW(gpu->topk_rows(xg, 65, xg, xg), Error);  // k above 64 (and wrong types): a clear error
    cpu->free(xc);
    gpu->free(xg);
  }
}

// kv_copy: sequential semantics (a copy may read a cell an earlier copy wrote, or one a later copy
// overwrites), K and V, F16 and F32 caches, row widths of 16-, 4- and 2-byte multiples; bytes identical.
TEST(CudaOps, KvCopyMatchesCpu) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  const int64_t cells = 64;
  // Chains: 2→1 then 3→2 (1 gets old 2, 2 gets old 3); 1→20 then 20→21 (21 gets old 2 via 1);
  // 10→11 then 5→10 then 7→5 (reads before overwrites); a self copy; then a long random list.
  std::vector<int32_t> src = {2, 3, 1, 20, 10, 5, 7, 9}, dst = {1, 2, 20, 21, 11, 10, 5, 9};
  std::mt19937 rng(5);
  for (int i = 0; i < 40; ++i) src.push_back(static_cast<int32_t>(rng() % cells)), dst.push_back(static_cast<int32_t>(rng() % cells));
  for (DType t : {DType::F16, DType::F32}) {
    for (int64_t w : {int64_t{1024}, int64_t{6}, int64_t{3}}) {
      if (t == DType::F32 && w == 3) continue;
      SCOPED_TRACE(std::string(dtype_name(t)) + " width " + std::to_string(w));
      const size_t bytes = row_bytes(t, w) * static_cast<size_t>(cells);
      std::vector<uint8_t> kb(bytes), vb(bytes);
      for (size_t i = 0; i < bytes; ++i) kb[i] = static_cast<uint8_t>(rng()), vb[i] = static_cast<uint8_t>(rng());
      KvLayer kc{make_tensor(*cpu, t, w, cells, kb.data()), make_tensor(*cpu, t, w, cells, vb.data())};
      KvLayer kg{make_tensor(*gpu, t, w, cells, kb.data()), make_tensor(*gpu, t, w, cells, vb.data())};
      const int n = static_cast<int>(src.size());
      Tensor sc = make_tensor(*cpu, DType::I32, n, 1, src.data()), dc = make_tensor(*cpu, DType::I32, n, 1, dst.data());
      Tensor sg = make_tensor(*gpu, DType::I32, n, 1, src.data()), dg = make_tensor(*gpu, DType::I32, n, 1, dst.data());
      cpu->kv_copy(kc, sc, dc);
      gpu->kv_copy(kg, sg, dg);
      for (int which = 0; which < 2; ++which) {
        std::vector<uint8_t> a(bytes), b(bytes);
        cpu->download(which ? kc.v : kc.k, a.data(), bytes);
        gpu->download(which ? kg.v : kg.k, b.data(), bytes);
        EXPECT_TRUE(a == b) << (which ? "V" : "K") << " cache differs";
      }
      // The chain's expected rows, spelled out: cell 21 ends with cell 2's original K row.
      std::vector<uint8_t> row21(row_bytes(t, w));
      gpu->download(kg.k, row21.data(), row21.size(), 21 * row21.size());
      EXPECT_EQ(0, std::memcmp(row21.data(), kb.data() + 2 * row21.size(), row21.size()));
      for (Tensor* x : {&kc.k, &kc.v, &sc, &dc}) cpu->free(*x);
      for (Tensor* x : {&kg.k, &kg.v, &sg, &dg}) gpu->free(*x);
    }
  }
}

TEST(CudaOps, Rope) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  struct Case {
    int heads, head_dim, n_rot;
  };
  const Case cases[] = {{3, 64, 64}, {2, 128, 64}, {5, 80, 80}, {8, 256, 128}};
  const int n = 11;
  std::vector<int32_t> pos(n);
  std::mt19937 rng(3);
  for (auto& p : pos) p = static_cast<int32_t>(rng() % 40000);
  pos[0] = 0;
  for (const Case& c : cases)
    for (RopeStyle style : {RopeStyle::Norm, RopeStyle::Neox}) {
      SCOPED_TRACE("head_dim=" + std::to_string(c.head_dim) + " n_rot=" + std::to_string(c.n_rot) + " neox=" + std::to_string(style == RopeStyle::Neox));
      const int64_t w = static_cast<int64_t>(c.heads) * c.head_dim;
      const auto x = randn(static_cast<size_t>(n * w), 8);
      Tensor xc = make_tensor(*cpu, DType::F32, w, n, x.data()), xg = make_tensor(*gpu, DType::F32, w, n, x.data());
      Tensor pc = make_tensor(*cpu, DType::I32, n, 1, pos.data()), pg_ = make_tensor(*gpu, DType::I32, n, 1, pos.data());
      cpu->rope(xc, pc, c.heads, c.head_dim, c.n_rot, 1e6f, style);
      gpu->rope(xg, pg_, c.heads, c.head_dim, c.n_rot, 1e6f, style);
      const ErrStats e = compare(fetch(*gpu, xg), fetch(*cpu, xc));
      EXPECT_EQ(e.bad, 0u);
      EXPECT_LE(e.max_abs, 2e-5);
    }
}

// qk_norm_rope: the one-launch kernel (CudaOptions::fuse_qk_norm_rope) against the four ops it replaces on the
// same GPU — bit-identical, q and k — and against the CPU (≤ the norm/RoPE op bounds), for head_dim 64/80/128/256,
// partial rotary (n_rot < head_dim), both styles, F32/F16/absent norm weights (absent: rope only; one absent),
// 1 and 37 rows, GQA and head counts that leave the last block of heads part-empty. With op profiling on, the
// fused side must have run as the one op "qk_norm_rope" (not silently as the four).
TEST(CudaOps, QkNormRopeFusedBitIdentical) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto sep = test::make_cuda(false), fused = test::make_cuda(false);
  CudaOptions so = sep->options(), fo = fused->options();
  so.fuse_qk_norm_rope = false;
  fo.fuse_qk_norm_rope = true;
  fo.profile = true;
  sep->set_options(so);
  fused->set_options(fo);
  struct Case {
    int n_head, n_head_kv, head_dim, n_rot;
  };
  const Case cases[] = {{32, 8, 128, 128}, {8, 2, 64, 64}, {5, 1, 64, 32}, {16, 4, 256, 256}, {8, 2, 256, 64},
                        {4, 4, 128, 64},   {3, 1, 80, 80},  {14, 2, 64, 64}};
  // wmode: 0 both F32 weights, 1 both F16, 2 none (rope only), 3 q F32 and no k norm, 4 k F16 and no q norm.
  int checked = 0;
  for (const Case& c : cases)
    for (const int n : {1, 37})
      for (RopeStyle style : {RopeStyle::Norm, RopeStyle::Neox})
        for (int wmode = 0; wmode < 5; ++wmode) {
          SCOPED_TRACE("heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + " head_dim " + std::to_string(c.head_dim) +
                       " n_rot " + std::to_string(c.n_rot) + " rows " + std::to_string(n) + " neox " +
                       std::to_string(style == RopeStyle::Neox) + " wmode " + std::to_string(wmode));
          const int64_t qw = static_cast<int64_t>(c.n_head) * c.head_dim, kw = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
          const auto qv = randn(static_cast<size_t>(n * qw), static_cast<uint32_t>(31 + c.head_dim + n), 3.0f);
          const auto kv = randn(static_cast<size_t>(n * kw), static_cast<uint32_t>(47 + c.head_dim + n), 3.0f);
          const auto wq = randn(static_cast<size_t>(c.head_dim), 5u), wk = randn(static_cast<size_t>(c.head_dim), 6u);
          std::vector<uint16_t> wqh(wq.size()), wkh(wk.size());
          quantize_row(DType::F16, wq.data(), wqh.data(), c.head_dim);
          quantize_row(DType::F16, wk.data(), wkh.data(), c.head_dim);
          std::vector<int32_t> pos(static_cast<size_t>(n));
          std::mt19937 rng(static_cast<uint32_t>(n + c.head_dim));
          for (auto& p : pos) p = static_cast<int32_t>(rng() % 40000);
          pos[0] = 0;
          if (n > 2) pos[1] = 1, pos[2] = 32767;
          const bool q_f16 = wmode == 1, k_f16 = wmode == 1 || wmode == 4;
          const bool has_q = wmode == 0 || wmode == 1 || wmode == 3, has_k = wmode == 0 || wmode == 1 || wmode == 4;
          struct Side {
            Tensor q, k, wq, wk, pos;
          };
          auto make = [&](Backend& be) {
            Side sd;
            sd.q = make_tensor(be, DType::F32, qw, n, qv.data());
            sd.k = make_tensor(be, DType::F32, kw, n, kv.data());
            if (has_q) sd.wq = q_f16 ? make_tensor(be, DType::F16, c.head_dim, 1, wqh.data()) : make_tensor(be, DType::F32, c.head_dim, 1, wq.data());
            if (has_k) sd.wk = k_f16 ? make_tensor(be, DType::F16, c.head_dim, 1, wkh.data()) : make_tensor(be, DType::F32, c.head_dim, 1, wk.data());
            sd.pos = make_tensor(be, DType::I32, n, 1, pos.data());
            be.qk_norm_rope(sd.q, sd.k, sd.wq, sd.wk, sd.pos, c.n_head, c.n_head_kv, c.head_dim, c.n_rot, 1e6f, style, 1e-6f);
            return sd;
          };
          Side a = make(*sep), b = make(*fused), r = make(*cpu);
          const auto aq = fetch(*sep, a.q), ak = fetch(*sep, a.k), bq = fetch(*fused, b.q), bk = fetch(*fused, b.k);
          EXPECT_EQ(0, std::memcmp(aq.data(), bq.data(), aq.size() * 4)) << "q: fused differs from rms_norm + rope";
          EXPECT_EQ(0, std::memcmp(ak.data(), bk.data(), ak.size() * 4)) << "k: fused differs from rms_norm + rope";
          EXPECT_EQ(compare(bq, aq).max_abs, 0.0);
          EXPECT_EQ(compare(bk, ak).max_abs, 0.0);
          for (auto [g, ref] : {std::pair{&bq, fetch(*cpu, r.q)}, std::pair{&bk, fetch(*cpu, r.k)}}) {
            const ErrStats e = compare(*g, ref);
            EXPECT_EQ(e.bad, 0u);
            EXPECT_LE(e.rel, 1e-5) << "vs CPU";
          }
          const auto prof = fused->profile_take();
          EXPECT_TRUE(std::any_of(prof.begin(), prof.end(), [](const Backend::OpTime& t) { return t.key.rfind("qk_norm_rope", 0) == 0; }))
              << "the fused kernel did not run";
          for (const auto& t : prof) EXPECT_TRUE(t.key.rfind("rms_norm", 0) != 0 && t.key.rfind("rope", 0) != 0) << t.key;
          auto release = [](Backend& be, Side& sd) {
            for (Tensor* t : {&sd.q, &sd.k, &sd.wq, &sd.wk, &sd.pos})
              if (t->valid()) be.free(*t);
          };
          release(*sep, a);
          release(*fused, b);
          release(*cpu, r);
          ++checked;
        }
  EXPECT_EQ(checked, 8 * 2 * 2 * 5);
  // A head the kernel does not take (512) still gives the four ops' result through the default.
  {
    const int64_t d = 512;
    const auto qv = randn(static_cast<size_t>(2 * d), 71), kv = randn(static_cast<size_t>(d), 72), w = randn(static_cast<size_t>(d), 73);
    const int32_t pos = 123;
    std::vector<float> out[2][2];
    for (int f = 0; f < 2; ++f) {
      Backend& be = f ? static_cast<Backend&>(*fused) : static_cast<Backend&>(*sep);
      Tensor q = make_tensor(be, DType::F32, 2 * d, 1, qv.data()), k = make_tensor(be, DType::F32, d, 1, kv.data());
      Tensor wt = make_tensor(be, DType::F32, d, 1, w.data()), p = make_tensor(be, DType::I32, 1, 1, &pos);
      be.qk_norm_rope(q, k, wt, wt, p, 2, 1, static_cast<int>(d), 128, 1e4f, RopeStyle::Neox, 1e-6f);
      out[f][0] = fetch(be, q), out[f][1] = fetch(be, k);
      for (Tensor* t : {&q, &k, &wt, &p}) be.free(*t);
    }
    EXPECT_EQ(out[0][0], out[1][0]);
    EXPECT_EQ(out[0][1], out[1][1]);
    fused->profile_take();
  }
}

// ---- attention over the paged cache -----------------------------------------------------------------

struct AttnCase {
  int n_head, n_head_kv, head_dim;
  int window;
  float softcap;
  DType kv;
};

class CudaAttention : public testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesCpu) {
  PG_REQUIRE_GPU();
  const AttnCase c = GetParam();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false, false);  // attention.cu at every row count (the FA path: test_cuda_attention_prefill)
  const int n_seq = 3, block_size = 16;
  const int lens[n_seq] = {700, 45, 300};
  const int max_blocks = (700 + block_size - 1) / block_size;
  const int n_blocks = n_seq * max_blocks;
  // Physical blocks in a shuffled order: the block table must be followed, not assumed contiguous.
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(42));
  std::vector<int32_t> table(static_cast<size_t>(n_seq * max_blocks));
  for (size_t i = 0; i < table.size(); ++i) table[i] = perm[i];
  auto cell = [&](int s, int p) { return table[static_cast<size_t>(s * max_blocks + p / block_size)] * block_size + p % block_size; };
  const int64_t kvw = static_cast<int64_t>(c.n_head_kv) * c.head_dim, qw = static_cast<int64_t>(c.n_head) * c.head_dim;

  struct Side {
    Backend* be;
    KvLayer kv;
    Tensor table;
  };
  Side sides[2] = {{cpu.get(), {}, {}}, {gpu.get(), {}, {}}};
  for (auto& s : sides) {
    s.kv.k = s.be->alloc(c.kv, kvw, static_cast<int64_t>(n_blocks) * block_size);
    s.kv.v = s.be->alloc(c.kv, kvw, static_cast<int64_t>(n_blocks) * block_size);
    s.table = make_tensor(*s.be, DType::I32, max_blocks, n_seq, table.data());
  }
  // Builds the per-row index tensors of a batch on one side.
  auto make_batch = [&](Side& s, const std::vector<int32_t>& pos, const std::vector<int32_t>& seq, std::vector<Tensor>& keep) {
    AttentionBatch b;
    const int n = static_cast<int>(pos.size());
    std::vector<int32_t> cells(pos.size());
    int mx = 0;
    for (size_t i = 0; i < pos.size(); ++i) {
      cells[i] = cell(seq[i], pos[i]);
      mx = std::max(mx, pos[i] + 1);
    }
    b.n_tokens = n;
    b.positions = make_tensor(*s.be, DType::I32, n, 1, pos.data());
    b.seq = make_tensor(*s.be, DType::I32, n, 1, seq.data());
    b.cells = make_tensor(*s.be, DType::I32, n, 1, cells.data());
    keep.insert(keep.end(), {b.positions, b.seq, b.cells});
    b.block_table = s.table;
    b.block_size = block_size;
    b.max_blocks = max_blocks;
    b.max_kv_len = mx;
    return b;
  };
  // Fill every sequence's cache through kv_store, in batches.
  for (int sq = 0; sq < n_seq; ++sq) {
    for (int p0 = 0; p0 < lens[sq]; p0 += 256) {
      std::vector<int32_t> pos, seq;
      for (int p = p0; p < std::min(lens[sq], p0 + 256); ++p) pos.push_back(p), seq.push_back(sq);
      const int n = static_cast<int>(pos.size());
      const auto k = randn(static_cast<size_t>(n * kvw), static_cast<uint32_t>(100 + sq * 7 + p0));
      const auto v = randn(static_cast<size_t>(n * kvw), static_cast<uint32_t>(200 + sq * 7 + p0));
      for (auto& s : sides) {
        std::vector<Tensor> keep;
        AttentionBatch b = make_batch(s, pos, seq, keep);
        Tensor kt = make_tensor(*s.be, DType::F32, kvw, n, k.data()), vt = make_tensor(*s.be, DType::F32, kvw, n, v.data());
        s.be->kv_store(s.kv, kt, vt, b);
        s.be->synchronize();
        for (auto& t : keep) s.be->free(t);
        s.be->free(kt);
        s.be->free(vt);
      }
    }
  }
  AttentionParams ap;
  ap.n_head = c.n_head;
  ap.n_head_kv = c.n_head_kv;
  ap.head_dim = c.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  ap.sliding_window = c.window;
  ap.logit_softcap = c.softcap;
  // Batches. First every row count 1..64 in ascending order (consecutive positions of sequence 0, then
  // alternating sequences): a launch needing more shared memory than any before it must still work (the
  // opt-in limit once stayed at the first launch's size: "invalid argument" at 8 rows on 128-wide heads,
  // at 2 rows on 256-wide ones). Then a mixed prefill-like batch (rows of three sequences, runs of
  // consecutive positions), a decode batch (one row per sequence at its last position: long contexts,
  // split-K), and token trees (below).
  struct AttnBatch {
    std::vector<int32_t> pos, seq, kv_len;
    std::vector<uint32_t> mask;  // (rows, kTreeMaskWords) when a tree is present
  };
  std::vector<AttnBatch> batches;
  for (int n = 1; n <= 64; ++n) {
    AttnBatch b;
    for (int i = 0; i < n; ++i) {
      const int sq = n % 2 ? 0 : i % 3;
      b.pos.push_back(sq == 0 ? 700 - n + i : sq == 1 ? 44 - i % 20 : 299 - i % 50);
      b.seq.push_back(sq);
    }
    batches.push_back(b);
  }
  {
    AttnBatch b;
    for (int p = 690; p < 700; ++p) b.pos.push_back(p), b.seq.push_back(0);
    for (int p = 0; p < 45; ++p) b.pos.push_back(p), b.seq.push_back(1);
    b.pos.push_back(299), b.seq.push_back(2);
    for (int p = 100; p < 140; ++p) b.pos.push_back(p), b.seq.push_back(2);
    batches.push_back(b);
    batches.push_back({{699, 44, 299}, {0, 1, 2}, {}, {}});
    batches.push_back({{5}, {1}, {}, {}});
  }
  // Token trees (speculative verification): a tree of `size` draft rows of sequence sq whose committed
  // cells are [0, base); the rows are stored at logical positions base, base+1, … in batch order, their
  // RoPE positions are base + depth, and each sees its ancestors and itself (random parents, so the masks
  // are irregular and, for 100 rows, span all four mask words). Chain rows of another sequence in the same
  // batch keep the causal rule (kv_len = pos + 1, no bits).
  std::mt19937 trng(11);
  auto add_tree = [&](AttnBatch& b, int sq, int base, int size) {
    std::vector<int> parent(static_cast<size_t>(size)), depth(static_cast<size_t>(size));
    std::vector<std::vector<uint32_t>> anc(static_cast<size_t>(size), std::vector<uint32_t>(kTreeMaskWords, 0u));
    for (int i = 0; i < size; ++i) {
      const int par = i == 0 ? -1 : static_cast<int>(trng() % static_cast<uint32_t>(i + 1)) - 1;
      parent[static_cast<size_t>(i)] = par;
      depth[static_cast<size_t>(i)] = par < 0 ? 0 : depth[static_cast<size_t>(par)] + 1;
      if (par >= 0) anc[static_cast<size_t>(i)] = anc[static_cast<size_t>(par)];
      anc[static_cast<size_t>(i)][static_cast<size_t>(i / 32)] |= 1u << (i % 32);
      b.pos.push_back(base + depth[static_cast<size_t>(i)]);
      b.seq.push_back(sq);
      b.kv_len.push_back(base);
      b.mask.insert(b.mask.end(), anc[static_cast<size_t>(i)].begin(), anc[static_cast<size_t>(i)].end());
    }
  };
  {
    AttnBatch b;
    add_tree(b, 0, 580, 100);
    for (int p = 40; p < 45; ++p) {
      b.pos.push_back(p), b.seq.push_back(1), b.kv_len.push_back(p + 1);
      b.mask.insert(b.mask.end(), kTreeMaskWords, 0u);
    }
    add_tree(b, 2, 250, 40);
    batches.push_back(b);
    AttnBatch one;  // a single tree of 22 rows (the default DDTree budget), alone in its batch
    add_tree(one, 2, 270, 22);
    batches.push_back(one);
  }
  for (const AttnBatch& ab : batches) {
    const auto& pos = ab.pos;
    const auto& seq = ab.seq;
    SCOPED_TRACE("batch of " + std::to_string(pos.size()) + " rows" + (ab.mask.empty() ? "" : " (tree)"));
    const int n = static_cast<int>(pos.size());
    const auto q = randn(static_cast<size_t>(n * qw), static_cast<uint32_t>(n));
    // out[0] CPU, out[1] CUDA with the exact max_kv_len, out[2] CUDA with the grid sized for a larger
    // bucket, as a graph-recorded decode step launches it (model.cpp: power-of-two buckets): the split-K
    // ranges must follow the rows' actual lengths, not the bucket.
    std::vector<float> out[3];
    for (int si = 0; si < 3; ++si) {
      Side& s = sides[si == 0 ? 0 : 1];
      std::vector<Tensor> keep;
      AttentionBatch b = make_batch(s, pos, seq, keep);
      if (!ab.mask.empty()) {
        b.kv_len = make_tensor(*s.be, DType::I32, n, 1, ab.kv_len.data());
        b.tree_mask = make_tensor(*s.be, DType::I32, kTreeMaskWords, n, ab.mask.data());
        keep.insert(keep.end(), {b.kv_len, b.tree_mask});
        int mx = 0;
        for (int r = 0; r < n; ++r) {
          int hi = ab.kv_len[static_cast<size_t>(r)];
          for (int j = 0; j < kMaxTreeRows; ++j)
            if (ab.mask[static_cast<size_t>(r * kTreeMaskWords + j / 32)] >> (j % 32) & 1u) hi = ab.kv_len[static_cast<size_t>(r)] + j + 1;
          mx = std::max(mx, hi);
        }
        b.max_kv_len = mx;
      }
      if (si == 2) {
        int bucket = 256;
        while (bucket < b.max_kv_len) bucket *= 2;
        b.max_kv_len = 2 * bucket;
      }
      Tensor qt = make_tensor(*s.be, DType::F32, qw, n, q.data());
      const std::vector<float> poison(static_cast<size_t>(n * qw), std::nanf(""));
      Tensor ot = make_tensor(*s.be, DType::F32, qw, n, poison.data());
      s.be->attention(qt, s.kv, b, ap, ot);
      out[si] = fetch(*s.be, ot);
      for (auto& t : keep) s.be->free(t);
      s.be->free(qt);
      s.be->free(ot);
    }
    for (int si = 1; si < 3; ++si) {
      SCOPED_TRACE(si == 1 ? "exact max_kv_len" : "bucketed max_kv_len");
      const ErrStats e = compare(out[si], out[0]);
      EXPECT_EQ(e.bad, 0u);
      EXPECT_LE(e.rel, 2e-5) << "max_abs " << e.max_abs;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         testing::Values(AttnCase{4, 2, 64, 0, 0.0f, DType::F16}, AttnCase{4, 2, 64, 0, 0.0f, DType::F32},
                                         AttnCase{8, 1, 128, 0, 0.0f, DType::F16}, AttnCase{6, 6, 80, 0, 0.0f, DType::F32},
                                         AttnCase{32, 8, 128, 37, 0.0f, DType::F16}, AttnCase{4, 4, 64, 0, 30.0f, DType::F32},
                                         AttnCase{2, 1, 256, 64, 50.0f, DType::F16}, AttnCase{32, 1, 64, 0, 0.0f, DType::F16},
                                         AttnCase{64, 1, 64, 0, 0.0f, DType::F32},
                                         // the decode shapes of qwen3-8b (32/8 × 128) and qwen35-27b (24/4 × 256)
                                         AttnCase{32, 8, 128, 0, 0.0f, DType::F16}, AttnCase{24, 4, 256, 0, 0.0f, DType::F16}));

// ---- mixture of experts ---------------------------------------------------------------------------------

TEST(CudaOps, MoeRoute) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  const int n = 37, ne = 64, k = 8;
  auto logits = randn(static_cast<size_t>(n * ne), 5, 2.0f);
  for (int e = 10; e < 20; ++e) logits[static_cast<size_t>(3 * ne + e)] = 3.25f;  // ties: lower ids first
  for (ExpertGating g : {ExpertGating::Softmax, ExpertGating::Sigmoid})
    for (bool norm : {false, true})
      for (float scale : {0.0f, 2.5f}) {
        SCOPED_TRACE("sigmoid=" + std::to_string(g == ExpertGating::Sigmoid) + " norm=" + std::to_string(norm) + " scale=" + std::to_string(scale));
        Tensor lc = make_tensor(*cpu, DType::F32, ne, n, logits.data()), lg = make_tensor(*gpu, DType::F32, ne, n, logits.data());
        Tensor ic = cpu->alloc(DType::I32, k, n), ig = gpu->alloc(DType::I32, k, n);
        Tensor wc = cpu->alloc(DType::F32, k, n), wg = gpu->alloc(DType::F32, k, n);
        cpu->moe_route(lc, k, g, norm, scale, ic, wc);
        gpu->moe_route(lg, k, g, norm, scale, ig, wg);
        std::vector<int32_t> a(static_cast<size_t>(n * k)), b(a.size());
        cpu->download(ic, a.data(), a.size() * 4);
        gpu->download(ig, b.data(), b.size() * 4);
        EXPECT_EQ(a, b);
        EXPECT_LE(compare(fetch(*gpu, wg), fetch(*cpu, wc)).rel, 1e-6);
      }
}

TEST(CudaOps, MoeFfn) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  struct Case {
    DType t;
    int n, n_exp, k;
  };
  // n ≤ 8: one GEMV per routed entry; larger n: entries grouped per expert (several tiles per expert
  // at n = 300) for the grouped tensor-core GEMM.
  const Case cases[] = {{DType::F16, 1, 16, 4}, {DType::Q4_K, 5, 16, 4}, {DType::Q8_0, 40, 16, 4},
                        {DType::Q4_K, 300, 8, 2}, {DType::BF16, 70, 8, 3},  {DType::Q6_K, 9, 4, 4}};
  const int64_t d = 256, ff = 512;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " n=" + std::to_string(c.n) + " experts=" + std::to_string(c.n_exp) + " k=" + std::to_string(c.k));
    const auto gate = make_weights(c.t, d, ff * c.n_exp, 1), up = make_weights(c.t, d, ff * c.n_exp, 2);
    const auto down = make_weights(c.t, ff, d * c.n_exp, 3);
    const auto x = randn(static_cast<size_t>(c.n * d), 4);
    // Routing: distinct experts per row, weights in (0, 1).
    std::vector<int32_t> ids(static_cast<size_t>(c.n * c.k));
    std::vector<float> w(ids.size());
    std::mt19937 rng(static_cast<uint32_t>(c.n));
    for (int r = 0; r < c.n; ++r) {
      std::vector<int32_t> e(static_cast<size_t>(c.n_exp));
      std::iota(e.begin(), e.end(), 0);
      std::shuffle(e.begin(), e.end(), rng);
      for (int j = 0; j < c.k; ++j) {
        ids[static_cast<size_t>(r * c.k + j)] = e[static_cast<size_t>(j)];
        w[static_cast<size_t>(r * c.k + j)] = static_cast<float>(rng() % 1000) / 1000.0f;
      }
    }
    std::vector<float> ref;
    {
      Tensor g = make_weight(*cpu, c.t, d, ff, c.n_exp, gate), u = make_weight(*cpu, c.t, d, ff, c.n_exp, up);
      Tensor dn = make_weight(*cpu, c.t, ff, d, c.n_exp, down);
      Tensor xt = make_tensor(*cpu, DType::F32, d, c.n, x.data());
      Tensor it = make_tensor(*cpu, DType::I32, c.k, c.n, ids.data()), wt = make_tensor(*cpu, DType::F32, c.k, c.n, w.data());
      Tensor o = cpu->alloc(DType::F32, d, c.n);
      cpu->moe_ffn(xt, it, wt, g, u, dn, Activation::Silu, o);
      ref = fetch(*cpu, o);
    }
    Tensor g = make_weight(*gpu, c.t, d, ff, c.n_exp, gate), u = make_weight(*gpu, c.t, d, ff, c.n_exp, up);
    Tensor dn = make_weight(*gpu, c.t, ff, d, c.n_exp, down);
    Tensor xt = make_tensor(*gpu, DType::F32, d, c.n, x.data());
    Tensor it = make_tensor(*gpu, DType::I32, c.k, c.n, ids.data()), wt = make_tensor(*gpu, DType::F32, c.k, c.n, w.data());
    for (bool exact : {true, false}) {
      CudaOptions o;
      o.exact_f32 = exact;
      gpu->set_options(o);
      const std::vector<float> poison(static_cast<size_t>(c.n * d), std::nanf(""));
      Tensor out = make_tensor(*gpu, DType::F32, d, c.n, poison.data());
      gpu->moe_ffn(xt, it, wt, g, u, dn, Activation::Silu, out);
      const std::vector<float> got = fetch(*gpu, out);
      const ErrStats e = compare(got, ref);
      // Default mode rounds the activations of quantized experts to 8 bits at every row count (the CPU
      // default mode's rounding; this reference is the exact CPU).
      const bool q8 = !exact && c.t != DType::F16 && c.t != DType::BF16;
      const bool tc = !exact && c.n > 8 && !q8;
      EXPECT_EQ(e.bad, 0u);
      // Three chained 8-bit-activation products (gate/up, then down on their GLU): up to 1.9 % measured.
      EXPECT_LE(e.rel, q8 ? 2.5e-2 : tc ? (c.t == DType::BF16 ? 8e-3 : 3e-3) : 2e-5) << (exact ? "exact" : "fast") << " max_abs " << e.max_abs;
      gpu->free(out);
      // Fused gate_up experts (qwen35moe): per expert rows [0, ff) gate, [ff, 2ff) up. The same kernels
      // read the same bytes, so the result is bit-identical.
      const size_t rb = row_bytes(c.t, d), eb = rb * static_cast<size_t>(ff);
      std::vector<uint8_t> fused(2 * eb * static_cast<size_t>(c.n_exp));
      for (int ex = 0; ex < c.n_exp; ++ex) {
        std::memcpy(fused.data() + 2 * eb * static_cast<size_t>(ex), gate.data() + eb * static_cast<size_t>(ex), eb);
        std::memcpy(fused.data() + 2 * eb * static_cast<size_t>(ex) + eb, up.data() + eb * static_cast<size_t>(ex), eb);
      }
      Tensor gu = make_weight(*gpu, c.t, d, 2 * ff, c.n_exp, fused);
      Tensor out2 = make_tensor(*gpu, DType::F32, d, c.n, poison.data());
      gpu->moe_ffn(xt, it, wt, gu, Tensor{}, dn, Activation::Silu, out2);
      const std::vector<float> got2 = fetch(*gpu, out2);
      EXPECT_EQ(0, std::memcmp(got.data(), got2.data(), got.size() * sizeof(float))) << "fused gate_up differs from separate gate/up";
      gpu->free(out2);
      gpu->free(gu);
    }
    for (Tensor* t : {&g, &u, &dn, &xt, &it, &wt}) gpu->free(*t);
  }
}

// Gated DeltaNet ops against the CPU: gates, row sigmoid, copy, the causal conv and the gated delta rule
// over a batch with a long segment (the CPU takes its chunked form), a segment with captured rows, a
// segment that starts from one of those captures (so the GPU must run segments in order), and a plain
// one. Outputs and every state slot are compared. Bound 1e-4 relative: both sides are FP32, but the CPU's
// chunked form sums in another order (it agrees with its own token-by-token form to ~1e-6).
TEST(CudaOps, GatedDeltaNetMatchesCpu) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  for (int d : {64, 128}) {
    SCOPED_TRACE("head dim " + std::to_string(d));
    const int hk = 2, hv = 4, K = 4, n = 40, n_seq = 3, slots = n_seq + n;
    const int64_t C = 2 * hk * d + hv * d, hs = static_cast<int64_t>(d) * d;
    // Segments: (start, len, src, dst) over rows listed in order 0..n-1.
    std::vector<int32_t> rows(n), capture(n, -1);
    std::iota(rows.begin(), rows.end(), 0);
    for (int r : {31, 32, 35}) capture[static_cast<size_t>(r)] = n_seq + r;
    const std::vector<int32_t> seg = {0, 30, 0, 0, 30, 4, 1, 1, 34, 3, n_seq + 31, -1, 37, 3, 2, 2};
    const int n_seg = 4;
    struct Side {
      Backend* be;
      RecurrentBatch rb;
      Tensor x, w, conv_state, conv_out, q, k, v, g, beta, state, out, dt_bias, a, rowgate;
    };
    const auto xv = randn(static_cast<size_t>(n * C), 11), wv = randn(static_cast<size_t>(C * K), 12, 0.5f);
    const auto cs = randn(static_cast<size_t>(slots * (K - 1) * C), 13);
    auto qv = randn(static_cast<size_t>(n * hk * d), 14), kv = randn(static_cast<size_t>(n * hk * d), 15);
    for (auto* t : {&qv, &kv})  // L2-normalised per head, as the model feeds them
      for (int64_t h = 0; h < n * hk; ++h) {
        double ss = 0;
        for (int i = 0; i < d; ++i) ss += (*t)[static_cast<size_t>(h * d + i)] * (*t)[static_cast<size_t>(h * d + i)];
        for (int i = 0; i < d; ++i) (*t)[static_cast<size_t>(h * d + i)] /= static_cast<float>(std::sqrt(ss));
      }
    const auto vv = randn(static_cast<size_t>(n * hv * d), 16);
    const auto alpha_raw = randn(static_cast<size_t>(n * hv), 17), beta_raw = randn(static_cast<size_t>(n * hv), 18);
    const auto dtb = randn(static_cast<size_t>(hv), 19), a_raw = randn(static_cast<size_t>(hv), 20);
    std::vector<float> av(static_cast<size_t>(hv));
    for (int h = 0; h < hv; ++h) av[static_cast<size_t>(h)] = -std::exp(0.3f * a_raw[static_cast<size_t>(h)]);
    const auto st0 = randn(static_cast<size_t>(slots * hv * hs), 21, 0.1f);
    const auto rg = randn(static_cast<size_t>(n), 22);
    Side sides[2];
    sides[0].be = cpu.get();
    sides[1].be = gpu.get();
    for (Side& sd : sides) {
      Backend& be = *sd.be;
      sd.rb.n_tokens = n;
      sd.rb.n_segments = n_seg;
      sd.rb.h_rows = rows;
      sd.rb.h_seg = seg;
      sd.rb.h_capture = capture;
      sd.rb.rows = make_tensor(be, DType::I32, n, 1, rows.data());
      sd.rb.seg = make_tensor(be, DType::I32, 4, n_seg, seg.data());
      sd.rb.capture = make_tensor(be, DType::I32, n, 1, capture.data());
      sd.x = make_tensor(be, DType::F32, C, n, xv.data());
      const int64_t wne[4] = {K, C, 1, 1};
      sd.w = be.load_weight(DType::F32, wne, wv.data());
      sd.conv_state = make_tensor(be, DType::F32, (K - 1) * C, slots, cs.data());
      sd.conv_out = be.alloc(DType::F32, C, n);
      be.ssm_conv(sd.x, sd.w, sd.conv_state, sd.rb, true, sd.conv_out);
      sd.g = make_tensor(be, DType::F32, hv, n, alpha_raw.data());
      sd.beta = make_tensor(be, DType::F32, hv, n, beta_raw.data());
      sd.dt_bias = make_tensor(be, DType::F32, hv, 1, dtb.data());
      sd.a = make_tensor(be, DType::F32, hv, 1, av.data());
      be.deltanet_gates(sd.g, sd.beta, sd.dt_bias, sd.a);
      sd.q = make_tensor(be, DType::F32, hk * d, n, qv.data());
      sd.k = make_tensor(be, DType::F32, hk * d, n, kv.data());
      sd.v = make_tensor(be, DType::F32, hv * d, n, vv.data());
      sd.state = make_tensor(be, DType::F32, hv * hs, slots, st0.data());
      sd.out = be.alloc(DType::F32, hv * d, n);
      be.gated_delta_net(sd.q, sd.k, sd.v, sd.g, sd.beta, sd.state, sd.rb, d, d, 1.0f / std::sqrt(static_cast<float>(d)), sd.out);
      sd.rowgate = make_tensor(be, DType::F32, 1, n, rg.data());
      be.mul_rows_sigmoid(sd.v, sd.rowgate);
    }
    auto check = [&](const char* what, Tensor Side::*m, double bound) {
      const ErrStats e = compare(fetch(*gpu, sides[1].*m), fetch(*cpu, sides[0].*m));
      EXPECT_EQ(e.bad, 0u) << what;
      EXPECT_LE(e.rel, bound) << what << " max_abs " << e.max_abs;
    };
    check("ssm_conv output", &Side::conv_out, 1e-6);
    check("conv state (dst and capture slots)", &Side::conv_state, 1e-6);
    check("gates: g", &Side::g, 1e-6);
    check("gates: beta", &Side::beta, 1e-6);
    check("gated_delta_net output", &Side::out, 1e-4);
    check("delta state (dst and capture slots)", &Side::state, 1e-4);
    check("mul_rows_sigmoid", &Side::v, 1e-6);
    // copy: a state slot snapshot, device to device.
    Tensor snap = gpu->alloc(DType::F32, hv * hs, slots);
    gpu->copy(sides[1].state, snap);
    const auto a1 = fetch(*gpu, snap), a2 = fetch(*gpu, sides[1].state);
    EXPECT_EQ(0, std::memcmp(a1.data(), a2.data(), a1.size() * sizeof(float)));
    gpu->free(snap);
  }
}

// A decode step (norm → projection → RoPE → KV store → attention → output projection) captured once as
// a CUDA graph and replayed for later positions, each replay checked against the CPU running the step.
// Programmatic dependent launch (CudaOptions::pdl) changes when the decode GEMV's blocks start, never
// what they compute: a chain of dependent decode matmuls (each output the next input; types alternating
// between the q8_K and q8_0 families so the shared activation scratch is re-quantized while a GEMV that
// read it may still run; a matmul_shared triple) must give bit-identical results with PDL on and off,
// eagerly and replayed from a CUDA graph.
TEST(CudaOps, PdlGemvChainBitIdentical) {
  PG_REQUIRE_GPU();
  const int64_t d = 512;
  const DType types[] = {DType::Q4_K, DType::Q8_0, DType::Q6_K, DType::Q4_0, DType::Q5_K, DType::IQ4_XS};
  std::vector<std::vector<uint8_t>> wb;
  for (size_t i = 0; i < 12; ++i) wb.push_back(make_weights(types[i % 6], d, d, static_cast<uint32_t>(40 + i)));
  const auto x0 = randn(static_cast<size_t>(d), 77);
  auto run = [&](bool pdl, bool graph) {
    auto gpu = test::make_cuda(false);
    CudaOptions o;
    o.pdl = pdl;
    gpu->set_options(o);
    std::vector<Tensor> w;
    for (size_t i = 0; i < wb.size(); ++i) w.push_back(make_weight(*gpu, types[i % 6], d, d, 1, wb[i]));
    Tensor x = make_tensor(*gpu, DType::F32, d, 1, x0.data());
    std::vector<Tensor> y;  // (1, d) each
    for (size_t i = 0; i < wb.size() + 2; ++i) y.push_back(gpu->alloc(DType::F32, d, 1));
    auto ops = [&]() {
      const Tensor* in = &x;
      for (size_t i = 0; i < wb.size(); ++i) {
        gpu->matmul(w[i], *in, y[i]);
        gpu->scale(y[i], 0.05f);  // keep magnitudes bounded along the chain
        in = &y[i];
      }
      gpu->matmul_shared(*in, {{&w[0], &y[wb.size()]}, {&w[1], &y[wb.size() + 1]}, {&w[2], &y[0]}});
    };
    ops();  // eager (also sizes the scratch for the recording)
    if (graph) {
      gpu->begin_capture();
      ops();
      const int g = gpu->end_capture();
      gpu->replay(g);
      gpu->replay(g);
    }
    std::vector<float> all;
    for (const Tensor& t : y) {
      const auto v = fetch(*gpu, t);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const auto ref = run(false, false);
  for (const bool graph : {false, true}) {
    const auto got = run(true, graph), plain = run(false, graph);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)), 0) << (graph ? "graph" : "eager") << ": PDL changed results";
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0) << (graph ? "graph" : "eager") << ": differs from eager";
  }
}

// The two-rows-per-warp one-row GEMV (CudaOptions::gemv_rows_per_warp = 2) sums each row in the same
// order as the one-row-per-warp kernel: bit-identical outputs, for every 8-bit-activation type, an odd
// row count (a warp with one row) and several widths, with PDL on and off.
TEST(CudaOps, GemvTwoRowsPerWarpBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  for (const DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::IQ4_XS}) {
    for (const int64_t K : {256, 2048, 4352}) {
      const int64_t M = 37;
      const auto wbytes = make_weights(t, K, M, 5);
      const auto xv = randn(static_cast<size_t>(K), 6);
      Tensor w = make_weight(*gpu, t, K, M, 1, wbytes);
      Tensor x = make_tensor(*gpu, DType::F32, K, 1, xv.data());
      Tensor y = gpu->alloc(DType::F32, M, 1);
      std::vector<float> ref;
      for (const int rpw : {1, 2}) {
        for (const bool pdl : {false, true}) {
          CudaOptions o;
          o.gemv_rows_per_warp = rpw;
          o.pdl = pdl;
          gpu->set_options(o);
          gpu->matmul(w, x, y);
          const auto got = fetch(*gpu, y);
          if (ref.empty()) {
            ref = got;
            continue;
          }
          EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0)
              << dtype_name(t) << " K=" << K << " rows per warp " << rpw << " pdl " << pdl;
        }
      }
      gpu->free(w);
      gpu->free(x);
      gpu->free(y);
    }
  }
}

TEST(CudaOps, GraphCaptureReplaysDecodeSteps) {
  PG_REQUIRE_GPU();
  auto cpu = test::make_cpu_exact();
  auto gpu = test::make_cuda(false);
  const int64_t d = 256, n_head = 4, hd = 64, block = 16, n_ctx = 64;
  const auto wq_b = make_weights(DType::Q8_0, d, d, 1), wo_b = make_weights(DType::F16, d, d, 2);
  const auto nw = randn(static_cast<size_t>(d), 3);
  std::vector<int32_t> table(static_cast<size_t>(n_ctx / block));
  std::iota(table.begin(), table.end(), 0);
  struct Side {
    Backend* be;
    Tensor wq, wo, norm_w, x, h, q, o, pos, seq, cells, table;
    KvLayer kv;
    AttentionBatch ab;
  };
  Side sides[2];
  Backend* bes[2] = {cpu.get(), gpu.get()};
  for (int i = 0; i < 2; ++i) {
    Side& s = sides[i];
    s.be = bes[i];
    s.wq = make_weight(*s.be, DType::Q8_0, d, d, 1, wq_b);
    s.wo = make_weight(*s.be, DType::F16, d, d, 1, wo_b);
    s.norm_w = make_tensor(*s.be, DType::F32, d, 1, nw.data());
    s.x = s.be->alloc(DType::F32, d, 1);
    s.h = s.be->alloc(DType::F32, d, 1);
    s.q = s.be->alloc(DType::F32, d, 1);
    s.o = s.be->alloc(DType::F32, d, 1);
    s.pos = s.be->alloc(DType::I32, 1, 1);
    s.seq = s.be->alloc(DType::I32, 1, 1);
    s.cells = s.be->alloc(DType::I32, 1, 1);
    s.table = make_tensor(*s.be, DType::I32, n_ctx / block, 1, table.data());
    s.kv.k = s.be->alloc(DType::F16, d, n_ctx);
    s.kv.v = s.be->alloc(DType::F16, d, n_ctx);
    s.ab.n_tokens = 1;
    s.ab.positions = s.pos;
    s.ab.seq = s.seq;
    s.ab.cells = s.cells;
    s.ab.block_table = s.table;
    s.ab.block_size = static_cast<int>(block);
    s.ab.max_blocks = static_cast<int>(n_ctx / block);
  }
  AttentionParams ap;
  ap.n_head = ap.n_head_kv = static_cast<int>(n_head);
  ap.head_dim = static_cast<int>(hd);
  ap.scale = 0.125f;
  auto step_ops = [&](Side& s) {
    s.be->rms_norm(s.x, s.norm_w, s.h, 1e-6f);
    s.be->matmul(s.wq, s.h, s.q);
    s.be->rope(s.q, s.pos, static_cast<int>(n_head), static_cast<int>(hd), static_cast<int>(hd), 10000.0f, RopeStyle::Neox);
    s.be->kv_store(s.kv, s.q, s.h, s.ab);
    s.be->attention(s.q, s.kv, s.ab, ap, s.o);
    s.be->matmul(s.wo, s.o, s.x);  // the output becomes the next step's input
  };
  auto set_inputs = [&](Side& s, int t, const std::vector<float>& x) {
    const int32_t zero = 0;
    s.be->upload(s.x, x.data(), x.size() * 4);
    s.be->upload(s.pos, &t, 4);
    s.be->upload(s.seq, &zero, 4);
    s.be->upload(s.cells, &t, 4);  // identity block table: cell = position
    s.ab.max_kv_len = t + 1;
  };
  gpu->set_attention_kv_capacity(static_cast<int>(n_ctx));
  int graph = -1;
  for (int t = 0; t < 12; ++t) {
    SCOPED_TRACE("step " + std::to_string(t));
    const auto x = randn(static_cast<size_t>(d), static_cast<uint32_t>(50 + t));
    std::vector<float> res[2];
    for (int i = 0; i < 2; ++i) {
      Side& s = sides[i];
      set_inputs(s, t, x);
      if (i == 0 || t == 0) {
        step_ops(s);  // CPU, and the GPU's uncaptured warm-up step
      } else {
        if (graph < 0) {
          gpu->begin_capture();
          step_ops(s);
          EXPECT_THROW(gpu->synchronize(), Error);  // not allowed inside a capture
          graph = gpu->end_capture();
        }
        gpu->replay(graph);
      }
      res[i] = fetch(*s.be, s.x);
    }
    const ErrStats e = compare(res[1], res[0]);
    EXPECT_EQ(e.bad, 0u);
    EXPECT_LE(e.rel, 2e-5);
  }
  EXPECT_GE(graph, 0);
  gpu->drop_graphs();
}

TEST(CudaOps, ErrorsAreReported) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  auto cpu = test::make_cpu_exact();
  Tensor a = gpu->alloc(DType::F32, 8, 2);
  Tensor b = cpu->alloc(DType::F32, 8, 2);
  EXPECT_THROW(gpu->add(a, b, a), Error);  // tensor of another backend
  std::vector<float> big(100);
  EXPECT_THROW(gpu->upload(a, big.data(), big.size() * 4), Error);  // past the end
  EXPECT_THROW(create_cuda_backend(cuda_device_count()), Error);   // no such device
}

// ---- fused decode kernels (CudaOptions::fuse_glu / fuse_qkv; issue 11) -----------------------------------

CudaOptions with_fuse(const CudaOptions& base, bool glu, bool qkv, int rpw, bool pdl) {
  CudaOptions o = base;
  o.fuse_glu = glu;
  o.fuse_qkv = qkv;
  o.gemv_rows_per_warp = rpw;
  o.pdl = pdl;
  return o;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = a.size() == b.size() ? 0.0f : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

// matmul_glu with fuse_glu (act-quant + gemv_q8_glu_kernel) against the composition it replaces
// (matmul_shared on gate and up, then glu): bit-identical (max |Δ| = 0, and the same bytes, NaN patterns
// included) for every 8-bit-activation type, the FFN shape of an 8B model, odd row counts (a block with
// fewer than 4 warps' rows, a single row), K of 1 and 17 superblocks, SiLU and GELU, one and two rows per
// warp in the composition, PDL on and off. And both against the CPU's default mode (bounds as
// MatmulDefaultModeMatchesCpuDefault; GELU's FP16 rounding as the GELU bound above).
TEST(CudaFuse, GluBitIdenticalToComposition) {
  PG_REQUIRE_GPU();
  CpuOptions co;
  co.n_threads = 2;
  auto cpu = std::make_unique<CpuBackend>(co);
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  for (const DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, DType::IQ4_XS}) {
    const bool sb = traits(t).block_size == 256;
    const std::pair<int64_t, int64_t> shapes[] = {{4096, 12288}, {256, 37}, {sb ? 4352 : 4128, 75}, {sb ? 512 : 96, 1}};  // (K, M)
    for (auto [K, M] : shapes) {
      const auto gb = make_weights(t, K, M, 11u + static_cast<uint32_t>(K + M)), ub = make_weights(t, K, M, 12u + static_cast<uint32_t>(K + M));
      auto xv = randn(static_cast<size_t>(K), 13u + static_cast<uint32_t>(K));
      xv[0] = 3.0f, xv[1] = -3.0f;
      Tensor gw = make_weight(*gpu, t, K, M, 1, gb), uw = make_weight(*gpu, t, K, M, 1, ub);
      Tensor gc = make_weight(*cpu, t, K, M, 1, gb), uc = make_weight(*cpu, t, K, M, 1, ub);
      Tensor x = make_tensor(*gpu, DType::F32, K, 1, xv.data()), xc = make_tensor(*cpu, DType::F32, K, 1, xv.data());
      Tensor y = gpu->alloc(DType::F32, M, 1), u = gpu->alloc(DType::F32, M, 1);  // (1, M)
      Tensor yc = cpu->alloc(DType::F32, M, 1), ucc = cpu->alloc(DType::F32, M, 1);
      for (const Activation act : {Activation::Silu, Activation::GeluTanh}) {
        const bool silu = act == Activation::Silu;
        cpu->matmul_glu(xc, gc, uc, act, yc, ucc);
        const auto cref = fetch(*cpu, yc);
        for (const int rpw : {2, 1}) {
          for (const bool pdl : {true, false}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " K=" + std::to_string(K) + " M=" + std::to_string(M) + (silu ? " silu" : " gelu") +
                         " rpw " + std::to_string(rpw) + " pdl " + std::to_string(pdl));
            gpu->set_options(with_fuse(base, false, false, rpw, pdl));
            gpu->matmul_glu(x, gw, uw, act, y, u);
            const auto ref = fetch(*gpu, y);
            gpu->set_options(with_fuse(base, true, false, rpw, pdl));
            std::vector<float> junk(static_cast<size_t>(M), 12345.0f);
            gpu->upload(y, junk.data(), junk.size() * sizeof(float));  // the fused kernel must write every row
            gpu->matmul_glu(x, gw, uw, act, y, u);
            const auto got = fetch(*gpu, y);
            EXPECT_EQ(max_abs_diff(got, ref), 0.0f);
            EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
            const ErrStats e = compare(got, cref);
            EXPECT_EQ(e.bad, 0u);
            EXPECT_LE(e.rel, silu ? (M < 64 ? 1e-4 : 5e-5) : 2e-3) << "vs CPU default mode, max_abs " << e.max_abs;
          }
        }
      }
      for (Tensor* p : {&gw, &uw, &x, &y, &u}) gpu->free(*p);
      for (Tensor* p : {&xc, &yc, &ucc}) cpu->free(*p);  // gc/uc reference gb/ub (CPU weights stay in place)
    }
  }
  gpu->set_options(base);
}

// Where the fused kernel does not apply, matmul_glu with fuse_glu is the composition itself (at MMQ rows,
// mmq_group's one launch with the GLU in its reduce, bit-identical to it): several rows (GEMV groups and MMQ), exact mode, gate and up of different types, 16 lanes per row, a type without an
// 8-bit kernel (Q3_K), MMQ from one row.
TEST(CudaFuse, GluFallsBackToComposition) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  const int64_t K = 512, M = 300;
  struct Case {
    DType tg, tu;
    int n;
    const char* what;
    void (*tweak)(CudaOptions&);
  };
  const Case cases[] = {
      {DType::Q4_K, DType::Q4_K, 2, "2 rows (MMQ)", [](CudaOptions&) {}},
      {DType::Q4_K, DType::Q4_K, 5, "5 rows, no MMQ", [](CudaOptions& o) { o.mmq_min_rows = 0; }},
      {DType::Q4_K, DType::Q4_K, 1, "exact mode", [](CudaOptions& o) { o.exact_f32 = true; }},
      {DType::Q4_K, DType::Q6_K, 1, "mixed types", [](CudaOptions&) {}},
      {DType::Q8_0, DType::Q8_0, 1, "16 lanes", [](CudaOptions& o) { o.gemv_lanes = 16; }},
      {DType::Q3_K, DType::Q3_K, 1, "no 8-bit kernel", [](CudaOptions&) {}},
      {DType::Q4_K, DType::Q4_K, 1, "MMQ from one row", [](CudaOptions& o) { o.mmq_min_rows = 1; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const auto gb = make_weights(c.tg, K, M, 21), ub = make_weights(c.tu, K, M, 22);
    const auto xv = randn(static_cast<size_t>(K * c.n), 23);
    Tensor gw = make_weight(*gpu, c.tg, K, M, 1, gb), uw = make_weight(*gpu, c.tu, K, M, 1, ub);
    Tensor x = make_tensor(*gpu, DType::F32, K, c.n, xv.data());
    Tensor y = gpu->alloc(DType::F32, M, c.n), u = gpu->alloc(DType::F32, M, c.n);
    std::vector<float> res[2];
    for (const bool fuse : {false, true}) {
      CudaOptions o = with_fuse(base, fuse, fuse, base.gemv_rows_per_warp, base.pdl);
      c.tweak(o);
      gpu->set_options(o);
      gpu->matmul_glu(x, gw, uw, Activation::Silu, y, u);
      res[fuse] = fetch(*gpu, y);
    }
    EXPECT_EQ(std::memcmp(res[0].data(), res[1].data(), res[0].size() * sizeof(float)), 0);
    for (Tensor* p : {&gw, &uw, &x, &y, &u}) gpu->free(*p);
  }
  gpu->set_options(base);
}

// matmul_shared of 2..5 products (initializer lists are fixed at compile time).
void shared_products(Backend& be, const Tensor& x, const std::vector<Tensor>& w, std::vector<Tensor>& y) {
  switch (w.size()) {
    case 2: return be.matmul_shared(x, {{&w[0], &y[0]}, {&w[1], &y[1]}});
    case 3: return be.matmul_shared(x, {{&w[0], &y[0]}, {&w[1], &y[1]}, {&w[2], &y[2]}});
    case 4: return be.matmul_shared(x, {{&w[0], &y[0]}, {&w[1], &y[1]}, {&w[2], &y[2]}, {&w[3], &y[3]}});
    default: return be.matmul_shared(x, {{&w[0], &y[0]}, {&w[1], &y[1]}, {&w[2], &y[2]}, {&w[3], &y[3]}, {&w[4], &y[4]}});
  }
}

// matmul_shared of one row with fuse_qkv (cuda::gemv_multi: the same-type products in one launch over
// their concatenated rows) against one launch per product: bit-identical, for q/k/v of an 8B model (one
// type; wv Q6_K beside Q4_K wq/wk: two launches), odd row counts (a warp with one row at the end of a
// matrix), more products than one launch takes (5 > 4), types of both activation roundings interleaved
// (the act-quant is redone between groups), a type without an 8-bit kernel among them, eagerly and
// replayed from a CUDA graph, one and two rows per warp, PDL on and off.
TEST(CudaFuse, QkvGroupedBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  struct Case {
    int64_t K;
    std::vector<std::pair<DType, int64_t>> outs;  // (type, M)
  };
  const Case cases[] = {
      {4096, {{DType::Q4_K, 4096}, {DType::Q4_K, 1024}, {DType::Q4_K, 1024}}},
      {4096, {{DType::Q4_K, 4096}, {DType::Q4_K, 1024}, {DType::Q6_K, 1024}}},
      {256, {{DType::Q4_K, 37}, {DType::Q4_K, 5}, {DType::Q4_K, 1}}},
      {96, {{DType::Q8_0, 33}, {DType::Q8_0, 7}, {DType::Q8_0, 64}, {DType::Q8_0, 3}, {DType::Q8_0, 1}}},
      {512, {{DType::Q8_0, 9}, {DType::Q4_K, 10}, {DType::Q8_0, 11}, {DType::IQ4_XS, 12}, {DType::Q4_0, 13}}},
      {512, {{DType::Q5_K, 255}, {DType::Q5_K, 257}}},
      {512, {{DType::Q6_K, 77}, {DType::Q3_K, 50}, {DType::Q6_K, 31}, {DType::F16, 20}}},
  };
  int ci = 0;
  for (const Case& c : cases) {
    std::vector<Tensor> w, y;
    for (size_t j = 0; j < c.outs.size(); ++j) {
      const auto [t, M] = c.outs[j];
      w.push_back(make_weight(*gpu, t, c.K, M, 1, make_weights(t, c.K, M, static_cast<uint32_t>(31 + 7 * ci + j))));
      y.push_back(gpu->alloc(DType::F32, M, 1));
    }
    const auto xv = randn(static_cast<size_t>(c.K), static_cast<uint32_t>(41 + ci));
    Tensor x = make_tensor(*gpu, DType::F32, c.K, 1, xv.data());
    auto fill_junk = [&]() {  // every output row must be written again
      for (Tensor& t : y) {
        std::vector<float> junk(static_cast<size_t>(t.cols()), -777.0f);
        gpu->upload(t, junk.data(), junk.size() * sizeof(float));
      }
    };
    auto outputs = [&]() {
      std::vector<std::vector<float>> r;
      for (const Tensor& t : y) r.push_back(fetch(*gpu, t));
      return r;
    };
    for (const int rpw : {2, 1}) {
      for (const bool pdl : {true, false}) {
        SCOPED_TRACE("case " + std::to_string(ci) + " rpw " + std::to_string(rpw) + " pdl " + std::to_string(pdl));
        gpu->set_options(with_fuse(base, false, false, rpw, pdl));
        shared_products(*gpu, x, w, y);
        const auto ref = outputs();
        gpu->set_options(with_fuse(base, false, true, rpw, pdl));
        fill_junk();
        shared_products(*gpu, x, w, y);
        const auto eager = outputs();
        gpu->begin_capture();
        shared_products(*gpu, x, w, y);
        const int g = gpu->end_capture();
        fill_junk();
        gpu->replay(g);
        const auto replay = outputs();
        gpu->drop_graphs();
        for (size_t j = 0; j < y.size(); ++j) {
          EXPECT_EQ(max_abs_diff(eager[j], ref[j]), 0.0f) << "product " << j << " eager";
          EXPECT_EQ(std::memcmp(eager[j].data(), ref[j].data(), ref[j].size() * sizeof(float)), 0) << "product " << j << " eager";
          EXPECT_EQ(std::memcmp(replay[j].data(), ref[j].data(), ref[j].size() * sizeof(float)), 0) << "product " << j << " graph";
        }
      }
    }
    for (Tensor& t : w) gpu->free(t);
    for (Tensor& t : y) gpu->free(t);
    gpu->free(x);
    ++ci;
  }
  gpu->set_options(base);
}

// CudaOptions::fuse_norm_quant: RMSNorm (and add_rms_norm) also writes its output's 8-bit activations, and the
// next matmul skips its act_quant launch. Against the unfused path (same ops, option off): bit-identical
// outputs (memcmp) for both roundings (q8_K: Q4_K/Q6_K/IQ4_XS; q8_0: Q8_0/Q4_0), one row (GEMV, fused GLU,
// grouped q/k/v, a type without an 8-bit kernel) and several rows (GEMV groups, MMQ), widths without a q8_K
// layout (K % 256 != 0), and the guard: after the norm, an op that rewrites the normed tensor (upload, add)
// or only something else (scale of another tensor) must make the matmul quantize again — the hit counter
// shows which path ran, and the outputs must still equal the unfused path's.
TEST(CudaFuseNormQuant, NormThenMatmulBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  struct Case {
    DType t;
    int64_t K, M;
    int rows;
  };
  const Case cases[] = {{DType::Q4_K, 4096, 1024, 1}, {DType::Q6_K, 4096, 512, 1},  {DType::Q8_0, 4096, 1024, 1}, {DType::Q4_0, 4128, 96, 1},
                        {DType::IQ4_XS, 512, 300, 1}, {DType::Q4_K, 4096, 1024, 5}, {DType::Q4_K, 512, 256, 24}, {DType::Q8_0, 512, 300, 12},
                        {DType::Q6_K, 1024, 200, 64}, {DType::Q3_K, 512, 100, 1},   {DType::Q4_0, 96, 40, 3}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(dtype_name(c.t)) + " K=" + std::to_string(c.K) + " M=" + std::to_string(c.M) + " rows=" + std::to_string(c.rows));
    const auto wb = make_weights(c.t, c.K, c.M, 31u + static_cast<uint32_t>(c.K + c.M));
    const auto ub = make_weights(c.t, c.K, c.M, 32u + static_cast<uint32_t>(c.K + c.M));
    Tensor w = make_weight(*gpu, c.t, c.K, c.M, 1, wb), wu = make_weight(*gpu, c.t, c.K, c.M, 1, ub);
    auto xv = randn(static_cast<size_t>(c.K * c.rows), 33), rv = randn(static_cast<size_t>(c.K * c.rows), 34);
    auto nv = randn(static_cast<size_t>(c.K), 35), other = randn(static_cast<size_t>(c.K * c.rows), 36);
    xv[0] = 4.0f, xv[1] = -4.0f;  // q8_K ties of magnitude
    Tensor nw = make_tensor(*gpu, DType::F32, c.K, 1, nv.data());
    Tensor x = gpu->alloc(DType::F32, c.K, c.rows), r = make_tensor(*gpu, DType::F32, c.K, c.rows, rv.data());
    Tensor xn = gpu->alloc(DType::F32, c.K, c.rows), z = make_tensor(*gpu, DType::F32, c.K, c.rows, other.data());
    Tensor y = gpu->alloc(DType::F32, c.M, c.rows), y2 = gpu->alloc(DType::F32, c.M, c.rows), y3 = gpu->alloc(DType::F32, c.M, c.rows);
    // Sequence g: norm, then the products; `between` runs between the norm and the products.
    auto sequence = [&](int between) {
      gpu->upload(x, xv.data(), xv.size() * sizeof(float));
      if (between == 3)
        gpu->rms_norm(x, nw, xn, 1e-6f);
      else
        gpu->add_rms_norm(x, r, nw, xn, 1e-6f);
      if (between == 1) gpu->upload(xn, other.data(), other.size() * sizeof(float));  // the normed tensor rewritten
      if (between == 2) gpu->add(xn, z, xn);                                          // ... by a kernel
      if (between == 4) gpu->scale(z, 1.0f);                                          // another tensor only
      std::vector<float> out;
      gpu->matmul(w, xn, y);
      out = fetch(*gpu, y);
      // fetch synchronises through download (an op): the record is gone; redo the norm for the next products.
      auto again = [&] {
        gpu->upload(x, xv.data(), xv.size() * sizeof(float));
        gpu->add_rms_norm(x, r, nw, xn, 1e-6f);
      };
      again();
      gpu->matmul_shared(xn, {{&w, &y}, {&wu, &y2}, {&w, &y3}});
      for (const Tensor* t : {&y, &y2, &y3}) {
        const auto v = fetch(*gpu, *t);
        out.insert(out.end(), v.begin(), v.end());
      }
      again();
      gpu->matmul_glu(xn, w, wu, Activation::Silu, y, y2);
      const auto g = fetch(*gpu, y);
      out.insert(out.end(), g.begin(), g.end());
      return out;
    };
    for (const bool fuse_mm : {true, false}) {  // fuse_glu / fuse_qkv on (default) and off: every consumer path
      CudaOptions o = base;
      o.fuse_glu = o.fuse_qkv = fuse_mm;
      for (int between = 0; between <= 4; ++between) {
        SCOPED_TRACE("fuse_glu/qkv " + std::to_string(fuse_mm) + " between " + std::to_string(between));
        o.fuse_norm_quant = false;
        gpu->set_options(o);
        const auto ref = sequence(between);
        o.fuse_norm_quant = true;
        gpu->set_options(o);
        const int64_t h0 = gpu->norm_quant_hits();
        const auto got = sequence(between);
        const int64_t hits = gpu->norm_quant_hits() - h0;
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)));
        const bool q8 = c.t != DType::Q3_K;  // Q3_K: no 8-bit kernel (FP32 GEMV on q·d), never reads the scratch
        // The first matmul reuses the norm's bytes unless something ran in between; the rest always do.
        const int64_t first = q8 && (between == 0 || between == 3) ? 1 : 0;
        if (q8) {
          EXPECT_GE(hits, first + 2) << "the fused path did not run";
        } else {
          EXPECT_EQ(hits, 0);
        }
        if (between == 1 || between == 2 || between == 4) {
          // The guard: the products after the intervening op re-quantized (a bump of at most the later ones).
          o.fuse_norm_quant = true;
          gpu->set_options(o);
          const int64_t g0 = gpu->norm_quant_hits();
          gpu->upload(x, xv.data(), xv.size() * sizeof(float));
          gpu->add_rms_norm(x, r, nw, xn, 1e-6f);
          if (between == 1) gpu->upload(xn, other.data(), other.size() * sizeof(float));
          if (between == 2) gpu->add(xn, z, xn);
          if (between == 4) gpu->scale(z, 1.0f);
          gpu->matmul(w, xn, y);
          EXPECT_EQ(gpu->norm_quant_hits(), g0) << "a matmul used the norm's bytes after another op";
          gpu->synchronize();
        }
      }
    }
    for (Tensor* p : {&w, &wu, &nw, &x, &r, &xn, &z, &y, &y2, &y3}) gpu->free(*p);
  }
  gpu->set_options(base);
}

// The fused norm's scratch inside CUDA graphs: a captured norm + products replays the same bits as eager
// launches with the option off, also after the normed tensor's scratch was reused by another norm.
TEST(CudaFuseNormQuant, GraphReplayBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  CudaOptions o = gpu->options();
  const int64_t K = 4096, M = 1024;
  const auto wb = make_weights(DType::Q4_K, K, M, 41), vb = make_weights(DType::Q8_0, K, M, 42);
  Tensor w = make_weight(*gpu, DType::Q4_K, K, M, 1, wb), v = make_weight(*gpu, DType::Q8_0, K, M, 1, vb);
  auto xv = randn(static_cast<size_t>(K), 43), nv = randn(static_cast<size_t>(K), 44);
  Tensor nw = make_tensor(*gpu, DType::F32, K, 1, nv.data()), x = make_tensor(*gpu, DType::F32, K, 1, xv.data());
  Tensor xn = gpu->alloc(DType::F32, K, 1), y = gpu->alloc(DType::F32, M, 1), y2 = gpu->alloc(DType::F32, M, 1);
  auto step = [&] {
    gpu->rms_norm(x, nw, xn, 1e-6f);
    gpu->matmul_shared(xn, {{&w, &y}, {&v, &y2}});  // q8_K and q8_0 from one norm
    gpu->rms_norm(xn, nw, xn, 1e-6f);               // in place: the record now points at the same data again
    gpu->matmul(w, xn, y2);
  };
  o.fuse_norm_quant = false;
  gpu->set_options(o);
  step();
  const auto ref1 = fetch(*gpu, y), ref2 = fetch(*gpu, y2);
  o.fuse_norm_quant = true;
  gpu->set_options(o);
  step();  // eager once (scratch sized), then captured
  gpu->begin_capture();
  step();
  const int g = gpu->end_capture();
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<float> junk(static_cast<size_t>(M), 777.0f);
    gpu->upload(y, junk.data(), junk.size() * sizeof(float));
    gpu->upload(y2, junk.data(), junk.size() * sizeof(float));
    gpu->replay(g);
    EXPECT_EQ(0, std::memcmp(fetch(*gpu, y).data(), ref1.data(), ref1.size() * sizeof(float))) << "replay " << rep;
    EXPECT_EQ(0, std::memcmp(fetch(*gpu, y2).data(), ref2.data(), ref2.size() * sizeof(float))) << "replay " << rep;
  }
  gpu->drop_graphs();
  for (Tensor* p : {&w, &v, &nw, &x, &xn, &y, &y2}) gpu->free(*p);
}


// ---- CudaOptions::gemv_pipe: the persistent pipelined one-row GEMV (gemv_pipe.cuh) ----------------------

// Weights (M, K) of type t whose rows repeat with a period of 997 rows (quantizing 151936 distinct rows on
// the host would take minutes); 997 is odd and prime, so a kernel that mixed up rows, row pairs or tasks
// would still read a different row than the reference.
std::vector<uint8_t> make_weights_tiled(DType t, int64_t K, int64_t M, uint32_t seed) {
  const int64_t period = std::min<int64_t>(M, 997);
  const auto base = make_weights(t, K, period, seed);
  if (period == M) return base;
  const size_t rb = row_bytes(t, K);
  std::vector<uint8_t> w(rb * static_cast<size_t>(M));
  for (int64_t r = 0; r < M; ++r) std::memcpy(w.data() + static_cast<size_t>(r) * rb, base.data() + static_cast<size_t>(r % period) * rb, rb);
  return w;
}

CudaOptions with_pipe(CudaOptions o, bool pipe, int stages, int bps, bool pdl) {
  o.gemv_pipe = pipe;
  o.gemv_pipe_stages = stages;
  o.gemv_pipe_bps = bps;
  o.gemv_rows_per_warp = 2;
  o.pdl = pdl;
  return o;
}

// The decode shapes of qwen3-8b (M × K = out × in) and odd ones: one superblock, 17 superblocks (a partial
// last round of 32 pieces), a single row, an odd row count (a task with one row), 129 Q8_0 blocks.
std::vector<std::pair<int64_t, int64_t>> pipe_shapes(DType t) {  // (M, K)
  const bool sb = traits(t).block_size == 256;
  return {{4096, 4096}, {1024, 4096}, {12288, 4096}, {4096, 12288}, {151936, 4096}, {37, 256}, {1, sb ? 4352 : 4128}, {75, sb ? 4352 : 4128},
          {3, sb ? 512 : 96}};
}

// matmul of one row with gemv_pipe against the existing two-rows-per-warp kernel: the same bytes for
// Q5_K/Q8_0 (the pipelined kernel) and for the types it does not take (Q4_K/Q6_K with their 64-weight pieces, Q4_0, IQ4_XS: the
// existing kernel either way), every shape above, ring stages 2/4/8, 1 block per SM (many tasks per warp)
// or as many as fit, PDL on and off.
TEST(CudaGemvPipe, PlainBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  for (const DType t : {DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::Q8_0, DType::Q4_0, DType::IQ4_XS}) {
    for (const auto& [M, K] : pipe_shapes(t)) {
      const bool big = M * K > 4096 * 4096;
      const auto wb = make_weights_tiled(t, K, M, 50u + static_cast<uint32_t>(M + K));
      auto xv = randn(static_cast<size_t>(K), 51u + static_cast<uint32_t>(K));
      xv[0] = 3.0f, xv[1] = -3.0f;
      Tensor w = make_weight(*gpu, t, K, M, 1, wb);
      Tensor x = make_tensor(*gpu, DType::F32, K, 1, xv.data());
      Tensor y = gpu->alloc(DType::F32, M, 1);  // (1, M)
      gpu->set_options(with_pipe(base, false, 4, 0, true));
      gpu->matmul(w, x, y);
      const auto ref = fetch(*gpu, y);
      struct Cfg {
        int stages, bps;
        bool pdl;
      };
      const std::vector<Cfg> cfgs = big ? std::vector<Cfg>{{4, 0, true}, {3, 1, true}}
                                        : std::vector<Cfg>{{4, 0, true}, {4, 0, false}, {2, 0, true}, {8, 1, true}, {3, 2, false}};
      for (const Cfg& c : cfgs) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " M=" + std::to_string(M) + " K=" + std::to_string(K) + " stages " + std::to_string(c.stages) +
                     " bps " + std::to_string(c.bps) + " pdl " + std::to_string(c.pdl));
        gpu->set_options(with_pipe(base, true, c.stages, c.bps, c.pdl));
        std::vector<float> junk(static_cast<size_t>(M), -555.0f);
        gpu->upload(y, junk.data(), junk.size() * sizeof(float));  // every row must be written again
        gpu->matmul(w, x, y);
        const auto got = fetch(*gpu, y);
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_EQ(max_abs_diff(got, ref), 0.0f);
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
      }
      gpu->free(w);
      gpu->free(x);
      gpu->free(y);
    }
  }
  gpu->set_options(base);
}

// CudaOptions::mmq_staged: MMQ with the activations staged in shared memory against the kernel that reads
// them from global memory, bit for bit, for every MMQ type and row-tile count (1..8 n8 tiles, ragged last
// tiles), on shapes whose K splits hold 1, 2, 4, 6 and 16 superblocks (the 2-stage ring runs short and long:
// 12288×4096 splits in 3, 3000×2048 in 2, 20000×1024 and 151936×4096 not at all) and a ragged last block of
// rows (M % 64 ≠ 0). At 2 rows CudaBackend::mmq keeps the global-memory kernel (faster there), so n = 2
// compares that kernel with itself.
TEST(CudaOps, MmqStagedBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  const std::pair<int64_t, int64_t> shapes[] = {{12288, 4096}, {3000, 2048}, {20000, 1024}, {67, 4096}, {300, 1280}, {151936, 4096}};  // (M, K)
  const int ns[] = {2, 8, 9, 17, 22, 33, 48, 64};
  int checked = 0;
  for (const DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0}) {
    for (const auto& [M, K] : shapes) {
      if (M == 151936 && t != DType::Q4_K && t != DType::Q6_K) continue;  // the output shape: the types it has
      const auto wb = make_weights_tiled(t, K, M, 71u + static_cast<uint32_t>(M + K));
      Tensor w = make_weight(*gpu, t, K, M, 1, wb);
      for (const int n : ns) {
        if ((t == DType::Q8_0 || t == DType::Q4_0) && n < 9) continue;  // the GEMV below 9 rows (use_mmq)
        auto xv = randn(static_cast<size_t>(n * K), 72u + static_cast<uint32_t>(n + K));
        xv[0] = 5.0f, xv[1] = -5.0f;
        Tensor x = make_tensor(*gpu, DType::F32, K, n, xv.data());
        Tensor y = gpu->alloc(DType::F32, M, n);
        SCOPED_TRACE(std::string(dtype_name(t)) + " M=" + std::to_string(M) + " K=" + std::to_string(K) + " n=" + std::to_string(n));
        CudaOptions o = base;
        o.mmq_min_rows = 2;
        o.mmq_staged = false;
        gpu->set_options(o);
        gpu->matmul(w, x, y);
        const auto ref = fetch(*gpu, y);
        o.mmq_staged = true;
        gpu->set_options(o);
        std::vector<float> junk(ref.size(), -555.0f);
        gpu->upload(y, junk.data(), junk.size() * sizeof(float));  // every output must be written again
        gpu->matmul(w, x, y);
        const auto got = fetch(*gpu, y);
        ASSERT_EQ(got.size(), ref.size());
        EXPECT_EQ(max_abs_diff(got, ref), 0.0f);
        EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
        gpu->free(x);
        gpu->free(y);
        ++checked;
      }
      gpu->free(w);
    }
  }
  gpu->set_options(base);
  EXPECT_EQ(checked, 8 * (3 * 5 + 2) + 6 * 2 * 5);  // K-quants every n (Q4_K/Q6_K also 151936), legacy from 9 rows
}

// CudaOptions::mmq_group: at MMQ row counts, matmul_shared runs the products that share a type, K and split
// plan as one launch (cuda::mmq_multi) and matmul_glu runs gate and up as one launch with the GLU in the
// split-K reduce. Against mmq_group off (one launch per product, then the glu op), bit for bit: q/k/v of
// an 8B-like model in one type and with v in another type (two launches), products whose split plans differ
// (not grouped: each its own launch), ragged tiles (M % 16 ≠ 0) at a segment boundary, 2 (the global-memory
// kernel), 3, 9, 22 and 64 rows; GLU with SiLU and GELU, and a gate/up shape whose K is not split (the
// composition). Junk is uploaded before the grouped run so every output must be written again.
TEST(CudaOps, MmqGroupedBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  struct Shared {
    DType t[3];
    int64_t M[3];
    int64_t K;
  };
  const Shared shared[] = {
      {{DType::Q4_K, DType::Q4_K, DType::Q4_K}, {2048, 512, 512}, 2048},
      {{DType::Q4_K, DType::Q4_K, DType::Q6_K}, {2048, 512, 512}, 2048},
      {{DType::Q6_K, DType::Q6_K, DType::Q6_K}, {1000, 200, 200}, 1024},  // ragged tiles at both boundaries
      {{DType::Q5_K, DType::Q5_K, DType::Q5_K}, {40000, 300, 300}, 1024}, // plans differ: 40000 rows unsplit
      {{DType::Q8_0, DType::Q8_0, DType::Q8_0}, {2048, 512, 512}, 2048},
      {{DType::Q4_0, DType::Q4_0, DType::Q4_0}, {1024, 256, 256}, 1024},
  };
  const int ns[] = {2, 3, 9, 22, 64};
  int checked = 0;
  auto upload_junk = [&](Tensor& t) {
    std::vector<float> junk(static_cast<size_t>(t.nbytes() / sizeof(float)), -777.0f);
    gpu->upload(t, junk.data(), t.nbytes());
  };
  for (const Shared& c : shared) {
    Tensor w[3];
    for (int i = 0; i < 3; ++i) w[i] = make_weight(*gpu, c.t[i], c.K, c.M[i], 1, make_weights_tiled(c.t[i], c.K, c.M[i], 90u + static_cast<uint32_t>(i + c.M[i])));
    for (const int n : ns) {
      const bool legacy = c.t[0] == DType::Q8_0 || c.t[0] == DType::Q4_0;
      if (legacy && n < 9) continue;  // the GEMV below 9 rows (use_mmq)
      SCOPED_TRACE(std::string(dtype_name(c.t[0])) + "/" + std::string(dtype_name(c.t[2])) + " M0=" + std::to_string(c.M[0]) + " K=" + std::to_string(c.K) +
                   " n=" + std::to_string(n));
      auto xv = randn(static_cast<size_t>(n * c.K), 91u + static_cast<uint32_t>(n));
      xv[0] = 4.0f, xv[1] = -4.0f;
      Tensor x = make_tensor(*gpu, DType::F32, c.K, n, xv.data());
      Tensor y[3];
      for (int i = 0; i < 3; ++i) y[i] = gpu->alloc(DType::F32, c.M[i], n);
      std::vector<float> ref[3];
      for (const bool group : {false, true}) {
        CudaOptions o = base;
        o.mmq_group = group;
        gpu->set_options(o);
        for (Tensor& t : y) upload_junk(t);
        gpu->matmul_shared(x, {{&w[0], &y[0]}, {&w[1], &y[1]}, {&w[2], &y[2]}});
        for (int i = 0; i < 3; ++i) {
          const auto got = fetch(*gpu, y[i]);
          if (!group) {
            ref[i] = got;
            continue;
          }
          ASSERT_EQ(got.size(), ref[i].size());
          EXPECT_EQ(std::memcmp(got.data(), ref[i].data(), got.size() * sizeof(float)), 0) << "product " << i;
        }
      }
      for (Tensor& t : y) gpu->free(t);
      gpu->free(x);
      ++checked;
    }
    for (Tensor& t : w) gpu->free(t);
  }
  EXPECT_EQ(checked, 4 * 5 + 2 * 3);
  // GLU: (K, M) of gate and up; 40000 × 1024 has one K slice (the composition runs).
  const std::pair<int64_t, int64_t> glu_shapes[] = {{4096, 12288}, {1024, 3000}, {1024, 40000}};
  int glu_checked = 0;
  for (const DType t : {DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
    for (const auto& [K, M] : glu_shapes) {
      if (M == 40000 && t != DType::Q4_K) continue;
      Tensor gw = make_weight(*gpu, t, K, M, 1, make_weights_tiled(t, K, M, 95u + static_cast<uint32_t>(M)));
      Tensor uw = make_weight(*gpu, t, K, M, 1, make_weights_tiled(t, K, M, 96u + static_cast<uint32_t>(M)));
      for (const int n : {3, 22}) {
        if ((t == DType::Q8_0) && n < 9) continue;
        auto xv = randn(static_cast<size_t>(n * K), 97u + static_cast<uint32_t>(n + K));
        Tensor x = make_tensor(*gpu, DType::F32, K, n, xv.data());
        Tensor y = gpu->alloc(DType::F32, M, n), u = gpu->alloc(DType::F32, M, n);
        for (const Activation act : {Activation::Silu, Activation::GeluTanh}) {
          SCOPED_TRACE(std::string("glu ") + std::string(dtype_name(t)) + " K=" + std::to_string(K) + " M=" + std::to_string(M) + " n=" + std::to_string(n) +
                       (act == Activation::Silu ? " silu" : " gelu"));
          std::vector<float> ry, ru;
          for (const bool group : {false, true}) {
            CudaOptions o = base;
            o.mmq_group = group;
            gpu->set_options(o);
            upload_junk(y);
            upload_junk(u);
            gpu->matmul_glu(x, gw, uw, act, y, u);
            auto gy = fetch(*gpu, y), gu = fetch(*gpu, u);
            if (!group) {
              ry = std::move(gy), ru = std::move(gu);
              continue;
            }
            EXPECT_EQ(std::memcmp(gy.data(), ry.data(), ry.size() * sizeof(float)), 0) << "y";
            EXPECT_EQ(std::memcmp(gu.data(), ru.data(), ru.size() * sizeof(float)), 0) << "u";
          }
          ++glu_checked;
        }
        for (Tensor* p : {&x, &y, &u}) gpu->free(*p);
      }
      gpu->free(gw);
      gpu->free(uw);
    }
  }
  gpu->set_options(base);
  EXPECT_EQ(glu_checked, 2 * (3 * 2 + 2 * 2 + 1 * 2));
}

// matmul_glu (fuse_glu) with gemv_pipe against the existing fused kernel: bit-identical, SiLU and GELU,
// the FFN gate/up shape, odd row counts and widths, two ring depths.
TEST(CudaGemvPipe, GluBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  for (const DType t : {DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::Q8_0, DType::Q4_0}) {
    const bool sb = traits(t).block_size == 256;
    const std::pair<int64_t, int64_t> shapes[] = {{12288, 4096}, {37, 256}, {75, sb ? 4352 : 4128}, {1, sb ? 512 : 96}};  // (M, K)
    for (const auto& [M, K] : shapes) {
      const auto gb = make_weights_tiled(t, K, M, 61u + static_cast<uint32_t>(M)), ub = make_weights_tiled(t, K, M, 62u + static_cast<uint32_t>(M));
      const auto xv = randn(static_cast<size_t>(K), 63u + static_cast<uint32_t>(K));
      Tensor gw = make_weight(*gpu, t, K, M, 1, gb), uw = make_weight(*gpu, t, K, M, 1, ub);
      Tensor x = make_tensor(*gpu, DType::F32, K, 1, xv.data());
      Tensor y = gpu->alloc(DType::F32, M, 1), u = gpu->alloc(DType::F32, M, 1);
      for (const Activation act : {Activation::Silu, Activation::GeluTanh}) {
        CudaOptions off = with_pipe(base, false, 4, 0, true);
        off.fuse_glu = true;
        gpu->set_options(off);
        gpu->matmul_glu(x, gw, uw, act, y, u);
        const auto ref = fetch(*gpu, y);
        for (const int stages : {4, 2}) {
          SCOPED_TRACE(std::string(dtype_name(t)) + " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                       (act == Activation::Silu ? " silu" : " gelu") + " stages " + std::to_string(stages));
          CudaOptions on = with_pipe(base, true, stages, 0, true);
          on.fuse_glu = true;
          gpu->set_options(on);
          std::vector<float> junk(static_cast<size_t>(M), 12345.0f);
          gpu->upload(y, junk.data(), junk.size() * sizeof(float));
          gpu->matmul_glu(x, gw, uw, act, y, u);
          const auto got = fetch(*gpu, y);
          EXPECT_EQ(max_abs_diff(got, ref), 0.0f);
          EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0);
        }
      }
      for (Tensor* p : {&gw, &uw, &x, &y, &u}) gpu->free(*p);
    }
  }
  gpu->set_options(base);
}

// matmul_shared of one row (fuse_qkv, grouped) with gemv_pipe against without: bit-identical for the q/k/v
// of an 8B model (Q4_K, and a Q6_K v in its own launch), odd row counts, more products than one launch
// takes, a type the pipelined kernel does not take among them; eagerly and replayed from a CUDA graph.
TEST(CudaGemvPipe, QkvBitIdenticalAndGraphReplay) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  struct Case {
    int64_t K;
    std::vector<std::pair<DType, int64_t>> outs;  // (type, M)
  };
  const Case cases[] = {
      {4096, {{DType::Q4_K, 4096}, {DType::Q4_K, 1024}, {DType::Q4_K, 1024}}},
      {4096, {{DType::Q4_K, 4096}, {DType::Q4_K, 1024}, {DType::Q6_K, 1024}}},
      {256, {{DType::Q4_K, 37}, {DType::Q4_K, 5}, {DType::Q4_K, 1}}},
      {96, {{DType::Q8_0, 33}, {DType::Q8_0, 7}, {DType::Q8_0, 64}, {DType::Q8_0, 3}, {DType::Q8_0, 1}}},
      {512, {{DType::Q8_0, 9}, {DType::Q4_K, 10}, {DType::Q8_0, 11}, {DType::IQ4_XS, 12}, {DType::Q4_0, 13}}},
      {512, {{DType::Q5_K, 255}, {DType::Q5_K, 257}}},
      {4352, {{DType::Q6_K, 77}, {DType::Q6_K, 31}}},
  };
  int ci = 0;
  for (const Case& c : cases) {
    std::vector<Tensor> w, y;
    for (size_t j = 0; j < c.outs.size(); ++j) {
      const auto [t, M] = c.outs[j];
      w.push_back(make_weight(*gpu, t, c.K, M, 1, make_weights(t, c.K, M, static_cast<uint32_t>(71 + 7 * ci + j))));
      y.push_back(gpu->alloc(DType::F32, M, 1));
    }
    const auto xv = randn(static_cast<size_t>(c.K), static_cast<uint32_t>(81 + ci));
    Tensor x = make_tensor(*gpu, DType::F32, c.K, 1, xv.data());
    auto fill_junk = [&]() {
      for (Tensor& t : y) {
        std::vector<float> junk(static_cast<size_t>(t.cols()), -777.0f);
        gpu->upload(t, junk.data(), junk.size() * sizeof(float));
      }
    };
    auto outputs = [&]() {
      std::vector<std::vector<float>> r;
      for (const Tensor& t : y) r.push_back(fetch(*gpu, t));
      return r;
    };
    for (const bool pdl : {true, false}) {
      SCOPED_TRACE("case " + std::to_string(ci) + " pdl " + std::to_string(pdl));
      CudaOptions off = with_pipe(base, false, 4, 0, pdl);
      off.fuse_qkv = true;
      gpu->set_options(off);
      shared_products(*gpu, x, w, y);
      const auto ref = outputs();
      CudaOptions on = with_pipe(base, true, 4, 0, pdl);
      on.fuse_qkv = true;
      gpu->set_options(on);
      fill_junk();
      shared_products(*gpu, x, w, y);
      const auto eager = outputs();
      gpu->begin_capture();
      shared_products(*gpu, x, w, y);
      const int g = gpu->end_capture();
      fill_junk();
      gpu->replay(g);
      const auto replay1 = outputs();
      fill_junk();
      gpu->replay(g);
      const auto replay2 = outputs();
      gpu->drop_graphs();
      for (size_t j = 0; j < y.size(); ++j) {
        EXPECT_EQ(std::memcmp(eager[j].data(), ref[j].data(), ref[j].size() * sizeof(float)), 0) << "product " << j << " eager";
        EXPECT_EQ(std::memcmp(replay1[j].data(), ref[j].data(), ref[j].size() * sizeof(float)), 0) << "product " << j << " graph";
        EXPECT_EQ(std::memcmp(replay2[j].data(), ref[j].data(), ref[j].size() * sizeof(float)), 0) << "product " << j << " graph again";
      }
    }
    for (Tensor& t : w) gpu->free(t);
    for (Tensor& t : y) gpu->free(t);
    gpu->free(x);
    ++ci;
  }
  gpu->set_options(base);
}

// A decode-like chain (plain matmuls whose outputs feed the next, a fused GLU, a grouped triple) recorded
// as a CUDA graph with gemv_pipe and replayed twice: the same bytes as eager execution without gemv_pipe.
TEST(CudaGemvPipe, GraphReplayMatchesEager) {
  PG_REQUIRE_GPU();
  const int64_t d = 1024, f = 3072;
  const DType types[] = {DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q5_K};
  std::vector<std::vector<uint8_t>> wb;
  for (size_t i = 0; i < 4; ++i) wb.push_back(make_weights(types[i], d, d, static_cast<uint32_t>(90 + i)));
  const auto gb = make_weights(DType::Q4_K, d, f, 95), ub = make_weights(DType::Q4_K, d, f, 96), db = make_weights(DType::Q6_K, f, d, 97);
  const auto x0 = randn(static_cast<size_t>(d), 98);
  auto run = [&](bool pipe, bool graph) {
    auto gpu = test::make_cuda(false);
    CudaOptions o = with_pipe(gpu->options(), pipe, 4, 0, true);
    o.fuse_glu = o.fuse_qkv = true;
    gpu->set_options(o);
    std::vector<Tensor> w;
    for (size_t i = 0; i < wb.size(); ++i) w.push_back(make_weight(*gpu, types[i], d, d, 1, wb[i]));
    Tensor gw = make_weight(*gpu, DType::Q4_K, d, f, 1, gb), uw = make_weight(*gpu, DType::Q4_K, d, f, 1, ub);
    Tensor dw = make_weight(*gpu, DType::Q6_K, f, d, 1, db);
    Tensor x = make_tensor(*gpu, DType::F32, d, 1, x0.data());
    std::vector<Tensor> y;  // (1, d) each
    for (size_t i = 0; i < wb.size() + 3; ++i) y.push_back(gpu->alloc(DType::F32, d, 1));
    Tensor h = gpu->alloc(DType::F32, f, 1), u = gpu->alloc(DType::F32, f, 1);
    auto ops = [&]() {
      const Tensor* in = &x;
      for (size_t i = 0; i < wb.size(); ++i) {
        gpu->matmul(w[i], *in, y[i]);
        gpu->scale(y[i], 0.05f);
        in = &y[i];
      }
      gpu->matmul_glu(*in, gw, uw, Activation::Silu, h, u);
      gpu->matmul(dw, h, y[wb.size()]);
      gpu->matmul_shared(y[wb.size()], {{&w[0], &y[wb.size() + 1]}, {&w[1], &y[wb.size() + 2]}, {&w[3], &y[0]}});
    };
    ops();
    if (graph) {
      gpu->begin_capture();
      ops();
      const int g = gpu->end_capture();
      gpu->replay(g);
      gpu->replay(g);
    }
    std::vector<float> all;
    for (const Tensor& t : y) {
      const auto v = fetch(*gpu, t);
      all.insert(all.end(), v.begin(), v.end());
    }
    const auto hv = fetch(*gpu, h);
    all.insert(all.end(), hv.begin(), hv.end());
    return all;
  };
  const auto ref = run(false, false);
  for (const bool graph : {false, true}) {
    const auto got = run(true, graph);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0) << (graph ? "graph" : "eager");
  }
}
}  // namespace
}  // namespace pg

namespace pg {
namespace {

// CudaOptions::gemv_stage_x: the one-row kernels with the activation row staged in shared memory (a block
// copies it once, XOR-swizzled) against the same kernels reading it from global memory, bit for bit: plain
// matmuls (two rows per warp) on the decode shapes and odd ones (a ragged last block whose warps have no
// rows but still take part in the copy), fused gate/up/GLU and grouped q/k/v, every type with a one-row
// kernel; K that cannot be staged (not a multiple of 128, or past kStageMaxK) takes the global kernel both ways.
TEST(CudaOps, GemvStageXBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  const CudaOptions base = gpu->options();
  auto opts = [&](bool stage) {
    CudaOptions o = with_pipe(base, false, 4, 0, true);
    o.gemv_stage_x = stage;
    o.fuse_glu = o.fuse_qkv = true;
    return o;
  };
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  int checked = 0;
  for (const DType t : {DType::Q4_K, DType::Q6_K, DType::Q5_K, DType::Q8_0, DType::Q4_0, DType::IQ4_XS}) {
    auto shapes = pipe_shapes(t);
    shapes.push_back({65, 40960});   // K > kStageMaxK: global both ways
    shapes.push_back({32771, 256});  // a tall matrix with a ragged last block
    for (const auto& [M, K] : shapes) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " M=" + std::to_string(M) + " K=" + std::to_string(K));
      const auto wb = make_weights_tiled(t, K, M, 150u + static_cast<uint32_t>(M + K));
      const auto ub = make_weights_tiled(t, K, M, 151u + static_cast<uint32_t>(M + K));
      auto xv = randn(static_cast<size_t>(K), 152u + static_cast<uint32_t>(K));
      xv[0] = 4.0f, xv[K - 1] = -4.0f;
      Tensor w = make_weight(*gpu, t, K, M, 1, wb), uw = make_weight(*gpu, t, K, M, 1, ub);
      Tensor x = make_tensor(*gpu, DType::F32, K, 1, xv.data());
      Tensor y = gpu->alloc(DType::F32, M, 1), u = gpu->alloc(DType::F32, M, 1);
      std::vector<float> junk(static_cast<size_t>(M), -555.0f);
      std::vector<std::vector<float>> out[2];
      for (const bool stage : {false, true}) {
        gpu->set_options(opts(stage));
        gpu->upload(y, junk.data(), junk.size() * sizeof(float));  // every row must be written again
        gpu->matmul(w, x, y);
        out[stage].push_back(fetch(*gpu, y));
        gpu->upload(y, junk.data(), junk.size() * sizeof(float));
        gpu->matmul_glu(x, w, uw, Activation::Silu, y, u);
        out[stage].push_back(fetch(*gpu, y));
        std::vector<Tensor> ws = {w, uw}, ys = {y, u};
        gpu->upload(y, junk.data(), junk.size() * sizeof(float));
        gpu->upload(u, junk.data(), junk.size() * sizeof(float));
        shared_products(*gpu, x, ws, ys);
        out[stage].push_back(fetch(*gpu, y));
        out[stage].push_back(fetch(*gpu, u));
      }
      for (size_t k = 0; k < out[0].size(); ++k) {
        EXPECT_TRUE(same(out[0][k], out[1][k])) << "product " << k << " (plain, glu, grouped q, grouped k)";
        EXPECT_EQ(max_abs_diff(out[0][k], out[1][k]), 0.0f) << "product " << k;
      }
      for (Tensor* p : {&w, &uw, &x, &y, &u}) gpu->free(*p);
      ++checked;
    }
  }
  gpu->set_options(base);
  EXPECT_EQ(checked, 6 * 11);
}

// CudaOptions::moe_fused (moe_gemv.cu): moe_ffn with the fused decode kernels must be bit-identical to the
// default path (same dot order, GLU and combine arithmetic), for the qwen3-30b-a3b expert shape (d 2048,
// ff 768, k 8; 16 experts instead of 128 to keep the host-side quantization short: the kernels index experts
// by id, their count does not change the arithmetic) and odd small shapes, mixed gate/down types as Q4_K_M
// files have, separate and fused [gate; up] experts, SiLU and GELU, n = 1, 2, 4, 8.
TEST(CudaMoeFused, OnOffBitIdentical) {
  PG_REQUIRE_GPU();
  auto gpu = test::make_cuda(false);
  struct Case {
    DType gt, dt;
    int64_t d, ff;
    int n_exp, k;
    Activation act;
  };
  const Case cases[] = {{DType::Q4_K, DType::Q6_K, 2048, 768, 16, 8, Activation::Silu},
                        {DType::Q4_K, DType::Q4_K, 256, 512, 8, 3, Activation::GeluTanh},
                        {DType::Q5_K, DType::Q8_0, 512, 256, 8, 4, Activation::Silu},
                        {DType::Q6_K, DType::Q5_K, 256, 256, 5, 2, Activation::GeluTanh},
                        {DType::Q8_0, DType::Q8_0, 96, 160, 6, 1, Activation::Silu},
                        {DType::Q8_0, DType::Q6_K, 2048, 768, 16, 8, Activation::GeluTanh},
                        // ff/32 > 32 pieces: the down kernel's general loop (the others take its batched one)
                        {DType::Q4_K, DType::Q5_K, 256, 1280, 4, 2, Activation::Silu},
                        {DType::Q8_0, DType::Q8_0, 64, 1056, 3, 3, Activation::GeluTanh}};
  int hits_expected = 0;
  for (const Case& c : cases) {
    const auto gate = make_weights(c.gt, c.d, c.ff * c.n_exp, 11), up = make_weights(c.gt, c.d, c.ff * c.n_exp, 12);
    const auto down = make_weights(c.dt, c.ff, c.d * c.n_exp, 13);
    const size_t rb = row_bytes(c.gt, c.d), eb = rb * static_cast<size_t>(c.ff);
    std::vector<uint8_t> fused(2 * eb * static_cast<size_t>(c.n_exp));
    for (int ex = 0; ex < c.n_exp; ++ex) {
      std::memcpy(fused.data() + 2 * eb * static_cast<size_t>(ex), gate.data() + eb * static_cast<size_t>(ex), eb);
      std::memcpy(fused.data() + 2 * eb * static_cast<size_t>(ex) + eb, up.data() + eb * static_cast<size_t>(ex), eb);
    }
    Tensor g = make_weight(*gpu, c.gt, c.d, c.ff, c.n_exp, gate), u = make_weight(*gpu, c.gt, c.d, c.ff, c.n_exp, up);
    Tensor gu = make_weight(*gpu, c.gt, c.d, 2 * c.ff, c.n_exp, fused);
    Tensor dn = make_weight(*gpu, c.dt, c.ff, c.d, c.n_exp, down);
    for (int n : {1, 2, 4, 8}) {
      SCOPED_TRACE(std::string(dtype_name(c.gt)) + "/" + std::string(dtype_name(c.dt)) + " d=" + std::to_string(c.d) + " ff=" + std::to_string(c.ff) +
                   " k=" + std::to_string(c.k) + " n=" + std::to_string(n));
      const auto x = randn(static_cast<size_t>(n * c.d), 20u + static_cast<uint32_t>(n));
      std::vector<int32_t> ids(static_cast<size_t>(n * c.k));
      std::vector<float> w(ids.size());
      std::mt19937 rng(static_cast<uint32_t>(n * 7 + c.k));
      for (int r = 0; r < n; ++r) {
        std::vector<int32_t> e(static_cast<size_t>(c.n_exp));
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.end(), rng);
        for (int j = 0; j < c.k; ++j) {
          ids[static_cast<size_t>(r * c.k + j)] = e[static_cast<size_t>(j)];
          w[static_cast<size_t>(r * c.k + j)] = static_cast<float>(rng() % 1000 + 1) / 1000.0f;
        }
      }
      Tensor xt = make_tensor(*gpu, DType::F32, c.d, n, x.data());
      Tensor it = make_tensor(*gpu, DType::I32, c.k, n, ids.data()), wt = make_tensor(*gpu, DType::F32, c.k, n, w.data());
      const std::vector<float> poison(static_cast<size_t>(n * c.d), std::nanf(""));
      for (bool fuse_gu : {false, true}) {
        std::vector<float> res[2];
        for (int on = 0; on < 2; ++on) {
          CudaOptions o = gpu->options();
          o.moe_fused = on != 0;
          gpu->set_options(o);
          Tensor out = make_tensor(*gpu, DType::F32, c.d, n, poison.data());
          const int64_t h0 = gpu->moe_fused_hits();
          if (fuse_gu)
            gpu->moe_ffn(xt, it, wt, gu, Tensor{}, dn, c.act, out);
          else
            gpu->moe_ffn(xt, it, wt, g, u, dn, c.act, out);
          EXPECT_EQ(gpu->moe_fused_hits() - h0, on) << "the fused path " << (on ? "did not run" : "ran while off");
          res[on] = fetch(*gpu, out);
          gpu->free(out);
        }
        size_t nan = 0;
        for (float v : res[1]) nan += std::isnan(v) ? 1 : 0;
        EXPECT_EQ(nan, 0u);
        EXPECT_EQ(0, std::memcmp(res[0].data(), res[1].data(), res[0].size() * sizeof(float)))
            << (fuse_gu ? "fused gate_up" : "separate gate/up") << ": moe_fused differs from the default path";
        ++hits_expected;
      }
      for (Tensor* t : {&xt, &it, &wt}) gpu->free(*t);
    }
    for (Tensor* t : {&g, &u, &gu, &dn}) gpu->free(*t);
  }
  EXPECT_GT(hits_expected, 0);
}

}  // namespace
}  // namespace pg
