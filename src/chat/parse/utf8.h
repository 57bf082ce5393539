// Incremental UTF-8 repair and JSON string escaping for streamed model output.
//
// Chunk boundaries (and byte-level BPE tokens) can split a multi-byte character, and a model can emit bytes that are not
// UTF-8 at all. Everything the parser hands out must be valid UTF-8 (it ends up in JSON), and must not depend on where
// the chunks were cut, so both classes work byte by byte and hold back an incomplete trailing sequence.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace pg::chat::detail {

// Passes valid UTF-8 through; each invalid byte (or maximal invalid subpart of a sequence) becomes U+FFFD.
class Utf8Sanitizer {
 public:
  void feed(std::string_view in, std::string& out);
  // End of input: an incomplete trailing sequence becomes U+FFFD.
  void flush(std::string& out);

 private:
  void byte(unsigned char c, std::string& out);
  std::string pending_;                  // bytes of the incomplete sequence (at most 3)
  int need_ = 0;                         // continuation bytes still expected
  unsigned char lo_ = 0x80, hi_ = 0xBF;  // allowed range of the next continuation byte
};

// Escapes text for the inside of a JSON string literal (no quotes added), repairing UTF-8 on the way.
class JsonStringEscaper {
 public:
  void feed(std::string_view in, std::string& out);
  void flush(std::string& out);

 private:
  Utf8Sanitizer utf8_;
  std::string tmp_;
};

// Appends the JSON escape of valid UTF-8 text (without quotes).
void append_json_escaped(std::string_view text, std::string& out);

// `text` as a complete JSON string literal, with UTF-8 repaired.
std::string json_quote(std::string_view text);

bool valid_utf8(std::string_view text);

}  // namespace pg::chat::detail
