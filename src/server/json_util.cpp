#include "server/json_util.h"

#include <chrono>
#include <cmath>
#include <random>
#include <unordered_map>
#include <vector>

namespace pg::server {

json openai_error_body(const ApiError& e) {
  json err = json::object();
  err["message"] = e.what();
  err["type"] = e.type();
  err["param"] = e.param().empty() ? json(nullptr) : json(e.param());
  err["code"] = e.code().empty() ? json(nullptr) : json(e.code());
  return json{{"error", err}};
}

json anthropic_error_body(const ApiError& e) {
  std::string type = "api_error";
  switch (e.status()) {
    case 400:
    case 409:
    case 422: type = "invalid_request_error"; break;
    case 401: type = "authentication_error"; break;
    case 403: type = "permission_error"; break;
    case 404: type = "not_found_error"; break;
    case 405: type = "invalid_request_error"; break;
    case 413: type = "request_too_large"; break;
    case 429: type = "rate_limit_error"; break;
    case 503:
    case 529: type = "overloaded_error"; break;
    default: type = e.status() >= 500 ? "api_error" : "invalid_request_error";
  }
  json err = json::object();
  err["type"] = type;
  err["message"] = e.what();
  json body = json::object();
  body["type"] = "error";
  body["error"] = err;
  return body;
}

json error_body(ApiFlavor f, const ApiError& e) {
  return f == ApiFlavor::kAnthropic ? anthropic_error_body(e) : openai_error_body(e);
}

namespace {

// Builds the ordered_json DOM from nlohmann's SAX events. nlohmann's own DOM builder inserts each
// member of an ordered_json object by a linear scan for a duplicate key, which makes parsing an
// object of n members O(n²): an 870 KB body of 80,000 distinct keys took 4.6 s, a 32 MB one would
// take hours. Here duplicates are found through a hash index once an object grows past a few
// members; the result is the same (a repeated key keeps its first position and its last value).
// The builder also bounds nesting: copying, serialising and rendering a JSON value recurse once per
// level, and a body of "[[[[..." a few hundred thousand deep (well within the body limit)
// overflowed the stack. Real requests, tool schemas included, nest a few dozen levels at most.
class DomBuilder {
 public:
  json root;

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(json(v)); }
  bool string(json::string_t& v) { return put(json(std::move(v))); }
  bool binary(json::binary_t& v) { return put(json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool start_array(std::size_t) { return open(json::array()); }
  bool key(json::string_t& k) {
    key_ = std::move(k);
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& e) {
    throw e;
  }

 private:
  static constexpr size_t kIndexFrom = 16;  // members before an object gets a hash index

  struct Frame {
    json* value;
    std::unordered_map<std::string, size_t> index;  // key -> member position, once indexed
  };

  bool open(json&& container) {
    if (stack_.size() >= static_cast<size_t>(kMaxBodyDepth))
      throw bad_request("the request nests objects and arrays more than " + std::to_string(kMaxBodyDepth) + " levels deep");
    json* p = put(std::move(container));
    stack_.push_back(Frame{p, {}});
    return true;
  }

  // Places a value where the parser is (root, next array element, or the member named by key_) and
  // returns where it now lives.
  json* put(json&& v) {
    if (stack_.empty()) {
      root = std::move(v);
      return &root;
    }
    Frame& f = stack_.back();
    if (f.value->is_array()) {
      auto& a = f.value->get_ref<json::array_t&>();
      a.push_back(std::move(v));
      return &a.back();
    }
    // ordered_map is a vector of members underneath; its own operator[] and emplace search by key.
    json::object_t::Container& o = f.value->get_ref<json::object_t&>();
    if (o.size() >= kIndexFrom && f.index.empty())
      for (size_t i = 0; i < o.size(); ++i) f.index.emplace(o[i].first, i);
    size_t at = o.size();
    if (f.index.empty()) {
      for (size_t i = 0; i < o.size(); ++i)
        if (o[i].first == key_) at = i;
    } else if (auto it = f.index.find(key_); it != f.index.end()) {
      at = it->second;
    }
    if (at < o.size()) {
      o[at].second = std::move(v);
      return &o[at].second;
    }
    if (!f.index.empty()) f.index.emplace(key_, o.size());
    o.emplace_back(std::move(key_), std::move(v));
    return &o.back().second;
  }

  std::vector<Frame> stack_;
  std::string key_;
};

}  // namespace

json parse_json(std::string_view text) {
  DomBuilder b;
  json::sax_parse(text.begin(), text.end(), &b);
  return std::move(b.root);
}

json parse_body(std::string_view body) {
  json j;
  try {
    j = parse_json(body);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number beyond double's range (1e400). nlohmann's message
    // names the byte offset and what it expected, which is what a client needs; it quotes the token
    // it stopped in, which for an unterminated string is the rest of the body, so it is cut short.
    std::string what = e.what();
    const auto p = what.find("] ");
    if (p != std::string::npos) what = what.substr(p + 2);
    if (what.size() > kMaxParseMessage) {
      size_t n = kMaxParseMessage;
      while (n > 0 && (static_cast<unsigned char>(what[n]) & 0xC0) == 0x80) --n;  // not inside a UTF-8 character
      what = what.substr(0, n) + "...";
    }
    throw bad_request("the request body is not valid JSON: " + what);
  }
  if (!j.is_object()) throw bad_request("the request body must be a JSON object, not " + type_name(j));
  return j;
}

std::string field(const std::string& path, const char* key) { return path.empty() ? std::string(key) : path + "." + key; }

std::string type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "an unsupported value";
  }
}

bool has(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && !it->is_null();
}

std::optional<std::string> opt_string(const json& o, const char* key, const std::string& path) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw bad_request("'" + field(path, key) + "' must be a string, not " + type_name(*it), field(path, key));
  return it->get<std::string>();
}

std::optional<bool> opt_bool(const json& o, const char* key, const std::string& path) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw bad_request("'" + field(path, key) + "' must be a boolean, not " + type_name(*it), field(path, key));
  return it->get<bool>();
}

std::optional<int64_t> opt_int(const json& o, const char* key, int64_t lo, int64_t hi, const std::string& path) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  const std::string f = field(path, key);
  int64_t v = 0;
  if (it->is_number_integer()) {
    v = it->get<int64_t>();
  } else if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) throw bad_request("'" + f + "' is out of range", f);
    v = static_cast<int64_t>(u);
  } else if (it->is_number_float()) {
    const double d = it->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e18)
      throw bad_request("'" + f + "' must be an integer", f);
    v = static_cast<int64_t>(d);
  } else {
    throw bad_request("'" + f + "' must be an integer, not " + type_name(*it), f);
  }
  if (v < lo || v > hi)
    throw bad_request("'" + f + "' must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " +
                          std::to_string(v),
                      f);
  return v;
}

std::optional<double> opt_number(const json& o, const char* key, double lo, double hi, const std::string& path) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  const std::string f = field(path, key);
  if (!it->is_number()) throw bad_request("'" + f + "' must be a number, not " + type_name(*it), f);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < lo || v > hi) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "' must be a finite number between %g and %g", lo, hi);
    throw bad_request("'" + f + buf, f);
  }
  return v;
}

std::string req_string(const json& o, const char* key, const std::string& path) {
  auto v = opt_string(o, key, path);
  if (!v) throw bad_request("'" + field(path, key) + "' is required", field(path, key));
  return *v;
}

const json* opt_array(const json& o, const char* key, const std::string& path) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  if (!it->is_array()) throw bad_request("'" + field(path, key) + "' must be an array, not " + type_name(*it), field(path, key));
  return &*it;
}

const json* opt_object(const json& o, const char* key, const std::string& path) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return nullptr;
  if (!it->is_object()) throw bad_request("'" + field(path, key) + "' must be an object, not " + type_name(*it), field(path, key));
  return &*it;
}

std::string random_id(std::string_view prefix, int n) {
  static const char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string s(prefix);
  std::uniform_int_distribution<int> d(0, 61);
  for (int i = 0; i < n; ++i) s += kAlnum[d(rng)];
  return s;
}

int64_t unix_time() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace pg::server
