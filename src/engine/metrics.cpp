#include "engine/metrics.h"

#include <algorithm>
#include <chrono>

namespace pg::engine {

namespace {

constexpr double kWindow = 10.0;  // seconds of history behind the tok/s gauges

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Histogram::Histogram(std::vector<double> b) : bounds(std::move(b)), counts(bounds.size(), 0) {}

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) ++counts[i];
  sum += v;
  ++count;
}

Metrics::Metrics() : t0_(now_s()) {
  s_.ttft = Histogram({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120});
  s_.token_latency = Histogram({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5});
  s_.queue_wait = Histogram({0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120});
  s_.request_duration = Histogram({0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600});
}

MetricsSnapshot Metrics::snapshot() const {
  std::lock_guard<std::mutex> lk(mu_);
  MetricsSnapshot s = s_;
  // Throughput over the window, counted from the oldest step still in it to now.
  const double now = now_s() - t0_;
  double span = 0;
  uint64_t p = 0, g = 0;
  for (const auto& r : recent_) {
    if (now - r.t > kWindow) continue;
    p += static_cast<uint64_t>(r.prompt);
    g += static_cast<uint64_t>(r.gen);
    span = std::max(span, now - r.t);
  }
  span = std::max(span, 1.0);
  s.prompt_tps = static_cast<double>(p) / span;
  s.generation_tps = static_cast<double>(g) / span;
  return s;
}

void Metrics::on_submit() {
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.requests_submitted;
}

void Metrics::on_reject() {
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.requests_rejected;
}

void Metrics::on_admit(double w) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.queue_wait.observe(w);
}

void Metrics::on_first_token(double t) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.ttft.observe(t);
}

void Metrics::on_token_gap(double g) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.token_latency.observe(g);
}

void Metrics::on_finish(const std::string& reason, double d) {
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.requests_finished[reason];
  s_.request_duration.observe(d);
}

void Metrics::on_step(int rows, int prompt_tokens, int generated_tokens, double seconds) {
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.steps;
  s_.batch_rows += static_cast<uint64_t>(rows);
  s_.prompt_tokens += static_cast<uint64_t>(prompt_tokens);
  s_.generated_tokens += static_cast<uint64_t>(generated_tokens);
  s_.busy_seconds += seconds;
  const double t = now_s() - t0_;
  recent_.push_back({t, prompt_tokens, generated_tokens});
  while (!recent_.empty() && t - recent_.front().t > kWindow) recent_.pop_front();
}

void Metrics::on_spec(int drafted, int accepted) {
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.spec_rounds;
  s_.spec_drafted += static_cast<uint64_t>(drafted);
  s_.spec_accepted += static_cast<uint64_t>(accepted);
}

void Metrics::on_spec_phases(double draft_s, double verify_s, double commit_s, double other_s) {
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.phase_steps;
  s_.phase_draft_s += draft_s;
  s_.phase_verify_s += verify_s;
  s_.phase_commit_s += commit_s;
  s_.phase_other_s += other_s;
}

void Metrics::set_occupancy(int active, int queued, int slots, int kv_used, int kv_total) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.active = active;
  s_.queued = queued;
  s_.slots = slots;
  s_.kv_blocks_used = kv_used;
  s_.kv_blocks_total = kv_total;
}

}  // namespace pg::engine
