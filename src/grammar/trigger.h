// Lazy-grammar triggers (llama-server's grammar_lazy / grammar_triggers; docs/structured-output.md
// "Lazy grammars"): the output is free until a trigger matches the text generated so far; from then
// on the grammar constrains the rest, and it is fed the text from the trigger's start.
//
// Trigger kinds and where the grammar starts (llama.cpp's semantics):
//   word          the literal anywhere in the text          -> at the word's first occurrence
//   pattern       a regex anywhere (regex_search)           -> at the first capture group that matched
//                                                              something, else at the match start
//   pattern_full  a regex matching the whole text so far    -> same rule as pattern
//                 (regex_match, checked after every token)
//   token         one token id, when that token is chosen   -> at that token's text
// Checked after each token, token triggers first, then the others in the order given.
//
// Cost: a trigger is a byte-level NFA (Thompson construction, leftmost-first priorities like
// ECMAScript's backtracking); the watch keeps the NFA's state set and advances it by the new token's
// bytes only, so a token costs O(bytes x NFA states), never a re-scan of the output. The exact start
// (capture groups) is computed once, when the trigger fires, by a Pike VM over the kept text.
//
// Regex subset (ECMAScript syntax): literals (UTF-8), `.` (any byte but \n \r), classes `[...]`
// with ranges, negation and escapes, `\d \D \w \W \s \S` (ASCII), `\n \r \t \v \f \0 \xHH \uHHHH`,
// escaped punctuation, groups `( )` `(?: )`, `|`, `* + ? {m} {m,} {m,n}` and their lazy forms,
// `^` `$` (start / end of the text). Errors (pg::Error "regex: ... at offset N"): lookaround, named
// groups, back-references, `\b \B`, non-ASCII characters in a negated class, over 4 096 program
// instructions. Negated classes, `.` and `\S` step over one byte, so they match multi-byte characters
// one byte at a time (the same strings under `*`/`+`; a capture could start mid-character only in a
// pattern that says so).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace pg::grammar {

// A compiled regex: a byte program for the NFA / Pike VM.
class Regex {
 public:
  // Throws pg::Error "regex: <what> at offset N".
  static Regex compile(std::string_view pattern);

  enum class Op : uint8_t { Byte, Split, Jmp, Save, Bol, Eol, Match };
  struct Inst {
    Op op;
    uint32_t x = 0, y = 0;  // Byte: set index; Split: preferred x, then y; Jmp: x; Save: slot x
  };
  const std::vector<Inst>& prog() const { return prog_; }
  bool in_set(uint32_t set, uint8_t b) const { return (sets_[set][b >> 6] >> (b & 63)) & 1; }
  int n_groups() const { return n_groups_; }  // capture groups, not counting the whole match

  // The grammar's start in `text` (see the header comment), or npos when it does not match.
  // full: regex_match of the whole text; else regex_search. O(text x program), run once per firing.
  size_t find_start(std::string_view text, bool full) const;

 private:
  friend struct RegexCompiler;
  std::vector<Inst> prog_;
  std::vector<std::array<uint64_t, 4>> sets_;
  int n_groups_ = 0;
};

struct TriggerSpec {
  enum class Kind : uint8_t { Word, Pattern, PatternFull, Token };
  Kind kind = Kind::Word;
  std::string value;   // word / pattern
  int32_t token = -1;  // Kind::Token
};

// The triggers of one request, compiled once and shared (immutable).
class Triggers {
 public:
  // Throws pg::Error naming the trigger by index ("trigger 2: regex: ... at offset 5") for an
  // empty word or pattern, or a regex that does not compile. Token ids are checked by the caller
  // (it knows the vocabulary).
  static std::shared_ptr<const Triggers> compile(std::vector<TriggerSpec> specs);
  const std::vector<TriggerSpec>& specs() const { return specs_; }

 private:
  friend class TriggerWatch;
  std::vector<TriggerSpec> specs_;
  std::vector<Regex> regex_;  // per spec (empty program for tokens)
};

// Per sequence: the armed phase. push() every chosen token's text; once it returns a position the
// watch is done (the caller feeds text().substr(pos) to the grammar).
class TriggerWatch {
 public:
  explicit TriggerWatch(std::shared_ptr<const Triggers> t);
  static constexpr size_t npos = std::string::npos;
  // Appends the token's text; returns where the grammar starts in text() when a trigger fired with
  // this token, else npos.
  size_t push(int32_t token, std::string_view piece);
  bool fired() const { return fired_; }
  // Back to the start (an empty text, nothing fired), keeping the buffers: a tool-call grammar that
  // re-arms after each call.
  void reset();
  const std::string& text() const { return text_; }
  int fired_index() const { return fired_index_; }  // which trigger (index into specs), -1 before

 private:
  // NFA state set of one regex trigger: the pcs of Byte (waiting for a byte) and Eol (waiting for
  // the end) instructions reached, in priority order.
  struct Nfa {
    std::vector<uint32_t> cur, next;
    std::vector<uint32_t> mark;  // generation stamp per pc
    uint32_t gen = 0;
    bool matched = false;  // search: a match ended somewhere in the text so far
    bool dead = false;     // full: no thread left, can never match
  };
  void closure(const Regex& re, Nfa& n, std::vector<uint32_t>& out, uint32_t pc, bool at_start, bool& match);
  bool ends_with_match(const Regex& re, Nfa& n);  // a thread reaches Match when the text ends here
  std::shared_ptr<const Triggers> t_;
  std::vector<Nfa> nfa_;
  std::vector<uint32_t> stack_;  // closure work list (reused)
  std::string text_;
  bool fired_ = false;
  int fired_index_ = -1;
};

}  // namespace pg::grammar
