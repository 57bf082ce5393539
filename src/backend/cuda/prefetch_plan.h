// L2 weight prefetch plan of the CUDA backend (CudaOptions::l2_prefetch_mb, issue 11): which weights to
// ask the L2 cache for right after a matmul has been launched.
//
// Why: a decode step reads every weight matrix once, but between two matmuls run the small ops (norms,
// RoPE, KV store, attention, activation quantization) that use the SMs and leave the memory bus mostly
// idle, and each GEMV then pays its own ramp-up from DRAM. Weights never change during a forward and the
// matmuls of a step come in the same order every step (and every prefill chunk), so after matmul i the
// backend can hint the L2 to fetch matmul i+1's weights while the small ops run: the bus works through
// those gaps and the next GEMV starts on L2 hits.
//
// The plan learns the order: read(s) records that weight set s (one matmul's matrices: q/k/v of one
// matmul_shared, gate/up of one matmul_glu, or one matrix) is being read now, and returns the set that came
// right after s the last time s was read. Sets are keyed by their first matrix's address. Host-only and
// CUDA-free, so tests/cuda/test_cuda_prefetch_plan.cpp tests it without a GPU. After the first forward (of
// any shape: prefill chunks read the matrices in decode order) read() allocates nothing: the map only gains
// keys for sets it has never seen.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>

namespace pg::cuda {

struct PrefetchRegion {
  const void* ptr = nullptr;
  size_t bytes = 0;
};

struct PrefetchSet {
  static constexpr int kMax = 4;  // q/k/v (+ a gate) at most: matmul_shared groups, matmul_glu's pair
  PrefetchRegion r[kMax];
  int n = 0;
  const void* key() const { return n > 0 ? r[0].ptr : nullptr; }
  size_t bytes() const {
    size_t b = 0;
    for (int i = 0; i < n; ++i) b += r[i].bytes;
    return b;
  }
};

class PrefetchPlan {
 public:
  // Records s as read now (as the successor of the set read before it) and returns the set that followed s
  // last time, or nullptr (first sighting, or s was the last set read so far). The pointer stays valid until
  // the next read() or clear().
  const PrefetchSet* read(const PrefetchSet& s) {
    const void* k = s.key();
    if (!k) return nullptr;
    if (last_ && last_ != k) {
      auto it = next_.find(last_);
      if (it == next_.end())
        next_.emplace(last_, s);
      else
        it->second = s;  // no allocation: the key exists
    }
    last_ = k;
    auto it = next_.find(k);
    if (it == next_.end() || it->second.key() == k) return nullptr;
    return &it->second;
  }
  // Forgets everything (a weight was freed: no later hint may name it).
  void clear() {
    next_.clear();
    last_ = nullptr;
  }
  size_t size() const { return next_.size(); }

 private:
  std::unordered_map<const void*, PrefetchSet> next_;
  const void* last_ = nullptr;
};

// The part of s to prefetch under a budget of cap bytes: every region whole when s fits, else the leading
// share of each region in proportion to its size (the GEMVs of a group walk all their matrices' rows in
// step: fused gate/up reads row i of both, grouped q/k/v their concatenated rows). Regions start at a
// 16-byte boundary at or after the matrix's start and have a multiple of 16 bytes (the bulk prefetch's
// alignment); a region that rounds to nothing is dropped. Returns the number of regions written to out.
inline int prefetch_clip(const PrefetchSet& s, size_t cap, PrefetchRegion (&out)[PrefetchSet::kMax]) {
  const size_t total = s.bytes();
  int n = 0;
  if (cap < 16 || total == 0) return 0;
  for (int i = 0; i < s.n; ++i) {
    const auto p = reinterpret_cast<uintptr_t>(s.r[i].ptr);
    const uintptr_t a = (p + 15) & ~uintptr_t{15};
    const size_t skip = static_cast<size_t>(a - p);
    if (s.r[i].bytes <= skip) continue;
    size_t want = total <= cap ? s.r[i].bytes : static_cast<size_t>(static_cast<double>(s.r[i].bytes) * static_cast<double>(cap) / static_cast<double>(total));
    if (want > s.r[i].bytes - skip) want = s.r[i].bytes - skip;
    want &= ~size_t{15};
    if (want == 0) continue;
    out[n++] = PrefetchRegion{reinterpret_cast<const void*>(a), want};
  }
  return n;
}

}  // namespace pg::cuda
