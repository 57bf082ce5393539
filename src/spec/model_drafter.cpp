// Draft-model drafting: greedy autoregressive steps of a small model that shares the target's
// vocabulary, one forward per depth for all sequences asking in this step.
#include <algorithm>

#include "core/error.h"
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
  ModelDrafter(Model& m, int n_slots, int n_ctx) : m_(m), n_vocab_(m.config().n_vocab), seen_(static_cast<size_t>(n_slots)) {
    KvCacheOptions ko;
    ko.n_seq = n_slots;
    // Drafts run up to a tree's depth past the target's context.
    ko.n_ctx = n_ctx + kMaxTreeNodes;
    cache_ = m_.make_cache(ko);
  }
  const char* name() const override { return "draft"; }
  void release(int slot) override {
    cache_->clear(slot);
    seen_[static_cast<size_t>(slot)].clear();
  }

  void propose(std::span<const DraftInput> in, std::span<Draft> out) override {
    const size_t nq = in.size();
    std::vector<int> want(nq);
    // 1. Catch each slot's cache up with its history: keep the longest common prefix of what the cache
    //    holds and the history (the accepted drafts), drop the rest, feed the remainder up to the root.
    batch_.clear();
    for (size_t i = 0; i < nq; ++i) {
      const DraftInput& q = in[i];
      out[i] = Draft{};
      const int h = static_cast<int>(q.history.size());
      want[i] = std::max(0, std::min(q.n_max, cache_->n_ctx() - h));
      PG_CHECK(h >= 1, "draft request without history");
      auto& seen = seen_[static_cast<size_t>(q.slot)];
      int c = 0;
      const int lim = std::min<int>(static_cast<int>(seen.size()), h - 1);
      while (c < lim && seen[static_cast<size_t>(c)] == q.history[static_cast<size_t>(c)]) ++c;
      try {
        cache_->truncate(q.slot, c);
      } catch (const Error&) {
        // A hybrid draft cannot cut its recurrent state back without a snapshot: start over.
        cache_->clear(q.slot);
        c = 0;
      }
      seen.assign(q.history.begin(), q.history.end());
      for (int p = c; p < h; ++p) batch_.add(q.history[static_cast<size_t>(p)], p, q.slot, p + 1 == h);
    }
    std::vector<int> active;  // queries still drafting
    for (size_t i = 0; i < nq; ++i) active.push_back(static_cast<int>(i));
    // Candidates per depth come from the backend (top-k ids + log-probs, or the argmax for chains):
    // a few bytes per row back instead of the vocabulary's logits.
    int k = 1;
    for (const auto& q : in) k = std::max(k, q.k);
    k = std::min({k, kMaxBackendTopK, n_vocab_});
    for (int depth = 0; !active.empty(); ++depth) {
      const size_t n_out = active.size();
      if (batch_.size() > 0) {
        ForwardOptions f;
        skip_.assign(n_out, 1);
        if (k > 1) {
          ids_.resize(n_out * static_cast<size_t>(k));
          lps_.resize(n_out * static_cast<size_t>(k));
          f.top_k = k;
          f.topk_ids = ids_.data();
          f.topk_logprobs = lps_.data();
          f.logits_skip = skip_.data();
        } else {
          ids_.resize(n_out);
          f.argmax = ids_.data();
          f.argmax_only = skip_.data();
        }
        m_.forward(batch_, *cache_, logits_, f);
      }
      std::vector<int> next;
      batch_.clear();
      for (size_t r = 0; r < n_out; ++r) {
        const int i = active[r];
        const DraftInput& q = in[static_cast<size_t>(i)];
        Draft& d = out[static_cast<size_t>(i)];
        if (depth >= want[static_cast<size_t>(i)]) continue;
        const int32_t tok = ids_[r * static_cast<size_t>(k)];
        d.chain.push_back(tok);
        if (q.k > 1) {
          TopK t;
          const int kq = std::min(q.k, k);
          t.ids.assign(ids_.begin() + static_cast<std::ptrdiff_t>(r * k), ids_.begin() + static_cast<std::ptrdiff_t>(r * k + kq));
          t.logprobs.assign(lps_.begin() + static_cast<std::ptrdiff_t>(r * k), lps_.begin() + static_cast<std::ptrdiff_t>(r * k + kq));
          d.topk.push_back(std::move(t));
        }
        if (depth + 1 < want[static_cast<size_t>(i)]) {
          auto& seen = seen_[static_cast<size_t>(q.slot)];
          batch_.add(tok, static_cast<int32_t>(seen.size()), q.slot, true);
          seen.push_back(tok);
          next.push_back(i);
        }
      }
      active = std::move(next);
    }
  }

 private:
  Model& m_;
  int n_vocab_;
  std::unique_ptr<KvCache> cache_;
  std::vector<std::vector<int32_t>> seen_;  // (n_slots) tokens whose K/V the cache holds, per slot
  static constexpr int kMaxBackendTopK = 64;  // Backend::topk_rows' limit
  Batch batch_;
  std::vector<float> logits_;   // (queries, n_vocab), left unfilled: every row is skipped
  std::vector<int32_t> ids_;    // (queries, k) top-k ids (k = 1: the argmax)
  std::vector<float> lps_;      // (queries, k) their log-probs
  std::vector<uint8_t> skip_;   // (queries) 1: no logits copy
};

}  // namespace

std::unique_ptr<Drafter> make_model_drafter(Model& draft, int n_slots, int n_ctx) {
  return std::make_unique<ModelDrafter>(draft, n_slots, n_ctx);
}

}  // namespace pg::spec
