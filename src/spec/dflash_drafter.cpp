// DFlash drafting: the target's features of the committed tokens (rows of the forward the runner runs
// anyway, left on the backend) are projected, per draft layer, into context K/V in the draft's own KV
// cache on the target's backend (one sequence per slot); one block pass for every sequence that asks,
// in Backend ops, so it runs wherever the target runs.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "model/dflash.h"
#include "spec/drafter.h"

namespace pg::spec {

namespace {

class DFlashDrafter final : public Drafter {
 public:
  DFlashDrafter(DFlashModel& m, int n_slots, int n_ctx, int fa_window)
      : m_(m), n_ctx_(n_ctx), nf_(m.n_feat()), slots_(static_cast<size_t>(n_slots)) {
    PG_CHECK(fa_window >= 0, "--fa-window must be ≥ 0 (0 = the whole context), got " + std::to_string(fa_window));
    const DFlashConfig& c = m.config();
    window_ = fa_window;
    if (window_ == 0 && c.sliding_window > 0 && std::all_of(c.layer_swa.begin(), c.layer_swa.end(), [](bool b) { return b; }))
      window_ = c.sliding_window;
    // Context positions [0, n_ctx) plus one block's scratch rows after the newest one.
    cache_ = m.make_cache(n_slots, n_ctx + c.block_size);
  }
  const char* name() const override { return "dflash"; }
  std::vector<int> feature_layers() const override { return m_.config().target_layers; }
  // The draft attends to the features of every context position, and only a forward of the target
  // makes them: a cached prefix is reusable only as far as this slot already has features (release()
  // drops them, so 0 for a new sequence). Without this cap a prefix hit left the positions it served
  // without features and propose() never drafted for that sequence.
  int reusable_prefix(int slot, int cached_tokens) const override {
    return std::min(cached_tokens, slots_[static_cast<size_t>(slot)].n_have);
  }

  void release(int slot) override {
    Slot& s = slots_[static_cast<size_t>(slot)];
    s.have.clear();
    s.n_have = 0;
    // Rows of the ended sequence not projected yet are dropped with it.
    size_t w = 0;
    for (size_t i = 0; i < pend_.size(); ++i)
      if (pend_[i].slot != slot) {
        if (!pend_feat_.empty() && w != i)
          std::memcpy(pend_feat_.data() + w * static_cast<size_t>(nf_), pend_feat_.data() + i * static_cast<size_t>(nf_),
                      static_cast<size_t>(nf_) * sizeof(float));
        pend_[w++] = pend_[i];
      }
    pend_.resize(w);
    if (!pend_feat_.empty()) pend_feat_.resize(w * static_cast<size_t>(nf_));
    cache_->clear(slot);
  }

  // Host rows (the fallback: a hybrid target's split verify forward): copied until the next projection.
  void add_features(int slot, int pos, const float* row) override {
    if (!note(slot, pos)) return;
    pend_.push_back({slot, pos, -1});
    pend_feat_.insert(pend_feat_.end(), row, row + nf_);
  }

  // Rows of the forward's device-side features: only their indices until the next projection.
  Tensor* feature_rows(int n_rows) override {
    project();  // rows of the previous forward, before this one overwrites them
    feat_dev_ = m_.feature_buffer(n_rows);
    feat_rows_ = n_rows;
    return &feat_dev_;
  }
  void add_feature_row(int slot, int pos, int row) override {
    if (!note(slot, pos)) return;
    pend_.push_back({slot, pos, row});
  }

  void propose(std::span<const DraftInput> in, std::span<Draft> out) override {
    const DFlashConfig& c = m_.config();
    project();  // the context rows handed over since the last pass
    std::vector<DFlashBlock> blocks;
    std::vector<size_t> who;
    int n_out = 0, k = 1;
    for (size_t i = 0; i < in.size(); ++i) {
      out[i] = Draft{};
      const DraftInput& q = in[i];
      const int p0 = static_cast<int>(q.history.size()) - 1;  // the root's position
      const int want = std::min(q.n_max, c.block_size - 1);
      Slot& s = slots_[static_cast<size_t>(q.slot)];
      // No features for part of the context (a prompt the forward did not see, e.g. a reused prefix):
      // no draft for this sequence.
      if (p0 < 1 || want < 1 || s.n_have < p0 || p0 >= n_ctx_) continue;
      // Cells for the context and for a whole block of scratch rows after it (full pool: no draft).
      if (!cache_->reserve(q.slot, p0 + c.block_size)) continue;
      DFlashBlock b;
      b.anchor = q.history[static_cast<size_t>(p0)];
      b.pos0 = p0;
      b.seq = q.slot;
      const int lo = window_ > 0 ? std::max(0, p0 - window_) : 0;
      b.n_ctx = p0 - lo;
      blocks.push_back(std::move(b));
      who.push_back(i);
      n_out = std::max(n_out, want);
      k = std::max(k, q.k);
    }
    if (blocks.empty()) return;
    k = std::min({k, 64, 1 << 30});
    ids_.resize(blocks.size() * static_cast<size_t>(n_out) * static_cast<size_t>(k));
    lps_.resize(ids_.size());
    m_.propose(*cache_, blocks, n_out, k, ids_.data(), lps_.data());
    for (size_t b = 0; b < blocks.size(); ++b) {
      const DraftInput& q = in[who[b]];
      Draft& d = out[who[b]];
      const int want = std::min({q.n_max, c.block_size - 1, n_out});
      const int kq = std::min(q.k, k);
      for (int i = 0; i < want; ++i) {
        const size_t at = (b * static_cast<size_t>(n_out) + static_cast<size_t>(i)) * static_cast<size_t>(k);
        d.chain.push_back(ids_[at]);
        if (q.k > 1) {
          TopK t;
          t.ids.assign(ids_.begin() + static_cast<std::ptrdiff_t>(at), ids_.begin() + static_cast<std::ptrdiff_t>(at + kq));
          t.logprobs.assign(lps_.begin() + static_cast<std::ptrdiff_t>(at), lps_.begin() + static_cast<std::ptrdiff_t>(at + kq));
          d.topk.push_back(std::move(t));
        }
      }
    }
  }

 private:
  struct Slot {
    std::vector<uint8_t> have;  // (positions) 1 = the position's features were handed over
    int n_have = 0;             // positions [0, n_have) all have features
  };
  struct Pending {
    int slot, pos;
    int row;  // batch row of the last forward's device features, or -1: host row (pend_feat_)
  };

  // Records that (slot, pos) has features; false for positions outside the context.
  bool note(int slot, int pos) {
    if (pos < 0 || pos >= n_ctx_) return false;
    Slot& s = slots_[static_cast<size_t>(slot)];
    if (s.have.size() <= static_cast<size_t>(pos)) s.have.resize(static_cast<size_t>(pos) + 1, 0);
    s.have[static_cast<size_t>(pos)] = 1;
    while (s.n_have < static_cast<int>(s.have.size()) && s.have[static_cast<size_t>(s.n_have)]) ++s.n_have;
    return true;
  }

  // Projects every row handed over since the last call, of all slots, into the draft cache in one pass
  // (after prefill that is whole prompts at once). The rows of one call come from one forward (the
  // runner hands rows over after each forward, and feature_rows() projects before the next), so they
  // are all host rows or all device rows. A rewritten position overwrites its cells; a position given
  // twice keeps the later row (cells are written in parallel on devices).
  void project() {
    if (pend_.empty()) return;
    const int n = static_cast<int>(pend_.size());
    std::vector<uint8_t> keep(static_cast<size_t>(n), 1);
    {
      std::vector<std::pair<int64_t, int>> key(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) key[static_cast<size_t>(i)] = {static_cast<int64_t>(pend_[static_cast<size_t>(i)].slot) * (n_ctx_ + 1) + pend_[static_cast<size_t>(i)].pos, i};
      std::sort(key.begin(), key.end());
      for (int i = 0; i + 1 < n; ++i)
        if (key[static_cast<size_t>(i)].first == key[static_cast<size_t>(i + 1)].first) keep[static_cast<size_t>(key[static_cast<size_t>(i)].second)] = 0;
    }
    std::vector<int32_t> seq, pos, rows;
    std::vector<float> feats;
    const bool dev = pend_[0].row >= 0;
    for (int i = 0; i < n; ++i) {
      const Pending& p = pend_[static_cast<size_t>(i)];
      PG_CHECK((p.row >= 0) == dev, "DFlash drafter: host and device feature rows in one projection");
      if (!keep[static_cast<size_t>(i)]) continue;
      // Cells for the position (and the block scratch rows reserved by propose later).
      if (!cache_->reserve(p.slot, p.pos + 1)) {
        // Pool full (it is sized for every slot at full context, so not expected): the position has no
        // K/V, the sequence is not drafted for past it.
        Slot& s = slots_[static_cast<size_t>(p.slot)];
        s.have[static_cast<size_t>(p.pos)] = 0;
        s.n_have = std::min(s.n_have, p.pos);
        continue;
      }
      seq.push_back(p.slot);
      pos.push_back(p.pos);
      if (dev)
        rows.push_back(p.row);
      else
        feats.insert(feats.end(), pend_feat_.begin() + static_cast<std::ptrdiff_t>(i) * nf_, pend_feat_.begin() + static_cast<std::ptrdiff_t>(i + 1) * nf_);
    }
    pend_.clear();
    pend_feat_.clear();
    if (dev)
      m_.store_context_rows(*cache_, feat_dev_, feat_rows_, rows.data(), seq.data(), pos.data(), static_cast<int>(seq.size()));
    else
      m_.store_context(*cache_, feats.data(), seq.data(), pos.data(), static_cast<int>(seq.size()));
  }

  DFlashModel& m_;
  int n_ctx_, nf_;
  int window_ = 0;
  std::vector<Slot> slots_;
  std::unique_ptr<KvCache> cache_;   // the draft's layers: (n_slots) sequences of n_ctx + block_size positions
  std::vector<Pending> pend_;        // rows handed over, not projected yet
  std::vector<float> pend_feat_;     // (host rows of pend_, n_feat) their features
  Tensor feat_dev_;                  // (n_feat_layers · feat_rows_, n_embd) the last forward's features (DFlashModel-owned)
  int feat_rows_ = 0;
  std::vector<int32_t> ids_;  // (blocks, n_out, k)
  std::vector<float> lps_;    // (blocks, n_out, k)
};

}  // namespace

std::unique_ptr<Drafter> make_dflash_drafter(DFlashModel& draft, int n_slots, int n_ctx, int fa_window) {
  return std::make_unique<DFlashDrafter>(draft, n_slots, n_ctx, fa_window);
}

}  // namespace pg::spec
