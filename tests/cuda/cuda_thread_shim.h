// Host emulation of the CUDA execution model for one kernel file, backend/cuda/attention_prefill.cu, so
// that its kernels run on the CPU (tests/cuda/test_cuda_fa_emulated.cpp). Each CUDA thread of a block is
// a host thread; blocks run one after another. Implemented:
//  - threadIdx / blockIdx / blockDim / gridDim (thread-local), __syncthreads (a barrier of the block's threads),
//    __shared__ as function statics (shared by the block's threads; blocks do not overlap), the dynamic
//    shared memory (filled with 0xFF bytes — FP16 NaN — so a read of a never-written element shows);
//  - the warp intrinsics the kernel uses, __shfl_xor_sync, __shfl_sync and __all_sync, through a per-warp exchange
//    area and barrier (all 32 lanes must take part, as the kernel's full masks promise);
//  - ldmatrix.x4 (plain and .trans) and mma.m16n8k16 (f16 in, f32 accumulate) from the PTX ISA's
//    fragment definitions (the same tables test_cuda_fa_layout.cpp checks the kernel's helpers against);
//  - cp.async (16/8/4 bytes with zero fill, and the plain 16/8/4-byte forms, alignment checked but for the
//    16-byte zero-fill form): a copy is queued
//    when issued and performed at the cp.async.wait_group that retires its group, not before, so a read of a
//    tile before its wait sees the old contents (NaN at first);
//  - the scalar intrinsics of backend/cuda/common.cuh and kv_quant.cuh (the typed-KV decoders) come from
//    tests/cuda/cuda_host_shim.h, which common.cuh includes under PG_CUDA_HOST_SHIM.
// FP16 conversions round to nearest even (core/fp16.h), as __floats2half2_rn does.
#pragma once
#include <cuda_runtime_api.h>  // dim3, float2 (host definitions)

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "core/fp16.h"

// (cuda_runtime_api.h defines these for the host compiler already; here they become plain C++.)
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct PgShimDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local PgShimDim3 threadIdx, blockIdx, blockDim, gridDim;

// Everything lives in pg::cuda::host_emu, where the emulated attention_prefill.cu puts its kernels and
// launchers (so they never clash with the real ones of the CUDA library the test also links).
namespace pg::cuda::host_emu {
using std::max;
using std::min;
inline void check_launch(const char*) {}  // hides pg::cuda::check_launch (no CUDA launch happened)

namespace shim {

struct Warp {
  std::barrier<> bar{32};
  uint64_t val[32] = {};
  const uint16_t* row[32] = {};
  uint32_t a[32][4] = {}, b[32][2] = {};
};
struct Block {
  explicit Block(int threads) : bar(threads), warps(static_cast<size_t>((threads + 31) / 32)) {}
  std::barrier<> bar;
  std::vector<Warp> warps;
  std::vector<uint8_t> dyn;
};
inline Block* g_block = nullptr;

inline int lane() { return static_cast<int>(threadIdx.x & 31); }
inline Warp& warp() { return g_block->warps[threadIdx.x >> 5]; }

template <class T>
T* dynamic_smem() {
  return reinterpret_cast<T*>(g_block->dyn.data());
}

// Pending cp.async copies of this thread: the open group and the committed ones, oldest first.
struct Copy {
  void* dst;
  const void* src;
  int bytes;  // bytes read from src (0: none)
  int total;  // bytes written at dst: the read ones, then zeros (cp.async's src-size < cp-size)
};
inline thread_local std::vector<Copy> t_open;
inline std::atomic<long> g_misaligned{0};  // cp.async copies issued with a misaligned address (never performed)
inline thread_local std::vector<std::vector<Copy>> t_groups;

// Runs body() as every thread of every block of the grid (blocks in order x, then y, then z).
inline void launch(dim3 grid, dim3 block, size_t dyn_bytes, const std::function<void()>& body) {
  const int threads = static_cast<int>(block.x);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        auto blk = std::make_unique<Block>(threads);
        blk->dyn.assign(dyn_bytes + 16, 0xFF);
        g_block = blk.get();
        std::vector<std::thread> ts;
        ts.reserve(static_cast<size_t>(threads));
        for (int t = 0; t < threads; ++t)
          ts.emplace_back([&, t] {
            threadIdx = {static_cast<unsigned>(t), 0, 0};
            blockIdx = {x, y, z};
            blockDim = {static_cast<unsigned>(threads), 1, 1};
            gridDim = {grid.x, grid.y, grid.z};
            t_open.clear();
            t_groups.clear();
            body();
          });
        for (auto& t : ts) t.join();
        g_block = nullptr;
      }
}

}  // namespace shim

inline void __syncthreads() { shim::g_block->bar.arrive_and_wait(); }
// Global-memory atomics and fences (the fused split combine): blocks run one after another, so a fence has
// nothing to order across blocks; the atomic is real because a block's threads run concurrently.
inline std::atomic<long> g_atomic_adds{0};  // atomicAdd calls, so a test can see the fused path ran
inline int atomicAdd(int* p, int v) {
  g_atomic_adds.fetch_add(1);
  return std::atomic_ref<int>(*p).fetch_add(v);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

namespace shim {
// One warp-wide exchange: every lane publishes v and receives lane src's (0..31).
template <class T>
T exchange(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of ≤ 8 bytes");
  Warp& w = warp();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  w.val[lane()] = bits;
  w.bar.arrive_and_wait();
  bits = w.val[src & 31];
  w.bar.arrive_and_wait();
  T r;
  std::memcpy(&r, &bits, sizeof(T));
  return r;
}
}  // namespace shim
template <class T>
T __shfl_xor_sync(unsigned, T v, int off) {
  return shim::exchange(v, shim::lane() ^ off);
}
// Indexed form (lane src of the warp).
template <class T>
T __shfl_sync(unsigned, T v, int src) {
  return shim::exchange(v, src);
}
inline bool __all_sync(unsigned, bool pred) {
  shim::Warp& w = shim::warp();
  w.val[shim::lane()] = pred ? 1 : 0;
  w.bar.arrive_and_wait();
  bool all = true;
  for (int l = 0; l < 32; ++l) all = all && w.val[l] != 0;
  w.bar.arrive_and_wait();
  return all;
}
inline int __ffsll(long long v) { return __builtin_ffsll(v); }

inline void cp_async16_zfill(void* dst, const void* src, int src_bytes) { shim::t_open.push_back({dst, src, src_bytes, 16}); }
// async_copy.cuh's plain forms (the typed-KV staging copies): 16, 8 or 4 bytes, both pointers aligned to it.
inline void cp_async_bytes(void* dst, const void* src, int bytes) {
  if (reinterpret_cast<uintptr_t>(dst) % static_cast<uintptr_t>(bytes) != 0 || reinterpret_cast<uintptr_t>(src) % static_cast<uintptr_t>(bytes) != 0) {
    shim::g_misaligned.fetch_add(1);  // the hardware faults on a misaligned cp.async: the test checks this count
    return;
  }
  shim::t_open.push_back({dst, src, bytes, bytes});
}
// The 8- and 4-byte zero-fill forms (attention_decode.cu's q8_0 staging), alignment checked like the plain ones.
inline void cp_async_zfill_bytes(void* dst, const void* src, int bytes, int src_bytes) {
  const auto n = static_cast<uintptr_t>(bytes);
  if (reinterpret_cast<uintptr_t>(dst) % n != 0 || reinterpret_cast<uintptr_t>(src) % n != 0) {
    shim::g_misaligned.fetch_add(1);
    return;
  }
  shim::t_open.push_back({dst, src, src_bytes, bytes});
}
inline void cp_async8_zfill(void* dst, const void* src, int src_bytes) { cp_async_zfill_bytes(dst, src, 8, src_bytes); }
inline void cp_async4_zfill(void* dst, const void* src, int src_bytes) { cp_async_zfill_bytes(dst, src, 4, src_bytes); }
inline void cp_async16(void* dst, const void* src) { cp_async_bytes(dst, src, 16); }
inline void cp_async8(void* dst, const void* src) { cp_async_bytes(dst, src, 8); }
inline void cp_async4(void* dst, const void* src) { cp_async_bytes(dst, src, 4); }
inline void cp_async_commit() {
  shim::t_groups.push_back(std::move(shim::t_open));
  shim::t_open.clear();
}
template <int N>
void cp_async_wait() {
  while (shim::t_groups.size() > static_cast<size_t>(N)) {
    for (const shim::Copy& c : shim::t_groups.front()) {
      if (c.bytes > 0) std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
      if (c.total > c.bytes) std::memset(static_cast<uint8_t*>(c.dst) + c.bytes, 0, static_cast<size_t>(c.total - c.bytes));
    }
    shim::t_groups.erase(shim::t_groups.begin());
  }
}

// ldmatrix.x4: lane 8i + j gives the address of row j of matrix i; register i of lane l receives, plain:
// row l/4, elements 2(l%4), 2(l%4)+1; .trans: element l/4 of rows 2(l%4) and 2(l%4)+1.
inline void ldsm_impl(uint32_t (&r)[4], const void* p, bool trans) {
  shim::Warp& w = shim::warp();
  const int l = shim::lane();
  w.row[l] = static_cast<const uint16_t*>(p);
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    uint32_t v = 0;
    for (int h = 0; h < 2; ++h) {
      const int row = trans ? 2 * (l & 3) + h : l >> 2, col = trans ? l >> 2 : 2 * (l & 3) + h;
      v |= static_cast<uint32_t>(w.row[8 * i + row][col]) << (16 * h);
    }
    r[i] = v;
  }
  w.bar.arrive_and_wait();
}
inline void ldsm_x4(uint32_t (&r)[4], const void* p) { ldsm_impl(r, p, false); }
inline void ldsm_x4_trans(uint32_t (&r)[4], const void* p) { ldsm_impl(r, p, true); }

// mma.m16n8k16.row.col.f32.f16.f16.f32 (PTX fragment tables; groupID = lane/4, tid = lane%4):
// A a_i: row groupID (+8 for i = 2,3,6,7), col 2·tid + (i&1) (+8 for i ≥ 4); B b_i: k = 2·tid + (i&1)
// (+8 for i ≥ 2), n = groupID; C c_i: row groupID (+8 for i ≥ 2), col 2·tid + (i&1).
inline void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  shim::Warp& w = shim::warp();
  const int l = shim::lane();
  for (int r = 0; r < 4; ++r) w.a[l][r] = a[r];
  w.b[l][0] = b0, w.b[l][1] = b1;
  w.bar.arrive_and_wait();
  float A[16][16], B[16][8];
  for (int s = 0; s < 32; ++s) {
    for (int i = 0; i < 8; ++i) {
      const int row = (s >> 2) + ((i == 2 || i == 3 || i == 6 || i == 7) ? 8 : 0), col = 2 * (s & 3) + (i & 1) + (i >= 4 ? 8 : 0);
      A[row][col] = fp16_to_f32(static_cast<uint16_t>(w.a[s][i / 2] >> (16 * (i % 2))));
    }
    for (int i = 0; i < 4; ++i) {
      const int k = 2 * (s & 3) + (i & 1) + (i >= 2 ? 8 : 0), n = s >> 2;
      B[k][n] = fp16_to_f32(static_cast<uint16_t>(w.b[s][i / 2] >> (16 * (i % 2))));
    }
  }
  w.bar.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    const int row = (l >> 2) + (i >= 2 ? 8 : 0), col = 2 * (l & 3) + (i & 1);
    float s = 0.0f;
    for (int k = 0; k < 16; ++k) s += A[row][k] * B[k][col];
    c[i] += s;
  }
}

inline uint32_t pack_h2(float lo, float hi) {
  return static_cast<uint32_t>(f32_to_fp16(lo)) | (static_cast<uint32_t>(f32_to_fp16(hi)) << 16);
}
inline float2 unpack_h2(uint32_t u) {
  return float2{fp16_to_f32(static_cast<uint16_t>(u & 0xffff)), fp16_to_f32(static_cast<uint16_t>(u >> 16))};
}

}  // namespace pg::cuda::host_emu
