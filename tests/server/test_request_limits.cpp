// Hostile request bodies found by fuzzing the request path (fuzz/fuzz_server_request.cpp) or while
// triaging its findings: each must be a 400 (or be accepted) quickly, never a crash, a 500 or minutes
// of CPU. Plus the pure first half of the handlers (server/prepare.h) that the fuzzer drives.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/synth.h"
#include "gguf/writer.h"
#include "server/chat_prompt.h"
#include "server/chat_request.h"
#include "server/json_util.h"
#include "server/prepare.h"
#include "testutil.h"

namespace pg::server {
namespace {

json J(const std::string& s) { return json::parse(s); }

// Runs f, expecting an ApiError 400 whose param or message mentions `what`; returns the message.
template <class F>
std::string expect_400(F&& f, const std::string& what) {
  try {
    f();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << e.what();
    EXPECT_TRUE(e.param().find(what) != std::string::npos || std::string(e.what()).find(what) != std::string::npos)
        << "param '" << e.param() << "', message: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error; expected 400 about " << what;
  return {};
}

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string nested(int depth, const std::string& inner = "") {
  return std::string(static_cast<size_t>(depth), '[') + inner + std::string(static_cast<size_t>(depth), ']');
}

const char* kUser = R"([{"role":"user","content":"hi"}])";

// Fuzzer finding: a number beyond double's range made nlohmann throw out_of_range, which parse_body
// did not catch (only parse_error): the handler answered 500 instead of 400.
TEST(BodyLimits, NumberOutOfRangeIs400) {
  expect_400([] { parse_body(R"({"max_tokens": 1e400})"); }, "not valid JSON");
  expect_400([] { parse_body("922300014734901e30014897285E{\"messages\":&?["); }, "not valid JSON");
  expect_400([] { parse_body(R"({"messages": [{"role": "user", "content": "x"}], "temperature": -1e999})"); }, "not valid JSON");
  EXPECT_EQ(parse_body(R"({"a": 1e300})")["a"], 1e300);
}

// Nesting a few hundred thousand levels deep (about 400 KB, far below the 32 MB body limit)
// overflowed the stack in json copies, dump() and template rendering.
TEST(BodyLimits, DeepNestingIs400) {
  const std::string deep = nested(200000);
  for (const std::string& body :
       {R"({"messages":[],"zzz":)" + deep + "}", std::string(R"({"chat_template_kwargs":{"x":)") + deep + "}}", deep}) {
    const std::string msg = expect_400([&] { parse_body(body); }, "levels deep");
    EXPECT_LT(msg.size(), 200u);
  }
  // kMaxBodyDepth levels are fine (the body object is the first), one more is not.
  EXPECT_NO_THROW(parse_body("{\"a\":" + nested(kMaxBodyDepth - 1) + "}"));
  expect_400([] { parse_body("{\"a\":" + nested(kMaxBodyDepth) + "}"); }, "levels deep");
  expect_400([] { parse_body("{\"a\":" + nested(10, "{\"b\":" + nested(kMaxBodyDepth) + "}") + "}"); }, "levels deep");
}

// Tool-call arguments arrive as a string and are parsed for the template: the same nesting limit
// applies there (a deep string used to crash rendering); a string too deep stays a string.
TEST(BodyLimits, DeepToolCallArgumentsStayText) {
  const std::string args = json("{\"a\":" + nested(200000) + "}").dump();
  auto r = parse_openai_chat(J(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[
    {"function":{"name":"f","arguments":)" +
                               args + "}}]}]}"));
  EXPECT_TRUE(r.messages[1]["tool_calls"][0]["function"]["arguments"].is_string());
  auto s = parse_responses(
      J(R"({"input":[{"role":"user","content":"hi"},{"type":"function_call","name":"f","arguments":)" + args + "}]}"));
  EXPECT_TRUE(s.messages[1]["tool_calls"][0]["function"]["arguments"].is_string());
  // Shallow arguments are still objects for the template.
  auto t = parse_openai_chat(J(R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","tool_calls":[
    {"function":{"name":"f","arguments":"{\"x\":[[1]]}"}}]}]})"));
  EXPECT_EQ(t.messages[1]["tool_calls"][0]["function"]["arguments"], J(R"({"x":[[1]]})"));
}

// ordered_json's own parser inserts each object member by a linear search for a duplicate: 80,000
// distinct keys (870 KB) took 4.6 s, a 32 MB body hours.
TEST(BodyLimits, ManyKeysParseInLinearTime) {
  std::string body = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]";
  const int n = 150000;
  for (int i = 0; i < n; ++i) body += ",\"k" + std::to_string(i) + "\":" + std::to_string(i);
  body += "}";
  json j;
  const double t = seconds([&] { j = parse_body(body); });
  EXPECT_LT(t, 3.0) << "parsing " << n << " keys is not linear";
  ASSERT_EQ(j.size(), static_cast<size_t>(n) + 1);
  EXPECT_EQ(j.begin().key(), "messages");  // document order is kept
  EXPECT_EQ(j["k77777"], 77777);
  EXPECT_EQ(std::prev(j.end()).key(), "k" + std::to_string(n - 1));
  const auto r = parse_openai_chat(j);
  EXPECT_EQ(r.ignored.size(), static_cast<size_t>(n));
}

// What nlohmann's parser does with a repeated key, kept: first position, last value, small objects
// and those large enough for the hash index alike.
TEST(BodyLimits, DuplicateKeysKeepFirstPositionAndLastValue) {
  EXPECT_EQ(parse_body(R"({"a":1,"b":2,"a":3})").dump(), R"({"a":3,"b":2})");
  std::string body = "{";
  for (int i = 0; i < 40; ++i) body += "\"k" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  body += R"("k3":"again","k39":{"x":[1,{"y":null}]},"k3":"last"})";
  const json j = parse_body(body);
  ASSERT_EQ(j.size(), 40u);
  EXPECT_EQ(std::next(j.begin(), 3).key(), "k3");
  EXPECT_EQ(j["k3"], "last");
  EXPECT_EQ(j["k39"], J(R"({"x":[1,{"y":null}]})"));
  EXPECT_EQ(parse_body(R"({"a":{"a":{"a":1,"a":2}},"a":[]})").dump(), R"({"a":[]})");
  // Whatever nlohmann accepts, the builder gives the same document.
  const std::string doc = R"({"s":"\u00e9\ud83d\ude00","i":-5,"u":18446744073709551615,"f":1.5e-3,"t":true,"n":null,
                             "arr":[[],{},[{"k":[1,2,{"z":"w"}]}]],"e":{}})";
  EXPECT_EQ(parse_body(doc), J(doc));
}

TEST(BodyLimits, ParseErrorMessagesAreShort) {
  const std::string body = "{\"messages\": \"" + std::string(1 << 20, 'x');  // unterminated string
  const std::string msg = expect_400([&] { parse_body(body); }, "not valid JSON");
  EXPECT_LT(msg.size(), 400u);
  expect_400([] { parse_body(std::string("{\"a\": \"\xc3\xa9\xc3\xa9") + std::string(1000, '\x01') + "\"}"); }, "not valid JSON");
}

// Consecutive leading system messages were joined one at a time, copying the joined text and
// shifting the array each time: quadratic.
TEST(BodyLimits, ManyLeadingSystemMessagesMergeInLinearTime) {
  auto r = parse_openai_chat(J(R"({"messages":[{"role":"system","content":"a"},{"role":"developer","content":"b"},
    {"role":"system","content":"c"},{"role":"user","content":"d"},{"role":"system","content":"e"}]})"));
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0]["content"], "a\n\nb\n\nc");
  EXPECT_EQ(r.messages[2]["content"], "e");

  const int n = 100000;
  std::string msgs;
  for (int i = 0; i < n; ++i) msgs += R"({"role":"system","content":"0123456789"},)";
  msgs += R"({"role":"user","content":"x"})";
  const json chat = J("{\"messages\":[" + msgs + "]}");
  const json resp = J("{\"input\":[" + msgs + "]}");
  ChatRequest a, b;
  EXPECT_LT(seconds([&] { a = parse_openai_chat(chat); }), 3.0);
  EXPECT_LT(seconds([&] { b = parse_responses(resp); }), 3.0);
  for (const ChatRequest* c : {&a, &b}) {
    ASSERT_EQ(c->messages.size(), 2u);
    EXPECT_EQ(c->messages[0]["content"].get<std::string>().size(), n * 10u + (n - 1) * 2u);
  }
}

// Each chat_template_kwargs entry becomes a template variable, set by a linear search in the
// template engine: tens of thousands took minutes. A handful is what clients send.
TEST(BodyLimits, TemplateKwargsAreBounded) {
  auto kwargs = [](int n) {
    std::string body = R"({"messages":)";
    body += kUser;
    body += R"(,"chat_template_kwargs":{)";
    for (int i = 0; i < n; ++i) {
      if (i) body += ',';
      body += "\"v";
      body += std::to_string(i);
      body += "\":1";
    }
    body += "}}";
    return parse_body(body);
  };
  EXPECT_EQ(parse_openai_chat(kwargs(256)).template_kwargs.size(), 256u);
  expect_400([&] { parse_openai_chat(kwargs(257)); }, "chat_template_kwargs");
  auto big = kwargs(20000);
  expect_400([&] { parse_openai_chat(big); }, "chat_template_kwargs");
  big.erase("messages");
  big["input"] = "x";
  expect_400([&] { parse_responses(big); }, "chat_template_kwargs");
  // The request's variables win over those derived from other fields.
  auto r = parse_openai_chat(J(std::string(R"({"messages":)") + kUser +
                               R"(,"reasoning_effort":"high","chat_template_kwargs":{"reasoning_effort":"low","x":1}})"));
  EXPECT_EQ(r.template_kwargs["reasoning_effort"], "low");
  EXPECT_EQ(r.template_kwargs["x"], 1);
  auto s = parse_openai_chat(
      J(std::string(R"({"messages":)") + kUser + R"(,"reasoning_effort":"none","chat_template_kwargs":{"x":1}})"));
  EXPECT_EQ(s.template_kwargs["reasoning_effort"], "none");
  EXPECT_EQ(s.enable_thinking, false);
}

// ---------------------------------------------------------------- server/prepare.h

// The unknown-field names went into a response header as sent: 300,000 of them made a 3 MB header
// line (clients refuse it), and one name holding CR LF made cpp-httplib drop the header.
TEST(IgnoredFieldsHeader, ShortAndPrintable) {
  EXPECT_EQ(ignored_fields_header({"a", "b_c"}), "a, b_c");
  EXPECT_EQ(ignored_fields_header({"x\r\nSet-Cookie: a=b", "\xc3\xa9", std::string("n\0ul", 4)}), "x??Set-Cookie: a=b, ??, n?ul");
  std::string body = R"({"messages":[{"role":"user","content":"hi"}])";
  for (int i = 0; i < 300000; ++i) {
    body += ",\"k";
    body += std::to_string(i);
    body += "\":0";
  }
  body += "}";
  const auto r = parse_openai_chat(parse_body(body));
  ASSERT_EQ(r.ignored.size(), 300000u);
  const std::string h = ignored_fields_header(r.ignored);
  EXPECT_LE(h.size(), kMaxIgnoredHeader + 32);
  EXPECT_TRUE(h.starts_with("k0, k1, k2, ")) << h;
  EXPECT_TRUE(h.ends_with(" more)")) << h;
  EXPECT_EQ(ignored_fields_header({std::string(5000, 'z'), "b"}), "... (2 more)");
}

class Prepare : public ::testing::Test {
 protected:
  void SetUp() override {
    gguf::Writer w;
    w.set_string("general.architecture", "qwen3");
    gguf::synth_bpe_vocab(w, "qwen", 1024);
    bytes_ = w.write_to_memory();
    file_ = gguf::File::from_memory(bytes_);
    tok_ = tok::Tokenizer::from_gguf(*file_);
  }
  std::vector<uint8_t> bytes_;
  std::unique_ptr<gguf::File> file_;
  std::unique_ptr<tok::Tokenizer> tok_;
};

TEST_F(Prepare, MakeSpecFitsTheSlot) {
  ServerOptions opt;
  GenParams g;
  const std::vector<int32_t> prompt(100, 5);
  auto s = make_spec(opt, 1000, g, prompt);
  EXPECT_EQ(s.max_tokens, 900);  // no max_tokens: up to the end of the slot
  opt.default_max_tokens = 64;
  EXPECT_EQ(make_spec(opt, 1000, g, prompt).max_tokens, 64);
  EXPECT_EQ(make_spec(opt, 120, g, prompt).max_tokens, 20);
  g.max_tokens = 901;
  expect_400([&] { make_spec(opt, 1000, g, prompt); }, "max_tokens");
  opt.clamp_max_tokens = true;
  EXPECT_EQ(make_spec(opt, 1000, g, prompt).max_tokens, 900);
  expect_400([&] { make_spec(opt, 100, g, prompt); }, "messages");  // the prompt alone fills the slot
  g.max_tokens = 7;
  g.stop = {"x"};
  g.logprobs = 3;
  g.ignore_eos = true;
  g.temperature = 0.25;
  opt.timeout_s = 0;
  s = make_spec(opt, 1000, g, prompt);
  EXPECT_EQ(s.max_tokens, 7);
  EXPECT_EQ(s.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(s.logprobs, 3);
  EXPECT_FALSE(s.stop_at_eog);
  EXPECT_FLOAT_EQ(s.sampling.temperature, 0.25f);
  EXPECT_EQ(s.deadline, engine::Clock::time_point::max());
  EXPECT_EQ(s.prompt, prompt);
}

TEST_F(Prepare, CompletionPrompt) {
  std::string text;
  auto ids = completion_prompt(*tok_, parse_completion(J(R"({"prompt":"<|im_start|>ab"})")), text);
  EXPECT_EQ(text, "<|im_start|>ab");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), tok_->text_to_token("<|im_start|>"));  // special tokens are parsed
  ids = completion_prompt(*tok_, parse_completion(J(R"({"prompt":[65,66],"echo":true})")), text);
  EXPECT_EQ(ids, (std::vector<int32_t>{65, 66}));
  EXPECT_EQ(text, tok_->detokenize(ids));
  completion_prompt(*tok_, parse_completion(J(R"({"prompt":[65,66]})")), text);
  EXPECT_EQ(text, "");
  expect_400([&] { completion_prompt(*tok_, parse_completion(J(R"({"prompt":[1,1024]})")), text); }, "prompt");
  expect_400([&] { completion_prompt(*tok_, parse_completion(J(R"({"prompt":""})")), text); }, "prompt");
  expect_400([&] { completion_prompt(*tok_, parse_completion(J(R"({"prompt":[[]]})")), text); }, "prompt");
}

TEST_F(Prepare, TokenizeAndDetokenizeRequests) {
  auto t = parse_tokenize(J(R"({"content":"abc","add_special":true,"with_pieces":true})"));
  EXPECT_EQ(t.content, "abc");
  EXPECT_TRUE(t.add_special);
  EXPECT_TRUE(t.parse_special);
  EXPECT_TRUE(t.with_pieces);
  expect_400([] { parse_tokenize(J(R"({})")); }, "content");
  expect_400([] { parse_tokenize(J(R"({"content":5})")); }, "content");
  expect_400([] { parse_tokenize(J(R"({"content":"a","parse_special":1})")); }, "parse_special");
  EXPECT_EQ(parse_detokenize(J(R"({"tokens":[0,5,1023]})"), 1024), (std::vector<int32_t>{0, 5, 1023}));
  expect_400([] { parse_detokenize(J(R"({"tokens":[1,1024]})"), 1024); }, "tokens");
  expect_400([] { parse_detokenize(J(R"({"tokens":[1,-2]})"), 1024); }, "tokens");
  expect_400([] { parse_detokenize(J(R"({"tokens":[1.5]})"), 1024); }, "tokens");
  expect_400([] { parse_detokenize(J(R"({"tokens":[18446744073709551615]})"), 1024); }, "tokens");
  expect_400([] { parse_detokenize(J(R"({"tokens":"1"})"), 1024); }, "tokens");
  expect_400([] { parse_detokenize(J(R"({})"), 1024); }, "tokens");
}

}  // namespace
}  // namespace pg::server
