// Llama 2/3 and derivatives: pre-norm blocks, GQA, RoPE on adjacent pairs, SwiGLU, optional output.
#include "model/arch.h"

namespace pg {

static void read_config(const ArchMeta& m, ModelConfig& c) {
  read_common_config(m, c);
  c.rope_style = RopeStyle::Norm;
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

extern const ArchDef kArchLlama = {"llama", read_config, bind};

}  // namespace pg
