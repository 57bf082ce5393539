#include "chat/jinja/lexer.h"

#include <cstdlib>

#include "chat/jinja/error.h"
#include "chat/jinja/pystr.h"

namespace pg::jinja {

const char* describe(Tok t) {
  switch (t) {
    case Tok::kData:
      return "template data / text";
    case Tok::kVarBegin:
      return "begin of print statement";
    case Tok::kVarEnd:
      return "end of print statement";
    case Tok::kBlockBegin:
      return "begin of statement block";
    case Tok::kBlockEnd:
      return "end of statement block";
    case Tok::kName:
      return "name";
    case Tok::kString:
      return "string";
    case Tok::kInteger:
      return "integer";
    case Tok::kFloat:
      return "float";
    case Tok::kAdd:
      return "+";
    case Tok::kSub:
      return "-";
    case Tok::kDiv:
      return "/";
    case Tok::kFloorDiv:
      return "//";
    case Tok::kMul:
      return "*";
    case Tok::kMod:
      return "%";
    case Tok::kPow:
      return "**";
    case Tok::kTilde:
      return "~";
    case Tok::kLBracket:
      return "[";
    case Tok::kRBracket:
      return "]";
    case Tok::kLParen:
      return "(";
    case Tok::kRParen:
      return ")";
    case Tok::kLBrace:
      return "{";
    case Tok::kRBrace:
      return "}";
    case Tok::kEq:
      return "==";
    case Tok::kNe:
      return "!=";
    case Tok::kGt:
      return ">";
    case Tok::kGe:
      return ">=";
    case Tok::kLt:
      return "<";
    case Tok::kLe:
      return "<=";
    case Tok::kAssign:
      return "=";
    case Tok::kDot:
      return ".";
    case Tok::kColon:
      return ":";
    case Tok::kPipe:
      return "|";
    case Tok::kComma:
      return ",";
    case Tok::kSemicolon:
      return ";";
    case Tok::kEof:
      return "end of template";
  }
  return "?";
}

std::string describe(const Token& t) {
  if (t.type == Tok::kName) return t.text;
  return describe(t.type);
}

namespace {

[[noreturn]] void syntax(const std::string& msg, int line) { throw Error(ErrorKind::kSyntax, msg, line); }

// Decodes the code point at s[pos]; len receives its byte length (0 at the end).
char32_t cp_at(const std::string& s, size_t pos, size_t& len) {
  if (pos >= s.size()) {
    len = 0;
    return 0;
  }
  unsigned char c = s[pos];
  if (c < 0x80) {
    len = 1;
    return c;
  }
  len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  if (pos + len > s.size()) len = s.size() - pos;
  std::u32string u = py::decode(std::string_view(s).substr(pos, len));
  return u.empty() ? 0xFFFD : u[0];
}

size_t skip_ws(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    size_t len;
    char32_t c = cp_at(s, pos, len);
    if (!py::is_space(c)) break;
    pos += len;
  }
  return pos;
}

bool starts(const std::string& s, size_t pos, std::string_view w) { return s.compare(pos, w.size(), w) == 0; }

int count_nl(std::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

bool is_dig(char c) { return c >= '0' && c <= '9'; }

// Matches (\d+_)*\d+ greedily; returns the end or npos.
size_t digits_us(const std::string& s, size_t p) {
  if (p >= s.size() || !is_dig(s[p])) return std::string::npos;
  ++p;
  while (p < s.size()) {
    if (is_dig(s[p])) {
      ++p;
    } else if (s[p] == '_' && p + 1 < s.size() && is_dig(s[p + 1])) {
      p += 2;
    } else {
      break;
    }
  }
  return p;
}

size_t match_float(const std::string& s, size_t p) {
  if (p > 0 && s[p - 1] == '.') return std::string::npos;
  size_t q = digits_us(s, p);
  if (q == std::string::npos) return q;
  auto exponent = [&](size_t r) -> size_t {
    if (r < s.size() && (s[r] == 'e' || s[r] == 'E')) {
      ++r;
      if (r < s.size() && (s[r] == '+' || s[r] == '-')) ++r;
      return digits_us(s, r);
    }
    return std::string::npos;
  };
  if (q < s.size() && s[q] == '.') {
    size_t f = digits_us(s, q + 1);
    if (f != std::string::npos) {
      size_t e = exponent(f);
      return e != std::string::npos ? e : f;
    }
  }
  return exponent(q);
}

size_t match_integer(const std::string& s, size_t p, int& base) {
  auto run = [&](size_t r, auto ok) -> size_t {
    // (_?X)+
    size_t start = r;
    while (r < s.size()) {
      if (ok(s[r])) {
        ++r;
      } else if (s[r] == '_' && r + 1 < s.size() && ok(s[r + 1])) {
        r += 2;
      } else {
        break;
      }
    }
    return r == start ? std::string::npos : r;
  };
  if (p < s.size() && s[p] == '0' && p + 1 < s.size()) {
    char x = static_cast<char>(s[p + 1] | 0x20);
    size_t r = std::string::npos;
    if (x == 'b') {
      base = 2;
      r = run(p + 2, [](char c) { return c == '0' || c == '1'; });
    } else if (x == 'o') {
      base = 8;
      r = run(p + 2, [](char c) { return c >= '0' && c <= '7'; });
    } else if (x == 'x') {
      base = 16;
      r = run(p + 2, [](char c) { return is_dig(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); });
    }
    if (r != std::string::npos) return r;
  }
  base = 10;
  if (p < s.size() && s[p] >= '1' && s[p] <= '9') {
    size_t r = run(p + 1, is_dig);
    return r == std::string::npos ? p + 1 : r;
  }
  if (p < s.size() && s[p] == '0') {
    size_t r = run(p + 1, [](char c) { return c == '0'; });
    return r == std::string::npos ? p + 1 : r;
  }
  return std::string::npos;
}

// Python's "unicode-escape" decoding of a string literal body (jinja2 runs it after
// backslash-replacing non-ASCII characters).
std::string unescape(const std::string& body, int line) {
  std::string out;
  size_t i = 0, n = body.size();
  auto hexval = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    c = static_cast<char>(c | 0x20);
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto put = [&](uint32_t cp) {
    if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;  // lone surrogates cannot be UTF-8
    py::utf8_append(out, cp);
  };
  while (i < n) {
    char c = body[i];
    if (c != '\\') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 >= n) {
      syntax("\\ at end of string", line);
    }
    char e = body[i + 1];
    i += 2;
    switch (e) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t v = 0;
        for (int k = 0; k < digits; ++k) {
          if (i + k >= n || hexval(body[i + k]) < 0)
            syntax(std::string("truncated \\") + e + std::string(digits, 'X') + " escape", line);
          v = v * 16 + static_cast<uint32_t>(hexval(body[i + k]));
        }
        i += digits;
        if (v > 0x10FFFF) syntax("illegal Unicode character", line);
        put(v);
        break;
      }
      case 'N':
        syntax("named unicode escapes (\\N{...}) are not supported", line);
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i < n && body[i] >= '0' && body[i] <= '7'; ++k) v = v * 8 + (body[i++] - '0');
          put(v);
        } else if (static_cast<unsigned char>(e) >= 0x80) {
          // The backslash escapes the backslash-replaced form of the character, so the result is a
          // literal backslash followed by that escape's text.
          size_t start = i - 1, len;
          std::string tmp(body);
          char32_t cp = cp_at(tmp, start, len);
          char buf[16];
          if (cp <= 0xFF) {
            std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
          } else if (cp <= 0xFFFF) {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
          } else {
            std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(cp));
          }
          out += buf;
          i = start + len;
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

struct Lexer {
  std::string src;
  size_t n = 0;
  std::vector<Token> out;
  int line = 1;

  void emit(Tok t, std::string text = {}) { out.push_back(Token{t, line, std::move(text)}); }

  void emit_data(std::string text, bool lstrip_ok, char sign, bool is_var, size_t text_start) {
    // jinja2's OptionalLStrip: "-" strips all whitespace before the tag; lstrip_blocks strips the
    // indentation of a block/comment tag that starts its line.
    int nl = count_nl(text);
    if (sign == '-') {
      text = py::strip(text, std::nullopt, py::StripSide::kRight);
    } else if (sign != '+' && lstrip_ok && !is_var) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      bool line_starting = text_start == 0 || src[text_start - 1] == '\n';
      if ((l_pos > 0 || line_starting) && l_pos < text.size() && py::str_isspace(std::string_view(text).substr(l_pos)))
        text.resize(l_pos);
    }
    if (!text.empty()) emit(Tok::kData, std::move(text));
    line += nl;
  }

  // Tokens of one {{ }} or {% %} tag, starting after the opening delimiter and its sign.
  size_t lex_tag(size_t pos, bool block) {
    std::vector<char> balance;
    while (true) {
      if (pos >= n) return pos;  // the parser reports the missing end
      if (balance.empty()) {
        if (block) {
          if (starts(src, pos, "+%}")) {
            emit(Tok::kBlockEnd);
            return pos + 3;
          }
          if (starts(src, pos, "-%}")) {
            emit(Tok::kBlockEnd);
            size_t e = skip_ws(src, pos + 3);
            line += count_nl(std::string_view(src).substr(pos, e - pos));
            return e;
          }
          if (starts(src, pos, "%}")) {
            emit(Tok::kBlockEnd);
            size_t e = pos + 2;
            if (e < n && src[e] == '\n') {
              ++e;
              ++line;
            }
            return e;
          }
        } else {
          if (starts(src, pos, "-}}")) {
            emit(Tok::kVarEnd);
            size_t e = skip_ws(src, pos + 3);
            line += count_nl(std::string_view(src).substr(pos, e - pos));
            return e;
          }
          if (starts(src, pos, "}}")) {
            emit(Tok::kVarEnd);
            return pos + 2;
          }
        }
      }
      size_t len;
      char32_t c = cp_at(src, pos, len);
      if (py::is_space(c)) {
        size_t e = skip_ws(src, pos);
        line += count_nl(std::string_view(src).substr(pos, e - pos));
        pos = e;
        continue;
      }
      size_t e = match_float(src, pos);
      if (e != std::string::npos) {
        std::string t;
        for (size_t k = pos; k < e; ++k)
          if (src[k] != '_') t.push_back(src[k]);
        Token tok{Tok::kFloat, line, {}};
        tok.fval = std::strtod(t.c_str(), nullptr);
        out.push_back(tok);
        pos = e;
        continue;
      }
      int base = 10;
      e = match_integer(src, pos, base);
      if (e != std::string::npos) {
        std::string t;
        size_t k = pos + (base == 10 ? 0 : 2);
        for (; k < e; ++k)
          if (src[k] != '_') t.push_back(src[k]);
        auto v = py::parse_int(t, base);
        if (!v) syntax("integer literal too large", line);
        Token tok{Tok::kInteger, line, {}};
        tok.ival = *v;
        out.push_back(tok);
        pos = e;
        continue;
      }
      if (c == '_' || py::is_alpha(c)) {
        size_t q = pos + len;
        while (q < n) {
          size_t l2;
          char32_t d = cp_at(src, q, l2);
          if (!py::is_word(d)) break;
          q += l2;
        }
        emit(Tok::kName, src.substr(pos, q - pos));
        pos = q;
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t q = pos + 1;
        bool closed = false;
        while (q < n) {
          if (src[q] == '\\' && q + 1 < n) {
            q += 2;
            continue;
          }
          if (src[q] == static_cast<char>(c)) {
            closed = true;
            break;
          }
          ++q;
        }
        if (!closed)
          syntax("unexpected char " + py::repr(std::string(1, static_cast<char>(c))) + " at " + std::to_string(pos), line);
        Token tok{Tok::kString, line, unescape(src.substr(pos + 1, q - pos - 1), line)};
        out.push_back(std::move(tok));
        line += count_nl(std::string_view(src).substr(pos, q - pos));
        pos = q + 1;
        continue;
      }
      static const struct {
        const char* s;
        Tok t;
      } kOps[] = {{"//", Tok::kFloorDiv}, {"**", Tok::kPow},   {"==", Tok::kEq},      {"!=", Tok::kNe},      {">=", Tok::kGe},
                  {"<=", Tok::kLe},       {"+", Tok::kAdd},    {"-", Tok::kSub},      {"/", Tok::kDiv},      {"*", Tok::kMul},
                  {"%", Tok::kMod},       {"~", Tok::kTilde},  {"[", Tok::kLBracket}, {"]", Tok::kRBracket}, {"(", Tok::kLParen},
                  {")", Tok::kRParen},    {"{", Tok::kLBrace}, {"}", Tok::kRBrace},   {">", Tok::kGt},       {"<", Tok::kLt},
                  {"=", Tok::kAssign},    {".", Tok::kDot},    {":", Tok::kColon},    {"|", Tok::kPipe},     {",", Tok::kComma},
                  {";", Tok::kSemicolon}};
      bool matched = false;
      for (const auto& op : kOps) {
        if (!starts(src, pos, op.s)) continue;
        char ch = op.s[0];
        if (op.s[1] == 0) {
          if (ch == '{' || ch == '(' || ch == '[') {
            balance.push_back(ch == '{' ? '}' : ch == '(' ? ')' : ']');
          } else if (ch == '}' || ch == ')' || ch == ']') {
            if (balance.empty()) syntax(std::string("unexpected '") + ch + "'", line);
            char want = balance.back();
            balance.pop_back();
            if (want != ch) syntax(std::string("unexpected '") + ch + "', expected '" + want + "'", line);
          }
        }
        emit(op.t);
        pos += std::char_traits<char>::length(op.s);
        matched = true;
        break;
      }
      if (!matched) syntax("unexpected char " + py::repr(src.substr(pos, len)) + " at " + std::to_string(pos), line);
    }
  }

  void run() {
    n = src.size();
    size_t pos = 0;
    while (pos < n) {
      // Earliest tag start.
      size_t p = pos;
      char kind = 0;
      while (true) {
        p = src.find('{', p);
        if (p == std::string::npos || p + 1 >= n) {
          p = std::string::npos;
          break;
        }
        char k = src[p + 1];
        if (k == '{' || k == '%' || k == '#') {
          kind = k;
          break;
        }
        ++p;
      }
      if (p == std::string::npos) {
        std::string text = src.substr(pos);
        int nl = count_nl(text);
        emit(Tok::kData, std::move(text));
        line += nl;
        return;
      }
      size_t q = p + 2;
      char sign = 0;
      if (q < n && (src[q] == '-' || src[q] == '+')) sign = src[q++];
      std::string text = src.substr(pos, p - pos);

      if (kind == '%') {
        // {% raw %} ... {% endraw %}
        size_t r = skip_ws(src, q);
        if (starts(src, r, "raw")) {
          size_t r2 = skip_ws(src, r + 3);
          size_t body = std::string::npos;
          if (starts(src, r2, "-%}")) {
            body = skip_ws(src, r2 + 3);
          } else if (starts(src, r2, "%}")) {
            body = r2 + 2;
          }
          if (body != std::string::npos) {
            emit_data(std::move(text), true, sign, false, pos);
            if (body >= n) return;  // "{% raw %}" ending the source: nothing more is lexed
            line += count_nl(std::string_view(src).substr(p, body - p));
            pos = lex_raw(body);
            continue;
          }
        }
      }
      emit_data(std::move(text), true, sign, kind == '{', pos);
      if (kind == '#') {
        // jinja2's lexer stops silently when "{#" is the very end of the source.
        if (q >= n) return;
        size_t f = src.find("#}", q);
        if (f == std::string::npos) syntax("Missing end of comment tag", line);
        char esign = (f > q && (src[f - 1] == '-' || src[f - 1] == '+')) ? src[f - 1] : 0;
        size_t e = f + 2;
        if (esign == '-') {
          e = skip_ws(src, e);
        } else if (esign != '+' && e < n && src[e] == '\n') {
          ++e;
        }
        line += count_nl(std::string_view(src).substr(p, e - p));
        pos = e;
        continue;
      }
      emit(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin);
      pos = lex_tag(q, kind == '%');
    }
  }

  size_t lex_raw(size_t body) {
    size_t k = body;
    while (true) {
      k = src.find("{%", k);
      if (k == std::string::npos) syntax("Missing end of raw directive", line);
      size_t q = k + 2;
      char sign = 0;
      if (q < n && (src[q] == '-' || src[q] == '+')) sign = src[q++];
      q = skip_ws(src, q);
      if (starts(src, q, "endraw")) {
        size_t r = skip_ws(src, q + 6);
        size_t end = std::string::npos;
        if (starts(src, r, "+%}")) {
          end = r + 3;
        } else if (starts(src, r, "-%}")) {
          end = skip_ws(src, r + 3);
        } else if (starts(src, r, "%}")) {
          end = r + 2;
          if (end < n && src[end] == '\n') ++end;
        }
        if (end != std::string::npos) {
          emit_data(src.substr(body, k - body), true, sign, false, body);
          line += count_nl(std::string_view(src).substr(k, end - k));
          return end;
        }
      }
      k += 2;
    }
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) {
  Lexer lx;
  // Every newline form becomes "\n" and one trailing newline is dropped (keep_trailing_newline=False).
  std::string& s = lx.src;
  s.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    char c = source[i];
    if (c == '\r') {
      s.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      s.push_back(c);
    }
  }
  if (!s.empty() && s.back() == '\n') s.pop_back();
  lx.run();
  lx.out.push_back(Token{Tok::kEof, lx.line, {}});
  return std::move(lx.out);
}

}  // namespace pg::jinja
