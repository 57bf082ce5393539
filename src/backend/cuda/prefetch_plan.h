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
// The plan learns the order. A weight set is one matmul's matrices (q/k/v of one matmul_shared, gate/up of
// one matmul_glu, or one matrix), keyed by its first matrix's address. Each key owns a slot of a fixed
// table; a slot holds the set that followed its key the first time it was read after it (sticky: a later
// different order — target and draft forwards interleaving on one backend — does not flip it back and
// forth). The backend mirrors the table on the device and the prefetch kernel reads its slot there at run
// time, so (1) a CUDA graph recorded before the order was learned starts prefetching once the slot is
// filled, and (2) freeing a weight clears every slot that names it (forget), so no recorded graph can ever
// prefetch freed memory. Host-only and CUDA-free: tests/cuda/test_cuda_prefetch_plan.cpp tests it without a
// GPU. After the first forward read() allocates nothing (the key map only grows for sets never seen).
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

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
  bool mentions(const void* p) const {
    for (int i = 0; i < n; ++i)
      if (r[i].ptr == p) return true;
    return false;
  }
};

class PrefetchPlan {
 public:
  explicit PrefetchPlan(int slots) : slots_(static_cast<size_t>(slots)) {
    index_.reserve(static_cast<size_t>(slots));
    dirty_.reserve(static_cast<size_t>(slots));
  }
  int capacity() const { return static_cast<int>(slots_.size()); }

  // Records s as read now: the first time a set follows the previously read one, it becomes that one's
  // successor (its slot turns dirty). Returns the slot of s itself — whose successor the caller prefetches
  // after launching s's matmul — or −1 (an empty set, or the table is full).
  int read(const PrefetchSet& s) {
    const void* k = s.key();
    if (!k) return -1;
    if (last_ >= 0 && slots_[static_cast<size_t>(last_)].key != k) {
      Slot& prev = slots_[static_cast<size_t>(last_)];
      if (prev.next.n == 0) {
        prev.next = s;
        mark(last_);
      }
    }
    last_ = slot_of(k);
    return last_;
  }

  // Forgets every mention of the matrix at p (it is being freed): its own slot's successor, and any
  // successor that names it. The touched slots turn dirty (the device copy must be cleared before p is).
  void forget(const void* p) {
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (s.key == nullptr) continue;
      if (s.key == p || s.next.mentions(p)) {
        s.next = PrefetchSet{};
        mark(static_cast<int>(i));
      }
    }
    // The slot of p itself stays assigned (its key is just an address): a new matrix at the same address
    // relearns its successor from scratch, since next is empty.
    if (last_ >= 0 && slots_[static_cast<size_t>(last_)].key == p) last_ = -1;
  }

  // Every learned slot dirty again (the clip budget changed: the device copies must be rewritten).
  void touch_all() {
    for (size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].key != nullptr) mark(static_cast<int>(i));
  }

  // Calls f(slot, successor set) for each dirty slot, then none is dirty.
  template <class F>
  void flush(F&& f) {
    for (int i : dirty_) {
      slots_[static_cast<size_t>(i)].dirty = false;
      f(i, slots_[static_cast<size_t>(i)].next);
    }
    dirty_.clear();
  }
  bool dirty() const { return !dirty_.empty(); }
  // The successor recorded in slot i (empty until learned).
  const PrefetchSet& next(int i) const { return slots_[static_cast<size_t>(i)].next; }
  size_t keys() const { return index_.size(); }

 private:
  struct Slot {
    const void* key = nullptr;
    PrefetchSet next;
    bool dirty = false;
  };
  int slot_of(const void* k) {
    auto it = index_.find(k);
    if (it != index_.end()) return it->second;
    if (index_.size() >= slots_.size()) return -1;
    const int i = static_cast<int>(index_.size());
    index_.emplace(k, i);
    slots_[static_cast<size_t>(i)].key = k;
    return i;
  }
  void mark(int i) {
    Slot& s = slots_[static_cast<size_t>(i)];
    if (!s.dirty) {
      s.dirty = true;
      dirty_.push_back(i);
    }
  }
  std::vector<Slot> slots_;
  std::unordered_map<const void*, int> index_;
  std::vector<int> dirty_;
  int last_ = -1;
};

// The part of s to prefetch under a budget of cap bytes: every region whole when s fits, else the leading
// share of each region in proportion to its size (the GEMVs of a group walk all their matrices' rows in
// step: fused gate/up reads row i of both, grouped q/k/v their concatenated rows). Regions start at a
// 16-byte boundary at or after the matrix's start and have a multiple of 16 bytes (the bulk prefetch's
// alignment), inside the matrix; a region that rounds to nothing is dropped. Returns the regions written.
inline int prefetch_clip(const PrefetchSet& s, size_t cap, PrefetchRegion (&out)[PrefetchSet::kMax]) {
  const size_t total = s.bytes();
  int n = 0;
  if (cap < 16 || total == 0) return 0;
  for (int i = 0; i < s.n; ++i) {
    const auto p = reinterpret_cast<uintptr_t>(s.r[i].ptr);
    const uintptr_t a = (p + 15) & ~uintptr_t{15};
    const size_t skip = static_cast<size_t>(a - p);
    if (s.r[i].bytes <= skip) continue;
    size_t want = total <= cap ? s.r[i].bytes
                               : static_cast<size_t>(static_cast<double>(s.r[i].bytes) * static_cast<double>(cap) / static_cast<double>(total));
    if (want > s.r[i].bytes - skip) want = s.r[i].bytes - skip;
    want &= ~size_t{15};
    if (want == 0) continue;
    out[n++] = PrefetchRegion{reinterpret_cast<const void*>(a), want};
  }
  return n;
}

}  // namespace pg::cuda
