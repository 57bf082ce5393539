#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/log.h"
#include "spec/verify.h"

namespace pg::engine {

void SpecOptions::validate() const {
  PG_CHECK(n_max >= 1 && n_max <= spec::kMaxTreeNodes - 1,
           "--spec-draft-n-max must be in [1, " + std::to_string(spec::kMaxTreeNodes - 1) + "], got " + std::to_string(n_max));
  PG_CHECK(n_min >= 0 && n_min <= n_max, "--spec-draft-n-min must be in [0, n-max], got " + std::to_string(n_min));
  PG_CHECK(budget >= 1 && budget <= spec::kMaxTreeNodes - 1,
           "--ddtree-budget must be in [1, " + std::to_string(spec::kMaxTreeNodes - 1) + "], got " + std::to_string(budget));
  PG_CHECK(p_min >= 0.0f && p_min <= 1.0f, "--spec-draft-p-min must be in [0, 1], got " + std::to_string(p_min));
  PG_CHECK(type != spec::SpecType::kDraft || draft != nullptr, "speculative type 'draft' needs a draft model (-md FILE)");
  PG_CHECK(type != spec::SpecType::kDFlash || dflash != nullptr, "speculative type 'dflash' needs a DFlash draft model (--draft FILE)");
}

Scheduler::Scheduler(Model& model, const tok::Tokenizer& tok, const SchedulerOptions& opt)
    : model_(model), tok_(tok), opt_(opt), n_vocab_(model.config().n_vocab) {
  PG_CHECK(opt_.n_slots >= 1 && opt_.n_slots <= 256, "parallel slots must be in [1, 256], got " + std::to_string(opt_.n_slots));
  PG_CHECK(opt_.n_ctx >= 8, "context size must be at least 8 tokens, got " + std::to_string(opt_.n_ctx));
  PG_CHECK(opt_.n_batch >= 1, "batch size must be positive");
  test_rng_.seed(opt_.spec.test_random_shapes);
  PG_CHECK(opt_.max_queue >= 0, "queue limit must be ≥ 0");
  // A step always carries one decode row per running sequence plus at least one prompt row.
  opt_.n_batch = std::max(opt_.n_batch, opt_.n_slots + 1);
  KvCacheOptions ko;
  ko.n_seq = opt_.n_slots;
  ko.n_ctx = opt_.n_ctx;
  ko.type = opt_.kv_type;
  ko.type_v = opt_.kv_type_v;
  ko.block_size = opt_.kv_block_size;
  if (opt_.spec.on()) {
    opt_.spec.validate();
    if (opt_.spec.type == spec::SpecType::kDraft) {
      spec::check_same_vocab(model_, *opt_.spec.draft, opt_.spec.draft->config().name);
      drafter_ = spec::make_model_drafter(*opt_.spec.draft, opt_.n_slots, opt_.n_ctx, opt_.spec.n_max);
    } else if (opt_.spec.type == spec::SpecType::kDFlash) {
      drafter_ = spec::make_dflash_drafter(*opt_.spec.dflash, opt_.n_slots, opt_.n_ctx, opt_.spec.fa_window);
    } else {
      drafter_ = spec::make_ngram_drafter();
    }
    // Hybrid targets cut a verified chain back from per-row snapshots of the recurrent state; verify
    // rows run as their own capturing forward, so capture slots for every verify row of a step suffice.
    const int rows = 1 + (opt_.spec.tree ? std::max(opt_.spec.budget, opt_.spec.n_max) : opt_.spec.n_max);
    if (model_.config().has_recurrent()) ko.n_capture = opt_.n_slots * std::min(rows, spec::kMaxTreeNodes);
  }
  cache_ = make_cache_with_prefix(model_, ko, opt_.prefix, prefix_);
  // Tree verification needs attention that honours AttentionBatch::tree_mask (the CPU and CUDA
  // backends do); a backend without it fails the forward loudly rather than attending to siblings.
  tree_forward_ = true;
  // PEREGRINE_PROFILE_STEPS=1: where a step's time goes (drafting vs the forward), printed at the end.
  if (const char* e = std::getenv("PEREGRINE_PROFILE_STEPS"); e && *e == '1') profile_ = true;
  kv_bytes_ = cache_->bytes();
  for (int s = opt_.n_slots - 1; s >= 0; --s) free_slots_.push_back(s);
  publish_occupancy();
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  shutdown();
  if (profile_ && prof_steps_ > 0)
    std::fprintf(stderr, "scheduler profile: %llu steps, %.1f rows/step, draft %.3f ms/step, forward %.3f ms/step\n",
                 static_cast<unsigned long long>(prof_steps_), static_cast<double>(prof_rows_) / static_cast<double>(prof_steps_),
                 1000 * prof_[0] / static_cast<double>(prof_steps_), 1000 * prof_[1] / static_cast<double>(prof_steps_));
  if (profile_ && drafter_)
    std::fprintf(stderr, "scheduler cost model: forward(1) %.3f ms, forward(4) %.3f ms, forward(9) %.3f ms, forward(23) %.3f ms, draft step %.3f ms\n",
                 1000 * cost_.forward(1), 1000 * cost_.forward(4), 1000 * cost_.forward(9), 1000 * cost_.forward(23), 1000 * cost_.draft_step());
}

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
  // Blocks only the prefix cache holds are not in use: any request may take them (eviction).
  const int idle = prefix_ ? prefix_->idle_blocks() : 0;
  metrics_.set_occupancy(static_cast<int>(active_.size()), n_queued_.load(), opt_.n_slots,
                         cache_->total_blocks() - cache_->free_blocks() - idle, cache_->total_blocks());
}

void Scheduler::release(Sequence& s) {
  if (s.slot() >= 0) {
    if (prefix_ && index_on_release_) prefix_->release(s.slot(), s.history(), s.n_past());
    if (prefix_ && !index_on_release_) prefix_->abandon(s.slot());
    cache_->clear(s.slot());
    if (drafter_) drafter_->release(s.slot());
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
    if (prefix_) {
      // A speculating request reuses only what its drafter can draft without (DFlash needs the
      // target's features of every prefix position, which only a prefill of the prefix makes).
      const int n_prompt = static_cast<int>(s->spec().prompt.size());
      const int cap = drafter_ && s->spec().speculative ? drafter_->reusable_prefix(slot, n_prompt - 1) : -1;
      const PrefixHit hit = prefix_->attach(slot, s->spec().prompt, cap);
      if (hit.n_tokens > 0) s->cached(hit.n_tokens, hit.n_disk);
    }
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

void Scheduler::draft() {
  verify_.clear();
  if (!drafter_) return;
  const auto t0 = Clock::now();
  draft_in_.clear();
  who_.clear();
  std::vector<Sequence*>& who = who_;
  for (auto& sp : active_) {
    Sequence& s = *sp;
    if (s.phase() != Sequence::Phase::kDecode || !s.spec().speculative) continue;
    // Tokens this sequence may still emit: a verify step emits accepted drafts + 1, and its rows sit at
    // positions n_past .. n_past + depth, which must stay inside the slot.
    const int remaining = std::min(s.spec().max_tokens - s.n_generated(), opt_.n_ctx - s.n_past());
    int depth = std::min({opt_.spec.n_max, remaining - 1, spec::kMaxTreeNodes - 1});
    // Tree rows see their ancestors through the tree mask, which must stay inside a sliding window.
    const int window = model_.config().sliding_window;
    if (opt_.spec.tree && window > 0) depth = std::min(depth, window - 1);
    if (depth < std::max(1, opt_.spec.n_min)) continue;
    if (opt_.spec.adaptive && (opt_.spec.test_random_shapes || (cost_.measured() && cost_.draft_step() > 0))) {
      // Draft only as deep as this sequence's acceptance pays for; when not even one token does,
      // decode plainly, with a short probe now and then so the statistics follow the text.
      int& idle = s.steps_without_draft();
      const int d = opt_.spec.test_random_shapes ? static_cast<int>(test_rng_() % static_cast<uint64_t>(depth + 1))
                                                 : spec::choose_depth(s.accept_stats().alpha(), depth, cost_);
      if (d == 0 && idle < kProbeEvery) {
        ++idle;
        continue;
      }
      if (!opt_.spec.tree) depth = std::min(depth, std::max(d, 2));
      idle = 0;
    }
    spec::DraftInput in;
    in.slot = s.slot();
    in.history = s.history();
    in.n_max = depth;
    in.k = opt_.spec.tree && tree_forward_ ? std::min(opt_.spec.budget, model_.config().n_vocab) : 1;
    in.p_min = opt_.spec.p_min;
    // Sampled chains draw their drafts from the drafter's q (exact min(1, p/q) acceptance); trees
    // are drafted greedily and verified by sample-and-match.
    // A constrained sequence (grammar, reasoning budget) takes sample-and-match through choose(): the
    // mask and the forced tokens live there, and min(1, p/q) would need both p and q masked.
    in.sampler = !opt_.spec.tree && s.sampled() && !s.constraint() ? s.draft_sampler() : nullptr;
    draft_in_.push_back(in);
    who.push_back(&s);
  }
  if (draft_in_.empty()) return;
  draft_out_.resize(draft_in_.size());
  const uint64_t forwards0 = drafter_->forwards();
  const double seconds0 = drafter_->forward_seconds();
  try {
    drafter_->propose(draft_in_, draft_out_);
  } catch (const std::exception& e) {
    // The draft model's cache is sized for every slot, so a failure is an op its backend lacks (or a
    // bug): the target's output does not depend on drafts, so decode on without speculation.
    PG_WARN("drafting failed (%s): speculative decoding is off from now on", e.what());
    drafter_.reset();
    return;
  }
  // The drafter's cost per depth step (its forwards for all sequences), for the adaptive choices.
  const double t_draft = std::chrono::duration<double>(Clock::now() - t0).count();
  if (const uint64_t steps = drafter_->forwards() - forwards0; steps > 0)
    cost_.observe_draft_step((drafter_->forward_seconds() - seconds0) / static_cast<double>(steps));
  for (size_t i = 0; i < who.size(); ++i) {
    spec::Draft& d = draft_out_[i];
    const int32_t root = who[i]->last_token();
    Verify v{who[i], {}, 0, {}, 0.0};
    if (d.has_tree && (d.tree.is_chain() || tree_forward_)) {
      v.tree = std::move(d.tree);
    } else if (opt_.spec.tree && tree_forward_ && !d.topk.empty()) {
      // A tree's rows are stored at n_past + j (j = node index), so its size is bounded by the room left.
      const int room = opt_.n_ctx - who[i]->n_past() - 1;
      v.tree = spec::build_ddtree(root, d.topk, std::max(1, std::min({opt_.spec.budget, spec::kMaxTreeNodes - 1, room})));
    } else {
      v.tree = spec::build_chain(root, d.chain);
    }
    // Drafts the sequence's grammar rejects are never accepted: leave them out of the verify rows.
    if (const Constraint* c = who[i]->constraint()) v.tree = c->prune(std::move(v.tree));
    // A tree deeper than allowed would write past the slot; drafters answer within n_max, so this is a bug guard.
    int deepest = 0;
    for (int32_t dd : v.tree.depth) deepest = std::max(deepest, dd);
    PG_CHECK(deepest <= draft_in_[i].n_max, "drafter proposed deeper than asked");
    const bool sampled = !d.q.empty() && v.tree.is_chain() && d.q.size() >= static_cast<size_t>(v.tree.n_draft());
    if (opt_.spec.adaptive) {
      // Verify the prefix of the draft (prefix-closed node order) with the best expected tokens per second.
      std::vector<double> p;
      if (sampled) {
        p.assign(static_cast<size_t>(v.tree.size()), 1.0);
        for (int n = 1; n < v.tree.size(); ++n)
          p[static_cast<size_t>(n)] = p[static_cast<size_t>(n - 1)] * d.q[static_cast<size_t>(n - 1)][static_cast<size_t>(v.tree.token[static_cast<size_t>(n)])];
      } else if (!d.topk.empty()) {
        p = spec::path_probs(v.tree, d.topk);
      }
      if (!p.empty()) {
        const int n = opt_.spec.test_random_shapes ? static_cast<int>(test_rng_() % static_cast<uint64_t>(p.size()))
                                                   : spec::choose_prefix(p, who[i]->accept_stats().gamma(), t_draft, cost_);
        spec::truncate_tree(v.tree, n);
        for (int j = 1; j <= n; ++j) v.predicted += std::min(1.0, p[static_cast<size_t>(j)]);
      }
    }
    if (v.tree.n_draft() < std::max(1, opt_.spec.n_min)) continue;
    if (sampled) {
      v.q = std::move(d.q);
      v.q.resize(static_cast<size_t>(v.tree.n_draft()));
    }
    verify_.push_back(std::move(v));
  }
}

// Runs batch_ (its first n_first rows are decode/verify rows). Hybrid targets run verify rows as a
// capturing forward of their own (the capture slots cover only those), then the prompt rows.
void Scheduler::forward_step(std::vector<float>& logits, const ForwardOptions& fopt, int n_first) {
  if (verify_.empty() || !cache_->recurrent()) {
    model_.forward(batch_, *cache_, logits, fopt);
    return;
  }
  auto part = [&](int b0, int b1) {
    sub_.clear();
    for (int r = b0; r < b1; ++r) {
      sub_.add(batch_.tokens[static_cast<size_t>(r)], batch_.positions[static_cast<size_t>(r)], batch_.seq[static_cast<size_t>(r)],
               batch_.logits[static_cast<size_t>(r)] != 0);
      const int32_t p = batch_.parent[static_cast<size_t>(r)];
      sub_.parent.back() = p >= 0 ? p - b0 : -1;
    }
    if (b0 == 0)  // tree rows are all in the first part
      for (int32_t t : batch_.tree_seqs) sub_.tree_seqs.push_back(t);
  };
  const int n = batch_.size();
  int outs_first = 0;
  for (int r = 0; r < n_first; ++r) outs_first += batch_.logits[static_cast<size_t>(r)];
  ForwardOptions f1 = fopt;
  f1.capture = true;
  part(0, n_first);
  model_.forward(sub_, *cache_, logits, f1);
  if (n_first == n) return;
  ForwardOptions f2 = fopt;
  if (f2.hidden) f2.hidden = &sub_hidden_;
  if (f2.argmax) {
    f2.argmax += outs_first;
    if (f2.argmax_only) f2.argmax_only += outs_first;
  }
  part(n_first, n);
  model_.forward(sub_, *cache_, sub_logits_, f2);
  if (fopt.hidden) fopt.hidden->insert(fopt.hidden->end(), sub_hidden_.begin(), sub_hidden_.end());
  logits.resize(logits.size() + sub_logits_.size());
  std::copy(sub_logits_.begin(), sub_logits_.end(), logits.end() - static_cast<std::ptrdiff_t>(sub_logits_.size()));
}

spec::WalkResult Scheduler::sample_chain(Verify& v, const std::function<const float*(int node)>& logits) {
  Sequence& s = *v.seq;
  const int n = v.tree.n_draft();
  std::vector<int32_t> drafts(v.tree.token.begin() + 1, v.tree.token.end());
  // p(i) is asked for in order, and only once draft i (1-based) was accepted: record it in the
  // sampler's history first, so penalties see the accepted prefix exactly as in plain decoding.
  auto p = [&](int node) -> const std::vector<float>& {
    if (node >= 1) s.record(drafts[static_cast<size_t>(node - 1)]);
    s.target_distribution(logits(node), p_buf_);
    return p_buf_;
  };
  auto q = [&](int node) -> const std::vector<float>& { return v.q[static_cast<size_t>(node)]; };
  auto uniform = [&]() { return opt_.spec.test_biased_accept ? 0.0 : s.uniform(); };
  auto draw = [&](const std::vector<float>& w) { return s.draw(w); };
  const spec::ChainSampleResult r = spec::speculative_sample_chain(drafts, p, q, uniform, draw);
  s.record(r.next);
  spec::WalkResult w;
  for (int i = 0; i <= r.n_accepted && i <= n; ++i) w.path.push_back(i);
  w.bonus = r.next;
  return w;
}

void Scheduler::feed_features(int n_first) {
  // Decode rows (the root of a plain step) and prompt rows are committed as they stand; verify rows
  // wait for the walk. Rows before n_first are all outputs, so a verify's nodes are rows out0 + i.
  const int n = batch_.size();
  if (n == 0 || (!features_dev_ && hidden_.empty())) return;
  const size_t fw = features_dev_ ? 0 : hidden_.size() / static_cast<size_t>(n);
  std::vector<uint8_t>& is_verify = is_verify_;  // (n_first) member: no allocation per step
  is_verify.assign(static_cast<size_t>(n_first), 0);
  for (const Verify& v : verify_)
    for (int i = 0; i < v.tree.size(); ++i) is_verify[static_cast<size_t>(v.out0 + i)] = 1;
  for (int r = 0; r < n; ++r) {
    if (r < n_first && is_verify[static_cast<size_t>(r)]) continue;
    if (features_dev_)
      drafter_->add_feature_row(batch_.seq[static_cast<size_t>(r)], batch_.positions[static_cast<size_t>(r)], r);
    else
      drafter_->add_features(batch_.seq[static_cast<size_t>(r)], batch_.positions[static_cast<size_t>(r)], hidden_.data() + static_cast<size_t>(r) * fw);
  }
}

void Scheduler::step() {
  const auto t0 = Clock::now();
  draft();
  // SchedulerOptions::spec_phases: each phase's queued device work is finished before its clock stops.
  const bool phases = opt_.spec_phases && drafter_ && !verify_.empty();
  auto phase_sync = [&] {
    if (!phases) return;
    model_.backend().synchronize();
    if (opt_.spec.draft && &opt_.spec.draft->backend() != &model_.backend()) opt_.spec.draft->backend().synchronize();
  };
  phase_sync();
  const auto t_drafted = Clock::now();
  Clock::time_point tf{}, t_verified{};
  batch_.clear();
  out_seq_.clear();
  int budget = opt_.n_batch, n_prompt_rows = 0, n_gen = 0;
  size_t vi = 0;
  for (auto& sp : active_) {
    Sequence& s = *sp;
    if (s.phase() != Sequence::Phase::kDecode) continue;
    if (vi < verify_.size() && verify_[vi].seq == &s) {
      // Verify rows: every node of the draft, at position n_past + depth; chains as plain rows (they
      // extend the history in order), trees with their parents.
      Verify& v = verify_[vi++];
      v.out0 = static_cast<int>(out_seq_.size());
      const int row0 = batch_.size();
      const bool chain = v.tree.is_chain();
      for (int i = 0; i < v.tree.size(); ++i) {
        const int32_t tok = v.tree.token[static_cast<size_t>(i)], pos = s.n_past() + v.tree.depth[static_cast<size_t>(i)];
        if (chain)
          batch_.add(tok, pos, s.slot(), true);
        else
          batch_.add_tree(tok, pos, s.slot(), i == 0 ? -1 : row0 + v.tree.parent[static_cast<size_t>(i)], true);
        out_seq_.push_back(&s);
      }
      budget -= v.tree.size();
      continue;
    }
    batch_.add(s.last_token(), s.n_past(), s.slot(), true);
    out_seq_.push_back(&s);
    s.decoded();
    --budget;
  }
  const int n_first = batch_.size();
  for (auto& sp : active_) {
    if (budget <= 0) break;
    Sequence& s = *sp;
    if (s.phase() != Sequence::Phase::kPrefill) continue;
    const int from = s.n_prefilled();
    int n = std::min(budget, s.n_prompt() - from);
    if (prefix_) n = std::min(n, prefix_->chunk_end(s.slot(), from, s.n_prompt()) - from);
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
  // A DFlash drafter reads the target's features of every committed row, from this very forward.
  if (drafter_) fopt.hidden_layers = drafter_->feature_layers();
  features_dev_ = false;
  if (!fopt.hidden_layers.empty()) {
    fopt.hidden_all_rows = true;
    // On the backend when the drafter takes them there (no host round trip); a hybrid target's verify
    // step runs as two forwards (forward_step) and hands host rows over instead.
    Tensor* dev = drafter_->feature_rows(batch_.size());  // also consumes the rows of the last forward
    if (dev && !(!verify_.empty() && cache_->recurrent())) {
      fopt.hidden_dev = dev;
      features_dev_ = true;
    } else {
      fopt.hidden = &hidden_;
    }
  }
  try {
    tf = Clock::now();
    forward_step(logits_, fopt, n_first);
    phase_sync();
    t_verified = Clock::now();
    // Decode/verify-only steps measure the target's cost of k rows (prompt chunks would blur it).
    if (opt_.spec.adaptive && drafter_ && n_prompt_rows == 0)
      cost_.observe_forward(batch_.size(), std::chrono::duration<double>(Clock::now() - tf).count());
    if (profile_) {
      prof_[0] += std::chrono::duration<double>(t_drafted - t0).count();
      prof_[1] += std::chrono::duration<double>(Clock::now() - tf).count();
      prof_rows_ += batch_.size();
      ++prof_steps_;
    }
  } catch (const std::exception& e) {
    // A failed forward leaves the cache contents of every sequence in it undefined: end them all.
    PG_WARN("forward failed: %s", e.what());
    const auto now = Clock::now();
    index_on_release_ = false;
    for (auto& sp : active_) {
      sp->finish(FinishReason::kError, now, metrics_, std::string("inference failed: ") + e.what());
      release(*sp);
    }
    index_on_release_ = true;
    active_.clear();
    return;
  }
  if (prefix_)
    for (auto& sp : active_)
      if (sp->phase() == Sequence::Phase::kPrefill) prefix_->after_forward(sp->slot(), sp->n_prefilled());
  if (!fopt.hidden_layers.empty() && drafter_) feed_features(n_first);
  const auto now = Clock::now();
  auto row_logits = [&](size_t i) { return logits_.data() + i * static_cast<size_t>(n_vocab_); };
  vi = 0;
  for (size_t i = 0; i < out_seq_.size();) {
    Sequence& s = *out_seq_[i];
    if (vi < verify_.size() && verify_[vi].out0 == static_cast<int>(i) && verify_[vi].seq == &s) {
      Verify& v = verify_[vi++];
      i += static_cast<size_t>(v.tree.size());
      const int n_past0 = s.n_past();
      const int max_emit = std::min(s.spec().max_tokens - s.n_generated(), opt_.n_ctx - n_past0);
      const bool g = greedy_only_[static_cast<size_t>(v.out0)] != 0;
      auto at = [&](int node) { return static_cast<size_t>(v.out0 + node); };
      const spec::WalkResult w =
          !v.q.empty() ? sample_chain(v, [&](int node) { return row_logits(at(node)); })
                       : spec::walk(
                             v.tree, [&](int node) { return s.choose(g ? nullptr : row_logits(at(node)), g ? greedy_[at(node)] : -1); },
                             max_emit);
      const int accepted = static_cast<int>(w.path.size()) - 1;
      int deepest = 0;
      for (int32_t dd : v.tree.depth) deepest = std::max(deepest, dd);
      s.accept_stats().observe(v.predicted, accepted, deepest);
      if (!fopt.hidden_layers.empty() && drafter_) {
        // Only the accepted path's features are kept (verify rows are batch rows out0 + node).
        const size_t fw = features_dev_ ? 0 : hidden_.size() / static_cast<size_t>(batch_.size());
        for (int j = 0; j <= accepted; ++j) {
          const int row = v.out0 + w.path[static_cast<size_t>(j)];
          if (features_dev_)
            drafter_->add_feature_row(s.slot(), n_past0 + j, row);
          else
            drafter_->add_features(s.slot(), n_past0 + j, hidden_.data() + static_cast<size_t>(row) * fw);
        }
      }
      s.on_draft(v.tree.n_draft(), accepted);
      metrics_.on_spec(v.tree.n_draft(), accepted);
      // Emit the accepted drafts, then the bonus, each with the logits of the node it was chosen at;
      // the first end condition ends the run.
      bool alive = true;
      for (int j = 0; j <= accepted && alive; ++j) {
        const int32_t t = j < accepted ? v.tree.token[static_cast<size_t>(w.path[static_cast<size_t>(j + 1)])] : w.bonus;
        s.set_n_past(n_past0 + j + 1);
        alive = s.emit(t, g ? nullptr : row_logits(at(w.path[static_cast<size_t>(j)])), opt_.n_ctx, now, metrics_);
        ++n_gen;
      }
      if (!alive) {
        release(s);
        continue;
      }
      // Keep root + accepted drafts as the sequence's next positions; drop the rest of the draft. A chain
      // was written in place (cut it back); a tree's accepted path is compacted behind the history.
      if (v.tree.is_chain())
        cache_->truncate(s.slot(), n_past0 + accepted + 1);
      else
        cache_->commit(s.slot(), w.path);
      continue;
    }
    ++n_gen;
    const int32_t greedy = greedy_only_[i] ? greedy_[i] : -1;
    if (!s.on_logits(row_logits(i), opt_.n_ctx, now, metrics_, greedy)) release(s);
    ++i;
  }
  phase_sync();
  const auto t_committed = Clock::now();
  std::erase_if(active_, [](const std::unique_ptr<Sequence>& s) { return s->phase() == Sequence::Phase::kDone; });
  const auto t_end = Clock::now();
  metrics_.on_step(batch_.size(), n_prompt_rows, n_gen, std::chrono::duration<double>(t_end - t0).count());
  if (phases) {
    auto sec = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
    const double d = sec(t0, t_drafted), v = sec(tf, t_verified), c = sec(t_verified, t_committed);
    metrics_.on_spec_phases(d, v, c, std::max(0.0, sec(t0, t_end) - d - v - c));
  }
}

}  // namespace pg::engine
