#include <array>

#include "tokenizer/impl.h"

namespace pg::tok {

namespace {
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  uint32_t cp;
  size_t n;
  if (c < 0x80) {
    cp = c, n = 1;
  } else if (c < 0xE0) {
    cp = ((c & 0x1Fu) << 6) | (b(1) & 0x3Fu), n = 2;
  } else if (c < 0xF0) {
    cp = ((c & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu), n = 3;
  } else {
    cp = ((c & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu), n = 4;
  }
  i += n;
  return cp;
}

void Utf8Sanitizer::feed(std::string_view bytes, std::string& out) {
  for (size_t k = 0; k < bytes.size(); ++k) {
    const uint8_t b = static_cast<uint8_t>(bytes[k]);
    if (n_ > 0) {
      if (b >= lo_ && b <= hi_) {
        buf_[n_++] = b;
        lo_ = 0x80, hi_ = 0xBF;
        if (n_ == need_) {
          out.append(reinterpret_cast<const char*>(buf_), n_);
          n_ = 0;
        }
        continue;
      }
      // The sequence broke off: its bytes so far are one maximal invalid subpart, and b starts anew.
      out += kReplacement;
      n_ = 0;
    }
    if (b < 0x80) {
      out += static_cast<char>(b);
      continue;
    }
    lo_ = 0x80, hi_ = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need_ = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need_ = 3;
      if (b == 0xE0) lo_ = 0xA0;  // no overlong forms
      if (b == 0xED) hi_ = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      need_ = 4;
      if (b == 0xF0) lo_ = 0x90;
      if (b == 0xF4) hi_ = 0x8F;  // nothing above U+10FFFF
    } else {
      out += kReplacement;  // continuation byte without a lead, C0, C1, F5..FF
      continue;
    }
    buf_[0] = b;
    n_ = 1;
  }
}

void Utf8Sanitizer::finish(std::string& out) {
  if (n_ > 0) out += kReplacement;
  n_ = 0;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  Utf8Sanitizer z;
  z.feed(s, out);
  z.finish(out);
  return out;
}

bool utf8_is_valid(std::string_view s) {
  Utf8Sanitizer z;
  std::string out;
  // Fast path: ASCII runs need no decoding.
  size_t i = 0;
  while (i < s.size() && static_cast<uint8_t>(s[i]) < 0x80) ++i;
  if (i == s.size()) return true;
  out.reserve(s.size() - i);
  z.feed(s.substr(i), out);
  return z.pending() == 0 && out.size() == s.size() - i;
}

void clean_spaces_inplace(std::string& text) {
  // llama.cpp's three clean-up passes (clean_up_tokenization_spaces), each reading the output of the
  // previous one. They only ever drop spaces, and a decision looks at most one byte back and two ahead.
  const auto pass1 = [](std::string& t) {  // " ?" " !" " ." " ," lose the space
    std::string o;
    o.reserve(t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      const char x = t[i];
      if (i > 0 && t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) o.pop_back();
      o += x;
    }
    t.swap(o);
  };
  const auto pass2 = [](std::string& t) {  // " ' " -> "'"
    std::string o;
    o.reserve(t.size());
    bool prev_dropped = false;  // the byte before i was a space swallowed by a " ' " (llama.cpp NULs it)
    for (size_t i = 0; i < t.size(); ++i) {
      const char x = t[i];
      const bool prev_space = i > 0 && t[i - 1] == ' ' && !prev_dropped;
      prev_dropped = false;
      if (i > 0 && x == '\'' && i + 1 < t.size() && prev_space && t[i + 1] == ' ') {
        o.pop_back();
        o += x;
        ++i;  // the following space is dropped too
        prev_dropped = true;
        continue;
      }
      o += x;
    }
    t.swap(o);
  };
  const auto pass3 = [](std::string& t) {  // " 's" " 'm" " 're" " 've" lose the space
    std::string o;
    o.reserve(t.size());
    for (size_t i = 0; i < t.size(); ++i) {
      const char x = t[i];
      if (i > 0 && t[i - 1] == ' ' && x == '\'' && i + 1 < t.size()) {
        const char x1 = t[i + 1];
        if (x1 == 's' || x1 == 'm') {
          o.pop_back();
        } else if (x1 != 't' && x1 != 'd' && i + 2 < t.size()) {
          const char x2 = t[i + 2];
          if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) o.pop_back();
        }
      }
      o += x;
    }
    t.swap(o);
  };
  pass1(text);
  pass2(text);
  pass3(text);
}

namespace {
struct Gpt2Bytes {
  std::array<std::string, 256> to_char;
  std::array<int16_t, 324> to_byte;  // code points used are < 324
  Gpt2Bytes() {
    to_byte.fill(-1);
    // Printable Latin-1 bytes map to themselves; the other 68 bytes map, in order, to U+0100...
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      utf8_append(to_char[b], cp);
      to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};
const Gpt2Bytes& gpt2_bytes() {
  static const Gpt2Bytes t;
  return t;
}
}  // namespace

const std::string& gpt2_byte_to_char(uint8_t b) { return gpt2_bytes().to_char[b]; }
int gpt2_char_to_byte(uint32_t cp) { return cp < 324 ? gpt2_bytes().to_byte[cp] : -1; }

}  // namespace pg::tok
