// Mixture of experts on the device: top-k routing, grouping of the routed (token, expert) entries by
// expert for the grouped GEMM, and the weighted combination of the expert outputs. Nothing here needs
// the host to see the routing (no synchronisation inside a forward).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int kMaxExperts = 1024;
constexpr int kMaxK = 32;

// One warp per row. Ties in probability go to the lower expert id, as CpuBackend's partial_sort.
__global__ void moe_route_kernel(const float* logits, int n, int n_expert, int k, int sigmoid, int norm, float scale, int32_t* ids,
                                 float* weights) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  extern __shared__ float probs[];  // (warps per block, n_expert)
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int r = static_cast<int>(blockIdx.x) * static_cast<int>(blockDim.x >> 5) + warp;
  if (r >= n) return;
  float* p = probs + warp * n_expert;
  const float* l = logits + static_cast<int64_t>(r) * n_expert;
  if (sigmoid) {
    for (int e = lane; e < n_expert; e += 32) p[e] = __fdiv_rn(1.0f, 1.0f + expf(-l[e]));
  } else {
    float mx = -INFINITY;
    for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, l[e]);
    mx = warp_max(mx);
    double sum = 0;
    for (int e = lane; e < n_expert; e += 32) {
      const float v = expf(l[e] - mx);
      p[e] = v;
      sum += v;
    }
    sum = warp_sum(sum);
    for (int e = lane; e < n_expert; e += 32) p[e] = static_cast<float>(static_cast<double>(p[e]) / sum);
  }
  __syncwarp();
  float sel_p = 0.0f;  // lane j keeps the j-th selection
  int sel_e = 0;
  for (int j = 0; j < k; ++j) {
    float bp = -INFINITY;
    int be = 0x7fffffff;
    for (int e = lane; e < n_expert; e += 32) {
      const float v = p[e];
      if (v > bp || (v == bp && e < be)) bp = v, be = e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(0xffffffffu, bp, o);
      const int oe = __shfl_xor_sync(0xffffffffu, be, o);
      if (op > bp || (op == bp && oe < be)) bp = op, be = oe;
    }
    if (be >= n_expert) be = 0;  // only with NaN logits: keep the index valid
    if (lane == j) sel_p = bp, sel_e = be;
    __syncwarp();
    if (lane == 0) p[be] = -INFINITY;  // out of the running (its value is kept in sel_p)
    __syncwarp();
  }
  // Sum of the selected probabilities in selection order, as the CPU does.
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += __shfl_sync(0xffffffffu, sel_p, j);
  sum = fmaxf(sum, 6.103515625e-5f);
  if (lane < k) {
    float w = sel_p;
    if (norm) w = __fdiv_rn(w, sum);
    if (scale != 0.0f) w = __fmul_rn(w, scale);
    ids[static_cast<int64_t>(r) * k + lane] = sel_e;
    weights[static_cast<int64_t>(r) * k + lane] = w;
  }
}

__global__ void moe_sort_kernel(const int32_t* ids, int n_entries, int k, int n_expert, int32_t* sorted_rows, int32_t* sorted_entry,
                                int32_t* tiles, int max_tiles) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  __shared__ int cnt[kMaxExperts], cursor[kMaxExperts], tile_off[kMaxExperts];
  __shared__ int total_tiles;
  for (int e = static_cast<int>(threadIdx.x); e < n_expert; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < n_entries; i += blockDim.x) {
    const int e = ids[i];
    if (e >= 0 && e < n_expert) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int off = 0, toff = 0;
    for (int e = 0; e < n_expert; ++e) {
      cursor[e] = off;
      tile_off[e] = toff;
      off += cnt[e];
      toff += (cnt[e] + kGemmTileN - 1) / kGemmTileN;
    }
    total_tiles = toff;
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < n_expert; e += blockDim.x) {
    const int first = cursor[e];
    for (int t = 0; t * kGemmTileN < cnt[e]; ++t) {
      int32_t* tt = tiles + 3 * (tile_off[e] + t);
      tt[0] = e;
      tt[1] = first + t * kGemmTileN;
      tt[2] = min(kGemmTileN, cnt[e] - t * kGemmTileN);
    }
  }
  for (int t = total_tiles + static_cast<int>(threadIdx.x); t < max_tiles; t += blockDim.x) tiles[3 * t + 2] = 0;
  __syncthreads();  // cursor[] is read above before the scatter moves it
  for (int i = static_cast<int>(threadIdx.x); i < n_entries; i += blockDim.x) {
    const int e = ids[i];
    if (e < 0 || e >= n_expert) continue;
    const int slot = atomicAdd(&cursor[e], 1);
    sorted_rows[slot] = i / k;
    sorted_entry[slot] = i;
  }
}

__global__ void moe_combine_kernel(const float* t, const int32_t* ids, const float* weights, int k, int64_t d, float* out) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  __shared__ int order[kMaxK];
  const int r = static_cast<int>(blockIdx.y);
  if (threadIdx.x == 0) {
    // Ascending expert id: the order in which the CPU backend accumulates the experts of a row.
    for (int j = 0; j < k; ++j) order[j] = j;
    for (int a = 1; a < k; ++a)
      for (int b = a; b > 0 && ids[static_cast<int64_t>(r) * k + order[b]] < ids[static_cast<int64_t>(r) * k + order[b - 1]]; --b) {
        const int tmp = order[b];
        order[b] = order[b - 1];
        order[b - 1] = tmp;
      }
  }
  __syncthreads();
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < d; c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int j = 0; j < k; ++j) {
      const int jj = order[j];
      s += weights[static_cast<int64_t>(r) * k + jj] * t[(static_cast<int64_t>(r) * k + jj) * d + c];
    }
    out[static_cast<int64_t>(r) * d + c] = s;
  }
}

}  // namespace

void moe_route(const float* logits, int n, int n_expert, int k, bool sigmoid, bool norm, float scale, int32_t* ids, float* weights,
               cudaStream_t stream) {
  if (n <= 0) return;
  PG_CHECK(k >= 1 && k <= kMaxK && k <= n_expert, "moe_route: k=" + std::to_string(k) + " unsupported (1..32, at most n_expert)");
  PG_CHECK(n_expert <= kMaxExperts, "moe_route: at most 1024 experts");
  const int warps = 4;
  const size_t smem = static_cast<size_t>(warps) * n_expert * sizeof(float);
  launch(moe_route_kernel, static_cast<unsigned>(ceil_div(n, warps)), warps * 32, smem, stream, logits, n, n_expert, k, sigmoid ? 1 : 0,
                                                                                           norm ? 1 : 0, scale, ids, weights);
  check_launch("moe_route");
}

int moe_max_tiles(int n_entries, int n_expert) { return ceil_div(n_entries, kGemmTileN) + std::min(n_entries, n_expert); }

size_t moe_sort_scratch_bytes(int) { return 0; }

void moe_sort(const int32_t* ids, int n_entries, int k, int n_expert, int32_t* sorted_rows, int32_t* sorted_entry, int32_t* tiles,
              int max_tiles, void*, cudaStream_t stream) {
  PG_CHECK(n_expert <= kMaxExperts, "moe: at most 1024 experts");
  launch(moe_sort_kernel, 1, 1024, 0, stream, ids, n_entries, k, n_expert, sorted_rows, sorted_entry, tiles, max_tiles);
  check_launch("moe_sort");
}

void moe_combine(const float* t, const int32_t* ids, const float* weights, int n, int k, int64_t d, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  PG_CHECK(k <= kMaxK, "moe_combine: k too large");
  for (int r0 = 0; r0 < n; r0 += 65535) {
    const int cnt = std::min(65535, n - r0);
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>((d + 255) / 256, 16)), static_cast<unsigned>(cnt));
    launch(moe_combine_kernel, grid, 256, 0, stream, t + static_cast<int64_t>(r0) * k * d, ids + static_cast<int64_t>(r0) * k,
                                                weights + static_cast<int64_t>(r0) * k, k, d, out + static_cast<int64_t>(r0) * d);
    check_launch("moe_combine");
  }
}

}  // namespace pg::cuda
