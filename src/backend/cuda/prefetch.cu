// L2 prefetch of weight regions (CudaOptions::l2_prefetch_mb; the plan: prefetch_plan.h).
//
// Contract (l2_prefetch_kernel): a hint, nothing else. It asks the L2 cache to fetch up to
// PrefetchSet::kMax regions of device memory — region i = [ptr_i, ptr_i + bytes_i), ptr_i 16-byte aligned,
// bytes_i a multiple of 16 (prefetch_clip) — and writes nothing, so it can never change a result. It runs
// on the backend's side stream, forked from the main stream right after a matmul's launches, so it overlaps
// the small ops that follow instead of delaying them (cuda_backend.cpp: prefetch_after).
// One block of kThreads threads; thread t issues chunks t, t + kThreads, ... of kChunk bytes with the
// Hopper bulk prefetch (cp.async.bulk.prefetch.L2: one instruction per chunk, no registers or shared memory
// held while the bytes arrive, so the block exits at once). Below sm_90 the kernel does nothing.
#include "backend/cuda/kernels.h"

namespace pg::cuda {
namespace {

constexpr int kThreads = 128;
constexpr uint32_t kChunk = 64u << 10;  // bytes per bulk prefetch instruction (a multiple of 16)

struct PrefetchArgs {
  const uint8_t* ptr[kMaxPrefetchRegions];  // 16-byte aligned
  uint64_t bytes[kMaxPrefetchRegions];      // multiples of 16
  int n;
};

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const PrefetchArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int i = 0; i < a.n; ++i) {
    const uint64_t chunks = (a.bytes[i] + kChunk - 1) / kChunk;
    for (uint64_t c = threadIdx.x; c < chunks; c += kThreads) {
      const uint64_t off = c * kChunk;
      const uint64_t left = a.bytes[i] - off;
      const uint32_t n = left < kChunk ? static_cast<uint32_t>(left) : kChunk;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a.ptr[i] + off), "r"(n) : "memory");
    }
  }
#endif
}

}  // namespace

void l2_prefetch(const void* const* ptr, const size_t* bytes, int n, cudaStream_t stream) {
  PrefetchArgs a{};
  a.n = 0;
  for (int i = 0; i < n && i < kMaxPrefetchRegions; ++i) {
    if (bytes[i] < 16) continue;
    a.ptr[a.n] = static_cast<const uint8_t*>(ptr[i]);
    a.bytes[a.n] = bytes[i] & ~size_t{15};
    ++a.n;
  }
  if (a.n == 0) return;
  l2_prefetch_kernel<<<1, kThreads, 0, stream>>>(a);
  check_launch("l2_prefetch");
}

}  // namespace pg::cuda
