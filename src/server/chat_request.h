// The three chat APIs (OpenAI chat completions, OpenAI Responses, Anthropic Messages) parsed into one
// request shape: messages normalised the way chat templates expect them (OpenAI-style roles, string
// content, tool_calls with object arguments), function tools in OpenAI form, tool choice, sampling
// and limits. Parsing is pure (no model needed) and throws ApiError 400 naming the bad field.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "engine/sampler.h"
#include "grammar/trigger.h"
#include "server/json_util.h"

namespace pg::server {

enum class ToolChoice { kAuto, kNone, kRequired, kNamed };

// Generation settings a request may override; unset fields keep the server's defaults.
struct GenParams {
  std::optional<double> temperature, top_p, min_p, typical_p, repeat_penalty, presence_penalty, frequency_penalty;
  std::optional<int64_t> top_k, repeat_last_n, seed;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<int64_t> max_tokens;
  std::vector<std::string> stop;
  int logprobs = -1;  // -1: off; 0: chosen tokens only; n: plus the n most likely
  bool ignore_eos = false;  // llama.cpp extension: generate through end-of-generation tokens (benchmarks)
  // Structured output (server/structured.h): GBNF of the answer, from grammar / json_schema /
  // response_format / text.format / output_format (schemas converted while parsing).
  std::string grammar;
  std::string grammar_field;                // the field it came from (error messages)
  // llama-server's lazy grammars: the grammar waits for one of the triggers (engine/constraint.h).
  // A token trigger given as text has token -1 and value = the text (resolved against the vocabulary
  // when the constraint is built).
  bool grammar_lazy = false;
  std::vector<grammar::TriggerSpec> grammar_triggers;
  std::vector<std::string> preserved_tokens;  // accepted and checked (strings); see docs/structured-output.md
  std::optional<int64_t> reasoning_budget;  // reasoning_budget_tokens / thinking.budget_tokens (-1: unlimited)
  std::string reasoning_effort;             // reasoning_effort / reasoning.effort (mapped by the server's table)

  // Server defaults overridden by what the request set. A default seed < 0 means a random seed.
  SamplingParams resolve(const SamplingParams& defaults, int64_t default_seed) const;
};

struct ChatRequest {
  json messages = json::array();  // template-ready, see above
  json tools = json::array();     // [{"type":"function","function":{"name","description","parameters"}}]
  ToolChoice tool_choice = ToolChoice::kAuto;
  std::string tool_name;          // kNamed
  bool parallel_tool_calls = true;
  std::vector<bool> tool_strict;  // per tool: function.strict
  GenParams gen;
  bool stream = false;
  bool include_usage = false;     // OpenAI stream_options.include_usage
  std::optional<bool> enable_thinking;
  bool hide_reasoning = false;            // Anthropic thinking.display "omitted": reasoning is not returned
  json template_kwargs = json::object();  // extra template variables (chat_template_kwargs, reasoning_effort)
  std::string model;
  std::vector<std::string> ignored;        // unknown top-level fields, reported back in a header
  std::vector<std::string> skipped_tools;  // non-function tools that were left out
};

struct CompletionRequest {
  std::variant<std::string, std::vector<int32_t>> prompt;
  GenParams gen;
  bool stream = false, include_usage = false, echo = false;
  std::string model;
  std::vector<std::string> ignored;
};

// POST /v1/chat/completions
ChatRequest parse_openai_chat(const json& body);
// POST /v1/responses. Reasoning items become reasoning_content of the assistant turn they precede.
ChatRequest parse_responses(const json& body);
// POST /v1/messages (and /v1/messages/count_tokens, where max_tokens is not required).
ChatRequest parse_anthropic(const json& body, bool count_only = false);
// POST /v1/completions
CompletionRequest parse_completion(const json& body);

}  // namespace pg::server
