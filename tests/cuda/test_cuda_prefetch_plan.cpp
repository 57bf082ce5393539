// The L2 weight prefetch plan of the CUDA backend (backend/cuda/prefetch_plan.h, CudaOptions::l2_prefetch_mb),
// on the host, no GPU: runs in CI. Each weight set's slot must name the set that first followed it — the
// next layer's, across the step boundary too — never a set it has not seen follow, and must not flip when
// another order interleaves; freeing a matrix must clear every slot that names it (recorded graphs read
// their slots at run time, so this is what keeps them from prefetching freed memory); prefetch_clip must
// keep every region inside its matrix, 16-byte aligned, a multiple of 16 bytes, within the budget, and in
// proportion when the set does not fit. The device side (hints change no result) is CudaPrefetchModel in
// test_cuda_model.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/prefetch_plan.h"

namespace pg {
namespace {

using cuda::PrefetchPlan;
using cuda::PrefetchRegion;
using cuda::PrefetchSet;

// Fake weight matrices: addresses inside one buffer (never dereferenced).
struct Weights {
  std::vector<uint8_t> buf = std::vector<uint8_t>(1 << 16);
  const void* at(size_t off) const { return buf.data() + off; }
};

PrefetchSet set_of(std::initializer_list<PrefetchRegion> rs) {
  PrefetchSet s;
  for (const PrefetchRegion& r : rs) s.r[s.n++] = r;
  return s;
}

// A two-layer "forward": q/k/v (3 matrices), o, gate/up, down per layer, then the output matrix.
std::vector<PrefetchSet> forward_sets(const Weights& w) {
  std::vector<PrefetchSet> step;
  for (int l = 0; l < 2; ++l) {
    const size_t b = 4096 * static_cast<size_t>(l);
    step.push_back(set_of({{w.at(b + 0), 256}, {w.at(b + 256), 64}, {w.at(b + 320), 64}}));
    step.push_back(set_of({{w.at(b + 512), 256}}));
    step.push_back(set_of({{w.at(b + 1024), 512}, {w.at(b + 1536), 512}}));
    step.push_back(set_of({{w.at(b + 2048), 512}}));
  }
  step.push_back(set_of({{w.at(9000), 1024}}));
  return step;
}

void expect_same(const PrefetchSet& got, const PrefetchSet& want, size_t i) {
  ASSERT_EQ(got.n, want.n) << "set " << i;
  for (int r = 0; r < want.n; ++r) {
    EXPECT_EQ(got.r[r].ptr, want.r[r].ptr) << "set " << i << " region " << r;
    EXPECT_EQ(got.r[r].bytes, want.r[r].bytes) << "set " << i << " region " << r;
  }
}

TEST(PrefetchPlan, EachSetsSlotNamesTheSetThatFollowedIt) {
  Weights w;
  const std::vector<PrefetchSet> step = forward_sets(w);
  PrefetchPlan plan(64);
  std::vector<int> slot;
  // First forward: every set gets its own slot; each slot learns its successor as the next set is read
  // (the last one only when the next forward starts).
  for (size_t i = 0; i < step.size(); ++i) {
    slot.push_back(plan.read(step[i]));
    ASSERT_GE(slot.back(), 0);
    for (size_t j = 0; j < i; ++j) EXPECT_NE(slot[j], slot.back());
    EXPECT_EQ(plan.next(slot.back()).n, 0) << "a successor before it was seen";
  }
  std::vector<int> dirty;
  plan.flush([&](int i, const PrefetchSet&) { dirty.push_back(i); });
  EXPECT_EQ(dirty.size(), step.size() - 1);
  // Second forward: same slots, and every one names its successor; the output matrix names layer 0's q/k/v.
  for (size_t i = 0; i < step.size(); ++i) EXPECT_EQ(plan.read(step[i]), slot[i]);
  for (size_t i = 0; i < step.size(); ++i) expect_same(plan.next(slot[i]), step[(i + 1) % step.size()], i);
  dirty.clear();
  plan.flush([&](int i, const PrefetchSet&) { dirty.push_back(i); });
  ASSERT_EQ(dirty.size(), 1u);
  EXPECT_EQ(dirty[0], slot.back());
  // Sticky: another order (a draft's forward between two target forwards) does not flip a learned successor.
  plan.read(step.back());
  plan.read(step[4]);
  expect_same(plan.next(slot.back()), step[0], step.size() - 1);
  EXPECT_FALSE(plan.dirty());
  // The same set twice in a row is not its own successor; an empty set has no slot.
  EXPECT_EQ(plan.read(step[4]), slot[4]);
  expect_same(plan.next(slot[4]), step[5], 4);
  EXPECT_EQ(plan.read(PrefetchSet{}), -1);
  EXPECT_EQ(plan.keys(), step.size());
}

TEST(PrefetchPlan, ForgetClearsEverySlotThatNamesAFreedMatrix) {
  Weights w;
  const std::vector<PrefetchSet> step = forward_sets(w);
  PrefetchPlan plan(64);
  std::vector<int> slot;
  for (int pass = 0; pass < 2; ++pass)
    for (const PrefetchSet& s : step) slot.push_back(plan.read(s));
  plan.flush([](int, const PrefetchSet&) {});
  // Free layer 0's k matrix (the second region of q/k/v): the slot before q/k/v (the output matrix) named
  // it and q/k/v's own slot is keyed by q: both are cleared and dirty, nothing else.
  plan.forget(step[0].r[1].ptr);
  std::vector<int> dirty;
  plan.flush([&](int i, const PrefetchSet& next) {
    dirty.push_back(i);
    EXPECT_EQ(next.n, 0);
  });
  ASSERT_EQ(dirty.size(), 1u);
  EXPECT_EQ(dirty[0], slot[step.size() - 1]);  // the output matrix's successor was q/k/v
  EXPECT_EQ(plan.next(slot[step.size() - 1]).n, 0);
  // Freeing a key clears its own successor too.
  plan.forget(step[3].key());
  dirty.clear();
  plan.flush([&](int i, const PrefetchSet&) { dirty.push_back(i); });
  EXPECT_EQ(dirty.size(), 2u);  // down's own slot, and gate/up's (whose successor is down)
  EXPECT_EQ(plan.next(slot[3]).n, 0);
  EXPECT_EQ(plan.next(slot[2]).n, 0);
  // A cleared slot learns again (a new matrix at the same address).
  plan.read(step[2]);
  plan.read(step[3]);
  expect_same(plan.next(slot[2]), step[3], 2);
  // touch_all marks every assigned slot dirty (a budget change rewrites the device table).
  plan.flush([](int, const PrefetchSet&) {});
  plan.touch_all();
  dirty.clear();
  plan.flush([&](int i, const PrefetchSet&) { dirty.push_back(i); });
  EXPECT_EQ(dirty.size(), step.size());
}

TEST(PrefetchPlan, FullTableGivesNoSlot) {
  Weights w;
  PrefetchPlan plan(2);
  EXPECT_EQ(plan.read(set_of({{w.at(0), 16}})), 0);
  EXPECT_EQ(plan.read(set_of({{w.at(64), 16}})), 1);
  EXPECT_EQ(plan.read(set_of({{w.at(128), 16}})), -1);
  // The set before a slotless one learns nothing from it and the one after it starts a fresh chain.
  EXPECT_EQ(plan.read(set_of({{w.at(0), 16}})), 0);
  expect_same(plan.next(0), set_of({{w.at(64), 16}}), 0);
}

TEST(PrefetchPlan, ClipKeepsRegionsAlignedInsideAndInProportion) {
  Weights w;
  PrefetchRegion out[PrefetchSet::kMax];
  // Fits: every region whole (aligned starts, multiples of 16).
  const PrefetchSet fits = set_of({{w.at(0), 4096}, {w.at(8192), 1024}});
  ASSERT_EQ(cuda::prefetch_clip(fits, 1 << 20, out), 2);
  EXPECT_EQ(out[0].bytes, 4096u);
  EXPECT_EQ(out[1].bytes, 1024u);
  // Does not fit: shares in proportion (3:1), within the budget.
  const PrefetchSet big = set_of({{w.at(0), 30000}, {w.at(32768), 10000}});
  const int n = cuda::prefetch_clip(big, 4000, out);
  ASSERT_EQ(n, 2);
  EXPECT_LE(out[0].bytes + out[1].bytes, 4000u);
  EXPECT_NEAR(static_cast<double>(out[0].bytes), 3000.0, 16.0);
  EXPECT_NEAR(static_cast<double>(out[1].bytes), 1000.0, 16.0);
  // Unaligned start and size: the region starts at the next 16-byte boundary and stays inside the matrix.
  const auto base = reinterpret_cast<uintptr_t>(w.at(0));
  const size_t mis = (16 - (base + 3) % 16) % 16;  // bytes from w.at(3) to its next boundary
  const PrefetchSet odd = set_of({{w.at(3), 1000}});
  ASSERT_EQ(cuda::prefetch_clip(odd, 1 << 20, out), 1);
  const auto p = reinterpret_cast<uintptr_t>(out[0].ptr);
  EXPECT_EQ(p % 16, 0u);
  EXPECT_EQ(p, base + 3 + mis);
  EXPECT_EQ(out[0].bytes % 16, 0u);
  EXPECT_LE(p + out[0].bytes, base + 3 + 1000);
  EXPECT_GE(out[0].bytes, 1000 - mis - 15);
  // A region smaller than its alignment gap, and a budget below 16 bytes: nothing.
  EXPECT_EQ(cuda::prefetch_clip(set_of({{w.at(3), 8}}), 1 << 20, out), 0);
  EXPECT_EQ(cuda::prefetch_clip(fits, 8, out), 0);
}

}  // namespace
}  // namespace pg
