// Draft-model drafting: autoregressive steps of a small model that shares the target's vocabulary,
// one forward per depth for all sequences asking in this step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "kv/recurrent_state.h"
#include "model/model.h"
#include "spec/drafter.h"

namespace pg::spec {

void check_same_vocab(const Model& target, const Model& draft, const std::string& draft_path) {
  const int nt = target.config().n_vocab, nd = draft.config().n_vocab;
  PG_CHECK(nt == nd, "draft model '" + draft_path + "' has a vocabulary of " + std::to_string(nd) +
                         " tokens, the target's has " + std::to_string(nt) + ": a draft must share the target's vocabulary");
  const char* key = "tokenizer.ggml.tokens";
  const bool ht = target.file().has(key), hd = draft.file().has(key);
  PG_CHECK(ht == hd, "draft model '" + draft_path + "': one of the two models has no tokenizer; cannot check that the vocabularies match");
  if (!ht) return;
  const auto a = target.file().get_string_array(key), b = draft.file().get_string_array(key);
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    PG_CHECK(a[i] == b[i], "draft model '" + draft_path + "' has another vocabulary than the target (token " + std::to_string(i) +
                               " differs): a draft must share the target's vocabulary");
}

namespace {

class ModelDrafter final : public Drafter {
 public:
  ModelDrafter(Model& m, int n_slots, int n_ctx, int max_depth, const ModelDrafterOptions& opt)
      : m_(m), opt_(opt), n_vocab_(m.config().n_vocab), n_slots_(n_slots), seen_(static_cast<size_t>(n_slots)) {
    KvCacheOptions ko;
    ko.n_seq = n_slots;
    // Drafts run up to a tree's depth past the target's context.
    ko.n_ctx = n_ctx + kMaxTreeNodes;
    if (m_.config().has_recurrent()) {
      // Capture slots: one per drafting row of a forward (one per slot), then the kept states, slot s
      // depth d at n_slots + s·stash + d (d = 0: after the root).
      stash_ = std::clamp(max_depth, 1, kMaxTreeNodes - 1) + 1;
      ko.n_capture = n_slots + n_slots * stash_;
    }
    cache_ = m_.make_cache(ko);
  }
  ~ModelDrafter() override {
    if (dev_ids_.valid()) m_.backend().free(dev_ids_);
  }
  const char* name() const override { return "draft"; }
  void release(int slot) override {
    cache_->clear(slot);
    seen_[static_cast<size_t>(slot)].clear();
  }

  void propose(std::span<const DraftInput> in, std::span<Draft> out) override {
    const size_t nq = in.size();
    want_.assign(nq, 0);
    RecurrentState* rs = stash_ > 0 ? cache_->recurrent() : nullptr;
    // 1. Catch each slot's cache up with its history: keep the longest common prefix of what the cache
    //    holds and the history (the accepted drafts), drop the rest, feed the remainder up to the root.
    //    A hybrid draft rolls its recurrent state back to a state kept from the last step's drafting.
    batch_.clear();
    for (size_t i = 0; i < nq; ++i) {
      const DraftInput& q = in[i];
      out[i].chain.clear();
      out[i].topk.clear();
      out[i].q.clear();
      out[i].has_tree = false;
      const int h = static_cast<int>(q.history.size());
      want_[i] = std::max(0, std::min(q.n_max, cache_->n_ctx() - h));
      PG_CHECK(h >= 1, "draft request without history");
      auto& seen = seen_[static_cast<size_t>(q.slot)];
      int c = 0;
      const int lim = std::min<int>(static_cast<int>(seen.size()), h - 1);
      while (c < lim && seen[static_cast<size_t>(c)] == q.history[static_cast<size_t>(c)]) ++c;
      try {
        cache_->truncate(q.slot, c);
      } catch (const Error&) {
        // No state kept at that position (a hybrid draft's first step after a jump): start over.
        cache_->clear(q.slot);
        c = 0;
        ++replays_;
      }
      seen.assign(q.history.begin(), q.history.end());
      for (int p = c; p < h; ++p) batch_.add(q.history[static_cast<size_t>(p)], p, q.slot, p + 1 == h);
      rows_fed_ += static_cast<uint64_t>(h - c);
    }
    active_.clear();  // queries still drafting
    for (size_t i = 0; i < nq; ++i) active_.push_back(static_cast<int>(i));
    // Candidates per depth come from the backend (top-k ids + log-probs): a few bytes per row back
    // instead of the vocabulary's logits, except for sampled drafts, which need the distribution.
    int k = 1;
    bool need_lp = false;  // some query needs log-probs (trees, p-min); else the argmax suffices
    for (const auto& q : in) {
      k = std::max(k, q.k);
      need_lp |= q.k > 1 || q.p_min > 0;
    }
    k = std::min({k, kMaxBackendTopK, n_vocab_});
    if (device_chain_fits(in)) {
      propose_device_chain(in, out);
      return;
    }
    for (int depth = 0; !active_.empty(); ++depth) {
      const size_t n_out = active_.size();
      if (batch_.size() > 0) {
        ForwardOptions f;
        skip_.resize(n_out);
        for (size_t r = 0; r < n_out; ++r) skip_[r] = in[static_cast<size_t>(active_[r])].sampler ? 0 : 1;
        ids_.resize(n_out * static_cast<size_t>(k));
        lps_.assign(n_out * static_cast<size_t>(k), 0.0f);
        if (need_lp) {
          f.top_k = k;
          f.topk_ids = ids_.data();
          f.topk_logprobs = lps_.data();
          f.logits_skip = skip_.data();
        } else {
          // Greedy chains without p-min: the argmax alone (the top-k's log-softmax over the vocabulary
          // costs a fifth of this small model's step).
          f.argmax = ids_.data();
          f.argmax_only = skip_.data();
        }
        // Hybrid drafts: the drafting rows (one per query) capture their state, kept per depth below.
        f.capture = rs != nullptr && depth > 0;
        const auto t0 = std::chrono::steady_clock::now();
        m_.forward(batch_, *cache_, logits_, f);
        if (depth > 0) {
          ++forwards_;
          seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        if (f.capture) {
          for (size_t r = 0; r < n_out; ++r) {
            const int slot = in[static_cast<size_t>(active_[r])].slot;
            if (depth == 1) keep(*rs, rs->backup_slot(slot) - rs->capture_slot(0), slot, 0);  // the root's state
            if (depth < stash_) keep(*rs, static_cast<int>(r), slot, depth);
          }
        }
      }
      next_.clear();
      batch_.clear();
      for (size_t r = 0; r < n_out; ++r) {
        const int i = active_[r];
        const DraftInput& q = in[static_cast<size_t>(i)];
        Draft& d = out[static_cast<size_t>(i)];
        if (depth >= want_[static_cast<size_t>(i)]) continue;
        const float* lp = lps_.data() + r * static_cast<size_t>(k);
        const int32_t* id = ids_.data() + r * static_cast<size_t>(k);
        const bool confident = std::exp(lp[0]) >= q.p_min;
        int32_t tok = id[0];
        if (q.sampler) {
          if (!confident) continue;
          d.q.emplace_back();
          tok = q.sampler->sample(logits_.data() + r * static_cast<size_t>(n_vocab_), d.q.back());
        } else if (q.k <= 1 && !confident) {
          continue;  // a chain drops the doubtful token
        }
        d.chain.push_back(tok);
        const int kq = std::max(1, std::min(q.k, k));
        TopK t;
        t.ids.assign(id, id + kq);
        t.logprobs.assign(lp, lp + kq);
        d.topk.push_back(std::move(t));
        if (confident && depth + 1 < want_[static_cast<size_t>(i)]) {
          auto& seen = seen_[static_cast<size_t>(q.slot)];
          batch_.add(tok, static_cast<int32_t>(seen.size()), q.slot, true);
          seen.push_back(tok);
          next_.push_back(i);
        }
      }
      std::swap(active_, next_);
    }
  }

  uint64_t rows_fed() const override { return rows_fed_; }
  uint64_t replays() const override { return replays_; }
  uint64_t forwards() const override { return forwards_; }
  double forward_seconds() const override { return seconds_; }
  uint64_t device_chain_steps() const override { return device_steps_; }

 private:
  // Whether this step's queries can take the device-fed chain (see ModelDrafterOptions::device_chain):
  // all greedy chains of the same depth ≥ 1 (so every row drafts every depth: no row leaves the batch,
  // the step shapes stay fixed), no recurrent state to keep per depth.
  bool device_chain_fits(std::span<const DraftInput> in) const {
    if (!opt_.device_chain || stash_ > 0 || in.empty()) return false;
    for (size_t i = 0; i < in.size(); ++i) {
      const DraftInput& q = in[i];
      if (q.sampler || q.k > 1 || q.p_min > 0 || want_[i] != want_[0]) return false;
    }
    return want_[0] >= 1;
  }
  // Greedy chains with one download: depth 0 is the catch-up batch already in batch_ (its argmax to
  // dev_ids_ row 0), depth d ≥ 1 feeds depth d-1's ids from dev_ids_ on the backend at position
  // history length + d - 1 (the same rows, cells and sequences the per-depth path would build).
  void propose_device_chain(std::span<const DraftInput> in, std::span<Draft> out) {
    const int nq = static_cast<int>(in.size()), depth_n = want_[0];
    const int64_t need = static_cast<int64_t>(nq) * depth_n;
    if (dev_ids_.n_elements() < need) {
      // Grows to the largest step seen (the first steps of a run), never in steady state.
      if (dev_ids_.valid()) m_.backend().free(dev_ids_);
      dev_ids_ = m_.backend().alloc(DType::I32, 1, need);  // I32 (depth, query) as need rows of 1
    }
    skip_.assign(static_cast<size_t>(nq), 1);
    ForwardOptions f;
    f.logits_skip = skip_.data();
    Tensor out_ids = dev_ids_.rows_view(0, nq);
    f.argmax_dev = &out_ids;
    m_.forward(batch_, *cache_, logits_, f);
    const auto t0 = std::chrono::steady_clock::now();
    Tensor in_ids;
    for (int d = 1; d < depth_n; ++d) {
      batch_.clear();
      for (int i = 0; i < nq; ++i) {
        const int slot = in[static_cast<size_t>(i)].slot;
        // Placeholder token (in range); the forward reads the real one from depth d-1's argmax.
        batch_.add(0, static_cast<int32_t>(seen_[static_cast<size_t>(slot)].size()) + d - 1, slot, true);
      }
      in_ids = dev_ids_.rows_view(static_cast<int64_t>(d - 1) * nq, nq);
      out_ids = dev_ids_.rows_view(static_cast<int64_t>(d) * nq, nq);
      f.tokens_dev = &in_ids;
      f.argmax_dev = &out_ids;
      m_.forward(batch_, *cache_, logits_, f);
      ++forwards_;
    }
    batch_.clear();
    ++device_steps_;
    ids_.resize(static_cast<size_t>(need));
    m_.backend().download(dev_ids_, ids_.data(), static_cast<size_t>(need) * sizeof(int32_t));
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int i = 0; i < nq; ++i) {
      Draft& dr = out[static_cast<size_t>(i)];
      auto& seen = seen_[static_cast<size_t>(in[static_cast<size_t>(i)].slot)];
      for (int d = 0; d < depth_n; ++d) {
        const int32_t tok = ids_[static_cast<size_t>(d) * static_cast<size_t>(nq) + static_cast<size_t>(i)];
        dr.chain.push_back(tok);
        TopK t;
        t.ids.assign(1, tok);
        t.logprobs.assign(1, 0.0f);  // as the per-depth path: no log-probs asked for greedy chains
        dr.topk.push_back(std::move(t));
        if (d + 1 < depth_n) seen.push_back(tok);  // its K/V is in the cache (fed at depth d + 1)
      }
    }
  }
  // Keeps capture `i`'s state (the state of `slot` after its newest row) as that slot's state at `depth`.
  void keep(RecurrentState& rs, int i, int slot, int depth) {
    const int dst = n_slots_ + slot * stash_ + depth;
    // i < 0 names a backup slot (tags and slots of backups sit just before the captures).
    const RecurrentState::CaptureTag tag = rs.tag(i);
    if (tag.seq != slot || tag.pos < 0 || !tag.chain) return;
    rs.copy_slot(rs.capture_slot(0) + i, rs.capture_slot(dst));
    rs.set_tag(dst, tag);
  }
  Model& m_;
  ModelDrafterOptions opt_;
  int n_vocab_, n_slots_;
  int stash_ = 0;  // hybrid drafts: kept states per slot (max depth + 1), else 0
  uint64_t rows_fed_ = 0, replays_ = 0, forwards_ = 0, device_steps_ = 0;
  double seconds_ = 0;
  std::vector<int> want_, active_, next_;  // (queries) depth wanted; queries still drafting
  std::unique_ptr<KvCache> cache_;
  std::vector<std::vector<int32_t>> seen_;  // (n_slots) tokens whose K/V the cache holds, per slot
  static constexpr int kMaxBackendTopK = 64;  // Backend::topk_rows' limit
  Batch batch_;
  std::vector<float> logits_;   // (queries, n_vocab), filled only for sampled drafts' rows
  std::vector<int32_t> ids_;    // (queries, k) top-k ids (k = 1: the argmax)
  std::vector<float> lps_;      // (queries, k) their log-probs
  std::vector<uint8_t> skip_;   // (queries) 1: no logits copy
  Tensor dev_ids_;              // I32 (depth · queries) on the draft's backend: device-fed chains' argmax per depth
};

}  // namespace

std::unique_ptr<Drafter> make_model_drafter(Model& draft, int n_slots, int n_ctx, int max_depth, const ModelDrafterOptions& opt) {
  ModelDrafterOptions o = opt;
  // Documented alias (drafter.h): PEREGRINE_DRAFT_DEVICE_CHAIN=1 turns the device-fed chain on, =0 off.
  if (const char* e = std::getenv("PEREGRINE_DRAFT_DEVICE_CHAIN"); e && *e) o.device_chain = std::string(e) != "0";
  return std::make_unique<ModelDrafter>(draft, n_slots, n_ctx, max_depth, o);
}

}  // namespace pg::spec
