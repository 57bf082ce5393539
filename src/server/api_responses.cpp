// OpenAI Responses API (POST /v1/responses), stateless, as Codex uses it.
#include "server/context.h"

namespace pg::server {

namespace {

struct ResponseShell {
  std::string id;
  int64_t created = 0;
  std::string model;
  json request;  // the request body, for the echoed fields
};

json base_response(const ResponseShell& s, const char* status) {
  const json& b = s.request;
  auto echo = [&](const char* k, json def) { return b.contains(k) && !b[k].is_null() ? b[k] : def; };
  json r = json::object();
  r["id"] = s.id;
  r["object"] = "response";
  r["created_at"] = s.created;
  r["status"] = status;
  r["error"] = nullptr;
  r["incomplete_details"] = nullptr;
  r["instructions"] = echo("instructions", nullptr);
  r["max_output_tokens"] = echo("max_output_tokens", nullptr);
  r["model"] = s.model;
  r["output"] = json::array();
  r["parallel_tool_calls"] = echo("parallel_tool_calls", true);
  r["previous_response_id"] = nullptr;
  r["reasoning"] = echo("reasoning", json{{"effort", nullptr}, {"summary", nullptr}});
  r["store"] = false;
  r["temperature"] = echo("temperature", nullptr);
  // The format the answer was constrained to (structured output), as OpenAI echoes it.
  r["text"] = b.contains("text") && b["text"].is_object() && b["text"].contains("format") ? json{{"format", b["text"]["format"]}}
                                                                                          : json{{"format", json{{"type", "text"}}}};
  r["tool_choice"] = echo("tool_choice", "auto");
  r["tools"] = echo("tools", json::array());
  r["top_p"] = echo("top_p", nullptr);
  r["truncation"] = "disabled";
  r["usage"] = nullptr;
  r["user"] = nullptr;
  r["metadata"] = echo("metadata", json::object());
  return r;
}

json usage_json(const engine::RequestStats& s) {
  json u = json::object();
  u["input_tokens"] = s.n_prompt;
  u["input_tokens_details"] = json{{"cached_tokens", s.n_cached}};
  u["output_tokens"] = s.n_generated;
  u["output_tokens_details"] = json{{"reasoning_tokens", s.n_reasoning}};
  u["total_tokens"] = s.n_prompt + s.n_generated;
  return u;
}

bool incomplete(const engine::Event& f) {
  return f.finish == engine::FinishReason::kLength || f.finish == engine::FinishReason::kContext ||
         f.finish == engine::FinishReason::kTimeout;
}

json reasoning_item(const std::string& id, const std::string& text) {
  json content = json::array();
  if (!text.empty()) content.push_back(json{{"type", "reasoning_text"}, {"text", text}});
  return json{{"type", "reasoning"}, {"id", id}, {"summary", json::array()}, {"content", content}};
}

json message_item(const std::string& id, const std::string& text, const char* status) {
  json part = json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
  return json{{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"},
              {"content", text.empty() && std::string(status) == "in_progress" ? json::array() : json::array({part})}};
}

json call_item(const std::string& id, const std::string& call_id, const std::string& name, const std::string& args,
               const char* status) {
  return json{{"type", "function_call"}, {"id", id}, {"call_id", call_id}, {"name", name}, {"arguments", args}, {"status", status}};
}

void finish_response(json& r, const engine::Event& f) {
  if (incomplete(f)) {
    r["status"] = "incomplete";
    r["incomplete_details"] = json{{"reason", "max_output_tokens"}};
  } else {
    r["status"] = "completed";
  }
  r["usage"] = usage_json(f.stats);
  r["timings"] = timings_json(f.stats);
}

}  // namespace

HttpOut handle_responses(Context& ctx, const HttpIn& in) {
  json body = parse_body(in.body);
  ChatRequest req = parse_responses(body);
  auto run = std::make_shared<ChatRun>(ctx, req);
  ResponseShell shell;
  shell.id = random_id("resp_");
  shell.created = unix_time();
  shell.model = req.model.empty() ? ctx.opt.model_name : req.model;
  shell.request = std::move(body);
  auto watch = std::make_shared<ConnWatch>(in.watch());

  if (!req.stream) {
    ChatChunk c;
    while (run->next(c, *watch)) {
    }
    if (run->gone()) return HttpOut::json_reply(json::object(), 499);
    const engine::Event& f = run->final_event();
    if (f.finish == engine::FinishReason::kError) throw ApiError(500, f.error, {}, {}, "server_error");
    json r = base_response(shell, "completed");
    const auto& m = run->message();
    if (!m.reasoning_content.empty()) r["output"].push_back(reasoning_item(random_id("rs_"), m.reasoning_content));
    if (!m.content.empty()) r["output"].push_back(message_item(random_id("msg_"), m.content, "completed"));
    for (const auto& call : run->tool_calls())
      r["output"].push_back(call_item(random_id("fc_"), call.id, call.name, call.arguments, "completed"));
    finish_response(r, f);
    return HttpOut::json_reply(r);
  }

  HttpOut o;
  o.content_type = "text/event-stream";
  o.headers.push_back({"Cache-Control", "no-cache"});
  o.stream = [run, watch, shell](const Write& write) {
    int seq = 0;
    auto send = [&](const char* type, json j) {
      j["type"] = type;
      j["sequence_number"] = seq++;
      if (!write(sse_event(type, j))) watch->mark_gone();
      return !watch->gone();
    };
    auto idle = [&] { return write(": keep-alive\n\n"); };
    json resp = base_response(shell, "in_progress");
    if (!send("response.created", json{{"response", resp}})) return;
    if (!send("response.in_progress", json{{"response", resp}})) return;

    enum class Item { kNone, kReasoning, kMessage, kCall };
    Item open = Item::kNone;
    int out_index = -1;
    std::string item_id, text, call_id, call_name;
    size_t open_call = SIZE_MAX;
    json output = json::array();

    auto close = [&]() {
      switch (open) {
        case Item::kNone: return true;
        case Item::kReasoning: {
          if (!send("response.reasoning_text.done",
                    json{{"item_id", item_id}, {"output_index", out_index}, {"content_index", 0}, {"text", text}}))
            return false;
          json item = reasoning_item(item_id, text);
          output.push_back(item);
          if (!send("response.output_item.done", json{{"output_index", out_index}, {"item", item}})) return false;
          break;
        }
        case Item::kMessage: {
          json part = json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
          if (!send("response.output_text.done", json{{"item_id", item_id}, {"output_index", out_index}, {"content_index", 0},
                                                       {"text", text}, {"logprobs", json::array()}}))
            return false;
          if (!send("response.content_part.done",
                    json{{"item_id", item_id}, {"output_index", out_index}, {"content_index", 0}, {"part", part}}))
            return false;
          json item = message_item(item_id, text, "completed");
          output.push_back(item);
          if (!send("response.output_item.done", json{{"output_index", out_index}, {"item", item}})) return false;
          break;
        }
        case Item::kCall: {
          if (!send("response.function_call_arguments.done",
                    json{{"item_id", item_id}, {"output_index", out_index}, {"name", call_name}, {"arguments", text}}))
            return false;
          json item = call_item(item_id, call_id, call_name, text, "completed");
          output.push_back(item);
          if (!send("response.output_item.done", json{{"output_index", out_index}, {"item", item}})) return false;
          break;
        }
      }
      open = Item::kNone;
      return true;
    };

    ChatChunk c;
    while (run->next(c, *watch, idle)) {
      const chat::Delta& d = c.delta;
      if (!d.reasoning_content.empty()) {
        if (open != Item::kReasoning) {
          if (!close()) return;
          open = Item::kReasoning;
          ++out_index;
          item_id = random_id("rs_");
          text.clear();
          if (!send("response.output_item.added", json{{"output_index", out_index}, {"item", reasoning_item(item_id, "")}})) return;
        }
        text += d.reasoning_content;
        if (!send("response.reasoning_text.delta",
                  json{{"item_id", item_id}, {"output_index", out_index}, {"content_index", 0}, {"delta", d.reasoning_content}}))
          return;
      }
      if (!d.content.empty()) {
        if (open != Item::kMessage) {
          if (!close()) return;
          open = Item::kMessage;
          ++out_index;
          item_id = random_id("msg_");
          text.clear();
          if (!send("response.output_item.added",
                    json{{"output_index", out_index}, {"item", message_item(item_id, "", "in_progress")}}))
            return;
          json part = json{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}};
          if (!send("response.content_part.added",
                    json{{"item_id", item_id}, {"output_index", out_index}, {"content_index", 0}, {"part", part}}))
            return;
        }
        text += d.content;
        if (!send("response.output_text.delta", json{{"item_id", item_id}, {"output_index", out_index}, {"content_index", 0},
                                                      {"delta", d.content}, {"logprobs", json::array()}}))
          return;
      }
      for (const auto& t : d.tool_calls) {
        if (open != Item::kCall || open_call != t.index) {
          if (!close()) return;
          open = Item::kCall;
          open_call = t.index;
          ++out_index;
          item_id = random_id("fc_");
          call_id = t.id;
          call_name = t.name;
          text.clear();
          if (!send("response.output_item.added",
                    json{{"output_index", out_index}, {"item", call_item(item_id, call_id, call_name, "", "in_progress")}}))
            return;
        }
        if (t.arguments.empty()) continue;
        text += t.arguments;
        if (!send("response.function_call_arguments.delta",
                  json{{"item_id", item_id}, {"output_index", out_index}, {"delta", t.arguments}}))
          return;
      }
    }
    if (run->gone()) return;
    const engine::Event& f = run->final_event();
    if (f.finish == engine::FinishReason::kError) {
      json r = base_response(shell, "failed");
      r["error"] = json{{"code", "server_error"}, {"message", f.error}};
      send("response.failed", json{{"response", r}});
      return;
    }
    if (!close()) return;
    json r = base_response(shell, "completed");
    r["output"] = output;
    finish_response(r, f);
    send(r["status"] == "incomplete" ? "response.incomplete" : "response.completed", json{{"response", r}});
  };
  return o;
}

}  // namespace pg::server
