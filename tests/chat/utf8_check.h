// A strict UTF-8 validity check for the chat parser tests and fuzzer, written independently of the
// parsers' own UTF-8 code on purpose (a shared bug would hide itself). Header-only so the libFuzzer
// target, which does not link the test utilities, can use it too.
#pragma once
#include <cstddef>
#include <string_view>

namespace pg::test {

// Well-formed UTF-8 per RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF.
inline bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      n = 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
    } else if (c == 0xE0) {
      n = 2, lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
      n = 2;
    } else if (c == 0xED) {
      n = 2, hi = 0x9F;
    } else if (c == 0xF0) {
      n = 3, lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
      n = 3;
    } else if (c == 0xF4) {
      n = 3, hi = 0x8F;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if (k == 1 ? (d < lo || d > hi) : ((d & 0xC0) != 0x80)) return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace pg::test
