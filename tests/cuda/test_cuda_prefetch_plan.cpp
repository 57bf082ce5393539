// The L2 weight prefetch plan of the CUDA backend (backend/cuda/prefetch_plan.h, CudaOptions::l2_prefetch_mb),
// on the host, no GPU: runs in CI. The plan must name, after each matmul, the weights of the matmul that
// followed it the last time — the next layer's, across the step boundary too — and never a set it has not
// seen follow; prefetch_clip must keep every region inside its matrix, 16-byte aligned, a multiple of 16
// bytes, within the budget, and in proportion when the set does not fit. The device side (hints change no
// result) is CudaPrefetchModel in test_cuda_model.cpp.
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

TEST(PrefetchPlan, NamesTheSetThatFollowedLastTime) {
  Weights w;
  // A two-layer "forward": qkv (3 matrices), o, gate/up, down per layer, then the output matrix.
  std::vector<PrefetchSet> step;
  for (int l = 0; l < 2; ++l) {
    const size_t b = 4096 * static_cast<size_t>(l);
    step.push_back(set_of({{w.at(b + 0), 256}, {w.at(b + 256), 64}, {w.at(b + 320), 64}}));
    step.push_back(set_of({{w.at(b + 512), 256}}));
    step.push_back(set_of({{w.at(b + 1024), 512}, {w.at(b + 1536), 512}}));
    step.push_back(set_of({{w.at(b + 2048), 512}}));
  }
  step.push_back(set_of({{w.at(9000), 1024}}));
  PrefetchPlan plan;
  // First forward: nothing is known yet, so no hint.
  for (const PrefetchSet& s : step) EXPECT_EQ(plan.read(s), nullptr);
  // Second forward: every set names its successor, the output matrix names the first layer's q/k/v.
  for (size_t i = 0; i < step.size(); ++i) {
    const PrefetchSet* next = plan.read(step[i]);
    ASSERT_NE(next, nullptr) << "set " << i;
    const PrefetchSet& want = step[(i + 1) % step.size()];
    ASSERT_EQ(next->n, want.n) << "set " << i;
    for (int r = 0; r < want.n; ++r) {
      EXPECT_EQ(next->r[r].ptr, want.r[r].ptr) << "set " << i << " region " << r;
      EXPECT_EQ(next->r[r].bytes, want.r[r].bytes) << "set " << i << " region " << r;
    }
  }
  EXPECT_EQ(plan.size(), step.size());
  // A changed order is learned: after the output matrix comes layer 1's q/k/v now.
  plan.read(step.back());
  plan.read(step[4]);
  const PrefetchSet* next = plan.read(step.back());
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->key(), step[4].key());
  // The same set twice in a row is not its own successor; an empty set is ignored.
  plan.clear();
  plan.read(step[0]);
  EXPECT_EQ(plan.read(step[0]), nullptr);
  EXPECT_EQ(plan.read(PrefetchSet{}), nullptr);
  EXPECT_EQ(plan.size(), 0u);
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
