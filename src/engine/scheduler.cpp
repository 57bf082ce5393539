#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>

#include "core/log.h"

namespace pg::engine {

Scheduler::Scheduler(Model& model, const tok::Tokenizer& tok, const SchedulerOptions& opt)
    : model_(model), tok_(tok), opt_(opt), n_vocab_(model.config().n_vocab) {
  PG_CHECK(opt_.n_slots >= 1 && opt_.n_slots <= 256, "parallel slots must be in [1, 256], got " + std::to_string(opt_.n_slots));
  PG_CHECK(opt_.n_ctx >= 8, "context size must be at least 8 tokens, got " + std::to_string(opt_.n_ctx));
  PG_CHECK(opt_.n_batch >= 1, "batch size must be positive");
  PG_CHECK(opt_.max_queue >= 0, "queue limit must be ≥ 0");
  // A step always carries one decode row per running sequence plus at least one prompt row.
  opt_.n_batch = std::max(opt_.n_batch, opt_.n_slots + 1);
  KvCacheOptions ko;
  ko.n_seq = opt_.n_slots;
  ko.n_ctx = opt_.n_ctx;
  ko.type = opt_.kv_type;
  ko.block_size = opt_.kv_block_size;
  cache_ = model_.make_cache(ko);
  kv_bytes_ = cache_->bytes();
  for (int s = opt_.n_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  publish_occupancy();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(); }

MetricsSnapshot Scheduler::metrics() const {
  MetricsSnapshot m = metrics_.snapshot();
  m.queued = n_queued_.load();  // exact now, not as of the last step
  m.active = n_active_.load();
  return m;
}

void Scheduler::shutdown() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestHandle> Scheduler::submit(RequestSpec spec) {
  auto reject = [&](RejectError::Kind k, const std::string& msg) {
    metrics_.on_reject();
    throw RejectError(k, msg);
  };
  const int n_prompt = static_cast<int>(spec.prompt.size());
  if (n_prompt == 0) reject(RejectError::Kind::kInvalid, "the prompt is empty");
  for (int32_t t : spec.prompt)
    if (t < 0 || t >= n_vocab_)
      reject(RejectError::Kind::kInvalid,
             "token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(n_vocab_) + ")");
  if (spec.max_tokens < 1) reject(RejectError::Kind::kInvalid, "max_tokens must be at least 1");
  if (spec.logprobs > 20) reject(RejectError::Kind::kInvalid, "top_logprobs must be at most 20");
  if (n_prompt >= opt_.n_ctx || static_cast<int64_t>(n_prompt) + spec.max_tokens > opt_.n_ctx)
    reject(RejectError::Kind::kContextOverflow,
           "the request needs " + std::to_string(static_cast<int64_t>(n_prompt) + spec.max_tokens) + " tokens (" +
               std::to_string(n_prompt) + " in the prompt, " + std::to_string(spec.max_tokens) +
               " to generate) but a slot holds " + std::to_string(opt_.n_ctx) + " tokens");
  try {
    spec.sampling.validate(n_vocab_);
  } catch (const Error& e) {
    reject(RejectError::Kind::kInvalid, e.what());
  }
  const auto now = Clock::now();
  std::shared_ptr<RequestHandle> h;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) reject(RejectError::Kind::kShutdown, "the server is shutting down");
    if (n_queued_.load() >= opt_.n_slots + opt_.max_queue)
      reject(RejectError::Kind::kOverloaded,
             "too many requests are waiting (" + std::to_string(n_queued_.load()) + "); try again later");
    h = std::make_shared<RequestHandle>(next_id_++);
    incoming_.push_back(std::make_unique<Sequence>(std::move(spec), h, tok_, n_vocab_, now));
    ++n_queued_;
  }
  metrics_.on_submit();
  cv_.notify_one();
  return h;
}

void Scheduler::publish_occupancy() {
  metrics_.set_occupancy(static_cast<int>(active_.size()), n_queued_.load(), opt_.n_slots,
                         cache_->total_blocks() - cache_->free_blocks(), cache_->total_blocks());
}

void Scheduler::release(Sequence& s) {
  if (s.slot() >= 0) {
    cache_->clear(s.slot());
    free_slots_.push_back(s.slot());
    --n_active_;
  }
}

void Scheduler::reap(Clock::time_point now) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Sequence& s = **it;
    const bool cancel = s.handle().cancelled(), late = now >= s.spec().deadline;
    if (cancel || late) {
      s.finish(cancel ? FinishReason::kCancelled : FinishReason::kTimeout, now, metrics_);
      --n_queued_;
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = active_.begin(); it != active_.end();) {
    Sequence& s = **it;
    const bool cancel = s.handle().cancelled(), late = now >= s.spec().deadline;
    if (cancel || late) {
      s.finish(cancel ? FinishReason::kCancelled : FinishReason::kTimeout, now, metrics_);
      release(s);
      it = active_.erase(it);
    } else {
      ++it;
    }
  }
}

void Scheduler::admit(Clock::time_point now) {
  while (!waiting_.empty() && !free_slots_.empty()) {
    const int slot = free_slots_.back();
    free_slots_.pop_back();
    cache_->clear(slot);
    auto s = std::move(waiting_.front());
    waiting_.pop_front();
    s->admit(slot, now, metrics_);
    ++n_active_;
    --n_queued_;
    active_.push_back(std::move(s));
  }
}

void Scheduler::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !incoming_.empty() || !active_.empty() || !waiting_.empty(); });
      while (!incoming_.empty()) {
        waiting_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
      if (stop_) break;
    }
    const auto now = Clock::now();
    reap(now);
    admit(now);
    if (!active_.empty()) step();
    publish_occupancy();
  }
  const auto now = Clock::now();
  for (auto& s : active_) s->finish(FinishReason::kError, now, metrics_, "the server is shutting down");
  for (auto& s : waiting_) s->finish(FinishReason::kError, now, metrics_, "the server is shutting down");
  active_.clear();
  waiting_.clear();
  n_queued_ = 0;
  n_active_ = 0;
}

void Scheduler::step() {
  const auto t0 = Clock::now();
  batch_.clear();
  out_seq_.clear();
  int budget = opt_.n_batch, n_prompt_rows = 0, n_gen = 0;
  for (auto& sp : active_) {
    Sequence& s = *sp;
    if (s.phase() != Sequence::Phase::kDecode) continue;
    batch_.add(s.last_token(), s.n_past(), s.slot(), true);
    out_seq_.push_back(&s);
    s.decoded();
    --budget;
  }
  for (auto& sp : active_) {
    if (budget <= 0) break;
    Sequence& s = *sp;
    if (s.phase() != Sequence::Phase::kPrefill) continue;
    const int from = s.n_prefilled();
    const int n = std::min(budget, s.n_prompt() - from);
    for (int i = 0; i < n; ++i) {
      const bool last = from + i + 1 == s.n_prompt();
      batch_.add(s.spec().prompt[static_cast<size_t>(from + i)], from + i, s.slot(), last);
      if (last) out_seq_.push_back(&s);
    }
    s.prefilled(n);
    budget -= n;
    n_prompt_rows += n;
  }
  if (batch_.size() == 0) return;
  // Greedy sequences get their token from the backend (4 bytes back instead of the vocabulary's logits).
  greedy_only_.resize(out_seq_.size());
  greedy_.assign(out_seq_.size(), -1);
  bool any_greedy = false;
  for (size_t i = 0; i < out_seq_.size(); ++i) {
    greedy_only_[i] = out_seq_[i]->greedy_only() ? 1 : 0;
    any_greedy |= greedy_only_[i] != 0;
  }
  ForwardOptions fopt;
  if (any_greedy) {
    fopt.argmax = greedy_.data();
    fopt.argmax_only = greedy_only_.data();
  }
  try {
    model_.forward(batch_, *cache_, logits_, fopt);
  } catch (const std::exception& e) {
    // A failed forward leaves the cache contents of every sequence in it undefined: end them all.
    PG_WARN("forward failed: %s", e.what());
    const auto now = Clock::now();
    for (auto& sp : active_) {
      sp->finish(FinishReason::kError, now, metrics_, std::string("inference failed: ") + e.what());
      release(*sp);
    }
    active_.clear();
    return;
  }
  const auto now = Clock::now();
  for (size_t i = 0; i < out_seq_.size(); ++i) {
    Sequence& s = *out_seq_[i];
    ++n_gen;
    const int32_t greedy = greedy_only_[i] ? greedy_[i] : -1;
    if (!s.on_logits(logits_.data() + i * static_cast<size_t>(n_vocab_), opt_.n_ctx, now, metrics_, greedy)) release(s);
  }
  std::erase_if(active_, [](const std::unique_ptr<Sequence>& s) { return s->phase() == Sequence::Phase::kDone; });
  metrics_.on_step(batch_.size(), n_prompt_rows, n_gen,
                   std::chrono::duration<double>(Clock::now() - t0).count());
}

}  // namespace pg::engine
