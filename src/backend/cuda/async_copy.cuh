// cp.async (sm_80+) helpers: global → shared copies that complete in the background, so a warp keeps
// several tiles of weights in flight while it computes on an earlier one.
#pragma once
#include <cstdint>
#include <initializer_list>

namespace pg::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// 16 bytes with zero fill: src_bytes = 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// 8 / 4 bytes with zero fill (src_bytes = 0 writes zeros and reads nothing), for staged rows whose copies
// cannot be 16 bytes (a q8_0 head of 128 values is 136 bytes: attention_decode.cu).
__device__ __forceinline__ void cp_async8_zfill(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4_zfill(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copies `bytes` (even) from src to dst, cooperatively over `nthreads` threads (this one is `tid`), in
// pieces of `unit` bytes (16, 8 or 4: both pointers aligned to it) through cp.async; the tail that is
// not a whole unit, or everything when unit == 2, is copied synchronously with 2-byte accesses. The
// caller commits/waits the cp.async group and then synchronises the threads that read dst.
__device__ __forceinline__ void copy_async(uint8_t* dst, const uint8_t* src, int bytes, int unit, int tid, int nthreads) {
  int main = 0;
  if (unit == 16) {
    main = bytes & ~15;
    for (int o = tid * 16; o < main; o += nthreads * 16) cp_async16(dst + o, src + o);
  } else if (unit == 8) {
    main = bytes & ~7;
    for (int o = tid * 8; o < main; o += nthreads * 8) cp_async8(dst + o, src + o);
  } else if (unit == 4) {
    main = bytes & ~3;
    for (int o = tid * 4; o < main; o += nthreads * 4) cp_async4(dst + o, src + o);
  }
  for (int o = main + tid * 2; o < bytes; o += nthreads * 2)
    *reinterpret_cast<uint16_t*>(dst + o) = *reinterpret_cast<const uint16_t*>(src + o);
}

// Largest copy unit (16, 8, 4 or 2) that divides every one of the given byte counts/addresses.
inline int copy_unit(std::initializer_list<uint64_t> values) {
  int unit = 16;
  for (uint64_t v : values)
    while (unit > 2 && v % static_cast<uint64_t>(unit) != 0) unit /= 2;
  return unit;
}

}  // namespace pg::cuda
