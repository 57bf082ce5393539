// Llama 3.x: a custom-tool call is the whole message, {"name": ..., "parameters": {...}} (3.1/3.3 may put <|python_tag|>
// first; several calls may follow each other, separated by whitespace or ';'). Builtin tools are
// <|python_tag|>brave_search.call(query="...") and, for code_interpreter, raw Python after <|python_tag|> (reported as a
// call to "python" with {"code": ...}).
//
// A bare '{' at the start is only a call when the object's name is one of the request's tools (when it lists any):
// otherwise a JSON answer would be taken for a call.
#include "chat/parse/parser_core.h"

namespace pg::chat::detail {

namespace {

constexpr std::string_view kPythonTag = "<|python_tag|>";

bool ident_start(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool ident_char(unsigned char c) { return ident_start(c) || (c >= '0' && c <= '9'); }

// Parses Python keyword arguments k="v", k=1, k=True, ... into a JSON object.
bool parse_kwargs(std::string_view s, json& out) {
  out = json::object();
  size_t i = 0;
  auto ws = [&] {
    while (i < s.size() && is_space(static_cast<unsigned char>(s[i]))) ++i;
  };
  ws();
  while (i < s.size()) {
    const size_t k0 = i;
    if (!ident_start(static_cast<unsigned char>(s[i]))) return false;
    while (i < s.size() && ident_char(static_cast<unsigned char>(s[i]))) ++i;
    const std::string key(s.substr(k0, i - k0));
    ws();
    if (i >= s.size() || s[i] != '=') return false;
    ++i;
    ws();
    if (i >= s.size()) return false;
    if (s[i] == '"' || s[i] == '\'') {
      const char q = s[i++];
      std::string v;
      bool closed = false;
      while (i < s.size()) {
        const char ch = s[i++];
        if (ch == q) {
          closed = true;
          break;
        }
        if (ch == '\\' && i < s.size()) {
          const char e = s[i++];
          v.push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e);
        } else {
          v.push_back(ch);
        }
      }
      if (!closed) return false;
      out[key] = v;
    } else {
      const size_t v0 = i;
      while (i < s.size() && s[i] != ',') ++i;
      const std::string_view tok = trim(s.substr(v0, i - v0));
      if (tok == "True" || tok == "False") {
        out[key] = tok == "True";
      } else if (tok == "None") {
        out[key] = nullptr;
      } else {
        json v = json::parse(tok, nullptr, false);
        if (!v.is_number()) return false;
        out[key] = std::move(v);
      }
    }
    ws();
    if (i < s.size()) {
      if (s[i] != ',') return false;
      ++i;
      ws();
    }
  }
  return true;
}

class Llama3Parser final : public ParserCore {
 public:
  Llama3Parser(const ChatFormat& f, ParserOptions o) : ParserCore(f, std::move(o)) {}

 protected:
  bool body_step() override;

 private:
  enum class S : uint8_t { kStart, kContent, kJson, kAfterCall, kPyTag, kPyBuiltin, kPyCode, kDrop };
  void start_object(size_t at, bool require_known);

  const std::vector<std::string> triggers_{std::string(kPythonTag)};
  S s_ = S::kStart;
  size_t cur_ = 0;
  std::unique_ptr<CallObjectParser> obj_;
  std::string builtin_;
  size_t py_scan_ = 0;  // how far the search for the builtin call's ')' has got
  char quote_ = 0;
  bool escape_ = false;
  int depth_ = 0;
  JsonStringEscaper code_esc_;
  std::string scratch_;
};

void Llama3Parser::start_object(size_t at, bool require_known) {
  obj_ = std::make_unique<CallObjectParser>(*this, require_known);
  pos_ = cur_ = at;
  s_ = S::kJson;
}

bool Llama3Parser::body_step() {
  switch (s_) {
    case S::kStart: {
      if (!tools_enabled()) {
        s_ = S::kContent;
        return true;
      }
      // Leading whitespace is consumed while waiting (the content sink drops it at the start anyway).
      const size_t c = pos_ = skip_ws(pos_);
      if (c == end()) {
        if (!eof()) return false;
        s_ = S::kContent;
        return true;
      }
      const Match m = match(c, kPythonTag);
      if (m == Match::kPartial) return false;
      if (m == Match::kYes) {
        pos_ = c;
        cur_ = c + kPythonTag.size();
        s_ = S::kPyTag;
      } else if (at(c) == '{') {
        start_object(c, true);
      } else {
        s_ = S::kContent;
      }
      return true;
    }

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
      cur_ = pos_ + kPythonTag.size();
      s_ = S::kPyTag;
      return true;
    }

    case S::kJson: {
      const bool moved = drive(*obj_, cur_);
      switch (obj_->status()) {
        case CallObjectParser::Status::kMore:
          if (obj_->committed()) pos_ = cur_;
          return moved;
        case CallObjectParser::Status::kDone:
          pos_ = cur_;
          s_ = S::kAfterCall;
          return true;
        case CallObjectParser::Status::kRejected:
          degrade(cur_);
          s_ = S::kContent;
          return true;
        case CallObjectParser::Status::kBroken:
          pos_ = cur_;
          s_ = S::kDrop;
          return true;
      }
      return false;
    }

    case S::kAfterCall: {
      size_t c = cur_;
      while (c < end() && (is_space(at(c)) || at(c) == ';')) ++c;
      cur_ = c;
      if (c == end()) {
        if (!eof()) return false;
        pos_ = cur_ = c;
        s_ = S::kContent;
        return true;
      }
      const Match m = match(c, kPythonTag);
      if (m == Match::kPartial) return false;
      if (m == Match::kYes) {
        pos_ = c;
        cur_ = c + kPythonTag.size();
        s_ = S::kPyTag;
      } else if (at(c) == '{') {
        start_object(c, true);
      } else {
        pos_ = cur_ = c;
        s_ = S::kContent;
      }
      return true;
    }

    case S::kPyTag: {
      const size_t c = cur_ = skip_ws(cur_);
      if (c == end()) {
        if (!eof()) return false;
        pos_ = cur_ = c;  // a lone tag carries nothing
        s_ = S::kContent;
        return true;
      }
      if (at(c) == '{') {
        // The tag makes the intent explicit: any name is a call.
        const size_t mark = pos_;
        start_object(c, false);
        pos_ = mark;
        return true;
      }
      // builtin: identifier ".call("
      size_t i = c;
      if (ident_start(at(c))) {
        while (i < end() && i < c + 64 && ident_char(at(i))) ++i;
        if (i == end() && !eof() && i < c + 64) return false;
        const Match m = match(i, ".call(");
        if (m == Match::kPartial) return false;
        if (m == Match::kYes) {
          builtin_ = std::string(view(c, i));
          cur_ = py_scan_ = i + 6;
          quote_ = 0;
          escape_ = false;
          depth_ = 0;
          s_ = S::kPyBuiltin;
          return true;
        }
      }
      // code_interpreter: the rest of the message is Python source.
      begin_call("python");
      call_args("{\"code\": \"");
      pos_ = cur_ = c;
      s_ = S::kPyCode;
      return true;
    }

    case S::kPyBuiltin: {
      size_t i = py_scan_;
      bool found = false;
      for (; i < end(); ++i) {
        const unsigned char ch = at(i);
        if (quote_ != 0) {
          if (escape_) {
            escape_ = false;
          } else if (ch == '\\') {
            escape_ = true;
          } else if (ch == static_cast<unsigned char>(quote_)) {
            quote_ = 0;
          }
        } else if (ch == '"' || ch == '\'') {
          quote_ = static_cast<char>(ch);
        } else if (ch == '(' || ch == '[' || ch == '{') {
          ++depth_;
        } else if (ch == ')' || ch == ']' || ch == '}') {
          if (depth_ == 0 && ch == ')') {
            found = true;
            break;
          }
          --depth_;
        }
      }
      const bool progressed = i > py_scan_;
      py_scan_ = i;
      if (!found) {
        if (!eof()) return progressed;
        degrade(end());
        s_ = S::kContent;
        return true;
      }
      json args;
      if (!parse_kwargs(view(cur_, i), args)) {
        degrade(i + 1);
        s_ = S::kContent;
        return true;
      }
      begin_call(builtin_);
      call_args(args.dump(-1, ' ', false, json::error_handler_t::replace));
      end_call();
      pos_ = cur_ = i + 1;
      s_ = S::kAfterCall;
      return true;
    }

    case S::kPyCode: {
      if (pos_ < end()) {
        scratch_.clear();
        code_esc_.feed(view(pos_, end()), scratch_);
        call_args(scratch_);
        pos_ = cur_ = end();
        return true;
      }
      if (!eof() || !in_call()) return false;
      scratch_.clear();
      code_esc_.flush(scratch_);
      scratch_ += "\"}";
      call_args(scratch_);
      end_call();
      return false;
    }

    case S::kDrop: {
      // A call broke while streaming; nothing after it in the message is usable.
      if (pos_ == end()) return false;
      pos_ = cur_ = end();
      return true;
    }
  }
  return false;
}

}  // namespace

std::unique_ptr<ParserCore> make_llama3_parser(const ChatFormat& format, ParserOptions options) {
  return std::make_unique<Llama3Parser>(format, std::move(options));
}

}  // namespace pg::chat::detail
