#include "gguf/synth_qwen35.h"

#include <cmath>

#include "core/error.h"

namespace pg::gguf {
namespace {

// Published configurations (HF config.json of Qwen/Qwen3.5-*, text_config): every 4th layer is full
// attention with 256-wide heads and 25% partial rotary (64 dims, M-RoPE sections [11, 11, 10, 0],
// base 1e7); linear-attention heads are 128 wide with a kernel-4 conv; vocabulary 248320 (padded).
Qwen35SynthConfig base(const char* arch, const char* name, const char* label) {
  Qwen35SynthConfig c;
  c.arch = arch;
  c.name = name;
  c.size_label = label;
  c.head_dim = 256;
  c.n_rot = 64;
  c.rope_sections[0] = 11;
  c.rope_sections[1] = 11;
  c.rope_sections[2] = 10;
  c.rope_sections[3] = 0;
  c.rope_base = 1e7;
  c.rms_eps = 1e-6;
  c.n_vocab = 248320;
  c.n_ctx = 262144;
  c.full_attention_interval = 4;
  c.ssm_conv_kernel = 4;
  c.ssm_state = 128;
  return c;
}

}  // namespace

std::vector<std::string> qwen35_synth_preset_names() { return {"qwen35-27b", "qwen35-9b", "qwen35-0.8b", "qwen35moe-35b-a3b"}; }

std::optional<Qwen35SynthConfig> qwen35_synth_preset(const std::string& name) {
  Qwen35SynthConfig c;
  if (name == "qwen35-27b") {
    // Also the shape of Qwen3.6-27B.
    c = base("qwen35", "Qwen3.5-27B", "27B");
    c.n_layer = 64;
    c.n_embd = 5120;
    c.n_ff = 17408;
    c.n_head = 24;
    c.n_head_kv = 4;
    c.ssm_groups = 16;
    c.ssm_dt_rank = 48;
  } else if (name == "qwen35-9b") {
    c = base("qwen35", "Qwen3.5-9B", "9B");
    c.n_layer = 32;
    c.n_embd = 4096;
    c.n_ff = 12288;
    c.n_head = 16;
    c.n_head_kv = 4;
    c.ssm_groups = 16;
    c.ssm_dt_rank = 32;
  } else if (name == "qwen35-0.8b") {
    c = base("qwen35", "Qwen3.5-0.8B", "0.8B");
    c.n_layer = 24;
    c.n_embd = 1024;
    c.n_ff = 3584;
    c.n_head = 8;
    c.n_head_kv = 2;
    c.ssm_groups = 16;
    c.ssm_dt_rank = 16;
    c.tied = true;
  } else if (name == "qwen35moe-35b-a3b") {
    // Also the shape of Qwen3.6-35B-A3B.
    c = base("qwen35moe", "Qwen3.5-35B-A3B", "35B-A3B");
    c.n_layer = 40;
    c.n_embd = 2048;
    c.n_ff = 512;  // the converter writes intermediate_size; llama.cpp reads the expert keys
    c.n_head = 16;
    c.n_head_kv = 2;
    c.ssm_groups = 16;
    c.ssm_dt_rank = 32;
    c.n_expert = 256;
    c.n_expert_used = 8;
    c.n_ff_exp = 512;
    c.n_ff_shexp = 512;
  } else {
    return std::nullopt;
  }
  return c;
}

void validate_qwen35_synth_config(const Qwen35SynthConfig& c) {
  auto need = [](bool ok, const std::string& what) { PG_CHECK(ok, "synth " + what); };
  need(c.arch == "qwen35" || c.arch == "qwen35moe", "architecture '" + c.arch + "' is not a Qwen3.5 hybrid");
  need(c.n_layer > 0 && c.n_embd > 0 && c.n_vocab > 0 && c.n_ctx > 0, "needs layers, embedding width, vocabulary and context");
  need(c.n_head > 0 && c.n_head_kv > 0 && c.n_head % c.n_head_kv == 0, "head counts are inconsistent");
  need(c.head_dim > 0 && c.n_rot > 0 && c.n_rot <= c.head_dim && c.n_rot % 2 == 0, "rotary dims must be even and ≤ head_dim");
  need(c.full_attention_interval > 0, "full_attention_interval must be positive");
  need(c.ssm_conv_kernel >= 2 && c.ssm_state > 0 && c.ssm_groups > 0 && c.ssm_dt_rank > 0, "needs the Gated DeltaNet sizes");
  need(c.ssm_dt_rank % c.ssm_groups == 0, "value heads (ssm_dt_rank) must be a multiple of key heads (ssm_groups)");
  if (c.arch == "qwen35moe") {
    need(c.n_expert > 0 && c.n_expert_used > 0 && c.n_expert_used <= c.n_expert && c.n_ff_exp > 0, "MoE sizes are inconsistent");
  } else {
    need(c.n_ff > 0 && c.n_expert == 0, "dense qwen35 needs n_ff and no experts");
  }
}

void qwen35_synth_metadata(Writer& w, const Qwen35SynthConfig& c) {
  validate_qwen35_synth_config(c);
  const std::string a = c.arch + ".";
  auto u32 = [&](const std::string& k, int64_t v) { w.set_u32(a + k, static_cast<uint32_t>(v)); };
  u32("block_count", c.n_layer);
  u32("context_length", c.n_ctx);
  u32("embedding_length", c.n_embd);
  u32("feed_forward_length", c.n_ff);
  u32("attention.head_count", c.n_head);
  u32("attention.head_count_kv", c.n_head_kv);
  u32("attention.key_length", c.head_dim);
  u32("attention.value_length", c.head_dim);
  w.set_f32(a + "rope.freq_base", static_cast<float>(c.rope_base));
  w.set_f32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_eps));
  u32("rope.dimension_count", c.n_rot);
  const int32_t sections[4] = {static_cast<int32_t>(c.rope_sections[0]), static_cast<int32_t>(c.rope_sections[1]),
                               static_cast<int32_t>(c.rope_sections[2]), static_cast<int32_t>(c.rope_sections[3])};
  w.set(a + "rope.dimension_sections", make_i32_array(sections));
  u32("ssm.conv_kernel", c.ssm_conv_kernel);
  u32("ssm.state_size", c.ssm_state);
  u32("ssm.group_count", c.ssm_groups);
  u32("ssm.time_step_rank", c.ssm_dt_rank);
  u32("ssm.inner_size", c.ssm_inner());
  // The converter writes both the per-layer list (from layer_types) and the interval.
  std::vector<Value> rec;
  for (int64_t il = 0; il < c.n_layer; ++il) rec.push_back(make_bool(c.recurrent(il)));
  w.set(a + "attention.recurrent_layers", make_array(ValueType::BOOL, std::move(rec)));
  u32("full_attention_interval", c.full_attention_interval);
  if (c.arch == "qwen35moe") {
    u32("expert_count", c.n_expert);
    u32("expert_used_count", c.n_expert_used);
    u32("expert_feed_forward_length", c.n_ff_exp);
    if (c.n_ff_shexp > 0) u32("expert_shared_feed_forward_length", c.n_ff_shexp);
  }
}

std::vector<Qwen35SynthTensor> qwen35_synth_tensors(const Qwen35SynthConfig& c) {
  validate_qwen35_synth_config(c);
  std::vector<Qwen35SynthTensor> t;
  auto sig = [](int64_t fan_in) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))); };
  // A weight matrix: N(0, 1/fan_in) keeps activations at unit scale through random layers.
  auto weight = [&](std::string name, std::vector<int64_t> shape, bool keep_f32 = false) {
    const float s = sig(shape[0]);
    t.push_back({std::move(name), std::move(shape), 0.0f, s, keep_f32});
  };
  auto vec = [&](std::string name, int64_t n, float mean, float sigma) {
    t.push_back({std::move(name), {n}, mean, sigma, true});
  };
  constexpr float kNormSpread = 0.05f;

  const int64_t key_dim = c.ssm_groups * c.ssm_state, inner = c.ssm_inner(), conv_dim = 2 * key_dim + inner;
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  weight("token_embd.weight", {c.n_embd, c.n_vocab});
  vec("output_norm.weight", c.n_embd, 1.0f, kNormSpread);
  if (!c.tied) weight("output.weight", {c.n_embd, c.n_vocab});
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    vec(p + "attn_norm.weight", c.n_embd, 1.0f, kNormSpread);
    vec(p + "post_attention_norm.weight", c.n_embd, 1.0f, kNormSpread);
    if (c.recurrent(il)) {
      weight(p + "attn_qkv.weight", {c.n_embd, conv_dim});
      weight(p + "attn_gate.weight", {c.n_embd, inner});
      // The conv kernel sums 4 taps: 1/sqrt(K) keeps its output near unit scale.
      t.push_back({p + "ssm_conv1d.weight", {c.ssm_conv_kernel, conv_dim}, 0.0f, sig(c.ssm_conv_kernel), true});
      vec(p + "ssm_dt.bias", c.ssm_dt_rank, 0.0f, 0.5f);
      // −exp(A_log) with A_log around log 4: clearly negative, so every head decays (8σ from zero).
      vec(p + "ssm_a", c.ssm_dt_rank, -4.0f, 0.5f);
      weight(p + "ssm_beta.weight", {c.n_embd, c.ssm_dt_rank});
      weight(p + "ssm_alpha.weight", {c.n_embd, c.ssm_dt_rank});
      vec(p + "ssm_norm.weight", c.ssm_state, 1.0f, kNormSpread);
      weight(p + "ssm_out.weight", {inner, c.n_embd});
    } else {
      weight(p + "attn_q.weight", {c.n_embd, 2 * q_dim});  // per head [query | output gate]
      weight(p + "attn_k.weight", {c.n_embd, kv_dim});
      weight(p + "attn_v.weight", {c.n_embd, kv_dim});
      weight(p + "attn_output.weight", {q_dim, c.n_embd});
      vec(p + "attn_q_norm.weight", c.head_dim, 1.0f, kNormSpread);
      vec(p + "attn_k_norm.weight", c.head_dim, 1.0f, kNormSpread);
    }
    if (c.arch == "qwen35moe") {
      weight(p + "ffn_gate_inp.weight", {c.n_embd, c.n_expert}, /*keep_f32=*/true);
      if (c.fused_gate_up_exps) {
        weight(p + "ffn_gate_up_exps.weight", {c.n_embd, 2 * c.n_ff_exp, c.n_expert});
      } else {
        weight(p + "ffn_gate_exps.weight", {c.n_embd, c.n_ff_exp, c.n_expert});
        weight(p + "ffn_up_exps.weight", {c.n_embd, c.n_ff_exp, c.n_expert});
      }
      weight(p + "ffn_down_exps.weight", {c.n_ff_exp, c.n_embd, c.n_expert});
      if (c.n_ff_shexp > 0) {
        // Written (hidden, 1) by the converter; llama.cpp declares it 1-D and keeps it F32.
        weight(p + "ffn_gate_inp_shexp.weight", {c.n_embd, 1}, /*keep_f32=*/true);
        weight(p + "ffn_gate_shexp.weight", {c.n_embd, c.n_ff_shexp});
        weight(p + "ffn_up_shexp.weight", {c.n_embd, c.n_ff_shexp});
        weight(p + "ffn_down_shexp.weight", {c.n_ff_shexp, c.n_embd});
      }
    } else {
      weight(p + "ffn_gate.weight", {c.n_embd, c.n_ff});
      weight(p + "ffn_up.weight", {c.n_embd, c.n_ff});
      weight(p + "ffn_down.weight", {c.n_ff, c.n_embd});
    }
  }
  return t;
}

}  // namespace pg::gguf
