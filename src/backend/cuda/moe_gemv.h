// Fused MoE decode kernels (moe_gemv.cu, CudaOptions::moe_fused). Host-side declarations only.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace pg::cuda {

// Weight types the fused kernels take (others: the default moe_ffn path).
bool moe_fused_type(DType t);

struct MoeGateUpParams {
  const uint8_t* gate = nullptr;  // (n_exp, ff, row_bytes) bytes; expert e at gate + e·gate_expert_bytes
  const uint8_t* up = nullptr;    // (n_exp, ff, row_bytes) bytes; expert e at up + e·up_expert_bytes
  size_t row_bytes = 0, gate_expert_bytes = 0, up_expert_bytes = 0;
  const int32_t* ids = nullptr;  // (E) expert of routed entry g = (token g/k, slot g%k)
  int E = 0, k = 1;
  int64_t K = 0, ff = 0;          // K = d (row width), ff = rows per expert
  int n_pieces = 0;               // K/32
  const int8_t* xq = nullptr;     // (n, K) x quantized by quantize_q8
  const float* xd = nullptr;      // (n, K/32) its scales
  const int32_t* xs = nullptr;    // (n, K/32) its sums per 32 values
  float* G = nullptr;             // (E, ff) out: act(gate)·up
};

struct MoeDownParams {
  const uint8_t* down = nullptr;  // (n_exp, d, row_bytes) bytes; expert e at down + e·expert_bytes
  size_t row_bytes = 0, expert_bytes = 0;
  const int32_t* ids = nullptr;    // (n, k)
  const float* weights = nullptr;  // (n, k)
  int n = 0, k = 1;
  int64_t d = 0, ff = 0;           // output width, row width
  int n_pieces = 0;                // ff/32
  const int8_t* gq = nullptr;      // (E, ff) G quantized by quantize_q8
  const float* gd = nullptr;       // (E, ff/32) its scales
  const int32_t* gs = nullptr;     // (E, ff/32) its sums per 32 values
  float* out = nullptr;            // (n, d)
};

// act 0 = SiLU, 1 = GELU. pdl: launch with programmatic stream serialization.
void moe_gate_up(DType type, const MoeGateUpParams& p, int act, bool pdl, cudaStream_t stream);
void moe_down_combine(DType type, const MoeDownParams& p, bool pdl, cudaStream_t stream);

}  // namespace pg::cuda
