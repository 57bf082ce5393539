// Structured-output request surfaces (server/structured.*): every field that constrains the answer
// becomes a grammar (response_format json_object / json_schema, llama-server's json_schema and
// grammar, Responses text.format, Anthropic output_format / output_config.format), refusals name the
// keyword or the grammar position, reasoning budgets come from the request, the effort table or the
// server, and forced tool calls get a grammar that the rendered prompt's opening continues.
#include <gtest/gtest.h>

#include <random>

#include "chat/parse/output_parser.h"
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
  // A lazy grammar needs triggers; triggers need grammar_lazy; lazy needs a grammar.
  EXPECT_NE(error_of(oa(R"(,"grammar":"root ::= \"a\"","grammar_lazy":true)")).find("grammar_lazy | 'grammar_lazy' is true but 'grammar_triggers' is empty"), std::string::npos);
  EXPECT_NE(error_of(oa(R"(,"grammar":5)")).find("grammar"), std::string::npos);
}

TEST(Structured, LazyGrammarFields) {
  auto oa = [&](const std::string& extra) { return parse_openai_chat(json::parse(chat(extra))).gen; };
  auto g = oa(R"(,"grammar":"root ::= \"a\"","grammar_lazy":true,"grammar_triggers":[)"
              R"J({"type":"word","value":"<tool_call>"},{"type":"pattern","value":"[\\s\\S]*?(<x>)"},)J"
              R"({"type":"pattern_full","value":"\\{.*"},{"type":"token","value":42},{"type":1,"value":"w"},)"
              R"({"type":0,"token":7},{"type":"token","value":"<think>"},{"word":"old-form"}],"preserved_tokens":["<tool_call>"])");
  using K = grammar::TriggerSpec::Kind;
  ASSERT_TRUE(g.grammar_lazy);
  ASSERT_EQ(g.grammar_triggers.size(), 8u);
  EXPECT_EQ(g.grammar_triggers[0].kind, K::Word);
  EXPECT_EQ(g.grammar_triggers[1].kind, K::Pattern);
  EXPECT_EQ(g.grammar_triggers[2].kind, K::PatternFull);
  EXPECT_EQ(g.grammar_triggers[3].kind, K::Token);
  EXPECT_EQ(g.grammar_triggers[3].token, 42);
  EXPECT_EQ(g.grammar_triggers[4].kind, K::Word);
  EXPECT_EQ(g.grammar_triggers[5].token, 7);
  EXPECT_EQ(g.grammar_triggers[6].token, -1);
  EXPECT_EQ(g.grammar_triggers[6].value, "<think>");
  EXPECT_EQ(g.grammar_triggers[7].value, "old-form");
  EXPECT_EQ(g.preserved_tokens, std::vector<std::string>{"<tool_call>"});
  EXPECT_TRUE(parse_openai_chat(json::parse(chat(R"(,"grammar":"root ::= \"a\"","grammar_lazy":true,"grammar_triggers":[{"type":"word","value":"a"}])"))).ignored.empty());
  // Refusals name the field and the problem.
  auto e = [&](const std::string& extra) { return error_of([&] { (void)oa(extra); }); };
  const std::string lz = R"(,"grammar":"root ::= \"a\"","grammar_lazy":true,"grammar_triggers":)";
  EXPECT_NE(e(lz + R"([{"type":"regex","value":"a"}])").find("grammar_triggers | 'grammar_triggers[0].type' must be"), std::string::npos);
  EXPECT_NE(e(lz + R"([{"type":"word","value":"a"},{"type":"pattern","value":"a(b"}])").find("trigger 1: regex: missing ')' at offset 3"), std::string::npos);
  EXPECT_NE(e(lz + R"J([{"type":"pattern","value":"(?=x)"}])J").find("lookahead"), std::string::npos);
  EXPECT_NE(e(lz + R"([{"type":"word","value":""}])").find("empty word"), std::string::npos);
  EXPECT_NE(e(lz + R"([{"type":"token","value":-3}])").find("non-negative"), std::string::npos);
  EXPECT_NE(e(lz + R"([{"type":"word"}])").find("value' must be a string"), std::string::npos);
  EXPECT_NE(e(lz + R"("word")").find("must be an array"), std::string::npos);
  EXPECT_NE(e(R"(,"grammar_lazy":true,"grammar_triggers":[{"type":"word","value":"a"}])").find("'grammar_lazy' needs a grammar"), std::string::npos);
  EXPECT_NE(e(R"(,"grammar":"root ::= \"a\"","grammar_triggers":[{"type":"word","value":"a"}])").find("grammar_triggers | 'grammar_triggers' is given but 'grammar_lazy' is not true"), std::string::npos);
  EXPECT_NE(e(R"(,"grammar":"root ::= \"a\"","preserved_tokens":[1])").find("preserved_tokens"), std::string::npos);
  // The completion route parses the same fields.
  auto cp = parse_completion(J(R"({"prompt":"x","json_schema":{"type":"object"},"grammar_lazy":true,"grammar_triggers":[{"type":"word","value":"{"}]})"));
  EXPECT_TRUE(cp.gen.grammar_lazy);
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

// Token triggers are checked against the vocabulary when the constraint is built.
TEST(Structured, LazyTokenTriggersAgainstTheVocabulary) {
  Qwen q;
  auto bad = [&](const std::string& trig) {
    auto cp = parse_completion(json::parse(R"({"prompt":"x","grammar":"root ::= \"a\"","grammar_lazy":true,"grammar_triggers":[)" + trig + "]}"));
    return error_of([&] { (void)completion_constraint(*q.tok, cp.gen); });
  };
  EXPECT_NE(bad(R"({"type":"token","value":151936})").find("token id 151936 is out of range (the vocabulary has 151936 tokens)"), std::string::npos);
  EXPECT_NE(bad(R"({"type":"token","value":"hello world again"})").find("not one"), std::string::npos);
  auto ok = parse_completion(J(R"({"prompt":"x","grammar":"root ::= \"a\"","grammar_lazy":true,"grammar_triggers":[{"type":"token","value":"<tool_call>"}]})"));
  auto c = completion_constraint(*q.tok, ok.gen);
  ASSERT_NE(c, nullptr);
  ASSERT_NE(c->lazy, nullptr);
  EXPECT_EQ(c->lazy->specs()[0].token, q.tok->encode("<tool_call>", false, true)[0]);
}

json tools_json(bool strict_f) {
  return json::parse(std::string(R"([{"type":"function","function":{"name":"f","strict":)") + (strict_f ? "true" : "false") +
                     R"(,"parameters":{"type":"object","properties":{"n":{"type":"integer"},"unit":{"type":"string","enum":["c","f"]},"note":{"type":"string"}},"required":["n"],"additionalProperties":false}}},)"
                     R"({"type":"function","function":{"name":"g","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}])");
}

bool accepts(const engine::ConstraintSpec& c, const std::string& text) {
  grammar::Matcher m = c.grammar->proto.clone();
  if (!c.prefix.empty() && !m.accept_bytes(c.prefix)) return false;
  return m.accept_bytes(text) && m.can_end();
}

// tool_choice "auto" (and the default): a lazy grammar whose trigger is the call opener; strict
// tools' arguments follow their schema, others any JSON object; parallel_tool_calls honoured.
TEST(Structured, AutoToolsAreALazyGrammarHermes) {
  Qwen q;
  ServerOptions opt;
  for (bool parallel : {true, false}) {
    json body = json::parse(chat(""));
    body["tools"] = tools_json(true);
    body["parallel_tool_calls"] = parallel;
    auto r = parse_openai_chat(body);
    auto c = chat_constraint(opt, *q.tok, r, q.prompt->render(r));
    ASSERT_NE(c, nullptr);
    ASSERT_NE(c->lazy, nullptr);
    ASSERT_EQ(c->lazy->specs().size(), 1u);
    EXPECT_EQ(c->lazy->specs()[0].value, "<tool_call>");
    EXPECT_EQ(c->think_close, "</think>");  // the reasoning block is not watched
    const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": 3, \"unit\": \"c\"}}\n</tool_call>";
    EXPECT_TRUE(accepts(*c, call));
    EXPECT_FALSE(accepts(*c, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"n\": \"3\"}}\n</tool_call>")) << "strict: n is an integer";
    EXPECT_FALSE(accepts(*c, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>")) << "strict: n is required";
    EXPECT_FALSE(accepts(*c, "<tool_call>\n{\"name\": \"h\", \"arguments\": {}}\n</tool_call>")) << "no such tool";
    // g is not strict: any JSON object.
    EXPECT_TRUE(accepts(*c, "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"zz\": [1, 2]}}\n</tool_call>"));
    // One call per firing; parallel calls re-arm the trigger after each (engine test: LazyRearm).
    EXPECT_FALSE(accepts(*c, call + "\n" + call));
    EXPECT_EQ(c->lazy_rearm, parallel);
  }
  // tool_choice "none": no tools, no constraint.
  json body = json::parse(chat(""));
  body["tools"] = tools_json(true);
  body["tool_choice"] = "none";
  auto rn = parse_openai_chat(body);
  EXPECT_EQ(chat_constraint(opt, *q.tok, rn, q.prompt->render(rn)), nullptr);
}

TEST(Structured, QwenCoderXmlCallsForcedAndAuto) {
  Qwen q;
  ChatPrompt coder(test::read_text(test::shared_path("testdata/chat_templates/llama.cpp/Qwen3-Coder.jinja")), *q.tok);
  ServerOptions opt;
  json body = json::parse(chat(""));
  body["tools"] = tools_json(true);
  auto r = parse_openai_chat(body);
  auto rp = coder.render(r);
  ASSERT_EQ(rp.format.family, chat::ChatFamily::kQwen3Coder);
  auto c = chat_constraint(opt, *q.tok, r, rp);
  ASSERT_NE(c, nullptr);
  ASSERT_NE(c->lazy, nullptr);
  const std::string ok = "<tool_call>\n<function=f>\n<parameter=n>\n12\n</parameter>\n<parameter=note>\nline 1\n</para x\nend\n</parameter>\n</function>\n</tool_call>";
  EXPECT_TRUE(accepts(*c, ok));
  EXPECT_TRUE(accepts(*c, "<tool_call>\n<function=f>\n<parameter=n>\n-4\n</parameter>\n<parameter=unit>\nf\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(*c, "<tool_call>\n<function=f>\n<parameter=n>\ntwelve\n</parameter>\n</function>\n</tool_call>")) << "n is an integer";
  EXPECT_FALSE(accepts(*c, "<tool_call>\n<function=f>\n<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>")) << "n is required";
  EXPECT_FALSE(accepts(*c, "<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n<parameter=unit>\nk\n</parameter>\n</function>\n</tool_call>")) << "unit is c or f";
  EXPECT_FALSE(accepts(*c, "<tool_call>\n<function=f>\n<parameter=n>\n1\n</parameter>\n<parameter=zz>\n1\n</parameter>\n</function>\n</tool_call>")) << "no such parameter";
  // g is not strict: its parameter names, raw values, any number of them.
  EXPECT_TRUE(accepts(*c, "<tool_call>\n<function=g>\n<parameter=q>\nwhat {is} <this>?\n</parameter>\n<parameter=q>\n\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(*c, "<tool_call>\n<function=g>\n<parameter=other>\nx\n</parameter>\n</function>\n</tool_call>"));
  // Forced (named): the prompt holds the opening; the grammar continues it.
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "f"}}}};
  auto rf = parse_openai_chat(body);
  auto rpf = coder.render(rf);
  auto cf = chat_constraint(opt, *q.tok, rf, rpf);
  ASSERT_NE(cf, nullptr);
  EXPECT_EQ(cf->lazy, nullptr);
  EXPECT_EQ(cf->prefix, "<tool_call>\n<function=f>\n");
  EXPECT_TRUE(accepts(*cf, "<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>"));
  EXPECT_FALSE(accepts(*cf, "<parameter=n>\nx\n</parameter>\n</function>\n</tool_call>"));
}

TEST(Structured, Llama3AutoToolsTriggerOnTheCallObject) {
  Qwen q;
  ChatPrompt l3(test::read_text(test::shared_path("testdata/chat_templates/llama.cpp/meta-llama-Llama-3.1-8B-Instruct.jinja")), *q.tok);
  ServerOptions opt;
  json body = json::parse(chat(""));
  body["tools"] = tools_json(true);
  auto r = parse_openai_chat(body);
  auto rp = l3.render(r);
  ASSERT_EQ(rp.format.family, chat::ChatFamily::kLlama3);
  auto c = chat_constraint(opt, *q.tok, r, rp);
  ASSERT_NE(c, nullptr);
  ASSERT_NE(c->lazy, nullptr);
  grammar::TriggerWatch w(c->lazy);
  EXPECT_EQ(w.push(1, " {\""), grammar::TriggerWatch::npos);
  EXPECT_EQ(w.push(2, "name\":"), 1u);  // the grammar starts at the brace
  EXPECT_TRUE(accepts(*c, "{\"name\": \"f\", \"parameters\": {\"n\": 1}}"));
  EXPECT_TRUE(accepts(*c, "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"n\": 1}}"));
  EXPECT_FALSE(accepts(*c, "{\"name\": \"f\", \"parameters\": {\"n\": true}}"));
  // Plain prose never fires the call trigger.
  grammar::TriggerWatch p(c->lazy);
  EXPECT_EQ(p.push(1, "Sure, {\"name\": is a key"), grammar::TriggerWatch::npos);
}


// Mistral, DeepSeek (V3.1 and R1 shapes) and GPT-OSS: the tool name is outside the arguments object.
// Per template: the parser's canonical call is accepted (auto: from the trigger on; forced: from the
// start of the answer) and parses back into the call; a wrong name or schema-violating arguments are
// rejected; random walks of the grammar always parse into valid calls.
struct NamedFormatCase {
  const char* tmpl;
  chat::ChatFamily family;
  const char* trigger;
  // Canonical calls of f {"n": 3, "unit": "c"} and g {"zz": [1]} (and of a tool named h).
  std::string f_call, g_call, h_call, f_bad_args;
};

#define PG_DS(x) "<\xEF\xBD\x9C" x "\xEF\xBD\x9C>"
std::vector<NamedFormatCase> named_format_cases() {
  auto ds = [](const std::string& body) { return std::string(PG_DS("tool\xE2\x96\x81" "calls\xE2\x96\x81" "begin")) + body + PG_DS("tool\xE2\x96\x81" "calls\xE2\x96\x81" "end"); };
  const std::string cb = PG_DS("tool\xE2\x96\x81" "call\xE2\x96\x81" "begin"), sep = PG_DS("tool\xE2\x96\x81" "sep"),
                    ce = PG_DS("tool\xE2\x96\x81" "call\xE2\x96\x81" "end");
  auto v31 = [&](const std::string& n, const std::string& a) { return ds(cb + n + sep + a + ce); };
  auto r1 = [&](const std::string& n, const std::string& a) { return ds(cb + "function" + sep + n + "\n```json\n" + a + "\n```" + ce); };
  auto oss = [](const std::string& n, const std::string& a) { return " to=functions." + n + "<|channel|>commentary json<|message|>" + a + "<|call|>"; };
  auto mis = [](const std::string& n, const std::string& a) { return "[TOOL_CALLS]" + n + "[ARGS]" + a; };
  const std::string fa = R"({"n": 3, "unit": "c"})", ga = R"({"zz": [1]})", bad = R"({"n": "3"})";
  return {
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", chat::ChatFamily::kMistral, "[TOOL_CALLS]", mis("f", fa), mis("g", ga), mis("h", fa), mis("f", bad)},
      {"deepseek-ai-DeepSeek-V3.1.jinja", chat::ChatFamily::kDeepSeek, "", v31("f", fa), v31("g", ga), v31("h", fa), v31("f", bad)},
      {"deepseek-ai-DeepSeek-V3.1.jinja", chat::ChatFamily::kDeepSeek, "", r1("f", fa), r1("g", ga), r1("h", fa), r1("f", bad)},
      {"openai-gpt-oss-120b.jinja", chat::ChatFamily::kGptOss, "to=functions.", oss("f", fa), oss("g", ga), oss("h", fa), oss("f", bad)},
  };
}
#undef PG_DS

// f's arguments by its (strict) schema: n an integer, unit "c" or "f", note a string, nothing else.
bool f_args_valid(const json& a) {
  if (!a.is_object() || !a.contains("n") || !a["n"].is_number_integer()) return false;
  for (auto it = a.begin(); it != a.end(); ++it) {
    if (it.key() == "n") continue;
    if (it.key() == "unit" && (it.value() == "c" || it.value() == "f")) continue;
    if (it.key() == "note" && it.value().is_string()) continue;
    return false;
  }
  return true;
}

// A random byte walk of the grammar (printable ASCII preferred, closing characters favoured so that
// walks end), from the constraint's prefix; empty when it did not end within `cap` bytes.
std::string random_walk(const engine::ConstraintSpec& c, std::mt19937& rng, size_t cap = 4000) {
  grammar::Matcher m = c.grammar->proto.clone();
  if (!m.accept_bytes(c.prefix)) return "<prefix refused>";
  std::string out;
  while (out.size() < cap) {
    if (m.can_end() && (m.done() || rng() % 3 == 0)) return out;
    std::vector<unsigned char> ascii, high, closing;
    for (int b = 1; b < 256; ++b) {
      grammar::Matcher t = m.clone();
      const char ch = static_cast<char>(b);
      if (!t.accept_bytes(std::string_view(&ch, 1))) continue;
      (b >= 0x20 && b < 0x7F) || b == '\n' ? ascii.push_back(b) : high.push_back(b);
      if (b == '"' || b == '}' || b == ']' || b == ',') closing.push_back(b);
    }
    const auto& pool = !closing.empty() && rng() % 2 ? closing : !ascii.empty() ? ascii : high;
    if (pool.empty()) return "<stuck>";
    const char ch = static_cast<char>(pool[rng() % pool.size()]);
    EXPECT_TRUE(m.accept_bytes(std::string_view(&ch, 1)));
    out += ch;
  }
  return {};
}

TEST(Structured, NamedCallFormatsForcedAndAuto) {
  Qwen q;
  ServerOptions opt;
  for (const NamedFormatCase& fc : named_format_cases()) {
    SCOPED_TRACE(fc.tmpl);
    ChatPrompt prompt(test::read_text(test::shared_path(std::string("testdata/chat_templates/llama.cpp/") + fc.tmpl)), *q.tok);
    json body = json::parse(chat(""));
    body["tools"] = tools_json(true);
    for (auto& t : body["tools"]) t["function"]["description"] = "a test tool";  // the GPT-OSS template needs one
    auto r = parse_openai_chat(body);
    auto rp = prompt.render(r);
    ASSERT_EQ(rp.format.family, fc.family);
    // auto: lazy, from the call opener.
    auto c = chat_constraint(opt, *q.tok, r, rp);
    ASSERT_NE(c, nullptr);
    ASSERT_NE(c->lazy, nullptr);
    ASSERT_EQ(c->lazy->specs().size(), 1u);
    if (*fc.trigger) {
      EXPECT_EQ(c->lazy->specs()[0].value, fc.trigger);
    }
    EXPECT_TRUE(c->lazy_rearm);
    auto from_trigger = [&](const std::string& call) { return call.substr(call.find(c->lazy->specs()[0].value)); };
    EXPECT_TRUE(accepts(*c, from_trigger(fc.f_call)));
    EXPECT_TRUE(accepts(*c, from_trigger(fc.g_call))) << "g is not strict: any object";
    EXPECT_FALSE(accepts(*c, from_trigger(fc.h_call))) << "no such tool";
    EXPECT_FALSE(accepts(*c, from_trigger(fc.f_bad_args))) << "strict: n is an integer";
    // The canonical text is what our parser reads back as the call.
    for (const std::string* t : {&fc.f_call, &fc.g_call}) {
      const chat::ParsedMessage pm = chat::parse_output(rp.format, *t, rp.parser);
      ASSERT_EQ(pm.tool_calls.size(), 1u) << *t;
      EXPECT_EQ(pm.tool_calls[0].name, t == &fc.f_call ? "f" : "g");
      EXPECT_EQ(json::parse(pm.tool_calls[0].arguments), json::parse(t == &fc.f_call ? R"({"n": 3, "unit": "c"})" : R"({"zz": [1]})"));
    }
    // Forced, named: the grammar is the whole answer, only f, by its schema.
    json fb = body;
    fb["tool_choice"] = {{"type", "function"}, {"function", {{"name", "f"}}}};
    fb["parallel_tool_calls"] = false;
    auto rf = parse_openai_chat(fb);
    auto rpf = prompt.render(rf);
    auto cf = chat_constraint(opt, *q.tok, rf, rpf);
    ASSERT_NE(cf, nullptr);
    EXPECT_EQ(cf->lazy, nullptr);
    EXPECT_EQ(cf->prefix, "");
    EXPECT_TRUE(accepts(*cf, fc.f_call));
    EXPECT_FALSE(accepts(*cf, fc.g_call)) << "named: f only";
    EXPECT_FALSE(accepts(*cf, fc.f_bad_args));
    EXPECT_FALSE(accepts(*cf, fc.f_call + fc.f_call)) << "parallel_tool_calls false: one call";
    // Forced, required, parallel: either tool, g by its schema too (q a string), several calls.
    json rb = body;
    rb["tool_choice"] = "required";
    auto rr = parse_openai_chat(rb);
    auto rpr = prompt.render(rr);
    auto cr = chat_constraint(opt, *q.tok, rr, rpr);
    ASSERT_NE(cr, nullptr);
    EXPECT_TRUE(accepts(*cr, fc.f_call));
    std::string g_q1 = fc.g_call;
    g_q1.replace(g_q1.find(R"({"zz": [1]})"), 11, R"({"q": 1})");
    EXPECT_FALSE(accepts(*cr, g_q1)) << "forced: g by its schema too (q is a string)";
    EXPECT_TRUE(accepts(*c, from_trigger(g_q1))) << "auto: g is not strict";
    if (fc.family != chat::ChatFamily::kDeepSeek) {
      const std::string join = fc.family == chat::ChatFamily::kGptOss ? "<|start|>assistant" : "";
      EXPECT_TRUE(accepts(*cr, fc.f_call + join + fc.f_call)) << "parallel: several calls";
      EXPECT_EQ(chat::parse_output(rpr.format, fc.f_call + join + fc.g_call, rpr.parser).tool_calls.size(), 2u);
    }
    // Random walks of the forced grammar: every one parses into calls of f / g whose arguments are valid.
    std::mt19937 rng(1234);
    int walked = 0;
    for (int w = 0; w < 40; ++w) {
      const std::string text = random_walk(*cr, rng);
      if (text.empty()) continue;
      ++walked;
      const chat::ParsedMessage pm = chat::parse_output(rpr.format, rpr.forced + text, rpr.parser);
      ASSERT_FALSE(pm.tool_calls.empty()) << text;
      EXPECT_TRUE(pm.errors.empty()) << text << " | " << pm.errors[0];
      EXPECT_TRUE(pm.content.empty() || pm.content.find_first_not_of(" \n") == std::string::npos) << text;
      for (const auto& tc : pm.tool_calls) {
        const json a = json::parse(tc.arguments);
        if (tc.name == "f") {
          EXPECT_TRUE(f_args_valid(a)) << text;
        } else {
          EXPECT_EQ(tc.name, "g") << text;
          EXPECT_TRUE(a.is_object()) << text;
          if (a.contains("q")) {
            EXPECT_TRUE(a["q"].is_string()) << text;
          }
        }
      }
    }
    EXPECT_GE(walked, 20);
  }
}

}  // namespace
}  // namespace pg::server
