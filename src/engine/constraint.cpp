#include "engine/constraint.h"

#include <cmath>
#include <limits>
#include <map>
#include <mutex>

#include "core/error.h"

namespace pg::engine {

std::shared_ptr<const grammar::Vocab> shared_vocab(const tok::Tokenizer& tok) {
  // Keyed by address: a tokenizer lives as long as its model, i.e. the process in the server.
  static std::mutex mu;
  static std::map<const tok::Tokenizer*, std::shared_ptr<const grammar::Vocab>> map;
  std::lock_guard<std::mutex> lk(mu);
  auto& v = map[&tok];
  if (!v) v = grammar::Vocab::from_tokenizer(tok);
  return v;
}

std::shared_ptr<const grammar::Compiled> compile_grammar(const std::string& gbnf, const tok::Tokenizer& tok, bool lead_ws) {
  if (!lead_ws) return grammar::compile_cached(gbnf, shared_vocab(tok));
  // A start rule of our own in front of the client's `root` (a name GBNF rule names cannot clash
  // with: clients write [a-zA-Z0-9-]+ names too, so the prefix is unusual rather than impossible).
  return grammar::compile_cached(gbnf + "\npg-lead-root ::= [ \\t\\n]{0,8} root\n", shared_vocab(tok), "pg-lead-root");
}

Constraint::Constraint(std::shared_ptr<const ConstraintSpec> spec, const tok::Tokenizer& tok)
    : spec_(std::move(spec)), tok_(tok) {
  PG_CHECK(spec_ != nullptr, "constraint: no spec");
  if (spec_->grammar) {
    matcher_.emplace(spec_->grammar->proto.clone());
    trigger_ = spec_->trigger;
    active_ = trigger_.empty();
    if (spec_->lazy) {
      watch_.emplace(spec_->lazy);
      active_ = false;
      trigger_.clear();
    } else if (spec_->reasoning_may_open && !spec_->think_open.empty()) {
      auto ids = tok_.encode(spec_->think_open, false, true);
      if (ids.size() == 1) open_id_ = ids[0];
    }
    if (active_ && !spec_->prefix.empty()) feed(spec_->prefix);
  }
  in_reasoning_ = spec_->starts_in_reasoning && !spec_->think_close.empty();
  if (!spec_->think_close.empty() && spec_->reasoning_budget >= 0) {
    close_ids_ = tok_.encode(spec_->close_text.empty() ? spec_->think_close : spec_->close_text, false, true);
    if (in_reasoning_ && spec_->reasoning_budget == 0) forced_.assign(close_ids_.begin(), close_ids_.end());
  }
}

spec::DraftTree Constraint::prune(spec::DraftTree tree) const {
  if (tree.size() <= 1) return tree;
  if (!forced_.empty()) {
    spec::DraftTree root_only;
    root_only.reset(tree.token[0]);
    return root_only;
  }
  if (!masking() || !active_ || (at_start_ && open_id_ >= 0)) return tree;
  const int n = tree.size();
  std::vector<std::optional<grammar::Matcher>> at(static_cast<size_t>(n));
  std::vector<int> remap(static_cast<size_t>(n), -1);
  at[0].emplace(matcher_->clone());
  spec::DraftTree out;
  out.reset(tree.token[0]);
  remap[0] = 0;
  for (int i = 1; i < n; ++i) {
    const int p = tree.parent[static_cast<size_t>(i)];
    if (p < 0 || remap[static_cast<size_t>(p)] < 0) continue;
    grammar::Matcher m = at[static_cast<size_t>(p)]->clone();
    bool ok = false;
    try {
      ok = m.accept_token(tree.token[static_cast<size_t>(i)]);
    } catch (const Error&) {
      ok = false;
    }
    if (!ok) continue;
    at[static_cast<size_t>(i)].emplace(std::move(m));
    remap[static_cast<size_t>(i)] = out.add(tree.token[static_cast<size_t>(i)], remap[static_cast<size_t>(p)]);
  }
  return out;
}

void Constraint::feed(std::string_view bytes) {
  if (!matcher_ || broken_ || bytes.empty()) return;
  // A rejection here means text the mask did not choose (a forced token, or the bytes after a
  // trigger inside one token): stop constraining rather than stall; the caller's output checks
  // (and the tests) see it through broken().
  try {
    if (!matcher_->accept_bytes(bytes)) broken_ = true;
  } catch (const Error&) {
    broken_ = true;  // over the parallel-parse limit (see apply)
  }
}

const float* Constraint::apply(const float* logits) {
  if (armed()) return logits;  // a lazy grammar before its trigger: the output is free
  const int n = matcher_->vocab()->n_vocab();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  masked_.assign(logits, logits + n);
  if (!active_) {
    // Before the trigger (inside the reasoning block): anything but the end, which would leave the
    // constrained part unwritten.
    for (int32_t t : matcher_->vocab()->eog_ids_) masked_[static_cast<size_t>(t)] = kNegInf;
    return masked_.data();
  }
  try {
    matcher_->allowed_tokens(mask_);
  } catch (const Error&) {
    // A grammar over its parallel-parse limit in a state the compile-time warm-up did not reach: the
    // engine thread must not throw; the sequence goes on unconstrained and reports it (grammar_broken).
    broken_ = true;
    return logits;
  }
  for (int i = 0; i < n; ++i)
    if (!grammar::mask_test(mask_, i)) masked_[static_cast<size_t>(i)] = kNegInf;
  if (at_start_ && open_id_ >= 0) masked_[static_cast<size_t>(open_id_)] = logits[open_id_];
  return masked_.data();
}

void Constraint::accept(int32_t t) {
  if (!forced_.empty() && forced_.front() == t) forced_.pop_front();
  const std::string piece = tok_.token_to_piece(t, true);
  const bool was_reasoning = in_reasoning_;
  if (was_reasoning) ++n_reasoning_;
  const bool first = at_start_;
  at_start_ = false;
  if (first && t == open_id_ && active_) {
    // The model opened its reasoning block: the grammar applies after it.
    active_ = false;
    trigger_ = spec_->think_close;
  } else if (masking() && active_) {
    if (matcher_->vocab()->is_eog(t))
      (void)matcher_->accept_token(t);  // EOG: no bytes, cannot throw
    else
      feed(matcher_->vocab()->piece(t));
  }
  const size_t old = tail_.size();
  tail_ += piece;
  auto ends_at = [&](const std::string& tag) -> size_t {  // end offset of tag in tail_ if it ends in this piece
    if (tag.empty()) return std::string::npos;
    const size_t from = old >= tag.size() ? old - tag.size() + 1 : 0;
    const size_t at = tail_.find(tag, from);
    return at == std::string::npos ? std::string::npos : at + tag.size();
  };
  if (!in_reasoning_ && ends_at(spec_->think_open) != std::string::npos) {
    in_reasoning_ = true;
    if (spec_->reasoning_budget == 0 && !close_ids_.empty()) forced_.assign(close_ids_.begin(), close_ids_.end());
  }
  if (in_reasoning_ && ends_at(spec_->think_close) != std::string::npos) {
    in_reasoning_ = false;
  }
  if (watch_ && !active_ && !broken_) {
    // The armed phase watches the answer text: nothing inside the reasoning block, and of the token
    // that closes it only what follows the closing tag.
    if (!in_reasoning_) {
      std::string_view seen = piece;
      if (was_reasoning) {
        const size_t e = ends_at(spec_->think_close);
        seen = e == std::string::npos ? std::string_view() : std::string_view(tail_).substr(e);
      }
      const size_t at = watch_->push(t, seen);
      if (at != grammar::TriggerWatch::npos) {
        active_ = true;
        feed(std::string_view(watch_->text()).substr(at));  // the grammar starts at the trigger
      }
    }
  } else if (matcher_ && !active_) {
    const size_t e = ends_at(trigger_);
    if (e != std::string::npos && !in_reasoning_) {
      active_ = true;
      feed(spec_->prefix);
      feed(std::string_view(tail_).substr(e));  // the rest of the token that completed the trigger
    }
  }
  if (watch_ && spec_->lazy_rearm && active_ && !broken_ && matcher_->done()) {
    // The call is complete: free again until the next trigger.
    *matcher_ = spec_->grammar->proto.clone();
    watch_->reset();
    active_ = false;
  }
  if (tail_.size() > 256) tail_.erase(0, tail_.size() - 128);
  // Budget spent inside the reasoning block: close it now (once).
  if (in_reasoning_ && spec_->reasoning_budget >= 0 && n_reasoning_ >= spec_->reasoning_budget && forced_.empty() &&
      !closed_by_budget_ && !close_ids_.empty()) {
    closed_by_budget_ = true;
    forced_.assign(close_ids_.begin(), close_ids_.end());
  }
}

}  // namespace pg::engine
