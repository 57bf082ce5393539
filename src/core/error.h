// One exception type for every user-facing failure: the message is the whole story, printed as one line.
#pragma once
#include <stdexcept>
#include <string>

namespace pg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Throws pg::Error when cond is false. msg is only built on failure.
#define PG_CHECK(cond, msg)                          \
  do {                                               \
    if (!(cond)) throw ::pg::Error(std::string(msg)); \
  } while (0)

}  // namespace pg
