// libFuzzer target for the streaming tool-call / reasoning parsers (model output is untrusted text).
//
// Input: model output, all of it. Every parser family (and the tag variants detect_chat_format produces: with and
// without reasoning tags, Seed-OSS's <seed:...> tags) parses it, each with one option set picked from a hash of the
// input: reasoning on, output starting inside the reasoning block, reasoning off, or no tool list / tool parsing off.
// (Running every option set on every input made an execution four times slower for little gain: the mutator soon
// changes the hash.) Each configuration parses the text whole, one byte at a time, and in two chunkings cut at points
// derived from the same hash.
// Checked, as documented in chat/parse/output_parser.h:
//  - nothing throws (the parsers never throw on any text), nothing crashes or trips a sanitizer;
//  - the final message is identical whatever the chunking (content, reasoning, calls with ids, errors);
//  - the deltas concatenate to the message, a call's first delta carries its id and name and comes before its
//    arguments, call deltas arrive in index order;
//  - everything is valid UTF-8, every tool call has a name and an id, and its arguments are a JSON object;
//  - the message serialises as OpenAI JSON.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "chat/parse/chat_format.h"
#include "chat/parse/output_parser.h"
#include "../tests/chat/utf8_check.h"

namespace {

using json = nlohmann::ordered_json;
using pg::chat::ChatFamily;
using pg::chat::ChatFormat;
using pg::chat::Delta;
using pg::chat::OutputParser;
using pg::chat::ParsedMessage;
using pg::chat::ParserOptions;
using pg::chat::ToolCall;

volatile size_t g_sink;

using pg::test::valid_utf8;

struct Config {
  ChatFormat format;
  ParserOptions options;
  std::string label;
};

std::string printable(std::string_view s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out.push_back(ch);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

std::string describe(const ParsedMessage& m) {
  json j = m.to_openai_json();
  j["errors"] = m.errors;
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

[[noreturn]] void bug(const Config& c, const std::string& what, std::string_view text) {
  std::fprintf(stderr, "fuzz_chat_parse: [%s] %s\ninput (%zu bytes): %s\n", c.label.c_str(), what.c_str(), text.size(),
               printable(text.substr(0, 4000)).c_str());
  std::abort();
}

const json& tools() {
  static const json t = json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "location": {"type": "string"}, "days": {"type": "integer"}, "detailed": {"type": "boolean"},
      "options": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}},
      "ratio": {"type": ["number", "null"]}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}}},
    {"name": "write_file", "input_schema": {"type": "object", "properties": {
      "path": {"type": "string"}, "content": {"type": "string"}}}},
    {"name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}}}
  ])");
  return t;
}

// The formats the parsers are used with: each family's defaults plus the variants detect_chat_format yields.
const std::vector<ChatFormat>& formats() {
  static const std::vector<ChatFormat> v = [] {
    std::vector<ChatFormat> f;
    ChatFormat plain_think = ChatFormat::of(ChatFamily::kContentOnly);
    plain_think.think_open = "<think>";
    plain_think.think_close = "</think>";
    f.push_back(plain_think);
    f.push_back(ChatFormat::of(ChatFamily::kHermes));
    ChatFormat hermes_plain = ChatFormat::of(ChatFamily::kHermes);  // Qwen2.5: no reasoning tags in the template
    hermes_plain.think_open.clear();
    hermes_plain.think_close.clear();
    f.push_back(hermes_plain);
    f.push_back(ChatFormat::of(ChatFamily::kQwen3Coder));
    ChatFormat seed = ChatFormat::of(ChatFamily::kQwen3Coder);  // Seed-OSS
    seed.tool_open = "<seed:tool_call>";
    seed.tool_close = "</seed:tool_call>";
    seed.think_open = "<seed:think>";
    seed.think_close = "</seed:think>";
    f.push_back(seed);
    f.push_back(ChatFormat::of(ChatFamily::kLlama3));
    f.push_back(ChatFormat::of(ChatFamily::kMistral));
    ChatFormat mistral_plain = ChatFormat::of(ChatFamily::kMistral);  // Mistral Nemo / Small: no [THINK]
    mistral_plain.think_open.clear();
    mistral_plain.think_close.clear();
    f.push_back(mistral_plain);
    f.push_back(ChatFormat::of(ChatFamily::kDeepSeek));
    f.push_back(ChatFormat::of(ChatFamily::kGptOss));
    return f;
  }();
  return v;
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

// splitmix64: a small deterministic generator for split points.
uint64_t next(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Streams text cut at `cuts` and checks the deltas against the final message.
ParsedMessage stream(const Config& c, std::string_view text, const std::vector<size_t>& cuts, const char* how) {
  OutputParser p(c.format, c.options);
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  auto take = [&](const Delta& d) {
    if (!valid_utf8(d.content) || !valid_utf8(d.reasoning_content)) bug(c, std::string(how) + ": delta not UTF-8", text);
    content += d.content;
    reasoning += d.reasoning_content;
    for (const auto& tc : d.tool_calls) {
      if (!valid_utf8(tc.arguments)) bug(c, std::string(how) + ": arguments delta not UTF-8", text);
      if (tc.index == calls.size()) {
        if (tc.id.empty() || tc.name.empty()) bug(c, std::string(how) + ": first delta of a call lacks id or name", text);
        calls.push_back({tc.id, tc.name, tc.arguments});
      } else if (tc.index < calls.size() && tc.id.empty() && tc.name.empty()) {
        calls[tc.index].arguments += tc.arguments;
      } else {
        bug(c, std::string(how) + ": call delta out of order or repeats id/name", text);
      }
    }
  };
  size_t prev = 0;
  for (size_t cut : cuts) {
    take(p.push(text.substr(prev, cut - prev)));
    prev = cut;
  }
  take(p.push(text.substr(prev)));
  take(p.finish());
  if (!p.finished()) bug(c, std::string(how) + ": not finished after finish()", text);
  if (!p.finish().empty()) bug(c, std::string(how) + ": second finish() returned text", text);
  const ParsedMessage& m = p.message();
  if (content != m.content) bug(c, std::string(how) + ": content deltas do not add up to the message", text);
  if (reasoning != m.reasoning_content) bug(c, std::string(how) + ": reasoning deltas do not add up to the message", text);
  if (calls.size() != m.tool_calls.size()) bug(c, std::string(how) + ": call deltas and message disagree on count", text);
  for (size_t i = 0; i < calls.size(); ++i) {
    const ToolCall& a = calls[i];
    const ToolCall& b = m.tool_calls[i];
    if (a.id != b.id || a.name != b.name || a.arguments != b.arguments) {
      bug(c, std::string(how) + ": call deltas do not add up to call " + std::to_string(i), text);
    }
  }
  return m;
}

void check_message(const Config& c, const ParsedMessage& m, std::string_view text) {
  if (!valid_utf8(m.content) || !valid_utf8(m.reasoning_content)) bug(c, "message not UTF-8", text);
  if (m.errors.size() > 16) bug(c, "more than 16 errors recorded", text);
  for (const auto& tc : m.tool_calls) {
    if (tc.name.empty() || !valid_utf8(tc.name)) bug(c, "tool call name empty or not UTF-8", text);
    if (tc.id.empty()) bug(c, "tool call without id", text);
    const json a = json::parse(tc.arguments, nullptr, /*allow_exceptions=*/false);
    if (!a.is_object()) bug(c, "arguments not a JSON object: " + printable(tc.arguments), text);
  }
  // Throws (type_error 316) on invalid UTF-8, which the checks above rule out.
  g_sink = g_sink + m.to_openai_json().dump().size();
}

bool same(const ParsedMessage& a, const ParsedMessage& b) {
  if (a.content != b.content || a.reasoning_content != b.reasoning_content || a.errors != b.errors) return false;
  if (a.tool_calls.size() != b.tool_calls.size()) return false;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    if (a.tool_calls[i].id != b.tool_calls[i].id || a.tool_calls[i].name != b.tool_calls[i].name ||
        a.tool_calls[i].arguments != b.tool_calls[i].arguments) {
      return false;
    }
  }
  return true;
}

void check_config(const Config& c, std::string_view text, uint64_t seed) {
  const ParsedMessage whole = stream(c, text, {}, "whole");
  check_message(c, whole, text);
  // Also the whole-text convenience entry point.
  if (!same(whole, pg::chat::parse_output(c.format, text, c.options))) bug(c, "parse_output differs from push+finish", text);

  std::vector<size_t> cuts;
  for (size_t i = 1; i < text.size(); ++i) cuts.push_back(i);
  const ParsedMessage bytes = stream(c, text, cuts, "1-byte");
  if (!same(whole, bytes)) bug(c, "1-byte chunking differs\nwhole: " + describe(whole) + "\n1-byte: " + describe(bytes), text);

  // Two more chunkings: small pieces (tags split in several places) and large ones (several tags per chunk).
  uint64_t s = seed;
  for (size_t max_piece : {size_t{1} + next(s) % 12, size_t{8} + next(s) % 250}) {
    cuts.clear();
    for (size_t at = 1 + next(s) % max_piece; at < text.size(); at += 1 + next(s) % max_piece) cuts.push_back(at);
    const ParsedMessage r = stream(c, text, cuts, "hash chunking");
    if (!same(whole, r)) {
      std::string where;
      for (size_t cut : cuts) where += std::to_string(cut) + ",";
      bug(c, "chunking differs\nwhole: " + describe(whole) + "\nsplit: " + describe(r) + "\ncuts: " + where, text);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const uint64_t h = fnv1a(text);
  const auto& fs = formats();
  for (size_t i = 0; i < fs.size(); ++i) {
    const ChatFormat& f = fs[i];
    const uint64_t bits = h >> (3 * i);  // this family's option set for this input
    Config c{f, {}, std::string(f.name()) + " think=" + f.think_open + " tool=" + f.tool_open};
    c.options.tools = tools();
    c.options.id_seed = 42;
    switch (bits & 3) {
      case 0:
        c.label += " reasoning";
        break;
      case 1:
        c.options.starts_in_reasoning = true;
        c.label += " starts_in_reasoning";
        break;
      case 2:
        c.options.reasoning = false;
        c.label += " reasoning=false";
        break;
      default:
        c.options.starts_in_reasoning = (bits >> 2) & 1;
        if (c.options.starts_in_reasoning) c.label += " starts_in_reasoning";
        if ((h >> 40) & 1) {
          c.options.tools = json::array();
          c.label += " no tools";
        } else {
          c.options.parse_tool_calls = false;
          c.label += " parse_tool_calls=false";
        }
        break;
    }
    check_config(c, text, h + i);
  }
  return 0;
}
