#include "chat/parse/parser_core.h"

#include <algorithm>

#include "core/error.h"

namespace pg::chat::detail {

// ---------------------------------------------------------------------------------------------------------------------
// TextSink

void TextSink::put(std::string_view text, std::string& delta, std::string& total) {
  size_t i = 0;
  const size_t n = text.size();
  if (!started_) {
    while (i < n && is_space(static_cast<unsigned char>(text[i]))) ++i;
    if (i == n) return;
    started_ = true;
  }
  size_t j = n;
  while (j > i && is_space(static_cast<unsigned char>(text[j - 1]))) --j;
  if (j > i) {
    delta += pending_ws_;
    total += pending_ws_;
    pending_ws_.clear();
    delta.append(text.data() + i, j - i);
    total.append(text.data() + i, j - i);
  }
  pending_ws_.append(text.data() + j, n - j);
}

void TextSink::feed(std::string_view in, std::string& delta, std::string& total) {
  clean_.clear();
  utf8_.feed(in, clean_);
  put(clean_, delta, total);
}

void TextSink::flush(std::string& delta, std::string& total) {
  clean_.clear();
  utf8_.flush(clean_);
  put(clean_, delta, total);
  pending_ws_.clear();
}

// ---------------------------------------------------------------------------------------------------------------------
// ParserCore

ParserCore::ParserCore(const ChatFormat& format, ParserOptions options) : format_(format), opts_(std::move(options)) {
  if (opts_.tools.is_array()) {
    for (const auto& t : opts_.tools) {
      if (!t.is_object()) continue;
      const json& f = t.contains("function") && t["function"].is_object() ? t["function"] : t;
      if (!f.contains("name") || !f["name"].is_string()) continue;
      json params = json::object();
      if (f.contains("parameters") && f["parameters"].is_object()) {
        params = f["parameters"];
      } else if (f.contains("input_schema") && f["input_schema"].is_object()) {
        params = f["input_schema"];
      }
      tool_params_[f["name"].get<std::string>()] = std::move(params);
    }
  }
  rng_.seed(opts_.id_seed ? *opts_.id_seed : std::random_device{}());
}

const json* ParserCore::tool_parameters(const std::string& name) const {
  auto it = tool_params_.find(name);
  return it == tool_params_.end() ? nullptr : &it->second;
}

Match ParserCore::match(size_t at, std::string_view lit) const {
  const size_t avail = end() - at;
  const size_t n = std::min(avail, lit.size());
  if (view(at, at + n) != lit.substr(0, n)) return Match::kNo;
  if (n == lit.size()) return Match::kYes;
  return eof_ ? Match::kNo : Match::kPartial;
}

size_t ParserCore::skip_ws(size_t at) const {
  while (at < end() && is_space(this->at(at))) ++at;
  return at;
}

size_t ParserCore::find(size_t from, size_t limit, std::string_view needle) const {
  limit = std::min(limit, end());
  if (from >= limit) return std::string_view::npos;
  const size_t p = view(from, limit).find(needle);
  return p == std::string_view::npos ? p : from + p;
}

ScanHit ParserCore::scan(size_t from, std::span<const std::string> triggers) const {
  ScanHit r;
  const size_t n = end();
  size_t best = std::string_view::npos;
  size_t longest = 0;
  const std::string_view rest = view(from, n);
  for (size_t t = 0; t < triggers.size(); ++t) {
    if (triggers[t].empty()) continue;
    longest = std::max(longest, triggers[t].size());
    const size_t p = rest.find(triggers[t]);
    if (p != std::string_view::npos && (best == std::string_view::npos || p < best)) {
      best = p;
      r.which = static_cast<int>(t);
    }
  }
  if (best != std::string_view::npos) {
    r.safe_end = from + best;
    return r;
  }
  r.safe_end = n;
  if (eof_ || longest == 0) return r;
  // Hold back the earliest suffix that could still grow into a trigger.
  const size_t start = rest.size() >= longest ? rest.size() - (longest - 1) : 0;
  for (size_t k = start; k < rest.size(); ++k) {
    const std::string_view tail = rest.substr(k);
    for (const auto& t : triggers) {
      if (t.size() > tail.size() && std::string_view(t).starts_with(tail)) {
        r.safe_end = from + k;
        return r;
      }
    }
  }
  return r;
}

void ParserCore::content(std::string_view text) {
  if (!text.empty()) content_sink_.feed(text, delta_.content, msg_.content);
}

void ParserCore::reasoning(std::string_view text) {
  if (!text.empty()) reasoning_sink_.feed(text, delta_.reasoning_content, msg_.reasoning_content);
}

std::string ParserCore::next_id() {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  // Mistral templates reject ids that are not exactly 9 alphanumerics when the conversation is sent back.
  const bool mistral = format_.family == ChatFamily::kMistral;
  std::string id = mistral ? "" : "call_";
  const int n = mistral ? 9 : 24;
  for (int i = 0; i < n; ++i) id.push_back(kAlnum[rng_() % 62]);
  return id;
}

void ParserCore::begin_call(const std::string& name) {
  if (call_open_) end_call();
  ToolCall tc;
  tc.id = next_id();
  tc.name = name;
  msg_.tool_calls.push_back(tc);
  ToolCallDelta d;
  d.index = msg_.tool_calls.size() - 1;
  d.id = tc.id;
  d.name = name;
  delta_.tool_calls.push_back(std::move(d));
  call_open_ = true;
}

void ParserCore::call_args(std::string_view text) {
  if (!call_open_ || text.empty()) return;
  const size_t index = msg_.tool_calls.size() - 1;
  msg_.tool_calls.back().arguments.append(text);
  if (delta_.tool_calls.empty() || delta_.tool_calls.back().index != index) {
    ToolCallDelta d;
    d.index = index;
    delta_.tool_calls.push_back(std::move(d));
  }
  delta_.tool_calls.back().arguments.append(text);
}

void ParserCore::end_call() {
  if (!call_open_) return;
  if (msg_.tool_calls.back().arguments.empty()) call_args("{}");
  call_open_ = false;
}

void ParserCore::error(std::string msg) {
  if (msg_.errors.size() < 16) msg_.errors.push_back(std::move(msg));
}

void ParserCore::degrade(size_t fail) {
  fail = std::min(std::max(fail, pos_ + 1), end());
  content(view(pos_, fail));
  pos_ = fail;
}

bool ParserCore::drive(CallObjectParser& obj, size_t& cur) {
  const size_t n = obj.feed(view(cur, end()));
  cur += n;
  if (obj.status() == CallObjectParser::Status::kMore && eof_) obj.finish();
  return n > 0 || obj.status() != CallObjectParser::Status::kMore;
}

ParserCore::ArgsResult ParserCore::drive_args(ArgsStreamer& args, size_t& cur, bool& moved) {
  const size_t n = args.feed(view(cur, end()));
  cur += n;
  pos_ = cur;
  moved = true;
  const std::string name = msg_.tool_calls.empty() ? std::string() : msg_.tool_calls.back().name;
  if (args.failed()) {
    args.heal();
    error("tool call '" + name + "': invalid JSON in arguments; arguments closed where they broke");
    end_call();
    return ArgsResult::kBroken;
  }
  if (!args.done() && eof_) {
    args.finish();
    if (!args.done()) {
      args.heal();
      error("tool call '" + name + "' cut off inside its arguments; arguments closed");
      end_call();
      return ArgsResult::kBroken;
    }
  }
  if (args.done()) {
    end_call();
    return ArgsResult::kDone;
  }
  moved = n > 0;
  return ArgsResult::kMore;
}

bool ParserCore::reasoning_step() {
  const std::string& open = format_.think_open;
  switch (rstate_) {
    case RState::kStart:
    case RState::kReasoningStart: {
      if (rstate_ == RState::kStart) {
        if (!opts_.reasoning || open.empty()) {
          rstate_ = RState::kBody;
          return true;
        }
        reasoning_end_.assign(1, format_.think_close);
        for (const auto& b : reasoning_breakers()) reasoning_end_.push_back(b);
        if (opts_.starts_in_reasoning) {
          rstate_ = RState::kReasoningStart;
          return true;
        }
      }
      // At the start (or, inside an already opened block, a repeated open tag) after optional whitespace. Leading
      // whitespace is consumed while waiting: both sinks drop it at the start anyway, and rescanning it on every push
      // would make a long run of it quadratic.
      const size_t c = skip_ws(pos_);
      const RState no_tag = rstate_ == RState::kStart ? RState::kBody : RState::kReasoning;
      pos_ = c;
      if (c == end()) {
        if (!eof_) return false;
        rstate_ = no_tag;
        return true;
      }
      switch (match(c, open)) {
        case Match::kYes:
          pos_ = c + open.size();
          rstate_ = RState::kReasoning;
          return true;
        case Match::kPartial:
          return false;
        case Match::kNo:
          rstate_ = no_tag;
          return true;
      }
      return false;
    }
    case RState::kReasoning: {
      const ScanHit h = scan(pos_, reasoning_end_);
      const bool progressed = h.safe_end > pos_;
      reasoning(view(pos_, h.safe_end));
      pos_ = h.safe_end;
      if (h.which == 0) {
        pos_ += format_.think_close.size();
        rstate_ = RState::kBody;
        return true;
      }
      if (h.which > 0) {
        rstate_ = RState::kBody;
        return true;
      }
      return progressed;
    }
    case RState::kBody:
      return body_step();
  }
  return false;
}

void ParserCore::run() {
  while (reasoning_step()) {
  }
  compact();
}

void ParserCore::compact() {
  const size_t dead = pos_ - base_;
  if (dead > 4096 && dead * 2 > buf_.size()) {
    buf_.erase(0, dead);
    base_ = pos_;
  }
}

Delta ParserCore::push(std::string_view chunk) {
  PG_CHECK(!eof_, "chat output parser: push() after finish()");
  buf_.append(chunk);
  run();
  Delta out = std::move(delta_);
  delta_ = Delta{};
  return out;
}

Delta ParserCore::finish() {
  if (eof_) return Delta{};
  eof_ = true;
  run();
  // Families close their calls at eof (healing the arguments if needed); this only guards against an oversight.
  end_call();
  if (pos_ < end()) {
    content(view(pos_, end()));
    pos_ = end();
  }
  content_sink_.flush(delta_.content, msg_.content);
  reasoning_sink_.flush(delta_.reasoning_content, msg_.reasoning_content);
  Delta out = std::move(delta_);
  delta_ = Delta{};
  return out;
}

// ---------------------------------------------------------------------------------------------------------------------
// ArgsStreamer

size_t ArgsStreamer::feed(std::string_view in) {
  const size_t n = sc_.feed(in);
  release();
  return n;
}

void ArgsStreamer::finish() {
  sc_.finish();
  release();
}

void ArgsStreamer::release() {
  const size_t s = sc_.safe();
  if (s > released_) {
    core_.call_args(std::string_view(sc_.out()).substr(released_, s - released_));
    released_ = s;
  }
}

void ArgsStreamer::heal() { core_.call_args(sc_.heal()); }

// ---------------------------------------------------------------------------------------------------------------------
// CallObjectParser

namespace {

bool parse_json_string(const std::string& text, std::string& out) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_string()) return false;
  out = j.get<std::string>();
  return true;
}

}  // namespace

bool CallObjectParser::complete() {
  if (committed_) {
    core_.end_call();
    status_ = Status::kDone;
    return true;
  }
  if (!have_name_) return false;
  std::string args = "{}";
  if (have_args_) {
    const json j = json::parse(buffered_args_, nullptr, false);
    if (j.is_object()) {
      args = buffered_args_;
    } else if (j.is_string()) {
      // Some models send the arguments as a JSON string holding the object.
      const std::string inner = j.get<std::string>();
      const json k = json::parse(inner, nullptr, false);
      if (!k.is_object()) return false;
      args = k.dump();
    } else if (!j.is_null()) {
      return false;
    }
  }
  core_.begin_call(name_);
  core_.call_args(args);
  core_.end_call();
  committed_ = true;
  status_ = Status::kDone;
  return true;
}

size_t CallObjectParser::feed(std::string_view in) {
  size_t i = 0;
  auto fail = [&]() {
    if (committed_) {
      // Arguments are complete here (failures inside them are handled where they stream), so the call stands.
      if (core_.in_call()) core_.end_call();
      status_ = Status::kBroken;
    } else {
      status_ = Status::kRejected;
    }
  };
  while (status_ == Status::kMore && i < in.size()) {
    const auto c = static_cast<unsigned char>(in[i]);
    switch (s_) {
      case S::kOpen:
        if (c != '{') return fail(), i;
        ++i;
        s_ = S::kKeyOrEnd;
        break;
      case S::kKeyOrEnd:
      case S::kKey:
        if (!sc_) {
          if (is_space(c)) {
            ++i;
            break;
          }
          if (c == '}' && s_ == S::kKeyOrEnd) {
            ++i;
            if (!complete()) fail();
            break;
          }
          if (c != '"') return fail(), i;
          sc_ = std::make_unique<JsonScanner>();
          s_ = S::kKey;
        }
        i += sc_->feed(in.substr(i));
        if (sc_->failed()) return fail(), i;
        if (sc_->done()) {
          if (!parse_json_string(sc_->out(), key_text_)) return fail(), i;
          sc_.reset();
          s_ = S::kColon;
        }
        break;
      case S::kColon:
        if (is_space(c)) {
          ++i;
        } else if (c == ':') {
          ++i;
          s_ = S::kValueStart;
        } else {
          return fail(), i;
        }
        break;
      case S::kValueStart: {
        if (is_space(c)) {
          ++i;
          break;
        }
        const bool name_key = key_text_ == "name";
        const bool args_key = key_text_ == "arguments" || key_text_ == "parameters";
        if (name_key && !have_name_) {
          s_ = S::kName;
        } else if (args_key && !have_args_) {
          if (c == '{' && have_name_ && !committed_) {
            core_.begin_call(name_);
            committed_ = true;
            args_ = std::make_unique<ArgsStreamer>(core_);
            s_ = S::kArgsStream;
            break;
          }
          s_ = S::kArgsBuffer;
        } else {
          s_ = S::kSkip;
        }
        sc_ = std::make_unique<JsonScanner>();
        break;
      }
      case S::kName:
      case S::kSkip:
      case S::kArgsBuffer:
        i += sc_->feed(in.substr(i));
        if (sc_->failed()) return fail(), i;
        if (sc_->done()) {
          if (s_ == S::kName) {
            if (!parse_json_string(sc_->out(), name_) || !plausible_tool_name(name_)) return fail(), i;
            if (require_known_ && core_.has_tools() && !core_.known_tool(name_)) return fail(), i;
            have_name_ = true;
          } else if (s_ == S::kArgsBuffer) {
            buffered_args_ = sc_->out();
            have_args_ = true;
          }
          sc_.reset();
          s_ = S::kAfter;
        }
        break;
      case S::kArgsStream:
        i += args_->feed(in.substr(i));
        if (args_->failed()) {
          args_->heal();
          core_.end_call();
          core_.error("tool call '" + name_ + "': invalid JSON in arguments; arguments closed where they broke");
          status_ = Status::kBroken;
          return i;
        }
        if (args_->done()) {
          have_args_ = true;
          s_ = S::kAfter;
        }
        break;
      case S::kAfter:
        if (is_space(c)) {
          ++i;
        } else if (c == ',') {
          ++i;
          s_ = S::kKey;  // a key must follow (no '}')
          key_text_.clear();
        } else if (c == '}') {
          ++i;
          if (!complete()) fail();
        } else {
          return fail(), i;
        }
        break;
    }
  }
  return i;
}

void CallObjectParser::finish() {
  if (status_ != Status::kMore) return;
  if (s_ == S::kArgsStream) {
    args_->finish();
    if (args_->done()) {
      have_args_ = true;
      s_ = S::kAfter;
    }
  }
  if (!committed_) {
    status_ = Status::kRejected;
    return;
  }
  if (s_ == S::kArgsStream) {
    args_->heal();
    core_.error("tool call '" + name_ + "' cut off inside its arguments; arguments closed");
    core_.end_call();
    status_ = Status::kBroken;
    return;
  }
  // Arguments complete, only the object's closing brace missing: the call stands.
  core_.end_call();
  status_ = Status::kDone;
}

// ---------------------------------------------------------------------------------------------------------------------
// Content only

namespace {

class ContentOnlyParser final : public ParserCore {
 public:
  using ParserCore::ParserCore;

 protected:
  bool body_step() override {
    if (pos_ == end()) return false;
    content(view(pos_, end()));
    pos_ = end();
    return true;
  }
};

}  // namespace

}  // namespace pg::chat::detail

// ---------------------------------------------------------------------------------------------------------------------
// Public API

namespace pg::chat {

nlohmann::ordered_json ParsedMessage::to_openai_json() const {
  nlohmann::ordered_json m;
  m["role"] = "assistant";
  if (content.empty() && !tool_calls.empty()) {
    m["content"] = nullptr;
  } else {
    m["content"] = content;
  }
  if (!reasoning_content.empty()) m["reasoning_content"] = reasoning_content;
  if (!tool_calls.empty()) {
    auto calls = nlohmann::ordered_json::array();
    for (const auto& tc : tool_calls) {
      calls.push_back({{"id", tc.id}, {"type", "function"}, {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}});
    }
    m["tool_calls"] = std::move(calls);
  }
  return m;
}

OutputParser::OutputParser(const ChatFormat& format, ParserOptions options) {
  using detail::make_deepseek_parser;
  switch (format.family) {
    case ChatFamily::kContentOnly:
      impl_ = std::make_unique<detail::ContentOnlyParser>(format, std::move(options));
      break;
    case ChatFamily::kHermes:
    case ChatFamily::kQwen3Coder:
      impl_ = detail::make_hermes_parser(format, std::move(options));
      break;
    case ChatFamily::kLlama3:
      impl_ = detail::make_llama3_parser(format, std::move(options));
      break;
    case ChatFamily::kMistral:
      impl_ = detail::make_mistral_parser(format, std::move(options));
      break;
    case ChatFamily::kDeepSeek:
      impl_ = detail::make_deepseek_parser(format, std::move(options));
      break;
    case ChatFamily::kGptOss:
      impl_ = detail::make_gpt_oss_parser(format, std::move(options));
      break;
  }
  PG_CHECK(impl_ != nullptr, "chat output parser: unknown format family");
}

OutputParser::~OutputParser() = default;
OutputParser::OutputParser(OutputParser&&) noexcept = default;
OutputParser& OutputParser::operator=(OutputParser&&) noexcept = default;

Delta OutputParser::push(std::string_view chunk) { return impl_->push(chunk); }
Delta OutputParser::finish() { return impl_->finish(); }
const ParsedMessage& OutputParser::message() const { return impl_->message(); }
bool OutputParser::finished() const { return impl_->finished(); }

ParsedMessage parse_output(const ChatFormat& format, std::string_view text, ParserOptions options) {
  OutputParser p(format, std::move(options));
  p.push(text);
  p.finish();
  return p.message();
}

}  // namespace pg::chat
