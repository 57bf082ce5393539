// SentencePiece-style BPE as llama.cpp runs it for tokenizer.ggml.model = "llama": the text (spaces
// already escaped to U+2581) starts as one symbol per UTF-8 character; the adjacent pair whose
// concatenation is the highest-scoring vocabulary entry merges first (leftmost on ties); symbols
// that end up outside the vocabulary fall back to <0xXX> byte tokens.
#include <algorithm>
#include <queue>

#include "core/error.h"
#include "tokenizer/impl.h"

namespace pg::tok {

void Tokenizer::Impl::spm_encode(std::string_view text, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t prev, next;
    uint32_t start, len;  // bytes of text
  };
  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t size;
  };
  struct Worse {
    bool operator()(const Bigram& x, const Bigram& y) const {
      return x.score < y.score || (x.score == y.score && x.left > y.left);
    }
  };
  std::vector<Sym> syms;
  syms.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    // llama.cpp steps by the length the lead byte announces, even over broken sequences.
    const size_t n = std::min(utf8_len_lax(static_cast<uint8_t>(text[off])), text.size() - off);
    const int32_t idx = static_cast<int32_t>(syms.size());
    syms.push_back(Sym{idx - 1, off + n == text.size() ? -1 : idx + 1, static_cast<uint32_t>(off), static_cast<uint32_t>(n)});
    off += n;
  }
  std::priority_queue<Bigram, std::vector<Bigram>, Worse> queue;
  const auto add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const std::string_view s = text.substr(syms[l].start, syms[l].len + syms[r].len);
    auto it = text_to_id.find(s);
    if (it == text_to_id.end()) return;
    queue.push(Bigram{tokens[it->second].score, l, r, static_cast<uint32_t>(s.size())});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) add(i - 1, i);
  while (!queue.empty()) {
    const Bigram bg = queue.top();
    queue.pop();
    Sym& l = syms[bg.left];
    Sym& r = syms[bg.right];
    if (l.len == 0 || r.len == 0 || l.len + r.len != bg.size) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = bg.left;
    add(l.prev, bg.left);
    add(bg.left, l.next);
  }
  for (int32_t i = syms.empty() ? -1 : 0; i >= 0; i = syms[i].next) {
    const Sym& s = syms[i];
    const std::string_view piece = text.substr(s.start, s.len);
    auto it = text_to_id.find(piece);
    if (it != text_to_id.end()) {
      out.push_back(it->second);
      continue;
    }
    for (char ch : piece) out.push_back(byte_to_token(static_cast<uint8_t>(ch)));
  }
}

int32_t Tokenizer::Impl::byte_to_token(uint8_t b) const {
  static const char* hex = "0123456789ABCDEF";
  const char buf[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
  auto it = text_to_id.find(std::string_view(buf, 6));
  if (it != text_to_id.end()) return it->second;
  it = text_to_id.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
  if (it != text_to_id.end()) return it->second;
  // llama.cpp aborts here; a vocabulary without byte tokens gets <unk> instead.
  if (sp.unk != kNoToken) return sp.unk;
  throw Error("cannot tokenize byte 0x" + std::string(buf + 3, 2) +
              ": the vocabulary has neither a byte token for it nor an unknown token");
}

}  // namespace pg::tok
