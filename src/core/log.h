// Logs go to stderr so that stdout carries only program output (generated text, token ids).
#pragma once
#include <cstdio>
#include <string_view>

namespace pg {

enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3, Silent = 4 };

void set_log_level(LogLevel level);
LogLevel log_level();
void log_line(LogLevel level, std::string_view msg);

#define PG_LOG(level, ...)                                   \
  do {                                                       \
    if ((level) >= ::pg::log_level()) {                      \
      char pg_log_buf_[1024];                                \
      std::snprintf(pg_log_buf_, sizeof pg_log_buf_, __VA_ARGS__); \
      ::pg::log_line((level), pg_log_buf_);                  \
    }                                                        \
  } while (0)
#define PG_INFO(...) PG_LOG(::pg::LogLevel::Info, __VA_ARGS__)
#define PG_WARN(...) PG_LOG(::pg::LogLevel::Warn, __VA_ARGS__)
#define PG_DEBUG(...) PG_LOG(::pg::LogLevel::Debug, __VA_ARGS__)

}  // namespace pg
