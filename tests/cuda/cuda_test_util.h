// Helpers shared by the CUDA tests: the GPU presence check, twin tensors on the CPU reference and the
// CUDA backend, error measures, and paged KV layers filled the same way on both backends.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"

namespace pg::test {

// Without a GPU every CUDA test fails, loudly, unless PEREGRINE_NO_GPU_OK=1 says that is expected (CI
// builds these tests on machines without a GPU; scripts/test.sh excludes the `cuda` label there).
#define PG_REQUIRE_GPU()                                                                                      \
  do {                                                                                                        \
    if (::pg::cuda_device_count() == 0) {                                                                     \
      const char* ok_ = std::getenv("PEREGRINE_NO_GPU_OK");                                                   \
      if (ok_ && std::string(ok_) == "1") GTEST_SKIP() << "no CUDA device (PEREGRINE_NO_GPU_OK=1)";           \
      FAIL() << "no CUDA device visible: this test needs an NVIDIA GPU (set PEREGRINE_NO_GPU_OK=1 to skip)"; \
    }                                                                                                         \
  } while (0)

inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// A tensor allocated and filled with the same bytes on a backend.
inline Tensor make_tensor(Backend& be, DType t, int64_t cols, int64_t rows, const void* data) {
  Tensor x = be.alloc(t, cols, rows);
  if (data) be.upload(x, data, x.nbytes());
  return x;
}

inline std::vector<float> fetch(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  be.download(t, v.data(), v.size() * sizeof(float));
  return v;
}

// The raw bytes of a tensor (quantized KV caches are compared byte for byte).
inline std::vector<uint8_t> fetch_bytes(Backend& be, const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  be.download(t, b.data(), b.size());
  return b;
}

struct ErrStats {
  double rel = 0;      // ‖a − ref‖ / ‖ref‖
  double max_abs = 0;  // max |a − ref|
  size_t bad = 0;      // NaN/Inf where ref is finite
};

inline ErrStats compare(const std::vector<float>& a, const std::vector<float>& ref) {
  ErrStats s;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    if (!std::isfinite(a[i]) && std::isfinite(ref[i])) {
      ++s.bad;
      continue;
    }
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
    s.max_abs = std::max(s.max_abs, std::fabs(d));
  }
  s.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (a.size() != ref.size()) s.bad += 1;
  return s;
}

// ---- paged KV layers for attention tests --------------------------------------------------------------

// n_seq sequences of up to max_len tokens in blocks of block_size cells, the physical blocks in a
// shuffled order (std::shuffle with mt19937(shuffle_seed)): the block table must be followed, not
// assumed contiguous.
struct PagedKvLayout {
  int n_seq, block_size, max_blocks, n_blocks;
  std::vector<int32_t> table;  // (n_seq, max_blocks) physical block of each sequence's logical block
  PagedKvLayout(int n_seq_, int max_len, int block_size_, uint32_t shuffle_seed)
      : n_seq(n_seq_),
        block_size(block_size_),
        max_blocks((max_len + block_size_ - 1) / block_size_),
        n_blocks(n_seq_ * max_blocks),
        table(static_cast<size_t>(n_blocks)) {
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), std::mt19937(shuffle_seed));
  }
  int64_t n_cells() const { return static_cast<int64_t>(n_blocks) * block_size; }
  int cell(int s, int p) const { return table[static_cast<size_t>(s * max_blocks + p / block_size)] * block_size + p % block_size; }
};

// One backend's copy of a KV layer in a test that compares backends, with its block table.
struct KvSide {
  Backend* be;
  KvLayer kv;
  Tensor table;  // I32 (n_seq, max_blocks)
};

inline Tensor upload_block_table(Backend& be, const PagedKvLayout& L) {
  return make_tensor(be, DType::I32, L.max_blocks, L.n_seq, L.table.data());
}

// The AttentionBatch of rows (pos[i], seq[i]) on one side: cells from the layout, max_kv_len the last
// row's reach (max position + 1). The index tensors it allocates are appended to keep (free them after use).
inline AttentionBatch paged_batch(const KvSide& s, const PagedKvLayout& L, const std::vector<int32_t>& pos,
                                  const std::vector<int32_t>& seq, std::vector<Tensor>& keep) {
  AttentionBatch b;
  const int n = static_cast<int>(pos.size());
  std::vector<int32_t> cells(pos.size());
  int mx = 0;
  for (size_t i = 0; i < pos.size(); ++i) {
    cells[i] = L.cell(seq[i], pos[i]);
    mx = std::max(mx, pos[i] + 1);
  }
  b.n_tokens = n;
  b.positions = make_tensor(*s.be, DType::I32, n, 1, pos.data());
  b.seq = make_tensor(*s.be, DType::I32, n, 1, seq.data());
  b.cells = make_tensor(*s.be, DType::I32, n, 1, cells.data());
  keep.insert(keep.end(), {b.positions, b.seq, b.cells});
  b.block_table = s.table;
  b.block_size = L.block_size;
  b.max_blocks = L.max_blocks;
  b.max_kv_len = mx;
  return b;
}

// Writes F32 K and V rows (pos.size(), kvw) at (pos[i], seq[i]) through the side's own kv_store.
inline void store_kv_rows(KvSide& s, const PagedKvLayout& L, const std::vector<int32_t>& pos, const std::vector<int32_t>& seq,
                          int64_t kvw, const std::vector<float>& k, const std::vector<float>& v) {
  const int n = static_cast<int>(pos.size());
  std::vector<Tensor> keep;
  AttentionBatch b = paged_batch(s, L, pos, seq, keep);
  Tensor kt = make_tensor(*s.be, DType::F32, kvw, n, k.data()), vt = make_tensor(*s.be, DType::F32, kvw, n, v.data());
  s.be->kv_store(s.kv, kt, vt, b);
  s.be->synchronize();
  for (auto& t : keep) s.be->free(t);
  s.be->free(kt);
  s.be->free(vt);
}

inline std::unique_ptr<CpuBackend> make_cpu_exact() {
  CpuOptions o;
  o.n_threads = 2;
  o.exact_f32 = true;
  return std::make_unique<CpuBackend>(o);
}

// fa_prefill false: attention calls of any row count stay on attention.cu (the op tests that bound it at
// FP32 precision); true: CudaOptions' default routing (≥ 32 rows on tensor cores) or the environment's.
inline std::unique_ptr<CudaBackend> make_cuda(bool exact, bool fa_prefill = true) {
  CudaOptions o;
  // The factory's environment aliases (cuda_options_from_env), so one device call can run every test with a path
  // switched on or off: PEREGRINE_CUDA_PDL=0, PEREGRINE_CUDA_GRAPH_ROWS=64, PEREGRINE_CUDA_FA_VEC=0,
  // PEREGRINE_CUDA_GEMM_CUBLAS=1 with PEREGRINE_CUDA_GEMM_CUBLAS_ROWS=65, ... (scripts/device-check.sh uses them).
  cuda_options_from_env(o);
  o.exact_f32 = exact;
  // Op tests that bound attention at FP32 precision keep attention.cu for every row count.
  if (!fa_prefill) o.fa_prefill_min_rows = 0, o.fa_decode = false;
  return std::make_unique<CudaBackend>(0, o);
}

}  // namespace pg::test
