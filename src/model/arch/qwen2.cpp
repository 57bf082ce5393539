// Qwen2 / Qwen2.5: Llama blocks with q/k/v biases and NEOX-style RoPE.
#include "model/arch.h"

namespace pg {

static void read_config(const ArchMeta& m, ModelConfig& c) {
  read_common_config(m, c);
  c.rope_style = RopeStyle::Neox;
  c.qkv_bias = true;
}

static void bind(Binder& b, const ModelConfig& c, ModelWeights& w) {
  bind_embeddings(b, c, w);
  for (int il = 0; il < c.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    b.req(l.attn_norm, blk(il, "attn_norm"), {c.n_embd});
    bind_attention(b, c, il, l);
    b.req(l.ffn_norm, blk(il, "ffn_norm"), {c.n_embd});
    bind_dense_ffn(b, c, il, l);
  }
}

extern const ArchDef kArchQwen2 = {"qwen2", read_config, bind};

}  // namespace pg
