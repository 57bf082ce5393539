// Prefill GEMM on tensor cores: y (n, M) = x (n, K) · Wᵀ for n > 8, W in its GGUF blocks.
//
// Why this design: the weights are dequantized inside the kernel, tile by tile, so no FP16 copy of a
// model is ever materialised (a quantized 8B model would need 16 GB more for it) and the one kernel
// covers every weight type through the same run decoders as get_rows. cuBLAS would need that copy — or,
// per matmul, one matrix of it: that is the alternative CudaOptions::gemm_cublas routes large batches to
// (gemm_cublas.cu; same 16-bit operands, gemm_convert_x below is shared).
//  - The activations are first converted once to FP16 (BF16 for BF16 weights) in a scratch buffer,
//    optionally gathering rows (MoE), so the kernel streams 16-bit tiles.
//  - Block tile: 128 weight rows × 128 activation rows, 8 warps (4 × 2), warp tile 32 × 64, mma.sync
//    m16n8k16 with FP32 accumulators, fragments loaded with ldmatrix from padded shared tiles.
//  - Quantized weights: the raw GGUF bytes of 128 rows × 256 (or 512) elements are staged with
//    cp.async, double-buffered, then dequantized in 64-element steps to an FP16 tile; FP16/BF16
//    weights are copied with cp.async straight into the MMA tile.
// Accuracy: in default mode the activations of quantized weights are first rounded to 8 bits exactly as
// the CPU's default mode rounds them (MatmulArgs::act_quant, gemv_q8.cu), then to FP16 (relative 2⁻¹¹);
// F16/BF16 weights take the activations rounded to FP16/BF16. Dequantized weights are rounded to FP16,
// sums are FP32; CudaOptions::exact_f32 routes everything through the FP32 GEMV instead.
// Next steps for speed (see README.md): wgmma (sm_90a) with TMA, larger N tiles, integer MMA on q8
// activations for the quantized types.
#include <algorithm>
#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_cublas.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "core/error.h"

namespace pg::cuda {
namespace {

constexpr int BM = 128, BN = kGemmTileN, BK = 64, kThreads = 256;
constexpr int WN = BN / 2;       // activation rows per warp (warps: 4 along M × 2 along N)
constexpr int NT = WN / 8;       // n8 MMA tiles per warp
constexpr int XV = BN * BK / 8 / kThreads;  // 16-byte activation vectors per thread per step
constexpr int LDS = BK + 8;  // padded row of the 16-bit tiles (144 bytes: ldmatrix rows hit distinct banks)

struct GemmParams {
  const uint8_t* w;
  size_t row_bytes;
  int64_t M, K;
  const uint16_t* xh;  // (rows, K) 16-bit activations
  float* y;
  int64_t y_stride;
  int n;
  const int32_t* tiles;  // grouped: (expert, first row, rows) per blockIdx.y
  size_t expert_bytes;
  const int32_t* y_rows;
  int unit;
};

template <class Q>
struct Raw {
  // Elements per stage: 128 for the 32-element types (keeps Q8_0's stage small), 256 for K-quants
  // whose 256-element rows are a multiple of 4 bytes (cp.async needs ≥ 4-byte units), else 512.
  static constexpr int KR = Q::kElems == 32 ? 128 : (Q::kBytes % 4 == 0 ? 256 : 512);
  static constexpr int RB = KR / Q::kElems * Q::kBytes;                          // bytes per row per stage
  static constexpr int RBP = (RB + 15) & ~15;
};

template <class Q>
constexpr int gemm_smem() {
  if constexpr (Q::kPlain)
    return 2 * BM * LDS * 2 + BN * LDS * 2;
  else
    return 2 * BM * Raw<Q>::RBP + BM * LDS * 2 + BN * LDS * 2;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

template <bool BF>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Block-wide copy of `rows` row segments of `bytes` each (src rows `src_stride` apart) into dst rows
// `dst_stride` apart, in units of `unit` bytes (cp.async) or 2 bytes (synchronous).
__device__ __forceinline__ void copy_rows(uint8_t* dst, int dst_stride, const uint8_t* src, size_t src_stride, int rows, int bytes,
                                         int unit) {
  const int upr = bytes / unit;
  const int total = rows * upr;
  for (int idx = static_cast<int>(threadIdx.x); idx < total; idx += kThreads) {
    const int r = idx / upr, o = (idx - r * upr) * unit;
    uint8_t* d = dst + r * dst_stride + o;
    const uint8_t* s = src + static_cast<size_t>(r) * src_stride + o;
    if (unit == 16)
      cp_async16(d, s);
    else if (unit == 8)
      cp_async8(d, s);
    else if (unit == 4)
      cp_async4(d, s);
    else
      *reinterpret_cast<uint16_t*>(d) = *reinterpret_cast<const uint16_t*>(s);
  }
}

template <class Q, bool BF>
__global__ void __launch_bounds__(kThreads) gemm_kernel(const GemmParams p) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int wm = warp & 3, wn = warp >> 2;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * BM;

  // Activation rows of this tile: [r0, r0 + nrows) of xh; output row i goes to y row yrow(i).
  int r0, nrows;
  const uint8_t* w = p.w;
  if (p.tiles) {
    const int* t = p.tiles + 3 * blockIdx.y;
    nrows = t[2];
    if (nrows <= 0) return;
    w += static_cast<size_t>(t[0]) * p.expert_bytes;
    r0 = t[1];
  } else {
    r0 = static_cast<int>(blockIdx.y) * BN;
    nrows = min(BN, p.n - r0);
  }
  const int mrows = static_cast<int>(min(static_cast<int64_t>(BM), p.M - m0));
  const uint8_t* wrow0 = w + static_cast<size_t>(m0) * p.row_bytes;

  uint16_t* ws;   // (BM, LDS) MMA weight tile (plain: two of them)
  uint16_t* xs;   // (BN, LDS) activation tile
  uint8_t* raw;   // quantized: two stages of (BM, RBP) raw bytes
  if constexpr (Q::kPlain) {
    ws = reinterpret_cast<uint16_t*>(smem);
    xs = ws + 2 * BM * LDS;
    raw = nullptr;
  } else {
    raw = smem;
    ws = reinterpret_cast<uint16_t*>(smem + 2 * BM * Raw<Q>::RBP);
    xs = ws + BM * LDS;
  }

  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;

  // Activation tile loads: BN rows × 8 uint4, XV per thread, prefetched into registers.
  uint4 xreg[XV];
  auto load_x = [&](int64_t k0) {
#pragma unroll
    for (int i = 0; i < XV; ++i) {
      const int idx = tid + kThreads * i, r = idx >> 3, c8 = idx & 7;
      const int64_t k = k0 + 8 * c8;
      if (r < nrows && k < p.K)
        xreg[i] = *reinterpret_cast<const uint4*>(p.xh + static_cast<int64_t>(r0 + r) * p.K + k);
      else
        xreg[i] = make_uint4(0, 0, 0, 0);
    }
  };
  auto store_x = [&] {
#pragma unroll
    for (int i = 0; i < XV; ++i) {
      const int idx = tid + kThreads * i, r = idx >> 3, c8 = idx & 7;
      *reinterpret_cast<uint4*>(xs + r * LDS + 8 * c8) = xreg[i];
    }
  };
  auto mma_tile = [&](const uint16_t* wt) {
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      uint32_t a[2][4], b[NT / 2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(a[mi], wt + (wm * 32 + mi * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 8);
#pragma unroll
      for (int nj = 0; nj < NT / 2; ++nj)
        ldmatrix_x4(b[nj], xs + (wn * WN + nj * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + kk + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < NT; ++ni) mma16816<BF>(acc[mi][ni], a[mi], b[ni >> 1][2 * (ni & 1)], b[ni >> 1][2 * (ni & 1) + 1]);
    }
  };

  if constexpr (Q::kPlain) {
    // FP16/BF16 weights: 64-element steps copied straight into one of two MMA tiles.
    const int nsteps = static_cast<int>((p.K + BK - 1) / BK);
    auto issue_w = [&](int s) {
      const int64_t k0 = static_cast<int64_t>(s) * BK;
      const int bytes = static_cast<int>(min(static_cast<int64_t>(BK), p.K - k0)) * 2;
      copy_rows(reinterpret_cast<uint8_t*>(ws + (s & 1) * BM * LDS), LDS * 2, wrow0 + k0 * 2, p.row_bytes, mrows, bytes, p.unit);
      if (bytes < BK * 2) {  // zero the K tail so that 0·x stays 0
        for (int idx = tid; idx < BM * (BK - bytes / 2); idx += kThreads) {
          const int r = idx / (BK - bytes / 2), c = bytes / 2 + idx % (BK - bytes / 2);
          ws[(s & 1) * BM * LDS + r * LDS + c] = 0;
        }
      }
    };
    issue_w(0);
    cp_async_commit();
    load_x(0);
    for (int s = 0; s < nsteps; ++s) {
      if (s + 1 < nsteps) issue_w(s + 1);
      cp_async_commit();
      store_x();
      if (s + 1 < nsteps) load_x(static_cast<int64_t>(s + 1) * BK);
      cp_async_wait<1>();
      __syncthreads();
      mma_tile(ws + (s & 1) * BM * LDS);
      __syncthreads();
    }
  } else {
    using RawQ = Raw<Q>;
    const int nstages = static_cast<int>((p.K + RawQ::KR - 1) / RawQ::KR);
    auto issue_raw = [&](int s) {
      const size_t off = static_cast<size_t>(s) * RawQ::RB;
      const int bytes = static_cast<int>(min(static_cast<size_t>(RawQ::RB), p.row_bytes - off));
      copy_rows(raw + (s & 1) * BM * RawQ::RBP, RawQ::RBP, wrow0 + off, p.row_bytes, mrows, bytes, p.unit);
    };
    issue_raw(0);
    cp_async_commit();
    load_x(0);
    // This thread dequantizes 32 consecutive elements (two runs) of row dr in each 64-element step.
    const int dr = tid >> 1, dhalf = tid & 1;
    for (int s = 0; s < nstages; ++s) {
      if (s + 1 < nstages) issue_raw(s + 1);
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();
      const uint8_t* rs = raw + (s & 1) * BM * RawQ::RBP + dr * RawQ::RBP;
#pragma unroll 1
      for (int sub = 0; sub < RawQ::KR / BK; ++sub) {
        const int64_t k0 = static_cast<int64_t>(s) * RawQ::KR + sub * BK;
        if (k0 >= p.K) break;
        // Dequantize two runs of row dr into the FP16 tile (zeros past K).
        uint4 packed[4];
        const int e = sub * BK + 32 * dhalf;  // element offset inside the stage
        if (k0 + 32 * dhalf < p.K) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int el = e + 16 * h;
            float v[16];
            Q::run(rs + (el / Q::kElems) * Q::kBytes, (el % Q::kElems) / 16, v);
            packed[2 * h] = make_uint4(pack_half2(v[0], v[1]), pack_half2(v[2], v[3]), pack_half2(v[4], v[5]), pack_half2(v[6], v[7]));
            packed[2 * h + 1] =
                make_uint4(pack_half2(v[8], v[9]), pack_half2(v[10], v[11]), pack_half2(v[12], v[13]), pack_half2(v[14], v[15]));
          }
        } else {
#pragma unroll
          for (int h = 0; h < 4; ++h) packed[h] = make_uint4(0, 0, 0, 0);
        }
        uint4* dst = reinterpret_cast<uint4*>(ws + dr * LDS + 32 * dhalf);
#pragma unroll
        for (int h = 0; h < 4; ++h) dst[h] = packed[h];
        store_x();
        const int64_t kn = k0 + BK;
        if (kn < p.K) load_x(kn);
        __syncthreads();
        mma_tile(ws);
        __syncthreads();
      }
    }
    cp_async_wait<0>();
  }

  // Epilogue: c0,c1 at (row g, cols 2t, 2t+1), c2,c3 at (row g+8, ...), g = lane/4, t = lane%4.
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const int64_t m = m0 + wm * 32 + mi * 16 + g + (h >> 1) * 8;
        const int i = wn * WN + ni * 8 + 2 * t4 + (h & 1);
        if (m >= p.M || i >= nrows) continue;
        const int row = p.y_rows ? p.y_rows[r0 + i] : r0 + i;
        p.y[static_cast<int64_t>(row) * p.y_stride + m] = acc[mi][ni][h];
      }
}

// x (rows, K) f32 → 16-bit (FP16 saturated to ±65504, or BF16), gathering row i from x_rows[i].
template <bool BF>
__global__ void convert_x_kernel(const float* x, int64_t x_stride, const int32_t* x_rows, int64_t K, uint16_t* out) {
  const int64_t i = blockIdx.y;
  const float* src = x + static_cast<int64_t>(x_rows ? x_rows[i] : i) * x_stride;
  uint16_t* dst = out + i * K;
  for (int64_t k = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 4; k < K; k += static_cast<int64_t>(gridDim.x) * blockDim.x * 4) {
    const float4 v = *reinterpret_cast<const float4*>(src + k);
    uint32_t lo, hi;
    if constexpr (BF) {
      const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
      lo = *reinterpret_cast<const uint32_t*>(&a);
      hi = *reinterpret_cast<const uint32_t*>(&b);
    } else {
      constexpr float kMax = 65504.0f;
      lo = pack_half2(fminf(fmaxf(v.x, -kMax), kMax), fminf(fmaxf(v.y, -kMax), kMax));
      hi = pack_half2(fminf(fmaxf(v.z, -kMax), kMax), fminf(fmaxf(v.w, -kMax), kMax));
    }
    *reinterpret_cast<uint2*>(dst + k) = make_uint2(lo, hi);
  }
}

template <class Q>
void gemm_typed(const MatmulArgs& a, const GemmGroups* groups, const int32_t* x_rows, void* scratch, cudaStream_t stream) {
  constexpr bool BF = std::is_same_v<Q, QBF16>;
  PG_CHECK(a.K % 32 == 0 && a.K % Q::kElems == 0, "matmul: K=" + std::to_string(a.K) + " is not a multiple of the block size");
  // Activation rows that the kernel reads: n plain, or the n sorted entries when grouped.
  auto* xh = static_cast<uint16_t*>(scratch);
  gemm_convert_x(a, x_rows, xh, stream);
  GemmParams p{};
  p.w = static_cast<const uint8_t*>(a.w);
  p.row_bytes = a.row_bytes;
  p.M = a.M;
  p.K = a.K;
  p.xh = xh;
  p.y = a.y;
  p.y_stride = a.y_stride;
  p.n = a.n;
  uint64_t stage_bytes;
  if constexpr (Q::kPlain)
    stage_bytes = 16;
  else
    stage_bytes = Raw<Q>::RB;
  p.unit = copy_unit({reinterpret_cast<uintptr_t>(a.w), a.row_bytes, stage_bytes, groups ? groups->expert_bytes : 0});
  int ny = ceil_div(a.n, BN);
  if (groups) {
    p.tiles = groups->tiles;
    p.expert_bytes = groups->expert_bytes;
    p.y_rows = groups->y_rows;
    ny = groups->max_tiles;
  }
  constexpr int smem = gemm_smem<Q>();
  auto kernel = gemm_kernel<Q, BF>;
  static SmemOptIn opt_in;
  opt_in.ensure(reinterpret_cast<const void*>(kernel), smem);
  for (int y0 = 0; y0 < ny; y0 += 65535) {
    GemmParams q = p;
    const int cnt = std::min(65535, ny - y0);
    if (groups)
      q.tiles = p.tiles + 3 * y0;
    else {
      q.xh = xh + static_cast<int64_t>(y0) * BN * a.K;
      q.y = a.y + static_cast<int64_t>(y0) * BN * a.y_stride;
      q.n = a.n - y0 * BN;
    }
    const dim3 grid(static_cast<unsigned>(ceil_div(a.M, BM)), static_cast<unsigned>(cnt));
    kernel<<<grid, kThreads, smem, stream>>>(q);
    check_launch("gemm");
  }
}

}  // namespace

// Shared with gemm_cublas.cu (declared in gemm_cublas.h): both routes multiply exactly these 16-bit activations.
void gemm_convert_x(const MatmulArgs& a, const int32_t* x_rows, uint16_t* xh, cudaStream_t stream) {
  PG_CHECK(a.x_stride % 4 == 0, "matmul: activations must be 16-byte aligned");
  const bool bf = a.type == DType::BF16;
  if (a.act_quant != kActNone && !bf) {
    // Default mode: the activations rounded as the CPU's default mode rounds them (8-bit quants), then
    // widened to FP16 — the same inputs the GEMV and the CPU see, up to the FP16 rounding of q·d.
    act_quant_f16(a.act_quant, a.x, a.x_stride, x_rows, a.n, a.K, xh, stream);
    return;
  }
  const int threads = 256;
  const int bx = std::max(1, std::min(ceil_div(a.K / 4, threads), 64));
  for (int r0 = 0; r0 < a.n; r0 += 65535) {
    const int cnt = std::min(65535, a.n - r0);
    const dim3 grid(static_cast<unsigned>(bx), static_cast<unsigned>(cnt));
    const float* x0 = x_rows ? a.x : a.x + static_cast<int64_t>(r0) * a.x_stride;
    const int32_t* rows0 = x_rows ? x_rows + r0 : nullptr;
    uint16_t* out0 = xh + static_cast<int64_t>(r0) * a.K;
    if (bf)
      convert_x_kernel<true><<<grid, threads, 0, stream>>>(x0, a.x_stride, rows0, a.K, out0);
    else
      convert_x_kernel<false><<<grid, threads, 0, stream>>>(x0, a.x_stride, rows0, a.K, out0);
    check_launch("convert_x");
  }
}

bool gemm_supported(DType t) { return t != DType::F32 && gemv_supported(t); }

size_t gemm_scratch_bytes(int64_t n, int64_t K) { return static_cast<size_t>(n) * static_cast<size_t>(K) * 2; }

void gemm(const MatmulArgs& a, const GemmGroups* groups, const int32_t* x_rows, void* scratch, cudaStream_t stream) {
  if (a.n <= 0 || a.M <= 0) return;
  bool ok = false;
  if (a.type != DType::F32)
    ok = dispatch_type(a.type, [&]<class Q>() {
      if constexpr (!std::is_same_v<Q, QF32>) gemm_typed<Q>(a, groups, x_rows, scratch, stream);
    });
  PG_CHECK(ok, "CUDA GEMM: weight type " + std::string(dtype_name(a.type)) + " is not supported");
}

}  // namespace pg::cuda
