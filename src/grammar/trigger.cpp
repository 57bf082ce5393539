#include "grammar/trigger.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>

#include "core/error.h"

namespace pg::grammar {

namespace {

constexpr size_t kMaxProg = 4096;   // instructions per trigger regex (a request field: bounded)
constexpr uint32_t kMaxRepeat = 1000;
constexpr int kMaxDepth = 64;       // nested groups

using Set = std::array<uint64_t, 4>;

void set_add(Set& s, uint8_t b) { s[b >> 6] |= uint64_t{1} << (b & 63); }
void set_range(Set& s, uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) set_add(s, static_cast<uint8_t>(b));
}
Set set_not(const Set& s) { return {~s[0], ~s[1], ~s[2], ~s[3]}; }

std::string utf8(uint32_t cp) {
  std::string o;
  if (cp < 0x80) {
    o += static_cast<char>(cp);
  } else if (cp < 0x800) {
    o += static_cast<char>(0xC0 | (cp >> 6));
    o += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    o += static_cast<char>(0xE0 | (cp >> 12));
    o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    o += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    o += static_cast<char>(0xF0 | (cp >> 18));
    o += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    o += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    o += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return o;
}

// Syntax tree of a pattern.
struct Node {
  enum class T : uint8_t { Set, Cat, Alt, Repeat, Group, Bol, Eol, Empty } t;
  explicit Node(T kind) : t(kind) {}
  Set set{};                  // T::Set
  std::vector<Node> kids;     // Cat / Alt / Repeat (1) / Group (1)
  uint32_t min = 0, max = 0;  // Repeat; max == UINT32_MAX: unbounded
  bool greedy = true;
  int group = -1;  // Group: capture index (1-based), -1 for (?:)
};

}  // namespace

struct RegexCompiler {
  explicit RegexCompiler(std::string_view pattern) : p(pattern) {}
  std::string_view p;
  size_t i = 0;
  int groups = 0;
  Regex re;

  [[noreturn]] void bad(const std::string& what) const {
    throw Error("regex: " + what + " at offset " + std::to_string(i));
  }
  bool eof() const { return i >= p.size(); }
  char peek() const { return p[i]; }

  static Node set_node(const Set& s) {
    Node n(Node::T::Set);
    n.set = s;
    return n;
  }
  static Node bytes_node(const std::string& s) {  // a literal byte string
    if (s.size() == 1) {
      Set st{};
      set_add(st, static_cast<uint8_t>(s[0]));
      return set_node(st);
    }
    Node n(Node::T::Cat);
    for (char c : s) n.kids.push_back(bytes_node(std::string(1, c)));
    return n;
  }

  // One UTF-8 character of the pattern as its code point (the pattern is a JSON string: UTF-8).
  uint32_t read_cp() {
    const auto b0 = static_cast<uint8_t>(p[i]);
    int n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > p.size()) bad("invalid UTF-8");
    uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int k = 1; k < n; ++k) {
      const auto b = static_cast<uint8_t>(p[i + k]);
      if ((b & 0xC0) != 0x80) bad("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    i += static_cast<size_t>(n);
    return cp;
  }

  uint32_t hex(int digits) {
    if (i + digits > p.size()) bad("truncated escape");
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const char c = p[i++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<uint32_t>(c - 'A' + 10);
      else bad("bad hex digit in escape");
    }
    return v;
  }

  // After a backslash: a class escape (\d \w \s and negations) into *cls, else a code point.
  // Returns true for a class.
  bool escape(Set* cls, uint32_t* cp, bool in_class) {
    if (eof()) bad("pattern ends with a backslash");
    const char c = p[i++];
    Set s{};
    switch (c) {
      case 'd': case 'D':
        set_range(s, '0', '9');
        *cls = c == 'd' ? s : set_not(s);
        return true;
      case 'w': case 'W':
        set_range(s, '0', '9');
        set_range(s, 'a', 'z');
        set_range(s, 'A', 'Z');
        set_add(s, '_');
        *cls = c == 'w' ? s : set_not(s);
        return true;
      case 's': case 'S':
        for (char w : {' ', '\t', '\n', '\v', '\f', '\r'}) set_add(s, static_cast<uint8_t>(w));
        *cls = c == 's' ? s : set_not(s);
        return true;
      case 'n': *cp = '\n'; return false;
      case 'r': *cp = '\r'; return false;
      case 't': *cp = '\t'; return false;
      case 'v': *cp = '\v'; return false;
      case 'f': *cp = '\f'; return false;
      case '0': *cp = 0; return false;
      case 'x': *cp = hex(2); return false;
      case 'u': {
        *cp = hex(4);
        if (*cp >= 0xD800 && *cp <= 0xDFFF) bad("surrogate in \\u escape");
        return false;
      }
      case 'b':
        if (in_class) {
          *cp = '\b';
          return false;
        }
        bad("word boundaries (\\b) are not supported");
      case 'B': bad("word boundaries (\\B) are not supported");
      case 'c': bad("control escapes (\\c) are not supported");
      case 'k': bad("named back-references are not supported");
      default:
        if (c >= '1' && c <= '9') bad("back-references are not supported");
        if (std::isalnum(static_cast<unsigned char>(c))) bad(std::string("unknown escape \\") + c);
        --i;
        *cp = read_cp();
        return false;
    }
  }

  // [ ... ]: an ASCII byte set, plus alternatives for non-ASCII members.
  Node parse_class() {
    ++i;  // '['
    bool neg = false;
    if (!eof() && peek() == '^') {
      neg = true;
      ++i;
    }
    Set s{};
    std::vector<std::string> wide;  // non-ASCII members as UTF-8
    bool first = true;
    while (true) {
      if (eof()) bad("unterminated character class");
      if (peek() == ']' && !first) {
        ++i;
        break;
      }
      first = false;
      uint32_t lo = 0;
      Set cls{};
      if (peek() == '\\') {
        ++i;
        if (escape(&cls, &lo, true)) {
          for (int k = 0; k < 4; ++k) s[static_cast<size_t>(k)] |= cls[static_cast<size_t>(k)];
          continue;
        }
      } else {
        lo = read_cp();
      }
      uint32_t hi = lo;
      if (i + 1 < p.size() && peek() == '-' && p[i + 1] != ']') {
        ++i;
        if (peek() == '\\') {
          ++i;
          if (escape(&cls, &hi, true)) bad("a class escape cannot end a range");
        } else {
          hi = read_cp();
        }
        if (hi < lo) bad("reversed range in character class");
      }
      if (hi < 0x80) {
        set_range(s, static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
      } else {
        if (lo < 0x80) {
          set_range(s, static_cast<uint8_t>(lo), 0x7F);
          lo = 0x80;
        }
        if (hi - lo > 256) bad("non-ASCII class ranges over 256 characters are not supported");
        for (uint32_t c = lo; c <= hi; ++c) wide.push_back(utf8(c));
      }
    }
    if (neg) {
      if (!wide.empty()) bad("non-ASCII characters in a negated class are not supported");
      return set_node(set_not(s));  // also every byte >= 0x80 (one byte at a time)
    }
    if (wide.empty()) return set_node(s);
    Node alt(Node::T::Alt);
    bool any = false;
    for (auto w : s) any |= w != 0;
    if (any) alt.kids.push_back(set_node(s));
    for (auto& w : wide) alt.kids.push_back(bytes_node(w));
    return alt.kids.size() == 1 ? alt.kids[0] : alt;
  }

  Node parse_atom(int depth) {
    const char c = peek();
    if (c == '(') {
      ++i;
      Node g(Node::T::Group);
      if (!eof() && peek() == '?') {
        if (i + 1 < p.size() && p[i + 1] == ':') {
          i += 2;
        } else if (i + 1 < p.size() && (p[i + 1] == '=' || p[i + 1] == '!')) {
          bad("lookahead is not supported");
        } else if (i + 1 < p.size() && p[i + 1] == '<') {
          bad(i + 2 < p.size() && (p[i + 2] == '=' || p[i + 2] == '!') ? "lookbehind is not supported"
                                                                        : "named groups are not supported");
        } else {
          bad("unknown group syntax (?");
        }
      } else {
        g.group = ++groups;
      }
      if (depth >= kMaxDepth) bad("groups nested too deeply");
      g.kids.push_back(parse_alt(depth + 1));
      if (eof() || peek() != ')') bad("missing ')'");
      ++i;
      return g;
    }
    if (c == '[') return parse_class();
    if (c == '.') {
      ++i;
      Set s{};
      set_add(s, '\n');
      set_add(s, '\r');
      return set_node(set_not(s));
    }
    if (c == '^') {
      ++i;
      return Node(Node::T::Bol);
    }
    if (c == '$') {
      ++i;
      return Node(Node::T::Eol);
    }
    if (c == '\\') {
      ++i;
      Set cls{};
      uint32_t cp = 0;
      if (escape(&cls, &cp, false)) return set_node(cls);
      return bytes_node(utf8(cp));
    }
    if (c == '*' || c == '+' || c == '?') bad(std::string("nothing to repeat before '") + c + "'");
    if (c == ')') bad("unbalanced ')'");
    return bytes_node(utf8(read_cp()));
  }

  // {m}, {m,}, {m,n} at i; false (i unchanged) when it is not one (then '{' is a literal).
  bool braces(uint32_t& mn, uint32_t& mx) {
    size_t j = i + 1;
    auto num = [&](uint32_t& v) {
      const size_t s = j;
      uint64_t x = 0;
      while (j < p.size() && std::isdigit(static_cast<unsigned char>(p[j]))) x = std::min<uint64_t>(x * 10 + static_cast<uint64_t>(p[j++] - '0'), 1u << 30);
      v = static_cast<uint32_t>(x);
      return j > s;
    };
    if (!num(mn)) return false;
    mx = mn;
    if (j < p.size() && p[j] == ',') {
      ++j;
      if (!num(mx)) mx = UINT32_MAX;
    }
    if (j >= p.size() || p[j] != '}') return false;
    i = j + 1;
    if (mx != UINT32_MAX && mx < mn) bad("{m,n} with n < m");
    if (mn > kMaxRepeat || (mx != UINT32_MAX && mx > kMaxRepeat)) bad("repetition count over " + std::to_string(kMaxRepeat));
    return true;
  }

  Node parse_seq(int depth) {
    Node cat(Node::T::Cat);
    while (!eof() && peek() != '|' && peek() != ')') {
      if (peek() == '{') {
        uint32_t a, b;
        const size_t at = i;
        if (braces(a, b)) {
          i = at;
          bad("nothing to repeat before '{'");
        }
      }
      Node atom = parse_atom(depth);
      while (!eof()) {
        uint32_t mn = 0, mx = 0;
        const char q = peek();
        if (q == '*') mn = 0, mx = UINT32_MAX, ++i;
        else if (q == '+') mn = 1, mx = UINT32_MAX, ++i;
        else if (q == '?') mn = 0, mx = 1, ++i;
        else if (q == '{' && braces(mn, mx)) {}
        else break;
        if (atom.t == Node::T::Bol || atom.t == Node::T::Eol) bad("nothing to repeat (an anchor)");
        Node r(Node::T::Repeat);
        r.min = mn;
        r.max = mx;
        if (!eof() && peek() == '?') {
          r.greedy = false;
          ++i;
        } else if (!eof() && peek() == '+') {
          bad("possessive quantifiers are not supported");
        }
        r.kids.push_back(std::move(atom));
        atom = std::move(r);
      }
      cat.kids.push_back(std::move(atom));
    }
    if (cat.kids.empty()) return Node(Node::T::Empty);
    return cat.kids.size() == 1 ? cat.kids[0] : cat;
  }

  Node parse_alt(int depth) {
    Node alt(Node::T::Alt);
    alt.kids.push_back(parse_seq(depth));
    while (!eof() && peek() == '|') {
      ++i;
      alt.kids.push_back(parse_seq(depth));
    }
    return alt.kids.size() == 1 ? alt.kids[0] : alt;
  }

  // Code generation (Pike VM program).
  uint32_t emit(Regex::Op op, uint32_t x = 0, uint32_t y = 0) {
    if (re.prog_.size() >= kMaxProg) bad("pattern too large (over " + std::to_string(kMaxProg) + " instructions)");
    re.prog_.push_back({op, x, y});
    return static_cast<uint32_t>(re.prog_.size() - 1);
  }
  uint32_t here() const { return static_cast<uint32_t>(re.prog_.size()); }

  void gen(const Node& n) {
    using Op = Regex::Op;
    switch (n.t) {
      case Node::T::Empty:
        return;
      case Node::T::Set: {
        uint32_t id = 0;
        for (; id < re.sets_.size(); ++id)
          if (re.sets_[id] == n.set) break;
        if (id == re.sets_.size()) re.sets_.push_back(n.set);
        emit(Op::Byte, id);
        return;
      }
      case Node::T::Bol: emit(Op::Bol); return;
      case Node::T::Eol: emit(Op::Eol); return;
      case Node::T::Cat:
        for (const Node& k : n.kids) gen(k);
        return;
      case Node::T::Group:
        if (n.group > 0) emit(Op::Save, static_cast<uint32_t>(2 * n.group));
        gen(n.kids[0]);
        if (n.group > 0) emit(Op::Save, static_cast<uint32_t>(2 * n.group + 1));
        return;
      case Node::T::Alt: {
        // split L1, next; L1: a; jmp end; next: split L2, ... ; last alternative without a split.
        std::vector<uint32_t> jumps;
        for (size_t k = 0; k < n.kids.size(); ++k) {
          if (k + 1 < n.kids.size()) {
            const uint32_t s = emit(Op::Split);
            re.prog_[s].x = here();
            gen(n.kids[k]);
            jumps.push_back(emit(Op::Jmp));
            re.prog_[s].y = here();
          } else {
            gen(n.kids[k]);
          }
        }
        for (uint32_t j : jumps) re.prog_[j].x = here();
        return;
      }
      case Node::T::Repeat: {
        const Node& body = n.kids[0];
        for (uint32_t k = 0; k < n.min; ++k) gen(body);
        auto split = [&](uint32_t s, uint32_t take, uint32_t skip) {
          re.prog_[s].x = n.greedy ? take : skip;
          re.prog_[s].y = n.greedy ? skip : take;
        };
        if (n.max == UINT32_MAX) {
          const uint32_t s = emit(Op::Split);
          gen(body);
          emit(Op::Jmp, s);
          split(s, s + 1, here());
          return;
        }
        std::vector<uint32_t> splits;
        for (uint32_t k = n.min; k < n.max; ++k) {
          splits.push_back(emit(Op::Split));
          gen(body);
        }
        for (uint32_t s : splits) split(s, s + 1, here());
        return;
      }
    }
  }
};

Regex Regex::compile(std::string_view pattern) {
  if (pattern.size() > 4096) throw Error("regex: pattern over 4096 bytes");
  RegexCompiler c(pattern);
  Node ast = c.parse_alt(0);
  if (!c.eof()) c.bad("unbalanced ')'");
  c.re.n_groups_ = c.groups;
  c.emit(Op::Save, 0);
  c.gen(ast);
  c.emit(Op::Save, 1);
  c.emit(Op::Match);
  return std::move(c.re);
}

size_t Regex::find_start(std::string_view text, bool full) const {
  // Pike VM: threads in priority order, each with its capture slots; the first thread (by priority)
  // to match wins and cuts the lower ones, as ECMAScript's backtracking would choose.
  const size_t ns = 2 * static_cast<size_t>(n_groups_ + 1);
  struct List {
    std::vector<uint32_t> pc;
    std::vector<int64_t> caps;  // ns per thread
  };
  List cl, nl;
  std::vector<size_t> mark(prog_.size(), SIZE_MAX);
  std::vector<int64_t> best;
  std::vector<std::pair<uint32_t, std::vector<int64_t>>> stack;
  // Epsilon closure from pc with caps at position pos, appended to l in priority order.
  auto add = [&](List& l, uint32_t pc0, const std::vector<int64_t>& caps0, size_t pos) {
    stack.clear();
    stack.emplace_back(pc0, caps0);
    while (!stack.empty()) {
      auto [pc, caps] = std::move(stack.back());
      stack.pop_back();
      if (mark[pc] == pos) continue;
      mark[pc] = pos;
      const Inst& in = prog_[pc];
      switch (in.op) {
        case Op::Jmp: stack.emplace_back(in.x, std::move(caps)); break;
        case Op::Split:
          stack.emplace_back(in.y, caps);
          stack.emplace_back(in.x, std::move(caps));
          break;
        case Op::Save:
          caps[in.x] = static_cast<int64_t>(pos);
          stack.emplace_back(pc + 1, std::move(caps));
          break;
        case Op::Bol:
          if (pos == 0) stack.emplace_back(pc + 1, std::move(caps));
          break;
        case Op::Eol:
          if (pos == text.size()) stack.emplace_back(pc + 1, std::move(caps));
          break;
        case Op::Byte:
        case Op::Match:
          l.pc.push_back(pc);
          l.caps.insert(l.caps.end(), caps.begin(), caps.end());
          break;
      }
    }
  };
  const std::vector<int64_t> none(ns, -1);
  bool matched = false;
  for (size_t pos = 0; pos <= text.size(); ++pos) {
    if (!matched && (pos == 0 || !full)) add(cl, 0, none, pos);
    nl.pc.clear();
    nl.caps.clear();
    for (size_t t = 0; t < cl.pc.size(); ++t) {
      const Inst& in = prog_[cl.pc[t]];
      const int64_t* caps = cl.caps.data() + t * ns;
      if (in.op == Op::Match) {
        if (full && pos != text.size()) continue;  // regex_match: only a match of the whole text
        best.assign(caps, caps + ns);
        matched = true;
        break;  // lower-priority threads are cut
      }
      if (pos < text.size() && in_set(in.x, static_cast<uint8_t>(text[pos])))
        add(nl, cl.pc[t] + 1, std::vector<int64_t>(caps, caps + ns), pos + 1);
    }
    std::swap(cl, nl);
    if (cl.pc.empty() && (matched || full)) break;
  }
  if (!matched) return std::string::npos;
  for (int g = 1; g <= n_groups_; ++g) {
    const int64_t s = best[2 * static_cast<size_t>(g)], e = best[2 * static_cast<size_t>(g) + 1];
    if (s >= 0 && e > s) return static_cast<size_t>(s);
  }
  return static_cast<size_t>(best[0]);
}

std::shared_ptr<const Triggers> Triggers::compile(std::vector<TriggerSpec> specs) {
  auto t = std::make_shared<Triggers>();
  for (size_t k = 0; k < specs.size(); ++k) {
    const TriggerSpec& s = specs[k];
    const std::string where = "trigger " + std::to_string(k) + ": ";
    if (s.kind == TriggerSpec::Kind::Token) {
      if (s.token < 0) throw Error(where + "token id must be >= 0");
      t->regex_.emplace_back();
      continue;
    }
    if (s.value.empty()) throw Error(where + "empty " + (s.kind == TriggerSpec::Kind::Word ? "word" : "pattern"));
    try {
      if (s.kind == TriggerSpec::Kind::Word) {
        std::string esc;  // the word as a literal pattern
        for (char c : s.value) {
          if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) esc += '\\';
          esc += c;
        }
        t->regex_.push_back(Regex::compile(esc));
      } else {
        t->regex_.push_back(Regex::compile(s.value));
      }
    } catch (const Error& e) {
      throw Error(where + e.what());
    }
  }
  t->specs_ = std::move(specs);
  return t;
}

TriggerWatch::TriggerWatch(std::shared_ptr<const Triggers> t) : t_(std::move(t)) {
  nfa_.resize(t_->specs_.size());
  text_.reserve(1024);
  for (size_t k = 0; k < nfa_.size(); ++k) {
    const Regex& re = t_->regex_[k];
    if (re.prog().empty()) continue;
    nfa_[k].mark.assign(re.prog().size(), 0);
    nfa_[k].cur.reserve(re.prog().size());
    nfa_[k].next.reserve(re.prog().size());
  }
  reset();
}

void TriggerWatch::reset() {
  text_.clear();
  fired_ = false;
  fired_index_ = -1;
  for (size_t k = 0; k < nfa_.size(); ++k) {
    const Regex& re = t_->regex_[k];
    if (re.prog().empty()) continue;
    Nfa& n = nfa_[k];
    n.matched = n.dead = false;
    n.cur.clear();
    ++n.gen;
    bool m = false;
    closure(re, n, n.cur, 0, true, m);
    if (m && t_->specs_[k].kind != TriggerSpec::Kind::PatternFull) n.matched = true;  // an empty match
  }
}

void TriggerWatch::closure(const Regex& re, Nfa& n, std::vector<uint32_t>& out, uint32_t pc0, bool at_start, bool& match) {
  // Epsilon closure (order does not matter for detection), marking pcs with the generation stamp.
  stack_.clear();
  stack_.push_back(pc0);
  while (!stack_.empty()) {
    const uint32_t pc = stack_.back();
    stack_.pop_back();
    if (n.mark[pc] == n.gen) continue;
    n.mark[pc] = n.gen;
    const Regex::Inst& in = re.prog()[pc];
    switch (in.op) {
      case Regex::Op::Jmp: stack_.push_back(in.x); break;
      case Regex::Op::Split:
        stack_.push_back(in.y);
        stack_.push_back(in.x);
        break;
      case Regex::Op::Save: stack_.push_back(pc + 1); break;
      case Regex::Op::Bol:
        if (at_start) stack_.push_back(pc + 1);
        break;
      case Regex::Op::Eol:
      case Regex::Op::Byte: out.push_back(pc); break;
      case Regex::Op::Match: match = true; break;
    }
  }
}

bool TriggerWatch::ends_with_match(const Regex& re, Nfa& n) {
  // Threads waiting at `$` continue when the text ends here; a new generation so the closure does
  // not stop at pcs already visited in this position's closure. Results are thrown away (more
  // text may come): only "does one reach Match" counts.
  ++n.gen;
  std::vector<uint32_t>& scratch = n.next;
  scratch.clear();
  bool m = false;
  for (size_t k = 0; k < n.cur.size() && !m; ++k) {
    const uint32_t pc = n.cur[k];
    if (re.prog()[pc].op != Regex::Op::Eol) continue;
    stack_.clear();
    // Eol passes at the end: everything after it, with further Eol passing as well.
    std::vector<uint32_t> todo{pc + 1};
    while (!todo.empty() && !m) {
      const uint32_t q = todo.back();
      todo.pop_back();
      const size_t before = scratch.size();
      closure(re, n, scratch, q, text_.empty(), m);
      for (size_t j = before; j < scratch.size(); ++j)
        if (re.prog()[scratch[j]].op == Regex::Op::Eol) todo.push_back(scratch[j] + 1);
    }
  }
  scratch.clear();
  return m;
}

size_t TriggerWatch::push(int32_t token, std::string_view piece) {
  if (fired_) return npos;
  const size_t start = text_.size();
  text_.append(piece);
  // Token triggers first (llama.cpp's order): the grammar starts at this token's text.
  for (size_t k = 0; k < t_->specs_.size(); ++k)
    if (t_->specs_[k].kind == TriggerSpec::Kind::Token && t_->specs_[k].token == token) {
      fired_ = true;
      fired_index_ = static_cast<int>(k);
      return start;
    }
  for (size_t k = 0; k < t_->specs_.size(); ++k) {
    const TriggerSpec& s = t_->specs_[k];
    if (s.kind == TriggerSpec::Kind::Token) continue;
    const Regex& re = t_->regex_[k];
    Nfa& n = nfa_[k];
    const bool full = s.kind == TriggerSpec::Kind::PatternFull;
    if (!n.dead && !n.matched) {
      bool match_here = false;  // a Match reached right after the last byte
      for (size_t b = start; b < text_.size(); ++b) {
        ++n.gen;
        n.next.clear();
        match_here = false;
        const auto byte = static_cast<uint8_t>(text_[b]);
        for (uint32_t pc : n.cur) {
          const Regex::Inst& in = re.prog()[pc];
          if (in.op == Regex::Op::Byte && re.in_set(in.x, byte)) closure(re, n, n.next, pc + 1, false, match_here);
        }
        // regex_search: a match may start at every position.
        if (!full) closure(re, n, n.next, 0, false, match_here);
        std::swap(n.cur, n.next);
        if (match_here && !full) {
          n.matched = true;
          break;
        }
        if (full && n.cur.empty() && !match_here) {
          n.dead = true;
          break;
        }
      }
      // At the token boundary the text ends here: `$` holds.
      if (!n.matched && !n.dead) {
        // pattern_full: the whole text matches exactly when a Match was reached after its last byte
        // (or through a trailing `$`); llama.cpp checks after every token and fires at the first success.
        if (match_here || ends_with_match(re, n)) n.matched = true;
        else if (full && n.cur.empty()) n.dead = true;
      }
    }
    if (n.matched) {
      const size_t at = re.find_start(text_, full);
      if (at == npos) {
        // Cannot happen (the VM and the NFA run the same program); do not fire on an inconsistency.
        n.matched = false;
        continue;
      }
      fired_ = true;
      fired_index_ = static_cast<int>(k);
      return at;
    }
  }
  return npos;
}

}  // namespace pg::grammar
