// GPT-OSS (harmony). The output is a sequence of messages, each a header up to <|message|> and a body up to <|end|>,
// <|call|> or <|return|>:
//   <|channel|>analysis<|message|>REASONING<|end|><|start|>assistant<|channel|>final<|message|>CONTENT<|return|>
// The generation prompt ends with "<|start|>assistant", so the first header has no <|start|>. A tool call is a message
// with a recipient, written in the role part or the channel part of the header:
//   <|start|>assistant to=functions.NAME<|channel|>commentary <|constrain|>json<|message|>{...}<|call|>
//   <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>
// The commentary channel without a recipient is a preamble shown to the user (content). Messages to other recipients
// (the builtin browser / python tools) are not function calls and are dropped with a note. With reasoning off, analysis
// messages go to content as <|channel|>analysis<|message|>...<|end|>.
#include "chat/parse/parser_core.h"

namespace pg::chat::detail {

namespace {

constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kCall = "<|call|>";
constexpr std::string_view kReturn = "<|return|>";
constexpr std::string_view kConstrain = "<|constrain|>";
constexpr size_t kMaxHeader = 512;

// The word after `at` up to whitespace or the next special token.
std::string_view word_at(std::string_view h, size_t at) {
  size_t e = at;
  while (e < h.size() && !is_space(static_cast<unsigned char>(h[e])) && h[e] != '<') ++e;
  return h.substr(at, e - at);
}

class GptOssParser final : public ParserCore {
 public:
  GptOssParser(const ChatFormat& f, ParserOptions o) : ParserCore(f, std::move(o)) {
    if (options().starts_in_reasoning && options().reasoning) {
      s_ = S::kBody;
      mode_ = Mode::kReasoning;
    }
  }

 protected:
  bool body_step() override;

 private:
  enum class S : uint8_t { kHeader, kText, kBody, kToolStart, kToolArgs, kToolTail, kSkip, kBetween };
  enum class Mode : uint8_t { kContent, kReasoning, kRawAnalysis };
  bool plausible_header_start() const;
  void route(std::string_view header);
  void emit(std::string_view text) {
    if (mode_ == Mode::kReasoning) {
      reasoning(text);
    } else {
      content(text);
    }
  }

  const std::vector<std::string> body_end_{std::string(kEnd), std::string(kCall), std::string(kReturn), std::string(kStart),
                                           std::string(kChannel)};
  const std::vector<std::string> text_end_{std::string(kStart), std::string(kChannel)};
  S s_ = S::kHeader;
  Mode mode_ = Mode::kContent;
  size_t cur_ = 0;
  std::string call_name_;
  std::unique_ptr<ArgsStreamer> args_;
  bool skipped_noted_ = false;
};

bool GptOssParser::plausible_header_start() const {
  const size_t c = skip_ws(pos_);
  if (c == end()) return !eof();
  for (std::string_view lit : {kStart, kChannel, std::string_view("to="), kConstrain, kMessage}) {
    if (match(c, lit) != Match::kNo) return true;
  }
  return false;
}

void GptOssParser::route(std::string_view h) {
  std::string_view recipient;
  if (size_t t = h.rfind("to="); t != std::string_view::npos) recipient = word_at(h, t + 3);
  if (recipient == "assistant") recipient = {};
  std::string_view channel;
  if (size_t c = h.rfind(kChannel); c != std::string_view::npos) channel = word_at(h, c + kChannel.size());

  skipped_noted_ = false;
  if (!recipient.empty()) {
    if (!tools_enabled()) {
      mode_ = Mode::kContent;
      s_ = S::kBody;
    } else if (recipient.starts_with("functions.") && plausible_tool_name(recipient.substr(10))) {
      call_name_ = std::string(recipient.substr(10));
      s_ = S::kToolStart;
    } else {
      error("message to '" + std::string(recipient.substr(0, 64)) + "' (not a function tool) dropped");
      skipped_noted_ = true;
      s_ = S::kSkip;
    }
    return;
  }
  if (channel == "analysis") {
    mode_ = options().reasoning ? Mode::kReasoning : Mode::kRawAnalysis;
    if (mode_ == Mode::kRawAnalysis) {
      content(kChannel);
      content("analysis");
      content(kMessage);
    }
  } else {
    mode_ = Mode::kContent;
  }
  s_ = S::kBody;
}

bool GptOssParser::body_step() {
  switch (s_) {
    case S::kHeader: {
      const size_t limit = pos_ + kMaxHeader + kMessage.size();
      const size_t p = find(pos_, limit, kMessage);
      if (p == std::string_view::npos) {
        if (!plausible_header_start()) {
          s_ = S::kText;
          return true;
        }
        if (!eof() && end() < limit) return false;
        // Never completed: the text is ordinary output. One byte goes first so the header is not tried again here.
        degrade(pos_ + 1);
        cur_ = pos_;
        s_ = S::kText;
        return true;
      }
      if (!plausible_header_start()) {
        s_ = S::kText;
        return true;
      }
      route(view(pos_, p));
      pos_ = cur_ = p + kMessage.size();
      return true;
    }

    case S::kText: {
      const ScanHit h = scan(pos_, text_end_);
      const bool progressed = h.safe_end > pos_;
      content(view(pos_, h.safe_end));
      pos_ = cur_ = h.safe_end;
      if (h.which < 0) return progressed;
      s_ = S::kHeader;
      return true;
    }

    case S::kBody: {
      const ScanHit h = scan(pos_, body_end_);
      const bool progressed = h.safe_end > pos_;
      emit(view(pos_, h.safe_end));
      pos_ = cur_ = h.safe_end;
      if (h.which < 0) return progressed;
      if (mode_ == Mode::kRawAnalysis) content(kEnd);
      if (h.which <= 2) pos_ = cur_ = pos_ + body_end_[h.which].size();
      s_ = S::kBetween;
      return true;
    }

    case S::kToolStart: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        error("tool call '" + call_name_ + "' has no arguments");
        pos_ = cur_ = c;
        return false;
      }
      if (at(c) != '{') {
        error("tool call '" + call_name_ + "': arguments are not a JSON object; kept as content");
        pos_ = cur_ = c;
        mode_ = Mode::kContent;
        s_ = S::kBody;
        return true;
      }
      begin_call(call_name_);
      args_ = std::make_unique<ArgsStreamer>(*this);
      pos_ = cur_ = c;
      s_ = S::kToolArgs;
      return true;
    }

    case S::kToolArgs: {
      bool moved = false;
      switch (drive_args(*args_, cur_, moved)) {
        case ArgsResult::kMore:
          return moved;
        case ArgsResult::kDone:
          s_ = S::kToolTail;
          return true;
        case ArgsResult::kBroken:
          skipped_noted_ = false;
          s_ = S::kSkip;
          return true;
      }
      return false;
    }

    case S::kToolTail: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        pos_ = cur_ = c;
        return false;
      }
      for (std::string_view lit : {kCall, kEnd, kReturn}) {
        const Match m = match(c, lit);
        if (m == Match::kPartial) return false;
        if (m == Match::kYes) {
          pos_ = cur_ = c + lit.size();
          s_ = S::kBetween;
          return true;
        }
      }
      pos_ = cur_ = c;
      s_ = S::kSkip;
      return true;
    }

    case S::kSkip: {
      const ScanHit h = scan(pos_, body_end_);
      if (!skipped_noted_ && !trim(view(pos_, h.safe_end)).empty()) {
        error("text after a tool call's arguments skipped");
        skipped_noted_ = true;
      }
      const bool progressed = h.safe_end > pos_;
      pos_ = cur_ = h.safe_end;
      if (h.which < 0) return progressed;
      if (h.which <= 2) pos_ = cur_ = pos_ + body_end_[h.which].size();
      s_ = S::kBetween;
      return true;
    }

    case S::kBetween: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        pos_ = cur_ = c;
        return false;
      }
      const Match st = match(c, kStart);
      const Match ch = match(c, kChannel);
      if (st == Match::kPartial || ch == Match::kPartial) return false;
      pos_ = cur_ = c;
      s_ = (st == Match::kYes || ch == Match::kYes) ? S::kHeader : S::kText;
      return true;
    }
  }
  return false;
}

}  // namespace

std::unique_ptr<ParserCore> make_gpt_oss_parser(const ChatFormat& format, ParserOptions options) {
  return std::make_unique<GptOssParser>(format, std::move(options));
}

}  // namespace pg::chat::detail
