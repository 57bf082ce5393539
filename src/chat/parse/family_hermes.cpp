// Hermes (JSON) and Qwen3-Coder (XML) tool calls: both wrap each call in <tool_call>...</tool_call>, so one state
// machine reads both bodies and picks by the first byte: '{' a JSON call object, '[' a list of them (Apriel), '<' an
// XML <function=NAME> block. Qwen3-Coder sometimes drops the <tool_call> wrapper, so a bare <function=NAME> naming a
// known tool (or any plausible name when no tool list is given) starts a call too.
#include <set>

#include "chat/parse/parser_core.h"

namespace pg::chat::detail {

namespace {

constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParamOpen = "<parameter=";
constexpr std::string_view kParamClose = "</parameter>";

// JSON types a parameter schema admits ("string", "integer", ...); empty when it says nothing.
void schema_types(const json& s, std::set<std::string>& out, int depth = 0) {
  if (!s.is_object() || depth > 8) return;
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string()) out.insert(t.get<std::string>());
    if (t.is_array()) {
      for (const auto& e : t) {
        if (e.is_string()) out.insert(e.get<std::string>());
      }
    }
    return;
  }
  for (const char* k : {"anyOf", "oneOf"}) {
    if (s.contains(k) && s[k].is_array()) {
      for (const auto& e : s[k]) schema_types(e, out, depth + 1);
    }
  }
  if (!out.empty()) return;
  if (s.contains("enum") && s["enum"].is_array()) {
    for (const auto& e : s["enum"]) {
      out.insert(e.is_string()    ? "string"
                 : e.is_boolean() ? "boolean"
                 : e.is_number()  ? "number"
                 : e.is_null()    ? "null"
                                  : "object");
    }
  } else if (s.contains("properties")) {
    out.insert("object");
  } else if (s.contains("items")) {
    out.insert("array");
  }
}

// A parameter value typed by its schema: JSON when the text is a JSON value of an admitted non-string type (Python's
// True/False/None accepted), otherwise a JSON string of the text.
std::string typed_value(const std::string& raw, const std::set<std::string>& types) {
  const std::string_view t = trim(raw);
  auto admits = [&](const char* ty) { return types.count(ty) != 0; };
  if (!t.empty()) {
    // The scanner, not nlohmann, decides validity: nlohmann stops at a NUL byte and would accept what precedes it. The
    // scanner's copy is strict JSON with the model's own formatting.
    JsonScanner sc;
    const size_t used = sc.feed(t);
    sc.finish();
    if (sc.done() && used == t.size()) {
      const json v = json::parse(sc.out(), nullptr, false);
      const bool ok = (v.is_number() && (admits("number") || admits("integer"))) || (v.is_boolean() && admits("boolean")) ||
                      (v.is_object() && admits("object")) || (v.is_array() && admits("array")) || (v.is_null() && admits("null"));
      if (ok) return sc.out();
    }
    if (admits("boolean") && (t == "True" || t == "False")) return t == "True" ? "true" : "false";
    if (admits("null") && t == "None") return "null";
  }
  return json_quote(raw);
}

class HermesParser final : public ParserCore {
 public:
  HermesParser(const ChatFormat& f, ParserOptions o) : ParserCore(f, std::move(o)) {
    content_triggers_ = {format().tool_open, std::string(kFunctionOpen)};
    if (tools_enabled()) breakers_ = {format().tool_open};
    value_end_ = {std::string(kParamClose), std::string(kParamOpen), std::string(kFunctionClose), format().tool_close};
    resync_ = {format().tool_close, format().tool_open};
  }

 protected:
  bool body_step() override;
  std::span<const std::string> reasoning_breakers() const override { return breakers_; }

 private:
  enum class S : uint8_t {
    kContent,
    kBody,        // after <tool_call>: which kind of body
    kJsonObj,     // inside a JSON call object
    kAfterObj,    // after a JSON call: </tool_call>, another object, or anything else
    kArr,         // inside [...]: an object or ']'
    kArrAfter,    // after an object in [...]: ',' or ']'
    kFuncName,    // after <function=
    kParams,      // inside <function=...>: <parameter=, </function>
    kParamName,   // after <parameter=
    kValueStart,  // after <parameter=NAME>: drop one '\n'
    kValue,       // parameter value
    kAfterFunc,   // after </function>
    kResync,      // a call broke after being emitted: skip to </tool_call>
  };

  bool step_content();
  bool step_json_obj();
  bool step_value();
  // A body that failed before anything was emitted becomes content; once a call of this block was emitted, the rest of
  // the block is skipped instead.
  void fail_block(size_t at, const char* why);
  void start_object(size_t at, bool in_array);
  void close_function();
  void emit_value(std::string_view text);
  void finish_value();

  std::vector<std::string> content_triggers_, breakers_, value_end_, resync_;
  S s_ = S::kContent;
  size_t cur_ = 0;
  bool bare_function_ = false;
  bool block_committed_ = false;
  bool in_array_ = false;
  bool skipped_noted_ = false;
  std::unique_ptr<CallObjectParser> obj_;
  std::string fn_name_;
  bool first_param_ = true;
  bool value_is_string_ = true;
  std::set<std::string> value_types_;
  std::string raw_value_;
  JsonStringEscaper esc_;
  std::string scratch_;
};

void HermesParser::fail_block(size_t at, const char* why) {
  if (!block_committed_) {
    degrade(at);
    cur_ = pos_;
    s_ = S::kContent;
    return;
  }
  error(std::string("tool call block: ") + why + "; rest of the block skipped");
  pos_ = cur_ = at;
  s_ = S::kResync;
}

void HermesParser::start_object(size_t at, bool in_array) {
  obj_ = std::make_unique<CallObjectParser>(*this, false);
  cur_ = at;
  in_array_ = in_array;
  s_ = S::kJsonObj;
}

void HermesParser::close_function() {
  call_args("}");
  end_call();
}

bool HermesParser::step_content() {
  if (!tools_enabled()) {
    if (pos_ == end()) return false;
    content(view(pos_, end()));
    pos_ = end();
    return true;
  }
  const ScanHit h = scan(pos_, content_triggers_);
  const bool progressed = h.safe_end > pos_;
  content(view(pos_, h.safe_end));
  pos_ = cur_ = h.safe_end;
  if (h.which < 0) return progressed;
  block_committed_ = false;
  skipped_noted_ = false;
  bare_function_ = h.which == 1;
  cur_ = pos_ + content_triggers_[h.which].size();
  s_ = bare_function_ ? S::kFuncName : S::kBody;
  return true;
}

bool HermesParser::step_json_obj() {
  const bool moved = drive(*obj_, cur_);
  switch (obj_->status()) {
    case CallObjectParser::Status::kMore:
      if (obj_->committed()) pos_ = cur_;
      return moved;
    case CallObjectParser::Status::kDone:
      block_committed_ = true;
      pos_ = cur_;
      s_ = in_array_ ? S::kArrAfter : S::kAfterObj;
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

void HermesParser::emit_value(std::string_view text) {
  if (text.empty()) return;
  if (value_is_string_) {
    scratch_.clear();
    esc_.feed(text, scratch_);
    call_args(scratch_);
  } else {
    raw_value_.append(text);
  }
}

void HermesParser::finish_value() {
  if (value_is_string_) {
    scratch_.clear();
    esc_.flush(scratch_);
    scratch_.push_back('"');
    call_args(scratch_);
    esc_ = JsonStringEscaper{};
  } else {
    call_args(typed_value(raw_value_, value_types_));
    raw_value_.clear();
  }
}

bool HermesParser::step_value() {
  const ScanHit h = scan(cur_, value_end_);
  const bool hit = h.which >= 0;
  size_t stop = h.safe_end;
  size_t text_end = stop;
  // The template writes "\nVALUE\n</parameter>": one newline on each side is markup. A trailing newline is held back
  // until it is known whether the closing tag follows it.
  if (text_end > cur_ && at(text_end - 1) == '\n') {
    --text_end;
    if (!hit && !eof()) stop = text_end;
  }
  emit_value(view(cur_, text_end));
  const bool progressed = stop > cur_;
  cur_ = pos_ = stop;
  if (hit) {
    finish_value();
    if (value_end_[h.which] == kParamClose) cur_ += kParamClose.size();
    pos_ = cur_;
    s_ = S::kParams;
    return true;
  }
  if (eof()) {
    finish_value();
    error("tool call '" + fn_name_ + "': parameter value not closed at end of output");
    s_ = S::kParams;
    return true;
  }
  return progressed;
}

bool HermesParser::body_step() {
  switch (s_) {
    case S::kContent:
      return step_content();

    case S::kBody: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        fail_block(end(), "empty tool call");
        return true;
      }
      const unsigned char ch = at(c);
      if (ch == '{') {
        start_object(c, false);
        return true;
      }
      if (ch == '[') {
        cur_ = c + 1;
        s_ = S::kArr;
        return true;
      }
      if (ch == '<') {
        const Match m = match(c, kFunctionOpen);
        if (m == Match::kPartial) return false;
        if (m == Match::kYes) {
          cur_ = c + kFunctionOpen.size();
          s_ = S::kFuncName;
          return true;
        }
      }
      fail_block(c, "unrecognised tool call body");
      return true;
    }

    case S::kJsonObj:
      return step_json_obj();

    case S::kAfterObj: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        pos_ = cur_ = c;
        s_ = S::kContent;
        return true;
      }
      const Match m = match(c, format().tool_close);
      if (m == Match::kPartial) return false;
      if (m == Match::kYes) {
        pos_ = cur_ = c + format().tool_close.size();
        s_ = S::kContent;
        return true;
      }
      if (at(c) == '{') {
        start_object(c, false);
        return true;
      }
      // The call stands without its closing tag; whatever follows is ordinary output.
      pos_ = cur_ = c;
      s_ = S::kContent;
      return true;
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
        s_ = S::kAfterObj;
        return true;
      }
      if (s_ == S::kArr && ch == '{') {
        start_object(c, true);
        return true;
      }
      if (s_ == S::kArrAfter && ch == ',') {
        cur_ = c + 1;
        s_ = S::kArr;
        return true;
      }
      fail_block(c, "malformed list of tool calls");
      return true;
    }

    case S::kFuncName: {
      const size_t gt = find(cur_, cur_ + 257, ">");
      if (gt == std::string_view::npos) {
        if (!eof() && end() < cur_ + 257) return false;
        fail_block(cur_, "unterminated <function= tag");
        return true;
      }
      const std::string name(trim(view(cur_, gt)));
      const bool ok = plausible_tool_name(name) && (!bare_function_ || !has_tools() || known_tool(name));
      if (!ok) {
        fail_block(cur_, "bad function name");
        return true;
      }
      begin_call(name);
      call_args("{");
      block_committed_ = true;
      fn_name_ = name;
      first_param_ = true;
      pos_ = cur_ = gt + 1;
      s_ = S::kParams;
      return true;
    }

    case S::kParams: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        close_function();
        error("tool call '" + fn_name_ + "': <function> not closed at end of output");
        pos_ = cur_ = c;
        s_ = S::kContent;
        return true;
      }
      bool partial = false;
      for (std::string_view lit : {kParamOpen, kFunctionClose, std::string_view(format().tool_close)}) {
        const Match m = match(c, lit);
        if (m == Match::kPartial) partial = true;
        if (m != Match::kYes) continue;
        if (lit == kParamOpen) {
          cur_ = c + lit.size();
          s_ = S::kParamName;
        } else {
          close_function();
          pos_ = cur_ = c + lit.size();
          s_ = lit == kFunctionClose ? S::kAfterFunc : S::kContent;
        }
        return true;
      }
      if (partial) return false;
      // Stray text between parameters: skipped up to the next tag.
      size_t next = find(c + 1, end(), "<");
      if (next == std::string_view::npos) next = end();
      if (!skipped_noted_) {
        error("tool call '" + fn_name_ + "': text outside <parameter> tags skipped");
        skipped_noted_ = true;
      }
      pos_ = cur_ = next;
      return true;
    }

    case S::kParamName: {
      const size_t gt = find(cur_, cur_ + 257, ">");
      if (gt == std::string_view::npos) {
        if (!eof() && end() < cur_ + 257) return false;
      }
      const std::string_view key = gt == std::string_view::npos ? std::string_view() : trim(view(cur_, gt));
      if (!plausible_tool_name(key)) {
        // Not a usable parameter tag: treated as stray text.
        if (!skipped_noted_) {
          error("tool call '" + fn_name_ + "': malformed <parameter= tag skipped");
          skipped_noted_ = true;
        }
        pos_ = cur_;
        s_ = S::kParams;
        return true;
      }
      std::string head = first_param_ ? "" : ", ";
      first_param_ = false;
      head += json_quote(key);
      head += ": ";
      value_is_string_ = true;
      value_types_.clear();
      if (const json* params = tool_parameters(fn_name_)) {
        if (params->contains("properties") && (*params)["properties"].is_object() &&
            (*params)["properties"].contains(std::string(key))) {
          schema_types((*params)["properties"][std::string(key)], value_types_);
          value_is_string_ = value_types_.empty() || (value_types_.size() == 1 && value_types_.count("string"));
        }
      }
      if (value_is_string_) head.push_back('"');
      call_args(head);
      pos_ = cur_ = gt + 1;
      s_ = S::kValueStart;
      return true;
    }

    case S::kValueStart:
      if (cur_ == end() && !eof()) return false;
      if (cur_ < end() && at(cur_) == '\n') ++cur_;
      pos_ = cur_;
      s_ = S::kValue;
      return true;

    case S::kValue:
      return step_value();

    case S::kAfterFunc: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        pos_ = cur_ = c;
        s_ = S::kContent;
        return true;
      }
      const Match close = match(c, format().tool_close);
      const Match again = match(c, kFunctionOpen);
      if (close == Match::kPartial || again == Match::kPartial) return false;
      if (close == Match::kYes) {
        pos_ = cur_ = c + format().tool_close.size();
        s_ = S::kContent;
      } else if (again == Match::kYes) {
        // Several functions inside one <tool_call>.
        cur_ = c + kFunctionOpen.size();
        pos_ = c;
        s_ = S::kFuncName;
      } else {
        pos_ = cur_ = c;
        s_ = S::kContent;
      }
      return true;
    }

    case S::kResync: {
      const ScanHit h = scan(cur_, resync_);
      const std::string_view skipped = view(cur_, h.safe_end);
      if (!skipped_noted_ && !trim(skipped).empty()) {
        error("text after a broken tool call skipped");
        skipped_noted_ = true;
      }
      const bool progressed = h.safe_end > cur_;
      pos_ = cur_ = h.safe_end;
      if (h.which == 0) {
        pos_ = cur_ = h.safe_end + format().tool_close.size();
        s_ = S::kContent;
        return true;
      }
      if (h.which == 1) {
        s_ = S::kContent;
        return true;
      }
      return progressed;
    }
  }
  return false;
}

}  // namespace

std::unique_ptr<ParserCore> make_hermes_parser(const ChatFormat& format, ParserOptions options) {
  return std::make_unique<HermesParser>(format, std::move(options));
}

}  // namespace pg::chat::detail
