// libFuzzer target for the Jinja engine (chat templates come from untrusted GGUF metadata and user files).
//
// Input: a template. When the first line is a JSON object, it is taken out of the template and its members override
// the fixed, realistic render context below (a conversation with reasoning, tool calls and tool results, a tool list,
// bos/eos tokens, add_generation_prompt, enable_thinking). The template is parsed and rendered with the engine's
// default sandbox limits, the work cap lowered (see below). A pg::Error (pg::jinja::Error) is an acceptable outcome;
// a crash, a sanitizer report, any other exception type, a hang (run with -timeout) or a huge allocation
// (-rss_limit_mb) is a bug. Besides not failing, the engine must honour its own contracts: the output is no larger
// than Limits::max_output_bytes, and a Template is immutable, so rendering it twice gives the same text (or the same
// error). The chat-format detection that runs on every template loaded from a GGUF file is exercised on the same
// input.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "chat/jinja/jinja.h"
#include "chat/parse/chat_format.h"
#include "core/error.h"

namespace {

using json = nlohmann::ordered_json;

volatile size_t g_sink;

const json& base_context() {
  static const json ctx = json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are a helpful assistant. Today is {{ date }}."},
      {"role": "user", "content": "What's the weather in Paris and the time in Oslo?"},
      {"role": "assistant", "content": "", "reasoning_content": "I should call both tools.",
       "tool_calls": [
         {"id": "call_0001", "type": "function",
          "function": {"name": "get_weather", "arguments": {"location": "Paris", "days": 2, "detailed": true,
                                                           "tags": ["a", "b"], "options": {"unit": "C", "x": null}}}},
         {"id": "call_0002", "type": "function",
          "function": {"name": "get_time", "arguments": {"city": "Oslo"}}}]},
      {"role": "tool", "tool_call_id": "call_0001", "name": "get_weather", "content": "{\"temp\": 21.5}"},
      {"role": "tool", "tool_call_id": "call_0002", "content": "14:03"},
      {"role": "assistant", "content": "<think>\nDone.\n</think>\n\nParis: 21.5°C; Oslo: 14:03.",
       "thinking": "plain"},
      {"role": "user", "content": [{"type": "text", "text": "Thanks! "}, {"type": "image"},
                                   {"type": "text", "text": "Now in 日本語 🚀"}]}
    ],
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Get the weather",
        "parameters": {"type": "object", "properties": {
          "location": {"type": "string", "description": "City"}, "days": {"type": "integer"},
          "detailed": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}},
          "options": {"type": "object"}, "unit": {"type": "string", "enum": ["C", "F"]}},
          "required": ["location"]}}},
      {"type": "function", "function": {"name": "get_time", "description": "Local time",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ],
    "documents": null,
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>",
    "enable_thinking": true
  })");
  return ctx;
}

[[noreturn]] void bug(const char* what, std::string_view detail) {
  std::fprintf(stderr, "fuzz_jinja: %s: %.*s\n", what, static_cast<int>(detail.size() > 2000 ? 2000 : detail.size()),
               detail.data());
  std::abort();
}

struct Outcome {
  bool ok = false;
  std::string text;  // output, or the error message
};

Outcome render(const pg::jinja::Template& t, const json& vars, const pg::jinja::RenderOptions& opts) {
  Outcome o;
  try {
    o.text = t.render(vars, opts);
    o.ok = true;
  } catch (const pg::Error& e) {
    o.text = e.what();
  } catch (const std::exception& e) {
    bug("render threw a non-pg exception", e.what());
  }
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view src(reinterpret_cast<const char*>(data), size);

  json vars = base_context();
  if (size_t nl = src.find('\n'); nl != std::string_view::npos && nl > 0 && src[0] == '{') {
    // Exceptions off: a first line that is not JSON is just template text.
    json ctx = json::parse(src.substr(0, nl), nullptr, /*allow_exceptions=*/false);
    if (ctx.is_object()) {
      for (auto& [k, v] : ctx.items()) vars[k] = v;
      src.remove_prefix(nl + 1);
    }
  }

  const pg::chat::ChatFormat fmt = pg::chat::detect_chat_format(src);
  size_t h = fmt.think_open.size() + fmt.tool_open.size() + static_cast<size_t>(fmt.family);

  std::optional<pg::jinja::Template> tpl;
  try {
    tpl.emplace(src);
  } catch (const pg::Error&) {
    g_sink = g_sink + h;
    return 0;
  } catch (const std::exception& e) {
    bug("parse threw a non-pg exception", e.what());
  }

  pg::jinja::RenderOptions opts;  // default limits, except for the work cap
  // A step costs 2-3 us in this build (ASan + UBSan + coverage tracing) against 20-60 ns in a release build, so the
  // default cap of 50M steps (about 1-3 s in release) would take minutes here and every template that merely loops to
  // the cap would count as a hang. 500k steps keep a loop-bound render under ~1.5 s here; single operations on strings
  // near the 64 MB output cap take a few seconds each in this build, so run with -timeout=25. A template still running
  // then does work the step counter does not see, which is exactly the bug to find. The memory and output caps stay at
  // their defaults: with -rss_limit_mb=2048, memory the allocation cap does not see shows up as an out-of-memory.
  opts.limits.max_steps = 500'000;
  opts.now = pg::jinja::DateTime{2025, 1, 2, 3, 4, 5, 0, std::nullopt};
  const Outcome first = render(*tpl, vars, opts);
  if (first.ok) {
    if (first.text.size() > opts.limits.max_output_bytes) bug("output larger than max_output_bytes", first.text.substr(0, 200));
    h += pg::chat::prompt_opens_reasoning(fmt, first.text);
  }
  // The random filter is the one legitimately nondeterministic thing a template can do.
  if (src.find("random") == std::string_view::npos) {
    const Outcome second = render(*tpl, vars, opts);
    if (second.ok != first.ok || second.text != first.text) {
      bug("second render of the same Template differs",
          std::string(first.text.substr(0, 300)) + "\n--- vs ---\n" + std::string(second.text.substr(0, 300)));
    }
  }
  g_sink = g_sink + h + first.text.size();
  return 0;
}
