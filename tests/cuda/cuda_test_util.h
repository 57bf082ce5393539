// Helpers shared by the CUDA tests: the GPU presence check, twin tensors on the CPU reference and the
// CUDA backend, and error measures.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"

namespace pg::test {

// Without a GPU every CUDA test fails, loudly, unless PEREGRINE_NO_GPU_OK=1 says that is expected (CI
// builds these tests on machines without a GPU; scripts/test.sh excludes the `cuda` label there).
#define PG_REQUIRE_GPU()                                                                                      \
  do {                                                                                                        \
    if (::pg::cuda_device_count() == 0) {                                                                     \
      const char* ok_ = std::getenv("PEREGRINE_NO_GPU_OK");                                                   \
      if (ok_ && std::string(ok_) == "1") GTEST_SKIP() << "no CUDA device (PEREGRINE_NO_GPU_OK=1)";           \
      FAIL() << "no CUDA device visible: this test needs an NVIDIA GPU (set PEREGRINE_NO_GPU_OK=1 to skip)"; \
    }                                                                                                         \
  } while (0)

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A tensor allocated and filled with the same bytes on a backend.
inline Tensor make_tensor(Backend& be, DType t, int64_t cols, int64_t rows, const void* data) {
  Tensor x = be.alloc(t, cols, rows);
  if (data) be.upload(x, data, x.nbytes());
  return x;
}

inline std::vector<float> fetch(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  be.download(t, v.data(), v.size() * sizeof(float));
  return v;
}

struct ErrStats {
  double rel = 0;      // ‖a − ref‖ / ‖ref‖
  double max_abs = 0;  // max |a − ref|
  size_t bad = 0;      // NaN/Inf where ref is finite
};

inline ErrStats compare(const std::vector<float>& a, const std::vector<float>& ref) {
  ErrStats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (!std::isfinite(a[i]) && std::isfinite(ref[i])) {
      ++s.bad;
      continue;
    }
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    s.max_abs = std::max(s.max_abs, std::fabs(d));
  }
  s.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (a.size() != ref.size()) s.bad += 1;
  return s;
}

inline std::unique_ptr<CpuBackend> make_cpu_exact() {
  CpuOptions o;
  o.n_threads = 2;
  o.exact_f32 = true;
  return std::make_unique<CpuBackend>(o);
}

// fa_prefill false: attention calls of any row count stay on attention.cu (the op tests that bound it at
// FP32 precision); true: CudaOptions' default routing (≥ 32 rows on tensor cores) or the environment's.
inline std::unique_ptr<CudaBackend> make_cuda(bool exact, bool fa_prefill = true) {
  CudaOptions o;
  o.exact_f32 = exact;
  // The factory's switch, so that one device call can run the tests with PDL off as well.
  if (const char* e = std::getenv("PEREGRINE_CUDA_PDL"); e && std::string(e) == "0") o.pdl = false;
  if (const char* e = std::getenv("PEREGRINE_GEMV_RPW"); e && *e) o.gemv_rows_per_warp = std::atoi(e);
  // Tensor-core prefill attention for calls of ≥ N rows (scripts/device-check.sh FA_PREFILL=1 runs the
  // model tests with it; op tests that bound attention at FP32 precision are not meant to run with it).
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_PREFILL"); e && *e) o.fa_prefill_min_rows = std::atoi(e);
  if (const char* e = std::getenv("PEREGRINE_CUDA_FA_PREFILL_TYPED"); e && *e) o.fa_prefill_typed = std::strcmp(e, "0") != 0;
  if (!fa_prefill) o.fa_prefill_min_rows = 0;
  return std::make_unique<CudaBackend>(0, o);
}

}  // namespace pg::test
