// DFlash block-diffusion draft models (issue 13; docs/dflash.md).
//
// A DFlash draft is a few target-width decoder layers that predict a whole block of tokens in one
// pass: the block [anchor token, MASK × (B-1)] goes through the target's own embedding, attends
// (non-causally) to itself and to K/V projected from the target's hidden states of the context, and
// the target's LM head reads its positions 1..B-1 (slot k predicts the token at anchor + k). The
// draft has no embedding or head of its own, so it loads against a target.
//
// File formats read (both name the same tensors once the prefixes are stripped):
//  - llama.cpp (v0.5.0): architecture "dflash"; dflash.block_size, dflash.target_layers (the layer
//    *inputs* it extracts, i.e. HF target_layer_ids + 1), tokenizer.ggml.mask_token_id; tensors
//    fc.weight, enc.output_norm.weight (hidden norm), output_norm.weight, blk.N.{attn_*, ffn_*}.
//  - Lucebox: architectures "dflash-draft", "qwen35-dflash-draft", "gemma4-dflash-draft";
//    <arch>.dflash.{block_size, target_layer_ids (HF ids), n_target_layers, mask_token_id}; tensors
//    dflash.fc.weight | dflash_fc.weight, dflash.hidden_norm.weight | dflash_hidden_norm.weight.
// Internally target_layers are 0-based target layers whose output (the residual stream leaving the
// layer, before the final norm) is a feature: ForwardOptions::hidden_layers.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "kv/kv_cache.h"

namespace pg {

class Model;

struct DFlashConfig {
  std::string arch, name;
  int n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  float rms_eps = 1e-6f;
  float rope_base = 1e6f;
  int n_ctx_train = 0;
  int block_size = 16;
  int32_t mask_token = -1;         // -1: the file names none (then the target's must be given)
  std::vector<int> target_layers;  // 0-based target layer ids (see above); empty: count only known
  int n_target_layers = 0;         // features fused by fc (= target_layers.size() when listed)
  int sliding_window = 0;          // 0 = full context
  std::vector<bool> layer_swa;     // (n_layer)
  bool causal = false;             // dflash.attention.causal: block rows see earlier block rows only
  std::string fc_name, hidden_norm_name;  // tensor names in this file
  bool llama_cpp_layout = false;   // target_layers stored +1 (llama.cpp)
};

bool is_dflash_arch(const std::string& arch);
// Reads and checks a DFlash draft's metadata and tensor shapes (no target needed; for inspect too).
DFlashConfig read_dflash_config(const gguf::File& f);
// `peregrine gguf inspect`: what the file is, in words (or the reason it cannot load).
void print_dflash_summary(const gguf::File& f, std::ostream& os);
// The tensors a draft of this config must hold, with their ggml shapes.
std::vector<std::pair<std::string, std::vector<int64_t>>> dflash_tensor_shapes(const DFlashConfig& c);

struct DFlashLayer {
  Tensor attn_norm, wq, wk, wv, wo, q_norm, k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down;
};

// One block to draft: the anchor (the sequence's newest token, at position pos0) and the context it
// sees, positions [pos0 - n_ctx, pos0). The device path (propose with a KvCache) reads that context from
// sequence `seq` of the draft's cache; the host reference path (propose_host) from ctx_k / ctx_v.
struct DFlashBlock {
  int32_t anchor = 0;
  int pos0 = 0;
  int n_ctx = 0;                   // context rows (n_ctx < pos0: a window)
  int seq = 0;                     // the draft cache's sequence (device path)
  std::vector<const float*> ctx_k;  // host path: (n_layer) each (n_ctx, n_head_kv·head_dim), RoPE'd at their positions
  std::vector<const float*> ctx_v;  // host path: (n_layer) each (n_ctx, n_head_kv·head_dim)
};

class DFlashModel {
 public:
  // Loads the draft onto the target's backend; checks it against the target (hidden size, layer ids,
  // mask token, the target's embedding / head). Throws pg::Error naming the problem.
  static std::unique_ptr<DFlashModel> load(const std::string& path, Model& target);
  ~DFlashModel();

  const DFlashConfig& config() const { return c_; }
  const gguf::File& file() const { return *file_; }
  int n_feat() const { return c_.n_target_layers * c_.n_embd; }
  int kv_width() const { return c_.n_head_kv * c_.head_dim; }

  // ---- the forward in Backend ops (any backend; what the drafter runs) ----
  // A KV cache of the draft's own layers on the target's backend: one sequence per slot, n_ctx
  // positions per sequence (the caller adds block_size scratch positions for the block rows). F32 cells
  // on host backends (the host path's numbers), F16 on devices.
  std::unique_ptr<KvCache> make_cache(int n_seq, int n_ctx) const;
  // Context rows of any sequences in one pass: feats (n, n_feat) (host memory) of positions pos (n) of
  // sequences seq (n) → every layer's k_norm'd, RoPE'd K and V stored at the rows' cells, which the
  // caller reserved (KvCache::reserve). Rewriting a position overwrites its cells.
  void store_context(KvCache& cache, const float* feats, const int32_t* seq, const int32_t* pos, int n);
  // The same with the features on the backend, in the layout a target forward writes them
  // (ForwardOptions::hidden_dev): feature layer k of batch row r at row k·n_rows + r of `src`; context
  // row i is batch row rows[i].
  void store_context_rows(KvCache& cache, const Tensor& src, int n_rows, const int32_t* rows, const int32_t* seq, const int32_t* pos, int n);
  // A backend tensor for ForwardOptions::hidden_dev of a forward of n_rows rows (owned here, reused:
  // valid until the next call).
  Tensor feature_buffer(int n_rows);
  // One pass over the blocks ([anchor, MASK × n_out] each) with the context read from `cache`. The block
  // rows' K/V go to the scratch cells at positions pos0 .. pos0+n_out of each block's sequence (the caller
  // reserved them; they are not committed: the sequence's length is untouched). For each block, slots
  // 1..n_out (n_out ≤ block_size-1): with top_k ≥ 1 ids (blocks, n_out, top_k) and logprobs likewise;
  // with logits non-null the full logits (blocks, n_out, n_vocab) instead.
  void propose(KvCache& cache, std::span<const DFlashBlock> blocks, int n_out, int top_k, int32_t* ids, float* logprobs,
               float* logits = nullptr);

  // ---- the host reference path (context K/V in host arrays, attention on the host; tests) ----
  // Context rows: feats (n, n_feat) of positions pos (n) → k_out[l], v_out[l] (n, kv_width) for each
  // draft layer l (k: k_norm'd and RoPE'd at pos).
  void context_kv(const float* feats, const int32_t* pos, int n, const std::vector<float*>& k_out, const std::vector<float*>& v_out);
  // propose() with the blocks' ctx_k / ctx_v.
  void propose_host(std::span<const DFlashBlock> blocks, int n_out, int top_k, int32_t* ids, float* logprobs, float* logits = nullptr);

 private:
  DFlashModel(std::unique_ptr<gguf::File> f, Model& target);
  Tensor scratch(int slot, int64_t cols, int64_t rows);
  Tensor scratch_i32(int slot, int64_t cols, int64_t rows = 1);
  // store_context's layers, from the features f (n, n_feat) on the backend.
  void store_fused(KvCache& cache, const Tensor& f, const int32_t* seq, const int32_t* pos, int n);
  // The block's rows through the layers up to x (R, n_embd); attention is the callback (layer, q, k, v, out).
  void block_layers(Tensor& x, const Tensor& tpos, int R, const std::function<void(int, Tensor&, Tensor&, Tensor&, Tensor&)>& attend);
  // Final norm, the target's head and top-k / logits of rows 1..n_out of each of nb blocks of x.
  void block_head(const Tensor& x, int nb, int n_out, int top_k, int32_t* ids, float* logprobs, float* logits);

  std::unique_ptr<gguf::File> file_;
  Model& target_;
  Backend& be_;
  DFlashConfig c_;
  Tensor fc_, hidden_norm_, output_norm_;
  std::vector<DFlashLayer> layers_;
  std::vector<Tensor> scratch_;        // reusable activations, grown on demand
  std::vector<int64_t> scratch_elems_;
};

}  // namespace pg
