// jinja2's filters, tests and globals, Python's str/list/dict methods, json.dumps (as HF's tojson
// calls it), printf-style '%' formatting and str.format. Each follows the CPython / jinja2 3.1
// behaviour, including which errors are raised and which inputs are silently accepted.
#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "chat/jinja/interp.h"
#include "chat/jinja/pystr.h"
#include "chat/jinja/work.h"

namespace pg::jinja {

namespace {

[[noreturn]] void value_error(const std::string& m) { throw Error(ErrorKind::kValue, m); }
[[noreturn]] void runtime_error(const std::string& m) { throw Error(ErrorKind::kRuntime, m); }

// Binds call arguments to parameter names like a Python signature with defaults.
class Params {
 public:
  Params(Args& a, const std::string& fname, std::initializer_list<const char*> names, bool kw_ok = true)
      : fname_(fname), names_(names), vals_(names.size()) {
    if (a.pos.size() > names_.size())
      type_error(fname + "() takes at most " + std::to_string(names_.size()) + " argument" + (names_.size() == 1 ? "" : "s") +
                 " (" + std::to_string(a.pos.size()) + " given)");
    for (size_t i = 0; i < a.pos.size(); ++i) vals_[i] = &a.pos[i];
    if (!a.kw.empty() && !kw_ok) type_error(fname + "() takes no keyword arguments");
    for (auto& kv : a.kw) {
      size_t i = 0;
      for (; i < names_.size(); ++i)
        if (kv.first == names_[i]) break;
      if (i == names_.size()) type_error(fname + "() got an unexpected keyword argument " + py::repr(kv.first));
      if (vals_[i]) type_error(fname + "() got multiple values for argument " + py::repr(kv.first));
      vals_[i] = &kv.second;
    }
  }
  const Value* get(size_t i) const { return vals_[i]; }
  bool has(size_t i) const { return vals_[i] != nullptr; }
  Value get_or(size_t i, Value def) const { return vals_[i] ? *vals_[i] : std::move(def); }
  const Value& required(size_t i) const {
    if (!vals_[i]) type_error(fname_ + "() missing required argument: " + py::repr(names_[i]));
    return *vals_[i];
  }

 private:
  std::string fname_;
  std::vector<const char*> names_;
  std::vector<const Value*> vals_;
};

int64_t to_index(const Value& v, const char* what = "integer") {
  if (v.is_integral()) return v.get_int();
  // Undefined has no __index__, so this is a TypeError even for Undefined.
  type_error(py::repr(v.type_name()) + " object cannot be interpreted as an " + what);
}

// soft_str: str(x), keeping Markup.
Value soft_str(Interp& in, const Value& v) {
  if (v.is_str()) return v;
  return in.make_str(v.to_str());
}

const std::string& need_str(const Value& v, const char* what) {
  if (!v.is_str()) {
    if (v.is_undefined()) v.fail_undefined();
    type_error(std::string(what) + " must be str, not " + v.type_name());
  }
  return v.str();
}

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kStr:
      return v.str_len();
    case Value::Kind::kList:
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict_obj().items.size());
    default:
      type_error("object of type " + py::repr(v.type_name()) + " has no len()");
  }
}

Value ignore_case(Interp& in, const Value& v) {
  if (v.is_str()) return in.make_str(py::lower(v.str()));
  return v;
}

// make_attrgetter: "a.b.0" looked up with getitem semantics.
std::vector<Value> attribute_parts(const Value& attr) {
  std::vector<Value> parts;
  if (attr.is_none()) return parts;
  if (attr.is_str()) {
    for (auto& p : py::split(attr.str(), std::string_view("."), -1)) {
      if (py::str_all(p, py::is_digit)) {
        auto n = py::parse_int(p, 10);
        if (!n) value_error("invalid literal for int() with base 10: " + py::repr(p));
        parts.push_back(Value::integer(*n));
      } else {
        parts.push_back(Value::string(p));
      }
    }
    return parts;
  }
  parts.push_back(attr);
  return parts;
}

struct AttrGetter {
  explicit AttrGetter(std::vector<Value> p = {}) : parts(std::move(p)) {}
  std::vector<Value> parts;
  bool lower = false;
  Value deflt;
  bool has_default = false;
  Value operator()(Interp& in, Value item) const {
    for (const auto& p : parts) {
      item = in.getitem(item, p);
      if (has_default && item.is_undefined()) item = deflt;
    }
    if (lower) item = ignore_case(in, item);
    return item;
  }
};

// Stable merge sort using only "<" (like Python's sorted), safe with inconsistent comparisons.
void stable_sort(std::vector<std::pair<Value, Value>>& v, Interp& in) {
  size_t n = v.size();
  if (n < 2) return;
  std::vector<std::pair<Value, Value>> tmp(n);
  for (size_t width = 1; width < n; width *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * width) {
      size_t mid = std::min(lo + width, n), hi = std::min(lo + 2 * width, n);
      size_t i = lo, j = mid, k = lo;
      while (i < mid && j < hi) {
        in.step();
        if (py_lt(v[j].first, v[i].first)) {
          tmp[k++] = v[j++];
        } else {
          tmp[k++] = v[i++];
        }
      }
      while (i < mid) tmp[k++] = v[i++];
      while (j < hi) tmp[k++] = v[j++];
    }
    v.swap(tmp);
  }
}

// sorted(items, key=..., reverse=...): pairs of (key, item).
std::vector<Value> sorted_by(Interp& in, std::vector<std::pair<Value, Value>> keyed, bool reverse) {
  if (reverse) std::reverse(keyed.begin(), keyed.end());
  stable_sort(keyed, in);
  if (reverse) std::reverse(keyed.begin(), keyed.end());
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

Value make_tuple(Interp& in, std::vector<Value> items) { return in.make_list(std::move(items), ListKind::kTuple); }

Value dict_items_list(Interp& in, const Value& d, ListKind kind) {
  std::vector<Value> out;
  for (const auto& kv : d.dict_obj().items) {
    if (kind == ListKind::kDictItems) {
      out.push_back(make_tuple(in, {kv.first, kv.second}));
    } else {
      out.push_back(kind == ListKind::kDictKeys ? kv.first : kv.second);
    }
  }
  return in.make_list(std::move(out), kind);
}

Value bound(const std::string& name, const Value& self, std::function<Value(Interp&, Args&)> fn) {
  return Value::object(std::make_shared<BuiltinFn>(name, std::move(fn), self.type_name()));
}

// ------------------------------------------------------------------------------------------------
// json.dumps
void dumps_into(Interp& in, const Value& v, std::string& out, bool ensure_ascii, const std::string* indent, int level,
                const std::string& item_sep, const std::string& key_sep, bool sort_keys, std::vector<const void*>& stack) {
  in.step();
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.get_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.get_int());
      return;
    case Value::Kind::kFloat: {
      double d = v.get_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += py::float_repr(d);
      }
      return;
    }
    case Value::Kind::kStr:
      py::json_quote(out, v.str(), ensure_ascii);
      return;
    case Value::Kind::kList: {
      ListKind k = v.list_obj().kind;
      if (k != ListKind::kList && k != ListKind::kTuple)
        type_error("Object of type " + std::string(v.type_name()) + " is not JSON serializable");
      const auto& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      if (std::find(stack.begin(), stack.end(), v.heap()) != stack.end()) value_error("Circular reference detected");
      stack.push_back(v.heap());
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (indent) {
          out.push_back('\n');
          for (int l = 0; l <= level; ++l) out += *indent;
        }
        dumps_into(in, items[i], out, ensure_ascii, indent, level + 1, item_sep, key_sep, sort_keys, stack);
      }
      if (indent) {
        out.push_back('\n');
        for (int l = 0; l < level; ++l) out += *indent;
      }
      out.push_back(']');
      stack.pop_back();
      return;
    }
    case Value::Kind::kDict: {
      const auto& items = v.dict_obj().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      if (std::find(stack.begin(), stack.end(), v.heap()) != stack.end()) value_error("Circular reference detected");
      stack.push_back(v.heap());
      std::vector<std::pair<Value, Value>> entries(items.begin(), items.end());
      if (sort_keys) {
        std::vector<std::pair<Value, Value>> keyed;
        for (size_t i = 0; i < entries.size(); ++i) keyed.emplace_back(entries[i].first, Value::integer(static_cast<int64_t>(i)));
        std::vector<Value> order = sorted_by(in, std::move(keyed), false);
        std::vector<std::pair<Value, Value>> sorted;
        for (const auto& o : order) sorted.push_back(entries[static_cast<size_t>(o.get_int())]);
        entries.swap(sorted);
      }
      out.push_back('{');
      bool first = true;
      for (const auto& kv : entries) {
        std::string key;
        const Value& k = kv.first;
        if (k.is_str()) {
          key = k.str();
        } else if (k.is_float()) {
          double d = k.get_float();
          key = std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : py::float_repr(d);
        } else if (k.is_bool()) {
          key = k.get_bool() ? "true" : "false";
        } else if (k.is_int()) {
          key = std::to_string(k.get_int());
        } else if (k.is_none()) {
          key = "null";
        } else {
          type_error(std::string("keys must be str, int, float, bool or None, not ") + k.type_name());
        }
        if (!first) out += item_sep;
        first = false;
        if (indent) {
          out.push_back('\n');
          for (int l = 0; l <= level; ++l) out += *indent;
        }
        py::json_quote(out, key, ensure_ascii);
        out += key_sep;
        dumps_into(in, kv.second, out, ensure_ascii, indent, level + 1, item_sep, key_sep, sort_keys, stack);
      }
      if (indent) {
        out.push_back('\n');
        for (int l = 0; l < level; ++l) out += *indent;
      }
      out.push_back('}');
      stack.pop_back();
      return;
    }
    default:
      type_error("Object of type " + std::string(v.type_name()) + " is not JSON serializable");
  }
}

}  // namespace

std::string json_dumps(Interp& in, const Value& v, bool ensure_ascii, const Value& indent, const std::string& item_sep,
                       const std::string& key_sep, bool sort_keys) {
  std::string out;
  std::vector<const void*> stack;
  std::string ind;
  const std::string* ip = nullptr;
  if (!indent.is_none()) {
    if (indent.is_str()) {
      ind = indent.str();
    } else if (indent.is_integral()) {
      ind.assign(static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(indent.get_int(), 1 << 16))), ' ');
    } else {
      type_error("can't multiply sequence by non-int of type " + py::repr(indent.type_name()));
    }
    ip = &ind;
  }
  dumps_into(in, v, out, ensure_ascii, ip, 0, item_sep, key_sep, sort_keys, stack);
  in.charge_bytes(out.size());
  return out;
}

Value from_json(Interp& in, const nlohmann::ordered_json& j, int depth) {
  if (depth > 900) throw Error(ErrorKind::kLimit, "input JSON nested too deeply");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::number(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return in.make_str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json(in, x, depth + 1));
      return in.make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<DictObj>();
      uint32_t dd = 0;
      for (auto it = j.begin(); it != j.end(); ++it) {
        Value v = from_json(in, it.value(), depth + 1);
        dd = std::max(dd, nest_depth(v));
        d->items.emplace_back(Value::string(it.key()), std::move(v));
      }
      d->depth = dd + 1;
      in.charge_bytes(d->items.size() * 2 * sizeof(Value));
      return Value::dict(std::move(d));
    }
    default:
      throw Error(ErrorKind::kType, "unsupported JSON value (binary)");
  }
}

// ------------------------------------------------------------------------------------------------
// printf-style formatting ('%' operator and the format filter).
namespace {

std::string apply_width(std::string body, int64_t width, bool left, char fill = ' ') {
  int64_t n = static_cast<int64_t>(py::cp_len(body));
  if (width <= n) return body;
  std::string pad(static_cast<size_t>(width - n), fill);
  return left ? body + pad : pad + body;
}

std::string int_to_base(uint64_t v, int base, bool upper) {
  if (v == 0) return "0";
  const char* digits = upper ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string s;
  while (v) {
    s.push_back(digits[v % static_cast<uint64_t>(base)]);
    v /= static_cast<uint64_t>(base);
  }
  std::reverse(s.begin(), s.end());
  return s;
}

double to_real(const Value& v, const std::string& ctx) {
  if (v.is_number()) return v.to_double();
  if (v.is_undefined()) v.fail_undefined();
  type_error(ctx + "must be real number, not " + v.type_name());
}

}  // namespace

std::string percent_format(Interp& in, const std::string& fmt, const Value& args) {
  std::vector<Value> argv;
  // CPython treats any non-tuple, non-str argument with __getitem__ as a mapping here: unused
  // arguments are then not an error.
  bool is_mapping = args.is_dict() || args.is_undefined() ||
                    (args.is_list() && (args.list_obj().kind == ListKind::kList || args.list_obj().kind == ListKind::kRange));
  if (args.is_list() && args.list_obj().kind == ListKind::kTuple) {
    argv = args.items();
  } else {
    argv.push_back(args);
  }
  size_t ai = 0;
  auto next_arg = [&]() -> Value {
    if (ai >= argv.size()) type_error("not enough arguments for format string");
    return argv[ai++];
  };
  std::string out;
  size_t i = 0, n = fmt.size();
  while (i < n) {
    char c = fmt[i];
    if (c != '%') {
      out.push_back(c);
      ++i;
      continue;
    }
    size_t start = i;
    ++i;
    if (i >= n) value_error("incomplete format");
    Value arg;
    bool have_arg = false;
    if (fmt[i] == '(') {
      if (!is_mapping) type_error("format requires a mapping");
      size_t depth = 1, k = i + 1;
      while (k < n && depth) {
        if (fmt[k] == '(') ++depth;
        if (fmt[k] == ')') --depth;
        ++k;
      }
      if (depth) value_error("incomplete format key");
      std::string key = fmt.substr(i + 1, k - i - 2);
      if (args.is_undefined()) args.fail_undefined();
      if (!args.is_dict()) type_error(std::string(args.type_name()) + " indices must be integers or slices, not str");
      const Value* p = args.dict_obj().find(Value::string(key));
      if (!p) throw Error(ErrorKind::kValue, "KeyError: " + py::repr(key));
      arg = *p;
      have_arg = true;
      ai = argv.size();  // CPython: the looked-up value replaces the arguments and is consumed
      i = k;
    }
    bool left = false, plus = false, space = false, alt = false, zero = false;
    while (i < n && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) {
      switch (fmt[i]) {
        case '-':
          left = true;
          break;
        case '+':
          plus = true;
          break;
        case ' ':
          space = true;
          break;
        case '#':
          alt = true;
          break;
        case '0':
          zero = true;
          break;
      }
      ++i;
    }
    int64_t width = -1, prec = -1;
    if (i < n && fmt[i] == '*') {
      Value w = next_arg();
      if (!w.is_integral()) type_error("* wants int");
      width = w.get_int();
      if (width < 0) {
        left = true;
        // INT64_MIN has no positive counterpart; it is far past the cap below anyway.
        width = width == INT64_MIN ? INT64_MAX : -width;
      }
      // Same cap as a width written in the format string: '%*d' % (10**11, 1) must not allocate 100 GB.
      if (width > (1 << 24)) value_error("width too big");
      ++i;
    } else {
      while (i < n && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
        width = std::max<int64_t>(width, 0) * 10 + (fmt[i] - '0');
        if (width > (1 << 24)) value_error("width too big");
        ++i;
      }
    }
    if (i < n && fmt[i] == '.') {
      ++i;
      prec = 0;
      if (i < n && fmt[i] == '*') {
        Value p = next_arg();
        if (!p.is_integral()) type_error("* wants int");
        prec = std::max<int64_t>(0, p.get_int());
        if (prec > (1 << 16)) value_error("precision too big");
        ++i;
      } else {
        while (i < n && std::isdigit(static_cast<unsigned char>(fmt[i]))) {
          prec = prec * 10 + (fmt[i] - '0');
          if (prec > (1 << 16)) value_error("precision too big");
          ++i;
        }
      }
    }
    while (i < n && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= n) value_error("incomplete format");
    char conv = fmt[i++];
    if (conv == '%' && i - start == 2) {  // only a bare "%%" is a literal percent sign
      out.push_back('%');
      continue;
    }
    if (!have_arg) arg = next_arg();  // CPython fetches the argument before validating the conversion
    std::string body;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        body = conv == 's' ? arg.to_str() : conv == 'r' ? arg.repr() : (arg.is_str() ? py::ascii_repr(arg.str()) : arg.repr());
        if (prec >= 0) {
          std::u32string u = py::decode(body);
          if (static_cast<int64_t>(u.size()) > prec) body = py::encode(u.substr(0, static_cast<size_t>(prec)));
        }
        out += apply_width(body, width, left);
        continue;
      }
      case 'c': {
        if (arg.is_str()) {
          if (arg.str_len() != 1) type_error("%c requires int or char");
          body = arg.str();
        } else if (arg.is_integral()) {
          int64_t cp = arg.get_int();
          if (cp < 0 || cp > 0x10FFFF) throw Error(ErrorKind::kValue, "%c arg not in range(0x110000)");
          py::utf8_append(body, static_cast<char32_t>(cp));
        } else {
          type_error("%c requires int or char");
        }
        out += apply_width(body, width, left);
        continue;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'o':
      case 'x':
      case 'X': {
        int64_t iv;
        if (arg.is_integral()) {
          iv = arg.get_int();
        } else if (arg.is_float() && (conv == 'd' || conv == 'i' || conv == 'u')) {
          double d = arg.get_float();
          if (!std::isfinite(d)) value_error("cannot convert float " + py::float_repr(d) + " to integer");
          if (std::fabs(d) >= 9.2e18) value_error("integer overflow");
          iv = static_cast<int64_t>(d);
        } else {
          if (arg.is_undefined()) arg.fail_undefined();
          if (conv == 'd' || conv == 'i' || conv == 'u')
            type_error(std::string("%") + conv + " format: a real number is required, not " + arg.type_name());
          type_error(std::string("%") + conv + " format: an integer is required, not " + arg.type_name());
        }
        bool neg = iv < 0;
        uint64_t mag = neg ? static_cast<uint64_t>(0) - static_cast<uint64_t>(iv) : static_cast<uint64_t>(iv);
        int base = (conv == 'o') ? 8 : (conv == 'x' || conv == 'X') ? 16 : 10;
        std::string digits = int_to_base(mag, base, conv == 'X');
        if (prec >= 0 && static_cast<int64_t>(digits.size()) < prec)
          digits = std::string(static_cast<size_t>(prec) - digits.size(), '0') + digits;
        std::string prefix = neg ? "-" : plus ? "+" : space ? " " : "";
        if (alt && base == 8) prefix += "0o";
        if (alt && base == 16) prefix += conv == 'X' ? "0X" : "0x";
        if (zero && !left && width > static_cast<int64_t>(prefix.size() + digits.size()))
          digits = std::string(static_cast<size_t>(width) - prefix.size() - digits.size(), '0') + digits;
        out += apply_width(prefix + digits, width, left);
        continue;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        double d = to_real(arg, "");
        std::string s = py::format_float(std::fabs(d), conv, prec < 0 ? 6 : static_cast<int>(prec), alt);
        bool neg = std::signbit(d) && !std::isnan(d);
        std::string prefix = neg ? "-" : plus ? "+" : space ? " " : "";
        if (zero && !left && std::isfinite(d) && width > static_cast<int64_t>(prefix.size() + s.size()))
          s = std::string(static_cast<size_t>(width) - prefix.size() - s.size(), '0') + s;
        out += apply_width(prefix + s, width, left);
        continue;
      }
      default: {
        char buf[96];
        std::snprintf(buf, sizeof buf, "unsupported format character '%c' (0x%x) at index %zu", conv,
                      static_cast<unsigned>(static_cast<unsigned char>(conv)), i - 1);
        value_error(buf);
      }
    }
  }
  // CPython: unconsumed arguments are an error unless the argument is a mapping.
  if (!is_mapping && ai < argv.size()) type_error("not all arguments converted during string formatting");
  in.charge_bytes(out.size());
  return out;
}

// ------------------------------------------------------------------------------------------------
// str.format / format(value, spec)
namespace {

struct Spec {
  char32_t fill = ' ';
  char align = 0;
  char sign = 0;
  bool alt = false, zero = false;
  int64_t width = -1, prec = -1;
  char grouping = 0;
  char type = 0;
};

Spec parse_spec(const std::string& s) {
  Spec sp;
  std::u32string u = py::decode(s);
  size_t i = 0, n = u.size();
  auto is_align = [](char32_t c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (n >= 2 && is_align(u[1])) {
    sp.fill = u[0];
    sp.align = static_cast<char>(u[1]);
    i = 2;
  } else if (n >= 1 && is_align(u[0])) {
    sp.align = static_cast<char>(u[0]);
    i = 1;
  }
  if (i < n && (u[i] == '+' || u[i] == '-' || u[i] == ' ')) sp.sign = static_cast<char>(u[i++]);
  if (i < n && u[i] == 'z') ++i;
  if (i < n && u[i] == '#') {
    sp.alt = true;
    ++i;
  }
  if (i < n && u[i] == '0') {
    sp.zero = true;
    ++i;
  }
  while (i < n && u[i] >= '0' && u[i] <= '9') {
    sp.width = std::max<int64_t>(sp.width, 0) * 10 + (u[i++] - '0');
    if (sp.width > (1 << 24)) value_error("Too many decimal digits in format string");
  }
  if (i < n && (u[i] == ',' || u[i] == '_')) sp.grouping = static_cast<char>(u[i++]);
  if (i < n && u[i] == '.') {
    ++i;
    if (i >= n || !(u[i] >= '0' && u[i] <= '9')) value_error("Format specifier missing precision");
    sp.prec = 0;
    while (i < n && u[i] >= '0' && u[i] <= '9') {
      sp.prec = sp.prec * 10 + (u[i++] - '0');
      if (sp.prec > (1 << 16)) value_error("Too many decimal digits in format string");
    }
  }
  if (i < n) sp.type = static_cast<char>(u[i++]);
  if (i < n) value_error("Invalid format specifier");
  return sp;
}

std::string group_digits(const std::string& digits, char sep, int every) {
  std::string out;
  int cnt = 0;
  for (size_t k = digits.size(); k-- > 0;) {
    if (cnt && cnt % every == 0) out.push_back(sep);
    out.push_back(digits[k]);
    ++cnt;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::string pad_spec(const std::string& sign_prefix, const std::string& body, const Spec& sp, char default_align) {
  char align = sp.align ? sp.align : default_align;
  char32_t fill = sp.fill;
  if (sp.zero && !sp.align) {
    fill = '0';
    align = '=';
  }
  int64_t len = static_cast<int64_t>(py::cp_len(sign_prefix) + py::cp_len(body));
  if (sp.width <= len) return sign_prefix + body;
  int64_t total = sp.width - len;
  std::string f;
  py::utf8_append(f, fill);
  auto rep = [&](int64_t k) {
    std::string r;
    for (int64_t x = 0; x < k; ++x) r += f;
    return r;
  };
  switch (align) {
    case '<':
      return sign_prefix + body + rep(total);
    case '^':
      return rep(total / 2) + sign_prefix + body + rep(total - total / 2);
    case '=':
      return sign_prefix + rep(total) + body;
    default:
      return rep(total) + sign_prefix + body;
  }
}

std::string format_number(Interp& in, const Value& v, const Spec& sp) {
  char type = sp.type;
  bool is_int = v.is_integral();
  if (is_int &&
      (type == 0 || type == 'd' || type == 'n' || type == 'b' || type == 'o' || type == 'x' || type == 'X' || type == 'c')) {
    if (sp.prec >= 0) value_error("Precision not allowed in integer format specifier");
    int64_t iv = v.get_int();
    if (type == 'c') {
      if (iv < 0 || iv > 0x10FFFF) throw Error(ErrorKind::kValue, "%c arg not in range(0x110000)");
      std::string s;
      py::utf8_append(s, static_cast<char32_t>(iv));
      return pad_spec("", s, sp, '<');
    }
    bool neg = iv < 0;
    uint64_t mag = neg ? static_cast<uint64_t>(0) - static_cast<uint64_t>(iv) : static_cast<uint64_t>(iv);
    int base = type == 'b' ? 2 : type == 'o' ? 8 : (type == 'x' || type == 'X') ? 16 : 10;
    std::string digits = int_to_base(mag, base, type == 'X');
    if (sp.grouping) digits = group_digits(digits, sp.grouping, base == 10 ? 3 : 4);
    std::string prefix = neg ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
    if (sp.alt && base != 10) prefix += base == 2 ? "0b" : base == 8 ? "0o" : type == 'X' ? "0X" : "0x";
    return pad_spec(prefix, digits, sp, '>');
  }
  double d = v.to_double();
  std::string body;
  bool neg = std::signbit(d) && !std::isnan(d);
  double a = std::fabs(d);
  switch (type) {
    case 0:
      if (sp.prec < 0) {
        body = py::float_repr(a);
      } else {
        body = py::format_float(a, 'g', sp.prec == 0 ? 1 : static_cast<int>(sp.prec), sp.alt);
        if (std::isfinite(a) && body.find_first_of(".e") == std::string::npos) body += ".0";
      }
      break;
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G':
      body = py::format_float(a, type, sp.prec < 0 ? 6 : static_cast<int>(sp.prec), sp.alt);
      break;
    case 'n':
      body = py::format_float(a, 'g', sp.prec < 0 ? 6 : static_cast<int>(sp.prec), sp.alt);
      break;
    case '%':
      body = py::format_float(a * 100, 'f', sp.prec < 0 ? 6 : static_cast<int>(sp.prec), sp.alt) + "%";
      break;
    default:
      value_error(std::string("Unknown format code '") + type + "' for object of type " +
                  py::repr(v.is_float() ? "float" : "int"));
  }
  if (sp.grouping && std::isfinite(a)) {
    size_t dot = body.find_first_of(".e%");
    std::string ip = body.substr(0, dot == std::string::npos ? body.size() : dot);
    std::string rest = dot == std::string::npos ? "" : body.substr(dot);
    body = group_digits(ip, sp.grouping, 3) + rest;
  }
  std::string prefix = neg ? "-" : sp.sign == '+' ? "+" : sp.sign == ' ' ? " " : "";
  return pad_spec(prefix, body, sp, '>');
}

}  // namespace

// format(value, spec)
std::string format_value(Interp& in, const Value& v, const std::string& spec) {
  if (spec.empty()) return v.to_str();
  if (v.is_str()) {
    Spec sp = parse_spec(spec);
    if (sp.sign) value_error("Sign not allowed in string format specifier");
    if (sp.alt) value_error("Alternate form (#) not allowed in string format specifier");
    if (sp.align == '=') value_error("'=' alignment not allowed in string format specifier");
    if (sp.type && sp.type != 's') value_error(std::string("Unknown format code '") + sp.type + "' for object of type 'str'");
    std::string s = v.str();
    if (sp.prec >= 0) {
      std::u32string u = py::decode(s);
      if (static_cast<int64_t>(u.size()) > sp.prec) s = py::encode(u.substr(0, static_cast<size_t>(sp.prec)));
    }
    return pad_spec("", s, sp, '<');
  }
  if (v.is_number()) return format_number(in, v, parse_spec(spec));
  type_error("unsupported format string passed to " + std::string(v.type_name()) + ".__format__");
}

namespace {

std::string str_format(Interp& in, const std::string& fmt, const std::vector<Value>& args, const Value& kwargs, int depth);

Value format_get_field(Interp& in, const std::string& field, const std::vector<Value>& args, const Value& kwargs,
                       int64_t& auto_idx) {
  size_t k = 0;
  while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
  std::string first = field.substr(0, k);
  Value obj;
  // string.Formatter checks numbering only for "" and all-digit field names ("0[x]" is neither).
  if (field.empty()) {
    if (auto_idx < 0) value_error("cannot switch from manual field specification to automatic field numbering");
    first = std::to_string(auto_idx++);
  } else if (py::str_all(field, py::is_digit)) {
    if (auto_idx > 0) value_error("cannot switch from automatic field numbering to manual field specification");
    auto_idx = -1;
  }
  if (py::str_all(first, py::is_digit)) {
    auto idx = py::parse_int(first, 10);
    if (!idx || *idx >= static_cast<int64_t>(args.size()))
      throw Error(ErrorKind::kValue, "Replacement index " + first + " out of range for positional args tuple");
    obj = args[static_cast<size_t>(*idx)];
  } else {
    const Value* p = kwargs.is_dict() ? kwargs.dict_obj().find(Value::string(first)) : nullptr;
    if (!p) throw Error(ErrorKind::kValue, "KeyError: " + py::repr(first));
    obj = *p;
  }
  while (k < field.size()) {
    if (field[k] == '.') {
      size_t e = k + 1;
      while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
      std::string attr = field.substr(k + 1, e - k - 1);
      if (attr.empty()) value_error("Empty attribute in format string");
      obj = in.getattr(obj, attr);
      k = e;
    } else {
      size_t e = field.find(']', k);
      if (e == std::string::npos) value_error("Missing ']' in format string");
      std::string key = field.substr(k + 1, e - k - 1);
      if (key.empty()) value_error("Empty attribute in format string");
      Value kv = py::str_all(key, py::is_digit) ? Value::integer(py::parse_int(key, 10).value_or(0)) : Value::string(key);
      obj = in.getitem(obj, kv);
      k = e + 1;
      if (k < field.size() && field[k] != '.' && field[k] != '[')
        value_error("Only '.' or '[' may follow ']' in format field specifier");
    }
  }
  return obj;
}

std::string str_format_impl(Interp& in, const std::string& fmt, const std::vector<Value>& args, const Value& kwargs, int depth,
                            int64_t& auto_idx) {
  if (depth < 0) value_error("Max string recursion exceeded");
  std::string out;
  size_t i = 0, n = fmt.size();
  while (i < n) {
    char c = fmt[i];
    if (c == '{') {
      if (i + 1 < n && fmt[i + 1] == '{') {
        out.push_back('{');
        i += 2;
        continue;
      }
      // Find the matching '}': nested braces are allowed in the spec, and inside [...] of the
      // field name every character is literal.
      size_t k = i + 1;
      int level = 1;
      bool in_spec = false;
      while (k < n) {
        char ch = fmt[k];
        if (!in_spec && ch == '[') {
          size_t e = fmt.find(']', k + 1);
          if (e == std::string::npos) {
            k = n;
            break;
          }
          k = e + 1;
          continue;
        }
        if (ch == ':' && level == 1) in_spec = true;
        if (ch == '{') ++level;
        if (ch == '}' && --level == 0) break;
        ++k;
      }
      if (k >= n) value_error("expected '}' before end of string");
      std::string field = fmt.substr(i + 1, k - i - 1);
      i = k + 1;
      // field_name [!conv] [:spec]
      size_t colon = std::string::npos, bang = std::string::npos;
      int br = 0;
      for (size_t q = 0; q < field.size(); ++q) {
        char ch = field[q];
        if (ch == '[') ++br;
        if (ch == ']') --br;
        if (br) continue;
        if (ch == '!' && bang == std::string::npos && colon == std::string::npos) bang = q;
        if (ch == ':' && colon == std::string::npos) {
          colon = q;
          break;
        }
      }
      std::string name = field.substr(0, std::min(bang, colon));
      for (size_t q = 0, br2 = 0; q < name.size(); ++q) {
        if (name[q] == '[') ++br2;
        if (name[q] == ']' && br2) --br2;
        if (name[q] == '{' && !br2) value_error("unexpected '{' in field name");
      }
      char conv = 0;
      if (bang != std::string::npos) {
        size_t cend = colon == std::string::npos ? field.size() : colon;
        if (cend - bang != 2) value_error("expected ':' after conversion specifier");
        conv = field[bang + 1];
      }
      std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
      Value obj = format_get_field(in, name, args, kwargs, auto_idx);
      if (conv == 'r') {
        obj = in.make_str(obj.repr());
      } else if (conv == 's') {
        obj = in.make_str(obj.to_str());
      } else if (conv == 'a') {
        obj = in.make_str(obj.is_str() ? py::ascii_repr(obj.str()) : obj.repr());
      } else if (conv) {
        value_error(std::string("Unknown conversion specifier ") + conv);
      }
      std::string spec2 = str_format_impl(in, spec, args, kwargs, depth - 1, auto_idx);
      out += format_value(in, obj, spec2);
      continue;
    }
    if (c == '}') {
      if (i + 1 < n && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      value_error("Single '}' encountered in format string");
    }
    out.push_back(c);
    ++i;
  }
  return out;
}

std::string str_format(Interp& in, const std::string& fmt, const std::vector<Value>& args, const Value& kwargs, int depth) {
  int64_t auto_idx = 0;
  std::string s = str_format_impl(in, fmt, args, kwargs, depth, auto_idx);
  in.charge_bytes(s.size());
  return s;
}

// ------------------------------------------------------------------------------------------------
// Methods of str, list, tuple and dict reachable from templates.

bool startsends(Interp& in, const Value& self, Args& a, bool ends) {
  const char* nm = ends ? "endswith" : "startswith";
  if (!a.kw.empty()) type_error(std::string(nm) + "() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) type_error(std::string(nm) + "() takes at least 1 argument");
  const std::string& s = self.str();
  std::optional<int64_t> st, en;
  if (a.pos.size() > 1 && !a.pos[1].is_none()) st = to_index(a.pos[1]);
  if (a.pos.size() > 2 && !a.pos[2].is_none()) en = to_index(a.pos[2]);
  std::vector<Value> cands;
  if (a.pos[0].is_tuple()) {
    cands = a.pos[0].items();
  } else {
    cands.push_back(a.pos[0]);
  }
  bool ascii = py::is_ascii(s);
  int64_t n = ascii ? static_cast<int64_t>(s.size()) : static_cast<int64_t>(py::cp_len(s));
  int64_t b = st.value_or(0), e = en.value_or(n);
  if (b < 0) b = std::max<int64_t>(0, b + n);
  if (e < 0) e = std::max<int64_t>(0, e + n);
  if (e > n) e = n;
  for (const auto& c : cands) {
    if (!c.is_str()) type_error(std::string(nm) + " first arg must be str or a tuple of str, not " + c.type_name());
    if (b > n) continue;
    if (e < b) continue;
    size_t bb = ascii ? static_cast<size_t>(b) : py::cp_to_byte(s, static_cast<size_t>(b));
    size_t eb = ascii ? static_cast<size_t>(e) : py::cp_to_byte(s, static_cast<size_t>(e));
    std::string_view win = std::string_view(s).substr(bb, eb - bb);
    const std::string& x = c.str();
    if (win.size() < x.size()) continue;
    charge_work(x.size());
    if (ends ? win.substr(win.size() - x.size()) == x : win.substr(0, x.size()) == x) return true;
  }
  return false;
}

std::optional<std::string_view> opt_chars(const Value* v, const char* fn) {
  if (!v || v->is_none()) return std::nullopt;
  if (!v->is_str()) type_error(std::string(fn) + " arg must be None or str");
  return std::string_view(v->str());
}

Value str_list(Interp& in, const std::vector<std::string>& parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(in.make_str(p));
  return in.make_list(std::move(out));
}

bool str_method(Interp& in, const Value& self, const std::string& name, Value& out) {
  using Fn = std::function<Value(Interp&, Args&)>;
  const bool mk = self.is_markup();
  const std::string owner = "str";
  Fn fn;
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "swapcase") {
    fn = [self, name, mk](Interp& in, Args& a) {
      Params p(a, name, {}, false);
      const std::string& s = self.str();
      std::string r = name == "upper"        ? py::upper(s)
                      : name == "lower"      ? py::lower(s)
                      : name == "title"      ? py::title(s)
                      : name == "capitalize" ? py::capitalize(s)
                                             : py::swapcase(s);
      return in.make_str(std::move(r), mk);
    };
  } else if (name == "strip" || name == "lstrip" || name == "rstrip") {
    fn = [self, name, mk](Interp& in, Args& a) {
      Params p(a, name, {"chars"}, false);
      auto side = name == "strip" ? py::StripSide::kBoth : name == "lstrip" ? py::StripSide::kLeft : py::StripSide::kRight;
      return in.make_str(py::strip(self.str(), opt_chars(p.get(0), name.c_str()), side), mk);
    };
  } else if (name == "split" || name == "rsplit") {
    fn = [self, name](Interp& in, Args& a) {
      Params p(a, name, {"sep", "maxsplit"});
      auto sep = opt_chars(p.get(0), "must be str or None; ");
      int64_t maxsplit = p.has(1) ? to_index(*p.get(1)) : -1;
      auto parts = name == "split" ? py::split(self.str(), sep, maxsplit) : py::rsplit(self.str(), sep, maxsplit);
      return str_list(in, parts);
    };
  } else if (name == "splitlines") {
    fn = [self](Interp& in, Args& a) {
      Params p(a, "splitlines", {"keepends"});
      return str_list(in, py::splitlines(self.str(), p.get_or(0, Value::boolean(false)).truthy()));
    };
  } else if (name == "startswith" || name == "endswith") {
    bool ends = name == "endswith";
    fn = [self, ends](Interp& in, Args& a) { return Value::boolean(startsends(in, self, a, ends)); };
  } else if (name == "replace") {
    fn = [self, mk](Interp& in, Args& a) {
      Params p(a, "replace", {"old", "new", "count"}, false);
      const std::string& o = need_str(p.required(0), "replace() argument 1");
      const std::string& nw = need_str(p.required(1), "replace() argument 2");
      int64_t count = p.has(2) ? to_index(*p.get(2)) : -1;
      return in.make_str(py::replace(self.str(), o, nw, count), mk);
    };
  } else if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    fn = [self, name](Interp&, Args& a) {
      Params p(a, name, {"sub", "start", "end"}, false);
      const std::string& sub = need_str(p.required(0), "must be str, not");
      std::optional<int64_t> st, en;
      if (p.has(1) && !p.get(1)->is_none()) st = to_index(*p.get(1));
      if (p.has(2) && !p.get(2)->is_none()) en = to_index(*p.get(2));
      if (name == "count") return Value::integer(py::count(self.str(), sub, st, en));
      bool rev = name == "rfind" || name == "rindex";
      int64_t r = py::find(self.str(), sub, st, en, rev);
      if (r < 0 && (name == "index" || name == "rindex")) throw Error(ErrorKind::kValue, "substring not found");
      return Value::integer(r);
    };
  } else if (name == "join") {
    fn = [self, mk](Interp& in, Args& a) {
      Params p(a, "join", {"iterable"}, false);
      std::vector<Value> items = in.to_list(p.required(0));
      std::string r;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!items[i].is_str())
          type_error("sequence item " + std::to_string(i) + ": expected str instance, " + items[i].type_name() + " found");
        if (i) r += self.str();
        r += items[i].str();
      }
      return in.make_str(std::move(r), mk);
    };
  } else if (name == "center" || name == "ljust" || name == "rjust") {
    fn = [self, name](Interp& in, Args& a) {
      Params p(a, name, {"width", "fillchar"}, false);
      int64_t w = to_index(p.required(0));
      char32_t fill = ' ';
      if (p.has(1)) {
        const Value& f = *p.get(1);
        if (!f.is_str() || f.str_len() != 1) type_error("The fill character must be exactly one character long");
        fill = py::decode(f.str())[0];
      }
      char align = name == "center" ? '^' : name == "ljust" ? '<' : '>';
      if (w > (1 << 24)) value_error("width too big");
      return in.make_str(py::pad(self.str(), w, fill, align));
    };
  } else if (name == "zfill") {
    fn = [self](Interp& in, Args& a) {
      Params p(a, "zfill", {"width"}, false);
      int64_t w = to_index(p.required(0));
      if (w > (1 << 24)) value_error("width too big");
      return in.make_str(py::zfill(self.str(), w));
    };
  } else if (name == "partition" || name == "rpartition") {
    fn = [self, name](Interp& in, Args& a) {
      Params p(a, name, {"sep"}, false);
      const std::string& sep = need_str(p.required(0), "must be str, not");
      if (sep.empty()) value_error("empty separator");
      const std::string& s = self.str();
      size_t f = name == "partition" ? py::find_bytes(s, sep) : py::rfind_bytes(s, sep, std::string::npos);
      std::vector<Value> r;
      if (f == std::string::npos) {
        if (name == "partition") {
          r = {in.make_str(s), in.make_str(""), in.make_str("")};
        } else {
          r = {in.make_str(""), in.make_str(""), in.make_str(s)};
        }
      } else {
        r = {in.make_str(s.substr(0, f)), in.make_str(sep), in.make_str(s.substr(f + sep.size()))};
      }
      return make_tuple(in, std::move(r));
    };
  } else if (name == "removeprefix" || name == "removesuffix") {
    fn = [self, name](Interp& in, Args& a) {
      Params p(a, name, {"affix"}, false);
      const std::string& x = need_str(p.required(0), "must be str, not");
      const std::string& s = self.str();
      if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return in.make_str(s.substr(x.size()));
      if (name == "removesuffix" && !x.empty() && s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
        return in.make_str(s.substr(0, s.size() - x.size()));
      return self;
    };
  } else if (name == "isalnum" || name == "isalpha" || name == "isascii" || name == "isdecimal" || name == "isdigit" ||
             name == "isidentifier" || name == "islower" || name == "isnumeric" || name == "isprintable" || name == "isspace" ||
             name == "istitle" || name == "isupper") {
    fn = [self, name](Interp&, Args& a) {
      Params p(a, name, {}, false);
      const std::string& s = self.str();
      bool r = false;
      if (name == "isalnum")
        r = py::str_isalnum(s);
      else if (name == "isalpha")
        r = py::str_all(s, py::is_alpha);
      else if (name == "isascii")
        r = py::is_ascii(s);
      else if (name == "isdecimal")
        r = py::str_all(s, py::is_decimal);
      else if (name == "isdigit")
        r = py::str_all(s, py::is_digit);
      else if (name == "isnumeric")
        r = py::str_all(s, py::is_numeric);
      else if (name == "isprintable")
        r = s.empty() || py::str_all(s, py::is_printable);
      else if (name == "isspace")
        r = py::str_isspace(s);
      else if (name == "islower")
        r = py::str_islower(s);
      else if (name == "isupper")
        r = py::str_isupper(s);
      else if (name == "istitle")
        r = py::str_istitle(s);
      else if (name == "isidentifier") {
        std::u32string u = py::decode(s);
        r = !u.empty() && (u[0] == '_' || py::is_alpha(u[0]));
        for (size_t k = 1; r && k < u.size(); ++k) r = py::is_word(u[k]);
      }
      return Value::boolean(r);
    };
  } else if (name == "format") {
    fn = [self](Interp& in, Args& a) {
      auto kw = std::make_shared<DictObj>();
      for (auto& kv : a.kw) kw->set(Value::string(kv.first), kv.second);
      return in.make_str(str_format(in, self.str(), a.pos, Value::dict(kw), 2));
    };
  } else if (name == "format_map") {
    fn = [self](Interp& in, Args& a) {
      if (!a.kw.empty()) type_error("format_map() takes no keyword arguments");
      if (a.pos.size() != 1) type_error("format_map() takes exactly one argument (" + std::to_string(a.pos.size()) + " given)");
      return in.make_str(str_format(in, self.str(), {}, a.pos[0], 2));
    };
  } else if (name == "encode" || name == "expandtabs" || name == "casefold" || name == "translate" || name == "maketrans") {
    // Real Python attributes this engine does not implement: calling them is an error.
    fn = [name](Interp&, Args&) -> Value { runtime_error("str." + name + "() is not supported by this template engine"); };
  } else {
    return false;
  }
  out = Value::object(std::make_shared<BuiltinFn>(name, std::move(fn), owner));
  return true;
}

bool list_method(Interp& in, const Value& self, const std::string& name, Value& out) {
  ListKind k = self.list_obj().kind;
  bool is_list = k == ListKind::kList, is_tuple = k == ListKind::kTuple || k == ListKind::kRange;
  if (k == ListKind::kDictItems || k == ListKind::kDictKeys || k == ListKind::kDictValues) {
    if (name == "mapping") {
      out = Value::undefined_attr(self, Value::string(name));
      return true;
    }
    return false;
  }
  if (self.list_obj().group && (name == "grouper" || name == "list")) {
    out = self.items()[name == "grouper" ? 0 : 1];
    return true;
  }
  if ((is_list || is_tuple) && (name == "index" || name == "count")) {
    out = bound(name, self, [self, name](Interp& in, Args& a) -> Value {
      Params p(a, name, {"value", "start", "stop"}, false);
      const Value& x = p.required(0);
      const auto& items = self.items();
      int64_t n = static_cast<int64_t>(items.size());
      if (name == "count") {
        int64_t c = 0;
        for (const auto& v : items) {
          in.step();
          c += py_eq(v, x);
        }
        return Value::integer(c);
      }
      int64_t b = p.has(1) ? to_index(*p.get(1)) : 0, e = p.has(2) ? to_index(*p.get(2)) : n;
      if (b < 0) b = std::max<int64_t>(0, b + n);
      if (e < 0) e = std::max<int64_t>(0, e + n);
      for (int64_t i = b; i < std::min(e, n); ++i) {
        in.step();
        if (py_eq(items[static_cast<size_t>(i)], x)) return Value::integer(i);
      }
      throw Error(ErrorKind::kValue, std::string(self.type_name()) + ".index(x): x not in " + self.type_name());
    });
    return true;
  }
  if (!is_list) return false;
  if (name == "copy") {
    out = bound(name, self, [self](Interp& in, Args& a) {
      Params p(a, "copy", {}, false);
      return in.make_list(self.items());
    });
    return true;
  }
  if (name == "pop") {
    // Allowed by jinja2's ImmutableSandboxedEnvironment (it only blocks append/extend/insert/...).
    out = bound(name, self, [self](Interp&, Args& a) {
      Params p(a, "pop", {"index"}, false);
      auto& items = self.items();
      if (items.empty()) throw Error(ErrorKind::kValue, "pop from empty list");
      int64_t n = static_cast<int64_t>(items.size());
      int64_t i = p.has(0) ? to_index(*p.get(0)) : -1;
      if (i < 0) i += n;
      if (i < 0 || i >= n) throw Error(ErrorKind::kValue, "pop index out of range");
      Value v = items[static_cast<size_t>(i)];
      items.erase(items.begin() + i);
      return v;
    });
    return true;
  }
  if (name == "clear") {
    out = bound(name, self, [self](Interp&, Args& a) {
      Params p(a, "clear", {}, false);
      self.items().clear();
      return Value::none();
    });
    return true;
  }
  if (name == "append" || name == "extend" || name == "insert" || name == "remove" || name == "reverse" || name == "sort") {
    out = Value::undefined_hint("access to attribute " + py::repr(name) + " of 'list' object is unsafe.", ErrorKind::kSecurity);
    return true;
  }
  return false;
}

bool dict_method(Interp& in, const Value& self, const std::string& name, Value& out) {
  if (name == "items" || name == "keys" || name == "values") {
    ListKind k = name == "items" ? ListKind::kDictItems : name == "keys" ? ListKind::kDictKeys : ListKind::kDictValues;
    out = bound(name, self, [self, k, name](Interp& in, Args& a) {
      Params p(a, name, {}, false);
      return dict_items_list(in, self, k);
    });
    return true;
  }
  if (name == "get") {
    out = bound(name, self, [self](Interp&, Args& a) {
      Params p(a, "get", {"key", "default"}, false);
      const Value& k = p.required(0);
      if (!hashable(k)) type_error("unhashable type: " + py::repr(k.type_name()));
      const Value* v = self.dict_obj().find(k);
      return v ? *v : p.get_or(1, Value::none());
    });
    return true;
  }
  if (name == "copy") {
    out = bound(name, self, [self](Interp& in, Args& a) {
      Params p(a, "copy", {}, false);
      auto d = std::make_shared<DictObj>(self.dict_obj());
      in.charge_bytes(d->items.size() * 2 * sizeof(Value));
      return Value::dict(std::move(d));
    });
    return true;
  }
  if (name == "clear" || name == "pop" || name == "popitem" || name == "setdefault" || name == "update") {
    out = Value::undefined_hint("access to attribute " + py::repr(name) + " of 'dict' object is unsafe.", ErrorKind::kSecurity);
    return true;
  }
  if (name == "fromkeys") {
    out = bound(name, self, [](Interp& in, Args& a) {
      Params p(a, "fromkeys", {"iterable", "value"}, false);
      auto d = std::make_shared<DictObj>();
      Value v = p.get_or(1, Value::none());
      for (auto& k : in.to_list(p.required(0))) {
        if (!hashable(k)) type_error("unhashable type: " + py::repr(k.type_name()));
        d->set(k, v);
      }
      return Value::dict(std::move(d));
    });
    return true;
  }
  return false;
}

}  // namespace

bool get_method(Interp& in, const Value& obj, const std::string& name, Value& out) {
  switch (obj.kind()) {
    case Value::Kind::kStr:
      return str_method(in, obj, name, out);
    case Value::Kind::kList:
      return list_method(in, obj, name, out);
    case Value::Kind::kDict:
      return dict_method(in, obj, name, out);
    default:
      return false;
  }
}

// ------------------------------------------------------------------------------------------------
// Filters
namespace {

using FilterFn = Value (*)(Interp&, const Value&, Args&);

Value f_abs(Interp&, const Value& v, Args& a) {
  Params p(a, "abs", {}, false);
  if (v.is_float()) return Value::number(std::fabs(v.get_float()));
  if (v.is_integral()) {
    if (v.get_int() == INT64_MIN) value_error("integer overflow");
    return Value::integer(std::llabs(v.get_int()));
  }
  type_error("bad operand type for abs(): " + py::repr(v.type_name()));
}

Value f_attr(Interp& in, const Value& v, Args& a) {
  Params p(a, "attr", {"name"});
  const Value& nm = p.required(0);
  if (!nm.is_str()) type_error("attribute name must be string");
  if (v.is_undefined()) v.fail_undefined();
  // getattr_static: only real attributes, never dict keys.
  Value out;
  if (v.is_object()) {
    if (v.obj().get_attr(in, nm.str(), out)) return in.getattr(v, nm.str());
  } else if (get_method(in, v, nm.str(), out)) {
    return in.getattr(v, nm.str());
  }
  return Value::undefined_attr(v, nm);
}

Value f_batch(Interp& in, const Value& v, Args& a) {
  Params p(a, "batch", {"linecount", "fill_with"});
  Value lc = p.required(0);  // only compared with len(tmp), like jinja2
  Value fill = p.get_or(1, Value::none());
  auto src = std::make_shared<std::shared_ptr<Object>>();
  Value value = v;
  auto done = std::make_shared<bool>(false);
  return in.make_generator("generator", v, [value, lc, fill, src, done](Interp& in, Value& out) {
    if (*done) return false;
    if (!*src) *src = in.iter(value);
    std::vector<Value> tmp;
    Value x;
    while (true) {
      if (py_eq(Value::integer(static_cast<int64_t>(tmp.size())), lc)) {
        out = in.make_list(std::move(tmp));
        return true;
      }
      if (!(*src)->next(in, x)) break;
      in.step();
      tmp.push_back(x);
    }
    *done = true;
    if (tmp.empty()) return false;
    Value len = Value::integer(static_cast<int64_t>(tmp.size()));
    if (!fill.is_none() && py_lt(len, lc)) {
      // tmp += [fill_with] * (linecount - len(tmp))
      Value extra = in.binop(BinOp::kMul, in.make_list({fill}), in.binop(BinOp::kSub, lc, len));
      for (const auto& e : extra.items()) tmp.push_back(e);
    }
    out = in.make_list(std::move(tmp));
    return true;
  });
}

Value f_capitalize(Interp& in, const Value& v, Args& a) {
  Params p(a, "capitalize", {}, false);
  Value s = soft_str(in, v);
  return in.make_str(py::capitalize(s.str()), s.is_markup());
}

Value f_center(Interp& in, const Value& v, Args& a) {
  Params p(a, "center", {"width"});
  int64_t w = p.has(0) ? to_index(*p.get(0)) : 80;
  if (w > (1 << 24)) value_error("width too big");
  Value s = soft_str(in, v);
  return in.make_str(py::pad(s.str(), w, ' ', '^'), s.is_markup());
}

Value f_length(Interp&, const Value& v, Args& a) {
  Params p(a, "length", {}, false);
  return Value::integer(py_len(v));
}

Value f_default(Interp&, const Value& v, Args& a) {
  Params p(a, "default", {"default_value", "boolean"});
  bool boolean = p.get_or(1, Value::boolean(false)).truthy();
  if (v.is_undefined() || (boolean && !v.truthy())) return p.get_or(0, Value::string(""));
  return v;
}

Value f_dictsort(Interp& in, const Value& v, Args& a) {
  Params p(a, "dictsort", {"case_sensitive", "by", "reverse"});
  bool cs = p.get_or(0, Value::boolean(false)).truthy();
  Value by = p.get_or(1, Value::string("key"));
  bool rev = to_index(p.get_or(2, Value::boolean(false))) != 0;  // sorted() wants an int
  size_t pos;
  if (by.is_str() && by.str() == "key") {
    pos = 0;
  } else if (by.is_str() && by.str() == "value") {
    pos = 1;
  } else {
    runtime_error("You can only sort by either \"key\" or \"value\"");
  }
  if (!v.is_dict()) {
    if (v.is_undefined()) v.fail_undefined();
    type_error(py::repr(v.type_name()) + " object has no attribute 'items'");
  }
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& kv : v.dict_obj().items) {
    Value item = make_tuple(in, {kv.first, kv.second});
    Value key = pos == 0 ? kv.first : kv.second;
    if (!cs) key = ignore_case(in, key);
    keyed.emplace_back(std::move(key), std::move(item));
  }
  return in.make_list(sorted_by(in, std::move(keyed), rev));
}

Value f_escape(Interp& in, const Value& v, Args& a) {
  Params p(a, "escape", {}, false);
  if (v.is_markup()) return v;
  return in.make_str(py::escape_html(v.to_str()), true);
}

Value f_forceescape(Interp& in, const Value& v, Args& a) {
  Params p(a, "forceescape", {}, false);
  return in.make_str(py::escape_html(v.to_str()), true);
}

Value f_filesizeformat(Interp& in, const Value& v, Args& a) {
  Params p(a, "filesizeformat", {"binary"});
  bool binary = p.get_or(0, Value::boolean(false)).truthy();
  double bytes;
  if (v.is_number()) {
    bytes = v.to_double();
  } else if (v.is_str()) {
    auto f = py::parse_float(v.str());
    if (!f) value_error("could not convert string to float: " + py::repr(v.str()));
    bytes = *f;
  } else {
    if (v.is_undefined()) v.fail_undefined();
    type_error("float() argument must be a string or a real number, not " + py::repr(v.type_name()));
  }
  double base = binary ? 1024 : 1000;
  static const char* kBin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  static const char* kDec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  if (bytes == 1) return in.make_str("1 Byte");
  if (bytes < base) {
    // int(bytes) of a large negative size: Python prints a big integer; a 64-bit one cannot hold it (and converting
    // an out-of-range double to int64_t is undefined behaviour).
    if (std::isinf(bytes)) throw Error(ErrorKind::kValue, "cannot convert float infinity to integer");
    if (bytes <= -9.2e18) value_error("integer overflow");
    return in.make_str(std::to_string(static_cast<int64_t>(bytes)) + " Bytes");
  }
  double unit = base;
  const char* prefix = "";
  for (int i = 0; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    prefix = binary ? kBin[i] : kDec[i];
    if (bytes < unit) break;
  }
  return in.make_str(py::format_float(base * bytes / unit, 'f', 1, false) + " " + prefix);
}

Value f_first(Interp& in, const Value& v, Args& a) {
  Params p(a, "first", {}, false);
  auto it = in.iter(v);
  Value x;
  if (it->next(in, x)) return x;
  return Value::undefined_hint("No first item, sequence was empty.");
}

Value f_last(Interp& in, const Value& v, Args& a) {
  Params p(a, "last", {}, false);
  if (v.is_iterator()) type_error(py::repr(v.type_name()) + " object is not reversible");
  if (v.is_str()) {
    if (v.str().empty()) return Value::undefined_hint("No last item, sequence was empty.");
    std::u32string u = py::decode(v.str());
    std::string s;
    py::utf8_append(s, u.back());
    return in.make_str(std::move(s));
  }
  if (v.is_list()) {
    if (v.items().empty()) return Value::undefined_hint("No last item, sequence was empty.");
    return v.items().back();
  }
  if (v.is_dict()) {
    if (v.dict_obj().items.empty()) return Value::undefined_hint("No last item, sequence was empty.");
    return v.dict_obj().items.back().first;
  }
  if (v.is_undefined()) return Value::undefined_hint("No last item, sequence was empty.");
  type_error(py::repr(v.type_name()) + " object is not reversible");
}

Value py_float(const Value& v, bool& ok) {
  ok = true;
  if (v.is_float()) return v;
  if (v.is_integral()) return Value::number(static_cast<double>(v.get_int()));
  if (v.is_undefined()) v.fail_undefined();
  if (v.is_str()) {
    auto f = py::parse_float(v.str());
    if (f) return Value::number(*f);
  }
  ok = false;
  return Value();
}

Value f_float(Interp&, const Value& v, Args& a) {
  Params p(a, "float", {"default"});
  bool ok;
  Value r = py_float(v, ok);
  return ok ? r : p.get_or(0, Value::number(0.0));
}

Value f_int(Interp&, const Value& v, Args& a) {
  Params p(a, "int", {"default", "base"});
  Value dflt = p.get_or(0, Value::integer(0));
  Value base_v = p.get_or(1, Value::integer(10));
  // try: int(value, base) for str, int(value) otherwise; on TypeError/ValueError: int(float(value))
  if (v.is_str()) {
    if (base_v.is_integral()) {
      int64_t base = base_v.get_int();
      if (base == 0 || (base >= 2 && base <= 36)) {
        if (auto r = py::parse_int(v.str(), static_cast<int>(base))) return Value::integer(*r);
      }
    }
  } else if (v.is_integral()) {
    return Value::integer(v.get_int());
  } else if (v.is_float()) {
    double d = v.get_float();
    if (std::isinf(d)) throw Error(ErrorKind::kValue, "cannot convert float infinity to integer");
    if (std::isnan(d)) return dflt;  // ValueError twice
    if (std::fabs(d) >= 9.2e18) value_error("integer overflow");
    return Value::integer(static_cast<int64_t>(d));
  } else if (v.is_undefined()) {
    v.fail_undefined();
  }
  // int(float(value)): only strings get here with a chance of success.
  if (v.is_str()) {
    if (auto f = py::parse_float(v.str())) {
      double d = *f;
      if (std::isinf(d)) throw Error(ErrorKind::kValue, "cannot convert float infinity to integer");
      if (std::isnan(d)) return dflt;
      if (std::fabs(d) >= 9.2e18) value_error("integer overflow");
      return Value::integer(static_cast<int64_t>(d));
    }
  }
  return dflt;
}

Value f_format(Interp& in, const Value& v, Args& a) {
  if (!a.pos.empty() && !a.kw.empty()) runtime_error("can't handle positional and keyword arguments at the same time");
  Value s = soft_str(in, v);
  Value args;
  if (!a.kw.empty()) {
    auto d = std::make_shared<DictObj>();
    for (auto& kv : a.kw) d->set(Value::string(kv.first), kv.second);
    args = Value::dict(d);
  } else {
    args = Value::tuple(a.pos);
  }
  return in.make_str(percent_format(in, s.str(), args), s.is_markup());
}

Value f_groupby(Interp& in, const Value& v, Args& a) {
  Params p(a, "groupby", {"attribute", "default", "case_sensitive"});
  AttrGetter expr{attribute_parts(p.required(0))};
  if (p.has(1) && !p.get(1)->is_none()) {
    expr.deflt = *p.get(1);
    expr.has_default = true;
  }
  bool cs = p.get_or(2, Value::boolean(false)).truthy();
  AttrGetter out_expr = expr;
  expr.lower = !cs;
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& x : in.to_list(v)) keyed.emplace_back(expr(in, x), x);
  std::vector<Value> sorted = sorted_by(in, keyed, false);
  std::vector<Value> groups;
  size_t i = 0;
  while (i < sorted.size()) {
    Value key = expr(in, sorted[i]);
    std::vector<Value> members{sorted[i]};
    size_t j = i + 1;
    while (j < sorted.size() && py_eq(expr(in, sorted[j]), key)) members.push_back(sorted[j++]);
    Value grouper = cs ? key : out_expr(in, members[0]);
    Value g = in.make_list({grouper, in.make_list(std::move(members))}, ListKind::kTuple);
    g.list_obj().group = true;
    groups.push_back(std::move(g));
    i = j;
  }
  return in.make_list(std::move(groups));
}

Value f_indent(Interp& in, const Value& v, Args& a) {
  Params p(a, "indent", {"width", "first", "blank"});
  Value width = p.get_or(0, Value::integer(4));
  bool first = p.get_or(1, Value::boolean(false)).truthy();
  bool blank = p.get_or(2, Value::boolean(false)).truthy();
  std::string ind;
  if (width.is_str()) {
    ind = width.str();
  } else if (width.is_integral()) {
    ind.assign(static_cast<size_t>(std::clamp<int64_t>(width.get_int(), 0, 1 << 16)), ' ');
  } else {
    type_error("can't multiply sequence by non-int of type " + py::repr(width.type_name()));
  }
  if (!v.is_str()) {
    if (v.is_undefined()) v.fail_undefined();
    type_error("unsupported operand type(s) for +=: " + py::repr(v.type_name()) + " and 'str'");
  }
  std::string s = v.str() + "\n";
  std::vector<std::string> lines = py::splitlines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + ind;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        if (!lines[i].empty()) rv += ind;
        rv += lines[i];
      }
    }
  }
  if (first) rv = ind + rv;
  return in.make_str(std::move(rv), v.is_markup());
}

Value f_items(Interp& in, const Value& v, Args& a) {
  Params p(a, "items", {}, false);
  Value value = v;
  auto idx = std::make_shared<size_t>(0);
  return in.make_generator("generator", v, [value, idx](Interp& in, Value& out) {
    if (value.is_undefined()) return false;
    if (!value.is_dict()) type_error("Can only get item pairs from a mapping.");
    const auto& items = value.dict_obj().items;
    if (*idx >= items.size()) return false;
    const auto& kv = items[(*idx)++];
    out = make_tuple(in, {kv.first, kv.second});
    return true;
  });
}

Value f_join(Interp& in, const Value& v, Args& a) {
  Params p(a, "join", {"d", "attribute"});
  Value d = p.get_or(0, Value::string(""));
  std::string sep = d.to_str();
  std::vector<Value> items = in.to_list(v);
  std::optional<AttrGetter> getter;
  if (p.has(1) && !p.get(1)->is_none()) getter = AttrGetter{attribute_parts(*p.get(1))};
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    const Value x = getter ? (*getter)(in, items[i]) : items[i];
    if (x.is_str()) {
      out += x.str();
    } else {
      out += x.to_str();
    }
    if (out.size() > in.options().limits.max_output_bytes) throw Error(ErrorKind::kLimit, "joined string too large");
  }
  return in.make_str(std::move(out));
}

Value f_list(Interp& in, const Value& v, Args& a) {
  Params p(a, "list", {}, false);
  return in.make_list(in.to_list(v));
}

Value f_lower(Interp& in, const Value& v, Args& a) {
  Params p(a, "lower", {}, false);
  Value s = soft_str(in, v);
  return in.make_str(py::lower(s.str()), s.is_markup());
}

Value f_upper(Interp& in, const Value& v, Args& a) {
  Params p(a, "upper", {}, false);
  Value s = soft_str(in, v);
  return in.make_str(py::upper(s.str()), s.is_markup());
}

Value f_map(Interp& in, const Value& v, Args& a) {
  Value value = v;
  Args args = a;
  auto state = std::make_shared<std::shared_ptr<Object>>();
  auto started = std::make_shared<bool>(false);
  auto getter = std::make_shared<std::optional<AttrGetter>>();
  auto fname = std::make_shared<std::string>();
  auto fargs = std::make_shared<Args>();
  return in.make_generator("generator", v, [=](Interp& in, Value& out) {
    if (!*started) {
      *started = true;
      if (!value.truthy()) return false;
      bool has_attr = false;
      for (auto& kv : args.kw)
        if (kv.first == "attribute") has_attr = true;
      if (args.pos.empty() && has_attr) {
        AttrGetter g;
        for (auto& kv : args.kw) {
          if (kv.first == "attribute") {
            g.parts = attribute_parts(kv.second);
          } else if (kv.first == "default") {
            if (!kv.second.is_none()) {
              g.deflt = kv.second;
              g.has_default = true;
            }
          } else {
            runtime_error("Unexpected keyword argument " + py::repr(kv.first));
          }
        }
        *getter = g;
      } else {
        if (args.pos.empty()) runtime_error("map requires a filter argument");
        if (!args.pos[0].is_str()) {
          if (!hashable(args.pos[0])) type_error("unhashable type: " + py::repr(args.pos[0].type_name()));
          runtime_error("No filter named " + args.pos[0].to_str() + ".");
        }
        *fname = args.pos[0].str();
        fargs->pos.assign(args.pos.begin() + 1, args.pos.end());
        fargs->kw = args.kw;
      }
      *state = in.iter(value);
    }
    if (!*state) return false;
    Value x;
    if (!(*state)->next(in, x)) return false;
    in.step();
    if (*getter) {
      out = (**getter)(in, x);
    } else {
      Args fa = *fargs;
      out = in.apply_filter(*fname, x, fa, 0);
    }
    return true;
  });
}

Value min_max(Interp& in, const Value& v, Args& a, bool is_max) {
  Params p(a, is_max ? "max" : "min", {"case_sensitive", "attribute"});
  bool cs = p.get_or(0, Value::boolean(false)).truthy();
  AttrGetter g{attribute_parts(p.get_or(1, Value::none()))};
  g.lower = !cs;
  std::vector<Value> items = in.to_list(v);
  if (items.empty()) return Value::undefined_hint("No aggregated item, sequence was empty.");
  Value best = items[0], best_key = g(in, items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = g(in, items[i]);
    if (is_max ? py_lt(best_key, k) : py_lt(k, best_key)) {
      best = items[i];
      best_key = k;
    }
  }
  return best;
}

Value f_max(Interp& in, const Value& v, Args& a) { return min_max(in, v, a, true); }
Value f_min(Interp& in, const Value& v, Args& a) { return min_max(in, v, a, false); }

Value f_random(Interp&, const Value& v, Args& a) {
  Params p(a, "random", {}, false);
  if (v.is_list()) {
    if (v.items().empty()) return Value::undefined_hint("No random item, sequence was empty.");
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    return v.items()[rng() % v.items().size()];
  }
  if (v.is_undefined()) return Value::undefined_hint("No random item, sequence was empty.");
  type_error(py::repr(v.type_name()) + " object is not subscriptable");
}

Value select_reject(Interp& in, const Value& v, Args& a, bool select, bool attr) {
  Value value = v;
  Args args = a;
  auto state = std::make_shared<std::shared_ptr<Object>>();
  auto started = std::make_shared<bool>(false);
  auto getter = std::make_shared<std::optional<AttrGetter>>();
  auto test = std::make_shared<std::optional<std::string>>();
  auto targs = std::make_shared<Args>();
  return in.make_generator("generator", v, [=](Interp& in, Value& out) {
    if (!*started) {
      *started = true;
      if (!value.truthy()) return false;
      size_t off = 0;
      if (attr) {
        if (args.pos.empty()) runtime_error("Missing parameter for attribute name");
        *getter = AttrGetter{attribute_parts(args.pos[0])};
        off = 1;
      }
      if (args.pos.size() > off) {
        if (!args.pos[off].is_str()) {
          if (!hashable(args.pos[off])) type_error("unhashable type: " + py::repr(args.pos[off].type_name()));
          runtime_error("No test named " + args.pos[off].to_str() + ".");
        }
        *test = args.pos[off].str();
        targs->pos.assign(args.pos.begin() + static_cast<std::ptrdiff_t>(off) + 1, args.pos.end());
        targs->kw = args.kw;
      }
      *state = in.iter(value);
    }
    if (!*state) return false;
    Value x;
    while ((*state)->next(in, x)) {
      in.step();
      Value t = *getter ? (**getter)(in, x) : x;
      bool r;
      if (*test) {
        Args ta = *targs;
        r = in.apply_test(**test, t, ta, 0);
      } else {
        r = t.truthy();
      }
      if (r == select) {
        out = x;
        return true;
      }
    }
    return false;
  });
}

Value f_select(Interp& in, const Value& v, Args& a) { return select_reject(in, v, a, true, false); }
Value f_reject(Interp& in, const Value& v, Args& a) { return select_reject(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, Args& a) { return select_reject(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, Args& a) { return select_reject(in, v, a, false, true); }

Value f_replace(Interp& in, const Value& v, Args& a) {
  Params p(a, "replace", {"old", "new", "count"});
  std::string old = p.required(0).to_str(), nw = p.required(1).to_str();
  int64_t count = -1;
  if (p.has(2) && !p.get(2)->is_none()) count = to_index(*p.get(2));
  return in.make_str(py::replace(v.to_str(), old, nw, count));
}

Value f_reverse(Interp& in, const Value& v, Args& a) {
  Params p(a, "reverse", {}, false);
  if (v.is_str()) {
    std::u32string u = py::decode(v.str());
    std::reverse(u.begin(), u.end());
    return in.make_str(py::encode(u), v.is_markup());
  }
  if (v.is_list() || v.is_dict() || v.is_undefined()) {
    std::vector<Value> items = v.is_undefined() ? std::vector<Value>{} : in.to_list(v);
    std::reverse(items.begin(), items.end());
    return in.make_generator("list_reverseiterator", v, [items = std::move(items), i = size_t{0}](Interp&, Value& out) mutable {
      if (i >= items.size()) return false;
      out = items[i++];
      return true;
    });
  }
  if (v.is_iterator()) {
    // reversed() refused the generator; list(value) then turns any TypeError into this error.
    std::vector<Value> items;
    try {
      items = in.to_list(v);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kType) throw;
      runtime_error("argument must be iterable");
    }
    std::reverse(items.begin(), items.end());
    return in.make_list(std::move(items));
  }
  runtime_error("argument must be iterable");
}

Value f_round(Interp& in, const Value& v, Args& a) {
  Params p(a, "round", {"precision", "method"});
  int64_t prec = p.has(0) ? to_index(*p.get(0)) : 0;
  Value method = p.get_or(1, Value::string("common"));
  if (!method.is_str() || (method.str() != "common" && method.str() != "ceil" && method.str() != "floor"))
    runtime_error("method must be common, ceil or floor");
  if (method.str() == "common") {
    if (!v.is_number()) type_error("type " + std::string(v.type_name()) + " doesn't define __round__ method");
    if (v.is_integral()) {
      if (prec >= 0) return Value::integer(v.get_int());
      // round(int, -n) rounds half to even at 10**n
      double r = py::round_float(static_cast<double>(v.get_int()), prec);
      return Value::integer(static_cast<int64_t>(r));
    }
    return Value::number(py::round_float(v.get_float(), prec));
  }
  // math.ceil/floor(value * 10 ** precision) / 10 ** precision
  double scale = std::pow(10.0, static_cast<double>(prec));
  Value scaled =
      in.binop(BinOp::kMul, v, prec >= 0 && prec <= 18 ? Value::integer(static_cast<int64_t>(scale)) : Value::number(scale));
  if (!scaled.is_number()) type_error("must be real number, not " + std::string(scaled.type_name()));
  double x = scaled.to_double();
  if (std::isinf(x)) throw Error(ErrorKind::kValue, "cannot convert float infinity to integer");
  if (std::isnan(x)) throw Error(ErrorKind::kValue, "cannot convert float NaN to integer");
  x = method.str() == "ceil" ? std::ceil(x) : std::floor(x);
  return Value::number(x / scale);
}

Value f_safe(Interp& in, const Value& v, Args& a) {
  Params p(a, "safe", {}, false);
  if (v.is_markup()) return v;
  return in.make_str(v.to_str(), true);
}

Value f_slice(Interp& in, const Value& v, Args& a) {
  Params p(a, "slice", {"slices", "fill_with"});
  if (p.required(0).is_undefined()) p.required(0).fail_undefined();  // len(seq) // slices
  int64_t slices = to_index(p.required(0));
  Value fill = p.get_or(1, Value::none());
  std::vector<Value> seq = in.to_list(v);
  int64_t length = static_cast<int64_t>(seq.size());
  if (slices == 0) throw Error(ErrorKind::kValue, "integer division or modulo by zero");
  int64_t per = length / slices, extra = length % slices;
  if (per * slices > length) --per;  // floor division for negative slices
  std::vector<Value> out;
  int64_t offset = 0;
  for (int64_t sn = 0; sn < slices; ++sn) {
    in.step();
    int64_t start = offset + sn * per;
    if (sn < extra) ++offset;
    int64_t end = offset + (sn + 1) * per;
    std::vector<Value> tmp;
    for (int64_t i = std::max<int64_t>(0, start); i < std::min(end, length); ++i) tmp.push_back(seq[static_cast<size_t>(i)]);
    if (!fill.is_none() && sn >= extra) tmp.push_back(fill);
    out.push_back(in.make_list(std::move(tmp)));
  }
  return in.make_generator("generator", v, [out = std::move(out), i = size_t{0}](Interp&, Value& o) mutable {
    if (i >= out.size()) return false;
    o = out[i++];
    return true;
  });
}

Value f_sort(Interp& in, const Value& v, Args& a) {
  Params p(a, "sort", {"reverse", "case_sensitive", "attribute"});
  bool rev = to_index(p.get_or(0, Value::boolean(false))) != 0;  // sorted() wants an int
  bool cs = p.get_or(1, Value::boolean(false)).truthy();
  Value attr = p.get_or(2, Value::none());
  std::vector<std::vector<Value>> getters;
  if (attr.is_str()) {
    for (auto& part : py::split(attr.str(), std::string_view(","), -1)) getters.push_back(attribute_parts(Value::string(part)));
  } else {
    getters.push_back(attribute_parts(attr));
  }
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& x : in.to_list(v)) {
    std::vector<Value> key;
    for (const auto& parts : getters) {
      AttrGetter g{parts};
      g.lower = !cs;
      key.push_back(g(in, x));
    }
    keyed.emplace_back(in.make_list(std::move(key)), x);
  }
  return in.make_list(sorted_by(in, std::move(keyed), rev));
}

Value f_string(Interp& in, const Value& v, Args& a) {
  Params p(a, "string", {}, false);
  return soft_str(in, v);
}

Value f_striptags(Interp& in, const Value& v, Args& a) {
  Params p(a, "striptags", {}, false);
  std::string s = v.to_str();
  // Drop comments, then tags.
  std::string t;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 4, "<!--") == 0) {
      size_t e = s.find("-->", i + 4);
      if (e == std::string::npos) {
        t.append(s, i, std::string::npos);
        break;
      }
      i = e + 3;
      continue;
    }
    t.push_back(s[i++]);
  }
  std::string u;
  // The next '>' is looked up once and reused while it lies ahead: searching again from every '<' made a text of
  // '<' without any '>' quadratic (2 MB of "<a~" took 4 s, a 64 MB one hours).
  size_t gt = 0;
  bool gt_known = false;
  for (size_t i = 0; i < t.size();) {
    if (t[i] == '<') {
      if (!gt_known || (gt != std::string::npos && gt <= i)) {
        gt = t.find('>', i + 1);
        gt_known = true;
      }
      if (gt != std::string::npos) {
        i = gt + 1;
        continue;
      }
    }
    u.push_back(t[i++]);
  }
  std::vector<std::string> words = py::split(u, std::nullopt, -1);
  std::string joined;
  for (size_t i = 0; i < words.size(); ++i) joined += (i ? " " : "") + words[i];
  // html.unescape for numeric references and the common named ones (the legacy names also
  // without ';', as HTML5 allows).
  static const std::pair<const char*, const char*> kEnt[] = {
      {"amp", "&"},        {"lt", "<"},  {"gt", ">"}, {"quot", "\""}, {"nbsp", "\xc2\xa0"}, {"copy", "\xc2\xa9"},
      {"reg", "\xc2\xae"}, {"AMP", "&"}, {"LT", "<"}, {"GT", ">"},    {"QUOT", "\""}};
  std::string r;
  for (size_t i = 0; i < joined.size();) {
    if (joined[i] == '&' && i + 1 < joined.size()) {
      if (joined[i + 1] == '#') {
        size_t k = i + 2;
        bool hex = k < joined.size() && (joined[k] == 'x' || joined[k] == 'X');
        if (hex) ++k;
        size_t d0 = k;
        uint32_t cp = 0;
        while (k < joined.size() && (hex ? std::isxdigit(static_cast<unsigned char>(joined[k]))
                                         : std::isdigit(static_cast<unsigned char>(joined[k])))) {
          cp = std::min<uint32_t>(cp * (hex ? 16 : 10) + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(joined[k]))
                                                                                   ? joined[k] - '0'
                                                                                   : (joined[k] | 0x20) - 'a' + 10),
                                  0x110000);
          ++k;
        }
        if (k > d0) {
          if (k < joined.size() && joined[k] == ';') ++k;
          if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) cp = 0xFFFD;
          py::utf8_append(r, static_cast<char32_t>(cp));
          i = k;
          continue;
        }
      } else {
        bool done = false;
        for (const auto& e : kEnt) {
          size_t l = std::char_traits<char>::length(e.first);
          if (joined.compare(i + 1, l, e.first) == 0) {
            r += e.second;
            i += 1 + l;
            if (i < joined.size() && joined[i] == ';') ++i;
            done = true;
            break;
          }
        }
        if (done) continue;
        if (joined.compare(i + 1, 5, "apos;") == 0) {
          r += "'";
          i += 6;
          continue;
        }
      }
    }
    r.push_back(joined[i++]);
  }
  return in.make_str(std::move(r));
}

Value f_sum(Interp& in, const Value& v, Args& a) {
  Params p(a, "sum", {"attribute", "start"});
  Value acc = p.get_or(1, Value::integer(0));
  if (acc.is_str()) type_error("sum() can't sum strings [use ''.join(seq) instead]");
  std::optional<AttrGetter> g;
  if (p.has(0) && !p.get(0)->is_none()) g = AttrGetter{attribute_parts(*p.get(0))};
  for (auto& x : in.to_list(v)) {
    Value item = g ? (*g)(in, x) : x;
    if (item.is_undefined()) item.fail_undefined();
    if (acc.is_number() && item.is_number()) {
      if (!acc.is_float() && !item.is_float()) {
        int64_t r;
        if (__builtin_add_overflow(acc.get_int(), item.get_int(), &r)) value_error("integer overflow");
        acc = Value::integer(r);
      } else {
        acc = Value::number(acc.to_double() + item.to_double());
      }
    } else if (acc.is_list() && item.is_list() && acc.list_obj().kind == item.list_obj().kind) {
      std::vector<Value> c = acc.items();
      c.insert(c.end(), item.items().begin(), item.items().end());
      acc = in.make_list(std::move(c), acc.list_obj().kind);
    } else {
      type_error(std::string("unsupported operand type(s) for +: ") + py::repr(acc.type_name()) + " and " +
                 py::repr(item.type_name()));
    }
  }
  return acc;
}

Value f_title(Interp& in, const Value& v, Args& a) {
  Params p(a, "title", {}, false);
  // jinja2 splits before runs of [-\s({\[<] and capitalises each piece.
  std::u32string u = py::decode(v.to_str());
  auto is_sep = [](char32_t c) { return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py::is_space(c); };
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i;
    bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    std::string piece = py::encode(std::u32string_view(u).substr(i, j - i));
    out += py::upper_first_lower_rest(piece);
    i = j;
  }
  return in.make_str(std::move(out));
}

Value f_tojson(Interp& in, const Value& v, Args& a) {
  // transformers: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=False)
  Params p(a, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  bool ensure_ascii = p.get_or(0, Value::boolean(false)).truthy();
  Value indent = p.get_or(1, Value::none());
  bool sort_keys = p.get_or(3, Value::boolean(false)).truthy();
  std::string item_sep = indent.is_none() ? ", " : ",", key_sep = ": ";
  if (p.has(2) && !p.get(2)->is_none()) {
    std::vector<Value> seps = in.to_list(*p.get(2));
    if (seps.size() != 2) value_error("not enough values to unpack (expected 2, got " + std::to_string(seps.size()) + ")");
    if (!seps[0].is_str() || !seps[1].is_str()) type_error("separators must be strings");
    item_sep = seps[0].str();
    key_sep = seps[1].str();
  }
  return in.make_str(json_dumps(in, v, ensure_ascii, indent, item_sep, key_sep, sort_keys));
}

Value f_trim(Interp& in, const Value& v, Args& a) {
  Params p(a, "trim", {"chars"});
  Value s = soft_str(in, v);
  return in.make_str(py::strip(s.str(), opt_chars(p.get(0), "strip"), py::StripSide::kBoth), s.is_markup());
}

Value f_truncate(Interp& in, const Value& v, Args& a) {
  Params p(a, "truncate", {"length", "killwords", "end", "leeway"});
  int64_t length = p.has(0) ? to_index(*p.get(0)) : 255;
  bool kill = p.get_or(1, Value::boolean(false)).truthy();
  std::string end = p.has(2) ? need_str(*p.get(2), "end") : "...";
  int64_t leeway = (p.has(3) && !p.get(3)->is_none()) ? to_index(*p.get(3)) : 5;
  int64_t end_len = static_cast<int64_t>(py::cp_len(end));
  if (length < end_len) runtime_error("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) runtime_error("expected leeway >= 0, got " + std::to_string(leeway));
  const std::string& s = need_str(v, "truncate value");
  std::u32string u = py::decode(s);
  if (static_cast<int64_t>(u.size()) <= length + leeway) return v;
  std::string head = py::encode(u.substr(0, static_cast<size_t>(length - end_len)));
  if (kill) return in.make_str(head + end);
  auto parts = py::rsplit(head, std::string_view(" "), 1);
  return in.make_str(parts[0] + end);
}

Value f_unique(Interp& in, const Value& v, Args& a) {
  Params p(a, "unique", {"case_sensitive", "attribute"});
  bool cs = p.get_or(0, Value::boolean(false)).truthy();
  AttrGetter g{attribute_parts(p.get_or(1, Value::none()))};
  g.lower = !cs;
  Value value = v;
  auto src = std::make_shared<std::shared_ptr<Object>>();
  auto seen = std::make_shared<std::vector<Value>>();
  return in.make_generator("generator", v, [value, g, src, seen](Interp& in, Value& out) {
    if (!*src) *src = in.iter(value);
    Value x;
    while ((*src)->next(in, x)) {
      Value key = g(in, x);
      if (!hashable(key)) type_error("unhashable type: " + py::repr(key.type_name()));
      bool dup = false;
      for (const auto& s : *seen) {
        in.step();
        if (py_eq(s, key)) {
          dup = true;
          break;
        }
      }
      if (!dup) {
        seen->push_back(key);
        out = x;
        return true;
      }
    }
    return false;
  });
}

std::string url_quote(const std::string& s, bool for_qs) {
  std::string out;
  static const char* hex = "0123456789ABCDEF";
  for (unsigned char c : s) {
    bool keep = std::isalnum(c) || c == '_' || c == '.' || c == '-' || c == '~' || (!for_qs && c == '/');
    if (keep) {
      out.push_back(static_cast<char>(c));
    } else if (for_qs && c == ' ') {
      out.push_back('+');
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

Value f_urlencode(Interp& in, const Value& v, Args& a) {
  Params p(a, "urlencode", {}, false);
  if (v.is_str() || !(v.is_list() || v.is_dict() || v.is_iterator() || v.is_undefined()))
    return in.make_str(url_quote(v.to_str(), false));
  std::vector<std::pair<Value, Value>> items;
  if (v.is_dict()) {
    items.assign(v.dict_obj().items.begin(), v.dict_obj().items.end());
  } else {
    for (auto& x : in.to_list(v)) {
      auto kv = in.to_list(x);
      if (kv.size() != 2) value_error("too many values to unpack (expected 2)");
      items.emplace_back(kv[0], kv[1]);
    }
  }
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += "&";
    out += url_quote(items[i].first.to_str(), true) + "=" + url_quote(items[i].second.to_str(), true);
  }
  return in.make_str(std::move(out));
}

Value f_wordcount(Interp&, const Value& v, Args& a) {
  Params p(a, "wordcount", {}, false);
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : py::decode(v.to_str())) {
    bool w = py::is_word(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}

Value f_xmlattr(Interp& in, const Value& v, Args& a) {
  Params p(a, "xmlattr", {"autospace"});
  bool autospace = p.get_or(0, Value::boolean(true)).truthy();
  if (v.is_undefined()) v.fail_undefined();
  if (!v.is_dict()) type_error(py::repr(v.type_name()) + " object has no attribute 'items'");
  std::string rv;
  for (const auto& kv : v.dict_obj().items) {
    if (kv.second.is_none() || kv.second.is_undefined()) continue;
    std::string key = kv.first.to_str();
    for (char c : key)
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == '/' || c == '>' || c == '=')
        value_error("Invalid character in attribute name: " + py::repr(key));
    if (!rv.empty()) rv += " ";
    rv += py::escape_html(key) + "=\"" + (kv.second.is_markup() ? kv.second.str() : py::escape_html(kv.second.to_str())) + "\"";
  }
  if (autospace && !rv.empty()) rv = " " + rv;
  return in.make_str(std::move(rv));
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = {
      {"abs", f_abs},
      {"attr", f_attr},
      {"batch", f_batch},
      {"capitalize", f_capitalize},
      {"center", f_center},
      {"count", f_length},
      {"d", f_default},
      {"default", f_default},
      {"dictsort", f_dictsort},
      {"e", f_escape},
      {"escape", f_escape},
      {"filesizeformat", f_filesizeformat},
      {"first", f_first},
      {"float", f_float},
      {"forceescape", f_forceescape},
      {"format", f_format},
      {"groupby", f_groupby},
      {"indent", f_indent},
      {"int", f_int},
      {"items", f_items},
      {"join", f_join},
      {"last", f_last},
      {"length", f_length},
      {"list", f_list},
      {"lower", f_lower},
      {"map", f_map},
      {"max", f_max},
      {"min", f_min},
      {"random", f_random},
      {"reject", f_reject},
      {"rejectattr", f_rejectattr},
      {"replace", f_replace},
      {"reverse", f_reverse},
      {"round", f_round},
      {"safe", f_safe},
      {"select", f_select},
      {"selectattr", f_selectattr},
      {"slice", f_slice},
      {"sort", f_sort},
      {"string", f_string},
      {"striptags", f_striptags},
      {"sum", f_sum},
      {"title", f_title},
      {"tojson", f_tojson},
      {"trim", f_trim},
      {"truncate", f_truncate},
      {"unique", f_unique},
      {"upper", f_upper},
      {"urlencode", f_urlencode},
      {"wordcount", f_wordcount},
      {"xmlattr", f_xmlattr},
  };
  return kFilters;
}

// ------------------------------------------------------------------------------------------------
// Tests
using TestFn = bool (*)(Interp&, const Value&, Args&);

const Value& test_arg(Args& a, const char* name) {
  Params p(a, name, {"other"});
  return p.required(0);
}

// value % num == r, with Python's % (so a string value is a printf format).
bool mod_equals(Interp& in, const Value& v, const Value& num, int64_t r) {
  return py_eq(in.binop(BinOp::kMod, v, num), Value::integer(r));
}
bool t_odd(Interp& in, const Value& v, Args& a) {
  Params p(a, "odd", {}, false);
  return mod_equals(in, v, Value::integer(2), 1);
}
bool t_even(Interp& in, const Value& v, Args& a) {
  Params p(a, "even", {}, false);
  return mod_equals(in, v, Value::integer(2), 0);
}
bool t_divisibleby(Interp& in, const Value& v, Args& a) {
  Params p(a, "divisibleby", {"num"});
  return mod_equals(in, v, p.required(0), 0);
}
bool t_defined(Interp&, const Value& v, Args& a) {
  Params p(a, "defined", {}, false);
  return !v.is_undefined();
}
bool t_undefined(Interp&, const Value& v, Args& a) {
  Params p(a, "undefined", {}, false);
  return v.is_undefined();
}
bool t_filter(Interp&, const Value& v, Args& a) {
  Params p(a, "filter", {}, false);
  if (!hashable(v)) type_error("unhashable type: " + py::repr(v.type_name()));
  return v.is_str() && filters().count(v.str());
}
bool t_test(Interp&, const Value& v, Args& a);
bool t_none(Interp&, const Value& v, Args& a) {
  Params p(a, "none", {}, false);
  return v.is_none();
}
bool t_boolean(Interp&, const Value& v, Args& a) {
  Params p(a, "boolean", {}, false);
  return v.is_bool();
}
bool t_false(Interp&, const Value& v, Args& a) {
  Params p(a, "false", {}, false);
  return v.is_bool() && !v.get_bool();
}
bool t_true(Interp&, const Value& v, Args& a) {
  Params p(a, "true", {}, false);
  return v.is_bool() && v.get_bool();
}
bool t_integer(Interp&, const Value& v, Args& a) {
  Params p(a, "integer", {}, false);
  return v.is_int();
}
bool t_float(Interp&, const Value& v, Args& a) {
  Params p(a, "float", {}, false);
  return v.is_float();
}
bool t_lower(Interp&, const Value& v, Args& a) {
  Params p(a, "lower", {}, false);
  return py::str_islower(v.to_str());
}
bool t_upper(Interp&, const Value& v, Args& a) {
  Params p(a, "upper", {}, false);
  return py::str_isupper(v.to_str());
}
bool t_string(Interp&, const Value& v, Args& a) {
  Params p(a, "string", {}, false);
  return v.is_str();
}
bool t_mapping(Interp&, const Value& v, Args& a) {
  Params p(a, "mapping", {}, false);
  return v.is_dict();
}
bool t_number(Interp&, const Value& v, Args& a) {
  Params p(a, "number", {}, false);
  return v.is_number();
}
bool t_sequence(Interp&, const Value& v, Args& a) {
  Params p(a, "sequence", {}, false);
  if (v.is_str() || v.is_dict() || v.is_undefined()) return true;
  if (v.is_list()) {
    ListKind k = v.list_obj().kind;
    return k == ListKind::kList || k == ListKind::kTuple || k == ListKind::kRange;
  }
  return false;
}
bool t_iterable(Interp&, const Value& v, Args& a) {
  Params p(a, "iterable", {}, false);
  return v.is_str() || v.is_list() || v.is_dict() || v.is_undefined() || v.is_iterator();
}
bool t_callable(Interp&, const Value& v, Args& a) {
  Params p(a, "callable", {}, false);
  return v.is_undefined() || v.is_callable();
}
bool t_sameas(Interp&, const Value& v, Args& a) { return v.same_as(test_arg(a, "sameas")); }
bool t_escaped(Interp&, const Value& v, Args& a) {
  Params p(a, "escaped", {}, false);
  return v.is_markup();
}
bool t_in(Interp& in, const Value& v, Args& a);
bool t_eq(Interp&, const Value& v, Args& a) { return py_eq(v, test_arg(a, "eq")); }
bool t_ne(Interp&, const Value& v, Args& a) { return !py_eq(v, test_arg(a, "ne")); }
bool t_gt(Interp&, const Value& v, Args& a) { return py_lt(test_arg(a, "gt"), v); }
bool t_ge(Interp&, const Value& v, Args& a) {
  const Value& o = test_arg(a, "ge");
  return py_lt(o, v) || py_eq(o, v);
}
bool t_lt(Interp&, const Value& v, Args& a) { return py_lt(v, test_arg(a, "lt")); }
bool t_le(Interp&, const Value& v, Args& a) {
  const Value& o = test_arg(a, "le");
  return py_lt(v, o) || py_eq(v, o);
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> kTests = {
      {"odd", t_odd},
      {"even", t_even},
      {"divisibleby", t_divisibleby},
      {"defined", t_defined},
      {"undefined", t_undefined},
      {"filter", t_filter},
      {"test", t_test},
      {"none", t_none},
      {"boolean", t_boolean},
      {"false", t_false},
      {"true", t_true},
      {"integer", t_integer},
      {"float", t_float},
      {"lower", t_lower},
      {"upper", t_upper},
      {"string", t_string},
      {"mapping", t_mapping},
      {"number", t_number},
      {"sequence", t_sequence},
      {"iterable", t_iterable},
      {"callable", t_callable},
      {"sameas", t_sameas},
      {"escaped", t_escaped},
      {"in", t_in},
      {"==", t_eq},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"!=", t_ne},
      {"ne", t_ne},
      {">", t_gt},
      {"gt", t_gt},
      {"greaterthan", t_gt},
      {"ge", t_ge},
      {">=", t_ge},
      {"<", t_lt},
      {"lt", t_lt},
      {"lessthan", t_lt},
      {"<=", t_le},
      {"le", t_le},
  };
  return kTests;
}

bool t_test(Interp&, const Value& v, Args& a) {
  Params p(a, "test", {}, false);
  if (!hashable(v)) type_error("unhashable type: " + py::repr(v.type_name()));
  return v.is_str() && tests().count(v.str());
}

bool t_in(Interp& in, const Value& v, Args& a) {
  const Value& seq = test_arg(a, "in");
  // Reuse the interpreter's `in` operator via a tiny expression-free path.
  if (seq.is_str()) {
    if (!v.is_str()) type_error("'in <string>' requires string as left operand, not " + std::string(v.type_name()));
    return py::find_bytes(seq.str(), v.str()) != std::string::npos;
  }
  if (seq.is_dict()) {
    if (!hashable(v)) type_error("unhashable type: " + py::repr(v.type_name()));
    return seq.dict_obj().find(v) != nullptr;
  }
  if (seq.is_undefined()) return false;
  if (seq.is_list() || seq.is_iterator()) {
    auto it = in.iter(seq);
    Value x;
    while (it->next(in, x)) {
      in.step();
      if (py_eq(x, v)) return true;
    }
    return false;
  }
  type_error("argument of type " + py::repr(seq.type_name()) + " is not iterable");
}

}  // namespace

bool is_known_filter(const std::string& name) { return filters().count(name) > 0; }
bool is_known_test(const std::string& name) { return tests().count(name) > 0; }

bool call_filter(Interp& in, const std::string& name, const Value& v, Args& args, Value& out) {
  auto it = filters().find(name);
  if (it == filters().end()) return false;
  out = it->second(in, v, args);
  return true;
}

bool call_test(Interp& in, const std::string& name, const Value& v, Args& args, bool& out) {
  auto it = tests().find(name);
  if (it == tests().end()) return false;
  out = it->second(in, v, args);
  return true;
}

// ------------------------------------------------------------------------------------------------
// Globals
namespace {

class CyclerObj final : public Object {
 public:
  explicit CyclerObj(std::vector<Value> items) : items_(std::move(items)) {}
  const char* type_name() const override { return "Cycler"; }
  bool get_attr(Interp&, const std::string& name, Value& out) override {
    if (name == "current") {
      out = items_[pos_];
      return true;
    }
    if (name == "items") {
      out = Value::tuple(items_);
      return true;
    }
    if (name == "next" || name == "reset") {
      auto self = std::static_pointer_cast<CyclerObj>(shared_from_this());
      bool nxt = name == "next";
      out = Value::object(std::make_shared<BuiltinFn>(
          name,
          [self, nxt](Interp&, Args& a) -> Value {
            if (!a.pos.empty() || !a.kw.empty()) type_error("takes no arguments");
            if (!nxt) {
              self->pos_ = 0;
              return Value::none();
            }
            Value rv = self->items_[self->pos_];
            self->pos_ = (self->pos_ + 1) % self->items_.size();
            return rv;
          },
          "Cycler"));
      return true;
    }
    return false;
  }

 private:
  std::vector<Value> items_;
  size_t pos_ = 0;
};

class JoinerObj final : public Object {
 public:
  explicit JoinerObj(Value sep) : sep_(std::move(sep)) {}
  const char* type_name() const override { return "Joiner"; }
  bool callable() const override { return true; }
  Value call(Interp&, Args& a) override {
    if (!a.pos.empty() || !a.kw.empty()) type_error("Joiner.__call__() takes no arguments");
    if (!used_) {
      used_ = true;
      return Value::string("");
    }
    return sep_;
  }

 private:
  Value sep_;
  bool used_ = false;
};

Value g_range(Interp& in, Args& a) {
  if (!a.kw.empty()) type_error("range() takes no keyword arguments");
  if (a.pos.empty() || a.pos.size() > 3) type_error("range expected at most 3 arguments, got " + std::to_string(a.pos.size()));
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    stop = to_index(a.pos[0]);
  } else {
    start = to_index(a.pos[0]);
    stop = to_index(a.pos[1]);
    if (a.pos.size() == 3) step = to_index(a.pos[2]);
  }
  if (step == 0) throw Error(ErrorKind::kValue, "range() arg 3 must not be zero");
  __int128 len = 0;
  if (step > 0 && stop > start) len = (static_cast<__int128>(stop) - start + step - 1) / step;
  if (step < 0 && stop < start) len = (static_cast<__int128>(start) - stop - step - 1) / -step;
  // jinja2's sandbox refuses ranges over MAX_RANGE items.
  if (len > 100000) throw Error(ErrorKind::kValue, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(len));
  for (__int128 i = 0; i < len; ++i) items.push_back(Value::integer(static_cast<int64_t>(start + i * step)));
  Value r = in.make_list(std::move(items), ListKind::kRange);
  r.list_obj().r_start = start;
  r.list_obj().r_stop = stop;
  r.list_obj().r_step = step;
  return r;
}

Value dict_from(Interp& in, Args& a, const char* fname) {
  auto d = std::make_shared<DictObj>();
  if (a.pos.size() > 1) type_error(std::string(fname) + " expected at most 1 argument, got " + std::to_string(a.pos.size()));
  if (a.pos.size() == 1) {
    const Value& src = a.pos[0];
    if (src.is_undefined()) src.fail_undefined();  // dict() probes .keys() first
    if (src.is_dict()) {
      *d = src.dict_obj();
    } else if (src.is_object() && src.obj().is_namespace()) {
      type_error("'Namespace' object is not iterable");
    } else {
      size_t idx = 0;
      for (auto& item : in.to_list(src)) {
        std::vector<Value> kv = item.is_str() ? std::vector<Value>{} : in.to_list(item);
        if (kv.size() != 2)
          value_error("dictionary update sequence element #" + std::to_string(idx) + " has length " +
                      std::to_string(item.is_str() ? item.str_len() : static_cast<int64_t>(kv.size())) + "; 2 is required");
        if (!hashable(kv[0])) type_error("unhashable type: " + py::repr(kv[0].type_name()));
        d->set(kv[0], kv[1]);
        ++idx;
      }
    }
  }
  for (auto& kv : a.kw) d->set(Value::string(kv.first), kv.second);
  uint32_t depth = 0;
  for (const auto& kv : d->items) depth = std::max({depth, nest_depth(kv.first), nest_depth(kv.second)});
  check_nest_depth(depth + 1);
  d->depth = depth + 1;
  in.charge_bytes(d->items.size() * 2 * sizeof(Value));
  return Value::dict(std::move(d));
}

}  // namespace

void install_globals(Interp& in, Scope& g) {
  auto fn = [](const char* name, BuiltinFn::Fn f) { return Value::object(std::make_shared<BuiltinFn>(name, std::move(f))); };
  g.set("range", fn("range", g_range));
  g.set("dict", fn("dict", [](Interp& in, Args& a) { return dict_from(in, a, "dict"); }));
  g.set("namespace", fn("namespace", [](Interp& in, Args& a) {
          Value d = dict_from(in, a, "Namespace");
          auto ns = std::make_shared<NamespaceObj>();
          ns->attrs = d.dict_obj();
          ns->depth = d.dict_obj().depth;
          in.register_namespace(ns);
          return Value::object(ns);
        }));
  g.set("cycler", fn("cycler", [](Interp&, Args& a) {
          if (!a.kw.empty()) type_error("Cycler() takes no keyword arguments");
          if (a.pos.empty()) runtime_error("at least one item has to be provided");
          return Value::object(std::make_shared<CyclerObj>(a.pos));
        }));
  g.set("joiner", fn("joiner", [](Interp&, Args& a) {
          Params p(a, "Joiner", {"sep"});
          return Value::object(std::make_shared<JoinerObj>(p.get_or(0, Value::string(", "))));
        }));
  g.set("raise_exception", fn("raise_exception", [](Interp&, Args& a) -> Value {
          Params p(a, "raise_exception", {"message"});
          throw Error(ErrorKind::kRaised, p.required(0).to_str());
        }));
  g.set("strftime_now", fn("strftime_now", [](Interp& in, Args& a) {
          Params p(a, "strftime_now", {"format"});
          const Value& f = p.required(0);
          if (!f.is_str()) type_error("strftime() argument 1 must be str, not " + std::string(f.type_name()));
          DateTime now = in.options().now ? *in.options().now : local_now();
          return in.make_str(strftime(now, f.str()));
        }));
}

}  // namespace pg::jinja
