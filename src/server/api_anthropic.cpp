// Anthropic Messages: /v1/messages (streaming and not) and /v1/messages/count_tokens.
#include "server/context.h"

namespace pg::server {

namespace {

// Anthropic tool-use ids read "toolu_…"; the parser's ids read "call_…".
std::string tool_use_id(const std::string& id) {
  if (id.rfind("call_", 0) == 0) return "toolu_" + id.substr(5);
  return id;
}

std::string stop_reason(const engine::Event& f, bool tool_calls) {
  switch (f.finish) {
    case engine::FinishReason::kLength:
    case engine::FinishReason::kContext:
    case engine::FinishReason::kTimeout: return "max_tokens";
    case engine::FinishReason::kStop: return tool_calls ? "tool_use" : "stop_sequence";
    default: return tool_calls ? "tool_use" : "end_turn";
  }
}

json tool_input(const std::string& args) {
  try {
    json j = parse_json(args);  // model output: as deep as a prompt asks for, so with the body's nesting limit
    if (j.is_object()) return j;
  } catch (...) {
  }
  return json::object();
}

// Anthropic counts cached input apart: input_tokens + cache_read_input_tokens is the whole prompt.
json usage_json(int n_prompt, int n_out, int n_cached = 0) {
  json u = json::object();
  u["input_tokens"] = n_prompt - n_cached;
  u["cache_creation_input_tokens"] = 0;
  u["cache_read_input_tokens"] = n_cached;
  u["output_tokens"] = n_out;
  return u;
}

}  // namespace

HttpOut handle_messages(Context& ctx, const HttpIn& in) {
  ChatRequest req = parse_anthropic(parse_body(in.body));
  auto run = std::make_shared<ChatRun>(ctx, req);
  const std::string id = random_id("msg_");
  const std::string model = req.model.empty() ? ctx.opt.model_name : req.model;
  auto watch = std::make_shared<ConnWatch>(in.watch());

  if (!req.stream) {
    ChatChunk c;
    while (run->next(c, *watch)) {
    }
    if (run->gone()) return HttpOut::json_reply(json::object(), 499);
    const engine::Event& f = run->final_event();
    if (f.finish == engine::FinishReason::kError) throw ApiError(500, f.error, {}, {}, "server_error");
    const auto& m = run->message();
    const auto calls = run->tool_calls();
    json content = json::array();
    if (!m.reasoning_content.empty() && !req.hide_reasoning)
      content.push_back(json{{"type", "thinking"}, {"thinking", m.reasoning_content}, {"signature", ""}});
    if (!m.content.empty()) content.push_back(json{{"type", "text"}, {"text", m.content}});
    for (const auto& call : calls)
      content.push_back(json{{"type", "tool_use"}, {"id", tool_use_id(call.id)}, {"name", call.name}, {"input", tool_input(call.arguments)}});
    json r = json::object();
    r["id"] = id;
    r["type"] = "message";
    r["role"] = "assistant";
    r["model"] = model;
    r["content"] = content;
    r["stop_reason"] = stop_reason(f, !calls.empty());
    r["stop_sequence"] = f.finish == engine::FinishReason::kStop ? json(f.stop_word) : json(nullptr);
    r["usage"] = usage_json(f.stats.n_prompt, f.stats.n_generated, f.stats.n_cached);
    r["timings"] = timings_json(f.stats);
    return HttpOut::json_reply(r);
  }

  HttpOut o;
  o.content_type = "text/event-stream";
  o.headers.push_back({"Cache-Control", "no-cache"});
  const bool hide_reasoning = req.hide_reasoning;
  o.stream = [run, watch, id, model, hide_reasoning](const Write& write) {
    auto send = [&](std::string_view ev, const json& j) {
      if (!write(sse_event(ev, j))) watch->mark_gone();
      return !watch->gone();
    };
    auto idle = [&] { return write(sse_event("ping", json{{"type", "ping"}})); };
    json msg = json::object();
    msg["id"] = id;
    msg["type"] = "message";
    msg["role"] = "assistant";
    msg["model"] = model;
    msg["content"] = json::array();
    msg["stop_reason"] = nullptr;
    msg["stop_sequence"] = nullptr;
    msg["usage"] = usage_json(run->n_prompt(), 1);
    if (!send("message_start", json{{"type", "message_start"}, {"message", msg}})) return;
    if (!send("ping", json{{"type", "ping"}})) return;

    enum class Block { kNone, kThinking, kText, kTool };
    Block open = Block::kNone;
    int index = -1;
    size_t open_tool = SIZE_MAX;  // parser index of the open tool_use block
    bool any_tool = false;
    auto close = [&]() {
      if (open == Block::kNone) return true;
      if (open == Block::kThinking &&
          !send("content_block_delta", json{{"type", "content_block_delta"}, {"index", index},
                                            {"delta", json{{"type", "signature_delta"}, {"signature", ""}}}}))
        return false;
      open = Block::kNone;
      return send("content_block_stop", json{{"type", "content_block_stop"}, {"index", index}});
    };
    auto start = [&](Block b, json block) {
      if (!close()) return false;
      open = b;
      ++index;
      return send("content_block_start", json{{"type", "content_block_start"}, {"index", index}, {"content_block", block}});
    };
    auto delta = [&](json d) { return send("content_block_delta", json{{"type", "content_block_delta"}, {"index", index}, {"delta", d}}); };

    ChatChunk c;
    while (run->next(c, *watch, idle)) {
      const chat::Delta& d = c.delta;
      if (!d.reasoning_content.empty() && !hide_reasoning) {
        if (open != Block::kThinking && !start(Block::kThinking, json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}})) return;
        if (!delta(json{{"type", "thinking_delta"}, {"thinking", d.reasoning_content}})) return;
      }
      if (!d.content.empty()) {
        if (open != Block::kText && !start(Block::kText, json{{"type", "text"}, {"text", ""}})) return;
        if (!delta(json{{"type", "text_delta"}, {"text", d.content}})) return;
      }
      for (const auto& t : d.tool_calls) {
        if (open != Block::kTool || open_tool != t.index) {
          any_tool = true;
          open_tool = t.index;
          if (!start(Block::kTool, json{{"type", "tool_use"}, {"id", tool_use_id(t.id)}, {"name", t.name}, {"input", json::object()}}))
            return;
        }
        if (!t.arguments.empty() && !delta(json{{"type", "input_json_delta"}, {"partial_json", t.arguments}})) return;
      }
    }
    if (run->gone()) return;
    const engine::Event& f = run->final_event();
    if (f.finish == engine::FinishReason::kError) {
      send("error", anthropic_error_body(ApiError(500, f.error)));
      return;
    }
    if (!close()) return;
    json md = json::object();
    md["type"] = "message_delta";
    md["delta"] = json{{"stop_reason", stop_reason(f, any_tool)},
                       {"stop_sequence", f.finish == engine::FinishReason::kStop ? json(f.stop_word) : json(nullptr)}};
    md["usage"] = usage_json(f.stats.n_prompt, f.stats.n_generated, f.stats.n_cached);
    md["timings"] = timings_json(f.stats);  // as the OpenAI streams carry on their last chunk
    if (!send("message_delta", md)) return;
    send("message_stop", json{{"type", "message_stop"}});
  };
  return o;
}

HttpOut handle_count_tokens(Context& ctx, const HttpIn& in) {
  ChatRequest req = parse_anthropic(parse_body(in.body), true);
  const RenderedPrompt rp = ctx.chat_prompt().render(req);
  return HttpOut::json_reply(json{{"input_tokens", rp.tokens.size()}});
}

}  // namespace pg::server
