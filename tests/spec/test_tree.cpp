// Draft trees: the chain builder, and DDTree's best-first construction — prefix-closed, within its
// budget, the greedy chain pre-seeded, and (unseeded) equal to the brute-force optimum of the
// surrogate Σ_{u∈T} q(u) (DDTree Prop. 2) on small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "core/error.h"
#include "spec/tree.h"

namespace pg::spec {
namespace {

std::vector<TopK> random_topk(std::mt19937& rng, int depth, int k, int vocab) {
  std::vector<TopK> pos;
  for (int d = 0; d < depth; ++d) {
    std::vector<double> w(static_cast<size_t>(vocab));
    double s = 0;
    for (auto& x : w) s += (x = std::exp(3.0 * std::uniform_real_distribution<double>(0, 1)(rng)));
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    for (int i = 0; i < vocab; ++i) ids[static_cast<size_t>(i)] = i;
    std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return w[static_cast<size_t>(a)] > w[static_cast<size_t>(b)]; });
    TopK t;
    for (int i = 0; i < k; ++i) {
      t.ids.push_back(ids[static_cast<size_t>(i)]);
      t.logprobs.push_back(static_cast<float>(std::log(w[static_cast<size_t>(ids[static_cast<size_t>(i)])] / s)));
    }
    pos.push_back(t);
  }
  return pos;
}

// Checks the structural invariants and returns Σ q(u) over the draft nodes.
double check_tree(const DraftTree& t, const std::vector<TopK>& pos) {
  EXPECT_EQ(t.parent[0], -1);
  EXPECT_EQ(t.depth[0], 0);
  std::vector<double> lq(static_cast<size_t>(t.size()), 0.0);
  double mass = 0;
  std::set<std::pair<int, int32_t>> seen;
  for (int i = 1; i < t.size(); ++i) {
    const int p = t.parent[static_cast<size_t>(i)];
    EXPECT_GE(p, 0);
    EXPECT_LT(p, i) << "parent after child: not prefix-closed in row order";
    EXPECT_EQ(t.depth[static_cast<size_t>(i)], t.depth[static_cast<size_t>(p)] + 1);
    EXPECT_TRUE(seen.insert({p, t.token[static_cast<size_t>(i)]}).second) << "two children with one token";
    const auto& tk = pos[static_cast<size_t>(t.depth[static_cast<size_t>(i)] - 1)];
    auto it = std::find(tk.ids.begin(), tk.ids.end(), t.token[static_cast<size_t>(i)]);
    EXPECT_NE(it, tk.ids.end());
    lq[static_cast<size_t>(i)] = lq[static_cast<size_t>(p)] + tk.logprobs[static_cast<size_t>(it - tk.ids.begin())];
    mass += std::exp(lq[static_cast<size_t>(i)]);
  }
  return mass;
}

TEST(Tree, ChainIsAChain) {
  DraftTree t = build_chain(7, {1, 2, 3});
  ASSERT_EQ(t.size(), 4);
  EXPECT_TRUE(t.is_chain());
  EXPECT_EQ(t.token, (std::vector<int32_t>{7, 1, 2, 3}));
  EXPECT_EQ(t.child(1, 2), 2);
  EXPECT_EQ(t.child(1, 3), -1);
  EXPECT_EQ(build_chain(7, std::vector<int32_t>(500, 1)).size(), kMaxTreeNodes);
}

TEST(Tree, DdtreeRespectsBudgetAndIsPrefixClosed) {
  std::mt19937 rng(1);
  for (int budget : {1, 2, 5, 22, 64, 127}) {
    auto pos = random_topk(rng, 16, std::min(budget, 40), 40);
    DraftTree t = build_ddtree(0, pos, budget);
    EXPECT_EQ(t.n_draft(), budget) << budget;
    check_tree(t, pos);
    // Seeded: the greedy chain is the first nodes.
    for (int d = 1; d <= std::min(budget, 16); ++d) {
      EXPECT_EQ(t.parent[static_cast<size_t>(d)], d - 1);
      EXPECT_EQ(t.token[static_cast<size_t>(d)], pos[static_cast<size_t>(d - 1)].ids[0]);
    }
  }
}

TEST(Tree, DdtreeUnseededIsSurrogateOptimal) {
  // Brute force over all prefix-closed trees is exponential; instead compare with the B best
  // prefixes by q(u) (optimal by Prop. 2) enumerated over the whole top-k product space.
  std::mt19937 rng(2);
  for (int trial = 0; trial < 20; ++trial) {
    const int depth = 4, k = 3, budget = 1 + trial % 12;
    auto pos = random_topk(rng, depth, k, 10);
    std::vector<double> all;
    std::function<void(int, double)> rec = [&](int d, double lq) {
      if (d > 0) all.push_back(std::exp(lq));
      if (d == depth) return;
      for (int r = 0; r < k; ++r) rec(d + 1, lq + pos[static_cast<size_t>(d)].logprobs[static_cast<size_t>(r)]);
    };
    rec(0, 0.0);
    std::sort(all.rbegin(), all.rend());
    double best = 0;
    for (int i = 0; i < budget; ++i) best += all[static_cast<size_t>(i)];
    DraftTree t = build_ddtree(0, pos, budget, false);
    EXPECT_EQ(t.n_draft(), budget);
    EXPECT_NEAR(check_tree(t, pos), best, 1e-6) << "trial " << trial;
    // The seeded tree never beats the optimum (and keeps the chain).
    EXPECT_LE(check_tree(build_ddtree(0, pos, budget, true), pos), best + 1e-6);
  }
}

TEST(Tree, DdtreeEdgeCases) {
  EXPECT_EQ(build_ddtree(5, {}, 10).size(), 1);                       // nothing drafted
  std::vector<TopK> one = {{{4}, {-0.1f}}};
  DraftTree t = build_ddtree(5, one, 10);                             // fewer candidates than budget
  EXPECT_EQ(t.size(), 2);
  EXPECT_THROW(build_ddtree(5, one, 0), Error);
  EXPECT_THROW(build_ddtree(5, one, 128), Error);
}

}  // namespace
}  // namespace pg::spec
