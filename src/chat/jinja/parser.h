// Recursive-descent parser with jinja2's grammar and precedence, including its compile-time checks
// (unknown filters/tests outside if/conditional expressions, break outside loops, bad targets).
#pragma once
#include <string_view>

#include "chat/jinja/ast.h"

namespace pg::jinja {

// Throws pg::jinja::Error (kSyntax) with the line of the offending token.
Body parse_template(std::string_view source);

// Names of the filters and tests the engine implements (used for the compile-time check).
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

}  // namespace pg::jinja
