// Process-wide cache of compiled grammars with warmed mask caches (see grammar.h: Compiled).
#include <chrono>
#include <list>
#include <mutex>

#include "grammar/grammar.h"

namespace pg::grammar {

void warm(const Matcher& proto, double budget_ms, uint64_t seed) {
  using clk = std::chrono::steady_clock;
  const auto t0 = clk::now();
  auto spent = [&] { return std::chrono::duration<double, std::milli>(clk::now() - t0).count(); };
  std::mt19937_64 rng(seed);
  TokenMask mask;
  proto.allowed_tokens(mask);
  // Every token boundary is a byte boundary, so masks after each byte of a sentence cover the states
  // a tokenized sentence passes through (string interiors, numbers, the gaps between properties).
  for (int s = 0; s < 8 && spent() < budget_ms; ++s) {
    std::string text;
    if (!proto.grammar()->sample(rng, text, 8, 4096)) continue;
    Matcher m = proto.clone();
    for (size_t i = 0; i < text.size() && spent() < budget_ms; ++i) {
      if (!m.accept_bytes(std::string_view(text).substr(i, 1))) break;
      m.allowed_tokens(mask);
    }
  }
}

namespace {
struct Lru {
  std::mutex mu;
  std::list<std::pair<std::string, std::shared_ptr<const Compiled>>> items;  // most recent first
  static constexpr size_t kMax = 16;  // each holds up to MaskCache::kMaxEntries masks
};
Lru& lru() {
  static Lru l;
  return l;
}
}  // namespace

std::shared_ptr<const Compiled> compile_cached(std::string_view gbnf, const std::shared_ptr<const Vocab>& vocab,
                                               std::string_view start_rule, double warm_ms) {
  std::string key;
  key.reserve(gbnf.size() + start_rule.size() + 24);
  key.append(std::to_string(reinterpret_cast<uintptr_t>(vocab.get()))).append(1, '\0');
  key.append(start_rule).append(1, '\0').append(gbnf);
  Lru& l = lru();
  {
    std::lock_guard<std::mutex> lk(l.mu);
    for (auto it = l.items.begin(); it != l.items.end(); ++it) {
      if (it->first == key) {
        l.items.splice(l.items.begin(), l.items, it);
        return it->second;
      }
    }
  }
  auto g = Grammar::parse(gbnf, Limits{}, start_rule);
  auto c = std::make_shared<Compiled>(Compiled{g, Matcher(g, vocab)});
  if (warm_ms > 0) warm(c->proto, warm_ms);
  std::lock_guard<std::mutex> lk(l.mu);
  l.items.emplace_front(std::move(key), c);
  if (l.items.size() > Lru::kMax) l.items.pop_back();
  return c;
}

}  // namespace pg::grammar
