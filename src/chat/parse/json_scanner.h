// Incremental JSON value scanner for streamed tool-call arguments.
//
// Bytes go in as they arrive; the scanner stops right after one complete value, or at the first byte that cannot continue
// it. It copies what it consumed into out(), normalised so that out() is always strict JSON that nlohmann accepts:
// raw control characters inside strings become escapes, invalid UTF-8 inside strings becomes U+FFFD, and \' becomes '.
// Everything else is copied byte for byte (whitespace included).
//
// For streaming, safe() marks the longest prefix of out() that heal() turns into valid JSON: keys, numbers, literals,
// escapes, half UTF-8 characters and commas are held back until what follows them is known, while the text inside a
// string value is released as it comes. A client that received out()[0, safe()) can thus always be given a valid end
// (heal()) if the model breaks off or writes something invalid.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pg::chat::detail {

class JsonScanner {
 public:
  static constexpr size_t kMaxDepth = 256;  // deeper nesting is treated as an error, so nothing downstream recurses deeply

  // Consumes bytes until the value is complete or a byte cannot continue it; returns how many were consumed. Leading
  // whitespace is accepted.
  size_t feed(std::string_view in);
  // No more input: a top-level number that is valid so far is complete. Does not change a failed or unfinished state
  // otherwise.
  void finish();

  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kError; }
  const std::string& out() const { return out_; }
  size_t safe() const { return safe_; }
  // Text that, appended to out()[0, safe()), gives valid JSON (closing a string and the open containers).
  std::string heal() const;

 private:
  enum class State : uint8_t {
    kValue,         // a value is expected
    kArrFirst,      // after '[': a value or ']'
    kObjFirst,      // after '{': a key or '}'
    kObjKey,        // after ',' in an object: a key
    kColon,         // after a key
    kAfter,         // after a value inside a container: ',' or the closer
    kStr,           // inside a string (key or value, see key_)
    kEsc,           // after '\'
    kHex,           // inside \uXXXX
    kLowBackslash,  // after a high surrogate escape: '\' of the low half must follow
    kLowU,          // ... then 'u'
    kNum,           // inside a number (num_ has the sub-state)
    kLit,           // inside true / false / null
    kDone,
    kError,
  };
  enum class Num : uint8_t { kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp };

  bool step(unsigned char c);  // false: c was not consumed (error, or a number ended before it)
  void open(char bracket);
  void close();
  void value_done();
  void mark_safe(bool in_string) {
    safe_ = out_.size();
    safe_in_string_ = in_string;
  }
  bool string_byte(unsigned char c);
  bool num_byte(unsigned char c);
  static bool num_complete(Num n) { return n == Num::kZero || n == Num::kInt || n == Num::kFrac || n == Num::kExp; }

  State state_ = State::kValue;
  std::string out_;
  std::string stack_;  // open brackets, innermost last
  size_t safe_ = 0;
  bool safe_in_string_ = false;
  bool key_ = false;  // the current string is an object key
  Num num_ = Num::kMinus;
  const char* lit_ = nullptr;  // the literal being matched and how much of it is left
  size_t lit_left_ = 0;
  int hex_left_ = 0;
  uint32_t hex_val_ = 0;
  bool want_low_ = false;  // the \u escape being read must be a low surrogate
  int u8_need_ = 0;        // UTF-8 continuation bytes still expected inside a string
  unsigned char u8_lo_ = 0x80, u8_hi_ = 0xBF;
  size_t u8_start_ = 0;  // out_ offset where the current multi-byte character began
};

}  // namespace pg::chat::detail
