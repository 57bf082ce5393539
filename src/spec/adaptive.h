// Adaptive speculation: how much of a draft to verify, chosen per step and per sequence from the
// measured cost of the target's forwards and of the draft's steps, and from how often this
// sequence's drafts were accepted.
//
// The rate of a speculative step that verifies n drafted nodes is
//     (1 + E[accepted | n]) / (t_draft + t_forward(1 + n))      tokens per second,
// where E[accepted | n] = γ · Σ_{i ≤ n} P(node i is on the accepted path). The drafter's own path
// probability stands in for P (node order is prefix-closed, so every prefix of a chain or of a DDTree
// is itself a valid tree), and γ, the sequence's running ratio of accepted to predicted tokens,
// corrects the drafter's over- or under-confidence. Plain decoding is the case n = 0 with no draft
// cost; the chooser never verifies more rows than pay for themselves, so speculation costs little
// more than AR when drafts are poor and grows the tree when they are good.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "spec/tree.h"

namespace pg::spec {

// t_forward(k): the running mean of the forwards of exactly k rows once a few were seen (the cost is
// not linear in k on the CPU: matmuls below a size stay on the calling thread, larger ones pay the
// thread pool's hand-off), else a + b·k, an exponentially weighted least-squares fit over recent
// forwards; and the mean cost of one draft step. Before any measurement of multi-row forwards the
// slope is a guess (a quarter of an AR step per row), so speculation gets tried and then measured.
class CostModel {
 public:
  void observe_forward(int rows, double seconds);
  void observe_draft_step(double seconds);  // one drafter forward (one depth), all sequences
  double forward(int rows) const;
  double draft_step() const { return n_draft_ > 0 ? draft_ : 0.0; }
  bool measured() const { return w_ > 0; }

 private:
  double fit(int rows) const;
  // Weighted sums for the fit (weights decay by kDecay per observation).
  double w_ = 0, sk_ = 0, st_ = 0, skk_ = 0, skt_ = 0;
  std::array<double, kMaxTreeNodes * 2 + 1> at_{};   // (rows) running mean of forwards of that many rows
  std::array<uint32_t, kMaxTreeNodes * 2 + 1> n_at_{};
  double draft_ = 0;
  uint64_t n_draft_ = 0;
};

// Per-sequence acceptance statistics (decaying sums).
struct AcceptStats {
  double predicted = 0, accepted = 0;  // Σ predicted accepted tokens, Σ actual accepted tokens
  double hits = 0, trials = 0;         // per drafted position: accepted / looked at (geometric model)
  // γ: actual / predicted, clamped to [0.1, 2] (1 before anything was measured).
  double gamma() const;
  // α: probability that the next drafted token is accepted given the previous one was.
  double alpha() const;
  void observe(double predicted_tokens, int accepted, int verified);
};

// Path probability of every node of `t` (node 0: 1) from the drafter's per-depth candidates.
// Nodes whose token is not among the candidates of its depth get 0.
std::vector<double> path_probs(const DraftTree& t, const std::vector<TopK>& pos);

// The number of drafted nodes n (0 ≤ n ≤ p.size()-1) of a prefix-closed node order maximizing
// (1 + γ·Σ_{1≤i≤n} p[i]) / (t_draft + cost.forward(1 + n)); 0 means plain decoding pays best (the
// draft cost is already spent then, so n = 0 competes as 1 / (t_draft + t_forward(1))).
int choose_prefix(const std::vector<double>& p, double gamma, double t_draft, const CostModel& cost);

// Draft depth worth asking for before drafting: the d ≤ n_max maximizing the expected rate of a chain
// whose tokens are accepted with probability α each, (1 + Σ_{i≤d} α^i) / (d·t_step + t_forward(1+d)),
// against plain decoding 1 / t_forward(1); 0 = do not draft this step.
int choose_depth(double alpha, int n_max, const CostModel& cost);

// Keeps the first n + 1 nodes (root + n drafts) of a prefix-closed tree.
void truncate_tree(DraftTree& t, int n_draft);

}  // namespace pg::spec
