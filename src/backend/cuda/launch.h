// Host helpers for kernel launches.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <mutex>

#include "backend/cuda/kernels.h"

namespace pg::cuda {

// A kernel that uses more than 48 KB of dynamic shared memory must opt in, per device, to the largest
// size it will be launched with. One static instance per kernel; ensure(bytes) raises the kernel's limit
// whenever a launch needs more than any earlier one (the limit is an upper bound, not a reservation:
// a smaller launch after a larger one is fine, a larger one after a smaller one needs a new call, which
// the first version of this class missed — attention then failed with "invalid argument" as soon as a
// batch grew past the row count it first ran with). Costs one cudaGetDevice and an atomic load when the
// limit is already high enough.
class SmemOptIn {
 public:
  void ensure(const void* kernel, int bytes) {
    if (bytes <= 40 * 1024) return;  // static shared memory comes on top of the dynamic size
    int dev = 0;
    check(cudaGetDevice(&dev), "cudaGetDevice");
    std::atomic<int>& have = limit_[dev & (kDevices - 1)];
    if (have.load(std::memory_order_acquire) >= bytes) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (have.load(std::memory_order_relaxed) >= bytes) return;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), "cudaFuncSetAttribute(smem)");
    have.store(bytes, std::memory_order_release);
  }

 private:
  static constexpr int kDevices = 64;
  std::atomic<int> limit_[kDevices] = {};
  std::mutex mu_;
};

}  // namespace pg::cuda
