// Verification of a draft tree against the target's outputs at its nodes.
//
// One rule covers greedy and sampled decoding: walk from the root, at each accepted node ask the
// target for its token there (`target_token(node)`: the argmax when greedy, one draw from the
// target's sampler — penalties, top-k/top-p/min-p, temperature — with the path's history when
// sampling), move to the child carrying that token if there is one, else stop: that token is the bonus.
// Every emitted token is therefore exactly the target's choice conditioned on the emitted prefix
// (the verify logits at node u are the target's logits after path(u)), so greedy output is the
// non-speculative output and sampled output has the target's distribution (docs/speculative.md).
// `target_token` is called once per emitted token, in order, so a sampler that draws once per call
// reproduces the non-speculative sample stream for a fixed seed.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "spec/tree.h"

namespace pg::spec {

struct WalkResult {
  std::vector<int> path;  // accepted nodes, root first (path.size() - 1 drafted tokens accepted)
  int32_t bonus = -1;     // the target's token at the last accepted node
};

// `max_emit` bounds the tokens emitted (accepted drafts + bonus, ≥ 1): the walk stops asking the
// target once that many were produced (max_tokens / context end), so no draw is wasted past the end.
WalkResult walk(const DraftTree& tree, const std::function<int32_t(int node)>& target_token, int max_emit = 1 << 30);

// Standard speculative sampling for a chain whose drafts were *sampled* from the drafter's q
// (Leviathan et al. / Chen et al.): draft i (1-based) is accepted with probability
// min(1, p_i(d_i) / q_i(d_i)); at the first rejection the next token is drawn from
// norm(max(0, p_i − q_i)); when all n are accepted the bonus is drawn from p_{n+1}.
// p(i) is the target's distribution at chain node i (0 = root; history = root + accepted drafts),
// q(i) the drafter's at node i (the distribution d_{i+1} was drawn from), both (n_vocab) summing to 1.
// uniform() gives U[0,1); draw(dist) samples a token from an (n_vocab) distribution.
struct ChainSampleResult {
  int n_accepted = 0;
  int32_t next = -1;  // the residual/bonus token
};
ChainSampleResult speculative_sample_chain(const std::vector<int32_t>& drafts,
                                           const std::function<const std::vector<float>&(int node)>& p,
                                           const std::function<const std::vector<float>&(int node)>& q,
                                           const std::function<double()>& uniform,
                                           const std::function<int32_t(const std::vector<float>&)>& draw);

}  // namespace pg::spec
