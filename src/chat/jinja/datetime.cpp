// strftime_now() support: Python's datetime.strftime on glibc delegates to the C strftime except for
// %f, %z and %Z, which Python expands itself (empty for naive datetimes).
#include <chrono>
#include <cstdio>
#include <ctime>

#include "chat/jinja/jinja.h"

namespace pg::jinja {

namespace {

int parse_digits(std::string_view s, size_t& i, size_t n, const char* what) {
  if (i + n > s.size()) throw pg::Error(std::string("invalid ISO 8601 time: missing ") + what);
  int v = 0;
  for (size_t k = 0; k < n; ++k) {
    char c = s[i + k];
    if (c < '0' || c > '9') throw pg::Error(std::string("invalid ISO 8601 time: bad ") + what);
    v = v * 10 + (c - '0');
  }
  i += n;
  return v;
}

bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

int days_in_month(int y, int m) {
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && leap(y) ? 29 : kDays[m - 1];
}

// Days since 1970-01-01 (proleptic Gregorian).
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

std::tm to_tm(const DateTime& dt) {
  std::tm t{};
  t.tm_year = dt.year - 1900;
  t.tm_mon = dt.month - 1;
  t.tm_mday = dt.day;
  t.tm_hour = dt.hour;
  t.tm_min = dt.minute;
  t.tm_sec = dt.second;
  int64_t days = days_from_civil(dt.year, static_cast<unsigned>(dt.month), static_cast<unsigned>(dt.day));
  t.tm_wday = static_cast<int>(((days % 7) + 11) % 7);  // 1970-01-01 was a Thursday
  t.tm_yday = static_cast<int>(days - days_from_civil(dt.year, 1, 1));
  t.tm_isdst = -1;
  return t;
}

}  // namespace

DateTime parse_iso8601(std::string_view s) {
  DateTime dt;
  size_t i = 0;
  dt.year = parse_digits(s, i, 4, "year");
  bool basic = i < s.size() && s[i] != '-';
  if (!basic) ++i;
  dt.month = parse_digits(s, i, 2, "month");
  if (!basic) {
    if (i >= s.size() || s[i] != '-') throw pg::Error("invalid ISO 8601 time: expected '-'");
    ++i;
  }
  dt.day = parse_digits(s, i, 2, "day");
  if (dt.month < 1 || dt.month > 12 || dt.day < 1 || dt.day > days_in_month(dt.year, dt.month) || dt.year < 1)
    throw pg::Error("invalid ISO 8601 date: out of range");
  if (i < s.size()) {
    if (s[i] != 'T' && s[i] != ' ' && s[i] != 't') throw pg::Error("invalid ISO 8601 time: expected 'T'");
    ++i;
    dt.hour = parse_digits(s, i, 2, "hour");
    if (i < s.size() && (s[i] == ':' || (s[i] >= '0' && s[i] <= '9'))) {
      if (s[i] == ':') ++i;
      dt.minute = parse_digits(s, i, 2, "minute");
      if (i < s.size() && (s[i] == ':' || (s[i] >= '0' && s[i] <= '9'))) {
        if (s[i] == ':') ++i;
        dt.second = parse_digits(s, i, 2, "second");
        if (i < s.size() && (s[i] == '.' || s[i] == ',')) {
          ++i;
          int digits = 0, us = 0;
          while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
            if (digits < 6) us = us * 10 + (s[i] - '0');
            ++digits;
            ++i;
          }
          if (digits == 0) throw pg::Error("invalid ISO 8601 time: empty fraction");
          for (int k = digits; k < 6; ++k) us *= 10;
          dt.microsecond = us;
        }
      }
    }
    if (dt.hour > 23 || dt.minute > 59 || dt.second > 59) throw pg::Error("invalid ISO 8601 time: out of range");
    if (i < s.size()) {
      if (s[i] == 'Z' || s[i] == 'z') {
        dt.tz_offset_min = 0;
        ++i;
      } else if (s[i] == '+' || s[i] == '-') {
        int sign = s[i] == '-' ? -1 : 1;
        ++i;
        int h = parse_digits(s, i, 2, "offset hours"), m = 0;
        if (i < s.size()) {
          if (s[i] == ':') ++i;
          m = parse_digits(s, i, 2, "offset minutes");
        }
        if (h > 23 || m > 59) throw pg::Error("invalid ISO 8601 time: bad offset");
        dt.tz_offset_min = sign * (h * 60 + m);
      }
    }
  }
  if (i != s.size()) throw pg::Error("invalid ISO 8601 time: trailing characters '" + std::string(s.substr(i)) + "'");
  return dt;
}

DateTime local_now() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm lt{};
  localtime_r(&t, &lt);
  auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  DateTime dt;
  dt.year = lt.tm_year + 1900;
  dt.month = lt.tm_mon + 1;
  dt.day = lt.tm_mday;
  dt.hour = lt.tm_hour;
  dt.minute = lt.tm_min;
  dt.second = lt.tm_sec;
  dt.microsecond = static_cast<int>(us < 0 ? us + 1000000 : us);
  return dt;
}

std::string strftime(const DateTime& dt, std::string_view fmt) {
  std::tm t = to_tm(dt);
  std::string out;
  char buf[512];
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c != '%' || i + 1 >= fmt.size()) {
      out.push_back(c);
      continue;
    }
    // A directive, possibly with a glibc flag (%-d, %_H, %0e, %^a, %#Z) and width.
    size_t j = i + 1;
    while (j < fmt.size() && (fmt[j] == '-' || fmt[j] == '_' || fmt[j] == '0' || fmt[j] == '^' || fmt[j] == '#')) ++j;
    while (j < fmt.size() && fmt[j] >= '0' && fmt[j] <= '9') ++j;
    if (j < fmt.size() && (fmt[j] == 'E' || fmt[j] == 'O')) ++j;
    if (j >= fmt.size()) {
      out.append(fmt.substr(i));
      break;
    }
    char d = fmt[j];
    std::string directive(fmt.substr(i, j - i + 1));
    i = j;
    if (d == 'f' && directive == "%f") {
      std::snprintf(buf, sizeof buf, "%06d", dt.microsecond);
      out += buf;
      continue;
    }
    if ((d == 'z' || d == 'Z') && directive.size() == 2) {
      if (!dt.tz_offset_min) continue;  // naive datetime: empty
      int off = *dt.tz_offset_min;
      char sign = off < 0 ? '-' : '+';
      int a = off < 0 ? -off : off;
      if (d == 'z') {
        std::snprintf(buf, sizeof buf, "%c%02d%02d", sign, a / 60, a % 60);
      } else if (off == 0) {
        std::snprintf(buf, sizeof buf, "UTC");
      } else {
        std::snprintf(buf, sizeof buf, "UTC%c%02d:%02d", sign, a / 60, a % 60);
      }
      out += buf;
      continue;
    }
    // glibc copies unknown directives as written; 0 means an empty expansion.
    size_t n = std::strftime(buf, sizeof buf, directive.c_str(), &t);
    out.append(buf, n);
  }
  return out;
}

}  // namespace pg::jinja
