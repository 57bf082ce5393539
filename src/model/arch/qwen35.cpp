// Qwen3.5 / Qwen3.6 hybrids ("qwen35" dense, "qwen35moe" MoE): three Gated DeltaNet (linear attention)
// layers for every full-attention layer. Full-attention layers carry a per-head sigmoid output gate in
// the q projection ([q | gate] per head), per-head q/k RMSNorm and partial rotary embedding (IMROPE
// with M-RoPE sections, which for text — equal t/h/w positions — is NEOX over the first n_rot dims).
// Every layer's FFN input norm is called post_attention_norm in the file; it is the ffn_norm slot here.
// The MoE variant always uses softmax routing with top-k renormalisation (llama.cpp hard-wires it for
// this architecture and the converter writes no key saying so) plus a shared expert scaled per token
// by sigmoid(ffn_gate_inp_shexp·h). Multi-token-prediction (nextn) blocks at the end of the file are
// not part of the main forward.
#include "core/error.h"
#include "model/arch.h"

namespace pg {

static void read_config(const ArchMeta& m, ModelConfig& c) {
  read_common_config(m, c);
  c.rope_style = RopeStyle::Neox;
  c.qk_norm = true;
  c.attn_output_gate = true;

  // Trailing nextn (MTP) blocks are counted in block_count.
  const int nextn = m.i("nextn_predict_layers", 0);
  PG_CHECK(nextn >= 0 && nextn < c.n_layer, "nextn_predict_layers " + std::to_string(nextn) + " is out of range");
  if (nextn > 0) {
    c.n_layer -= nextn;
    c.layer_swa.assign(static_cast<size_t>(c.n_layer), false);
  }

  if (m.has("rope.dimension_sections")) {
    // Only text positions exist here (t = h = w), so the sections do not change the rotation; check them.
    const auto sec = m.ints("rope.dimension_sections");
    int64_t sum = 0;
    for (int64_t s : sec) {
      PG_CHECK(s >= 0, "rope.dimension_sections has a negative entry");
      sum += s;
    }
    PG_CHECK(sum <= c.n_rot / 2 || c.n_rot == c.head_dim, "rope.dimension_sections cover more than rope.dimension_count");
  }

  c.ssm_conv_kernel = m.i("ssm.conv_kernel");
  c.ssm_state = m.i("ssm.state_size");
  c.ssm_groups = m.i("ssm.group_count");
  c.ssm_dt_rank = m.i("ssm.time_step_rank");
  c.ssm_inner = m.i("ssm.inner_size");
  PG_CHECK(c.ssm_conv_kernel >= 2 && c.ssm_conv_kernel <= 64,
           "ssm.conv_kernel " + std::to_string(c.ssm_conv_kernel) + " is out of range");
  PG_CHECK(c.ssm_state > 0 && c.ssm_groups > 0 && c.ssm_dt_rank > 0, "invalid ssm head counts");
  PG_CHECK(c.ssm_dt_rank % c.ssm_groups == 0, "ssm.time_step_rank (value heads) " + std::to_string(c.ssm_dt_rank) +
                                                  " is not a multiple of ssm.group_count (key heads)");
  PG_CHECK(c.ssm_inner == c.ssm_dt_rank * c.ssm_state,
           "ssm.inner_size " + std::to_string(c.ssm_inner) + " != time_step_rank × state_size (head_v_dim = head_k_dim)");

  // Which layers are linear attention: an explicit per-layer list, else every `interval`-th is full.
  c.layer_kind.assign(static_cast<size_t>(c.n_layer), LayerKind::Attention);
  if (m.has("attention.recurrent_layers")) {
    const gguf::Value& v = m.file().get(m.key("attention.recurrent_layers"));
    if (v.type == gguf::ValueType::ARRAY) {
      const auto& items = v.as_array().items;
      PG_CHECK(items.size() >= static_cast<size_t>(c.n_layer), "attention.recurrent_layers has fewer entries than layers");
      for (int il = 0; il < c.n_layer; ++il)
        if (items[static_cast<size_t>(il)].as_int()) c.layer_kind[static_cast<size_t>(il)] = LayerKind::GatedDeltaNet;
    } else if (v.as_int()) {
      c.layer_kind.assign(static_cast<size_t>(c.n_layer), LayerKind::GatedDeltaNet);
    }
  } else {
    const int interval = m.i("full_attention_interval", 4);
    PG_CHECK(interval > 0, "full_attention_interval must be positive");
    for (int il = 0; il < c.n_layer; ++il)
      if ((il + 1) % interval != 0) c.layer_kind[static_cast<size_t>(il)] = LayerKind::GatedDeltaNet;
  }
}

static void read_config_moe(const ArchMeta& m, ModelConfig& c) {
  read_config(m, c);
  c.n_expert = m.i("expert_count");
  c.n_expert_used = m.i("expert_used_count");
  PG_CHECK(c.n_expert > 0 && c.n_expert_used > 0 && c.n_expert_used <= c.n_expert, "invalid expert counts");
  // expert_feed_forward_length may be per layer; only uniform widths are supported.
  auto width = [&](const char* key, int def) {
    if (!m.has(key)) return def;
    const gguf::Value& v = m.file().get(m.key(key));
    if (v.type != gguf::ValueType::ARRAY) return m.i(key);
    const auto w = m.ints(key);
    PG_CHECK(!w.empty(), std::string(key) + " is an empty array");
    for (int64_t x : w) PG_CHECK(x == w[0], std::string("per-layer ") + key + " values differ, which is not supported");
    PG_CHECK(w[0] > 0 && w[0] < (1 << 30), std::string(key) + " is out of range");
    return static_cast<int>(w[0]);
  };
  c.n_ff_exp = width("expert_feed_forward_length", c.n_ff / c.n_expert_used);
  c.n_ff_shexp = width("expert_shared_feed_forward_length", c.n_ff);
  PG_CHECK(c.n_ff_exp > 0, "expert_feed_forward_length is missing and feed_forward_length does not give it");
  const int gating = m.i("expert_gating_func", 1);
  if (gating == 0 || gating == 1) {
    c.expert_gating = ExpertGating::Softmax;
  } else if (gating == 2) {
    c.expert_gating = ExpertGating::Sigmoid;
  } else {
    throw Error("expert_gating_func " + std::to_string(gating) + " is not supported (1 = softmax, 2 = sigmoid)");
  }
  c.expert_norm_topk = m.b("expert_weights_norm", true);
  c.expert_weights_scale = m.f("expert_weights_scale", 0.0f);
}

static void bind_deltanet(Binder& b, const ModelConfig& c, int il, LayerWeights& l) {
  const int64_t key_dim = static_cast<int64_t>(c.ssm_groups) * c.ssm_state;
  const int64_t conv_dim = 2 * key_dim + c.ssm_inner;
  b.req(l.ssm_qkv, blk(il, "attn_qkv"), {c.n_embd, conv_dim});
  b.req(l.ssm_z, blk(il, "attn_gate"), {c.n_embd, c.ssm_inner});
  b.req(l.ssm_conv1d, blk(il, "ssm_conv1d"), {c.ssm_conv_kernel, conv_dim});
  b.req(l.ssm_dt_bias, blk(il, "ssm_dt", "bias"), {c.ssm_dt_rank});
  b.req(l.ssm_a, "blk." + std::to_string(il) + ".ssm_a", {c.ssm_dt_rank});
  b.req(l.ssm_beta, blk(il, "ssm_beta"), {c.n_embd, c.ssm_dt_rank});
  b.req(l.ssm_alpha, blk(il, "ssm_alpha"), {c.n_embd, c.ssm_dt_rank});
  b.req(l.ssm_norm, blk(il, "ssm_norm"), {c.ssm_state});
  b.req(l.ssm_out, blk(il, "ssm_out"), {c.ssm_inner, c.n_embd});
}

static void bind_moe(Binder& b, const ModelConfig& c, int il, LayerWeights& l) {
  b.req(l.router, blk(il, "ffn_gate_inp"), {c.n_embd, c.n_expert});
  // Fused [gate | up] experts where the file has them (up_exps then stays empty), else separate tensors.
  if (!b.opt(l.gate_exps, blk(il, "ffn_gate_up_exps"), {c.n_embd, 2 * static_cast<int64_t>(c.n_ff_exp), c.n_expert})) {
    b.req(l.gate_exps, blk(il, "ffn_gate_exps"), {c.n_embd, c.n_ff_exp, c.n_expert});
    b.req(l.up_exps, blk(il, "ffn_up_exps"), {c.n_embd, c.n_ff_exp, c.n_expert});
  }
  b.req(l.down_exps, blk(il, "ffn_down_exps"), {c.n_ff_exp, c.n_embd, c.n_expert});
  if (c.n_ff_shexp > 0) {
    b.req(l.gate_shexp, blk(il, "ffn_gate_shexp"), {c.n_embd, c.n_ff_shexp});
    b.req(l.up_shexp, blk(il, "ffn_up_shexp"), {c.n_embd, c.n_ff_shexp});
    b.req(l.down_shexp, blk(il, "ffn_down_shexp"), {c.n_ff_shexp, c.n_embd});
    b.req(l.router_shexp, blk(il, "ffn_gate_inp_shexp"), {c.n_embd});
  }
}

static void bind(Binder& b, const ModelConfig& c, ModelWeights& w) {
  bind_embeddings(b, c, w);
  for (int il = 0; il < c.n_layer; ++il) {
    auto& l = w.layers[static_cast<size_t>(il)];
    b.req(l.attn_norm, blk(il, "attn_norm"), {c.n_embd});
    if (c.layer_kind[static_cast<size_t>(il)] == LayerKind::GatedDeltaNet) {
      bind_deltanet(b, c, il, l);
    } else {
      bind_attention(b, c, il, l);
    }
    b.req(l.ffn_norm, blk(il, "post_attention_norm"), {c.n_embd});
    if (c.is_moe()) {
      bind_moe(b, c, il, l);
    } else {
      bind_dense_ffn(b, c, il, l);
    }
  }
}

extern const ArchDef kArchQwen35 = {"qwen35", read_config, bind};
extern const ArchDef kArchQwen35Moe = {"qwen35moe", read_config_moe, bind};

}  // namespace pg
