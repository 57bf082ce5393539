// Verification rules. The greedy walk on hand-made trees; and two statistical tests that the
// emitted distribution is the target's (chi-square over 20 000+ draws, 0.1 % level), each shown
// failing on a deliberately biased rule so that they can fail:
//   - speculative sampling of a chain of sampled drafts (accept min(1, p/q), resample the residual);
//   - sample-and-match on a token tree, on a real tiny model's distributions with top-k, top-p,
//     temperature and a repetition penalty that follows the path's history.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/sampler.h"
#include "model/model.h"
#include "backend/cpu/cpu_backend.h"
#include "spec/verify.h"
#include "testutil.h"

namespace pg::spec {
namespace {

TEST(Walk, GreedyAcceptsMatchingChildrenAndEndsWithTheBonus) {
  // root(9) ─ 1 ─ 2 ─ 3
  //        └─ 4 ─ 5
  DraftTree t;
  t.reset(9);
  t.add(1, 0);
  t.add(2, 1);
  t.add(3, 2);
  t.add(4, 0);
  t.add(5, 4);
  // Target's token at each node.
  std::map<int, int32_t> target = {{0, 4}, {4, 5}, {5, 8}};
  std::vector<int> asked;
  auto f = [&](int node) {
    asked.push_back(node);
    return target.at(node);
  };
  WalkResult w = walk(t, f);
  EXPECT_EQ(w.path, (std::vector<int>{0, 4, 5}));
  EXPECT_EQ(w.bonus, 8);
  EXPECT_EQ(asked, (std::vector<int>{0, 4, 5}));  // once per emitted token, in order
  // Nothing matches: the bonus is the target's token at the root.
  target = {{0, 7}};
  w = walk(t, [&](int n) { return target.at(n); });
  EXPECT_EQ(w.path, (std::vector<int>{0}));
  EXPECT_EQ(w.bonus, 7);
  // max_emit 2: one accepted draft + the bonus, even though the walk could go on.
  target = {{0, 1}, {1, 2}, {2, 3}, {3, 6}};
  w = walk(t, [&](int n) { return target.at(n); }, 2);
  EXPECT_EQ(w.path, (std::vector<int>{0, 1}));
  EXPECT_EQ(w.bonus, 2);
}

// Chi-square statistic over the bins with expected count ≥ 5 (the rest pooled), and the 0.1 %
// critical value (Wilson–Hilferty).
struct Chi2 {
  double stat = 0, crit = 0;
  int df = 0;
};
Chi2 chi_square(const std::map<std::vector<int32_t>, double>& expect_p, const std::map<std::vector<int32_t>, int>& got, int n) {
  Chi2 c;
  double pool_e = 0;
  int pool_o = 0, bins = 0;
  for (const auto& [k, p] : expect_p) {
    const double e = p * n;
    const int o = got.count(k) ? got.at(k) : 0;
    if (e < 5) {
      pool_e += e;
      pool_o += o;
      continue;
    }
    c.stat += (o - e) * (o - e) / e;
    ++bins;
  }
  // Observed outcomes the exact distribution gives probability 0 count against the pool.
  for (const auto& [k, o] : got)
    if (!expect_p.count(k)) pool_o += o;
  if (pool_e > 0) {
    c.stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    ++bins;
  } else if (pool_o > 0) {
    c.stat = 1e30;
  }
  c.df = std::max(1, bins - 1);
  const double z = 3.09, d = c.df;
  c.crit = d * std::pow(1 - 2 / (9 * d) + z * std::sqrt(2 / (9 * d)), 3);
  return c;
}

std::vector<float> random_dist(std::mt19937& rng, int v, double sharp) {
  std::vector<float> p(static_cast<size_t>(v));
  double s = 0;
  for (auto& x : p) s += (x = static_cast<float>(std::exp(sharp * std::uniform_real_distribution<double>(0, 1)(rng))));
  for (auto& x : p) x = static_cast<float>(x / s);
  return p;
}

// The rule under test, or a biased copy: resampling from p instead of the residual after a rejection.
ChainSampleResult biased_chain(const std::vector<int32_t>& drafts, const std::function<const std::vector<float>&(int)>& p,
                               const std::function<const std::vector<float>&(int)>& q, const std::function<double()>& u,
                               const std::function<int32_t(const std::vector<float>&)>& draw) {
  ChainSampleResult r;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const int32_t d = drafts[i];
    if (u() < std::min(1.0f, p(static_cast<int>(i))[static_cast<size_t>(d)] / q(static_cast<int>(i))[static_cast<size_t>(d)])) {
      ++r.n_accepted;
      continue;
    }
    r.next = draw(p(static_cast<int>(i)));  // wrong: should be norm(max(0, p − q))
    return r;
  }
  r.next = draw(p(static_cast<int>(drafts.size())));
  return r;
}

TEST(SpeculativeSampling, ChainOfSampledDraftsHasTheTargetDistribution) {
  const int V = 6, N = 40000;
  std::mt19937 g(7);
  // Target and draft distributions at depth 0, 1, 2 (independent of history here, so the exact law
  // of the first two emitted tokens is p0 × p1).
  std::vector<std::vector<float>> p = {random_dist(g, V, 2.5), random_dist(g, V, 2.5), random_dist(g, V, 2.5)};
  std::vector<std::vector<float>> q = {random_dist(g, V, 2.5), random_dist(g, V, 2.5)};
  std::map<std::vector<int32_t>, double> exact;
  for (int a = 0; a < V; ++a)
    for (int b = 0; b < V; ++b) exact[{a, b}] = p[0][static_cast<size_t>(a)] * p[1][static_cast<size_t>(b)];
  auto run = [&](bool biased) {
    std::mt19937_64 rng(11);
    auto u = [&] { return std::uniform_real_distribution<double>(0, 1)(rng); };
    auto draw = [&](const std::vector<float>& w) { return std::discrete_distribution<int32_t>(w.begin(), w.end())(rng); };
    std::map<std::vector<int32_t>, int> got;
    for (int i = 0; i < N; ++i) {
      std::vector<int32_t> drafts = {draw(q[0]), draw(q[1])};
      auto P = [&](int n) -> const std::vector<float>& { return p[static_cast<size_t>(n)]; };
      auto Q = [&](int n) -> const std::vector<float>& { return q[static_cast<size_t>(n)]; };
      ChainSampleResult r = biased ? biased_chain(drafts, P, Q, u, draw) : speculative_sample_chain(drafts, P, Q, u, draw);
      std::vector<int32_t> out(drafts.begin(), drafts.begin() + r.n_accepted);
      out.push_back(r.next);
      if (out.size() < 2) out.push_back(draw(p[1]));  // the next step's token after a first-position rejection
      out.resize(2);
      ++got[out];
    }
    return chi_square(exact, got, N);
  };
  const Chi2 ok = run(false), bad = run(true);
  EXPECT_LT(ok.stat, ok.crit) << "df " << ok.df;
  EXPECT_GT(bad.stat, bad.crit) << "the biased rule passed: the test cannot fail (df " << bad.df << ")";
}

// Sample-and-match on a token tree of a real tiny model: the law of the first two emitted tokens must be
// the target's own sampler's, p(y1 | P) · p(y2 | P, y1), with penalties following the path.
TEST(SpeculativeSampling, TreeSampleAndMatchHasTheTargetDistribution) {
  CpuBackend be(CpuOptions{});
  auto model = Model::load(test::shared_path("golden/models/tiny-qwen3-f16.gguf").string(), be);
  const int V = model->config().n_vocab;
  SamplingParams sp;
  sp.temperature = 1.3f;
  sp.top_k = 12;
  sp.top_p = 0.97f;
  sp.min_p = 0.0f;
  sp.repeat_penalty = 1.3f;
  const std::vector<int32_t> prompt = {17, 250, 33, 91, 402, 5};
  // Logits after prompt + path, each from its own forward (what a tree forward computes at that node).
  std::map<std::vector<int32_t>, std::vector<float>> memo;
  auto logits_after = [&](const std::vector<int32_t>& path) -> const std::vector<float>& {
    auto it = memo.find(path);
    if (it != memo.end()) return it->second;
    auto cache = model->make_cache({1, 64, DType::F32, 16});
    Batch b;
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), path.begin(), path.end());
    for (size_t i = 0; i < all.size(); ++i) b.add(all[i], static_cast<int32_t>(i), 0, i + 1 == all.size());
    std::vector<float> l;
    model->forward(b, *cache, l);
    return memo[path] = l;
  };
  auto history_sampler = [&](const std::vector<int32_t>& path, uint64_t seed) {
    SamplingParams s = sp;
    s.seed = seed;
    Sampler smp(s, V);
    for (int32_t t : prompt) smp.accept(t);
    for (int32_t t : path) smp.accept(t);
    return smp;
  };
  // Exact law of (y1, y2).
  std::vector<float> p1, p2;
  std::map<std::vector<int32_t>, double> exact;
  history_sampler({}, 0).distribution(logits_after({}).data(), p1);
  for (int32_t a = 0; a < V; ++a) {
    if (p1[static_cast<size_t>(a)] <= 0) continue;
    history_sampler({a}, 0).distribution(logits_after({a}).data(), p2);
    for (int32_t b = 0; b < V; ++b)
      if (p2[static_cast<size_t>(b)] > 0) exact[{a, b}] = p1[static_cast<size_t>(a)] * p2[static_cast<size_t>(b)];
  }
  // The tree: the target's three most likely first tokens, each with its two most likely successors.
  std::vector<int32_t> order(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
  auto top = [&](const std::vector<float>& p, int n) {
    std::vector<int32_t> o = order;
    std::partial_sort(o.begin(), o.begin() + n, o.end(), [&](int32_t x, int32_t y) { return p[static_cast<size_t>(x)] > p[static_cast<size_t>(y)]; });
    return std::vector<int32_t>(o.begin(), o.begin() + n);
  };
  DraftTree tree;
  tree.reset(prompt.back());
  std::vector<std::vector<int32_t>> node_path = {{}};
  for (int32_t a : top(p1, 3)) {
    const int na = tree.add(a, 0);
    node_path.push_back({a});
    history_sampler({a}, 0).distribution(logits_after({a}).data(), p2);
    for (int32_t b : top(p2, 2)) {
      tree.add(b, na);
      node_path.push_back({a, b});
    }
  }
  const int N = 24000;
  auto run = [&](bool biased) {
    std::map<std::vector<int32_t>, int> got;
    std::vector<float> pd;
    for (int i = 0; i < N; ++i) {
      Sampler smp = history_sampler({}, 1000 + static_cast<uint64_t>(i));
      std::vector<int32_t> out;
      WalkResult w = walk(tree, [&](int node) {
        const auto& l = logits_after(node_path[static_cast<size_t>(node)]);
        int32_t y = smp.sample(l.data());
        if (biased && tree.child(node, y) < 0) {
          // Over-acceptance: take a likely child instead of the target's own draw.
          smp.distribution(l.data(), pd);
          for (int c = node + 1; c < tree.size(); ++c)
            if (tree.parent[static_cast<size_t>(c)] == node && pd[static_cast<size_t>(tree.token[static_cast<size_t>(c)])] > 0.05f) {
              y = tree.token[static_cast<size_t>(c)];
              break;
            }
        }
        smp.accept(y);
        return y;
      });
      for (size_t j = 1; j < w.path.size(); ++j) out.push_back(tree.token[static_cast<size_t>(w.path[j])]);
      out.push_back(w.bonus);
      if (out.size() < 2) {
        // The next step's token after a bonus at the root: a plain draw from the target.
        const int32_t y = smp.sample(logits_after(out).data());
        out.push_back(y);
      }
      out.resize(2);
      ++got[out];
    }
    return chi_square(exact, got, N);
  };
  const Chi2 ok = run(false), bad = run(true);
  EXPECT_LT(ok.stat, ok.crit) << "df " << ok.df;
  EXPECT_GT(bad.stat, bad.crit) << "the biased rule passed: the test cannot fail (df " << bad.df << ")";
}

}  // namespace
}  // namespace pg::spec
