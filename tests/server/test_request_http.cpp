// The HTTP layer (src/server/http.cpp) on a loopback socket, without a model: framing errors
// answered at once with the right status, chunked bodies decoded and bounded, pipelining in order,
// idle connections that do not hold workers. (tests/e2e/reliability.test.mjs covers the same rows
// against the whole server; this runs where node does not.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/http.h"

namespace pg::server::http {
namespace {

using Clock = std::chrono::steady_clock;

class HttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Options o;
    o.max_body = 1 << 16;
    o.max_workers = 4;
    srv_ = std::make_unique<HttpServer>(
        o,
        [this](Request& q, Response& r) {
          ++handled_;
          if (q.path == "/slow") std::this_thread::sleep_for(std::chrono::milliseconds(300));
          r.body = q.method + " " + q.path + " " + std::to_string(q.body.size()) + " " + q.body.substr(0, 16);
          r.content_type = "text/plain";
        },
        [](const Request&, int status, const std::string& why, Response& r) {
          r.status = status;
          r.body = why;
        });
    port_ = srv_->bind("127.0.0.1", 0);
    th_ = std::thread([this] { srv_->run(); });
  }
  void TearDown() override {
    srv_->stop();
    th_.join();
  }

  int dial() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    return fd;
  }

  // Sends `req`, reads until the server closes or `want` status lines arrived (or 3 s pass).
  std::string exchange(const std::string& req, int want = 1, double* ms = nullptr) const {
    const int fd = dial();
    const auto t0 = Clock::now();
    EXPECT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string out;
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 3000) <= 0) break;
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
      if (count(out) >= want && out.find("\r\n\r\n") != std::string::npos && complete(out, want)) break;
    }
    if (ms) *ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    close(fd);
    return out;
  }

  static int count(const std::string& s) {
    int n = 0;
    for (size_t p = s.find("HTTP/1.1 "); p != std::string::npos; p = s.find("HTTP/1.1 ", p + 1)) ++n;
    return n;
  }
  // The last of `want` responses has its whole Content-Length body.
  static bool complete(const std::string& s, int want) {
    size_t p = 0;
    for (int i = 0; i < want; ++i) {
      const size_t h = s.find("\r\n\r\n", p);
      if (h == std::string::npos) return false;
      const size_t cl = s.find("Content-Length: ", p);
      const size_t len = cl != std::string::npos && cl < h ? std::stoul(s.substr(cl + 16)) : 0;
      if (s.size() < h + 4 + len) return false;
      p = h + 4 + len;
    }
    return true;
  }
  static int status(const std::string& s) { return s.size() > 12 && s.rfind("HTTP/1.1 ", 0) == 0 ? std::stoi(s.substr(9, 3)) : -1; }

  std::unique_ptr<HttpServer> srv_;
  std::thread th_;
  int port_ = 0;
  std::atomic<int> handled_{0};
};

TEST_F(HttpTest, MalformedFramingIsAnsweredAtOnce) {
  const std::string post = "POST /x HTTP/1.1\r\nHost: h\r\n";
  const std::vector<std::pair<std::string, int>> cases = {
      {post + "Content-Length: -5\r\n\r\n", 400},
      {post + "Content-Length: 99999999999999999999\r\n\r\n", 413},
      {post + "Content-Length: 70000\r\n\r\n", 413},
      {post + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n", 400},
      {post + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {post + "Transfer-Encoding: gzip\r\n\r\n", 501},
      {post + "Transfer-Encoding: chunked\r\n\r\n-5\r\n", 400},
      {post + "Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {post + "Transfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n", 413},
      {post + "\r\n", 411},
      {std::string("\x16\x03\x01\x02\x00\x01", 6), 400},
      {"hello\r\n", 400},
      {"GET / HTTP/2.0\r\n\r\n", 505},
      {"GET /\tx HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\n folded\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nX: " + std::string(70000, 'a') + "\r\n\r\n", 431},
  };
  for (const auto& [req, want] : cases) {
    double ms = 0;
    const std::string r = exchange(req, 1, &ms);
    EXPECT_EQ(status(r), want) << req.substr(0, 80) << "\n" << r.substr(0, 200);
    EXPECT_LT(ms, 1000) << req.substr(0, 80);
    EXPECT_NE(r.find("Connection: close"), std::string::npos);
  }
  EXPECT_EQ(handled_.load(), 0);
}

TEST_F(HttpTest, ChunkedBodiesAreDecodedAndBounded) {
  const std::string r = exchange("POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nTrailer: x\r\n\r\n");
  EXPECT_EQ(status(r), 200) << r;
  EXPECT_NE(r.find("POST /c 11 hello world"), std::string::npos) << r;
  // Many small chunks whose total passes the limit: refused as soon as the total does.
  std::string big = "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 80; ++i) big += "400\r\n" + std::string(1024, 'a') + "\r\n";
  EXPECT_EQ(status(exchange(big)), 413);
}

TEST_F(HttpTest, PipelinedRequestsAreAnsweredInOrder) {
  const std::string r = exchange(
      "GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyzGET /slow HTTP/1.1\r\n\r\nGET /d HTTP/1.1\r\n\r\n", 4);
  const size_t a = r.find("GET /a 0"), b = r.find("POST /b 3 xyz"), c = r.find("GET /slow 0"), d = r.find("GET /d 0");
  ASSERT_NE(a, std::string::npos) << r;
  ASSERT_NE(b, std::string::npos) << r;
  ASSERT_NE(c, std::string::npos) << r;
  ASSERT_NE(d, std::string::npos) << r;
  EXPECT_TRUE(a < b && b < c && c < d) << r;
}

TEST_F(HttpTest, IdleAndSlowConnectionsHoldNoWorker) {
  // More idle and half-sent connections than workers (4), then a request on a new one.
  std::vector<int> fds;
  for (int i = 0; i < 64; ++i) {
    fds.push_back(dial());
    if (i % 2) send(fds.back(), "GET / HTTP/1.1\r\nX-Slow: a", 25, MSG_NOSIGNAL);
  }
  double ms = 0;
  const std::string r = exchange("GET /probe HTTP/1.1\r\n\r\n", 1, &ms);
  EXPECT_EQ(status(r), 200) << r;
  EXPECT_LT(ms, 1000);
  EXPECT_GE(srv_->stats().connections, 64u);
  EXPECT_LE(srv_->stats().workers, 4);
  for (int fd : fds) close(fd);
}

TEST_F(HttpTest, KeepAliveAndClose) {
  std::string r = exchange("GET /a HTTP/1.1\r\n\r\n");
  EXPECT_NE(r.find("Connection: keep-alive"), std::string::npos);
  r = exchange("GET /a HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_NE(r.find("Connection: close"), std::string::npos);
  r = exchange("GET /a HTTP/1.0\r\n\r\n");
  EXPECT_NE(r.find("Connection: close"), std::string::npos);
  r = exchange("GET /pa%20th?q=1 HTTP/1.1\r\n\r\n");
  EXPECT_NE(r.find("GET /pa th 0"), std::string::npos) << r;
}

TEST_F(HttpTest, RandomBytesNeverBreakTheServer) {
  // Mutations of valid requests and plain noise: every one gets an answer or a close, never a
  // crash or a hang, and the server keeps serving.
  std::mt19937 rng(15);
  const std::vector<std::string> seeds = {
      "GET /a HTTP/1.1\r\nHost: h\r\n\r\n",
      "POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
      "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
  };
  for (int i = 0; i < 300; ++i) {
    std::string m = seeds[i % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 6);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % (m.size() + 1);
      switch (rng() % 3) {
        case 0: m.insert(at, 1, static_cast<char>(rng() % 256)); break;
        case 1: if (at < m.size()) m.erase(at, 1); break;
        default: if (at < m.size()) m[at] = static_cast<char>(rng() % 256);
      }
    }
    if (i % 10 == 9) {
      m.resize(1 + rng() % 200);
      for (char& c : m) c = static_cast<char>(rng() % 256);
    }
    // Half-sent requests would wait for their deadline: end each with a close of the write side.
    const int fd = dial();
    send(fd, m.data(), m.size(), MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR);
    pollfd p{fd, POLLIN, 0};
    char buf[4096];
    const auto t0 = Clock::now();
    while (poll(&p, 1, 2000) > 0 && recv(fd, buf, sizeof buf, 0) > 0) {
    }
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.5) << i;
    close(fd);
  }
  EXPECT_EQ(status(exchange("GET /probe HTTP/1.1\r\n\r\n")), 200);
}

}  // namespace
}  // namespace pg::server::http
