#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "core/error.h"

namespace pg {

void SamplingParams::validate(int n_vocab) const {
  auto finite = [](float v) { return std::isfinite(v); };
  PG_CHECK(finite(temperature), "temperature must be a finite number");
  PG_CHECK(finite(top_p) && top_p >= 0.0f, "top_p must be a number ≥ 0");
  PG_CHECK(finite(min_p) && min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1]");
  PG_CHECK(finite(typical_p) && typical_p >= 0.0f, "typical_p must be ≥ 0");
  PG_CHECK(top_k >= -1, "top_k must be ≥ -1");
  PG_CHECK(finite(repeat_penalty) && repeat_penalty > 0.0f, "repetition penalty must be > 0");
  PG_CHECK(repeat_last_n >= -1, "repeat_last_n must be ≥ -1");
  PG_CHECK(finite(presence_penalty) && std::fabs(presence_penalty) <= 100.0f, "presence_penalty must be a finite number in [-100, 100]");
  PG_CHECK(finite(frequency_penalty) && std::fabs(frequency_penalty) <= 100.0f, "frequency_penalty must be a finite number in [-100, 100]");
  for (const auto& [id, b] : logit_bias) {
    PG_CHECK(id >= 0 && id < n_vocab, "logit_bias token id " + std::to_string(id) + " is outside the vocabulary");
    PG_CHECK(!std::isnan(b) && b != std::numeric_limits<float>::infinity(), "logit_bias values must be numbers (or -inf)");
  }
}

int32_t argmax(const float* logits, int n_vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < n_vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

static double log_sum_exp(const float* logits, int n) {
  const float mx = logits[argmax(logits, n)];
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(static_cast<double>(logits[i]) - mx);
  return mx + std::log(s);
}

float token_logprob(const float* logits, int n_vocab, int32_t id) {
  return static_cast<float>(logits[id] - log_sum_exp(logits, n_vocab));
}

std::vector<TokenLogprob> top_logprobs(const float* logits, int n_vocab, int n) {
  n = std::clamp(n, 0, n_vocab);
  const double lse = log_sum_exp(logits, n_vocab);
  std::vector<int32_t> idx(static_cast<size_t>(n_vocab));
  for (int32_t i = 0; i < n_vocab; ++i) idx[static_cast<size_t>(i)] = i;
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  std::vector<TokenLogprob> out;
  for (int i = 0; i < n; ++i) out.push_back({idx[static_cast<size_t>(i)], static_cast<float>(logits[idx[static_cast<size_t>(i)]] - lse)});
  return out;
}

Sampler::Sampler(const SamplingParams& p, int n_vocab) : p_(p), n_vocab_(n_vocab), rng_(p.seed) {
  p_.validate(n_vocab);
  cand_.reserve(static_cast<size_t>(n_vocab));
}

void Sampler::reset() {
  history_.clear();
  rng_.seed(p_.seed);
}

void Sampler::accept(int32_t token) {
  history_.push_back(token);
  if (p_.repeat_last_n >= 0)
    while (static_cast<int>(history_.size()) > p_.repeat_last_n) history_.pop_front();
}

bool Sampler::raw_argmax() const {
  const bool penalties = p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;
  return !penalties && p_.logit_bias.empty() && p_.greedy();
}

int32_t Sampler::sample(const float* logits) {
  if (raw_argmax()) return argmax(logits, n_vocab_);
  const int32_t g = prepare(logits);
  if (g >= 0) return g;
  std::discrete_distribution<size_t> dist(w_.begin(), w_.end());
  return cand_[dist(rng_)].second;
}

void Sampler::distribution(const float* logits, std::vector<float>& probs) {
  probs.assign(static_cast<size_t>(n_vocab_), 0.0f);
  if (raw_argmax()) {
    probs[static_cast<size_t>(argmax(logits, n_vocab_))] = 1.0f;
    return;
  }
  const int32_t g = prepare(logits);
  if (g >= 0) {
    probs[static_cast<size_t>(g)] = 1.0f;
    return;
  }
  double s = 0;
  for (double v : w_) s += v;
  for (size_t i = 0; i < w_.size(); ++i) probs[static_cast<size_t>(cand_[i].second)] = static_cast<float>(w_[i] / s);
}

double Sampler::uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }

int32_t Sampler::draw(const std::vector<float>& weights) {
  std::discrete_distribution<int32_t> dist(weights.begin(), weights.end());
  return dist(rng_);
}

int32_t Sampler::prepare(const float* logits) {
  const bool penalties = p_.repeat_penalty != 1.0f || p_.presence_penalty != 0.0f || p_.frequency_penalty != 0.0f;

  // Work on a copy of the logits as (logit, id) candidates.
  cand_.resize(static_cast<size_t>(n_vocab_));
  for (int32_t i = 0; i < n_vocab_; ++i) cand_[static_cast<size_t>(i)] = {logits[i], i};

  if (penalties && !history_.empty()) {
    std::unordered_map<int32_t, int> counts;
    for (int32_t t : history_) ++counts[t];
    for (const auto& [id, count] : counts) {
      if (id < 0 || id >= n_vocab_) continue;
      float& l = cand_[static_cast<size_t>(id)].first;
      l = l > 0 ? l / p_.repeat_penalty : l * p_.repeat_penalty;
      l -= static_cast<float>(count) * p_.frequency_penalty + (count > 0 ? p_.presence_penalty : 0.0f);
    }
  }
  for (const auto& [id, b] : p_.logit_bias) cand_[static_cast<size_t>(id)].first += b;

  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  if (p_.greedy()) return std::min_element(cand_.begin(), cand_.end(), by_logit)->second;

  size_t n = cand_.size();
  // top-k
  if (p_.top_k > 0 && static_cast<size_t>(p_.top_k) < n) {
    std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
    n = static_cast<size_t>(p_.top_k);
  } else {
    std::sort(cand_.begin(), cand_.end(), by_logit);
  }
  // Drop banned tokens (-inf) so they can never be drawn.
  while (n > 1 && std::isinf(cand_[n - 1].first) && cand_[n - 1].first < 0) --n;

  auto softmax = [&](std::vector<float>& probs) {
    probs.resize(n);
    const float mx = cand_[0].first;
    double s = 0;
    for (size_t i = 0; i < n; ++i) s += (probs[i] = std::exp(cand_[i].first - mx));
    for (auto& v : probs) v = static_cast<float>(v / s);
  };
  std::vector<float> probs;
  // typical
  if (p_.typical_p < 1.0f && n > 1) {
    softmax(probs);
    double ent = 0;
    for (float q : probs)
      if (q > 0) ent -= q * std::log(q);
    std::vector<std::pair<double, size_t>> dev(n);
    for (size_t i = 0; i < n; ++i) dev[i] = {std::fabs(-std::log(std::max(probs[i], 1e-30f)) - ent), i};
    std::stable_sort(dev.begin(), dev.end());
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += probs[dev[keep].second];
      ++keep;
      if (cum >= p_.typical_p) break;
    }
    std::vector<std::pair<float, int32_t>> kept;
    for (size_t i = 0; i < keep; ++i) kept.push_back(cand_[dev[i].second]);
    std::sort(kept.begin(), kept.end(), by_logit);
    std::copy(kept.begin(), kept.end(), cand_.begin());
    n = keep;
  }
  // top-p
  if (p_.top_p < 1.0f && n > 1) {
    softmax(probs);
    double cum = 0;
    size_t keep = 0;
    while (keep < n) {
      cum += probs[keep++];
      if (cum >= p_.top_p) break;
    }
    n = std::max<size_t>(keep, 1);
  }
  // min-p: keep tokens with p ≥ min_p · p_max
  if (p_.min_p > 0.0f && n > 1) {
    const float thresh = cand_[0].first + std::log(p_.min_p);
    size_t keep = 1;
    while (keep < n && cand_[keep].first >= thresh) ++keep;
    n = keep;
  }
  // temperature: the weights of the candidates the draw chooses from
  w_.resize(n);
  const double mx = cand_[0].first;
  for (size_t i = 0; i < n; ++i) w_[i] = std::exp((cand_[i].first - mx) / p_.temperature);
  return -1;
}

}  // namespace pg
