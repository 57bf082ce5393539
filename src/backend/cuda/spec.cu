// Speculative-verification ops (backend.h): per-row top-k with log-softmax values, and K/V row copies
// inside a layer's cache that compact an accepted tree path. Both read their per-step inputs (logits,
// cell lists) from device tensors and launch with shapes fixed by the tensors' sizes, so they can sit
// inside a recorded step graph.
#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace pg::cuda {
namespace {

constexpr int kTopkThreads = 1024;
constexpr int kTopkMax = 64;

// Order-preserving key of a non-NaN float (a larger key is a larger value); −0 is taken as +0 because the
// CPU reference compares values with `>`, for which they are equal (then the lower column wins).
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* sh) {
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // sh may still be read by a previous reduction
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  T r = sh[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) r = op(r, sh[w]);  // fixed order: deterministic
  return r;
}

// One block per row. (1) max and Σ exp(x − max) in double (NaN skipped), as the CPU; (2) the k-th largest
// key by a 4-pass radix select (8 bits per pass, histogram in shared memory); (3) the values above it,
// then the lowest columns among those equal to it (an in-order scan), so ties go to the lower column;
// (4) the ≤ 64 winners ranked in shared memory.
__global__ void __launch_bounds__(kTopkThreads) topk_rows_kernel(const float* __restrict__ x, int64_t cols, int k, int32_t* __restrict__ ids,
                                                                 float* __restrict__ logprobs) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  __shared__ double sh_d[32];
  __shared__ float sh_f[32];
  __shared__ int sh_i[32];
  __shared__ int hist[256];
  __shared__ uint32_t sh_prefix;
  __shared__ int sh_need, sh_count;
  __shared__ float cand_v[kTopkMax];
  __shared__ int cand_i[kTopkMax];

  float mx = -INFINITY;
  int valid = 0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = row[i];
    if (v == v) {
      mx = fmaxf(mx, v);
      ++valid;
    }
  }
  mx = block_reduce(mx, [](float a, float b) { return fmaxf(a, b); }, sh_f);
  valid = block_reduce(valid, [](int a, int b) { return a + b; }, sh_i);
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float v = row[i];
    if (v == v) sum += exp(static_cast<double>(v) - static_cast<double>(mx));
  }
  sum = block_reduce(sum, [](double a, double b) { return a + b; }, sh_d);
  const float lse = mx + static_cast<float>(log(sum));
  const int take = min(k, valid);  // fewer non-NaN values than k: all of them, then the last one repeated

  // Radix select of the take-th largest key.
  if (threadIdx.x == 0) sh_prefix = 0, sh_need = take, sh_count = 0;
  __syncthreads();
  uint32_t mask = 0;
  for (int shift = 24; shift >= 0 && take > 0; shift -= 8) {
    for (int b = static_cast<int>(threadIdx.x); b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = sh_prefix;
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
      const float v = row[i];
      if (v != v) continue;
      const uint32_t key = order_key(v);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int need = sh_need, b = 255;
      for (; b > 0 && hist[b] < need; --b) need -= hist[b];
      sh_need = need;  // keys equal to the new prefix still to take (all above it are taken)
      sh_prefix = prefix | (static_cast<uint32_t>(b) << shift);
    }
    mask |= 255u << shift;
    __syncthreads();
  }
  const uint32_t thr = sh_prefix;
  const int ties = sh_need;  // how many keys == thr to take, lowest columns first
  // Keys above the threshold: fewer than take, any order (ranked below).
  for (int64_t i = threadIdx.x; i < cols && take > 0; i += blockDim.x) {
    const float v = row[i];
    if (v == v && order_key(v) > thr) {
      const int slot = atomicAdd(&sh_count, 1);
      cand_v[slot] = v, cand_i[slot] = static_cast<int>(i);
    }
  }
  __syncthreads();
  // Keys equal to the threshold, in column order, until `ties` are taken.
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5), nw = static_cast<int>(blockDim.x >> 5);
  int base = sh_count, left = ties;
  for (int64_t c0 = 0; c0 < cols && left > 0; c0 += blockDim.x) {
    const int64_t i = c0 + threadIdx.x;
    const float v = i < cols ? row[i] : NAN;
    const bool tie = v == v && order_key(v) == thr;
    const uint32_t bal = __ballot_sync(0xffffffffu, tie);
    __syncthreads();
    if (lane == 0) sh_i[warp] = __popc(bal);
    __syncthreads();
    int before = 0, total = 0;
    for (int w = 0; w < nw; ++w) {
      if (w < warp) before += sh_i[w];
      total += sh_i[w];
    }
    const int rank = before + __popc(bal & ((1u << lane) - 1u));
    if (tie && rank < left) cand_v[base + rank] = v, cand_i[base + rank] = static_cast<int>(i);
    const int got = min(left, total);
    base += got;
    left -= got;
  }
  __syncthreads();
  // Rank: descending value, ties to the lower column.
  if (static_cast<int>(threadIdx.x) < take) {
    const float v = cand_v[threadIdx.x];
    const int c = cand_i[threadIdx.x];
    int r = 0;
    for (int j = 0; j < take; ++j) r += (cand_v[j] > v || (cand_v[j] == v && cand_i[j] < c)) ? 1 : 0;
    ids[static_cast<int64_t>(blockIdx.x) * k + r] = c;
    logprobs[static_cast<int64_t>(blockIdx.x) * k + r] = v - lse;
  }
  __syncthreads();
  if (static_cast<int>(threadIdx.x) >= take && static_cast<int>(threadIdx.x) < k) {  // padding, as the CPU
    int32_t* id = ids + static_cast<int64_t>(blockIdx.x) * k;
    const int last = take > 0 ? id[take - 1] : 0;
    id[threadIdx.x] = last;
    logprobs[static_cast<int64_t>(blockIdx.x) * k + threadIdx.x] = row[last] - lse;
  }
}

// dst[i] ← src[i] for i in order, per U-byte unit of the row: each thread owns one unit column of both
// caches and walks the copy list itself, so chained copies (2→1 then 3→2) see each other's results
// without any synchronisation between threads. To keep loads in flight, the list is cut into waves of
// up to kWave copies in which no copy reads a cell written earlier in the same wave: a wave loads all its
// sources, then stores in order (a later store to the same cell wins, as in sequential order; a read of a
// cell that a later copy of the wave overwrites happens first in both). Every thread cuts the same waves.
// Out-of-range cells (the device cannot throw) are skipped.
constexpr int kWave = 8;

template <class U>
__global__ void kv_copy_kernel(uint8_t* __restrict__ k, uint8_t* __restrict__ v, int64_t k_units, int64_t v_units, int64_t n_cells,
                               const int32_t* __restrict__ src, const int32_t* __restrict__ dst, int n) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= k_units + v_units) return;
  const bool is_v = t >= k_units;
  U* base = reinterpret_cast<U*>(is_v ? v : k);
  const int64_t w = is_v ? v_units : k_units, col = is_v ? t - k_units : t;
  auto ok = [&](int c) { return c >= 0 && c < n_cells; };
  for (int i0 = 0; i0 < n;) {
    int s[kWave], d[kWave];
    int m = 0;
    for (; m < kWave && i0 + m < n; ++m) {
      const int sm = __ldg(src + i0 + m), dm = __ldg(dst + i0 + m);
      bool dep = false;
      for (int j = 0; j < m; ++j) dep |= d[j] == sm;
      if (dep) break;
      s[m] = sm, d[m] = dm;
    }
    U val[kWave];
#pragma unroll
    for (int j = 0; j < kWave; ++j)
      if (j < m && ok(s[j]) && ok(d[j])) val[j] = base[static_cast<int64_t>(s[j]) * w + col];
#pragma unroll
    for (int j = 0; j < kWave; ++j)
      if (j < m && ok(s[j]) && ok(d[j]) && s[j] != d[j]) base[static_cast<int64_t>(d[j]) * w + col] = val[j];
    i0 += m;
  }
}

}  // namespace

void topk_rows(const float* x, int64_t rows, int64_t cols, int k, int32_t* ids, float* logprobs, cudaStream_t stream) {
  if (rows <= 0) return;
  launch(topk_rows_kernel, static_cast<unsigned>(rows), kTopkThreads, 0, stream, x, cols, k, ids, logprobs);
  check_launch("topk_rows");
}

void kv_copy(void* k_cache, void* v_cache, size_t k_row_bytes, size_t v_row_bytes, int64_t n_cells, const int32_t* src, const int32_t* dst,
             int n, cudaStream_t stream) {
  if (n <= 0) return;
  auto run = [&]<class U>() {
    const int64_t ku = static_cast<int64_t>(k_row_bytes / sizeof(U)), vu = static_cast<int64_t>(v_row_bytes / sizeof(U));
    const int64_t total = ku + vu;
    launch(kv_copy_kernel<U>, static_cast<unsigned>((total + 255) / 256), 256, 0, stream, static_cast<uint8_t*>(k_cache), static_cast<uint8_t*>(v_cache),
                                                                                       ku, vu, n_cells, src, dst, n);
  };
  const size_t g = k_row_bytes | v_row_bytes | reinterpret_cast<uintptr_t>(k_cache) | reinterpret_cast<uintptr_t>(v_cache);
  if (g % 16 == 0)
    run.template operator()<uint4>();
  else if (g % 4 == 0)
    run.template operator()<uint32_t>();
  else
    run.template operator()<uint16_t>();
  check_launch("kv_copy");
}

}  // namespace pg::cuda
