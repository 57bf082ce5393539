#include "server/server.h"

#include <algorithm>
#include <chrono>
#include <malloc.h>
#include <cstdlib>
#include <map>
#include <new>

#include "core/log.h"
#include "server/context.h"
#include "server/http.h"

namespace pg::server {

namespace {

using Handler = HttpOut (*)(Context&, const HttpIn&);

// Anthropic routes answer errors in Anthropic's shape; everything else in OpenAI's.
ApiFlavor flavor_of(const std::string& path) {
  return path.rfind("/v1/messages", 0) == 0 ? ApiFlavor::kAnthropic : ApiFlavor::kOpenAI;
}

bool equal_ct(const std::string& a, const std::string& b) {
  // Constant time in the length of the presented key, so timing does not reveal matching prefixes.
  unsigned diff = a.size() != b.size() ? 1u : 0u;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i % std::max<size_t>(b.size(), 1)]);
  return diff == 0;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

bool is_loopback_name(const std::string& h) {
  return h == "localhost" || h == "::1" || h == "[::1]" || h.rfind("127.", 0) == 0;
}

// The host part of a Host header ("[::1]:8080" → "[::1]", "LocalHost.:80" → "localhost").
std::string host_of(std::string_view v) {
  std::string h;
  if (!v.empty() && v.front() == '[') {
    const size_t e = v.find(']');
    h = std::string(v.substr(0, e == std::string_view::npos ? v.size() : e + 1));
  } else {
    h = std::string(v.substr(0, v.find(':')));
  }
  h = lower(h);
  if (!h.empty() && h.back() == '.') h.pop_back();
  return h;
}

struct Route {
  Handler get = nullptr, post = nullptr;
};

}  // namespace

struct Server::Impl {
  Context ctx;
  std::unique_ptr<http::HttpServer> http;
  std::map<std::string, Route> routes;
  std::vector<std::string> hosts;  // accepted Host names; empty: any
  int port = -1;

  Impl(engine::Scheduler& s, const tok::Tokenizer& t, ServerOptions o) : ctx{s, t, std::move(o), nullptr, unix_time()} {}

  void write_error(http::Response& res, ApiFlavor f, const ApiError& e, std::string* reason = nullptr) {
    res.status = e.status();
    res.content_type = "application/json";
    res.stream = nullptr;
    res.body = error_body(f, e).dump(-1, ' ', false, json::error_handler_t::replace);
    if (reason) *reason = e.what();
  }

  void log_line(const http::Request& req, int status, double ms, const RequestLog& l, const std::string& reason, bool streamed) {
    if (!ctx.opt.log_requests) return;
    std::string s = req.method + " " + req.path + " " + std::to_string(status);
    char buf[256];
    std::snprintf(buf, sizeof buf, " %.1f ms", ms);
    s += buf;
    if (l.n_prompt >= 0) {
      std::snprintf(buf, sizeof buf, " prompt=%d gen=%d ttft=%.1fms %.1ftok/s", l.n_prompt, l.n_generated, l.ttft_ms, l.predicted_per_second);
      s += buf;
      if (!l.finish.empty()) s += " finish=" + l.finish;
      s += " cached=" + std::to_string(l.n_cached);  // prompt tokens served by the prefix cache
    }
    if (streamed) s += " stream";
    if (l.cancelled) s += " CANCELLED (client disconnected)";
    if (status >= 400 && !reason.empty()) s += ": " + reason.substr(0, 300);
    s += " [" + req.remote_addr + ":" + std::to_string(req.remote_port) + "]";
    PG_INFO("%s", s.c_str());
  }

  // The checks every request passes before its route: Host (403), key (401). Returns false with
  // `res` filled when the request is refused.
  bool admit(const http::Request& req, http::Response& res, ApiFlavor f, std::string& reason) {
    if (!hosts.empty()) {
      const std::string_view hv = req.header("host");
      if (hv.empty()) {
        // Browsers always send Host; an HTTP/1.0 tool without it is no rebinding attack.
        if (req.minor >= 1) {
          write_error(res, f, ApiError(400, "the Host header is required in HTTP/1.1"), &reason);
          return false;
        }
      } else {
        const std::string h = host_of(hv);
        if (std::find(hosts.begin(), hosts.end(), h) == hosts.end()) {
          write_error(res, f,
                      ApiError(403, "Host '" + std::string(hv.substr(0, 100)) +
                                        "' is not served here (DNS-rebinding protection): use localhost or 127.0.0.1, or start the server with --allowed-hosts " + h,
                               {}, "host_not_allowed", "permission_error"),
                      &reason);
          return false;
        }
      }
    }
    if (ctx.opt.api_key.empty() || req.method == "OPTIONS" || req.path == "/health" || req.path == "/v1/health") return true;
    std::string key;
    const std::string auth = std::string(req.header("authorization"));
    // The auth scheme is case-insensitive (RFC 9110 §11.1); spaces after it are not significant.
    if (auth.size() > 7 && lower(auth.substr(0, 7)) == "bearer ") {
      size_t i = 7;
      while (i < auth.size() && auth[i] == ' ') ++i;
      key = auth.substr(i);
    }
    if (key.empty()) key = std::string(req.header("x-api-key"));
    if (!key.empty() && equal_ct(key, ctx.opt.api_key)) return true;
    write_error(res, f,
                ApiError(401, key.empty() ? "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'" : "invalid API key", {},
                         "invalid_api_key", "authentication_error"),
                &reason);
    return false;
  }

  void cors(http::Response& res) {
    if (ctx.opt.cors_origin.empty()) return;
    res.headers.push_back({"Access-Control-Allow-Origin", ctx.opt.cors_origin});
    if (ctx.opt.cors_origin != "*") res.headers.push_back({"Vary", "Origin"});
    res.headers.push_back({"Access-Control-Expose-Headers", "X-Peregrine-Ignored-Fields"});
  }

  void handle(http::Request& req, http::Response& res) {
    const auto t0 = std::chrono::steady_clock::now();
    const ApiFlavor f = flavor_of(req.path);
    auto log = std::make_shared<RequestLog>();
    std::string reason;
    auto ms = [t0] { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(); };
    dispatch(req, res, f, *log, reason);
    cors(res);
    if (!res.stream) {
      log_line(req, res.status, ms(), *log, reason, false);
      return;
    }
    // A stream logs at its end; it runs on this worker thread after this returns.
    auto inner = std::move(res.stream);
    http::Request brief;
    brief.method = req.method;
    brief.path = req.path;
    brief.remote_addr = req.remote_addr;
    brief.remote_port = req.remote_port;
    const int status = res.status;
    res.stream = [this, inner, log, brief, status, ms](const http::StreamWrite& w) {
      current_request_log() = log.get();
      bool client_ok = true;
      inner([&](std::string_view s) { return client_ok = w(s) && client_ok; });
      current_request_log() = nullptr;
      // A stream that ends without the engine's final event ended because its client left (found by
      // a failed write or by the handler's own watch).
      if (!client_ok || (log->n_prompt >= 0 && log->finish.empty())) log->cancelled = true;
      log_line(brief, status, ms(), *log, {}, true);
    };
  }

  void dispatch(http::Request& req, http::Response& res, ApiFlavor f, RequestLog& log, std::string& reason) {
    if (!admit(req, res, f, reason)) return;
    if (req.method == "OPTIONS") {
      if (ctx.opt.cors_origin.empty()) {
        write_error(res, f, ApiError(405, "OPTIONS: CORS is off (start the server with --cors ORIGIN)", {}, "method_not_allowed"), &reason);
        return;
      }
      res.status = 204;
      res.content_type.clear();
      res.headers.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
      res.headers.push_back({"Access-Control-Allow-Headers",
                             "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "
                             "anthropic-dangerous-direct-browser-access, OpenAI-Organization, OpenAI-Project, X-Stainless-*"});
      res.headers.push_back({"Access-Control-Max-Age", "86400"});
      return;
    }
    Handler fn = nullptr;
    auto it = routes.find(req.path);
    const bool get = req.method == "GET" || req.method == "HEAD";
    if (it == routes.end()) {
      if (req.path.rfind("/v1/models/", 0) == 0 && req.path.size() > 11) {
        if (!get) {
          write_error(res, f, ApiError(405, "use GET for " + req.path, {}, "method_not_allowed"), &reason);
          return;
        }
        model_by_id(req.path.substr(11), res, reason);
        return;
      }
      write_error(res, f, ApiError(404, "no route for " + req.method + " " + req.path, {}, "not_found", "not_found_error"), &reason);
      return;
    }
    if (get) fn = it->second.get;
    else if (req.method == "POST") fn = it->second.post;
    if (!fn) {
      write_error(res, f, ApiError(405, std::string("use ") + (it->second.post ? "POST" : "GET") + " for " + req.path, {}, "method_not_allowed"),
                  &reason);
      return;
    }
    if (req.method == "POST") {
      // JSON only: a browser can send text/plain or a form cross-site without a CORS preflight, and
      // such a body must not run inference.
      const std::string ct = lower(req.header("content-type"));
      const std::string media(http_trim(ct.substr(0, ct.find(';'))));
      const bool json_type = media == "application/json" || (media.rfind("application/", 0) == 0 && media.size() > 5 &&
                                                              media.compare(media.size() - 5, 5, "+json") == 0);
      if (!json_type) {
        write_error(res, f,
                    ApiError(415, ct.empty() ? "the request needs 'Content-Type: application/json'"
                                             : "unsupported Content-Type '" + ct.substr(0, 100) + "': send 'Content-Type: application/json'",
                             {}, "unsupported_media_type"),
                    &reason);
        return;
      }
    }
    HttpIn in;
    in.body = req.body;
    in.fd = req.fd;
    current_request_log() = &log;
    try {
      apply(fn(ctx, in), res);
    } catch (const ApiError& e) {
      write_error(res, f, e, &reason);
    } catch (const std::bad_alloc&) {
      write_error(res, f, ApiError(500, "out of memory", {}, {}, "server_error"), &reason);
    } catch (const std::exception& e) {
      PG_WARN("%s %s failed: %s", req.method.c_str(), req.path.c_str(), e.what());
      write_error(res, f, ApiError(500, e.what(), {}, {}, "server_error"), &reason);
    }
    current_request_log() = nullptr;
    if (res.status == 499) log.cancelled = true;
  }

  static std::string_view http_trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  }

  void model_by_id(const std::string& id, http::Response& res, std::string& reason) {
    if (id != ctx.opt.model_name) {
      write_error(res, ApiFlavor::kOpenAI, ApiError(404, "the model '" + id + "' does not exist", "model", "model_not_found", "not_found_error"),
                  &reason);
      return;
    }
    json m = json{{"id", ctx.opt.model_name}, {"object", "model"}, {"created", ctx.started}, {"owned_by", "peregrine"}};
    apply(HttpOut::json_reply(m), res);
  }

  void apply(HttpOut&& out, http::Response& res) {
    res.status = out.status;
    for (auto& [k, v] : out.headers) res.headers.push_back({k, v});
    res.content_type = out.content_type;
    if (!out.stream) {
      res.body = std::move(out.body);
      return;
    }
    auto stream = std::move(out.stream);
    res.stream = [stream](const http::StreamWrite& sink) {
      bool ok = true;
      const Write w = [&](std::string_view s) {
        if (ok) ok = sink(s);
        return ok;
      };
      try {
        stream(w);
      } catch (const std::exception& e) {
        // Headers are gone already; all that can be done is to end the stream visibly.
        PG_WARN("stream failed: %s", e.what());
        w(sse_data(openai_error_body(ApiError(500, e.what(), {}, {}, "server_error"))));
      }
    };
  }

  void on_http_error(const http::Request& req, int status, const std::string& why, http::Response& res) {
    const ApiFlavor f = flavor_of(req.path);
    std::string reason;
    switch (status) {
      case 413:
        write_error(res, f,
                    ApiError(413, "the request body is larger than the server's limit of " + std::to_string(ctx.opt.max_body) + " bytes (--max-body): " + why,
                             {}, "request_too_large"),
                    &reason);
        break;
      case 503: write_error(res, f, ApiError(503, why, {}, "overloaded", "server_error"), &reason); break;
      default: write_error(res, f, ApiError(status, why, {}, "bad_request_framing"), &reason);
    }
    RequestLog none;
    http::Request shown = req;
    if (shown.method.empty()) shown.method = "-";
    log_line(shown, status, 0, none, reason, false);
  }

  void setup() {
    const ServerOptions& o = ctx.opt;
    if (!o.chat_template.empty()) ctx.prompt = std::make_unique<ChatPrompt>(o.chat_template, ctx.tok, o.chat_template_tool_use);

    const auto& so = ctx.sched.options();
    // A request holds a worker from the end of its body to the end of its answer, including while it
    // waits in the engine's queue: room for every slot, the whole queue and utility requests.
    const int workers = o.http_threads > 0 ? o.http_threads : std::clamp(so.n_slots + so.max_queue + 64, 64, 4096);
    ctx.opt.http_threads = workers;

    // Host names a loopback server answers to (a DNS-rebinding page names its own domain).
    bool any = std::find(o.allowed_hosts.begin(), o.allowed_hosts.end(), "*") != o.allowed_hosts.end();
    if (!is_loopback_name(lower(o.host)) && o.allowed_hosts.empty()) any = true;
    if (!any) {
      hosts = {"localhost", "127.0.0.1", "[::1]"};
      std::string h = lower(o.host);
      if (h.find(':') != std::string::npos && h.front() != '[') h = "[" + h + "]";
      hosts.push_back(h);
      for (const auto& a : o.allowed_hosts) hosts.push_back(host_of(lower(a)));
    }

    // Memory that comes back after large requests. glibc's thresholds adapt upwards after a large
    // free (up to 32 MiB for mmap, 64 MiB for trimming), after which a request body or a token
    // array lands in a worker thread's arena, whose top is never returned (malloc_trim only trims
    // the main arena's): measured, six 6 MB /tokenize requests left 66 MB resident over a 6 MB
    // idle server, 8 MB with these fixed thresholds. Blocks ≥ 1 MiB are mmapped (freed at once);
    // arenas shrink once 1 MiB is free at their top.
    mallopt(M_MMAP_THRESHOLD, 1 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 20);

    http::Options ho;
    ho.max_body = o.max_body;
    ho.max_workers = workers;
    http = std::make_unique<http::HttpServer>(
        ho, [this](http::Request& q, http::Response& r) { handle(q, r); },
        [this](const http::Request& q, int st, const std::string& why, http::Response& r) { on_http_error(q, st, why, r); });

    auto post = [&](const char* path, Handler fn) { routes[path].post = fn; };
    auto get = [&](const char* path, Handler fn) { routes[path].get = fn; };

    get("/health", [](Context&, const HttpIn&) { return HttpOut::json_reply(json{{"status", "ok"}}); });
    get("/v1/health", [](Context&, const HttpIn&) { return HttpOut::json_reply(json{{"status", "ok"}}); });
    get("/v1/models", handle_models);
    get("/models", handle_models);
    get("/props", handle_props);
    get("/metrics", handle_metrics);
    post("/v1/chat/completions", handle_chat_completions);
    post("/chat/completions", handle_chat_completions);
    post("/v1/completions", handle_completions);
    post("/completions", handle_completions);
    post("/v1/responses", handle_responses);
    post("/responses", handle_responses);
    post("/v1/messages", handle_messages);
    post("/v1/messages/count_tokens", handle_count_tokens);
    post("/tokenize", handle_tokenize);
    post("/detokenize", handle_detokenize);
    post("/apply-template", handle_apply_template);
  }
};

Server::Server(engine::Scheduler& sched, const tok::Tokenizer& tok, ServerOptions opt)
    : impl_(std::make_unique<Impl>(sched, tok, std::move(opt))) {
  impl_->setup();
}

Server::~Server() { stop(); }

int Server::bind() {
  const ServerOptions& o = impl_->ctx.opt;
  impl_->port = impl_->http->bind(o.host, o.port);
  return impl_->port;
}

void Server::run() {
  if (impl_->port < 0) bind();
  impl_->http->run();
}

void Server::stop() {
  if (impl_ && impl_->http) impl_->http->stop();
}

int Server::port() const { return impl_->port; }

}  // namespace pg::server
