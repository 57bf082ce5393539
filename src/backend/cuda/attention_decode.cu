// SIMT flash-decoding attention for decode / short verification calls (1..8 rows) over the paged KV cache in F16 or
// a typed format (CudaOptions::fa_vec, issue 11; Q8_0, the mixed pairs and the 3/4/5-bit and BF16 caches: issue 12). Why a separate kernel: the tensor-core kernel
// (attention_prefill.cu) fills only g of its 64 MMA rows at decode and pays a large fixed part per block (ncu:
// 25.5 µs per launch at depth 0, ~28 µs + an 8.8 µs combine at depth 4096 for qwen3-8b), while the KV read itself
// is ~5 µs there.
//
// Contract (attention_decode): out (n, n_head·head_dim) FP32 = softmax(softcap(scale·q·kᵀ))·v per (row, head),
// row r seeing the keys of its sequence at logical positions [begin, positions[r] + 1) with begin = 0 or, with
// a sliding window w, positions[r] + 1 − w; tree rows (tree_mask set) see [begin, kv_len[r]) plus kv_len[r] + j
// for each set bit j of their mask words — the semantics of CpuBackend::attention and attention.cu. Cells
// through the block table: cell = table[seq][p / block_size]·block_size + p % block_size. The (K, V) element-type
// pairs (fd_pair_supported; instantiated pairs only, to bound compile time and binary size — 15 pairs × 12 kernels,
// TQ3_0 pairs 8):
//   - K and V each F16 or Q8_0: f16/f16, q8_0/q8_0, f16/q8_0, q8_0/f16;
//   - K = V: q4_0, q4_1, q5_0, q5_1, tq3_0, bf16;
//   - an F16 K with a q4_0, q4_1, q5_0, q5_1 or tq3_0 V (K is the more precision-sensitive side).
// Other pairs (a q8_0 K with a q4_0 V, say) fall back to attention.cu's attn_kvq_kernel. Heads in core/kv_quant.h's
// layout (each head whole blocks: 34 / 18 / 20 / 22 / 24 bytes per 32 values for q8_0 / q4_0 / q4_1 / q5_0 / q5_1;
// TQ3_0 14 bytes per 32 values in 128-value rotation groups), head_dim 64 / 128 / 256 (TQ3_0: 128 / 256; at 64
// its head is a zero-padded 128-group), n_head / n_head_kv ≤ 8, n ≤ 8 (attention_decode_supported).
// FP32 arithmetic on the cache's values, exactly the values of core's dequantizers: F16 / BF16 converted
// exactly, Q8_0 as d·q (exact in FP32), Q4_0 / Q5_0 as d·(q − 8 / 16) and Q4_1 / Q5_1 as d·q + m with one
// rounding each (__fmul_rn / __fadd_rn, as quant_ref.cpp is written; a host compiler that contracts its d·q + m
// into an FMA differs by an ulp), TQ3_0 as centroid·norm in the rotated domain. TQ3_0
// as the CPU attention (kv_attn.cpp): a TQ3_0 K dots the query rotated by R (tq3_rotate) with the stored rotated
// keys (q·k = R(q)·R(k)); a TQ3_0 V accumulates Σ p·R(v) and the output is turned back by R⁻¹ (fd_tq3_rotate, in
// registers with shuffles, the butterflies of core's rotate_group). Only the summation order differs from the CPU
// (not bit-exact, ~1e-6 relative). No dequantized copy of a typed cache exists: its blocks are staged as stored
// and decoded in registers.
//
// Layout: one block of 4 warps per (batch row, KV head, key split): all g query heads of the KV head are in the block
// (GQA: each K/V byte is read once for the group). A lane holds 8 dims of the head (F16: one 16-byte load of K, one
// of V; the typed formats: its 8 quants and their block's scale(s), FdKv); head_dim / 8 lanes share a key (a "lane group"); a warp thus
// works on 32·8 / head_dim keys at once, U of them per lane group per iteration (U loads of K and U of V in flight
// per lane). Warps take interleaved stretches of the split's keys; each lane group keeps its own online softmax (m,
// l, acc of its 8 dims) per query head in FP32 registers, base 2. After the key loop the lane groups of a warp merge
// by shuffles, then the 4 warps merge through shared memory with every thread taking (head, dim) entries.
// Q is loaded once per block with float4 loads, pre-scaled (×log2 e too when there is no soft-cap).
// K/V reach the lanes through shared memory: a cp.async ring of 2..4 tiles (FdParams::stages), each tile one
// warp-iteration of every warp, so the split's bytes are requested before the first score. The F16/F16
// instantiations are the kernel of issue 11 unchanged (the typed code sits in `if constexpr` branches).
//
// Splits: the host picks n_splits from the launch-shape bound (max_kv_len or the graph bucket, fd::split_plan)
// so the grid fills the SMs; each split takes fd::split_range's share of its row's ACTUAL range (computed on
// the device), so a graph replayed at another length and an eager launch cut the keys the same way and give
// the same bits; surplus splits write only an empty (m, l) = (−∞, 0) and exit. n_splits == 1 (short contexts: no
// split below 2·kMinChunk keys) writes the output directly, else fd_combine_kernel merges the partials (one
// block of 8 warps per (row, head), each warp 8 of the splits); with one non-empty split its result has the
// same bits as the direct write.
// Deterministic: every reduction has a fixed order.
//
// Host emulation: with PG_CUDA_HOST_SHIM this file compiles against tests/cuda/cuda_thread_shim.h (one host
// thread per CUDA thread), so tests/cuda/test_cuda_favec_emulated.cpp runs this kernel code on the CPU.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/attention_prefill.cuh"  // fa::row_bounds, tree_hi, tree_visible (CUDA-free helpers)
#include "backend/cuda/kernels.h"
#include "core/error.h"
#ifdef PG_CUDA_HOST_SHIM
#include "cuda_thread_shim.h"  // namespace pg::cuda::host_emu: the emulated intrinsics
#define PG_FD_NAMESPACE pg::cuda::host_emu
#define PG_FD_LAUNCH(kernel, grid, block, smem, stream, ...) ::pg::cuda::host_emu::shim::launch(grid, block, smem, [&] { kernel(__VA_ARGS__); })
namespace pg::cuda::host_emu {
inline void grid_wait() {}  // PDL has nothing to emulate: one kernel at a time
inline void grid_launch_dependents() {}
}  // namespace pg::cuda::host_emu
#else
#include <cuda_fp16.h>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/pdl.cuh"
#define PG_FD_NAMESPACE pg::cuda
#define PG_FD_LAUNCH(kernel, grid, block, smem, stream, ...) ::pg::cuda::launch(kernel, grid, block, smem, stream, __VA_ARGS__)
#endif
// h2f (fp16 → FP32, exact) in pg::cuda, which the host emulation's namespace sits inside.
#include "backend/cuda/common.cuh"
#include "core/kv_quant.h"

namespace PG_FD_NAMESPACE {
namespace {

constexpr float kFdLog2e = 1.4426950408889634f;

#ifdef PG_CUDA_HOST_SHIM
inline float4 fd_ldf4(const float* p) {
  float4 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
#else
// q through the read-only path (not written during the kernel).
__device__ __forceinline__ float4 fd_ldf4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float2 unpack_h2(uint32_t u) { return __half22float2(*reinterpret_cast<const __half2*>(&u)); }
#endif

// 8 F16 values (one 16-byte load) → FP32.
__device__ __forceinline__ void fd_unpack8(const uint4& u, float (&f)[8]) {
  const float2 a = unpack_h2(u.x), b = unpack_h2(u.y), c = unpack_h2(u.z), d = unpack_h2(u.w);
  f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

// The K/V element types the kernel reads, one head of D values per key: how a key's head is staged (kChunks
// cp.async copies of kUnit bytes from the cache, into kPitch bytes of shared memory) and how a lane gets its 8
// dims [8·sub, 8·sub + 8) out of the staged head (load: the stored bits into registers; unpack: → FP32).
template <DType T, int D>
struct FdKv;

// F16: the head's D halves; a lane's 8 dims are one 16-byte load.
template <int D>
struct FdKv<DType::F16, D> {
  static constexpr int kHeadBytes = 2 * D;  // in the cache (a row: n_head_kv heads) and staged
  static constexpr int kUnit = 16, kChunks = D / 8, kPitch = kHeadBytes;
  using Raw = uint4;  // 8 halves
  __device__ static Raw load(const uint8_t* head, int sub) { return *reinterpret_cast<const uint4*>(head + sub * 16); }
  __device__ static void unpack(const Raw& r, float (&f)[8]) { fd_unpack8(r, f); }
};

// Q8_0: D / 32 blocks of (fp16 d, int8 q[32]), 34 bytes each: 17·D/16 bytes per head (68, 136, 272), which is
// 4-, 8-, 16-byte aligned in a row and in the cache (kv_row_bytes = n_head_kv heads; 16-byte aligned base), so a
// head is 17 cp.async copies of D/16 bytes (the largest size that divides it: 17 is odd). Lane sub's 8 dims are
// block b = sub / 4, q bytes [o, o + 8) of the head with o = 34·b + 2 + 8·(sub % 4): o is even but 4-aligned only
// for odd b, so they are read as three aligned words and shifted by 0 or 2 bytes (byte_perm), plus the block's d
// (2 bytes at 34·b). Values d·q, exact in FP32 (core's dequantizer): q from a byte by byte_perm into the
// significand of 2^23 (biased by 128, unbiased with one subtraction, both exact).
// Staged pitch: the head's bytes, padded where that lowers the shared-memory bank conflicts of those reads
// (a model of the 32 lanes' word addresses, every load of K or V: 9 → 6 wavefronts per warp-wide read at
// D 64 / 128 — 96 / 192 bytes; at D 256 a warp reads one key and padding does not help). Not measured.
template <int D>
struct FdKv<DType::Q8_0, D> {
  static constexpr int kHeadBytes = 17 * D / 16;
  static constexpr int kUnit = D / 16, kChunks = 17;
  static constexpr int kPitch = D == 64 ? 96 : D == 128 ? 192 : kHeadBytes;
  static_assert(kPitch >= kHeadBytes && kPitch % 16 == 0 && D % 64 == 0, "q8_0 staging: 16-byte aligned rows of one head");
  struct Raw {
    uint32_t lo, hi;  // this lane's 8 int8 q (value i in byte i % 4 of lo (i < 4) or hi)
    uint32_t d;       // the block's fp16 scale bits
  };
  __device__ static Raw load(const uint8_t* head, int sub) {  // head: 4-byte aligned
    const int b = sub >> 2, o = 34 * b + 2 + 8 * (sub & 3);
    const auto* w = reinterpret_cast<const uint32_t*>(head + (o & ~3));
    // o % 4 == 2: the bytes are w0.hi, w1, w2.lo; o % 4 == 0: w0, w1 (the third load repeats w1: never past the head).
    const uint32_t w0 = w[0], w1 = w[1], w2 = w[1 + ((o >> 1) & 1)];
    const uint32_t sel = (o & 2) ? 0x5432u : 0x3210u;
    return Raw{__byte_perm(w0, w1, sel), __byte_perm(w1, w2, sel), *reinterpret_cast<const uint16_t*>(head + 34 * b)};
  }
  // q + 128 = byte k of (w ^ 0x80808080) as the significand of 2^23 + (q + 128); minus 2^23 + 128: q, exactly.
  __device__ static float q_of(uint32_t wb, int k) {
    return __int_as_float(__byte_perm(wb, 0x4B000000u, static_cast<uint32_t>(k) | 0x7540u)) - 8388736.0f;
  }
  __device__ static void unpack(const Raw& r, float (&f)[8]) {
    const float d = h2f(r.d);
    const uint32_t lo = r.lo ^ 0x80808080u, hi = r.hi ^ 0x80808080u;
#pragma unroll
    for (int k = 0; k < 4; ++k) f[k] = __fmul_rn(q_of(lo, k), d), f[4 + k] = __fmul_rn(q_of(hi, k), d);
  }
};

// ---- the types of issue 12's second part (q4_0, q4_1, q5_0, q5_1, tq3_0, bf16) ----
// Each new type stages a head as stored, densely (kPitch = kHeadBytes: every head here is a multiple of 4 bytes,
// the staged rows stay 4-byte aligned and the V rows 16-byte aligned since TK is a multiple of 16; padding was not
// modelled for bank conflicts as Q8_0's was), by kChunks cp.async copies of the largest size ≤ 16 that divides it.
// A lane's Raw holds its 8 dims as compactly as the decode allows (4-bit quants two to a byte, one word), so
// U keys of K and of V in registers cost no more than Q8_0's; unpack gives core's dequantizer's values exactly
// (d·(q − bias) and d·q + m with one rounding each, __fmul_rn / __fadd_rn as common.cuh's decoders: no FMA
// contraction, quant_ref.cpp's dequantize_row as written).
constexpr int fd_unit_bytes(int head_bytes) { return head_bytes % 16 == 0 ? 16 : head_bytes % 8 == 0 ? 8 : 4; }

// The float of byte k of w (0..255) minus bias, exactly: the byte as the significand of 2^23, minus 2^23 + bias.
__device__ __forceinline__ float fd_byte_f(uint32_t w, int k, float bias) {
  return __int_as_float(__byte_perm(w, 0x4B000000u, static_cast<uint32_t>(k) | 0x7540u)) - (8388608.0f + bias);
}

// The 8 bytes at head + o (o even, head 4-byte aligned) as two words, read as three aligned words (Q8_0's
// read): the third repeats the second when o % 4 == 0; callers make sure o % 4 == 2 never holds for the head's
// last 8 bytes (it would read 2 bytes past the head: past the ring for the tile's last key).
__device__ __forceinline__ void fd_ld8_a2(const uint8_t* head, int o, uint32_t& lo, uint32_t& hi) {
  const auto* w = reinterpret_cast<const uint32_t*>(head + (o & ~3));
  const uint32_t w0 = w[0], w1 = w[1], w2 = w[1 + ((o >> 1) & 1)];
  const uint32_t sel = (o & 2) ? 0x5432u : 0x3210u;
  lo = __byte_perm(w0, w1, sel), hi = __byte_perm(w1, w2, sel);
}

// A lane's 8 4-bit quants out of the 8 qs bytes that hold them (lo: bytes 0..3, hi: 4..7) and the nibble
// (shift 0: values 0..15 of the block, 4: values 16..31): one word, value k < 4 in the low nibble of byte k,
// value 4 + k in its high nibble.
__device__ __forceinline__ uint32_t fd_nibbles8(uint32_t lo, uint32_t hi, int shift) {
  return ((lo >> shift) & 0x0F0F0F0Fu) | (((hi >> shift) & 0x0F0F0F0Fu) << 4);
}

// GGML's 32-value 4/5-bit blocks (core/quant.h: Q4_0 {d, qs[16]}, Q4_1 {d, m, qs[16]}, Q5_0 {d, qh[4], qs[16]},
// Q5_1 {d, m, qh[4], qs[16]}): value j < 16 in the low nibble of qs[j], j ≥ 16 in the high nibble of qs[j − 16],
// 5th bit j of qh. Lane sub's 8 dims are block b = sub / 4, values 8c..8c + 7 with c = sub % 4: qs bytes
// [8·(c % 2), +8) at nibble 4·(c / 2), and qh byte c (bits 8c..8c + 7: value k's 5th bit is bit k).
// kMin: d·q + m (Q4_1, Q5_1) instead of d·(q − kBias) (Q4_0 bias 8, Q5_0 16); k5: the 5th bit.
template <int BlockBytes, int QsOff, int QhOff, bool kMin, int kBias, int D>
struct FdKvGgml {
  static constexpr int kHeadBytes = BlockBytes * D / 32;
  static constexpr int kUnit = fd_unit_bytes(kHeadBytes), kChunks = kHeadBytes / kUnit, kPitch = kHeadBytes;
  static_assert(kHeadBytes % 4 == 0 && kChunks * kUnit == kHeadBytes && D % 64 == 0, "4-byte aligned staged heads");
  static constexpr bool k5 = QhOff >= 0;
  struct Raw {
    uint32_t q;   // fd_nibbles8
    uint32_t dm;  // the fp16 scale d (bits 0..15) and m (Q4_1, Q5_1: bits 16..31) or the qh byte (Q5_0: bits 16..23)
    uint32_t h;   // Q5_1: the qh byte (unused otherwise; never loaded)
  };
  __device__ static Raw load(const uint8_t* head, int sub) {  // head: 4-byte aligned
    const int b = sub >> 2, c = sub & 3, blk = BlockBytes * b, o = blk + QsOff + 8 * (c & 1);
    uint32_t lo, hi;
    if constexpr (BlockBytes % 4 == 0) {  // Q4_1, Q5_1: o is 4-byte aligned
      const auto* w = reinterpret_cast<const uint32_t*>(head + o);
      lo = w[0], hi = w[1];
    } else {  // Q4_0, Q5_0: o % 4 is 2 for even b (never the last block: D / 32 is even)
      fd_ld8_a2(head, o, lo, hi);
    }
    Raw r{fd_nibbles8(lo, hi, 4 * (c >> 1)), 0u, 0u};
    if constexpr (kMin) r.dm = *reinterpret_cast<const uint32_t*>(head + blk);
    else r.dm = *reinterpret_cast<const uint16_t*>(head + blk);
    if constexpr (k5 && kMin) r.h = head[blk + QhOff + c];
    else if constexpr (k5) r.dm |= static_cast<uint32_t>(head[blk + QhOff + c]) << 16;
    return r;
  }
  __device__ static void unpack(const Raw& r, float (&f)[8]) {
    const float d = h2f(r.dm);
    uint32_t a = r.q & 0x0F0F0F0Fu, bb = (r.q >> 4) & 0x0F0F0F0Fu;
    if constexpr (k5) {
      const uint32_t h = kMin ? r.h : r.dm >> 16;
      a |= spread4(h) << 4, bb |= spread4(h >> 4) << 4;
    }
    if constexpr (kMin) {
      const float m = h2f(r.dm >> 16);
#pragma unroll
      for (int k = 0; k < 4; ++k) f[k] = __fadd_rn(__fmul_rn(fd_byte_f(a, k, 0.0f), d), m), f[4 + k] = __fadd_rn(__fmul_rn(fd_byte_f(bb, k, 0.0f), d), m);
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) f[k] = __fmul_rn(fd_byte_f(a, k, kBias), d), f[4 + k] = __fmul_rn(fd_byte_f(bb, k, kBias), d);
    }
  }
};
template <int D>
struct FdKv<DType::Q4_0, D> : FdKvGgml<18, 2, -1, false, 8, D> {};
template <int D>
struct FdKv<DType::Q4_1, D> : FdKvGgml<20, 4, -1, true, 0, D> {};
template <int D>
struct FdKv<DType::Q5_0, D> : FdKvGgml<22, 6, 2, false, 16, D> {};
template <int D>
struct FdKv<DType::Q5_1, D> : FdKvGgml<24, 8, 4, true, 0, D> {};

// TQ3_0 (core/kv_quant.h: 14-byte blocks {fp16 norm, qs[8], signs[4]}, value j's index = 2 bits at 2·(j % 4)
// of qs[j / 4] plus 4 × bit j % 8 of signs[j / 8]; value = centroid[index]·norm in the rotated domain, as
// tq3_dequantize). Lane sub: block b = sub / 4, c = sub % 4: qs bytes 2c, 2c + 1 (one 16-bit word) and signs
// byte c. D 128 / 256 only (at 64 the stored head is a padded 128-group, 16 values per lane: fd_supported
// refuses it). The rotation is the kernel's (fd_tq3_rotate): the query for a TQ3_0 K, the output for a V.
template <int D>
struct FdKv<DType::TQ3_0, D> {
  static constexpr int kHeadBytes = 14 * D / 32;  // 56, 112
  static constexpr int kUnit = fd_unit_bytes(kHeadBytes), kChunks = kHeadBytes / kUnit, kPitch = kHeadBytes;
  static_assert(D % 128 == 0 && kHeadBytes % 8 == 0, "whole 128-groups");
  struct Raw {
    uint32_t idx;   // bits 0..15: the 8 two-bit parts (value k at 2k); bits 16..23: the 8 high bits (value k at 16 + k)
    uint32_t norm;  // fp16 bits
  };
  __device__ static Raw load(const uint8_t* head, int sub) {  // head: 2-byte aligned suffices
    const int blk = 14 * (sub >> 2), c = sub & 3;
    return Raw{*reinterpret_cast<const uint16_t*>(head + blk + 2 + 2 * c) | static_cast<uint32_t>(head[blk + 10 + c]) << 16,
               *reinterpret_cast<const uint16_t*>(head + blk)};
  }
  // c[index]·norm as tq3_dequantize: the centroid from a table in shared memory (lut(), filled by the kernel
  // before its first barrier), one conflict-free load per value (8 words: lanes with the same index broadcast).
  // Why not tq3_centroid's selects: those (or selects between the 4 magnitudes·norm) spilled the G = 1, 2 and
  // 4 instantiations at D 128 (24..100 bytes, ptxas sm_90).
  __device__ static void unpack(const Raw& r, float (&f)[8]) {
    const float d = h2f(r.norm);
    const float* c = lut();
#pragma unroll
    for (int k = 0; k < 8; ++k) f[k] = __fmul_rn(c[((r.idx >> (2 * k)) & 3u) | (((r.idx >> (16 + k)) & 1u) << 2)], d);
  }
  // The 8 centroids by index (kTq3Centroids), per block.
  __device__ static float* lut() {
    __shared__ float t[8];
    return t;
  }
};

// BF16: F16's layout and load, bf16 → FP32 (exact: the upper half of the float).
template <int D>
struct FdKv<DType::BF16, D> {
  static constexpr int kHeadBytes = 2 * D;
  static constexpr int kUnit = 16, kChunks = D / 8, kPitch = kHeadBytes;
  using Raw = uint4;  // 8 bf16
  __device__ static Raw load(const uint8_t* head, int sub) { return *reinterpret_cast<const uint4*>(head + sub * 16); }
  __device__ static void unpack(const Raw& r, float (&f)[8]) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) f[2 * i] = bf2f(w[i]), f[2 * i + 1] = bf2f(w[i] >> 16);
  }
};

// The TQ3_0 rotation of G vectors held as the kernel holds q and acc: lane sub has dims [8·sub, 8·sub + 8) of
// each, a 128-group spans the 16 lanes with the same sub / 16 (D 128: the lane group; D 256: each half-warp).
// R (Inverse false: s2 ⊙ H(s1 ⊙ x)/√128, tq3_rotate) or R⁻¹ (s1 ⊙ H(s2 ⊙ x)/√128, tq3_rotate_inverse),
// operation for operation as core's rotate_group: the butterflies of stages 1, 2, 4 inside the lane, 8..64
// across lanes sub ^ 1..8 (the lane whose bit is clear takes a + b, its partner a − b: both from the same two
// values), so the result is bit-identical to the CPU's. Every lane of the warp calls it (shuffles).
template <int G, bool Inverse>
__device__ __forceinline__ void fd_tq3_rotate(float (&x)[G][8], int sub) {
  const int base = (sub & 15) * 8;  // this lane's first index in its group (a multiple of 8: one byte of a sign word)
  const uint32_t s_in = (tq3_sign_word(Inverse ? 1 : 0, base >> 5) >> (base & 31)) & 0xffu;
  const uint32_t s_out = (tq3_sign_word(Inverse ? 0 : 1, base >> 5) >> (base & 31)) & 0xffu;
#pragma unroll
  for (int h = 0; h < G; ++h) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[h][i] = (s_in >> i) & 1u ? -x[h][i] : x[h][i];
#pragma unroll
    for (int len = 1; len < 8; len <<= 1)
#pragma unroll
      for (int i = 0; i < 8; ++i)
        if (!(i & len)) {
          const float a = x[h][i], b = x[h][i + len];
          x[h][i] = __fadd_rn(a, b), x[h][i + len] = __fsub_rn(a, b);
        }
  }
#pragma unroll
  for (int off = 1; off < 16; off <<= 1)
#pragma unroll
    for (int h = 0; h < G; ++h)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float o = __shfl_xor_sync(0xffffffffu, x[h][i], off);
        x[h][i] = (sub & off) ? __fsub_rn(o, x[h][i]) : __fadd_rn(x[h][i], o);
      }
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float v = __fmul_rn(x[h][i], kTq3InvSqrt128);
      x[h][i] = (s_out >> i) & 1u ? -v : v;
    }
}

struct FdParams {
  AttentionArgs a;
  int n_splits, target, min_chunk;  // fd::split_plan
  int stages;            // the cp.async ring's tiles (2..4)
  int bs_shift;          // log2(block_size) when it is a power of two, else −1 (division)
  float qscale;          // scale, ×log2 e without a soft-cap (scores come out in base 2 directly)
  float* part_acc;       // (n_splits, n, n_head, D) unnormalised output of each split (n_splits > 1)
  float* part_ml;        // (n_splits, n, n_head, 2) base-2 maximum and sum of each split
};

// Keys per lane group per iteration: 4 loads of K and 4 of V in flight per lane; 2 at G = 8, where the
// group's q and acc already take 128 registers (8 heads × 8 dims × 2).
template <int G>
constexpr int fd_unroll() {
  return G >= 8 ? 2 : 4;
}
// Keys of one staged tile: one warp-iteration of every warp, so each warp takes
// its own KPW keys of the tile (4 warps × (32 / lanes per key) × U: 32 keys at D 128, U 4).
template <int D, int G>
constexpr int fd_tile_keys() {
  return fd::kWarps * (32 / fd::lanes_per_key(D)) * fd_unroll<G>();
}
// Shared bytes of one staged tile: its K rows then its V rows at their pitches (F16/F16: U·4 KB, 16 KB for U = 4;
// Q8_0/Q8_0 at D 128: 32 keys · 2 · 192 = 12 KB, of which 8.5 KB are cache bytes).
template <int D, int G, DType KT = DType::F16, DType VT = DType::F16>
constexpr int fd_tile_bytes() {
  return fd_tile_keys<D, G>() * (FdKv<KT, D>::kPitch + FdKv<VT, D>::kPitch);
}
// Shared bytes of the warp merge (fd_finish): (kWarps, G, D) partial outputs + (kWarps, G) m and l.
template <int D, int G>
constexpr int fd_merge_bytes() {
  return (fd::kWarps * G * D + 2 * fd::kWarps * G) * 4;
}

// The cache cell of logical position kp of a sequence whose block-table row is `table`.
__device__ __forceinline__ int64_t fd_cell(const int32_t* table, int kp, int bs, int bs_shift) {
  if (bs_shift >= 0) return (static_cast<int64_t>(table[kp >> bs_shift]) << bs_shift) | (kp & (bs - 1));
  return static_cast<int64_t>(table[kp / bs]) * bs + kp % bs;
}

// The row's visible range [lo, hi) of split z and, for a tree row, its dense end and mask words (shared).
__device__ __forceinline__ void fd_bounds(const FdParams& P, int r, int z, uint32_t* mask, int tid, int& lo, int& end, int& hi) {
  const AttentionArgs& p = P.a;
  lo = 0, end = 0;
  fa::row_bounds(p.positions[r], p.sliding_window, lo, end);
  const bool tree = p.tree_mask != nullptr;  // block-uniform
  if (tree) {
    end = p.kv_len[r];
    if (tid < kAttnMaskWords) mask[tid] = p.tree_mask[static_cast<int64_t>(r) * kAttnMaskWords + tid];
  }
  __syncthreads();  // (block-uniform) the mask words visible to every thread
  hi = tree ? fa::tree_hi(end, mask, kAttnMaskWords) : end;
  fd::split_range(lo, hi, z, P.n_splits, P.target, P.min_chunk);
}

// The group's queries, this lane's 8 dims (sub) of each (dead slots h ≥ g: zeros), times scale.
template <int D, int G>
__device__ __forceinline__ void fd_load_q(const FdParams& P, int r, int kvh, int sub, float scale, float (&q)[G][8]) {
  const AttentionArgs& p = P.a;
  const int g = p.n_head / p.n_head_kv;
#pragma unroll
  for (int h = 0; h < G; ++h) {
    if (h < g) {
      const float* qp = p.q + static_cast<int64_t>(r) * p.q_stride + static_cast<int64_t>(kvh * g + h) * D + sub * 8;
      const float4 a = fd_ldf4(qp), b = fd_ldf4(qp + 4);
      q[h][0] = a.x * scale, q[h][1] = a.y * scale, q[h][2] = a.z * scale, q[h][3] = a.w * scale;
      q[h][4] = b.x * scale, q[h][5] = b.y * scale, q[h][6] = b.z * scale, q[h][7] = b.w * scale;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) q[h][i] = 0.0f;
    }
  }
}

// fd_load_q for a TQ3_0 K: the queries rotated by R (core's kv_prepare_query: tq3_rotate of the unscaled query,
// so the same rotated values as the CPU's; ×1 is exact), then pre-scaled.
template <int D, int G>
__device__ __forceinline__ void fd_load_q_tq3(const FdParams& P, int r, int kvh, int sub, float (&q)[G][8]) {
  fd_load_q<D, G>(P, r, kvh, sub, 1.0f, q);
  fd_tq3_rotate<G, false>(q, sub);
#pragma unroll
  for (int h = 0; h < G; ++h)
#pragma unroll
    for (int i = 0; i < 8; ++i) q[h][i] *= P.qscale;
}

// One iteration of a lane group over its U keys (kr, vr: this lane's 8 dims of each key's K and V as stored,
// FdKv<KT / VT, D>::Raw; ok: the key is visible): scores for every head (this lane's 8-dim partial dot summed
// over the L lanes of the key by shuffles), soft-cap and mask, one max update per head for the U keys, then
// acc += p·v. load_v() runs between the two (F16/F16: nothing, vr is read with kr; other pairs: it reads vr
// there, see the kernel).
template <int D, int G, int U, DType KT = DType::F16, DType VT = DType::F16, class LoadV>
__device__ __forceinline__ void fd_keys(const float (&q)[G][8], float (&m)[G], float (&l)[G], float (&acc)[G][8],
                                        const typename FdKv<KT, D>::Raw (&kr)[U], const typename FdKv<VT, D>::Raw (&vr)[U],
                                        const bool (&ok)[U], float softcap, const LoadV& load_v) {
  constexpr int L = fd::lanes_per_key(D);
  float s[G][U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float kf[8];
    FdKv<KT, D>::unpack(kr[u], kf);
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float d = q[h][0] * kf[0];
#pragma unroll
      for (int i = 1; i < 8; ++i) d = fmaf(q[h][i], kf[i], d);
      s[h][u] = d;
    }
  }
#pragma unroll
  for (int off = L / 2; off > 0; off >>= 1)
#pragma unroll
    for (int h = 0; h < G; ++h)
#pragma unroll
      for (int u = 0; u < U; ++u) s[h][u] += __shfl_xor_sync(0xffffffffu, s[h][u], off);
  // Soft-cap (in the natural base, then to base 2), mask; one max update per head for the U keys.
#pragma unroll
  for (int h = 0; h < G; ++h) {
    float mx = m[h];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float v = s[h][u];
      if (softcap > 0.0f) v = softcap * tanhf(v / softcap) * kFdLog2e;
      v = ok[u] ? v : -INFINITY;
      s[h][u] = v;
      mx = fmaxf(mx, v);
    }
    const float ref = mx == -INFINITY ? 0.0f : mx;  // nothing visible yet: weights stay 0
    const float corr = exp2f(m[h] - ref);
    m[h] = mx;
    float ls = l[h] * corr;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[h][u] = exp2f(s[h][u] - ref);
      ls += s[h][u];
    }
    l[h] = ls;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[h][i] *= corr;
  }
  load_v();
#pragma unroll
  for (int u = 0; u < U; ++u) {
    float vf[8];
    FdKv<VT, D>::unpack(vr[u], vf);
#pragma unroll
    for (int h = 0; h < G; ++h)
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[h][i] = fmaf(s[h][u], vf[i], acc[h][i]);
  }
}

// After the key loop: the warp's lane groups merge by shuffles (lane group 0's state is used), then the 4
// warps through shared memory `sm` (fd_merge_bytes, 16-byte aligned; the caller has synchronised any earlier
// use of it), every thread taking (head, dim) entries in a fixed warp order; the result goes to the output
// (one split) or to split z's partial.
template <int D, int G>
__device__ __forceinline__ void fd_finish(const FdParams& P, int r, int kvh, int z, float (&m)[G], float (&l)[G], float (&acc)[G][8], float* sm) {
  constexpr int L = fd::lanes_per_key(D);
  const AttentionArgs& p = P.a;
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int grp = lane / L, sub = lane % L;
  const int g = p.n_head / p.n_head_kv;
#pragma unroll
  for (int off = L; off < 32; off <<= 1)
#pragma unroll
    for (int h = 0; h < G; ++h) {
      const float mo = __shfl_xor_sync(0xffffffffu, m[h], off), lo_ = __shfl_xor_sync(0xffffffffu, l[h], off);
      const float mx = fmaxf(m[h], mo);
      const float ref = mx == -INFINITY ? 0.0f : mx;
      const float c = exp2f(m[h] - ref), co = exp2f(mo - ref);
      l[h] = l[h] * c + lo_ * co;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float ao = __shfl_xor_sync(0xffffffffu, acc[h][i], off);
        acc[h][i] = acc[h][i] * c + ao * co;
      }
      m[h] = mx;
    }
  float* sm_acc = sm;                            // (kWarps, G, D)
  float* sm_m = sm + fd::kWarps * G * D;         // (kWarps, G)
  float* sm_l = sm_m + fd::kWarps * G;           // (kWarps, G)
  if (grp == 0) {
#pragma unroll
    for (int h = 0; h < G; ++h) {
      float* dst = sm_acc + (warp * G + h) * D + sub * 8;
      *reinterpret_cast<float4*>(dst) = float4{acc[h][0], acc[h][1], acc[h][2], acc[h][3]};
      *reinterpret_cast<float4*>(dst + 4) = float4{acc[h][4], acc[h][5], acc[h][6], acc[h][7]};
      if (sub == 0) sm_m[warp * G + h] = m[h], sm_l[warp * G + h] = l[h];
    }
  }
  __syncthreads();
  for (int idx = tid; idx < g * D; idx += fd::kThreads) {
    const int h = idx / D, d = idx - h * D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < fd::kWarps; ++w) mx = fmaxf(mx, sm_m[w * G + h]);
    const float ref = mx == -INFINITY ? 0.0f : mx;
    float ls = 0.0f, a = 0.0f;
#pragma unroll
    for (int w = 0; w < fd::kWarps; ++w) {
      const float c = exp2f(sm_m[w * G + h] - ref);
      ls += sm_l[w * G + h] * c;
      a += sm_acc[(w * G + h) * D + d] * c;
    }
    const int head = kvh * g + h;
    if (P.n_splits == 1) {
      const float inv = ls > 0.0f ? 1.0f / ls : 0.0f;
      p.out[static_cast<int64_t>(r) * p.out_stride + static_cast<int64_t>(head) * D + d] = a * inv;
    } else {
      // Partial of this split (an empty split: a = 0, l = 0, which the combine weighs 0).
      const int64_t slot = (static_cast<int64_t>(z) * p.n + r) * p.n_head + head;
      P.part_acc[slot * D + d] = a;
      if (d == 0) P.part_ml[2 * slot] = mx, P.part_ml[2 * slot + 1] = ls;
    }
  }
}

// The zero-filling cp.async of N bytes (src_bytes 0: N zero bytes, nothing read).
template <int N>
__device__ __forceinline__ void fd_cp_zfill(void* dst, const void* src, int src_bytes) {
  static_assert(N == 16 || N == 8 || N == 4, "cp.async copies 16, 8 or 4 bytes");
  if constexpr (N == 16) cp_async16_zfill(dst, src, src_bytes);
  else if constexpr (N == 8) cp_async8_zfill(dst, src, src_bytes);
  else cp_async4_zfill(dst, src, src_bytes);
}

// Staging of one key's head of K or V for a pair other than F16/F16: the key's TPK threads (j = 0..TPK−1 of
// them) copy its pieces j, j + TPK, … (KV::kChunks pieces of KV::kUnit bytes) from src (the head in the cache)
// to dst (its staged row); a key that is not visible is zero-filled (in false: nothing is read; a masked key's
// V must be finite, 0 · NaN). Why each thread stages pieces of one key, not consecutive pieces in key order: it then
// looks up one cell per tile for both K and V (a piece order over 17-piece Q8_0 heads needed ~5 lookups per
// thread and part, and spilled at G = 4), and its TPK neighbours still read consecutive bytes (Q8_0 at D 128:
// 4 threads × 8 bytes, one 32-byte sector per warp-load and key).
template <class KV, int TPK>
__device__ __forceinline__ void fd_issue_head(uint8_t* dst, const uint8_t* src, int j, bool in) {
#pragma unroll
  for (int i = 0; i < (KV::kChunks + TPK - 1) / TPK; ++i) {
    const int c = j + i * TPK;
    if (KV::kChunks % TPK == 0 || c < KV::kChunks)
      fd_cp_zfill<KV::kUnit>(dst + c * KV::kUnit, src + c * KV::kUnit, in ? KV::kUnit : 0);
  }
}

// D: head_dim; G: register slots for the group (fd::group_slots(g) ≥ g). Grid (n, n_head_kv, n_splits),
// fd::kThreads threads. The split's keys are staged in shared memory by cp.async (FdParams::stages = S, 2..4):
// tiles of fd_tile_keys keys (K rows, then V rows) in a ring of S, S − 1 tiles in flight ahead of the one
// being computed; each warp computes its own KPW keys of a tile with fd_keys. Why staged (it replaced a kernel
// that loaded K/V straight into registers, run 41): there each warp-iteration waited for a block-table load
// and then for its own K/V, twice per 64-key split at depth 4096 (ncu run 40: 19.7 µs per launch, 857 GB/s,
// 15 % of warps active); staged, the split's bytes are all requested before the first score (16.6 µs, and
// qwen3-8b tg128 +2.5 % / +4.3 % at depths 4096 / 32768 over the register kernel with the same combine).
// Dynamic shared memory: max(S · fd_tile_bytes, fd_merge_bytes), the merge reusing the ring after the last
// tile. Keys past hi and masked tree keys are zero-filled (ok is false).
// KT / VT: the K and V element types (FdKv). F16/F16 is the original kernel, text and code (its staging maps
// each thread to one 16-byte column of CPT keys, shared by K and V); any other pair stages through
// fd_issue_head and reads each lane's dims with FdKv::load, in `if constexpr` branches of the same loop.
//
// Register budget (D ≤ 128): G = 4 in ≤ 128 registers (4 blocks per SM, the default fa_vec_blocks_per_sm),
// G = 2 in ≤ 102 (5), G = 1 in ≤ 64 (8), what the compiler chose unbounded. Why bounded: at 166 registers (a
// loop over splits, since removed) only 3 blocks of G = 4 fit, a 512-block grid at depth 32768 ran in two
// waves and the kernel fell from 63.7 to 98 µs (run 46); a bound makes such a change a compile-time fact.
template <int D, int G>
constexpr int fd_min_blocks() {
  return D > 128 || G > 4 ? 1 : G == 4 ? 4 : G == 2 ? 5 : 8;
}
template <int D, int G, DType KT = DType::F16, DType VT = DType::F16>
__global__ void __launch_bounds__(fd::kThreads, fd_min_blocks<D, G>()) fd_decode_staged_kernel(const FdParams P) {
  grid_wait();  // PDL (pdl.cuh): before any read or write of memory an earlier kernel touches
  grid_launch_dependents();
  constexpr int L = fd::lanes_per_key(D);
  constexpr int NG = 32 / L;
  constexpr int U = fd_unroll<G>();
  constexpr int KPW = NG * U;
  constexpr int TK = fd_tile_keys<D, G>();        // keys per tile
  constexpr int TH = TK * D;                      // halves of K (and of V) per tile
  constexpr int CPR = D / 8;                      // 16-byte chunks per key row
  constexpr int CPT = TK * CPR / fd::kThreads;    // chunks of K (and of V) each thread copies per tile (= U)
  static_assert(TK * CPR == CPT * fd::kThreads && fd::kThreads % CPR == 0, "tile copy shape");
  using KK = FdKv<KT, D>;
  using VV = FdKv<VT, D>;
  constexpr bool kF16 = KT == DType::F16 && VT == DType::F16;
  constexpr int TB = fd_tile_bytes<D, G, KT, VT>();  // bytes per tile (typed pairs: K rows at KK::kPitch, then V rows)
  static_assert(TB % 16 == 0 && TK * KK::kPitch % 16 == 0, "16-byte aligned tiles and V rows");
  const AttentionArgs& p = P.a;
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int grp = lane / L, sub = lane % L;
  const int r = static_cast<int>(blockIdx.x), kvh = static_cast<int>(blockIdx.y), z = static_cast<int>(blockIdx.z);
  __shared__ uint32_t mask[kAttnMaskWords];
  // TQ3_0's centroid table (FdKv<TQ3_0>::unpack), visible after fd_bounds' barrier.
  if constexpr (KT == DType::TQ3_0 || VT == DType::TQ3_0) {
    if (tid < 8) FdKv<DType::TQ3_0, D>::lut()[tid] = tq3_centroid(static_cast<uint32_t>(tid));
  }
  int lo, end, hi;
  fd_bounds(P, r, z, mask, tid, lo, end, hi);
  const bool tree = p.tree_mask != nullptr;
  if (hi <= lo && P.n_splits > 1) {
    // A surplus split (the grid is sized for the bound; the actual range has fewer chunks): only its (m, l)
    // = (−∞, 0), which the combine weighs 0 without reading its acc. Why not the full epilogue: surplus
    // blocks ran it to no use (run 44: qwen3-32b's 64/8 heads at depth 4096 30.7 → 22.9 µs per call).
    const int g = p.n_head / p.n_head_kv;  // (block-uniform: every thread returns here)
    if (tid < g) {
      const int64_t slot = (static_cast<int64_t>(z) * p.n + r) * p.n_head + kvh * g + tid;
      P.part_ml[2 * slot] = -INFINITY, P.part_ml[2 * slot + 1] = 0.0f;
    }
    return;
  }
#ifdef PG_CUDA_HOST_SHIM
  uint16_t* const ring = shim::dynamic_smem<uint16_t>();
#else
  // (S, 2, TK, D): tile t's K rows, then its V rows (F16/F16; other pairs: (S, TB) bytes).
  extern __shared__ __align__(16) uint16_t ring[];
#endif
  const int S = P.stages;
  const int64_t kv_w = static_cast<int64_t>(p.n_head_kv) * D;
  const int32_t* table = p.block_table + static_cast<int64_t>(p.seq[r]) * p.max_blocks;
  const int n_tiles = hi > lo ? (hi - lo + TK - 1) / TK : 0;  // block-uniform
  // Thread tid copies chunk column tid % CPR of keys tid / CPR + i · (kThreads / CPR), i < CPT, of each tile.
  const int ccol = tid % CPR, crow = tid / CPR;
  const auto* kg = static_cast<const uint16_t*>(p.k) + static_cast<int64_t>(kvh) * D + ccol * 8;
  const auto* vg = static_cast<const uint16_t*>(p.v) + static_cast<int64_t>(kvh) * D + ccol * 8;
  // Typed pairs: head kvh of cache cell 0 (rows of p.k_row_bytes / p.v_row_bytes).
  [[maybe_unused]] const auto* kgt = static_cast<const uint8_t*>(p.k) + static_cast<int64_t>(kvh) * KK::kHeadBytes;
  [[maybe_unused]] const auto* vgt = static_cast<const uint8_t*>(p.v) + static_cast<int64_t>(kvh) * VV::kHeadBytes;
  auto issue = [&](int t) {
    if constexpr (kF16) {
      uint16_t* kd = ring + static_cast<int64_t>(t % S) * 2 * TH;
      uint16_t* vd = kd + TH;
#pragma unroll
      for (int i = 0; i < CPT; ++i) {
        const int key = crow + i * (fd::kThreads / CPR), kp = lo + t * TK + key;
        // Only visible keys are read (a masked key's V must be 0, not whatever its cell holds: 0 · NaN).
        const bool in = kp < hi && (!tree || kp < end || fa::tree_visible(kp, end, mask, kAttnMaskWords));
        const int64_t off = in ? fd_cell(table, kp, p.block_size, P.bs_shift) * kv_w : 0;
        cp_async16_zfill(kd + key * D + ccol * 8, kg + off, in ? 16 : 0);
        cp_async16_zfill(vd + key * D + ccol * 8, vg + off, in ? 16 : 0);
      }
    } else {
      // Thread tid stages key tid / TPK of the tile, pieces tid % TPK + i·TPK of its K and of its V head.
      constexpr int TPK = fd::kThreads / TK;
      static_assert(TPK * TK == fd::kThreads, "whole threads per key");
      uint8_t* kd = reinterpret_cast<uint8_t*>(ring) + static_cast<int64_t>(t % S) * TB;
      const int key = tid / TPK, j = tid % TPK, kp = lo + t * TK + key;
      const bool in = kp < hi && (!tree || kp < end || fa::tree_visible(kp, end, mask, kAttnMaskWords));
      const int64_t cl = in ? fd_cell(table, kp, p.block_size, P.bs_shift) : 0;
      fd_issue_head<KK, TPK>(kd + key * KK::kPitch, kgt + cl * static_cast<int64_t>(p.k_row_bytes), j, in);
      fd_issue_head<VV, TPK>(kd + TK * KK::kPitch + key * VV::kPitch, vgt + cl * static_cast<int64_t>(p.v_row_bytes), j, in);
    }
  };
  // The prologue: tiles 0..S−2 (a group is committed per tile slot, empty or not, so the wait counts hold).
  for (int t = 0; t < S - 1; ++t) {
    if (t < n_tiles) issue(t);
    cp_async_commit();
  }
  float q[G][8];
  if constexpr (KT == DType::TQ3_0) fd_load_q_tq3<D, G>(P, r, kvh, sub, q);
  else fd_load_q<D, G>(P, r, kvh, sub, P.qscale, q);
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int h = 0; h < G; ++h) {
    m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[h][i] = 0.0f;
  }
  for (int t = 0; t < n_tiles; ++t) {
    // Groups committed so far: S − 1 + t; tile t's is complete when at most S − 2 newer ones are pending.
    if (S == 2) cp_async_wait<0>();
    else if (S == 3) cp_async_wait<1>();
    else cp_async_wait<2>();
    __syncthreads();  // tile t visible to every thread; every warp is done with tile t − 1, whose slot is refilled next
    if (t + S - 1 < n_tiles) issue(t + S - 1);
    cp_async_commit();
    if constexpr (kF16) {
      const uint16_t* kt = ring + static_cast<int64_t>(t % S) * 2 * TH;
      const uint16_t* vt = kt + TH;
      uint4 kr[U], vr[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int key = warp * KPW + u * NG + grp, kp = lo + t * TK + key;
        ok[u] = kp < hi && (!tree || kp < end || fa::tree_visible(kp, end, mask, kAttnMaskWords));
        kr[u] = *reinterpret_cast<const uint4*>(kt + key * D + sub * 8);
        vr[u] = *reinterpret_cast<const uint4*>(vt + key * D + sub * 8);
      }
      fd_keys<D, G, U>(q, m, l, acc, kr, vr, ok, p.softcap, [] {});
    } else {
      // V is read after the scores (load_v), not with K as F16/F16 does: the decode temporaries of a Q8_0 K beside
      // four F16 V keys spilled at G = 4 (128 registers); read there, no pair spills.
      const uint8_t* kt = reinterpret_cast<const uint8_t*>(ring) + static_cast<int64_t>(t % S) * TB;
      const uint8_t* vt = kt + TK * KK::kPitch;
      typename KK::Raw kr[U];
      typename VV::Raw vr[U];
      bool ok[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int key = warp * KPW + u * NG + grp, kp = lo + t * TK + key;
        ok[u] = kp < hi && (!tree || kp < end || fa::tree_visible(kp, end, mask, kAttnMaskWords));
        kr[u] = KK::load(kt + key * KK::kPitch, sub);
      }
      fd_keys<D, G, U, KT, VT>(q, m, l, acc, kr, vr, ok, p.softcap, [&] {
#pragma unroll
        for (int u = 0; u < U; ++u) vr[u] = VV::load(vt + (warp * KPW + u * NG + grp) * VV::kPitch, sub);
      });
    }
  }
  // A TQ3_0 V: acc is Σ p·R(v), in the rotated domain; R⁻¹ is linear, so each lane group's partial is turned back
  // here and every later merge (lane groups, warps, splits) combines outputs (the CPU un-rotates the final sum).
  if constexpr (VT == DType::TQ3_0) fd_tq3_rotate<G, true>(acc, sub);
  cp_async_wait<0>();
  __syncthreads();  // the ring is free for the merge
  fd_finish<D, G>(P, r, kvh, z, m, l, acc, reinterpret_cast<float*>(ring));
}

// Dynamic shared bytes of fd_decode_staged_kernel<D, G, KT, VT> with S stages.
template <int D, int G, DType KT = DType::F16, DType VT = DType::F16>
constexpr int fd_staged_smem(int S) {
  constexpr int tile = fd_tile_bytes<D, G, KT, VT>();
  return S * tile > fd_merge_bytes<D, G>() ? S * tile : fd_merge_bytes<D, G>();
}

constexpr int kCombineWarps = 8;  // fd_combine_kernel: warps per (row, head); each takes every 8th split

// Merges the split partials: one block of kCombineWarps warps per (row, head). Warp w sums splits w, w + 8, …
// (n_splits ≤ 64: 8 each), every lane D/32 consecutive dims, all its loads issued before the weights are
// known; then the warps' sums add in warp order through shared memory. Why: with one warp per (row, head)
// and 8 splits' loads at a time the combine was 8 dependent rounds of loads over only n·n_head/4 blocks
// (ncu, run 40: 7.3 µs per launch at depth 4096 over 8 blocks). Weights 2^(m_z − M) with M the maximum of
// the non-empty splits (l > 0); an empty split weighs 0 and its acc is not read (a surplus split writes
// none), so one non-empty split gives the bits of the unsplit kernel's direct write.
template <int D>
__global__ void __launch_bounds__(32 * kCombineWarps) fd_combine_kernel(const float* part_acc,  // (n_splits, n, n_head, D)
                                                                        const float* part_ml,   // (n_splits, n, n_head, 2)
                                                                        int n_splits, int n_rh,  // n_rh = n·n_head
                                                                        int n_head,
                                                                        float* out,  // (n, out_stride), heads at h·D
                                                                        int64_t out_stride) {
  grid_wait();  // PDL (pdl.cuh): the partials come from the kernel just before
  grid_launch_dependents();
  constexpr int PER = D / 32;                        // dims per lane: 2, 4, 8
  constexpr int J = fd::kMaxSplits / kCombineWarps;  // splits per warp
  __shared__ __align__(16) float red[kCombineWarps][D];
  const int tid = static_cast<int>(threadIdx.x), warp = tid >> 5, lane = tid & 31;
  const int rh = static_cast<int>(blockIdx.x);
  const int64_t per_split = n_rh;
  // Every warp reads the (m, l) of all splits (lane z: splits z and z + 32) and computes their weights.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  if (lane < n_splits) m0 = part_ml[2 * (lane * per_split + rh)], l0 = part_ml[2 * (lane * per_split + rh) + 1];
  if (lane + 32 < n_splits) m1 = part_ml[2 * ((lane + 32) * per_split + rh)], l1 = part_ml[2 * ((lane + 32) * per_split + rh) + 1];
  // This warp's splits' values, all issued before the weights are computed; an empty split (l = 0: a
  // surplus split writes no acc) is not read.
  float v[J][PER];
  const float* base = part_acc + static_cast<int64_t>(rh) * D + lane * PER;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int zz = warp + j * kCombineWarps;  // < 64: lane zz % 32 holds its l in l0 (zz < 32) or l1
    const float la = __shfl_sync(0xffffffffu, l0, zz & 31), lb = __shfl_sync(0xffffffffu, l1, zz & 31);
    const bool full = zz < n_splits && (zz < 32 ? la : lb) > 0.0f;
#pragma unroll
    for (int i = 0; i < PER; i += 2) {
      float2 t = float2{0.0f, 0.0f};
      if (full) t = *reinterpret_cast<const float2*>(base + zz * per_split * D + i);
      v[j][i] = t.x, v[j][i + 1] = t.y;
    }
  }
  float mx = fmaxf(l0 > 0.0f ? m0 : -INFINITY, l1 > 0.0f ? m1 : -INFINITY);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  const float ref = mx == -INFINITY ? 0.0f : mx;
  const float w0 = l0 > 0.0f ? exp2f(m0 - ref) : 0.0f, w1 = l1 > 0.0f ? exp2f(m1 - ref) : 0.0f;
  float ls = l0 * w0 + l1 * w1;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ls += __shfl_xor_sync(0xffffffffu, ls, off);
  float s[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) s[i] = 0.0f;
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int zz = warp + j * kCombineWarps;  // < 64: lane zz % 32 holds its weight in w0 (zz < 32) or w1
    const float wa = __shfl_sync(0xffffffffu, w0, zz & 31), wb = __shfl_sync(0xffffffffu, w1, zz & 31);
    const float w = zz < n_splits ? (zz < 32 ? wa : wb) : 0.0f;
#pragma unroll
    for (int i = 0; i < PER; ++i) s[i] = w != 0.0f ? fmaf(v[j][i], w, s[i]) : s[i];
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) red[warp][lane * PER + i] = s[i];
  __syncthreads();
  const float inv = ls > 0.0f ? 1.0f / ls : 0.0f;
  const int r = rh / n_head, h = rh - r * n_head;
  for (int d = tid; d < D; d += 32 * kCombineWarps) {
    float t = red[0][d];
#pragma unroll
    for (int w = 1; w < kCombineWarps; ++w) t += red[w][d];
    out[static_cast<int64_t>(r) * out_stride + static_cast<int64_t>(h) * D + d] = t * inv;
  }
}

fd::Plan fd_plan(const AttentionArgs& a, int n_sm) {
  int max_kv = std::max(1, a.max_kv_len);
  if (a.kv_capacity > 0) {  // graph-captured shapes: the grid serves every length up to the capacity (its bucket)
    int cap = 64;
    while (cap < a.kv_capacity) cap *= 2;
    max_kv = std::max(max_kv, cap);
  }
  // A causal row of a sliding-window layer sees at most `window` keys whatever the depth: the splits are sized
  // for that (tree rows may see more: their drafts past kv_len; they keep the full bound).
  if (a.sliding_window > 0 && a.tree_mask == nullptr) max_kv = std::min(max_kv, a.sliding_window);
  const int fill = std::max(1, a.fa_vec_blocks_per_sm) * std::max(1, n_sm);
  return fd::split_plan(a.n * a.n_head_kv, fill, max_kv, a.fa_vec_min_chunk);
}

// The (K, V) type pairs with an instantiation (fd_launch_kv; the list of the file's header).
bool fd_pair_supported(DType k, DType v) {
  const auto f16_or_q8 = [](DType t) { return t == DType::F16 || t == DType::Q8_0; };
  const auto low_bit = [](DType t) {
    return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::TQ3_0;
  };
  if (f16_or_q8(k) && f16_or_q8(v)) return true;
  if (k == v && (low_bit(k) || k == DType::BF16)) return true;
  return k == DType::F16 && low_bit(v);
}

// (Named apart from attention_decode_supported so the host emulation's copy never meets the CUDA library's
// through argument-dependent lookup.)
bool fd_supported(const AttentionArgs& a) {
  if (a.n <= 0 || a.n > fd::kMaxRows) return false;
  if (a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0 || a.n_head / a.n_head_kv > fd::kMaxGroup) return false;
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) return false;
  if (a.typed) {
    // The pairs instantiated (fd_launch_kv): K and V each F16 or Q8_0; K = V one of q4_0, q4_1, q5_0, q5_1, tq3_0,
    // bf16; F16 K with a q4_0 / q4_1 / q5_0 / q5_1 / tq3_0 V. TQ3_0 at head_dim 128 / 256 only (at 64 its head is
    // a padded 128-group). Rows of n_head_kv heads in core/kv_quant.h's layout (the row strides the kernel uses).
    if (!fd_pair_supported(a.k_type, a.v_type)) return false;
    if ((a.k_type == DType::TQ3_0 || a.v_type == DType::TQ3_0) && a.head_dim < 128) return false;
    if (a.k_row_bytes != kv_row_bytes(a.k_type, a.n_head_kv, a.head_dim)) return false;
    if (a.v_row_bytes != kv_row_bytes(a.v_type, a.n_head_kv, a.head_dim)) return false;
  } else if (!a.kv_f16) {
    return false;
  }
  // 16-byte loads: the cache bases (rows of n_head_kv·head_dim halves are multiples of 16 bytes; Q8_0 rows and
  // heads of multiples of its copy size head_dim / 16) and q.
  const auto al16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return al16(a.k) && al16(a.v) && al16(a.q) && a.q_stride % 4 == 0 && a.block_size > 0;
}

template <int D, int G, DType KT, DType VT>
void fd_launch(const FdParams& P, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(P.a.n), static_cast<unsigned>(P.a.n_head_kv), static_cast<unsigned>(P.n_splits));
  auto kernel = fd_decode_staged_kernel<D, G, KT, VT>;
  const int smem = fd_staged_smem<D, G, KT, VT>(P.stages);
#ifndef PG_CUDA_HOST_SHIM
  static SmemOptIn optin;  // one per instantiation: up to 4 · 16 KB + the static mask words
  optin.ensure(reinterpret_cast<const void*>(kernel), smem);
#endif
  PG_FD_LAUNCH(kernel, grid, fd::kThreads, smem, stream, P);
}

template <int D, DType KT, DType VT>
void fd_launch_d(const FdParams& P, cudaStream_t stream) {
  switch (fd::group_slots(P.a.n_head / P.a.n_head_kv)) {
    case 1: fd_launch<D, 1, KT, VT>(P, stream); break;
    case 2: fd_launch<D, 2, KT, VT>(P, stream); break;
    case 4: fd_launch<D, 4, KT, VT>(P, stream); break;
    default: fd_launch<D, 8, KT, VT>(P, stream); break;
  }
  check_launch("attention_decode");
  if (P.n_splits > 1) {
    const int n_rh = P.a.n * P.a.n_head;
    auto combine = fd_combine_kernel<D>;
    PG_FD_LAUNCH(combine, dim3(static_cast<unsigned>(n_rh)), 32 * kCombineWarps, 0, stream, P.part_acc, P.part_ml, P.n_splits, n_rh,
                 P.a.n_head, P.a.out, P.a.out_stride);
    check_launch("attention_decode combine");
  }
}

// The (K, V) element-type pair of the cache (fd_supported: fd_pair_supported's pairs; TQ3_0 at D ≥ 128).
template <int D>
void fd_launch_kv(const FdParams& P, cudaStream_t stream) {
  const DType kt = P.a.typed ? P.a.k_type : DType::F16, vt = P.a.typed ? P.a.v_type : DType::F16;
  const bool kq = kt == DType::Q8_0, vq = vt == DType::Q8_0;
  if ((kt == DType::F16 || kq) && (vt == DType::F16 || vq)) {
    if (!kq && !vq) fd_launch_d<D, DType::F16, DType::F16>(P, stream);
    else if (kq && vq) fd_launch_d<D, DType::Q8_0, DType::Q8_0>(P, stream);
    else if (kq) fd_launch_d<D, DType::Q8_0, DType::F16>(P, stream);
    else fd_launch_d<D, DType::F16, DType::Q8_0>(P, stream);
    return;
  }
  // K = V (q4_0 … bf16) or an F16 K with a low-bit V.
  const bool same = kt == vt;
  switch (vt) {
    case DType::Q4_0: same ? fd_launch_d<D, DType::Q4_0, DType::Q4_0>(P, stream) : fd_launch_d<D, DType::F16, DType::Q4_0>(P, stream); break;
    case DType::Q4_1: same ? fd_launch_d<D, DType::Q4_1, DType::Q4_1>(P, stream) : fd_launch_d<D, DType::F16, DType::Q4_1>(P, stream); break;
    case DType::Q5_0: same ? fd_launch_d<D, DType::Q5_0, DType::Q5_0>(P, stream) : fd_launch_d<D, DType::F16, DType::Q5_0>(P, stream); break;
    case DType::Q5_1: same ? fd_launch_d<D, DType::Q5_1, DType::Q5_1>(P, stream) : fd_launch_d<D, DType::F16, DType::Q5_1>(P, stream); break;
    case DType::TQ3_0:
      if constexpr (D >= 128) {
        same ? fd_launch_d<D, DType::TQ3_0, DType::TQ3_0>(P, stream) : fd_launch_d<D, DType::F16, DType::TQ3_0>(P, stream);
      }
      break;
    default: fd_launch_d<D, DType::BF16, DType::BF16>(P, stream); break;  // BF16 (fd_supported: nothing else reaches here)
  }
}

}  // namespace

bool attention_decode_supported(const AttentionArgs& a) { return fd_supported(a); }

size_t attention_decode_scratch_bytes(const AttentionArgs& a, int n_sm) {
  if (!fd_supported(a)) return 0;
  const fd::Plan pl = fd_plan(a, n_sm);
  if (pl.n_splits <= 1) return 0;
  // part_acc (n_splits, n, n_head, D) + part_ml (n_splits, n, n_head, 2), FP32.
  return static_cast<size_t>(pl.n_splits) * static_cast<size_t>(a.n) * static_cast<size_t>(a.n_head) * static_cast<size_t>(a.head_dim + 2) *
         sizeof(float);
}

void attention_decode(const AttentionArgs& a, void* scratch, int n_sm, cudaStream_t stream) {
  PG_CHECK(fd_supported(a),
           "attention_decode: unsupported shape (K/V pair of fd_pair_supported, head_dim 64/128/256 (tq3_0: 128/256), GQA ≤ 8, 1..8 rows, aligned q/K/V)");
  const fd::Plan pl = fd_plan(a, n_sm);
  PG_CHECK(a.n_head_kv <= 65535, "attention_decode: too many KV heads");
  FdParams P{};
  P.a = a;
  P.n_splits = pl.n_splits;
  P.target = pl.target;
  P.min_chunk = pl.min_chunk;
  P.stages = std::clamp(a.fa_vec_stages, 2, fd::kMaxStages);
  P.bs_shift = std::has_single_bit(static_cast<unsigned>(a.block_size)) ? std::countr_zero(static_cast<unsigned>(a.block_size)) : -1;
  P.qscale = a.softcap > 0.0f ? a.scale : a.scale * kFdLog2e;
  if (P.n_splits > 1) {
    PG_CHECK(scratch != nullptr, "attention_decode: missing split scratch");
    P.part_acc = static_cast<float*>(scratch);
    P.part_ml = P.part_acc + static_cast<size_t>(P.n_splits) * a.n * a.n_head * a.head_dim;
  }
  switch (a.head_dim) {
    case 64: fd_launch_kv<64>(P, stream); break;
    case 128: fd_launch_kv<128>(P, stream); break;
    default: fd_launch_kv<256>(P, stream); break;
  }
}

}  // namespace PG_FD_NAMESPACE
