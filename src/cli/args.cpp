#include "cli/args.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace pg::cli {
namespace {

std::vector<std::string> split_names(const std::string& names) {
  std::vector<std::string> out;
  std::stringstream ss(names);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

int64_t parse_int(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || errno) throw Error("invalid integer '" + v + "' for " + flag);
  return x;
}

double parse_double(const std::string& flag, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || errno || !std::isfinite(x)) throw Error("invalid number '" + v + "' for " + flag);
  return x;
}

std::string num_text(double d) {
  std::ostringstream os;
  os << d;
  return os.str();
}

}  // namespace

Args::Args(std::string command, std::string summary) : command_(std::move(command)), summary_(std::move(summary)) {}

Args& Args::add(const std::string& names, bool takes_value, const std::string& meta, const std::string& help,
                std::function<void(const std::string&)> set, std::string default_text) {
  opts_.push_back(Opt{split_names(names), meta, help, takes_value, std::move(set), std::move(default_text)});
  return *this;
}

Args& Args::opt(const std::string& names, std::string* out, const std::string& help, const std::string& meta) {
  return add(names, true, meta, help, [out](const std::string& v) { *out = v; }, out->empty() ? "" : *out);
}
Args& Args::opt(const std::string& names, std::optional<std::string>* out, const std::string& help, const std::string& meta) {
  return add(names, true, meta, help, [out](const std::string& v) { *out = v; }, "");
}
Args& Args::opt(const std::string& names, std::vector<std::string>* out, const std::string& help, const std::string& meta) {
  return add(names, true, meta, help, [out](const std::string& v) { out->push_back(v); }, "");
}
Args& Args::opt(const std::string& names, int* out, const std::string& help) {
  auto flag = split_names(names).back();
  return add(names, true, "N", help, [out, flag](const std::string& v) {
    int64_t x = parse_int(flag, v);
    if (x < INT32_MIN || x > INT32_MAX) throw Error("value " + v + " out of range for " + flag);
    *out = static_cast<int>(x);
  }, std::to_string(*out));
}
Args& Args::opt(const std::string& names, int64_t* out, const std::string& help) {
  auto flag = split_names(names).back();
  return add(names, true, "N", help, [out, flag](const std::string& v) { *out = parse_int(flag, v); }, std::to_string(*out));
}
Args& Args::opt(const std::string& names, double* out, const std::string& help) {
  auto flag = split_names(names).back();
  return add(names, true, "X", help, [out, flag](const std::string& v) { *out = parse_double(flag, v); }, num_text(*out));
}
Args& Args::opt(const std::string& names, float* out, const std::string& help) {
  auto flag = split_names(names).back();
  return add(names, true, "X", help, [out, flag](const std::string& v) { *out = static_cast<float>(parse_double(flag, v)); },
             num_text(*out));
}
Args& Args::flag(const std::string& names, bool* out, const std::string& help) {
  return add(names, false, "", help, [out](const std::string&) { *out = true; }, "");
}
Args& Args::positional(const std::string& name, std::string* out, const std::string& help, bool required) {
  pos_.push_back(Pos{name, help, out, required});
  return *this;
}
Args& Args::footer(const std::string& text) {
  footer_ = text;
  return *this;
}

bool Args::given(const std::string& long_name) const {
  for (const auto& g : given_)
    if (g == long_name) return true;
  return false;
}

std::string Args::help() const {
  std::ostringstream os;
  os << "usage: peregrine " << command_;
  for (const auto& p : pos_) os << (p.required ? " " : " [") << p.name << (p.required ? "" : "]");
  if (!opts_.empty()) os << " [options]";
  os << "\n\n" << summary_ << "\n";
  if (!pos_.empty()) {
    os << "\narguments:\n";
    for (const auto& p : pos_) os << "  " << p.name << std::string(p.name.size() < 28 ? 28 - p.name.size() : 1, ' ') << p.help << "\n";
  }
  os << "\noptions:\n";
  for (const auto& o : opts_) {
    std::string left;
    for (size_t i = 0; i < o.names.size(); ++i) left += (i ? ", " : "") + o.names[i];
    if (o.takes_value) left += " " + o.meta;
    os << "  " << left << std::string(left.size() < 28 ? 28 - left.size() : 1, ' ') << o.help;
    if (!o.default_text.empty()) os << " (default: " << o.default_text << ")";
    os << "\n";
  }
  os << "  -h, --help" << std::string(18, ' ') << "show this help\n";
  if (!footer_.empty()) os << "\n" << footer_ << "\n";
  return os.str();
}

bool Args::parse(int argc, char** argv, int first) {
  size_t next_pos = 0;
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    if (a.size() > 1 && a[0] == '-' && !(a.size() > 1 && (std::isdigit(static_cast<unsigned char>(a[1])) || a[1] == '.'))) {
      std::string value;
      bool has_inline = false;
      if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_inline = true;
      }
      const Opt* found = nullptr;
      for (const auto& o : opts_)
        for (const auto& n : o.names)
          if (n == a) found = &o;
      if (!found) throw Error("unknown option '" + a + "' for '" + command_ + "' (see peregrine " + command_ + " --help)");
      if (found->takes_value) {
        if (!has_inline) {
          if (i + 1 >= argc) throw Error("option " + a + " needs a value");
          value = argv[++i];
        }
        found->set(value);
      } else {
        if (has_inline) throw Error("option " + a + " takes no value");
        found->set("");
      }
      std::string long_name = found->names.back();
      while (!long_name.empty() && long_name[0] == '-') long_name.erase(0, 1);
      given_.push_back(long_name);
      continue;
    }
    if (next_pos >= pos_.size()) throw Error("unexpected argument '" + a + "' for '" + command_ + "'");
    *pos_[next_pos++].out = a;
  }
  for (size_t i = next_pos; i < pos_.size(); ++i)
    if (pos_[i].required) throw Error("missing argument " + pos_[i].name + " for '" + command_ + "' (see --help)");
  return true;
}

std::vector<int32_t> parse_id_list(const std::string& s) {
  std::vector<int32_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    if (b == std::string::npos) throw Error("empty item in id list '" + s + "'");
    item = item.substr(b, e - b + 1);
    errno = 0;
    char* end = nullptr;
    long long x = std::strtoll(item.c_str(), &end, 10);
    if (*end || errno || x < 0 || x > INT32_MAX) throw Error("invalid token id '" + item + "'");
    out.push_back(static_cast<int32_t>(x));
  }
  return out;
}

}  // namespace pg::cli
