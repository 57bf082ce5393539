// Decode GEMV: y (n ≤ 8, M) = x (n, K) · Wᵀ straight from the GGUF blocks, FP32 arithmetic.
//
// Decode is memory-bound: every weight byte is read once per step, so the kernel is built around the
// weight stream.
//  - A block (4 warps) owns R consecutive weight rows; its warps split each row's K range into tiles
//    (tile = the blocks that hold 32 chunks of 32 weights, e.g. 4 Q4_K superblocks = 576 bytes) and
//    stride over them.
//  - Each warp streams its tiles global → shared with cp.async, S stages deep, all R rows at once, so
//    S·R tiles of bytes are in flight per warp with no registers held; copies are 16 bytes wide
//    whenever rows and tiles are 16-byte multiples (8/4 otherwise, 2-byte only for odd layouts).
//  - Lane l decodes chunk l of the tile (32 weights: two runs of 16 that share their bytes) to FP32
//    and multiplies it with the matching 32 activations, loaded as float4 from global memory (L1/L2
//    resident: x is at most 8 rows × K floats). R rows share each activation load.
//  - Partial sums are reduced over the warp (shuffles) and then over the 4 warps (shared memory), in a
//    fixed order, so results are deterministic.
// Activations stay FP32 here (the exact path and the reference for the tensor-core path). A q8_1
// activation variant (integer dot products, 4× less activation traffic) would plug in as another
// decoder/inner-product pair; see README.md.
#include <algorithm>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int kWarps = 4;

struct GemvParams {
  const uint8_t* w;
  size_t row_bytes;
  int64_t M;
  int nblocks;  // blocks per row
  int n_tiles;  // tiles per row
  const float* x;
  int64_t x_stride;
  float* y;
  int64_t y_stride;
  int n;
  const int32_t* expert_ids;
  size_t expert_bytes;
  int x_div;
  int g_base;  // first group of this launch (gridDim.y is limited to 65535)
  int unit;    // copy unit in bytes
};

template <class Q>
struct GemvShape {
  static constexpr int kChunksPerBlock = Q::kElems / 32;
  static constexpr int kTileBlocks = 32 / kChunksPerBlock;
  static constexpr int kTile = kTileBlocks * Q::kBytes;
  static constexpr int kTilePad = (kTile + 15) & ~15;
};

template <class Q, int NA>
struct GemvConfig {
  using S_ = GemvShape<Q>;
  // Rows per block: 4 when few activation rows keep register use low (x stays in registers), else 2.
  static constexpr int R = (NA <= 2 && S_::kTile <= 1200) ? 4 : 2;
  static constexpr int S = std::max(2, std::min(4, 12288 / (R * S_::kTilePad)));
  static constexpr int kSmem = kWarps * S * R * S_::kTilePad;
};

template <int N>
__device__ __forceinline__ void load_x16(const float* p, float (&v)[N], int o) {
  const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 t = __ldg(q + i);
    v[o + 4 * i] = t.x, v[o + 4 * i + 1] = t.y, v[o + 4 * i + 2] = t.z, v[o + 4 * i + 3] = t.w;
  }
}

template <class Q, int NA>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvParams p) {
  using Shape = GemvShape<Q>;
  using Cfg = GemvConfig<Q, NA>;
  constexpr int R = Cfg::R, S = Cfg::S;
  constexpr int CPB = Shape::kChunksPerBlock, TB = Shape::kTileBlocks, TILE = Shape::kTile, PAD = Shape::kTilePad;
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ float red[kWarps][R][NA];

  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * R;
  const uint8_t* w = p.w;
  const float* xr[NA];
  const int g = static_cast<int>(blockIdx.y) + p.g_base;
  int a0;
  if (p.expert_ids) {
    w += static_cast<size_t>(p.expert_ids[g]) * p.expert_bytes;
    a0 = g;
    xr[0] = p.x + static_cast<int64_t>(g / p.x_div) * p.x_stride;
  } else {
    a0 = g * NA;
#pragma unroll
    for (int a = 0; a < NA; ++a) xr[a] = p.x + static_cast<int64_t>(min(a0 + a, p.n - 1)) * p.x_stride;
  }
  uint8_t* ws = smem + warp * (S * R * PAD);
  const int my_tiles = p.n_tiles > warp ? (p.n_tiles - warp + kWarps - 1) / kWarps : 0;

  auto issue = [&](int i) {
    const size_t off = static_cast<size_t>(warp + kWarps * i) * TILE;
    const int bytes = static_cast<int>(min(static_cast<size_t>(TILE), p.row_bytes - off));
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (row0 + r < p.M)
        copy_async(ws + ((i % S) * R + r) * PAD, w + static_cast<size_t>(row0 + r) * p.row_bytes + off, bytes, p.unit, lane, 32);
  };

  float acc[R][NA];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int a = 0; a < NA; ++a) acc[r][a] = 0.0f;

#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < my_tiles) issue(i);
    cp_async_commit();
  }
  const int blk = lane / CPB, c = lane % CPB;
  for (int i = 0; i < my_tiles; ++i) {
    if (i + S - 1 < my_tiles) issue(i + S - 1);
    cp_async_commit();
    cp_async_wait<S - 1>();
    __syncwarp();
    const int gb = (warp + kWarps * i) * TB + blk;  // block index in the row
    if (gb < p.nblocks) {
      const uint8_t* st = ws + (i % S) * R * PAD + blk * Q::kBytes;
      const int64_t e = static_cast<int64_t>(gb) * Q::kElems;
      if constexpr (NA <= 2) {
        // x-stationary: this lane's 32 activations per row once, then each weight row.
        float xv[NA][32];
        int off0 = 0, off1 = 0;
        Q::offsets(c, off0, off1);
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          load_x16(xr[a] + e + off0, xv[a], 0);
          load_x16(xr[a] + e + off1, xv[a], 16);
        }
        if constexpr (Q::kDot) {
          // Fused path: quants × activations as exact small integers, scales applied per run.
          float xs[NA][2];
#pragma unroll
          for (int a = 0; a < NA; ++a) {
            xs[a][0] = xs[a][1] = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; ++k) xs[a][0] += xv[a][k], xs[a][1] += xv[a][16 + k];
          }
#pragma unroll
          for (int r = 0; r < R; ++r) Q::template dot<NA>(st + r * PAD, c, xv, xs, acc[r]);
        } else {
          float wv[32];
#pragma unroll
          for (int r = 0; r < R; ++r) {
            decode_chunk<Q>(st + r * PAD, c, wv, off0, off1);
#pragma unroll
            for (int a = 0; a < NA; ++a) {
              float s = 0.0f;
#pragma unroll
              for (int k = 0; k < 32; ++k) s = fmaf(wv[k], xv[a][k], s);
              acc[r][a] += s;
            }
          }
        }
      } else {
        // weight-stationary: all R chunks decoded, then the activation rows streamed 16 at a time.
        float wv[R][32];
        int off0 = 0, off1 = 0;
#pragma unroll
        for (int r = 0; r < R; ++r) decode_chunk<Q>(st + r * PAD, c, wv[r], off0, off1);
#pragma unroll
        for (int a = 0; a < NA; ++a) {
          float xv[16];
          load_x16(xr[a] + e + off0, xv, 0);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; ++k) s = fmaf(wv[r][k], xv[k], s);
            acc[r][a] += s;
          }
          load_x16(xr[a] + e + off1, xv, 0);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 16; ++k) s = fmaf(wv[r][16 + k], xv[k], s);
            acc[r][a] += s;
          }
        }
      }
    }
    __syncwarp();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int a = 0; a < NA; ++a) {
      const float s = warp_sum(acc[r][a]);
      if (lane == 0) red[warp][r][a] = s;
    }
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  if (t < R * NA) {
    const int r = t / NA, a = t % NA;
    const int64_t row = row0 + r;
    const int arow = a0 + a;
    if (row < p.M && (p.expert_ids ? a == 0 : arow < p.n)) {
      float s = red[0][r][a];
#pragma unroll
      for (int k = 1; k < kWarps; ++k) s += red[k][r][a];
      p.y[static_cast<int64_t>(arow) * p.y_stride + row] = s;
    }
  }
}

template <class Q, int NA>
void launch(const GemvParams& p, int groups, cudaStream_t stream) {
  using Cfg = GemvConfig<Q, NA>;
  auto kernel = gemv_kernel<Q, NA>;
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(kernel), Cfg::kSmem);
  for (int g0 = 0; g0 < groups; g0 += 65535) {
    GemvParams q = p;
    q.g_base = g0;
    const dim3 grid(static_cast<unsigned>(ceil_div(p.M, Cfg::R)), static_cast<unsigned>(std::min(65535, groups - g0)));
    kernel<<<grid, kWarps * 32, Cfg::kSmem, stream>>>(q);
    check_launch("gemv");
  }
}

template <class Q>
void gemv_typed(const MatmulArgs& a, cudaStream_t stream) {
  using Shape = GemvShape<Q>;
  PG_CHECK(a.K % Q::kElems == 0, "matmul: K=" + std::to_string(a.K) + " is not a multiple of the " +
                                     std::string(dtype_name(a.type)) + " block (" + std::to_string(Q::kElems) + ")");
  PG_CHECK(a.x_stride % 4 == 0 && reinterpret_cast<uintptr_t>(a.x) % 16 == 0, "matmul: activations must be 16-byte aligned");
  GemvParams p{};
  p.w = static_cast<const uint8_t*>(a.w);
  p.row_bytes = a.row_bytes;
  p.M = a.M;
  p.nblocks = static_cast<int>(a.K / Q::kElems);
  p.n_tiles = ceil_div(p.nblocks, Shape::kTileBlocks);
  p.x = a.x;
  p.x_stride = a.x_stride;
  p.y = a.y;
  p.y_stride = a.y_stride;
  p.n = a.n;
  p.expert_ids = a.expert_ids;
  p.expert_bytes = a.expert_bytes;
  p.x_div = std::max(1, a.x_div);
  p.unit = copy_unit({reinterpret_cast<uintptr_t>(a.w), a.row_bytes, static_cast<uint64_t>(Shape::kTile), a.expert_bytes});
  if (a.expert_ids) {
    launch<Q, 1>(p, a.n, stream);  // one activation row per group
    return;
  }
  const int na = a.n <= 1 ? 1 : a.n <= 2 ? 2 : a.n <= 4 ? 4 : 8;
  const int groups = ceil_div(a.n, na);
  switch (na) {
    case 1: launch<Q, 1>(p, groups, stream); break;
    case 2: launch<Q, 2>(p, groups, stream); break;
    case 4: launch<Q, 4>(p, groups, stream); break;
    default: launch<Q, 8>(p, groups, stream); break;
  }
}

}  // namespace

bool gemv_supported(DType t) {
  bool found = false;  // (a capturing lambda: nvcc warns about captureless template lambdas)
  dispatch_type(t, [&found]<class Q>() { found = true; });
  return found;
}

void gemv(const MatmulArgs& a, cudaStream_t stream) {
  if (a.n <= 0 || a.M <= 0) return;
  const bool ok = dispatch_type(a.type, [&]<class Q>() { gemv_typed<Q>(a, stream); });
  PG_CHECK(ok, "CUDA matmul: weight type " + std::string(dtype_name(a.type)) + " is not supported");
}

}  // namespace pg::cuda
