// Adaptive speculation (spec/adaptive.h): the cost fit recovers a linear cost, the chooser verifies
// the prefix with the best expected tokens per second (and nothing when rows are too dear), the
// depth chooser follows acceptance, and a truncated DDTree is still a valid tree.
#include <gtest/gtest.h>

#include <cmath>

#include "spec/adaptive.h"

namespace pg::spec {
namespace {

CostModel linear(double a, double b) {
  CostModel c;
  for (int i = 0; i < 300; ++i)
    for (int k : {1, 1, 1, 4, 9, 23}) c.observe_forward(k, a + b * k);
  return c;
}

TEST(CostModel, FitsALinearCostAndClipsPreemptedSteps) {
  CostModel c = linear(1e-4, 3e-4);
  EXPECT_NEAR(c.forward(1), 4e-4, 1e-6);
  EXPECT_NEAR(c.forward(23), 1e-4 + 23 * 3e-4, 1e-5);
  // A step 100× too slow (the OS preempted it) is clipped to 3× the prediction: it moves the estimate
  // by a few percent, not 100×.
  c.observe_forward(1, 4e-2);
  EXPECT_LT(c.forward(1), 4e-4 * 1.15);
  // A cost that jumps between row counts (CPU: 8 rows stay on one thread, 9 go to the pool) is
  // followed per row count where measured, by the fit elsewhere.
  CostModel j;
  for (int i = 0; i < 100; ++i) {
    j.observe_forward(1, 4e-4);
    j.observe_forward(8, 1.2e-3);
    j.observe_forward(9, 3.6e-3);
  }
  EXPECT_NEAR(j.forward(8), 1.2e-3, 1e-5);
  EXPECT_NEAR(j.forward(9), 3.6e-3, 1e-5);
  EXPECT_GT(j.forward(20), j.forward(9));
  // Only AR steps seen: the slope is a guess, positive, below one AR step per row.
  CostModel ar;
  for (int i = 0; i < 50; ++i) ar.observe_forward(1, 4e-4);
  EXPECT_NEAR(ar.forward(1), 4e-4, 1e-6);
  EXPECT_GT(ar.forward(9), ar.forward(1));
  EXPECT_LT(ar.forward(9), 9 * ar.forward(1));
}

TEST(ChoosePrefix, VerifiesWhatPaysAndNothingWhenRowsAreDear) {
  const std::vector<double> p = {1, 0.95, 0.9, 0.85, 0.2, 0.05, 0.01};
  // Cheap rows (a GPU: 22 rows ≈ 1.25 AR steps): every likely node pays, the unlikely tail too.
  const CostModel gpu = linear(4e-4, 1e-5);
  EXPECT_GE(choose_prefix(p, 1.0, 0, gpu), 4);
  // Rows as dear as an AR step each and a costly draft already spent: few or none.
  const CostModel cpu = linear(0.0, 4e-4);
  const int n_cpu = choose_prefix(p, 1.0, 5e-4, cpu);
  EXPECT_LE(n_cpu, 4);
  // The chosen prefix is the argmax of the rate over all prefixes.
  auto rate = [&](int n, double g, double td, const CostModel& c) {
    double e = 0;
    for (int i = 1; i <= n; ++i) e += std::min(1.0, g * p[static_cast<size_t>(i)]);
    return (1 + e) / (td + c.forward(1 + n));
  };
  for (double g : {0.2, 1.0, 1.8})
    for (const CostModel* c : {&gpu, &cpu}) {
      const int n = choose_prefix(p, g, 2e-4, *c);
      for (int m = 0; m < static_cast<int>(p.size()); ++m) EXPECT_GE(rate(n, g, 2e-4, *c) + 1e-12, rate(m, g, 2e-4, *c)) << g << " " << m;
    }
  // A drafter that is always wrong (γ → 0.1) on dear rows: plain decoding.
  EXPECT_EQ(choose_prefix({1, 0.3, 0.1}, 0.1, 0, cpu), 0);
}

TEST(ChooseDepth, FollowsAcceptance) {
  CostModel c = linear(2e-4, 1e-4);
  for (int i = 0; i < 20; ++i) c.observe_draft_step(5e-5);
  const int high = choose_depth(0.95, 16, c), low = choose_depth(0.2, 16, c);
  EXPECT_GT(high, low);
  EXPECT_GE(high, 3);
  // Dear rows and a poor drafter: do not draft.
  CostModel dear = linear(0.0, 4e-4);
  for (int i = 0; i < 20; ++i) dear.observe_draft_step(1.6e-4);
  EXPECT_EQ(choose_depth(0.3, 8, dear), 0);
}

TEST(AcceptStats, TracksAcceptance) {
  AcceptStats s;
  EXPECT_DOUBLE_EQ(s.gamma(), 1.0);
  for (int i = 0; i < 30; ++i) s.observe(4.0, 4, 4);  // predicted 4, all 4 accepted
  EXPECT_GT(s.alpha(), 0.9);
  EXPECT_NEAR(s.gamma(), 1.0, 0.05);
  AcceptStats bad;
  for (int i = 0; i < 30; ++i) bad.observe(4.0, 0, 4);  // predicted 4, none accepted
  EXPECT_LT(bad.alpha(), 0.2);
  EXPECT_LT(bad.gamma(), 0.3);
}

TEST(TruncateTree, EveryPrefixOfADDTreeIsATree) {
  std::vector<TopK> pos(6);
  for (size_t d = 0; d < pos.size(); ++d)
    for (int r = 0; r < 5; ++r) {
      pos[d].ids.push_back(static_cast<int32_t>(10 * d + static_cast<size_t>(r)));
      pos[d].logprobs.push_back(-0.3f * static_cast<float>(r) - 0.05f * static_cast<float>(d));
    }
  const DraftTree full = build_ddtree(1, pos, 22);
  const std::vector<double> p = path_probs(full, pos);
  ASSERT_EQ(p.size(), static_cast<size_t>(full.size()));
  EXPECT_DOUBLE_EQ(p[0], 1.0);
  for (int n = 0; n <= full.n_draft(); ++n) {
    DraftTree t = full;
    truncate_tree(t, n);
    ASSERT_EQ(t.n_draft(), n);
    for (int i = 1; i < t.size(); ++i) {
      EXPECT_LT(t.parent[static_cast<size_t>(i)], i);
      EXPECT_EQ(t.depth[static_cast<size_t>(i)], t.depth[static_cast<size_t>(t.parent[static_cast<size_t>(i)])] + 1);
      // A child is never more likely than its parent.
      EXPECT_LE(p[static_cast<size_t>(i)], p[static_cast<size_t>(t.parent[static_cast<size_t>(i)])] + 1e-12);
    }
  }
}

}  // namespace
}  // namespace pg::spec
