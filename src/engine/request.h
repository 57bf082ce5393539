// What a client asks the engine for, and the channel its output comes back through.
//
// The HTTP thread submits a RequestSpec and gets a RequestHandle; the engine thread appends output
// to the handle as it samples, the HTTP thread drains it with next(). Output that arrives while the
// reader is busy is merged, so a slow reader never slows the engine down.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/sampler.h"

namespace pg::engine {

struct ConstraintSpec;  // engine/constraint.h

using Clock = std::chrono::steady_clock;

enum class FinishReason : uint8_t {
  kNone,
  kEog,        // the model emitted an end-of-generation token
  kStop,       // a stop string
  kLength,     // max_tokens
  kContext,    // the sequence reached the context size
  kCancelled,  // the client went away (or cancelled)
  kTimeout,    // the request's deadline passed
  kError,      // the engine failed (message in Event::error)
};
const char* finish_reason_name(FinishReason r);

struct RequestSpec {
  std::vector<int32_t> prompt;  // (n_prompt) token ids, not empty
  SamplingParams sampling;
  int max_tokens = 256;              // tokens to generate at most, > 0
  std::vector<std::string> stop;     // stop strings, matched on the detokenized text
  bool stop_at_eog = true;           // end at the vocabulary's end-of-generation tokens
  bool special_text = false;         // detokenize control tokens (formats whose markup is control tokens)
  int logprobs = -1;                 // -1: off; 0: logprob of each chosen token; n > 0: plus the n most likely (≤ 20)
  Clock::time_point deadline = Clock::time_point::max();
  bool speculative = true;           // speculate when the engine has a drafter (false: plain decoding)
  std::shared_ptr<const ConstraintSpec> constraint;  // grammar / reasoning budget (null: none)
};

struct TokenOut {
  int32_t id = -1;
  float logprob = 0;               // log-softmax of the raw logits (when logprobs ≥ 0)
  std::vector<TokenLogprob> top;   // the most likely alternatives (when logprobs > 0)
};

struct RequestStats {
  int n_prompt = 0, n_generated = 0;
  double queue_ms = 0;    // submission → slot
  double prompt_ms = 0;   // slot → first token (prefill)
  double decode_ms = 0;   // first token → end
  double ttft_ms = 0;     // submission → first token
  int draft_rounds = 0;      // speculative decoding: verify steps of this request
  int draft_n = 0;           // speculative decoding: tokens drafted for this request
  int draft_n_accepted = 0;  // of which the target accepted
  int n_cached = 0;       // prompt tokens served by the prefix cache (not prefilled)
  int n_cached_disk = 0;  // of which read from the disk tier
  int n_reasoning = 0;       // generated tokens inside the reasoning block (constraint.h)
  bool grammar_broken = false;  // the grammar rejected a forced byte and stopped constraining (a bug guard)
};

// Output since the previous next(): text and tokens; the final one has done = true.
struct Event {
  std::string text;              // released text: complete UTF-8, never part of a stop string
  std::vector<TokenOut> tokens;  // tokens sampled (end-of-generation tokens excluded)
  bool done = false;
  FinishReason finish = FinishReason::kNone;
  std::string stop_word;  // the stop string that ended generation
  std::string error;      // kError
  RequestStats stats;     // filled on the final event

  void merge(Event&& later);
  bool empty() const { return text.empty() && tokens.empty() && !done; }
};

class RequestHandle {
 public:
  explicit RequestHandle(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }

  // Longest a token waits before the reader sees it while output is flowing (the first output and
  // the final event wake the reader at once).
  static constexpr std::chrono::milliseconds kPoll{2};
  // Waits up to `timeout` for output. Returns true with the output merged since the last call;
  // false on timeout, or when the final event has already been delivered.
  bool next(Event& out, std::chrono::milliseconds timeout);
  // Asks the engine to stop this request: it ends within one step and frees its slot.
  void cancel() { cancel_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancel_.load(std::memory_order_relaxed); }
  bool finished() const;  // the final event was produced (it may not have been read yet)

  // Engine side.
  void push(Event&& e);

 private:
  const uint64_t id_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Event pending_;
  bool has_pending_ = false;
  // Output is flowing and the reader collects it every kPoll instead of being woken per push: a
  // wake-up per token (a context switch onto a core the model's threads are using) cost as much as
  // the forward of a small model. Cleared when a poll finds nothing, so an idle reader sleeps.
  bool reader_polls_ = false;
  bool produced_done_ = false;
  bool delivered_done_ = false;
  std::atomic<bool> cancel_{false};
};

}  // namespace pg::engine
