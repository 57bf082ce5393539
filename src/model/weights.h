// Canonical weight slots. Architecture files bind GGUF tensor names to these; the forward only
// knows the slots. An invalid (null) Tensor means the slot is absent for this architecture/layer.
#pragma once
#include <vector>

#include "backend/tensor.h"

namespace pg {

struct LayerWeights {
  Tensor attn_norm;  // (n_embd)
  // attention
  Tensor wq;               // (n_head*head_dim [*2 with output gate], n_embd)
  Tensor wk, wv;           // (n_head_kv*head_dim, n_embd)
  Tensor wo;               // (n_embd, n_head*head_dim)
  Tensor bq, bk, bv;       // biases (qwen2)
  Tensor q_norm, k_norm;   // (head_dim) per-head RMSNorm
  Tensor attn_post_norm;   // (n_embd) gemma
  // feed-forward
  Tensor ffn_norm;  // (n_embd)
  Tensor ffn_gate, ffn_up;  // (n_ff, n_embd)
  Tensor ffn_down;          // (n_embd, n_ff)
  Tensor ffn_post_norm;     // (n_embd) gemma
  // mixture of experts
  Tensor router;                        // (n_expert, n_embd)
  Tensor gate_exps, up_exps;            // (n_expert, n_ff_exp, n_embd)
  Tensor down_exps;                     // (n_expert, n_embd, n_ff_exp)
  Tensor gate_shexp, up_shexp;          // (n_ff_shexp, n_embd)
  Tensor down_shexp;                    // (n_embd, n_ff_shexp)
  Tensor router_shexp;                  // (1, n_embd) shared-expert gate
  // Gated DeltaNet
  Tensor ssm_qkv;      // (2*groups*state + inner, n_embd)  "attn_qkv"
  Tensor ssm_z;        // (inner, n_embd)                   "attn_gate"
  Tensor ssm_conv1d;   // (channels, kernel)
  Tensor ssm_dt_bias;  // (dt_rank)
  Tensor ssm_a;        // (dt_rank)
  Tensor ssm_beta;     // (dt_rank, n_embd)
  Tensor ssm_alpha;    // (dt_rank, n_embd)
  Tensor ssm_norm;     // (state)
  Tensor ssm_out;      // (n_embd, inner)
};

struct ModelWeights {
  Tensor tok_embd;     // (n_vocab, n_embd)
  Tensor output_norm;  // (n_embd)
  Tensor output;       // (n_vocab, n_embd); = tok_embd when tied
  std::vector<LayerWeights> layers;
};

}  // namespace pg
