#include "chat/jinja/interp.h"

#include <cmath>
#include <deque>
#include <unordered_set>

#include "chat/jinja/parser.h"
#include "chat/jinja/pystr.h"
#include "chat/jinja/work.h"

namespace pg::jinja {

namespace {

constexpr uint32_t kMaxNest = 1000;

[[noreturn]] void value_error(const std::string& m) { throw Error(ErrorKind::kValue, m); }
[[noreturn]] void runtime_error(const std::string& m) { throw Error(ErrorKind::kRuntime, m); }

bool is_unsafe_dunder(const std::string& n) {
  if (n.size() < 5 || n[0] != '_' || n[1] != '_') return false;
  static const std::unordered_set<std::string> kDunders = {"__class__",
                                                           "__dict__",
                                                           "__doc__",
                                                           "__module__",
                                                           "__init__",
                                                           "__new__",
                                                           "__repr__",
                                                           "__str__",
                                                           "__len__",
                                                           "__getitem__",
                                                           "__iter__",
                                                           "__contains__",
                                                           "__eq__",
                                                           "__ne__",
                                                           "__lt__",
                                                           "__le__",
                                                           "__gt__",
                                                           "__ge__",
                                                           "__hash__",
                                                           "__subclasses__",
                                                           "__mro__",
                                                           "__bases__",
                                                           "__base__",
                                                           "__globals__",
                                                           "__code__",
                                                           "__builtins__",
                                                           "__getattribute__",
                                                           "__setattr__",
                                                           "__delattr__",
                                                           "__reduce__",
                                                           "__reduce_ex__",
                                                           "__sizeof__",
                                                           "__dir__",
                                                           "__format__",
                                                           "__init_subclass__",
                                                           "__subclasshook__",
                                                           "__class_getitem__",
                                                           "__add__",
                                                           "__mul__",
                                                           "__setitem__",
                                                           "__delitem__",
                                                           "__name__",
                                                           "__qualname__",
                                                           "__self__",
                                                           "__func__",
                                                           "__call__",
                                                           "__closure__",
                                                           "__defaults__"};
  return kDunders.count(n) > 0;
}

Value unsafe_undefined(const Value& obj, const std::string& attr) {
  return Value::undefined_hint(
      "access to attribute " + py::repr(attr) + " of " + py::repr(obj.type_name()) + " object is unsafe.", ErrorKind::kSecurity);
}

// Python list iterator: reads the live list, so pop() during iteration is visible.
class ListIter final : public Object {
 public:
  explicit ListIter(Value list) : list_(std::move(list)) {}
  const char* type_name() const override { return "list_iterator"; }
  bool is_iterator() const override { return true; }
  bool next(Interp&, Value& out) override {
    auto& items = list_.items();
    if (idx_ >= items.size()) return false;
    out = items[idx_++];
    return true;
  }

 private:
  Value list_;
  size_t idx_ = 0;
};

class VecIter final : public Object {
 public:
  VecIter(const char* type, std::vector<Value> items) : type_(type), items_(std::move(items)) {}
  const char* type_name() const override { return type_; }
  bool is_iterator() const override { return true; }
  bool next(Interp&, Value& out) override {
    if (idx_ >= items_.size()) return false;
    out = std::move(items_[idx_++]);
    return true;
  }

 private:
  const char* type_;
  std::vector<Value> items_;
  size_t idx_ = 0;
};

// Walks the UTF-8 text in place: decoding a whole 60 MB string up front (4 bytes per code point) to take its first
// character cost 240 MB.
class StrIter final : public Object {
 public:
  explicit StrIter(Value str) : str_(std::move(str)) {}
  const char* type_name() const override { return "str_ascii_iterator"; }
  bool is_iterator() const override { return true; }
  bool next(Interp& in, Value& out) override {
    const std::string& s = str_.str();
    if (pos_ >= s.size()) return false;
    std::string c;
    py::utf8_append(c, py::decode_at(s, pos_));
    out = in.make_str(std::move(c));
    return true;
  }

 private:
  Value str_;  // keeps the text alive
  size_t pos_ = 0;
};

// A call scope guard for macro recursion and recursive loops.
struct DepthGuard {
  int& d;
  DepthGuard(int& depth, int max) : d(depth) {
    if (++d > max) {
      --d;
      throw Error(ErrorKind::kLimit, "maximum recursion depth exceeded (" + std::to_string(max) + " nested calls)");
    }
  }
  ~DepthGuard() { --d; }
};

}  // namespace

// ------------------------------------------------------------------------------------------------
uint32_t nest_depth(const Value& v) { return v.heap() ? v.heap()->depth : 0; }

void check_nest_depth(uint32_t d) {
  if (d > kMaxNest) throw Error(ErrorKind::kLimit, "values nested more than " + std::to_string(kMaxNest) + " levels deep");
}

std::string BuiltinFn::repr() const {
  if (owner_.empty()) return "<built-in function " + name_ + ">";
  return "<built-in method " + name_ + " of " + owner_ + " object>";
}

std::string NamespaceObj::repr() const { return "<Namespace " + repr_dict(attrs) + ">"; }

bool NamespaceObj::get_attr(Interp&, const std::string& name, Value& out) {
  const Value* p = attrs.find_str(name);
  if (!p) return false;
  out = *p;
  return true;
}

bool GeneratorObj::next(Interp& in, Value& out) {
  if (done_) return false;
  if (!pull_(in, out)) {
    done_ = true;
    pull_ = nullptr;  // releases the source
    return false;
  }
  return true;
}

// ------------------------------------------------------------------------------------------------
class MacroObj final : public Object {
 public:
  MacroObj(std::shared_ptr<const MacroDef> def, ScopeP closure) : def_(std::move(def)), closure_(std::move(closure)) {}
  const char* type_name() const override { return "Macro"; }
  std::string repr() const override { return "<Macro " + py::repr(def_->name) + ">"; }
  bool callable() const override { return true; }
  Value call(Interp& in, Args& args) override { return in.call_macro(*def_, closure_, args, Value()); }
  bool get_attr(Interp& in, const std::string& name, Value& out) override {
    if (name == "name") {
      out = Value::string(def_->name);
      return true;
    }
    if (name == "arguments") {
      std::vector<Value> a;
      for (const auto& p : def_->params) a.push_back(Value::string(p));
      out = Value::tuple(std::move(a));
      return true;
    }
    if (name == "catch_kwargs" || name == "catch_varargs" || name == "caller") {
      bool b = name == "catch_kwargs" ? def_->uses_kwargs : name == "catch_varargs" ? def_->uses_varargs : def_->uses_caller;
      out = Value::boolean(b);
      return true;
    }
    return false;
  }

 private:
  std::shared_ptr<const MacroDef> def_;
  ScopeP closure_;
};

class LoopObj final : public Object {
 public:
  const char* type_name() const override { return "LoopContext"; }
  std::string repr() const override {
    // repr() shows the length, which (like jinja2) drains an unsized iterable.
    std::string len = interp ? std::to_string(const_cast<LoopObj*>(this)->get_length(*interp)) : "?";
    return "<LoopContext " + std::to_string(index0 + 1) + "/" + len + ">";
  }
  bool callable() const override { return true; }

  std::shared_ptr<Object> it;
  Value sized;  // the iterable when len() works on it (unfiltered list/str/dict)
  bool has_sized = false;
  std::deque<Value> ahead;
  int64_t index0 = -1;
  Value current, before;
  std::optional<int64_t> length;
  bool has_changed = false;
  Value last_changed;
  int depth0 = 0;
  const Stmt* stmt = nullptr;
  ScopeP outer;
  Interp* interp = nullptr;  // the render this loop belongs to (loops never outlive it)

  bool peek(Interp& in) {
    if (!ahead.empty()) return true;
    Value v;
    if (!it->next(in, v)) return false;
    ahead.push_back(std::move(v));
    return true;
  }
  bool advance(Interp& in, Value& out) {
    if (!ahead.empty()) {
      out = std::move(ahead.front());
      ahead.pop_front();
    } else if (!it->next(in, out)) {
      return false;
    }
    ++index0;
    before = current;
    current = out;
    return true;
  }
  int64_t get_length(Interp& in) {
    if (length) return *length;
    if (has_sized) {
      // Like len(self._iterable): the live size of the list.
      if (sized.is_list()) return static_cast<int64_t>(sized.items().size());
      if (sized.is_dict()) return static_cast<int64_t>(sized.dict_obj().items.size());
      if (sized.is_str()) return sized.str_len();
    }
    Value v;
    while (it->next(in, v)) {
      in.step();
      ahead.push_back(std::move(v));
    }
    length = index0 + 1 + static_cast<int64_t>(ahead.size());
    return *length;
  }

  bool get_attr(Interp& in, const std::string& name, Value& out) override {
    if (name == "index0") {
      out = Value::integer(index0);
    } else if (name == "index") {
      out = Value::integer(index0 + 1);
    } else if (name == "revindex") {
      out = Value::integer(get_length(in) - index0);
    } else if (name == "revindex0") {
      out = Value::integer(get_length(in) - index0 - 1);
    } else if (name == "first") {
      out = Value::boolean(index0 == 0);
    } else if (name == "last") {
      out = Value::boolean(!peek(in));
    } else if (name == "length") {
      out = Value::integer(get_length(in));
    } else if (name == "depth") {
      out = Value::integer(depth0 + 1);
    } else if (name == "depth0") {
      out = Value::integer(depth0);
    } else if (name == "previtem") {
      out = index0 == 0 ? Value::undefined_hint("there is no previous item") : before;
    } else if (name == "nextitem") {
      out = peek(in) ? ahead.front() : Value::undefined_hint("there is no next item");
    } else if (name == "cycle") {
      auto self = std::static_pointer_cast<LoopObj>(shared_from_this());
      out = Value::object(std::make_shared<BuiltinFn>(
          "cycle",
          [self](Interp&, Args& a) -> Value {
            if (a.pos.empty()) type_error("no items for cycling given");
            int64_t n = static_cast<int64_t>(a.pos.size());
            return a.pos[static_cast<size_t>(((self->index0 % n) + n) % n)];
          },
          "LoopContext"));
    } else if (name == "changed") {
      auto self = std::static_pointer_cast<LoopObj>(shared_from_this());
      out = Value::object(std::make_shared<BuiltinFn>(
          "changed",
          [self](Interp&, Args& a) -> Value {
            Value t = Value::tuple(a.pos);
            if (!self->has_changed || !py_eq(self->last_changed, t)) {
              self->has_changed = true;
              self->last_changed = t;
              return Value::boolean(true);
            }
            return Value::boolean(false);
          },
          "LoopContext"));
    } else {
      return false;
    }
    return true;
  }

  Value call(Interp& in, Args& args) override {
    if (!stmt || !stmt->recursive) type_error("The loop must have the 'recursive' marker to be called recursively.");
    if (args.pos.size() != 1 || !args.kw.empty()) type_error("loop() takes exactly one argument");
    return in.recurse_loop(*stmt, outer, args.pos[0], depth0 + 1);
  }
};

// ------------------------------------------------------------------------------------------------
Interp::Interp(const RenderOptions& opts) : opts_(opts) {
  globals_ = std::make_shared<Scope>();
  install_globals(*this, *globals_);
}

Interp::~Interp() {
  // Macros hold their defining scope and scopes hold macros; namespaces can hold themselves.
  // Clearing them breaks every such cycle so the whole render is freed.
  for (auto& w : captured_)
    if (auto s = w.lock()) s->vars.clear();
  for (auto& w : namespaces_)
    if (auto n = w.lock()) n->attrs.items.clear();
  if (root_) root_->vars.clear();
}

void Interp::step(int64_t n) {
  steps_ += n;
  if (steps_ > opts_.limits.max_steps)
    throw Error(ErrorKind::kLimit, "template exceeded its work limit of " + std::to_string(opts_.limits.max_steps) + " steps");
}

void Interp::charge_bytes(size_t n) {
  bytes_ += n;
  if (bytes_ > opts_.limits.max_alloc_bytes)
    throw Error(ErrorKind::kLimit, "template allocated more than " + std::to_string(opts_.limits.max_alloc_bytes) + " bytes");
  step(static_cast<int64_t>(n / 256));
}

Value Interp::make_str(std::string s, bool markup) {
  // The heap object of a string costs memory too: a template that splits a string into millions of one-byte strings
  // uses ~100 bytes per part, which charging the text alone let grow to gigabytes within the 256 MB cap.
  charge_bytes(s.size() + kStrValueBytes);
  if (s.size() > opts_.limits.max_output_bytes)
    throw Error(ErrorKind::kLimit, "a string of " + std::to_string(s.size()) + " bytes exceeds the output limit of " +
                                       std::to_string(opts_.limits.max_output_bytes) + " bytes");
  return Value::string(std::move(s), markup);
}

Value Interp::make_list(std::vector<Value> items, ListKind kind) {
  charge_bytes(items.size() * sizeof(Value));
  uint32_t d = 0;
  for (const auto& v : items) d = std::max(d, nest_depth(v));
  check_nest_depth(d + 1);
  Value v = Value::list(std::move(items), kind);
  const_cast<HeapObj*>(v.heap())->depth = d + 1;
  return v;
}

Value Interp::make_generator(const char* type, const Value& source, GeneratorObj::Pull pull) {
  uint32_t d = nest_depth(source) + 1;
  check_nest_depth(d);
  auto g = std::make_shared<GeneratorObj>(type, std::move(pull));
  g->depth = d;
  return Value::object(std::move(g));
}

ScopeP Interp::new_scope(const ScopeP& parent) {
  auto s = std::make_shared<Scope>();
  s->parent = parent;
  return s;
}

ScopeP Interp::capture_scope(const ScopeP& s) {
  captured_.push_back(s);
  return s;
}

void Interp::emit(const std::string& s) {
  out_->append(s);
  if (out_->size() > opts_.limits.max_output_bytes)
    throw Error(ErrorKind::kLimit, "template output exceeds " + std::to_string(opts_.limits.max_output_bytes) + " bytes");
}

// ------------------------------------------------------------------------------------------------
namespace {

// The render running on this thread and its work bytes not yet turned into steps (see work.h). A Template may be
// rendered by several threads at once; each render runs on one thread, so per-thread state is per-render state.
thread_local Interp* t_render = nullptr;
thread_local uint64_t t_work = 0;

// Filters, tests and methods that walk a list or dict do so in C++ loops the interpreter does not see (max, sum,
// join, unique, list.index, ...): charge the walk up front from the container sizes.
void charge_containers(const Value& v, const Args& args) {
  auto size = [](const Value& x) -> uint64_t {
    if (x.is_list()) return x.items().size();
    if (x.is_dict()) return x.dict_obj().items.size();
    return 0;
  };
  uint64_t n = size(v);
  for (const auto& x : args.pos) n += size(x);
  for (const auto& kv : args.kw) n += size(kv.second);
  if (n > 0) charge_work(n * kWorkPerItem);
}

struct RenderScope {
  Interp* saved;
  uint64_t saved_work;
  explicit RenderScope(Interp* in) : saved(t_render), saved_work(t_work) {
    t_render = in;
    t_work = 0;
  }
  ~RenderScope() {
    t_render = saved;
    t_work = saved_work;
  }
};

}  // namespace

void charge_work(uint64_t bytes) {
  if (t_render == nullptr) return;
  t_work += bytes;
  if (t_work >= kWorkBytesPerStep) {
    const uint64_t steps = t_work / kWorkBytesPerStep;
    t_work %= kWorkBytesPerStep;
    t_render->step(static_cast<int64_t>(steps));
  }
}

void charge_alloc(uint64_t bytes) {
  if (t_render != nullptr) t_render->charge_bytes(bytes);
}

std::string Interp::render(const Body& body, const std::vector<std::pair<std::string, Value>>& vars) {
  RenderScope active(this);
  auto ctx = new_scope(globals_);
  for (const auto& kv : vars) ctx->set(kv.first, kv.second);
  root_ = new_scope(ctx);
  std::string out;
  out_ = &out;
  exec(body, root_);
  out_ = nullptr;
  return out;
}

Flow Interp::exec(const Body& body, const ScopeP& scope) {
  for (const auto& s : body) {
    step();
    Flow f = exec_stmt(*s, scope);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

Value Interp::capture(const Body& body, const ScopeP& scope) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec(body, scope);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return make_str(std::move(buf));
}

Flow Interp::exec_stmt(const Stmt& s, const ScopeP& scope) {
  try {
    switch (s.kind) {
      case StmtKind::kOutput:
        if (!s.expr) {
          emit(s.text);
        } else {
          Value v;
          bool done = false;
          if (s.expr->fold && !fold_mode_) {
            // jinja2 prints a constant expression's compile-time value whenever that evaluation
            // succeeds (printable or not).
            try {
              fold_mode_ = true;
              v = eval_inner(*s.expr, scope);
              done = true;
            } catch (const Error&) {
            }
            fold_mode_ = false;
          }
          if (!done) v = eval(*s.expr, scope);
          if (v.is_str()) {
            emit(v.str());
          } else {
            std::string t = v.to_str();
            charge_bytes(t.size());
            emit(t);
          }
        }
        return Flow::kNormal;
      case StmtKind::kIf:
        if (eval(*s.expr, scope).truthy()) return exec(s.body, scope);
        return exec(s.else_body, scope);
      case StmtKind::kFor: {
        Value it = eval(*s.expr, scope);
        exec_for(s, scope, it, 0);
        return Flow::kNormal;
      }
      case StmtKind::kSet:
        // jinja2 checks a namespace target before evaluating the value.
        if (s.target.kind == Target::kNsAttr) {
          Value ns = lookup(s.target.name, scope);
          if (!ns.is_object() || !ns.obj().is_namespace()) runtime_error("cannot assign attribute on non-namespace object");
        }
        assign(s.target, eval(*s.expr, scope), scope);
        return Flow::kNormal;
      case StmtKind::kSetBlock: {
        Value v = capture(s.body, new_scope(scope));
        if (s.filter) {
          Value saved = filter_block_value_;
          filter_block_value_ = v;
          v = eval(*s.filter, scope);
          filter_block_value_ = saved;
        }
        assign(s.target, v, scope);
        return Flow::kNormal;
      }
      case StmtKind::kMacro:
        scope->set(s.macro->name, Value::object(std::make_shared<MacroObj>(s.macro, capture_scope(scope))));
        return Flow::kNormal;
      case StmtKind::kCallBlock: {
        const Expr& call = *s.expr;
        Value fn = eval(*call.a, scope);
        Args args;
        eval_args(call.call, scope, args);
        args.kw.emplace_back("caller", Value::object(std::make_shared<MacroObj>(s.macro, capture_scope(scope))));
        Value r = this->call(fn, args);
        std::string t = r.to_str();
        emit(t);
        return Flow::kNormal;
      }
      case StmtKind::kFilterBlock: {
        Value v = capture(s.body, new_scope(scope));
        Value saved = filter_block_value_;
        filter_block_value_ = v;
        Value r;
        try {
          r = eval(*s.filter, scope);
        } catch (...) {
          filter_block_value_ = saved;
          throw;
        }
        filter_block_value_ = saved;
        emit(r.to_str());
        return Flow::kNormal;
      }
      case StmtKind::kWith: {
        ScopeP inner = new_scope(scope);
        for (size_t i = 0; i < s.with_targets.size(); ++i) assign(s.with_targets[i], eval(*s.with_values[i], scope), inner);
        return exec(s.body, inner);
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kScope: {
        ScopeP inner = new_scope(s.block_scope ? root_ : scope);
        exec(s.body, inner);
        return Flow::kNormal;
      }
      case StmtKind::kUnsupported:
        if (s.expr) eval(*s.expr, scope);
        throw Error(ErrorKind::kType, s.text);
    }
  } catch (const Error& e) {
    if (e.line() == 0 && e.kind() != ErrorKind::kRaised) throw Error(e.kind(), e.message(), s.line);
    throw;
  }
  return Flow::kNormal;
}

Flow Interp::exec_for(const Stmt& s, const ScopeP& scope, const Value& iterable, int depth0) {
  auto loop = std::make_shared<LoopObj>();
  loop->stmt = &s;
  loop->outer = scope;
  loop->interp = this;
  loop->depth0 = depth0;
  loop->depth = nest_depth(iterable) + 1;
  std::shared_ptr<Object> src = iter(iterable);
  if (s.test) {
    // `for x in y if cond`: a lazy filter, evaluated in its own scope that sees the outer `loop`.
    const Stmt* sp = &s;
    ScopeP outer = scope;
    auto filtered = std::make_shared<GeneratorObj>("generator", [this, sp, outer, src](Interp&, Value& out) {
      Value v;
      while (src->next(*this, v)) {
        step();
        ScopeP ts = new_scope(outer);
        assign(sp->target, v, ts);
        if (eval(*sp->test, ts).truthy()) {
          out = std::move(v);
          return true;
        }
      }
      return false;
    });
    loop->it = filtered;
  } else {
    loop->it = src;
    if (iterable.is_list() || iterable.is_dict() || iterable.is_str()) {
      loop->sized = iterable;
      loop->has_sized = true;
    }
  }
  Value loop_val = Value::object(loop);
  bool completed_any = false;
  Value item;
  while (loop->advance(*this, item)) {
    step();
    ScopeP body_scope = new_scope(scope);
    body_scope->set("loop", loop_val);
    assign(s.target, item, body_scope);
    Flow f = exec(s.body, body_scope);
    if (f == Flow::kBreak) break;
    if (f == Flow::kContinue) continue;
    completed_any = true;
  }
  // jinja2 runs `else` unless an iteration ran to its end (break/continue skip the marker).
  if (!completed_any && !s.else_body.empty()) exec(s.else_body, new_scope(scope));
  return Flow::kNormal;
}

Value Interp::recurse_loop(const Stmt& loop, const ScopeP& scope, const Value& iterable, int depth0) {
  DepthGuard g(call_depth_, opts_.limits.max_call_depth);
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  try {
    exec_for(loop, scope, iterable, depth0);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return make_str(std::move(buf));
}

Value Interp::call_macro(const MacroDef& def, const ScopeP& closure, Args& args, const Value&) {
  DepthGuard g(call_depth_, opts_.limits.max_call_depth);
  step();
  ScopeP sc = new_scope(closure);
  size_t argc = def.params.size();
  std::vector<std::optional<Value>> vals;
  size_t npos = std::min(args.pos.size(), argc);
  for (size_t i = 0; i < npos; ++i) vals.emplace_back(args.pos[i]);
  auto& kw = args.kw;
  auto pop_kw = [&](const std::string& name, Value& out) {
    for (size_t i = 0; i < kw.size(); ++i) {
      if (kw[i].first == name) {
        out = kw[i].second;
        kw.erase(kw.begin() + static_cast<std::ptrdiff_t>(i));
        return true;
      }
    }
    return false;
  };
  bool found_caller = false;
  if (npos != argc) {
    for (size_t i = npos; i < argc; ++i) {
      Value v;
      if (pop_kw(def.params[i], v)) {
        vals.emplace_back(std::move(v));
      } else {
        vals.emplace_back(std::nullopt);
      }
      if (def.params[i] == "caller") found_caller = true;
    }
  } else {
    found_caller = def.explicit_caller;
  }
  Value caller;
  bool bind_caller = false;
  if (def.uses_caller && !found_caller) {
    if (!pop_kw("caller", caller) || caller.is_none()) caller = Value::undefined_hint("No caller defined");
    bind_caller = true;
  }
  Value kwargs_val;
  if (def.uses_kwargs) {
    auto d = std::make_shared<DictObj>();
    for (auto& kv : kw) d->set(Value::string(kv.first), kv.second);
    kwargs_val = Value::dict(std::move(d));
  } else if (!kw.empty()) {
    for (const auto& kv : kw)
      if (kv.first == "caller")
        type_error("macro " + py::repr(def.name) +
                   " was invoked with two values for the special caller argument. This is most likely a bug.");
    type_error("macro " + py::repr(def.name) + " takes no keyword argument " + py::repr(kw[0].first));
  }
  Value varargs_val;
  if (def.uses_varargs) {
    std::vector<Value> extra(args.pos.begin() + static_cast<std::ptrdiff_t>(npos), args.pos.end());
    varargs_val = Value::tuple(std::move(extra));
  } else if (args.pos.size() > argc) {
    type_error("macro " + py::repr(def.name) + " takes not more than " + std::to_string(argc) + " argument(s)");
  }
  size_t first_default = argc - def.defaults.size();
  for (size_t i = 0; i < argc; ++i) {
    Value v;
    if (vals[i]) {
      v = *vals[i];
    } else if (i >= first_default) {
      v = eval(*def.defaults[i - first_default], sc);
    } else {
      v = Value::undefined_hint("parameter " + py::repr(def.params[i]) + " was not provided");
    }
    sc->set(def.params[i], std::move(v));
  }
  if (bind_caller) sc->set("caller", caller);
  if (def.uses_kwargs) sc->set("kwargs", kwargs_val);
  if (def.uses_varargs) sc->set("varargs", varargs_val);
  return capture(def.body, sc);
}

// ------------------------------------------------------------------------------------------------
void Interp::assign(const Target& t, Value v, const ScopeP& scope) {
  switch (t.kind) {
    case Target::kName:
      scope->set(t.name, std::move(v));
      return;
    case Target::kNsAttr: {
      Value ns = lookup(t.name, scope);
      if (!ns.is_object() || !ns.obj().is_namespace()) runtime_error("cannot assign attribute on non-namespace object");
      auto& nso = static_cast<NamespaceObj&>(ns.obj());
      uint32_t d = nest_depth(v) + 1;
      check_nest_depth(d);
      nso.depth = std::max(nso.depth, d);
      nso.attrs.set(Value::string(t.attr), std::move(v));
      return;
    }
    case Target::kTuple: {
      std::vector<Value> items = to_list(v);
      if (items.size() > t.items.size())
        value_error("too many values to unpack (expected " + std::to_string(t.items.size()) + ")");
      if (items.size() < t.items.size())
        value_error("not enough values to unpack (expected " + std::to_string(t.items.size()) + ", got " +
                    std::to_string(items.size()) + ")");
      for (size_t i = 0; i < items.size(); ++i) assign(t.items[i], std::move(items[i]), scope);
      return;
    }
  }
}

Value Interp::lookup(const std::string& name, const ScopeP& scope) {
  for (Scope* s = scope.get(); s; s = s->parent.get()) {
    if (Value* v = s->find_local(name)) return *v;
  }
  return Value::undefined_name(name);
}

std::shared_ptr<Object> Interp::iter(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::make_shared<VecIter>("iterator", std::vector<Value>{});
    case Value::Kind::kList:
      return std::make_shared<ListIter>(v);
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict_obj().items.size());
      for (const auto& kv : v.dict_obj().items) keys.push_back(kv.first);
      return std::make_shared<VecIter>("dict_keyiterator", std::move(keys));
    }
    case Value::Kind::kStr:
      return std::make_shared<StrIter>(v);
    case Value::Kind::kObject:
      if (v.obj().is_iterator()) return v.obj_ptr();
      [[fallthrough]];
    default:
      type_error(py::repr(v.type_name()) + " object is not iterable");
  }
}

std::vector<Value> Interp::to_list(const Value& v) {
  if (v.is_list()) {
    charge_work(v.items().size() * kWorkPerItem);
    return v.items();
  }
  auto it = iter(v);
  std::vector<Value> out;
  Value x;
  while (it->next(*this, x)) {
    step();
    // Charged as the list grows, so that the memory cap stops a long generator before the list is built.
    charge_bytes(sizeof(Value));
    out.push_back(std::move(x));
  }
  return out;
}

Value Interp::call(const Value& fn, Args& args) {
  if (fn.is_undefined()) fn.fail_undefined();
  if (fn.is_callable()) {
    step();
    charge_containers(Value(), args);
    return fn.obj().call(*this, args);
  }
  type_error(py::repr(fn.type_name()) + " object is not callable");
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  // Attributes every Python object has (even Undefined) exist but are refused by the sandbox.
  if (is_unsafe_dunder(name)) return unsafe_undefined(obj, name);
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_object()) {
    Value out;
    if (obj.obj().get_attr(*this, name, out)) {
      if (!name.empty() && name[0] == '_') return unsafe_undefined(obj, name);
      return out;
    }
    return Value::undefined_attr(obj, Value::string(name));
  }
  Value m;
  if (get_method(*this, obj, name, m)) {
    charge_containers(obj, Args{});  // list.index / list.count / dict.items walk their receiver
    return m;
  }
  if (obj.is_dict()) {
    if (const Value* p = obj.dict_obj().find_str(name)) return *p;
  }
  return Value::undefined_attr(obj, Value::string(name));
}

Value Interp::getitem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) obj.fail_undefined();
  switch (obj.kind()) {
    case Value::Kind::kDict:
      if (hashable(key)) {
        if (const Value* p = obj.dict_obj().find(key)) return *p;
      }
      break;
    case Value::Kind::kList:
      if (key.is_integral()) {
        const auto& items = obj.items();
        int64_t n = static_cast<int64_t>(items.size()), i = key.get_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) return items[static_cast<size_t>(i)];
        return Value::undefined_attr(obj, key);
      }
      break;
    case Value::Kind::kStr:
      if (key.is_integral()) {
        const std::string& s = obj.str();
        int64_t n = obj.str_len(), i = key.get_int();
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          if (static_cast<int64_t>(s.size()) == n) return make_str(std::string(1, s[static_cast<size_t>(i)]));
          size_t b = py::cp_to_byte(s, static_cast<size_t>(i)), e = py::cp_to_byte(s, static_cast<size_t>(i) + 1);
          return make_str(s.substr(b, e - b));
        }
        return Value::undefined_attr(obj, key);
      }
      break;
    default:
      break;
  }
  if (key.is_str()) {
    const std::string& name = key.str();
    if (is_unsafe_dunder(name)) return unsafe_undefined(obj, name);
    if (obj.is_object()) {
      Value out;
      if (obj.obj().get_attr(*this, name, out)) {
        if (!name.empty() && name[0] == '_') return unsafe_undefined(obj, name);
        return out;
      }
    } else {
      Value m;
      if (get_method(*this, obj, name, m)) return m;
    }
  }
  return Value::undefined_attr(obj, key);
}

// ------------------------------------------------------------------------------------------------
static int64_t slice_index(const Value& v, const char*) {
  if (v.is_integral()) return v.get_int();
  type_error("slice indices must be integers or None or have an __index__ method");
}

// Python's PySlice_AdjustIndices: returns the selected indices of a sequence of length n.
static std::vector<int64_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v, const Value& step_v) {
  int64_t step = step_v.is_none() ? 1 : slice_index(step_v, "step");
  if (step == 0) value_error("slice step cannot be zero");
  int64_t start, stop;
  if (start_v.is_none()) {
    start = step < 0 ? n - 1 : 0;
  } else {
    start = slice_index(start_v, "start");
    if (start < 0) {
      start += n;
      if (start < 0) start = step < 0 ? -1 : 0;
    } else if (start >= n) {
      start = step < 0 ? n - 1 : n;
    }
  }
  if (stop_v.is_none()) {
    stop = step < 0 ? -1 : n;
  } else {
    stop = slice_index(stop_v, "stop");
    if (stop < 0) {
      stop += n;
      if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= n) {
      stop = step < 0 ? n - 1 : n;
    }
  }
  std::vector<int64_t> idx;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) idx.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) idx.push_back(i);
  }
  return idx;
}

Value Interp::slice(const Value& obj, const Value& start, const Value& stop, const Value& stepv) {
  if (obj.is_undefined()) obj.fail_undefined();
  if (obj.is_str()) {
    const std::string& s = obj.str();
    bool ascii = static_cast<int64_t>(s.size()) == obj.str_len();
    std::vector<int64_t> idx = slice_indices(obj.str_len(), start, stop, stepv);
    std::string out;
    if (ascii) {
      bool contiguous = stepv.is_none() || (stepv.is_integral() && stepv.get_int() == 1);
      if (contiguous && !idx.empty()) {
        out = s.substr(static_cast<size_t>(idx.front()), idx.size());
      } else {
        for (int64_t i : idx) out.push_back(s[static_cast<size_t>(i)]);
      }
    } else {
      std::u32string u = py::decode(s);
      std::u32string r;
      for (int64_t i : idx) r.push_back(u[static_cast<size_t>(i)]);
      out = py::encode(r);
    }
    return make_str(std::move(out), obj.is_markup());
  }
  if (obj.is_list()) {
    ListKind k = obj.list_obj().kind;
    if (k == ListKind::kDictItems || k == ListKind::kDictKeys || k == ListKind::kDictValues)
      type_error(py::repr(obj.type_name()) + " object is not subscriptable");
    const auto& items = obj.items();
    std::vector<int64_t> idx = slice_indices(static_cast<int64_t>(items.size()), start, stop, stepv);
    std::vector<Value> out;
    out.reserve(idx.size());
    for (int64_t i : idx) out.push_back(items[static_cast<size_t>(i)]);
    return make_list(std::move(out), k == ListKind::kTuple ? ListKind::kTuple : ListKind::kList);
  }
  if (obj.is_dict()) type_error("unhashable type: 'slice'");
  type_error(py::repr(obj.type_name()) + " object is not subscriptable");
}

// Compile-time evaluation reached something only known at run time (jinja2's nodes.Impossible).
[[noreturn]] static void impossible() { throw Error(ErrorKind::kRuntime, "not a compile-time constant"); }

// Values jinja2's optimizer is willing to inline as constants (nodes.has_safe_repr).
static bool safe_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kBool:
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
    case Value::Kind::kStr:
      return true;
    case Value::Kind::kList: {
      ListKind k = v.list_obj().kind;
      if (k == ListKind::kRange) return true;
      if (k != ListKind::kList && k != ListKind::kTuple) return false;
      for (const auto& x : v.items())
        if (!safe_repr(x)) return false;
      return true;
    }
    case Value::Kind::kDict:
      for (const auto& kv : v.dict_obj().items)
        if (!safe_repr(kv.first) || !safe_repr(kv.second)) return false;
      return true;
    default:
      return false;
  }
}

Value Interp::eval(const Expr& e, const ScopeP& scope) {
  if (e.fold && !fold_mode_) {
    // jinja2's optimizer replaces a constant subexpression by its compile-time value when that
    // evaluation succeeds and the value is a plain literal; otherwise it is evaluated normally.
    try {
      fold_mode_ = true;
      Value v = eval_inner(e, scope);
      fold_mode_ = false;
      if (safe_repr(v)) return v;
    } catch (const Error&) {
      fold_mode_ = false;
    }
  }
  return eval_inner(e, scope);
}

void Interp::eval_args(const CallArgs& ca, const ScopeP& scope, Args& out) {
  for (const auto& a : ca.args) out.pos.push_back(eval(*a, scope));
  for (const auto& kv : ca.kwargs) out.kw.emplace_back(kv.first, eval(*kv.second, scope));
  if (ca.dyn_args) {
    Value v = eval(*ca.dyn_args, scope);
    for (auto& x : to_list(v)) out.pos.push_back(std::move(x));
  }
  if (ca.dyn_kwargs) {
    Value v = eval(*ca.dyn_kwargs, scope);
    if (!v.is_dict()) type_error("argument after ** must be a mapping, not " + std::string(v.type_name()));
    for (const auto& kv : v.dict_obj().items) {
      if (!kv.first.is_str()) type_error("keywords must be strings");
      for (const auto& existing : out.kw)
        if (existing.first == kv.first.str()) type_error("got multiple values for keyword argument " + py::repr(kv.first.str()));
      out.kw.emplace_back(kv.first.str(), kv.second);
    }
  }
}

Value Interp::eval_inner(const Expr& e, const ScopeP& scope) {
  switch (e.kind) {
    case ExprKind::kConst:
      return e.value;
    case ExprKind::kName:
      if (fold_mode_) impossible();
      return lookup(e.name, scope);
    case ExprKind::kGetattr:
      return getattr(eval(*e.a, scope), e.name);
    case ExprKind::kGetitem: {
      Value obj = eval(*e.a, scope);
      Value key = eval(*e.b, scope);
      return getitem(obj, key);
    }
    case ExprKind::kSlice: {
      Value obj = eval(*e.a, scope);
      Value start = e.b ? eval(*e.b, scope) : Value::none();
      Value stop = e.c ? eval(*e.c, scope) : Value::none();
      Value stepv = e.d ? eval(*e.d, scope) : Value::none();
      if (!fold_mode_) return slice(obj, start, stop, stepv);
      // Compile-time evaluation slices through the sandbox's getitem, which turns TypeError into Undefined.
      try {
        return slice(obj, start, stop, stepv);
      } catch (const Error& err) {
        if (err.kind() != ErrorKind::kType) throw;
        auto u = std::make_shared<UndefObj>();
        u->obj_desc = object_type_repr(obj);
        u->name = "slice(" + start.repr() + ", " + stop.repr() + ", " + stepv.repr() + ")";
        u->element = true;
        return Value::undefined(std::move(u));
      }
    }
    case ExprKind::kCall: {
      if (fold_mode_) impossible();  // the sandbox never calls at compile time
      Value fn = eval(*e.a, scope);
      Args args;
      eval_args(e.call, scope, args);
      return call(fn, args);
    }
    case ExprKind::kFilter: {
      if (fold_mode_) {
        static const std::unordered_set<std::string> kContextFilters = {"map",        "select",     "reject",
                                                                        "selectattr", "rejectattr", "random"};
        if (!e.a || kContextFilters.count(e.name) || !is_known_filter(e.name) || e.call.dyn_args || e.call.dyn_kwargs)
          impossible();
      }
      Value v = e.a ? eval(*e.a, scope) : filter_block_value_;
      Args args;
      eval_args(e.call, scope, args);
      return apply_filter(e.name, v, args, e.line);
    }
    case ExprKind::kTest: {
      if (fold_mode_ && (!is_known_test(e.name) || e.call.dyn_args || e.call.dyn_kwargs)) impossible();
      Value v = eval(*e.a, scope);
      Args args;
      eval_args(e.call, scope, args);
      return Value::boolean(apply_test(e.name, v, args, e.line));
    }
    case ExprKind::kNeg:
    case ExprKind::kPos: {
      Value v = eval(*e.a, scope);
      if (v.is_undefined()) v.fail_undefined();
      bool neg = e.kind == ExprKind::kNeg;
      if (v.is_float()) return Value::number(neg ? -v.get_float() : v.get_float());
      if (v.is_integral()) {
        if (neg && v.get_int() == INT64_MIN) value_error("integer overflow");
        return Value::integer(neg ? -v.get_int() : v.get_int());
      }
      type_error(std::string("bad operand type for unary ") + (neg ? "-" : "+") + ": " + py::repr(v.type_name()));
    }
    case ExprKind::kNot:
      return Value::boolean(!eval(*e.a, scope).truthy());
    case ExprKind::kAnd: {
      Value l = eval(*e.a, scope);
      if (!l.truthy()) return l;
      return eval(*e.b, scope);
    }
    case ExprKind::kOr: {
      Value l = eval(*e.a, scope);
      if (l.truthy()) return l;
      return eval(*e.b, scope);
    }
    case ExprKind::kBinary: {
      Value l = eval(*e.a, scope);
      Value r = eval(*e.b, scope);
      return binary(e.op, l, r);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const auto& i : e.items) {
        Value v = eval(*i, scope);
        if (v.is_str()) {
          out += v.str();
        } else {
          out += v.to_str();
        }
      }
      return make_str(std::move(out));
    }
    case ExprKind::kCompare: {
      Value l = eval(*e.items[0], scope);
      for (size_t i = 0; i < e.cmp_ops.size(); ++i) {
        Value r = eval(*e.items[i + 1], scope);
        if (!compare(e.cmp_ops[i], l, r)) return Value::boolean(false);
        l = std::move(r);
      }
      return Value::boolean(true);
    }
    case ExprKind::kCondExpr:
      if (eval(*e.a, scope).truthy()) return eval(*e.b, scope);
      if (e.c) return eval(*e.c, scope);
      if (fold_mode_) impossible();
      return Value::undefined_hint("the inline if-expression on line " + std::to_string(e.line) +
                                   " evaluated to false and no else section was defined.");
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      items.reserve(e.items.size());
      for (const auto& i : e.items) items.push_back(eval(*i, scope));
      return make_list(std::move(items), e.kind == ExprKind::kTuple ? ListKind::kTuple : ListKind::kList);
    }
    case ExprKind::kDict: {
      auto d = std::make_shared<DictObj>();
      uint32_t depth = 0;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = eval(*e.items[i], scope);
        Value v = eval(*e.items[i + 1], scope);
        if (!hashable(k)) type_error("unhashable type: " + py::repr(k.type_name()));
        depth = std::max({depth, nest_depth(k), nest_depth(v)});
        d->set(k, std::move(v));
      }
      check_nest_depth(depth + 1);
      d->depth = depth + 1;
      charge_bytes(d->items.size() * 2 * sizeof(Value));
      return Value::dict(std::move(d));
    }
  }
  return Value();
}

// ------------------------------------------------------------------------------------------------
static void overflow() { value_error("integer overflow (the result does not fit in 64 bits)"); }

[[noreturn]] static void unsupported(const char* op, const Value& a, const Value& b) {
  type_error(std::string("unsupported operand type(s) for ") + op + ": " + py::repr(a.type_name()) + " and " +
             py::repr(b.type_name()));
}

// CPython's float divmod, so // and % on floats round exactly like Python.
static void float_divmod(double vx, double wx, double& floordiv, double& mod) {
  if (wx == 0.0) throw Error(ErrorKind::kValue, "float divmod()");
  mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) {
      mod += wx;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, wx);
  }
  if (div != 0.0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, vx / wx);
  }
}

static Value repeat_seq(Interp& in, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_str()) {
    const std::string& s = seq.str();
    if (n > 0 && s.size() > 0 && static_cast<uint64_t>(n) * s.size() > (1ull << 34)) overflow();
    in.charge_bytes(s.size() * static_cast<size_t>(n));
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value::string(std::move(out), seq.is_markup());
  }
  const auto& items = seq.items();
  if (n > 0 && items.size() > 0 && static_cast<uint64_t>(n) * items.size() > (1ull << 30)) overflow();
  in.charge_bytes(items.size() * static_cast<size_t>(n) * sizeof(Value));
  std::vector<Value> out;
  out.reserve(items.size() * static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), items.begin(), items.end());
  return in.make_list(std::move(out), seq.list_obj().kind == ListKind::kTuple ? ListKind::kTuple : ListKind::kList);
}

Value Interp::binary(BinOp op, const Value& a, const Value& b) {
  // str.__mod__ accepts any right operand (Undefined included) before Undefined gets a say.
  if (op == BinOp::kMod && a.is_str()) return make_str(percent_format(*this, a.str(), b), a.is_markup());
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  int64_t r = 0;
  switch (op) {
    case BinOp::kAdd:
      if (ints) {
        if (__builtin_add_overflow(a.get_int(), b.get_int(), &r)) overflow();
        return Value::integer(r);
      }
      if (nums) return Value::number(a.to_double() + b.to_double());
      if (a.is_str() && b.is_str()) {
        if (a.is_markup() || b.is_markup()) {
          std::string l = a.is_markup() ? a.str() : py::escape_html(a.str());
          std::string rr = b.is_markup() ? b.str() : py::escape_html(b.str());
          return make_str(l + rr, true);
        }
        std::string s;
        s.reserve(a.str().size() + b.str().size());
        s += a.str();
        s += b.str();
        return make_str(std::move(s));
      }
      if (a.is_list() && b.is_list()) {
        ListKind ka = a.list_obj().kind, kb = b.list_obj().kind;
        bool ok = (ka == ListKind::kList && kb == ListKind::kList) || (ka == ListKind::kTuple && kb == ListKind::kTuple);
        if (ok) {
          std::vector<Value> out;
          out.reserve(a.items().size() + b.items().size());
          out.insert(out.end(), a.items().begin(), a.items().end());
          out.insert(out.end(), b.items().begin(), b.items().end());
          return make_list(std::move(out), ka);
        }
        if (ka == ListKind::kList || ka == ListKind::kTuple)
          type_error("can only concatenate " + std::string(a.type_name()) + " (not \"" + b.type_name() + "\") to " +
                     a.type_name());
      }
      if (a.is_str() && !b.is_str()) type_error("can only concatenate str (not \"" + std::string(b.type_name()) + "\") to str");
      unsupported("+", a, b);
    case BinOp::kSub:
      if (ints) {
        if (__builtin_sub_overflow(a.get_int(), b.get_int(), &r)) overflow();
        return Value::integer(r);
      }
      if (nums) return Value::number(a.to_double() - b.to_double());
      unsupported("-", a, b);
    case BinOp::kMul:
      if (ints) {
        if (__builtin_mul_overflow(a.get_int(), b.get_int(), &r)) overflow();
        return Value::integer(r);
      }
      if (nums) return Value::number(a.to_double() * b.to_double());
      if ((a.is_str() || a.is_list()) && b.is_integral() &&
          !(a.is_list() && !(a.list_obj().kind == ListKind::kList || a.list_obj().kind == ListKind::kTuple)))
        return repeat_seq(*this, a, b.get_int());
      if ((b.is_str() || b.is_list()) && a.is_integral() &&
          !(b.is_list() && !(b.list_obj().kind == ListKind::kList || b.list_obj().kind == ListKind::kTuple)))
        return repeat_seq(*this, b, a.get_int());
      if ((a.is_str() || a.is_list()) && b.is_number())
        type_error("can't multiply sequence by non-int of type " + py::repr(b.type_name()));
      unsupported("*", a, b);
    case BinOp::kDiv:
      if (nums) {
        double y = b.to_double();
        if (y == 0.0) throw Error(ErrorKind::kValue, "division by zero");
        return Value::number(a.to_double() / y);
      }
      unsupported("/", a, b);
    case BinOp::kFloorDiv:
      if (ints) {
        int64_t x = a.get_int(), y = b.get_int();
        if (y == 0) throw Error(ErrorKind::kValue, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) overflow();
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value::integer(q);
      }
      if (nums) {
        if (b.to_double() == 0.0) throw Error(ErrorKind::kValue, "float floor division by zero");
        double fd, m;
        float_divmod(a.to_double(), b.to_double(), fd, m);
        return Value::number(fd);
      }
      unsupported("//", a, b);
    case BinOp::kMod:
      if (ints) {
        int64_t x = a.get_int(), y = b.get_int();
        if (y == 0) throw Error(ErrorKind::kValue, "integer division or modulo by zero");
        if (y == -1) return Value::integer(0);
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::integer(m);
      }
      if (nums) {
        if (b.to_double() == 0.0) throw Error(ErrorKind::kValue, "float modulo");
        double fd, m;
        float_divmod(a.to_double(), b.to_double(), fd, m);
        return Value::number(m);
      }
      if (a.is_str()) return make_str(percent_format(*this, a.str(), b), a.is_markup());
      unsupported("%", a, b);
    case BinOp::kPow:
      if (ints) {
        int64_t x = a.get_int(), y = b.get_int();
        if (y < 0) {
          if (x == 0) throw Error(ErrorKind::kValue, "0.0 cannot be raised to a negative power");
          return Value::number(std::pow(static_cast<double>(x), static_cast<double>(y)));
        }
        int64_t acc = 1, base = x;
        while (y > 0) {
          if (y & 1) {
            if (__builtin_mul_overflow(acc, base, &acc)) overflow();
          }
          y >>= 1;
          if (y > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
        }
        return Value::integer(acc);
      }
      if (nums) {
        double x = a.to_double(), y = b.to_double();
        if (x == 0.0 && y < 0) throw Error(ErrorKind::kValue, "0.0 cannot be raised to a negative power");
        if (x < 0 && y != std::floor(y)) value_error("a negative number raised to a fractional power gives a complex number");
        double res = std::pow(x, y);
        if (std::isinf(res) && std::isfinite(x) && std::isfinite(y))
          throw Error(ErrorKind::kValue, "(34, 'Numerical result out of range')");
        return Value::number(res);
      }
      unsupported("** or pow()", a, b);
  }
  return Value();
}

bool Interp::compare(CmpOp op, const Value& a, const Value& b) {
  switch (op) {
    case CmpOp::kEq:
      return py_eq(a, b);
    case CmpOp::kNe:
      return !py_eq(a, b);
    case CmpOp::kLt:
      return py_lt(a, b);
    case CmpOp::kGt:
      return py_lt(b, a);
    case CmpOp::kLe:
      return py_lt(a, b) || py_eq(a, b);
    case CmpOp::kGe:
      return py_lt(b, a) || py_eq(a, b);
    case CmpOp::kIn:
    case CmpOp::kNotIn: {
      bool found = false;
      if (b.is_str()) {
        if (!a.is_str()) type_error("'in <string>' requires string as left operand, not " + std::string(a.type_name()));
        found = py::find_bytes(b.str(), a.str()) != std::string::npos;
      } else if (b.is_dict()) {
        if (!hashable(a)) type_error("unhashable type: " + py::repr(a.type_name()));
        found = b.dict_obj().find(a) != nullptr;
      } else if (b.is_list()) {
        for (const auto& x : b.items()) {
          step();
          if (py_eq(x, a)) {
            found = true;
            break;
          }
        }
      } else if (b.is_undefined()) {
        found = false;
      } else if (b.is_iterator()) {
        Value x;
        while (b.obj().next(*this, x)) {
          step();
          if (py_eq(x, a)) {
            found = true;
            break;
          }
        }
      } else {
        type_error("argument of type " + py::repr(b.type_name()) + " is not iterable");
      }
      return op == CmpOp::kIn ? found : !found;
    }
  }
  return false;
}

Value Interp::apply_filter(const std::string& name, const Value& v, Args& args, int line) {
  step();
  charge_containers(v, args);
  Value out;
  if (!call_filter(*this, name, v, args, out)) {
    // jinja2 stands in a stub taking only positional arguments for a filter missing at run time.
    if (!args.kw.empty()) type_error("got an unexpected keyword argument " + py::repr(args.kw[0].first));
    throw Error(ErrorKind::kRuntime, "No filter named " + py::repr(name) + " found.", line);
  }
  return out;
}

bool Interp::apply_test(const std::string& name, const Value& v, Args& args, int line) {
  step();
  charge_containers(v, args);
  bool out = false;
  if (!call_test(*this, name, v, args, out)) {
    if (!args.kw.empty()) type_error("got an unexpected keyword argument " + py::repr(args.kw[0].first));
    throw Error(ErrorKind::kRuntime, "No test named " + py::repr(name) + " found.", line);
  }
  return out;
}

}  // namespace pg::jinja
