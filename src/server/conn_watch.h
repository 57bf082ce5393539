// Notices that the client of a request has gone away, so its sequence can be cancelled while the
// model is still working (a non-streaming request writes nothing until the end, and a stream may be
// silent through a long prefill).
//
// The HTTP layer (http.h) hands each request its connection's socket; while the request runs
// nothing else reads it, so the watch polls it for a peer shutdown: POLLRDHUP / POLLHUP, or a
// readable socket whose peek reads end-of-file. A client that pipelines another request keeps the
// socket readable with data, which is not mistaken for EOF.
#pragma once
#include <chrono>

namespace pg::server {

class ConnWatch {
 public:
  ConnWatch() = default;  // watches nothing (gone() only reflects mark_gone())
  explicit ConnWatch(int fd) : fd_(fd) {}

  // True once the peer closed its side (polled at most every millisecond: a poll(2) of one socket
  // costs about a microsecond, and a small model can finish a whole answer within 20 ms).
  bool gone();
  void mark_gone() { gone_ = true; }
  bool found() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
  bool gone_ = false;
  std::chrono::steady_clock::time_point last_check_{};
};

}  // namespace pg::server
