#include "spec/tree.h"

#include <algorithm>
#include <map>
#include <queue>

#include "core/error.h"

namespace pg::spec {

void DraftTree::reset(int32_t root) {
  token.assign(1, root);
  parent.assign(1, -1);
  depth.assign(1, 0);
}

int DraftTree::add(int32_t tok, int parent_node) {
  PG_CHECK(parent_node >= 0 && parent_node < size(), "draft tree: parent " + std::to_string(parent_node) + " is not a node");
  PG_CHECK(size() < kMaxTreeNodes, "draft tree: more than " + std::to_string(kMaxTreeNodes) + " nodes");
  token.push_back(tok);
  parent.push_back(parent_node);
  depth.push_back(depth[static_cast<size_t>(parent_node)] + 1);
  return size() - 1;
}

int DraftTree::child(int node, int32_t tok) const {
  // Children always follow their parent; trees are ≤ 128 nodes, so a scan beats any index.
  for (int i = node + 1; i < size(); ++i)
    if (parent[static_cast<size_t>(i)] == node && token[static_cast<size_t>(i)] == tok) return i;
  return -1;
}

bool DraftTree::is_chain() const {
  for (int i = 1; i < size(); ++i)
    if (parent[static_cast<size_t>(i)] != i - 1) return false;
  return true;
}

DraftTree build_chain(int32_t root, const std::vector<int32_t>& tokens) {
  DraftTree t;
  t.reset(root);
  const size_t n = std::min(tokens.size(), static_cast<size_t>(kMaxTreeNodes - 1));
  for (size_t i = 0; i < n; ++i) t.add(tokens[i], static_cast<int>(i));
  return t;
}

DraftTree build_ddtree(int32_t root, const std::vector<TopK>& pos, int budget, bool seed_chain) {
  PG_CHECK(budget >= 1 && budget <= kMaxTreeNodes - 1,
           "DDTree budget must be in [1, " + std::to_string(kMaxTreeNodes - 1) + "], got " + std::to_string(budget));
  DraftTree t;
  t.reset(root);
  // Usable depth: positions with at least one candidate, stopping at the first empty one.
  size_t L = 0;
  while (L < pos.size() && !pos[L].ids.empty()) ++L;
  if (L == 0) return t;
  auto k_at = [&](size_t d) { return std::min<size_t>(static_cast<size_t>(budget), pos[d].ids.size()); };

  // Rank tuples (0-based ranks) → node index; a tuple's parent is the tuple without its last rank.
  std::map<std::vector<int>, int> node_of;
  node_of[{}] = 0;
  auto add_tuple = [&](const std::vector<int>& r) {
    std::vector<int> par(r.begin(), r.end() - 1);
    const int p = node_of.at(par);
    const size_t d = r.size() - 1;
    node_of[r] = t.add(pos[d].ids[static_cast<size_t>(r.back())], p);
  };
  if (seed_chain) {
    std::vector<int> r;
    for (size_t d = 0; d < L && t.n_draft() < budget; ++d) {
      r.push_back(0);
      add_tuple(r);
    }
  }
  struct Entry {
    double score;
    std::vector<int> ranks;
  };
  // Max-heap by score; ties to the lexicographically smaller tuple.
  auto worse = [](const Entry& a, const Entry& b) { return a.score < b.score || (a.score == b.score && a.ranks > b.ranks); };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> heap(worse);
  heap.push({pos[0].logprobs[0], {0}});
  while (!heap.empty() && t.n_draft() < budget) {
    Entry e = heap.top();
    heap.pop();
    if (!node_of.count(e.ranks)) add_tuple(e.ranks);  // seeded chain tuples are already nodes
    const size_t d = e.ranks.size() - 1;
    const int rk = e.ranks.back();
    if (static_cast<size_t>(rk + 1) < k_at(d)) {  // next sibling
      Entry s{e.score - pos[d].logprobs[static_cast<size_t>(rk)] + pos[d].logprobs[static_cast<size_t>(rk + 1)], e.ranks};
      s.ranks.back() = rk + 1;
      heap.push(std::move(s));
    }
    if (d + 1 < L) {  // first child
      Entry c{e.score + pos[d + 1].logprobs[0], e.ranks};
      c.ranks.push_back(0);
      heap.push(std::move(c));
    }
  }
  return t;
}

}  // namespace pg::spec
