// Engine counters for /metrics and /props: totals, latency histograms and current occupancy.
// The engine thread updates them; readers take a consistent snapshot under the lock.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace pg::engine {

// Cumulative-bucket histogram in the Prometheus sense: counts[i] = observations ≤ bounds[i];
// the implicit +Inf bucket is `count`.
struct Histogram {
  std::vector<double> bounds;    // (n) ascending upper bounds, seconds
  std::vector<uint64_t> counts;  // (n) cumulative
  double sum = 0;
  uint64_t count = 0;

  explicit Histogram(std::vector<double> b = {});
  void observe(double v);
};

struct MetricsSnapshot {
  uint64_t requests_submitted = 0;  // accepted into the queue
  uint64_t requests_rejected = 0;   // refused at submission (context overflow, bad parameters, queue full)
  std::map<std::string, uint64_t> requests_finished;  // by finish reason name
  uint64_t prompt_tokens = 0;       // prefilled
  uint64_t generated_tokens = 0;    // sampled
  uint64_t steps = 0;               // batched forwards
  uint64_t batch_rows = 0;          // rows over all steps
  double busy_seconds = 0;          // time inside forward + sampling
  Histogram ttft{};                 // submission → first token, seconds
  Histogram token_latency{};        // between consecutive tokens of one sequence, seconds
  Histogram queue_wait{};           // submission → admitted to a slot, seconds
  Histogram request_duration{};     // submission → finished, seconds
  int active = 0;                   // sequences holding a slot
  int queued = 0;                   // waiting for a slot
  int slots = 0;
  int kv_blocks_used = 0, kv_blocks_total = 0;
  double prompt_tps = 0, generation_tps = 0;  // over the last few seconds
  // Speculative decoding: verify rounds (one per speculating sequence and step), tokens drafted and
  // accepted over all of them. Mean accepted length τ = (accepted + rounds) / rounds counts the bonus.
  uint64_t spec_rounds = 0, spec_drafted = 0, spec_accepted = 0;
  double spec_mean_accept_len() const {
    return spec_rounds ? static_cast<double>(spec_accepted + spec_rounds) / static_cast<double>(spec_rounds) : 0.0;
  }
  // SchedulerOptions::spec_phases: host-clock seconds of the steps with verify rows, summed per phase
  // (drafting, the verify forward, the walk/emit/cache commit, the rest of the step), and how many steps.
  uint64_t phase_steps = 0;
  double phase_draft_s = 0, phase_verify_s = 0, phase_commit_s = 0, phase_other_s = 0;
};

class Metrics {
 public:
  Metrics();
  MetricsSnapshot snapshot() const;

  // Engine-side updates.
  void on_submit();
  void on_reject();
  void on_admit(double queue_wait_s);
  void on_first_token(double ttft_s);
  void on_token_gap(double gap_s);
  void on_finish(const std::string& reason, double duration_s);
  void on_step(int rows, int prompt_tokens, int generated_tokens, double seconds);
  void on_spec(int drafted, int accepted);
  void on_spec_phases(double draft_s, double verify_s, double commit_s, double other_s);
  void set_occupancy(int active, int queued, int slots, int kv_used, int kv_total);

 private:
  struct StepRec {
    double t;  // seconds since start
    int prompt, gen;
  };
  mutable std::mutex mu_;
  MetricsSnapshot s_;
  std::deque<StepRec> recent_;  // steps of the last kWindow seconds, for the throughput gauges
  double t0_;
};

}  // namespace pg::engine
