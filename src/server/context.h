// Internal to the server: what every handler shares, the HTTP-independent request/reply shapes the
// handlers work on, and the run of one request through the engine (with output parsing for chat).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/parse/output_parser.h"
#include "engine/scheduler.h"
#include "server/api_error.h"
#include "server/chat_prompt.h"
#include "server/chat_request.h"
#include "server/conn_watch.h"
#include "server/json_util.h"
#include "server/server.h"

namespace pg::server {

struct Context {
  engine::Scheduler& sched;
  const tok::Tokenizer& tok;
  ServerOptions opt;
  std::unique_ptr<ChatPrompt> prompt;  // null when the model has no chat template
  int64_t started = 0;                 // unix time

  const ChatPrompt& chat_prompt() const;  // throws ApiError when there is no template
  int n_ctx() const { return sched.options().n_ctx; }
};

struct HttpIn {
  std::string_view body;
  int fd = -1;  // the client's connection (see ConnWatch); -1: none to watch
  ConnWatch watch() const { return ConnWatch(fd); }
};

// What the request log line (`serve -v`) reports about a request that reached the engine. The
// server points current_request_log() at one while a request's handler and its stream run (both
// on the same worker thread); EngineRun fills it in.
struct RequestLog {
  int n_prompt = -1;  // -1: the request never reached the engine
  int n_generated = 0;
  int n_cached = 0;  // prompt tokens the prefix cache served
  double ttft_ms = 0, predicted_per_second = 0;
  std::string finish;   // eog, stop, length, ... once finished
  bool cancelled = false;  // the client left before the end
};
RequestLog*& current_request_log();

// Writes one piece of a streamed body; false when the client is gone.
using Write = std::function<bool(std::string_view)>;

struct HttpOut {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  // Streaming replies: produces the body after the headers went out.
  std::function<void(const Write&)> stream;

  static HttpOut json_reply(const json& j, int status = 200);
};

// The engine side of one request: submission (rejections become ApiError) and waiting for output
// while watching the client. Destroying an unfinished run cancels it.
class EngineRun {
 public:
  EngineRun(Context& ctx, engine::RequestSpec spec);
  ~EngineRun();
  EngineRun(const EngineRun&) = delete;
  EngineRun& operator=(const EngineRun&) = delete;

  // Waits for the next output. Returns false once the final event was returned before, or when the
  // client left (the request is then cancelled and gone() is true). `idle` is called after every
  // `idle_every` without output (streams write a keep-alive there); it returns false when the
  // client is gone.
  bool next(engine::Event& e, ConnWatch& w, const std::function<bool()>& idle = {});
  bool gone() const { return gone_; }
  const engine::Event& final_event() const { return final_; }
  int n_prompt() const { return n_prompt_; }

 private:
  void cancelled() {
    gone_ = true;
    h_->cancel();
    if (RequestLog* l = current_request_log()) l->cancelled = true;
  }
  std::shared_ptr<engine::RequestHandle> h_;
  engine::Event final_;
  int n_prompt_ = 0;
  bool done_ = false, gone_ = false;
};

// Generation limits and sampling for a request, checked against the slot's context.
engine::RequestSpec make_spec(const Context& ctx, const GenParams& g, std::vector<int32_t> prompt);

struct ChatChunk {
  chat::Delta delta;
  std::vector<engine::TokenOut> tokens;
};

// A chat request end to end: prompt, engine, output parser.
class ChatRun {
 public:
  ChatRun(Context& ctx, const ChatRequest& req);
  // Next parsed output (possibly empty when only tokens arrived). Returns false when finished or the
  // client left; the last true return carries the parser's final flush.
  bool next(ChatChunk& c, ConnWatch& w, const std::function<bool()>& idle = {});
  const chat::ParsedMessage& message() const { return parser_.message(); }
  std::vector<chat::ToolCall> tool_calls() const;  // honours parallel_tool_calls = false
  const engine::Event& final_event() const { return run_->final_event(); }
  bool gone() const { return run_->gone(); }
  int n_prompt() const { return run_->n_prompt(); }
  const RenderedPrompt& prompt() const { return rp_; }

 private:
  void filter(chat::Delta& d);
  RenderedPrompt rp_;
  chat::OutputParser parser_;
  std::unique_ptr<EngineRun> run_;
  bool parallel_ = true;
  bool first_ = true, finished_ = false;
};

// Concatenates a later delta onto an earlier one (tool-call pieces of the same call merge).
void append_delta(chat::Delta& d, chat::Delta&& more);

// The usage/timings fields shared by the OpenAI replies.
json timings_json(const engine::RequestStats& s);

// Route handlers (api_*.cpp).
HttpOut handle_chat_completions(Context& ctx, const HttpIn& in);
HttpOut handle_completions(Context& ctx, const HttpIn& in);
HttpOut handle_responses(Context& ctx, const HttpIn& in);
HttpOut handle_messages(Context& ctx, const HttpIn& in);
HttpOut handle_count_tokens(Context& ctx, const HttpIn& in);
HttpOut handle_models(Context& ctx, const HttpIn& in);
HttpOut handle_props(Context& ctx, const HttpIn& in);
HttpOut handle_metrics(Context& ctx, const HttpIn& in);
HttpOut handle_tokenize(Context& ctx, const HttpIn& in);
HttpOut handle_detokenize(Context& ctx, const HttpIn& in);
HttpOut handle_apply_template(Context& ctx, const HttpIn& in);

// SSE framing.
std::string sse_data(const json& j);                           // "data: {...}\n\n"
std::string sse_event(std::string_view event, const json& j);  // "event: NAME\ndata: {...}\n\n"

}  // namespace pg::server
