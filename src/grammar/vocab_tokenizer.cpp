// Vocab from a loaded tokenizer (kept apart from matcher.cpp so the fuzzer builds without the
// tokenizer layer).
#include "grammar/grammar.h"
#include "tokenizer/tokenizer.h"

namespace pg::grammar {

std::shared_ptr<const Vocab> Vocab::from_tokenizer(const tok::Tokenizer& tok) {
  const int32_t n = tok.n_vocab();
  std::vector<std::string> pieces(static_cast<size_t>(n));
  std::vector<bool> eog(static_cast<size_t>(n), false);
  for (int32_t i = 0; i < n; ++i) {
    eog[i] = tok.is_eog(i);
    // Control tokens (and EOG) never match grammar bytes: a grammar constrains text.
    if (!eog[i] && !tok.is_control(i)) pieces[i] = tok.token_to_piece(i, false);
  }
  return build(std::move(pieces), std::move(eog));
}

}  // namespace pg::grammar
