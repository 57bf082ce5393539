// Structured output core: GBNF grammars (llama-server's `grammar` field), JSON Schema -> GBNF, and an
// incremental byte-level recogniser with a per-step allowed-token mask over a tokenizer's vocabulary.
//
// Design (docs/structured-output.md has the whole story):
//   - GBNF is parsed into rules over Unicode code points, then compiled to a BYTE-level grammar: every
//     character class becomes alternatives of UTF-8 byte-set sequences. The matcher therefore never
//     deals with partial UTF-8 (tokens may end mid-character) and the vocabulary trie is a plain byte trie.
//   - The matcher is a pushdown recogniser like llama.cpp's: its state is a set of stacks of grammar
//     positions whose tops are terminals (byte sets); an empty stack means "the grammar may end here".
//     Right recursion is a tail call (the return position is not pushed when it is the end of a
//     sequence), so `x*` runs in constant stack depth. Left recursion is rejected when compiling.
//   - allowed_tokens() walks the byte trie of all token pieces once, advancing the stack set per trie
//     edge, and caches per "window" of the state (the top frames of every stack): the part of the mask
//     decided inside the window is reused across steps, positions and clones; only tokens that pop out
//     of the window are walked again with the real rest of the stacks.
// Every failure on untrusted input (grammar text, schema) is a pg::Error with a position or keyword.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace pg::tok {
class Tokenizer;
}

namespace pg::grammar {

// Bounds on untrusted grammar text (a request field).
struct Limits {
  size_t max_text_bytes = 1u << 20;     // grammar source
  int max_nesting = 64;                 // parenthesised groups inside one another
  size_t max_elements = 1u << 20;       // compiled byte-level elements after repetition expansion
  uint32_t max_repetition = 10000;      // m and n in x{m,n}
  size_t max_stacks = 4096;             // parallel parses (stacks) of one expansion (ambiguous grammars blow up)
};

// A compiled byte-level grammar. Immutable; share it between matchers (and threads).
class Grammar {
 public:
  // Parses GBNF text and compiles it. The start rule is `root` unless start_rule names another.
  // Throws pg::Error "grammar: <what> at line L col C" for malformed text, an undefined or missing
  // rule, left recursion or a limit exceeded.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf, const Limits& limits = {},
                                              std::string_view start_rule = "root");

  // Compiled form. An element is a terminal (a byte set), a reference to a rule, or the end of an
  // alternative; each alternative is a run of elements ending in End.
  enum class Kind : uint8_t { Bytes, Ref, End };
  struct Element {
    Kind kind;
    uint32_t arg;  // Bytes: index into byte_sets; Ref: rule index
  };
  struct ByteSet {
    uint64_t bits[4];
    bool test(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  };
  const std::vector<Element>& elements() const { return elems_; }
  const std::vector<ByteSet>& byte_sets() const { return sets_; }
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return alts_[rule]; }  // start offsets
  uint32_t root() const { return root_; }
  size_t n_rules() const { return alts_.size(); }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
  const Limits& limits() const { return limits_; }

  // A random sentence of the grammar (bytes), for tests and fuzzing: a random walk that prefers the
  // shortest alternative once depth passes max_depth. False when the grammar has no finite sentence or
  // the walk ran over max_bytes.
  bool sample(std::mt19937_64& rng, std::string& out, int max_depth = 12, size_t max_bytes = 1 << 16) const;

  struct Builder;

 private:
  friend struct Builder;
  Grammar() = default;
  std::vector<Element> elems_;
  std::vector<ByteSet> sets_;
  std::vector<std::vector<uint32_t>> alts_;
  std::vector<std::string> names_;
  std::vector<uint32_t> min_len_;  // shortest sentence of each rule, in bytes (for sample())
  uint32_t root_ = 0;
  Limits limits_;
};

// JSON Schema -> GBNF text (root rule `root`). Throws pg::Error "json_schema: ..." naming the keyword
// for an unsupported or malformed construct. See docs/structured-output.md for the covered subset and
// the whitespace policy.
// Code point ranges sorted and merged (adjacent ones joined), complemented over 0..0x10FFFF when
// `complement`: the shared step of GBNF character classes and JSON Schema pattern classes.
std::vector<std::pair<uint32_t, uint32_t>> merge_code_ranges(std::vector<std::pair<uint32_t, uint32_t>> r, bool complement);

// A GBNF string literal matching exactly the bytes of `raw` (quotes, backslashes, newlines and
// control bytes escaped).
std::string gbnf_literal(std::string_view raw);

std::string json_schema_to_gbnf(std::string_view schema_json);
// Several schemas as named rules of one grammar (no `root` rule; the caller writes its own start):
// rule `name` for the schema at `root_json` (its `properties[property]` when property is not empty;
// $refs resolve against root_json). Rule names must not start with "s<digit>" (generated names) nor
// be a primitive's (ws, char, string, integer, number, boolean, null, value, object, array).
struct SchemaRule {
  std::string name, root_json, property;
};
std::string json_schema_rules_gbnf(const std::vector<SchemaRule>& items);
// {"type":"json_object"}: any JSON object.
std::string json_object_gbnf();

// The vocabulary as a byte trie of token pieces, built once per tokenizer and shared.
class Vocab {
 public:
  // pieces[id]: the bytes of token id; eog[id]: an end-of-generation token (allowed only where the
  // grammar may end); a token that is neither EOG nor has bytes (control tokens) is never allowed.
  static std::shared_ptr<const Vocab> build(std::vector<std::string> pieces, std::vector<bool> eog);
  static std::shared_ptr<const Vocab> from_tokenizer(const tok::Tokenizer& tok);

  int32_t n_vocab() const { return static_cast<int32_t>(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_[id]; }
  bool is_eog(int32_t id) const { return eog_[id]; }
  size_t n_trie_nodes() const { return nodes_.size(); }

  // Trie: node 0 is the root; children of a node are a contiguous run of edges sorted by byte.
  struct Node {
    uint32_t first_edge, n_edges;
    uint32_t first_token, n_tokens;  // tokens whose piece ends here (indices into token_at_)
  };
  struct Edge {
    uint8_t byte;
    uint32_t child;
  };
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  std::vector<int32_t> token_at_;
  std::vector<int32_t> eog_ids_;
  // Per node (n_nodes): every byte on an edge below it (4 x 64 bits), and the end of its subtree's
  // tokens in token_at_ (contiguous: the trie is laid out depth first). The mask walk accepts a whole
  // subtree at once when the grammar state loops on every byte in it (a JSON string's interior).
  std::vector<std::array<uint64_t, 4>> sub_bytes_;
  std::vector<uint32_t> sub_end_;

 private:
  std::vector<std::string> pieces_;
  std::vector<bool> eog_;
};

// The mask walk's whole-subtree acceptance (Vocab::sub_bytes_) on or off: benchmarks compare both.
void set_subtree_skip(bool on);

// Bitmask over the vocabulary: bit id of word id/32.
using TokenMask = std::vector<uint32_t>;
inline bool mask_test(const TokenMask& m, int32_t id) { return (m[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1; }

struct MaskCache;

// Incremental recogniser. Cheap to copy (clone): the state is a few short stacks; the mask cache is
// shared between clones (thread-safe).
class Matcher {
 public:
  Matcher(std::shared_ptr<const Grammar> g, std::shared_ptr<const Vocab> v);

  // Advance over bytes / a token. On rejection returns false and leaves the state unchanged.
  bool accept_bytes(std::string_view bytes);
  bool accept_token(int32_t id);
  // The grammar may end here (EOG tokens are allowed).
  bool can_end() const;
  // No continuation at all (only after a state that can_end() with nothing more to match).
  bool done() const { return can_end() && stacks_.size() == 1; }

  // mask gets n_vocab bits: a token is allowed when accept_token(id) would succeed (EOG tokens: when
  // can_end()).
  void allowed_tokens(TokenMask& mask) const;
  // The same, by simulating every token (tests, and the reference for the fast walk).
  void allowed_tokens_brute(TokenMask& mask) const;

  Matcher clone() const { return *this; }
  const std::shared_ptr<const Grammar>& grammar() const { return g_; }
  const std::shared_ptr<const Vocab>& vocab() const { return v_; }
  size_t n_stacks() const { return stacks_.size(); }

  // Cache statistics (hits/misses of window masks), for benchmarks.
  struct CacheStats {
    uint64_t hits = 0, misses = 0;
  };
  CacheStats cache_stats() const;

 private:
  using Stack = std::vector<uint32_t>;  // grammar positions, bottom first; top is a Bytes element
  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const Vocab> v_;
  std::shared_ptr<MaskCache> cache_;
  std::vector<Stack> stacks_;  // sorted, unique; an empty Stack = may end
};

}  // namespace pg::grammar

namespace pg::grammar {

// A compiled grammar together with a prototype matcher over one vocabulary: requests with the same
// grammar text share it, so the mask cache (the expensive part: the first visit of a JSON-string
// state walks most of a 151 936-token trie, ~5 ms) is paid once per grammar, not once per request,
// and warm() pays it before the request reaches the engine thread.
struct Compiled {
  std::shared_ptr<const Grammar> grammar;
  Matcher proto;  // clone() it per sequence; clones share the mask cache
};

// Parses (or finds in a process-wide LRU of recent grammars, keyed by text, start rule and vocab)
// and warms the mask cache: masks of the states along a few random sentences of the grammar, byte by
// byte, for at most warm_ms. Throws pg::Error as Grammar::parse does.
std::shared_ptr<const Compiled> compile_cached(std::string_view gbnf, const std::shared_ptr<const Vocab>& vocab,
                                               std::string_view start_rule = "root", double warm_ms = 150);

// Computes masks along random sentences (bytes) of the matcher's grammar, filling its cache.
void warm(const Matcher& proto, double budget_ms, uint64_t seed = 1);

}  // namespace pg::grammar
