// L2 prefetch of weight regions (CudaOptions::l2_prefetch_mb; the plan: prefetch_plan.h).
//
// Contract (l2_prefetch_kernel): a hint, nothing else. d: one slot of the backend's device table
// (PrefetchDesc), read when the kernel runs — up to kMaxPrefetchRegions regions [ptr_i, ptr_i + bytes_i),
// ptr_i 16-byte aligned, bytes_i a multiple of 16 (prefetch_clip); n = 0 (a slot not learned yet, or cleared
// because a matrix it named was freed) fetches nothing. It writes nothing, so it can never change a result.
// It runs on the backend's side stream, forked from the main stream right after a matmul's launches, so it
// overlaps the small ops that follow instead of delaying them (cuda_backend.cpp: PrefetchScope).
// `blocks` blocks of kThreads threads; thread t of block b issues chunks b·kThreads + t, + blocks·kThreads, ... of
// kChunk bytes with the Hopper bulk prefetch (cp.async.bulk.prefetch.L2: one instruction per chunk, no registers
// or shared memory held while the bytes arrive). Why several blocks: run 71 measured one block's bulk prefetches
// at ~0.4 TB/s (one SM's share), which made the side-stream chain the step's critical path; more blocks spread
// the hints over more SMs (CudaOptions::l2_prefetch_blocks). Below sm_90 the kernel does nothing.
#include "backend/cuda/kernels.h"

namespace pg::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) l2_prefetch_kernel(const PrefetchDesc* __restrict__ d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr uint32_t kChunk = 64u << 10;  // bytes per bulk prefetch instruction (a multiple of 16)
  const int n = d->n;
  for (int i = 0; i < n && i < kMaxPrefetchRegions; ++i) {
    const auto* base = static_cast<const uint8_t*>(d->ptr[i]);
    const uint64_t bytes = d->bytes[i] & ~uint64_t{15};
    if (base == nullptr || (reinterpret_cast<uintptr_t>(base) & 15) != 0) continue;  // never from a torn or bad slot
    const uint64_t chunks = (bytes + kChunk - 1) / kChunk;
    for (uint64_t c = static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x; c < chunks; c += static_cast<uint64_t>(gridDim.x) * kThreads) {
      const uint64_t off = c * kChunk;
      const uint64_t left = bytes - off;
      const uint32_t len = left < kChunk ? static_cast<uint32_t>(left) : kChunk;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(len) : "memory");
    }
  }
#endif
}

}  // namespace

void l2_prefetch(const PrefetchDesc* desc, int blocks, cudaStream_t stream) {
  l2_prefetch_kernel<<<blocks < 1 ? 1 : blocks, kThreads, 0, stream>>>(desc);
  check_launch("l2_prefetch");
}

}  // namespace pg::cuda
