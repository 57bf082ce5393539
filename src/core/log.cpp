#include "core/log.h"

#include <atomic>
#include <mutex>

namespace pg {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};
std::mutex g_mutex;
}  // namespace

void set_log_level(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

void log_line(LogLevel level, std::string_view msg) {
  static const char* kTags[] = {"debug", "info", "warn", "error", ""};
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "[%s] %.*s\n", kTags[static_cast<int>(level)], static_cast<int>(msg.size()), msg.data());
}

}  // namespace pg
