// Drafters propose continuations of a sequence for the target to verify in one forward.
//
// A drafter answers for several sequences at once (the runner asks every speculating sequence of a
// step together, so a draft model runs one forward per depth for all of them). It may answer with
// an explicit tree (`tree`, e.g. the n-gram drafter's chain), or with per-position candidate lists
// (`topk`, one entry per drafted depth, and `chain`, its greedy path) from which the runner builds a
// chain or a DDTree. A DFlash drafter (issue 13) fits the second form: one parallel pass gives the
// marginals of a 16-token block.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "spec/tree.h"

namespace pg {
class Model;
class DFlashModel;
}

namespace pg::spec {

enum class SpecType : uint8_t { kNone, kDraft, kNgram, kDFlash };
// "none" | "draft" (alias "draft-simple") | "ngram" (aliases "ngram-simple", "ngram-cache") | "dflash"
// (alias "draft-dflash"); throws
// pg::Error naming the accepted values otherwise.
SpecType parse_spec_type(const std::string& s);
const char* spec_type_name(SpecType t);

class DraftSampler;

struct DraftInput {
  int slot = 0;                                // the target's sequence slot (drafters keep state per slot)
  std::span<const int32_t> history;            // prompt + generated tokens; the last one is the root
  int n_max = 16;                              // draft depth wanted
  int k = 1;                                   // candidates per depth wanted (1 = chain only)
  // Stop drafting once the drafter's most likely token at a depth has a probability below p_min
  // (llama-server's --spec-draft-p-min): a chain drops that token, a tree keeps that depth's
  // candidates as siblings and goes no deeper. 0 = draft n_max.
  float p_min = 0;
  // Sampled drafting (temperature > 0, chains): each draft is drawn from q = sampler->sample(the
  // drafter's logits), and q is returned so the target can accept with min(1, p/q). Null: the drafter's
  // greedy continuation.
  DraftSampler* sampler = nullptr;
};

// Turns a drafter's logits at one depth into the distribution q (n_vocab, sums to 1) and one draw from
// it. The engine implements it per sequence (the request's truncation and temperature, its own RNG).
class DraftSampler {
 public:
  virtual ~DraftSampler() = default;
  virtual int32_t sample(const float* logits, std::vector<float>& q) = 0;
};

struct Draft {
  std::vector<int32_t> chain;  // (depth) the drafter's continuation (greedy, or drawn from q)
  std::vector<TopK> topk;      // (depth) per-position candidates (k ≥ 1: at least the top-1 and its log-prob), or empty
  std::vector<std::vector<float>> q;  // sampled drafts: (depth, n_vocab) the distribution chain[d] was drawn from
  bool has_tree = false;       // `tree` is the proposal as is
  DraftTree tree;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual const char* name() const = 0;
  // Fills out[i] for in[i].
  virtual void propose(std::span<const DraftInput> in, std::span<Draft> out) = 0;
  // The slot's sequence ended (or a new one takes the slot): drop its state.
  virtual void release(int /*slot*/) {}
  // A new sequence in `slot` could skip prefilling its first `cached_tokens` prompt tokens (a prefix
  // cache hit): how many of them this drafter can do without the target having run them. The
  // scheduler caps the hit by the answer, so the rest is prefilled. Default: all of them (a draft
  // model catches up from the history, the n-gram drafter reads the tokens). A drafter that needs the
  // target's features of every context position (DFlash) answers only what it still holds for the slot.
  virtual int reusable_prefix(int /*slot*/, int cached_tokens) const { return cached_tokens; }
  // Tokens fed to a draft model to catch up with histories (tests: a rollback must not replay history),
  // and how many times a slot had to start over.
  virtual uint64_t rows_fed() const { return 0; }
  virtual uint64_t replays() const { return 0; }
  // Drafting forwards (one token per sequence, after the catch-up) run so far and their seconds:
  // the per-depth cost the adaptive choices weigh.
  virtual uint64_t forwards() const { return 0; }
  virtual double forward_seconds() const { return 0; }
  // Steps drafted as device-fed greedy chains (ModelDrafterOptions::device_chain), 0 for other drafters.
  virtual uint64_t device_chain_steps() const { return 0; }
  // Target features (DFlash): the target layers whose hidden states this drafter reads
  // (ForwardOptions::hidden_layers), empty for none; the runner then hands it, for every committed
  // token, that token's row (feature_layers().size()·n_embd floats) at its position.
  virtual std::vector<int> feature_layers() const { return {}; }
  virtual void add_features(int /*slot*/, int /*pos*/, const float* /*row*/) {}
  // Device-side features instead (no host round trip): the tensor, on the target's backend, that the
  // next forward of n_rows batch rows writes its features into (ForwardOptions::hidden_dev layout:
  // feature layer k of batch row r at row k·n_rows + r), or null for host rows (add_features). Rows
  // handed over from an earlier forward are consumed before this returns (the forward overwrites them).
  virtual Tensor* feature_rows(int /*n_rows*/) { return nullptr; }
  // With feature_rows(): batch row `row` of the last forward holds the features of (slot, pos).
  virtual void add_feature_row(int /*slot*/, int /*pos*/, int /*row*/) {}
};

// Prompt lookup: the longest suffix of the history (n_max_ngram … n_min_ngram tokens) that occurred
// before, and the tokens that followed its most recent earlier occurrence.
std::unique_ptr<Drafter> make_ngram_drafter(int n_min_ngram = 1, int n_max_ngram = 4);

// A draft model with its own KV cache (n_slots × n_ctx) on its own backend: autoregressive steps, one
// forward per depth for every sequence, keeping its cache at the longest common prefix of what it saw
// and the history it is given (rejected drafts are rolled back, not recomputed). A hybrid (Gated
// DeltaNet) draft keeps the recurrent state after each drafted token of the last step (capture slots,
// `max_depth` + 1 per sequence slot), so it rolls back to the accepted prefix without replaying history.
//
// ModelDrafterOptions::device_chain (alias: env PEREGRINE_DRAFT_DEVICE_CHAIN=1, read here): greedy chains
// (no sampler, k ≤ 1, p_min ≤ 0, every query wanting the same depth, a draft without recurrent layers)
// run all depths back to back on the backend, each depth's token ids read there from the last depth's
// argmax (ForwardOptions::tokens_dev / argmax_dev), with one download at the end. The drafts are the
// same as the per-depth path's; other requests keep that path.
struct ModelDrafterOptions {
  bool device_chain = false;
};
std::unique_ptr<Drafter> make_model_drafter(Model& draft, int n_slots, int n_ctx, int max_depth = kMaxTreeNodes - 1,
                                            const ModelDrafterOptions& opt = {});

// DFlash (docs/dflash.md): one parallel pass of the block-diffusion draft per step for every
// sequence, on the target's backend, from the target's features of its committed tokens (taken from
// the forward's device tensors, projected into a draft KV cache of n_slots × n_ctx positions);
// per-position top-k for DDTree. fa_window > 0: the draft sees only the last fa_window context
// positions (0 = the whole context, or the file's own sliding window).
std::unique_ptr<Drafter> make_dflash_drafter(DFlashModel& draft, int n_slots, int n_ctx, int fa_window = 0);

// Throws pg::Error unless the draft's vocabulary is the target's (same size and same token texts).
void check_same_vocab(const Model& target, const Model& draft, const std::string& draft_path);

}  // namespace pg::spec
