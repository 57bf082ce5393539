#include "chat/jinja/parser.h"

#include <set>

#include "chat/jinja/lexer.h"
#include "chat/jinja/pystr.h"

namespace pg::jinja {

namespace {

// Nesting beyond this is refused instead of risking the C++ stack (CPython's recursion limit stops
// jinja2 at a similar depth).
constexpr int kMaxNesting = 150;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

  Body parse() {
    Body b = subparse({});
    return b;
  }

 private:
  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::vector<std::string>> end_stack_;

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& pp) : p(pp) {
      if (++p.depth_ > kMaxNesting) {
        --p.depth_;
        throw Error(ErrorKind::kSyntax, "template nested too deeply", p.cur().line);
      }
    }
    ~DepthGuard() { --p.depth_; }
  };

  // Left-associative chains (a + b + c, x.y.z, v|f|g, x(1)(2)) build their tree in a loop, one level deeper per link,
  // without recursing here; but evaluating and freeing the tree recurse once per level, so a 300k-link chain
  // overflowed the stack at render time. Each link counts as a nesting level until the chain ends, which keeps the
  // tree as shallow as the parser's own recursion.
  struct ChainGuard {
    Parser& p;
    int links = 0;
    explicit ChainGuard(Parser& pp) : p(pp) {}
    void link() {
      if (p.depth_ + 1 > kMaxNesting) throw Error(ErrorKind::kSyntax, "template nested too deeply", p.cur().line);
      ++p.depth_;
      ++links;
    }
    ~ChainGuard() { p.depth_ -= links; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& look() const { return t_[std::min(i_ + 1, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  bool skip_name(const char* n) {
    if (is_name(n)) {
      next();
      return true;
    }
    return false;
  }
  bool skip(Tok t) {
    if (cur().type == t) {
      next();
      return true;
    }
    return false;
  }
  [[noreturn]] void fail(const std::string& msg, int line = 0) const {
    throw Error(ErrorKind::kSyntax, msg, line ? line : cur().line);
  }
  [[noreturn]] void fail_eof_or(const std::string& expected) const {
    if (cur().type == Tok::kEof) fail("unexpected end of template, expected " + expected + ".");
    fail("expected token " + expected + ", got " + py::repr(describe(cur())));
  }
  const Token& expect(Tok t) {
    if (cur().type != t) fail_eof_or(py::repr(describe(t)));
    return next();
  }
  const Token& expect_name(const char* n = nullptr) {
    if (cur().type != Tok::kName || (n && cur().text != n)) fail_eof_or(py::repr(n ? n : "name"));
    return next();
  }

  // ---------------------------------------------------------------------------------------------
  Body subparse(const std::vector<std::string>& end_tokens) {
    Body body;
    if (!end_tokens.empty()) end_stack_.push_back(end_tokens);
    while (cur().type != Tok::kEof) {
      const Token& tok = cur();
      if (tok.type == Tok::kData) {
        auto s = std::make_unique<Stmt>(StmtKind::kOutput, tok.line);
        s->text = tok.text;
        body.push_back(std::move(s));
        next();
      } else if (tok.type == Tok::kVarBegin) {
        next();
        auto s = std::make_unique<Stmt>(StmtKind::kOutput, tok.line);
        s->expr = parse_tuple(false, true, {}, false);
        expect(Tok::kVarEnd);
        body.push_back(std::move(s));
      } else if (tok.type == Tok::kBlockBegin) {
        next();
        if (!end_tokens.empty() && cur().type == Tok::kName) {
          for (const auto& e : end_tokens) {
            if (cur().text == e) {
              end_stack_.pop_back();
              return body;
            }
          }
        }
        parse_statement(body);
        expect(Tok::kBlockEnd);
      } else {
        fail("internal parsing error");
      }
    }
    if (!end_tokens.empty()) end_stack_.pop_back();
    return body;
  }

  Body parse_statements(const std::vector<std::string>& end_tokens, bool drop_needle) {
    skip(Tok::kColon);
    expect(Tok::kBlockEnd);
    Body b = subparse(end_tokens);
    if (cur().type == Tok::kEof) {
      std::string want;
      for (const auto& e : end_tokens) want += (want.empty() ? "" : " or ") + py::repr(e);
      fail("Unexpected end of template. Jinja was looking for the following tags: " + want + ".");
    }
    if (drop_needle) next();
    return b;
  }

  [[noreturn]] void fail_unknown_tag(const std::string& name, int line) {
    std::string msg = "Encountered unknown tag " + py::repr(name) + ".";
    if (!end_stack_.empty()) {
      std::string want;
      for (const auto& e : end_stack_.back()) want += (want.empty() ? "" : " or ") + py::repr(e);
      msg += " Jinja was looking for the following tags: " + want + ".";
    }
    fail(msg, line);
  }

  void parse_statement(Body& out) {
    DepthGuard g(*this);
    const Token& tok = cur();
    if (tok.type != Tok::kName) fail("tag name expected");
    const std::string name = tok.text;
    int line = tok.line;
    if (name == "for") return out.push_back(parse_for());
    if (name == "if") return out.push_back(parse_if());
    if (name == "set") return out.push_back(parse_set());
    if (name == "macro") return out.push_back(parse_macro());
    if (name == "call") return out.push_back(parse_call_block());
    if (name == "filter") return out.push_back(parse_filter_block());
    if (name == "with") return out.push_back(parse_with());
    if (name == "print") {
      next();
      bool first = true;
      while (cur().type != Tok::kBlockEnd) {
        if (!first) expect(Tok::kComma);
        first = false;
        auto s = std::make_unique<Stmt>(StmtKind::kOutput, line);
        s->expr = parse_expression(true);
        out.push_back(std::move(s));
      }
      return;
    }
    if (name == "break" || name == "continue") {
      next();
      if (loop_depth_ == 0) fail("'" + name + "' outside loop", line);
      out.push_back(std::make_unique<Stmt>(name == "break" ? StmtKind::kBreak : StmtKind::kContinue, line));
      return;
    }
    if (name == "generation") {
      // transformers' AssistantTracker: a call block whose body is rendered as-is.
      next();
      auto s = std::make_unique<Stmt>(StmtKind::kScope, line);
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_statements({"endgeneration"}, true);
      loop_depth_ = saved;
      out.push_back(std::move(s));
      return;
    }
    if (name == "block") {
      next();
      std::string bname = expect_name().text;
      auto s = std::make_unique<Stmt>(StmtKind::kScope, line);
      bool scoped = skip_name("scoped");
      skip_name("required");
      if (cur().type == Tok::kSub)
        fail(
            "Block names in Jinja have to be valid Python identifiers and may not contain hyphens, use an "
            "underscore instead.");
      s->block_scope = !scoped;
      int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_statements({"endblock"}, true);
      loop_depth_ = saved;
      if (cur().type == Tok::kName && cur().text == bname) next();
      out.push_back(std::move(s));
      return;
    }
    if (name == "extends" || name == "include" || name == "import" || name == "from") {
      // Parsed like jinja2; rendering fails like jinja2 without a template loader.
      next();
      auto s = std::make_unique<Stmt>(StmtKind::kUnsupported, line);
      s->expr = parse_expression(true);
      auto context_modifier = [&] {
        if ((is_name("with") || is_name("without")) && look().type == Tok::kName && look().text == "context") {
          next();
          next();
          return true;
        }
        return false;
      };
      if (name == "include") {
        if (is_name("ignore") && look().type == Tok::kName && look().text == "missing") {
          next();
          next();
        }
        context_modifier();
      } else if (name == "import") {
        expect_name("as");
        expect_name();
        context_modifier();
      } else if (name == "from") {
        expect_name("import");
        bool first = true;
        while (true) {
          if (!first) expect(Tok::kComma);
          first = false;
          if (cur().type != Tok::kName) {
            expect_name();
          }
          if (context_modifier()) break;
          std::string imported = expect_name().text;
          if (!imported.empty() && imported[0] == '_') fail("names starting with an underline can not be imported");
          if (skip_name("as")) expect_name();
          if (context_modifier() || cur().type != Tok::kComma) break;
        }
      }
      s->text = "no loader for this environment specified";
      out.push_back(std::move(s));
      return;
    }
    if (name == "autoescape") {
      next();
      ExprP e = parse_expression(true);
      Body b = parse_statements({"endautoescape"}, true);
      auto s = std::make_unique<Stmt>(StmtKind::kUnsupported, line);
      s->text = "autoescape blocks are not supported";
      s->expr = std::move(e);
      out.push_back(std::move(s));
      return;
    }
    fail_unknown_tag(name, line);
  }

  StmtP parse_for() {
    int line = expect_name("for").line;
    auto s = std::make_unique<Stmt>(StmtKind::kFor, line);
    s->target = parse_assign_target(true, false, {"in"}, false);
    check_no_loop_store(s->target);
    expect_name("in");
    s->expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) s->test = parse_expression(true);
    s->recursive = skip_name("recursive");
    ++loop_depth_;
    s->body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().text == "endfor") return s;
    s->else_body = parse_statements({"endfor"}, true);
    return s;
  }

  void check_no_loop_store(const Target& t) {
    if (t.kind == Target::kName && t.name == "loop") fail("Can't assign to special loop variable in for-loop target");
    for (const auto& i : t.items) check_no_loop_store(i);
  }

  StmtP parse_if() {
    int line = expect_name("if").line;
    auto s = std::make_unique<Stmt>(StmtKind::kIf, line);
    Stmt* node = s.get();
    while (true) {
      node->expr = parse_tuple(false, false, {}, false);
      node->body = parse_statements({"elif", "else", "endif"}, false);
      const Token& t = next();
      if (t.text == "elif") {
        auto e = std::make_unique<Stmt>(StmtKind::kIf, cur().line);
        Stmt* en = e.get();
        node->else_body.push_back(std::move(e));
        node = en;
        continue;
      }
      if (t.text == "else") node->else_body = parse_statements({"endif"}, true);
      break;
    }
    return s;
  }

  StmtP parse_set() {
    int line = next().line;
    Target target = parse_assign_target(true, false, {}, true);
    if (skip(Tok::kAssign)) {
      auto s = std::make_unique<Stmt>(StmtKind::kSet, line);
      s->target = std::move(target);
      s->expr = parse_tuple(false, true, {}, false);
      return s;
    }
    auto s = std::make_unique<Stmt>(StmtKind::kSetBlock, line);
    s->target = std::move(target);
    s->filter = parse_filter(nullptr, false);
    s->body = parse_statements({"endset"}, true);
    return s;
  }

  void parse_signature(MacroDef& m) {
    expect(Tok::kLParen);
    while (cur().type != Tok::kRParen) {
      if (!m.params.empty()) expect(Tok::kComma);
      std::string arg = expect_name().text;
      if (skip(Tok::kAssign)) {
        m.defaults.push_back(parse_expression(true));
      } else if (!m.defaults.empty()) {
        fail("non-default argument follows default argument");
      }
      m.params.push_back(arg);
    }
    expect(Tok::kRParen);
  }

  static void scan_names(const Body& body, MacroDef& m);

  std::shared_ptr<MacroDef> parse_macro_body(std::shared_ptr<MacroDef> m, const char* end_tag) {
    int saved = loop_depth_;
    loop_depth_ = 0;
    m->body = parse_statements({end_tag}, true);
    loop_depth_ = saved;
    scan_names(m->body, *m);
    for (const auto& d : m->defaults) scan_expr_names(*d, *m);
    for (const auto& p : m->params) {
      if (p == "caller") m->explicit_caller = true;
      // A parameter named like a special variable shadows it.
      if (p == "caller") m->uses_caller = false;
      if (p == "varargs") m->uses_varargs = false;
      if (p == "kwargs") m->uses_kwargs = false;
    }
    return m;
  }

  StmtP parse_macro() {
    int line = next().line;
    auto s = std::make_unique<Stmt>(StmtKind::kMacro, line);
    auto m = std::make_shared<MacroDef>();
    m->name = expect_name().text;
    parse_signature(*m);
    s->macro = parse_macro_body(std::move(m), "endmacro");
    return s;
  }

  StmtP parse_call_block() {
    int line = next().line;
    auto s = std::make_unique<Stmt>(StmtKind::kCallBlock, line);
    auto m = std::make_shared<MacroDef>();
    m->name = "caller";
    if (cur().type == Tok::kLParen) parse_signature(*m);
    s->expr = parse_expression(true);
    if (s->expr->kind != ExprKind::kCall) fail("expected call", line);
    s->macro = parse_macro_body(std::move(m), "endcall");
    return s;
  }

  StmtP parse_filter_block() {
    int line = next().line;
    auto s = std::make_unique<Stmt>(StmtKind::kFilterBlock, line);
    s->filter = parse_filter(nullptr, true);
    s->body = parse_statements({"endfilter"}, true);
    return s;
  }

  StmtP parse_with() {
    int line = next().line;
    auto s = std::make_unique<Stmt>(StmtKind::kWith, line);
    while (cur().type != Tok::kBlockEnd) {
      if (!s->with_targets.empty()) expect(Tok::kComma);
      s->with_targets.push_back(parse_assign_target(true, false, {}, false));
      expect(Tok::kAssign);
      s->with_values.push_back(parse_expression(true));
    }
    s->body = parse_statements({"endwith"}, true);
    return s;
  }

  // ---------------------------------------------------------------------------------------------
  Target to_target(const Expr& e) {
    Target t;
    if (e.kind == ExprKind::kName) {
      t.kind = Target::kName;
      t.name = e.name;
      return t;
    }
    if (e.kind == ExprKind::kTuple) {
      t.kind = Target::kTuple;
      for (const auto& i : e.items) t.items.push_back(to_target(*i));
      return t;
    }
    std::string what = e.kind == ExprKind::kConst ? "const" : e.kind == ExprKind::kList ? "list" : "expression";
    fail("can't assign to " + py::repr(what), e.line);
  }

  Target parse_assign_target(bool with_tuple, bool name_only, const std::vector<std::string>& extra_end, bool with_namespace) {
    if (with_namespace && look().type == Tok::kDot) {
      Target t;
      t.kind = Target::kNsAttr;
      t.name = expect_name().text;
      next();
      t.attr = expect_name().text;
      return t;
    }
    if (name_only) {
      Target t;
      t.name = expect_name().text;
      return t;
    }
    ExprP e = with_tuple ? parse_tuple(true, true, extra_end, false) : parse_primary();
    return to_target(*e);
  }

  // ---------------------------------------------------------------------------------------------
  ExprP parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  static void mark_soft(Expr& e) {
    if (e.kind == ExprKind::kFilter || e.kind == ExprKind::kTest) e.soft = true;
    for (Expr* c : {e.a.get(), e.b.get(), e.c.get(), e.d.get()})
      if (c) mark_soft(*c);
    for (auto& i : e.items)
      if (i) mark_soft(*i);
    for (auto& i : e.call.args) mark_soft(*i);
    for (auto& kv : e.call.kwargs) mark_soft(*kv.second);
    if (e.call.dyn_args) mark_soft(*e.call.dyn_args);
    if (e.call.dyn_kwargs) mark_soft(*e.call.dyn_kwargs);
  }

  ExprP parse_condexpr() {
    DepthGuard g(*this);
    int line = cur().line;
    ExprP e1 = parse_or();
    ChainGuard chain(*this);
    while (skip_name("if")) {
      chain.link();
      ExprP e2 = parse_or();
      ExprP e3;
      if (skip_name("else")) e3 = parse_condexpr();
      auto n = std::make_unique<Expr>(ExprKind::kCondExpr, line);
      n->a = std::move(e2);  // test
      n->b = std::move(e1);  // value when true
      n->c = std::move(e3);  // value when false (may be null)
      mark_soft(*n);
      e1 = std::move(n);
      line = cur().line;
    }
    return e1;
  }

  ExprP parse_or() {
    int line = cur().line;
    ExprP l = parse_and();
    ChainGuard chain(*this);
    while (skip_name("or")) {
      chain.link();
      auto n = std::make_unique<Expr>(ExprKind::kOr, line);
      n->a = std::move(l);
      n->b = parse_and();
      l = std::move(n);
      line = cur().line;
    }
    return l;
  }

  ExprP parse_and() {
    int line = cur().line;
    ExprP l = parse_not();
    ChainGuard chain(*this);
    while (skip_name("and")) {
      chain.link();
      auto n = std::make_unique<Expr>(ExprKind::kAnd, line);
      n->a = std::move(l);
      n->b = parse_not();
      l = std::move(n);
      line = cur().line;
    }
    return l;
  }

  ExprP parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      int line = next().line;
      auto n = std::make_unique<Expr>(ExprKind::kNot, line);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }

  ExprP parse_compare() {
    int line = cur().line;
    ExprP e = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      CmpOp op;
      Tok t = cur().type;
      if (t == Tok::kEq) {
        op = CmpOp::kEq;
      } else if (t == Tok::kNe) {
        op = CmpOp::kNe;
      } else if (t == Tok::kLt) {
        op = CmpOp::kLt;
      } else if (t == Tok::kLe) {
        op = CmpOp::kLe;
      } else if (t == Tok::kGt) {
        op = CmpOp::kGt;
      } else if (t == Tok::kGe) {
        op = CmpOp::kGe;
      } else if (is_name("in")) {
        op = CmpOp::kIn;
      } else if (is_name("not") && look().type == Tok::kName && look().text == "in") {
        next();
        op = CmpOp::kNotIn;
      } else {
        break;
      }
      next();
      if (!cmp) {
        cmp = std::make_unique<Expr>(ExprKind::kCompare, line);
        cmp->items.push_back(std::move(e));
      }
      cmp->cmp_ops.push_back(op);
      cmp->items.push_back(parse_math1());
    }
    if (cmp) return cmp;
    return e;
  }

  ExprP binary(BinOp op, ExprP l, ExprP r, int line) {
    auto n = std::make_unique<Expr>(ExprKind::kBinary, line);
    n->op = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  ExprP parse_math1() {
    int line = cur().line;
    ExprP l = parse_concat();
    ChainGuard chain(*this);
    while (cur().type == Tok::kAdd || cur().type == Tok::kSub) {
      chain.link();
      BinOp op = next().type == Tok::kAdd ? BinOp::kAdd : BinOp::kSub;
      l = binary(op, std::move(l), parse_concat(), line);
      line = cur().line;
    }
    return l;
  }

  ExprP parse_concat() {
    int line = cur().line;
    ExprP first = parse_math2();
    if (cur().type != Tok::kTilde) return first;
    auto n = std::make_unique<Expr>(ExprKind::kConcat, line);
    n->items.push_back(std::move(first));
    while (skip(Tok::kTilde)) n->items.push_back(parse_math2());
    return n;
  }

  ExprP parse_math2() {
    int line = cur().line;
    ExprP l = parse_pow();
    ChainGuard chain(*this);
    while (true) {
      BinOp op;
      Tok t = cur().type;
      if (t == Tok::kMul) {
        op = BinOp::kMul;
      } else if (t == Tok::kDiv) {
        op = BinOp::kDiv;
      } else if (t == Tok::kFloorDiv) {
        op = BinOp::kFloorDiv;
      } else if (t == Tok::kMod) {
        op = BinOp::kMod;
      } else {
        break;
      }
      next();
      chain.link();
      l = binary(op, std::move(l), parse_pow(), line);
      line = cur().line;
    }
    return l;
  }

  ExprP parse_pow() {
    int line = cur().line;
    ExprP l = parse_unary(true);
    ChainGuard chain(*this);
    while (skip(Tok::kPow)) {
      chain.link();
      l = binary(BinOp::kPow, std::move(l), parse_unary(true), line);
      line = cur().line;
    }
    return l;
  }

  ExprP parse_unary(bool with_filter) {
    DepthGuard g(*this);
    int line = cur().line;
    ExprP node;
    if (cur().type == Tok::kSub || cur().type == Tok::kAdd) {
      bool neg = next().type == Tok::kSub;
      node = std::make_unique<Expr>(neg ? ExprKind::kNeg : ExprKind::kPos, line);
      node->a = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprP parse_primary() {
    DepthGuard g(*this);
    const Token& tok = cur();
    int line = tok.line;
    if (tok.type == Tok::kName) {
      ExprP n;
      if (tok.text == "true" || tok.text == "True") {
        n = make_const(Value::boolean(true), line);
      } else if (tok.text == "false" || tok.text == "False") {
        n = make_const(Value::boolean(false), line);
      } else if (tok.text == "none" || tok.text == "None") {
        n = make_const(Value::none(), line);
      } else {
        n = std::make_unique<Expr>(ExprKind::kName, line);
        n->name = tok.text;
      }
      next();
      return n;
    }
    if (tok.type == Tok::kString) {
      std::string s;
      while (cur().type == Tok::kString) s += next().text;
      return make_const(Value::string(std::move(s)), line);
    }
    if (tok.type == Tok::kInteger) return make_const(Value::integer(next().ival), line);
    if (tok.type == Tok::kFloat) return make_const(Value::number(next().fval), line);
    if (tok.type == Tok::kLParen) {
      next();
      ExprP e = parse_tuple(false, true, {}, true);
      expect(Tok::kRParen);
      return e;
    }
    if (tok.type == Tok::kLBracket) {
      next();
      auto n = std::make_unique<Expr>(ExprKind::kList, line);
      while (cur().type != Tok::kRBracket) {
        if (!n->items.empty()) expect(Tok::kComma);
        if (cur().type == Tok::kRBracket) break;
        n->items.push_back(parse_expression(true));
      }
      expect(Tok::kRBracket);
      return n;
    }
    if (tok.type == Tok::kLBrace) {
      next();
      auto n = std::make_unique<Expr>(ExprKind::kDict, line);
      while (cur().type != Tok::kRBrace) {
        if (!n->items.empty()) expect(Tok::kComma);
        if (cur().type == Tok::kRBrace) break;
        n->items.push_back(parse_expression(true));
        expect(Tok::kColon);
        n->items.push_back(parse_expression(true));
      }
      expect(Tok::kRBrace);
      return n;
    }
    if (tok.type == Tok::kEof) fail("unexpected end of template");
    fail("unexpected " + py::repr(describe(tok)));
  }

  static ExprP make_const(Value v, int line) {
    auto n = std::make_unique<Expr>(ExprKind::kConst, line);
    n->value = std::move(v);
    return n;
  }

  // jinja2 passes its extra end rules (e.g. "name:in" for for-loop targets) in a way that never
  // matches (Token.test_any gets a tuple inside a tuple), so only these tokens end a tuple: a
  // trailing comma in `for a, in x` makes `in` part of the target. Kept for parity.
  bool is_tuple_end(const std::vector<std::string>&) const {
    Tok t = cur().type;
    return t == Tok::kVarEnd || t == Tok::kBlockEnd || t == Tok::kRParen;
  }

  ExprP parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end, bool explicit_parens) {
    int line = cur().line;
    std::vector<ExprP> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) expect(Tok::kComma);
      if (is_tuple_end(extra_end)) break;
      if (simplified) {
        args.push_back(parse_primary());
      } else {
        args.push_back(parse_expression(with_condexpr));
      }
      if (cur().type == Tok::kComma) {
        is_tuple = true;
      } else {
        break;
      }
      line = cur().line;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!explicit_parens) fail("Expected an expression, got " + py::repr(describe(cur())));
    }
    auto n = std::make_unique<Expr>(ExprKind::kTuple, line);
    n->items = std::move(args);
    return n;
  }

  ExprP parse_postfix(ExprP node) {
    ChainGuard chain(*this);
    while (true) {
      Tok t = cur().type;
      if (t == Tok::kDot || t == Tok::kLBracket || t == Tok::kLParen) chain.link();
      if (t == Tok::kDot || t == Tok::kLBracket) {
        node = parse_subscript(std::move(node));
      } else if (t == Tok::kLParen) {
        node = parse_call(std::move(node));
      } else {
        break;
      }
    }
    return node;
  }

  ExprP parse_filter_expr(ExprP node) {
    ChainGuard chain(*this);
    while (true) {
      Tok t = cur().type;
      if (t == Tok::kPipe || t == Tok::kLParen || is_name("is")) chain.link();
      if (t == Tok::kPipe) {
        node = parse_filter(std::move(node), false);
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (t == Tok::kLParen) {
        node = parse_call(std::move(node));
      } else {
        break;
      }
    }
    return node;
  }

  ExprP parse_subscript(ExprP node) {
    DepthGuard g(*this);
    const Token& tok = next();
    int line = tok.line;
    if (tok.type == Tok::kDot) {
      const Token& attr = next();
      if (attr.type == Tok::kName) {
        auto n = std::make_unique<Expr>(ExprKind::kGetattr, line);
        n->a = std::move(node);
        n->name = attr.text;
        return n;
      }
      if (attr.type != Tok::kInteger) fail("expected name or number", attr.line);
      auto n = std::make_unique<Expr>(ExprKind::kGetitem, line);
      n->a = std::move(node);
      n->b = make_const(Value::integer(attr.ival), attr.line);
      return n;
    }
    // '['
    std::vector<ExprP> args;
    while (cur().type != Tok::kRBracket) {
      if (!args.empty()) expect(Tok::kComma);
      args.push_back(parse_subscribed());
    }
    expect(Tok::kRBracket);
    ExprP arg;
    if (args.size() == 1) {
      arg = std::move(args[0]);
    } else {
      // jinja2 would emit `x[a, b:c]` as invalid Python: a compile-time syntax error.
      for (const auto& x : args)
        if (x->kind == ExprKind::kSlice && !x->a) fail("invalid syntax", line);
      arg = std::make_unique<Expr>(ExprKind::kTuple, line);
      arg->items = std::move(args);
    }
    if (arg->kind == ExprKind::kSlice) {
      arg->a = std::move(node);
      return arg;
    }
    auto n = std::make_unique<Expr>(ExprKind::kGetitem, line);
    n->a = std::move(node);
    n->b = std::move(arg);
    return n;
  }

  // A subscript: expression or slice [start:stop:step]. For slices the node operand (a) is set by
  // the caller; b, c, d are start, stop and step.
  ExprP parse_subscribed() {
    int line = cur().line;
    ExprP start;
    if (cur().type == Tok::kColon) {
      next();
    } else {
      ExprP e = parse_expression(true);
      if (cur().type != Tok::kColon) return e;
      next();
      start = std::move(e);
    }
    auto n = std::make_unique<Expr>(ExprKind::kSlice, line);
    n->b = std::move(start);
    if (cur().type != Tok::kColon && cur().type != Tok::kRBracket && cur().type != Tok::kComma) n->c = parse_expression(true);
    if (cur().type == Tok::kColon) {
      next();
      if (cur().type != Tok::kRBracket && cur().type != Tok::kComma) n->d = parse_expression(true);
    }
    return n;
  }

  void parse_call_args(CallArgs& ca) {
    int line = expect(Tok::kLParen).line;
    bool require_comma = false;
    auto ensure = [&](bool ok) {
      if (!ok) fail("invalid syntax for function call expression", line);
    };
    while (cur().type != Tok::kRParen) {
      if (require_comma) {
        expect(Tok::kComma);
        if (cur().type == Tok::kRParen) break;
      }
      if (cur().type == Tok::kMul) {
        ensure(!ca.dyn_args && !ca.dyn_kwargs);
        next();
        ca.dyn_args = parse_expression(true);
      } else if (cur().type == Tok::kPow) {
        ensure(!ca.dyn_kwargs);
        next();
        ca.dyn_kwargs = parse_expression(true);
      } else if (cur().type == Tok::kName && look().type == Tok::kAssign) {
        ensure(!ca.dyn_kwargs);
        std::string key = next().text;
        next();
        for (const auto& kv : ca.kwargs)
          if (kv.first == key) fail("keyword argument repeated: " + key, line);
        ca.kwargs.emplace_back(key, parse_expression(true));
      } else {
        ensure(!ca.dyn_args && !ca.dyn_kwargs && ca.kwargs.empty());
        ca.args.push_back(parse_expression(true));
      }
      require_comma = true;
    }
    expect(Tok::kRParen);
  }

  ExprP parse_call(ExprP node) {
    DepthGuard g(*this);
    auto n = std::make_unique<Expr>(ExprKind::kCall, cur().line);
    n->a = std::move(node);
    parse_call_args(n->call);
    return n;
  }

  ExprP parse_filter(ExprP node, bool start_inline) {
    ChainGuard chain(*this);
    while (cur().type == Tok::kPipe || start_inline) {
      chain.link();
      if (!start_inline) next();
      const Token& tok = expect_name();
      auto n = std::make_unique<Expr>(ExprKind::kFilter, tok.line);
      n->name = tok.text;
      while (cur().type == Tok::kDot) {
        next();
        n->name += "." + expect_name().text;
      }
      if (cur().type == Tok::kLParen) parse_call_args(n->call);
      n->a = std::move(node);
      node = std::move(n);
      start_inline = false;
    }
    return node;
  }

  ExprP parse_test(ExprP node) {
    DepthGuard g(*this);
    int line = next().line;
    bool negated = skip_name("not");
    auto n = std::make_unique<Expr>(ExprKind::kTest, line);
    n->name = expect_name().text;
    while (cur().type == Tok::kDot) {
      next();
      n->name += "." + expect_name().text;
    }
    Tok t = cur().type;
    if (t == Tok::kLParen) {
      parse_call_args(n->call);
    } else if ((t == Tok::kName || t == Tok::kString || t == Tok::kInteger || t == Tok::kFloat || t == Tok::kLParen ||
                t == Tok::kLBracket || t == Tok::kLBrace) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      ExprP arg = parse_primary();
      arg = parse_postfix(std::move(arg));
      n->call.args.push_back(std::move(arg));
    }
    n->a = std::move(node);
    if (negated) {
      auto nn = std::make_unique<Expr>(ExprKind::kNot, line);
      nn->a = std::move(n);
      return nn;
    }
    return n;
  }

 public:
  static void scan_expr_names(const Expr& e, MacroDef& m) {
    if (e.kind == ExprKind::kName) {
      if (e.name == "caller") m.uses_caller = true;
      if (e.name == "varargs") m.uses_varargs = true;
      if (e.name == "kwargs") m.uses_kwargs = true;
    }
    for (const Expr* c : {e.a.get(), e.b.get(), e.c.get(), e.d.get()})
      if (c) scan_expr_names(*c, m);
    for (const auto& i : e.items)
      if (i) scan_expr_names(*i, m);
    for (const auto& i : e.call.args) scan_expr_names(*i, m);
    for (const auto& kv : e.call.kwargs) scan_expr_names(*kv.second, m);
    if (e.call.dyn_args) scan_expr_names(*e.call.dyn_args, m);
    if (e.call.dyn_kwargs) scan_expr_names(*e.call.dyn_kwargs, m);
  }
};

void Parser::scan_names(const Body& body, MacroDef& m) {
  for (const auto& s : body) {
    for (const Expr* e : {s->expr.get(), s->test.get(), s->filter.get()})
      if (e) scan_expr_names(*e, m);
    for (const auto& v : s->with_values) scan_expr_names(*v, m);
    scan_names(s->body, m);
    scan_names(s->else_body, m);
    if (s->macro) {
      // A nested macro's or call block's body is scanned too, like jinja2's find_undeclared.
      scan_names(s->macro->body, m);
      for (const auto& d : s->macro->defaults) scan_expr_names(*d, m);
    }
  }
}

// --- constant folding ---------------------------------------------------------------------------
// jinja2's optimizer evaluates expressions at compile time (Node.as_const) and inlines the result;
// that evaluation differs from run time only for slices (see Interp::eval), so only expressions
// containing a slice are marked for the attempt. Returns whether e contains a slice.
bool mark_fold(Expr& e) {
  bool slice = e.kind == ExprKind::kSlice;
  auto visit = [&](Expr* c) {
    if (c && mark_fold(*c)) slice = true;
  };
  for (Expr* c : {e.a.get(), e.b.get(), e.c.get(), e.d.get()}) visit(c);
  for (auto& i : e.items) visit(i.get());
  for (auto& x : e.call.args) visit(x.get());
  for (auto& kv : e.call.kwargs) visit(kv.second.get());
  if (e.call.dyn_args) visit(e.call.dyn_args.get());
  if (e.call.dyn_kwargs) visit(e.call.dyn_kwargs.get());
  e.fold = slice;
  return slice;
}

void mark_fold_body(Body& body) {
  for (auto& s : body) {
    for (Expr* e : {s->expr.get(), s->test.get(), s->filter.get()})
      if (e) mark_fold(*e);
    for (auto& v : s->with_values) mark_fold(*v);
    mark_fold_body(s->body);
    mark_fold_body(s->else_body);
    if (s->macro) {
      for (auto& d : s->macro->defaults) mark_fold(*d);
      mark_fold_body(s->macro->body);
    }
  }
}

// --- compile-time check of filter and test names ---------------------------------------------
void check_expr(const Expr& e, bool soft) {
  if (e.kind == ExprKind::kFilter && !soft && !e.soft && !is_known_filter(e.name))
    throw Error(ErrorKind::kSyntax, "No filter named " + py::repr(e.name) + ".", e.line);
  if (e.kind == ExprKind::kTest && !soft && !e.soft && !is_known_test(e.name))
    throw Error(ErrorKind::kSyntax, "No test named " + py::repr(e.name) + ".", e.line);
  for (const Expr* c : {e.a.get(), e.b.get(), e.c.get(), e.d.get()})
    if (c) check_expr(*c, soft);
  for (const auto& i : e.items)
    if (i) check_expr(*i, soft);
  for (const auto& i : e.call.args) check_expr(*i, soft);
  for (const auto& kv : e.call.kwargs) check_expr(*kv.second, soft);
  if (e.call.dyn_args) check_expr(*e.call.dyn_args, soft);
  if (e.call.dyn_kwargs) check_expr(*e.call.dyn_kwargs, soft);
}

void check_body(const Body& body, bool soft);

void check_stmt(const Stmt& s, bool soft) {
  switch (s.kind) {
    case StmtKind::kIf:
      // jinja2 compiles if-tests and if-bodies in a "soft" frame: unknown names fail only when run.
      check_expr(*s.expr, true);
      check_body(s.body, true);
      check_body(s.else_body, true);
      return;
    case StmtKind::kFor:
      check_expr(*s.expr, soft);
      if (s.test) check_expr(*s.test, false);
      check_body(s.body, false);
      check_body(s.else_body, false);
      return;
    case StmtKind::kSetBlock:
      if (s.filter) check_expr(*s.filter, false);
      check_body(s.body, false);
      return;
    case StmtKind::kFilterBlock:
      check_expr(*s.filter, false);
      check_body(s.body, false);
      return;
    case StmtKind::kMacro:
      for (const auto& d : s.macro->defaults) check_expr(*d, false);
      check_body(s.macro->body, false);
      return;
    case StmtKind::kCallBlock:
      check_expr(*s.expr, soft);
      for (const auto& d : s.macro->defaults) check_expr(*d, false);
      check_body(s.macro->body, false);
      return;
    case StmtKind::kWith:
      for (const auto& v : s.with_values) check_expr(*v, soft);
      check_body(s.body, false);
      return;
    case StmtKind::kScope:
      check_body(s.body, false);
      return;
    default:
      if (s.expr) check_expr(*s.expr, soft);
      return;
  }
}

void check_body(const Body& body, bool soft) {
  for (const auto& s : body) check_stmt(*s, soft);
}

}  // namespace

Body parse_template(std::string_view source) {
  if (!py::utf8_valid(source)) throw Error(ErrorKind::kSyntax, "template source is not valid UTF-8");
  Parser p(tokenize(source));
  Body b = p.parse();
  check_body(b, false);
  mark_fold_body(b);
  return b;
}

}  // namespace pg::jinja
