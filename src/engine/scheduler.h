// The engine's request loop: continuous batching over a fixed set of KV slots.
//
// One engine thread owns the model and its KV cache. Requests arrive through submit() (any thread);
// each step the engine
//   1. drops sequences whose client cancelled or whose deadline passed (freeing their slots),
//   2. gives free slots to queued requests in arrival order,
//   3. builds ONE batch: a decode row for every sequence that is generating, then prompt chunks of
//      sequences still prefilling, up to n_batch rows, so running streams keep flowing while a
//      long prompt is read,
//   4. runs one forward and samples every sequence that got logits.
// With a drafter (SpecOptions), step 3 first asks it — once, for every decoding sequence — for a
// draft and lays each draft out as verify rows [root, drafts…] instead of the one decode row; step 4
// walks each sequence's draft against the target's tokens at its nodes (spec/verify.h), emits the
// accepted run plus the bonus through the same end checks as plain decoding, and cuts the cache back
// to the accepted path. Several sequences speculate in the same step, each with its own draft.
// Sequence state (sequence.h) is kept apart from the step so that speculative verification,
// prefix reuse and several models can later change how a step is built without touching it.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/metrics.h"
#include "engine/prefix.h"
#include "engine/request.h"
#include "engine/sequence.h"
#include "model/model.h"
#include "spec/adaptive.h"
#include "spec/drafter.h"
#include "spec/verify.h"
#include "tokenizer/tokenizer.h"

namespace pg::engine {

// Speculative decoding (docs/speculative.md).
struct SpecOptions {
  spec::SpecType type = spec::SpecType::kNone;
  Model* draft = nullptr;  // kDraft: the draft model (any backend); the scheduler gives it a cache
  int n_max = 16;          // draft depth per step (chain length; DDTree depth)
  int n_min = 0;           // a draft shorter than this is not verified (plain decode row instead)
  bool tree = false;       // verify a DDTree built from the drafter's per-depth top-k instead of a chain
  int budget = 22;         // DDTree draft nodes (root excluded), 1..127
  float p_min = 0.75f;     // stop drafting below this top-1 draft probability (--spec-draft-p-min; 0 = off)
  // Per step and sequence, verify only the prefix of the draft (chain length, tree nodes) that pays:
  // expected tokens per second from the sequence's acceptance and the measured costs (spec/adaptive.h).
  bool adaptive = true;
  // Tests only: accept every sampled draft (a wrong rule the distribution tests must catch).
  bool test_biased_accept = false;
  // Tests only (non-zero: a seed): the adaptive choices (draft depth, verified prefix) are drawn at
  // random instead of from the measured costs, so lossless tests cover the shapes the cost model
  // would pick on another machine or under another load, reproducibly.
  uint64_t test_random_shapes = 0;
  DFlashModel* dflash = nullptr;  // kDFlash: the block-diffusion draft (loaded against this target)
  int fa_window = 0;              // kDFlash: context positions the draft sees (0 = all)
  // Throws pg::Error for absurd values.
  void validate() const;
  bool on() const { return type != spec::SpecType::kNone; }
};

struct SchedulerOptions {
  int n_slots = 4;        // sequences decoded together (KV slots)
  int n_ctx = 4096;       // tokens per slot (prompt + generated)
  int n_batch = 512;      // rows per step (decode rows + prompt chunks)
  int max_queue = 1024;   // requests waiting for a slot beyond which submit() refuses
  DType kv_type = DType::F16;               // K (and V unless kv_type_v is set)
  std::optional<DType> kv_type_v;           // V cache type when it differs
  int kv_block_size = 64;
  SpecOptions spec;
  PrefixOptions prefix;  // the prefix cache (RAM budget, disk tier); docs/prefix-cache.md
  // Where a speculative step's time goes (peregrine bench --draft prints it): per step with verify rows,
  // host-clock time of drafting, the verify forward, the walk/emit/cache commit and the rest, into
  // MetricsSnapshot::phase_*. The target's (and a draft model's) backend is synchronised after each phase
  // so that queued device work is charged to the phase that issued it; off by default (no extra syncs).
  bool spec_phases = false;
};

// submit() refuses a request before any work is done.
class RejectError : public Error {
 public:
  enum class Kind { kInvalid, kContextOverflow, kOverloaded, kShutdown };
  RejectError(Kind k, const std::string& msg) : Error(msg), kind_(k) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

class Scheduler {
 public:
  // Creates the KV cache (n_slots × n_ctx) and starts the engine thread.
  Scheduler(Model& model, const tok::Tokenizer& tok, const SchedulerOptions& opt);
  // Stops the engine; requests still queued or running end with an error event.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Validates (prompt not empty, prompt + max_tokens within a slot's context, sampling values) and
  // queues the request. Throws RejectError.
  std::shared_ptr<RequestHandle> submit(RequestSpec spec);

  MetricsSnapshot metrics() const;
  const SchedulerOptions& options() const { return opt_; }
  size_t kv_bytes() const { return kv_bytes_; }
  const Model& model() const { return model_; }
  const tok::Tokenizer& tokenizer() const { return tok_; }
  // The prefix cache (null when off); its stats() may be read from any thread.
  const PrefixCache* prefix_cache() const { return prefix_.get(); }
  void shutdown();
  // The drafter's counters (tests; read when the engine is idle): catch-up tokens fed to a draft
  // model and how often a slot started over.
  struct DrafterStats {
    uint64_t rows_fed = 0, replays = 0;
  };
  DrafterStats drafter_stats() const { return drafter_ ? DrafterStats{drafter_->rows_fed(), drafter_->replays()} : DrafterStats{}; }

 private:
  void loop();
  void reap(Clock::time_point now);
  void admit(Clock::time_point now);
  void step();
  void release(Sequence& s);
  void publish_occupancy();
  // Drafts for the decoding sequences that speculate this step; fills verify_.
  void draft();
  void forward_step(std::vector<float>& logits, const ForwardOptions& fopt, int n_first);

  Model& model_;
  const tok::Tokenizer& tok_;
  SchedulerOptions opt_;
  int n_vocab_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<PrefixCache> prefix_;  // after cache_: destroyed first
  bool index_on_release_ = true;         // false while releasing sequences of a failed forward
  size_t kv_bytes_ = 0;
  Metrics metrics_;

  std::mutex mu_;  // guards incoming_, stop_, next_id_
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> incoming_;
  bool stop_ = false;
  uint64_t next_id_ = 1;
  std::atomic<int> n_queued_{0};  // submitted and not yet admitted or finished
  std::atomic<int> n_active_{0};  // holding a slot

  // Engine-thread state.
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> active_;  // admission order
  std::vector<int> free_slots_;
  Batch batch_;
  std::vector<float> logits_;  // (rows with logits, n_vocab)
  std::vector<Sequence*> out_seq_;  // sequence of each logits row
  std::vector<uint8_t> greedy_only_;  // per logits row: only the backend's argmax is needed
  std::vector<int32_t> greedy_;       // per logits row: the backend's argmax

  // Speculation.
  std::unique_ptr<spec::Drafter> drafter_;
  bool tree_forward_ = true;  // the target's backend verifies tree batches (tree-masked attention)
  struct Verify {
    Sequence* seq;
    spec::DraftTree tree;
    int out0 = 0;  // logits row of the tree's root; node i is row out0 + i
    std::vector<std::vector<float>> q;  // sampled chain drafts: (n_draft, n_vocab) the drafter's q per draft
    double predicted = 0;               // adaptive: accepted tokens the drafter's probabilities predicted
  };
  // Sampled chain drafts: min(1, p/q) acceptance and the residual; emits like the greedy walk.
  spec::WalkResult sample_chain(Verify& v, const std::function<const float*(int node)>& logits);
  spec::CostModel cost_;  // measured target-forward and draft-step costs (adaptive speculation)
  std::mt19937_64 test_rng_;  // SpecOptions::test_random_shapes: seeded in the constructor
  std::vector<float> p_buf_;  // (n_vocab) the target's distribution at a node
  std::vector<Verify> verify_;
  std::vector<spec::DraftInput> draft_in_;
  std::vector<spec::Draft> draft_out_;
  std::vector<Sequence*> who_;  // (speculating sequences) the sequence of each draft_in_ entry
  static constexpr int kProbeEvery = 16;  // adaptive: plain steps before a sequence drafts again anyway
  Batch sub_;  // a part of batch_ run as its own forward (hybrid targets: capture only the verify rows)
  std::vector<float> sub_logits_;
  std::vector<float> hidden_, sub_hidden_;  // (batch rows, features) target features for a DFlash drafter
  void feed_features(int n_first);          // hands the committed non-verify rows' features to the drafter
  std::vector<uint8_t> is_verify_;  // (batch rows) feed_features: which rows are verify rows
  bool features_dev_ = false;       // this step's features stay on the backend (Drafter::feature_rows)
  bool profile_ = false;
  double prof_[2] = {0, 0};  // seconds: drafting, forward
  uint64_t prof_rows_ = 0, prof_steps_ = 0;

  std::thread thread_;
};

}  // namespace pg::engine
