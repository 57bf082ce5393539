// Values of the Jinja engine, with Python's data model: None, bool, int, float, str (UTF-8, may be
// "Markup"), list/tuple (shared and mutable like Python lists), dict (insertion ordered), jinja2's
// Undefined, and objects (functions, macros, namespaces, loop contexts, lazy iterators).
// Heap payloads are reference counted so passing values around is cheap and aliasing behaves as
// in Python (two names for one list see the same pop()).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "chat/jinja/error.h"

namespace pg::jinja {

class Interp;
class Value;

struct HeapObj : std::enable_shared_from_this<HeapObj> {
  virtual ~HeapObj() = default;
  // Nesting depth of containers and generator chains, kept small so that printing and
  // destruction (both recursive) cannot exhaust the stack.
  uint32_t depth = 0;
};

struct StrObj final : HeapObj {
  explicit StrObj(std::string v) : s(std::move(v)) {}
  std::string s;
  // Cached code point count. Atomic because string constants of a parsed template are shared by
  // concurrent renders.
  mutable std::atomic<int64_t> cp_count{-1};
};

// What a sequence prints as; all behave as Python lists or tuples otherwise.
enum class ListKind : uint8_t { kList, kTuple, kDictItems, kDictKeys, kDictValues, kRange };

struct ListObj final : HeapObj {
  std::vector<Value> items;
  ListKind kind = ListKind::kList;
  bool group = false;                           // groupby's (grouper, list) namedtuple: also has .grouper and .list
  int64_t r_start = 0, r_stop = 0, r_step = 1;  // kRange only, for repr
};

struct DictObj final : HeapObj {
  // Insertion ordered; lookups are linear, which is fine for the small dicts of chat messages.
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find_str(std::string_view key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value v);
  bool erase(const Value& key, Value* out);
};

// jinja2.Undefined: the message is built only when an operation on it fails.
struct UndefObj final : HeapObj {
  std::string hint;      // explicit message (wins when set)
  std::string obj_desc;  // object_type_repr of the object that lacked the attribute, "" if none
  std::string name;      // attribute / variable name (repr'd element key for kElement)
  bool element = false;  // missing item with a non-string key
  ErrorKind exc = ErrorKind::kUndefined;
  std::string message() const;
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

// Base of every non-data value. Defaults describe a plain Python object without attributes.
class Object : public HeapObj {
 public:
  virtual const char* type_name() const = 0;
  virtual std::string repr() const;
  virtual bool callable() const { return false; }
  virtual Value call(Interp& in, Args& args);
  // Attribute lookup; returns false when there is no such attribute.
  virtual bool get_attr(Interp& in, const std::string& name, Value& out);
  // Lazy iterators (generators): next() yields items until it returns false.
  virtual bool is_iterator() const { return false; }
  virtual bool next(Interp& in, Value& out);
  // Namespace objects accept attribute assignment.
  virtual bool is_namespace() const { return false; }
};

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kObject };

  Value() = default;  // a bare Undefined
  static Value none() { return Value(Kind::kNone); }
  static Value boolean(bool b) {
    Value v(Kind::kBool);
    v.i_ = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(Kind::kInt);
    v.i_ = i;
    return v;
  }
  static Value number(double f) {
    Value v(Kind::kFloat);
    v.f_ = f;
    return v;
  }
  static Value string(std::string s, bool markup = false);
  static Value list(std::vector<Value> items, ListKind kind = ListKind::kList);
  static Value tuple(std::vector<Value> items) { return list(std::move(items), ListKind::kTuple); }
  static Value dict(std::shared_ptr<DictObj> d);
  static Value dict();
  static Value object(std::shared_ptr<Object> o);
  static Value undefined(std::shared_ptr<UndefObj> u);
  static Value undefined_name(const std::string& name);
  static Value undefined_hint(const std::string& hint, ErrorKind exc = ErrorKind::kUndefined);
  // Missing attribute/item of obj; key is the name (string) or element key.
  static Value undefined_attr(const Value& obj, const Value& key);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_integral() const { return kind_ == Kind::kInt || kind_ == Kind::kBool; }  // Python int incl. bool
  bool is_str() const { return kind_ == Kind::kStr; }
  bool is_markup() const { return kind_ == Kind::kStr && markup_; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && list_obj().kind == ListKind::kTuple; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_iterator() const { return kind_ == Kind::kObject && obj().is_iterator(); }
  bool is_callable() const { return kind_ == Kind::kObject && obj().callable(); }

  bool get_bool() const { return i_ != 0; }
  int64_t get_int() const { return i_; }  // kInt or kBool
  double get_float() const { return f_; }
  double to_double() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const std::string& str() const { return static_cast<const StrObj&>(*heap_).s; }
  const StrObj& str_obj() const { return static_cast<const StrObj&>(*heap_); }
  int64_t str_len() const;  // code points
  ListObj& list_obj() const { return static_cast<ListObj&>(*heap_); }
  std::vector<Value>& items() const { return list_obj().items; }
  DictObj& dict_obj() const { return static_cast<DictObj&>(*heap_); }
  Object& obj() const { return static_cast<Object&>(*heap_); }
  std::shared_ptr<Object> obj_ptr() const { return std::static_pointer_cast<Object>(heap_); }
  const UndefObj* undef() const { return static_cast<const UndefObj*>(heap_.get()); }
  const HeapObj* heap() const { return heap_.get(); }

  // Python semantics.
  bool truthy() const;
  std::string to_str() const;     // str(x)
  std::string repr() const;       // repr(x)
  const char* type_name() const;  // type(x).__name__
  // `x is y` for sameas: identity for heap values, value identity for small immutables.
  bool same_as(const Value& o) const;

  // Raises the UndefinedError (or SecurityError) this Undefined stands for.
  [[noreturn]] void fail_undefined() const;

 private:
  explicit Value(Kind k) : kind_(k) {}
  Kind kind_ = Kind::kUndefined;
  bool markup_ = false;
  union {
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<HeapObj> heap_;
};

// Python == (never throws; Undefined == Undefined is true).
bool py_eq(const Value& a, const Value& b);
// Python < ; throws TypeError for unorderable types, UndefinedError for Undefined.
bool py_lt(const Value& a, const Value& b);
// repr() of a dict (namespaces print their attributes with it).
std::string repr_dict(const DictObj& d);
// object_type_repr of jinja2 ("dict object", "None").
std::string object_type_repr(const Value& v);
// Values usable as dict keys (hashable in Python).
bool hashable(const Value& v);

[[noreturn]] void type_error(const std::string& msg);

}  // namespace pg::jinja
