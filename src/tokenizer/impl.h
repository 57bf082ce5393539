// Internals shared by the tokenizer sources. Not part of the public API.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace pg::tok {

// Hash/equality that let unordered_map<std::string, T> be probed with a string_view.
struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
struct StrEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const noexcept { return a == b; }
};
template <class T>
using StrMap = std::unordered_map<std::string, T, StrHash, StrEq>;

// ---- UTF-8 -------------------------------------------------------------------------------------
// Length of the sequence a lead byte announces, as llama.cpp counts it (1 for continuation bytes).
inline size_t utf8_len_lax(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}
void utf8_append(std::string& out, uint32_t cp);
// Decodes one well-formed character at s[i] (the caller has validated s); advances i.
uint32_t utf8_next(std::string_view s, size_t& i);

// Incremental form of utf8_sanitize: feed bytes, get back the complete, valid text they finish.
class Utf8Sanitizer {
 public:
  void feed(std::string_view bytes, std::string& out);
  void finish(std::string& out);  // an unfinished sequence becomes one U+FFFD
  void reset() { n_ = need_ = 0; }
  size_t pending() const { return n_; }

 private:
  uint8_t buf_[4] = {};
  size_t n_ = 0;                   // bytes held of the current sequence
  size_t need_ = 0;                // total length of the current sequence
  uint8_t lo_ = 0x80, hi_ = 0xBF;  // allowed range of the next continuation byte
};

// llama.cpp's clean_up_tokenization_spaces passes over a complete text (in place).
void clean_spaces_inplace(std::string& text);

// ---- pre-tokenizer (regex splitting) -------------------------------------------------------------
class PreTokenizer {
 public:
  // regexes are applied in order, each splitting every piece the previous ones produced; both the
  // matches and the text between them become pieces (Hugging Face's "Isolated" split behaviour).
  explicit PreTokenizer(const std::vector<std::string>& regexes);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;
  // text must be valid UTF-8. Returns [begin, end) byte ranges covering text, in order.
  std::vector<std::pair<size_t, size_t>> split(std::string_view text) const;

 private:
  struct Regex;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

// What tokenizer.ggml.pre selects for a byte-level BPE vocabulary.
struct PreConfig {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  // a word that is itself a token is taken whole (Llama 3)
  bool clean_spaces = true;
  int add_bos = -1;     // -1: leave the BPE default (false); 0/1: the pre-tokenizer's default
  bool no_bos = false;  // the pre-tokenizer clears the default BOS id (ChatGLM)
};
// Throws pg::Error naming the pre-tokenizer when it is unknown.
PreConfig pre_config(const std::string& name);
// Every name pre_config() accepts (for messages and tests).
std::vector<std::string> known_pre_names();

// ---- byte-level BPE ------------------------------------------------------------------------------
class BpeModel {
 public:
  // tokens: vocabulary texts by id; text_to_id: the lookup llama.cpp uses (last duplicate wins).
  BpeModel(const std::vector<std::string>& tokens, const StrMap<int32_t>& text_to_id, const std::vector<std::string_view>& merges,
           PreConfig pre);
  // Appends the tokens of one raw-text fragment (valid UTF-8).
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  const PreConfig& pre() const { return pre_; }

 private:
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  int32_t intern(std::string_view s);
  int32_t find_sym(std::string_view s) const;

  PreConfig pre_;
  PreTokenizer splitter_;
  int32_t n_vocab_ = 0;
  StrMap<int32_t> sym_of_text_;                                       // token texts (sym == id) and other merge strings
  std::vector<std::string> sym_text_;                                 // text of every symbol
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left,right) -> (rank, result)
  int32_t byte_sym_[256];                                             // symbol of each byte's GPT-2 character, or -1
  std::string byte_char_[256];                                        // GPT-2 byte -> unicode character (UTF-8)
  const StrMap<int32_t>* text_to_id_ = nullptr;

  mutable std::mutex cache_mu_;
  mutable StrMap<std::vector<int32_t>> cache_;  // word bytes -> tokens
};

// The 256 GPT-2 byte-to-character mappings (UTF-8 strings) and the reverse (character -> byte).
const std::string& gpt2_byte_to_char(uint8_t b);
int gpt2_char_to_byte(uint32_t cp);  // -1 if cp is not one of the 256 characters

// ---- WordPiece normalisation tables (generated from UnicodeData.txt) -------------------------------
namespace uni {
enum : uint8_t {
  kLetter = 1,
  kNumber = 2,
  kMark = 4,
  kPunct = 8,
  kSymbol = 16,
  kSeparator = 32,
  kControl = 64,
  kNonspacing = 128
};
uint8_t category(uint32_t cp);  // major class bit (+ kNonspacing for Mn); 0 unassigned
bool is_whitespace(uint32_t cp);
uint32_t to_lower(uint32_t cp);                    // simple lowercase mapping
void decompose(uint32_t cp, std::u32string& out);  // appends the full canonical decomposition (NFD, unordered)
}  // namespace uni

struct TokenData {
  std::string text;
  float score = 0.0f;
  uint32_t attr = ATTR_NORMAL;
};

struct Tokenizer::Impl {
  VocabType type = VocabType::SPM;
  std::string model, pre;
  std::vector<TokenData> tokens;
  StrMap<int32_t> text_to_id;
  SpecialTokens sp;
  bool add_bos = false, add_eos = false, add_sep = false;
  bool add_space_prefix = false, clean_spaces = false, remove_extra_ws = false;
  bool wpm_lowercase = true, wpm_strip_accents = true;
  size_t max_token_len = 0;
  std::vector<int32_t> special_cache;  // control/user-defined/unknown ids, longest text first
  std::vector<int32_t> eog;            // sorted
  std::vector<std::string> piece;      // token_to_piece(id, special=true) for every id
  std::unique_ptr<BpeModel> bpe;

  std::string make_piece(int32_t id) const;
  int32_t byte_to_token(uint8_t b) const;
  void spm_encode(std::string_view text, std::vector<int32_t>& out) const;
  void wpm_encode(std::string_view text, std::vector<int32_t>& out) const;
  void check_id(int32_t id) const;
};

}  // namespace pg::tok
