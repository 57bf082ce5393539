#include "server/conn_watch.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

namespace pg::server {

bool ConnWatch::gone() {
  if (gone_ || fd_ < 0) return gone_;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_check_ < std::chrono::milliseconds(1)) return false;
  last_check_ = now;
  pollfd p{};
  p.fd = fd_;
  p.events = POLLIN | POLLRDHUP;
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) {
    gone_ = true;
  } else if (p.revents & POLLIN) {
    char c;
    const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) gone_ = true;
  }
  return gone_;
}

}  // namespace pg::server
