// Byte-level BPE. Every string that takes part in a merge is interned as a small integer "symbol"
// (a token's symbol is its id), so a merge step is one hash lookup of a pair of integers. Each
// pre-tokenized word is merged with a priority queue over a linked list of symbols (lowest rank
// first, leftmost on ties, as Hugging Face and llama.cpp do), and finished words are cached.
#include <queue>

#include "core/error.h"
#include "tokenizer/impl.h"

namespace pg::tok {

namespace {
constexpr size_t kCacheMaxEntries = 1 << 16;
constexpr size_t kCacheMaxWordBytes = 256;

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
}  // namespace

BpeModel::BpeModel(const std::vector<std::string>& tokens, const StrMap<int32_t>& text_to_id,
                   const std::vector<std::string_view>& merges, PreConfig pre)
    : pre_(std::move(pre)), splitter_(pre_.regexes), text_to_id_(&text_to_id) {
  n_vocab_ = static_cast<int32_t>(tokens.size());
  sym_text_ = tokens;
  sym_of_text_.reserve(text_to_id.size() + merges.size() / 8);
  for (const auto& [text, id] : text_to_id) sym_of_text_.emplace(text, id);
  merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string_view m = merges[rank];
    // "left right"; the split is at the first space after the first byte, as llama.cpp reads it.
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (sp == std::string_view::npos) continue;
    const std::string_view l = m.substr(0, sp), r = m.substr(sp + 1);
    const int32_t a = intern(l), b = intern(r);
    joined.assign(l);
    joined += r;
    const int32_t c = intern(joined);
    merges_.emplace(pair_key(a, b), std::make_pair(static_cast<int32_t>(rank), c));  // first rank wins
  }
  for (int b = 0; b < 256; ++b) {
    byte_char_[b] = gpt2_byte_to_char(static_cast<uint8_t>(b));
    byte_sym_[b] = find_sym(byte_char_[b]);
  }
}

int32_t BpeModel::intern(std::string_view s) {
  auto it = sym_of_text_.find(s);
  if (it != sym_of_text_.end()) return it->second;
  const int32_t id = static_cast<int32_t>(sym_text_.size());
  sym_text_.emplace_back(s);
  sym_of_text_.emplace(std::string(s), id);
  return id;
}

int32_t BpeModel::find_sym(std::string_view s) const {
  auto it = sym_of_text_.find(s);
  return it == sym_of_text_.end() ? -1 : it->second;
}

void BpeModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  for (const auto& [a, b] : splitter_.split(text)) encode_word(text.substr(a, b - a), out);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> result;

  if (pre_.ignore_merges) {
    std::string enc;
    for (char ch : word) enc += byte_char_[static_cast<uint8_t>(ch)];
    auto it = text_to_id_->find(enc);
    if (it != text_to_id_->end()) result.push_back(it->second);
  }

  if (result.empty()) {
    // One symbol per input byte (each byte is one GPT-2 character); len counts input bytes.
    struct Sym {
      int32_t sym;
      int32_t prev, next;
      uint32_t start, len;
    };
    struct Bigram {
      int32_t rank;
      int32_t left, right;
      uint32_t size;
      int32_t result;
    };
    struct Later {
      bool operator()(const Bigram& x, const Bigram& y) const { return x.rank > y.rank || (x.rank == y.rank && x.left > y.left); }
    };
    const int32_t n = static_cast<int32_t>(word.size());
    std::vector<Sym> syms(n);
    for (int32_t i = 0; i < n; ++i) {
      syms[i] = Sym{byte_sym_[static_cast<uint8_t>(word[i])], i - 1, i + 1 < n ? i + 1 : -1, static_cast<uint32_t>(i), 1};
    }
    std::priority_queue<Bigram, std::vector<Bigram>, Later> queue;
    const auto add = [&](int32_t l, int32_t r) {
      if (l < 0 || r < 0 || syms[l].sym < 0 || syms[r].sym < 0) return;
      auto it = merges_.find(pair_key(syms[l].sym, syms[r].sym));
      if (it == merges_.end()) return;
      queue.push(Bigram{it->second.first, l, r, syms[l].len + syms[r].len, it->second.second});
    };
    for (int32_t i = 1; i < n; ++i) add(i - 1, i);
    while (!queue.empty()) {
      const Bigram bg = queue.top();
      queue.pop();
      Sym& l = syms[bg.left];
      Sym& r = syms[bg.right];
      // A symbol only grows by swallowing its right neighbour, so unchanged lengths mean the pair
      // this bigram was made for is still there.
      if (l.len == 0 || r.len == 0 || l.len + r.len != bg.size) continue;
      l.sym = bg.result;
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) syms[r.next].prev = bg.left;
      add(l.prev, bg.left);
      add(bg.left, l.next);
    }
    for (int32_t i = 0; i >= 0 && i < n; i = syms[i].next) {
      const Sym& s = syms[i];
      if (s.len == 0) continue;
      if (s.sym >= 0 && s.sym < n_vocab_) {
        result.push_back(s.sym);
        continue;
      }
      // Not a token: llama.cpp looks each byte of the symbol's (GPT-2 encoded) text up as a
      // one-byte token and drops the bytes that are not.
      std::string enc;
      for (uint32_t k = 0; k < s.len; ++k) enc += byte_char_[static_cast<uint8_t>(word[s.start + k])];
      for (char ch : enc) {
        auto it = text_to_id_->find(std::string_view(&ch, 1));
        if (it != text_to_id_->end()) result.push_back(it->second);
      }
    }
  }

  out.insert(out.end(), result.begin(), result.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    if (cache_.size() >= kCacheMaxEntries) cache_.clear();
    cache_.emplace(std::string(word), std::move(result));
  }
}

}  // namespace pg::tok
