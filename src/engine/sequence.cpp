#include "engine/sequence.h"

#include <algorithm>
#include <cmath>

#include "engine/metrics.h"

namespace pg::engine {

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Generated text continues the prompt, so the first piece keeps its leading space (SentencePiece
// vocabularies would otherwise drop it as the dummy prefix). The tokenizer layer is gaining a
// switch for this; use it where it exists.
template <class D>
void mark_continuation(D& d) {
  if constexpr (requires { d.continuation(); }) d.continuation();
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kEog: return "eog";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kContext: return "context";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kTimeout: return "timeout";
    case FinishReason::kError: return "error";
  }
  return "none";
}

SamplingParams DraftSampler::strip(SamplingParams p) {
  p.repeat_penalty = 1.0f;
  p.presence_penalty = p.frequency_penalty = 0.0f;
  p.logit_bias.clear();
  p.seed ^= 0x9E3779B97F4A7C15ull;  // its own stream: the target's draws stay those of the request's seed
  return p;
}

DraftSampler::DraftSampler(const SamplingParams& p, int n_vocab) : s_(strip(p), n_vocab) {}

int32_t DraftSampler::sample(const float* logits, std::vector<float>& q) {
  s_.distribution(logits, q);
  return s_.draw(q);
}

void DraftSampler::reset() { s_.reset(); }

Sequence::Sequence(RequestSpec spec, std::shared_ptr<RequestHandle> handle, const tok::Tokenizer& tok, int n_vocab,
                   Clock::time_point submitted)
    : spec_(std::move(spec)),
      handle_(std::move(handle)),
      tok_(tok),
      n_vocab_(n_vocab),
      sampler_(spec_.sampling, n_vocab),
      detok_(tok, spec_.special_text),
      stop_(spec_.stop),
      submitted_(submitted) {
  mark_continuation(detok_);
  if (!spec_.sampling.greedy()) draft_sampler_ = std::make_unique<DraftSampler>(spec_.sampling, n_vocab);
}

void Sequence::admit(int slot, Clock::time_point now, Metrics& m) {
  slot_ = slot;
  phase_ = Phase::kPrefill;
  admitted_ = now;
  n_prefilled_ = n_past_ = 0;
  sampler_.reset();
  if (draft_sampler_) draft_sampler_->reset();
  accept_ = {};
  no_draft_steps_ = 0;
  for (int32_t t : spec_.prompt) sampler_.accept(t);
  history_ = spec_.prompt;
  if (spec_.constraint) constraint_ = std::make_unique<Constraint>(spec_.constraint, tok_);
  m.on_admit(ms_between(submitted_, now) / 1000.0);
}

void Sequence::prefilled(int n) {
  n_prefilled_ += n;
  n_past_ += n;
}

bool Sequence::on_logits(const float* logits, int n_ctx, Clock::time_point now, Metrics& m, int32_t greedy) {
  return emit(choose(logits, greedy), logits, n_ctx, now, m);
}

int32_t Sequence::choose(const float* logits, int32_t greedy) {
  int32_t t;
  if (constraint_ && constraint_->forced() >= 0)
    t = constraint_->forced();  // the reasoning block closes: no draw (speculation consumes none either)
  else if (constraint_ && constraint_->masking())
    t = sampler_.sample(constraint_->apply(logits));  // greedy_only() is false: logits are there
  else
    t = greedy >= 0 ? greedy : sampler_.sample(logits);
  sampler_.accept(t);
  if (constraint_) constraint_->accept(t);
  return t;
}

bool Sequence::emit(int32_t t, const float* logits, int n_ctx, Clock::time_point now, Metrics& m) {
  ++n_generated_;
  if (n_generated_ == 1) {
    first_token_ = now;
    m.on_first_token(ms_between(submitted_, now) / 1000.0);
    phase_ = Phase::kDecode;
  } else {
    m.on_token_gap(ms_between(last_token_time_, now) / 1000.0);
  }
  last_token_time_ = now;
  if (spec_.stop_at_eog && tok_.is_eog(t)) {
    finish(FinishReason::kEog, now, m);
    return false;
  }
  Event e;
  TokenOut out;
  out.id = t;
  if (spec_.logprobs >= 0) {
    out.logprob = token_logprob(logits, n_vocab_, t);
    if (spec_.logprobs > 0) out.top = top_logprobs(logits, n_vocab_, spec_.logprobs);
  }
  e.tokens.push_back(std::move(out));
  e.text = stop_.push(detok_.push(t));
  handle_->push(std::move(e));
  last_ = t;
  history_.push_back(t);
  if (stop_.matched()) {
    finish(FinishReason::kStop, now, m);
    return false;
  }
  if (n_generated_ >= spec_.max_tokens) {
    finish(FinishReason::kLength, now, m);
    return false;
  }
  // The sampled token still has to be written at position n_past_; there must be room for it.
  if (n_past_ >= n_ctx) {
    finish(FinishReason::kContext, now, m);
    return false;
  }
  return true;
}

void Sequence::finish(FinishReason r, Clock::time_point now, Metrics& m, std::string error) {
  if (phase_ == Phase::kDone) return;
  Event e;
  if (r != FinishReason::kStop && r != FinishReason::kError && r != FinishReason::kCancelled) {
    // Whatever the stop matcher and the detokenizer held back is output after all.
    e.text = stop_.push(detok_.finish());
    e.text += stop_.flush();
  }
  e.done = true;
  e.finish = r;
  e.stop_word = stop_.which();
  e.error = std::move(error);
  RequestStats& s = e.stats;
  s.n_prompt = n_prompt();
  s.n_generated = n_generated_;
  s.draft_rounds = draft_rounds_;
  s.draft_n = draft_n_;
  s.draft_n_accepted = draft_accepted_;
  s.n_cached = n_cached_;
  s.n_cached_disk = n_cached_disk_;
  if (constraint_) {
    s.n_reasoning = constraint_->reasoning_tokens();
    s.grammar_broken = constraint_->broken();
  }
  const bool admitted = phase_ != Phase::kWaiting;
  s.queue_ms = ms_between(submitted_, admitted ? admitted_ : now);
  if (n_generated_ > 0) {
    s.prompt_ms = ms_between(admitted_, first_token_);
    s.ttft_ms = ms_between(submitted_, first_token_);
    s.decode_ms = ms_between(first_token_, now);
  } else if (admitted) {
    s.prompt_ms = ms_between(admitted_, now);
  }
  phase_ = Phase::kDone;
  m.on_finish(finish_reason_name(r), ms_between(submitted_, now) / 1000.0);
  handle_->push(std::move(e));
}

void Event::merge(Event&& later) {
  text += later.text;
  for (auto& t : later.tokens) tokens.push_back(std::move(t));
  if (later.done) {
    done = true;
    finish = later.finish;
    stop_word = std::move(later.stop_word);
    error = std::move(later.error);
    stats = later.stats;
  }
}

bool RequestHandle::next(Event& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lk(mu_);
  if (delivered_done_) return false;
  const auto until = Clock::now() + timeout;
  while (!has_pending_) {
    const auto now = Clock::now();
    if (now >= until) break;
    if (reader_polls_) {
      // The engine does not wake a polling reader (push): look again after kPoll; when nothing came
      // (a long prefill, a queue), sleep until the engine wakes us.
      cv_.wait_until(lk, std::min(until, now + kPoll));
      if (!has_pending_) reader_polls_ = false;
    } else {
      cv_.wait_until(lk, until);
    }
  }
  if (!has_pending_) return false;
  out = std::move(pending_);
  pending_ = Event{};
  has_pending_ = false;
  if (out.done)
    delivered_done_ = true;
  else
    reader_polls_ = true;
  return true;
}

bool RequestHandle::finished() const {
  std::lock_guard<std::mutex> lk(mu_);
  return produced_done_;
}

void RequestHandle::push(Event&& e) {
  bool wake;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (produced_done_) return;
    if (e.done) produced_done_ = true;
    wake = e.done || !reader_polls_;
    if (has_pending_)
      pending_.merge(std::move(e));
    else
      pending_ = std::move(e);
    has_pending_ = true;
  }
  if (wake) cv_.notify_all();
}

}  // namespace pg::engine
