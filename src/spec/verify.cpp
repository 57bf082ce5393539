#include "spec/verify.h"

#include <algorithm>

#include "core/error.h"

namespace pg::spec {

WalkResult walk(const DraftTree& tree, const std::function<int32_t(int node)>& target_token, int max_emit) {
  PG_CHECK(tree.size() >= 1, "draft tree without a root");
  WalkResult r;
  int node = 0;
  r.path.push_back(0);
  for (;;) {
    const int32_t y = target_token(node);
    const int c = tree.child(node, y);
    // Emitted so far: accepted drafts (path.size()-1) + this token.
    if (c < 0 || static_cast<int>(r.path.size()) >= max_emit) {
      r.bonus = y;
      return r;
    }
    node = c;
    r.path.push_back(c);
  }
}

ChainSampleResult speculative_sample_chain(const std::vector<int32_t>& drafts,
                                           const std::function<const std::vector<float>&(int node)>& p,
                                           const std::function<const std::vector<float>&(int node)>& q,
                                           const std::function<double()>& uniform,
                                           const std::function<int32_t(const std::vector<float>&)>& draw) {
  ChainSampleResult r;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const std::vector<float>& pi = p(static_cast<int>(i));
    const std::vector<float>& qi = q(static_cast<int>(i));
    PG_CHECK(pi.size() == qi.size(), "speculative sampling: p and q differ in size");
    const int32_t d = drafts[i];
    const double pd = pi[static_cast<size_t>(d)], qd = qi[static_cast<size_t>(d)];
    if (qd > 0 && uniform() < std::min(1.0, pd / qd)) {
      ++r.n_accepted;
      continue;
    }
    std::vector<float> res(pi.size());
    double s = 0;
    for (size_t v = 0; v < pi.size(); ++v) s += (res[v] = std::max(0.0f, pi[v] - qi[v]));
    // p == q exactly leaves no residual mass; then rejection had probability 0 — fall back to p.
    if (s <= 0) res = pi;
    r.next = draw(res);
    return r;
  }
  r.next = draw(p(static_cast<int>(drafts.size())));
  return r;
}

}  // namespace pg::spec
