#include "model/arch.h"

#include "core/error.h"

namespace pg {

extern const ArchDef kArchLlama, kArchQwen2, kArchQwen3, kArchQwen3Moe, kArchGemma3, kArchQwen35, kArchQwen35Moe;

namespace {
const ArchDef* const kArchs[] = {&kArchLlama,  &kArchQwen2,  &kArchQwen3,    &kArchQwen3Moe,
                                 &kArchGemma3, &kArchQwen35, &kArchQwen35Moe};
}

// Architectures registered by other translation units (e.g. hybrid models) append here.
std::vector<const ArchDef*>& extra_archs() {
  static std::vector<const ArchDef*> v;
  return v;
}

const ArchDef* find_arch(const std::string& name) {
  for (const auto* a : kArchs)
    if (name == a->name) return a;
  for (const auto* a : extra_archs())
    if (name == a->name) return a;
  return nullptr;
}

std::vector<std::string> supported_archs() {
  std::vector<std::string> v;
  for (const auto* a : kArchs) v.emplace_back(a->name);
  for (const auto* a : extra_archs()) v.emplace_back(a->name);
  return v;
}

int ArchMeta::i(const std::string& k) const {
  const int64_t v = f_.get_int(key(k));
  PG_CHECK(v >= 0 && v <= (1LL << 31) - 1, f_.path() + ": metadata " + key(k) + " = " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}
int ArchMeta::i(const std::string& k, int def) const { return has(k) ? i(k) : def; }
float ArchMeta::f(const std::string& k) const { return static_cast<float>(f_.get_float(key(k))); }
float ArchMeta::f(const std::string& k, float def) const { return has(k) ? f(k) : def; }
bool ArchMeta::b(const std::string& k, bool def) const { return has(k) ? f_.get_bool(key(k)) : def; }
std::vector<int64_t> ArchMeta::ints(const std::string& k) const { return f_.get_int_array(key(k)); }

std::string blk(int il, const std::string& name, const char* suffix) {
  return "blk." + std::to_string(il) + "." + name + "." + suffix;
}

static std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "{";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "}";
}

bool Binder::opt(Tensor& slot, const std::string& name, std::vector<int64_t> shape) {
  const gguf::TensorInfo* t = f_.find_tensor(name);
  if (!t) return false;
  // Trailing 1-dims are equivalent ({256} == {256, 1}), as llama.cpp accepts.
  std::vector<int64_t> have(t->ne, t->ne + t->n_dims);
  while (have.size() > 1 && have.back() == 1) have.pop_back();
  while (shape.size() > 1 && shape.back() == 1) shape.pop_back();
  PG_CHECK(have == shape, f_.path() + ": tensor '" + name + "' has shape " + shape_str(have) + ", expected " + shape_str(shape));
  PG_CHECK(traits(t->type).supported, f_.path() + ": tensor '" + name + "' has type " + std::string(dtype_name(t->type)) +
                                          ", which this engine does not support yet");
  used_.insert(name);
  pending_.push_back({&slot, t});
  return true;
}

void Binder::req(Tensor& slot, const std::string& name, std::vector<int64_t> shape) {
  PG_CHECK(opt(slot, name, std::move(shape)), f_.path() + ": missing tensor '" + name + "'");
}

void read_common_config(const ArchMeta& m, ModelConfig& c) {
  c.n_embd = m.i("embedding_length");
  c.n_layer = m.i("block_count");
  c.n_head = m.i("attention.head_count");
  c.n_head_kv = m.i("attention.head_count_kv", c.n_head);
  PG_CHECK(c.n_layer > 0 && c.n_layer <= 1024, "block_count " + std::to_string(c.n_layer) + " is out of range");
  PG_CHECK(c.n_embd > 0 && c.n_head > 0 && c.n_head_kv > 0 && c.n_head % c.n_head_kv == 0,
           "invalid head counts " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv));
  c.head_dim = m.i("attention.key_length", c.n_embd / c.n_head);
  c.head_dim_v = m.i("attention.value_length", c.head_dim);
  c.n_ff = m.has("feed_forward_length") && m.file().get(m.key("feed_forward_length")).is_integer() ? m.i("feed_forward_length") : 0;
  c.n_ctx_train = m.i("context_length", 4096);
  c.rms_eps = m.f("attention.layer_norm_rms_epsilon", 1e-5f);
  c.rope_base = m.f("rope.freq_base", 10000.0f);
  c.n_rot = m.i("rope.dimension_count", c.head_dim);
  PG_CHECK(c.n_rot > 0 && c.n_rot <= c.head_dim && c.n_rot % 2 == 0, "invalid rope.dimension_count " + std::to_string(c.n_rot));
  c.layer_kind.assign(static_cast<size_t>(c.n_layer), LayerKind::Attention);
  c.layer_swa.assign(static_cast<size_t>(c.n_layer), false);
  c.final_logit_softcap = m.f("final_logit_softcapping", 0.0f);
  c.attn_logit_softcap = m.f("attn_logit_softcapping", 0.0f);
  if (m.file().has(m.key("rope.scaling.type"))) {
    const std::string t = m.file().get_string(m.key("rope.scaling.type"));
    PG_CHECK(t == "none", "rope scaling type '" + t + "' is not supported yet");
  }
}

void bind_embeddings(Binder& b, const ModelConfig& c, ModelWeights& w) {
  const gguf::TensorInfo* te = b.file().find_tensor("token_embd.weight");
  PG_CHECK(te != nullptr, b.file().path() + ": missing tensor 'token_embd.weight'");
  b.req(w.tok_embd, "token_embd.weight", {c.n_embd, c.n_vocab});
  b.req(w.output_norm, "output_norm.weight", {c.n_embd});
  b.opt(w.output, "output.weight", {c.n_embd, c.n_vocab});
}

void bind_attention(Binder& b, const ModelConfig& c, int il, LayerWeights& l) {
  const int64_t q_out = static_cast<int64_t>(c.n_head) * c.head_dim * (c.attn_output_gate ? 2 : 1);
  const int64_t kv_out = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  const int64_t v_out = static_cast<int64_t>(c.n_head_kv) * c.head_dim_v;
  b.req(l.wq, blk(il, "attn_q"), {c.n_embd, q_out});
  b.req(l.wk, blk(il, "attn_k"), {c.n_embd, kv_out});
  b.req(l.wv, blk(il, "attn_v"), {c.n_embd, v_out});
  b.req(l.wo, blk(il, "attn_output"), {static_cast<int64_t>(c.n_head) * c.head_dim_v, c.n_embd});
  if (c.qkv_bias) {
    b.req(l.bq, blk(il, "attn_q", "bias"), {q_out});
    b.req(l.bk, blk(il, "attn_k", "bias"), {kv_out});
    b.req(l.bv, blk(il, "attn_v", "bias"), {v_out});
  } else {
    b.opt(l.bq, blk(il, "attn_q", "bias"), {q_out});
    b.opt(l.bk, blk(il, "attn_k", "bias"), {kv_out});
    b.opt(l.bv, blk(il, "attn_v", "bias"), {v_out});
  }
  if (c.qk_norm) {
    b.req(l.q_norm, blk(il, "attn_q_norm"), {c.head_dim});
    b.req(l.k_norm, blk(il, "attn_k_norm"), {c.head_dim});
  }
}

void bind_dense_ffn(Binder& b, const ModelConfig& c, int il, LayerWeights& l) {
  b.req(l.ffn_gate, blk(il, "ffn_gate"), {c.n_embd, c.n_ff});
  b.req(l.ffn_up, blk(il, "ffn_up"), {c.n_embd, c.n_ff});
  b.req(l.ffn_down, blk(il, "ffn_down"), {c.n_ff, c.n_embd});
}

void bind_moe_ffn(Binder& b, const ModelConfig& c, int il, LayerWeights& l) {
  b.req(l.router, blk(il, "ffn_gate_inp"), {c.n_embd, c.n_expert});
  b.req(l.gate_exps, blk(il, "ffn_gate_exps"), {c.n_embd, c.n_ff_exp, c.n_expert});
  b.req(l.up_exps, blk(il, "ffn_up_exps"), {c.n_embd, c.n_ff_exp, c.n_expert});
  b.req(l.down_exps, blk(il, "ffn_down_exps"), {c.n_ff_exp, c.n_embd, c.n_expert});
  if (c.n_ff_shexp > 0) {
    b.req(l.gate_shexp, blk(il, "ffn_gate_shexp"), {c.n_embd, c.n_ff_shexp});
    b.req(l.up_shexp, blk(il, "ffn_up_shexp"), {c.n_embd, c.n_ff_shexp});
    b.req(l.down_shexp, blk(il, "ffn_down_shexp"), {c.n_ff_shexp, c.n_embd});
    b.opt(l.router_shexp, blk(il, "ffn_gate_inp_shexp"), {c.n_embd});
  }
}

}  // namespace pg
