// Row and element-wise ops: get_rows, RMSNorm, RoPE, GLU, residual adds, bias, scale, softcap,
// sigmoid gating, column gathers and the KV-cache store. Each follows CpuBackend's arithmetic
// (same association order, accurate exp/tanh/sin/cos, sums of squares in double) so results agree
// with the CPU to a few ulps.
#include <algorithm>
#include <atomic>

#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/glu_act.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int kThreads = 256;

inline unsigned grid_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, 65535 * 8)));
}

// ---- get_rows -----------------------------------------------------------------------------------------

template <class Q>
__global__ void get_rows_quant_kernel(const uint8_t* table, size_t row_bytes, int64_t n_rows, int64_t d, const int32_t* ids,
                                      float* out, int64_t out_stride) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int i = static_cast<int>(blockIdx.y);
  const int32_t id = ids[i];
  float* o = out + static_cast<int64_t>(i) * out_stride;
  const int64_t runs = d / 16;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < runs; j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[16];
    if (id >= 0 && id < n_rows) {
      constexpr int kRunsPerBlock = Q::kElems / 16;
      Q::run(table + static_cast<size_t>(id) * row_bytes + static_cast<size_t>(j / kRunsPerBlock) * Q::kBytes,
             static_cast<int>(j % kRunsPerBlock), v);
    } else {
#pragma unroll
      for (int k = 0; k < 16; ++k) v[k] = __int_as_float(0x7fc00000);  // NaN marks an invalid id
    }
#pragma unroll
    for (int k = 0; k < 16; ++k) o[16 * j + k] = v[k];
  }
}

// Plain tables (F32/F16/BF16) of any width.
template <int T>  // 0 f32, 1 f16, 2 bf16
__global__ void get_rows_plain_kernel(const uint8_t* table, size_t row_bytes, int64_t n_rows, int64_t d, const int32_t* ids,
                                      float* out, int64_t out_stride) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int i = static_cast<int>(blockIdx.y);
  const int32_t id = ids[i];
  float* o = out + static_cast<int64_t>(i) * out_stride;
  const uint8_t* row = table + static_cast<size_t>(id) * row_bytes;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < d; j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v;
    if (id < 0 || id >= n_rows)
      v = __int_as_float(0x7fc00000);
    else if (T == 0)
      v = reinterpret_cast<const float*>(row)[j];
    else if (T == 1)
      v = h2f(reinterpret_cast<const uint16_t*>(row)[j]);
    else
      v = bf2f(reinterpret_cast<const uint16_t*>(row)[j]);
    o[j] = v;
  }
}

// ---- norms --------------------------------------------------------------------------------------------

template <typename T>
__device__ T block_sum(T v, T* sh) {
  v = warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (nw == 1) return v;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T s = 0;
  for (int k = 0; k < nw; ++k) s += sh[k];  // same order in every thread
  return s;
}

// CudaOptions::fuse_norm_quant: after the block has stored its row yr (d) of y, it quantizes that row into
// the 8-bit activation scratch(es) of q (NormQuant: q8_0 and/or q8_K, rows × d layout of act_quant.cuh), so
// the next matmul skips its act_quant launch. The values are re-read from y after a barrier (the row is
// spread over the block's threads in a strided order, the quantization wants 8 consecutive values per lane)
// and go through the same act_quant.cuh calls as act_quant_kernel, one warp per 256 values: the bytes equal
// those quantize_q8 would write from y. Whole warps only (blockDim.x is 32, 128 or 512).
__device__ __forceinline__ void norm_quant_tail(const float* yr, int64_t row, int64_t d, const NormQuant& q) {
  __syncthreads();  // every y store of this block is visible to the block's threads
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  const int nw = static_cast<int>(blockDim.x >> 5);
  const int64_t units = (d + 255) / 256;
  for (int64_t u = warp; u < units; u += nw) {  // warp-uniform bound: every lane of a warp takes part
    const int64_t e0 = u * 256 + 8 * lane;
    const bool live = e0 < d;  // d % 32 == 0: a live lane has all 8 values
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = live ? yr[e0 + j] : 0.0f;
    if (q.q8_0.q) aq::quantize_store_q8<aq::kQ8_0>(v, lane, row, d, e0, live, q.q8_0.q, q.q8_0.d, q.q8_0.s, nullptr);
    if (q.q8_k.q) aq::quantize_store_q8<aq::kQ8_K>(v, lane, row, d, e0, live, q.q8_k.q, q.q8_k.d, q.q8_k.s, q.q8_k.split);
  }
}

// One block per row. With r (the fused residual add of add_rms_norm), x is read-write: each thread writes
// x[i] = x[i] + r[i] (one FP32 add, as add_kernel) in the sum pass and reads its own writes back in the
// scale pass, so the result equals add then rms_norm bit for bit (same thread count, same order).
// Q: also quantize the row (norm_quant_tail, CudaOptions::fuse_norm_quant); y is computed identically either way.
template <bool Q>
__global__ void rms_norm_kernel(const float* x, const void* w, int w_f16, float* y, int64_t d, float eps, const float* r, float* x_out,
                                NormQuant quant) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  __shared__ double sh[32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * d;
  float* yr = y + row * d;
  double s = 0;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float v = xr[i];
    if (r) {
      v = v + r[row * d + i];
      x_out[row * d + i] = v;
    }
    s += static_cast<double>(__fmul_rn(v, v));
  }
  s = block_sum(s, sh);
  const float mean = static_cast<float>(s / static_cast<double>(d));
  const float sc = 1.0f / sqrtf(mean + eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = __fmul_rn(xr[i], sc);
    float wv = 1.0f;
    if (w) wv = w_f16 ? h2f(static_cast<const uint16_t*>(w)[i]) : static_cast<const float*>(w)[i];
    yr[i] = w ? __fmul_rn(v, wv) : v;
  }
  if constexpr (Q) norm_quant_tail(yr, row, d, quant);
}

// The same norm with the row held in registers (d ≤ PER·blockDim.x: every row of a decode step). Why: the
// loop above cannot hoist a load past the x_out / y stores that may alias x (in-place norms, the fused
// residual), so each of a thread's elements costs a dependent round trip to L2, twice (sum pass, scale
// pass): one 4096-wide row took 8.5 µs on the H200 (ncu, qwen3-8b decode), ~4 µs the 128-wide q/k heads.
// Here every load of a thread (x, r and w) is issued before the first use. Same per-thread order of the
// double sums, the same block_sum and the same products: bit-identical to rms_norm_kernel.
template <int PER, bool Q>
__global__ void rms_norm_reg_kernel(const float* x, const void* w, int w_f16, float* y, int64_t d, float eps, const float* r,
                                    float* x_out, NormQuant quant) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  __shared__ double sh[32];
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  const float* xr = x + row * d;  // (d) this row; x_out may alias it (add_rms_norm in place)
  float* yr = y + row * d;        // (d) may alias x (rms_norm in place)
  float v[PER], wv[PER];          // this thread's elements t, t + nt, … and their weights
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int64_t i = t + static_cast<int64_t>(j) * nt;
    v[j] = i < d ? xr[i] : 0.0f;
    wv[j] = 1.0f;
    if (w && i < d) wv[j] = w_f16 ? h2f(static_cast<const uint16_t*>(w)[i]) : static_cast<const float*>(w)[i];
  }
  if (r) {
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t i = t + static_cast<int64_t>(j) * nt;
      if (i < d) v[j] = v[j] + r[row * d + i];
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int64_t i = t + static_cast<int64_t>(j) * nt;
      if (i < d) x_out[row * d + i] = v[j];
    }
  }
  double s = 0;
#pragma unroll
  for (int j = 0; j < PER; ++j)
    if (t + static_cast<int64_t>(j) * nt < d) s += static_cast<double>(__fmul_rn(v[j], v[j]));
  s = block_sum(s, sh);
  const float mean = static_cast<float>(s / static_cast<double>(d));
  const float sc = 1.0f / sqrtf(mean + eps);
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int64_t i = t + static_cast<int64_t>(j) * nt;
    if (i < d) {
      const float u = __fmul_rn(v[j], sc);
      yr[i] = w ? __fmul_rn(u, wv[j]) : u;
    }
  }
  if constexpr (Q) norm_quant_tail(yr, row, d, quant);
}

// Launches the register form when the row fits (values per thread ≤ 16), else rms_norm_kernel; the
// quantizing instantiations (Q) only when quant is given.
template <bool Q>
void launch_rms_norm_t(unsigned rows, int threads, const float* x, const void* w, int w_f16, float* y, int64_t d, float eps,
                       const float* r, float* x_out, const NormQuant& q, cudaStream_t stream) {
  const int64_t per = (d + threads - 1) / threads;
  if (per <= 4)
    launch(rms_norm_reg_kernel<4, Q>, rows, threads, 0, stream, x, w, w_f16, y, d, eps, r, x_out, q);
  else if (per <= 8)
    launch(rms_norm_reg_kernel<8, Q>, rows, threads, 0, stream, x, w, w_f16, y, d, eps, r, x_out, q);
  else if (per <= 16)
    launch(rms_norm_reg_kernel<16, Q>, rows, threads, 0, stream, x, w, w_f16, y, d, eps, r, x_out, q);
  else
    launch(rms_norm_kernel<Q>, rows, threads, 0, stream, x, w, w_f16, y, d, eps, r, x_out, q);
}

void launch_rms_norm(unsigned rows, int threads, const float* x, const void* w, int w_f16, float* y, int64_t d, float eps,
                     const float* r, float* x_out, const NormQuant* quant, cudaStream_t stream) {
  if (quant && (quant->q8_0.q || quant->q8_k.q)) {
    PG_CHECK(!quant->q8_0.q || d % 32 == 0, "rms_norm: q8_0 output needs a width that is a multiple of 32");
    PG_CHECK(!quant->q8_k.q || d % 256 == 0, "rms_norm: q8_K output needs a width that is a multiple of 256");
    launch_rms_norm_t<true>(rows, threads, x, w, w_f16, y, d, eps, r, x_out, *quant, stream);
  } else {
    launch_rms_norm_t<false>(rows, threads, x, w, w_f16, y, d, eps, r, x_out, NormQuant{}, stream);
  }
}

// ---- element-wise -----------------------------------------------------------------------------------

#define PG_GRID_STRIDE(i, n) \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  PG_GRID_STRIDE(i, n) y[i] = a[i] + b[i];
}
__global__ void scale_kernel(float* x, float s, int64_t n) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  PG_GRID_STRIDE(i, n) x[i] = __fmul_rn(x[i], s);
}
__global__ void add_bias_kernel(float* y, const void* bias, int bias_f16, int64_t rows, int64_t d) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  PG_GRID_STRIDE(i, rows * d) {
    const int64_t c = i % d;
    y[i] += bias_f16 ? h2f(static_cast<const uint16_t*>(bias)[c]) : static_cast<const float*>(bias)[c];
  }
}

// act(gate)·up through glu_act.cuh, the expression the fused decode GEMV + GLU (gemv_q8.cu) shares.
__global__ void glu_kernel(const float* gate, const float* up, float* y, int64_t n, int act) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  PG_GRID_STRIDE(i, n) y[i] = glu_act(gate[i], up[i], act);
}

__global__ void mul_sigmoid_kernel(float* x, const float* gate, int64_t n) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  PG_GRID_STRIDE(i, n) x[i] = __fmul_rn(x[i], __fdiv_rn(1.0f, 1.0f + expf(-gate[i])));
}

__global__ void softcap_kernel(float* x, float cap, int64_t n) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  PG_GRID_STRIDE(i, n) x[i] = __fmul_rn(cap, tanhf(__fdiv_rn(x[i], cap)));
}

__global__ void gather_cols_kernel(const float* src, int64_t src_cols, int group, int col0, float* dst, int64_t dst_cols,
                                   int64_t rows, int64_t w) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  PG_GRID_STRIDE(i, rows * dst_cols) {
    const int64_t r = i / dst_cols, c = i % dst_cols, g = c / w, k = c % w;
    dst[i] = src[r * src_cols + g * group + col0 + k];
  }
}

// ---- RoPE ---------------------------------------------------------------------------------------------

// blockIdx.x = row; threadIdx.x = rotation pair i (< n_rot/2), threadIdx.y strides over heads.
__global__ void rope_kernel(float* x, int64_t x_stride, const int32_t* pos, int n_heads, int head_dim, int n_rot,
                            float theta_scale, int neox) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int r = static_cast<int>(blockIdx.x);
  const int half = n_rot / 2;
  for (int i = static_cast<int>(threadIdx.x); i < half; i += blockDim.x) {
    // The running product θ_i = pos·scale^i, multiplied in the same order as ggml and the CPU backend.
    float theta = static_cast<float>(pos[r]);
    for (int k = 0; k < i; ++k) theta = __fmul_rn(theta, theta_scale);
    const float c = cosf(theta), s = sinf(theta);
    const int i0 = neox ? i : 2 * i;
    const int i1 = neox ? i + half : 2 * i + 1;
    for (int h = static_cast<int>(threadIdx.y); h < n_heads; h += blockDim.y) {
      float* v = x + static_cast<int64_t>(r) * x_stride + static_cast<int64_t>(h) * head_dim;
      const float a = v[i0], b = v[i1];
      v[i0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
      v[i1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
  }
}

// ---- q/k RMSNorm + RoPE in one launch ---------------------------------------------------------------------

constexpr int kQkWarps = 4;  // heads per block, one warp each

// Backend::qk_norm_rope for every head of q and k of every row, in place.
// Contract: grid (n rows, ceil((n_head + n_head_kv) / kQkWarps)), block kQkWarps × 32 threads; block (r, y) owns
// the heads y·kQkWarps + warp of row r, numbered q heads first, then k heads. head_dim ≤ kQkNormRopeMaxHeadDim,
// n_rot even ≤ head_dim. A null weight means no norm for that tensor (rope only).
// Bit-identical to rms_norm_kernel (the 32-thread launch that rms_norm uses for rows below 512) followed by
// rope_kernel, because each value goes through the same operations in the same order:
//  - norm: lane l sums (double) __fmul_rn(v, v) over i = l, l+32, … in that order, warp_sum (block_sum's one-warp
//    case), then the same float expressions for mean, scale and the weight product;
//  - rope: θ_i = pos·scale^i by the same running product of __fmul_rn, cosf/sinf, the same four rounded
//    products and sums, taken on the normalised values exactly as rms_norm would have stored them.
// Why a θ table per block: the running product costs i multiplies for pair i; one table serves the block's heads
// (rope_kernel shares it over all heads of a row in the same way).
__global__ void __launch_bounds__(kQkWarps * 32)
    qk_norm_rope_kernel(float* q,                  // (n, q_stride) F32, heads at h·head_dim
                        int64_t q_stride,          // floats per q row
                        float* k,                  // (n, k_stride) F32
                        int64_t k_stride,          // floats per k row
                        const void* q_w,           // (head_dim) F32/F16 q norm weight, or null
                        int q_w_f16,               // q_w is F16
                        const void* k_w,           // (head_dim) F32/F16 k norm weight, or null
                        int k_w_f16,               // k_w is F16
                        const int32_t* pos,        // I32 (n) rotation positions
                        int n_head, int n_head_kv, int head_dim, int n_rot,
                        float theta_scale,         // base^(−2/n_rot), computed on the host as for rope
                        int neox, float eps) {
  constexpr int kPer = kQkNormRopeMaxHeadDim / 32;  // values of a head per lane
  __shared__ float cos_t[kQkNormRopeMaxHeadDim / 2], sin_t[kQkNormRopeMaxHeadDim / 2];  // (n_rot/2): per pair
  __shared__ float buf[kQkWarps][kQkNormRopeMaxHeadDim];                                 // (head_dim) per warp
  const int r = static_cast<int>(blockIdx.x);
  const int half = n_rot / 2;
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int hg = static_cast<int>(blockIdx.y) * kQkWarps + warp;
  const bool has_head = hg < n_head + n_head_kv;
  const bool is_q = hg < n_head;
  float* x = is_q ? q + static_cast<int64_t>(r) * q_stride + static_cast<int64_t>(hg) * head_dim
                  : k + static_cast<int64_t>(r) * k_stride + static_cast<int64_t>(hg - n_head) * head_dim;
  const void* w = is_q ? q_w : k_w;
  const int w_f16 = is_q ? q_w_f16 : k_w_f16;
  // The head and its weights are loaded into registers before the θ table is built, so their memory latency
  // overlaps the running product and sin/cos (a decode step has one row: this kernel is latency, not bandwidth).
  // Weights stay raw bits until after the table: an F16 conversion next to its load would wait for it.
  float v[kPer];
  uint32_t wbits[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    const bool in = has_head && i < head_dim;
    v[j] = in ? x[i] : 0.0f;
    wbits[j] = in && w ? (w_f16 ? static_cast<uint32_t>(static_cast<const uint16_t*>(w)[i]) : static_cast<const uint32_t*>(w)[i]) : 0u;
  }
  for (int i = static_cast<int>(threadIdx.x); i < half; i += blockDim.x) {
    float theta = static_cast<float>(pos[r]);
    for (int j = 0; j < i; ++j) theta = __fmul_rn(theta, theta_scale);
    cos_t[i] = cosf(theta);
    sin_t[i] = sinf(theta);
  }
  __syncthreads();  // the only block-wide barrier: warps without a head leave after it
  if (!has_head) return;
  float* b = buf[warp];
  if (w) {
    // rms_norm_kernel's per-thread sum for 32 threads: lane l adds i = l, l+32, … in increasing order.
    double s = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (lane + 32 * j < head_dim) s += static_cast<double>(__fmul_rn(v[j], v[j]));
    s = warp_sum(s);
    const float mean = static_cast<float>(s / static_cast<double>(head_dim));
    const float sc = 1.0f / sqrtf(mean + eps);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const float wv = w_f16 ? h2f(wbits[j]) : __uint_as_float(wbits[j]);
      v[j] = __fmul_rn(__fmul_rn(v[j], sc), wv);
    }
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (lane + 32 * j < head_dim) b[lane + 32 * j] = v[j];
  __syncwarp();  // pairs cross lanes: every lane's (normalised) values are in b
  for (int i = lane; i < half; i += 32) {
    const int i0 = neox ? i : 2 * i;
    const int i1 = neox ? i + half : 2 * i + 1;
    const float a = b[i0], bb = b[i1], c = cos_t[i], sn = sin_t[i];
    x[i0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, sn));
    x[i1] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(bb, c));
  }
  if (w)  // dims past n_rot pass through the rotation: they only need the norm's result
    for (int i = n_rot + lane; i < head_dim; i += 32) x[i] = b[i];
}

// ---- KV store -----------------------------------------------------------------------------------------

template <bool F16>
__global__ void kv_store_kernel(void* kc, void* vc, const float* k, const float* v, int64_t kw, int64_t vw, const int32_t* cells) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int r = static_cast<int>(blockIdx.x);
  const int64_t cell = cells[r];
  for (int64_t i = threadIdx.x; i < kw + vw; i += blockDim.x) {
    const bool is_v = i >= kw;
    const int64_t j = is_v ? i - kw : i;
    const int64_t w = is_v ? vw : kw;
    const float val = (is_v ? v : k)[static_cast<int64_t>(r) * w + j];
    void* dst = is_v ? vc : kc;
    if (F16)
      static_cast<__half*>(dst)[cell * w + j] = __float2half_rn(val);
    else
      static_cast<float*>(dst)[cell * w + j] = val;
  }
}

}  // namespace

void get_rows(DType type, const void* table, size_t row_bytes, int64_t n_rows, int64_t d, const int32_t* ids, int n, float* out,
              int64_t out_stride, cudaStream_t stream) {
  if (n <= 0) return;
  const auto* t = static_cast<const uint8_t*>(table);
  for (int i0 = 0; i0 < n; i0 += 65535) {
    const int cnt = std::min(65535, n - i0);
    float* o = out + static_cast<int64_t>(i0) * out_stride;
    const int32_t* id = ids + i0;
    if (type == DType::F32 || type == DType::F16 || type == DType::BF16) {
      const dim3 grid(static_cast<unsigned>(std::min<int64_t>((d + kThreads - 1) / kThreads, 64)), static_cast<unsigned>(cnt));
      if (type == DType::F32)
        launch(get_rows_plain_kernel<0>, grid, kThreads, 0, stream, t, row_bytes, n_rows, d, id, o, out_stride);
      else if (type == DType::F16)
        launch(get_rows_plain_kernel<1>, grid, kThreads, 0, stream, t, row_bytes, n_rows, d, id, o, out_stride);
      else
        launch(get_rows_plain_kernel<2>, grid, kThreads, 0, stream, t, row_bytes, n_rows, d, id, o, out_stride);
    } else {
      const bool ok = dispatch_type(type, [&]<class Q>() {
        PG_CHECK(d % Q::kElems == 0, "get_rows: row width is not a multiple of the block size");
        const dim3 grid(static_cast<unsigned>(std::min<int64_t>((d / 16 + 127) / 128, 64)), static_cast<unsigned>(cnt));
        launch(get_rows_quant_kernel<Q>, grid, 128, 0, stream, t, row_bytes, n_rows, d, id, o, out_stride);
      });
      PG_CHECK(ok, "CUDA get_rows: type " + std::string(dtype_name(type)) + " is not supported");
    }
    check_launch("get_rows");
  }
}

void rms_norm(const float* x, const void* w, bool w_f16, float* y, int64_t rows, int64_t d, float eps, cudaStream_t stream,
              const NormQuant* quant) {
  if (rows <= 0) return;
  const int threads = d >= 2048 ? 512 : d >= 512 ? 128 : 32;
  // The quantized rows are indexed by blockIdx.x: one launch only.
  PG_CHECK(!quant || rows <= 0x7fffffff, "rms_norm: too many rows to quantize in one launch");
  for (int64_t r0 = 0; r0 < rows; r0 += 0x7fffffff) {
    const int64_t cnt = std::min<int64_t>(0x7fffffff, rows - r0);
    launch_rms_norm(static_cast<unsigned>(cnt), threads, x + r0 * d, w, w_f16 ? 1 : 0, y + r0 * d, d, eps, nullptr, nullptr, quant, stream);
    check_launch("rms_norm");
  }
}

void add_rms_norm(float* x, const float* r, const void* w, bool w_f16, float* y, int64_t rows, int64_t d, float eps,
                  cudaStream_t stream, const NormQuant* quant) {
  if (rows <= 0) return;
  const int threads = d >= 2048 ? 512 : d >= 512 ? 128 : 32;  // as rms_norm: the same per-thread sums
  PG_CHECK(!quant || rows <= 0x7fffffff, "add_rms_norm: too many rows to quantize in one launch");
  for (int64_t r0 = 0; r0 < rows; r0 += 0x7fffffff) {
    const int64_t cnt = std::min<int64_t>(0x7fffffff, rows - r0);
    launch_rms_norm(static_cast<unsigned>(cnt), threads, x + r0 * d, w, w_f16 ? 1 : 0, y + r0 * d, d, eps, r + r0 * d, x + r0 * d, quant,
                    stream);
    check_launch("add_rms_norm");
  }
}

void add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch(add_kernel, grid_for(n), kThreads, 0, stream, a, b, y, n);
  check_launch("add");
}

void scale(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch(scale_kernel, grid_for(n), kThreads, 0, stream, x, s, n);
  check_launch("scale");
}

void add_bias(float* y, const void* bias, bool bias_f16, int64_t rows, int64_t d, cudaStream_t stream) {
  if (rows * d <= 0) return;
  launch(add_bias_kernel, grid_for(rows * d), kThreads, 0, stream, y, bias, bias_f16 ? 1 : 0, rows, d);
  check_launch("add_bias");
}

void glu(const float* gate, const float* up, float* y, int64_t n, int act, cudaStream_t stream) {
  if (n <= 0) return;
  launch(glu_kernel, grid_for(n), kThreads, 0, stream, gate, up, y, n, act);
  check_launch("glu");
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch(mul_sigmoid_kernel, grid_for(n), kThreads, 0, stream, x, gate, n);
  check_launch("mul_sigmoid");
}

// One block per row: the highest value's column, ties to the lowest column, NaNs never win, a NaN in
// column 0 gives 0 — the engine's host argmax (a strict > scan from column 0) exactly.
__device__ __forceinline__ bool argmax_better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

// Why 1024 threads and float4 loads: one block reads a whole vocabulary row (151 936 floats = 594 KB for
// Qwen3); with 256 threads and scalar loads each thread issued ~600 dependent-latency loads (226 µs per
// decode step on an H200, device run 26); 1024 threads × 4 independent float4 loads in flight per
// iteration keep the SM's memory pipe full. The comparison is a strict total order (value, then column),
// so the scan order does not change the result.
__global__ void __launch_bounds__(1024) argmax_rows_kernel(const float* x, int64_t cols, int32_t* ids) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  const int tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  int64_t i0 = 0;  // columns below i0 went through the vector loop
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    const int64_t n4 = cols / 4;
    constexpr int U = 4;  // float4 loads in flight per thread
    int64_t j = tid;
    for (; j + static_cast<int64_t>(U - 1) * nt < n4; j += static_cast<int64_t>(U) * nt) {
      float4 v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = __ldg(r4 + j + static_cast<int64_t>(u) * nt);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = static_cast<int>(4 * (j + static_cast<int64_t>(u) * nt));
        if (argmax_better(v[u].x, c, bv, bi)) bv = v[u].x, bi = c;
        if (argmax_better(v[u].y, c + 1, bv, bi)) bv = v[u].y, bi = c + 1;
        if (argmax_better(v[u].z, c + 2, bv, bi)) bv = v[u].z, bi = c + 2;
        if (argmax_better(v[u].w, c + 3, bv, bi)) bv = v[u].w, bi = c + 3;
      }
    }
    for (; j < n4; j += nt) {
      const float4 v = __ldg(r4 + j);
      const int c = static_cast<int>(4 * j);
      if (argmax_better(v.x, c, bv, bi)) bv = v.x, bi = c;
      if (argmax_better(v.y, c + 1, bv, bi)) bv = v.y, bi = c + 1;
      if (argmax_better(v.z, c + 2, bv, bi)) bv = v.z, bi = c + 2;
      if (argmax_better(v.w, c + 3, bv, bi)) bv = v.w, bi = c + 3;
    }
    i0 = 4 * n4;
  }
  for (int64_t i = i0 + tid; i < cols; i += nt) {
    const float v = row[i];
    if (argmax_better(v, static_cast<int>(i), bv, bi)) bv = v, bi = static_cast<int>(i);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (argmax_better(ov, oi, bv, bi)) bv = ov, bi = oi;
  }
  __shared__ float sv[32];
  __shared__ int si[32];
  const int warp = tid >> 5, lane = tid & 31;
  if (lane == 0) sv[warp] = bv, si[warp] = bi;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (nt >> 5); ++w)
      if (argmax_better(sv[w], si[w], bv, bi)) bv = sv[w], bi = si[w];
    ids[blockIdx.x] = (bi == 0x7fffffff || isnan(row[0])) ? 0 : bi;
  }
}

void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* ids, cudaStream_t stream) {
  if (rows <= 0) return;
  // Small rows (tests, tiny vocabularies) do not need a 1024-thread block.
  const int threads = cols >= 16384 ? 1024 : 256;
  launch(argmax_rows_kernel, static_cast<unsigned>(rows), threads, 0, stream, x, cols, ids);
  check_launch("argmax_rows");
}

void softcap(float* x, float cap, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch(softcap_kernel, grid_for(n), kThreads, 0, stream, x, cap, n);
  check_launch("softcap");
}

void gather_cols(const float* src, int64_t src_cols, int group, int col0, float* dst, int64_t dst_cols, int64_t rows,
                 cudaStream_t stream) {
  if (rows * dst_cols <= 0) return;
  const int64_t groups = src_cols / group;
  const int64_t w = dst_cols / groups;
  launch(gather_cols_kernel, grid_for(rows * dst_cols), kThreads, 0, stream, src, src_cols, group, col0, dst, dst_cols, rows, w);
  check_launch("gather_cols");
}

void rope(float* x, int64_t x_stride, const int32_t* pos, int n, int n_heads, int head_dim, int n_rot, float theta_scale, bool neox,
          cudaStream_t stream) {
  if (n <= 0 || n_rot < 2) return;
  const int pairs = std::min(n_rot / 2, 256);
  const dim3 block(static_cast<unsigned>(pairs), static_cast<unsigned>(std::max(1, std::min(n_heads, 256 / pairs))));
  launch(rope_kernel, static_cast<unsigned>(n), block, 0, stream, x, x_stride, pos, n_heads, head_dim, n_rot, theta_scale, neox ? 1 : 0);
  check_launch("rope");
}

void qk_norm_rope(float* q, int64_t q_stride, float* k, int64_t k_stride, const void* q_w, bool q_w_f16, const void* k_w, bool k_w_f16,
                  const int32_t* pos, int n, int n_head, int n_head_kv, int head_dim, int n_rot, float theta_scale, bool neox,
                  float eps, cudaStream_t stream) {
  if (n <= 0 || n_head + n_head_kv <= 0) return;
  PG_CHECK(head_dim > 0 && head_dim <= kQkNormRopeMaxHeadDim, "qk_norm_rope: head_dim above the fused kernel's limit");
  PG_CHECK(n_rot >= 0 && n_rot <= head_dim && n_rot % 2 == 0, "qk_norm_rope: invalid n_rot");
  const int groups = (n_head + n_head_kv + kQkWarps - 1) / kQkWarps;
  PG_CHECK(groups <= 65535, "qk_norm_rope: too many heads");
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(groups));
  qk_norm_rope_kernel<<<grid, kQkWarps * 32, 0, stream>>>(q, q_stride, k, k_stride, q_w, q_w_f16 ? 1 : 0, k_w, k_w_f16 ? 1 : 0, pos,
                                                          n_head, n_head_kv, head_dim, n_rot, theta_scale, neox ? 1 : 0, eps);
  check_launch("qk_norm_rope");
}

void kv_store(void* k_cache, void* v_cache, bool kv_f16, const float* k, const float* v, int64_t k_width, int64_t v_width,
              const int32_t* cells, int n, cudaStream_t stream) {
  if (n <= 0) return;
  if (kv_f16)
    launch(kv_store_kernel<true>, static_cast<unsigned>(n), kThreads, 0, stream, k_cache, v_cache, k, v, k_width, v_width, cells);
  else
    launch(kv_store_kernel<false>, static_cast<unsigned>(n), kThreads, 0, stream, k_cache, v_cache, k, v, k_width, v_width, cells);
  check_launch("kv_store");
}

namespace {
std::atomic<bool> g_pdl_launches{false};
}  // namespace
bool pdl_launches() { return g_pdl_launches.load(std::memory_order_relaxed); }
void set_pdl_launches(bool on) { g_pdl_launches.store(on, std::memory_order_relaxed); }

}  // namespace pg::cuda
