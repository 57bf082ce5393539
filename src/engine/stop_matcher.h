// Stop strings matched on generated text as it streams: a stop string may be split over any number
// of tokens, and none of it may ever reach the client. Text that could still be the beginning of a
// stop string is held back until later text decides it.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace pg::engine {

class StopMatcher {
 public:
  StopMatcher() = default;
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  // Adds text; returns what is now safe to release. Once a stop string is found, the text before it
  // is returned, matched() turns true and everything after it is discarded.
  std::string push(std::string_view text);
  // End of generation without a match: the text still held back.
  std::string flush();

  bool matched() const { return matched_ >= 0; }
  const std::string& which() const;  // the stop string found ("" when none)
  size_t held() const { return held_.size(); }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // text not yet released: at most (longest stop − 1) bytes between calls
  int matched_ = -1;
};

}  // namespace pg::engine
