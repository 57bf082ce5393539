#include <algorithm>

#include "core/log.h"
#include "server/structured.h"
#include "server/context.h"
#include "server/prepare.h"

namespace pg::server {

using namespace std::chrono_literals;

const ChatPrompt& Context::chat_prompt() const {
  if (!prompt)
    throw ApiError(400,
                   "the model has no chat template, so chat endpoints are unavailable: restart the server with "
                   "--chat-template-file FILE, or use /v1/completions",
                   {}, "no_chat_template");
  return *prompt;
}

HttpOut HttpOut::json_reply(const json& j, int status) {
  HttpOut o;
  o.status = status;
  o.body = j.dump(-1, ' ', false, json::error_handler_t::replace);
  return o;
}

std::string sse_data(const json& j) {
  return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

std::string sse_event(std::string_view event, const json& j) {
  std::string s = "event: ";
  s += event;
  s += "\ndata: ";
  s += j.dump(-1, ' ', false, json::error_handler_t::replace);
  s += "\n\n";
  return s;
}

json timings_json(const engine::RequestStats& s) {
  json t = json::object();
  // llama-server's meaning: prompt_n tokens were prefilled, cache_n came from the prefix cache.
  const int prefilled = s.n_prompt - s.n_cached;
  t["cache_n"] = s.n_cached;
  t["prompt_n"] = prefilled;
  t["prompt_ms"] = s.prompt_ms;
  t["prompt_per_token_ms"] = prefilled > 0 ? s.prompt_ms / prefilled : 0.0;
  t["prompt_per_second"] = s.prompt_ms > 0 ? prefilled * 1000.0 / s.prompt_ms : 0.0;
  // The first generated token is produced by the prefill; the decode time covers the rest.
  const int decoded = std::max(0, s.n_generated - 1);
  t["predicted_n"] = s.n_generated;
  t["predicted_ms"] = s.decode_ms;
  t["predicted_per_token_ms"] = decoded > 0 ? s.decode_ms / decoded : 0.0;
  t["predicted_per_second"] = s.decode_ms > 0 ? decoded * 1000.0 / s.decode_ms : 0.0;
  t["queue_ms"] = s.queue_ms;
  t["ttft_ms"] = s.ttft_ms;
  // Speculative decoding (llama-server's names): tokens drafted for the request and accepted.
  t["draft_n"] = s.draft_n;
  t["draft_n_accepted"] = s.draft_n_accepted;
  return t;
}

engine::RequestSpec make_spec(const Context& ctx, const GenParams& g, std::vector<int32_t> prompt) {
  return make_spec(ctx.opt, ctx.n_ctx(), g, std::move(prompt));
}

RequestLog*& current_request_log() {
  thread_local RequestLog* log = nullptr;
  return log;
}

EngineRun::EngineRun(Context& ctx, engine::RequestSpec spec) {
  n_prompt_ = static_cast<int>(spec.prompt.size());
  if (RequestLog* l = current_request_log()) l->n_prompt = n_prompt_;
  try {
    h_ = ctx.sched.submit(std::move(spec));
  } catch (const engine::RejectError& e) {
    using K = engine::RejectError::Kind;
    switch (e.kind()) {
      case K::kContextOverflow: throw ApiError(400, e.what(), "max_tokens", "context_length_exceeded");
      case K::kInvalid: throw ApiError(400, e.what());
      case K::kOverloaded: throw ApiError(503, e.what(), {}, "overloaded", "server_error");
      case K::kShutdown: throw ApiError(503, e.what(), {}, "shutting_down", "server_error");
    }
    throw ApiError(400, e.what());
  }
}

EngineRun::~EngineRun() {
  if (h_ && !done_) h_->cancel();
}

bool EngineRun::next(engine::Event& e, ConnWatch& w, const std::function<bool()>& idle) {
  if (done_ || gone_) return false;
  auto last_output = engine::Clock::now();
  for (;;) {
    if (w.gone()) {
      cancelled();
      return false;
    }
    if (h_->next(e, 25ms)) {
      if (RequestLog* l = current_request_log()) l->n_generated += static_cast<int>(e.tokens.size());
      if (e.done) {
        done_ = true;
        final_ = e;
        if (RequestLog* l = current_request_log()) {
          l->n_generated = e.stats.n_generated;
          l->ttft_ms = e.stats.ttft_ms;
          l->n_cached = e.stats.n_cached;
          l->predicted_per_second = e.stats.decode_ms > 0 ? std::max(0, e.stats.n_generated - 1) * 1000.0 / e.stats.decode_ms : 0.0;
          l->finish = engine::finish_reason_name(e.finish);
        }
      }
      return true;
    }
    if (idle && engine::Clock::now() - last_output > 10s) {
      last_output = engine::Clock::now();
      if (!idle()) {
        w.mark_gone();
        cancelled();
        return false;
      }
    }
  }
}

ChatRun::ChatRun(Context& ctx, const ChatRequest& req)
    : rp_(ctx.chat_prompt().render(req)),
      parser_(rp_.format, rp_.parser),
      parallel_(req.parallel_tool_calls) {
  engine::RequestSpec spec = make_spec(ctx, req.gen, rp_.tokens);
  spec.special_text = ChatPrompt::special_text(rp_.format);
  spec.constraint = chat_constraint(ctx.opt, ctx.tok, req, rp_);
  run_ = std::make_unique<EngineRun>(ctx, std::move(spec));
}

void append_delta(chat::Delta& d, chat::Delta&& more) {
  d.content += more.content;
  d.reasoning_content += more.reasoning_content;
  for (auto& t : more.tool_calls) {
    if (!d.tool_calls.empty() && d.tool_calls.back().index == t.index) {
      auto& last = d.tool_calls.back();
      if (last.id.empty()) last.id = std::move(t.id);
      if (last.name.empty()) last.name = std::move(t.name);
      last.arguments += t.arguments;
    } else {
      d.tool_calls.push_back(std::move(t));
    }
  }
}

std::vector<chat::ToolCall> ChatRun::tool_calls() const {
  std::vector<chat::ToolCall> calls = message().tool_calls;
  if (!parallel_ && calls.size() > 1) calls.resize(1);
  return calls;
}

void ChatRun::filter(chat::Delta& d) {
  // parallel_tool_calls = false: the first call only.
  if (!parallel_) std::erase_if(d.tool_calls, [](const chat::ToolCallDelta& t) { return t.index > 0; });
}

bool ChatRun::next(ChatChunk& c, ConnWatch& w, const std::function<bool()>& idle) {
  c.delta = chat::Delta{};
  c.tokens.clear();
  if (finished_) return false;
  if (first_) {
    first_ = false;
    if (!rp_.forced.empty()) {
      c.delta = parser_.push(rp_.forced);
      filter(c.delta);
      if (!c.delta.empty()) return true;
    }
  }
  engine::Event e;
  if (!run_->next(e, w, idle)) {
    finished_ = true;
    return false;
  }
  c.delta = parser_.push(e.text);
  c.tokens = std::move(e.tokens);
  if (e.done) {
    append_delta(c.delta, parser_.finish());
    finished_ = true;
  }
  filter(c.delta);
  return true;
}

}  // namespace pg::server
