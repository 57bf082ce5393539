// Programmatic dependent launch (PDL, sm_90+) for the kernels of a decode step.
//
// Why: a decode step is ~780 small dependent kernels; without PDL each one starts only after its
// predecessor has drained (~1-2 µs of launch and ramp per boundary even inside a CUDA graph). A kernel
// launched with the programmatic-serialization attribute is scheduled as soon as its predecessor's blocks
// have all called grid_launch_dependents (or exited), runs its prologue, and blocks in grid_wait until the
// predecessor has completed and its memory is visible — so the launch latency overlaps the predecessor.
//
// Contract for every kernel launched through launch() below: grid_wait() runs in every thread before the
// kernel reads anything an earlier kernel writes AND before it writes anything (an earlier kernel may still
// be reading it); in practice, as the kernel's first statement. grid_launch_dependents() is only a hint
// (the dependent still waits for this grid's completion). Both are no-ops on older GPUs and in kernels
// launched without the attribute. The dependence is transitive: a kernel that passed its wait has a
// completed predecessor, which passed its own.
#pragma once
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace pg::cuda {

__device__ __forceinline__ void grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// pdl_launches() / set_pdl_launches(): kernels.h.

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic-serialization attribute when pdl
// (the kernel must follow the contract above). The one place that builds the attribute.
template <class... P, class... A>
inline void launch_pdl(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  if (pdl) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
    PG_CHECK(e == cudaSuccess, std::string("CUDA kernel launch failed (PDL): ") + cudaGetErrorString(e));
  } else {
    kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
  }
}

// The decode-path kernels: PDL when pdl_launches() (CudaOptions::pdl_all).
template <class... P, class... A>
inline void launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, A&&... args) {
  launch_pdl(pdl_launches(), kernel, grid, block, smem, stream, std::forward<A>(args)...);
}

}  // namespace pg::cuda
