// Gemma 3: interleaved sliding-window (local) and global attention layers, embeddings scaled by
// sqrt(n_embd), q/k norms, RMSNorm after attention and FFN outputs, GELU-gated FFN, tied output.
#include <cmath>

#include "core/error.h"
#include "model/arch.h"

namespace pg {

static void read_config(const ArchMeta& m, ModelConfig& c) {
  read_common_config(m, c);
  c.rope_style = RopeStyle::Neox;
  c.qk_norm = true;
  c.post_norms = true;
  c.ffn_act = Activation::GeluTanh;
  c.embd_scale = std::sqrt(static_cast<float>(c.n_embd));
  c.sliding_window = m.i("attention.sliding_window", 0);
  // Real Gemma 3 files do not write the pattern key: llama.cpp then uses 6 (5 local : 1 global).
  const int pattern = m.i("attention.sliding_window_pattern", 6);
  PG_CHECK(pattern > 0, "invalid sliding_window_pattern");
  for (int il = 0; il < c.n_layer; ++il) c.layer_swa[static_cast<size_t>(il)] = c.sliding_window > 0 && il % pattern < pattern - 1;
  c.rope_base_swa = m.f("rope.freq_base_swa", 10000.0f);
  // Gemma 3 27B scales queries by 1/sqrt(n_embd/n_head) (query_pre_attn_scalar); the others by 1/sqrt(head_dim).
  if (c.n_layer == 62) c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.n_embd / c.n_head));
}

static void bind(Binder& b, const ModelConfig& c, ModelWeights& w) {
  bind_embeddings(b, c, w);
  for (int il = 0; il < c.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    b.req(l.attn_norm, blk(il, "attn_norm"), {c.n_embd});
    bind_attention(b, c, il, l);
    b.req(l.attn_post_norm, blk(il, "post_attention_norm"), {c.n_embd});
    b.req(l.ffn_norm, blk(il, "ffn_norm"), {c.n_embd});
    bind_dense_ffn(b, c, il, l);
    b.req(l.ffn_post_norm, blk(il, "post_ffw_norm"), {c.n_embd});
  }
}

extern const ArchDef kArchGemma3 = {"gemma3", read_config, bind};

}  // namespace pg
