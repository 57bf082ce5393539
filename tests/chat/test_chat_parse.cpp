// Output parsers per template family: realistic model outputs (single / parallel calls, content around calls, reasoning,
// malformed markup), each also streamed one byte at a time and in random chunks, which must give the same message and
// deltas that add up to it.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "chat/parse/chat_format.h"
#include "chat/parse/output_parser.h"
#include "core/error.h"
#include "testutil.h"
#include "utf8_check.h"

namespace pg::chat {
namespace {

using json = nlohmann::ordered_json;

// ----------------------------------------------------------------------------------------------------------------------
// Helpers

using pg::test::valid_utf8;

struct Run {
  ParsedMessage msg;
  std::vector<Delta> deltas;
};

Run run_cuts(const ChatFormat& f, const ParserOptions& o, std::string_view text, const std::vector<size_t>& cuts) {
  Run r;
  OutputParser p(f, o);
  size_t prev = 0;
  for (size_t c : cuts) {
    r.deltas.push_back(p.push(text.substr(prev, c - prev)));
    prev = c;
  }
  r.deltas.push_back(p.push(text.substr(prev)));
  r.deltas.push_back(p.finish());
  r.msg = p.message();
  return r;
}

// Deltas concatenate to the message; ids/names come first and once per call; everything is valid UTF-8; arguments are
// JSON objects.
void check_run(const Run& r, const std::string& what) {
  std::string content, reasoning;
  std::vector<ToolCall> calls;
  for (const auto& d : r.deltas) {
    EXPECT_TRUE(valid_utf8(d.content)) << what;
    EXPECT_TRUE(valid_utf8(d.reasoning_content)) << what;
    content += d.content;
    reasoning += d.reasoning_content;
    for (const auto& tc : d.tool_calls) {
      EXPECT_TRUE(valid_utf8(tc.arguments)) << what;
      if (tc.index == calls.size()) {
        EXPECT_FALSE(tc.id.empty()) << what << ": first delta of a call carries the id";
        EXPECT_FALSE(tc.name.empty()) << what << ": first delta of a call carries the name";
        calls.push_back({tc.id, tc.name, tc.arguments});
      } else {
        ASSERT_LT(tc.index, calls.size()) << what << ": call deltas arrive in index order";
        EXPECT_TRUE(tc.id.empty() && tc.name.empty()) << what;
        calls[tc.index].arguments += tc.arguments;
      }
    }
  }
  EXPECT_EQ(content, r.msg.content) << what;
  EXPECT_EQ(reasoning, r.msg.reasoning_content) << what;
  ASSERT_EQ(calls.size(), r.msg.tool_calls.size()) << what;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].id, r.msg.tool_calls[i].id) << what;
    EXPECT_EQ(calls[i].name, r.msg.tool_calls[i].name) << what;
    EXPECT_EQ(calls[i].arguments, r.msg.tool_calls[i].arguments) << what;
    const json a = json::parse(r.msg.tool_calls[i].arguments, nullptr, false);
    EXPECT_TRUE(a.is_object()) << what << ": arguments not a JSON object: " << r.msg.tool_calls[i].arguments;
    EXPECT_TRUE(valid_utf8(r.msg.tool_calls[i].name)) << what;
  }
  EXPECT_TRUE(valid_utf8(r.msg.content)) << what;
  EXPECT_TRUE(valid_utf8(r.msg.reasoning_content)) << what;
}

void expect_same(const ParsedMessage& a, const ParsedMessage& b, const std::string& what) {
  EXPECT_EQ(a.content, b.content) << what;
  EXPECT_EQ(a.reasoning_content, b.reasoning_content) << what;
  ASSERT_EQ(a.tool_calls.size(), b.tool_calls.size()) << what;
  for (size_t i = 0; i < a.tool_calls.size(); ++i) {
    EXPECT_EQ(a.tool_calls[i].id, b.tool_calls[i].id) << what;
    EXPECT_EQ(a.tool_calls[i].name, b.tool_calls[i].name) << what;
    EXPECT_EQ(a.tool_calls[i].arguments, b.tool_calls[i].arguments) << what;
  }
  EXPECT_EQ(a.errors, b.errors) << what;
}

// Parses `text` whole, one byte at a time and in random pieces; all must agree. Returns the whole-text message.
ParsedMessage parse_all_ways(const ChatFormat& f, ParserOptions o, std::string_view text, int random_splits = 24) {
  if (!o.id_seed) o.id_seed = 42;
  const Run whole = run_cuts(f, o, text, {});
  check_run(whole, "whole");
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  const Run bytes = run_cuts(f, o, text, every);
  check_run(bytes, "1-byte");
  expect_same(whole.msg, bytes.msg, "1-byte vs whole");
  std::mt19937 rng(static_cast<uint32_t>(text.size()) * 7919u + 1);
  for (int k = 0; k < random_splits; ++k) {
    std::vector<size_t> cuts;
    const size_t max_piece = 1 + rng() % 12;
    for (size_t c = 1 + rng() % max_piece; c < text.size(); c += 1 + rng() % max_piece) cuts.push_back(c);
    const Run r = run_cuts(f, o, text, cuts);
    check_run(r, "random split " + std::to_string(k));
    expect_same(whole.msg, r.msg, "random split " + std::to_string(k));
  }
  return whole.msg;
}

struct Call {
  std::string name;
  json args;
};

void expect_calls(const ParsedMessage& m, const std::vector<Call>& want) {
  ASSERT_EQ(m.tool_calls.size(), want.size()) << m.to_openai_json().dump();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(m.tool_calls[i].name, want[i].name);
    EXPECT_EQ(json::parse(m.tool_calls[i].arguments), want[i].args) << m.tool_calls[i].arguments;
  }
}

json weather_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather",
      "parameters": {"type": "object", "properties": {
        "location": {"type": "string"}, "days": {"type": "integer"}, "detailed": {"type": "boolean"},
        "options": {"type": "object"}, "tags": {"type": "array", "items": {"type": "string"}},
        "ratio": {"type": ["number", "null"]}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}}},
    {"name": "write_file", "input_schema": {"type": "object", "properties": {
      "path": {"type": "string"}, "content": {"type": "string"}}}}
  ])");
}

ParserOptions with_tools() {
  ParserOptions o;
  o.tools = weather_tools();
  return o;
}

const ChatFormat kHermes = ChatFormat::of(ChatFamily::kHermes);
const ChatFormat kCoder = ChatFormat::of(ChatFamily::kQwen3Coder);
const ChatFormat kLlama = ChatFormat::of(ChatFamily::kLlama3);
const ChatFormat kMistral = ChatFormat::of(ChatFamily::kMistral);
const ChatFormat kDeepSeek = ChatFormat::of(ChatFamily::kDeepSeek);
const ChatFormat kGptOss = ChatFormat::of(ChatFamily::kGptOss);
const ChatFormat kPlain = ChatFormat::of(ChatFamily::kContentOnly);

// ----------------------------------------------------------------------------------------------------------------------
// Format detection from the real templates

ChatFormat detect_file(const std::string& rel) {
  return detect_chat_format(test::read_text(test::shared_path("testdata/chat_templates/" + rel)));
}

TEST(ChatFormatDetect, RealTemplates) {
  struct Want {
    const char* file;
    ChatFamily family;
    const char* think_open;
  };
  const Want wants[] = {
      {"llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja", ChatFamily::kHermes, ""},
      {"llama.cpp/Qwen-Qwen3-0.6B.jinja", ChatFamily::kHermes, "<think>"},
      {"llama.cpp/Qwen-QwQ-32B.jinja", ChatFamily::kHermes, "<think>"},
      {"llama.cpp/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", ChatFamily::kHermes, ""},
      {"llama.cpp/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", ChatFamily::kHermes, ""},
      {"llama.cpp/ibm-granite-granite-4.0.jinja", ChatFamily::kHermes, ""},
      {"llama.cpp/Qwen3-Coder.jinja", ChatFamily::kQwen3Coder, ""},
      {"llama.cpp/Qwen3.5-4B.jinja", ChatFamily::kQwen3Coder, "<think>"},
      {"llama.cpp/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", ChatFamily::kQwen3Coder, "<think>"},
      {"ollama/qwen38_chat_template.jinja", ChatFamily::kQwen3Coder, "<think>"},
      {"llama.cpp/ByteDance-Seed-OSS.jinja", ChatFamily::kQwen3Coder, "<seed:think>"},
      {"llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja", ChatFamily::kLlama3, ""},
      {"llama.cpp/meta-llama-Llama-3.2-3B-Instruct.jinja", ChatFamily::kLlama3, ""},
      {"llama.cpp/meta-llama-Llama-3.3-70B-Instruct.jinja", ChatFamily::kLlama3, ""},
      {"llama.cpp/mistralai-Mistral-Nemo-Instruct-2407.jinja", ChatFamily::kMistral, ""},
      {"llama.cpp/Mistral-Small-3.2-24B-Instruct-2506.jinja", ChatFamily::kMistral, ""},
      {"llama.cpp/unsloth-mistral-Devstral-Small-2507.jinja", ChatFamily::kMistral, ""},
      {"llama.cpp/mistralai-Ministral-3-14B-Reasoning-2512.jinja", ChatFamily::kMistral, "[THINK]"},
      {"llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", ChatFamily::kDeepSeek, "<think>"},
      {"llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", ChatFamily::kDeepSeek, "<think>"},
      {"llama.cpp/deepseek-ai-DeepSeek-V3.1.jinja", ChatFamily::kDeepSeek, "<think>"},
      {"llama.cpp/llama-cpp-deepseek-r1.jinja", ChatFamily::kDeepSeek, "<think>"},
      {"llama.cpp/openai-gpt-oss-120b.jinja", ChatFamily::kGptOss, ""},
      {"llama.cpp/google-gemma-2-2b-it.jinja", ChatFamily::kContentOnly, ""},
      {"llama.cpp/microsoft-Phi-3.5-mini-instruct.jinja", ChatFamily::kContentOnly, ""},
      {"llama.cpp/GLM-4.6.jinja", ChatFamily::kContentOnly, "<think>"},
      {"llama.cpp/MiniMax-M2.jinja", ChatFamily::kContentOnly, "<think>"},
  };
  for (const auto& w : wants) {
    const ChatFormat f = detect_file(w.file);
    EXPECT_EQ(f.family, w.family) << w.file << " detected as " << f.name();
    EXPECT_EQ(f.think_open, w.think_open) << w.file;
  }
  const ChatFormat seed = detect_file("llama.cpp/ByteDance-Seed-OSS.jinja");
  EXPECT_EQ(seed.tool_open, "<seed:tool_call>");
  EXPECT_EQ(seed.tool_close, "</seed:tool_call>");
}

TEST(ChatFormatDetect, EveryTemplateInSharedData) {
  // Every real template gets a family and a parser that copes with a typical answer.
  size_t n = 0;
  for (const auto* dir : {"testdata/chat_templates/llama.cpp", "testdata/chat_templates/ollama"}) {
    for (const auto& e : std::filesystem::directory_iterator(test::shared_path(dir))) {
      if (e.path().extension() != ".jinja" && e.path().extension() != ".jinja2") continue;
      const ChatFormat f = detect_chat_format(test::read_text(e.path()));
      const ParsedMessage m = parse_output(f, "Hello there!");
      EXPECT_EQ(m.content, "Hello there!") << e.path() << " (" << f.name() << ")";
      ++n;
    }
  }
  EXPECT_GE(n, 60u);
}

TEST(ChatFormatDetect, PromptOpensReasoning) {
  const ChatFormat qwen = detect_file("llama.cpp/Qwen3.5-4B.jinja");
  EXPECT_TRUE(prompt_opens_reasoning(qwen, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning(qwen, "<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_reasoning(qwen, "<|im_start|>assistant\n<think></think>"));
  const ChatFormat r1 = detect_file("llama.cpp/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
  EXPECT_TRUE(prompt_opens_reasoning(r1,
                                     "<\xEF\xBD\x9CUser\xEF\xBD\x9Chi<\xEF\xBD\x9C"
                                     "Assistant\xEF\xBD\x9C><think>\n"));
  const ChatFormat ministral = detect_file("llama.cpp/mistralai-Ministral-3-14B-Reasoning-2512.jinja");
  EXPECT_TRUE(prompt_opens_reasoning(ministral, "[INST]hi[/INST][THINK]"));
  EXPECT_FALSE(prompt_opens_reasoning(ministral, "[INST]hi[/INST]"));
  EXPECT_FALSE(prompt_opens_reasoning(kGptOss, "<|start|>assistant"));
  EXPECT_TRUE(prompt_opens_reasoning(kGptOss, "<|start|>assistant<|channel|>analysis<|message|>"));
  EXPECT_FALSE(prompt_opens_reasoning(detect_file("llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja"), "<think>\n"));
}

// ----------------------------------------------------------------------------------------------------------------------
// Round trip through the real templates: each template's own rendering of an assistant turn that calls get_weather
// (Paris/2, and Rome/3 where the template allows parallel calls), i.e. exactly the text the model was trained to
// produce. The strings were made with Python jinja2 set up as transformers does (trim_blocks, lstrip_blocks, tojson
// with ensure_ascii=False): render([user, assistant], add_generation_prompt=False) minus the longest common prefix with
// render([user], add_generation_prompt=True), end-of-turn token removed. prompt_tail is the end of the latter.

TEST(ChatParseRoundTrip, TemplatesOwnToolCallRendering) {
  struct Case {
    const char* file;
    size_t calls;
    const char* prompt_tail;
    const char* assistant;
  };
  const Case cases[] = {
      {"llama.cpp/NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", 2, ">\n<|im_start|>assistant\n",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": "
       "2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\", \"days\": "
       "3}}\n</tool_call>"},
      {"llama.cpp/ibm-granite-granite-4.0.jinja", 2, "assistant<|end_of_role|>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": "
       "2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\", \"days\": "
       "3}}\n</tool_call>"},
      {"llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja", 1, "stant<|end_header_id|>\n\n",
       "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\", \"days\": 2}}"},
      {"llama.cpp/meta-llama-Llama-3.2-3B-Instruct.jinja", 1, "stant<|end_header_id|>\n\n",
       "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\", \"days\": 2}}"},
      {"llama.cpp/openai-gpt-oss-120b.jinja", 1, "|end|><|start|>assistant",
       " to=functions.get_weather<|channel|>commentary json<|message|>{\"location\": \"Paris\", \"days\": 2}<|call|>"},
      {"ollama/qwen38_chat_template.jinja", 2, "tart|>assistant\n<think>\n",
       "\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=days>\n2\n</"
       "parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=location>\nRome\n</"
       "parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"},
      {"llama.cpp/Qwen-Qwen3-0.6B.jinja", 2, ">\n<|im_start|>assistant\n",
       "<think>\n\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": "
       "2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\", \"days\": "
       "3}}\n</tool_call>"},
      {"llama.cpp/Qwen-Qwen2.5-7B-Instruct.jinja", 2, ">\n<|im_start|>assistant\n",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": "
       "2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\", \"days\": "
       "3}}\n</tool_call>"},
      {"llama.cpp/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", 2, ">\n<|im_start|>assistant\n",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": "
       "2}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\", \"days\": "
       "3}}\n</tool_call>"},
      {"llama.cpp/Qwen3-Coder.jinja", 2, ">\n<|im_start|>assistant\n",
       "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</"
       "function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=location>\nRome\n</"
       "parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"},
      {"llama.cpp/Qwen3.5-4B.jinja", 2, "tart|>assistant\n<think>\n",
       "\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=days>\n2\n</"
       "parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=location>\nRome\n</"
       "parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"},
      {"llama.cpp/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", 2, "tart|>assistant\n<think>\n",
       "</think>\n<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=days>\n2\n</"
       "parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=location>\nRome\n</"
       "parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"},
      {"llama.cpp/meta-llama-Llama-3.3-70B-Instruct.jinja", 1, "stant<|end_header_id|>\n\n",
       "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris\", \"days\": 2}}"},
      {"llama.cpp/mistralai-Mistral-Nemo-Instruct-2407.jinja", 2, "n Paris and Rome?[/INST]",
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": 2}, \"id\": \"call00001\"}, "
       "{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Rome\", \"days\": 3}, \"id\": \"call00002\"}]"},
      {"llama.cpp/Mistral-Small-3.2-24B-Instruct-2506.jinja", 2, "n Paris and Rome?[/INST]",
       "[TOOL_CALLS]get_weather[CALL_ID]call00001[ARGS]{\"location\": \"Paris\", \"days\": "
       "2}[TOOL_CALLS]get_weather[CALL_ID]call00002[ARGS]{\"location\": \"Rome\", \"days\": 3}"},
      {"llama.cpp/unsloth-mistral-Devstral-Small-2507.jinja", 2, "n Paris and Rome?[/INST]",
       "[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\", \"days\": 2}[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Rome\", "
       "\"days\": 3}"},
      {"llama.cpp/mistralai-Ministral-3-14B-Reasoning-2512.jinja", 2, "n Paris and Rome?[/INST]",
       "[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\", \"days\": 2}[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Rome\", "
       "\"days\": 3}"},
      {"llama.cpp/deepseek-ai-DeepSeek-V3.1.jinja", 2, "sistant｜><think></think>",
       "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"Paris\", \"days\": "
       "2}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"location\": \"Rome\", \"days\": "
       "3}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
      {"llama.cpp/ByteDance-Seed-OSS.jinja", 2, "eos><seed:bos>assistant\n",
       "<seed:tool_call>\n<function=get_weather>\n<parameter=location>Paris</parameter>\n<parameter=days>2</parameter>\n</"
       "function>\n</seed:tool_call>\n<seed:tool_call>\n<function=get_weather>\n<parameter=location>Rome</"
       "parameter>\n<parameter=days>3</parameter>\n</function>\n</seed:tool_call>"},
  };
  ParserOptions o;
  o.tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}, "required": ["location"]}}}])");
  const std::vector<Call> want = {{"get_weather", {{"location", "Paris"}, {"days", 2}}},
                                  {"get_weather", {{"location", "Rome"}, {"days", 3}}}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.file);
    const ChatFormat f = detect_file(c.file);
    o.starts_in_reasoning = prompt_opens_reasoning(f, c.prompt_tail);
    const ParsedMessage m = parse_all_ways(f, o, c.assistant, 4);
    EXPECT_EQ(m.content, "");
    EXPECT_EQ(m.reasoning_content, "");
    EXPECT_TRUE(m.errors.empty());
    expect_calls(m, std::vector<Call>(want.begin(), want.begin() + static_cast<std::ptrdiff_t>(c.calls)));
  }
}

// ----------------------------------------------------------------------------------------------------------------------
// Hermes / Qwen JSON

TEST(ChatParseHermes, SingleCall) {
  const auto m = parse_all_ways(
      kHermes, with_tools(),
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": 2}}\n</tool_call>");
  EXPECT_EQ(m.content, "");
  EXPECT_EQ(m.reasoning_content, "");
  expect_calls(m, {{"get_weather", {{"location", "Paris"}, {"days", 2}}}});
  // The arguments are the model's own text, not a re-serialisation.
  EXPECT_EQ(m.tool_calls[0].arguments, R"({"location": "Paris", "days": 2})");
  EXPECT_TRUE(m.tool_calls[0].id.starts_with("call_"));
  EXPECT_EQ(m.tool_calls[0].id.size(), 5u + 24u);
  EXPECT_TRUE(m.errors.empty());
  const json j = m.to_openai_json();
  EXPECT_TRUE(j["content"].is_null());
  EXPECT_EQ(j["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(j["tool_calls"][0]["type"], "function");
}

TEST(ChatParseHermes, ParallelCallsWithContentAndReasoning) {
  const std::string out =
      "<think>\nThe user wants the weather and the time in Paris.\nI'll call both tools.\n</think>\n\n"
      "Let me look that up.\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  const auto m = parse_all_ways(kHermes, with_tools(), out);
  EXPECT_EQ(m.reasoning_content, "The user wants the weather and the time in Paris.\nI'll call both tools.");
  EXPECT_EQ(m.content, "Let me look that up.");
  expect_calls(m, {{"get_weather", {{"location", "Paris"}}}, {"get_time", {{"city", "Paris"}}}});
  EXPECT_NE(m.tool_calls[0].id, m.tool_calls[1].id);
}

TEST(ChatParseHermes, NoCallsAndContentAfterCall) {
  auto m = parse_all_ways(kHermes, with_tools(), "  The weather in Paris is sunny, 24°C.\n\nAnything else? ");
  EXPECT_EQ(m.content, "The weather in Paris is sunny, 24°C.\n\nAnything else?");
  EXPECT_TRUE(m.tool_calls.empty());
  m = parse_all_ways(kHermes, with_tools(),
                     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\nDone, waiting for results.");
  expect_calls(m, {{"get_time", json::object()}});
  EXPECT_EQ(m.content, "Done, waiting for results.");
}

TEST(ChatParseHermes, StartsInReasoning) {
  ParserOptions o = with_tools();
  o.starts_in_reasoning = true;
  auto m = parse_all_ways(kHermes, o, "Okay, simple question.\n</think>\n\nParis is the capital of France.");
  EXPECT_EQ(m.reasoning_content, "Okay, simple question.");
  EXPECT_EQ(m.content, "Paris is the capital of France.");
  // A model that repeats the opening tag anyway.
  m = parse_all_ways(kHermes, o, "<think>\nhmm\n</think>\nYes.");
  EXPECT_EQ(m.reasoning_content, "hmm");
  EXPECT_EQ(m.content, "Yes.");
  // Reasoning cut off by the token limit stays reasoning.
  m = parse_all_ways(kHermes, o, "Let me think about this carefully");
  EXPECT_EQ(m.reasoning_content, "Let me think about this carefully");
  EXPECT_EQ(m.content, "");
  // A tool call straight after reasoning without </think> ends the reasoning.
  m = parse_all_ways(
      kHermes, o, "I need the time.\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
  EXPECT_EQ(m.reasoning_content, "I need the time.");
  expect_calls(m, {{"get_time", {{"city", "Oslo"}}}});
}

TEST(ChatParseHermes, ReasoningOrToolsDisabledLeaveMarkupInContent) {
  ParserOptions o = with_tools();
  o.reasoning = false;
  const std::string out = "<think>\nR\n</think>\n\nC";
  auto m = parse_all_ways(kHermes, o, out);
  EXPECT_EQ(m.content, out);
  EXPECT_EQ(m.reasoning_content, "");
  ParserOptions no_tools;
  no_tools.parse_tool_calls = false;
  const std::string call = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  m = parse_all_ways(kHermes, no_tools, call);
  EXPECT_EQ(m.content, call);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(ChatParseHermes, TagLookalikesAreContent) {
  const std::string out = "Use <tool> or <tool_calls> or <tool_call or <function name=x> in HTML: a<b && c>d <";
  const auto m = parse_all_ways(kHermes, with_tools(), out);
  EXPECT_EQ(m.content, out);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(ChatParseHermes, HoldsBackPossibleTagThenReleasesIt) {
  OutputParser p(kHermes, with_tools());
  EXPECT_EQ(p.push("Hello <tool").content, "Hello");
  EXPECT_EQ(p.push("_ca").content, "");
  // Not a tag after all: released as content.
  EXPECT_EQ(p.push("r> ok").content, " <tool_car> ok");
  EXPECT_EQ(p.push(" <tool_call>\n{\"name\": \"get_time\", \"argu").content, "");
  Delta d = p.push("ments\": {\"city\": \"Ro");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_time");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": \"Ro");
  d = p.push("me\"}}\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.tool_calls[0].name.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, "me\"}");
  p.finish();
  EXPECT_EQ(p.message().content, "Hello <tool_car> ok");
  EXPECT_EQ(p.message().tool_calls[0].arguments, "{\"city\": \"Rome\"}");
  EXPECT_THROW(p.push("x"), pg::Error);
  EXPECT_TRUE(p.finish().empty());
}

TEST(ChatParseHermes, ArgumentVariants) {
  // Arguments before the name, arguments as a JSON string, "parameters" key, extra keys, no arguments.
  auto m = parse_all_ways(kHermes, {}, "<tool_call>\n{\"arguments\": {\"a\": [1, 2]}, \"name\": \"f\"}\n</tool_call>");
  expect_calls(m, {{"f", {{"a", {1, 2}}}}});
  m = parse_all_ways(kHermes, {}, "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}\n</tool_call>");
  expect_calls(m, {{"f", {{"a", 1}}}});
  m = parse_all_ways(kHermes, {},
                     "<tool_call>\n{\"type\": \"function\", \"name\": \"f\", \"parameters\": {\"b\": null}}</tool_call>");
  expect_calls(m, {{"f", {{"b", nullptr}}}});
  m = parse_all_ways(kHermes, {}, "<tool_call>\n{\"name\": \"f\"}\n</tool_call>");
  expect_calls(m, {{"f", json::object()}});
  // Two objects in one tag, and a list of calls in one tag (Apriel).
  m = parse_all_ways(kHermes, {},
                     "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>");
  expect_calls(m, {{"a", json::object()}, {"b", json::object()}});
  m = parse_all_ways(
      kHermes, {}, "<tool_call>[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]</tool_call>");
  expect_calls(m, {{"a", {{"x", 1}}}, {"b", json::object()}});
}

TEST(ChatParseHermes, ArgumentsAreNormalisedToStrictJson) {
  // Raw newlines/tabs inside strings, \' escapes, unicode escapes and non-ASCII text.
  const std::string out =
      "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.py\", \"content\": "
      "\"def f():\n\treturn 'x' \\' \\u00e9 \\ud83d\\ude00 ü 日本\"}}\n</tool_call>";
  const auto m = parse_all_ways(kHermes, with_tools(), out);
  ASSERT_EQ(m.tool_calls.size(), 1u);
  const json a = json::parse(m.tool_calls[0].arguments);
  EXPECT_EQ(a["content"], "def f():\n\treturn 'x' ' \xC3\xA9 \xF0\x9F\x98\x80 ü 日本");
  EXPECT_TRUE(m.errors.empty());
}

TEST(ChatParseHermes, MalformedCalls) {
  // Not JSON at all: the whole block is content.
  std::string out = "<tool_call>\nget_weather(location=\"Paris\")\n</tool_call>";
  auto m = parse_all_ways(kHermes, with_tools(), out);
  EXPECT_EQ(m.content, out);
  EXPECT_TRUE(m.tool_calls.empty());
  // Unclosed at finish before anything was emitted: content.
  out = "Checking.\n<tool_call>\n{\"name\": \"get_wea";
  m = parse_all_ways(kHermes, with_tools(), out);
  EXPECT_EQ(m.content, out);
  EXPECT_TRUE(m.tool_calls.empty());
  // Object without a name: content.
  out = "<tool_call>\n{\"arguments\": {}}\n</tool_call>";
  m = parse_all_ways(kHermes, with_tools(), out);
  EXPECT_EQ(m.content, out);
  // Invalid JSON after the arguments started streaming: the call keeps what was valid, closed, and an error is noted.
  m = parse_all_ways(
      kHermes, with_tools(),
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"days\": }\n</tool_call>\nok");
  expect_calls(m, {{"get_weather", {{"location", "Paris"}}}});
  EXPECT_FALSE(m.errors.empty());
  EXPECT_EQ(m.content, "ok");
  // Cut off by the token limit inside a string.
  m = parse_all_ways(kHermes, with_tools(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Par");
  expect_calls(m, {{"get_weather", {{"location", "Par"}}}});
  EXPECT_EQ(m.errors.size(), 1u);
  // Cut off inside a number that is complete so far.
  m = parse_all_ways(kHermes, with_tools(), "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 12");
  expect_calls(m, {{"get_weather", {{"days", 12}}}});
  // Missing final brace of the call object (a common small-model slip): the call stands.
  m = parse_all_ways(kHermes, with_tools(),
                     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Rome\"}\n</tool_call>");
  expect_calls(m, {{"get_time", {{"city", "Rome"}}}});
  EXPECT_EQ(m.content, "");
}

// ----------------------------------------------------------------------------------------------------------------------
// Qwen3-Coder XML

TEST(ChatParseQwen3Coder, TypedParametersFromSchema) {
  const std::string out =
      "<tool_call>\n<function=get_weather>\n"
      "<parameter=location>\nParis, France\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n"
      "<parameter=detailed>\nTrue\n</parameter>\n"
      "<parameter=options>\n{\"units\": \"metric\", \"lang\": [\"fr\"]}\n</parameter>\n"
      "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
      "<parameter=ratio>\nnull\n</parameter>\n"
      "</function>\n</tool_call>";
  const auto m = parse_all_ways(kCoder, with_tools(), out);
  EXPECT_EQ(m.content, "");
  expect_calls(m, {{"get_weather",
                    {{"location", "Paris, France"},
                     {"days", 3},
                     {"detailed", true},
                     {"options", {{"units", "metric"}, {"lang", {"fr"}}}},
                     {"tags", {"a", "b"}},
                     {"ratio", nullptr}}}});
  EXPECT_TRUE(m.errors.empty());
}

TEST(ChatParseQwen3Coder, StringsWithoutSchemaAndBadTypedValues) {
  const std::string out = "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
  auto m = parse_all_ways(kCoder, {}, out);
  expect_calls(m, {{"get_weather", {{"days", "3"}}}});
  // The schema says integer but the value is not a number: kept as a string rather than lost.
  m = parse_all_ways(kCoder, with_tools(),
                     "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>");
  expect_calls(m, {{"get_weather", {{"days", "three"}}}});
}

TEST(ChatParseQwen3Coder, MultilineCodeValue) {
  const std::string code = "#include <functional>\nint main() {\n  if (a < b && c > d) return \"</para\";\n\n  return 0;\n}\n";
  const std::string out =
      "I'll write the file.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.cpp\n</parameter>\n"
      "<parameter=content>\n" +
      code + "\n</parameter>\n</function>\n</tool_call>";
  const auto m = parse_all_ways(kCoder, with_tools(), out);
  EXPECT_EQ(m.content, "I'll write the file.");
  expect_calls(m, {{"write_file", {{"path", "src/main.cpp"}, {"content", code}}}});
}

TEST(ChatParseQwen3Coder, ParallelCallsWithReasoningOpenedInPrompt) {
  ParserOptions o = with_tools();
  o.starts_in_reasoning = true;
  const std::string out =
      "The user asks for weather in two cities.\n</think>\n\nChecking both.\n\n"
      "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>\n"
      "<tool_call>\n<function=get_weather>\n<parameter=location>\nBerlin\n</parameter>\n</function>\n</tool_call>";
  const auto m = parse_all_ways(kCoder, o, out);
  EXPECT_EQ(m.reasoning_content, "The user asks for weather in two cities.");
  EXPECT_EQ(m.content, "Checking both.");
  expect_calls(m, {{"get_weather", {{"location", "Paris"}}}, {"get_weather", {{"location", "Berlin"}}}});
}

TEST(ChatParseQwen3Coder, BareFunctionWithoutWrapper) {
  // Qwen3-Coder sometimes drops <tool_call>; a known tool name still makes a call.
  auto m = parse_all_ways(kCoder, with_tools(), "<function=get_time>\n<parameter=city>\nLima\n</parameter>\n</function>");
  expect_calls(m, {{"get_time", {{"city", "Lima"}}}});
  // An unknown name (with a tool list) is content.
  const std::string out = "Call <function=launch_missiles>\n<parameter=x>\n1\n</parameter>\n</function> never.";
  m = parse_all_ways(kCoder, with_tools(), out);
  EXPECT_EQ(m.content, out);
  EXPECT_TRUE(m.tool_calls.empty());
}

TEST(ChatParseQwen3Coder, MalformedAndTruncated) {
  // Cut off inside a value: the call is closed with what arrived.
  auto m =
      parse_all_ways(kCoder, with_tools(),
                     "<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n<parameter=content>\nhello wor");
  expect_calls(m, {{"write_file", {{"path", "a.txt"}, {"content", "hello wor"}}}});
  EXPECT_FALSE(m.errors.empty());
  // Missing </parameter> before the next parameter and before </function>.
  m = parse_all_ways(
      kCoder, with_tools(),
      "<tool_call>\n<function=get_weather>\n<parameter=location>\nOslo\n<parameter=days>\n2\n</function>\n</tool_call>");
  expect_calls(m, {{"get_weather", {{"location", "Oslo"}, {"days", 2}}}});
  // A body that is neither JSON nor <function=: content.
  const std::string junk = "<tool_call>\nget_weather Oslo\n</tool_call>";
  m = parse_all_ways(kCoder, with_tools(), junk);
  EXPECT_EQ(m.content, junk);
  // The JSON body also works under the Qwen3-Coder family (Qwen3.5 sometimes answers in Hermes style).
  m = parse_all_ways(kCoder, with_tools(),
                     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>");
  expect_calls(m, {{"get_time", {{"city", "Rome"}}}});
}

TEST(ChatParseQwen3Coder, SeedOssTags) {
  const ChatFormat seed = detect_file("llama.cpp/ByteDance-Seed-OSS.jinja");
  const auto m = parse_all_ways(seed, with_tools(),
                                "<seed:think>Need time.</seed:think>Sure.<seed:tool_call>\n<function=get_time>\n"
                                "<parameter=city>Tokyo</parameter>\n</function>\n</seed:tool_call>");
  EXPECT_EQ(m.reasoning_content, "Need time.");
  EXPECT_EQ(m.content, "Sure.");
  expect_calls(m, {{"get_time", {{"city", "Tokyo"}}}});
}

// ----------------------------------------------------------------------------------------------------------------------
// Llama 3.x

TEST(ChatParseLlama3, JsonCall) {
  auto m =
      parse_all_ways(kLlama, with_tools(), "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"San Francisco, CA\"}}");
  expect_calls(m, {{"get_weather", {{"location", "San Francisco, CA"}}}});
  EXPECT_EQ(m.content, "");
  m = parse_all_ways(kLlama, with_tools(),
                     "<|python_tag|>{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": {\"city\": \"Paris\"}}");
  expect_calls(m, {{"get_time", {{"city", "Paris"}}}});
  // Several calls in a row.
  m = parse_all_ways(
      kLlama, with_tools(),
      "{\"name\": \"get_time\", \"parameters\": {\"city\": \"A\"}}; {\"name\": \"get_time\", \"parameters\": {\"city\": \"B\"}}");
  expect_calls(m, {{"get_time", {{"city", "A"}}}, {"get_time", {{"city", "B"}}}});
}

TEST(ChatParseLlama3, JsonAnswerIsNotACall) {
  // With a tool list, an object naming no listed tool is an ordinary JSON answer.
  std::string out = "{\"name\": \"Bob\", \"age\": 42}";
  auto m = parse_all_ways(kLlama, with_tools(), out);
  EXPECT_EQ(m.content, out);
  EXPECT_TRUE(m.tool_calls.empty());
  out = "Here it is: {\"name\": \"get_time\", \"parameters\": {}}";
  m = parse_all_ways(kLlama, with_tools(), out);
  EXPECT_EQ(m.content, out);
  out = "{ not json at all";
  m = parse_all_ways(kLlama, with_tools(), out);
  EXPECT_EQ(m.content, out);
}

TEST(ChatParseLlama3, BuiltinTools) {
  auto m = parse_all_ways(kLlama, with_tools(), "<|python_tag|>brave_search.call(query=\"weather in Menlo Park\")");
  expect_calls(m, {{"brave_search", {{"query", "weather in Menlo Park"}}}});
  m = parse_all_ways(kLlama, with_tools(), "<|python_tag|>wolfram_alpha.call(query='2+2', precise=True, n=3)");
  expect_calls(m, {{"wolfram_alpha", {{"query", "2+2"}, {"precise", true}, {"n", 3}}}});
  // code_interpreter: raw Python after the tag.
  const std::string code = "import math\nprint(math.sqrt(2) * \"x\")\n";
  m = parse_all_ways(kLlama, with_tools(), "<|python_tag|>" + code);
  expect_calls(m, {{"python", {{"code", code}}}});
}

// ----------------------------------------------------------------------------------------------------------------------
// Mistral

TEST(ChatParseMistral, JsonListForm) {
  auto m = parse_all_ways(
      kMistral, with_tools(),
      "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}, \"id\": \"abc123def\"}]");
  expect_calls(m, {{"get_weather", {{"location", "Paris"}}}});
  ASSERT_EQ(m.tool_calls.size(), 1u);
  EXPECT_EQ(m.tool_calls[0].id.size(), 9u);  // Mistral templates require 9 alphanumerics
  m = parse_all_ways(kMistral, with_tools(),
                     "Sure.[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {\"city\": \"A\"}}, "
                     "{\"name\": \"get_time\", \"arguments\": {\"city\": \"B\"}}]");
  EXPECT_EQ(m.content, "Sure.");
  expect_calls(m, {{"get_time", {{"city", "A"}}}, {"get_time", {{"city", "B"}}}});
}

TEST(ChatParseMistral, NameArgsForm) {
  auto m = parse_all_ways(kMistral, with_tools(), "[TOOL_CALLS]get_weather[ARGS]{\"location\": \"Paris\", \"days\": 1}");
  expect_calls(m, {{"get_weather", {{"location", "Paris"}, {"days", 1}}}});
  m = parse_all_ways(kMistral, with_tools(),
                     "Hello, world!\nWhat's up?[TOOL_CALLS]get_time[ARGS]{\"city\": "
                     "\"A\"}[TOOL_CALLS]get_time[CALL_ID]000000002[ARGS]{\"city\": \"B\"}");
  EXPECT_EQ(m.content, "Hello, world!\nWhat's up?");
  expect_calls(m, {{"get_time", {{"city", "A"}}}, {"get_time", {{"city", "B"}}}});
}

TEST(ChatParseMistral, ReasoningAndMalformed) {
  const ChatFormat ministral = detect_file("llama.cpp/mistralai-Ministral-3-14B-Reasoning-2512.jinja");
  auto m = parse_all_ways(ministral, with_tools(),
                          "[THINK]Let me think about [TOOL_CALLS]get_time[ARGS]{\"city\":\"X\"} and more[/THINK]"
                          "[TOOL_CALLS]get_time[ARGS]{\"city\": \"Y\"}");
  EXPECT_EQ(m.reasoning_content, "Let me think about [TOOL_CALLS]get_time[ARGS]{\"city\":\"X\"} and more");
  expect_calls(m, {{"get_time", {{"city", "Y"}}}});
  const std::string bad = "[TOOL_CALLS] I cannot call tools right now.";
  m = parse_all_ways(kMistral, with_tools(), bad);
  EXPECT_EQ(m.content, bad);
  m = parse_all_ways(kMistral, with_tools(), "[TOOL_CALLS]get_time[ARGS]{\"city\": \"Y\"");
  expect_calls(m, {{"get_time", {{"city", "Y"}}}});
  EXPECT_EQ(m.errors.size(), 1u);
}

// ----------------------------------------------------------------------------------------------------------------------
// DeepSeek

const std::string kDsCallsBegin = "<｜tool▁calls▁begin｜>";
const std::string kDsCallBegin = "<｜tool▁call▁begin｜>";
const std::string kDsSep = "<｜tool▁sep｜>";
const std::string kDsCallEnd = "<｜tool▁call▁end｜>";
const std::string kDsCallsEnd = "<｜tool▁calls▁end｜>";

TEST(ChatParseDeepSeek, R1Calls) {
  ParserOptions o = with_tools();
  o.starts_in_reasoning = true;  // the R1 templates end the prompt with <think>\n
  const std::string out = "The user wants weather for two cities.\n</think>\n\n" + kDsCallsBegin + kDsCallBegin + "function" +
                          kDsSep + "get_weather\n```json\n{\"location\": \"Paris\"}\n```" + kDsCallEnd + "\n" + kDsCallBegin +
                          "function" + kDsSep + "get_weather\n```json\n{\"location\": \"Rome\"}\n```" + kDsCallEnd + kDsCallsEnd;
  const auto m = parse_all_ways(kDeepSeek, o, out);
  EXPECT_EQ(m.reasoning_content, "The user wants weather for two cities.");
  expect_calls(m, {{"get_weather", {{"location", "Paris"}}}, {"get_weather", {{"location", "Rome"}}}});
  EXPECT_EQ(m.content, "");
}

TEST(ChatParseDeepSeek, V31Calls) {
  ParserOptions o = with_tools();
  o.starts_in_reasoning = true;
  const std::string out = "REASONING</think>CONTENT" + kDsCallsBegin + kDsCallBegin + "get_time" + kDsSep +
                          "{\"city\": \"Paris\"}" + kDsCallEnd + kDsCallBegin + "get_weather" + kDsSep +
                          "{\"location\": \"Paris\"}" + kDsCallEnd + kDsCallsEnd;
  const auto m = parse_all_ways(kDeepSeek, o, out);
  EXPECT_EQ(m.reasoning_content, "REASONING");
  EXPECT_EQ(m.content, "CONTENT");
  expect_calls(m, {{"get_time", {{"city", "Paris"}}}, {"get_weather", {{"location", "Paris"}}}});
}

TEST(ChatParseDeepSeek, PlainAndMalformed) {
  auto m = parse_all_ways(kDeepSeek, with_tools(), "<think>\nShort.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(m.reasoning_content, "Short.");
  EXPECT_EQ(m.content, "The answer is 4.");
  const std::string bad = "Hmm " + kDsCallsBegin + "I will call get_weather" + kDsCallsEnd;
  m = parse_all_ways(kDeepSeek, with_tools(), bad);
  EXPECT_EQ(m.content, bad);
  EXPECT_TRUE(m.tool_calls.empty());
  // A misspelled block token from an R1 distill.
  m = parse_all_ways(kDeepSeek, with_tools(),
                     "<｜tool_calls_begin｜>" + kDsCallBegin + "function" + kDsSep +
                         "get_time\n```json\n{\"city\": \"Rome\"}\n```" + kDsCallEnd);
  expect_calls(m, {{"get_time", {{"city", "Rome"}}}});
}

// ----------------------------------------------------------------------------------------------------------------------
// GPT-OSS (harmony)

TEST(ChatParseGptOss, AnalysisThenFinal) {
  const std::string out =
      "<|channel|>analysis<|message|>User greets. Respond.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I "
      "help?";
  auto m = parse_all_ways(kGptOss, with_tools(), out);
  EXPECT_EQ(m.reasoning_content, "User greets. Respond.");
  EXPECT_EQ(m.content, "Hello! How can I help?");
  m = parse_all_ways(kGptOss, with_tools(), out + "<|return|>");
  EXPECT_EQ(m.content, "Hello! How can I help?");
  ParserOptions o = with_tools();
  o.reasoning = false;
  m = parse_all_ways(kGptOss, o, out);
  EXPECT_EQ(m.content, "<|channel|>analysis<|message|>User greets. Respond.<|end|>Hello! How can I help?");
  EXPECT_EQ(m.reasoning_content, "");
}

TEST(ChatParseGptOss, ToolCalls) {
  // Recipient in the role part, with a constraint.
  auto m = parse_all_ways(kGptOss, with_tools(),
                          "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather"
                          "<|channel|>commentary <|constrain|>json<|message|>{\"location\":\"Tokyo\"}<|call|>");
  EXPECT_EQ(m.reasoning_content, "Need weather.");
  expect_calls(m, {{"get_weather", {{"location", "Tokyo"}}}});
  // Recipient in the channel part, preamble on commentary first.
  m = parse_all_ways(kGptOss, with_tools(),
                     "<|channel|>analysis<|message|>Check time.<|end|><|start|>assistant<|channel|>commentary<|message|>"
                     "Let me check.<|end|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json"
                     "<|message|>{\"city\": \"Oslo\"}<|call|>");
  EXPECT_EQ(m.content, "Let me check.");
  expect_calls(m, {{"get_time", {{"city", "Oslo"}}}});
  // Straight after the generation prompt "<|start|>assistant".
  m = parse_all_ways(kGptOss, with_tools(), " to=functions.get_time<|channel|>commentary<|message|>{\"city\": \"Lima\"}");
  expect_calls(m, {{"get_time", {{"city", "Lima"}}}});
}

TEST(ChatParseGptOss, EdgeCases) {
  // A message to a builtin tool is dropped with a note.
  auto m = parse_all_ways(kGptOss, with_tools(),
                          "<|channel|>analysis<|message|>Run python.<|end|><|start|>assistant<|channel|>commentary to=python "
                          "<|constrain|>code<|message|>print(\"hello\")<|call|>");
  EXPECT_EQ(m.reasoning_content, "Run python.");
  EXPECT_EQ(m.content, "");
  EXPECT_TRUE(m.tool_calls.empty());
  EXPECT_EQ(m.errors.size(), 1u);
  // Stray "<|channel|>commentary to=assistant" before the analysis channel.
  m = parse_all_ways(kGptOss, with_tools(),
                     "<|channel|>commentary to=assistant<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
                     "<|channel|>final<|message|>Hello, world!\nWhat's up?");
  EXPECT_EQ(m.reasoning_content, "I'm\nthinking");
  EXPECT_EQ(m.content, "Hello, world!\nWhat's up?");
  // No harmony markup at all.
  m = parse_all_ways(kGptOss, with_tools(), "to be or not to be <|chan");
  EXPECT_EQ(m.content, "to be or not to be <|chan");
  // Truncated analysis.
  m = parse_all_ways(kGptOss, with_tools(), "<|channel|>analysis<|message|>I'm\nthinking");
  EXPECT_EQ(m.reasoning_content, "I'm\nthinking");
  // Continuing an analysis message opened in the prompt.
  ParserOptions o = with_tools();
  o.starts_in_reasoning = true;
  m = parse_all_ways(kGptOss, o, " thinking<|end|><|start|>assistant<|channel|>final<|message|>Done.");
  EXPECT_EQ(m.reasoning_content, "thinking");
  EXPECT_EQ(m.content, "Done.");
}

// ----------------------------------------------------------------------------------------------------------------------
// Content only

TEST(ChatParseContentOnly, ReasoningTagsAndTrim) {
  ChatFormat f = kPlain;
  f.think_open = "<think>";
  f.think_close = "</think>";
  auto m = parse_all_ways(f, {}, "\n<think>\nA\n</think>\n\n  B  \n");
  EXPECT_EQ(m.reasoning_content, "A");
  EXPECT_EQ(m.content, "B");
  m = parse_all_ways(kPlain, {}, "<think>x</think> <tool_call>{}</tool_call>");
  EXPECT_EQ(m.content, "<think>x</think> <tool_call>{}</tool_call>");
  // Invalid UTF-8 is repaired, split multi-byte characters are not.
  m = parse_all_ways(kPlain, {}, "caf\xC3\xA9 \xFF ok \xE2\x82");
  EXPECT_EQ(m.content, "caf\xC3\xA9 \xEF\xBF\xBD ok \xEF\xBF\xBD");
}

}  // namespace
}  // namespace pg::chat
