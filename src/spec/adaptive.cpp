#include "spec/adaptive.h"

#include <algorithm>
#include <cmath>

namespace pg::spec {

namespace {
constexpr double kDecay = 0.995;      // cost fit: ~200 recent forwards
constexpr double kSeqDecay = 0.85;    // acceptance: the last ~7 verify steps of the sequence
constexpr double kSlopeGuess = 0.25;  // per extra row, as a fraction of an AR step, until measured
}  // namespace

void CostModel::observe_forward(int rows, double s) {
  const double k = rows;
  // A step the OS preempted (shared machine) says nothing about the model's cost: clip outliers.
  if (w_ > 8) s = std::min(s, 3 * forward(rows));
  if (rows >= 1 && static_cast<size_t>(rows) < at_.size()) {
    uint32_t& n = n_at_[static_cast<size_t>(rows)];
    ++n;
    const double a = std::max(1.0 / n, 0.05);  // the last ~20 forwards of that size
    at_[static_cast<size_t>(rows)] += a * (s - at_[static_cast<size_t>(rows)]);
  }
  w_ = w_ * kDecay + 1;
  sk_ = sk_ * kDecay + k;
  st_ = st_ * kDecay + s;
  skk_ = skk_ * kDecay + k * k;
  skt_ = skt_ * kDecay + k * s;
}

void CostModel::observe_draft_step(double s) {
  if (n_draft_ > 8) s = std::min(s, 3 * draft_);
  ++n_draft_;
  // Running mean with a floor on the weight of the newest value, so the cost follows the machine's load.
  const double a = std::max(1.0 / static_cast<double>(n_draft_), 1.0 - kDecay);
  draft_ += a * (s - draft_);
}

double CostModel::forward(int rows) const {
  if (rows >= 1 && static_cast<size_t>(rows) < at_.size() && n_at_[static_cast<size_t>(rows)] >= 4)
    return at_[static_cast<size_t>(rows)];
  return fit(rows);
}

double CostModel::fit(int rows) const {
  if (w_ <= 0) return 1e-3 * (1 + kSlopeGuess * (rows - 1));  // nothing measured: any positive scale
  const double mean_k = sk_ / w_, mean_t = st_ / w_;
  const double var_k = skk_ / w_ - mean_k * mean_k;
  double b;
  if (var_k < 0.25) {
    // One row count seen so far (AR only): guess the slope from the intercept.
    b = kSlopeGuess * mean_t / std::max(mean_k, 1.0);
  } else {
    b = (skt_ / w_ - mean_k * mean_t) / var_k;
  }
  double a = mean_t - b * mean_k;
  // A noisy fit must not make rows free or the fixed cost negative.
  const double t1 = std::max(a + b, 1e-7);
  b = std::max(b, 0.02 * t1);
  a = std::max(t1 - b, 0.0);
  return a + b * rows;
}

double AcceptStats::gamma() const {
  if (predicted < 1e-9) return 1.0;
  return std::clamp((accepted + 1.0) / (predicted + 1.0), 0.1, 2.0);
}

double AcceptStats::alpha() const {
  // Prior: 0.7 with the weight of two drafted positions.
  return (hits + 1.4) / (trials + 2.0);
}

void AcceptStats::observe(double pred, int acc, int verified) {
  predicted = predicted * kSeqDecay + pred;
  accepted = accepted * kSeqDecay + acc;
  hits = hits * kSeqDecay + acc;
  trials = trials * kSeqDecay + acc + (acc < verified ? 1 : 0);
}

std::vector<double> path_probs(const DraftTree& t, const std::vector<TopK>& pos) {
  std::vector<double> p(static_cast<size_t>(t.size()), 0.0);
  if (t.size() == 0) return p;
  p[0] = 1.0;
  for (int i = 1; i < t.size(); ++i) {
    const size_t d = static_cast<size_t>(t.depth[static_cast<size_t>(i)] - 1);
    double q = 0;
    if (d < pos.size()) {
      const TopK& c = pos[d];
      for (size_t j = 0; j < c.ids.size(); ++j)
        if (c.ids[j] == t.token[static_cast<size_t>(i)]) {
          q = std::exp(static_cast<double>(c.logprobs[j]));
          break;
        }
    }
    p[static_cast<size_t>(i)] = p[static_cast<size_t>(t.parent[static_cast<size_t>(i)])] * q;
  }
  return p;
}

int choose_prefix(const std::vector<double>& p, double gamma, double t_draft, const CostModel& cost) {
  int best = 0;
  double best_rate = 1.0 / (t_draft + cost.forward(1)), e = 0;
  for (size_t n = 1; n < p.size(); ++n) {
    e += std::min(1.0, gamma * p[n]);
    const double rate = (1.0 + e) / (t_draft + cost.forward(static_cast<int>(n) + 1));
    if (rate > best_rate) {
      best_rate = rate;
      best = static_cast<int>(n);
    }
  }
  return best;
}

int choose_depth(double alpha, int n_max, const CostModel& cost) {
  int best = 0;
  double best_rate = 1.0 / cost.forward(1), e = 0, a = 1;
  for (int d = 1; d <= n_max; ++d) {
    a *= alpha;
    e += a;
    const double rate = (1.0 + e) / (d * cost.draft_step() + cost.forward(1 + d));
    if (rate > best_rate) {
      best_rate = rate;
      best = d;
    }
  }
  return best;
}

void truncate_tree(DraftTree& t, int n_draft) {
  const size_t n = static_cast<size_t>(std::clamp(n_draft, 0, t.n_draft())) + 1;
  t.token.resize(n);
  t.parent.resize(n);
  t.depth.resize(n);
}

}  // namespace pg::spec
