// peregrine serve: the OpenAI- and Anthropic-compatible HTTP server (see docs/server.md).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "chat/chat_template.h"
#include "cli/common.h"
#include "spec/drafter.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/scheduler.h"
#include "server/server.h"

namespace pg::cli {

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  PG_CHECK(f.good(), "cannot read '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  ModelFlags mf;
  SamplingFlags sf;
  SpecFlags spf;
  std::string host = "127.0.0.1", api_key, model_name, template_file, cors, allowed_hosts;
  int port = 8080, parallel = 4, default_max_tokens = 0, http_threads = 0, max_queue = 1024;
  double timeout = 600;
  int64_t max_body = 32 << 20;
  bool clamp = false, verbose = false, props_full = false;
  Args a("serve",
         "Serve the model over HTTP: OpenAI (/v1/chat/completions, /v1/completions, /v1/responses, /v1/models) and "
         "Anthropic (/v1/messages) APIs, plus /health, /props, /metrics, /tokenize, /detokenize.");
  mf.add_to(a);
  mf.add_prefix_to(a);
  a.opt("--host", &host, "address to listen on (0.0.0.0 exposes the server to the network)", "ADDR");
  a.opt("--port", &port, "port to listen on (0 = any free port)");
  a.opt("-np,--parallel", &parallel, "sequences decoded together (KV slots); more requests wait in a queue");
  a.opt("--api-key", &api_key, "require this key (Authorization: Bearer KEY or x-api-key) on every route but /health; "
                               "default: $PEREGRINE_API_KEY",
        "KEY");
  a.opt("-a,--model-name,--alias", &model_name, "model id reported to clients (default: the file name)", "NAME");
  a.opt("--chat-template-file", &template_file, "Jinja chat template to use instead of the model's", "FILE");
  a.opt("--cors", &cors, "allow browser requests from this origin ('*' for any); off by default", "ORIGIN");
  a.opt("--timeout", &timeout, "time limit of one request in seconds (0 = none)");
  a.opt("--max-body", &max_body, "largest request body accepted, in bytes");
  a.opt("-n,--default-max-tokens", &default_max_tokens, "tokens to generate when a request sets no limit (0 = up to the context end)");
  a.flag("--clamp-max-tokens", &clamp, "shorten a max_tokens that does not fit the context instead of answering 400");
  a.opt("--threads-http", &http_threads,
        "most requests running at once, queued ones included; idle connections hold none (0 = slots + --max-queue + 64)");
  a.opt("--max-queue", &max_queue, "requests allowed to wait for a slot before new ones get 503");
  a.opt("--allowed-hosts", &allowed_hosts,
        "comma-separated Host header names accepted besides localhost, 127.0.0.1, [::1] and --host ('*' = any); "
        "other Hosts get 403 (DNS-rebinding protection)",
        "LIST");
  a.flag("--props-full", &props_full, "show the model's absolute path in /props (default: its file name)");
  // Reasoning budgets (docs/structured-output.md).
  int reasoning_budget = -1, hard_reply = -1;
  std::string close_hint;
  int effort[5] = {1024, 4096, 16384, 32768, -1};
  a.opt("--reasoning-budget,--think-max-tokens", &reasoning_budget,
        "tokens a reply may spend inside its reasoning block before it is closed (-1 = unlimited, 0 = no thinking)");
  a.opt("--reasoning-close-hint", &close_hint, "text written before the end-of-thinking tag when the budget runs out", "TEXT");
  a.opt("--hard-limit-reply-budget", &hard_reply, "tokens of every reply at most, reasoning included; the block is closed in time (-1 = none)");
  a.opt("--reasoning-effort-low", &effort[0], "reasoning budget of reasoning_effort \"low\"");
  a.opt("--reasoning-effort-medium", &effort[1], "reasoning budget of reasoning_effort \"medium\"");
  a.opt("--reasoning-effort-high", &effort[2], "reasoning budget of reasoning_effort \"high\"");
  a.opt("--reasoning-effort-x-high", &effort[3], "reasoning budget of reasoning_effort \"x-high\"");
  a.opt("--reasoning-effort-max", &effort[4], "reasoning budget of reasoning_effort \"max\" (-1 = unlimited)");
  sf.add_to(a);
  spf.add_to(a);
  a.flag("-v,--verbose", &verbose, "log one line per request (route, status, tokens, TTFT, tok/s, the reason of a refusal)");
  a.footer(
      "Unlike llama-server's, -c is the context of each slot: the KV cache holds np × c tokens.\n"
      "In serve, -t defaults to cores - 1 (a core is left for HTTP and local clients), and -c 0 is the model's\n"
      "whole training context (no -c: the training context, at most 4096); a -c beyond it gets a warning.\n"
      "-n 0 lets a request without a limit run to the end of its slot: agent clients such as Codex send none.\n"
      "Example: peregrine serve -m model.gguf -c 8192 -np 4 --port 8080");
  if (!a.parse(argc, argv)) return 0;
  spf.validate();

  PG_CHECK(port >= 0 && port <= 65535, "invalid port " + std::to_string(port));
  PG_CHECK(parallel >= 1 && parallel <= 256, "--parallel must be in [1, 256], got " + std::to_string(parallel));
  PG_CHECK(timeout >= 0, "--timeout must be ≥ 0");
  PG_CHECK(max_body >= 1024, "--max-body must be at least 1024 bytes");
  PG_CHECK(default_max_tokens >= 0, "--default-max-tokens must be ≥ 0");
  PG_CHECK(http_threads >= 0 && http_threads <= 4096, "--threads-http must be in [0, 4096]");
  PG_CHECK(max_queue >= 0, "--max-queue must be ≥ 0");
  if (api_key.empty())
    if (const char* env = std::getenv("PEREGRINE_API_KEY")) api_key = env;
  // The HTTP threads and local clients need a core: a compute pool spread over every core stalls
  // whenever one of its workers is descheduled (measured: 2.4 vs 0.46 ms/token on 2 cores).
  if (!a.given("threads") && mf.threads == 0) mf.threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1);
  const bool ctx_given = a.given("ctx-size");

  // Block the stop signals in every thread (the ones started below inherit the mask); one thread
  // waits for them and shuts the server down in order.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  // A client that hangs up makes writes fail with EPIPE instead of killing the process.
  signal(SIGPIPE, SIG_IGN);

  std::string template_src, template_from;
  if (!template_file.empty()) {
    template_src = read_file(template_file);
    template_from = template_file;
  }

  const bool bundled = mf.model.empty() && !std::getenv("PEREGRINE_MODEL");
  if (mf.model.empty()) mf.model = default_model_path();
  auto lm = load_model(mf);
  auto draft = load_spec(spf, mf, lm, mf.model, bundled);
  const ModelConfig& cfg = lm.model->config();
  // -c 0: the model's training context. A larger -c than the model was trained for runs, but its
  // output past the training length is usually poor: say so at startup.
  if (ctx_given && mf.ctx == 0 && cfg.n_ctx_train > 0) lm.n_ctx = cfg.n_ctx_train;
  if (cfg.n_ctx_train > 0 && lm.n_ctx > cfg.n_ctx_train)
    PG_WARN("-c %d is beyond the model's training context (%d tokens): expect degraded output past %d tokens", lm.n_ctx,
            cfg.n_ctx_train, cfg.n_ctx_train);
  std::string tool_use_src;
  if (template_src.empty()) {
    if (auto t = chat::gguf_chat_template(lm.model->file())) {
      template_src = *t;
      template_from = "the model file";
      if (auto tu = chat::gguf_chat_template(lm.model->file(), "tool_use")) {
        tool_use_src = *tu;
        template_from += " (and its tool_use variant)";
      }
    }
  }
  const SamplingParams sp = sf.p;
  sp.validate(cfg.n_vocab);

  engine::SchedulerOptions so = lm.scheduler_options(parallel, mf.batch, draft.opt);
  so.max_queue = max_queue;
  engine::Scheduler sched(*lm.model, *lm.tokenizer, so);

  server::ServerOptions o;
  o.host = host;
  o.port = port;
  o.api_key = api_key;
  o.model_path = mf.model;
  o.model_name = !model_name.empty() ? model_name : std::filesystem::path(mf.model).filename().string();
  o.cors_origin = cors;
  o.chat_template = template_src;
  o.chat_template_tool_use = tool_use_src;
  o.max_body = static_cast<size_t>(max_body);
  o.timeout_s = timeout;
  o.default_max_tokens = default_max_tokens;
  o.clamp_max_tokens = clamp;
  o.http_threads = http_threads;
  o.props_full = props_full;
  o.log_requests = verbose;
  PG_CHECK(reasoning_budget >= -1, "--reasoning-budget must be ≥ -1");
  PG_CHECK(hard_reply == -1 || hard_reply >= 1, "--hard-limit-reply-budget must be ≥ 1 (or -1)");
  o.reasoning_budget = reasoning_budget;
  o.reasoning_close_hint = close_hint;
  o.hard_limit_reply_budget = hard_reply;
  {
    // Per-model defaults from a model card beside the GGUF ("reasoning_effort": {"low": N, ...}); flags win.
    const char* names[5] = {"low", "medium", "high", "x-high", "max"};
    const auto card = std::filesystem::path(mf.model).parent_path() / "card.json";
    std::error_code ec;
    if (std::filesystem::exists(card, ec)) {
      try {
        std::ifstream f(card);
        auto j = nlohmann::json::parse(f);
        if (j.contains("reasoning_effort") && j["reasoning_effort"].is_object())
          for (int k = 0; k < 5; ++k)
            if (!a.given(std::string("reasoning-effort-") + names[k]) && j["reasoning_effort"].contains(names[k]) &&
                j["reasoning_effort"][names[k]].is_number_integer())
              effort[k] = j["reasoning_effort"][names[k]].get<int>();
      } catch (const std::exception& e) {
        PG_WARN("%s: not read (%s)", card.string().c_str(), e.what());
      }
    }
    for (int k = 0; k < 5; ++k) o.effort_budget[k] = effort[k];
  }
  for (size_t p = 0; p < allowed_hosts.size();) {
    size_t e = allowed_hosts.find(',', p);
    if (e == std::string::npos) e = allowed_hosts.size();
    std::string h = allowed_hosts.substr(p, e - p);
    std::erase(h, ' ');
    if (!h.empty()) o.allowed_hosts.push_back(h);
    p = e + 1;
  }
  o.sampling = sp;
  o.seed = sf.seed;
  o.build_info = PEREGRINE_VERSION;
  {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  R"({"backend":"%s","threads":%d,"kv_type":"%s","arch":"%s","n_ctx_train":%d,"n_layer":%d,"n_embd":%d})",
                  lm.backend->name().c_str(), mf.threads, mf.kv_types().c_str(), cfg.arch.c_str(), cfg.n_ctx_train, cfg.n_layer,
                  cfg.n_embd);
    o.runtime_info_json = buf;
  }
  server::Server srv(sched, *lm.tokenizer, o);
  const int bound = srv.bind();

  std::fprintf(stderr, "peregrine %s serve\n", PEREGRINE_VERSION);
  std::fprintf(stderr, "  model     %s (%s, %s, %s)\n", o.model_name.c_str(), cfg.arch.c_str(), mf.model.c_str(),
               mib(lm.model->bytes().file).c_str());
  std::fprintf(stderr, "  context   %d tokens per slot × %d slots (KV cache %s, %s), batch %d\n", lm.n_ctx, parallel,
               mib(sched.kv_bytes()).c_str(), mf.kv_types().c_str(), so.n_batch);
  std::fprintf(stderr, "  backend   %s\n", lm.backend->name().c_str());
  if (so.spec.on())
    std::fprintf(stderr, "  speculate %s%s%s, %s, up to %d drafted tokens per step%s\n", spec::spec_type_name(so.spec.type),
                 draft.path.empty() ? "" : " with ", draft.path.c_str(), so.spec.tree ? "DDTree" : "chain", so.spec.n_max,
                 so.spec.tree ? (", budget " + std::to_string(so.spec.budget) + " nodes").c_str() : "");
  else
    std::fprintf(stderr, "  speculate off\n");
  if (template_src.empty())
    std::fprintf(stderr, "  template  none: chat endpoints are off (give --chat-template-file); /v1/completions works\n");
  else
    std::fprintf(stderr, "  template  from %s\n", template_from.c_str());
  std::fprintf(stderr, "  auth      %s%s\n", api_key.empty() ? "none" : "API key required",
               cors.empty() ? "" : (", CORS origin " + cors).c_str());
  if (api_key.empty() && host != "127.0.0.1" && host != "localhost" && host != "::1")
    std::fprintf(stderr, "  warning   listening on %s without --api-key: anyone who can reach this address can use the model\n",
                 host.c_str());
  std::fprintf(stderr, "listening on http://%s:%d\n", host.find(':') != std::string::npos ? ("[" + host + "]").c_str() : host.c_str(),
               bound);
  std::fflush(stderr);

  std::thread sig([&] {
    int s = 0;
    sigwait(&stop_signals, &s);
    std::fprintf(stderr, "\nstopping (signal %d)\n", s);
    srv.stop();
  });
  sig.detach();
  srv.run();
  sched.shutdown();
  return 0;
}

}  // namespace pg::cli
