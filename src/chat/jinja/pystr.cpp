#include "chat/jinja/pystr.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "chat/jinja/error.h"
#include "chat/jinja/work.h"

namespace pg::jinja::py {

namespace {

struct CpRange {
  char32_t lo, hi;
};
struct CaseRun {
  char32_t first, last;
  int stride;
  int delta;
};
struct CaseMulti {
  char32_t cp;
  char32_t out[3];
  int n;
};

#include "chat/jinja/unicode_tables.inc"

template <size_t N>
bool in_ranges(const CpRange (&table)[N], char32_t c) {
  size_t lo = 0, hi = N;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (table[mid].hi < c) {
      lo = mid + 1;
    } else if (table[mid].lo > c) {
      hi = mid;
    } else {
      return true;
    }
  }
  return false;
}

// Appends the full case mapping of c (1 to 3 code points) to out.
template <size_t N, size_t M>
void map_case(const CaseRun (&runs)[N], const CaseMulti (&multi)[M], char32_t c, std::u32string& out) {
  if (c < 0x80 && &runs[0] == &kToUpper[0]) {
    out.push_back(c >= 'a' && c <= 'z' ? c - 32 : c);
    return;
  }
  if (c < 0x80 && &runs[0] == &kToLower[0]) {
    out.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
    return;
  }
  for (const auto& m : multi) {
    if (m.cp == c) {
      for (int i = 0; i < m.n; ++i) out.push_back(m.out[i]);
      return;
    }
  }
  size_t lo = 0, hi = N;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (runs[mid].last < c) {
      lo = mid + 1;
    } else if (runs[mid].first > c) {
      hi = mid;
    } else {
      const auto& r = runs[mid];
      if ((c - r.first) % r.stride == 0) {
        out.push_back(static_cast<char32_t>(static_cast<int64_t>(c) + r.delta));
        return;
      }
      break;
    }
  }
  out.push_back(c);
}

void to_upper(char32_t c, std::u32string& out) { map_case(kToUpper, kToUpper_multi, c, out); }
void to_title(char32_t c, std::u32string& out) { map_case(kToTitle, kToTitle_multi, c, out); }

bool is_case_ignorable(char32_t c) { return in_ranges(kCaseIgnorable, c); }

// CPython's lower() special-cases capital sigma at the end of a word (final sigma rule).
void to_lower_at(const std::u32string& s, size_t i, std::u32string& out) {
  char32_t c = s[i];
  if (c == 0x3A3) {
    size_t j = i;
    bool before = false;
    while (j > 0) {
      --j;
      if (is_case_ignorable(s[j])) continue;
      before = is_cased(s[j]);
      break;
    }
    bool after = false;
    for (size_t k = i + 1; k < s.size(); ++k) {
      if (is_case_ignorable(s[k])) continue;
      after = is_cased(s[k]);
      break;
    }
    out.push_back(before && !after ? 0x3C2 : 0x3C3);
    return;
  }
  map_case(kToLower, kToLower_multi, c, out);
}

[[noreturn]] void value_error(const std::string& m) { throw_error(ErrorKind::kValue, m); }

// Python slice normalisation for str.find & co: negative indices count from the end, clamped.
void adjust(int64_t n, std::optional<int64_t> start, std::optional<int64_t> end, int64_t& s, int64_t& e) {
  s = start.value_or(0);
  e = end.value_or(n);
  if (s < 0) s = std::max<int64_t>(0, s + n);
  if (e < 0) e = std::max<int64_t>(0, e + n);
  if (e > n) e = n;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
bool utf8_valid(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    char32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      unsigned char cc = s[i + k];
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp < 0xE000))
      return false;
    i += len;
  }
  return true;
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t decode_at(std::string_view s, size_t& i) {
  const unsigned char c = s[i];
  if (c < 0x80) {
    ++i;
    return c;
  }
  const int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return 0xFFFD;
  }
  char32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len; ++k) {
    const unsigned char cc = s[i + k];
    if ((cc & 0xC0) != 0x80) {
      ++i;
      return 0xFFFD;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  i += len;
  return cp;
}

std::u32string decode(std::string_view s) {
  // Decoding (and the per-code-point loop that follows) costs a few ns a byte, far more than a memchr.
  charge_work(4 * s.size());
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(decode_at(s, i));
  return out;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

bool is_ascii(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (static_cast<unsigned char>(s[i]) >= 0x80) {
      charge_work(i);
      return false;
    }
  }
  charge_work(s.size());
  return true;
}

size_t cp_len(std::string_view s) {
  charge_work(s.size());
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

size_t cp_to_byte(std::string_view s, size_t i) {
  size_t b = 0, cps = 0;
  while (b < s.size()) {
    if (((unsigned char)s[b] & 0xC0) != 0x80) {
      if (cps == i) break;
      ++cps;
    }
    ++b;
  }
  charge_work(b);
  return b;
}

namespace {

// Needles up to this many bytes are searched with std::string_view (memchr + memcmp, fast in practice, at worst
// kShortNeedle times the haystack); longer ones with Knuth-Morris-Pratt, linear whatever the text.
constexpr size_t kShortNeedle = 32;

// KMP failure function of p read in direction `rev` (p reversed when true).
std::vector<uint32_t> kmp_table(std::string_view p, bool rev) {
  const size_t m = p.size();
  auto at = [&](size_t i) { return rev ? p[m - 1 - i] : p[i]; };
  std::vector<uint32_t> fail(m, 0);  // [m]: length of the longest proper border of p[0..i]
  uint32_t k = 0;
  for (size_t i = 1; i < m; ++i) {
    while (k > 0 && at(i) != at(k)) k = fail[k - 1];
    if (at(i) == at(k)) ++k;
    fail[i] = k;
  }
  charge_work(m);
  return fail;
}

}  // namespace

size_t find_bytes(std::string_view hay, std::string_view needle, size_t from) {
  if (from > hay.size()) return std::string_view::npos;
  if (needle.size() <= kShortNeedle || needle.size() >= UINT32_MAX) {
    const size_t f = hay.find(needle, from);
    charge_work((f == std::string_view::npos ? hay.size() : f) - from);
    return f;
  }
  if (hay.size() - from < needle.size()) return std::string_view::npos;
  const std::vector<uint32_t> fail = kmp_table(needle, false);
  const size_t m = needle.size();
  uint32_t k = 0;
  for (size_t i = from; i < hay.size(); ++i) {
    while (k > 0 && hay[i] != needle[k]) k = fail[k - 1];
    if (hay[i] == needle[k]) ++k;
    if (k == m) {
      charge_work(i + 1 - from);
      return i + 1 - m;
    }
  }
  charge_work(hay.size() - from);
  return std::string_view::npos;
}

size_t rfind_bytes(std::string_view hay, std::string_view needle, size_t last_start) {
  if (needle.size() > hay.size()) return std::string_view::npos;
  // The match may not start after last_start, so the search window ends at last_start + |needle|.
  const size_t end = std::min(hay.size(), last_start > hay.size() - needle.size() ? hay.size() : last_start + needle.size());
  if (needle.size() <= kShortNeedle || needle.size() >= UINT32_MAX) {
    const size_t f = hay.rfind(needle, last_start);
    charge_work(end - (f == std::string_view::npos ? 0 : f));
    return f;
  }
  // KMP over the reversed window and the reversed needle: the first match found is the last one.
  const std::vector<uint32_t> fail = kmp_table(needle, true);
  const size_t m = needle.size();
  uint32_t k = 0;
  for (size_t j = 0; j < end; ++j) {
    const char c = hay[end - 1 - j];
    while (k > 0 && c != needle[m - 1 - k]) k = fail[k - 1];
    if (c == needle[m - 1 - k]) ++k;
    if (k == m) {
      charge_work(j + 1);
      return end - 1 - j;
    }
  }
  charge_work(end);
  return std::string_view::npos;
}

// ------------------------------------------------------------------------------------------------
bool is_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return in_ranges(kSpace, c);
}
bool is_printable(char32_t c) {
  if (c < 0x80) return c >= 0x20 && c < 0x7F;
  return !in_ranges(kNonPrintable, c);
}
bool is_word(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  return in_ranges(kWord, c);
}
bool is_alpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  return in_ranges(kAlpha, c);
}
bool is_decimal(char32_t c) { return c < 0x80 ? (c >= '0' && c <= '9') : in_ranges(kDecimal, c); }
bool is_digit(char32_t c) { return c < 0x80 ? (c >= '0' && c <= '9') : in_ranges(kDigit, c); }
bool is_numeric(char32_t c) { return c < 0x80 ? (c >= '0' && c <= '9') : in_ranges(kNumeric, c); }
bool is_upper(char32_t c) { return c < 0x80 ? (c >= 'A' && c <= 'Z') : in_ranges(kUpper, c); }
bool is_lower(char32_t c) { return c < 0x80 ? (c >= 'a' && c <= 'z') : in_ranges(kLower, c); }
static bool is_titlecase(char32_t c) { return c >= 0x80 && in_ranges(kTitle, c); }
bool is_cased(char32_t c) { return is_upper(c) || is_lower(c) || is_titlecase(c); }

// ------------------------------------------------------------------------------------------------
std::string upper(std::string_view s) {
  if (is_ascii(s)) {
    std::string r(s);
    for (auto& ch : r)
      if (ch >= 'a' && ch <= 'z') ch -= 32;
    return r;
  }
  std::u32string out;
  for (char32_t c : decode(s)) to_upper(c, out);
  return encode(out);
}

std::string lower(std::string_view s) {
  if (is_ascii(s)) {
    std::string r(s);
    for (auto& ch : r)
      if (ch >= 'A' && ch <= 'Z') ch += 32;
    return r;
  }
  std::u32string u = decode(s), out;
  for (size_t i = 0; i < u.size(); ++i) to_lower_at(u, i, out);
  return encode(out);
}

std::string title(std::string_view s) {
  std::u32string u = decode(s), out;
  bool prev_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    if (prev_cased) {
      to_lower_at(u, i, out);
    } else {
      to_title(u[i], out);
    }
    prev_cased = is_cased(u[i]);
  }
  return encode(out);
}

std::string capitalize(std::string_view s) {
  std::u32string u = decode(s), out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0) {
      to_title(u[i], out);
    } else {
      to_lower_at(u, i, out);
    }
  }
  return encode(out);
}

std::string swapcase(std::string_view s) {
  std::u32string u = decode(s), out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (is_upper(u[i])) {
      to_lower_at(u, i, out);
    } else if (is_lower(u[i])) {
      to_upper(u[i], out);
    } else {
      out.push_back(u[i]);
    }
  }
  return encode(out);
}

std::string upper_first_lower_rest(std::string_view s) {
  std::u32string u = decode(s);
  if (u.empty()) return "";
  std::u32string first(1, u[0]), rest = u.substr(1);
  return upper(encode(first)) + lower(encode(rest));
}

bool str_isupper(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    if (is_lower(c) || is_titlecase(c)) return false;
    if (is_upper(c)) cased = true;
  }
  return cased;
}

bool str_islower(std::string_view s) {
  bool cased = false;
  for (char32_t c : decode(s)) {
    if (is_upper(c) || is_titlecase(c)) return false;
    if (is_lower(c)) cased = true;
  }
  return cased;
}

bool str_istitle(std::string_view s) {
  bool cased = false, prev_cased = false;
  for (char32_t c : decode(s)) {
    if (is_upper(c) || is_titlecase(c)) {
      if (prev_cased) return false;
      prev_cased = cased = true;
    } else if (is_lower(c)) {
      if (!prev_cased) return false;
      prev_cased = cased = true;
    } else {
      prev_cased = false;
    }
  }
  return cased;
}

bool str_all(std::string_view s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (char32_t c : decode(s))
    if (!pred(c)) return false;
  return true;
}

bool str_isspace(std::string_view s) { return str_all(s, is_space); }

bool str_isalnum(std::string_view s) {
  return str_all(s, [](char32_t c) { return is_alpha(c) || is_decimal(c) || is_digit(c) || is_numeric(c); });
}

// ------------------------------------------------------------------------------------------------
std::string strip(std::string_view s, const std::optional<std::string_view>& chars, StripSide side) {
  std::u32string set;
  bool ascii_ws = !chars && is_ascii(s);
  if (chars) {
    // Sorted for binary search: a linear scan of a long `chars` for every code point of a long string is quadratic.
    set = decode(*chars);
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
  }
  auto strip_cp = [&](char32_t c) { return chars ? std::binary_search(set.begin(), set.end(), c) : is_space(c); };
  if (ascii_ws || (chars && is_ascii(s) && is_ascii(*chars))) {
    size_t b = 0, e = s.size();
    auto strip_byte = [&](unsigned char c) { return strip_cp(c); };
    if (side != StripSide::kRight)
      while (b < e && strip_byte(s[b])) ++b;
    if (side != StripSide::kLeft)
      while (e > b && strip_byte(s[e - 1])) --e;
    return std::string(s.substr(b, e - b));
  }
  std::u32string u = decode(s);
  size_t b = 0, e = u.size();
  if (side != StripSide::kRight)
    while (b < e && strip_cp(u[b])) ++b;
  if (side != StripSide::kLeft)
    while (e > b && strip_cp(u[e - 1])) --e;
  return encode(std::u32string_view(u).substr(b, e - b));
}

namespace {

// Parts are charged to the render as they are made: splitting a 60 MB string into one-byte parts built 60 million
// strings (gigabytes) before the interpreter could charge the result.
void add_part(std::vector<std::string>& out, std::string&& part) {
  charge_alloc(sizeof(std::string) + part.size());
  out.push_back(std::move(part));
}
void add_part(std::vector<std::string>& out, std::string_view part) { add_part(out, std::string(part)); }

}  // namespace

std::vector<std::string> split(std::string_view s, const std::optional<std::string_view>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    if (sep->empty()) value_error("empty separator");
    size_t pos = 0;
    while (maxsplit-- > 0) {
      size_t f = find_bytes(s, *sep, pos);
      if (f == std::string_view::npos) break;
      add_part(out, s.substr(pos, f - pos));
      pos = f + sep->size();
    }
    add_part(out, s.substr(pos));
    return out;
  }
  std::u32string u = decode(s);
  size_t i = 0, n = u.size();
  while (true) {
    while (i < n && is_space(u[i])) ++i;
    if (i >= n) break;
    if (maxsplit-- <= 0) {
      add_part(out, encode(std::u32string_view(u).substr(i)));
      break;
    }
    size_t j = i;
    while (j < n && !is_space(u[j])) ++j;
    add_part(out, encode(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string_view>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    if (sep->empty()) value_error("empty separator");
    size_t end = s.size();
    while (maxsplit-- > 0) {
      if (end < sep->size()) break;
      size_t f = rfind_bytes(s, *sep, end - sep->size());
      if (f == std::string_view::npos) break;
      add_part(out, s.substr(f + sep->size(), end - f - sep->size()));
      end = f;
    }
    add_part(out, s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::u32string u = decode(s);
  size_t j = u.size();
  while (true) {
    while (j > 0 && is_space(u[j - 1])) --j;
    if (j == 0) break;
    if (maxsplit-- <= 0) {
      add_part(out, encode(std::u32string_view(u).substr(0, j)));
      break;
    }
    size_t i = j;
    while (i > 0 && !is_space(u[i - 1])) --i;
    add_part(out, encode(std::u32string_view(u).substr(i, j - i)));
    j = i;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  std::u32string u = decode(s);
  size_t i = 0, n = u.size();
  while (i < n) {
    size_t j = i;
    while (j < n) {
      char32_t c = u[j];
      if (c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 || c == 0x2028 ||
          c == 0x2029)
        break;
      ++j;
    }
    size_t eol = j;
    if (j < n) {
      if (u[j] == '\r' && j + 1 < n && u[j + 1] == '\n') {
        j += 2;
      } else {
        j += 1;
      }
      if (keepends) eol = j;
    }
    add_part(out, encode(std::u32string_view(u).substr(i, eol - i)));
    i = j;
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {
    // Python inserts repl before every code point and at the end.
    std::u32string u = decode(s);
    int64_t done = 0;
    for (char32_t c : u) {
      if (done < count) {
        out += repl;
        ++done;
      }
      utf8_append(out, c);
    }
    if (done < count) out += repl;
    return out;
  }
  size_t pos = 0;
  while (count-- > 0) {
    size_t f = find_bytes(s, old, pos);
    if (f == std::string_view::npos) break;
    out.append(s.substr(pos, f - pos));
    out.append(repl);
    pos = f + old.size();
  }
  out.append(s.substr(pos));
  return out;
}

int64_t find(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end, bool reverse) {
  bool ascii = is_ascii(s);
  int64_t n = ascii ? static_cast<int64_t>(s.size()) : static_cast<int64_t>(cp_len(s));
  int64_t b, e;
  adjust(n, start, end, b, e);
  int64_t sub_n = ascii ? static_cast<int64_t>(sub.size()) : static_cast<int64_t>(cp_len(sub));
  if (e - b < sub_n) return -1;
  size_t bb = ascii ? b : cp_to_byte(s, b), eb = ascii ? e : cp_to_byte(s, e);
  std::string_view win = s.substr(bb, eb - bb);
  size_t f = reverse ? rfind_bytes(win, sub, std::string_view::npos) : find_bytes(win, sub, 0);
  if (f == std::string_view::npos) return -1;
  if (ascii) return b + static_cast<int64_t>(f);
  return b + static_cast<int64_t>(cp_len(win.substr(0, f)));
}

int64_t count(std::string_view s, std::string_view sub, std::optional<int64_t> start, std::optional<int64_t> end) {
  bool ascii = is_ascii(s);
  int64_t n = ascii ? static_cast<int64_t>(s.size()) : static_cast<int64_t>(cp_len(s));
  int64_t b, e;
  adjust(n, start, end, b, e);
  if (e < b) return 0;
  size_t bb = ascii ? b : cp_to_byte(s, b), eb = ascii ? e : cp_to_byte(s, e);
  std::string_view win = s.substr(bb, eb - bb);
  if (sub.empty()) return static_cast<int64_t>(cp_len(win)) + 1;
  int64_t c = 0;
  size_t pos = 0;
  while ((pos = find_bytes(win, sub, pos)) != std::string_view::npos) {
    ++c;
    pos += sub.size();
  }
  return c;
}

std::string pad(std::string_view s, int64_t width, char32_t fill, char align) {
  int64_t n = static_cast<int64_t>(cp_len(s));
  if (width <= n) return std::string(s);
  int64_t total = width - n, left = 0;
  if (align == '>') {
    left = total;
  } else if (align == '^') {
    // str.center puts the extra space on the right unless the padding and width are both odd.
    left = total / 2 + (total & width & 1);
  }
  std::string fill_s;
  utf8_append(fill_s, fill);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill_s;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += fill_s;
  return out;
}

std::string zfill(std::string_view s, int64_t width) {
  int64_t n = static_cast<int64_t>(cp_len(s));
  if (width <= n) return std::string(s);
  std::string out;
  size_t start = 0;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    out.push_back(s[0]);
    start = 1;
  }
  out.append(static_cast<size_t>(width - n), '0');
  out.append(s.substr(start));
  return out;
}

std::string escape_html(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&#39;";
        break;
      case '"':
        out += "&#34;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
static std::string repr_impl(std::string_view s, bool ascii_only) {
  bool has_sq = s.find('\'') != std::string_view::npos, has_dq = s.find('"') != std::string_view::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back(q);
  char buf[16];
  for (char32_t c : decode(s)) {
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && (ascii_only || !is_printable(c)))) {
      if (c <= 0xFF) {
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      } else if (c <= 0xFFFF) {
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out.push_back(q);
  return out;
}

std::string repr(std::string_view s) { return repr_impl(s, false); }
std::string ascii_repr(std::string_view s) { return repr_impl(s, true); }

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci looks like "-d.ddde+XX": split sign, digits and exponent.
  bool neg = sci[0] == '-';
  std::string body = neg ? sci.substr(1) : sci;
  size_t epos = body.find('e');
  std::string mant = body.substr(0, epos);
  int exp = std::stoi(body.substr(epos + 1));
  std::string digits;
  for (char c : mant)
    if (c != '.') digits.push_back(c);
  int decpt = exp + 1;  // position of the decimal point relative to the digit string
  std::string out = neg ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0.";
      out.append(static_cast<size_t>(-decpt), '0');
      out += digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits;
      out.append(decpt - digits.size(), '0');
      out += ".0";
    } else {
      out += digits.substr(0, decpt);
      out += '.';
      out += digits.substr(decpt);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out += '.';
    out += digits.substr(1);
  }
  int e = decpt - 1;
  std::snprintf(buf, sizeof buf, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
  out += buf;
  return out;
}

std::string int_repr(int64_t v) { return std::to_string(v); }

std::string format_float(double v, char conv, int precision, bool alt) {
  if (std::isnan(v) || std::isinf(v)) {
    bool up = conv == 'E' || conv == 'F' || conv == 'G';
    std::string s = std::isnan(v) ? "nan" : "inf";
    if (up) s = upper(s);
    if (std::isinf(v) && v < 0) s = "-" + s;
    return s;
  }
  char fmt[16];
  std::snprintf(fmt, sizeof fmt, "%%%s.%d%c", alt ? "#" : "", precision, conv);
  int n = std::snprintf(nullptr, 0, fmt, v);
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, fmt, v);
  return out;
}

double round_float(double v, int64_t ndigits) {
  if (!std::isfinite(v)) return v;
  if (ndigits > 323) return v;
  if (ndigits < -308) return std::copysign(0.0, v);
  if (ndigits >= 0) {
    // glibc printf rounds the exact binary value half-to-even, which is what CPython's round does.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(ndigits), v);
    double r = std::strtod(buf, nullptr);
    return r == 0 ? std::copysign(0.0, v) : r;
  }
  double p = std::pow(10.0, static_cast<double>(-ndigits));
  double y = v / p;
  double z = std::nearbyint(y);
  if (std::fabs(y - z) == 0.5) z = 2.0 * std::nearbyint(y / 2.0);
  double r = z * p;
  return r == 0 ? std::copysign(0.0, v) : r;
}

std::optional<int64_t> parse_int(std::string_view s, int base) {
  std::string t = strip(s, std::nullopt, StripSide::kBoth);
  if (t.empty()) return std::nullopt;
  size_t i = 0;
  bool neg = false;
  if (t[i] == '+' || t[i] == '-') {
    neg = t[i] == '-';
    ++i;
  }
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (i + 1 < t.size() && t[i] == '0') {
      char p = static_cast<char>(t[i + 1] | 0x20);
      int b = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (b && (base == 0 || base == b)) {
        base = b;
        i += 2;
        if (i < t.size() && t[i] == '_') ++i;
      }
    }
    if (base == 0) base = 10;
  }
  if (base < 2 || base > 36) return std::nullopt;
  if (i >= t.size()) return std::nullopt;
  __int128 acc = 0;
  bool prev_us = true;
  for (; i < t.size(); ++i) {
    char c = t[i];
    if (c == '_') {
      if (prev_us) return std::nullopt;
      prev_us = true;
      continue;
    }
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : (c >= 'A' && c <= 'Z') ? c - 'A' + 10 : 99;
    if (d >= base) return std::nullopt;
    acc = acc * base + d;
    if (acc > (static_cast<__int128>(1) << 64)) return std::nullopt;
    prev_us = false;
  }
  if (prev_us) return std::nullopt;
  if (neg) acc = -acc;
  if (acc > INT64_MAX || acc < INT64_MIN) return std::nullopt;
  return static_cast<int64_t>(acc);
}

std::optional<double> parse_float(std::string_view s) {
  std::string t = strip(s, std::nullopt, StripSide::kBoth);
  if (t.empty()) return std::nullopt;
  std::string low = lower(t);
  size_t i = (low[0] == '+' || low[0] == '-') ? 1 : 0;
  std::string rest = low.substr(i);
  bool neg = i == 1 && low[0] == '-';
  if (rest == "inf" || rest == "infinity") return neg ? -HUGE_VAL : HUGE_VAL;
  if (rest == "nan") return std::nan("");
  // Python accepts digits with single underscores between them; strtod does not.
  std::string clean;
  for (size_t k = 0; k < t.size(); ++k) {
    char c = t[k];
    if (c == '_') {
      bool ok = k > 0 && k + 1 < t.size() && std::isdigit(static_cast<unsigned char>(t[k - 1])) &&
                std::isdigit(static_cast<unsigned char>(t[k + 1]));
      if (!ok) return std::nullopt;
      continue;
    }
    if (!(std::isdigit(static_cast<unsigned char>(c)) || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
      return std::nullopt;
    clean.push_back(c);
  }
  double v = 0;
  const char* b = clean.data();
  const char* e = b + clean.size();
  if (*b == '+') ++b;
  auto res = std::from_chars(b, e, v);
  if (res.ec == std::errc::result_out_of_range) {
    // Overflow gives inf in Python only through the literal path; float('1e999') is inf too.
    return std::strtod(clean.c_str(), nullptr);
  }
  if (res.ec != std::errc() || res.ptr != e) return std::nullopt;
  return v;
}

void json_quote(std::string& out, std::string_view s, bool ensure_ascii) {
  out.push_back('"');
  char buf[16];
  auto hex4 = [&](unsigned v) {
    std::snprintf(buf, sizeof buf, "\\u%04x", v);
    out += buf;
  };
  // The escapes both modes share; false for a character that needs no short escape.
  auto short_escape = [&](char32_t c) {
    switch (c) {
      case '"': out += "\\\""; return true;
      case '\\': out += "\\\\"; return true;
      case '\n': out += "\\n"; return true;
      case '\r': out += "\\r"; return true;
      case '\t': out += "\\t"; return true;
      case '\b': out += "\\b"; return true;
      case '\f': out += "\\f"; return true;
      default: return false;
    }
  };
  if (!ensure_ascii) {
    // Bytes pass through (UTF-8 stays UTF-8); only quotes, backslashes and controls are escaped.
    for (char ch : s) {
      const auto c = static_cast<unsigned char>(ch);
      if (short_escape(c)) continue;
      if (c < 0x20)
        hex4(c);
      else
        out.push_back(ch);
    }
  } else {
    // Everything outside printable ASCII as \uXXXX, astral characters as surrogate pairs (Python's json).
    for (char32_t c : decode(s)) {
      if (short_escape(c)) continue;
      if (c >= 0x20 && c <= 0x7E) {
        out.push_back(static_cast<char>(c));
      } else if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        hex4(0xD800 | (v >> 10));
        hex4(0xDC00 | (v & 0x3FF));
      } else {
        hex4(c);
      }
    }
  }
  out.push_back('"');
}

}  // namespace pg::jinja::py
