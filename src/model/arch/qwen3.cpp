// Qwen3 dense and Qwen3-MoE: per-head q/k RMSNorm before NEOX RoPE; the MoE variant routes each
// token to the top-k of n_expert SwiGLU experts (softmax gating, renormalised weights).
#include "core/error.h"
#include "model/arch.h"

namespace pg {

static void read_config(const ArchMeta& m, ModelConfig& c) {
  read_common_config(m, c);
  c.rope_style = RopeStyle::Neox;
  c.qk_norm = true;
}

static void read_config_moe(const ArchMeta& m, ModelConfig& c) {
  read_config(m, c);
  c.n_expert = m.i("expert_count");
  c.n_expert_used = m.i("expert_used_count");
  PG_CHECK(c.n_expert > 0 && c.n_expert_used > 0 && c.n_expert_used <= c.n_expert, "invalid expert counts");
  c.n_ff_exp = m.i("expert_feed_forward_length", c.n_ff / c.n_expert_used);
  c.expert_norm_topk = true;  // llama.cpp's qwen3moe graph always renormalises
}

static void bind(Binder& b, const ModelConfig& c, ModelWeights& w) {
  bind_embeddings(b, c, w);
  for (int il = 0; il < c.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    b.req(l.attn_norm, blk(il, "attn_norm"), {c.n_embd});
    bind_attention(b, c, il, l);
    b.req(l.ffn_norm, blk(il, "ffn_norm"), {c.n_embd});
    if (c.is_moe()) bind_moe_ffn(b, c, il, l);
    else bind_dense_ffn(b, c, il, l);
  }
}

extern const ArchDef kArchQwen3 = {"qwen3", read_config, bind};
extern const ArchDef kArchQwen3Moe = {"qwen3moe", read_config_moe, bind};

}  // namespace pg
