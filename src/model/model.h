// A loaded model: its canonical config, its weights on one backend, and the one forward pass that
// every architecture shares.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "kv/kv_cache.h"
#include "model/batch.h"
#include "model/config.h"
#include "model/weights.h"

namespace pg {

struct ModelOptions {
  int max_batch = 512;  // rows per forward micro-batch (longer batches are split)
  bool progress = false;  // show a loading progress bar on stderr
};

// Per-call options of Model::forward.
struct ForwardOptions {
  // Hybrid models: also keep the recurrent state (conv window + delta state of every linear-attention
  // layer) after each row r in capture slot r of the cache (needs KvCacheOptions::n_capture ≥ batch
  // size), and each extended sequence's state before the batch in its backup slot. Afterwards
  // KvCache::truncate(seq, n) can cut a verified chain back to any length from before the batch to
  // after its last row, and
  // RecurrentState::commit(seq, r) selects the state of any verified tree node. Tree batches
  // (Batch::parent ≥ 0) require it: their rows never update the sequence's committed state.
  bool capture = false;
  // Greedy outputs: when `argmax` is set, argmax[i] receives the greedy token of output row i (highest
  // logit, ties to the lowest id — engine argmax()), computed on the backend. Rows with argmax_only[i]
  // set (argmax_only may be null: none) then skip the logits copy to the host; their logits rows are left
  // unspecified. Both arrays have one entry per output row (Batch::n_outputs()).
  int32_t* argmax = nullptr;
  const uint8_t* argmax_only = nullptr;
  // Top-k per output row, on the backend (Backend::topk_rows): with 1 ≤ top_k ≤ 64, topk_ids (int32
  // (n_outputs, top_k)) receives each row's top_k tokens by descending logit (ties to the lower id) and
  // topk_logprobs (float (n_outputs, top_k)) their log-softmax over the whole vocabulary.
  int top_k = 0;
  int32_t* topk_ids = nullptr;
  float* topk_logprobs = nullptr;
  // Rows whose logits the caller does not need (it reads argmax, top-k or hidden states only): with
  // logits_skip[i] set (one entry per output row; null = none) output row i's logits are not copied to
  // the host and its logits row is left unspecified. argmax_only is the same thing for argmax users.
  const uint8_t* logits_skip = nullptr;
  // Hidden states (the seam for DFlash drafts): for each layer id in hidden_layers (0 ≤ id < n_layer, in
  // the caller's order), the residual stream leaving that layer (before the final norm) of every output
  // row, written to *hidden as (n_outputs, hidden_layers.size()·n_embd): row i holds layer
  // hidden_layers[0]'s n_embd values, then hidden_layers[1]'s, ...
  std::vector<int> hidden_layers;
  std::vector<float>* hidden = nullptr;
  // With hidden_all_rows, *hidden holds every batch row instead (n_rows, hidden_layers.size()·n_embd),
  // in batch order: DFlash drafts need the features of prompt rows too.
  bool hidden_all_rows = false;
  // With hidden_all_rows, the hidden states may stay on the backend instead: hidden_dev (F32 on this
  // model's backend, at least hidden_layers.size()·n_rows rows of n_embd) receives layer
  // hidden_layers[k]'s state of batch row r at row k·n_rows + r (device-to-device copies, nothing
  // comes to the host); `hidden` may then be null.
  Tensor* hidden_dev = nullptr;
  // Device-fed steps (a greedy chain drafted depth after depth with no host round trip, one download at
  // the end): with tokens_dev set (I32 on this model's backend, at least n_rows elements, e.g. a
  // (1, n) column), batch row r's token id is read from element r on the backend (a device-to-device
  // copy into the step's id buffer, where batch.tokens would be uploaded; batch.tokens is then ignored
  // apart from its range check). A recorded graph is unchanged: the copy runs before it, like the upload.
  const Tensor* tokens_dev = nullptr;
  // With argmax_dev set (I32 on this model's backend, at least n_outputs elements), output row i's
  // greedy token (as for `argmax`) is written to element i on the backend and not downloaded. When the
  // forward has nothing else for the host (rows skipped by logits_skip, no top-k, no host hidden
  // states), it returns without waiting for the backend: read argmax_dev with a later download.
  Tensor* argmax_dev = nullptr;
};

// Bytes a forward step reads, for roofline accounting.
struct ModelBytes {
  size_t file = 0;            // all tensor data
  size_t per_token = 0;       // weights read to decode one token (all but the embedding table; MoE: active experts)
  size_t embedding_row = 0;   // one token_embd row
};

class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& path, Backend& backend, const ModelOptions& opt = {});
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const gguf::File& file() const { return *file_; }
  Backend& backend() { return backend_; }
  const ModelWeights& weights() const { return w_; }
  ModelBytes bytes() const { return bytes_; }

  // Makes the cache for this model (a PagedKvCache behind the KvCache interface): K/V for attention
  // layers and, for hybrid models, the recurrent state of the linear-attention layers (with
  // opt.n_capture capture slots).
  std::unique_ptr<KvCache> make_cache(const KvCacheOptions& opt);

  // Evaluates the batch: writes every row's K/V into the cache (reserving blocks as needed), and
  // returns the logits of rows with logits=1, in row order, as (n_outputs, n_vocab) row-major.
  // Sequence lengths in the cache advance to max(position)+1 of their rows.
  //
  // Token trees (speculative verification): when any row of a sequence has parent ≥ 0, all rows of that
  // sequence in this batch are tree rows: a root (parent -1) is at position seq_len, any other row at its
  // parent's position + 1 (the parent an earlier row of the same sequence), at most kMaxTreeRows of them,
  // depth below the model's sliding window. Tree row j (its index among the sequence's tree rows, in
  // batch order) is stored at logical position seq_len + j and attends to the committed history and to
  // its ancestors and itself; the sequence length does not advance, and KvCache::commit(seq, path)
  // later keeps an accepted root-to-node path. Chain rows of other sequences may share the batch.
  //
  // Hybrid models keep one recurrent state per sequence, so their rows must extend the history exactly:
  // in a chain batch (all parents -1) the rows of a sequence, in batch order, take positions
  // seq_len, seq_len+1, ...; in a tree each node's state derives from its parent's (the sequence's
  // committed state is left unchanged; see ForwardOptions::capture, which tree batches need).
  void forward(const Batch& batch, KvCache& cache, std::vector<float>& logits, const ForwardOptions& fopt = {});

 private:
  Model(std::unique_ptr<gguf::File> file, Backend& backend, const ModelOptions& opt);
  struct Workspace;
  void ensure_workspace(KvCache& cache);
  void drop_workspace();
  // (Forwards of up to Backend::graph_max_rows() rows replay recorded graphs; see forward_ubatch.)
  struct TreePlan;
  struct RecurrentPlan;
  TreePlan plan_tree(const Batch& batch, const KvCache& cache) const;
  RecurrentPlan plan_recurrent(const Batch& batch, const KvCache& cache, const ForwardOptions& fopt) const;
  void forward_ubatch(const Batch& batch, int b0, int b1, KvCache& cache, const TreePlan& tp, const RecurrentPlan* plan,
                      const ForwardOptions& fopt, int out0, std::vector<float>& logits);
  void build_recurrent_batch(const Batch& batch, int b0, int b1, const KvCache& cache, const RecurrentPlan& plan);
  void attention_block(int il, int n, KvCache& cache);
  void deltanet_block(int il, int n, KvCache& cache);
  void ffn_block(int il, int n);

  std::unique_ptr<gguf::File> file_;
  Backend& backend_;
  ModelOptions opt_;
  ModelConfig cfg_;
  ModelWeights w_;
  ModelBytes bytes_;
  std::unique_ptr<Workspace> ws_;
};

}  // namespace pg
