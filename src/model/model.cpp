#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "kv/paged_kv_cache.h"
#include "model/arch.h"

namespace pg {

// Activation buffers for one micro-batch of up to `cap` rows, allocated once on the backend.
struct Model::Workspace {
  int cap = 0;
  static constexpr int kLogitRows = 64;  // logits are produced in chunks so the buffer stays small
  Tensor ids, pos, seq, cells, out_ids;  // I32 (cap)
  Tensor block_table;                    // I32 (n_seq, max_blocks)
  Tensor kv_len;                         // I32 (cap) tree micro-batches: end of each row's committed range
  Tensor tree_mask;                      // I32 (cap, kTreeMaskWords) tree micro-batches: ancestor bits
  Tensor x, h, o;                        // (cap, n_embd)
  Tensor qfull;                          // (cap, q rows incl. gate)
  Tensor q, gate;                        // (cap, n_head*head_dim)
  Tensor k, v;                           // (cap, n_head_kv*head_dim)
  Tensor attn;                           // (cap, n_head*head_dim_v)
  Tensor ff_g, ff_u;                     // (cap, max ffn width)
  Tensor o2;                             // (cap, n_embd) shared expert output
  Tensor r_logits, r_ids, r_w;           // (cap, n_expert), (cap, k) I32, (cap, k)
  Tensor xo;                             // (cap, n_embd) rows that want logits
  Tensor logits;                         // (kLogitRows, n_vocab)
  Tensor out_argmax;                     // I32 (kLogitRows) greedy tokens of a logits chunk
  Tensor topk_ids, topk_lp;              // I32 / F32 (kLogitRows, ≤ 64) top-k of a logits chunk
  Tensor hid;                            // (n_hidden·cap, n_embd) captured hidden states, slot k at rows [k·cap, (k+1)·cap)
  int hid_slots = 0;                     // hidden-state slots hid holds
  std::vector<int> hid_slot;             // (n_layer) slot of each layer for this forward, -1 = not captured
  Tensor sh_gate;                        // (cap, 1) shared-expert gate logits
  // Gated DeltaNet layers (conv_dim = 2·groups·state + inner)
  Tensor dn_mixed, dn_conv;              // (cap, conv_dim) projected q|k|v before / after the conv
  Tensor dn_q, dn_k;                     // (cap, groups·state)
  Tensor dn_v, dn_z, dn_out;             // (cap, inner)
  Tensor dn_g, dn_beta;                  // (cap, value heads)
  Tensor rb_rows, rb_capture;            // I32 (cap)
  Tensor rb_seg;                         // I32 (cap, 4)
  uint64_t cache_id = 0;  // KvCache::id() the workspace was sized for
  bool table_loaded = false;  // block_table holds the cache's table (uploaded at least once)
  std::vector<Tensor*> all;
  // Recorded decode steps (Backend::begin_graph), by step shape: see Model::forward_ubatch.
  std::map<std::vector<int32_t>, int> graphs;
  std::set<std::vector<int32_t>> warm;  // shapes run once uncaptured (scratch buffers sized)
  AttentionBatch ab;
  RecurrentBatch rb;
};

// Token trees of a batch (speculative verification), decided once per forward for every model: a
// sequence with any row whose parent ≥ 0 is a tree sequence, all its rows are tree rows, stored at
// logical positions seq_len + j (j = index among the sequence's tree rows, in batch order) and seeing
// [0, seq_len) plus their ancestors and themselves.
struct Model::TreePlan {
  bool any = false;
  std::vector<uint8_t> tree;     // (n_seq) 1 = the sequence's rows form a tree
  std::vector<int32_t> j;        // (n) index among the sequence's tree rows; -1 for chain rows
  std::vector<int32_t> kv_len;   // (n) tree rows: the sequence's committed length; chain rows: position + 1
  std::vector<uint32_t> mask;    // (n, kTreeMaskWords) tree rows: bit j of each ancestor and of itself
};

// How the rows of a whole batch thread through recurrent state (hybrid models), decided once per
// forward and then cut into micro-batches.
struct Model::RecurrentPlan {
  std::vector<int32_t> pred;     // (n) predecessor row of r (-1: the sequence's committed state)
  std::vector<uint8_t> tree;     // (n_seq) 1 = the sequence's rows form a tree (parents given)
  bool capture = false;
};

Model::Model(std::unique_ptr<gguf::File> file, Backend& backend, const ModelOptions& opt)
    : file_(std::move(file)), backend_(backend), opt_(opt) {}

void Model::drop_workspace() {
  if (!ws_) return;
  for (const auto& [key, id] : ws_->graphs) backend_.drop_graph(id);
  for (Tensor* t : ws_->all)
    if (t->valid()) backend_.free(*t);
  ws_.reset();
}

Model::~Model() {
  if (ws_)
    for (const auto& [key, id] : ws_->graphs) backend_.drop_graph(id);
  if (ws_)
    for (Tensor* t : ws_->all)
      if (t->valid()) backend_.free(*t);
  if (!backend_.is_host()) {
    // Device backends own uploaded weight copies.
    auto free_slot = [&](Tensor& t) {
      if (t.valid()) backend_.free(t);
    };
    // Tied embeddings share one upload: free it once (decide before tok_embd is reset).
    if (w_.output.data != w_.tok_embd.data) free_slot(w_.output);
    free_slot(w_.tok_embd);
    free_slot(w_.output_norm);
    for (auto& l : w_.layers) {
      Tensor* slots[] = {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm,
                         &l.attn_post_norm, &l.ffn_norm, &l.ffn_gate, &l.ffn_up, &l.ffn_down, &l.ffn_post_norm,
                         &l.router, &l.gate_exps, &l.up_exps, &l.down_exps, &l.gate_shexp, &l.up_shexp, &l.down_shexp,
                         &l.router_shexp, &l.ssm_qkv, &l.ssm_z, &l.ssm_conv1d, &l.ssm_dt_bias, &l.ssm_a, &l.ssm_beta,
                         &l.ssm_alpha, &l.ssm_norm, &l.ssm_out};
      for (Tensor* t : slots) free_slot(*t);
    }
  }
}

std::unique_ptr<Model> Model::load(const std::string& path, Backend& backend, const ModelOptions& opt) {
  auto file = gguf::File::open(path);
  const std::string arch = file->architecture();
  PG_CHECK(!arch.empty(), path + ": no general.architecture key (is this a model file?)");
  const ArchDef* def = find_arch(arch);
  if (!def) {
    std::string list;
    for (const auto& a : supported_archs()) list += (list.empty() ? "" : ", ") + a;
    throw Error(path + ": architecture '" + arch + "' is not supported (supported: " + list + ")");
  }
  std::unique_ptr<Model> m(new Model(std::move(file), backend, opt));
  ModelConfig& c = m->cfg_;
  c.arch = arch;
  c.name = m->file_->get_string_opt("general.name").value_or(arch);
  ArchMeta meta(*m->file_, arch);
  try {
    def->read_config(meta, c);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  const gguf::TensorInfo* te = m->file_->find_tensor("token_embd.weight");
  PG_CHECK(te && te->n_dims == 2, path + ": missing or malformed tensor 'token_embd.weight'");
  c.n_vocab = static_cast<int>(te->ne[1]);

  m->w_.layers.resize(static_cast<size_t>(c.n_layer));
  Binder binder(*m->file_);
  def->bind(binder, c, m->w_);
  c.tied_embeddings = m->file_->find_tensor("output.weight") == nullptr;

  // Every tensor of the file should have a slot: an unknown one means a variant we would compute wrongly.
  for (const auto& t : m->file_->tensors()) {
    if (binder.used().count(t.name) || t.name == "rope_freqs.weight") continue;
    PG_LOG(LogLevel::Warn, "%s: tensor '%s' is not used by the %s forward", path.c_str(), t.name.c_str(), arch.c_str());
  }

  size_t done = 0, total = 0;
  for (const auto& p : binder.pending()) total += p.info->nbytes;
  for (const auto& p : binder.pending()) {
    *p.slot = backend.load_weight(p.info->type, p.info->ne, p.info->data);
    done += p.info->nbytes;
    if (opt.progress && total > (64u << 20)) {
      const int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
      std::fprintf(stderr, "\rloading %s [%-40s] %3d%%", path.c_str(), std::string(static_cast<size_t>(pct * 40 / 100), '#').c_str(), pct);
    }
  }
  if (opt.progress && total > (64u << 20)) std::fprintf(stderr, "\n");
  if (c.tied_embeddings) m->w_.output = m->w_.tok_embd;

  // Bytes read per decoded token: every weight once, but only one embedding row and the active experts.
  ModelBytes& b = m->bytes_;
  for (const auto& t : m->file_->tensors()) b.file += t.nbytes;
  b.embedding_row = m->w_.tok_embd.row_bytes();
  for (const auto& p : binder.pending()) {
    const std::string& n = p.info->name;
    if (n == "token_embd.weight") continue;
    size_t bytes = p.info->nbytes;
    if (n.find("_exps.") != std::string::npos && c.n_expert > 0)
      bytes = bytes / static_cast<size_t>(c.n_expert) * static_cast<size_t>(c.n_expert_used);
    b.per_token += bytes;
  }
  if (c.tied_embeddings) b.per_token += m->w_.tok_embd.nbytes();
  return m;
}

std::unique_ptr<KvCache> Model::make_cache(const KvCacheOptions& opt) {
  std::vector<KvLayerShape> shapes(static_cast<size_t>(cfg_.n_layer));
  for (int il = 0; il < cfg_.n_layer; ++il)
    if (cfg_.layer_kind[static_cast<size_t>(il)] == LayerKind::Attention)
      shapes[static_cast<size_t>(il)] = {static_cast<int64_t>(cfg_.n_head_kv) * cfg_.head_dim,
                                         static_cast<int64_t>(cfg_.n_head_kv) * cfg_.head_dim_v, cfg_.n_head_kv};
  std::vector<RecurrentLayerShape> rec;
  if (cfg_.has_recurrent()) {
    rec.resize(static_cast<size_t>(cfg_.n_layer));
    const int64_t conv_dim = 2 * static_cast<int64_t>(cfg_.ssm_groups) * cfg_.ssm_state + cfg_.ssm_inner;
    for (int il = 0; il < cfg_.n_layer; ++il)
      if (cfg_.layer_kind[static_cast<size_t>(il)] == LayerKind::GatedDeltaNet)
        rec[static_cast<size_t>(il)] = {static_cast<int64_t>(cfg_.ssm_conv_kernel - 1) * conv_dim,
                                        static_cast<int64_t>(cfg_.ssm_dt_rank) * cfg_.ssm_state * cfg_.ssm_state};
  }
  return std::make_unique<PagedKvCache>(backend_, shapes, opt, rec);
}

void Model::ensure_workspace(KvCache& cache) {
  if (ws_ && ws_->cache_id == cache.id()) return;
  drop_workspace();
  ws_ = std::make_unique<Workspace>();
  Workspace& w = *ws_;
  const ModelConfig& c = cfg_;
  const int cap = w.cap = opt_.max_batch;
  auto mk = [&](Tensor& t, DType type, int64_t cols, int64_t rows) {
    t = backend_.alloc(type, std::max<int64_t>(cols, 1), std::max<int64_t>(rows, 1));
    w.all.push_back(&t);
  };
  const int64_t q_dim = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t ff = std::max({c.n_ff, c.n_ff_exp, c.n_ff_shexp, 1});
  mk(w.ids, DType::I32, cap, 1);
  mk(w.pos, DType::I32, cap, 1);
  mk(w.seq, DType::I32, cap, 1);
  mk(w.cells, DType::I32, cap, 1);
  mk(w.out_ids, DType::I32, cap, 1);
  mk(w.block_table, DType::I32, cache.max_blocks(), cache.n_seq());
  mk(w.x, DType::F32, c.n_embd, cap);
  mk(w.h, DType::F32, c.n_embd, cap);
  mk(w.o, DType::F32, c.n_embd, cap);
  mk(w.o2, DType::F32, c.n_embd, cap);
  mk(w.qfull, DType::F32, q_dim * (c.attn_output_gate ? 2 : 1), cap);
  mk(w.q, DType::F32, q_dim, cap);
  mk(w.gate, DType::F32, static_cast<int64_t>(c.n_head) * c.head_dim_v, cap);
  mk(w.k, DType::F32, static_cast<int64_t>(c.n_head_kv) * c.head_dim, cap);
  mk(w.v, DType::F32, static_cast<int64_t>(c.n_head_kv) * c.head_dim_v, cap);
  mk(w.attn, DType::F32, static_cast<int64_t>(c.n_head) * c.head_dim_v, cap);
  mk(w.ff_g, DType::F32, ff, cap);
  mk(w.ff_u, DType::F32, ff, cap);
  mk(w.r_logits, DType::F32, c.n_expert, cap);
  mk(w.r_ids, DType::I32, c.n_expert_used, cap);
  mk(w.r_w, DType::F32, c.n_expert_used, cap);
  mk(w.xo, DType::F32, c.n_embd, cap);
  mk(w.logits, DType::F32, c.n_vocab, Workspace::kLogitRows);
  mk(w.out_argmax, DType::I32, Workspace::kLogitRows, 1);
  mk(w.topk_ids, DType::I32, 64, Workspace::kLogitRows);
  mk(w.topk_lp, DType::F32, 64, Workspace::kLogitRows);
  w.all.push_back(&w.hid);  // allocated on first use (forward), freed with the rest
  if (c.n_ff_shexp > 0) mk(w.sh_gate, DType::F32, 1, cap);
  if (c.has_recurrent()) {
    const int64_t key_dim = static_cast<int64_t>(c.ssm_groups) * c.ssm_state, conv_dim = 2 * key_dim + c.ssm_inner;
    mk(w.dn_mixed, DType::F32, conv_dim, cap);
    mk(w.dn_conv, DType::F32, conv_dim, cap);
    mk(w.dn_q, DType::F32, key_dim, cap);
    mk(w.dn_k, DType::F32, key_dim, cap);
    mk(w.dn_v, DType::F32, c.ssm_inner, cap);
    mk(w.dn_z, DType::F32, c.ssm_inner, cap);
    mk(w.dn_out, DType::F32, c.ssm_inner, cap);
    mk(w.dn_g, DType::F32, c.ssm_dt_rank, cap);
    mk(w.dn_beta, DType::F32, c.ssm_dt_rank, cap);
    mk(w.rb_rows, DType::I32, cap, 1);
    mk(w.rb_capture, DType::I32, cap, 1);
    mk(w.rb_seg, DType::I32, 4, cap);
  }
  mk(w.kv_len, DType::I32, cap, 1);
  mk(w.tree_mask, DType::I32, kTreeMaskWords, cap);
  w.cache_id = cache.id();
  w.ab.block_table = w.block_table;
  w.ab.block_size = cache.block_size();
  w.ab.max_blocks = cache.max_blocks();
}

void Model::forward(const Batch& batch, KvCache& cache, std::vector<float>& logits, const ForwardOptions& fopt) {
  const int n = batch.size();
  PG_CHECK(n > 0, "empty batch");
  PG_CHECK(batch.positions.size() == static_cast<size_t>(n) && batch.seq.size() == static_cast<size_t>(n) &&
               batch.logits.size() == static_cast<size_t>(n) && (batch.parent.empty() || batch.parent.size() == static_cast<size_t>(n)),
           "malformed batch");
  for (int i = 0; i < n; ++i) {
    PG_CHECK(batch.tokens[static_cast<size_t>(i)] >= 0 && batch.tokens[static_cast<size_t>(i)] < cfg_.n_vocab,
             "token id " + std::to_string(batch.tokens[static_cast<size_t>(i)]) + " is outside the vocabulary (" + std::to_string(cfg_.n_vocab) + ")");
    PG_CHECK(batch.seq[static_cast<size_t>(i)] >= 0 && batch.seq[static_cast<size_t>(i)] < cache.n_seq(), "sequence slot out of range");
    PG_CHECK(batch.positions[static_cast<size_t>(i)] >= 0 && batch.positions[static_cast<size_t>(i)] < cache.n_ctx(),
             "position " + std::to_string(batch.positions[static_cast<size_t>(i)]) + " is beyond the context size " + std::to_string(cache.n_ctx()));
  }
  PG_CHECK(!fopt.argmax_only || fopt.argmax, "ForwardOptions::argmax_only needs ForwardOptions::argmax");
  PG_CHECK(!fopt.tokens_dev || (fopt.tokens_dev->type == DType::I32 && fopt.tokens_dev->n_elements() >= n),
           "ForwardOptions::tokens_dev needs an I32 tensor of at least one element per batch row");
  PG_CHECK(!fopt.argmax_dev || (fopt.argmax_dev->type == DType::I32 && fopt.argmax_dev->n_elements() >= batch.n_outputs()),
           "ForwardOptions::argmax_dev needs an I32 tensor of at least one element per output row");
  PG_CHECK(fopt.top_k >= 0 && fopt.top_k <= 64 && fopt.top_k <= cfg_.n_vocab,
           "ForwardOptions::top_k must be between 1 and 64 (and at most the vocabulary), or 0 for none");
  PG_CHECK(fopt.top_k == 0 || (fopt.topk_ids && fopt.topk_logprobs), "ForwardOptions::top_k needs topk_ids and topk_logprobs");
  PG_CHECK(fopt.hidden_layers.empty() || fopt.hidden || fopt.hidden_dev, "ForwardOptions::hidden_layers needs ForwardOptions::hidden");
  PG_CHECK(!fopt.hidden_dev || (fopt.hidden_all_rows && fopt.hidden_dev->type == DType::F32 && fopt.hidden_dev->cols() == cfg_.n_embd &&
                                fopt.hidden_dev->rows() >= static_cast<int64_t>(fopt.hidden_layers.size()) * batch.size()),
           "ForwardOptions::hidden_dev needs hidden_all_rows and an F32 tensor of hidden_layers.size()·n_rows rows of n_embd");
  for (size_t k = 0; k < fopt.hidden_layers.size(); ++k) {
    const int il = fopt.hidden_layers[k];
    PG_CHECK(il >= 0 && il < cfg_.n_layer, "ForwardOptions::hidden_layers: layer " + std::to_string(il) + " is not a layer of this model (" +
                                               std::to_string(cfg_.n_layer) + " layers)");
    PG_CHECK(std::find(fopt.hidden_layers.begin(), fopt.hidden_layers.begin() + static_cast<std::ptrdiff_t>(k), il) ==
                 fopt.hidden_layers.begin() + static_cast<std::ptrdiff_t>(k),
             "ForwardOptions::hidden_layers lists layer " + std::to_string(il) + " twice");
  }
  const TreePlan tp = plan_tree(batch, cache);
  std::unique_ptr<RecurrentPlan> plan;
  if (cfg_.has_recurrent()) {
    plan = std::make_unique<RecurrentPlan>(plan_recurrent(batch, cache, fopt));
  } else {
    PG_CHECK(!fopt.capture, "state capture is only meaningful for models with recurrent (linear-attention) layers");
  }
  ensure_workspace(cache);
  // Tree sequences: the cells of all their rows are reserved up front (a micro-batch may hold only part
  // of a tree), and once every row is computed the cache records the tree for commit(). Every sequence
  // of the batch first drops the record of an earlier tree (its rows overwrite those cells), so a
  // forward that fails leaves no tree to commit.
  std::vector<std::pair<int, std::pair<std::vector<int32_t>, std::vector<int32_t>>>> trees;  // (seq, (parent, rows))
  {
    std::vector<int32_t> n_tree(static_cast<size_t>(cache.n_seq()), 0);
    std::vector<uint8_t> seen(static_cast<size_t>(cache.n_seq()), 0);
    for (int r = 0; r < n; ++r) {
      const int s = batch.seq[static_cast<size_t>(r)];
      seen[static_cast<size_t>(s)] = 1;
      if (tp.tree[static_cast<size_t>(s)]) ++n_tree[static_cast<size_t>(s)];
    }
    for (int s = 0; s < cache.n_seq(); ++s) {
      if (!seen[static_cast<size_t>(s)]) continue;
      // An uncommitted tree is abandoned: release its cells past the sequence (truncate to the current
      // length touches no recurrent state).
      if (cache.tree_size(s) > 0) cache.truncate(s, cache.seq_len(s));
      if (!tp.tree[static_cast<size_t>(s)]) continue;
      if (!cache.reserve(s, cache.seq_len(s) + n_tree[static_cast<size_t>(s)])) throw Error("KV cache is full");
      std::vector<int32_t> parent, rows;
      for (int r = 0; r < n; ++r) {
        if (batch.seq[static_cast<size_t>(r)] != s) continue;
        const int p = batch.parent[static_cast<size_t>(r)];
        parent.push_back(p < 0 ? -1 : tp.j[static_cast<size_t>(p)]);
        rows.push_back(r);
      }
      trees.push_back({s, {std::move(parent), std::move(rows)}});
    }
  }
  if (plan && plan->capture) {
    // The state before the batch, so that rejecting every row is a rollback like the others.
    std::vector<uint8_t> seen(static_cast<size_t>(cache.n_seq()), 0);
    for (int r = 0; r < n; ++r) {
      const int s = batch.seq[static_cast<size_t>(r)];
      if (seen[static_cast<size_t>(s)] || plan->tree[static_cast<size_t>(s)]) continue;
      seen[static_cast<size_t>(s)] = 1;
      cache.recurrent()->backup(s, cache.seq_len(s) - 1);
    }
  }
  const int n_out = batch.n_outputs();
  {
    Workspace& w = *ws_;
    const int nh = static_cast<int>(fopt.hidden_layers.size());
    w.hid_slot.assign(static_cast<size_t>(cfg_.n_layer), -1);
    for (int k = 0; k < nh; ++k) {
      w.hid_slot[static_cast<size_t>(fopt.hidden_layers[static_cast<size_t>(k)])] = k;
    }
    if (nh > w.hid_slots) {
      // Recordings reference the old buffer: drop them with it.
      for (const auto& [key, id] : w.graphs) backend_.drop_graph(id);
      w.graphs.clear();
      w.warm.clear();
      if (w.hid.valid()) backend_.free(w.hid);
      w.hid = backend_.alloc(DType::F32, cfg_.n_embd, static_cast<int64_t>(nh) * w.cap);
      w.hid_slots = nh;
    }
    const int n_hid = fopt.hidden_all_rows ? n : n_out;
    if (fopt.hidden) fopt.hidden->assign(static_cast<size_t>(n_hid) * static_cast<size_t>(nh) * static_cast<size_t>(cfg_.n_embd), 0.0f);
  }
  logits.resize(static_cast<size_t>(n_out) * static_cast<size_t>(cfg_.n_vocab));
  size_t out_pos = 0;
  int out_rows = 0;
  std::vector<float> chunk;
  for (int b0 = 0; b0 < n; b0 += ws_->cap) {
    const int b1 = std::min(n, b0 + ws_->cap);
    chunk.clear();
    forward_ubatch(batch, b0, b1, cache, tp, plan.get(), fopt, out_rows, chunk);
    std::memcpy(logits.data() + out_pos, chunk.data(), chunk.size() * sizeof(float));
    out_pos += chunk.size();
    for (int r = b0; r < b1; ++r) out_rows += batch.logits[static_cast<size_t>(r)] ? 1 : 0;
  }
  for (auto& [s, t] : trees) cache.set_tree(s, std::move(t.first), std::move(t.second));
}

Model::TreePlan Model::plan_tree(const Batch& batch, const KvCache& cache) const {
  const int n = batch.size();
  TreePlan tp;
  tp.tree.assign(static_cast<size_t>(cache.n_seq()), 0);
  auto parent = [&](int r) { return batch.parent.empty() ? -1 : batch.parent[static_cast<size_t>(r)]; };
  for (int r = 0; r < n; ++r)
    if (parent(r) >= 0) tp.tree[static_cast<size_t>(batch.seq[static_cast<size_t>(r)])] = tp.any = true;
  for (int32_t s : batch.tree_seqs) {
    PG_CHECK(s >= 0 && s < cache.n_seq(), "Batch::tree_seqs: sequence slot out of range");
    tp.tree[static_cast<size_t>(s)] = tp.any = true;
  }
  if (!tp.any) return tp;
  // The shortest sliding window of the model's attention layers bounds a tree's depth: a row's window
  // is applied to the committed range, so every ancestor must lie inside it.
  int window = 0;
  for (int il = 0; il < cfg_.n_layer; ++il)
    if (cfg_.layer_kind[static_cast<size_t>(il)] == LayerKind::Attention && cfg_.layer_swa[static_cast<size_t>(il)] && cfg_.sliding_window > 0)
      window = cfg_.sliding_window;
  tp.j.assign(static_cast<size_t>(n), -1);
  tp.kv_len.assign(static_cast<size_t>(n), 0);
  tp.mask.assign(static_cast<size_t>(n) * kTreeMaskWords, 0);
  std::vector<int32_t> count(static_cast<size_t>(cache.n_seq()), 0);
  for (int r = 0; r < n; ++r) {
    const int s = batch.seq[static_cast<size_t>(r)], pos = batch.positions[static_cast<size_t>(r)];
    if (!tp.tree[static_cast<size_t>(s)]) {
      tp.kv_len[static_cast<size_t>(r)] = pos + 1;
      continue;
    }
    const std::string where = "tree row " + std::to_string(r) + " (sequence " + std::to_string(s) + ", position " + std::to_string(pos) + ")";
    const int len = cache.seq_len(s), p = parent(r);
    int& jj = count[static_cast<size_t>(s)];
    PG_CHECK(jj < kMaxTreeRows, "sequence " + std::to_string(s) + " has more than " + std::to_string(kMaxTreeRows) +
                                    " tree rows in one forward");
    PG_CHECK(len + jj < cache.n_ctx(), where + ": the tree's rows are stored past the sequence's " + std::to_string(len) +
                                           " tokens and do not fit in the context of " + std::to_string(cache.n_ctx()));
    uint32_t* m = tp.mask.data() + static_cast<size_t>(r) * kTreeMaskWords;
    if (p < 0) {
      PG_CHECK(pos == len, where + ": a tree root (parent -1) must be at the sequence's length " + std::to_string(len));
    } else {
      PG_CHECK(p < r && batch.seq[static_cast<size_t>(p)] == s, where + ": parent must be an earlier row of the same sequence");
      PG_CHECK(pos == batch.positions[static_cast<size_t>(p)] + 1, where + ": a tree row must be at its parent's position + 1");
      std::copy_n(tp.mask.data() + static_cast<size_t>(p) * kTreeMaskWords, kTreeMaskWords, m);
    }
    PG_CHECK(window == 0 || pos - len < window, where + ": tree depth " + std::to_string(pos - len) +
                                                    " reaches the sliding window (" + std::to_string(window) + ") of the model");
    m[jj / 32] |= 1u << (jj % 32);
    tp.j[static_cast<size_t>(r)] = jj++;
    tp.kv_len[static_cast<size_t>(r)] = len;
  }
  return tp;
}

Model::RecurrentPlan Model::plan_recurrent(const Batch& batch, const KvCache& cache, const ForwardOptions& fopt) const {
  const int n = batch.size();
  const RecurrentState* rs = cache.recurrent();
  PG_CHECK(rs != nullptr && rs->n_layer() == cfg_.n_layer, "this cache has no recurrent state for this hybrid model (make it with Model::make_cache)");
  for (int il = 0; il < cfg_.n_layer; ++il)
    PG_CHECK(rs->has_layer(il) == (cfg_.layer_kind[static_cast<size_t>(il)] == LayerKind::GatedDeltaNet),
             "this cache's recurrent layers do not match the model (make it with Model::make_cache)");
  RecurrentPlan plan;
  plan.capture = fopt.capture;
  if (fopt.capture)
    PG_CHECK(n <= rs->n_capture(), "a capturing forward of " + std::to_string(n) + " rows needs as many capture slots; the cache has " +
                                       std::to_string(rs->n_capture()) + " (KvCacheOptions::n_capture)");
  plan.tree.assign(static_cast<size_t>(cache.n_seq()), 0);
  auto parent = [&](int r) { return batch.parent.empty() ? -1 : batch.parent[static_cast<size_t>(r)]; };
  for (int r = 0; r < n; ++r)
    if (parent(r) >= 0) plan.tree[static_cast<size_t>(batch.seq[static_cast<size_t>(r)])] = 1;
  for (int32_t s : batch.tree_seqs) plan.tree[static_cast<size_t>(s)] = 1;  // checked by plan_tree
  plan.pred.assign(static_cast<size_t>(n), -1);
  std::vector<int32_t> last(static_cast<size_t>(cache.n_seq()), -1);  // chain: previous row of the sequence
  for (int r = 0; r < n; ++r) {
    const int s = batch.seq[static_cast<size_t>(r)], pos = batch.positions[static_cast<size_t>(r)];
    const std::string where = "row " + std::to_string(r) + " (sequence " + std::to_string(s) + ", position " + std::to_string(pos) + ")";
    int pred;
    if (plan.tree[static_cast<size_t>(s)]) {
      PG_CHECK(fopt.capture, "tree batches need ForwardOptions::capture: each node's state is kept for its children");
      pred = parent(r);
      if (pred >= 0) {
        PG_CHECK(pred < r && batch.seq[static_cast<size_t>(pred)] == s, where + ": parent must be an earlier row of the same sequence");
        PG_CHECK(pos == batch.positions[static_cast<size_t>(pred)] + 1, where + ": a tree row must be at its parent's position + 1");
      }
    } else {
      pred = last[static_cast<size_t>(s)];
      last[static_cast<size_t>(s)] = r;
      if (pred >= 0)
        PG_CHECK(pos == batch.positions[static_cast<size_t>(pred)] + 1,
                 where + ": rows of a sequence must take consecutive positions (recurrent layers cannot skip or rewrite history)");
    }
    if (pred < 0)
      PG_CHECK(pos == cache.seq_len(s), where + ": the sequence holds " + std::to_string(cache.seq_len(s)) +
                                            " tokens; a model with recurrent layers can only continue at that position (truncate first)");
    plan.pred[static_cast<size_t>(r)] = pred;
  }
  return plan;
}

void Model::build_recurrent_batch(const Batch& batch, int b0, int b1, const KvCache& cache, const RecurrentPlan& plan) {
  Workspace& w = *ws_;
  const RecurrentState& rs = *cache.recurrent();
  const int n = b1 - b0;
  struct Seg {
    std::vector<int32_t> rows;  // micro-batch rows
    int src, dst;
  };
  std::vector<Seg> segs;
  std::vector<int> seg_of_last(static_cast<size_t>(n), -1);  // micro-batch row → segment it ends (or -1)
  RecurrentBatch& rb = w.rb;
  rb.h_capture.assign(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i) {
    const int r = b0 + i, s = batch.seq[static_cast<size_t>(r)];
    const bool tree = plan.tree[static_cast<size_t>(s)];
    const int pred = plan.pred[static_cast<size_t>(r)];
    if (plan.capture) rb.h_capture[static_cast<size_t>(i)] = rs.capture_slot(r);
    int sg = pred >= b0 ? seg_of_last[static_cast<size_t>(pred - b0)] : -1;
    if (sg < 0) {
      // A new chain: from the committed state (first row, or a chain continuing an earlier micro-batch,
      // which left its state there), or from the captured state of a tree row's parent.
      const int src = pred < 0 || !tree ? s : rs.capture_slot(pred);
      segs.push_back({{}, src, tree ? -1 : s});
      sg = static_cast<int>(segs.size()) - 1;
    } else {
      seg_of_last[static_cast<size_t>(pred - b0)] = -1;
    }
    segs[static_cast<size_t>(sg)].rows.push_back(i);
    seg_of_last[static_cast<size_t>(i)] = sg;
  }
  rb.n_tokens = n;
  rb.n_segments = static_cast<int>(segs.size());
  rb.h_rows.clear();
  rb.h_seg.clear();
  for (const Seg& g : segs) {
    rb.h_seg.insert(rb.h_seg.end(), {static_cast<int32_t>(rb.h_rows.size()), static_cast<int32_t>(g.rows.size()), g.src, g.dst});
    rb.h_rows.insert(rb.h_rows.end(), g.rows.begin(), g.rows.end());
  }
  backend_.upload(w.rb_rows, rb.h_rows.data(), rb.h_rows.size() * 4);
  backend_.upload(w.rb_capture, rb.h_capture.data(), rb.h_capture.size() * 4);
  backend_.upload(w.rb_seg, rb.h_seg.data(), rb.h_seg.size() * 4);
  rb.rows = w.rb_rows.reshape_2d(n, 1);
  rb.capture = w.rb_capture.reshape_2d(n, 1);
  rb.seg = w.rb_seg.rows_view(0, rb.n_segments);
}

void Model::forward_ubatch(const Batch& batch, int b0, int b1, KvCache& cache, const TreePlan& tp, const RecurrentPlan* plan,
                           const ForwardOptions& fopt, int out0, std::vector<float>& logits) {
  Workspace& w = *ws_;
  const ModelConfig& c = cfg_;
  const int n = b1 - b0;
  Backend& be = backend_;

  // Host-side indices for this micro-batch.
  std::vector<int32_t> cells(static_cast<size_t>(n)), out_rows;
  int max_kv = 0;
  bool tree_rows = false;
  for (int i = 0; i < n; ++i) {
    const int r = b0 + i;
    const int s = batch.seq[static_cast<size_t>(r)], p = batch.positions[static_cast<size_t>(r)];
    if (tp.any && tp.tree[static_cast<size_t>(s)]) {
      // Tree row j lives at logical position seq_len + j (reserved by forward); it sees up to itself.
      const int lp = tp.kv_len[static_cast<size_t>(r)] + tp.j[static_cast<size_t>(r)];
      cells[static_cast<size_t>(i)] = cache.write_cell(s, lp);
      max_kv = std::max(max_kv, lp + 1);
      tree_rows = true;
    } else {
      if (!cache.reserve(s, std::max(cache.seq_len(s), p + 1))) throw Error("KV cache is full");
      cells[static_cast<size_t>(i)] = cache.write_cell(s, p);
      max_kv = std::max(max_kv, p + 1);
    }
    if (batch.logits[static_cast<size_t>(r)]) out_rows.push_back(i);
  }
  if (fopt.tokens_dev) {
    // Ids produced on the backend by an earlier step (its argmax_dev): nothing comes from the host.
    const Tensor src = fopt.tokens_dev->reshape_2d(1, fopt.tokens_dev->n_elements()).rows_view(b0, n);  // I32 (n, 1)
    Tensor dst = w.ids.reshape_2d(1, w.cap).rows_view(0, n);                                             // I32 (n, 1)
    be.copy(src, dst);
  } else {
    be.upload(w.ids, batch.tokens.data() + b0, static_cast<size_t>(n) * 4);
  }
  be.upload(w.pos, batch.positions.data() + b0, static_cast<size_t>(n) * 4);
  be.upload(w.seq, batch.seq.data() + b0, static_cast<size_t>(n) * 4);
  be.upload(w.cells, cells.data(), static_cast<size_t>(n) * 4);
  // A workspace made for this cache has never seen its table (the cache's dirty flag may have been
  // cleared by an earlier workspace, before another cache took the model's workspace).
  if (cache.table_dirty() || !w.table_loaded) {
    be.upload(w.block_table, cache.block_table().data(), cache.block_table().size() * 4);
    cache.clear_dirty();
    w.table_loaded = true;
  }
  w.ab.n_tokens = n;
  w.ab.positions = w.pos.rows_view(0, 1).reshape_2d(n, 1);
  w.ab.seq = w.seq.reshape_2d(n, 1);
  w.ab.cells = w.cells.reshape_2d(n, 1);
  w.ab.max_kv_len = max_kv;
  if (tree_rows) {
    be.upload(w.kv_len, tp.kv_len.data() + b0, static_cast<size_t>(n) * 4);
    be.upload(w.tree_mask, tp.mask.data() + static_cast<size_t>(b0) * kTreeMaskWords, static_cast<size_t>(n) * kTreeMaskWords * 4);
    w.ab.kv_len = w.kv_len.reshape_2d(n, 1);
    w.ab.tree_mask = w.tree_mask.rows_view(0, n);
  } else {
    w.ab.kv_len = Tensor{};
    w.ab.tree_mask = Tensor{};
  }
  if (plan) build_recurrent_batch(batch, b0, b1, cache, *plan);
  const int m = static_cast<int>(out_rows.size());
  const int nh = static_cast<int>(fopt.hidden_layers.size());
  // Output rows are gathered inside the layers too when hidden states are captured.
  if (m > 0) be.upload(w.out_ids, out_rows.data(), static_cast<size_t>(m) * 4);
  Tensor out_ids = w.out_ids.reshape_2d(std::max(m, 1), 1);

  Tensor ids = w.ids.reshape_2d(n, 1);
  Tensor x = w.x.rows_view(0, n), h = w.h.rows_view(0, n), o = w.o.rows_view(0, n);
  auto layers = [&] {
    be.get_rows(w_.tok_embd, ids, x);
    if (c.embd_scale != 0.0f) be.scale(x, c.embd_scale);
    // Each residual add is fused with the RMSNorm that reads its result (Backend::add_rms_norm, bit-identical
    // to the two ops): the attention residual with ffn_norm, the FFN residual with the next layer's attn_norm.
    for (int il = 0; il < c.n_layer; ++il) {
      const LayerWeights& l = w_.layers[static_cast<size_t>(il)];
      if (il == 0) be.rms_norm(x, l.attn_norm, h, c.rms_eps);  // later layers: normed by the previous one's residual step
      if (c.layer_kind[static_cast<size_t>(il)] == LayerKind::Attention) {
        attention_block(il, n, cache);
      } else {
        deltanet_block(il, n, cache);
      }
      if (l.attn_post_norm.valid()) be.rms_norm(o, l.attn_post_norm, o, c.rms_eps);
      be.add_rms_norm(x, o, l.ffn_norm, h, c.rms_eps);
      ffn_block(il, n);
      if (l.ffn_post_norm.valid()) be.rms_norm(o, l.ffn_post_norm, o, c.rms_eps);
      if (il + 1 < c.n_layer)
        be.add_rms_norm(x, o, w_.layers[static_cast<size_t>(il) + 1].attn_norm, h, c.rms_eps);
      else
        be.add(x, o, x);
      const int slot = w.hid_slot[static_cast<size_t>(il)];
      if (slot >= 0 && fopt.hidden_all_rows) {
        Tensor hv = w.hid.rows_view(static_cast<int64_t>(slot) * w.cap, n);
        be.copy(x, hv);
      } else if (slot >= 0 && m > 0) {
        Tensor hv = w.hid.rows_view(static_cast<int64_t>(slot) * w.cap, m);
        be.get_rows(x, out_ids, hv);
      }
    }
  };
  // Decode and verify steps (up to Backend::graph_max_rows rows) on a device with graphs: the layers are recorded once per step shape and
  // replayed, so a step costs one launch instead of hundreds. Every op reads its per-step inputs (token
  // ids, positions, cells, block table, recurrent segments) from the workspace, uploaded above; what the
  // launches depend on on the host is the key: rows, the KV length rounded up to a power-of-two bucket
  // (attention grids are sized for the bucket, blocks past a row's length exit at once), and the shape of
  // the recurrent segments.
  if (be.graphs_supported() && n <= be.graph_max_rows()) {
    int bucket = 256;
    while (bucket < max_kv) bucket *= 2;
    w.ab.max_kv_len = bucket;
    // Whether the step has tree rows changes which attention form the backend records (kv_len and
    // tree_mask are workspace tensors, uploaded above like the positions).
    std::vector<int32_t> key = {n, bucket, tree_rows ? 1 : 0};
    if (plan) {
      // Segment lengths and captured rows shape the launches; a segment starting from a capture slot
      // (tree verification) can make the backend run segments in order, so those slots are in the key.
      key.push_back(w.rb.n_segments);
      for (int sg = 0; sg < w.rb.n_segments; ++sg) {
        key.push_back(w.rb.h_seg[static_cast<size_t>(4 * sg + 1)]);
        const int32_t src = w.rb.h_seg[static_cast<size_t>(4 * sg + 2)];
        key.push_back(src >= cache.n_seq() ? src : -1);
      }
      for (int32_t cap : w.rb.h_capture) key.push_back(cap >= 0 ? 1 : 0);
    }
    if (nh > 0) {
      // Hidden-state gathers are recorded for this many output rows and these layers.
      key.push_back(fopt.hidden_all_rows ? -1000 - n : -m);
      for (int il : fopt.hidden_layers) key.push_back(il);
    }
    if (auto it = w.graphs.find(key); it != w.graphs.end()) {
      be.replay_graph(it->second);
    } else if (w.warm.count(key)) {
      be.begin_graph();
      try {
        layers();
      } catch (...) {
        be.abort_graph();
        throw;
      }
      const int id = be.end_graph();
      w.graphs.emplace(key, id);
      be.replay_graph(id);
    } else {
      layers();
      w.warm.insert(key);
    }
  } else {
    layers();
  }

  // Sequence lengths advance past the rows just written; tree rows are drafts, not history.
  for (int i = 0; i < n; ++i) {
    const int r = b0 + i;
    const int s = batch.seq[static_cast<size_t>(r)];
    if (tp.any && tp.tree[static_cast<size_t>(s)]) continue;
    cache.set_len(s, std::max(cache.seq_len(s), batch.positions[static_cast<size_t>(r)] + 1));
  }
  if (plan && plan->capture) {
    RecurrentState& rs = *cache.recurrent();
    for (int i = 0; i < n; ++i) {
      const int r = b0 + i, s = batch.seq[static_cast<size_t>(r)];
      rs.set_tag(r, {s, batch.positions[static_cast<size_t>(r)], !plan->tree[static_cast<size_t>(s)]});
    }
  }

  if (nh > 0 && fopt.hidden_all_rows && fopt.hidden_dev) {
    // Every row of the micro-batch, at its batch index, staying on the backend.
    const int64_t n_rows = batch.size();
    for (int k = 0; k < nh; ++k) {
      Tensor dst = fopt.hidden_dev->rows_view(static_cast<int64_t>(k) * n_rows + b0, n);
      be.copy(w.hid.rows_view(static_cast<int64_t>(k) * w.cap, n), dst);
    }
  }
  if (nh > 0 && fopt.hidden_all_rows && fopt.hidden) {
    // Every row of the micro-batch, at its batch index.
    const size_t e = static_cast<size_t>(c.n_embd);
    std::vector<float> staging(static_cast<size_t>(n) * e);
    for (int k = 0; k < nh; ++k) {
      be.download(w.hid.rows_view(static_cast<int64_t>(k) * w.cap, n), staging.data(), staging.size() * sizeof(float));
      for (int i = 0; i < n; ++i)
        std::memcpy(fopt.hidden->data() + (static_cast<size_t>(b0 + i) * static_cast<size_t>(nh) + static_cast<size_t>(k)) * e,
                    staging.data() + static_cast<size_t>(i) * e, e * sizeof(float));
    }
  }
  if (m == 0) return;
  if (nh > 0 && !fopt.hidden_all_rows) {
    // Slot k holds (m, n_embd); the caller's layout is (n_outputs, nh·n_embd).
    const size_t e = static_cast<size_t>(c.n_embd);
    std::vector<float> staging(static_cast<size_t>(m) * e);
    for (int k = 0; k < nh; ++k) {
      be.download(w.hid.rows_view(static_cast<int64_t>(k) * w.cap, m), staging.data(), staging.size() * sizeof(float));
      for (int i = 0; i < m; ++i)
        std::memcpy(fopt.hidden->data() + (static_cast<size_t>(out0 + i) * static_cast<size_t>(nh) + static_cast<size_t>(k)) * e,
                    staging.data() + static_cast<size_t>(i) * e, e * sizeof(float));
    }
  }
  Tensor xo = w.xo.rows_view(0, m);
  be.get_rows(x, out_ids, xo);
  be.rms_norm(xo, w_.output_norm, xo, c.rms_eps);
  logits.resize(static_cast<size_t>(m) * static_cast<size_t>(c.n_vocab));
  const size_t row_bytes = static_cast<size_t>(c.n_vocab) * sizeof(float);
  bool host_out = fopt.argmax || fopt.top_k > 0 || nh > 0;  // something was downloaded
  for (int r0 = 0; r0 < m; r0 += Workspace::kLogitRows) {
    const int rn = std::min(m - r0, Workspace::kLogitRows);
    Tensor lg = w.logits.rows_view(0, rn);
    be.matmul(w_.output, xo.rows_view(r0, rn), lg);
    if (c.final_logit_softcap > 0) be.softcap(lg, c.final_logit_softcap);
    if (fopt.argmax_dev) {
      // Greedy tokens staying on the backend (the next device-fed step's token ids).
      Tensor am = fopt.argmax_dev->reshape_2d(1, fopt.argmax_dev->n_elements()).rows_view(out0 + r0, rn).reshape_2d(rn, 1);  // I32 (rn)
      be.argmax_rows(lg, am);
    }
    if (fopt.argmax) {
      // Greedy tokens on the backend: 4 bytes per row come back instead of the whole vocabulary.
      Tensor am = w.out_argmax.reshape_2d(rn, 1);
      be.argmax_rows(lg, am);
      be.download(am, fopt.argmax + out0 + r0, static_cast<size_t>(rn) * sizeof(int32_t));
    }
    if (fopt.top_k > 0) {
      const int k = fopt.top_k;
      Tensor ti = w.topk_ids.reshape_2d(k, rn), tl = w.topk_lp.reshape_2d(k, rn);  // (rn, k) each
      be.topk_rows(lg, k, ti, tl);
      const size_t at = static_cast<size_t>(out0 + r0) * static_cast<size_t>(k), cnt = static_cast<size_t>(rn) * static_cast<size_t>(k);
      be.download(ti, fopt.topk_ids + at, cnt * sizeof(int32_t));
      be.download(tl, fopt.topk_logprobs + at, cnt * sizeof(float));
    }
    // Logits rows the caller wants, in runs of consecutive rows (one copy per run).
    for (int i = 0; i < rn;) {
      auto wanted = [&](int k) {
        const int o = out0 + r0 + k;
        return !(fopt.argmax_only && fopt.argmax_only[o]) && !(fopt.logits_skip && fopt.logits_skip[o]);
      };
      if (!wanted(i)) {
        ++i;
        continue;
      }
      int j = i + 1;
      while (j < rn && wanted(j)) ++j;
      be.download(lg, logits.data() + static_cast<size_t>(r0 + i) * c.n_vocab, static_cast<size_t>(j - i) * row_bytes,
                  static_cast<size_t>(i) * row_bytes);
      host_out = true;
      i = j;
    }
  }
  // A device-fed step with nothing for the host leaves the backend running: the caller's next step
  // queues behind it, and its final download waits for all of them.
  if (host_out || !fopt.argmax_dev) be.synchronize();
}

void Model::attention_block(int il, int n, KvCache& cache) {
  Workspace& w = *ws_;
  const ModelConfig& c = cfg_;
  const LayerWeights& l = w_.layers[static_cast<size_t>(il)];
  Backend& be = backend_;
  Tensor h = w.h.rows_view(0, n), o = w.o.rows_view(0, n);
  Tensor q = w.q.rows_view(0, n), k = w.k.rows_view(0, n), v = w.v.rows_view(0, n), attn = w.attn.rows_view(0, n);
  Tensor gate = w.gate.rows_view(0, n);

  if (c.attn_output_gate) {
    // The q projection holds, per head, [query (head_dim) | gate (head_dim)].
    Tensor qfull = w.qfull.rows_view(0, n);
    be.matmul_shared(h, {{&l.wq, &qfull}, {&l.wk, &k}, {&l.wv, &v}});
    be.gather_cols(qfull, 2 * c.head_dim, 0, q);
    be.gather_cols(qfull, 2 * c.head_dim, c.head_dim, gate);
  } else {
    be.matmul_shared(h, {{&l.wq, &q}, {&l.wk, &k}, {&l.wv, &v}});
    if (l.bq.valid()) be.add_bias(q, l.bq);
  }
  if (l.bk.valid()) be.add_bias(k, l.bk);
  if (l.bv.valid()) be.add_bias(v, l.bv);

  const bool swa = c.layer_swa[static_cast<size_t>(il)];
  const float base = swa ? c.rope_base_swa : c.rope_base;
  // Per-head q/k RMSNorm (qwen3, gemma3, qwen35; invalid weights = none: llama, qwen2) and RoPE of both:
  // one op, which CUDA can run as one launch instead of four (issue 11); elsewhere the same four ops.
  be.qk_norm_rope(q, k, l.q_norm, l.k_norm, w.ab.positions, c.n_head, c.n_head_kv, c.head_dim, c.n_rot, base, c.rope_style,
                  c.rms_eps);

  KvLayer& kv = cache.layer(il);
  be.kv_store(kv, k, v, w.ab);
  AttentionParams p;
  p.n_head = c.n_head;
  p.n_head_kv = c.n_head_kv;
  p.head_dim = c.head_dim;
  p.scale = c.kq_scale();
  p.sliding_window = swa ? c.sliding_window : 0;
  p.logit_softcap = c.attn_logit_softcap;
  be.attention(q, kv, w.ab, p, attn);
  if (c.attn_output_gate) be.mul_sigmoid(attn, gate);
  be.matmul(l.wo, attn, o);
}

// Gated DeltaNet mixer (golden/README §4.5): projections, causal conv + SiLU, L2-normalised q/k, the
// gated delta rule over the recurrent state, per-head RMSNorm gated by silu(z), output projection.
void Model::deltanet_block(int il, int n, KvCache& cache) {
  Workspace& w = *ws_;
  const ModelConfig& c = cfg_;
  const LayerWeights& l = w_.layers[static_cast<size_t>(il)];
  Backend& be = backend_;
  RecurrentState::Layer& st = cache.recurrent()->layer(il);
  const int ds = c.ssm_state;  // head_k_dim = head_v_dim
  const int64_t key_dim = static_cast<int64_t>(c.ssm_groups) * ds, conv_dim = 2 * key_dim + c.ssm_inner;
  Tensor h = w.h.rows_view(0, n), o = w.o.rows_view(0, n);
  Tensor mixed = w.dn_mixed.rows_view(0, n), conv = w.dn_conv.rows_view(0, n);
  Tensor q = w.dn_q.rows_view(0, n), k = w.dn_k.rows_view(0, n), v = w.dn_v.rows_view(0, n);
  Tensor z = w.dn_z.rows_view(0, n), out = w.dn_out.rows_view(0, n);
  Tensor g = w.dn_g.rows_view(0, n), beta = w.dn_beta.rows_view(0, n);

  be.matmul_shared(h, {{&l.ssm_qkv, &mixed}, {&l.ssm_z, &z}, {&l.ssm_beta, &beta}, {&l.ssm_alpha, &g}});
  be.deltanet_gates(g, beta, l.ssm_dt_bias, l.ssm_a);
  be.ssm_conv(mixed, l.ssm_conv1d, st.conv, w.rb, /*silu=*/true, conv);
  be.gather_cols(conv, static_cast<int>(conv_dim), 0, q);
  be.gather_cols(conv, static_cast<int>(conv_dim), static_cast<int>(key_dim), k);
  be.gather_cols(conv, static_cast<int>(conv_dim), static_cast<int>(2 * key_dim), v);
  // L2 norm per head as llama.cpp computes it: x/sqrt(Σx² + eps) = RMSNorm(x, eps/d)/sqrt(d).
  const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(ds));
  for (Tensor* t : {&q, &k}) {
    Tensor th = t->reshape_2d(ds, static_cast<int64_t>(n) * c.ssm_groups);
    be.rms_norm(th, Tensor{}, th, c.rms_eps / static_cast<float>(ds));
    be.scale(*t, inv_sqrt_d);
  }
  be.gated_delta_net(q, k, v, g, beta, st.ssm, w.rb, ds, ds, inv_sqrt_d, out);
  Tensor oh = out.reshape_2d(ds, static_cast<int64_t>(n) * c.ssm_dt_rank);
  be.rms_norm(oh, l.ssm_norm, oh, c.rms_eps);
  be.glu(z, out, out, Activation::Silu);
  be.matmul(l.ssm_out, out, o);
}

void Model::ffn_block(int il, int n) {
  Workspace& w = *ws_;
  const ModelConfig& c = cfg_;
  const LayerWeights& l = w_.layers[static_cast<size_t>(il)];
  Backend& be = backend_;
  Tensor h = w.h.rows_view(0, n), o = w.o.rows_view(0, n);
  if (!c.is_moe()) {
    Tensor g = w.ff_g.reshape_2d(c.n_ff, w.cap).rows_view(0, n), u = w.ff_u.reshape_2d(c.n_ff, w.cap).rows_view(0, n);
    be.matmul_glu(h, l.ffn_gate, l.ffn_up, c.ffn_act, g, u);
    be.matmul(l.ffn_down, g, o);
    return;
  }
  Tensor rl = w.r_logits.rows_view(0, n), ids = w.r_ids.rows_view(0, n), rw = w.r_w.rows_view(0, n);
  be.matmul(l.router, h, rl);
  be.moe_route(rl, c.n_expert_used, c.expert_gating, c.expert_norm_topk, c.expert_weights_scale, ids, rw);
  be.moe_ffn(h, ids, rw, l.gate_exps, l.up_exps, l.down_exps, c.ffn_act, o);
  if (c.n_ff_shexp > 0) {
    Tensor g = w.ff_g.reshape_2d(c.n_ff_shexp, w.cap).rows_view(0, n), u = w.ff_u.reshape_2d(c.n_ff_shexp, w.cap).rows_view(0, n);
    Tensor o2 = w.o2.rows_view(0, n);
    be.matmul_glu(h, l.gate_shexp, l.up_shexp, c.ffn_act, g, u);
    be.matmul(l.down_shexp, g, o2);
    if (l.router_shexp.valid()) {
      Tensor sg = w.sh_gate.rows_view(0, n);
      be.matmul(l.router_shexp, h, sg);
      be.mul_rows_sigmoid(o2, sg);
    }
    be.add(o, o2, o);
  }
}

}  // namespace pg
