#include "server/chat_request.h"

#include "server/structured.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

namespace pg::server {

namespace {

constexpr int64_t kMaxTokensLimit = int64_t{1} << 30;
constexpr size_t kMaxStops = 16;
constexpr size_t kMaxTemplateKwargs = 256;

std::string idx(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

[[noreturn]] void unsupported(const std::string& what, const std::string& param) {
  throw bad_request(what, param);
}

void collect_ignored(const json& body, const std::set<std::string>& known, std::vector<std::string>& out) {
  // Structured-output fields every API accepts (server/structured.cpp parses them).
  static const std::set<std::string> structured = {"grammar", "json_schema", "output_format", "reasoning_budget_tokens", "response_format",
                                                   "grammar_lazy", "grammar_triggers", "preserved_tokens"};
  for (auto it = body.begin(); it != body.end(); ++it)
    if (!known.count(it.key()) && !structured.count(it.key())) out.push_back(it.key());
}

// "stop": a string or an array of strings.
std::vector<std::string> parse_stop(const json& body, const char* key) {
  std::vector<std::string> out;
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return out;
  if (it->is_string()) {
    if (!it->get<std::string>().empty()) out.push_back(it->get<std::string>());
    return out;
  }
  if (!it->is_array()) throw bad_request(std::string("'") + key + "' must be a string or an array of strings", key);
  if (it->size() > kMaxStops)
    throw bad_request(std::string("'") + key + "' may hold at most " + std::to_string(kMaxStops) + " strings", key);
  for (size_t i = 0; i < it->size(); ++i) {
    const json& s = (*it)[i];
    if (!s.is_string()) throw bad_request("'" + idx(key, i) + "' must be a string, not " + type_name(s), key);
    if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
  }
  return out;
}

// Sampling fields shared by the OpenAI endpoints (and, by name, the others).
void parse_sampling(const json& b, GenParams& g) {
  g.temperature = opt_number(b, "temperature", 0, 100);
  g.top_p = opt_number(b, "top_p", 0, 1);
  g.min_p = opt_number(b, "min_p", 0, 1);
  g.typical_p = opt_number(b, "typical_p", 0, 1);
  g.top_k = opt_int(b, "top_k", 0, kMaxTokensLimit);
  g.presence_penalty = opt_number(b, "presence_penalty", -2, 2);
  g.frequency_penalty = opt_number(b, "frequency_penalty", -2, 2);
  g.repeat_penalty = opt_number(b, "repetition_penalty", 1e-6, 10);
  if (auto r = opt_number(b, "repeat_penalty", 1e-6, 10)) g.repeat_penalty = r;
  g.repeat_last_n = opt_int(b, "repeat_last_n", -1, kMaxTokensLimit);
  g.seed = opt_int(b, "seed", INT64_MIN, INT64_MAX);
  g.ignore_eos = opt_bool(b, "ignore_eos").value_or(false);
  if (const json* lb = opt_object(b, "logit_bias")) {
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string& k = it.key();
      int64_t id = -1;
      try {
        size_t used = 0;
        id = std::stoll(k, &used);
        if (used != k.size()) id = -1;
      } catch (...) {
        id = -1;
      }
      if (id < 0 || id > INT32_MAX) throw bad_request("'logit_bias' keys must be token ids, got '" + k + "'", "logit_bias");
      if (!it->is_number()) throw bad_request("'logit_bias." + k + "' must be a number", "logit_bias");
      const double v = it->get<double>();
      if (!std::isfinite(v) || v < -100 || v > 100)
        throw bad_request("'logit_bias." + k + "' must be between -100 and 100", "logit_bias");
      // OpenAI's -100 means "never": make it a ban rather than a large penalty.
      g.logit_bias.push_back({static_cast<int32_t>(id), v <= -100 ? -INFINITY : static_cast<float>(v)});
    }
  }
}

// Text of an OpenAI content value: a string, or an array of text parts.
std::string openai_content_text(const json& c, const std::string& path, bool allow_null) {
  if (c.is_null()) {
    if (allow_null) return {};
    throw bad_request("'" + path + "' must not be null", path);
  }
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request("'" + path + "' must be a string or an array of content parts, not " + type_name(c), path);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& p = c[i];
    const std::string pp = idx(path, i);
    if (p.is_string()) {  // tolerated: a bare string part
      if (!out.empty()) out += "\n";
      out += p.get<std::string>();
      continue;
    }
    if (!p.is_object()) throw bad_request("'" + pp + "' must be an object, not " + type_name(p), pp);
    const std::string type = opt_string(p, "type", pp).value_or("text");
    if (type == "text" || type == "input_text" || type == "output_text" || type == "refusal") {
      const char* key = type == "refusal" ? "refusal" : "text";
      const std::string t = req_string(p, key, pp);
      if (!out.empty()) out += "\n";
      out += t;
    } else if (type == "image_url" || type == "input_image" || type == "input_audio" || type == "file" || type == "input_file") {
      unsupported("'" + pp + "': content parts of type '" + type + "' are not supported (this model reads text only)", pp);
    } else {
      unsupported("'" + pp + "': unknown content part type '" + type + "'", pp);
    }
  }
  return out;
}

// Tool-call arguments as templates want them: an object when the string holds one (nested no
// deeper than a body may be: the string escapes parse_body's limit).
json template_arguments(const json& args) {
  if (args.is_string()) {
    try {
      json j = parse_json(args.get<std::string>());
      if (j.is_object()) return j;
    } catch (...) {
    }
  }
  return args;
}

json make_tool_call(std::string id, std::string name, const json& arguments) {
  json fn = json::object();
  fn["name"] = std::move(name);
  fn["arguments"] = template_arguments(arguments);
  json tc = json::object();
  tc["id"] = std::move(id);
  tc["type"] = "function";
  tc["function"] = std::move(fn);
  return tc;
}

json make_tool(const std::string& name, const json* description, const json* parameters) {
  json fn = json::object();
  fn["name"] = name;
  if (description && description->is_string()) fn["description"] = *description;
  fn["parameters"] = parameters && parameters->is_object() ? *parameters : json{{"type", "object"}, {"properties", json::object()}};
  return json{{"type", "function"}, {"function", fn}};
}

// OpenAI chat tools: [{"type":"function","function":{...}}]. Other tool types are left out.
void parse_openai_tools(const json& body, ChatRequest& r) {
  const json* tools = opt_array(body, "tools");
  if (!tools) return;
  std::set<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const json& t = (*tools)[i];
    const std::string p = idx("tools", i);
    if (!t.is_object()) throw bad_request("'" + p + "' must be an object", p);
    const std::string type = opt_string(t, "type", p).value_or("function");
    if (type != "function") {
      r.skipped_tools.push_back(type);
      continue;
    }
    const json* fn = opt_object(t, "function", p);
    if (!fn) throw bad_request("'" + p + ".function' is required", p);
    const std::string name = req_string(*fn, "name", p + ".function");
    if (name.empty()) throw bad_request("'" + p + ".function.name' must not be empty", p);
    if (!names.insert(name).second) throw bad_request("two tools are named '" + name + "'", p);
    auto d = fn->find("description");
    if (d != fn->end() && !d->is_null() && !d->is_string()) throw bad_request("'" + p + ".function.description' must be a string", p);
    const json* params = opt_object(*fn, "parameters", p + ".function");
    r.tools.push_back(make_tool(name, d != fn->end() ? &*d : nullptr, params));
    r.tool_strict.push_back(opt_bool(*fn, "strict", p + ".function").value_or(false));
  }
}

bool has_tool(const ChatRequest& r, const std::string& name) {
  for (const auto& t : r.tools)
    if (t["function"]["name"] == name) return true;
  return false;
}

void check_tool_choice(ChatRequest& r) {
  if ((r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) && r.tools.empty())
    throw bad_request("'tool_choice' asks for a tool call but the request has no function tools", "tool_choice");
  if (r.tool_choice == ToolChoice::kNamed && !has_tool(r, r.tool_name))
    throw bad_request("'tool_choice' names '" + r.tool_name + "', which is not among the tools", "tool_choice");
}

// OpenAI chat and Responses tool_choice.
void parse_openai_tool_choice(const json& body, ChatRequest& r, bool responses) {
  auto it = body.find("tool_choice");
  if (it == body.end() || it->is_null()) return;
  if (it->is_string()) {
    const std::string s = it->get<std::string>();
    if (s == "auto") r.tool_choice = ToolChoice::kAuto;
    else if (s == "none") r.tool_choice = ToolChoice::kNone;
    else if (s == "required") r.tool_choice = ToolChoice::kRequired;
    else throw bad_request("'tool_choice' must be \"auto\", \"none\", \"required\" or a function, got \"" + s + "\"", "tool_choice");
  } else if (it->is_object()) {
    const std::string type = opt_string(*it, "type", "tool_choice").value_or("");
    if (type == "function") {
      std::string name;
      if (const json* fn = opt_object(*it, "function", "tool_choice")) name = req_string(*fn, "name", "tool_choice.function");
      else if (responses || has(*it, "name")) name = req_string(*it, "name", "tool_choice");
      else throw bad_request("'tool_choice.function.name' is required", "tool_choice");
      r.tool_choice = ToolChoice::kNamed;
      r.tool_name = name;
    } else if (type == "allowed_tools") {
      r.tool_choice = ToolChoice::kAuto;
    } else {
      throw bad_request("'tool_choice.type' \"" + type + "\" is not supported (use \"function\")", "tool_choice");
    }
  } else {
    throw bad_request("'tool_choice' must be a string or an object", "tool_choice");
  }
}

// Consecutive system messages at the start (Codex sends several developer messages) become one:
// many templates accept a single system message, and only as the first.
// One pass and one erase: joining and erasing one message at a time was quadratic, minutes of CPU for
// a body of a few hundred thousand system messages.
void merge_leading_system(json& messages) {
  size_t n = 0;  // leading system messages
  while (n < messages.size() && messages[n]["role"] == "system") ++n;
  if (n < 2) return;
  std::string joined = messages[0]["content"].get<std::string>();
  for (size_t i = 1; i < n; ++i) {
    joined += "\n\n";
    joined += messages[i]["content"].get_ref<const std::string&>();
  }
  messages[0]["content"] = std::move(joined);
  messages.erase(messages.begin() + 1, messages.begin() + static_cast<std::ptrdiff_t>(n));
}

void parse_reasoning_effort(const std::string& effort, ChatRequest& r) {
  r.template_kwargs["reasoning_effort"] = effort;
  r.gen.reasoning_effort = effort;
  if (effort == "none") r.enable_thinking = false;
}

void parse_template_kwargs(const json& body, ChatRequest& r) {
  if (const json* kw = opt_object(body, "chat_template_kwargs")) {
    // Each becomes a template variable; the template engine sets variables by a linear search, so
    // tens of thousands of them took minutes. Real requests pass a handful.
    if (kw->size() > kMaxTemplateKwargs)
      throw bad_request("'chat_template_kwargs' may hold at most " + std::to_string(kMaxTemplateKwargs) + " variables",
                        "chat_template_kwargs");
    // The request's variables win over those set from other fields. Merged into a copy of kw: inserting
    // kw's members one by one into an ordered_json is a linear search each, quadratic in their number.
    json merged = *kw;
    for (auto it = r.template_kwargs.begin(); it != r.template_kwargs.end(); ++it)
      if (!merged.contains(it.key())) merged[it.key()] = *it;
    r.template_kwargs = std::move(merged);
    if (auto e = opt_bool(*kw, "enable_thinking", "chat_template_kwargs")) r.enable_thinking = e;
  }
}

}  // namespace

SamplingParams GenParams::resolve(const SamplingParams& d, int64_t default_seed) const {
  SamplingParams p = d;
  if (temperature) p.temperature = static_cast<float>(*temperature);
  if (top_p) p.top_p = static_cast<float>(*top_p);
  if (min_p) p.min_p = static_cast<float>(*min_p);
  if (typical_p) p.typical_p = static_cast<float>(*typical_p);
  if (repeat_penalty) p.repeat_penalty = static_cast<float>(*repeat_penalty);
  if (presence_penalty) p.presence_penalty = static_cast<float>(*presence_penalty);
  if (frequency_penalty) p.frequency_penalty = static_cast<float>(*frequency_penalty);
  if (top_k) p.top_k = static_cast<int>(*top_k);
  if (repeat_last_n) p.repeat_last_n = static_cast<int>(*repeat_last_n);
  if (!logit_bias.empty()) p.logit_bias = logit_bias;
  if (seed) p.seed = static_cast<uint64_t>(*seed);
  else if (default_seed >= 0) p.seed = static_cast<uint64_t>(default_seed);
  else p.seed = std::random_device{}();
  return p;
}

// ---------------------------------------------------------------- OpenAI chat completions

ChatRequest parse_openai_chat(const json& b) {
  static const std::set<std::string> known = {
      "model", "messages", "tools", "tool_choice", "parallel_tool_calls", "stop", "max_tokens", "max_completion_tokens",
      "temperature", "top_p", "top_k", "min_p", "typical_p", "presence_penalty", "frequency_penalty",
      "repetition_penalty", "repeat_penalty", "repeat_last_n", "seed", "logit_bias", "logprobs", "top_logprobs", "stream",
      "stream_options", "n", "response_format", "chat_template_kwargs", "reasoning_effort", "functions", "function_call",
      "audio", "modalities", "web_search_options",
      // Accepted and without effect here.
      "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "prediction", "verbosity",
      "cache_prompt", "id_slot", "timings_per_token", "ignore_eos"};
  ChatRequest r;
  collect_ignored(b, known, r.ignored);
  r.model = opt_string(b, "model").value_or("");
  if (auto n = opt_int(b, "n", 1, 128); n && *n != 1)
    unsupported("'n' must be 1: this server returns one choice per request (send parallel requests instead)", "n");
  if (has(b, "functions") || has(b, "function_call"))
    unsupported("'functions' and 'function_call' are deprecated and not supported; use 'tools' and 'tool_choice'", "functions");
  if (has(b, "audio")) unsupported("'audio' output is not supported", "audio");
  if (has(b, "web_search_options")) unsupported("'web_search_options' is not supported", "web_search_options");
  if (const json* mods = opt_array(b, "modalities"))
    for (const auto& m : *mods)
      if (m != "text") unsupported("'modalities' may only contain \"text\"", "modalities");
  parse_structured_fields(b, r.gen);

  const json* msgs = opt_array(b, "messages");
  if (!msgs) throw bad_request("'messages' is required", "messages");
  if (msgs->empty()) throw bad_request("'messages' must not be empty", "messages");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string p = idx("messages", i);
    if (!m.is_object()) throw bad_request("'" + p + "' must be an object, not " + type_name(m), p);
    const std::string role = req_string(m, "role", p);
    json out = json::object();
    if (role == "system" || role == "developer" || role == "user") {
      auto c = m.find("content");
      if (c == m.end()) throw bad_request("'" + p + ".content' is required", p + ".content");
      out["role"] = role == "developer" ? "system" : role;
      out["content"] = openai_content_text(*c, p + ".content", false);
      if (auto name = opt_string(m, "name", p)) out["name"] = *name;
    } else if (role == "assistant") {
      out["role"] = "assistant";
      auto c = m.find("content");
      out["content"] = c == m.end() ? std::string() : openai_content_text(*c, p + ".content", true);
      std::optional<std::string> rc = opt_string(m, "reasoning_content", p);
      if (!rc) rc = opt_string(m, "reasoning", p);
      if (rc && !rc->empty()) out["reasoning_content"] = *rc;
      if (const json* tcs = opt_array(m, "tool_calls", p)) {
        json calls = json::array();
        for (size_t k = 0; k < tcs->size(); ++k) {
          const json& tc = (*tcs)[k];
          const std::string tp = idx(p + ".tool_calls", k);
          if (!tc.is_object()) throw bad_request("'" + tp + "' must be an object", tp);
          const std::string type = opt_string(tc, "type", tp).value_or("function");
          if (type != "function") unsupported("'" + tp + ".type' must be \"function\"", tp);
          const json* fn = opt_object(tc, "function", tp);
          if (!fn) throw bad_request("'" + tp + ".function' is required", tp);
          const std::string name = req_string(*fn, "name", tp + ".function");
          auto a = fn->find("arguments");
          json args = a == fn->end() || a->is_null() ? json("{}") : *a;
          if (!args.is_string() && !args.is_object())
            throw bad_request("'" + tp + ".function.arguments' must be a JSON string", tp + ".function.arguments");
          calls.push_back(make_tool_call(opt_string(tc, "id", tp).value_or(random_id("call_")), name, args));
        }
        if (!calls.empty()) out["tool_calls"] = calls;
      }
      if (auto name = opt_string(m, "name", p)) out["name"] = *name;
    } else if (role == "tool") {
      out["role"] = "tool";
      out["tool_call_id"] = opt_string(m, "tool_call_id", p).value_or("");
      auto c = m.find("content");
      out["content"] = c == m.end() ? std::string() : openai_content_text(*c, p + ".content", true);
      if (auto name = opt_string(m, "name", p)) out["name"] = *name;
    } else if (role == "function") {
      unsupported("'" + p + ".role' \"function\" is deprecated and not supported; use \"tool\"", p + ".role");
    } else {
      throw bad_request("'" + p + ".role' must be one of system, developer, user, assistant, tool; got \"" + role + "\"",
                        p + ".role");
    }
    r.messages.push_back(std::move(out));
  }
  merge_leading_system(r.messages);

  parse_openai_tools(b, r);
  parse_openai_tool_choice(b, r, false);
  r.parallel_tool_calls = opt_bool(b, "parallel_tool_calls").value_or(true);
  if (r.tool_choice != ToolChoice::kNone) check_tool_choice(r);

  parse_sampling(b, r.gen);
  r.gen.stop = parse_stop(b, "stop");
  r.gen.max_tokens = opt_int(b, "max_completion_tokens", 1, kMaxTokensLimit);
  if (!r.gen.max_tokens) r.gen.max_tokens = opt_int(b, "max_tokens", 1, kMaxTokensLimit);
  const bool lp = opt_bool(b, "logprobs").value_or(false);
  const auto top = opt_int(b, "top_logprobs", 0, 20);
  if (top && !lp) throw bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs");
  if (lp) r.gen.logprobs = static_cast<int>(top.value_or(0));
  r.stream = opt_bool(b, "stream").value_or(false);
  if (const json* so = opt_object(b, "stream_options")) r.include_usage = opt_bool(*so, "include_usage", "stream_options").value_or(false);
  if (auto e = opt_string(b, "reasoning_effort")) parse_reasoning_effort(*e, r);
  parse_template_kwargs(b, r);
  return r;
}

// ---------------------------------------------------------------- OpenAI Responses

namespace {

// Responses content: a string, or parts (input_text, output_text, refusal).
std::string responses_text(const json& c, const std::string& path) { return openai_content_text(c, path, true); }

std::string function_output_text(const json& o, const std::string& path) {
  if (o.is_string()) return o.get<std::string>();
  if (o.is_array()) return openai_content_text(o, path, true);
  if (o.is_null()) return {};
  return o.dump();  // some clients send structured output: give the model its JSON text
}

}  // namespace

ChatRequest parse_responses(const json& b) {
  static const std::set<std::string> known = {
      "model", "instructions", "input", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens", "temperature",
      "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stream", "reasoning", "ignore_eos",
      "text", "previous_response_id", "background", "conversation", "prompt", "top_logprobs", "chat_template_kwargs",
      // Accepted and without effect here.
      "store", "include", "truncation", "metadata", "user", "prompt_cache_key", "service_tier", "max_tool_calls",
      "safety_identifier", "stream_options", "client_metadata"};
  ChatRequest r;
  collect_ignored(b, known, r.ignored);
  parse_structured_fields(b, r.gen);
  r.model = opt_string(b, "model").value_or("");
  if (has(b, "previous_response_id"))
    unsupported("'previous_response_id' is not supported: this server keeps no state, send the whole conversation in 'input'",
                "previous_response_id");
  if (has(b, "conversation")) unsupported("'conversation' is not supported: send the whole conversation in 'input'", "conversation");
  if (opt_bool(b, "background").value_or(false)) unsupported("'background' responses are not supported", "background");
  if (has(b, "prompt")) unsupported("reusable 'prompt' templates are not supported", "prompt");
  if (const json* text = opt_object(b, "text")) {
    if (const json* fmt = opt_object(*text, "format", "text")) {
      parse_format_object(*fmt, r.gen, "text.format");
    }
  }

  if (auto ins = opt_string(b, "instructions"); ins && !ins->empty()) r.messages.push_back(json{{"role", "system"}, {"content", *ins}});
  auto in = b.find("input");
  if (in == b.end() || in->is_null()) throw bad_request("'input' is required", "input");
  if (in->is_string()) {
    r.messages.push_back(json{{"role", "user"}, {"content", in->get<std::string>()}});
  } else if (in->is_array()) {
    std::string pending_reasoning;
    // Index of the assistant message that function calls attach to, while no other turn came after it.
    std::optional<size_t> open_assistant;
    auto assistant = [&]() -> json& {
      if (!open_assistant) {
        json m = json::object();
        m["role"] = "assistant";
        m["content"] = "";
        r.messages.push_back(std::move(m));
        open_assistant = r.messages.size() - 1;
      }
      json& m = r.messages[*open_assistant];
      if (!pending_reasoning.empty()) {
        m["reasoning_content"] = pending_reasoning;
        pending_reasoning.clear();
      }
      return m;
    };
    for (size_t i = 0; i < in->size(); ++i) {
      const json& it = (*in)[i];
      const std::string p = idx("input", i);
      if (!it.is_object()) throw bad_request("'" + p + "' must be an object, not " + type_name(it), p);
      std::string type = opt_string(it, "type", p).value_or(has(it, "role") ? "message" : "");
      if (type == "message") {
        const std::string role = req_string(it, "role", p);
        auto c = it.find("content");
        const std::string text = c == it.end() ? std::string() : responses_text(*c, p + ".content");
        if (role == "assistant") {
          open_assistant.reset();
          json& m = assistant();
          m["content"] = text;
        } else if (role == "user" || role == "system" || role == "developer") {
          open_assistant.reset();
          r.messages.push_back(json{{"role", role == "developer" ? "system" : role}, {"content", text}});
        } else {
          throw bad_request("'" + p + ".role' must be one of user, assistant, system, developer; got \"" + role + "\"", p + ".role");
        }
      } else if (type == "function_call" || type == "custom_tool_call") {
        const std::string name = req_string(it, "name", p);
        const std::string call_id = opt_string(it, "call_id", p).value_or(opt_string(it, "id", p).value_or(random_id("call_")));
        json args;
        if (type == "function_call") {
          auto a = it.find("arguments");
          args = a == it.end() || a->is_null() ? json("{}") : *a;
          if (!args.is_string() && !args.is_object()) throw bad_request("'" + p + ".arguments' must be a string", p + ".arguments");
        } else {
          args = json{{"input", opt_string(it, "input", p).value_or("")}};
        }
        json& m = assistant();
        if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
        m["tool_calls"].push_back(make_tool_call(call_id, name, args));
      } else if (type == "function_call_output" || type == "custom_tool_call_output") {
        open_assistant.reset();
        const std::string call_id = req_string(it, "call_id", p);
        auto o = it.find("output");
        r.messages.push_back(json{{"role", "tool"},
                                  {"tool_call_id", call_id},
                                  {"content", o == it.end() ? std::string() : function_output_text(*o, p + ".output")}});
      } else if (type == "reasoning") {
        std::string text;
        for (const char* key : {"content", "summary"}) {
          const json* parts = opt_array(it, key, p);
          if (!parts) continue;
          for (const auto& part : *parts)
            if (part.is_object() && part.contains("text") && part["text"].is_string()) {
              if (!text.empty()) text += "\n";
              text += part["text"].get<std::string>();
            }
          if (!text.empty()) break;  // the full reasoning text when present, else its summary
        }
        if (!pending_reasoning.empty() && !text.empty()) pending_reasoning += "\n";
        pending_reasoning += text;
      } else if (type == "item_reference") {
        unsupported("'" + p + "': item references need server-side state, which this server does not keep", p);
      } else if (type.empty()) {
        throw bad_request("'" + p + ".type' is required", p + ".type");
      } else {
        // Hosted-tool items (web_search_call, local_shell_call, ...) carry nothing a local model can use.
        r.skipped_tools.push_back(type);
      }
    }
  } else {
    throw bad_request("'input' must be a string or an array of items, not " + type_name(*in), "input");
  }
  if (r.messages.empty()) throw bad_request("'input' holds no messages", "input");
  merge_leading_system(r.messages);

  if (const json* tools = opt_array(b, "tools")) {
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string p = idx("tools", i);
      if (!t.is_object()) throw bad_request("'" + p + "' must be an object", p);
      const std::string type = opt_string(t, "type", p).value_or("function");
      if (type != "function") {
        r.skipped_tools.push_back(type);
        continue;
      }
      const std::string name = req_string(t, "name", p);
      if (name.empty()) throw bad_request("'" + p + ".name' must not be empty", p);
      if (!names.insert(name).second) throw bad_request("two tools are named '" + name + "'", p);
      auto d = t.find("description");
      r.tools.push_back(make_tool(name, d != t.end() ? &*d : nullptr, opt_object(t, "parameters", p)));
      r.tool_strict.push_back(opt_bool(t, "strict", p).value_or(false));
    }
  }
  parse_openai_tool_choice(b, r, true);
  r.parallel_tool_calls = opt_bool(b, "parallel_tool_calls").value_or(true);
  if (r.tool_choice != ToolChoice::kNone) check_tool_choice(r);

  parse_sampling(b, r.gen);
  r.gen.max_tokens = opt_int(b, "max_output_tokens", 1, kMaxTokensLimit);
  r.stream = opt_bool(b, "stream").value_or(false);
  r.include_usage = true;
  if (const json* reasoning = opt_object(b, "reasoning"))
    if (auto e = opt_string(*reasoning, "effort", "reasoning")) parse_reasoning_effort(*e, r);
  parse_template_kwargs(b, r);
  return r;
}

// ---------------------------------------------------------------- Anthropic Messages

namespace {

std::string anthropic_text_blocks(const json& c, const std::string& path) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request("'" + path + "' must be a string or an array of content blocks", path);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& bl = c[i];
    const std::string p = idx(path, i);
    if (!bl.is_object()) throw bad_request("'" + p + "' must be an object", p);
    const std::string type = req_string(bl, "type", p);
    if (type == "text") {
      if (!out.empty()) out += "\n";
      out += req_string(bl, "text", p);
    } else if (type == "image" || type == "document") {
      unsupported("'" + p + "': content blocks of type '" + type + "' are not supported (this model reads text only)", p);
    } else {
      throw bad_request("'" + p + ".type' must be \"text\" here, got \"" + type + "\"", p);
    }
  }
  return out;
}

}  // namespace

ChatRequest parse_anthropic(const json& b, bool count_only) {
  static const std::set<std::string> known = {
      "model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p", "top_k", "tools",
      "tool_choice", "thinking", "mcp_servers", "chat_template_kwargs", "output_config",
      // Accepted and without effect here.
      "metadata", "service_tier", "container", "context_management", "betas"};
  ChatRequest r;
  collect_ignored(b, known, r.ignored);
  parse_structured_fields(b, r.gen);
  r.model = opt_string(b, "model").value_or("");
  if (has(b, "mcp_servers")) unsupported("'mcp_servers' are not supported", "mcp_servers");
  if (!count_only) {
    r.gen.max_tokens = opt_int(b, "max_tokens", 1, kMaxTokensLimit);
    if (!r.gen.max_tokens) throw bad_request("'max_tokens' is required", "max_tokens");
  }
  if (auto s = b.find("system"); s != b.end() && !s->is_null()) {
    const std::string sys = anthropic_text_blocks(*s, "system");
    if (!sys.empty()) r.messages.push_back(json{{"role", "system"}, {"content", sys}});
  }
  const json* msgs = opt_array(b, "messages");
  if (!msgs) throw bad_request("'messages' is required", "messages");
  if (msgs->empty()) throw bad_request("'messages' must not be empty", "messages");
  std::vector<std::string> late_system;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string p = idx("messages", i);
    if (!m.is_object()) throw bad_request("'" + p + "' must be an object", p);
    const std::string role = req_string(m, "role", p);
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) throw bad_request("'" + p + ".content' is required", p + ".content");
    if (role == "system") {
      // Claude Code sends context (environment, reminders) as system turns between the others. Most
      // chat templates accept a system message only at the start, so it joins the system prompt.
      const std::string text = anthropic_text_blocks(*c, p + ".content");
      if (!text.empty()) late_system.push_back(text);
      continue;
    }
    if (role != "user" && role != "assistant")
      throw bad_request("'" + p + ".role' must be \"user\", \"assistant\" or \"system\", got \"" + role + "\"", p + ".role");
    if (c->is_string()) {
      r.messages.push_back(json{{"role", role}, {"content", c->get<std::string>()}});
      continue;
    }
    if (!c->is_array()) throw bad_request("'" + p + ".content' must be a string or an array of content blocks", p + ".content");
    if (role == "user") {
      // Tool results become tool messages (in order, before the user's own text, as the API defines).
      std::string text;
      for (size_t k = 0; k < c->size(); ++k) {
        const json& bl = (*c)[k];
        const std::string bp = idx(p + ".content", k);
        if (!bl.is_object()) throw bad_request("'" + bp + "' must be an object", bp);
        const std::string type = req_string(bl, "type", bp);
        if (type == "text") {
          if (!text.empty()) text += "\n";
          text += req_string(bl, "text", bp);
        } else if (type == "tool_result") {
          const std::string id = req_string(bl, "tool_use_id", bp);
          auto rc = bl.find("content");
          std::string out = rc == bl.end() || rc->is_null() ? std::string() : anthropic_text_blocks(*rc, bp + ".content");
          r.messages.push_back(json{{"role", "tool"}, {"tool_call_id", id}, {"content", out}});
        } else if (type == "image" || type == "document") {
          unsupported("'" + bp + "': content blocks of type '" + type + "' are not supported (this model reads text only)", bp);
        } else {
          throw bad_request("'" + bp + ".type' \"" + type + "\" is not allowed in a user message", bp + ".type");
        }
      }
      if (!text.empty() || r.messages.empty() || r.messages.back()["role"] != "tool")
        r.messages.push_back(json{{"role", "user"}, {"content", text}});
    } else {
      json out = json::object();
      out["role"] = "assistant";
      std::string text, thinking;
      json calls = json::array();
      for (size_t k = 0; k < c->size(); ++k) {
        const json& bl = (*c)[k];
        const std::string bp = idx(p + ".content", k);
        if (!bl.is_object()) throw bad_request("'" + bp + "' must be an object", bp);
        const std::string type = req_string(bl, "type", bp);
        if (type == "text") {
          if (!text.empty()) text += "\n";
          text += req_string(bl, "text", bp);
        } else if (type == "thinking") {
          if (!thinking.empty()) thinking += "\n";
          thinking += opt_string(bl, "thinking", bp).value_or("");
        } else if (type == "redacted_thinking") {
          // Encrypted by another provider: nothing a local model can read.
        } else if (type == "tool_use") {
          const std::string id = req_string(bl, "id", bp);
          const std::string name = req_string(bl, "name", bp);
          auto in = bl.find("input");
          json args = in == bl.end() || in->is_null() ? json::object() : *in;
          if (!args.is_object()) throw bad_request("'" + bp + ".input' must be an object", bp + ".input");
          calls.push_back(make_tool_call(id, name, args));
        } else {
          throw bad_request("'" + bp + ".type' \"" + type + "\" is not allowed in an assistant message", bp + ".type");
        }
      }
      out["content"] = text;
      if (!thinking.empty()) out["reasoning_content"] = thinking;
      if (!calls.empty()) out["tool_calls"] = calls;
      r.messages.push_back(std::move(out));
    }
  }

  if (!late_system.empty()) {
    std::string extra;
    for (const auto& t : late_system) extra += (extra.empty() ? "" : "\n\n") + t;
    if (!r.messages.empty() && r.messages[0]["role"] == "system")
      r.messages[0]["content"] = r.messages[0]["content"].get<std::string>() + "\n\n" + extra;
    else
      r.messages.insert(r.messages.begin(), json{{"role", "system"}, {"content", extra}});
  }
  bool any_turn = false;
  for (const auto& m : r.messages) any_turn = any_turn || m["role"] != "system";
  if (!any_turn) throw bad_request("'messages' must hold at least one user or assistant message", "messages");

  if (const json* tools = opt_array(b, "tools")) {
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string p = idx("tools", i);
      if (!t.is_object()) throw bad_request("'" + p + "' must be an object", p);
      const std::string type = opt_string(t, "type", p).value_or("custom");
      // Server tools (web_search_20250305, bash_20250124, ...) run on Anthropic's side: leave them out.
      if (type != "custom") {
        r.skipped_tools.push_back(type);
        continue;
      }
      // Deferred tools are revealed by Anthropic's server-side tool search, which a local server
      // does not have: the model never sees them (as with the real API until they are searched).
      if (opt_bool(t, "defer_loading", p).value_or(false)) {
        r.skipped_tools.push_back("deferred:" + opt_string(t, "name", p).value_or(""));
        continue;
      }
      const std::string name = req_string(t, "name", p);
      if (name.empty()) throw bad_request("'" + p + ".name' must not be empty", p);
      if (!names.insert(name).second) throw bad_request("two tools are named '" + name + "'", p);
      const json* schema = opt_object(t, "input_schema", p);
      if (!schema) throw bad_request("'" + p + ".input_schema' is required", p + ".input_schema");
      auto d = t.find("description");
      r.tools.push_back(make_tool(name, d != t.end() ? &*d : nullptr, schema));
    }
  }
  if (const json* tc = opt_object(b, "tool_choice")) {
    const std::string type = req_string(*tc, "type", "tool_choice");
    if (type == "auto") r.tool_choice = ToolChoice::kAuto;
    else if (type == "any") r.tool_choice = ToolChoice::kRequired;
    else if (type == "none") r.tool_choice = ToolChoice::kNone;
    else if (type == "tool") {
      r.tool_choice = ToolChoice::kNamed;
      r.tool_name = req_string(*tc, "name", "tool_choice");
    } else {
      throw bad_request("'tool_choice.type' must be auto, any, tool or none; got \"" + type + "\"", "tool_choice.type");
    }
    if (opt_bool(*tc, "disable_parallel_tool_use", "tool_choice").value_or(false)) r.parallel_tool_calls = false;
  }
  if (r.tool_choice != ToolChoice::kNone) check_tool_choice(r);

  r.gen.temperature = opt_number(b, "temperature", 0, 100);
  r.gen.top_p = opt_number(b, "top_p", 0, 1);
  r.gen.top_k = opt_int(b, "top_k", 0, kMaxTokensLimit);
  r.gen.stop = parse_stop(b, "stop_sequences");
  r.stream = opt_bool(b, "stream").value_or(false);
  if (const json* th = opt_object(b, "thinking")) {
    const std::string type = req_string(*th, "type", "thinking");
    if (type == "enabled" || type == "adaptive") r.enable_thinking = true;
    else if (type == "disabled") r.enable_thinking = false;
    else throw bad_request("'thinking.type' must be \"enabled\", \"adaptive\" or \"disabled\", got \"" + type + "\"", "thinking.type");
    if (auto d = opt_string(*th, "display", "thinking"); d && *d == "omitted") r.hide_reasoning = true;
    // Honoured as given, small values included (Anthropic's API asks for >= 1024; this server does not).
    if (type == "enabled")
      if (auto bt = opt_int(*th, "budget_tokens", 0, kMaxTokensLimit)) r.gen.reasoning_budget = *bt;
  }
  if (const json* oc = opt_object(b, "output_config"))
    if (auto e = opt_string(*oc, "effort", "output_config")) r.template_kwargs["reasoning_effort"] = *e;
  parse_template_kwargs(b, r);
  return r;
}

// ---------------------------------------------------------------- OpenAI completions

CompletionRequest parse_completion(const json& b) {
  static const std::set<std::string> known = {
      "model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "typical_p", "n", "stream", "stream_options",
      "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty", "repetition_penalty", "repeat_penalty",
      "repeat_last_n", "best_of", "logit_bias", "seed", "suffix", "ignore_eos",
      // Accepted and without effect here.
      "user", "cache_prompt", "id_slot"};
  CompletionRequest r;
  collect_ignored(b, known, r.ignored);
  parse_structured_fields(b, r.gen);
  r.model = opt_string(b, "model").value_or("");
  if (auto n = opt_int(b, "n", 1, 128); n && *n != 1) unsupported("'n' must be 1: send parallel requests instead", "n");
  if (auto bo = opt_int(b, "best_of", 1, 128); bo && *bo != 1) unsupported("'best_of' must be 1", "best_of");
  if (has(b, "suffix")) unsupported("'suffix' (fill-in-the-middle) is not supported", "suffix");
  auto p = b.find("prompt");
  if (p == b.end() || p->is_null()) throw bad_request("'prompt' is required", "prompt");
  auto ids_of = [](const json& a, const std::string& path) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!a[i].is_number_integer() || a[i].get<int64_t>() < 0 || a[i].get<int64_t>() > INT32_MAX)
        throw bad_request("'" + idx(path, i) + "' must be a token id", path);
      ids.push_back(static_cast<int32_t>(a[i].get<int64_t>()));
    }
    return ids;
  };
  if (p->is_string()) {
    r.prompt = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) throw bad_request("'prompt' must not be empty", "prompt");
    const json& first = (*p)[0];
    if (first.is_number()) {
      r.prompt = ids_of(*p, "prompt");
    } else if (p->size() != 1) {
      unsupported("'prompt' may hold one prompt only: send parallel requests instead", "prompt");
    } else if (first.is_string()) {
      r.prompt = first.get<std::string>();
    } else if (first.is_array()) {
      r.prompt = ids_of(first, "prompt[0]");
    } else {
      throw bad_request("'prompt' must be a string, an array of token ids, or an array holding one of those", "prompt");
    }
  } else {
    throw bad_request("'prompt' must be a string or an array of token ids, not " + type_name(*p), "prompt");
  }
  parse_sampling(b, r.gen);
  r.gen.stop = parse_stop(b, "stop");
  r.gen.max_tokens = opt_int(b, "max_tokens", 1, kMaxTokensLimit);
  if (auto lp = opt_int(b, "logprobs", 0, 20)) r.gen.logprobs = static_cast<int>(*lp);
  r.echo = opt_bool(b, "echo").value_or(false);
  r.stream = opt_bool(b, "stream").value_or(false);
  if (const json* so = opt_object(b, "stream_options")) r.include_usage = opt_bool(*so, "include_usage", "stream_options").value_or(false);
  return r;
}

}  // namespace pg::server
