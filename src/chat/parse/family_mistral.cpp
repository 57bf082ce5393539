// Mistral: [TOOL_CALLS] then either a JSON list of call objects (Nemo: [{"name": ..., "arguments": {...}, "id": ...}])
// or, in the newer templates (Small 3.2, Devstral, Ministral 3), NAME[ARGS]{...} with an optional [CALL_ID]id before
// [ARGS]; each further call repeats [TOOL_CALLS]. Reasoning (Ministral 3 / Magistral) is [THINK]...[/THINK].
#include "chat/parse/parser_core.h"

namespace pg::chat::detail {

namespace {

constexpr std::string_view kToolCalls = "[TOOL_CALLS]";
constexpr std::string_view kArgs = "[ARGS]";
constexpr std::string_view kCallId = "[CALL_ID]";
constexpr size_t kNameWindow = 256;

class MistralParser final : public ParserCore {
 public:
  MistralParser(const ChatFormat& f, ParserOptions o) : ParserCore(f, std::move(o)) {}

 protected:
  bool body_step() override;

 private:
  enum class S : uint8_t { kContent, kHead, kName, kCallId, kArgsStart, kArgs, kJson, kArr, kArrAfter, kResync };
  void fail_block(size_t at, const char* why);
  void start_object(size_t at, bool in_array);

  const std::vector<std::string> triggers_{std::string(kToolCalls)};
  S s_ = S::kContent;
  size_t cur_ = 0;
  bool block_committed_ = false;
  bool in_array_ = false;
  bool skipped_noted_ = false;
  std::string name_;
  std::unique_ptr<CallObjectParser> obj_;
  std::unique_ptr<ArgsStreamer> args_;
};

void MistralParser::fail_block(size_t at, const char* why) {
  if (!block_committed_) {
    degrade(at);
    cur_ = pos_;
    s_ = S::kContent;
    return;
  }
  error(std::string("tool calls: ") + why + "; skipped to the next [TOOL_CALLS]");
  pos_ = cur_ = at;
  s_ = S::kResync;
}

void MistralParser::start_object(size_t at, bool in_array) {
  obj_ = std::make_unique<CallObjectParser>(*this, false);
  cur_ = at;
  in_array_ = in_array;
  s_ = S::kJson;
}

bool MistralParser::body_step() {
  switch (s_) {
    case S::kContent: {
      if (!tools_enabled()) {
        if (pos_ == end()) return false;
        content(view(pos_, end()));
        pos_ = end();
        return true;
      }
      const ScanHit h = scan(pos_, triggers_);
      const bool progressed = h.safe_end > pos_;
      content(view(pos_, h.safe_end));
      pos_ = h.safe_end;
      if (h.which < 0) return progressed;
      cur_ = pos_ + kToolCalls.size();
      block_committed_ = false;
      skipped_noted_ = false;
      s_ = S::kHead;
      return true;
    }

    case S::kHead: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        fail_block(end(), "nothing after [TOOL_CALLS]");
        return true;
      }
      if (at(c) == '[') {
        cur_ = c + 1;
        s_ = S::kArr;
      } else if (at(c) == '{') {
        start_object(c, false);
      } else {
        cur_ = c;
        s_ = S::kName;
      }
      return true;
    }

    case S::kName: {
      const size_t a = find(cur_, cur_ + kNameWindow + kArgs.size(), kArgs);
      const size_t b = find(cur_, cur_ + kNameWindow + kCallId.size(), kCallId);
      if (a == std::string_view::npos && b == std::string_view::npos) {
        if (!eof() && end() < cur_ + kNameWindow + kCallId.size()) return false;
        fail_block(cur_, "no [ARGS] after the tool name");
        return true;
      }
      const bool with_id = b != std::string_view::npos && (a == std::string_view::npos || b < a);
      const size_t p = with_id ? b : a;
      name_ = std::string(trim(view(cur_, p)));
      if (!plausible_tool_name(name_)) {
        fail_block(cur_, "bad tool name");
        return true;
      }
      cur_ = p + (with_id ? kCallId.size() : kArgs.size());
      s_ = with_id ? S::kCallId : S::kArgsStart;
      return true;
    }

    case S::kCallId: {
      // The model's own id is not used: ids are generated (9 alphanumerics) so they are unique within the reply.
      const size_t a = find(cur_, cur_ + 64 + kArgs.size(), kArgs);
      if (a == std::string_view::npos) {
        if (!eof() && end() < cur_ + 64 + kArgs.size()) return false;
        fail_block(cur_, "no [ARGS] after [CALL_ID]");
        return true;
      }
      cur_ = a + kArgs.size();
      s_ = S::kArgsStart;
      return true;
    }

    case S::kArgsStart: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        fail_block(end(), "no arguments after [ARGS]");
        return true;
      }
      if (at(c) != '{') {
        fail_block(c, "arguments are not a JSON object");
        return true;
      }
      begin_call(name_);
      block_committed_ = true;
      args_ = std::make_unique<ArgsStreamer>(*this);
      pos_ = cur_ = c;
      s_ = S::kArgs;
      return true;
    }

    case S::kArgs: {
      bool moved = false;
      switch (drive_args(*args_, cur_, moved)) {
        case ArgsResult::kMore:
          return moved;
        case ArgsResult::kDone:
          s_ = S::kContent;
          return true;
        case ArgsResult::kBroken:
          s_ = S::kResync;
          return true;
      }
      return false;
    }

    case S::kJson: {
      const bool moved = drive(*obj_, cur_);
      switch (obj_->status()) {
        case CallObjectParser::Status::kMore:
          if (obj_->committed()) pos_ = cur_;
          return moved;
        case CallObjectParser::Status::kDone:
          block_committed_ = true;
          pos_ = cur_;
          s_ = in_array_ ? S::kArrAfter : S::kContent;
          return true;
        case CallObjectParser::Status::kRejected:
          fail_block(cur_, "not a tool call object");
          return true;
        case CallObjectParser::Status::kBroken:
          block_committed_ = true;
          pos_ = cur_;
          s_ = S::kResync;
          return true;
      }
      return false;
    }

    case S::kArr:
    case S::kArrAfter: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        fail_block(end(), "unclosed list of tool calls");
        return true;
      }
      const unsigned char ch = at(c);
      if (ch == ']') {
        pos_ = cur_ = c + 1;
        s_ = S::kContent;
      } else if (s_ == S::kArr && ch == '{') {
        start_object(c, true);
      } else if (s_ == S::kArrAfter && ch == ',') {
        cur_ = c + 1;
        s_ = S::kArr;
      } else {
        fail_block(c, "malformed list of tool calls");
      }
      return true;
    }

    case S::kResync: {
      const ScanHit h = scan(cur_, triggers_);
      if (!skipped_noted_ && !trim(view(cur_, h.safe_end)).empty()) {
        error("text after a broken tool call skipped");
        skipped_noted_ = true;
      }
      const bool progressed = h.safe_end > cur_;
      pos_ = cur_ = h.safe_end;
      if (h.which >= 0) {
        s_ = S::kContent;
        return true;
      }
      return progressed;
    }
  }
  return false;
}

}  // namespace

std::unique_ptr<ParserCore> make_mistral_parser(const ChatFormat& format, ParserOptions options) {
  return std::make_unique<MistralParser>(format, std::move(options));
}

}  // namespace pg::chat::detail
