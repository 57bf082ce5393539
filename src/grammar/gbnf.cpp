// GBNF parser (llama.cpp's grammar format) and compiler to a byte-level grammar.
#include <algorithm>
#include <functional>
#include <map>

#include "core/error.h"
#include "grammar/grammar.h"

namespace pg::grammar {
namespace {

constexpr uint32_t kInf = UINT32_MAX;
constexpr uint32_t kMaxCp = 0x10FFFF;

// ---- AST over code points -------------------------------------------------------------------------
struct Alts;
struct Item {
  enum Type { Class, Ref, Group } type;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // Class: code point ranges (already negated)
  std::string name;                                   // Ref
  size_t name_pos = 0;                                // Ref: offset in the text, for errors
  std::shared_ptr<Alts> group;                        // Group
  uint32_t min = 1, max = 1;                          // repetition; max kInf = unbounded
};
struct Alts {
  std::vector<std::vector<Item>> alts;
};

class Parser {
 public:
  Parser(std::string_view s, const Limits& lim) : s_(s), lim_(lim) {}

  std::vector<std::pair<std::string, Alts>> rules;
  std::map<std::string, size_t> index;

  void parse() {
    skip(true);
    while (i_ < s_.size()) {
      size_t name_at = i_;
      std::string name = parse_name();
      skip(false);
      if (s_.substr(i_, 3) != "::=") fail("expected '::='", i_);
      i_ += 3;
      skip(true);
      Alts a = parse_alts(0);
      if (index.count(name)) fail("rule '" + name + "' defined twice", name_at);
      index[name] = rules.size();
      rules.emplace_back(name, std::move(a));
      if (i_ < s_.size() && s_[i_] != '\n' && s_[i_] != '\r') fail("expected end of rule", i_);
      skip(true);
    }
  }

  [[noreturn]] void fail(const std::string& what, size_t at) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < s_.size(); ++k) {
      if (s_[k] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw Error("grammar: " + what + " at line " + std::to_string(line) + " col " + std::to_string(col));
  }

 private:
  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  // Spaces, tabs and comments; newlines too when newline_ok (inside groups, after '|', between rules).
  void skip(bool newline_ok) {
    while (i_ < s_.size()) {
      char c = s_[i_];
      if (c == ' ' || c == '\t') {
        ++i_;
      } else if (c == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if ((c == '\n' || c == '\r') && newline_ok) {
        ++i_;
      } else {
        break;
      }
    }
  }

  // After a newline at the end of a sequence, a rule continues when the next line starts with '|'.
  bool continues_with_bar() const {
    size_t k = i_;
    while (k < s_.size()) {
      char c = s_[k];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++k;
      } else if (c == '#') {
        while (k < s_.size() && s_[k] != '\n') ++k;
      } else {
        return c == '|';
      }
    }
    return false;
  }

  std::string parse_name() {
    size_t b = i_;
    while (i_ < s_.size() && is_name_char(s_[i_])) ++i_;
    if (b == i_) fail("expected a rule name", b);
    return std::string(s_.substr(b, i_ - b));
  }

  uint32_t decode_utf8() {
    auto c = static_cast<unsigned char>(s_[i_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + n > s_.size()) fail("invalid UTF-8", i_);
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) {
      auto d = static_cast<unsigned char>(s_[i_ + k]);
      if ((d >> 6) != 2) fail("invalid UTF-8", i_);
      cp = (cp << 6) | (d & 0x3F);
    }
    i_ += n;
    return cp;
  }

  uint32_t parse_hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (i_ >= s_.size()) fail("unfinished escape", i_);
      char c = s_[i_];
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) fail("expected a hex digit", i_);
      v = v * 16 + static_cast<uint32_t>(d);
      ++i_;
    }
    if (v > kMaxCp || (v >= 0xD800 && v <= 0xDFFF)) fail("escape is not a Unicode scalar value", i_);
    return v;
  }

  // One character of a literal or class, escapes resolved.
  uint32_t parse_char() {
    if (i_ >= s_.size()) fail("unexpected end of grammar", i_);
    if (s_[i_] != '\\') return decode_utf8();
    size_t at = i_++;
    if (i_ >= s_.size()) fail("unfinished escape", at);
    char c = s_[i_++];
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '0': return 0;
      case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/': return static_cast<uint32_t>(c);
      case 'x': return parse_hex(2);
      case 'u': return parse_hex(4);
      case 'U': return parse_hex(8);
      default: fail(std::string("unknown escape '\\") + c + "'", at);
    }
  }

  Alts parse_alts(int depth) {
    if (depth > lim_.max_nesting) fail("groups nested too deeply", i_);
    Alts a;
    for (;;) {
      a.alts.push_back(parse_seq(depth));
      if (i_ < s_.size() && (s_[i_] == '\n' || s_[i_] == '\r') && continues_with_bar()) skip(true);
      if (i_ < s_.size() && s_[i_] == '|') {
        ++i_;
        skip(true);
        continue;
      }
      return a;
    }
  }

  std::vector<Item> parse_seq(int depth) {
    std::vector<Item> seq;
    const bool nested = depth > 0;
    size_t last_start = 0;  // where the last syntactic item's items begin (a literal gives several)
    bool have_item = false;
    for (;;) {
      skip(nested);
      if (i_ >= s_.size()) break;
      char c = s_[i_];
      size_t at = i_;
      const bool is_op = c == '*' || c == '+' || c == '?' || c == '{';
      if (!is_op) last_start = seq.size();
      if (c == '"') {
        ++i_;
        while (true) {
          if (i_ >= s_.size()) fail("unterminated string literal", at);
          if (s_[i_] == '"') break;
          if (s_[i_] == '\n') fail("newline in string literal", i_);
          Item it{Item::Class, {}, {}, 0, nullptr, 1, 1};
          uint32_t cp = parse_char();
          it.ranges.push_back({cp, cp});
          seq.push_back(std::move(it));
        }
        ++i_;
      } else if (c == '[') {
        ++i_;
        Item it{Item::Class, {}, {}, 0, nullptr, 1, 1};
        bool neg = false;
        if (i_ < s_.size() && s_[i_] == '^') {
          neg = true;
          ++i_;
        }
        while (true) {
          if (i_ >= s_.size() || s_[i_] == '\n') fail("unterminated character class", at);
          if (s_[i_] == ']') break;
          uint32_t lo = parse_char(), hi = lo;
          if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
            ++i_;
            if (s_[i_] == '\n') fail("unterminated character class", at);
            hi = parse_char();
            if (hi < lo) fail("character range is reversed", i_);
          }
          it.ranges.push_back({lo, hi});
        }
        ++i_;
        it.ranges = normalise(it.ranges, neg);
        seq.push_back(std::move(it));
      } else if (c == '.') {
        ++i_;
        Item it{Item::Class, normalise({}, true), {}, 0, nullptr, 1, 1};
        seq.push_back(std::move(it));
      } else if (c == '(') {
        ++i_;
        skip(true);
        Item it{Item::Group, {}, {}, 0, std::make_shared<Alts>(parse_alts(depth + 1)), 1, 1};
        skip(true);
        if (i_ >= s_.size() || s_[i_] != ')') fail("expected ')'", i_);
        ++i_;
        seq.push_back(std::move(it));
      } else if (is_name_char(c)) {
        size_t k = i_;
        while (k < s_.size() && is_name_char(s_[k])) ++k;
        size_t k2 = k;
        while (k2 < s_.size() && (s_[k2] == ' ' || s_[k2] == '\t')) ++k2;
        if (s_.substr(k2, 3) == "::=") break;  // the next rule starts (its name on this line)
        Item it{Item::Ref, {}, parse_name(), at, nullptr, 1, 1};
        seq.push_back(std::move(it));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_item) fail(std::string("'") + c + "' with nothing to repeat", at);
        if (last_start == seq.size()) {  // "" repeated: still nothing
          skip_operator();
          continue;
        }
        if (seq.size() - last_start > 1) {  // a multi-character literal: the operator applies to all of it
          Item g{Item::Group, {}, {}, 0, std::make_shared<Alts>(), 1, 1};
          g.group->alts.push_back(std::vector<Item>(std::make_move_iterator(seq.begin() + static_cast<long>(last_start)),
                                                    std::make_move_iterator(seq.end())));
          seq.erase(seq.begin() + static_cast<long>(last_start), seq.end());
          seq.push_back(std::move(g));
        }
        Item& last = seq.back();
        if (last.min != 1 || last.max != 1) {
          // x** and the like: wrap the repeated item in a group so the operators compose.
          Item g{Item::Group, {}, {}, 0, std::make_shared<Alts>(), 1, 1};
          g.group->alts.push_back({std::move(last)});
          last = std::move(g);
        }
        ++i_;
        if (c == '*') {
          last.min = 0, last.max = kInf;
        } else if (c == '+') {
          last.min = 1, last.max = kInf;
        } else if (c == '?') {
          last.min = 0, last.max = 1;
        } else {
          skip(false);
          uint32_t m = parse_int();
          uint32_t n = m;
          skip(false);
          if (i_ < s_.size() && s_[i_] == ',') {
            ++i_;
            skip(false);
            n = (i_ < s_.size() && s_[i_] == '}') ? kInf : parse_int();
            skip(false);
          }
          if (i_ >= s_.size() || s_[i_] != '}') fail("expected '}'", i_);
          ++i_;
          if (n != kInf && n < m) fail("repetition {m,n} with n < m", at);
          last.min = m, last.max = n;
        }
      } else {
        break;
      }
      have_item = true;
    }
    return seq;
  }

  void skip_operator() {
    char c = s_[i_++];
    if (c == '{') {
      while (i_ < s_.size() && s_[i_] != '}') ++i_;
      if (i_ >= s_.size()) fail("expected '}'", i_);
      ++i_;
    }
  }

  uint32_t parse_int() {
    size_t b = i_;
    uint64_t v = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(s_[i_] - '0');
      if (v > lim_.max_repetition) fail("repetition count over " + std::to_string(lim_.max_repetition), b);
      ++i_;
    }
    if (b == i_) fail("expected a number", b);
    return static_cast<uint32_t>(v);
  }

  // Sorted, merged ranges without surrogates; complemented over all scalar values when neg.
  static std::vector<std::pair<uint32_t, uint32_t>> normalise(std::vector<std::pair<uint32_t, uint32_t>> r, bool neg) {
    const std::vector<std::pair<uint32_t, uint32_t>> m = merge_code_ranges(std::move(r), neg);
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (auto& x : m) {
      if (x.first <= 0xDFFF && x.second >= 0xD800) {
        if (x.first < 0xD800) out.push_back({x.first, 0xD7FF});
        if (x.second > 0xDFFF) out.push_back({0xE000, x.second});
      } else {
        out.push_back(x);
      }
    }
    return out;
  }

  std::string_view s_;
  const Limits& lim_;
  size_t i_ = 0;
};

// UTF-8 byte-range sequences for a code point range (the classic utf8-ranges split).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (int k = 0; k < 3; ++k) {
    if (lo <= bounds[k] && hi > bounds[k]) {
      utf8_sequences(lo, bounds[k], out);
      utf8_sequences(bounds[k] + 1, hi, out);
      return;
    }
  }
  for (int i = 1; i < 4; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  auto enc = [](uint32_t c, uint8_t* b) -> int {
    if (c < 0x80) {
      b[0] = static_cast<uint8_t>(c);
      return 1;
    }
    if (c < 0x800) {
      b[0] = static_cast<uint8_t>(0xC0 | (c >> 6)), b[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      return 2;
    }
    if (c < 0x10000) {
      b[0] = static_cast<uint8_t>(0xE0 | (c >> 12)), b[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      return 3;
    }
    b[0] = static_cast<uint8_t>(0xF0 | (c >> 18)), b[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
    b[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F)), b[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
    return 4;
  };
  uint8_t a[4], b[4];
  int n = enc(lo, a);
  enc(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int k = 0; k < n; ++k) seq.push_back({a[k], b[k]});
  out.push_back(std::move(seq));
}

}  // namespace

struct Grammar::Builder {
  Grammar& g;
  const Parser& p;
  std::map<std::vector<uint64_t>, uint32_t> set_index;
  std::vector<std::vector<std::vector<Element>>> rules;  // rule -> alternatives -> elements
  size_t n_elems = 0;

  uint32_t byte_set(uint8_t lo, uint8_t hi) {
    Grammar::ByteSet s{};
    for (unsigned b = lo; b <= hi; ++b) s.bits[b >> 6] |= 1ull << (b & 63);
    return intern(s);
  }
  uint32_t intern(const Grammar::ByteSet& s) {
    std::vector<uint64_t> key(s.bits, s.bits + 4);
    auto it = set_index.find(key);
    if (it != set_index.end()) return it->second;
    uint32_t id = static_cast<uint32_t>(g.sets_.size());
    g.sets_.push_back(s);
    set_index[key] = id;
    return id;
  }
  uint32_t new_rule(const std::string& name) {
    rules.emplace_back();
    g.names_.push_back(name);
    return static_cast<uint32_t>(rules.size() - 1);
  }
  void count(size_t n) {
    n_elems += n;
    if (n_elems > g.limits_.max_elements) throw Error("grammar: compiled grammar over " + std::to_string(g.limits_.max_elements) + " elements");
  }

  // One occurrence of the item (no repetition) as elements appended to `out`.
  void atom(const Item& it, const std::string& ctx, std::vector<Element>& out) {
    if (it.type == Item::Ref) {
      auto f = p.index.find(it.name);
      if (f == p.index.end()) p.fail("undefined rule '" + it.name + "'", it.name_pos);
      out.push_back({Kind::Ref, static_cast<uint32_t>(f->second)});
    } else if (it.type == Item::Group) {
      uint32_t r = new_rule(ctx + "-group");
      auto alts = compile_alts(*it.group, ctx);
      rules[r] = std::move(alts);
      out.push_back({Kind::Ref, r});
    } else {
      std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
      for (auto& r : it.ranges) utf8_sequences(r.first, r.second, seqs);
      if (seqs.empty()) throw Error("grammar: empty character class in rule '" + ctx + "'");
      // Single-byte sequences merge into one byte set; longer ones become alternatives.
      Grammar::ByteSet single{};
      bool any_single = false;
      std::vector<std::vector<std::pair<uint8_t, uint8_t>>> multi;
      for (auto& s : seqs) {
        if (s.size() == 1) {
          for (unsigned b = s[0].first; b <= s[0].second; ++b) single.bits[b >> 6] |= 1ull << (b & 63);
          any_single = true;
        } else {
          multi.push_back(s);
        }
      }
      if (multi.empty()) {
        out.push_back({Kind::Bytes, intern(single)});
        count(1);
        return;
      }
      if (!any_single && multi.size() == 1) {
        for (auto& br : multi[0]) out.push_back({Kind::Bytes, byte_set(br.first, br.second)});
        count(multi[0].size());
        return;
      }
      uint32_t r = new_rule(ctx + "-char");
      if (any_single) rules[r].push_back({{Kind::Bytes, intern(single)}});
      for (auto& s : multi) {
        std::vector<Element> alt;
        for (auto& br : s) alt.push_back({Kind::Bytes, byte_set(br.first, br.second)});
        count(alt.size() + 1);
        rules[r].push_back(std::move(alt));
      }
      out.push_back({Kind::Ref, r});
    }
  }

  void item(const Item& it, const std::string& ctx, std::vector<Element>& out) {
    if (it.min == 1 && it.max == 1) {
      atom(it, ctx, out);
      return;
    }
    std::vector<Element> one;
    atom(it, ctx, one);
    if (one.size() > 1) {  // a multi-byte character: make it a rule so repetition copies one element
      uint32_t r = new_rule(ctx + "-char");
      rules[r].push_back(one);
      one = {{Kind::Ref, r}};
    }
    for (uint32_t k = 0; k < it.min; ++k) out.push_back(one[0]);
    count(it.min);
    if (it.max == kInf) {
      uint32_t star = new_rule(ctx + "-star");
      rules[star].push_back({one[0], {Kind::Ref, star}});
      rules[star].push_back({});
      count(3);
      out.push_back({Kind::Ref, star});
    } else if (it.max > it.min) {
      // opt_k ::= x opt_{k-1} | ""  (x{0,n} without n! alternatives)
      uint32_t prev = UINT32_MAX;
      for (uint32_t k = 0; k < it.max - it.min; ++k) {
        uint32_t r = new_rule(ctx + "-opt");
        if (prev == UINT32_MAX) {
          rules[r].push_back({one[0]});
        } else {
          rules[r].push_back({one[0], {Kind::Ref, prev}});
        }
        rules[r].push_back({});
        count(4);
        prev = r;
      }
      out.push_back({Kind::Ref, prev});
    }
  }

  std::vector<std::vector<Element>> compile_alts(const Alts& a, const std::string& ctx) {
    std::vector<std::vector<Element>> res;
    for (auto& seq : a.alts) {
      std::vector<Element> e;
      for (auto& it : seq) item(it, ctx, e);
      res.push_back(std::move(e));
    }
    return res;
  }

  void finish() {
    // Flatten: every alternative is a run of elements ending with End.
    g.alts_.resize(rules.size());
    for (size_t r = 0; r < rules.size(); ++r) {
      for (auto& alt : rules[r]) {
        g.alts_[r].push_back(static_cast<uint32_t>(g.elems_.size()));
        g.elems_.insert(g.elems_.end(), alt.begin(), alt.end());
        g.elems_.push_back({Kind::End, 0});
      }
    }
    check_left_recursion();
  }

  void check_left_recursion() {
    const size_t n = rules.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (auto& alt : rules[r]) {
          bool all = std::all_of(alt.begin(), alt.end(), [&](const Element& e) { return e.kind == Kind::Ref && nullable[e.arg]; });
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Left edges r -> s: s can start r. Iterative DFS with colours (the matcher's expansion is
    // iterative too, so long left chains are fine; only cycles are errors).
    std::vector<std::vector<uint32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (auto& alt : rules[r]) {
        for (auto& e : alt) {
          if (e.kind != Kind::Ref) break;
          left[r].push_back(e.arg);
          if (!nullable[e.arg]) break;
        }
      }
    }
    std::vector<uint8_t> colour(n, 0);
    for (size_t s = 0; s < n; ++s) {
      if (colour[s]) continue;
      std::vector<std::pair<uint32_t, size_t>> st{{static_cast<uint32_t>(s), 0}};
      colour[s] = 1;
      while (!st.empty()) {
        auto& [r, k] = st.back();
        if (k < left[r].size()) {
          uint32_t t = left[r][k++];
          if (colour[t] == 1) throw Error("grammar: left recursion in rule '" + g.names_[t] + "'");
          if (colour[t] == 0) {
            colour[t] = 1;
            st.push_back({t, 0});
          }
        } else {
          colour[r] = 2;
          st.pop_back();
        }
      }
    }
  }
};

std::vector<std::pair<uint32_t, uint32_t>> merge_code_ranges(std::vector<std::pair<uint32_t, uint32_t>> r, bool complement) {
  std::sort(r.begin(), r.end());
  std::vector<std::pair<uint32_t, uint32_t>> m;
  for (auto& x : r) {
    if (!m.empty() && x.first <= m.back().second + 1) {
      m.back().second = std::max(m.back().second, x.second);
    } else {
      m.push_back(x);
    }
  }
  if (!complement) return m;
  std::vector<std::pair<uint32_t, uint32_t>> c;
  uint32_t next = 0;
  for (auto& x : m) {
    if (x.first > next) c.push_back({next, x.first - 1});
    next = x.second + 1;
  }
  if (next <= kMaxCp) c.push_back({next, kMaxCp});
  return c;
}

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, const Limits& limits, std::string_view start_rule) {
  if (gbnf.size() > limits.max_text_bytes) throw Error("grammar: text over " + std::to_string(limits.max_text_bytes) + " bytes");
  Parser p(gbnf, limits);
  p.parse();
  auto root = p.index.find(std::string(start_rule));
  if (root == p.index.end()) throw Error("grammar: no rule '" + std::string(start_rule) + "'");
  std::shared_ptr<Grammar> g(new Grammar());
  g->limits_ = limits;
  Builder b{*g, p, {}, {}, 0};
  for (auto& [name, alts] : p.rules) b.new_rule(name);
  for (size_t r = 0; r < p.rules.size(); ++r) b.rules[r] = b.compile_alts(p.rules[r].second, p.rules[r].first);
  b.finish();
  g->root_ = static_cast<uint32_t>(root->second);
  return g;
}

bool Grammar::sample(std::mt19937_64& rng, std::string& out, int max_depth, size_t max_bytes) const {
  // Shortest sentence length per rule (fixpoint; rules with none stay "infinite").
  std::vector<uint64_t> minlen(alts_.size(), UINT64_MAX / 4);
  auto alt_len = [&](uint32_t a) {
    uint64_t s = 0;
    for (uint32_t p = a; elems_[p].kind != Kind::End; ++p) s += elems_[p].kind == Kind::Bytes ? 1 : minlen[elems_[p].arg];
    return std::min<uint64_t>(s, UINT64_MAX / 4);
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < alts_.size(); ++r) {
      for (uint32_t a : alts_[r]) {
        uint64_t l = alt_len(a);
        if (l < minlen[r]) {
          minlen[r] = l;
          changed = true;
        }
      }
    }
  }
  if (minlen[root_] >= UINT64_MAX / 4) return false;
  out.clear();
  std::function<bool(uint32_t, int)> gen = [&](uint32_t rule, int depth) -> bool {
    if (depth > max_depth + 2000) return false;  // a long chain of rules: give up rather than recurse on
    const auto& alts = alts_[rule];
    uint32_t a;
    if (depth > max_depth) {
      a = alts[0];
      for (uint32_t x : alts) {
        if (alt_len(x) < alt_len(a)) a = x;
      }
    } else {
      std::vector<uint32_t> ok;
      for (uint32_t x : alts) {
        if (alt_len(x) < UINT64_MAX / 4) ok.push_back(x);
      }
      a = ok[std::uniform_int_distribution<size_t>(0, ok.size() - 1)(rng)];
    }
    for (uint32_t p = a; elems_[p].kind != Kind::End; ++p) {
      if (out.size() > max_bytes) return false;
      if (elems_[p].kind == Kind::Bytes) {
        const ByteSet& s = sets_[elems_[p].arg];
        std::vector<uint8_t> bs;
        for (int b = 0; b < 256; ++b) {
          if (s.test(static_cast<uint8_t>(b))) bs.push_back(static_cast<uint8_t>(b));
        }
        // Prefer printable ASCII when the set has it: instances stay readable and JSON-friendly.
        std::vector<uint8_t> pr;
        for (uint8_t b : bs) {
          if (b >= 0x20 && b < 0x7F) pr.push_back(b);
        }
        const auto& pick = (!pr.empty() && std::uniform_int_distribution<int>(0, 9)(rng) != 0) ? pr : bs;
        out.push_back(static_cast<char>(pick[std::uniform_int_distribution<size_t>(0, pick.size() - 1)(rng)]));
      } else if (!gen(elems_[p].arg, depth + 1)) {
        return false;
      }
    }
    return true;
  };
  return gen(root_, 0);
}

}  // namespace pg::grammar
