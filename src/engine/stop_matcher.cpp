#include "engine/stop_matcher.h"

#include <algorithm>

namespace pg::engine {

namespace {
const std::string kNone;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

const std::string& StopMatcher::which() const { return matched_ >= 0 ? stops_[static_cast<size_t>(matched_)] : kNone; }

std::string StopMatcher::push(std::string_view text) {
  if (matched()) return {};
  if (stops_.empty()) return std::string(text);
  held_.append(text);
  // The earliest occurrence wins; at the same position the longer stop string (it contains the other).
  size_t best = std::string::npos;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t p = held_.find(stops_[i]);
    if (p == std::string::npos) continue;
    if (p < best || (p == best && stops_[i].size() > stops_[static_cast<size_t>(matched_)].size())) {
      best = p;
      matched_ = static_cast<int>(i);
    }
  }
  if (best != std::string::npos) {
    std::string out = held_.substr(0, best);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string. Every shorter
  // candidate start lies inside it, so nothing released can begin a stop string.
  size_t keep = 0;
  for (const auto& s : stops_) {
    const size_t max_k = std::min(held_.size(), s.size() - 1);
    for (size_t k = max_k; k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (matched()) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace pg::engine
