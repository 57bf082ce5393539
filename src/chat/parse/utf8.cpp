#include "chat/parse/utf8.h"

namespace pg::chat::detail {

namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}

void Utf8Sanitizer::byte(unsigned char c, std::string& out) {
  if (need_ > 0) {
    if (c >= lo_ && c <= hi_) {
      pending_.push_back(static_cast<char>(c));
      lo_ = 0x80;
      hi_ = 0xBF;
      if (--need_ == 0) {
        out += pending_;
        pending_.clear();
      }
      return;
    }
    // The sequence broke off: it becomes one U+FFFD and c starts afresh.
    out += kReplacement;
    pending_.clear();
    need_ = 0;
  }
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
    return;
  }
  // Second-byte ranges exclude overlong forms, UTF-16 surrogates and code points above U+10FFFF.
  if (c >= 0xC2 && c <= 0xDF) {
    need_ = 1, lo_ = 0x80, hi_ = 0xBF;
  } else if (c == 0xE0) {
    need_ = 2, lo_ = 0xA0, hi_ = 0xBF;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need_ = 2, lo_ = 0x80, hi_ = 0xBF;
  } else if (c == 0xED) {
    need_ = 2, lo_ = 0x80, hi_ = 0x9F;
  } else if (c == 0xF0) {
    need_ = 3, lo_ = 0x90, hi_ = 0xBF;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need_ = 3, lo_ = 0x80, hi_ = 0xBF;
  } else if (c == 0xF4) {
    need_ = 3, lo_ = 0x80, hi_ = 0x8F;
  } else {
    out += kReplacement;
    return;
  }
  pending_.assign(1, static_cast<char>(c));
}

void Utf8Sanitizer::feed(std::string_view in, std::string& out) {
  // Fast path: plain ASCII with nothing pending is copied as is.
  size_t i = 0;
  if (need_ == 0) {
    while (i < in.size() && static_cast<unsigned char>(in[i]) < 0x80) ++i;
    out.append(in.data(), i);
  }
  for (; i < in.size(); ++i) byte(static_cast<unsigned char>(in[i]), out);
}

void Utf8Sanitizer::flush(std::string& out) {
  if (!pending_.empty()) out += kReplacement;
  pending_.clear();
  need_ = 0;
}

void append_json_escaped(std::string_view text, std::string& out) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 15]);
        } else {
          out.push_back(ch);
        }
    }
  }
}

void JsonStringEscaper::feed(std::string_view in, std::string& out) {
  tmp_.clear();
  utf8_.feed(in, tmp_);
  append_json_escaped(tmp_, out);
}

void JsonStringEscaper::flush(std::string& out) {
  tmp_.clear();
  utf8_.flush(tmp_);
  append_json_escaped(tmp_, out);
}

bool valid_utf8(std::string_view text) {
  std::string out;
  Utf8Sanitizer s;
  s.feed(text, out);
  s.flush(out);
  return out == text;
}

std::string json_quote(std::string_view text) {
  std::string out = "\"";
  JsonStringEscaper esc;
  esc.feed(text, out);
  esc.flush(out);
  out.push_back('"');
  return out;
}

}  // namespace pg::chat::detail
