// Token-tree verification in Model::forward (issue 10 §1) on every golden model: one tree forward
// gives, for each node, the logits of a plain chain forward along that node's path; committing an
// accepted path (KvCache::commit) continues exactly like autoregressive decoding of that path; several
// sequences' trees share a batch; micro-batch splits inside a tree change nothing.
//
// Tolerance: bit-identical. The CPU kernels compute every row independently of how many rows share the
// call (matmuls convert and multiply per row in a fixed order, attention walks a row's keys in
// logical order, which for a tree row is its committed history then its ancestors by depth, exactly
// the chain's order), and recurrent layers of hybrids run token by token in both forms (capture on).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "kv/paged_kv_cache.h"
#include "model/model.h"
#include "testutil.h"

namespace pg {
namespace {

const char* kStems[] = {"tiny-llama-f16",    "tiny-llama-Q8_0",   "tiny-llama-Q4_0",   "tiny-llama-Q4_1",   "tiny-llama-Q5_0",
                        "tiny-llama-Q5_1",   "tiny-llama-Q4_K_M", "tiny-llama-Q5_K_M", "tiny-llama-Q6_K",   "tiny-llama-Q2_K",
                        "tiny-llama-Q3_K_M", "tiny-llama-IQ4_XS", "tiny-qwen3-f16",    "tiny-qwen3-Q8_0",   "tiny-qwen3-Q4_0",
                        "tiny-qwen3-Q4_1",   "tiny-qwen3-Q5_0",   "tiny-qwen3-Q5_1",   "tiny-qwen3-Q4_K_M", "tiny-qwen3-Q5_K_M",
                        "tiny-qwen3-Q6_K",   "tiny-qwen3-Q2_K",   "tiny-qwen3-Q3_K_M", "tiny-qwen3-IQ4_XS", "tiny-qwen2-f16",
                        "tiny-qwen3moe-f16", "tiny-gemma3-f16",   "tiny-qwen35-f16",   "tiny-qwen35moe-f16"};

struct Tree {
  std::vector<int32_t> tok, parent, depth;
  std::vector<int32_t> path(int node) const {  // tree indices root → node
    std::vector<int32_t> p;
    for (int x = node; x >= 0; x = parent[static_cast<size_t>(x)]) p.insert(p.begin(), x);
    return p;
  }
};

// A random tree of `n` nodes: one root, each later node's parent drawn among earlier nodes (biased to
// recent ones so that trees get deep), depth < max_depth.
Tree random_tree(int n, int vocab, int max_depth, std::mt19937& rng) {
  Tree t;
  for (int i = 0; i < n; ++i) {
    int p = -1;
    if (i > 0) {
      p = static_cast<int>(rng() % static_cast<uint32_t>(i));
      if (rng() % 2) p = i - 1 - static_cast<int>(rng() % static_cast<uint32_t>(std::min(i, 3)));
      while (t.depth[static_cast<size_t>(p)] + 1 >= max_depth) p = t.parent[static_cast<size_t>(p)];
      if (p < 0) p = 0;  // max_depth ≥ 2 keeps the root's children legal
    }
    t.parent.push_back(p);
    t.depth.push_back(p < 0 ? 0 : t.depth[static_cast<size_t>(p)] + 1);
    t.tok.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
  }
  return t;
}

struct Fixture {
  CpuBackend be;
  std::unique_ptr<Model> model;
  int V = 0;
  bool hybrid = false;
  int max_depth = 1 << 20;
  explicit Fixture(const std::string& stem, int max_batch = 512) : be(CpuOptions{2, false, 64}) {
    ModelOptions mo;
    mo.max_batch = max_batch;
    model = Model::load(test::shared_path("golden/models/" + stem + ".gguf").string(), be, mo);
    V = model->config().n_vocab;
    hybrid = model->config().has_recurrent();
    if (model->config().sliding_window > 0) max_depth = std::min(max_depth, model->config().sliding_window);
  }
  DType kv = DType::F32;
  std::unique_ptr<KvCache> cache(int n_seq = 1) { return model->make_cache({n_seq, 256, kv, 16, 0, hybrid ? 160 : 0}); }
  ForwardOptions fopt() const {
    ForwardOptions f;
    f.capture = hybrid;  // hybrids: token-by-token recurrent form in every forward, and trees need it
    return f;
  }
  // Chain forward of `toks` on seq at its current length; returns the logits of every row.
  std::vector<float> chain(KvCache& c, const std::vector<int32_t>& toks, int seq = 0) {
    Batch b;
    for (size_t i = 0; i < toks.size(); ++i) b.add(toks[i], c.seq_len(seq) + static_cast<int>(i), seq, true);
    std::vector<float> out;
    model->forward(b, c, out, fopt());
    return out;
  }
};

std::vector<int32_t> prompt_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab)));
  return p;
}

double max_rel(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  return m;
}

int argmax_row(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// Adds the tree's rows for sequence seq (committed length len) to b.
void add_tree(Batch& b, const Tree& t, int seq, int len) {
  const int off = b.size();
  for (size_t i = 0; i < t.tok.size(); ++i) b.add_tree(t.tok[i], len + t.depth[i], seq, t.parent[i] < 0 ? -1 : t.parent[i] + off, true);
}

// Checks the logits of tree nodes (rows row0.. of `got`) against chains along each leaf's path, on a
// copy of the committed state `state` (KvCache::save_seq), and returns the worst relative difference.
double check_tree_logits(Fixture& f, const std::vector<uint8_t>& state, const Tree& t, const float* got, const std::string& what) {
  const int n = static_cast<int>(t.tok.size());
  std::vector<uint8_t> is_parent(static_cast<size_t>(n), 0);
  for (int32_t p : t.parent)
    if (p >= 0) is_parent[static_cast<size_t>(p)] = 1;
  double worst = 0;
  for (int leaf = 0; leaf < n; ++leaf) {
    if (is_parent[static_cast<size_t>(leaf)]) continue;
    auto c = f.cache();
    c->restore_seq(0, state);
    const auto path = t.path(leaf);
    std::vector<int32_t> toks;
    for (int32_t x : path) toks.push_back(t.tok[static_cast<size_t>(x)]);
    const auto ref = f.chain(*c, toks);
    for (size_t d = 0; d < path.size(); ++d) {
      const float* g = got + static_cast<size_t>(path[d]) * static_cast<size_t>(f.V);
      const double e = max_rel(g, ref.data() + d * static_cast<size_t>(f.V), static_cast<size_t>(f.V));
      worst = std::max(worst, e);
      EXPECT_EQ(e, 0.0) << what << ": node " << path[d] << " (depth " << d << ") differs from the chain along its path";
    }
  }
  return worst;
}

class TreeForward : public testing::TestWithParam<std::string> {};

TEST_P(TreeForward, NodesEqualChainsAndCommitContinuesLikeAutoregression) {
  Fixture f(GetParam());
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(GetParam())));
  const auto prompt = prompt_tokens(13, f.V, 5);
  for (int budget : {1, 5, 22, 64}) {
    const std::string what = GetParam() + " budget " + std::to_string(budget);
    auto c = f.cache();
    f.chain(*c, prompt);
    const auto state = c->save_seq(0);
    const Tree t = random_tree(budget, f.V, f.max_depth, rng);
    Batch b;
    add_tree(b, t, 0, 13);
    std::vector<float> out;
    f.model->forward(b, *c, out, f.fopt());
    ASSERT_EQ(out.size(), static_cast<size_t>(budget) * static_cast<size_t>(f.V));
    EXPECT_EQ(c->seq_len(0), 13) << what << ": tree rows must not advance the sequence";
    check_tree_logits(f, state, t, out.data(), what);

    // Commit a random root-to-node path, then greedy-decode: the same tokens (and logits) as decoding
    // after a plain chain of that path.
    const int node = static_cast<int>(rng() % static_cast<uint32_t>(budget));
    const auto path = t.path(node);
    c->commit(0, std::vector<int>(path.begin(), path.end()));
    ASSERT_EQ(c->seq_len(0), 13 + static_cast<int>(path.size())) << what;
    EXPECT_EQ(c->tree_size(0), 0);
    auto ref = f.cache();
    std::vector<int32_t> hist = prompt;
    for (int32_t x : path) hist.push_back(t.tok[static_cast<size_t>(x)]);
    auto rl = f.chain(*ref, hist);
    {
      const auto sa = c->save_seq(0), sb = ref->save_seq(0);
      if (sa != sb) {
        size_t i = 0;
        while (i < sa.size() && sa[i] == sb[i]) ++i;
        ADD_FAILURE() << what << ": state differs at byte " << i << " of " << sa.size() << " path size " << path.size() << " node " << node;
      }
    }
    int tok_ref = argmax_row(rl.data() + (hist.size() - 1) * static_cast<size_t>(f.V), f.V);
    int tok = argmax_row(out.data() + static_cast<size_t>(node) * static_cast<size_t>(f.V), f.V);
    ASSERT_EQ(tok, tok_ref) << what << ": the bonus token";
    for (int step = 0; step < 6; ++step) {
      const auto a = f.chain(*c, {tok}), r = f.chain(*ref, {tok_ref});
      EXPECT_EQ(max_rel(a.data(), r.data(), static_cast<size_t>(f.V)), 0.0) << what << " step " << step;
      tok = argmax_row(a.data(), f.V);
      tok_ref = argmax_row(r.data(), f.V);
      ASSERT_EQ(tok, tok_ref) << what << " step " << step;
    }
  }
}

// Three sequences in one batch: two trees and one chain (prefill-like) sequence, cut into micro-batches
// of 5 rows (so trees straddle micro-batches), each tree node still equal to its chain; then each
// tree sequence commits its own path. With an F16 cache (the server's default; the vector attention
// path on AVX2).
TEST_P(TreeForward, SeveralSequencesAndMicroBatchSplits) {
  for (int max_batch : {512, 5}) {
    Fixture f(GetParam(), max_batch);
    f.kv = DType::F16;
    std::mt19937 rng(99);
    const auto p0 = prompt_tokens(9, f.V, 1), p1 = prompt_tokens(17, f.V, 2), p2 = prompt_tokens(6, f.V, 3);
    auto c = f.cache(3);
    f.chain(*c, p0, 0);
    f.chain(*c, p1, 1);
    f.chain(*c, p2, 2);
    const auto s0 = c->save_seq(0), s1 = c->save_seq(1);
    const Tree t0 = random_tree(12, f.V, f.max_depth, rng), t1 = random_tree(9, f.V, f.max_depth, rng);
    const auto more = prompt_tokens(4, f.V, 4);
    Batch b;
    add_tree(b, t0, 0, 9);
    for (size_t i = 0; i < more.size(); ++i) b.add(more[i], 6 + static_cast<int>(i), 2, true);
    add_tree(b, t1, 1, 17);
    std::vector<float> out;
    f.model->forward(b, *c, out, f.fopt());
    const std::string what = GetParam() + " max_batch " + std::to_string(max_batch);
    const size_t V = static_cast<size_t>(f.V);
    check_tree_logits(f, s0, t0, out.data(), what + " tree 0");
    check_tree_logits(f, s1, t1, out.data() + (12 + 4) * V, what + " tree 1");
    EXPECT_EQ(c->seq_len(0), 9);
    EXPECT_EQ(c->seq_len(1), 17);
    EXPECT_EQ(c->seq_len(2), 10);  // the chain sequence advances
    {
      auto ref = f.cache();
      std::vector<int32_t> h = p2;
      h.insert(h.end(), more.begin(), more.end());
      const auto r = f.chain(*ref, h);
      EXPECT_EQ(max_rel(out.data() + 12 * V, r.data() + 6 * V, 4 * V), 0.0) << what << ": chain rows beside trees";
    }
    // Commit: sequence 0 its deepest node's path, sequence 1 nothing (every draft rejected).
    int deepest = 0;
    for (int i = 0; i < 12; ++i)
      if (t0.depth[static_cast<size_t>(i)] > t0.depth[static_cast<size_t>(deepest)]) deepest = i;
    const auto path = t0.path(deepest);
    c->commit(0, std::vector<int>(path.begin(), path.end()));
    c->commit(1, {});
    EXPECT_EQ(c->seq_len(1), 17);
    std::vector<int32_t> h0 = p0;
    for (int32_t x : path) h0.push_back(t0.tok[static_cast<size_t>(x)]);
    auto ref = f.cache(2);
    f.chain(*ref, h0, 0);
    f.chain(*ref, p1, 1);
    const auto a0 = f.chain(*c, {3}, 0), r0 = f.chain(*ref, {3}, 0);
    const auto a1 = f.chain(*c, {4}, 1), r1 = f.chain(*ref, {4}, 1);
    EXPECT_EQ(max_rel(a0.data(), r0.data(), V), 0.0) << what << ": after commit";
    EXPECT_EQ(max_rel(a1.data(), r1.data(), V), 0.0) << what << ": after rejecting the whole tree";
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, TreeForward, testing::ValuesIn(std::vector<std::string>(std::begin(kStems), std::end(kStems))),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

// A chain verified as a tree (each row's parent the previous row) commits without moving a K/V row;
// a path through a branchy tree moves exactly the rows not yet at their depth.
TEST(TreeCommit, ChainCommitsWithoutCopies) {
  Fixture f("tiny-qwen3-f16");
  auto c = f.cache();
  auto& paged = dynamic_cast<PagedKvCache&>(*c);
  f.chain(*c, prompt_tokens(7, f.V, 1));
  Tree chain;
  for (int i = 0; i < 10; ++i) {
    chain.tok.push_back(3 + i);
    chain.parent.push_back(i - 1);
    chain.depth.push_back(i);
  }
  Batch b;
  add_tree(b, chain, 0, 7);
  std::vector<float> out;
  f.model->forward(b, *c, out);
  c->commit(0, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(paged.rows_copied(), 0);
  EXPECT_EQ(c->seq_len(0), 13);
  // Root 0 with children 1 and 2; 2's child 3; the path 0 → 2 → 3 moves rows 2 and 3 (to depths 1, 2).
  Tree t{{5, 6, 7, 8}, {-1, 0, 0, 2}, {0, 1, 1, 2}};
  b.clear();
  add_tree(b, t, 0, 13);
  f.model->forward(b, *c, out);
  c->commit(0, {0, 2, 3});
  EXPECT_EQ(paged.rows_copied(), 2);
  EXPECT_EQ(c->seq_len(0), 16);
  // A tree left uncommitted is abandoned by the next chain forward: its cells return to the pool.
  const int free_before = c->free_blocks();
  Tree wide;
  for (int i = 0; i < 40; ++i) {
    wide.tok.push_back(i);
    wide.parent.push_back(i == 0 ? -1 : 0);
    wide.depth.push_back(i == 0 ? 0 : 1);
  }
  b.clear();
  add_tree(b, wide, 0, 16);
  f.model->forward(b, *c, out);
  EXPECT_LT(c->free_blocks(), free_before);
  f.chain(*c, {1});
  EXPECT_EQ(c->tree_size(0), 0);
  EXPECT_EQ(c->free_blocks(), free_before - 1);  // 17 tokens: the 16 of before fill one block exactly
  EXPECT_THROW(c->commit(0, {0}), Error);
}

// Bad trees are clear errors and change nothing.
TEST(TreeForwardErrors, BadTreesAndBadCommits) {
  Fixture f("tiny-qwen3-f16");
  auto c = f.cache(2);
  f.chain(*c, prompt_tokens(5, f.V, 1));
  const auto before = c->save_seq(0);
  std::vector<float> out;
  auto tree_batch = [&](std::vector<int32_t> pos, std::vector<int32_t> par, std::vector<int32_t> seq = {}) {
    Batch b;
    for (size_t i = 0; i < pos.size(); ++i) {
      b.add(1, pos[i], seq.empty() ? 0 : seq[i], true);
      b.parent.back() = par[i];
    }
    return b;
  };
  EXPECT_THROW(f.model->forward(tree_batch({5, 6}, {-1, 1}), *c, out), Error);         // parent not earlier
  EXPECT_THROW(f.model->forward(tree_batch({5, 7}, {-1, 0}), *c, out), Error);         // not at parent + 1
  EXPECT_THROW(f.model->forward(tree_batch({4, 5}, {-1, 0}), *c, out), Error);         // root not at seq_len
  EXPECT_THROW(f.model->forward(tree_batch({5, 0}, {-1, 0}, {0, 1}), *c, out), Error);  // parent of another sequence
  {
    std::vector<int32_t> pos, par;
    for (int i = 0; i <= kMaxTreeRows; ++i) {
      pos.push_back(5 + (i > 0 ? 1 : 0));
      par.push_back(i > 0 ? 0 : -1);
    }
    EXPECT_THROW(f.model->forward(tree_batch(pos, par), *c, out), Error);  // 129 rows
  }
  EXPECT_EQ(c->seq_len(0), 5);
  EXPECT_EQ(c->save_seq(0), before);
  // Past the context: 256 − 5 = 251 cells left, a 4-row tree at length 253 does not fit.
  {
    auto small = f.model->make_cache({1, 8, DType::F32, 4});
    f.chain(*small, prompt_tokens(6, f.V, 2));
    EXPECT_THROW(f.model->forward(tree_batch({6, 7, 7}, {-1, 0, 0}), *small, out), Error);
  }
  // Commits: no tree, a path not starting at a root, a non-child, an index out of range.
  EXPECT_THROW(c->commit(0, {0}), Error);
  f.model->forward(tree_batch({5, 6, 6, 7}, {-1, 0, 0, 2}), *c, out);
  EXPECT_THROW(c->commit(0, {1}), Error);
  EXPECT_THROW(c->commit(0, {0, 3}), Error);
  EXPECT_THROW(c->commit(0, {0, 9}), Error);
  EXPECT_EQ(c->seq_len(0), 5);
  c->commit(0, {0, 2, 3});
  EXPECT_EQ(c->seq_len(0), 8);
  EXPECT_THROW(c->commit(0, {0}), Error);  // the tree is gone once committed
}

// Gemma 3 has sliding-window layers: a tree as deep as the window is refused.
TEST(TreeForwardErrors, DepthBoundedBySlidingWindow) {
  Fixture f("tiny-gemma3-f16");
  const int W = f.model->config().sliding_window;
  ASSERT_GT(W, 0);
  ASSERT_LT(W, kMaxTreeRows);
  auto c = f.cache();
  f.chain(*c, prompt_tokens(3, f.V, 1));
  Batch b;
  for (int i = 0; i <= W; ++i) {
    b.add(1, 3 + i, 0, true);
    b.parent.back() = i - 1;
  }
  std::vector<float> out;
  EXPECT_THROW(f.model->forward(b, *c, out), Error);
  b.tokens.pop_back();
  b.positions.pop_back();
  b.seq.pop_back();
  b.parent.pop_back();
  b.logits.pop_back();
  f.model->forward(b, *c, out);  // depth W − 1 is fine
}

}  // namespace
}  // namespace pg
