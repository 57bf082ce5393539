// Request parsing and validation of the three chat APIs and the completions API, and prompt
// rendering with a real chat template (Qwen3's, with the Qwen3 vocabulary).
#include <gtest/gtest.h>

#include <cmath>

#include "gguf/gguf.h"
#include "server/chat_prompt.h"
#include "server/chat_request.h"
#include "testutil.h"

namespace pg::server {
namespace {

json J(const char* s) { return json::parse(s); }

// Runs f, expecting an ApiError with this status whose param (or message) mentions `what`.
template <class F>
void expect_error(F&& f, int status, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error; expected " << status << " about " << what;
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), status) << e.what();
    EXPECT_TRUE(e.param().find(what) != std::string::npos || std::string(e.what()).find(what) != std::string::npos)
        << "param '" << e.param() << "', message: " << e.what();
  }
}

TEST(ParseBody, MalformedJsonAndNonObjects) {
  expect_error([] { parse_body("{\"a\": "); }, 400, "not valid JSON");
  expect_error([] { parse_body(""); }, 400, "not valid JSON");
  expect_error([] { parse_body("[1,2]"); }, 400, "JSON object");
  expect_error([] { parse_body("\"x\""); }, 400, "JSON object");
  EXPECT_TRUE(parse_body(" {\"a\":1} ").is_object());
}

TEST(OpenAIChat, NormalisesMessagesForTemplates) {
  auto r = parse_openai_chat(J(R"({
    "model": "m", "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "42"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
              {"type": "web_search"}],
    "stop": "END", "max_completion_tokens": 7, "temperature": 0.5, "seed": 3, "user": "u", "some_new_field": 1,
    "logprobs": true, "top_logprobs": 2, "stream": true, "stream_options": {"include_usage": true}
  })"));
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "a\nb");
  EXPECT_EQ(r.messages[2]["content"], "");
  EXPECT_EQ(r.messages[2]["reasoning_content"], "hmm");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"], J(R"({"x": 1})"));  // object for templates
  EXPECT_EQ(r.messages[3]["tool_call_id"], "call_1");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.skipped_tools, std::vector<std::string>{"web_search"});
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.gen.max_tokens, 7);
  EXPECT_EQ(r.gen.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.ignored, std::vector<std::string>{"some_new_field"});
  SamplingParams d;
  auto sp = r.gen.resolve(d, -1);
  EXPECT_FLOAT_EQ(sp.temperature, 0.5f);
  EXPECT_EQ(sp.seed, 3u);
  EXPECT_EQ(sp.top_k, d.top_k);
}

TEST(OpenAIChat, RejectsWrongTypesAndAbsurdValues) {
  auto chat = [](const char* extra) {
    return [extra] { parse_openai_chat(J((std::string(R"({"messages":[{"role":"user","content":"hi"}])") + extra + "}").c_str())); };
  };
  expect_error(chat(R"(,"max_tokens": -1)"), 400, "max_tokens");
  expect_error(chat(R"(,"max_tokens": 0)"), 400, "max_tokens");
  expect_error(chat(R"(,"max_tokens": 1.5)"), 400, "max_tokens");
  expect_error(chat(R"(,"max_tokens": "5")"), 400, "max_tokens");
  expect_error(chat(R"(,"temperature": -0.1)"), 400, "temperature");
  expect_error(chat(R"(,"temperature": "hot")"), 400, "temperature");
  expect_error(chat(R"(,"top_p": 1.5)"), 400, "top_p");
  expect_error(chat(R"(,"n": 2)"), 400, "n");
  expect_error(chat(R"(,"stream": "yes")"), 400, "stream");
  expect_error(chat(R"(,"stop": 5)"), 400, "stop");
  expect_error(chat(R"(,"stop": ["a", 1])"), 400, "stop");
  expect_error(chat(R"(,"logit_bias": {"abc": 1})"), 400, "logit_bias");
  expect_error(chat(R"(,"logit_bias": {"5": 1000})"), 400, "logit_bias");
  expect_error(chat(R"(,"top_logprobs": 3)"), 400, "top_logprobs");
  expect_error(chat(R"(,"logprobs": true, "top_logprobs": 21)"), 400, "top_logprobs");
  expect_error(chat(R"(,"response_format": {"type": "json_schema"})"), 400, "response_format");
  expect_error(chat(R"(,"functions": [])"), 400, "functions");
  expect_error(chat(R"(,"tool_choice": "required")"), 400, "tool_choice");
  expect_error(chat(R"(,"tool_choice": "sometimes")"), 400, "tool_choice");
  expect_error(chat(R"(,"tools": [{"type":"function","function":{"name":"f"}}], "tool_choice": {"type":"function","function":{"name":"g"}})"),
               400, "tool_choice");
  expect_error(chat(R"(,"tools": [{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}])"), 400,
               "tools");
  expect_error(chat(R"(,"tools": [{"type":"function"}])"), 400, "tools[0]");
  expect_error([] { parse_openai_chat(J(R"({})")); }, 400, "messages");
  expect_error([] { parse_openai_chat(J(R"({"messages": []})")); }, 400, "messages");
  expect_error([] { parse_openai_chat(J(R"({"messages": "hi"})")); }, 400, "messages");
  expect_error([] { parse_openai_chat(J(R"({"messages": [{"role": "wizard", "content": "x"}]})")); }, 400, "messages[0].role");
  expect_error([] { parse_openai_chat(J(R"({"messages": [{"content": "x"}]})")); }, 400, "messages[0].role");
  expect_error([] { parse_openai_chat(J(R"({"messages": [{"role": "user"}]})")); }, 400, "messages[0].content");
  expect_error([] { parse_openai_chat(J(R"({"messages": [{"role": "user", "content": 5}]})")); }, 400, "messages[0].content");
  expect_error([] {
    parse_openai_chat(J(R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})"));
  }, 400, "messages[0].content[0]");
  // A large integer that is not representable stays an error, not an overflow.
  expect_error(chat(R"(,"max_tokens": 1e300)"), 400, "max_tokens");
}

TEST(OpenAIChat, ToolChoiceForms) {
  const char* base = R"({"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],)";
  auto tc = [&](const char* v) { return parse_openai_chat(J((std::string(base) + "\"tool_choice\":" + v + "}").c_str())); };
  EXPECT_EQ(tc("\"auto\"").tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(tc("\"none\"").tool_choice, ToolChoice::kNone);
  EXPECT_EQ(tc("\"required\"").tool_choice, ToolChoice::kRequired);
  auto named = tc(R"({"type":"function","function":{"name":"f"}})");
  EXPECT_EQ(named.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(named.tool_name, "f");
}

TEST(Responses, InputItemsBecomeTurns) {
  auto r = parse_responses(J(R"({
    "model": "m", "instructions": "sys", "store": false, "include": [],
    "input": [
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "need ls"}]},
      {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":[\"ls\"]}"},
      {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{\"cmd\":[\"pwd\"]}"},
      {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
      {"type": "function_call_output", "call_id": "c2", "output": "/tmp"},
      {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
      {"type": "web_search_call", "id": "ws"}
    ],
    "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}, {"type": "local_shell"}],
    "tool_choice": "auto", "max_output_tokens": 9, "reasoning": {"effort": "medium"}
  })"));
  ASSERT_EQ(r.messages.size(), 6u);
  EXPECT_EQ(r.messages[0], J(R"({"role":"system","content":"sys"})"));
  EXPECT_EQ(r.messages[1]["content"], "list files");
  EXPECT_EQ(r.messages[2]["role"], "assistant");
  EXPECT_EQ(r.messages[2]["reasoning_content"], "need ls");
  ASSERT_EQ(r.messages[2]["tool_calls"].size(), 2u);  // consecutive calls form one assistant turn
  EXPECT_EQ(r.messages[2]["tool_calls"][1]["id"], "c2");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["cmd"][0], "ls");
  EXPECT_EQ(r.messages[3], J(R"({"role":"tool","tool_call_id":"c1","content":"a.txt"})"));
  EXPECT_EQ(r.messages[5]["content"], "done");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["function"]["name"], "shell");
  EXPECT_EQ(r.gen.max_tokens, 9);
  EXPECT_EQ(r.template_kwargs["reasoning_effort"], "medium");

  auto s = parse_responses(J(R"({"input": "hello"})"));
  ASSERT_EQ(s.messages.size(), 1u);
  EXPECT_EQ(s.messages[0]["role"], "user");
  expect_error([] { parse_responses(J(R"({"input": "x", "previous_response_id": "resp_1"})")); }, 400, "previous_response_id");
  expect_error([] { parse_responses(J(R"({})")); }, 400, "input");
  expect_error([] { parse_responses(J(R"({"input": 3})")); }, 400, "input");
  expect_error([] { parse_responses(J(R"({"input": [{"type": "message", "role": "robot", "content": "x"}]})")); }, 400, "input[0].role");
  expect_error([] { parse_responses(J(R"({"input": "x", "text": {"format": {"type": "json_schema"}}})")); }, 400, "text.format");
  expect_error([] { parse_responses(J(R"({"input": "x", "max_output_tokens": 0})")); }, 400, "max_output_tokens");
}

TEST(Anthropic, BlocksBecomeTurns) {
  auto r = parse_anthropic(J(R"({
    "model": "claude", "max_tokens": 100,
    "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "call the tool", "signature": "sig"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
        {"type": "text", "text": "thanks"}]}
    ],
    "tools": [{"name": "get_weather", "description": "d", "input_schema": {"type": "object"}},
              {"type": "web_search_20250305", "name": "web_search"}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "stop_sequences": ["###"], "thinking": {"type": "enabled", "budget_tokens": 1024}, "metadata": {"user_id": "x"}
  })"));
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0], J(R"({"role":"system","content":"You are terse."})"));
  EXPECT_EQ(r.messages[2]["reasoning_content"], "call the tool");
  EXPECT_EQ(r.messages[2]["content"], "Checking.");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"], J(R"({"city":"Paris"})"));
  EXPECT_EQ(r.messages[3], J(R"({"role":"tool","tool_call_id":"toolu_1","content":"sunny"})"));
  EXPECT_EQ(r.messages[4], J(R"({"role":"user","content":"thanks"})"));
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["function"]["parameters"], J(R"({"type":"object"})"));
  EXPECT_EQ(r.tool_choice, ToolChoice::kRequired);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.gen.stop, std::vector<std::string>{"###"});
  EXPECT_EQ(r.enable_thinking, true);
  EXPECT_TRUE(r.ignored.empty());

  auto a = [](const char* body) { return [body] { parse_anthropic(J(body)); }; };
  expect_error(a(R"({"messages":[{"role":"user","content":"x"}]})"), 400, "max_tokens");
  expect_error(a(R"({"max_tokens":5,"messages":[{"role":"robot","content":"x"}]})"), 400, "messages[0].role");
  expect_error(a(R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]})"), 400,
               "messages[0].content[0]");
  expect_error(a(R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"b","input":{}}]}]})"),
               400, "messages[0].content[0].type");
  expect_error(a(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],"tools":[{"name":"t"}]})"), 400, "input_schema");
  expect_error(a(R"({"max_tokens":5,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"maybe"}})"), 400, "thinking.type");
  expect_error(a(R"({"max_tokens":-5,"messages":[{"role":"user","content":"x"}]})"), 400, "max_tokens");
  // count_tokens needs no max_tokens.
  EXPECT_EQ(parse_anthropic(J(R"({"messages":[{"role":"user","content":"x"}]})"), true).messages.size(), 1u);
}

TEST(Anthropic, ClaudeCodeRequestShape) {
  // As Claude Code sends it: a system turn after the user's, deferred tools, adaptive thinking
  // with the display omitted, output_config.effort, beta fields.
  auto r = parse_anthropic(J(R"({
    "model": "claude-opus", "max_tokens": 128000, "stream": true,
    "system": [{"type": "text", "text": "You are Claude Code."}],
    "messages": [
      {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}, {"type": "text", "text": "say hi"}]},
      {"role": "system", "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}]}
    ],
    "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
              {"name": "Later", "description": "deferred", "input_schema": {"type": "object"}, "defer_loading": true}],
    "thinking": {"type": "adaptive", "display": "omitted"}, "output_config": {"effort": "medium"},
    "context_management": {"edits": []}, "metadata": {"user_id": "u"}
  })"));
  ASSERT_EQ(r.messages.size(), 2u);
  EXPECT_EQ(r.messages[0], J(R"({"role":"system","content":"You are Claude Code.\n\n# Environment"})"));
  EXPECT_EQ(r.messages[1]["content"], "<system-reminder>x</system-reminder>\nsay hi");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0]["function"]["name"], "Bash");
  EXPECT_EQ(r.skipped_tools, std::vector<std::string>{"deferred:Later"});
  EXPECT_EQ(r.enable_thinking, true);
  EXPECT_TRUE(r.hide_reasoning);
  EXPECT_EQ(r.template_kwargs["reasoning_effort"], "medium");
  EXPECT_TRUE(r.ignored.empty());
  expect_error([] { parse_anthropic(J(R"({"max_tokens":5,"messages":[{"role":"system","content":"only"}]})")); }, 400, "messages");
}

TEST(Responses, CodexRequestShape) {
  // As Codex sends it: developer messages first, namespace and hosted tools, encrypted reasoning include.
  auto r = parse_responses(J(R"({
    "model": "m", "stream": true, "store": false, "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k",
    "reasoning": {"summary": "auto"}, "tool_choice": "auto", "parallel_tool_calls": true, "client_metadata": {"a": "b"},
    "input": [
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
      {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Skills."}]},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]}
    ],
    "tools": [{"type": "function", "name": "exec_command", "description": "d", "strict": false, "parameters": {"type": "object"}},
              {"type": "namespace", "name": "multi_agent_v1", "tools": []}, {"type": "web_search", "external_web_access": false}]
  })"));
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0], J(R"({"role":"system","content":"You are Codex.\n\nSkills."})"));
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.skipped_tools, (std::vector<std::string>{"namespace", "web_search"}));
  EXPECT_TRUE(r.ignored.empty());
}

TEST(Completions, PromptForms) {
  EXPECT_EQ(std::get<std::string>(parse_completion(J(R"({"prompt":"abc"})")).prompt), "abc");
  EXPECT_EQ(std::get<std::string>(parse_completion(J(R"({"prompt":["abc"]})")).prompt), "abc");
  EXPECT_EQ(std::get<std::vector<int32_t>>(parse_completion(J(R"({"prompt":[1,2,3]})")).prompt), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(std::get<std::vector<int32_t>>(parse_completion(J(R"({"prompt":[[4,5]]})")).prompt), (std::vector<int32_t>{4, 5}));
  expect_error([] { parse_completion(J(R"({"prompt":["a","b"]})")); }, 400, "prompt");
  expect_error([] { parse_completion(J(R"({"prompt":[1,-2]})")); }, 400, "prompt");
  expect_error([] { parse_completion(J(R"({})")); }, 400, "prompt");
  expect_error([] { parse_completion(J(R"({"prompt":"a","suffix":"b"})")); }, 400, "suffix");
  expect_error([] { parse_completion(J(R"({"prompt":"a","best_of":3})")); }, 400, "best_of");
  auto r = parse_completion(J(R"({"prompt":"a","logprobs":2,"echo":true,"max_tokens":3})"));
  EXPECT_EQ(r.gen.logprobs, 2);
  EXPECT_TRUE(r.echo);
}

class Qwen3Prompt : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = gguf::File::open(test::shared_path("testdata/tokenizer/ggml-vocab-qwen3.gguf").string());
    tok_ = tok::Tokenizer::from_gguf(*file_);
    prompt_ = std::make_unique<ChatPrompt>(test::read_text(test::shared_path("testdata/chat_templates/llama.cpp/Qwen-Qwen3-0.6B.jinja")),
                                           *tok_);
  }
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::unique_ptr<ChatPrompt> prompt_;
};

TEST_F(Qwen3Prompt, RendersToolsAndForcesToolChoice) {
  EXPECT_EQ(prompt_->format().family, chat::ChatFamily::kHermes);
  auto r = parse_openai_chat(J(R"({"messages":[{"role":"user","content":"weather in Paris?"}],
    "tools":[{"type":"function","function":{"name":"get_weather","description":"Weather of a city",
              "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]})"));
  RenderedPrompt p = prompt_->render(r);
  EXPECT_NE(p.text.find("get_weather"), std::string::npos);
  EXPECT_NE(p.text.find("<tools>"), std::string::npos);
  EXPECT_TRUE(p.text.ends_with("<|im_start|>assistant\n")) << p.text;
  EXPECT_TRUE(p.forced.empty());
  EXPECT_TRUE(p.parser.parse_tool_calls);
  // <|im_start|> is one control token, not text.
  EXPECT_EQ(p.tokens.front(), tok_->text_to_token("<|im_start|>"));

  r.tool_choice = ToolChoice::kNone;
  RenderedPrompt none = prompt_->render(r);
  EXPECT_EQ(none.text.find("get_weather"), std::string::npos);
  EXPECT_FALSE(none.parser.parse_tool_calls);
  EXPECT_LT(none.tokens.size(), p.tokens.size());

  r.tool_choice = ToolChoice::kNamed;
  r.tool_name = "get_weather";
  RenderedPrompt named = prompt_->render(r);
  EXPECT_EQ(named.forced, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {");
  EXPECT_TRUE(named.text.ends_with(named.forced));
  // The parser, fed the forced text, is inside the call.
  chat::OutputParser parser(prompt_->format(), named.parser);
  chat::Delta d = parser.push(named.forced);
  d.content += parser.push("\"city\": \"Paris\"}}\n</tool_call>").content;
  parser.finish();
  ASSERT_EQ(parser.message().tool_calls.size(), 1u);
  EXPECT_EQ(parser.message().tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(parser.message().tool_calls[0].arguments), J(R"({"city":"Paris"})"));
  EXPECT_TRUE(parser.message().content.empty());
}

TEST_F(Qwen3Prompt, ThinkingSwitchAndTemplateErrors) {
  auto r = parse_openai_chat(J(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}})"));
  RenderedPrompt p = prompt_->render(r);
  EXPECT_NE(p.text.find("<think>\n\n</think>"), std::string::npos) << p.text;
  auto a = parse_anthropic(J(R"({"max_tokens":5,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"disabled"}})"));
  EXPECT_NE(prompt_->render(a).text.find("<think>\n\n</think>"), std::string::npos);
  // The Qwen3.5 template raises for a conversation without a user query: a 400 naming the template.
  ChatPrompt q35(test::read_text(test::shared_path("testdata/chat_templates/llama.cpp/Qwen3.5-4B.jinja")), *tok_);
  EXPECT_EQ(q35.format().family, chat::ChatFamily::kQwen3Coder);
  auto bad = parse_openai_chat(J(R"({"messages":[{"role":"system","content":"only system"}]})"));
  expect_error([&] { q35.render(bad); }, 400, "No user query");
}

}  // namespace
}  // namespace pg::server
