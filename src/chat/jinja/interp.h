// Tree-walking evaluator with jinja2's runtime semantics (sandboxed, immutable builtins) and
// resource limits. One Interp renders one template once; it is not shared between threads.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "chat/jinja/ast.h"
#include "chat/jinja/jinja.h"
#include "chat/jinja/value.h"

namespace pg::jinja {

// Variables of one frame. Names are views of strings that outlive the render (the template's
// syntax tree, the caller's variables, string literals), so setting a variable never allocates.
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string_view, Value>> vars;
  Value* find_local(std::string_view name) {
    for (auto& kv : vars)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
  void set(std::string_view name, Value v) {
    if (Value* p = find_local(name)) {
      *p = std::move(v);
      return;
    }
    vars.emplace_back(name, std::move(v));
  }
};
using ScopeP = std::shared_ptr<Scope>;

// A built-in callable (global function, bound method).
class BuiltinFn final : public Object {
 public:
  using Fn = std::function<Value(Interp&, Args&)>;
  BuiltinFn(std::string name, Fn fn, std::string owner = "")
      : name_(std::move(name)), owner_(std::move(owner)), fn_(std::move(fn)) {}
  const char* type_name() const override { return "builtin_function_or_method"; }
  std::string repr() const override;
  bool callable() const override { return true; }
  Value call(Interp& in, Args& args) override { return fn_(in, args); }

 private:
  std::string name_, owner_;
  Fn fn_;
};

class NamespaceObj final : public Object {
 public:
  const char* type_name() const override { return "Namespace"; }
  std::string repr() const override;
  bool get_attr(Interp& in, const std::string& name, Value& out) override;
  bool is_namespace() const override { return true; }
  DictObj attrs;
};

// Lazy iterator over a precomputed or computed sequence; `pull` yields the next item.
class GeneratorObj final : public Object {
 public:
  using Pull = std::function<bool(Interp&, Value&)>;
  GeneratorObj(const char* type, Pull pull) : type_(type), pull_(std::move(pull)) {}
  const char* type_name() const override { return type_; }
  std::string repr() const override { return std::string("<") + type_ + " object>"; }
  bool is_iterator() const override { return true; }
  bool next(Interp& in, Value& out) override;

 private:
  const char* type_;
  Pull pull_;
  bool done_ = false;
};

enum class Flow { kNormal, kBreak, kContinue };

class Interp {
 public:
  Interp(const RenderOptions& opts);
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  std::string render(const Body& body, const std::vector<std::pair<std::string, Value>>& vars);

  // --- services for built-ins ------------------------------------------------------------------
  const RenderOptions& options() const { return opts_; }
  void step(int64_t n = 1);
  void charge_bytes(size_t n);
  // Memory one string value costs besides its text (control block + StrObj + allocator header), charged by make_str.
  static constexpr size_t kStrValueBytes = sizeof(StrObj) + 32;
  Value make_str(std::string s, bool markup = false);
  Value make_list(std::vector<Value> items, ListKind kind = ListKind::kList);

  Value call(const Value& fn, Args& args);
  Value binop(BinOp op, const Value& a, const Value& b) { return binary(op, a, b); }
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  // An iterator object over v (list items, dict keys, str characters); TypeError when not iterable.
  std::shared_ptr<Object> iter(const Value& v);
  std::vector<Value> to_list(const Value& v);
  // Wraps a pull function as a generator value over `source`, tracking the chain depth (a chain
  // of lazy generators recurses once per level when pulled).
  Value make_generator(const char* type, const Value& source, GeneratorObj::Pull pull);
  Value apply_filter(const std::string& name, const Value& v, Args& args, int line);
  bool apply_test(const std::string& name, const Value& v, Args& args, int line);
  void register_namespace(const std::shared_ptr<NamespaceObj>& ns) { namespaces_.push_back(ns); }

  // Macro invocation (used by MacroObj).
  Value call_macro(const MacroDef& def, const ScopeP& closure, Args& args, const Value& caller_obj);
  // Renders a recursive loop again for loop(iterable).
  Value recurse_loop(const Stmt& loop, const ScopeP& scope, const Value& iterable, int depth0);

 private:
  Flow exec(const Body& body, const ScopeP& scope);
  Flow exec_stmt(const Stmt& s, const ScopeP& scope);
  Flow exec_for(const Stmt& s, const ScopeP& scope, const Value& iterable, int depth0);
  Value eval(const Expr& e, const ScopeP& scope);
  Value eval_inner(const Expr& e, const ScopeP& scope);
  void eval_args(const CallArgs& ca, const ScopeP& scope, Args& out);
  Value lookup(const std::string& name, const ScopeP& scope);
  void assign(const Target& t, Value v, const ScopeP& scope);
  Value binary(BinOp op, const Value& a, const Value& b);
  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
  bool compare(CmpOp op, const Value& a, const Value& b);
  Value capture(const Body& body, const ScopeP& scope);
  void emit(const std::string& s);
  ScopeP new_scope(const ScopeP& parent);
  ScopeP capture_scope(const ScopeP& s);

  RenderOptions opts_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  uint64_t bytes_ = 0;
  int call_depth_ = 0;
  Value filter_block_value_;
  bool fold_mode_ = false;  // evaluating like jinja2's compile-time Node.as_const  // body text of the {% filter %} / {% set %}
                            // block being filtered
  ScopeP globals_, root_;
  std::vector<std::weak_ptr<Scope>> captured_;
  std::vector<std::weak_ptr<NamespaceObj>> namespaces_;

  friend class MacroObj;
  friend class LoopObj;
};

// Nesting depth of containers / generator chains, capped so destruction and printing stay shallow.
uint32_t nest_depth(const Value& v);
void check_nest_depth(uint32_t d);

// Built-ins (builtins.cpp).
bool call_filter(Interp& in, const std::string& name, const Value& v, Args& args, Value& out);
bool call_test(Interp& in, const std::string& name, const Value& v, Args& args, bool& out);
// str/list/dict methods: a bound method value, or false when obj has no such attribute.
bool get_method(Interp& in, const Value& obj, const std::string& name, Value& out);
void install_globals(Interp& in, Scope& globals);
std::string json_dumps(Interp& in, const Value& v, bool ensure_ascii, const Value& indent, const std::string& item_sep,
                       const std::string& key_sep, bool sort_keys);
std::string percent_format(Interp& in, const std::string& fmt, const Value& args);
Value from_json(Interp& in, const nlohmann::ordered_json& j, int depth = 0);

}  // namespace pg::jinja
