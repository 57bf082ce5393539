// The index arithmetic of the cuBLAS prefill GEMM (gemm_cublas.cu, CudaOptions::gemm_cublas), in plain C++
// with no CUDA type, so that tests/cuda/test_cuda_gemm_cublas_host.cpp checks it on the host (no GPU).
//
// cuBLAS is column-major; Peregrine's matrices are row-major. A row-major (R, C) matrix with row stride ld
// is, read column-major, the (C, R) matrix with leading dimension ld: its transpose, for free. So
//   y (n, M) = x_h (n, K) · W_h (M, K)ᵀ            (row-major, what MatmulArgs asks for)
// is, column-major,
//   Y (M, n) = op_T(A) · B,  A = W_h as (K, M) with lda = w_ld,  B = x_h as (K, n) with ldb = K,
//                            Y = y as (M, n) with ldc = y_stride
// — cuBLAS's "TN" case (A transposed, B not), the one its FP16 tensor-core kernels prefer.
#pragma once
#include <cstdint>

namespace pg::cuda {

// One column-major product D (m, n) = op(A) (m, k) · op(B) (k, n) as cuBLAS takes it. A is stored (k, m)
// when trans_a (else (m, k)), B (k, n) when !trans_b; lda/ldb/ldd are the column strides in elements.
struct CublasGemmShape {
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;
  bool trans_a = true, trans_b = false;
};

// y (n_rows, M) row-major, y_stride floats apart, = x_h (n_rows, K) row-major dense · W_h (M, K)ᵀ with the
// rows of W_h w_ld elements apart (K for the dequantized scratch; row_bytes/2 for F16/BF16 read in place).
inline CublasGemmShape cublas_gemm_shape(int64_t M, int64_t K, int64_t n_rows, int64_t w_ld, int64_t y_stride) {
  CublasGemmShape s;
  s.m = M;
  s.n = n_rows;
  s.k = K;
  s.lda = w_ld;      // A = W_h read as (K, M): column m is weight row m
  s.ldb = K;         // B = x_h read as (K, n): column i is activation row i (the converted scratch is dense)
  s.ldd = y_stride;  // D = y read as (M, n): column i is output row i
  s.trans_a = true;
  s.trans_b = false;
  return s;
}

// The largest power of two (at most cap) that divides the address: what cuBLASLt's MIN_ALIGNMENT_*
// preferences must not exceed, or the heuristic may pick a kernel whose vector loads fault (its default
// assumes 256 bytes; a strided y or a view into a tensor can be less aligned).
inline uint32_t pointer_alignment(const void* p, uint32_t cap = 256) {
  const uint64_t a = reinterpret_cast<uint64_t>(p);
  if (a == 0) return cap;
  const uint64_t low = a & (~a + 1);  // lowest set bit
  return low >= cap ? cap : static_cast<uint32_t>(low);
}

}  // namespace pg::cuda
