// The GLU activations of the CUDA backend, in one place: elementwise.cu's glu kernel and gemv_q8.cu's fused
// decode GEMV + GLU (CudaOptions::fuse_glu) both call glu_act, so the fused result is bit-identical to
// matmul + glu by construction (same expression, same rounding steps; never compiled with fast math).
#pragma once
#include <cuda_fp16.h>

namespace pg::cuda {

__device__ __forceinline__ float round_fp16(float x) { return __half2float(__float2half_rn(x)); }

// GELU (tanh form) as ggml-cpu computes it (see CpuBackend::gelu_ggml): through FP16 in and out.
__device__ __forceinline__ float gelu_ggml(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  const float h = round_fp16(x);
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  constexpr float kCoef = 0.044715f;
  const float g = 0.5f * h * (1.0f + tanhf(kSqrt2OverPi * h * (1.0f + kCoef * h * h)));
  return round_fp16(g);
}

// y = act(g)·u; act 0 = SiLU (g / (1 + e^−g), correctly rounded division), 1 = GELU (gelu_ggml).
__device__ __forceinline__ float glu_act(float g, float u, int act) {
  const float a = act == 0 ? __fdiv_rn(g, 1.0f + expf(-g)) : gelu_ggml(g);
  return __fmul_rn(a, u);
}

}  // namespace pg::cuda
