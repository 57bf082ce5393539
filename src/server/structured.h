// Structured output and reasoning budgets on the server side (docs/structured-output.md): the
// request fields that constrain the answer are turned into a GBNF grammar while parsing (a schema
// keyword the converter does not support, or a grammar that does not parse, is a 400 naming it), and
// the engine's per-sequence constraint is built from the grammar, the rendered prompt (a reasoning
// block left open, a forced tool-call opening) and the reasoning budget.
#pragma once
#include <memory>

#include "engine/constraint.h"
#include "server/chat_prompt.h"
#include "server/chat_request.h"
#include "server/json_util.h"
#include "server/server.h"

namespace pg::server {

// grammar, json_schema, response_format, output_format / output_config.format, reasoning_budget_tokens
// (top-level fields of every API). Throws ApiError 400.
void parse_structured_fields(const json& body, GenParams& g);
// A response_format / text.format object ({type: text|json_object|json_schema, ...}); path names it.
void parse_format_object(const json& fmt, GenParams& g, const std::string& path);
// JSON Schema -> GBNF, refusals as 400 naming `param` and the keyword.
std::string schema_grammar(const json& schema, const std::string& param);

// The engine constraint of a chat request (null when nothing constrains it).
std::shared_ptr<const engine::ConstraintSpec> chat_constraint(const ServerOptions& opt, const tok::Tokenizer& tok,
                                                              const ChatRequest& req, const RenderedPrompt& rp);
// Of a legacy completion (grammar only).
std::shared_ptr<const engine::ConstraintSpec> completion_constraint(const tok::Tokenizer& tok, const GenParams& g);

}  // namespace pg::server
