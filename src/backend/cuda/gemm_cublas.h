// Prefill GEMM through cuBLASLt on weights dequantized to FP16 (gemm_cublas.cu; CudaOptions::gemm_cublas).
// Launchers in plain C++ types, like kernels.h (kept out of it so that adding them rebuilds only their users).
//
// y (n, M) FP32 = x_h (n, K) · W_h (M, K)ᵀ, FP32 accumulation, where
//  - x_h is the GEMM's own activation operand (gemm_convert_x: default mode rounds the activations of
//    quantized weights to 8 bits as the CPU does, then to FP16; otherwise FP16, BF16 for BF16 weights),
//  - W_h is the weight matrix with every element rounded to FP16 exactly as gemm.cu's tile dequantization
//    rounds it (dequant_f16; F16/BF16 weights are read in place),
// so this path and cuda::gemm multiply the same 16-bit operands and differ only in FP32 summation order.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace pg::cuda {

// The GEMM's activation operand, shared by cuda::gemm and gemm_cublas: x (n, K) (x_stride floats apart;
// row i taken from x row x_rows[i] when x_rows is given) → xh (n, K) dense 16-bit, i.e. the 8-bit rounding
// of a.act_quant then FP16 (quantized weights in default mode), else FP16 saturated to ±65504, or BF16 for
// BF16 weights. xh holds gemm_scratch_bytes(n, K).
void gemm_convert_x(const MatmulArgs& a, const int32_t* x_rows, uint16_t* xh, cudaStream_t stream);

// Whether gemm_cublas takes a: a gemm_supported type, K % 32 == 0, not grouped (expert_ids unset), the
// matrix 16-byte aligned with whole blocks per row (the dequantization kernel's loads), x_stride % 4 == 0.
bool gemm_cublas_supported(const MatmulArgs& a);
// Bytes of the 16-bit weight scratch gemm_cublas needs for a: M·K·2, or 0 for F16/BF16 weights (read in place).
size_t gemm_cublas_weight_bytes(const MatmulArgs& a);
// The cuBLASLt workspace (split-K partials, its own scratch) that gemm_cublas is given: 32 MiB, NVIDIA's
// recommendation for Hopper. Passed explicitly on every call, so nothing is allocated inside a call and a
// call can be recorded in a CUDA graph.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// W (a.M, a.K) of a.type in its GGUF blocks (a.w, a.row_bytes apart) → out (M, K) row-major dense: FP16, or
// BF16 for BF16 weights; element (m, k) is the FP16 rounding (round to nearest even, no saturation) of the
// decoder's value, the bits gemm.cu's tile dequantization writes. Needs gemm_cublas_supported(a) (its
// layout conditions); out: M·K·2 bytes, 16-byte aligned.
void dequant_f16(const MatmulArgs& a, uint16_t* out, cudaStream_t stream);

// One cuBLASLt handle and its cached plans (matmul descriptor, layouts and the heuristic's algorithm per
// shape and alignment). Host state only: one per backend, used from one thread at a time.
class CublasGemm;
CublasGemm* cublas_gemm_create();
void cublas_gemm_destroy(CublasGemm* h);

// y = x·Wᵀ through cuBLASLt: converts x into x_scratch (gemm_scratch_bytes(n, K)), dequantizes W into
// w_scratch (gemm_cublas_weight_bytes(a); may be null when that is 0), then one cublasLtMatmul on `stream`
// with `workspace` (workspace_bytes). Respects a.x_stride and a.y_stride. Returns false, launching nothing,
// when cuBLASLt offers no algorithm for the shape (the caller then runs cuda::gemm). Launches nothing that
// allocates: capturable once the handle exists.
bool gemm_cublas(CublasGemm& h, const MatmulArgs& a, void* x_scratch, void* w_scratch, void* workspace, size_t workspace_bytes,
                 cudaStream_t stream);

}  // namespace pg::cuda
