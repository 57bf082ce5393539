// DFlash drafting: per slot, the target's features of the committed tokens (handed over by the runner
// from the forward it runs anyway) and, per draft layer, the context K/V projected from them into the
// draft's own KV cache on the target's backend (one sequence per slot); one block pass for every
// sequence that asks, in Backend ops (so it runs wherever the target runs).
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

  void release(int slot) override {
    Slot& s = slots_[static_cast<size_t>(slot)];
    s.have.clear();
    s.n_have = 0;
    s.kv_done = 0;
    cache_->clear(slot);
  }

  void add_features(int slot, int pos, const float* row) override {
    if (pos < 0 || pos >= n_ctx_) return;
    Slot& s = slots_[static_cast<size_t>(slot)];
    const size_t need = static_cast<size_t>(pos + 1);
    if (s.have.size() < need) {
      s.have.resize(need, 0);
      s.feat.resize(need * static_cast<size_t>(nf_));
    }
    std::memcpy(s.feat.data() + static_cast<size_t>(pos) * static_cast<size_t>(nf_), row, static_cast<size_t>(nf_) * sizeof(float));
    s.have[static_cast<size_t>(pos)] = 1;
    s.kv_done = std::min(s.kv_done, pos);  // a rewritten row invalidates its projection
    while (s.n_have < static_cast<int>(s.have.size()) && s.have[static_cast<size_t>(s.n_have)]) ++s.n_have;
  }

  void propose(std::span<const DraftInput> in, std::span<Draft> out) override {
    const DFlashConfig& c = m_.config();
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
      queue_projection(q.slot, p0);
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
    project();
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
    std::vector<float> feat;    // (positions, n_feat) the target's features per committed position
    std::vector<uint8_t> have;  // (positions) 1 = feat row written
    int n_have = 0;             // positions [0, n_have) all have features
    int kv_done = 0;            // positions [0, kv_done) are projected into the draft cache
  };

  // Queues the slot's unprojected context rows [kv_done, p0) for project().
  void queue_projection(int slot, int p0) {
    Slot& s = slots_[static_cast<size_t>(slot)];
    if (s.kv_done >= p0) return;
    for (int p = s.kv_done; p < p0; ++p) {
      pend_seq_.push_back(slot);
      pend_pos_.push_back(p);
      const float* f = s.feat.data() + static_cast<size_t>(p) * static_cast<size_t>(nf_);
      pend_feat_.insert(pend_feat_.end(), f, f + nf_);
    }
    s.kv_done = p0;
  }

  // Projects every queued row, of all slots, into the draft cache in one pass (after prefill that is
  // whole prompts at once).
  void project() {
    m_.store_context(*cache_, pend_feat_.data(), pend_seq_.data(), pend_pos_.data(), static_cast<int>(pend_seq_.size()));
    pend_feat_.clear();
    pend_seq_.clear();
    pend_pos_.clear();
  }

  DFlashModel& m_;
  int n_ctx_, nf_;
  int window_ = 0;
  std::vector<Slot> slots_;
  std::unique_ptr<KvCache> cache_;   // the draft's layers: (n_slots) sequences of n_ctx + block_size positions
  std::vector<float> pend_feat_;     // (queued rows, n_feat) features of the rows project() stores
  std::vector<int32_t> pend_seq_, pend_pos_;  // (queued rows) their slot and position
  std::vector<int32_t> ids_;  // (blocks, n_out, k)
  std::vector<float> lps_;    // (blocks, n_out, k)
};

}  // namespace

std::unique_ptr<Drafter> make_dflash_drafter(DFlashModel& draft, int n_slots, int n_ctx, int fa_window) {
  return std::make_unique<DFlashDrafter>(draft, n_slots, n_ctx, fa_window);
}

}  // namespace pg::spec
