#include "server/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"

namespace pg::server::http {

using Clock = std::chrono::steady_clock;

namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// RFC 9110 token characters (methods, header names).
bool is_tchar(unsigned char c) {
  if (std::isalnum(c)) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != 0;
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::string percent_decode(std::string_view s) {
  std::string r;
  r.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && hexval(s[i + 1]) >= 0 && hexval(s[i + 2]) >= 0) {
      r.push_back(static_cast<char>(hexval(s[i + 1]) * 16 + hexval(s[i + 2])));
      i += 2;
    } else {
      r.push_back(s[i]);
    }
  }
  return r;
}

void addr_of(const sockaddr_storage& ss, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
    port = ntohs(a->sin6_port);
  }
  addr = buf;
}

// Sends all of `data` on a non-blocking socket, waiting at most `timeout_s` for each stretch of
// progress. False when the peer is gone or too slow.
bool send_all(int fd, std::string_view data, double timeout_s) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      const int r = ::poll(&p, 1, static_cast<int>(timeout_s * 1000));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0 || (p.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

// A worker pool that grows to the load (up to a cap) and shrinks back when idle: a request waiting
// on the engine holds its thread, and a fixed small pool is what let a few clients lock out the rest.
// Threads are added when a task has waited kSpawnAfter, not for every queued task: a burst of
// quick requests (health checks) is served by the threads there are instead of spawning hundreds,
// while requests that block (inference) get a thread each within milliseconds.
class Pool {
 public:
  static constexpr auto kSpawnAfter = std::chrono::milliseconds(5);

  Pool(int min_threads, int max_threads) : min_(std::max(1, min_threads)), max_(std::max(1, max_threads)) {
    monitor_ = std::thread([this] { monitor(); });
  }
  ~Pool() {
    shutdown();
    if (monitor_.joinable()) monitor_.join();
  }

  void submit(std::function<void()> f) {
    std::unique_lock lk(m_);
    q_.push_back({std::move(f), Clock::now()});
    if (idle_ >= static_cast<int>(q_.size())) {
      cv_.notify_one();
    } else if (threads_ < min_) {
      spawn();
    } else {
      mon_cv_.notify_one();  // the monitor adds a thread if this one waits too long
    }
  }

  // Waits for every thread to finish its task and exit.
  void shutdown() {
    std::unique_lock lk(m_);
    stop_ = true;
    cv_.notify_all();
    mon_cv_.notify_all();
    done_cv_.wait(lk, [&] { return threads_ == 0; });
  }

  int threads() const {
    std::lock_guard lk(m_);
    return threads_;
  }
  int busy() const {
    std::lock_guard lk(m_);
    return threads_ - idle_;
  }

 private:
  struct Task {
    std::function<void()> f;
    Clock::time_point queued;
  };

  void spawn() {  // m_ held
    ++threads_;
    ++starting_;
    std::thread([this] { work(); }).detach();
  }

  void monitor() {
    std::unique_lock lk(m_);
    while (!stop_) {
      if (q_.empty()) {
        mon_cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        continue;
      }
      const auto now = Clock::now();
      int waiting = 0;
      for (const Task& t : q_) {
        if (now - t.queued < kSpawnAfter) break;
        ++waiting;
      }
      // Threads still starting will take tasks too: counting them keeps a slow thread start (a loaded
      // machine) from spawning again on every tick.
      for (int n = waiting - idle_ - starting_; n > 0 && threads_ < max_; --n) spawn();
      mon_cv_.wait_for(lk, std::chrono::milliseconds(2));
    }
  }

  void work() {
    std::unique_lock lk(m_);
    --starting_;
    for (;;) {
      if (q_.empty()) {
        if (stop_) break;
        ++idle_;
        const bool got = cv_.wait_for(lk, std::chrono::seconds(10), [&] { return stop_ || !q_.empty(); });
        --idle_;
        // Threads beyond the minimum leave after 10 s without work.
        if (!got && threads_ > min_) break;
        continue;
      }
      auto f = std::move(q_.front().f);
      q_.pop_front();
      lk.unlock();
      try {
        f();
      } catch (const std::exception& e) {
        PG_WARN("http worker: %s", e.what());
      } catch (...) {
      }
      f = nullptr;  // what the task held is freed outside the lock
      lk.lock();
    }
    --threads_;
    done_cv_.notify_all();
  }

  mutable std::mutex m_;
  std::condition_variable cv_, done_cv_, mon_cv_;
  std::deque<Task> q_;
  int min_, max_, threads_ = 0, idle_ = 0, starting_ = 0;
  bool stop_ = false;
  std::thread monitor_;
};

}  // namespace

std::string_view Request::header(std::string_view lname) const {
  for (const auto& [k, v] : headers)
    if (k == lname) return v;
  return {};
}

bool Request::has_header(std::string_view lname) const {
  for (const auto& kv : headers)
    if (kv.first == lname) return true;
  return false;
}

const char* status_reason(int s) {
  switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return s < 300 ? "OK" : s < 500 ? "Bad Request" : "Error";
  }
}

namespace {

// One connection. The loop thread owns it except while `busy`, when a worker runs its request
// (the loop then neither reads it nor closes it).
struct Conn {
  int fd = -1;
  std::string in;  // received bytes not yet consumed
  // kDrain: refused and half-closed; what the client still sends is read and dropped for a moment
  // before the close, so that the close does not reset the connection before the client read the
  // answer (a client sending a large body gets its 413).
  enum class St { kIdle, kHeaders, kBody, kBusy, kDrain } st = St::kIdle;
  Clock::time_point deadline;
  Request req;  // the request being read
  // Body framing of the request being read.
  bool chunked = false;
  size_t need = 0;  // Content-Length bytes still to come
  enum class Ck { kSize, kData, kDataEnd, kTrailer } ck = Ck::kSize;
  size_t chunk_left = 0;
  std::string remote_addr;
  int remote_port = -1, local_port = -1;
  bool in_epoll = false;
};

// A framing error: answered with `status` and the connection closed.
struct Refuse {
  int status;
  std::string reason;
};

}  // namespace

struct HttpServer::Impl {
  Options opt;
  Handler handler;
  ErrorHandler on_error;
  int listen_fd = -1, ep = -1, wake_fd = -1;
  std::atomic<bool> stopping{false}, is_running{false};
  bool accept_paused = false;  // out of descriptors: the listening socket is unwatched until the next sweep
  std::unordered_map<int, std::unique_ptr<Conn>> conns;
  std::atomic<size_t> n_conns{0};
  std::mutex done_m;
  std::vector<std::pair<Conn*, bool>> done;  // (connection, keep it open) from workers
  std::unique_ptr<Pool> pool;

  Impl(Options o, Handler h, ErrorHandler e) : opt(std::move(o)), handler(std::move(h)), on_error(std::move(e)) {
    pool = std::make_unique<Pool>(opt.min_workers, opt.max_workers);
  }
  ~Impl() {
    pool.reset();
    for (auto& [fd, c] : conns) ::close(fd);
    if (listen_fd >= 0) ::close(listen_fd);
    if (ep >= 0) ::close(ep);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  void watch(Conn& c, bool on) {
    if (on == c.in_epoll) return;
    if (on) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.fd = c.fd;
      epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
    } else {
      epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    }
    c.in_epoll = on;
  }

  void close_conn(int fd) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    if (it->second->in_epoll) epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    ::close(fd);
    conns.erase(it);
    n_conns = conns.size();
  }

  // The head of a response (status line and headers) for `res`; `length` < 0: chunked (or, for an
  // HTTP/1.0 client, a body ended by closing the connection).
  std::string head(const Request& req, const Response& res, long long length, bool keep) const {
    std::string h = "HTTP/1.1 " + std::to_string(res.status) + " " + status_reason(res.status) + "\r\n";
    if (!res.content_type.empty() && res.status != 204) h += "Content-Type: " + res.content_type + "\r\n";
    if (length >= 0) {
      if (res.status != 204) h += "Content-Length: " + std::to_string(length) + "\r\n";
    } else if (req.minor >= 1) {
      h += "Transfer-Encoding: chunked\r\n";
    }
    if (keep) {
      h += "Connection: keep-alive\r\nKeep-Alive: timeout=" + std::to_string(static_cast<int>(opt.keepalive_timeout_s)) + "\r\n";
    } else {
      h += "Connection: close\r\n";
    }
    for (const auto& [k, v] : res.headers) h += k + ": " + v + "\r\n";
    h += "\r\n";
    return h;
  }

  // Writes `res` on the request's connection (a worker's thread, or the loop for refusals).
  // Returns whether the connection can serve another request.
  bool write_response(const Request& req, Response& res, bool keep) {
    keep = keep && !res.close && req.keep_alive && !stopping;
    if (!res.stream) {
      const bool head_only = req.method == "HEAD";
      std::string out = head(req, res, static_cast<long long>(res.body.size()), keep);
      if (!head_only) {
        // Large bodies go out in their own write rather than being copied behind the head.
        if (res.body.size() > (64u << 10)) {
          if (!send_all(req.fd, out, opt.write_timeout_s)) return false;
          out.clear();
          if (!send_all(req.fd, res.body, opt.write_timeout_s)) return false;
        } else {
          out += res.body;
        }
      }
      if (!out.empty() && !send_all(req.fd, out, opt.write_timeout_s)) return false;
      return keep;
    }
    // A stream to an HTTP/1.0 client has no chunked coding: its end is the connection's close.
    const bool chunked = req.minor >= 1;
    if (!chunked) keep = false;
    if (!send_all(req.fd, head(req, res, -1, keep), opt.write_timeout_s)) return false;
    bool ok = true;
    const StreamWrite w = [&](std::string_view s) {
      if (!ok) return false;
      if (s.empty()) return true;
      if (chunked) {
        char size[24];
        std::snprintf(size, sizeof size, "%zx\r\n", s.size());
        std::string piece = size;
        piece.append(s);
        piece += "\r\n";
        ok = send_all(req.fd, piece, opt.write_timeout_s);
      } else {
        ok = send_all(req.fd, s, opt.write_timeout_s);
      }
      return ok;
    };
    res.stream(w);
    if (!ok) return false;
    if (chunked && !send_all(req.fd, "0\r\n\r\n", opt.write_timeout_s)) return false;
    return keep;
  }

  // Answers a framing error from the loop thread and closes the connection. The answer is small, so
  // a short wait is enough; a client that does not read it loses it.
  void refuse(Conn& c, const Refuse& r) {
    Response res;
    res.status = r.status;
    try {
      on_error(c.req, r.status, r.reason, res);
    } catch (...) {
      res.body = "{\"error\":{\"message\":\"bad request\"}}";
    }
    Request& q = c.req;
    q.fd = c.fd;
    q.keep_alive = false;
    res.stream = nullptr;
    write_response(q, res, false);  // a failed write shows up as an error or EOF while draining
    ::shutdown(c.fd, SHUT_WR);
    c.st = Conn::St::kDrain;
    c.in.clear();
    c.in.shrink_to_fit();
    c.req = Request{};
    c.deadline = Clock::now() + std::chrono::seconds(2);
    watch(c, true);
  }

  // Parses the request line and headers in c.in[0, end). Throws Refuse.
  void parse_head(Conn& c, size_t end) {
    Request& r = c.req;
    std::string_view text(c.in.data(), end);
    size_t line_end = text.find('\n');
    std::string_view line = trim(text.substr(0, line_end));
    // Request line: METHOD SP target SP HTTP/1.x
    const size_t sp1 = line.find(' ');
    const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
      throw Refuse{400, "malformed request line"};
    r.method = std::string(line.substr(0, sp1));
    r.target = std::string(line.substr(sp1 + 1, sp2 - sp1 - 1));
    const std::string_view ver = line.substr(sp2 + 1);
    for (char ch : r.method)
      if (!is_tchar(static_cast<unsigned char>(ch))) throw Refuse{400, "malformed request method"};
    if (ver.size() != 8 || ver.substr(0, 5) != "HTTP/") throw Refuse{400, "malformed HTTP version"};
    if (ver == "HTTP/1.1") r.minor = 1;
    else if (ver == "HTTP/1.0") r.minor = 0;
    else throw Refuse{505, "only HTTP/1.0 and HTTP/1.1 are served"};
    if (r.target.empty()) throw Refuse{400, "empty request target"};
    for (unsigned char ch : r.target)
      if (ch <= 0x20 || ch == 0x7f) throw Refuse{400, "control character in the request target"};
    std::string_view t = r.target;
    if (t.rfind("http://", 0) == 0 || t.rfind("https://", 0) == 0) {
      // absolute-form: the path starts after the authority
      const size_t a = t.find("//") + 2;
      const size_t p = t.find('/', a);
      t = p == std::string_view::npos ? std::string_view("/") : t.substr(p);
    } else if (t[0] != '/' && !(r.method == "OPTIONS" && t == "*")) {
      throw Refuse{400, "malformed request target"};
    }
    const size_t q = t.find('?');
    r.path = percent_decode(t.substr(0, q));
    r.query = q == std::string_view::npos ? std::string() : std::string(t.substr(q + 1));

    // Header fields.
    size_t pos = line_end == std::string_view::npos ? end : line_end + 1;
    while (pos < end) {
      size_t e = text.find('\n', pos);
      if (e == std::string_view::npos) e = end;
      std::string_view h = text.substr(pos, e - pos);
      pos = e + 1;
      if (!h.empty() && h.back() == '\r') h.remove_suffix(1);
      if (h.empty()) break;
      if (h[0] == ' ' || h[0] == '\t') throw Refuse{400, "obsolete header line folding"};
      const size_t colon = h.find(':');
      if (colon == std::string_view::npos || colon == 0) throw Refuse{400, "malformed header line"};
      for (size_t i = 0; i < colon; ++i)
        if (!is_tchar(static_cast<unsigned char>(h[i]))) throw Refuse{400, "malformed header name"};
      if (r.headers.size() >= opt.max_headers) throw Refuse{431, "too many header fields"};
      r.headers.emplace_back(lower(h.substr(0, colon)), std::string(trim(h.substr(colon + 1))));
    }

    const std::string conn = lower(r.header("connection"));
    r.keep_alive = r.minor >= 1 ? conn.find("close") == std::string::npos : conn.find("keep-alive") != std::string::npos;

    // Body framing (RFC 9112 §6). A length that cannot be trusted is refused, never guessed.
    bool have_cl = false;
    unsigned long long cl = 0;
    for (const auto& [k, v] : r.headers) {
      if (k != "content-length") continue;
      if (v.empty()) throw Refuse{400, "empty Content-Length"};
      unsigned long long x = 0;
      bool huge = false;
      for (char ch : v) {
        if (ch < '0' || ch > '9') throw Refuse{400, "Content-Length must be a non-negative decimal integer, got '" + v.substr(0, 40) + "'"};
        if (x > (~0ull - 9) / 10) huge = true;
        else x = x * 10 + static_cast<unsigned>(ch - '0');
      }
      if (huge) x = ~0ull;
      if (have_cl && x != cl) throw Refuse{400, "conflicting Content-Length headers"};
      have_cl = true;
      cl = x;
    }
    bool te = false;
    for (const auto& [k, v] : r.headers) {
      if (k != "transfer-encoding") continue;
      if (te || lower(v) != "chunked") throw Refuse{501, "only 'Transfer-Encoding: chunked' is supported"};
      te = true;
    }
    if (te && have_cl) throw Refuse{400, "both Content-Length and Transfer-Encoding sent"};
    if (te && r.minor == 0) throw Refuse{400, "chunked transfer coding in an HTTP/1.0 request"};
    c.chunked = te;
    c.need = 0;
    c.ck = Conn::Ck::kSize;
    if (have_cl) {
      if (cl > opt.max_body)
        throw Refuse{413, "Content-Length " + (cl == ~0ull ? std::string("beyond 2^64") : std::to_string(cl)) + " is over the limit"};
      c.need = static_cast<size_t>(cl);
    } else if (!te && (r.method == "POST" || r.method == "PUT" || r.method == "PATCH")) {
      throw Refuse{411, "a " + r.method + " request needs Content-Length or chunked transfer coding"};
    }
    const std::string expect = lower(r.header("expect"));
    if (!expect.empty() && expect != "100-continue") throw Refuse{417, "unsupported Expect"};
  }

  // Decodes chunked body bytes from c.in. Returns true when the body (and trailers) are complete.
  // Consumes what it decoded. Throws Refuse.
  bool decode_chunks(Conn& c) {
    size_t p = 0;
    std::string& in = c.in;
    for (;;) {
      switch (c.ck) {
        case Conn::Ck::kSize: {
          const size_t e = in.find('\n', p);
          if (e == std::string::npos) {
            if (in.size() - p > 1024) throw Refuse{400, "malformed chunk size line"};
            in.erase(0, p);
            return false;
          }
          std::string_view line(in.data() + p, e - p);
          if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
          const size_t semi = line.find(';');
          std::string_view hex = trim(line.substr(0, semi));
          if (hex.empty()) throw Refuse{400, "malformed chunk size"};
          unsigned long long n = 0;
          bool huge = false;
          for (char ch : hex) {
            const int v = hexval(ch);
            if (v < 0) throw Refuse{400, "malformed chunk size '" + std::string(hex.substr(0, 20)) + "'"};
            if (n >> 60) huge = true;
            else n = n * 16 + static_cast<unsigned>(v);
          }
          if (huge || n > opt.max_body || c.req.body.size() + n > opt.max_body) throw Refuse{413, "chunked body over the limit"};
          p = e + 1;
          if (n == 0) {
            c.ck = Conn::Ck::kTrailer;
          } else {
            c.chunk_left = static_cast<size_t>(n);
            c.ck = Conn::Ck::kData;
          }
          break;
        }
        case Conn::Ck::kData: {
          const size_t take = std::min(c.chunk_left, in.size() - p);
          c.req.body.append(in, p, take);
          p += take;
          c.chunk_left -= take;
          if (c.chunk_left > 0) {
            in.erase(0, p);
            return false;
          }
          c.ck = Conn::Ck::kDataEnd;
          break;
        }
        case Conn::Ck::kDataEnd: {
          if (in.size() - p < 1) {
            in.erase(0, p);
            return false;
          }
          if (in[p] == '\n') {
            p += 1;
          } else if (in[p] == '\r') {
            if (in.size() - p < 2) {
              in.erase(0, p);
              return false;
            }
            if (in[p + 1] != '\n') throw Refuse{400, "chunk data not followed by CRLF"};
            p += 2;
          } else {
            throw Refuse{400, "chunk data longer than its size"};
          }
          c.ck = Conn::Ck::kSize;
          break;
        }
        case Conn::Ck::kTrailer: {
          const size_t e = in.find('\n', p);
          if (e == std::string::npos) {
            if (in.size() - p > opt.max_header) throw Refuse{431, "chunked trailers too large"};
            in.erase(0, p);
            return false;
          }
          std::string_view line(in.data() + p, e - p);
          p = e + 1;
          if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
          if (line.empty()) {
            in.erase(0, p);
            return true;
          }
          break;  // trailer fields are read and dropped
        }
      }
    }
  }

  // Advances the connection's state machine on its buffered bytes; dispatches a complete request.
  void progress(Conn& c) {
    try {
      for (;;) {
        if (c.st == Conn::St::kIdle) {
          // Blank lines before a request are allowed (RFC 9112 §2.2).
          size_t skip = 0;
          while (skip < c.in.size() && (c.in[skip] == '\r' || c.in[skip] == '\n')) ++skip;
          if (skip) c.in.erase(0, skip);
          if (c.in.empty()) return;
          c.st = Conn::St::kHeaders;
          c.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(opt.header_timeout_s * 1000));
          c.req = Request{};
        }
        if (c.st == Conn::St::kHeaders) {
          // Bytes that cannot start an HTTP request (TLS, binary) are refused at the first byte.
          if (!is_tchar(static_cast<unsigned char>(c.in[0]))) throw Refuse{400, "not an HTTP request"};
          size_t end = c.in.find("\r\n\r\n");
          size_t body_at = end == std::string::npos ? end : end + 4;
          if (const size_t lf = c.in.find("\n\n"); lf != std::string::npos && (end == std::string::npos || lf < end)) {
            end = lf;
            body_at = lf + 2;
          }
          if (end == std::string::npos) {
            if (c.in.size() > opt.max_header) throw Refuse{431, "request headers over " + std::to_string(opt.max_header) + " bytes"};
            // A complete first line that is not a request line is refused without waiting for more.
            if (const size_t lf = c.in.find('\n'); lf != std::string::npos) {
              std::string_view first(c.in.data(), lf);
              if (first.find(" HTTP/") == std::string_view::npos) throw Refuse{400, "malformed request line"};
            }
            return;
          }
          if (end > opt.max_header) throw Refuse{431, "request headers over " + std::to_string(opt.max_header) + " bytes"};
          parse_head(c, end + 1);
          c.in.erase(0, body_at);
          c.st = Conn::St::kBody;
          c.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(opt.body_timeout_s * 1000));
          const bool body_pending = c.chunked || c.need > c.in.size();
          if (body_pending && c.req.header("expect") == "100-continue")
            send_all(c.fd, "HTTP/1.1 100 Continue\r\n\r\n", 1.0);
          // Grown as bytes arrive rather than reserved from the announced length: a client that
          // announces 32 MiB and sends nothing costs nothing.
        }
        if (c.st == Conn::St::kBody) {
          bool complete = false;
          if (c.chunked) {
            complete = decode_chunks(c);
          } else {
            const size_t take = std::min(c.need, c.in.size());
            c.req.body.append(c.in, 0, take);
            c.in.erase(0, take);
            c.need -= take;
            complete = c.need == 0;
          }
          if (!complete) return;
          dispatch(c);
          return;
        }
        return;  // kBusy
      }
    } catch (const Refuse& r) {
      refuse(c, r);
    }
  }

  void dispatch(Conn& c) {
    c.st = Conn::St::kBusy;
    watch(c, false);
    if (c.in.capacity() > (256u << 10) && c.in.size() < (64u << 10)) c.in.shrink_to_fit();
    auto req = std::make_shared<Request>(std::move(c.req));
    c.req = Request{};
    req->fd = c.fd;
    req->remote_addr = c.remote_addr;
    req->remote_port = c.remote_port;
    req->local_port = c.local_port;
    Conn* cp = &c;
    pool->submit([this, cp, req] {
      Response res;
      bool keep = true;
      try {
        handler(*req, res);
      } catch (...) {
        res = Response{};
        on_error(*req, 500, "internal error", res);
      }
      const size_t big = req->body.size() + res.body.size();
      keep = write_response(*req, res, keep);
      // A large request leaves freed pages in the allocator's arenas; hand them back to the system
      // so that a burst of big requests does not leave the process at its peak size.
      req->body = std::string();
      res = Response{};
      if (big > (1u << 20)) malloc_trim(0);
      {
        std::lock_guard lk(done_m);
        done.emplace_back(cp, keep);
      }
      wake();
    });
  }

  void finish_done() {
    std::vector<std::pair<Conn*, bool>> d;
    {
      std::lock_guard lk(done_m);
      d.swap(done);
    }
    for (auto [c, keep] : d) {
      if (!keep || stopping) {
        close_conn(c->fd);
        continue;
      }
      c->st = Conn::St::kIdle;
      c->deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(opt.keepalive_timeout_s * 1000));
      watch(*c, true);
      progress(*c);  // a pipelined request may be waiting in the buffer
    }
  }

  void accept_all() {
    for (int i = 0; i < 512; ++i) {
      sockaddr_storage peer{};
      socklen_t pl = sizeof peer;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE) {
          // The pending connection stays readable on the listening socket: stop watching it for a
          // moment rather than spinning on it.
          PG_WARN("http: out of file descriptors (%zu connections open)", conns.size());
          epoll_ctl(ep, EPOLL_CTL_DEL, listen_fd, nullptr);
          accept_paused = true;
        }
        return;
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      addr_of(peer, c->remote_addr, c->remote_port);
      sockaddr_storage self{};
      socklen_t sl = sizeof self;
      std::string ignored;
      if (getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl) == 0) addr_of(self, ignored, c->local_port);
      c->deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(opt.keepalive_timeout_s * 1000));
      Conn& ref = *c;
      conns.emplace(fd, std::move(c));
      n_conns = conns.size();
      if (conns.size() > opt.max_connections) {
        refuse(ref, Refuse{503, "too many open connections"});
        continue;
      }
      watch(ref, true);
    }
  }

  void on_readable(Conn& c) {
    if (c.st == Conn::St::kBusy) return;
    char buf[64 << 10];
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (c.st == Conn::St::kDrain) {
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) close_conn(c.fd);
      return;
    }
    if (n == 0) {
      close_conn(c.fd);
      return;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      close_conn(c.fd);
      return;
    }
    c.in.append(buf, static_cast<size_t>(n));
    if (c.st == Conn::St::kBody)
      c.deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(opt.body_timeout_s * 1000));
    progress(c);
  }

  void sweep() {
    const auto now = Clock::now();
    if (accept_paused) {
      accept_paused = false;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = listen_fd;
      epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd, &ev);
    }
    std::vector<int> expired;
    for (auto& [fd, c] : conns)
      if (c->st != Conn::St::kBusy && now > c->deadline) expired.push_back(fd);
    for (int fd : expired) {
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      Conn& c = *it->second;
      if (c.st == Conn::St::kIdle || c.st == Conn::St::kDrain) close_conn(fd);  // nothing to answer
      else refuse(c, Refuse{408, c.st == Conn::St::kHeaders ? "request headers not received in time" : "request body not received in time"});
    }
  }

  void loop() {
    epoll_event evs[256];
    auto last_sweep = Clock::now();
    while (!stopping) {
      const int n = epoll_wait(ep, evs, 256, 200);
      for (int i = 0; i < n; ++i) {
        const int fd = evs[i].data.fd;
        if (fd == listen_fd) {
          accept_all();
        } else if (fd == wake_fd) {
          uint64_t v;
          [[maybe_unused]] const ssize_t r = ::read(wake_fd, &v, sizeof v);
        } else {
          auto it = conns.find(fd);
          if (it != conns.end()) on_readable(*it->second);
        }
      }
      finish_done();
      if (Clock::now() - last_sweep > std::chrono::milliseconds(200)) {
        last_sweep = Clock::now();
        sweep();
      }
    }
    // Shutting down: requests still running see their connections close (and cancel); then every
    // worker is waited for.
    for (auto& [fd, c] : conns)
      if (c->st == Conn::St::kBusy) ::shutdown(fd, SHUT_RDWR);
    pool->shutdown();
    finish_done();
    std::vector<int> fds;
    for (auto& [fd, c] : conns) fds.push_back(fd);
    for (int fd : fds) close_conn(fd);
  }
};

HttpServer::HttpServer(Options opt, Handler handler, ErrorHandler on_error)
    : impl_(std::make_unique<Impl>(std::move(opt), std::move(handler), std::move(on_error))) {}

HttpServer::~HttpServer() {
  stop();
}

int HttpServer::bind(const std::string& host, int port) {
  Impl& s = *impl_;
  // Room for every connection the server is meant to hold: raise the soft descriptor limit to the
  // hard one (commonly 1024 soft, far more hard).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    if (rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
    // Refuse connections (503) before accept() runs out of descriptors; the rest are kept for
    // model files and the like.
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur > 128)
      s.opt.max_connections = std::min<size_t>(s.opt.max_connections, static_cast<size_t>(rl.rlim_cur) - 64);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string h = host.size() > 2 && host.front() == '[' && host.back() == ']' ? host.substr(1, host.size() - 2) : host;
  const std::string p = std::to_string(port);
  if (getaddrinfo(h.empty() ? nullptr : h.c_str(), p.c_str(), &hints, &res) != 0 || !res)
    throw Error("cannot listen on " + host + ": unknown address");
  int fd = -1;
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, s.opt.backlog) == 0) break;
    ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0)
    throw Error("cannot listen on " + host + ":" + (port == 0 ? std::string("(any port)") : p) + " (address in use or not available)");
  sockaddr_storage self{};
  socklen_t sl = sizeof self;
  getsockname(fd, reinterpret_cast<sockaddr*>(&self), &sl);
  std::string a;
  int bound = port;
  addr_of(self, a, bound);
  s.listen_fd = fd;
  s.ep = epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (s.ep < 0 || s.wake_fd < 0) throw Error(std::string("epoll: ") + std::strerror(errno));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  epoll_ctl(s.ep, EPOLL_CTL_ADD, fd, &ev);
  ev.data.fd = s.wake_fd;
  epoll_ctl(s.ep, EPOLL_CTL_ADD, s.wake_fd, &ev);
  return bound;
}

void HttpServer::run() {
  Impl& s = *impl_;
  if (s.listen_fd < 0) throw Error("HttpServer::run before bind");
  s.is_running = true;
  s.loop();
  s.is_running = false;
}

void HttpServer::stop() {
  if (!impl_) return;
  impl_->stopping = true;
  if (impl_->wake_fd >= 0) impl_->wake();
}

bool HttpServer::running() const { return impl_->is_running; }

Stats HttpServer::stats() const {
  Stats st;
  st.connections = impl_->n_conns;
  st.workers = impl_->pool->threads();
  st.busy = impl_->pool->busy();
  return st;
}

}  // namespace pg::server::http
