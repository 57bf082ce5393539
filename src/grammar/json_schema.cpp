// JSON Schema -> GBNF. The covered subset and the whitespace policy are in docs/structured-output.md.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "grammar/grammar.h"

// GCC 12 reports a false -Wrestrict on `"literal" + std::string` chains (GCC PR 105329).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

namespace pg::grammar {
namespace {

using json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& what) { throw Error("json_schema: " + what); }

// Whitespace between JSON tokens: nothing, one space, or one newline plus up to 24 spaces/tabs of
// indentation. Bounded on purpose: an unbounded `[ \t\n]*` lets a model emit whitespace forever.
const char* kPrimitives = R"(ws ::= ( " " | "\n" [ \t]{0,24} )?
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
string ::= "\"" char* "\""
integer ::= "-"? ( "0" | [1-9] [0-9]{0,15} )
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
)";

std::string lit(std::string_view s) { return gbnf_literal(s); }

// Keywords that only annotate (ignored) and those handled below; anything else is an error.
const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                            "deprecated", "readOnly", "writeOnly", "contentEncoding", "contentMediaType",
                                            "$defs", "definitions"};
const std::set<std::string> kHandled = {"type", "properties", "required", "additionalProperties", "enum", "const", "items",
                                        "prefixItems", "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "minLength",
                                        "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
                                        "exclusiveMaximum", "nullable", "uniqueItems", "additionalItems"};

// ---- integer ranges -------------------------------------------------------------------------------
// Alternatives matching the decimal numbers of [a, b] (equal-length digit strings, leading digits
// allowed to be zero only below the first position, which callers ensure).
void same_len(const std::string& a, const std::string& b, const std::string& prefix, std::vector<std::string>& out) {
  size_t n = a.size();
  if (n == 0) {
    out.push_back(prefix.empty() ? "\"\"" : prefix);
    return;
  }
  if (a == b) {
    out.push_back(prefix + " " + lit(a));
    return;
  }
  if (a[0] == b[0]) {
    same_len(a.substr(1), b.substr(1), prefix + " " + lit(a.substr(0, 1)), out);
    return;
  }
  std::string rest_a = a.substr(1), rest_b = b.substr(1);
  std::string nines(n - 1, '9'), zeros(n - 1, '0');
  char lo = a[0], hi = b[0];
  if (rest_a != zeros) {
    same_len(rest_a, nines, prefix + " " + lit(a.substr(0, 1)), out);
    ++lo;
  }
  std::string tail_b;
  if (rest_b != nines) {
    --hi;
  }
  if (lo <= hi) {
    std::string e = prefix + " [" + std::string(1, lo) + "-" + std::string(1, hi) + "]";
    if (n > 1) e += " [0-9]{" + std::to_string(n - 1) + "}";
    out.push_back(e);
  }
  if (rest_b != nines) same_len(zeros, rest_b, prefix + " " + lit(b.substr(0, 1)), out);
}

// Non-negative integers in [lo, hi] (hi < 0: unbounded above, up to 16 digits).
std::string nonneg_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  auto digits = [](int64_t x) { return static_cast<int>(std::to_string(x).size()); };
  int dl = digits(lo), dh = hi < 0 ? 16 : digits(hi);
  for (int d = dl; d <= dh; ++d) {
    int64_t first = d == 1 ? 0 : static_cast<int64_t>(std::pow(10, d - 1));
    int64_t last = static_cast<int64_t>(std::pow(10, d)) - 1;
    int64_t a = std::max(lo, first), b = hi < 0 ? last : std::min(hi, last);
    if (a > b) continue;
    if (hi < 0 && a == first && d > dl) {
      // Every number of d.. 16 digits: one alternative.
      alts.push_back("[1-9] [0-9]{" + std::to_string(d - 1) + "," + std::to_string(15) + "}");
      break;
    }
    same_len(std::to_string(a), std::to_string(b), "", alts);
  }
  std::string o;
  for (auto& a : alts) o += (o.empty() ? "" : " | ") + a;
  return "( " + o + " )";
}

// ---- the converter ----------------------------------------------------------------------------------
struct Converter {
  json root;
  std::map<std::string, std::string> rules;  // name -> body, in a stable order
  std::map<std::string, std::string> ref_rules;
  int counter = 0;

  std::string fresh(const std::string& hint) {
    std::string h;
    for (char c : hint) h += (std::isalnum(static_cast<unsigned char>(c)) ? c : '-');
    if (h.size() > 40) h.resize(40);
    return "s" + std::to_string(counter++) + (h.empty() ? "" : "-" + h);
  }
  std::string define(const std::string& hint, const std::string& body) {
    std::string n = fresh(hint);
    rules[n] = body;
    return n;
  }

  std::string gbnf(const std::string& root_expr) {
    std::string o = "root ::= " + root_expr + "\n" + kPrimitives;
    for (auto& [n, b] : rules) o += n + " ::= " + b + "\n";
    return o;
  }

  const json& resolve(const std::string& ref) {
    if (ref.empty() || ref[0] != '#') fail("$ref '" + ref + "' is not a local reference (only '#...' is supported)");
    const json* cur = &root;
    std::string p = ref.substr(1);
    if (!p.empty() && p[0] != '/') fail("$ref '" + ref + "': only JSON pointers ('#/...') are supported");
    size_t i = 1;
    while (i <= p.size() && !p.empty()) {
      size_t j = p.find('/', i);
      if (j == std::string::npos) j = p.size();
      std::string tokn = p.substr(i, j - i);
      std::string t;
      for (size_t k = 0; k < tokn.size(); ++k) {
        if (tokn[k] == '~' && k + 1 < tokn.size()) {
          t += tokn[k + 1] == '1' ? '/' : '~';
          ++k;
        } else {
          t += tokn[k];
        }
      }
      if (cur->is_object() && cur->contains(t)) {
        cur = &(*cur)[t];
      } else if (cur->is_array() && !t.empty() && std::all_of(t.begin(), t.end(), ::isdigit) && std::stoul(t) < cur->size()) {
        cur = &(*cur)[std::stoul(t)];
      } else {
        fail("$ref '" + ref + "' does not resolve");
      }
      i = j + 1;
    }
    return *cur;
  }

  std::string visit(const json& s, const std::string& name, int depth) {
    if (depth > 64) fail("schema nested too deeply (over 64 levels)");
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail("schema 'false' admits no value");
      return "value";
    }
    if (!s.is_object()) fail("a schema must be an object or a boolean (at '" + name + "')");
    for (auto& [k, v] : s.items()) {
      if (!kAnnotations.count(k) && !kHandled.count(k)) fail("unsupported keyword '" + k + "'");
    }
    auto has = [&](const char* k) { return s.contains(k); };
    if (has("uniqueItems") && !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()))
      fail("unsupported keyword 'uniqueItems'");

    std::string nullable_suffix;
    if (has("nullable")) {
      if (!s["nullable"].is_boolean()) fail("'nullable' must be a boolean");
      if (s["nullable"].get<bool>()) nullable_suffix = " | null";
    }
    auto wrap = [&](const std::string& e) { return nullable_suffix.empty() ? e : "( " + e + nullable_suffix + " )"; };

    auto constraining_siblings = [&](std::initializer_list<const char*> allowed) {
      for (auto& [k, v] : s.items()) {
        if (kAnnotations.count(k) || k == "nullable") continue;
        bool ok = false;
        for (auto* a : allowed) ok = ok || k == a;
        if (!ok) return k;
      }
      return std::string();
    };

    if (has("$ref")) {
      if (auto k = constraining_siblings({"$ref"}); !k.empty()) fail("'$ref' with sibling keyword '" + k + "' is not supported");
      if (!s["$ref"].is_string()) fail("'$ref' must be a string");
      std::string ref = s["$ref"].get<std::string>();
      auto it = ref_rules.find(ref);
      if (it != ref_rules.end()) return wrap(it->second);
      std::string n = fresh("ref-" + ref.substr(ref.rfind('/') + 1));
      ref_rules[ref] = n;
      rules[n] = "\"\"";  // placeholder while the target (possibly recursive) is visited
      rules[n] = visit(resolve(ref), n, depth + 1);
      return wrap(n);
    }
    for (const char* comb : {"anyOf", "oneOf"}) {
      if (!has(comb)) continue;
      if (auto k = constraining_siblings({comb}); !k.empty()) fail(std::string("'") + comb + "' with sibling keyword '" + k + "' is not supported");
      if (!s[comb].is_array() || s[comb].empty()) fail(std::string("'") + comb + "' must be a non-empty array");
      std::string o;
      int i = 0;
      for (auto& sub : s[comb]) o += (o.empty() ? "" : " | ") + visit(sub, name + "-" + std::to_string(i++), depth + 1);
      return wrap(define(name, o));
    }
    if (has("allOf")) {
      if (auto k = constraining_siblings({"allOf"}); !k.empty()) fail("'allOf' with sibling keyword '" + k + "' is not supported");
      if (!s["allOf"].is_array() || s["allOf"].empty()) fail("'allOf' must be a non-empty array");
      // Only a merge of object schemas (properties/required/additionalProperties).
      json merged = {{"type", "object"}, {"properties", json::object()}, {"required", json::array()}};
      for (auto sub : s["allOf"]) {
        while (sub.is_object() && sub.contains("$ref") && sub.size() == 1) sub = resolve(sub["$ref"].get<std::string>());
        if (!sub.is_object()) fail("'allOf' member is not an object schema");
        for (auto& [k, v] : sub.items()) {
          if (kAnnotations.count(k)) continue;
          if (k == "type") {
            if (v != "object") fail("'allOf' is supported only as a merge of object schemas");
          } else if (k == "properties") {
            if (!v.is_object()) fail("'properties' must be an object");
            for (auto& [pk, pv] : v.items()) {
              if (merged["properties"].contains(pk)) fail("'allOf' merges property '" + pk + "' twice");
              merged["properties"][pk] = pv;
            }
          } else if (k == "required") {
            for (auto& r : v) merged["required"].push_back(r);
          } else if (k == "additionalProperties") {
            merged["additionalProperties"] = v;
          } else {
            fail("'allOf' member with keyword '" + k + "' is not supported");
          }
        }
      }
      return wrap(visit(merged, name, depth + 1));
    }
    if (has("const")) return wrap(lit(s["const"].dump()));
    if (has("enum")) {
      if (!s["enum"].is_array() || s["enum"].empty()) fail("'enum' must be a non-empty array");
      std::vector<std::string> types;
      if (has("type")) {
        if (s["type"].is_string()) types.push_back(s["type"].get<std::string>());
        if (s["type"].is_array()) {
          for (auto& t : s["type"]) types.push_back(t.get<std::string>());
        }
      }
      std::string o;
      for (auto& v : s["enum"]) {
        if (!types.empty()) {
          bool ok = false;
          for (auto& t : types) {
            ok = ok || (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
                 (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
                 (t == "object" && v.is_object()) || (t == "array" && v.is_array());
          }
          if (!ok) continue;
        }
        o += (o.empty() ? "" : " | ") + lit(v.dump());
      }
      if (o.empty()) fail("no 'enum' value has the schema's 'type'");
      return wrap(define(name + "-enum", o));
    }

    std::vector<std::string> types;
    if (has("type")) {
      if (s["type"].is_string()) {
        types.push_back(s["type"].get<std::string>());
      } else if (s["type"].is_array() && !s["type"].empty()) {
        for (auto& t : s["type"]) {
          if (!t.is_string()) fail("'type' entries must be strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        fail("'type' must be a string or a non-empty array of strings");
      }
    } else {
      // No type: infer from the keywords present, else any value.
      if (has("properties") || has("additionalProperties") || has("required")) types.push_back("object");
      if (has("items") || has("prefixItems") || has("minItems") || has("maxItems")) types.push_back("array");
      if (has("minLength") || has("maxLength") || has("pattern") || has("format")) types.push_back("string");
      if (has("minimum") || has("maximum") || has("exclusiveMinimum") || has("exclusiveMaximum")) types.push_back("number");
      if (types.empty()) return wrap("value");
    }
    std::string o;
    for (auto& t : types) {
      std::string e;
      if (t == "string") {
        e = string_rule(s, name);
      } else if (t == "integer") {
        e = integer_rule(s, name);
      } else if (t == "number") {
        e = number_rule(s);
      } else if (t == "boolean") {
        e = "boolean";
      } else if (t == "null") {
        e = "null";
      } else if (t == "object") {
        e = object_rule(s, name, depth);
      } else if (t == "array") {
        e = array_rule(s, name, depth);
      } else {
        fail("unsupported type '" + t + "'");
      }
      o += (o.empty() ? "" : " | ") + e;
    }
    return wrap(types.size() == 1 ? o : define(name + "-types", o));
  }

  static uint64_t get_count(const json& s, const char* k, uint64_t dflt) {
    if (!s.contains(k)) return dflt;
    const auto& v = s[k];
    if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))
      fail(std::string("'") + k + "' must be a non-negative integer");
    double d = v.get<double>();
    if (d < 0) fail(std::string("'") + k + "' must be a non-negative integer");
    if (d > 10000) fail(std::string("'") + k + "' over 10000 is not supported");
    return static_cast<uint64_t>(d);
  }

  std::string string_rule(const json& s, const std::string& name) {
    if (s.contains("format")) {
      if (s.contains("pattern") || s.contains("minLength") || s.contains("maxLength"))
        fail("'format' together with 'pattern'/'minLength'/'maxLength' is not supported");
      return format_rule(s["format"]);
    }
    if (s.contains("pattern")) {
      if (s.contains("minLength") || s.contains("maxLength")) fail("'pattern' together with 'minLength'/'maxLength' is not supported");
      if (!s["pattern"].is_string()) fail("'pattern' must be a string");
      return define(name + "-pattern", "\"\\\"\" " + regex_to_gbnf(s["pattern"].get<std::string>()) + " \"\\\"\"");
    }
    uint64_t mn = get_count(s, "minLength", 0), mx = get_count(s, "maxLength", UINT64_MAX);
    if (mn == 0 && mx == UINT64_MAX) return "string";
    if (mx != UINT64_MAX && mx < mn) fail("'maxLength' below 'minLength'");
    std::string rep = "{" + std::to_string(mn) + "," + (mx == UINT64_MAX ? "" : std::to_string(mx)) + "}";
    return define(name + "-string", "\"\\\"\" char" + rep + " \"\\\"\"");
  }

  std::string format_rule(const json& f) {
    if (!f.is_string()) fail("'format' must be a string");
    std::string fmt = f.get<std::string>();
    const std::string date =
        "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | ( \"0\" [469] | \"11\" ) \"-\" "
        "( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) )";
    const std::string time =
        "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) "
        "\":\" [0-5] [0-9] )";
    std::string body;
    if (fmt == "date") {
      body = date;
    } else if (fmt == "time") {
      body = time;
    } else if (fmt == "date-time") {
      body = date + " \"T\" " + time;
    } else if (fmt == "uuid") {
      body = "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{12}";
    } else if (fmt == "email") {
      body = "[a-zA-Z0-9_%+-] [a-zA-Z0-9._%+-]{0,63} \"@\" [a-zA-Z0-9] [a-zA-Z0-9-]{0,62} ( \".\" [a-zA-Z0-9] [a-zA-Z0-9-]{0,62} ){1,8}";
    } else {
      fail("unsupported format '" + fmt + "'");
    }
    return define("format-" + fmt, "\"\\\"\" " + body + " \"\\\"\"");
  }

  // Integer bounds: a fractional bound rounds inward (up for a lower bound, down for an upper one).
  static bool get_int(const json& s, const char* k, int64_t& out, bool round_up) {
    if (!s.contains(k)) return false;
    const auto& v = s[k];
    if (v.is_boolean()) fail(std::string("boolean '") + k + "' (draft 4) is not supported");
    if (!v.is_number()) fail(std::string("'") + k + "' must be a number");
    double d = v.get<double>();
    if (!(std::abs(d) < 1e15)) fail(std::string("'") + k + "' beyond 1e15 is not supported");
    out = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(round_up ? std::ceil(d) : std::floor(d));
    return true;
  }
  static bool is_fraction(const json& v) { return v.is_number_float() && v.get<double>() != std::floor(v.get<double>()); }

  std::string integer_rule(const json& s, const std::string& name) {
    int64_t lo = 0, hi = 0, x;
    bool has_lo = false, has_hi = false;
    if (get_int(s, "minimum", x, true)) lo = x, has_lo = true;
    if (get_int(s, "exclusiveMinimum", x, true)) {
      if (!is_fraction(s["exclusiveMinimum"])) ++x;  // ceil of a fraction is already above it
      lo = has_lo ? std::max(lo, x) : x, has_lo = true;
    }
    if (get_int(s, "maximum", x, false)) hi = x, has_hi = true;
    if (get_int(s, "exclusiveMaximum", x, false)) {
      if (!is_fraction(s["exclusiveMaximum"])) --x;
      hi = has_hi ? std::min(hi, x) : x, has_hi = true;
    }
    if (!has_lo && !has_hi) return "integer";
    if (has_lo && has_hi && hi < lo) fail("'maximum' below 'minimum'");
    std::string o;
    // Negative part: -(numbers in [max(1,-hi), -lo]).
    if (!has_lo || lo < 0) {
      int64_t nlo = has_hi ? std::max<int64_t>(1, -hi) : 1;
      int64_t nhi = has_lo ? -lo : -1;
      if (!has_hi || hi < 0 || nlo <= nhi) {
        if (nhi < 0 || nlo <= nhi) o += "\"-\" " + nonneg_range(nlo, nhi);
      }
    }
    if (!has_hi || hi >= 0) {
      int64_t plo = has_lo ? std::max<int64_t>(0, lo) : 0;
      int64_t phi = has_hi ? hi : -1;
      o += (o.empty() ? "" : " | ") + nonneg_range(plo, phi);
    }
    return define(name + "-int", o);
  }

  std::string number_rule(const json& s) {
    // Only the cheap bound: a non-negative number (minimum 0).
    for (const char* k : {"maximum", "exclusiveMaximum", "exclusiveMinimum"}) {
      if (s.contains(k)) fail(std::string("'") + k + "' on a number is not supported (only 'minimum': 0; use 'integer' for ranges)");
    }
    if (s.contains("minimum")) {
      if (!s["minimum"].is_number() || s["minimum"].get<double>() != 0) fail("'minimum' on a number is supported only as 0");
      return "( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?";
    }
    return "number";
  }

  std::string object_rule(const json& s, const std::string& name, int depth) {
    json props = s.contains("properties") ? s["properties"] : json::object();
    if (!props.is_object()) fail("'properties' must be an object");
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) fail("'required' must be an array");
      for (auto& r : s["required"]) {
        if (!r.is_string()) fail("'required' entries must be strings");
        required.insert(r.get<std::string>());
      }
    }
    for (auto& r : required) {
      if (!props.contains(r)) fail("required property '" + r + "' has no schema in 'properties'");
    }
    // additionalProperties: absent means none when properties are listed (the structured-output
    // convention: a subset of the valid documents), any when there are none.
    std::string extra;
    if (s.contains("additionalProperties")) {
      const auto& ap = s["additionalProperties"];
      if (!(ap.is_boolean() && !ap.get<bool>())) extra = visit(ap, name + "-additional", depth + 1);
    } else if (props.empty()) {
      extra = "value";
    }
    struct P {
      std::string kv;
      bool req;
    };
    std::vector<P> ps;
    for (auto& [k, v] : props.items()) {
      std::string val = visit(v, name + "-" + k, depth + 1);
      ps.push_back({lit(json(k).dump()) + " ws \":\" ws " + val + " ws", required.count(k) > 0});
    }
    std::string extra_kv = extra.empty() ? "" : define(name + "-extra-kv", "string ws \":\" ws " + extra + " ws");
    // R(i, first): properties i.. in order, optional ones may be skipped; first = nothing emitted yet.
    // Built from the last property backwards (no recursion per property).
    std::vector<std::array<std::string, 2>> R(ps.size() + 1);  // [i][first]
    for (int first = 0; first < 2; ++first) {
      if (extra_kv.empty()) {
        R[ps.size()][first] = "";
      } else {
        R[ps.size()][first] = define(name + "-extra", first ? "( " + extra_kv + " ( \",\" ws " + extra_kv + " )* )?"
                                                            : "( \",\" ws " + extra_kv + " )*");
      }
    }
    for (size_t i = ps.size(); i-- > 0;) {
      for (int first = 0; first < 2; ++first) {
        const std::string sep = first ? "" : "\",\" ws ";
        const std::string& next = R[i + 1][0];
        std::string body = sep + ps[i].kv + (next.empty() ? "" : " " + next);
        if (!ps[i].req) {
          const std::string& skip = R[i + 1][first];
          body = "( " + body + " )" + (skip.empty() ? "?" : " | " + skip);
        }
        R[i][first] = define(name + "-props", body);
      }
    }
    std::string inner = R[0][1];
    return define(name + "-object", "\"{\" ws " + inner + (inner.empty() ? "" : " ") + "\"}\"");
  }

  std::string array_rule(const json& s, const std::string& name, int depth) {
    std::vector<std::string> prefix;
    std::string item = "value";
    bool items_false = false;
    if (s.contains("prefixItems")) {
      if (!s["prefixItems"].is_array()) fail("'prefixItems' must be an array");
      int i = 0;
      for (auto& p : s["prefixItems"]) prefix.push_back(visit(p, name + "-" + std::to_string(i++), depth + 1));
    }
    if (s.contains("items")) {
      const auto& it = s["items"];
      if (it.is_array()) {  // draft 7 tuple form
        if (!prefix.empty()) fail("'items' as an array together with 'prefixItems'");
        int i = 0;
        for (auto& p : it) prefix.push_back(visit(p, name + "-" + std::to_string(i++), depth + 1));
        if (s.contains("additionalItems")) {
          const auto& ai = s["additionalItems"];
          if (ai.is_boolean() && !ai.get<bool>()) {
            items_false = true;
          } else {
            item = visit(ai, name + "-item", depth + 1);
          }
        }
      } else if (it.is_boolean() && !it.get<bool>()) {
        items_false = true;
      } else {
        item = visit(it, name + "-item", depth + 1);
      }
    }
    uint64_t mn = get_count(s, "minItems", 0), mx = get_count(s, "maxItems", UINT64_MAX);
    if (items_false) mx = std::min<uint64_t>(mx, prefix.size());
    if (mx < mn) fail("'maxItems' below 'minItems' (or 'items': false with too few 'prefixItems')");
    const size_t k = prefix.size();
    std::string e = define(name + "-elem", item + " ws");
    auto rep = [](uint64_t a, uint64_t b) {
      return "{" + std::to_string(a) + "," + (b == UINT64_MAX ? "" : std::to_string(b)) + "}";
    };
    // Tail after i >= k elements (first: none emitted yet).
    auto tail = [&](bool first, uint64_t lo, uint64_t hi) -> std::string {
      if (hi == 0) return "";
      if (first) {
        uint64_t h1 = hi == UINT64_MAX ? UINT64_MAX : hi - 1;
        if (lo == 0) return "( " + e + " ( \",\" ws " + e + " )" + rep(0, h1) + " )?";
        return e + " ( \",\" ws " + e + " )" + rep(lo - 1, h1);
      }
      return "( \",\" ws " + e + " )" + rep(lo, hi);
    };
    // R(i): elements from index i on (i already emitted), built backwards from the tail.
    std::vector<std::string> R(k + 1);
    {
      uint64_t lo = mn > k ? mn - k : 0, hi = mx == UINT64_MAX ? UINT64_MAX : mx - std::min<uint64_t>(mx, k);
      R[k] = mx < k ? "" : tail(k == 0, lo, hi);
    }
    for (size_t i = k; i-- > 0;) {
      if (i >= mx) {
        R[i] = "";
        continue;
      }
      std::string sep = i == 0 ? "" : "\",\" ws ";
      const std::string& next = R[i + 1];
      std::string body = sep + prefix[i] + " ws" + (next.empty() ? "" : " " + next);
      if (i >= mn) body = "( " + body + " )?";
      R[i] = define(name + "-items", body);
    }
    std::string inner = R[0];
    return define(name + "-array", "\"[\" ws " + inner + (inner.empty() ? "" : " ") + "\"]\"");
  }

  // ---- pattern: a regex subset ------------------------------------------------------------------
  // Characters inside the JSON string: raw where JSON allows, escaped otherwise.
  static std::string json_char_lit(uint32_t c) {
    if (c == '"') return lit("\\\"");
    if (c == '\\') return lit("\\\\");
    if (c == '\n') return lit("\\n");
    if (c == '\t') return lit("\\t");
    if (c == '\r') return lit("\\r");
    if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      return lit(b);
    }
    std::string u;
    if (c < 0x80) {
      u += static_cast<char>(c);
    } else if (c < 0x800) {
      u += static_cast<char>(0xC0 | (c >> 6)), u += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      u += static_cast<char>(0xE0 | (c >> 12)), u += static_cast<char>(0x80 | ((c >> 6) & 0x3F)), u += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      u += static_cast<char>(0xF0 | (c >> 18)), u += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      u += static_cast<char>(0x80 | ((c >> 6) & 0x3F)), u += static_cast<char>(0x80 | (c & 0x3F));
    }
    return lit(u);
  }
  // A class as code point ranges -> GBNF: the JSON-safe part as [..], plus escapes for the rest.
  static std::string class_gbnf(std::vector<std::pair<uint32_t, uint32_t>> r, bool neg) {
    const std::vector<std::pair<uint32_t, uint32_t>> m = merge_code_ranges(std::move(r), neg);
    auto in = [&](uint32_t c) {
      for (auto& x : m) {
        if (c >= x.first && c <= x.second) return true;
      }
      return false;
    };
    std::string cls, alts;
    auto hex = [](uint32_t c) {
      char b[16];
      std::snprintf(b, sizeof b, c < 0x10000 ? "\\u%04X" : "\\U%08X", c);
      return std::string(b);
    };
    for (auto x : m) {
      // Drop control chars, '"' and '\\' from the raw part; surrogates are dropped by the parser.
      std::vector<std::pair<uint32_t, uint32_t>> parts{x};
      for (uint32_t bad : {0x22u, 0x5Cu}) {
        std::vector<std::pair<uint32_t, uint32_t>> np;
        for (auto p : parts) {
          if (bad < p.first || bad > p.second) {
            np.push_back(p);
            continue;
          }
          if (p.first < bad) np.push_back({p.first, bad - 1});
          if (p.second > bad) np.push_back({bad + 1, p.second});
        }
        parts = np;
      }
      for (auto p : parts) {
        if (p.second < 0x20) continue;
        p.first = std::max<uint32_t>(p.first, 0x20);
        if (p.first >= 0xD800 && p.second <= 0xDFFF) continue;
        cls += hex(p.first) + (p.second != p.first ? "-" + hex(p.second) : "");
      }
    }
    std::string o;
    if (!cls.empty()) o = "[" + cls + "]";
    for (uint32_t c : {0x22u, 0x5Cu, 0x0Au, 0x09u, 0x0Du}) {
      if (in(c)) o += (o.empty() ? "" : " | ") + json_char_lit(c);
    }
    if (o.empty()) fail("pattern: a character class matches nothing");
    return "( " + o + " )";
  }

  struct Regex {
    const std::string& p;
    size_t i = 0;
    int depth = 0;
    [[noreturn]] void bad(const std::string& what) const {
      fail("pattern: unsupported construct " + what + " at offset " + std::to_string(i) + " of '" + p + "'");
    }
    uint32_t utf8() {
      auto c = static_cast<unsigned char>(p[i]);
      int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      if (i + n > p.size()) fail("pattern: invalid UTF-8");
      uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
      for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(p[i + k]) & 0x3F);
      i += n;
      return cp;
    }
    // An escape inside or outside a class: either a class (\d \w \s and negations) or one char.
    bool escape_class(char c, std::vector<std::pair<uint32_t, uint32_t>>& r, bool& neg) {
      neg = c == 'D' || c == 'W' || c == 'S';
      switch (c) {
        case 'd': case 'D': r = {{'0', '9'}}; return true;
        case 'w': case 'W': r = {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}}; return true;
        case 's': case 'S': r = {{' ', ' '}, {'\t', '\r'}}; return true;
        default: return false;
      }
    }
    uint32_t escape_char(char c) {
      switch (c) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case 'f': return '\f';
        case 'v': return '\v';
        case '0': return 0;
        case 'x': {
          if (i + 2 > p.size()) bad("'\\x'");
          uint32_t v = static_cast<uint32_t>(std::stoul(p.substr(i, 2), nullptr, 16));
          i += 2;
          return v;
        }
        case 'u': {
          if (i + 4 > p.size() || !std::all_of(p.begin() + static_cast<long>(i), p.begin() + static_cast<long>(i + 4), ::isxdigit)) bad("'\\u'");
          uint32_t v = static_cast<uint32_t>(std::stoul(p.substr(i, 4), nullptr, 16));
          i += 4;
          return v;
        }
        default:
          if (std::isalnum(static_cast<unsigned char>(c))) bad(std::string("'\\") + c + "'");
          return static_cast<uint32_t>(static_cast<unsigned char>(c));
      }
    }
    std::string alt() {
      if (++depth > 32) bad("(groups nested over 32 deep)");
      std::string o = seq();
      while (i < p.size() && p[i] == '|') {
        ++i;
        o += " | " + seq();
      }
      --depth;
      return "( " + o + " )";
    }
    std::string seq() {
      std::string o;
      while (i < p.size() && p[i] != '|' && p[i] != ')') {
        std::string a = atom();
        o += " " + quant(a);
      }
      return o.empty() ? "\"\"" : o;
    }
    std::string quant(const std::string& a) {
      if (i >= p.size()) return a;
      char c = p[i];
      std::string r;
      if (c == '*' || c == '+' || c == '?') {
        ++i;
        r = "( " + a + " )" + std::string(1, c);
      } else if (c == '{') {
        size_t j = p.find('}', i);
        if (j == std::string::npos) bad("'{' without '}'");
        std::string body = p.substr(i + 1, j - i - 1);
        if (body.empty() || !std::all_of(body.begin(), body.end(), [](char x) { return std::isdigit(static_cast<unsigned char>(x)) || x == ','; }))
          bad("'{" + body + "}'");
        i = j + 1;
        r = "( " + a + " ){" + body + "}";
      } else {
        return a;
      }
      if (i < p.size() && p[i] == '?') ++i;  // lazy: the same language
      if (i < p.size() && p[i] == '+') bad("possessive quantifier");
      return r;
    }
    std::string atom() {
      char c = p[i];
      if (c == '(') {
        ++i;
        if (i < p.size() && p[i] == '?') {
          if (i + 1 < p.size() && p[i + 1] == ':') {
            i += 2;
          } else {
            bad("'(?' (lookaround or named group)");
          }
        }
        std::string a = alt();
        if (i >= p.size() || p[i] != ')') bad("unbalanced '('");
        ++i;
        return a;
      }
      if (c == '[') {
        ++i;
        bool neg = false;
        if (i < p.size() && p[i] == '^') neg = true, ++i;
        std::vector<std::pair<uint32_t, uint32_t>> r;
        bool first = true;
        while (i < p.size() && (p[i] != ']' || first)) {
          first = false;
          uint32_t lo;
          if (p[i] == '\\') {
            ++i;
            if (i >= p.size()) bad("trailing '\\'");
            std::vector<std::pair<uint32_t, uint32_t>> er;
            bool eneg;
            char ec = p[i++];
            if (escape_class(ec, er, eneg)) {
              if (eneg) bad(std::string("'\\") + ec + "' inside a class");
              r.insert(r.end(), er.begin(), er.end());
              continue;
            }
            if (ec == 'b') {
              lo = '\b';
            } else {
              lo = escape_char(ec);
            }
          } else if (p[i] == '[' && i + 1 < p.size() && p[i + 1] == ':') {
            bad("POSIX class '[:'");
          } else {
            lo = utf8();
          }
          uint32_t hi = lo;
          if (i + 1 < p.size() && p[i] == '-' && p[i + 1] != ']') {
            ++i;
            if (p[i] == '\\') {
              ++i;
              if (i >= p.size()) bad("trailing '\\'");
              hi = escape_char(p[i++]);
            } else {
              hi = utf8();
            }
            if (hi < lo) bad("reversed range");
          }
          r.push_back({lo, hi});
        }
        if (i >= p.size()) bad("unterminated '['");
        ++i;
        return class_gbnf(r, neg);
      }
      if (c == '.') {
        ++i;
        return "pchar";
      }
      if (c == '\\') {
        ++i;
        if (i >= p.size()) bad("trailing '\\'");
        char e = p[i++];
        std::vector<std::pair<uint32_t, uint32_t>> r;
        bool neg;
        if (escape_class(e, r, neg)) return class_gbnf(r, neg);
        if (e == 'b' || e == 'B') bad("word boundary '\\" + std::string(1, e) + "'");
        if (std::isdigit(static_cast<unsigned char>(e)) && e != '0') bad("back-reference");
        return json_char_lit(escape_char(e));
      }
      if (c == '^' || c == '$') bad(std::string("anchor '") + c + "' inside the pattern");
      if (c == '*' || c == '+' || c == '?' || c == '{') bad(std::string("'") + c + "' with nothing to repeat");
      return json_char_lit(utf8());
    }
  };

  std::string regex_to_gbnf(const std::string& pat) {
    std::string p = pat;
    bool a0 = !p.empty() && p[0] == '^';
    if (a0) p.erase(0, 1);
    bool a1 = false;
    if (!p.empty() && p.back() == '$') {
      size_t bs = 0;
      for (size_t k = p.size() - 1; k-- > 0 && p[k] == '\\';) ++bs;
      if (bs % 2 == 0) {
        a1 = true;
        p.pop_back();
      }
    }
    Regex r{p};
    std::string body = r.alt();
    if (r.i != p.size()) r.bad("unbalanced ')'");
    // JSON Schema patterns are unanchored: an unanchored side admits any characters.
    if (!rules.count("pchar")) rules["pchar"] = "[^\"\\\\\\x00-\\x1F\\n] | \"\\\\\\\"\" | \"\\\\\\\\\"";
    return std::string(a0 ? "" : "pchar* ") + body + (a1 ? "" : " pchar*");
  }
};

void check_depth(std::string_view s) {
  int d = 0;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (in_str) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_str = false;
      }
    } else if (c == '"') {
      in_str = true;
    } else if (c == '{' || c == '[') {
      if (++d > 128) fail("schema nested too deeply (over 128 levels)");
    } else if (c == '}' || c == ']') {
      --d;
    }
  }
}

}  // namespace

std::string gbnf_literal(std::string_view s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c == '\n') {
      o += "\\n";
    } else if (c < 0x20 || c == 0x7F) {
      static const char* hex = "0123456789ABCDEF";
      o += "\\x";
      o += hex[c >> 4];
      o += hex[c & 15];
    } else {
      o += static_cast<char>(c);
    }
  }
  return o + "\"";
}

std::string json_schema_to_gbnf(std::string_view schema_json) {
  if (schema_json.size() > (1u << 20)) fail("schema over 1 MiB");
  check_depth(schema_json);
  Converter c;
  try {
    c.root = json::parse(schema_json);
  } catch (const json::exception& e) {
    fail(std::string("invalid JSON: ") + e.what());
  }
  try {
    std::string r = c.visit(c.root, "root", 0);
    return c.gbnf(r);
  } catch (const json::exception& e) {
    fail(std::string("malformed schema: ") + e.what());
  }
}

std::string json_schema_rules_gbnf(const std::vector<SchemaRule>& items) {
  // One converter for all: generated rule names stay unique, the primitives are written once.
  Converter c;
  std::string out;
  for (const SchemaRule& it : items) {
    if (it.root_json.size() > (1u << 20)) fail("schema over 1 MiB");
    check_depth(it.root_json);
    try {
      c.root = json::parse(it.root_json);
    } catch (const json::exception& e) {
      fail(std::string("invalid JSON: ") + e.what());
    }
    c.ref_rules.clear();  // $refs resolve against this item's root
    try {
      const json* s = &c.root;
      if (!it.property.empty()) {
        if (!c.root.is_object() || !c.root.contains("properties") || !c.root["properties"].contains(it.property))
          fail("no property '" + it.property + "'");
        s = &c.root["properties"][it.property];
      }
      out += it.name + " ::= " + c.visit(*s, it.name, 0) + "\n";
    } catch (const json::exception& e) {
      fail(std::string("malformed schema: ") + e.what());
    }
  }
  out += kPrimitives;
  for (auto& [n, b] : c.rules) out += n + " ::= " + b + "\n";
  return out;
}

std::string json_object_gbnf() { return std::string("root ::= object\n") + kPrimitives; }

}  // namespace pg::grammar
