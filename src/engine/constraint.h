// Per-sequence output constraints, applied where the sequence chooses its next token
// (Sequence::choose): a grammar (structured output) and a reasoning budget (docs/structured-output.md).
//
//   - Grammar: disallowed tokens get -inf before the sampler's chain (penalties, top-k/top-p,
//     temperature), so greedy is the argmax over allowed tokens and sampling draws from the
//     constrained distribution; end-of-generation tokens are allowed only where the grammar may end.
//     The matcher advances over every chosen token's bytes (the same bytes the detokenizer emits).
//     It can wait for a trigger text (the end of the reasoning block, or a tool call's opening) and
//     start with bytes the prompt already wrote into the answer (a forced tool-call prefix).
//   - Reasoning budget: tokens inside the reasoning block are counted; when the budget is spent the
//     block is closed the way the template does (the end-of-thinking text, tokenized, emitted as
//     forced tokens) and the answer follows.
// Speculation needs nothing else: the verify walk calls choose() once per emitted token, in order,
// so each node's choice is the constrained choice after the accepted prefix (forced tokens
// included), and greedy output with drafts equals the output without.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/trigger.h"
#include "spec/tree.h"
#include "tokenizer/tokenizer.h"

namespace pg::engine {

struct ConstraintSpec {
  std::shared_ptr<const grammar::Compiled> grammar;  // null: no grammar
  std::string prefix;   // answer bytes the prompt already holds (forced tool-call opening): consumed first
  std::string trigger;  // non-empty: the grammar applies to the output after this text only
  // A lazy grammar (llama-server's grammar_lazy; a tool call under tool_choice "auto"): the output is
  // free (end of generation included) until one of these triggers matches the answer text (the
  // reasoning block is not watched); the grammar is then fed the text from the trigger's start
  // (grammar/trigger.h) and constrains the rest. Null: the grammar applies from the start (or after
  // `trigger`).
  std::shared_ptr<const grammar::Triggers> lazy;
  // With `lazy`: when the grammar is complete (nothing can follow), go back to the armed phase —
  // several tool calls with free text between them (parallel_tool_calls); otherwise only the end of
  // generation may follow.
  bool lazy_rearm = false;
  // The model may open a reasoning block of its own first (templates that leave it to the model):
  // at the start the think_open token is allowed besides the grammar, and when chosen the grammar
  // waits for think_close.
  bool reasoning_may_open = false;
  // Reasoning. budget < 0: unlimited.
  int reasoning_budget = -1;
  bool starts_in_reasoning = false;     // the prompt left a reasoning block open
  std::string think_open, think_close;  // the template's tags ("<think>", "</think>"); empty: no reasoning
  std::string close_text;               // forced when the budget runs out (e.g. "\n</think>\n\n"; a hint may precede)
  bool empty() const { return !grammar && (reasoning_budget < 0 || think_close.empty()); }
};

// The vocabulary of a tokenizer as the grammar engine's byte trie, built once per tokenizer.
std::shared_ptr<const grammar::Vocab> shared_vocab(const tok::Tokenizer& tok);

// Compiles a GBNF answer grammar (start rule `root`) for a tokenizer. lead_ws: the answer may start
// with a few blanks/newlines (after a reasoning block or a tool-call tag, templates write "\n\n").
// Throws pg::Error with the position for a grammar that does not parse.
std::shared_ptr<const grammar::Compiled> compile_grammar(const std::string& gbnf, const tok::Tokenizer& tok, bool lead_ws);

class Constraint {
 public:
  Constraint(std::shared_ptr<const ConstraintSpec> spec, const tok::Tokenizer& tok);

  // A token that must come next (reasoning close), or -1.
  int32_t forced() const { return forced_.empty() ? -1 : forced_.front(); }
  // The grammar constrains the next token (the sampler then needs the full logits): the mask once
  // active, before its trigger only a ban on end-of-generation.
  bool masking() const { return matcher_.has_value() && !broken_; }
  bool active() const { return active_; }
  // A lazy grammar still waiting for its trigger (the mask is not applied).
  bool armed() const { return watch_.has_value() && !active_; }
  // logits (n_vocab) with disallowed tokens at -inf; valid until the next call.
  const float* apply(const float* logits);
  // Records the chosen token: advances the grammar and the reasoning state.
  void accept(int32_t t);
  // Could the grammar have the sequence end here (no grammar, or one that accepts): checked when EOG
  // is chosen without masking (never happens through apply()).
  bool has_grammar() const { return matcher_.has_value(); }
  // A draft tree without the nodes the grammar rejects (and their subtrees), checked with matcher
  // clones along each path: those drafts could never be accepted (the target's choice is
  // constrained), so verifying them only costs rows. With a forced token pending the draft is
  // dropped (the forced tokens come one per step). Unchanged when nothing constrains the next token.
  spec::DraftTree prune(spec::DraftTree tree) const;
  int reasoning_tokens() const { return n_reasoning_; }
  bool in_reasoning() const { return in_reasoning_; }
  const grammar::Matcher* matcher() const { return matcher_ ? &*matcher_ : nullptr; }
  bool broken() const { return broken_; }

 private:
  void feed(std::string_view bytes);
  std::shared_ptr<const ConstraintSpec> spec_;
  const tok::Tokenizer& tok_;
  std::optional<grammar::Matcher> matcher_;
  bool active_ = false, broken_ = false, at_start_ = true;
  std::string trigger_;
  std::optional<grammar::TriggerWatch> watch_;  // lazy grammars: the armed phase
  int32_t open_id_ = -1;  // think_open as one token (reasoning_may_open)
  std::string tail_;  // recent output text (for trigger and tag detection)
  bool in_reasoning_ = false, closed_by_budget_ = false;
  int n_reasoning_ = 0;
  std::deque<int32_t> forced_;
  std::vector<int32_t> close_ids_;
  grammar::TokenMask mask_;
  std::vector<float> masked_;  // (n_vocab)
};

}  // namespace pg::engine
