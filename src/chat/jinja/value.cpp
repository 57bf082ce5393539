#include "chat/jinja/value.h"

#include <algorithm>
#include <cmath>

#include "chat/jinja/pystr.h"
#include "chat/jinja/work.h"

namespace pg::jinja {

const char* error_kind_name(ErrorKind k) {
  switch (k) {
    case ErrorKind::kSyntax:
      return "TemplateSyntaxError";
    case ErrorKind::kUndefined:
      return "UndefinedError";
    case ErrorKind::kType:
      return "TypeError";
    case ErrorKind::kValue:
      return "ValueError";
    case ErrorKind::kSecurity:
      return "SecurityError";
    case ErrorKind::kRaised:
      return "TemplateError";
    case ErrorKind::kRuntime:
      return "TemplateRuntimeError";
    case ErrorKind::kLimit:
      return "SandboxLimitError";
  }
  return "Error";
}

std::string Error::format(ErrorKind kind, const std::string& message, int line) {
  // A template's own raise_exception() message is shown as written: it is meant for the user.
  if (kind == ErrorKind::kRaised) return message;
  std::string s = std::string(error_kind_name(kind)) + ": " + message;
  if (line > 0) s += " (template line " + std::to_string(line) + ")";
  return s;
}

Error::Error(ErrorKind kind, const std::string& message, int line)
    : pg::Error(format(kind, message, line)), kind_(kind), message_(message), line_(line) {}

void throw_error(ErrorKind kind, const std::string& message) { throw Error(kind, message); }
void type_error(const std::string& msg) { throw Error(ErrorKind::kType, msg); }

// ------------------------------------------------------------------------------------------------
std::string UndefObj::message() const {
  if (!hint.empty()) return hint;
  if (obj_desc.empty()) return py::repr(name) + " is undefined";
  if (element) return obj_desc + " has no element " + name;
  return py::repr(obj_desc) + " has no attribute " + py::repr(name);
}

std::string Object::repr() const { return std::string("<") + type_name() + " object>"; }
Value Object::call(Interp&, Args&) { type_error(py::repr(type_name()).append(" object is not callable")); }
bool Object::get_attr(Interp&, const std::string&, Value&) { return false; }
bool Object::next(Interp&, Value&) { return false; }

// ------------------------------------------------------------------------------------------------
const Value* DictObj::find(const Value& key) const {
  if (key.is_str()) return find_str(key.str());
  // Lookups are linear (see value.h): charged per entry, so a loop of lookups in a 100k-entry dict is bounded by
  // the step cap like any other loop.
  charge_work(items.size() * kWorkPerItem);
  for (const auto& kv : items)
    if (py_eq(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value* DictObj::find_str(std::string_view key) const {
  size_t scanned = 0;
  for (const auto& kv : items) {
    ++scanned;
    if (kv.first.is_str() && kv.first.str() == key) {
      charge_work(scanned * kWorkPerItem + key.size());
      return &kv.second;
    }
  }
  charge_work(scanned * kWorkPerItem);
  return nullptr;
}

Value* DictObj::find(const Value& key) { return const_cast<Value*>(static_cast<const DictObj*>(this)->find(key)); }

void DictObj::set(const Value& key, Value v) {
  if (Value* p = find(key)) {
    *p = std::move(v);
    return;
  }
  items.emplace_back(key, std::move(v));
}

bool DictObj::erase(const Value& key, Value* out) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (py_eq(items[i].first, key)) {
      if (out) *out = items[i].second;
      items.erase(items.begin() + static_cast<std::ptrdiff_t>(i));
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------------------------------------------
Value Value::string(std::string s, bool markup) {
  Value v(Kind::kStr);
  v.markup_ = markup;
  v.heap_ = std::make_shared<StrObj>(std::move(s));
  return v;
}

Value Value::list(std::vector<Value> items, ListKind kind) {
  Value v(Kind::kList);
  auto l = std::make_shared<ListObj>();
  l->items = std::move(items);
  l->kind = kind;
  v.heap_ = std::move(l);
  return v;
}

Value Value::dict(std::shared_ptr<DictObj> d) {
  Value v(Kind::kDict);
  v.heap_ = std::move(d);
  return v;
}

Value Value::dict() { return dict(std::make_shared<DictObj>()); }

Value Value::object(std::shared_ptr<Object> o) {
  Value v(Kind::kObject);
  v.heap_ = std::move(o);
  return v;
}

Value Value::undefined(std::shared_ptr<UndefObj> u) {
  Value v(Kind::kUndefined);
  v.heap_ = std::move(u);
  return v;
}

Value Value::undefined_name(const std::string& name) {
  auto u = std::make_shared<UndefObj>();
  u->name = name;
  return undefined(std::move(u));
}

Value Value::undefined_hint(const std::string& hint, ErrorKind exc) {
  auto u = std::make_shared<UndefObj>();
  u->hint = hint;
  u->exc = exc;
  return undefined(std::move(u));
}

Value Value::undefined_attr(const Value& obj, const Value& key) {
  auto u = std::make_shared<UndefObj>();
  u->obj_desc = object_type_repr(obj);
  if (key.is_str()) {
    u->name = key.str();
  } else {
    u->name = key.repr();
    u->element = true;
  }
  return undefined(std::move(u));
}

int64_t Value::str_len() const {
  const StrObj& so = str_obj();
  int64_t n = so.cp_count.load(std::memory_order_relaxed);
  if (n < 0) {
    n = static_cast<int64_t>(py::cp_len(so.s));
    so.cp_count.store(n, std::memory_order_relaxed);
  }
  return n;
}

void Value::fail_undefined() const {
  const UndefObj* u = undef();
  if (!u) throw Error(ErrorKind::kUndefined, "value is undefined");
  throw Error(u->exc, u->message());
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kStr:
      return !str().empty();
    case Kind::kList:
      return !items().empty();
    case Kind::kDict:
      return !dict_obj().items.empty();
    case Kind::kObject:
      return true;
  }
  return false;
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kStr:
      return markup_ ? "Markup" : "str";
    case Kind::kList:
      switch (list_obj().kind) {
        case ListKind::kList:
          return "list";
        case ListKind::kTuple:
          return "tuple";
        case ListKind::kDictItems:
          return "dict_items";
        case ListKind::kDictKeys:
          return "dict_keys";
        case ListKind::kDictValues:
          return "dict_values";
        case ListKind::kRange:
          return "range";
      }
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kObject:
      return obj().type_name();
  }
  return "object";
}

std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.is_undefined()) return "jinja2.runtime.Undefined object";
  if (v.is_markup()) return "markupsafe.Markup object";
  return std::string(v.type_name()) + " object";
}

std::string Value::to_str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kStr:
      return str();
    default:
      return repr();
  }
}

namespace {

// Containers being printed on this thread: like CPython's Py_ReprEnter, a container met again
// inside itself prints as [...] / {...}; the depth cap bounds the C++ recursion.
thread_local std::vector<const void*> g_repr_stack;

struct ReprGuard {
  bool recursive = false;
  explicit ReprGuard(const void* p) {
    for (const void* q : g_repr_stack)
      if (q == p) recursive = true;
    if (!recursive) {
      if (g_repr_stack.size() > 200) throw Error(ErrorKind::kLimit, "value nested too deeply to print");
      g_repr_stack.push_back(p);
    }
  }
  ~ReprGuard() {
    if (!recursive) g_repr_stack.pop_back();
  }
};

void repr_into(const Value& v, std::string& out);

void repr_seq(const std::vector<Value>& items, std::string& out, char open, char close, bool tuple) {
  out.push_back(open);
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    repr_into(items[i], out);
  }
  if (tuple && items.size() == 1) out.push_back(',');
  out.push_back(close);
}

void repr_dict_into(const DictObj& d, std::string& out) {
  ReprGuard g(&d);
  if (g.recursive) {
    out += "{...}";
    return;
  }
  out.push_back('{');
  bool first = true;
  for (const auto& kv : d.items) {
    if (!first) out += ", ";
    first = false;
    repr_into(kv.first, out);
    out += ": ";
    repr_into(kv.second, out);
  }
  out.push_back('}');
}

void repr_into(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      out += "Undefined";
      return;
    case Value::Kind::kNone:
      out += "None";
      return;
    case Value::Kind::kBool:
      out += v.get_bool() ? "True" : "False";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.get_int());
      return;
    case Value::Kind::kFloat:
      out += py::float_repr(v.get_float());
      return;
    case Value::Kind::kStr:
      if (v.is_markup()) {
        out += "Markup(" + py::repr(v.str()) + ")";
      } else {
        out += py::repr(v.str());
      }
      return;
    case Value::Kind::kList: {
      const ListObj& l = v.list_obj();
      ReprGuard g(&l);
      if (g.recursive) {
        out += l.kind == ListKind::kTuple ? "(...)" : "[...]";
        return;
      }
      switch (l.kind) {
        case ListKind::kList:
          repr_seq(l.items, out, '[', ']', false);
          return;
        case ListKind::kTuple:
          repr_seq(l.items, out, '(', ')', true);
          return;
        case ListKind::kDictItems:
          out += "dict_items(";
          repr_seq(l.items, out, '[', ']', false);
          out += ")";
          return;
        case ListKind::kDictKeys:
          out += "dict_keys(";
          repr_seq(l.items, out, '[', ']', false);
          out += ")";
          return;
        case ListKind::kDictValues:
          out += "dict_values(";
          repr_seq(l.items, out, '[', ']', false);
          out += ")";
          return;
        case ListKind::kRange:
          out += "range(" + std::to_string(l.r_start) + ", " + std::to_string(l.r_stop);
          if (l.r_step != 1) out += ", " + std::to_string(l.r_step);
          out += ")";
          return;
      }
      return;
    }
    case Value::Kind::kDict:
      repr_dict_into(v.dict_obj(), out);
      return;
    case Value::Kind::kObject:
      out += v.obj().repr();
      return;
  }
}

}  // namespace

std::string repr_dict(const DictObj& d) {
  std::string out;
  repr_dict_into(d, out);
  return out;
}

std::string Value::repr() const {
  std::string out;
  repr_into(*this, out);
  return out;
}

bool Value::same_as(const Value& o) const {
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return i_ == o.i_;
    // CPython caches small ints, so `5 is 5` holds there and nowhere else.
    case Kind::kInt:
      return i_ == o.i_ && i_ >= -5 && i_ <= 256;
    case Kind::kFloat:
      return false;
    case Kind::kUndefined:
      return heap_ == o.heap_ && heap_ != nullptr;
    default:
      return heap_ == o.heap_;
  }
}

// ------------------------------------------------------------------------------------------------
static bool num_eq(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float()) return a.get_int() == b.get_int();
  if (a.is_float() && b.is_float()) return a.get_float() == b.get_float();
  const Value& f = a.is_float() ? a : b;
  const Value& i = a.is_float() ? b : a;
  double d = f.get_float();
  if (!std::isfinite(d) || d != std::floor(d)) return false;
  if (d < -9.3e18 || d > 9.3e18) return false;
  return static_cast<int64_t>(d) == i.get_int() && static_cast<double>(i.get_int()) == d;
}

static int num_cmp(const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float()) return a.get_int() < b.get_int() ? -1 : a.get_int() > b.get_int() ? 1 : 0;
  long double x = a.is_float() ? a.get_float() : static_cast<long double>(a.get_int());
  long double y = b.is_float() ? b.get_float() : static_cast<long double>(b.get_int());
  if (x < y) return -1;
  if (x > y) return 1;
  return 0;  // NaN compares "equal" here but py_lt only asks for <, which is false for NaN
}

static bool seq_kind_compatible(const Value& a, const Value& b) {
  ListKind ka = a.list_obj().kind, kb = b.list_obj().kind;
  return ka == kb;
}

bool py_eq(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return num_eq(a, b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kStr:
      if (a.heap() == b.heap()) return true;
      if (a.str().size() != b.str().size()) return false;
      charge_work(a.str().size());  // memcmp of two long strings, possibly once per item of a long list
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (!seq_kind_compatible(a, b)) return false;
      const auto& x = a.items();
      const auto& y = b.items();
      if (&x == &y) return true;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        charge_work(kWorkPerItem);
        if (!py_eq(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.dict_obj();
      const auto& y = b.dict_obj();
      if (&x == &y) return true;
      if (x.items.size() != y.items.size()) return false;
      for (const auto& kv : x.items) {
        const Value* o = y.find(kv.first);
        if (!o || !py_eq(kv.second, *o)) return false;
      }
      return true;
    }
    case Value::Kind::kObject:
      return a.heap() == b.heap();
    default:
      return false;
  }
}

bool py_lt(const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() && std::isnan(a.get_float())) return false;
    if (b.is_float() && std::isnan(b.get_float())) return false;
    return num_cmp(a, b) < 0;
  }
  if (a.is_str() && b.is_str()) {
    charge_work(std::min(a.str().size(), b.str().size()));
    return a.str() < b.str();
  }
  if (a.is_list() && b.is_list() && seq_kind_compatible(a, b) &&
      (a.list_obj().kind == ListKind::kList || a.list_obj().kind == ListKind::kTuple)) {
    const auto& x = a.items();
    const auto& y = b.items();
    size_t n = std::min(x.size(), y.size());
    for (size_t i = 0; i < n; ++i) {
      charge_work(kWorkPerItem);
      if (!py_eq(x[i], y[i])) return py_lt(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  type_error(std::string("'<' not supported between instances of '") + a.type_name() + "' and '" + b.type_name() + "'");
}

bool hashable(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kList:
      if (v.list_obj().kind == ListKind::kTuple) {
        for (const auto& x : v.items())
          if (!hashable(x)) return false;
        return true;
      }
      return v.list_obj().kind == ListKind::kRange;
    case Value::Kind::kDict:
      return false;
    default:
      return true;
  }
}

}  // namespace pg::jinja
