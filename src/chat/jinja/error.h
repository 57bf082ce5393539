// The one exception type the Jinja engine throws. It derives from pg::Error so the CLI and the
// server report template failures like every other failure.
#pragma once
#include <string>

#include "core/error.h"

namespace pg::jinja {

// Mirrors the Python exception a jinja2 render would raise, so callers can tell a template's own
// raise_exception() from a syntax error or an exhausted sandbox limit.
enum class ErrorKind {
  kSyntax,     // TemplateSyntaxError / TemplateAssertionError (at parse time)
  kUndefined,  // UndefinedError
  kType,       // TypeError
  kValue,      // ValueError, OverflowError, ZeroDivisionError, KeyError, IndexError
  kSecurity,   // SecurityError (sandbox refused an attribute or call)
  kRaised,     // raise_exception(msg) called by the template
  kRuntime,    // TemplateRuntimeError and everything else
  kLimit,      // a sandbox resource limit (depth, steps, output size) was hit
};

const char* error_kind_name(ErrorKind k);

class Error : public pg::Error {
 public:
  Error(ErrorKind kind, const std::string& message, int line = 0);
  ErrorKind kind() const { return kind_; }
  // The message without the kind prefix and line suffix.
  const std::string& message() const { return message_; }
  int line() const { return line_; }

 private:
  static std::string format(ErrorKind kind, const std::string& message, int line);
  ErrorKind kind_;
  std::string message_;
  int line_;
};

[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

}  // namespace pg::jinja
