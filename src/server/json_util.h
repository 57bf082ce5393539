// Typed access to request fields: every getter names the offending field in the ApiError it throws,
// so a wrong type or an absurd value gets a 400 that says exactly what to fix.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace pg::server {

using json = nlohmann::ordered_json;

// Parses a request body; throws ApiError 400 for malformed JSON, a non-object, or nesting deeper
// than kMaxBodyDepth objects/arrays. Parse error messages are cut to about kMaxParseMessage bytes.
constexpr int kMaxBodyDepth = 128;
constexpr size_t kMaxParseMessage = 300;
json parse_body(std::string_view body);
// JSON text from a request (a body, tool-call arguments in a string): throws json::exception when
// malformed, ApiError 400 when nested deeper than kMaxBodyDepth.
json parse_json(std::string_view text);

// Field access on an object. A missing field or an explicit null gives nullopt. `path` prefixes
// the field name in messages ("messages[2].content").
bool has(const json& o, const char* key);
std::optional<std::string> opt_string(const json& o, const char* key, const std::string& path = {});
std::optional<bool> opt_bool(const json& o, const char* key, const std::string& path = {});
// Integers: JSON numbers with an integral value within [lo, hi].
std::optional<int64_t> opt_int(const json& o, const char* key, int64_t lo, int64_t hi, const std::string& path = {});
// Finite numbers within [lo, hi].
std::optional<double> opt_number(const json& o, const char* key, double lo, double hi, const std::string& path = {});
std::string req_string(const json& o, const char* key, const std::string& path = {});
const json* opt_array(const json& o, const char* key, const std::string& path = {});
const json* opt_object(const json& o, const char* key, const std::string& path = {});

std::string field(const std::string& path, const char* key);  // "path.key" or "key"
std::string type_name(const json& v);                          // "string", "number", ... for messages

// Random alphanumeric id with a prefix ("chatcmpl-", "msg_", "call_").
std::string random_id(std::string_view prefix, int n = 24);
int64_t unix_time();

}  // namespace pg::server
