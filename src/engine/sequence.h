// One request's state inside the engine: where its prompt stands, its sampler, detokenizer and stop
// matcher, and the handle its output goes to. Kept apart from the step loop so that other ways of
// stepping (speculative verification, prefix reuse) can drive the same state.
#pragma once
#include <memory>
#include <optional>

#include "engine/constraint.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "engine/stop_matcher.h"
#include "spec/adaptive.h"
#include "spec/drafter.h"
#include "tokenizer/tokenizer.h"

namespace pg::engine {

class Metrics;

// The drafter's sampling distribution for a sampled request: the request's truncation (top-k, typical,
// top-p, min-p) and temperature without penalties or logit bias, with an RNG of its own seeded from the
// request's seed, so a seed still decides the whole output. Any q keeps speculative sampling exact; a
// q close to the target's raises acceptance.
class DraftSampler final : public spec::DraftSampler {
 public:
  DraftSampler(const SamplingParams& p, int n_vocab);
  int32_t sample(const float* logits, std::vector<float>& q) override;
  void reset();

 private:
  static SamplingParams strip(SamplingParams p);
  Sampler s_;
};

class Sequence {
 public:
  enum class Phase : uint8_t { kWaiting, kPrefill, kDecode, kDone };

  Sequence(RequestSpec spec, std::shared_ptr<RequestHandle> handle, const tok::Tokenizer& tok, int n_vocab,
           Clock::time_point submitted);

  Phase phase() const { return phase_; }
  int slot() const { return slot_; }
  const RequestSpec& spec() const { return spec_; }
  RequestHandle& handle() { return *handle_; }
  int n_prompt() const { return static_cast<int>(spec_.prompt.size()); }
  int n_prefilled() const { return n_prefilled_; }
  int n_past() const { return n_past_; }  // tokens in the KV cache
  int n_generated() const { return n_generated_; }
  int32_t last_token() const { return last_; }
  Clock::time_point submitted() const { return submitted_; }

  // Takes a cache slot (already cleared by the caller); prefill starts with the next step.
  void admit(int slot, Clock::time_point now, Metrics& m);
  // The prefix cache attached the first n prompt tokens (n_disk of them from disk): prefill resumes there.
  void cached(int n, int n_disk) {
    n_prefilled_ = n_past_ = n_cached_ = n;
    n_cached_disk_ = n_disk;
  }
  int n_cached() const { return n_cached_; }
  // The caller put prompt tokens [n_prefilled, n_prefilled + n) in this step's batch.
  void prefilled(int n);
  // The caller put last_token() in this step's batch at position n_past().
  void decoded() { ++n_past_; }
  // True when this sequence needs only the greedy token of its logits row (raw-argmax sampling and no
  // logprobs): the model then computes it on its backend and skips the logits copy.
  bool greedy_only() const { return sampler_.raw_argmax() && spec_.logprobs < 0 && !(constraint_ && constraint_->masking()); }
  // The grammar / reasoning-budget state (null without one).
  const Constraint* constraint() const { return constraint_.get(); }
  // The row of this sequence that asked for logits was evaluated: samples (or takes `greedy`, the
  // backend's argmax, when ≥ 0 — then logits may be null), detokenizes, checks the end conditions and
  // publishes the output. Returns false when the sequence finished.
  bool on_logits(const float* logits, int n_ctx, Clock::time_point now, Metrics& m, int32_t greedy = -1);

  // ---- speculative steps (engine/scheduler.cpp): choose, then emit ----
  // The target's token from one node's logits (or `greedy`, the backend's argmax, when ≥ 0), recorded
  // in the sampler's history — called once per emitted token, along the accepted path.
  int32_t choose(const float* logits, int32_t greedy = -1);
  // Publishes a chosen token exactly as on_logits does after choosing (end-of-generation, stop
  // strings, max_tokens, context end). `logits` (for logprobs) may be null when logprobs are off.
  // Returns false when the sequence finished; the caller drops the rest of the accepted run.
  bool emit(int32_t t, const float* logits, int n_ctx, Clock::time_point now, Metrics& m);
  // The verify rows of root + `accepted` drafts are now the sequence's cache: n_past advances past them.
  void set_n_past(int n) { n_past_ = n; }
  // Prompt + every token generated so far (the last is last_token()): what a drafter continues.
  const std::vector<int32_t>& history() const { return history_; }
  void on_draft(int drafted, int accepted) {
    ++draft_rounds_;
    draft_n_ += drafted;
    draft_accepted_ += accepted;
  }
  bool wants_logprobs() const { return spec_.logprobs >= 0; }
  // Sampled speculation (chains with a draft model): the target's sampling distribution at a node
  // (penalties over the history recorded so far), draws from the sequence's RNG, and recording a
  // token accepted by the min(1, p/q) rule — which then is emitted with emit().
  void target_distribution(const float* logits, std::vector<float>& p) { sampler_.distribution(logits, p); }
  double uniform() { return sampler_.uniform(); }
  int32_t draw(const std::vector<float>& w) { return sampler_.draw(w); }
  void record(int32_t t) { sampler_.accept(t); }
  bool sampled() const { return !spec_.sampling.greedy(); }
  // The drafter's distribution for this request (null when greedy).
  DraftSampler* draft_sampler() { return draft_sampler_.get(); }
  // Adaptive speculation: this sequence's acceptance so far, and plain steps since it last drafted.
  spec::AcceptStats& accept_stats() { return accept_; }
  int& steps_without_draft() { return no_draft_steps_; }
  // Ends the sequence (any phase) and publishes the final event.
  void finish(FinishReason r, Clock::time_point now, Metrics& m, std::string error = {});

 private:
  RequestSpec spec_;
  std::shared_ptr<RequestHandle> handle_;
  const tok::Tokenizer& tok_;
  int n_vocab_;
  Sampler sampler_;
  tok::Detokenizer detok_;
  StopMatcher stop_;
  std::unique_ptr<Constraint> constraint_;
  Phase phase_ = Phase::kWaiting;
  int slot_ = -1;
  int n_prefilled_ = 0, n_past_ = 0, n_generated_ = 0;
  int32_t last_ = -1;
  std::vector<int32_t> history_;
  int draft_rounds_ = 0, draft_n_ = 0, draft_accepted_ = 0;
  int n_cached_ = 0, n_cached_disk_ = 0;
  std::unique_ptr<DraftSampler> draft_sampler_;
  spec::AcceptStats accept_;
  int no_draft_steps_ = 0;
  Clock::time_point submitted_, admitted_, first_token_, last_token_time_;
};

}  // namespace pg::engine
