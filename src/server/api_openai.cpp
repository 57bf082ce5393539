// OpenAI chat completions, legacy completions and models.
#include "server/structured.h"
#include "server/context.h"
#include "server/prepare.h"

namespace pg::server {

namespace {

std::string model_of(const Context& ctx, const std::string& requested) {
  return requested.empty() ? ctx.opt.model_name : requested;
}

const char* chat_finish_reason(const engine::Event& f, bool tool_calls) {
  switch (f.finish) {
    case engine::FinishReason::kLength:
    case engine::FinishReason::kContext:
    case engine::FinishReason::kTimeout: return "length";
    default: return tool_calls ? "tool_calls" : "stop";
  }
}

json usage_json(const engine::RequestStats& s) {
  json u = json::object();
  u["prompt_tokens"] = s.n_prompt;
  u["completion_tokens"] = s.n_generated;
  if (s.n_reasoning > 0) u["completion_tokens_details"] = json{{"reasoning_tokens", s.n_reasoning}};
  u["total_tokens"] = s.n_prompt + s.n_generated;
  u["prompt_tokens_details"] = json{{"cached_tokens", s.n_cached}};  // served by the prefix cache
  return u;
}

json bytes_json(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// logprobs.content entries of the chat API.
void add_logprobs(const Context& ctx, const std::vector<engine::TokenOut>& toks, json& content) {
  for (const auto& t : toks) {
    const std::string piece = ctx.tok.token_to_piece(t.id, false);
    json e = json::object();
    e["token"] = tok::utf8_sanitize(piece);
    e["logprob"] = t.logprob;
    e["bytes"] = bytes_json(piece);
    json top = json::array();
    for (const auto& a : t.top) {
      const std::string p = ctx.tok.token_to_piece(a.id, false);
      top.push_back(json{{"token", tok::utf8_sanitize(p)}, {"logprob", a.logprob}, {"bytes", bytes_json(p)}});
    }
    e["top_logprobs"] = top;
    content.push_back(std::move(e));
  }
}

json tool_calls_json(const std::vector<chat::ToolCall>& calls) {
  json a = json::array();
  for (const auto& c : calls)
    a.push_back(json{{"id", c.id}, {"type", "function"}, {"function", json{{"name", c.name}, {"arguments", c.arguments}}}});
  return a;
}

json delta_json(const chat::Delta& d) {
  json j = json::object();
  if (!d.reasoning_content.empty()) j["reasoning_content"] = d.reasoning_content;
  if (!d.content.empty()) j["content"] = d.content;
  if (!d.tool_calls.empty()) {
    json a = json::array();
    for (const auto& t : d.tool_calls) {
      json e = json::object();
      e["index"] = t.index;
      json fn = json::object();
      if (!t.id.empty()) {
        e["id"] = t.id;
        e["type"] = "function";
      }
      if (!t.name.empty()) fn["name"] = t.name;
      fn["arguments"] = t.arguments;
      e["function"] = fn;
      a.push_back(std::move(e));
    }
    j["tool_calls"] = a;
  }
  return j;
}

void add_ignored_header(HttpOut& o, const std::vector<std::string>& ignored) {
  if (ignored.empty()) return;
  o.headers.push_back({"X-Peregrine-Ignored-Fields", ignored_fields_header(ignored)});
}

}  // namespace

HttpOut handle_chat_completions(Context& ctx, const HttpIn& in) {
  ChatRequest req = parse_openai_chat(parse_body(in.body));
  auto run = std::make_shared<ChatRun>(ctx, req);
  const std::string id = random_id("chatcmpl-");
  const int64_t created = unix_time();
  const std::string model = model_of(ctx, req.model);
  const bool want_lp = req.gen.logprobs >= 0;
  auto watch = std::make_shared<ConnWatch>(in.watch());

  if (!req.stream) {
    ChatChunk c;
    json lp_content = json::array();
    while (run->next(c, *watch))
      if (want_lp) add_logprobs(ctx, c.tokens, lp_content);
    if (run->gone()) return HttpOut::json_reply(json::object(), 499);
    const engine::Event& f = run->final_event();
    if (f.finish == engine::FinishReason::kError) throw ApiError(500, f.error, {}, {}, "server_error");
    const auto calls = run->tool_calls();
    const auto& m = run->message();
    json msg = json::object();
    msg["role"] = "assistant";
    msg["content"] = m.content.empty() && !calls.empty() ? json(nullptr) : json(m.content);
    if (!m.reasoning_content.empty()) msg["reasoning_content"] = m.reasoning_content;
    if (!calls.empty()) msg["tool_calls"] = tool_calls_json(calls);
    json choice = json::object();
    choice["index"] = 0;
    choice["message"] = msg;
    choice["logprobs"] = want_lp ? json{{"content", lp_content}} : json(nullptr);
    choice["finish_reason"] = chat_finish_reason(f, !calls.empty());
    json r = json::object();
    r["id"] = id;
    r["object"] = "chat.completion";
    r["created"] = created;
    r["model"] = model;
    r["system_fingerprint"] = "peregrine-" + ctx.opt.build_info;
    r["choices"] = json::array({choice});
    r["usage"] = usage_json(f.stats);
    r["timings"] = timings_json(f.stats);
    HttpOut o = HttpOut::json_reply(r);
    add_ignored_header(o, req.ignored);
    return o;
  }

  HttpOut o;
  o.content_type = "text/event-stream";
  o.headers.push_back({"Cache-Control", "no-cache"});
  add_ignored_header(o, req.ignored);
  const bool include_usage = req.include_usage;
  o.stream = [&ctx, run, watch, id, created, model, want_lp, include_usage](const Write& write) {
    auto chunk = [&](json choice_delta, json logprobs, json finish) {
      json choice = json::object();
      choice["index"] = 0;
      choice["delta"] = std::move(choice_delta);
      choice["logprobs"] = std::move(logprobs);
      choice["finish_reason"] = std::move(finish);
      json j = json::object();
      j["id"] = id;
      j["object"] = "chat.completion.chunk";
      j["created"] = created;
      j["model"] = model;
      j["system_fingerprint"] = "peregrine-" + ctx.opt.build_info;
      j["choices"] = json::array({choice});
      if (include_usage) j["usage"] = nullptr;
      return j;
    };
    auto send = [&](const json& j) {
      if (!write(sse_data(j))) watch->mark_gone();
      return !watch->gone();
    };
    auto idle = [&] { return write(": keep-alive\n\n"); };
    if (!send(chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))) return;
    ChatChunk c;
    json pending_lp = json::array();
    bool any_tool = false;
    while (run->next(c, *watch, idle)) {
      if (want_lp) add_logprobs(ctx, c.tokens, pending_lp);
      if (c.delta.empty()) continue;
      if (!c.delta.tool_calls.empty()) any_tool = true;
      json lp = nullptr;
      if (want_lp) {
        lp = json{{"content", pending_lp}};
        pending_lp = json::array();
      }
      if (!send(chunk(delta_json(c.delta), lp, nullptr))) return;
    }
    if (run->gone()) return;
    const engine::Event& f = run->final_event();
    if (f.finish == engine::FinishReason::kError) {
      send(openai_error_body(ApiError(500, f.error, {}, {}, "server_error")));
      return;
    }
    json last = chunk(json::object(), want_lp ? json{{"content", pending_lp}} : json(nullptr),
                      chat_finish_reason(f, any_tool || !run->tool_calls().empty()));
    last["timings"] = timings_json(f.stats);
    if (!send(last)) return;
    if (include_usage) {
      json u = json::object();
      u["id"] = id;
      u["object"] = "chat.completion.chunk";
      u["created"] = created;
      u["model"] = model;
      u["system_fingerprint"] = "peregrine-" + ctx.opt.build_info;
      u["choices"] = json::array();
      u["usage"] = usage_json(f.stats);
      if (!send(u)) return;
    }
    write("data: [DONE]\n\n");
  };
  return o;
}

// ---------------------------------------------------------------- legacy completions

namespace {

// The legacy logprobs object: parallel arrays.
struct LegacyLogprobs {
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), text_offset = json::array();
  size_t offset = 0;
  void add(const Context& ctx, const std::vector<engine::TokenOut>& toks) {
    for (const auto& t : toks) {
      const std::string piece = tok::utf8_sanitize(ctx.tok.token_to_piece(t.id, false));
      tokens.push_back(piece);
      token_logprobs.push_back(t.logprob);
      json top = json::object();
      for (const auto& a : t.top) top[tok::utf8_sanitize(ctx.tok.token_to_piece(a.id, false))] = a.logprob;
      top_logprobs.push_back(top);
      text_offset.push_back(offset);
      offset += piece.size();
    }
  }
  json take() {
    json j = json{{"tokens", tokens}, {"token_logprobs", token_logprobs}, {"top_logprobs", top_logprobs}, {"text_offset", text_offset}};
    tokens = token_logprobs = top_logprobs = text_offset = json::array();
    return j;
  }
};

const char* completion_finish_reason(const engine::Event& f) {
  switch (f.finish) {
    case engine::FinishReason::kLength:
    case engine::FinishReason::kContext:
    case engine::FinishReason::kTimeout: return "length";
    default: return "stop";
  }
}

}  // namespace

HttpOut handle_completions(Context& ctx, const HttpIn& in) {
  CompletionRequest req = parse_completion(parse_body(in.body));
  std::string prompt_text;
  std::vector<int32_t> ids = completion_prompt(ctx.tok, req, prompt_text);
  engine::RequestSpec spec = make_spec(ctx, req.gen, std::move(ids));
  spec.constraint = completion_constraint(ctx.tok, req.gen);
  auto run = std::make_shared<EngineRun>(ctx, std::move(spec));
  const std::string id = random_id("cmpl-");
  const int64_t created = unix_time();
  const std::string model = model_of(ctx, req.model);
  const bool want_lp = req.gen.logprobs >= 0;
  auto watch = std::make_shared<ConnWatch>(in.watch());

  if (!req.stream) {
    std::string text = req.echo ? prompt_text : std::string();
    LegacyLogprobs lp;
    engine::Event e;
    while (run->next(e, *watch)) {
      text += e.text;
      if (want_lp) lp.add(ctx, e.tokens);
    }
    if (run->gone()) return HttpOut::json_reply(json::object(), 499);
    const engine::Event& f = run->final_event();
    if (f.finish == engine::FinishReason::kError) throw ApiError(500, f.error, {}, {}, "server_error");
    json choice = json::object();
    choice["text"] = text;
    choice["index"] = 0;
    choice["logprobs"] = want_lp ? lp.take() : json(nullptr);
    choice["finish_reason"] = completion_finish_reason(f);
    json r = json::object();
    r["id"] = id;
    r["object"] = "text_completion";
    r["created"] = created;
    r["model"] = model;
    r["system_fingerprint"] = "peregrine-" + ctx.opt.build_info;
    r["choices"] = json::array({choice});
    r["usage"] = usage_json(f.stats);
    r["timings"] = timings_json(f.stats);
    HttpOut o = HttpOut::json_reply(r);
    add_ignored_header(o, req.ignored);
    return o;
  }

  HttpOut o;
  o.content_type = "text/event-stream";
  o.headers.push_back({"Cache-Control", "no-cache"});
  add_ignored_header(o, req.ignored);
  const bool include_usage = req.include_usage, echo = req.echo;
  o.stream = [&ctx, run, watch, id, created, model, want_lp, include_usage, echo, prompt_text](const Write& write) {
    auto chunk = [&](const std::string& text, json logprobs, json finish) {
      json choice = json::object();
      choice["text"] = text;
      choice["index"] = 0;
      choice["logprobs"] = std::move(logprobs);
      choice["finish_reason"] = std::move(finish);
      json j = json::object();
      j["id"] = id;
      j["object"] = "text_completion";
      j["created"] = created;
      j["model"] = model;
      j["system_fingerprint"] = "peregrine-" + ctx.opt.build_info;
      j["choices"] = json::array({choice});
      return j;
    };
    auto send = [&](const json& j) {
      if (!write(sse_data(j))) watch->mark_gone();
      return !watch->gone();
    };
    auto idle = [&] { return write(": keep-alive\n\n"); };
    if (echo && !prompt_text.empty() && !send(chunk(prompt_text, nullptr, nullptr))) return;
    LegacyLogprobs lp;
    engine::Event e;
    while (run->next(e, *watch, idle)) {
      if (want_lp) lp.add(ctx, e.tokens);
      if (e.text.empty()) continue;
      if (!send(chunk(e.text, want_lp ? lp.take() : json(nullptr), nullptr))) return;
    }
    if (run->gone()) return;
    const engine::Event& f = run->final_event();
    if (f.finish == engine::FinishReason::kError) {
      send(openai_error_body(ApiError(500, f.error, {}, {}, "server_error")));
      return;
    }
    json last = chunk("", want_lp ? lp.take() : json(nullptr), completion_finish_reason(f));
    last["timings"] = timings_json(f.stats);
    if (!send(last)) return;
    if (include_usage) {
      json u = chunk("", nullptr, nullptr);
      u["choices"] = json::array();
      u["usage"] = usage_json(f.stats);
      if (!send(u)) return;
    }
    write("data: [DONE]\n\n");
  };
  return o;
}

HttpOut handle_models(Context& ctx, const HttpIn&) {
  json meta = json::object();
  meta["n_ctx"] = ctx.n_ctx();
  meta["n_vocab"] = ctx.tok.n_vocab();
  meta["n_slots"] = ctx.sched.options().n_slots;
  json m = json::object();
  m["id"] = ctx.opt.model_name;
  m["object"] = "model";
  m["created"] = ctx.started;
  m["owned_by"] = "peregrine";
  m["meta"] = meta;
  json r = json::object();
  r["object"] = "list";
  r["data"] = json::array({m});
  // Ollama-style list that some clients (Codex's model picker among them) read.
  r["models"] = json::array({json{{"name", ctx.opt.model_name}, {"model", ctx.opt.model_name}, {"type", "model"}}});
  return HttpOut::json_reply(r);
}

}  // namespace pg::server
