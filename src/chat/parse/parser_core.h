// Internal machinery shared by the per-family output parsers (output_parser.h is the public face).
//
// Input is kept in one buffer addressed by absolute stream offsets. A family's state machine decides what the bytes
// from pos_ on are; bytes before pos_ are settled and may be discarded. While a family is unsure (a possible tag, a
// tool-call header not yet complete) it leaves pos_ at the start of the undecided text and scans ahead with its own
// cursor; if the guess fails, the text from pos_ is emitted as content ("degrade") and scanning resumes where it failed.
// Every decision depends only on the bytes seen, never on where chunks ended, which is what makes the result
// independent of chunking. Where a window bounds a search, the window is measured from a fixed start for the same reason.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "chat/parse/chat_format.h"
#include "chat/parse/json_scanner.h"
#include "chat/parse/output_parser.h"
#include "chat/parse/utf8.h"

namespace pg::chat::detail {

using json = nlohmann::ordered_json;

enum class Match { kNo, kPartial, kYes };

// Result of scanning for trigger strings: [from, safe_end) cannot be part of any trigger. which >= 0: trigger `which`
// starts at safe_end. which < 0: nothing found; bytes from safe_end on may start a trigger (held back unless at eof).
struct ScanHit {
  size_t safe_end = 0;
  int which = -1;
};

inline bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && is_space(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// A usable tool name: 1..256 bytes of valid UTF-8 without whitespace, control characters, quotes, brackets or markup
// characters. Between markers this keeps a stray "<function=" in prose from being taken for a call.
inline bool plausible_tool_name(std::string_view s) {
  if (s.empty() || s.size() > 256 || !valid_utf8(s)) return false;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= ' ' || c == 0x7F || c == '<' || c == '>' || c == '=' || c == '"' || c == '\'' || c == '`' || c == '{' || c == '}' ||
        c == '[' || c == ']' || c == '(' || c == ')' || c == ',' || c == ';') {
      return false;
    }
  }
  return true;
}

// Trims whitespace at both ends of a stream of text: leading whitespace is dropped, inner whitespace is released when
// the next non-whitespace byte arrives, trailing whitespace never. Repairs UTF-8 first.
class TextSink {
 public:
  void feed(std::string_view in, std::string& delta, std::string& total);
  void flush(std::string& delta, std::string& total);

 private:
  void put(std::string_view text, std::string& delta, std::string& total);
  Utf8Sanitizer utf8_;
  std::string clean_;       // scratch
  std::string pending_ws_;  // whitespace not yet known to be inner
  bool started_ = false;
};

class CallObjectParser;
class ArgsStreamer;

class ParserCore {
 public:
  ParserCore(const ChatFormat& format, ParserOptions options);
  virtual ~ParserCore() = default;

  Delta push(std::string_view chunk);
  Delta finish();
  const ParsedMessage& message() const { return msg_; }
  bool finished() const { return eof_; }

  // ---- input, for families and sub-parsers ----
  size_t end() const { return base_ + buf_.size(); }
  bool eof() const { return eof_; }
  unsigned char at(size_t i) const { return static_cast<unsigned char>(buf_[i - base_]); }
  std::string_view view(size_t a, size_t b) const { return std::string_view(buf_).substr(a - base_, b - a); }
  // kPartial: the buffer ends inside `lit` (only before eof).
  Match match(size_t at, std::string_view lit) const;
  size_t skip_ws(size_t at) const;
  ScanHit scan(size_t from, std::span<const std::string> triggers) const;
  // First occurrence of `needle` in [from, limit) (limit clipped to end()); npos if none.
  size_t find(size_t from, size_t limit, std::string_view needle) const;

  // ---- output ----
  void content(std::string_view text);
  void reasoning(std::string_view text);
  void begin_call(const std::string& name);
  void call_args(std::string_view text);
  void end_call();
  bool in_call() const { return call_open_; }
  void error(std::string msg);

  // ---- tools ----
  bool has_tools() const { return !tool_params_.empty(); }
  bool known_tool(const std::string& name) const { return tool_params_.count(name) != 0; }
  // The tool's "parameters" schema, or nullptr.
  const json* tool_parameters(const std::string& name) const;

  const ChatFormat& format() const { return format_; }
  const ParserOptions& options() const { return opts_; }
  bool tools_enabled() const { return opts_.parse_tool_calls; }

 protected:
  // One step of the family's state machine for the text after any reasoning block. Returns false when nothing more can
  // be done until more input arrives (or, at eof, when everything is consumed). Must make progress when returning true.
  virtual bool body_step() = 0;
  // Strings that also end a reasoning block (left for the body to parse): a model may skip </think> and go straight to
  // a tool call.
  virtual std::span<const std::string> reasoning_breakers() const { return {}; }
  // Text from pos_ to `fail` becomes content; parsing resumes at `fail`.
  void degrade(size_t fail);
  // Feeds `obj` the bytes from `cur` on (advancing `cur`), finishing it at eof. True if anything moved; the caller
  // then looks at obj.status().
  bool drive(CallObjectParser& obj, size_t& cur);
  // Streams the open call's arguments from `cur` (at its '{'), advancing `cur` and pos_. Ends the call when the value is
  // complete (kDone) or broken or cut off (kBroken: healed, error recorded). `moved` tells whether anything happened.
  enum class ArgsResult : uint8_t { kMore, kDone, kBroken };
  ArgsResult drive_args(ArgsStreamer& args, size_t& cur, bool& moved);

  size_t pos_ = 0;

 private:
  enum class RState : uint8_t { kStart, kReasoningStart, kReasoning, kBody };
  bool reasoning_step();
  void run();
  void compact();
  std::string next_id();

  ChatFormat format_;
  ParserOptions opts_;
  std::map<std::string, json> tool_params_;
  std::string buf_;  // input bytes [base_, base_ + buf_.size())
  size_t base_ = 0;
  bool eof_ = false;
  RState rstate_ = RState::kStart;
  std::vector<std::string> reasoning_end_;  // think_close + reasoning_breakers()

  ParsedMessage msg_;
  Delta delta_;
  TextSink content_sink_, reasoning_sink_;
  bool call_open_ = false;
  std::mt19937_64 rng_;
};

// Streams one JSON value (tool-call arguments) through the core as it is validated: what is released is always a prefix
// that heal() can close. On a syntax error or truncation the healing suffix is released and the caller is told.
class ArgsStreamer {
 public:
  explicit ArgsStreamer(ParserCore& core) : core_(core) {}
  size_t feed(std::string_view in);  // consumes up to the end of the value or the bad byte
  void finish();                     // eof: completes a trailing number
  bool done() const { return sc_.done(); }
  bool failed() const { return sc_.failed(); }
  // Releases the healing suffix (after failed() or at eof when not done()).
  void heal();

 private:
  void release();
  ParserCore& core_;
  JsonScanner sc_;
  size_t released_ = 0;
};

// Parses {"name": "...", "arguments": {...}} (also "parameters"; other keys such as "type" or "id" are skipped) and
// streams it as a tool call. The call is begun when the arguments object starts, if the name is already known;
// otherwise (arguments first, or arguments as a JSON string) it is begun when the object is complete.
class CallObjectParser {
 public:
  enum class Status : uint8_t {
    kMore,      // needs more input
    kDone,      // call emitted; consumed up to and including the closing '}'
    kRejected,  // not a call and nothing emitted: the caller turns the text into content
    kBroken,    // emitted, then broke: arguments healed and call ended; the caller resynchronises
  };
  // require_known_name: with a non-empty tool list, a name not in it rejects the object (Llama's bare JSON, where a
  // JSON answer must not be mistaken for a call).
  CallObjectParser(ParserCore& core, bool require_known_name) : core_(core), require_known_(require_known_name) {}
  // Feeds bytes starting at the object's '{'. Returns bytes consumed (on kRejected/kBroken: up to the offending byte).
  size_t feed(std::string_view in);
  // eof: resolves a call cut short.
  void finish();
  Status status() const { return status_; }
  bool committed() const { return committed_; }

 private:
  enum class S : uint8_t { kOpen, kKeyOrEnd, kKey, kColon, kValueStart, kSkip, kName, kArgsStream, kArgsBuffer, kAfter };
  void reject() { status_ = committed_ ? Status::kBroken : Status::kRejected; }
  bool complete();  // at '}': emit if not yet, true on success

  ParserCore& core_;
  bool require_known_;
  S s_ = S::kOpen;
  Status status_ = Status::kMore;
  bool committed_ = false;
  bool have_name_ = false;
  bool have_args_ = false;
  std::string name_;
  std::string key_text_;
  std::unique_ptr<JsonScanner> sc_;     // key / name / skipped / buffered value
  std::unique_ptr<ArgsStreamer> args_;  // streamed arguments
  std::string buffered_args_;           // normalised JSON text of arguments seen before the name
};

std::unique_ptr<ParserCore> make_hermes_parser(const ChatFormat& format, ParserOptions options);
std::unique_ptr<ParserCore> make_llama3_parser(const ChatFormat& format, ParserOptions options);
std::unique_ptr<ParserCore> make_mistral_parser(const ChatFormat& format, ParserOptions options);
std::unique_ptr<ParserCore> make_deepseek_parser(const ChatFormat& format, ParserOptions options);
std::unique_ptr<ParserCore> make_gpt_oss_parser(const ChatFormat& format, ParserOptions options);

}  // namespace pg::chat::detail
