// Prompt-lookup drafting (no model): repeated context — code edits, agent loops quoting earlier
// output — continues the way it did before.
#include <algorithm>

#include "core/error.h"
#include "spec/drafter.h"

namespace pg::spec {

SpecType parse_spec_type(const std::string& s) {
  if (s == "none") return SpecType::kNone;
  if (s == "draft" || s == "draft-simple") return SpecType::kDraft;
  if (s == "ngram" || s == "ngram-simple" || s == "ngram-cache") return SpecType::kNgram;
  if (s == "dflash" || s == "draft-dflash") return SpecType::kDFlash;
  throw Error("unknown --spec-type '" + s + "' (expected none, draft, ngram or dflash)");
}

const char* spec_type_name(SpecType t) {
  switch (t) {
    case SpecType::kNone: return "none";
    case SpecType::kDraft: return "draft";
    case SpecType::kNgram: return "ngram";
    case SpecType::kDFlash: return "dflash";
  }
  return "none";
}

namespace {

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int n_min, int n_max) : n_min_(n_min), n_max_(n_max) {
    PG_CHECK(n_min_ >= 1 && n_max_ >= n_min_, "n-gram drafter: need 1 ≤ n_min ≤ n_max");
  }
  const char* name() const override { return "ngram"; }
  void propose(std::span<const DraftInput> in, std::span<Draft> out) override {
    for (size_t i = 0; i < in.size(); ++i) out[i] = one(in[i]);
  }

 private:
  Draft one(const DraftInput& q) const {
    Draft d;
    const auto& h = q.history;
    const int n = static_cast<int>(h.size());
    for (int g = std::min(n_max_, n - 1); g >= n_min_ && d.chain.empty(); --g) {
      // Most recent earlier occurrence of the last g tokens (the match must end before the suffix starts
      // so that at least one token follows it).
      for (int e = n - 2; e >= g - 1; --e) {
        bool match = true;
        for (int j = 0; j < g && match; ++j) match = h[static_cast<size_t>(e - j)] == h[static_cast<size_t>(n - 1 - j)];
        if (!match) continue;
        for (int j = e + 1; j < n && static_cast<int>(d.chain.size()) < q.n_max; ++j) d.chain.push_back(h[static_cast<size_t>(j)]);
        break;
      }
    }
    d.has_tree = true;
    d.tree = build_chain(h.empty() ? -1 : h.back(), d.chain);
    return d;
  }
  int n_min_, n_max_;
};

}  // namespace

std::unique_ptr<Drafter> make_ngram_drafter(int n_min_ngram, int n_max_ngram) {
  return std::make_unique<NgramDrafter>(n_min_ngram, n_max_ngram);
}

}  // namespace pg::spec
