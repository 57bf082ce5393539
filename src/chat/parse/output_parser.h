// Incremental parser of generated text into an assistant message: content, reasoning_content and tool_calls.
//
//   OutputParser p(detect_chat_format(template_src), {.tools = tools, .starts_in_reasoning = opens});
//   for (each detokenized piece) send(p.push(piece));   // OpenAI-style streaming deltas
//   send(p.finish());
//   p.message();                                          // the whole message
//
// Guarantees:
//  - The final message does not depend on how the text was cut into chunks (one call, or one byte at a time).
//  - The deltas concatenate to the final message: content, reasoning_content, and per tool call the arguments string.
//  - Markup is never emitted half-way: text that might be the start of a tag is held back until it is decided; text
//    that turns out not to be a tag is then emitted as ordinary content.
//  - Everything handed out is valid UTF-8 (invalid bytes become U+FFFD), and every tool call's arguments string is a
//    valid JSON object once the call is finished.
//  - Malformed markup never throws: a tool call that breaks before anything of it was emitted becomes content; one
//    that breaks while its arguments were already streaming keeps the arguments received so far, closed into valid
//    JSON, and the problem is recorded in ParsedMessage::errors.
//  - content and reasoning_content are trimmed of leading and trailing whitespace (trailing whitespace is held back
//    while streaming until more text shows it is not trailing).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "chat/parse/chat_format.h"

namespace pg::chat {

struct ToolCall {
  std::string id;  // "call_" + 24 alphanumerics; 9 alphanumerics for Mistral (its templates require that shape)
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ParsedMessage {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCall> tool_calls;
  // Malformed markup that was turned into content, repaired or dropped, in order of occurrence (at most 16 entries).
  std::vector<std::string> errors;

  // OpenAI assistant message: {"role":"assistant","content":...,"reasoning_content":...,"tool_calls":[...]}; content is
  // null when empty and there are tool calls; reasoning_content and tool_calls only when non-empty.
  nlohmann::ordered_json to_openai_json() const;
};

// One streamed piece of a tool call (OpenAI's choices[].delta.tool_calls[] element). id and name are set only on the
// first delta of a call, which always comes before any of its arguments.
struct ToolCallDelta {
  size_t index = 0;
  std::string id;
  std::string name;
  std::string arguments;
};

struct Delta {
  std::string content;
  std::string reasoning_content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return content.empty() && reasoning_content.empty() && tool_calls.empty(); }
};

struct ParserOptions {
  // The request's tools: OpenAI form [{"type":"function","function":{"name":..,"parameters":{..}}}] or bare function
  // objects ({"name":..,"parameters"|"input_schema":..}). Used to type Qwen3-Coder XML parameters and, for Llama 3's
  // bare-JSON calls, to tell a call from a JSON answer. Entries without a name are ignored.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  // false: tool-call markup is left in the content (the request offered no tools, or tool_choice is "none").
  bool parse_tool_calls = true;
  // false: reasoning markup is left in the content.
  bool reasoning = true;
  // The prompt already opened the reasoning block (see prompt_opens_reasoning): output starts inside it.
  bool starts_in_reasoning = false;
  // Seed for tool-call ids; unset: random.
  std::optional<uint64_t> id_seed;
};

namespace detail {
class ParserCore;
}

class OutputParser {
 public:
  OutputParser(const ChatFormat& format, ParserOptions options = {});
  ~OutputParser();
  OutputParser(OutputParser&&) noexcept;
  OutputParser& operator=(OutputParser&&) noexcept;

  // Adds generated text; returns what can be released now. Throws pg::Error after finish().
  Delta push(std::string_view chunk);
  // End of generation: resolves everything held back. Further calls return an empty delta.
  Delta finish();
  // The message so far (complete after finish()).
  const ParsedMessage& message() const;
  bool finished() const;

 private:
  std::unique_ptr<detail::ParserCore> impl_;
};

// Whole-text convenience: push(text) + finish().
ParsedMessage parse_output(const ChatFormat& format, std::string_view text, ParserOptions options = {});

}  // namespace pg::chat
