// Draft token trees and the builders that make them: a chain (one path) and DDTree (best-first over
// the drafter's per-position top-k, path log-probability priority, the greedy chain pre-seeded).
//
// Node 0 is the root: the sequence's newest token, which the target has not evaluated yet (the bonus
// of the previous step, or the first token after prefill). Every other node is a drafted token whose
// parent is an earlier node; nodes are numbered so that a parent always precedes its children, which
// is the order the verify batch lays the rows out in.
#pragma once
#include <cstdint>
#include <vector>

namespace pg::spec {

// At most this many rows (root included) in one sequence's verify tree (backend kMaxTreeRows).
inline constexpr int kMaxTreeNodes = 128;

// One drafted position's candidates: the k most likely tokens, best first, and their log-probs.
struct TopK {
  std::vector<int32_t> ids;      // (k)
  std::vector<float> logprobs;   // (k) non-increasing
};

struct DraftTree {
  std::vector<int32_t> token;   // (n) node 0 = root
  std::vector<int32_t> parent;  // (n) -1 for the root, else an earlier node
  std::vector<int32_t> depth;   // (n) root 0

  int size() const { return static_cast<int>(token.size()); }
  int n_draft() const { return size() > 0 ? size() - 1 : 0; }
  void reset(int32_t root);
  int add(int32_t tok, int parent_node);
  // The child of `node` carrying `tok`, or -1.
  int child(int node, int32_t tok) const;
  // Every node's parent is the node before it.
  bool is_chain() const;
};

// root → tokens[0] → tokens[1] … (at most kMaxTreeNodes-1 drafts).
DraftTree build_chain(int32_t root, const std::vector<int32_t>& tokens);

// DDTree (Algorithm 1 of the DDTree paper; ../shared/reference/dflash-ddtree.md §4.2): `budget` draft
// nodes (1 ≤ budget ≤ kMaxTreeNodes-1) chosen best-first by the path score Σ log q_i over the per-depth
// candidates `pos` (depth i+1 uses pos[i]; K = min(budget, candidates)). With `seed_chain` the greedy
// chain (rank 1 at every depth, up to the budget) is put in first — Lucebox's deviation, which keeps the
// drafter's own greedy continuation whole whatever the scores say; the rest of the budget goes
// best-first. The result is prefix-closed by construction (a tuple is pushed only after its
// predecessor was taken). Ties go to the lexicographically smaller rank tuple.
DraftTree build_ddtree(int32_t root, const std::vector<TopK>& pos, int budget, bool seed_chain = true);

}  // namespace pg::spec
