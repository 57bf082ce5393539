#include "server/structured.h"

#include "core/error.h"
#include "grammar/grammar.h"
#include "server/api_error.h"

namespace pg::server {

namespace {

void set_grammar(GenParams& g, std::string gbnf, const std::string& field) {
  if (!g.grammar.empty() && g.grammar_field != field)
    throw bad_request("'" + field + "' and '" + g.grammar_field + "' both constrain the output; send one", field);
  // Parse now: a grammar that does not parse is the client's error, with its position.
  try {
    (void)grammar::Grammar::parse(gbnf);
  } catch (const Error& e) {
    throw bad_request(std::string("'") + field + "': " + e.what(), field);
  }
  g.grammar = std::move(gbnf);
  g.grammar_field = field;
}

}  // namespace

std::string schema_grammar(const json& schema, const std::string& param) {
  if (!schema.is_object() && !schema.is_boolean()) throw bad_request("'" + param + "' must be a JSON Schema object", param);
  try {
    return grammar::json_schema_to_gbnf(schema.dump());
  } catch (const Error& e) {
    throw bad_request(std::string("'") + param + "': " + e.what(), param);
  }
}

void parse_format_object(const json& fmt, GenParams& g, const std::string& path) {
  const std::string t = opt_string(fmt, "type", path).value_or("text");
  if (t == "text") return;
  if (t == "json_object") {
    // llama-server also accepts a schema beside json_object.
    if (auto s = fmt.find("schema"); s != fmt.end() && !s->is_null())
      set_grammar(g, schema_grammar(*s, path + ".schema"), path);
    else
      set_grammar(g, grammar::json_object_gbnf(), path);
    return;
  }
  if (t == "json_schema") {
    // OpenAI chat: {type, json_schema: {name, schema, strict}}; Responses / llama-server / Anthropic:
    // {type, schema, name, strict}.
    const json* holder = &fmt;
    std::string p = path;
    if (auto js = fmt.find("json_schema"); js != fmt.end() && js->is_object()) {
      holder = &*js;
      p = path + ".json_schema";
    }
    auto s = holder->find("schema");
    if (s == holder->end() || s->is_null()) throw bad_request("'" + p + ".schema' is required", p + ".schema");
    set_grammar(g, schema_grammar(*s, p + ".schema"), path);
    return;
  }
  if (t == "grammar") {  // a GBNF grammar in the format object (some clients of llama-server)
    auto gr = fmt.find("grammar");
    if (gr == fmt.end() || !gr->is_string()) throw bad_request("'" + path + ".grammar' must be a GBNF string", path + ".grammar");
    set_grammar(g, gr->get<std::string>(), path);
    return;
  }
  throw bad_request("'" + path + ".type' must be \"text\", \"json_object\" or \"json_schema\", got \"" + t + "\"", path + ".type");
}

void parse_structured_fields(const json& b, GenParams& g) {
  if (auto it = b.find("grammar"); it != b.end() && !it->is_null()) {
    if (!it->is_string()) throw bad_request("'grammar' must be a GBNF string", "grammar");
    if (!it->get<std::string>().empty()) set_grammar(g, it->get<std::string>(), "grammar");
  }
  if (auto it = b.find("json_schema"); it != b.end() && !it->is_null())
    set_grammar(g, schema_grammar(*it, "json_schema"), "json_schema");
  if (const json* rf = opt_object(b, "response_format")) parse_format_object(*rf, g, "response_format");
  if (const json* of = opt_object(b, "output_format")) parse_format_object(*of, g, "output_format");
  if (const json* oc = opt_object(b, "output_config"))
    if (const json* f = opt_object(*oc, "format", "output_config")) parse_format_object(*f, g, "output_config.format");
  if (auto rb = opt_int(b, "reasoning_budget_tokens", -1, int64_t{1} << 30)) g.reasoning_budget = *rb;
}

namespace {

int effort_index(const std::string& e) {
  if (e == "minimal" || e == "low") return 0;
  if (e == "medium") return 1;
  if (e == "high") return 2;
  if (e == "x-high" || e == "xhigh") return 3;
  if (e == "max") return 4;
  return -1;
}

// The call objects a tool choice allows: {"name": <const>, "arguments": <schema>} for each tool
// (Hermes / Llama 3 use "arguments" / "parameters").
std::string tool_call_schema_grammar(const ServerOptions&, const ChatRequest& req, const std::string& args_key) {
  json alts = json::array();
  for (size_t i = 0; i < req.tools.size(); ++i) {
    const json& fn = req.tools[i]["function"];
    const std::string name = fn.value("name", "");
    if (req.tool_choice == ToolChoice::kNamed && name != req.tool_name) continue;
    json params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : json{{"type", "object"}};
    const bool strict = i < req.tool_strict.size() && req.tool_strict[i];
    // A schema the converter refuses: a strict tool is the client's error; otherwise the arguments
    // are constrained to a JSON object (the call still parses).
    try {
      (void)grammar::json_schema_to_gbnf(params.dump());
    } catch (const Error& e) {
      if (strict) throw bad_request(std::string("'tools': the parameters of '") + name + "' (strict): " + e.what(), "tools");
      params = json{{"type", "object"}};
    }
    alts.push_back({{"type", "object"},
                    {"properties", {{"name", {{"const", name}}}, {args_key, params}}},
                    {"required", {"name", args_key}},
                    {"additionalProperties", false}});
  }
  json schema = alts.size() == 1 ? alts[0] : json{{"anyOf", alts}};
  return schema_grammar(schema, "tools");
}

}  // namespace

std::shared_ptr<const engine::ConstraintSpec> chat_constraint(const ServerOptions& opt, const tok::Tokenizer& tok,
                                                              const ChatRequest& req, const RenderedPrompt& rp) {
  auto c = std::make_shared<engine::ConstraintSpec>();
  const chat::ChatFormat& fmt = rp.format;
  // Reasoning budget: the request's, else its effort through the table, else the server's.
  int64_t budget = opt.reasoning_budget;
  if (!req.gen.reasoning_effort.empty() && effort_index(req.gen.reasoning_effort) >= 0)
    budget = opt.effort_budget[effort_index(req.gen.reasoning_effort)];
  if (req.gen.reasoning_budget) budget = *req.gen.reasoning_budget;
  if (opt.hard_limit_reply_budget >= 0) {
    // The whole reply is capped (make_spec caps max_tokens): leave room to close the block and answer.
    const int64_t room = std::max<int64_t>(0, opt.hard_limit_reply_budget - 16);
    budget = budget < 0 ? room : std::min(budget, room);
  }
  if (!fmt.think_close.empty() && budget >= 0) {
    c->reasoning_budget = static_cast<int>(std::min<int64_t>(budget, int64_t{1} << 30));
    c->think_open = fmt.think_open;
    c->think_close = fmt.think_close;
    c->close_text = (opt.reasoning_close_hint.empty() ? "" : "\n" + opt.reasoning_close_hint) + "\n" + fmt.think_close + "\n\n";
  }
  c->starts_in_reasoning = rp.parser.starts_in_reasoning && rp.forced.empty();
  const bool tool_forced = req.tool_choice == ToolChoice::kRequired || req.tool_choice == ToolChoice::kNamed;
  try {
    if (tool_forced && (fmt.family == chat::ChatFamily::kHermes || fmt.family == chat::ChatFamily::kLlama3)) {
      const bool hermes = fmt.family == chat::ChatFamily::kHermes;
      std::string gbnf = tool_call_schema_grammar(opt, req, hermes ? "arguments" : "parameters");
      // The prompt already holds the opening the template's call syntax starts with (chat_prompt.cpp):
      // the JSON part of it is the grammar's first bytes, the closing tag its last.
      const std::string& f = rp.forced;
      const size_t brace = f.find('{');
      c->prefix = brace == std::string::npos ? "" : f.substr(brace);
      if (hermes) gbnf += "\npg-call ::= root \"\\n" + fmt.tool_close + "\"\n";
      else gbnf += "\npg-call ::= root\n";
      c->grammar = grammar::compile_cached(gbnf, engine::shared_vocab(tok), "pg-call");
    } else if (!req.gen.grammar.empty()) {
      // Reasoning first, then the constrained answer: after a block the prompt left open, or one the
      // model may open itself (thinking not disabled and the format has tags).
      const bool may_open = !c->starts_in_reasoning && !fmt.think_open.empty() && req.enable_thinking.value_or(true) &&
                            rp.text.size() >= fmt.think_close.size() &&
                            rp.text.find(fmt.think_close, rp.text.size() > 64 ? rp.text.size() - 64 : 0) == std::string::npos;
      c->grammar = engine::compile_grammar(req.gen.grammar, tok, c->starts_in_reasoning || may_open);
      if (c->starts_in_reasoning) c->trigger = fmt.think_close;
      c->reasoning_may_open = may_open;
      if (may_open) {
        c->think_open = fmt.think_open;
        c->think_close = fmt.think_close;
      }
    }
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw bad_request(std::string("the output grammar: ") + e.what(), req.gen.grammar_field.empty() ? "tools" : req.gen.grammar_field);
  }
  if (c->empty()) return nullptr;
  return c;
}

std::shared_ptr<const engine::ConstraintSpec> completion_constraint(const tok::Tokenizer& tok, const GenParams& g) {
  if (g.grammar.empty()) return nullptr;
  auto c = std::make_shared<engine::ConstraintSpec>();
  try {
    c->grammar = engine::compile_grammar(g.grammar, tok, false);
  } catch (const Error& e) {
    throw bad_request(std::string("'") + g.grammar_field + "': " + e.what(), g.grammar_field);
  }
  return c;
}

}  // namespace pg::server
