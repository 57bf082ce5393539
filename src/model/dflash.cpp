// DFlash draft: loading (both published layouts) and the forward (linear ops on the target's backend,
// attention over [context K/V ; block K/V] on the host — the drafter owns the context cache).
#include "model/dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "kv/paged_kv_cache.h"
#include "model/model.h"

namespace pg {

namespace {

const char* const kLucebox[] = {"dflash-draft", "qwen35-dflash-draft", "gemma4-dflash-draft"};

std::string shape_str(const int64_t* ne, int nd) {
  std::string r = "{";
  for (int i = 0; i < nd; ++i) r += (i ? ", " : "") + std::to_string(ne[i]);
  return r + "}";
}

int meta_int(const gguf::File& f, const std::string& key, int def, bool required = false) {
  const auto v = f.get_int_opt(key);
  if (!v) {
    PG_CHECK(!required, f.path() + ": DFlash draft has no metadata '" + key + "'");
    return def;
  }
  PG_CHECK(*v >= 0 && *v <= (1LL << 30), f.path() + ": metadata " + key + " = " + std::to_string(*v) + " is out of range");
  return static_cast<int>(*v);
}

float meta_float(const gguf::File& f, const std::string& key, float def) {
  const auto v = f.get_float_opt(key);
  return v ? static_cast<float>(*v) : def;
}

// Metadata that may be stored as a bool or as a "true"/"false" string (llama.cpp reads it as text).
bool meta_flag(const gguf::File& f, const std::string& key) {
  if (!f.has(key)) return false;
  if (auto b = f.get_bool_opt(key)) return *b;
  if (auto s = f.get_string_opt(key)) return *s == "true";
  return false;
}

}  // namespace

bool is_dflash_arch(const std::string& arch) {
  if (arch == "dflash") return true;
  for (const char* a : kLucebox)
    if (arch == a) return true;
  return false;
}

DFlashConfig read_dflash_config(const gguf::File& f) {
  DFlashConfig c;
  c.arch = f.architecture();
  PG_CHECK(is_dflash_arch(c.arch), f.path() + ": architecture '" + c.arch + "' is not a DFlash draft (dflash, dflash-draft, qwen35-dflash-draft)");
  c.name = f.get_string_opt("general.name").value_or(c.arch);
  const std::string a = c.arch + ".";
  c.llama_cpp_layout = c.arch == "dflash";
  c.n_embd = meta_int(f, a + "embedding_length", 0, true);
  c.n_layer = meta_int(f, a + "block_count", 0, true);
  c.n_head = meta_int(f, a + "attention.head_count", 0, true);
  c.n_head_kv = meta_int(f, a + "attention.head_count_kv", c.n_head);
  PG_CHECK(c.n_embd > 0 && c.n_layer > 0 && c.n_layer <= 1024 && c.n_head > 0 && c.n_head_kv > 0 && c.n_head % c.n_head_kv == 0,
           f.path() + ": DFlash draft has inconsistent sizes (embedding " + std::to_string(c.n_embd) + ", layers " +
               std::to_string(c.n_layer) + ", heads " + std::to_string(c.n_head) + "/" + std::to_string(c.n_head_kv) + ")");
  c.head_dim = meta_int(f, a + "attention.key_length", c.n_embd / c.n_head);
  PG_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0 && c.head_dim <= 1024, f.path() + ": DFlash draft head size " + std::to_string(c.head_dim) + " is not usable");
  PG_CHECK(meta_int(f, a + "attention.value_length", c.head_dim) == c.head_dim, f.path() + ": DFlash drafts with a value size other than the key size are not supported");
  c.n_ff = meta_int(f, a + "feed_forward_length", 0, true);
  c.rms_eps = meta_float(f, a + "attention.layer_norm_rms_epsilon", 1e-6f);
  c.rope_base = meta_float(f, a + "rope.freq_base", 1e6f);
  c.n_ctx_train = meta_int(f, a + "context_length", 0);
  const std::string dk = c.llama_cpp_layout ? a : a + "dflash.";
  c.block_size = meta_int(f, dk + "block_size", 16);
  PG_CHECK(c.block_size >= 2 && c.block_size <= 64, f.path() + ": DFlash block size " + std::to_string(c.block_size) + " is out of range [2, 64]");
  // Layer ids.
  if (c.llama_cpp_layout) {
    PG_CHECK(f.has(a + "target_layers"), f.path() + ": DFlash draft requires '" + a + "target_layers' (the target layers it reads)");
    for (int64_t v : f.get_int_array(a + "target_layers")) {
      PG_CHECK(v >= 1, f.path() + ": " + a + "target_layers holds " + std::to_string(v) + " (llama.cpp counts layer inputs from 1)");
      c.target_layers.push_back(static_cast<int>(v - 1));
    }
  } else if (f.has(dk + "target_layer_ids")) {
    for (int64_t v : f.get_int_array(dk + "target_layer_ids")) {
      PG_CHECK(v >= 0, f.path() + ": " + dk + "target_layer_ids holds a negative id");
      c.target_layers.push_back(static_cast<int>(v));
    }
  }
  // Mask token.
  if (auto m = f.get_int_opt("tokenizer.ggml.mask_token_id")) c.mask_token = static_cast<int32_t>(*m);
  else if (auto m2 = f.get_int_opt(dk + "mask_token_id")) c.mask_token = static_cast<int32_t>(*m2);
  // Tensors.
  auto pick = [&](std::initializer_list<const char*> names) -> std::string {
    for (const char* n : names)
      if (f.find_tensor(n)) return n;
    return *names.begin();
  };
  c.fc_name = pick({"fc.weight", "dflash.fc.weight", "dflash_fc.weight"});
  c.hidden_norm_name = pick({"enc.output_norm.weight", "dflash.hidden_norm.weight", "dflash_hidden_norm.weight"});
  const gguf::TensorInfo* fc = f.find_tensor(c.fc_name);
  PG_CHECK(fc && fc->n_dims == 2 && fc->ne[1] == c.n_embd && fc->ne[0] % c.n_embd == 0,
           f.path() + ": DFlash draft has no fusion projection '" + c.fc_name + "' of shape {n·" + std::to_string(c.n_embd) + ", " +
               std::to_string(c.n_embd) + "}" + (fc ? std::string(" (found ") + shape_str(fc->ne, fc->n_dims) + ")" : ""));
  c.n_target_layers = static_cast<int>(fc->ne[0] / c.n_embd);
  if (!c.llama_cpp_layout && c.target_layers.empty()) {
    const int n = meta_int(f, dk + "n_target_layers", 0);
    PG_CHECK(n == 0 || n == c.n_target_layers, f.path() + ": " + dk + "n_target_layers = " + std::to_string(n) + " but fc fuses " +
                                                   std::to_string(c.n_target_layers) + " features");
  }
  PG_CHECK(c.target_layers.empty() || static_cast<int>(c.target_layers.size()) == c.n_target_layers,
           f.path() + ": the DFlash draft lists " + std::to_string(c.target_layers.size()) + " target layers but its fc fuses " +
               std::to_string(c.n_target_layers) + " features");
  for (size_t i = 0; i < c.target_layers.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      PG_CHECK(c.target_layers[i] != c.target_layers[j], f.path() + ": the DFlash draft lists target layer " + std::to_string(c.target_layers[i]) + " twice");
  // Sliding window / causal flags.
  c.sliding_window = meta_int(f, a + "attention.sliding_window", 0);
  c.layer_swa.assign(static_cast<size_t>(c.n_layer), c.sliding_window > 0);
  if (c.sliding_window > 0 && f.has(a + "attention.sliding_window_pattern")) {
    const auto p = f.get_int_array(a + "attention.sliding_window_pattern");
    for (size_t i = 0; i < c.layer_swa.size() && i < p.size(); ++i) c.layer_swa[i] = p[i] != 0;
  }
  c.causal = meta_flag(f, a + "attention.causal") || meta_flag(f, "dflash.attention.causal");
  // Shapes of everything else.
  for (const auto& [name, shape] : dflash_tensor_shapes(c)) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    PG_CHECK(t, f.path() + ": DFlash draft is missing tensor '" + name + "'");
    std::vector<int64_t> have(t->ne, t->ne + t->n_dims);
    while (have.size() > shape.size() && have.back() == 1) have.pop_back();
    PG_CHECK(have == shape, f.path() + ": tensor '" + name + "' has shape " + shape_str(t->ne, t->n_dims) + ", expected " +
                                shape_str(shape.data(), static_cast<int>(shape.size())));
  }
  return c;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> dflash_tensor_shapes(const DFlashConfig& c) {
  const int64_t e = c.n_embd, q = static_cast<int64_t>(c.n_head) * c.head_dim, kv = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  std::vector<std::pair<std::string, std::vector<int64_t>>> v = {
      {c.fc_name.empty() ? "fc.weight" : c.fc_name, {static_cast<int64_t>(c.n_target_layers) * e, e}},
      {c.hidden_norm_name.empty() ? "enc.output_norm.weight" : c.hidden_norm_name, {e}},
      {"output_norm.weight", {e}}};
  for (int il = 0; il < c.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    v.push_back({p + "attn_norm.weight", {e}});
    v.push_back({p + "attn_q.weight", {e, q}});
    v.push_back({p + "attn_k.weight", {e, kv}});
    v.push_back({p + "attn_v.weight", {e, kv}});
    v.push_back({p + "attn_output.weight", {q, e}});
    v.push_back({p + "attn_q_norm.weight", {c.head_dim}});
    v.push_back({p + "attn_k_norm.weight", {c.head_dim}});
    v.push_back({p + "ffn_norm.weight", {e}});
    v.push_back({p + "ffn_gate.weight", {e, c.n_ff}});
    v.push_back({p + "ffn_up.weight", {e, c.n_ff}});
    v.push_back({p + "ffn_down.weight", {c.n_ff, e}});
  }
  return v;
}

void print_dflash_summary(const gguf::File& f, std::ostream& os) {
  os << "\nDFlash block-diffusion draft (" << f.architecture() << "):\n";
  try {
    const DFlashConfig c = read_dflash_config(f);
    os << "  layout: " << (c.llama_cpp_layout ? "llama.cpp (target_layers stored as layer inputs, id + 1)" : "Lucebox") << "\n";
    os << "  " << c.n_layer << " layers of width " << c.n_embd << ", " << c.n_head << " query / " << c.n_head_kv << " KV heads of "
       << c.head_dim << ", SwiGLU " << c.n_ff << ", RMS eps " << c.rms_eps << ", RoPE base " << c.rope_base << "\n";
    os << "  block: " << c.block_size << " positions = anchor + " << (c.block_size - 1) << " drafted tokens per pass, attention inside the block "
       << (c.causal ? "causal" : "non-causal") << "\n";
    os << "  mask token: " << (c.mask_token >= 0 ? std::to_string(c.mask_token) : std::string("none in the file (the target's is used)")) << "\n";
    os << "  target features: " << c.n_target_layers << " layers fused by " << c.fc_name << " into width " << c.n_embd << ", then "
       << c.hidden_norm_name << "; layer ids (0-based outputs): ";
    if (c.target_layers.empty()) os << "not listed (computed from the target's depth)";
    for (size_t i = 0; i < c.target_layers.size(); ++i) os << (i ? ", " : "[") << c.target_layers[i] << (i + 1 == c.target_layers.size() ? "]" : "");
    os << "\n  context: " << (c.sliding_window > 0 ? "sliding window " + std::to_string(c.sliding_window) : std::string("full")) << "\n";
    const bool embd = f.find_tensor("token_embd.weight") != nullptr, head = f.find_tensor("output.weight") != nullptr;
    os << "  embedding / LM head: " << (embd || head ? "the file carries its own" : "none: shared with the target (which must provide them)") << "\n";
  } catch (const Error& e) {
    os << "  cannot be loaded: " << e.what() << "\n";
  }
}

DFlashModel::DFlashModel(std::unique_ptr<gguf::File> f, Model& target) : file_(std::move(f)), target_(target), be_(target.backend()) {}

DFlashModel::~DFlashModel() {
  for (Tensor& t : scratch_)
    if (t.valid()) be_.free(t);
  if (!be_.is_host()) {
    auto fr = [&](Tensor& t) {
      if (t.valid()) be_.free(t);
    };
    fr(fc_);
    fr(hidden_norm_);
    fr(output_norm_);
    for (auto& l : layers_)
      for (Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.q_norm, &l.k_norm, &l.ffn_norm, &l.ffn_gate, &l.ffn_up, &l.ffn_down})
        fr(*t);
  }
}

std::unique_ptr<DFlashModel> DFlashModel::load(const std::string& path, Model& target) {
  auto file = gguf::File::open(path);
  DFlashConfig c = read_dflash_config(*file);
  const ModelConfig& tc = target.config();
  const std::string tn = "the target '" + tc.name + "'";
  PG_CHECK(c.n_embd == tc.n_embd, path + ": DFlash draft hidden size " + std::to_string(c.n_embd) + " does not match " + tn + "'s " +
                                      std::to_string(tc.n_embd) + " (a DFlash draft shares the target's embedding and LM head)");
  PG_CHECK(target.weights().tok_embd.valid() && target.weights().output.valid(),
           path + ": " + tn + " provides no token embedding / LM head for the DFlash draft to share");
  if (c.target_layers.empty()) {
    // Lucebox computes the ids from the target's depth: 1 + k·floor((L-2)/(N-1)).
    const int n = c.n_target_layers;
    for (int k = 0; k < n; ++k) c.target_layers.push_back(n == 1 ? tc.n_layer / 2 : 1 + k * ((tc.n_layer - 2) / (n - 1)));
  }
  for (int id : c.target_layers)
    PG_CHECK(id >= 0 && id < tc.n_layer, path + ": DFlash draft reads target layer " + std::to_string(id) + " but " + tn + " has " +
                                             std::to_string(tc.n_layer) + " layers (0.." + std::to_string(tc.n_layer - 1) + ")");
  if (c.mask_token < 0) {
    // Lucebox takes the target's mask id.
    if (auto m = target.file().get_int_opt("tokenizer.ggml.mask_token_id")) c.mask_token = static_cast<int32_t>(*m);
  }
  PG_CHECK(c.mask_token >= 0, path + ": DFlash draft names no mask token (tokenizer.ggml.mask_token_id), nor does " + tn);
  PG_CHECK(c.mask_token < tc.n_vocab, path + ": DFlash mask token " + std::to_string(c.mask_token) + " is outside " + tn + "'s vocabulary of " +
                                          std::to_string(tc.n_vocab));
  PG_CHECK(tc.embd_scale == 0.0f && tc.final_logit_softcap == 0.0f,
           path + ": " + tn + " scales its embeddings or logits (gemma); DFlash drafts for such targets are not supported yet");
  std::unique_ptr<DFlashModel> m(new DFlashModel(std::move(file), target));
  m->c_ = c;
  auto load = [&](const std::string& name) {
    const gguf::TensorInfo* t = m->file_->find_tensor(name);
    return m->be_.load_weight(t->type, t->ne, t->data);
  };
  m->fc_ = load(c.fc_name);
  m->hidden_norm_ = load(c.hidden_norm_name);
  m->output_norm_ = load("output_norm.weight");
  m->layers_.resize(static_cast<size_t>(c.n_layer));
  for (int il = 0; il < c.n_layer; ++il) {
    DFlashLayer& l = m->layers_[static_cast<size_t>(il)];
    const std::string p = "blk." + std::to_string(il) + ".";
    l.attn_norm = load(p + "attn_norm.weight");
    l.wq = load(p + "attn_q.weight");
    l.wk = load(p + "attn_k.weight");
    l.wv = load(p + "attn_v.weight");
    l.wo = load(p + "attn_output.weight");
    l.q_norm = load(p + "attn_q_norm.weight");
    l.k_norm = load(p + "attn_k_norm.weight");
    l.ffn_norm = load(p + "ffn_norm.weight");
    l.ffn_gate = load(p + "ffn_gate.weight");
    l.ffn_up = load(p + "ffn_up.weight");
    l.ffn_down = load(p + "ffn_down.weight");
  }
  return m;
}

Tensor DFlashModel::scratch(int slot, int64_t cols, int64_t rows) {
  if (scratch_.size() <= static_cast<size_t>(slot)) {
    scratch_.resize(static_cast<size_t>(slot) + 1);
    scratch_elems_.resize(static_cast<size_t>(slot) + 1, 0);
  }
  const int64_t need = std::max<int64_t>(1, cols * rows);
  if (scratch_elems_[static_cast<size_t>(slot)] < need) {
    if (scratch_[static_cast<size_t>(slot)].valid()) be_.free(scratch_[static_cast<size_t>(slot)]);
    const int64_t cap = std::max(need, scratch_elems_[static_cast<size_t>(slot)] * 2);
    scratch_[static_cast<size_t>(slot)] = be_.alloc(DType::F32, cap, 1);
    scratch_elems_[static_cast<size_t>(slot)] = cap;
  }
  Tensor t = scratch_[static_cast<size_t>(slot)];
  t.ne[0] = cols;
  t.ne[1] = rows;
  return t;
}

Tensor DFlashModel::scratch_i32(int slot, int64_t cols, int64_t rows) {
  Tensor t = scratch(slot, cols, rows);  // an F32-sized buffer holds as many I32
  t.type = DType::I32;
  return t;
}

void DFlashModel::context_kv(const float* feats, const int32_t* pos, int n, const std::vector<float*>& k_out, const std::vector<float*>& v_out) {
  if (n <= 0) return;
  PG_CHECK(static_cast<int>(k_out.size()) == c_.n_layer && static_cast<int>(v_out.size()) == c_.n_layer, "DFlash context_kv: one output per layer");
  const int e = c_.n_embd, kvw = kv_width();
  Tensor f = scratch(0, n_feat(), n);      // (n, n_feat) target features
  Tensor cx = scratch(1, e, n);            // (n, n_embd) fused context
  Tensor k = scratch(2, kvw, n);           // (n, kv_width)
  Tensor v = scratch(3, kvw, n);           // (n, kv_width)
  Tensor p = scratch_i32(4, n);            // I32 (n) positions
  be_.upload(f, feats, static_cast<size_t>(n) * static_cast<size_t>(n_feat()) * sizeof(float));
  be_.upload(p, pos, static_cast<size_t>(n) * sizeof(int32_t));
  be_.matmul(fc_, f, cx);
  be_.rms_norm(cx, hidden_norm_, cx, c_.rms_eps);
  for (int il = 0; il < c_.n_layer; ++il) {
    const DFlashLayer& l = layers_[static_cast<size_t>(il)];
    // The layer's own W_k / k_norm / W_v, applied to the context rows (no attn_norm: C is already normed).
    be_.matmul(l.wk, cx, k);
    be_.matmul(l.wv, cx, v);
    Tensor kh = k.reshape_2d(c_.head_dim, static_cast<int64_t>(n) * c_.n_head_kv);
    be_.rms_norm(kh, l.k_norm, kh, c_.rms_eps);
    be_.rope(k, p, c_.n_head_kv, c_.head_dim, c_.head_dim, c_.rope_base, RopeStyle::Neox);
    be_.download(k, k_out[static_cast<size_t>(il)], static_cast<size_t>(n) * static_cast<size_t>(kvw) * sizeof(float));
    be_.download(v, v_out[static_cast<size_t>(il)], static_cast<size_t>(n) * static_cast<size_t>(kvw) * sizeof(float));
  }
}

std::unique_ptr<KvCache> DFlashModel::make_cache(int n_seq, int n_ctx) const {
  KvCacheOptions o;
  o.n_seq = n_seq;
  o.n_ctx = n_ctx;
  // F32 on the CPU keeps the host path's numbers (its context arrays were F32); devices halve the bytes.
  o.type = be_.is_host() ? DType::F32 : DType::F16;
  o.block_size = 64;
  const int kvw = kv_width();
  std::vector<KvLayerShape> shapes(static_cast<size_t>(c_.n_layer), KvLayerShape{kvw, kvw, c_.n_head_kv});
  return std::make_unique<PagedKvCache>(be_, shapes, o);
}

void DFlashModel::store_context(KvCache& cache, const float* feats, const int32_t* seq, const int32_t* pos, int n) {
  if (n <= 0) return;
  Tensor f = scratch(0, n_feat(), n);  // (n, n_feat) target features
  be_.upload(f, feats, static_cast<size_t>(n) * static_cast<size_t>(n_feat()) * sizeof(float));
  store_fused(cache, f, seq, pos, n);
}

Tensor DFlashModel::feature_buffer(int n_rows) {
  // Slot 7: only store_context_rows reads it; (n_target_layers · n_rows, n_embd).
  return scratch(7, c_.n_embd, static_cast<int64_t>(c_.n_target_layers) * std::max(n_rows, 1));
}

void DFlashModel::store_context_rows(KvCache& cache, const Tensor& src, int n_rows, const int32_t* rows, const int32_t* seq,
                                     const int32_t* pos, int n) {
  if (n <= 0) return;
  const int nh = c_.n_target_layers;
  PG_CHECK(src.type == DType::F32 && src.cols() == c_.n_embd && src.rows() >= static_cast<int64_t>(nh) * n_rows,
           "DFlash store_context_rows: features must be F32 (n_target_layers·n_rows, n_embd)");
  // Row i's layers side by side = rows i·nh .. i·nh+nh-1 of an (n·nh, n_embd) gather: the same bytes
  // as the (n, n_feat) input of fc.
  std::vector<int32_t> ids(static_cast<size_t>(n) * static_cast<size_t>(nh));
  for (int i = 0; i < n; ++i) {
    PG_CHECK(rows[i] >= 0 && rows[i] < n_rows, "DFlash store_context_rows: row " + std::to_string(rows[i]) + " outside the forward's " +
                                                   std::to_string(n_rows) + " rows");
    for (int k = 0; k < nh; ++k) ids[static_cast<size_t>(i) * nh + static_cast<size_t>(k)] = k * n_rows + rows[i];
  }
  Tensor ti = scratch_i32(6, static_cast<int64_t>(n) * nh);
  be_.upload(ti, ids.data(), ids.size() * sizeof(int32_t));
  Tensor f = scratch(0, n_feat(), n);  // (n, n_feat) = (n·nh, n_embd)
  Tensor fr = f.reshape_2d(c_.n_embd, static_cast<int64_t>(n) * nh);
  be_.get_rows(src, ti, fr);
  store_fused(cache, f, seq, pos, n);
}

void DFlashModel::store_fused(KvCache& cache, const Tensor& f, const int32_t* seq, const int32_t* pos, int n) {
  PG_CHECK(cache.n_layer() == c_.n_layer, "DFlash store_context: the cache is not this draft's (" + std::to_string(cache.n_layer()) +
                                              " layers, the draft has " + std::to_string(c_.n_layer) + ")");
  const int e = c_.n_embd, kvw = kv_width();
  std::vector<int32_t> cells(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) cells[static_cast<size_t>(i)] = cache.write_cell(seq[i], pos[i]);
  Tensor cx = scratch(1, e, n);   // (n, n_embd) fused context
  Tensor k = scratch(2, kvw, n);  // (n, kv_width)
  Tensor v = scratch(3, kvw, n);  // (n, kv_width)
  Tensor p = scratch_i32(4, n);   // I32 (n) RoPE positions
  Tensor tc = scratch_i32(5, n);  // I32 (n) cache cells
  be_.upload(p, pos, static_cast<size_t>(n) * sizeof(int32_t));
  be_.upload(tc, cells.data(), cells.size() * sizeof(int32_t));
  AttentionBatch ab;  // kv_store reads the cells only
  ab.n_tokens = n;
  ab.cells = tc;
  be_.matmul(fc_, f, cx);
  be_.rms_norm(cx, hidden_norm_, cx, c_.rms_eps);
  for (int il = 0; il < c_.n_layer; ++il) {
    const DFlashLayer& l = layers_[static_cast<size_t>(il)];
    // The layer's own W_k / k_norm / W_v, applied to the context rows (no attn_norm: C is already normed).
    be_.matmul_shared(cx, {{&l.wk, &k}, {&l.wv, &v}});
    Tensor kh = k.reshape_2d(c_.head_dim, static_cast<int64_t>(n) * c_.n_head_kv);
    be_.rms_norm(kh, l.k_norm, kh, c_.rms_eps);
    be_.rope(k, p, c_.n_head_kv, c_.head_dim, c_.head_dim, c_.rope_base, RopeStyle::Neox);
    be_.kv_store(cache.layer(il), k, v, ab);
  }
}

void DFlashModel::block_layers(Tensor& x, const Tensor& tpos, int R,
                               const std::function<void(int, Tensor&, Tensor&, Tensor&, Tensor&)>& attend) {
  const int e = c_.n_embd, kvw = kv_width(), qw = c_.n_head * c_.head_dim, hd = c_.head_dim;
  Tensor h = scratch(13, e, R), o = scratch(14, e, R);               // (R, n_embd)
  Tensor q = scratch(15, qw, R), at = scratch(16, qw, R);            // (R, n_head·head_dim)
  Tensor k = scratch(17, kvw, R), v = scratch(18, kvw, R);           // (R, kv_width)
  Tensor g = scratch(19, c_.n_ff, R), u = scratch(20, c_.n_ff, R);   // (R, n_ff)
  for (int il = 0; il < c_.n_layer; ++il) {
    const DFlashLayer& l = layers_[static_cast<size_t>(il)];
    be_.rms_norm(x, l.attn_norm, h, c_.rms_eps);
    be_.matmul_shared(h, {{&l.wq, &q}, {&l.wk, &k}, {&l.wv, &v}});
    be_.qk_norm_rope(q, k, l.q_norm, l.k_norm, tpos, c_.n_head, c_.n_head_kv, hd, hd, c_.rope_base, RopeStyle::Neox, c_.rms_eps);
    attend(il, q, k, v, at);
    be_.matmul(l.wo, at, o);
    be_.add(x, o, x);
    be_.rms_norm(x, l.ffn_norm, h, c_.rms_eps);
    be_.matmul_glu(h, l.ffn_gate, l.ffn_up, Activation::Silu, g, u);
    be_.matmul(l.ffn_down, g, o);
    be_.add(x, o, x);
  }
}

void DFlashModel::block_head(const Tensor& x, int nb, int n_out, int top_k, int32_t* ids, float* logprobs, float* logits) {
  // Slots 1..n_out of every block through the final norm and the target's head.
  const int B = n_out + 1, e = c_.n_embd;
  const int M = nb * n_out;
  std::vector<int32_t> rows(static_cast<size_t>(M));
  for (int b = 0; b < nb; ++b)
    for (int i = 0; i < n_out; ++i) rows[static_cast<size_t>(b * n_out + i)] = b * B + 1 + i;
  Tensor ridx = scratch_i32(21, M);
  be_.upload(ridx, rows.data(), rows.size() * 4);
  Tensor xo = scratch(22, e, M);  // (M, n_embd)
  be_.get_rows(x, ridx, xo);
  be_.rms_norm(xo, output_norm_, xo, c_.rms_eps);
  const int nv = target_.config().n_vocab;
  Tensor lg = scratch(23, nv, M);  // (M, n_vocab)
  be_.matmul(target_.weights().output, xo, lg);
  if (logits) {
    be_.download(lg, logits, static_cast<size_t>(M) * static_cast<size_t>(nv) * sizeof(float));
    return;
  }
  PG_CHECK(top_k >= 1 && top_k <= 64 && top_k <= nv, "DFlash propose: top_k must be in [1, 64]");
  Tensor ti = scratch_i32(24, top_k, M), tl = scratch(25, top_k, M);  // (M, top_k)
  be_.topk_rows(lg, top_k, ti, tl);
  be_.download(ti, ids, static_cast<size_t>(M) * static_cast<size_t>(top_k) * 4);
  be_.download(tl, logprobs, static_cast<size_t>(M) * static_cast<size_t>(top_k) * 4);
}

namespace {

// Token ids [anchor, MASK × n_out] and RoPE positions pos0 + i of every block, (nb·B) each.
void block_inputs(std::span<const DFlashBlock> blocks, int B, int32_t mask, std::vector<int32_t>& tok, std::vector<int32_t>& pos) {
  const int nb = static_cast<int>(blocks.size());
  tok.resize(static_cast<size_t>(nb * B));
  pos.resize(tok.size());
  for (int b = 0; b < nb; ++b)
    for (int i = 0; i < B; ++i) {
      tok[static_cast<size_t>(b * B + i)] = i == 0 ? blocks[static_cast<size_t>(b)].anchor : mask;
      pos[static_cast<size_t>(b * B + i)] = blocks[static_cast<size_t>(b)].pos0 + i;
    }
}

}  // namespace

void DFlashModel::propose(KvCache& cache, std::span<const DFlashBlock> blocks, int n_out, int top_k, int32_t* ids, float* logprobs,
                          float* logits) {
  const int nb = static_cast<int>(blocks.size());
  if (nb == 0) return;
  PG_CHECK(n_out >= 1 && n_out <= c_.block_size - 1, "DFlash propose: n_out must be in [1, block_size-1]");
  PG_CHECK(n_out + 1 <= kMaxTreeRows, "DFlash propose: the block is longer than a tree-masked attention takes");
  PG_CHECK(cache.n_layer() == c_.n_layer, "DFlash propose: the cache is not this draft's");
  const int B = n_out + 1, R = nb * B;
  std::vector<int32_t> tok, pos;
  block_inputs(blocks, B, c_.mask_token, tok, pos);
  // The block rows as tree rows of the attention: row i of a block sees its sequence's context
  // [pos0 - n_ctx, pos0) (kv_len = pos0) plus the block rows stored at pos0 + j, by mask bit j: every
  // j (non-causal) or j ≤ i (causal). The K/V of the block rows go to those scratch cells, uncommitted.
  std::vector<int32_t> cells(static_cast<size_t>(R)), seqs(cells.size()), apos(cells.size()), kvl(cells.size());
  std::vector<int32_t> mask(static_cast<size_t>(R) * kTreeMaskWords, 0);
  // A window (n_ctx < pos0) is placed through the attention's sliding window: with window W, a row at
  // attention position a sees from a + 1 - W, so a = begin + W - 1 puts every block's start where it
  // belongs (the attention's positions are not RoPE positions here: RoPE took tpos above). W covers
  // the longest context so that unwindowed blocks start at 0.
  bool windowed = false;
  int W = 1, max_kv = 1;
  for (const DFlashBlock& b : blocks) {
    PG_CHECK(b.n_ctx >= 0 && b.n_ctx <= b.pos0, "DFlash propose: context of " + std::to_string(b.n_ctx) + " rows before position " + std::to_string(b.pos0));
    windowed = windowed || b.n_ctx < b.pos0;
    W = std::max(W, b.pos0 + 1);
    max_kv = std::max(max_kv, b.pos0 + B);
  }
  for (int b = 0; b < nb; ++b) {
    const DFlashBlock& blk = blocks[static_cast<size_t>(b)];
    for (int i = 0; i < B; ++i) {
      const size_t r = static_cast<size_t>(b * B + i);
      cells[r] = cache.write_cell(blk.seq, blk.pos0 + i);
      seqs[r] = blk.seq;
      apos[r] = windowed ? blk.pos0 - blk.n_ctx + W - 1 : blk.pos0 + i;
      kvl[r] = blk.pos0;
      const int nbk = c_.causal ? i + 1 : B;
      for (int j = 0; j < nbk; ++j) mask[r * kTreeMaskWords + static_cast<size_t>(j / 32)] |= 1u << (j % 32);
    }
  }
  const int nseq = cache.n_seq(), mb = cache.max_blocks();
  Tensor tids = scratch_i32(10, R), tpos = scratch_i32(11, R);
  Tensor tcells = scratch_i32(26, R), tseq = scratch_i32(27, R), tapos = scratch_i32(28, R), tkvl = scratch_i32(29, R);
  Tensor tmask = scratch_i32(30, kTreeMaskWords, R);  // I32 (R, kTreeMaskWords)
  Tensor ttab = scratch_i32(31, mb, nseq);            // I32 (n_seq, max_blocks)
  be_.upload(tids, tok.data(), tok.size() * 4);
  be_.upload(tpos, pos.data(), pos.size() * 4);
  be_.upload(tcells, cells.data(), cells.size() * 4);
  be_.upload(tseq, seqs.data(), seqs.size() * 4);
  be_.upload(tapos, apos.data(), apos.size() * 4);
  be_.upload(tkvl, kvl.data(), kvl.size() * 4);
  be_.upload(tmask, mask.data(), mask.size() * 4);
  // The whole table every pass: a few hundred bytes, and write_cell above may have changed it.
  be_.upload(ttab, cache.block_table().data(), cache.block_table().size() * 4);
  cache.clear_dirty();
  AttentionBatch ab;
  ab.n_tokens = R;
  ab.positions = tapos;
  ab.seq = tseq;
  ab.cells = tcells;
  ab.block_table = ttab;
  ab.block_size = cache.block_size();
  ab.max_blocks = mb;
  ab.max_kv_len = max_kv;
  ab.kv_len = tkvl;
  ab.tree_mask = tmask;
  AttentionParams ap;
  ap.n_head = c_.n_head;
  ap.n_head_kv = c_.n_head_kv;
  ap.head_dim = c_.head_dim;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
  ap.sliding_window = windowed ? W : 0;
  Tensor x = scratch(12, c_.n_embd, R);  // (R, n_embd)
  be_.get_rows(target_.weights().tok_embd, tids, x);
  block_layers(x, tpos, R, [&](int il, Tensor& q, Tensor& k, Tensor& v, Tensor& at) {
    KvLayer& kv = cache.layer(il);
    be_.kv_store(kv, k, v, ab);
    be_.attention(q, kv, ab, ap, at);
  });
  block_head(x, nb, n_out, top_k, ids, logprobs, logits);
}

void DFlashModel::propose_host(std::span<const DFlashBlock> blocks, int n_out, int top_k, int32_t* ids, float* logprobs, float* logits) {
  const int nb = static_cast<int>(blocks.size());
  if (nb == 0) return;
  PG_CHECK(n_out >= 1 && n_out <= c_.block_size - 1, "DFlash propose: n_out must be in [1, block_size-1]");
  // The block is as long as the draft wanted (anchor + n_out masks, as llama.cpp runs it): a shorter
  // block than trained costs fewer rows and predicts nearly as well (DFlash Tab. 8).
  const int B = n_out + 1, kvw = kv_width(), qw = c_.n_head * c_.head_dim, hd = c_.head_dim;
  const int R = nb * B;
  std::vector<int32_t> tok, pos;
  block_inputs(blocks, B, c_.mask_token, tok, pos);
  Tensor tids = scratch_i32(10, R), tpos = scratch_i32(11, R);
  be_.upload(tids, tok.data(), tok.size() * 4);
  be_.upload(tpos, pos.data(), pos.size() * 4);
  Tensor x = scratch(12, c_.n_embd, R);  // (R, n_embd)
  be_.get_rows(target_.weights().tok_embd, tids, x);
  std::vector<float> hq(static_cast<size_t>(R) * qw), hk(static_cast<size_t>(R) * kvw), hv(static_cast<size_t>(R) * kvw),
      ho(static_cast<size_t>(R) * qw);
  std::vector<float> sc;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int rep = c_.n_head / c_.n_head_kv;
  block_layers(x, tpos, R, [&](int il, Tensor& q, Tensor& k, Tensor& v, Tensor& at) {
    be_.download(q, hq.data(), hq.size() * 4);
    be_.download(k, hk.data(), hk.size() * 4);
    be_.download(v, hv.data(), hv.size() * 4);
    // Attention on the host: every block row sees the block's context rows and (non-causal) all B
    // block rows, or only earlier ones when the file says causal.
    for (int b = 0; b < nb; ++b) {
      const DFlashBlock& blk = blocks[static_cast<size_t>(b)];
      const float* ck = blk.ctx_k[static_cast<size_t>(il)];
      const float* cv = blk.ctx_v[static_cast<size_t>(il)];
      const int nc = blk.n_ctx;
      sc.resize(static_cast<size_t>(nc + B));
      for (int i = 0; i < B; ++i) {
        const int r = b * B + i;
        const int nbk = c_.causal ? i + 1 : B;
        for (int hh = 0; hh < c_.n_head; ++hh) {
          const int kh_i = hh / rep;
          const float* qv = hq.data() + static_cast<size_t>(r) * qw + static_cast<size_t>(hh) * hd;
          float mx = -INFINITY;
          for (int j = 0; j < nc; ++j) {
            const float* kv = ck + static_cast<size_t>(j) * kvw + static_cast<size_t>(kh_i) * hd;
            float s = 0;
            for (int d = 0; d < hd; ++d) s += qv[d] * kv[d];
            sc[static_cast<size_t>(j)] = s * scale;
            mx = std::max(mx, sc[static_cast<size_t>(j)]);
          }
          for (int j = 0; j < nbk; ++j) {
            const float* kv = hk.data() + static_cast<size_t>(b * B + j) * kvw + static_cast<size_t>(kh_i) * hd;
            float s = 0;
            for (int d = 0; d < hd; ++d) s += qv[d] * kv[d];
            sc[static_cast<size_t>(nc + j)] = s * scale;
            mx = std::max(mx, sc[static_cast<size_t>(nc + j)]);
          }
          double sum = 0;
          for (int j = 0; j < nc + nbk; ++j) {
            sc[static_cast<size_t>(j)] = std::exp(sc[static_cast<size_t>(j)] - mx);
            sum += sc[static_cast<size_t>(j)];
          }
          const float inv = static_cast<float>(1.0 / sum);
          float* out = ho.data() + static_cast<size_t>(r) * qw + static_cast<size_t>(hh) * hd;
          std::fill(out, out + hd, 0.0f);
          for (int j = 0; j < nc; ++j) {
            const float w = sc[static_cast<size_t>(j)] * inv;
            const float* vv = cv + static_cast<size_t>(j) * kvw + static_cast<size_t>(kh_i) * hd;
            for (int d = 0; d < hd; ++d) out[d] += w * vv[d];
          }
          for (int j = 0; j < nbk; ++j) {
            const float w = sc[static_cast<size_t>(nc + j)] * inv;
            const float* vv = hv.data() + static_cast<size_t>(b * B + j) * kvw + static_cast<size_t>(kh_i) * hd;
            for (int d = 0; d < hd; ++d) out[d] += w * vv[d];
          }
        }
      }
    }
    be_.upload(at, ho.data(), ho.size() * 4);
  });
  block_head(x, nb, n_out, top_k, ids, logprobs, logits);
}

}  // namespace pg
