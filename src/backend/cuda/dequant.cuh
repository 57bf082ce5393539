// One 16-element run of a weight matrix, for the whole-matrix dequantization of the cuBLAS prefill GEMM
// (gemm_cublas.cu). Separate from the kernel so that tests/cuda/test_cuda_gemm_cublas_host.cpp runs the same
// index arithmetic on the host (through cuda_host_shim.h) against core's dequantize_row.
#pragma once
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace pg::cuda {

// Run i (0 .. M·K/16) of W (M, K), stored as Q's blocks with rows row_bytes apart, runs_per_row = K/16:
// writes its 16 values (Q::run's, bit-identical to dequantize_row) to v and returns the element offset of
// its first value in the row-major dense (M, K) output. Runs are numbered row by row, so consecutive i
// are consecutive 16-element pieces of the output (a warp's stores form one contiguous 1 KiB span).
template <class Q>
__device__ __forceinline__ int64_t dequant_run(const uint8_t* w, size_t row_bytes, int64_t runs_per_row, int64_t i, float (&v)[16]) {
  constexpr int kRuns = Q::kElems / 16;  // runs per block: 2 (32-element blocks) or 16 (K-quants)
  const int64_t m = i / runs_per_row, j = i - m * runs_per_row;
  Q::run(w + static_cast<size_t>(m) * row_bytes + static_cast<size_t>(j / kRuns) * Q::kBytes, static_cast<int>(j % kRuns), v);
  return m * runs_per_row * 16 + 16 * j;
}

}  // namespace pg::cuda
