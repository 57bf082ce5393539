// The canonical description of a model: every architecture's hyperparameters land here, so the
// forward reads one structure whatever the GGUF file called things.
#pragma once
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace pg {

enum class LayerKind { Attention, GatedDeltaNet };

struct ModelConfig {
  std::string arch;  // GGUF general.architecture
  std::string name;  // general.name, for display
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;    // key/query head size
  int head_dim_v = 0;  // value head size
  int n_ff = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;

  // rotary embedding
  int n_rot = 0;
  float rope_base = 10000.0f;
  float rope_base_swa = 10000.0f;  // local (sliding-window) layers
  RopeStyle rope_style = RopeStyle::Norm;

  // attention features
  float attn_scale = 0.0f;  // q·k scale; 0 = 1/sqrt(head_dim)
  bool qk_norm = false;     // per-head RMSNorm of q and k before RoPE
  bool qkv_bias = false;
  bool attn_output_gate = false;  // qwen35: q projection carries a per-head sigmoid gate
  int sliding_window = 0;
  std::vector<bool> layer_swa;  // (n_layer) true: sliding-window layer
  float attn_logit_softcap = 0.0f;

  // block structure
  std::vector<LayerKind> layer_kind;  // (n_layer)
  bool post_norms = false;            // gemma: RMSNorm on attention and FFN outputs before the residual add
  float embd_scale = 0.0f;            // 0 = none; gemma: sqrt(n_embd)
  Activation ffn_act = Activation::Silu;
  bool tied_embeddings = false;
  float final_logit_softcap = 0.0f;

  // mixture of experts
  int n_expert = 0;
  int n_expert_used = 0;
  int n_ff_exp = 0;
  int n_ff_shexp = 0;  // shared expert width (0 = none)
  ExpertGating expert_gating = ExpertGating::Softmax;
  bool expert_norm_topk = true;
  float expert_weights_scale = 0.0f;  // 0 = none

  // Gated DeltaNet (linear attention) layers
  int ssm_conv_kernel = 0;
  int ssm_state = 0;      // head_k_dim = head_v_dim
  int ssm_groups = 0;     // number of key/query heads
  int ssm_dt_rank = 0;    // number of value heads
  int ssm_inner = 0;      // value heads × head_v_dim

  bool is_moe() const { return n_expert > 0; }
  bool has_recurrent() const {
    for (auto k : layer_kind)
      if (k == LayerKind::GatedDeltaNet) return true;
    return false;
  }
  int n_attention_layers() const {
    int n = 0;
    for (auto k : layer_kind) n += k == LayerKind::Attention;
    return n;
  }
  float kq_scale() const { return attn_scale != 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }
};

}  // namespace pg
