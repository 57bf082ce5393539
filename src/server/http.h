// The server's HTTP/1.1 layer: one epoll thread owns every connection while it is idle or being
// read, and a worker pool that grows with the load runs complete requests.
//
// Why not a thread per connection (cpp-httplib's model, used before): an idle keep-alive client or a
// slow-loris socket held one of a fixed number of workers, so 32 of them locked every other client
// out. Here a connection costs a worker only from the moment its request is complete until its
// answer is written; reading requests (headers within a deadline, bodies with a progress deadline,
// keep-alive idle time) costs nothing but a buffer. Framing errors are answered as soon as the bytes
// that show them arrive: a bad Content-Length or chunk size, a body over the limit (Content-Length
// or the running total of a chunked body), a POST with no length, bytes that are not HTTP (TLS).
//
// One request per connection is in flight at a time: pipelined requests wait in the connection's
// buffer (and the kernel's) and are answered in order.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pg::server::http {

struct Request {
  std::string method;  // as sent (methods are case-sensitive)
  std::string target;  // the request target as sent
  std::string path;    // target's path, percent-decoded, without the query
  std::string query;   // after '?', not decoded
  int minor = 1;       // HTTP/1.minor
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, values trimmed
  std::string body;    // de-chunked
  std::string remote_addr;
  int remote_port = -1, local_port = -1;
  int fd = -1;          // the connection's socket, for watching it while the request runs
  bool keep_alive = true;

  // Value of the first header with this (lower-case) name; empty when absent.
  std::string_view header(std::string_view lname) const;
  bool has_header(std::string_view lname) const;
};

// Writes one piece of a streamed body; false once the client is gone.
using StreamWrite = std::function<bool(std::string_view)>;

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Streaming replies (chunked transfer coding): produces the body after the headers went out.
  std::function<void(const StreamWrite&)> stream;
  bool close = false;  // close the connection after this answer
};

struct Options {
  size_t max_body = 32u << 20;         // bytes of (de-chunked) body
  size_t max_header = 64u << 10;       // request line + headers
  size_t max_headers = 100;            // header lines
  double header_timeout_s = 10;        // first byte of a request to the end of its headers
  double body_timeout_s = 30;          // longest wait for more body bytes
  double keepalive_timeout_s = 30;     // idle connection between requests (announced in Keep-Alive)
  double write_timeout_s = 30;         // longest wait for the client to take more of an answer
  int backlog = 1024;                  // listen queue (the kernel caps it at net.core.somaxconn)
  size_t max_connections = 4096;       // open connections beyond this get 503 and are closed
  int max_workers = 256;               // requests running at once; more wait in the pool's queue
  int min_workers = 4;                 // threads kept when idle
};

using Handler = std::function<void(Request&, Response&)>;
// Fills the answer to a request refused by the HTTP layer itself (status 400, 408, 411, 413, 431,
// 501, 503, 505). `req` carries what was parsed before the error (its path may be empty).
using ErrorHandler = std::function<void(const Request& req, int status, const std::string& reason, Response& res)>;

struct Stats {
  size_t connections = 0;  // open
  int workers = 0;         // threads in the pool
  int busy = 0;            // requests running
};

class HttpServer {
 public:
  HttpServer(Options opt, Handler handler, ErrorHandler on_error);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; throws pg::Error when the address is unavailable. port 0 picks a free one.
  // Returns the bound port.
  int bind(const std::string& host, int port);
  // Serves until stop(); returns once every worker finished (running requests see their
  // connections shut down, so requests waiting on the engine are cancelled).
  void run();
  void stop();  // from any thread
  bool running() const;
  Stats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

const char* status_reason(int status);

}  // namespace pg::server::http
