// Errors a request handler answers with: an HTTP status plus the fields of the error body, written
// in the shape of the API the endpoint belongs to (OpenAI or Anthropic).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace pg::server {

enum class ApiFlavor { kOpenAI, kAnthropic };

class ApiError : public Error {
 public:
  // type: the OpenAI error type ("invalid_request_error", "authentication_error", "not_found_error",
  // "server_error", ...). The Anthropic shape derives its own type from the status.
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : Error(message), status_(status), type_(std::move(type)), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string type_, param_, code_;
};

inline ApiError bad_request(std::string message, std::string param = {}) {
  return ApiError(400, std::move(message), std::move(param));
}

// {"error":{"message","type","param","code"}}
nlohmann::ordered_json openai_error_body(const ApiError& e);
// {"type":"error","error":{"type","message"}}
nlohmann::ordered_json anthropic_error_body(const ApiError& e);
nlohmann::ordered_json error_body(ApiFlavor f, const ApiError& e);

}  // namespace pg::server
