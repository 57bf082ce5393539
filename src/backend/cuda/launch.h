// Host helpers for kernel launches.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "backend/cuda/kernels.h"

namespace pg::cuda {

// A kernel that uses more than 48 KB of dynamic shared memory must opt in, once per device. One static
// instance per kernel; ensure() costs one cudaGetDevice and an atomic load after the first call.
class SmemOptIn {
 public:
  void ensure(const void* kernel, int bytes) {
    if (bytes <= 40 * 1024) return;  // static shared memory comes on top of the dynamic size
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    const uint64_t bit = uint64_t{1} << (dev & 63);
    if (done_.load(std::memory_order_acquire) & bit) return;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "cudaFuncSetAttribute(smem)");
    done_.fetch_or(bit, std::memory_order_acq_rel);
  }

 private:
  std::atomic<uint64_t> done_{0};
};

}  // namespace pg::cuda
