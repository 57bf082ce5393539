// Tokenizers loaded from GGUF metadata (the tokenizer.ggml.* keys llama.cpp writes), reproducing
// llama.cpp's tokenization and detokenization:
//   - "gpt2": byte-level BPE with ranked merges and a pre-tokenizer chosen by tokenizer.ggml.pre
//     (regex splitting through PCRE2 in UTF + UCP mode);
//   - "llama": SentencePiece-style merges by score with byte fallback and the dummy-prefix space;
//   - "bert": WordPiece (BERT normalisation: lowercasing, accent stripping, punctuation splitting).
// A Tokenizer is immutable after loading and safe to use from several threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pg::gguf {
class File;
}

namespace pg::tok {

constexpr int32_t kNoToken = -1;

enum class VocabType { SPM, BPE, WPM };

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : int32_t { UNDEFINED = 0, NORMAL = 1, UNKNOWN = 2, CONTROL = 3, USER_DEFINED = 4, UNUSED = 5, BYTE = 6 };

// Per-token attributes as llama.cpp derives them (llama_token_attr bit values).
enum TokenAttr : uint32_t {
  ATTR_UNDEFINED = 0,
  ATTR_UNKNOWN = 1u << 0,
  ATTR_UNUSED = 1u << 1,
  ATTR_NORMAL = 1u << 2,
  ATTR_CONTROL = 1u << 3,
  ATTR_USER_DEFINED = 1u << 4,
  ATTR_BYTE = 1u << 5,
  ATTR_NORMALIZED = 1u << 6,
  ATTR_LSTRIP = 1u << 7,
  ATTR_RSTRIP = 1u << 8,
  ATTR_SINGLE_WORD = 1u << 9,
};

// Special token ids; kNoToken where the vocabulary has none.
struct SpecialTokens {
  int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken, sep = kNoToken, pad = kNoToken,
          mask = kNoToken, nl = kNoToken;
  int32_t fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken, fim_pad = kNoToken, fim_rep = kNoToken, fim_sep = kNoToken;
};

struct LoadOptions {
  std::string pre_override;  // BPE: use this pre-tokenizer instead of tokenizer.ggml.pre
};

class Tokenizer {
 public:
  // Reads the tokenizer.* keys of any GGUF (a full model or a vocab-only file). Throws pg::Error for a
  // missing or malformed key, an unknown tokenizer.ggml.model or an unknown tokenizer.ggml.pre.
  static std::unique_ptr<Tokenizer> from_gguf(const gguf::File& file, const LoadOptions& options = {});
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: BOS/EOS (or CLS/SEP) as the vocabulary asks for. parse_special: text that spells a
  // control token becomes that token; otherwise it is tokenized as plain text. User-defined tokens
  // are always matched, as in llama.cpp and Hugging Face tokenizers.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  // The bytes of one token (llama_token_to_piece with lstrip 0). With special=false, control and
  // unknown tokens give "". The piece of a byte token may be a lone, invalid UTF-8 byte.
  std::string token_to_piece(int32_t id, bool special = true) const;

  // llama_detokenize(remove_special=false, unparse_special=special): pieces joined, the SPM dummy
  // prefix space removed from the first token, then the vocabulary's clean-up of spaces before
  // punctuation when it asks for one (clean_spaces=false turns that off). Raw bytes, possibly not
  // valid UTF-8. Throws pg::Error for an id outside [0, n_vocab).
  std::string decode(std::span<const int32_t> ids, bool special = false, bool clean_spaces = true) const;
  // decode() made valid UTF-8: each maximal invalid subpart becomes U+FFFD. Detokenizer gives
  // exactly this text, piece by piece.
  std::string detokenize(std::span<const int32_t> ids, bool special = false, bool clean_spaces = true) const;

  int32_t n_vocab() const;
  VocabType type() const;
  const std::string& model_name() const;  // tokenizer.ggml.model
  const std::string& pre_name() const;    // tokenizer.ggml.pre as used ("default" when absent)

  const SpecialTokens& special() const;
  int32_t bos() const { return special().bos; }
  int32_t eos() const { return special().eos; }
  int32_t eot() const { return special().eot; }
  int32_t pad() const { return special().pad; }
  int32_t unk() const { return special().unk; }
  int32_t nl() const { return special().nl; }
  bool add_bos() const;
  bool add_eos() const;
  bool add_sep() const;
  bool add_space_prefix() const;
  bool clean_spaces() const;

  // End-of-generation tokens: eos, eot, eom and every token whose text is one of the end markers
  // llama.cpp knows (<|im_end|>, <|eot_id|>, <|endoftext|>, <end_of_turn>, ...), sorted ascending.
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const;

  uint32_t attr(int32_t id) const;  // TokenAttr bits; throws for an out-of-range id
  bool is_control(int32_t id) const { return attr(id) & ATTR_CONTROL; }
  bool is_byte(int32_t id) const { return attr(id) & ATTR_BYTE; }
  const std::string& token_text(int32_t id) const;  // the vocabulary entry as stored (Ġ, ▁, <0x0A>)
  float score(int32_t id) const;
  int32_t text_to_token(std::string_view text) const;  // exact vocabulary entry, or kNoToken

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class Detokenizer;
};

// Streaming detokenizer for generation: push() returns the new text each token adds, only ever
// complete UTF-8 characters, held back while a character (or a space the clean-up may still remove)
// is unfinished; finish() flushes what is left, an unfinished character as U+FFFD. The
// concatenation of all outputs equals tok.detokenize(all ids, special, clean_spaces).
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tok, bool special = false, bool clean_spaces = true);
  std::string push(int32_t id);
  std::string finish();  // also readies the detokenizer for a new stream
  void reset();
  // The stream continues earlier text (generation after a prompt): the first token keeps the
  // leading space that SentencePiece vocabularies otherwise drop as the dummy prefix. Sticky across
  // finish() and reset().
  void continuation() {
    continuation_ = true;
    first_ = false;
  }

 private:
  std::string clean_feed(std::string_view bytes, bool final);
  std::string utf8_feed(std::string_view bytes, bool final);

  const Tokenizer& tok_;
  bool special_, clean_;
  bool continuation_ = false;
  bool first_ = true;
  std::string clean_pending_;  // raw bytes not yet past the space clean-up
  std::string utf8_pending_;   // bytes of an unfinished UTF-8 sequence (at most 3)
};

// Turns every maximal invalid UTF-8 subpart into U+FFFD (the Unicode / WHATWG convention).
std::string utf8_sanitize(std::string_view s);
bool utf8_is_valid(std::string_view s);

}  // namespace pg::tok
