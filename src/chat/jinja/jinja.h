// pg::jinja — a Jinja2 template engine that renders chat templates byte for byte like Hugging Face's
// apply_chat_template, i.e. Python jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True, extensions=[loopcontrols]) plus transformers' {% generation %} tag, its
// tojson (ensure_ascii=False), raise_exception() and strftime_now().
//
// Sandboxed: templates cannot do I/O, call unsafe methods (list.append, dict.update, ...), or run
// unbounded: recursion depth, work steps, allocated bytes and output size are capped (Limits), and
// every failure ends in a pg::jinja::Error (a pg::Error), never a crash or a hang. Work that grows with
// the size of an operand (searching, comparing or decoding a long string, walking a long list, a lookup
// in a large dict) is charged as steps too (work.h), and every string value is charged its heap
// overhead as well as its text.
//
// Parse once, render many times: a Template is immutable after construction and may be rendered
// concurrently from several threads.
//
// Where this engine knowingly differs from CPython + jinja2 3.1:
//  - integers are 64-bit: a result that needs a bigger Python int raises ValueError;
//  - repr() of functions, generators and other objects has no memory address ("<generator object>");
//  - not implemented (parse-time "No filter named" like an unknown filter): pprint, urlize,
//    wordwrap; global lipsum(); str.casefold/expandtabs/encode/translate raise when called;
//  - {% include %}, {% import %}, {% extends %} fail as in jinja2 without a template loader, and
//    {% autoescape %} blocks are refused;
//  - jinja2's compile-time constant folding is reproduced only where it changes results (slices
//    of constants); striptags unescapes only the common HTML entities;
//  - expressions nested more than 150 levels deep are a syntax error, chains included (a + b + ..., x.y.z...,
//    v|f|g...: each link is a level), so evaluating the tree cannot overflow the stack; Python accepts somewhat
//    longer chains before its own recursion limit;
//  - error messages follow Python's where practical; the error kind always matches.
// The golden cases (tests/chat/jinja_cases.json) and the parity test pin the rest down.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "chat/jinja/error.h"

namespace pg::jinja {

struct Limits {
  int64_t max_steps = 50'000'000;           // statements, loop iterations, calls, per-item work
  uint64_t max_alloc_bytes = 256ull << 20;  // cumulative bytes of strings/lists built by the template
  size_t max_output_bytes = 64u << 20;      // rendered text, any captured block, any single string
  int max_call_depth = 200;                 // nested macro calls / recursive loops
};

// A wall-clock time as Python's datetime sees it (naive unless tz_offset_min is set).
struct DateTime {
  int year = 1970, month = 1, day = 1, hour = 0, minute = 0, second = 0, microsecond = 0;
  std::optional<int> tz_offset_min;  // aware datetime: offset from UTC in minutes
};

// Parses ISO 8601 like Python's datetime.fromisoformat: "YYYY-MM-DD[THH[:MM[:SS[.ffffff]]]][Z|±HH:MM]".
// Throws pg::Error on malformed input.
DateTime parse_iso8601(std::string_view s);
// The current local time (what datetime.now() gives).
DateTime local_now();
// datetime.strftime(fmt) for dt.
std::string strftime(const DateTime& dt, std::string_view fmt);

struct RenderOptions {
  Limits limits;
  std::optional<DateTime> now;  // fixes strftime_now(); default: the current local time
};

class Template {
 public:
  // Parses source; throws Error (kind kSyntax) like jinja2's compile-time errors.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the members of vars (a JSON object, or null) as template variables.
  std::string render(const nlohmann::ordered_json& vars, const RenderOptions& opts = {}) const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace pg::jinja
