#include "server/structured.h"

#include <climits>
#include <cstdio>
#include <set>

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

constexpr size_t kMaxTriggers = 64;

// grammar_lazy, grammar_triggers, preserved_tokens (llama-server's names). Triggers:
// {"type": "word"|"pattern"|"pattern_full"|"token" (or llama.cpp's numbers 1, 2, 3, 0), "value": ...}
// (a token's value: its id, or its text; "token": id also accepted), and the older {"word": "..."}.
void parse_lazy_fields(const json& b, GenParams& g) {
  g.grammar_lazy = opt_bool(b, "grammar_lazy").value_or(false);
  if (auto it = b.find("grammar_triggers"); it != b.end() && !it->is_null()) {
    if (!it->is_array()) throw bad_request("'grammar_triggers' must be an array of triggers", "grammar_triggers");
    if (it->size() > kMaxTriggers) throw bad_request("'grammar_triggers' may hold at most " + std::to_string(kMaxTriggers) + " triggers", "grammar_triggers");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string p = "grammar_triggers[" + std::to_string(i) + "]";
      if (!t.is_object()) throw bad_request("'" + p + "' must be an object {type, value}", "grammar_triggers");
      grammar::TriggerSpec s;
      using K = grammar::TriggerSpec::Kind;
      if (t.contains("word") && !t.contains("type")) {  // llama-server's first form: {"word", "at_start"}
        if (!t["word"].is_string()) throw bad_request("'" + p + ".word' must be a string", "grammar_triggers");
        s.kind = K::Word;
        s.value = t["word"].get<std::string>();
        if (opt_bool(t, "at_start", p).value_or(false)) throw bad_request("'" + p + ".at_start' is not supported: use {\"type\": \"pattern_full\"}", "grammar_triggers");
      } else {
        auto ty = t.find("type");
        if (ty == t.end()) throw bad_request("'" + p + ".type' is required (word, pattern, pattern_full, token)", "grammar_triggers");
        std::string name;
        if (ty->is_string()) name = ty->get<std::string>();
        else if (ty->is_number_integer()) {
          const int64_t n = ty->get<int64_t>();
          name = n == 0 ? "token" : n == 1 ? "word" : n == 2 ? "pattern" : n == 3 ? "pattern_full" : "";
        }
        if (name == "word") s.kind = K::Word;
        else if (name == "pattern") s.kind = K::Pattern;
        else if (name == "pattern_full") s.kind = K::PatternFull;
        else if (name == "token") s.kind = K::Token;
        else throw bad_request("'" + p + ".type' must be \"word\", \"pattern\", \"pattern_full\" or \"token\", got " + ty->dump(), "grammar_triggers");
        auto v = t.find("value");
        auto tk = t.find("token");
        if (s.kind == K::Token) {
          const json* id = tk != t.end() && !tk->is_null() ? &*tk : v != t.end() && v->is_number() ? &*v : nullptr;
          if (id) {
            if (!id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX)
              throw bad_request("'" + p + "': a token id must be a non-negative integer", "grammar_triggers");
            s.token = static_cast<int32_t>(id->get<int64_t>());
          } else if (v != t.end() && v->is_string() && !v->get<std::string>().empty()) {
            s.value = v->get<std::string>();  // the token's text
          } else {
            throw bad_request("'" + p + ".value' must be a token id (or the token's text)", "grammar_triggers");
          }
        } else {
          if (v == t.end() || !v->is_string()) throw bad_request("'" + p + ".value' must be a string", "grammar_triggers");
          s.value = v->get<std::string>();
        }
      }
      g.grammar_triggers.push_back(std::move(s));
    }
    // Words and patterns are checked now (a regex that does not compile names its position).
    std::vector<grammar::TriggerSpec> check = g.grammar_triggers;
    for (auto& c : check)
      if (c.kind == grammar::TriggerSpec::Kind::Token && c.token < 0) c.token = 0;  // resolved later
    try {
      (void)grammar::Triggers::compile(std::move(check));
    } catch (const Error& e) {
      throw bad_request(std::string("'grammar_triggers': ") + e.what(), "grammar_triggers");
    }
  }
  if (auto it = b.find("preserved_tokens"); it != b.end() && !it->is_null()) {
    if (!it->is_array()) throw bad_request("'preserved_tokens' must be an array of strings", "preserved_tokens");
    for (const json& s : *it) {
      if (!s.is_string()) throw bad_request("'preserved_tokens' must be an array of strings", "preserved_tokens");
      g.preserved_tokens.push_back(s.get<std::string>());
    }
  }
  if (g.grammar_lazy) {
    if (g.grammar_triggers.empty()) throw bad_request("'grammar_lazy' is true but 'grammar_triggers' is empty: a lazy grammar needs a trigger", "grammar_lazy");
    if (g.grammar.empty()) throw bad_request("'grammar_lazy' needs a grammar ('grammar', 'json_schema' or 'response_format')", "grammar_lazy");
  } else if (!g.grammar_triggers.empty()) {
    throw bad_request("'grammar_triggers' is given but 'grammar_lazy' is not true", "grammar_triggers");
  }
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
  parse_lazy_fields(b, g);
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
// loose_non_strict: a tool without `strict` gets any JSON object as arguments (tool_choice "auto":
// the schema is the client's promise only for strict tools).
std::string tool_call_schema_grammar(const ServerOptions&, const ChatRequest& req, const std::string& args_key,
                                     bool loose_non_strict = false) {
  json alts = json::array();
  for (size_t i = 0; i < req.tools.size(); ++i) {
    const json& fn = req.tools[i]["function"];
    const std::string name = fn.value("name", "");
    if (req.tool_choice == ToolChoice::kNamed && name != req.tool_name) continue;
    json params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : json{{"type", "object"}};
    const bool strict = i < req.tool_strict.size() && req.tool_strict[i];
    if (loose_non_strict && !strict) params = json{{"type", "object"}};
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

std::string lit(std::string_view s) { return grammar::gbnf_literal(s); }

// JSON types a parameter schema names (as the Qwen3-Coder parser reads them, family_hermes.cpp):
// empty when it says nothing.
void param_types(const json& s, std::set<std::string>& out, int depth = 0) {
  if (!s.is_object() || depth > 8) return;
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string()) out.insert(t.get<std::string>());
    if (t.is_array())
      for (const auto& e : t)
        if (e.is_string()) out.insert(e.get<std::string>());
    return;
  }
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k) && s[k].is_array())
      for (const auto& e : s[k]) param_types(e, out, depth + 1);
  if (!out.empty()) return;
  if (s.contains("enum") && s["enum"].is_array()) {
    for (const auto& e : s["enum"])
      out.insert(e.is_string() ? "string" : e.is_boolean() ? "boolean" : e.is_number() ? "number" : e.is_null() ? "null" : "object");
  } else if (s.contains("properties")) {
    out.insert("object");
  } else if (s.contains("items")) {
    out.insert("array");
  }
}

// Qwen3-Coder XML calls (<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...
// </function>\n</tool_call>): GBNF whose rule `pg-xcall` is one call block of an allowed tool.
// by_schema(i): the tool's parameters decide names, order, required ones and value types (a string
// parameter's value is raw text, an enum of strings one of them, any other type JSON by its schema);
// otherwise any of its parameter names (any number, any order) with raw text values.
std::string xml_call_gbnf(const ChatRequest& req, const chat::ChatFormat& fmt, const std::vector<bool>& by_schema) {
  // Raw text up to and including "\n</parameter>" (an automaton over the terminator's prefixes:
  // only its first character, '\n', repeats in it, so a mismatch falls back to state 0 or 1).
  const std::string term = "\n</parameter>";
  std::string g = "pg-tx ::= [^\\n] pg-tx | \"\\n\" pg-tx1\n";
  for (size_t i = 1; i < term.size(); ++i) {
    const std::string c = term.substr(i, 1);
    const std::string next = i + 1 < term.size() ? " pg-tx" + std::to_string(i + 1) : "";
    g += "pg-tx" + std::to_string(i) + " ::= " + lit(c) + next + " | \"\\n\" pg-tx1 | [^\\n" + (c == "-" || c == "]" || c == "^" || c == "\\" ? "\\" : "") + c + "] pg-tx\n";
  }
  std::vector<grammar::SchemaRule> json_rules;
  std::string fns;
  for (size_t i = 0; i < req.tools.size(); ++i) {
    const json& fn = req.tools[i]["function"];
    const std::string name = fn.value("name", "");
    if (req.tool_choice == ToolChoice::kNamed && name != req.tool_name) continue;
    const json params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : json::object();
    const json props = params.contains("properties") && params["properties"].is_object() ? params["properties"] : json::object();
    const std::string fr = "pg-f" + std::to_string(i);
    std::string body;
    if (by_schema[i]) {
      std::set<std::string> required;
      if (params.contains("required") && params["required"].is_array())
        for (const auto& r : params["required"])
          if (r.is_string()) required.insert(r.get<std::string>());
      size_t j = 0;
      for (auto it = props.begin(); it != props.end(); ++it, ++j) {
        const std::string pr = fr + "-p" + std::to_string(j);
        std::set<std::string> types;
        param_types(it.value(), types);
        std::string value;
        if (types.empty() || types.count("string")) {
          const json& ps = it.value();
          bool all_str = ps.is_object() && ps.contains("enum") && ps["enum"].is_array() && !ps["enum"].empty();
          if (all_str)
            for (const auto& e : ps["enum"]) all_str &= e.is_string();
          if (all_str && types.size() <= 1) {
            for (const auto& e : ps["enum"]) value += (value.empty() ? "( " : " | ") + lit(e.get<std::string>());
            value += " ) " + lit(term);
          } else {
            value = "pg-tx";
          }
        } else {
          json_rules.push_back({pr + "-v", params.dump(), it.key()});
          value = pr + "-v " + lit(term);
        }
        g += pr + " ::= " + lit("<parameter=" + it.key() + ">\n") + " " + value + " \"\\n\"\n";
        body += " " + pr + (required.count(it.key()) ? "" : "?");
      }
    } else {
      std::string names;
      for (auto it = props.begin(); it != props.end(); ++it) names += (names.empty() ? "" : " | ") + lit(it.key());
      if (names.empty()) names = "[a-zA-Z0-9_.-]{1,64}";
      g += fr + "-any ::= \"<parameter=\" ( " + names + " ) \">\\n\" pg-tx \"\\n\"\n";
      body = " " + fr + "-any*";
    }
    g += fr + " ::= " + lit("<function=" + name + ">\n") + body + " " + lit("</function>\n") + "\n";
    fns += (fns.empty() ? "" : " | ") + fr;
  }
  if (fns.empty()) throw bad_request("'tools': no tool to call", "tools");
  g += "pg-xcall ::= " + lit(fmt.tool_open + "\n") + " ( " + fns + " ) " + lit(fmt.tool_close) + "\n";
  if (!json_rules.empty()) {
    try {
      g += grammar::json_schema_rules_gbnf(json_rules);
    } catch (const Error& e) {
      throw bad_request(std::string("'tools': ") + e.what(), "tools");
    }
  }
  return g;
}

// by_schema per tool for the XML and named-call formats: strict tools always (a schema the converter
// refuses is a 400); the others when `all` (forced calls, like the JSON formats) and the converter takes it.
std::vector<bool> xml_by_schema(const ChatRequest& req, bool all) {
  std::vector<bool> v(req.tools.size(), false);
  for (size_t i = 0; i < req.tools.size(); ++i) {
    const json& fn = req.tools[i]["function"];
    const bool strict = i < req.tool_strict.size() && req.tool_strict[i];
    if (!strict && !all) continue;
    const json params = fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : json{{"type", "object"}};
    try {
      (void)grammar::json_schema_to_gbnf(params.dump());
      v[i] = true;
    } catch (const Error& e) {
      if (strict)
        throw bad_request(std::string("'tools': the parameters of '") + fn.value("name", "") + "' (strict): " + e.what(), "tools");
    }
  }
  return v;
}

// Formats whose calls put the tool name outside the arguments object (Mistral, DeepSeek, GPT-OSS):
// one shape, one table per format. A call is `open NAME sep ARGS close` (GBNF fragments), a block
// `block_open call (join call)* block_close` when calls share a block, else one call per block.
// Each table is the syntax the format's parser (src/chat/parse/family_*.cpp) reads back into a call.
struct CallShape {
  std::string open, sep, close;
};
struct NamedCallFormat {
  std::string block_open, join, block_close;
  std::vector<CallShape> shapes;  // alternatives the model may pick (R1 / V3.1 for DeepSeek)
  bool calls_share_block = false;
  std::string block_join;  // between blocks of forced parallel calls (one call per block)
  std::string trigger;     // lazy: the word that opens a call; the grammar starts at it
};

const NamedCallFormat* named_call_format(chat::ChatFamily family) {
  // "[TOOL_CALLS]NAME[ARGS]{...}" (Mistral Small 3.2, Devstral, Ministral 3 templates), one per opener.
  static const NamedCallFormat mistral{"", "", "", {{lit("[TOOL_CALLS]"), lit("[ARGS]"), ""}}, false, "", "[TOOL_CALLS]"};
  // DeepSeek markers are fullwidth bars and U+2581 (family_deepseek.cpp).
  static const std::string bar = "\xEF\xBD\x9C", sp = "\xE2\x96\x81";
  static const std::string calls_begin = "<" + bar + "tool" + sp + "calls" + sp + "begin" + bar + ">";
  static const std::string call_begin = "<" + bar + "tool" + sp + "call" + sp + "begin" + bar + ">";
  static const std::string sep = "<" + bar + "tool" + sp + "sep" + bar + ">";
  static const std::string call_end = "<" + bar + "tool" + sp + "call" + sp + "end" + bar + ">";
  static const std::string calls_end = "<" + bar + "tool" + sp + "calls" + sp + "end" + bar + ">";
  // V3.1: <call_begin>NAME<sep>{...}<call_end>; R1: <call_begin>function<sep>NAME\n```json\n{...}\n```<call_end>.
  static const NamedCallFormat deepseek{lit(calls_begin),
                                        "\"\\n\"?",
                                        lit(calls_end),
                                        {{lit(call_begin), lit(sep), lit(call_end)},
                                         {lit(call_begin + "function" + sep), lit("\n```json\n"), lit("\n```") + " " + lit(call_end)}},
                                        true,
                                        "",
                                        calls_begin};
  // Harmony: the recipient in the role header as the template writes it
  // ("<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>", the
  // prompt ends with "<|start|>assistant"), or after the channel ("<|channel|>commentary
  // to=functions.NAME <|constrain|>json<|message|>"); family_gpt_oss.cpp reads both. The parser reads
  // the recipient up to a space or '<', so "json" never follows the name directly.
  static const NamedCallFormat gpt_oss{"",
                                       "",
                                       "",
                                       {{"( \"<|channel|>commentary \" | \" \" )? \"to=functions.\"",
                                         "\"<|channel|>commentary\"? ( \" \"? \"<|constrain|>json\" | \" json\" )? \"<|message|>\"", lit("<|call|>")}},
                                       false,
                                       lit("<|start|>assistant"),
                                       "to=functions."};
  switch (family) {
    case chat::ChatFamily::kMistral:
      return &mistral;
    case chat::ChatFamily::kDeepSeek:
      return &deepseek;
    case chat::ChatFamily::kGptOss:
      return &gpt_oss;
    default:
      return nullptr;
  }
}

// GBNF whose rule `pg-root` is one block of calls of the allowed tools in `nf`'s syntax (several when
// `parallel`: calls of one block, or blocks). by_schema(i): the tool's parameters constrain its
// arguments, else any JSON object.
std::string named_call_gbnf(const ChatRequest& req, const NamedCallFormat& nf, const std::vector<bool>& by_schema, bool parallel) {
  std::vector<grammar::SchemaRule> rules;
  std::string g, calls;
  for (size_t i = 0; i < req.tools.size(); ++i) {
    const json& fn = req.tools[i]["function"];
    const std::string name = fn.value("name", "");
    if (req.tool_choice == ToolChoice::kNamed && name != req.tool_name) continue;
    const std::string ar = "pg-a" + std::to_string(i);
    const json params = by_schema[i] && fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : json{{"type", "object"}};
    rules.push_back({ar, params.dump(), ""});
    for (size_t k = 0; k < nf.shapes.size(); ++k) {
      const CallShape& sh = nf.shapes[k];
      const std::string cr = "pg-c" + std::to_string(i) + "-" + std::to_string(k);
      g += cr + " ::= " + sh.open + " " + lit(name) + " " + sh.sep + " " + ar + (sh.close.empty() ? "" : " " + sh.close) + "\n";
      calls += (calls.empty() ? "" : " | ") + cr;
    }
  }
  if (calls.empty()) throw bad_request("'tools': no tool to call", "tools");
  g += "pg-call ::= " + calls + "\n";
  const std::string bo = nf.block_open.empty() ? "" : nf.block_open + " ";
  const std::string bc = nf.block_close.empty() ? "" : " " + nf.block_close;
  if (nf.calls_share_block) {
    g += "pg-block ::= " + bo + "pg-call" + (parallel ? " ( " + nf.join + " pg-call )*" : "") + bc + "\n";
    g += "pg-root ::= pg-block\n";
  } else {
    g += "pg-block ::= " + bo + "pg-call" + bc + "\n";
    g += "pg-root ::= pg-block" + (parallel ? " ( " + nf.block_join + " pg-block )*" : "") + "\n";
  }
  try {
    g += grammar::json_schema_rules_gbnf(rules);
  } catch (const Error& e) {
    throw bad_request(std::string("'tools': ") + e.what(), "tools");
  }
  return g;
}

// The request's triggers with token texts resolved and ids checked against the vocabulary.
std::shared_ptr<const grammar::Triggers> request_triggers(const tok::Tokenizer& tok, const GenParams& g) {
  std::vector<grammar::TriggerSpec> specs = g.grammar_triggers;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto& s = specs[i];
    if (s.kind != grammar::TriggerSpec::Kind::Token) continue;
    const std::string p = "grammar_triggers[" + std::to_string(i) + "]";
    if (s.token < 0) {
      const auto ids = tok.encode(s.value, false, true);
      if (ids.size() != 1)
        throw bad_request("'" + p + "': " + json(s.value).dump() + " is " + std::to_string(ids.size()) + " tokens, not one", "grammar_triggers");
      s.token = ids[0];
    }
    if (s.token >= tok.n_vocab())
      throw bad_request("'" + p + "': token id " + std::to_string(s.token) + " is out of range (the vocabulary has " +
                            std::to_string(tok.n_vocab()) + " tokens)",
                        "grammar_triggers");
  }
  try {
    return grammar::Triggers::compile(std::move(specs));
  } catch (const Error& e) {
    throw bad_request(std::string("'grammar_triggers': ") + e.what(), "grammar_triggers");
  }
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
    } else if (tool_forced && fmt.family == chat::ChatFamily::kQwen3Coder) {
      // The prompt holds "<tool_call>\n" (and "<function=NAME>\n" when named): the grammar's first bytes.
      std::string gbnf = xml_call_gbnf(req, fmt, xml_by_schema(req, true));
      const size_t at = rp.forced.find(fmt.tool_open);
      c->prefix = at == std::string::npos ? "" : rp.forced.substr(at);
      gbnf += "pg-root ::= pg-xcall\n";
      c->grammar = grammar::compile_cached(gbnf, engine::shared_vocab(tok), "pg-root");
    } else if (tool_forced && named_call_format(fmt.family)) {
      // The prompt forced at most the close of a reasoning block it opened: the grammar is the whole answer.
      std::string gbnf = named_call_gbnf(req, *named_call_format(fmt.family), xml_by_schema(req, true), req.parallel_tool_calls);
      c->grammar = grammar::compile_cached(gbnf, engine::shared_vocab(tok), "pg-root");
    } else if (req.tool_choice == ToolChoice::kAuto && !req.tools.empty() && req.gen.grammar.empty() &&
               (fmt.family == chat::ChatFamily::kHermes || fmt.family == chat::ChatFamily::kLlama3 ||
                fmt.family == chat::ChatFamily::kQwen3Coder || named_call_format(fmt.family))) {
      // tool_choice "auto": free text, but a call the model opens in the format's syntax is
      // constrained to the allowed tools (a lazy grammar whose trigger is the call opener).
      std::vector<grammar::TriggerSpec> trig;
      std::string gbnf;
      using K = grammar::TriggerSpec::Kind;
      if (fmt.family == chat::ChatFamily::kHermes) {
        gbnf = tool_call_schema_grammar(opt, req, "arguments", true);
        gbnf += "\npg-hcall ::= " + lit(fmt.tool_open) + " \"\\n\"? root \"\\n\"? " + lit(fmt.tool_close) + "\n";
        gbnf += "pg-root ::= pg-hcall\n";
        trig.push_back({K::Word, fmt.tool_open, -1});
      } else if (fmt.family == chat::ChatFamily::kQwen3Coder) {
        gbnf = xml_call_gbnf(req, fmt, xml_by_schema(req, false));
        gbnf += "pg-root ::= pg-xcall\n";
        trig.push_back({K::Word, fmt.tool_open, -1});
      } else if (const NamedCallFormat* nf = named_call_format(fmt.family)) {
        // One block per firing (several calls in it when the format's calls share a block).
        gbnf = named_call_gbnf(req, *nf, xml_by_schema(req, false), req.parallel_tool_calls && nf->calls_share_block);
        trig.push_back({K::Word, nf->trigger, -1});
      } else {
        // Llama 3: the whole answer is the call object, optionally after <|python_tag|>; one call.
        gbnf = tool_call_schema_grammar(opt, req, "parameters", true);
        gbnf += "\npg-root ::= ( \"<|python_tag|>\" [ \\n]? )? root\n";
        trig.push_back({K::PatternFull, "\\s*(\\{\\s*\"name\"\\s*:)[\\s\\S]*", -1});
        trig.push_back({K::Word, "<|python_tag|>", -1});
      }
      c->grammar = grammar::compile_cached(gbnf, engine::shared_vocab(tok), "pg-root");
      c->lazy = grammar::Triggers::compile(std::move(trig));
      // One call per firing; with parallel_tool_calls the answer is free again after it (another
      // call, or text), without only the end may follow. Llama 3's call is the whole answer.
      c->lazy_rearm = req.parallel_tool_calls && fmt.family != chat::ChatFamily::kLlama3;
      // The reasoning block is not watched (a call the model drafts while thinking is not a call).
      c->think_open = fmt.think_open;
      c->think_close = fmt.think_close;
    } else if (!req.gen.grammar.empty() && req.gen.grammar_lazy) {
      // llama-server's lazy grammar: the client's grammar from its trigger on; the reasoning block is
      // not watched.
      c->grammar = engine::compile_grammar(req.gen.grammar, tok, false);
      c->lazy = request_triggers(tok, req.gen);
      c->think_open = fmt.think_open;
      c->think_close = fmt.think_close;
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
  if (g.grammar_lazy) c->lazy = request_triggers(tok, g);
  try {
    c->grammar = engine::compile_grammar(g.grammar, tok, false);
  } catch (const Error& e) {
    throw bad_request(std::string("'") + g.grammar_field + "': " + e.what(), g.grammar_field);
  }
  return c;
}

}  // namespace pg::server
