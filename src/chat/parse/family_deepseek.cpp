// DeepSeek R1 / V3 / V3.1 tool calls. A block opens with <｜tool▁calls▁begin｜> and closes with <｜tool▁calls▁end｜>;
// each call is <｜tool▁call▁begin｜>...<｜tool▁call▁end｜>, in one of two shapes:
//   R1/V3:  function<｜tool▁sep｜>NAME\n```json\n{...}\n```
//   V3.1:   NAME<｜tool▁sep｜>{...}
// The byte after the separator tells them apart ('{' means V3.1). R1 distills sometimes misspell the block token; the
// spellings seen in practice are accepted, and a call token without the block token opens a block too.
#include "chat/parse/parser_core.h"

namespace pg::chat::detail {

namespace {

// "｜" is U+FF5C and "▁" U+2581 in the tokenizer's special tokens.
#define PG_BAR "\xEF\xBD\x9C"
#define PG_SP "\xE2\x96\x81"
const std::string kCallsBegin = "<" PG_BAR "tool" PG_SP "calls" PG_SP "begin" PG_BAR ">";
const std::string kCallBegin = "<" PG_BAR "tool" PG_SP "call" PG_SP "begin" PG_BAR ">";
const std::string kSep = "<" PG_BAR "tool" PG_SP "sep" PG_BAR ">";
const std::string kCallEnd = "<" PG_BAR "tool" PG_SP "call" PG_SP "end" PG_BAR ">";
const std::string kCallsEnd = "<" PG_BAR "tool" PG_SP "calls" PG_SP "end" PG_BAR ">";
const std::vector<std::string> kBlockOpeners = {
    kCallsBegin,
    "<" PG_BAR "tool_calls_begin" PG_BAR ">",
    "<" PG_BAR "tool calls begin" PG_BAR ">",
    "<" PG_BAR "tool\\_calls\\_begin" PG_BAR ">",
    "<" PG_BAR "tool" PG_SP "calls" PG_BAR ">",
};
#undef PG_BAR
#undef PG_SP

constexpr size_t kHeadWindow = 256;

class DeepSeekParser final : public ParserCore {
 public:
  DeepSeekParser(const ChatFormat& f, ParserOptions o) : ParserCore(f, std::move(o)) {
    triggers_ = kBlockOpeners;
    triggers_.push_back(kCallBegin);
    if (tools_enabled()) breakers_ = triggers_;
    resync_ = {kCallEnd, kCallsEnd};
  }

 protected:
  bool body_step() override;
  std::span<const std::string> reasoning_breakers() const override { return breakers_; }

 private:
  enum class S : uint8_t { kContent, kCalls, kHead, kAfterSep, kName, kFence, kArgsStart, kArgs, kTail, kResync };
  void fail_block(size_t at, const char* why);

  std::vector<std::string> triggers_, breakers_, resync_;
  S s_ = S::kContent;
  size_t cur_ = 0;
  bool block_committed_ = false;
  bool skipped_noted_ = false;
  bool fenced_ = false;  // R1 shape: arguments inside ```json ... ```
  std::string head_;     // text between the call token and the separator
  std::string name_;
  std::unique_ptr<ArgsStreamer> args_;
};

void DeepSeekParser::fail_block(size_t at, const char* why) {
  if (!block_committed_) {
    degrade(at);
    cur_ = pos_;
    s_ = S::kContent;
    return;
  }
  error(std::string("tool call: ") + why + "; skipped to the next call");
  pos_ = cur_ = at;
  s_ = S::kResync;
}

bool DeepSeekParser::body_step() {
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
      pos_ = cur_ = h.safe_end;
      if (h.which < 0) return progressed;
      // A bare call token is left for kCalls to read.
      if (triggers_[h.which] != kCallBegin) cur_ += triggers_[h.which].size();
      block_committed_ = false;
      skipped_noted_ = false;
      s_ = S::kCalls;
      return true;
    }

    case S::kCalls: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        if (block_committed_) {
          pos_ = cur_ = c;
          s_ = S::kContent;
        } else {
          fail_block(end(), "empty tool call block");
        }
        return true;
      }
      const Match call = match(c, kCallBegin);
      const Match close = match(c, kCallsEnd);
      if (call == Match::kPartial || close == Match::kPartial) return false;
      if (call == Match::kYes) {
        cur_ = c + kCallBegin.size();
        s_ = S::kHead;
      } else if (close == Match::kYes) {
        pos_ = cur_ = c + kCallsEnd.size();
        s_ = S::kContent;
      } else if (block_committed_) {
        // Unclosed block followed by text: the calls stand, the text is content.
        pos_ = cur_ = c;
        s_ = S::kContent;
      } else {
        fail_block(c, "no call in tool call block");
      }
      return true;
    }

    case S::kHead: {
      const size_t p = find(cur_, cur_ + kHeadWindow + kSep.size(), kSep);
      if (p == std::string_view::npos) {
        if (!eof() && end() < cur_ + kHeadWindow + kSep.size()) return false;
        fail_block(cur_, "no separator after the call token");
        return true;
      }
      head_ = std::string(trim(view(cur_, p)));
      cur_ = p + kSep.size();
      s_ = S::kAfterSep;
      return true;
    }

    case S::kAfterSep: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        fail_block(end(), "nothing after the separator");
        return true;
      }
      if (at(c) == '{') {
        // V3.1: the name precedes the separator.
        name_ = head_;
        if (!plausible_tool_name(name_)) {
          fail_block(c, "bad tool name");
          return true;
        }
        fenced_ = false;
        s_ = S::kArgsStart;
      } else {
        // R1: the call type ("function") precedes the separator, the name follows on its own line.
        s_ = S::kName;
      }
      return true;
    }

    case S::kName: {
      size_t p = find(cur_, cur_ + kHeadWindow + 1, "\n");
      const size_t q = find(cur_, cur_ + kHeadWindow + 3, "```");
      if (q != std::string_view::npos && (p == std::string_view::npos || q < p)) p = q;
      if (p == std::string_view::npos) {
        if (!eof() && end() < cur_ + kHeadWindow + 3) return false;
        fail_block(cur_, "no line break after the tool name");
        return true;
      }
      name_ = std::string(trim(view(cur_, p)));
      if (!plausible_tool_name(name_)) {
        fail_block(cur_, "bad tool name");
        return true;
      }
      cur_ = p;
      s_ = S::kFence;
      return true;
    }

    case S::kFence: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        fail_block(end(), "no arguments");
        return true;
      }
      fenced_ = false;
      const Match json_fence = match(c, "```json");
      if (json_fence == Match::kPartial) return false;
      if (json_fence == Match::kYes) {
        cur_ = c + 7;
        fenced_ = true;
      } else {
        const Match plain = match(c, "```");
        if (plain == Match::kPartial) return false;
        cur_ = c;
        if (plain == Match::kYes) {
          cur_ = c + 3;
          fenced_ = true;
        }
      }
      s_ = S::kArgsStart;
      return true;
    }

    case S::kArgsStart: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        fail_block(end(), "no arguments");
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
          s_ = S::kTail;
          return true;
        case ArgsResult::kBroken:
          s_ = S::kResync;
          return true;
      }
      return false;
    }

    case S::kTail: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        pos_ = cur_ = c;
        s_ = S::kContent;
        return true;
      }
      if (fenced_) {
        const Match fence = match(c, "```");
        if (fence == Match::kPartial) return false;
        if (fence == Match::kYes) {
          fenced_ = false;
          pos_ = cur_ = c + 3;
          return true;
        }
      }
      const Match end_tok = match(c, kCallEnd);
      if (end_tok == Match::kPartial) return false;
      pos_ = cur_ = end_tok == Match::kYes ? c + kCallEnd.size() : c;
      s_ = S::kCalls;
      return true;
    }

    case S::kResync: {
      const ScanHit h = scan(cur_, resync_);
      if (!skipped_noted_ && !trim(view(cur_, h.safe_end)).empty()) {
        error("text after a broken tool call skipped");
        skipped_noted_ = true;
      }
      const bool progressed = h.safe_end > cur_;
      pos_ = cur_ = h.safe_end;
      if (h.which == 0) {
        pos_ = cur_ = h.safe_end + kCallEnd.size();
        s_ = S::kCalls;
        return true;
      }
      if (h.which == 1) {
        s_ = S::kCalls;
        return true;
      }
      return progressed;
    }
  }
  return false;
}

}  // namespace

std::unique_ptr<ParserCore> make_deepseek_parser(const ChatFormat& format, ParserOptions options) {
  return std::make_unique<DeepSeekParser>(format, std::move(options));
}

}  // namespace pg::chat::detail
