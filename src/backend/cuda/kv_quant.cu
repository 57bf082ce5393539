// kv_store for caches of any KV type (core/kv_quant.h): each row's heads are encoded into whole blocks of
// the cache type on the device, with the encoders of kv_quant.cuh (bytes identical to the CPU backend's
// kv_quantize_row). The F32/F16 pair of equal types keeps elementwise.cu's kv_store kernel.
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_quant.cuh"
#include "core/error.h"

namespace pg::cuda {
namespace {

// One block per batch row r: threads stride over the encoding units of the row's K heads, then its V heads
// (unit = one value, one 32-block or one 128-group: kvq_unit_elems). Reads src rows (n, n_head_kv·hd) f32,
// writes cache row cells[r] (row_bytes each); a negative or out-of-range cell writes nothing.
__global__ void kv_store_typed_kernel(const KvStoreArgs a) {
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

}  // namespace

void kv_store_typed(const KvStoreArgs& a, cudaStream_t stream) {
  if (a.n <= 0) return;
  // 64 threads: a decode row has n_head_kv·(head_dim/32) block units per side (8·4 for an 8B model), a
  // TQ3_0 row n_head_kv groups; the per-thread work is sequential by design (kv_quant.cuh).
  kv_store_typed_kernel<<<static_cast<unsigned>(a.n), 64, 0, stream>>>(a);
  check_launch("kv_store (typed)");
}

}  // namespace pg::cuda
