// Streaming detokenization in two stages: (1) the vocabulary's space clean-up, which only looks a few
// bytes around a space or apostrophe, so only a short tail after one has to wait; (2) UTF-8 sanitising, which holds back an
// unfinished character. Both stages give, over any split of the input, the same bytes as on the whole text, so the stream equals
// detokenize().
#include "tokenizer/impl.h"

namespace pg::tok {

namespace {
bool cleanup_sensitive(char c) { return c == ' ' || c == '\''; }
}  // namespace

Detokenizer::Detokenizer(const Tokenizer& tok, bool special, bool clean_spaces)
    : tok_(tok), special_(special), clean_(clean_spaces && tok.clean_spaces()) {}

void Detokenizer::reset() {
  first_ = !continuation_;
  clean_pending_.clear();
  utf8_pending_.clear();
}

std::string Detokenizer::push(int32_t id) {
  std::string piece = tok_.token_to_piece(id, special_);
  if (first_ && tok_.add_space_prefix() && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
  first_ = false;
  if (!clean_) return utf8_feed(piece, false);
  return utf8_feed(clean_feed(piece, false), false);
}

std::string Detokenizer::finish() {
  std::string out;
  if (clean_) out = utf8_feed(clean_feed({}, true), false);
  out += utf8_feed({}, true);
  first_ = !continuation_;
  return out;
}

std::string Detokenizer::clean_feed(std::string_view bytes, bool final) {
  clean_pending_.append(bytes);
  size_t cut = 0;
  if (final) {
    cut = clean_pending_.size();
  } else {
    // Every clean-up rule needs a space right before the byte it looks at, acts only on a space or an
    // apostrophe, and looks at most two bytes ahead; the rules only delete spaces. So where the last
    // two bytes before a point are neither space nor apostrophe (and so stay in place and adjacent),
    // no rule can span the point and the text before it is final.
    for (size_t p = clean_pending_.size(); p >= 2; --p) {
      if (!cleanup_sensitive(clean_pending_[p - 1]) && !cleanup_sensitive(clean_pending_[p - 2])) {
        cut = p;
        break;
      }
    }
  }
  if (cut == 0) return {};
  std::string seg = clean_pending_.substr(0, cut);
  clean_pending_.erase(0, cut);
  clean_spaces_inplace(seg);
  return seg;
}

std::string Detokenizer::utf8_feed(std::string_view bytes, bool final) {
  // utf8_pending_ is an unfinished sequence that was valid so far; re-feeding it first keeps the
  // sanitiser stateless between calls.
  std::string in = std::move(utf8_pending_);
  utf8_pending_.clear();
  in.append(bytes);
  Utf8Sanitizer z;
  std::string out;
  z.feed(in, out);
  if (final) {
    z.finish(out);
  } else if (z.pending() > 0) {
    utf8_pending_ = in.substr(in.size() - z.pending());
  }
  return out;
}

}  // namespace pg::tok
