#include "gguf/inspect.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace pg::gguf {
namespace {

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

std::string pad_right(const std::string& s, size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }
std::string pad_left(const std::string& s, size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }

// Display width in terminal columns, counting a UTF-8 sequence as one column (good enough for keys).
size_t columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xc0) != 0x80) ++n;
  return n;
}

std::string pad_cols(const std::string& s, size_t w) {
  const size_t c = columns(s);
  return c >= w ? s : s + std::string(w - c, ' ');
}

// Whole numbers print in full ("10000", "1000000" for rope bases) rather than as "1e+04".
bool print_whole(double x) { return std::isfinite(x) && x == std::trunc(x) && std::fabs(x) < 1e16; }

}  // namespace

std::string format_f32(float x) {
  char buf[64];
  if (print_whole(x)) return fmt("%.0f", x);
  for (int prec = 1; prec <= 9; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, static_cast<double>(x));
    if (std::strtof(buf, nullptr) == x) return buf;
  }
  return buf;  // NaN lands here; "%.9g" prints "nan"
}

std::string format_f64(double x) {
  char buf[64];
  if (print_whole(x)) return fmt("%.0f", x);
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*g", prec, x);
    if (std::strtod(buf, nullptr) == x) return buf;
  }
  return buf;
}

std::string type_string(const Value& v) {
  if (v.type != ValueType::ARRAY) return value_type_name(v.type);
  const Array& a = v.as_array();
  std::string elem = a.elem_type == ValueType::ARRAY && !a.items.empty() ? type_string(a.items[0]) : value_type_name(a.elem_type);
  return "arr[" + elem + "," + std::to_string(a.items.size()) + "]";
}

std::string format_value(const Value& v, const InspectOptions& opt) {
  switch (v.type) {
    case ValueType::STRING: {
      const std::string& s = v.as_string();
      bool cut = false;
      std::string out(1, '"');
      out += escape_text(s, opt.max_string_bytes ? opt.max_string_bytes : s.size(), &cut, /*quoted=*/true);
      out.push_back('"');
      if (cut) out += " (" + std::to_string(s.size()) + " bytes)";
      return out;
    }
    case ValueType::ARRAY: {
      const Array& a = v.as_array();
      const size_t n = a.items.size();
      const size_t shown = opt.max_array_items ? std::min(n, opt.max_array_items) : n;
      std::string out = "[";
      for (size_t i = 0; i < shown; ++i) {
        if (i) out += ", ";
        out += format_value(a.items[i], opt);
      }
      if (shown < n) out += (shown ? ", ... (" : "... (") + std::to_string(n) + " items)";
      return out + "]";
    }
    case ValueType::BOOL:
      return v.as_bool() ? "true" : "false";
    case ValueType::FLOAT32:
      return format_f32(static_cast<float>(v.as_float()));
    case ValueType::FLOAT64:
      return format_f64(v.as_float());
    default:
      if (const auto* u = std::get_if<uint64_t>(&v.v)) return std::to_string(*u);
      return std::to_string(std::get<int64_t>(v.v));
  }
}

TensorTotals tensor_totals(const File& f) {
  TensorTotals t;
  for (const auto& ti : f.tensors()) {
    const auto params = static_cast<uint64_t>(ti.n_elements());
    t.tensors += 1;
    t.params += params;
    t.bytes += ti.nbytes;
    auto& bt = t.by_type[ti.type];
    bt.tensors += 1;
    bt.params += params;
    bt.bytes += ti.nbytes;
  }
  return t;
}

std::string with_commas(uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string human_bytes(uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double x = static_cast<double>(n);
  int u = 0;
  while (x >= 1024.0 && u < 6) {
    x /= 1024.0;
    ++u;
  }
  return u == 0 ? std::to_string(n) + " B" : fmt("%.2f", x) + " " + units[u];
}

std::string human_count(uint64_t n) {
  static const char* units[] = {"", "K", "M", "B", "T", "P", "E"};
  double x = static_cast<double>(n);
  int u = 0;
  while (x >= 1000.0 && u < 6) {
    x /= 1000.0;
    ++u;
  }
  return u == 0 ? std::to_string(n) : fmt("%.2f", x) + units[u];
}

void print_inspect(const File& f, std::ostream& os, const InspectOptions& opt) {
  os << "file:        " << escape_text(f.path(), 4096) << "\n";
  os << "version:     " << f.version() << "\n";
  os << "alignment:   " << f.alignment() << "\n";
  os << "data offset: " << f.data_offset() << "\n";
  os << "file size:   " << with_commas(f.file_size()) << " bytes (" << human_bytes(f.file_size()) << ")\n";
  os << "metadata:    " << f.metadata().size() << " keys\n";
  os << "tensors:     " << f.tensors().size() << "\n";

  if (!f.metadata().empty()) {
    std::vector<std::string> keys, types;
    size_t kw = 3, tw = 4;
    for (const auto& [key, v] : f.metadata()) {
      keys.push_back(escape_text(key, 96));
      types.push_back(type_string(v));
      kw = std::max(kw, columns(keys.back()));
      tw = std::max(tw, types.back().size());
    }
    os << "\nmetadata:\n  " << pad_right("key", kw) << "  " << pad_right("type", tw) << "  value\n";
    for (size_t i = 0; i < keys.size(); ++i)
      os << "  " << pad_cols(keys[i], kw) << "  " << pad_right(types[i], tw) << "  " << format_value(f.metadata()[i].second, opt)
         << "\n";
  }

  const auto totals = tensor_totals(f);
  if (opt.tensors && !f.tensors().empty()) {
    size_t nw = 4, sw = 5;
    std::vector<std::string> names;
    for (const auto& t : f.tensors()) {
      names.push_back(escape_text(t.name, 96));
      nw = std::max(nw, columns(names.back()));
      sw = std::max(sw, t.shape_string().size());
    }
    const size_t iw = std::max<size_t>(1, std::to_string(f.tensors().size() - 1).size());
    os << "\ntensors (offsets from the data section start):\n  " << pad_left("#", iw) << "  " << pad_right("name", nw) << "  "
       << pad_right("type", 7) << "  " << pad_right("shape", sw) << "  " << pad_left("offset", 14) << "  "
       << pad_left("bytes", 14) << "\n";
    for (size_t i = 0; i < f.tensors().size(); ++i) {
      const auto& t = f.tensors()[i];
      os << "  " << pad_left(std::to_string(i), iw) << "  " << pad_cols(names[i], nw) << "  "
         << pad_right(std::string(dtype_name(t.type)), 7) << "  " << pad_right(t.shape_string(), sw) << "  "
         << pad_left(std::to_string(t.offset), 14) << "  " << pad_left(std::to_string(t.nbytes), 14) << "\n";
    }
  }

  os << "\ntotals:\n";
  os << "  tensors:    " << totals.tensors << "\n";
  os << "  parameters: " << with_commas(totals.params) << " (" << human_count(totals.params) << ")\n";
  os << "  bytes:      " << with_commas(totals.bytes) << " (" << human_bytes(totals.bytes) << ")\n";
  if (!totals.by_type.empty()) {
    os << "  by type:\n";
    for (const auto& [type, bt] : totals.by_type) {
      const double bpw = bt.params ? 8.0 * static_cast<double>(bt.bytes) / static_cast<double>(bt.params) : 0.0;
      os << "    " << pad_right(std::string(dtype_name(type)), 8) << pad_left(std::to_string(bt.tensors), 5) << " tensors  "
         << pad_left(with_commas(bt.params), 17) << " params  " << pad_left(with_commas(bt.bytes), 17) << " bytes  ("
         << human_bytes(bt.bytes) << ", " << fmt("%.2f", bpw) << " bits/weight)\n";
    }
  }
}

std::string inspect(const File& f, const InspectOptions& opt) {
  std::ostringstream os;
  print_inspect(f, os, opt);
  return os.str();
}

}  // namespace pg::gguf
