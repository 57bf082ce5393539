// kv_store for caches of any KV type (core/kv_quant.h): each row's heads are encoded into whole blocks of
// the cache type on the device, with the encoders of kv_quant.cuh (bytes identical to the CPU backend's
// kv_quantize_row). The F32/F16 pair of equal types keeps elementwise.cu's kv_store kernel.
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/kv_quant.cuh"
#include "core/error.h"

namespace pg::cuda {
namespace {

// One block per batch row r: threads stride over the encoding units of the row's K heads, then its V heads
// (unit = one value, one 32-block or one 128-group: kvq_unit_elems). Reads src rows (n, n_head_kv·hd) f32,
// writes cache row cells[r] (row_bytes each); a negative or out-of-range cell writes nothing.
__global__ void kv_store_typed_kernel(const KvStoreArgs a) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  const int r = static_cast<int>(blockIdx.x);
  const int64_t cell = a.cells[r];
#pragma unroll 1
  for (int which = 0; which < 2; ++which) {
    const DType t = which ? a.v_type : a.k_type;
    const int hd = which ? a.head_dim_v : a.head_dim;
    const int ue = kvq_unit_elems(t), ub = kvq_unit_bytes(t);
    const int units = (hd + ue - 1) / ue;  // per head: the head width rounded up to whole units
    const int64_t n_cells = which ? a.v_cells : a.k_cells;
    if (cell < 0 || cell >= n_cells || ue == 0) continue;
    const size_t rb = which ? a.v_row_bytes : a.k_row_bytes;
    const size_t hb = static_cast<size_t>(units) * static_cast<size_t>(ub);
    const float* src = (which ? a.v : a.k) + static_cast<int64_t>(r) * (which ? a.v_stride : a.k_stride);
    uint8_t* row = static_cast<uint8_t*>(which ? a.v_cache : a.k_cache) + static_cast<size_t>(cell) * rb;
    for (int i = static_cast<int>(threadIdx.x); i < a.n_head_kv * units; i += static_cast<int>(blockDim.x)) {
      const int h = i / units, u = i % units;
      kvq_encode_unit(t, src + static_cast<int64_t>(h) * hd, hd, u, row + static_cast<size_t>(h) * hb);
    }
  }
}


// ---- parallel store (KvStoreArgs::parallel): one warp per 32-value block / 32 plain values / 128-group ----
// Same bytes as kvq_encode_unit (kv_quant.cuh's contract), with the per-value work spread over the lanes:
// lane j holds value 32u + j of its block. The reductions (amax, signed absmax, min, max) are exact and
// pick the same element as the sequential loops: a value and its index travel together and ties go to
// the lower index (ggml's "first strictly larger" rule; ±0 compare equal, so the first zero wins, as
// sequentially). TQ3_0's two double sums stay sequential in lane 0 (their rounding depends on the order;
// the products are exact in double, the sums are not), everything else — scaling, the rotation
// (tq3_rotate_par), the 128 centroid searches, the packing — runs on all 32 lanes.

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kStoreWarps = 4;  // warps per block of kv_store_typed_par_kernel

// Bitwise OR over the lanes whose xor-distance is below `width` (a power of two ≤ 32).
__device__ __forceinline__ uint32_t kvq_warp_or(uint32_t v, int width) {
  for (int o = width / 2; o > 0; o >>= 1) v |= __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Warp-wide selection of the element (key, value, index) the sequential loop `if (better(key, best)) take`
// ends on: better(a, b) strict, ties → lower index. Every lane ends with the winner.
template <class Better>
__device__ __forceinline__ void kvq_warp_select(float& key, float& val, int& idx, Better better) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ok = __shfl_xor_sync(kFullMask, key, o), ov = __shfl_xor_sync(kFullMask, val, o);
    const int oi = __shfl_xor_sync(kFullMask, idx, o);
    if (better(ok, key) || (!better(key, ok) && oi < idx)) key = ok, val = ov, idx = oi;
  }
}

// One 32-value block of a GGML type: x = this lane's value (zero in the padding), y = the block's bytes.
__device__ __forceinline__ void kvq_encode_block_warp(DType t, float x, int lane, uint8_t* y) {
  if (t == DType::Q8_0) {
    float amax = fabsf(x);
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    if (lane == 0) kvq_put16(y, kvq_f32_to_f16(d));
    y[2 + lane] = kvq_q8_quant(__fmul_rn(x, id));
    return;
  }
  const bool sym = t == DType::Q4_0 || t == DType::Q5_0;  // scale from the signed absmax, else from min/max
  float d, mn = 0.0f;
  if (sym) {
    float key = fabsf(x), mx = x;
    int idx = lane;
    kvq_warp_select(key, mx, idx, [](float a, float b) { return a > b; });
    if (!(key > 0.0f)) mx = 0.0f;  // the sequential loop starts at (0, 0) and takes only a strictly larger |x|
    d = __fdiv_rn(mx, t == DType::Q4_0 ? -8.0f : -16.0f);
  } else {
    float kmin = x, vmin = x, kmax = x, vmax = x;
    int imin = lane, imax = lane;
    kvq_warp_select(kmin, vmin, imin, [](float a, float b) { return a < b; });
    kvq_warp_select(kmax, vmax, imax, [](float a, float b) { return a > b; });
    mn = vmin;
    d = __fdiv_rn(__fsub_rn(vmax, mn), t == DType::Q4_1 ? 15.0f : 31.0f);
  }
  const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
  int q;
  switch (t) {
    case DType::Q4_0: q = min(15, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(x, id), 8.5f))))); break;
    case DType::Q5_0: q = min(31, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(x, id), 16.5f))))); break;
    case DType::Q4_1:
      q = min(15, static_cast<int>(static_cast<int8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(__fsub_rn(x, mn), id), 0.5f)))));
      break;
    default: q = static_cast<uint8_t>(kvq_trunc_int(__fadd_rn(__fmul_rn(__fsub_rn(x, mn), id), 0.5f)) & 0xff); break;  // Q5_1
  }
  const int qhi = __shfl_xor_sync(kFullMask, q, 16);  // lanes 0..15 get value j + 16's quant
  const bool five = t == DType::Q5_0 || t == DType::Q5_1;
  const int hdr = (sym ? 2 : 4) + (five ? 4 : 0);  // d [, m] [, qh]
  if (lane < 16) y[hdr + lane] = static_cast<uint8_t>(((q & 0x0F) | ((qhi & 0x0F) << 4)) & 0xff);
  if (five) {
    const uint32_t qh = kvq_warp_or(static_cast<uint32_t>((q >> 4) & 1) << lane, 32);
    if (lane < 4) y[hdr - 4 + lane] = static_cast<uint8_t>((qh >> (8 * lane)) & 0xff);
  }
  if (lane == 0) {
    kvq_put16(y, kvq_f32_to_f16(d));
    if (!sym) kvq_put16(y + 2, kvq_f32_to_f16(mn));
  }
}

// One TQ3_0 group by one warp. xs: this warp's 128 floats of shared memory (the group, zero-padded, already
// loaded and visible to the warp); ks: 128 bytes, sh_d: 1 double, words: 12 words of shared memory; y: 56 bytes.
__device__ __forceinline__ void kvq_encode_tq3_0_warp(float* xs, uint8_t* ks, double* sh_d, uint32_t* words, int lane,
                                                      uint8_t* y) {
  if (lane == 0) {  // core's sequential double sum (order-dependent rounding)
    double ss = 0.0;
    for (int i = 0; i < 128; ++i) ss = __dadd_rn(ss, __dmul_rn(static_cast<double>(xs[i]), static_cast<double>(xs[i])));
    *sh_d = __dsqrt_rn(ss);
  }
  __syncwarp();
  const double nrm = *sh_d;
  const float inv = nrm > 0.0 ? __double2float_rn(__ddiv_rn(1.0, nrm)) : 0.0f;
#pragma unroll
  for (int m = 0; m < 4; ++m) xs[lane + 32 * m] = __fmul_rn(xs[lane + 32 * m], inv);
  __syncwarp();
  tq3_rotate_par(xs, 128, false, lane, 32, [] { __syncwarp(); });
  const float mids[7] = {-0.154259f, -0.091775f, -0.043589f, 0.0f, 0.043589f, 0.091775f, 0.154259f};
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int i = lane + 32 * m;
    const float u = xs[i];
    uint32_t k = 0;
#pragma unroll
    for (int j = 0; j < 7; ++j) k += u > mids[j] ? 1u : 0u;
    ks[i] = static_cast<uint8_t>(k);
    // qs word i >> 4 = 2m + lane / 16 (16 two-bit parts), sign word m (32 bits).
    const uint32_t qw = kvq_warp_or((k & 3u) << (2 * (lane & 15)), 16);
    const uint32_t sw = kvq_warp_or((k >> 2) << lane, 32);
    if ((lane & 15) == 0) words[2 * m + (lane >> 4)] = qw;
    if (lane == 0) words[8 + m] = sw;
  }
  __syncwarp();
  if (lane == 0) {  // the second sequential double sum, over the chosen centroids in index order
    double cs = 0.0;
    for (int i = 0; i < 128; ++i) {
      const double c = static_cast<double>(tq3_centroid(ks[i]));
      cs = __dadd_rn(cs, __dmul_rn(c, c));
    }
    words[12] = kvq_f32_to_f16(__double2float_rn(__ddiv_rn(nrm, __dsqrt_rn(cs))));
  }
  __syncwarp();
  // 4 blocks of 14 bytes: norm (2), qs words 2b, 2b + 1 (8), sign word b (4).
  for (int p = lane; p < 56; p += 32) {
    const int b = p / 14, o = p % 14;
    uint32_t w, sh;
    if (o < 2)
      w = words[12], sh = 8u * static_cast<uint32_t>(o);
    else if (o < 10)
      w = words[2 * b + (o - 2) / 4], sh = 8u * static_cast<uint32_t>((o - 2) % 4);
    else
      w = words[8 + b], sh = 8u * static_cast<uint32_t>(o - 10);
    y[p] = static_cast<uint8_t>((w >> sh) & 0xff);
  }
  __syncwarp();  // xs / ks / words are reused by this warp's next group
}

// Grid (n, ⌈work / kStoreWarps⌉), kStoreWarps·32 threads. Row r = blockIdx.x; warp item w of the row:
// the first n_head_kv·wk items are K's (head w / wk, unit w % wk), then V's. A unit is 32 values (a GGML
// block, or 32 plain F32/F16/BF16 values) or a 128-group for TQ3_0; wk = units per K head. Reads src rows
// (n, n_head_kv·hd) f32, writes cache row cells[r]; a negative or out-of-range cell writes nothing.
__global__ void __launch_bounds__(kStoreWarps * 32) kv_store_typed_par_kernel(const KvStoreArgs a) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  __shared__ float s_x[kStoreWarps][128];
  __shared__ uint8_t s_k[kStoreWarps][128];
  __shared__ double s_d[kStoreWarps];
  __shared__ uint32_t s_w[kStoreWarps][13];
  const int r = static_cast<int>(blockIdx.x);
  const int lane = static_cast<int>(threadIdx.x) & 31, wi = static_cast<int>(threadIdx.x) >> 5;
  int item = static_cast<int>(blockIdx.y) * kStoreWarps + wi;
  const int64_t cell = a.cells[r];
  const auto wu = [](DType t, int hd) { return (hd + (t == DType::TQ3_0 ? 127 : 31)) / (t == DType::TQ3_0 ? 128 : 32); };
  const int wk = wu(a.k_type, a.head_dim), wv = wu(a.v_type, a.head_dim_v);
  const bool which = item >= a.n_head_kv * wk;
  if (which) item -= a.n_head_kv * wk;
  if (which && item >= a.n_head_kv * wv) return;  // warp-uniform: whole warps leave
  const DType t = which ? a.v_type : a.k_type;
  const int hd = which ? a.head_dim_v : a.head_dim, units = which ? wv : wk;
  const int64_t n_cells = which ? a.v_cells : a.k_cells;
  const int ub = kvq_unit_bytes(t);
  if (cell < 0 || cell >= n_cells || ub == 0) return;
  const int h = item / units, u = item % units;
  const float* src = (which ? a.v : a.k) + static_cast<int64_t>(r) * (which ? a.v_stride : a.k_stride) + static_cast<int64_t>(h) * hd;
  const size_t rb = which ? a.v_row_bytes : a.k_row_bytes;
  const int ue = kvq_unit_elems(t);
  const size_t hb = static_cast<size_t>((hd + ue - 1) / ue) * static_cast<size_t>(ub);  // kv_head_bytes
  uint8_t* head = static_cast<uint8_t*>(which ? a.v_cache : a.k_cache) + static_cast<size_t>(cell) * rb + static_cast<size_t>(h) * hb;
  if (t == DType::TQ3_0) {
    float* xs = s_x[wi];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int e = 128 * u + lane + 32 * m;
      xs[lane + 32 * m] = e < hd ? src[e] : 0.0f;
    }
    __syncwarp();
    kvq_encode_tq3_0_warp(xs, s_k[wi], &s_d[wi], s_w[wi], lane, head + 56 * u);
    return;
  }
  const int e = 32 * u + lane;
  const float x = e < hd ? src[e] : 0.0f;
  if (ue == 1) {  // plain values: no padding (the head width is head_dim)
    if (e < hd) {
      if (t == DType::F32)
        reinterpret_cast<float*>(head)[e] = x;
      else
        reinterpret_cast<uint16_t*>(head)[e] = static_cast<uint16_t>(t == DType::F16 ? kvq_f32_to_f16(x) : kvq_f32_to_bf16(x));
    }
    return;
  }
  kvq_encode_block_warp(t, x, lane, head + static_cast<size_t>(ub) * u);
}

}  // namespace

void kv_store_typed(const KvStoreArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  if (a.parallel) {
    const auto wu = [](DType t, int hd) { return (hd + (t == DType::TQ3_0 ? 127 : 31)) / (t == DType::TQ3_0 ? 128 : 32); };
    const int work = a.n_head_kv * (wu(a.k_type, a.head_dim) + wu(a.v_type, a.head_dim_v));
    const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>((work + kStoreWarps - 1) / kStoreWarps));
    launch(kv_store_typed_par_kernel, grid, kStoreWarps * 32, 0, stream, a);
    check_launch("kv_store (typed, parallel)");
    return;
  }
  // 64 threads: a decode row has n_head_kv·(head_dim/32) block units per side (8·4 for an 8B model), a
  // TQ3_0 row n_head_kv groups; the per-thread work is sequential by design (kv_quant.cuh).
  launch(kv_store_typed_kernel, static_cast<unsigned>(a.n), 64, 0, stream, a);
  check_launch("kv_store (typed)");
}

}  // namespace pg::cuda
