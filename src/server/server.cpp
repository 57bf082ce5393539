#include "server/server.h"

#include <httplib.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "core/log.h"
#include "server/context.h"

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

void write_error(httplib::Response& res, ApiFlavor f, const ApiError& e) {
  res.status = e.status();
  res.set_content(error_body(f, e).dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

}  // namespace

struct Server::Impl {
  Context ctx;
  httplib::Server svr;
  int port = -1;

  Impl(engine::Scheduler& s, const tok::Tokenizer& t, ServerOptions o) : ctx{s, t, std::move(o), nullptr, unix_time()} {}

  void apply(HttpOut&& out, httplib::Response& res) {
    res.status = out.status;
    for (auto& [k, v] : out.headers) res.set_header(k, v);
    if (!out.stream) {
      res.set_content(out.body, out.content_type);
      return;
    }
    auto stream = std::move(out.stream);
    res.set_chunked_content_provider(out.content_type, [stream](size_t, httplib::DataSink& sink) {
      bool ok = true;
      const Write w = [&](std::string_view s) {
        if (ok) ok = sink.write(s.data(), s.size());
        return ok;
      };
      try {
        stream(w);
      } catch (const std::exception& e) {
        // Headers are gone already; all that can be done is to end the stream visibly.
        PG_WARN("stream failed: %s", e.what());
        w(sse_data(openai_error_body(ApiError(500, e.what(), {}, {}, "server_error"))));
      }
      if (!ok) return false;
      sink.done();
      return true;
    });
  }

  httplib::Server::Handler route(Handler fn) {
    return [this, fn](const httplib::Request& req, httplib::Response& res) {
      const ApiFlavor f = flavor_of(req.path);
      HttpIn in;
      in.body = req.body;
      in.remote_addr = req.remote_addr;
      in.remote_port = req.remote_port;
      in.local_port = req.local_port;
      try {
        apply(fn(ctx, in), res);
      } catch (const ApiError& e) {
        write_error(res, f, e);
      } catch (const std::bad_alloc&) {
        write_error(res, f, ApiError(500, "out of memory", {}, {}, "server_error"));
      } catch (const std::exception& e) {
        PG_WARN("%s %s failed: %s", req.method.c_str(), req.path.c_str(), e.what());
        write_error(res, f, ApiError(500, e.what(), {}, {}, "server_error"));
      }
    };
  }

  void setup() {
    const ServerOptions& o = ctx.opt;
    if (!o.chat_template.empty()) ctx.prompt = std::make_unique<ChatPrompt>(o.chat_template, ctx.tok, o.chat_template_tool_use);

    const int slots = ctx.sched.options().n_slots;
    const int threads = o.http_threads > 0 ? o.http_threads : std::max(32, slots * 4 + 8);
    ctx.opt.http_threads = threads;
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
    svr.set_payload_max_length(o.max_body);
    svr.set_keep_alive_max_count(1000);
    svr.set_read_timeout(60, 0);
    svr.set_write_timeout(30, 0);
    svr.set_tcp_nodelay(true);

    svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (ctx.opt.api_key.empty() || req.method == "OPTIONS" || req.path == "/health" || req.path == "/v1/health")
        return httplib::Server::HandlerResponse::Unhandled;
      std::string key;
      const std::string auth = req.get_header_value("Authorization");
      if (auth.size() > 7 && (auth.rfind("Bearer ", 0) == 0 || auth.rfind("bearer ", 0) == 0)) key = auth.substr(7);
      if (key.empty()) key = req.get_header_value("x-api-key");
      if (!key.empty() && equal_ct(key, ctx.opt.api_key)) return httplib::Server::HandlerResponse::Unhandled;
      write_error(res, flavor_of(req.path),
                  ApiError(401, key.empty() ? "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
                                            : "invalid API key",
                           {}, "invalid_api_key", "authentication_error"));
      return httplib::Server::HandlerResponse::Handled;
    });
    if (!o.cors_origin.empty()) {
      svr.set_post_routing_handler([this](const httplib::Request&, httplib::Response& res) {
        res.set_header("Access-Control-Allow-Origin", ctx.opt.cors_origin);
        if (ctx.opt.cors_origin != "*") res.set_header("Vary", "Origin");
        res.set_header("Access-Control-Expose-Headers", "X-Peregrine-Ignored-Fields");
      });
      svr.Options(".*", [](const httplib::Request&, httplib::Response& res) {
        res.status = 204;
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers",
                       "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "
                       "anthropic-dangerous-direct-browser-access, OpenAI-Organization, OpenAI-Project, X-Stainless-*");
        res.set_header("Access-Control-Max-Age", "86400");
      });
    }
    svr.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler's own error body
      const ApiFlavor f = flavor_of(req.path);
      switch (res.status) {
        case 404: write_error(res, f, ApiError(404, "no route for " + req.method + " " + req.path, {}, "not_found", "not_found_error")); break;
        case 413: {
          // cpp-httplib caps form-encoded bodies at 8 KiB whatever the payload limit; `curl -d` sends
          // that content type unless told otherwise.
          const std::string ct = req.get_header_value("Content-Type");
          const size_t len = std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10);
          if (ct.find("x-www-form-urlencoded") != std::string::npos && len <= ctx.opt.max_body)
            write_error(res, f, ApiError(413, "form-encoded request bodies are limited to 8 KiB: send JSON with 'Content-Type: application/json'",
                                         {}, "request_too_large"));
          else
            write_error(res, f, ApiError(413, "the request body is larger than the server's limit of " + std::to_string(ctx.opt.max_body) +
                                                  " bytes (--max-body)", {}, "request_too_large"));
          break;
        }
        default:
          write_error(res, f, ApiError(res.status, "the request could not be processed (HTTP " + std::to_string(res.status) + ")"));
      }
    });
    svr.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        if (ep) std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      write_error(res, flavor_of(req.path), ApiError(500, what, {}, {}, "server_error"));
    });
    svr.set_logger([](const httplib::Request& req, const httplib::Response& res) {
      PG_DEBUG("%s %s %d", req.method.c_str(), req.path.c_str(), res.status);
    });

    auto post = [&](const char* path, Handler fn) {
      svr.Post(path, route(fn));
      // A GET on a POST route is a client mistake worth naming precisely.
      const std::string p = path;
      svr.Get(path, [this, p](const httplib::Request& req, httplib::Response& res) {
        write_error(res, flavor_of(req.path), ApiError(405, "use POST for " + p, {}, "method_not_allowed"));
      });
    };
    auto get = [&](const char* path, Handler fn) { svr.Get(path, route(fn)); };

    get("/health", [](Context&, const HttpIn&) { return HttpOut::json_reply(json{{"status", "ok"}}); });
    get("/v1/health", [](Context&, const HttpIn&) { return HttpOut::json_reply(json{{"status", "ok"}}); });
    get("/v1/models", handle_models);
    get("/models", handle_models);
    svr.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      if (id != ctx.opt.model_name) {
        write_error(res, ApiFlavor::kOpenAI, ApiError(404, "the model '" + id + "' does not exist", "model", "model_not_found", "not_found_error"));
        return;
      }
      json m = json{{"id", ctx.opt.model_name}, {"object", "model"}, {"created", ctx.started}, {"owned_by", "peregrine"}};
      apply(HttpOut::json_reply(m), res);
    });
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
  auto& s = impl_->svr;
  const ServerOptions& o = impl_->ctx.opt;
  if (o.port == 0) {
    impl_->port = s.bind_to_any_port(o.host);
    if (impl_->port <= 0) throw Error("cannot listen on " + o.host + " (any port)");
  } else {
    if (!s.bind_to_port(o.host, o.port))
      throw Error("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (address in use or not available)");
    impl_->port = o.port;
  }
  return impl_->port;
}

void Server::run() {
  if (impl_->port < 0) bind();
  impl_->svr.listen_after_bind();
}

void Server::stop() {
  if (impl_ && impl_->svr.is_running()) impl_->svr.stop();
}

int Server::port() const { return impl_->port; }

}  // namespace pg::server
