#include "chat/parse/json_scanner.h"

namespace pg::chat::detail {

namespace {

bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

int hex_digit(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

size_t JsonScanner::feed(std::string_view in) {
  size_t i = 0;
  while (i < in.size() && state_ != State::kDone && state_ != State::kError) {
    if (step(static_cast<unsigned char>(in[i]))) ++i;
    // Not consumed and no error: the byte ended a number or a broken UTF-8 sequence; it is looked at again.
  }
  return i;
}

void JsonScanner::finish() {
  if (state_ == State::kNum && num_complete(num_)) value_done();
}

std::string JsonScanner::heal() const {
  // The stack at safe() equals the current stack: every open and close is itself a safe point, and nothing after the
  // last safe point can have changed the nesting.
  std::string h;
  if (safe_in_string_) h.push_back('"');
  for (auto it = stack_.rbegin(); it != stack_.rend(); ++it) h.push_back(*it == '{' ? '}' : ']');
  return h;
}

void JsonScanner::open(char bracket) {
  if (stack_.size() >= kMaxDepth) {
    state_ = State::kError;
    return;
  }
  stack_.push_back(bracket);
  out_.push_back(bracket);
  state_ = bracket == '{' ? State::kObjFirst : State::kArrFirst;
  mark_safe(false);
}

void JsonScanner::close() {
  out_.push_back(stack_.back() == '{' ? '}' : ']');
  stack_.pop_back();
  value_done();
}

void JsonScanner::value_done() {
  state_ = stack_.empty() ? State::kDone : State::kAfter;
  mark_safe(false);
}

bool JsonScanner::num_byte(unsigned char c) {
  const bool digit = c >= '0' && c <= '9';
  Num next = num_;
  bool ends = false;
  switch (num_) {
    case Num::kMinus:
      if (!digit) return state_ = State::kError, false;
      next = c == '0' ? Num::kZero : Num::kInt;
      break;
    case Num::kZero:
      if (c == '.')
        next = Num::kDot;
      else if (c == 'e' || c == 'E')
        next = Num::kE;
      else if (digit)
        return state_ = State::kError, false;  // leading zero
      else
        ends = true;
      break;
    case Num::kInt:
      if (c == '.')
        next = Num::kDot;
      else if (c == 'e' || c == 'E')
        next = Num::kE;
      else if (!digit)
        ends = true;
      break;
    case Num::kDot:
      if (!digit) return state_ = State::kError, false;
      next = Num::kFrac;
      break;
    case Num::kFrac:
      if (c == 'e' || c == 'E')
        next = Num::kE;
      else if (!digit)
        ends = true;
      break;
    case Num::kE:
      if (c == '+' || c == '-')
        next = Num::kESign;
      else if (digit)
        next = Num::kExp;
      else
        return state_ = State::kError, false;
      break;
    case Num::kESign:
      if (!digit) return state_ = State::kError, false;
      next = Num::kExp;
      break;
    case Num::kExp:
      if (!digit) ends = true;
      break;
  }
  if (ends) {
    if (!num_complete(num_)) return state_ = State::kError, false;
    value_done();
    return false;  // c belongs to whatever follows the number
  }
  num_ = next;
  out_.push_back(static_cast<char>(c));
  return true;
}

bool JsonScanner::string_byte(unsigned char c) {
  if (u8_need_ > 0) {
    if (c >= u8_lo_ && c <= u8_hi_) {
      out_.push_back(static_cast<char>(c));
      u8_lo_ = 0x80;
      u8_hi_ = 0xBF;
      if (--u8_need_ == 0 && !key_) mark_safe(true);
      return true;
    }
    // A broken multi-byte character becomes U+FFFD; c is then read afresh.
    out_.resize(u8_start_);
    out_ += kReplacement;
    u8_need_ = 0;
    if (!key_) mark_safe(true);
    return false;
  }
  if (c == '"') {
    out_.push_back('"');
    if (key_) {
      key_ = false;
      state_ = State::kColon;
    } else {
      value_done();
    }
    return true;
  }
  if (c == '\\') {
    out_.push_back('\\');
    state_ = State::kEsc;
    return true;
  }
  if (c < 0x20) {
    // Models often write raw newlines and tabs inside JSON strings; they are escaped so the result stays strict JSON.
    static constexpr char kHex[] = "0123456789abcdef";
    switch (c) {
      case '\n':
        out_ += "\\n";
        break;
      case '\r':
        out_ += "\\r";
        break;
      case '\t':
        out_ += "\\t";
        break;
      default:
        out_ += "\\u00";
        out_.push_back(kHex[c >> 4]);
        out_.push_back(kHex[c & 15]);
    }
  } else if (c < 0x80) {
    out_.push_back(static_cast<char>(c));
  } else {
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
      need = 1;
    else if (c == 0xE0)
      need = 2, lo = 0xA0;
    else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
      need = 2;
    else if (c == 0xED)
      need = 2, hi = 0x9F;
    else if (c == 0xF0)
      need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3)
      need = 3;
    else if (c == 0xF4)
      need = 3, hi = 0x8F;
    if (need == 0) {
      out_ += kReplacement;
    } else {
      u8_start_ = out_.size();
      out_.push_back(static_cast<char>(c));
      u8_need_ = need;
      u8_lo_ = lo;
      u8_hi_ = hi;
      return true;  // not a safe point until the character is complete
    }
  }
  if (!key_) mark_safe(true);
  return true;
}

bool JsonScanner::step(unsigned char c) {
  switch (state_) {
    case State::kValue:
    case State::kArrFirst:
      if (is_ws(c)) {
        out_.push_back(static_cast<char>(c));
        return true;
      }
      if (c == ']' && state_ == State::kArrFirst) {
        close();
        return true;
      }
      switch (c) {
        case '{':
        case '[':
          open(static_cast<char>(c));
          return state_ != State::kError;
        case '"':
          out_.push_back('"');
          key_ = false;
          state_ = State::kStr;
          mark_safe(true);
          return true;
        case 't':
          lit_ = "rue", lit_left_ = 3;
          break;
        case 'f':
          lit_ = "alse", lit_left_ = 4;
          break;
        case 'n':
          lit_ = "ull", lit_left_ = 3;
          break;
        default:
          if (c == '-' || (c >= '0' && c <= '9')) {
            out_.push_back(static_cast<char>(c));
            num_ = c == '-' ? Num::kMinus : (c == '0' ? Num::kZero : Num::kInt);
            state_ = State::kNum;
            return true;
          }
          state_ = State::kError;
          return false;
      }
      out_.push_back(static_cast<char>(c));
      state_ = State::kLit;
      return true;

    case State::kObjFirst:
    case State::kObjKey:
      if (is_ws(c)) {
        out_.push_back(static_cast<char>(c));
        return true;
      }
      if (c == '}' && state_ == State::kObjFirst) {
        close();
        return true;
      }
      if (c == '"') {
        out_.push_back('"');
        key_ = true;
        state_ = State::kStr;
        return true;
      }
      state_ = State::kError;
      return false;

    case State::kColon:
      if (is_ws(c)) {
        out_.push_back(static_cast<char>(c));
        return true;
      }
      if (c == ':') {
        out_.push_back(':');
        state_ = State::kValue;
        return true;
      }
      state_ = State::kError;
      return false;

    case State::kAfter:
      if (is_ws(c)) {
        out_.push_back(static_cast<char>(c));
        return true;
      }
      if (c == ',') {
        out_.push_back(',');
        state_ = stack_.back() == '{' ? State::kObjKey : State::kValue;
        return true;
      }
      if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
        close();
        return true;
      }
      state_ = State::kError;
      return false;

    case State::kStr:
      return string_byte(c);

    case State::kEsc:
      switch (c) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
          out_.push_back(static_cast<char>(c));
          break;
        case '\'':
          // \' is not JSON, but models write it; the backslash is dropped.
          out_.pop_back();
          out_.push_back('\'');
          break;
        case 'u':
          out_.push_back('u');
          state_ = State::kHex;
          hex_left_ = 4;
          hex_val_ = 0;
          return true;
        default:
          state_ = State::kError;
          return false;
      }
      state_ = State::kStr;
      if (!key_) mark_safe(true);
      return true;

    case State::kHex: {
      const int d = hex_digit(c);
      if (d < 0) {
        state_ = State::kError;
        return false;
      }
      out_.push_back(static_cast<char>(c));
      hex_val_ = hex_val_ * 16 + static_cast<uint32_t>(d);
      if (--hex_left_ > 0) return true;
      const bool high = hex_val_ >= 0xD800 && hex_val_ <= 0xDBFF;
      const bool low = hex_val_ >= 0xDC00 && hex_val_ <= 0xDFFF;
      if (want_low_ != low) {
        // Unpaired surrogates are rejected by strict parsers (nlohmann among them).
        state_ = State::kError;
        return false;
      }
      if (high) {
        want_low_ = true;
        state_ = State::kLowBackslash;
        return true;
      }
      want_low_ = false;
      state_ = State::kStr;
      if (!key_) mark_safe(true);
      return true;
    }

    case State::kLowBackslash:
      if (c != '\\') {
        state_ = State::kError;
        return false;
      }
      out_.push_back('\\');
      state_ = State::kLowU;
      return true;

    case State::kLowU:
      if (c != 'u') {
        state_ = State::kError;
        return false;
      }
      out_.push_back('u');
      state_ = State::kHex;
      hex_left_ = 4;
      hex_val_ = 0;
      return true;

    case State::kNum:
      return num_byte(c);

    case State::kLit:
      if (c != static_cast<unsigned char>(*lit_)) {
        state_ = State::kError;
        return false;
      }
      out_.push_back(static_cast<char>(c));
      ++lit_;
      if (--lit_left_ == 0) value_done();
      return true;

    case State::kDone:
    case State::kError:
      return false;
  }
  return false;
}

}  // namespace pg::chat::detail
