// Gated DeltaNet (Qwen3.5 linear attention) on the GPU: gates, the causal conv with its rolling state,
// and the gated delta rule. Semantics: backend.h (RecurrentBatch, ssm_conv, gated_delta_net).
//
// Segment bookkeeping lives on the device (rows, seg, capture tensors), so a recorded decode step replays
// with whatever slots the step uses; the host only picks the grid (segment count) and whether segments
// must run one after another (one starts from a slot that another writes in the same call).
//
// gated_delta_net keeps a head's state in registers for a whole segment: block = 32 value columns ×
// kWarps warps; thread (w, j) holds S[a][j] for rows a = w, w + kWarps, … (≤ kMaxRows of them). Per token:
// kv = Sᵀk and o = Sᵀq reduce over the warps through shared memory, δ = β(v − γ·kv), S ← γS + kδᵀ. The
// state is read from memory once per segment and written once (plus capture slots), which is what decode
// needs (a step reads and writes every head's state once: the recurrent part of the roofline). Long
// prefill segments run token by token inside the kernel too, with the same float operations per token
// whatever the segment's length, so a prompt's outputs and state do not depend on how the scheduler cut
// it into steps (backend.h, gated_delta_net; greedy speculative decoding relies on it). A chunked
// tensor-core form for prefill would have to keep that property, which chunks counted from the segment
// start do not (cpu_deltanet.cpp, header).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kMaxRowsPerThread = 64;  // d_k ≤ kWarps · 64 = 256

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

__global__ void deltanet_gates_kernel(float* alpha, float* beta, const float* dt_bias, const float* a, int64_t rows, int h) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * h) return;
  const int c = static_cast<int>(i % h);
  const float x = alpha[i] + dt_bias[c];
  const float sp = x > 20.0f ? x : logf(1.0f + expf(x));
  alpha[i] = sp * a[c];
  beta[i] = 1.0f / (1.0f + expf(-beta[i]));
}

__global__ void mul_rows_sigmoid_kernel(float* x, const float* gate, int64_t rows, int64_t d) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * d) return;
  const float g = gate[i / d];
  x[i] *= 1.0f / (1.0f + expf(-g));
}

// One thread per channel, blockIdx.y = segment (seg_base + y).
template <int H>
__global__ void ssm_conv_kernel(const float* __restrict__ x, const void* __restrict__ w, bool w_f16, float* state, const int32_t* rows,
                                const int32_t* seg, const int32_t* capture, int seg_base, int64_t C, bool silu, float* __restrict__ out) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int32_t* sg = seg + 4 * (seg_base + static_cast<int>(blockIdx.y));
  const int start = sg[0], len = sg[1], src = sg[2], dst = sg[3];
  const int64_t slot_w = static_cast<int64_t>(H) * C;
  constexpr int K = H + 1;
  float wt[K], hist[H > 0 ? H : 1];
#pragma unroll
  for (int j = 0; j < K; ++j)
    wt[j] = w_f16 ? h2f(static_cast<const uint16_t*>(w)[c * K + j]) : static_cast<const float*>(w)[c * K + j];
#pragma unroll
  for (int j = 0; j < H; ++j) hist[j] = state[src * slot_w + j * C + c];
  for (int t = 0; t < len; ++t) {
    const int r = rows[start + t];
    const float xv = x[static_cast<int64_t>(r) * C + c];
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < H; ++j) sum = __fadd_rn(sum, __fmul_rn(hist[j], wt[j]));
    sum = __fadd_rn(sum, __fmul_rn(xv, wt[H]));
    out[static_cast<int64_t>(r) * C + c] = silu ? silu_f(sum) : sum;
#pragma unroll
    for (int j = 0; j + 1 < H; ++j) hist[j] = hist[j + 1];
    if (H > 0) hist[H > 0 ? H - 1 : 0] = xv;
    const int cap = capture[r];
    if (cap >= 0)
#pragma unroll
      for (int j = 0; j < H; ++j) state[cap * slot_w + j * C + c] = hist[j];
  }
  if (dst >= 0)
#pragma unroll
    for (int j = 0; j < H; ++j) state[dst * slot_w + j * C + c] = hist[j];
}

struct DeltaParams {
  const float *q, *k, *v, *g, *beta;  // q, k (n, hk·d_k); v (n, hv·d_v); g, beta (n, hv)
  float* state;                        // (slots, hv·d_k·d_v), [head][d_k][d_v]
  const int32_t *rows, *seg, *capture;
  int seg_base;
  int hk, hv, d_k, d_v;
  float scale;
  float* out;  // (n, hv·d_v)
};

// grid: (ceil(d_v/32), hv, segments); block: 32 × kWarps.
__global__ void __launch_bounds__(32 * kWarps) gated_delta_kernel(const DeltaParams p) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int j = static_cast<int>(blockIdx.x) * 32 + lane;  // value column
  const int h = static_cast<int>(blockIdx.y), kh = h % p.hk;
  const int32_t* sg = p.seg + 4 * (p.seg_base + static_cast<int>(blockIdx.z));
  const int start = sg[0], len = sg[1], src = sg[2], dst = sg[3];
  const bool col = j < p.d_v;
  const int64_t hs = static_cast<int64_t>(p.d_k) * p.d_v;
  const int64_t slot_w = static_cast<int64_t>(p.hv) * hs;
  __shared__ float sk[kWarps * kMaxRowsPerThread], sq[kWarps * kMaxRowsPerThread];
  __shared__ float red_kv[kWarps][32], red_o[kWarps][32];

  float S[kMaxRowsPerThread];
  const float* s_src = p.state + src * slot_w + h * hs;
#pragma unroll
  for (int i = 0; i < kMaxRowsPerThread; ++i) {
    const int a = warp + kWarps * i;
    S[i] = (col && a < p.d_k) ? s_src[static_cast<int64_t>(a) * p.d_v + j] : 0.0f;
  }
  const int64_t qw = static_cast<int64_t>(p.hk) * p.d_k, vw = static_cast<int64_t>(p.hv) * p.d_v;
  for (int t = 0; t < len; ++t) {
    const int r = p.rows[start + t];
    for (int a = static_cast<int>(threadIdx.x); a < p.d_k; a += 32 * kWarps) {
      sk[a] = p.k[r * qw + kh * p.d_k + a];
      sq[a] = p.q[r * qw + kh * p.d_k + a];
    }
    const float gamma = expf(p.g[static_cast<int64_t>(r) * p.hv + h]), b = p.beta[static_cast<int64_t>(r) * p.hv + h];
    const float vj = col ? p.v[r * vw + static_cast<int64_t>(h) * p.d_v + j] : 0.0f;
    __syncthreads();
    float kv = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxRowsPerThread; ++i) {
      const int a = warp + kWarps * i;
      if (a < p.d_k) kv = fmaf(S[i], sk[a], kv);
    }
    red_kv[warp][lane] = kv;
    __syncthreads();
    kv = 0.0f;
#pragma unroll
    for (int w2 = 0; w2 < kWarps; ++w2) kv += red_kv[w2][lane];
    const float delta = b * (vj - gamma * kv);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxRowsPerThread; ++i) {
      const int a = warp + kWarps * i;
      if (a < p.d_k) {
        S[i] = fmaf(gamma, S[i], sk[a] * delta);
        o = fmaf(S[i], sq[a], o);
      }
    }
    red_o[warp][lane] = o;
    __syncthreads();
    if (warp == 0 && col) {
      float s = 0.0f;
#pragma unroll
      for (int w2 = 0; w2 < kWarps; ++w2) s += red_o[w2][lane];
      p.out[r * vw + static_cast<int64_t>(h) * p.d_v + j] = p.scale * s;
    }
    const int cap = p.capture[r];
    if (cap >= 0 && col) {
      float* s_cap = p.state + cap * slot_w + h * hs;
#pragma unroll
      for (int i = 0; i < kMaxRowsPerThread; ++i) {
        const int a = warp + kWarps * i;
        if (a < p.d_k) s_cap[static_cast<int64_t>(a) * p.d_v + j] = S[i];
      }
    }
    __syncthreads();  // sk/sq and the reductions are rewritten by the next token
  }
  if (dst >= 0 && col) {
    float* s_dst = p.state + dst * slot_w + h * hs;
#pragma unroll
    for (int i = 0; i < kMaxRowsPerThread; ++i) {
      const int a = warp + kWarps * i;
      if (a < p.d_k) s_dst[static_cast<int64_t>(a) * p.d_v + j] = S[i];
    }
  }
}

// Runs segments [0, n_segments) either in one launch or, when `serial`, one launch per segment.
template <class F>
void over_segments(int n_segments, bool serial, F&& launch) {
  if (!serial) {
    launch(0, n_segments);
    return;
  }
  for (int s = 0; s < n_segments; ++s) launch(s, 1);
}

}  // namespace

void deltanet_gates(float* alpha, float* beta, const float* dt_bias, const float* a, int64_t rows, int h, cudaStream_t stream) {
  const int64_t n = rows * h;
  if (n == 0) return;
  launch(deltanet_gates_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, stream, alpha, beta, dt_bias, a, rows, h);
  check_launch("deltanet_gates");
}

void mul_rows_sigmoid(float* x, const float* gate, int64_t rows, int64_t d, cudaStream_t stream) {
  const int64_t n = rows * d;
  if (n == 0) return;
  launch(mul_rows_sigmoid_kernel, static_cast<unsigned>((n + 255) / 256), 256, 0, stream, x, gate, rows, d);
  check_launch("mul_rows_sigmoid");
}

void ssm_conv(const SsmConvArgs& a, cudaStream_t stream) {
  if (a.n_segments == 0) return;
  PG_CHECK(a.kernel >= 1 && a.kernel <= 8, "ssm_conv: kernel sizes 1..8 are supported on CUDA");
  const unsigned bx = static_cast<unsigned>((a.C + 127) / 128);
  over_segments(a.n_segments, a.serial, [&](int s0, int count) {
    const dim3 grid(bx, static_cast<unsigned>(count));
#define PG_CONV(HH)                                                                                                    \
  case HH + 1:                                                                                                         \
    launch(ssm_conv_kernel<HH>, grid, 128, 0, stream, a.x, a.w, a.w_f16, a.state, a.rows, a.seg, a.capture, s0, a.C, a.silu, a.out); \
    break;
    switch (a.kernel) {
      PG_CONV(0)
      PG_CONV(1)
      PG_CONV(2)
      PG_CONV(3)
      PG_CONV(4)
      PG_CONV(5)
      PG_CONV(6)
      PG_CONV(7)
    }
#undef PG_CONV
    check_launch("ssm_conv");
  });
}

void gated_delta_net(const GatedDeltaArgs& a, cudaStream_t stream) {
  if (a.n_segments == 0) return;
  PG_CHECK(a.d_k >= 1 && a.d_k <= kWarps * kMaxRowsPerThread, "gated_delta_net: head_k_dim up to 256 is supported on CUDA");
  DeltaParams p{a.q, a.k, a.v, a.g, a.beta, a.state, a.rows, a.seg, a.capture, 0, a.hk, a.hv, a.d_k, a.d_v, a.scale, a.out};
  over_segments(a.n_segments, a.serial, [&](int s0, int count) {
    p.seg_base = s0;
    const dim3 grid(static_cast<unsigned>((a.d_v + 31) / 32), static_cast<unsigned>(a.hv), static_cast<unsigned>(count));
    launch(gated_delta_kernel, grid, 32 * kWarps, 0, stream, p);
    check_launch("gated_delta_net");
  });
}

}  // namespace pg::cuda
