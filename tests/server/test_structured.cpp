// Structured-output request surfaces (server/structured.*): every field that constrains the answer
// becomes a grammar (response_format json_object / json_schema, llama-server's json_schema and
// grammar, Responses text.format, Anthropic output_format / output_config.format), refusals name the
// keyword or the grammar position, reasoning budgets come from the request, the effort table or the
// server, and forced tool calls get a grammar that the rendered prompt's opening continues.
#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "server/chat_prompt.h"
#include "server/chat_request.h"
#include "server/prepare.h"
#include "server/structured.h"
#include "testutil.h"

namespace pg::server {
namespace {

json J(const char* s) { return json::parse(s); }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    return e.param() + " | " + e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

const char* kMsgs = R"("messages": [{"role": "user", "content": "hi"}])";
std::string chat(const std::string& extra) { return std::string("{") + kMsgs + extra + "}"; }

TEST(Structured, EverySurfaceSetsAGrammar) {
  const char* schema = R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})";
  auto oa = [&](const std::string& extra) { return parse_openai_chat(json::parse(chat(extra))).gen; };
  EXPECT_EQ(oa(R"(,"response_format":{"type":"json_object"})").grammar_field, "response_format");
  EXPECT_NE(oa(R"(,"response_format":{"type":"json_object"})").grammar.find("object"), std::string::npos);
  auto g = oa(std::string(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","strict":true,"schema":)") + schema + "}}");
  EXPECT_NE(g.grammar.find("\\\"a\\\""), std::string::npos) << g.grammar;
  EXPECT_EQ(oa(std::string(R"(,"json_schema":)") + schema).grammar_field, "json_schema");
  EXPECT_EQ(oa(R"(,"grammar":"root ::= \"yes\" | \"no\"")").grammar, "root ::= \"yes\" | \"no\"");
  EXPECT_TRUE(oa(R"(,"response_format":{"type":"text"})").grammar.empty());
  auto rs = parse_responses(json::parse(std::string(R"({"input":"x","text":{"format":{"type":"json_schema","name":"x","schema":)") + schema + "}}}"));
  EXPECT_EQ(rs.gen.grammar_field, "text.format");
  auto an = parse_anthropic(json::parse(std::string(R"({"model":"m","max_tokens":9,)") + kMsgs +
                                        R"(,"output_format":{"type":"json_schema","schema":)" + schema + "}}"));
  EXPECT_EQ(an.gen.grammar_field, "output_format");
  auto an2 = parse_anthropic(json::parse(std::string(R"({"model":"m","max_tokens":9,)") + kMsgs +
                                         R"(,"output_config":{"format":{"type":"json_schema","schema":)" + schema + "}}}"));
  EXPECT_EQ(an2.gen.grammar_field, "output_config.format");
  auto cp = parse_completion(J(R"({"prompt":"x","grammar":"root ::= [0-9]+"})"));
  EXPECT_EQ(cp.gen.grammar, "root ::= [0-9]+");
  // No "ignored field" report for the fields that are honoured.
  auto r = parse_openai_chat(json::parse(chat(R"(,"grammar":"root ::= \"a\"","reasoning_budget_tokens":5)")));
  EXPECT_TRUE(r.ignored.empty());
  EXPECT_EQ(r.gen.reasoning_budget, 5);
}

TEST(Structured, RefusalsNameTheKeywordOrPosition) {
  auto oa = [&](const std::string& extra) { return [extra] { parse_openai_chat(json::parse(chat(extra))); }; };
  EXPECT_NE(error_of(oa(R"(,"json_schema":{"type":"object","patternProperties":{"x":{}}})")).find("patternProperties"), std::string::npos);
  EXPECT_NE(error_of(oa(R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","if":{"required":["a"]}}}})"))
                .find("'if'"),
            std::string::npos);
  const std::string e = error_of(oa(R"(,"grammar":"root ::= \"a\" (")"));
  EXPECT_NE(e.find("line 1 col"), std::string::npos) << e;
  EXPECT_NE(error_of(oa(R"(,"grammar":"root ::= x")")).find("undefined rule 'x'"), std::string::npos);
  EXPECT_NE(error_of(oa(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x"}})")).find("schema"), std::string::npos);
  EXPECT_NE(error_of(oa(R"(,"response_format":{"type":"yaml"})")).find("response_format.type"), std::string::npos);
  EXPECT_NE(error_of(oa(R"(,"grammar":"root ::= \"a\"","json_schema":{"type":"object"})")).find("both"), std::string::npos);
  EXPECT_NE(error_of(oa(R"(,"grammar":"root ::= \"a\"","grammar_lazy":true)")).find("grammar_lazy"), std::string::npos);
  EXPECT_NE(error_of(oa(R"(,"grammar":5)")).find("grammar"), std::string::npos);
}

struct Qwen {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<tok::Tokenizer> tok;
  std::unique_ptr<ChatPrompt> prompt;
  Qwen() {
    file = gguf::File::open(test::shared_path("testdata/tokenizer/ggml-vocab-qwen3.gguf").string());
    tok = tok::Tokenizer::from_gguf(*file);
    prompt = std::make_unique<ChatPrompt>(test::read_text(test::shared_path("testdata/chat_templates/llama.cpp/Qwen-Qwen3-0.6B.jinja")), *tok);
  }
};

TEST(Structured, ConstraintsFromPromptBudgetsAndTools) {
  Qwen q;
  ServerOptions opt;
  // No constraint at all: null (the engine's plain path).
  auto plain = parse_openai_chat(json::parse(chat("")));
  EXPECT_EQ(chat_constraint(opt, *q.tok, plain, q.prompt->render(plain)), nullptr);
  // Budgets: request > effort table > server default.
  opt.reasoning_budget = 100;
  auto c = chat_constraint(opt, *q.tok, plain, q.prompt->render(plain));
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->reasoning_budget, 100);
  EXPECT_EQ(c->think_close, "</think>");
  auto eff = parse_openai_chat(json::parse(chat(R"(,"reasoning_effort":"low")")));
  EXPECT_EQ(chat_constraint(opt, *q.tok, eff, q.prompt->render(eff))->reasoning_budget, opt.effort_budget[0]);
  auto rb = parse_openai_chat(json::parse(chat(R"(,"reasoning_effort":"low","reasoning_budget_tokens":3)")));
  EXPECT_EQ(chat_constraint(opt, *q.tok, rb, q.prompt->render(rb))->reasoning_budget, 3);
  auto an = parse_anthropic(json::parse(std::string(R"({"model":"m","max_tokens":9,)") + kMsgs +
                                        R"(,"thinking":{"type":"enabled","budget_tokens":2}})"));
  EXPECT_EQ(chat_constraint(opt, *q.tok, an, q.prompt->render(an))->reasoning_budget, 2);
  // A named strict tool: the forced opening is the grammar's first bytes, the closing tag its end.
  auto tr = parse_openai_chat(json::parse(chat(
      R"(,"tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"],"additionalProperties":false}}}],"tool_choice":{"type":"function","function":{"name":"f"}})")));
  auto rp = q.prompt->render(tr);
  auto tc = chat_constraint(opt, *q.tok, tr, rp);
  ASSERT_NE(tc, nullptr);
  ASSERT_NE(tc->grammar, nullptr);
  EXPECT_EQ(tc->prefix, "{\"name\": \"f\", \"arguments\": {");
  grammar::Matcher m = tc->grammar->proto.clone();
  ASSERT_TRUE(m.accept_bytes(tc->prefix));
  EXPECT_TRUE(m.accept_bytes("\"n\": 12}}\n</tool_call>"));
  EXPECT_TRUE(m.can_end());
  grammar::Matcher bad = tc->grammar->proto.clone();
  ASSERT_TRUE(bad.accept_bytes(tc->prefix));
  EXPECT_FALSE(bad.accept_bytes("\"n\": \"x\""));
  // A strict tool whose schema the converter refuses: 400 naming the keyword.
  auto ts = parse_openai_chat(json::parse(chat(
      R"(,"tools":[{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object","patternProperties":{"x":{}}}}}],"tool_choice":"required")")));
  const std::string e = error_of([&] { (void)chat_constraint(opt, *q.tok, ts, q.prompt->render(ts)); });
  EXPECT_NE(e.find("patternProperties"), std::string::npos) << e;
}

}  // namespace
}  // namespace pg::server
