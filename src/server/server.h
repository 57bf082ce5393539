// `peregrine serve`'s HTTP side: OpenAI (chat completions, completions, responses, models),
// Anthropic (messages, count_tokens) and utility routes (health, props, metrics, tokenize,
// detokenize, apply-template) over the epoll HTTP layer in http.h, talking to one engine Scheduler.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace pg::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                  // 0: any free port (see Server::port())
  std::string api_key;              // empty: no authentication
  std::string model_name;           // id reported by /v1/models and in responses
  std::string model_path;
  std::string cors_origin;          // empty: no CORS headers
  std::string chat_template;        // Jinja source; empty: chat endpoints answer 400
  std::string chat_template_tool_use;  // variant for requests with tools (GGUF tokenizer.chat_template.tool_use)
  size_t max_body = 32u << 20;      // request body limit, bytes
  double timeout_s = 600;           // per-request time limit (0: none)
  int default_max_tokens = 0;       // when a request sets none; 0: up to the end of the slot's context
  bool clamp_max_tokens = false;    // shrink max_tokens to fit the context instead of answering 400
  int http_threads = 0;             // most requests run at once; 0: every slot + the queue + 64
  // Host header names accepted besides the loopback names and the bound address ("*": any). With
  // an empty list and a non-loopback --host, any Host is accepted (the server cannot know its names).
  std::vector<std::string> allowed_hosts;
  bool props_full = false;          // /props shows the model's absolute path (default: its file name)
  bool log_requests = false;        // one log line per request (serve -v)
  SamplingParams sampling;          // defaults for requests
  int64_t seed = -1;                // default seed (-1: random per request)
  std::string build_info;           // version string for /props
  std::string runtime_info_json;    // extra runtime settings for /props (a JSON object), may be empty
  // Reasoning budgets (docs/structured-output.md): tokens inside the reasoning block, -1 unlimited.
  int reasoning_budget = -1;        // --reasoning-budget / --think-max-tokens (requests may set their own)
  std::string reasoning_close_hint; // text written before the forced end-of-thinking tag
  int hard_limit_reply_budget = -1; // --hard-limit-reply-budget: tokens of the whole reply, -1 none
  // reasoning_effort low / medium / high / x-high / max -> budget (-1: unlimited).
  int effort_budget[5] = {1024, 4096, 16384, 32768, -1};
};

class Server {
 public:
  // Throws pg::Error when the chat template does not parse.
  Server(engine::Scheduler& sched, const tok::Tokenizer& tok, ServerOptions opt);
  ~Server();

  // Binds the listening socket; throws pg::Error when the address is unavailable. Returns the port.
  int bind();
  // Serves until stop() (from another thread or a signal handler thread).
  void run();
  void stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace pg::server
