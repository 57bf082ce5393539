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
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "core/error.h"

namespace pg {

enum class RopeStyle { Norm, Neox };  // Norm: adjacent pairs (x[2i], x[2i+1]); Neox: (x[i], x[i+n_rot/2])
enum class Activation { Silu, GeluTanh };
enum class ExpertGating { Softmax, Sigmoid };

// Token trees (speculative verification): the draft rows of one sequence in one forward, at most this many.
// A tree row sees the sequence's committed cells plus its ancestors among these rows (and itself).
inline constexpr int kMaxTreeRows = 128;
inline constexpr int kTreeMaskWords = kMaxTreeRows / 32;

// Per-step indices that tell attention where each batch row's keys live. Built by the KV cache.
//
// Visibility of row r (logical positions of its sequence, read through the block table):
//  - without a tree (tree_mask invalid): [begin, positions[r] + 1);
//  - with a tree: [begin, kv_len[r]) plus every position kv_len[r] + j with bit j of tree_mask[r] set
//    (bit j of word j/32, j < kMaxTreeRows). A tree's draft rows are stored at logical positions
//    kv_len, kv_len+1, ... in batch order (so those cells exist in the block table) while their RoPE
//    positions (positions[r]) are kv_len + depth. Chain rows of the same batch have kv_len[r] =
//    positions[r] + 1 and no mask bits.
//  begin = max(0, positions[r] + 1 − sliding_window) for sliding-window layers, else 0. The model
//  guarantees that a tree's depth is below the window, so ancestors are never outside it.
struct AttentionBatch {
  int n_tokens = 0;
  Tensor positions;    // I32 (n_tokens): logical position of row r in its sequence
  Tensor seq;          // I32 (n_tokens): sequence slot of row r
  Tensor cells;        // I32 (n_tokens): physical cache cell that receives row r's K/V
  Tensor block_table;  // I32 (n_seq_slots, max_blocks): physical block of each logical block
  int block_size = 0;  // cells per block
  int max_blocks = 0;  // block_table row length
  int max_kv_len = 0;  // max over rows of the highest visible logical position + 1 (bound for launches)
  Tensor kv_len;       // I32 (n_tokens), valid only with tree_mask: end of row r's contiguous visible range
  Tensor tree_mask;    // I32 (n_tokens, kTreeMaskWords) or invalid (no tree rows in this micro-batch)
};

struct AttentionParams {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 1.0f;          // applied to q·k
  int sliding_window = 0;      // 0 = full causal; else row at p sees keys p' with p − p' < window
  float logit_softcap = 0.0f;  // 0 = off; else s = cap·tanh(s/cap)
};

// KV storage of one attention layer: k and v hold one row per cell, each in its own KV type
// (core/kv_quant.h). A row is n_head_kv heads of kv_head_width(type, head_dim) values (head_dim padded to
// the type's block / rotation group; no padding for F32/F16/BF16), so k is (n_cells,
// n_head_kv*kv_head_width(k.type, head_dim)) and v likewise with head_dim_v.
struct KvLayer {
  Tensor k, v;
  int n_head_kv = 0, head_dim = 0, head_dim_v = 0;  // 0 = the row is one head (callers that predate the KV types)
};

// How the rows of a batch thread through the recurrent state of linear-attention (Gated DeltaNet)
// layers. Built by the model from Batch::seq / Batch::parent.
//
// State lives in per-layer pools of "slots" (one row of the pool each; see kv/recurrent_state.h):
// slots 0..n_seq-1 are the sequences' committed states, the rest are capture slots. The rows of the
// batch are grouped into segments; a segment is a chain of rows (rows[start], rows[start+1], ...) in
// which each row continues the state left by the previous one. It starts from slot `src` and, when
// `dst` ≥ 0, leaves its final state in slot `dst` (dst may equal src: an in-place update). A row with
// capture[r] ≥ 0 additionally leaves the state after it in that slot, so a later step can resume from
// any position of a verified chain, or from any node of a verified tree (a tree is a set of segments
// whose src is the capture slot of the parent row). Segments run in order: a segment may start from a
// slot that an earlier segment of the same call captured.
struct RecurrentBatch {
  int n_tokens = 0;  // rows of the activations
  int n_segments = 0;
  Tensor rows;     // I32 (Σ segment lengths ≤ n_tokens): batch rows ordered segment by segment; rows
                   // that no segment lists are not computed (the model always lists every row)
  Tensor seg;      // I32 (n_segments, 4): start (index into rows), length, src slot, dst slot (-1 = none)
  Tensor capture;  // I32 (n_tokens): per batch row, slot receiving the state after the row (-1 = none)
  // Host mirrors of the three tensors above (identical contents): kernels launch per segment and
  // choose the chunked or the token-by-token form from the host-side lengths.
  std::vector<int32_t> h_rows, h_seg, h_capture;
};

// One product of matmul_shared: y = x · wᵀ.
struct MatmulOut {
  const Tensor* w;
  Tensor* y;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual bool is_host() const = 0;  // tensor data is directly addressable by the CPU
  // Whether kv_store/attention/kv_copy handle a KV cache stored in type t (core/kv_quant.h's KV types).
  // The default is what every backend had before the quantized types: F32 and F16.
  virtual bool supports_kv_type(DType t) const { return t == DType::F32 || t == DType::F16; }

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
  // Several products of one input (q/k/v, gate/up): devices prepare x once (quantize, stage).
  virtual void matmul_shared(const Tensor& x, std::initializer_list<MatmulOut> outs) {
    for (const MatmulOut& o : outs) matmul(*o.w, x, *o.y);
  }
  // y += bias (cols) broadcast over rows.
  virtual void add_bias(Tensor& y, const Tensor& bias) = 0;
  // y (rows, d) = x / sqrt(mean(x²) + eps) · w, per row; w (d) may be invalid (no weight).
  // To normalise per head, pass x reshaped to (n*heads, head_dim).
  virtual void rms_norm(const Tensor& x, const Tensor& w, Tensor& y, float eps) = 0;
  // y = a + b (same shapes). y may alias a.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& y) = 0;
  // The residual step of a transformer layer: x += r, then y = rms_norm(x)·w — exactly add(x, r, x) followed
  // by rms_norm(x, w, y, eps), bit for bit. A backend may fuse the two (one pass over x instead of three
  // and one launch instead of two: a decode step has two per layer). x, r, y (rows, d); y must not alias r.
  virtual void add_rms_norm(Tensor& x, const Tensor& r, const Tensor& w, Tensor& y, float eps) {
    add(x, r, x);
    rms_norm(x, w, y, eps);
  }
  // x *= s.
  virtual void scale(Tensor& x, float s) = 0;
  // y (n, f) = act(gate) ⊙ up, all (n, f).
  virtual void glu(const Tensor& gate, const Tensor& up, Tensor& y, Activation act) = 0;
  // The gated FFN's first half: y (n, f) = act(x · gate_wᵀ) ⊙ (x · up_wᵀ), x (n, d), gate_w and up_w (f, d).
  // u (n, f) is the caller's scratch for the up product (the op allocates nothing); y may not alias x or u.
  // The default is exactly matmul_shared(x, {gate_w → y, up_w → u}) then glu(y, u, y, act), bit for bit;
  // a backend may fuse it (CUDA: one decode kernel for both products and the activation, which then
  // leaves u untouched).
  virtual void matmul_glu(const Tensor& x, const Tensor& gate_w, const Tensor& up_w, Activation act, Tensor& y, Tensor& u) {
    matmul_shared(x, {{&gate_w, &y}, {&up_w, &u}});
    glu(y, u, y, act);
  }
  // Rotates x (n, n_heads*head_dim) in place by positions pos (I32 n); dims ≥ n_rot pass through.
  virtual void rope(Tensor& x, const Tensor& pos, int n_heads, int head_dim, int n_rot, float base, RopeStyle style) = 0;
  // The per-head q/k step of an attention layer, in place: q (n, n_head*head_dim) and k (n, n_head_kv*head_dim)
  // are each, when their norm weight (head_dim, F32/F16) is valid, normalised per head (rms_norm of the
  // (n*heads, head_dim) view with that weight and eps; an invalid weight means no norm at all for that
  // tensor, not a weightless norm), then both rotated by rope(pos, head_dim, n_rot, base, style). Exactly
  // this sequence of ops — rms_norm q, rms_norm k, rope q, rope k — bit for bit; a backend may fuse it
  // (CUDA: one launch instead of up to four per layer). q and k must not alias.
  virtual void qk_norm_rope(Tensor& q, Tensor& k, const Tensor& q_norm, const Tensor& k_norm, const Tensor& pos, int n_head,
                            int n_head_kv, int head_dim, int n_rot, float base, RopeStyle style, float eps) {
    if (q_norm.valid()) {
      Tensor qh = q.reshape_2d(head_dim, q.rows() * n_head);  // (n*n_head, head_dim)
      rms_norm(qh, q_norm, qh, eps);
    }
    if (k_norm.valid()) {
      Tensor kh = k.reshape_2d(head_dim, k.rows() * n_head_kv);  // (n*n_head_kv, head_dim)
      rms_norm(kh, k_norm, kh, eps);
    }
    rope(q, pos, n_head, head_dim, n_rot, base, style);
    rope(k, pos, n_head_kv, head_dim, n_rot, base, style);
  }
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
  // ids (I32, rows) = per row of x (rows, cols) the column of the highest value, ties to the lowest
  // column; NaNs never win, except that a NaN in column 0 gives 0 (the engine's host argmax exactly).
  virtual void argmax_rows(const Tensor& x, Tensor& ids) = 0;
  // Per row of x (rows, cols) the k largest values: ids (I32 (rows, k)) in descending order of value (ties
  // to the lower column, NaN never chosen) and their log-softmax over the whole row, logprobs (F32 (rows, k)):
  // x[id] − max − log Σ exp(x − max), sum in double. 1 ≤ k ≤ min(cols, 64).
  virtual void topk_rows(const Tensor& x, int k, Tensor& ids, Tensor& logprobs) { not_implemented("topk_rows"); }
  // Moves K/V rows inside one layer's cache: for i = 0, 1, ... in order, cell dst[i] ← cell src[i] (K and
  // V). src, dst: I32 (n). The result is as if the copies ran one after another (a destination may be a
  // later copy's source); used to compact an accepted tree path into consecutive positions.
  virtual void kv_copy(KvLayer& kv, const Tensor& src_cells, const Tensor& dst_cells) { not_implemented("kv_copy"); }
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
  // gate_exps/up_exps: (n_expert, ff, d) stacked; down_exps: (n_expert, d, ff). When up_exps is invalid,
  // gate_exps is the fused (n_expert, 2·ff, d) tensor: per expert, rows [0, ff) gate and [ff, 2·ff) up.
  virtual void moe_ffn(const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate_exps,
                       const Tensor& up_exps, const Tensor& down_exps, Activation act, Tensor& out) = 0;
  // x (n, d): row r *= sigmoid(gate[r]), gate (n, 1). Qwen's shared-expert gate σ(w·h) per token.
  virtual void mul_rows_sigmoid(Tensor& x, const Tensor& gate) { not_implemented("mul_rows_sigmoid"); }

  // ---- linear attention (Gated DeltaNet) ----
  // dst = src, any two tensors of the same byte size on this backend (state snapshots). The default
  // stages through host memory; devices override it with a device-to-device copy.
  virtual void copy(const Tensor& src, Tensor& dst) {
    PG_CHECK(src.nbytes() == dst.nbytes(), "copy: size mismatch");
    std::vector<uint8_t> staging(src.nbytes());
    download(src, staging.data(), staging.size());
    upload(dst, staging.data(), staging.size());
  }
  // In place, per row r and head h: alpha[r][h] ← softplus(alpha[r][h] + dt_bias[h])·a[h] (the log-decay
  // g, ≤ 0 since a = −exp(A_log) < 0) and beta[r][h] ← sigmoid(beta[r][h]). alpha, beta (n, H); dt_bias,
  // a (H) F32. softplus(x) = log(1 + eˣ), taken as x above 20 like ggml.
  virtual void deltanet_gates(Tensor& alpha, Tensor& beta, const Tensor& dt_bias, const Tensor& a) {
    not_implemented("deltanet_gates");
  }
  // Causal depthwise convolution over time with kernel K, per segment of rb:
  //   out[t][c] = Σ_{j<K} w[c][j] · u[t−K+1+j][c],  then SiLU when `silu`,
  // where u is the segment's input history: the K−1 inputs held in conv_state slot src (oldest first),
  // followed by the x rows of the segment. x, out (n, C); w (C, K) F32 or F16 (ggml ssm_conv1d {K, C});
  // conv_state (n_slots, (K−1)·C) F32, slot layout [K−1][C], oldest input first. Writes the last K−1
  // inputs to slot dst and, for rows with a capture slot, the window as it stands after the row.
  virtual void ssm_conv(const Tensor& x, const Tensor& w, Tensor& conv_state, const RecurrentBatch& rb, bool silu,
                        Tensor& out) {
    not_implemented("ssm_conv");
  }
  // Gated delta rule, per segment of rb and per value head h (key/query head h % n_k_heads, tiled the way
  // ggml broadcasts). With S (d_k, d_v) the head's state, per row t in chain order:
  //   S ← exp(g_t)·S;  δ = β_t·(v_t − Sᵀk_t);  S ← S + k_t δᵀ;  o_t = scale · Sᵀq_t.
  // q, k (n, n_k_heads·d_k) (L2-normalised by the caller); v, out (n, n_v_heads·d_v); g, beta (n, n_v_heads);
  // state (n_slots, n_v_heads·d_k·d_v) F32, slot layout [head][d_k][d_v]. A row's outputs and the state
  // after it must not depend on how the history was cut into segments and steps (bit for bit): the
  // scheduler splits prompts by the room other sequences' rows leave, and greedy speculative decoding
  // must emit the tokens of plain decoding. Token-by-token forms have this by construction; a chunked
  // form (chunks counted from the segment start) does not.
  virtual void gated_delta_net(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                               Tensor& state, const RecurrentBatch& rb, int d_k, int d_v, float scale, Tensor& out) {
    not_implemented("gated_delta_net");
  }

  // ---- op profiling ----
  // A backend built with op profiling on (CUDA: CudaOptions::profile, PEREGRINE_CUDA_PROFILE=1) times every
  // op it runs on the device (CUDA events around it; graphs off, so each op is its own launch). This drains
  // what was timed since the last call: one entry per op and shape key, in no particular order. Empty when
  // profiling is off or the backend does not profile.
  struct OpTime {
    std::string key;    // op name plus what shapes its launch (e.g. "matmul Q4_K 4096x4096 n1")
    int64_t calls = 0;
    double ms = 0.0;    // device time between the events around the op, summed over the calls
  };
  virtual std::vector<OpTime> profile_take() { return {}; }
  // Seconds the host spent blocked on the device (a download or synchronize waiting for queued work) since
  // the last call, drained. A step's wall time less this is host work (and launch), the rest the device time
  // the host had to wait for: `peregrine bench` prints both, so a slow step says which side it is slow on.
  // 0 on backends that run ops on the calling thread.
  virtual double wait_take() { return 0.0; }

  // ---- step graphs ----
  // A device with a command queue may record the ops of a step once and replay them (CUDA graphs). Between
  // begin_graph() and end_graph() ops are recorded, not run, and alloc/free/upload/download throw;
  // replay_graph(id) runs the recording on the tensors' current contents (per-step inputs are uploaded
  // first). An op whose launch shape depends on host values must be recorded per distinct value: the
  // caller keys its recordings accordingly. abort_graph() ends a failed recording.
  virtual bool graphs_supported() const { return false; }
  // Forwards of at most this many rows are recorded and replayed (Model::forward keys a recording per row
  // count, KV bucket and tree/recurrent shape); larger ones run eagerly. 8 by default (decode micro-batches);
  // CUDA: CudaOptions::graph_max_rows, up to 64 so that speculative verify forwards (a chain of 8 + 1 rows, a
  // DDTree of 22-23) replay too instead of paying a launch per op.
  virtual int graph_max_rows() const { return 8; }
  virtual void begin_graph() { not_implemented("begin_graph"); }
  virtual int end_graph() { not_implemented("end_graph"); }
  virtual void abort_graph() {}
  virtual void replay_graph(int id) { not_implemented("replay_graph"); }
  virtual void drop_graph(int id) {}

 protected:
  [[noreturn]] void not_implemented(const char* op) const {
    throw Error(std::string(op) + " is not implemented on the " + name() + " backend");
  }
};

}  // namespace pg
