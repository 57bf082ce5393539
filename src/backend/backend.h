// The op interface every backend implements. The model's forward is written once against it.
//
// Conventions (all ops):
//  - activations are F32, 2-D, row-major: (rows = tokens, cols = features); shapes in comments are
//    (rows, cols), i.e. (ne[1], ne[0]).
//  - a weight W of ggml shape {in, out} is (out, in): y = x · Wᵀ.
//  - ops are asynchronous on devices with queues (CUDA): results are only visible to the host after
//    download()/synchronize(); nothing here allocates except alloc().
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/tensor.h"

namespace pg {

enum class RopeStyle { Norm, Neox };  // Norm: adjacent pairs (x[2i], x[2i+1]); Neox: (x[i], x[i+n_rot/2])
enum class Activation { Silu, GeluTanh };
enum class ExpertGating { Softmax, Sigmoid };

// Per-step indices that tell attention where each batch row's keys live. Built by the KV cache.
struct AttentionBatch {
  int n_tokens = 0;
  Tensor positions;    // I32 (n_tokens): logical position of row r in its sequence
  Tensor seq;          // I32 (n_tokens): sequence slot of row r
  Tensor cells;        // I32 (n_tokens): physical cache cell that receives row r's K/V
  Tensor block_table;  // I32 (n_seq_slots, max_blocks): physical block of each logical block
  int block_size = 0;  // cells per block
  int max_blocks = 0;  // block_table row length
  int max_kv_len = 0;  // max over rows of positions[r] + 1 (an upper bound for kernel launches)
};

struct AttentionParams {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;          // applied to q·k
  int sliding_window = 0;      // 0 = full causal; else row at p sees keys p' with p − p' < window
  float logit_softcap = 0.0f;  // 0 = off; else s = cap·tanh(s/cap)
};

// KV storage of one attention layer: (n_cells, n_head_kv*head_dim) each, F32 or F16.
struct KvLayer {
  Tensor k, v;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool is_host() const = 0;  // tensor data is directly addressable by the CPU

  // ---- memory ----
  // Allocates (rows, cols) of type t, zero-filled. Owned by the backend until free().
  virtual Tensor alloc(DType t, int64_t cols, int64_t rows = 1, int64_t ne2 = 1) = 0;
  virtual void free(Tensor& t) = 0;
  // A weight for use by ops: host backends may reference `host_data` in place (mmap), devices copy it.
  virtual Tensor load_weight(DType t, const int64_t ne[4], const void* host_data) = 0;
  virtual void upload(Tensor& dst, const void* src, size_t bytes, size_t dst_offset = 0) = 0;
  virtual void download(const Tensor& src, void* dst, size_t bytes, size_t src_offset = 0) = 0;
  virtual void synchronize() {}

  // ---- ops ----
  // out (n, cols) = table rows ids[i] (table any type, dequantized to F32). ids: I32 (n).
  virtual void get_rows(const Tensor& table, const Tensor& ids, Tensor& out) = 0;
  // y (n, out) = x (n, in) · Wᵀ, W (out, in) of any supported weight type.
  virtual void matmul(const Tensor& w, const Tensor& x, Tensor& y) = 0;
  // y += bias (cols) broadcast over rows.
  virtual void add_bias(Tensor& y, const Tensor& bias) = 0;
  // y (rows, d) = x / sqrt(mean(x²) + eps) · w, per row; w (d) may be invalid (no weight).
  // To normalise per head, pass x reshaped to (n*heads, head_dim).
  virtual void rms_norm(const Tensor& x, const Tensor& w, Tensor& y, float eps) = 0;
  // y = a + b (same shapes). y may alias a.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  // x *= s.
  virtual void scale(Tensor& x, float s) = 0;
  // y (n, f) = act(gate) ⊙ up, all (n, f).
  virtual void glu(const Tensor& gate, const Tensor& up, Tensor& y, Activation act) = 0;
  // Rotates x (n, n_heads*head_dim) in place by positions pos (I32 n); dims ≥ n_rot pass through.
  virtual void rope(Tensor& x, const Tensor& pos, int n_heads, int head_dim, int n_rot, float base, RopeStyle style) = 0;
  // Writes k, v (n, n_head_kv*head_dim) into the layer cache at cells batch.cells.
  virtual void kv_store(KvLayer& kv, const Tensor& k, const Tensor& v, const AttentionBatch& batch) = 0;
  // out (n, n_head*head_dim) = softmax(q·kᵀ·scale + mask)·v over each row's visible cache cells
  // (logical positions 0..pos[r], bounded by the sliding window), q (n, n_head*head_dim).
  virtual void attention(const Tensor& q, const KvLayer& kv, const AttentionBatch& batch, const AttentionParams& p,
                         Tensor& out) = 0;
  // x ⊙= sigmoid(gate), same shapes.
  virtual void mul_sigmoid(Tensor& x, const Tensor& gate) = 0;
  // x = cap·tanh(x/cap) (Gemma's logit softcapping).
  virtual void softcap(Tensor& x, float cap) = 0;
  // Copies columns [col0, col0+dst.cols) of every group of `group` columns of src into dst:
  // src (n, g*group) → dst (n, g*w). Splits interleaved per-head blocks such as qwen35's [q | gate].
  virtual void gather_cols(const Tensor& src, int group, int col0, Tensor& dst) = 0;

  // ---- mixture of experts ----
  // From router logits (n, n_expert): ids (I32 (n, k)) and weights (F32 (n, k)) of the top-k experts.
  // gating softmax: p = softmax(logits); sigmoid: p = σ(logits). norm: w = p/Σ_topk p (sum clamped ≥ 6.1e-5).
  // Then w *= scale when scale != 0.
  virtual void moe_route(const Tensor& logits, int k, ExpertGating gating, bool norm, float scale, Tensor& ids,
                         Tensor& weights) = 0;
  // out (n, d) = Σ_j weights[r][j] · down_e( act(gate_e·x) ⊙ up_e·x ), e = ids[r][j].
  // gate_exps/up_exps: (n_expert, ff, d) stacked; down_exps: (n_expert, d, ff).
  virtual void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_exps,
                       const Tensor& up_exps, const Tensor& down_exps, Activation act, Tensor& out) = 0;
};

}  // namespace pg
