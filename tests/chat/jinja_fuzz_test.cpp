// Fuzz-style robustness test: thousands of mutated real chat templates and random token soups are
// parsed and rendered. Every one must either render or throw pg::Error, quickly; a crash, a hang,
// or any other exception type fails the test. Deterministic (fixed seeds) so failures reproduce.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "chat/jinja/jinja.h"
#include "testutil.h"

namespace {

using json = nlohmann::ordered_json;

const char* kTokens[] = {
    "{%",
    "%}",
    "{{",
    "}}",
    "{#",
    "#}",
    "{%-",
    "-%}",
    "{{-",
    "-}}",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ",",
    ":",
    ".",
    "|",
    "~",
    "+",
    "-",
    "*",
    "**",
    "/",
    "//",
    "%",
    "==",
    "!=",
    "<",
    ">=",
    "=",
    " ",
    "\n",
    "\t",
    "'",
    "\"",
    "\\",
    "x",
    "for",
    "endfor",
    "in",
    "if",
    "elif",
    "else",
    "endif",
    "set",
    "endset",
    "macro",
    "endmacro",
    "call",
    "endcall",
    "filter",
    "endfilter",
    "with",
    "endwith",
    "raw",
    "endraw",
    "break",
    "continue",
    "is",
    "not",
    "and",
    "or",
    "none",
    "true",
    "loop",
    "recursive",
    "caller",
    "namespace(a=1)",
    "ns.a",
    "range(100000)",
    "range(3)",
    "messages",
    "message",
    "tools",
    "tojson",
    "trim",
    "length",
    "join",
    "map",
    "select",
    "selectattr",
    "items",
    "dictsort",
    "default",
    "string",
    "upper",
    "indent",
    "batch(2)",
    "list",
    "first",
    "last",
    "unique",
    "sort",
    "reverse",
    "int",
    "'abc'",
    "\"q\"",
    "0",
    "1",
    "-1",
    "2.5",
    "1e308",
    "[1,2]",
    "{'k':1}",
    "loop.index",
    "loop(messages)",
    "raise_exception('boom')",
    "strftime_now('%Y')",
    "message['content']",
    "m.role",
    "[::-1]",
    "'x' * 1000",
    "é",
    "🚀",
    "\xc3",
    "{% generation %}",
    "{% endgeneration %}",
};

std::vector<std::string> seed_templates() {
  std::vector<std::string> seeds;
  auto root = pg::test::shared_path("testdata/chat_templates");
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    auto ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".jinja" || ext == ".jinja2")) seeds.push_back(pg::test::read_text(e.path()));
  }
  auto cases = std::filesystem::path(PEREGRINE_SOURCE_DIR) / "tests" / "chat" / "jinja_cases.json";
  json doc = json::parse(pg::test::read_text(cases));
  for (const auto& c : doc["cases"]) seeds.push_back(c["template"].get<std::string>());
  return seeds;
}

json sample_vars() {
  return json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "hi {{ x }}"},
      {"role": "assistant", "content": "", "reasoning_content": "hmm",
       "tool_calls": [{"id": "call00001", "type": "function",
                       "function": {"name": "f", "arguments": {"a": [1, 2, {"b": null}]}}}]},
      {"role": "tool", "tool_call_id": "call00001", "content": "42"},
      {"role": "user", "content": [{"type": "text", "text": "part"}]}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "enable_thinking": false})");
}

std::string mutate(std::mt19937& rng, const std::string& src, const std::vector<std::string>& seeds) {
  std::string s = src;
  int n = 1 + static_cast<int>(rng() % 6);
  for (int k = 0; k < n; ++k) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 7) {
      case 0:  // insert a token
        s.insert(pos, kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))]);
        break;
      case 1:  // delete a span
        if (!s.empty()) s.erase(pos < s.size() ? pos : s.size() - 1, 1 + rng() % 40);
        break;
      case 2:  // flip a byte
        if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng() % 256);
        break;
      case 3: {  // duplicate a span
        if (s.empty()) break;
        size_t a = rng() % s.size(), len = 1 + rng() % 200;
        std::string part = s.substr(a, len);
        s.insert(pos, part);
        break;
      }
      case 4: {  // splice a piece of another template
        const std::string& o = seeds[rng() % seeds.size()];
        if (o.empty()) break;
        size_t a = rng() % o.size();
        s.insert(pos, o.substr(a, 1 + rng() % 300));
        break;
      }
      default:  // replace a byte by a delimiter character
        if (!s.empty() && pos < s.size()) s[pos] = "{}%#-+()[]|'\"\n"[rng() % 14];
        break;
    }
    if (s.size() > 40000) s.resize(40000);
  }
  return s;
}

struct Stats {
  int rendered = 0, errors = 0;
};

void run_one(const std::string& src, const json& vars, const pg::jinja::RenderOptions& opts, Stats& st) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    pg::jinja::Template t(src);
    t.render(vars, opts);
    ++st.rendered;
  } catch (const pg::Error&) {
    ++st.errors;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-pg exception " << typeid(e).name() << ": " << e.what() << "\ntemplate:\n" << src;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 5.0) << "slow template:\n" << src;
}

pg::jinja::RenderOptions fuzz_opts() {
  pg::jinja::RenderOptions opts;
  opts.limits.max_steps = 200'000;
  opts.limits.max_output_bytes = 1 << 20;
  opts.limits.max_alloc_bytes = 64u << 20;
  opts.limits.max_call_depth = 64;
  opts.now = pg::jinja::parse_iso8601("2025-01-02T03:04:05");
  return opts;
}

TEST(JinjaFuzz, MutatedRealTemplates) {
  auto seeds = seed_templates();
  ASSERT_GT(seeds.size(), 100u);
  json vars = sample_vars();
  auto opts = fuzz_opts();
  std::mt19937 rng(12345);
  Stats st;
  for (int i = 0; i < 20000; ++i) run_one(mutate(rng, seeds[rng() % seeds.size()], seeds), vars, opts, st);
  std::printf("mutated templates: %d rendered, %d raised\n", st.rendered, st.errors);
  EXPECT_GT(st.rendered, 1000);  // mutations that keep the template valid still render
  EXPECT_GT(st.errors, 1000);
}

TEST(JinjaFuzz, RandomTokenSoup) {
  json vars = sample_vars();
  auto opts = fuzz_opts();
  std::mt19937 rng(777);
  Stats st;
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    int n = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) s += kTokens[rng() % (sizeof(kTokens) / sizeof(kTokens[0]))];
    run_one(s, vars, opts, st);
  }
  std::printf("token soup: %d rendered, %d raised\n", st.rendered, st.errors);
  EXPECT_EQ(st.rendered + st.errors, 20000);
}

// Well-formed but adversarial programs built from a grammar: nested loops, macros and filters over
// the conversation. Exercises the evaluator rather than the parser.
TEST(JinjaFuzz, GeneratedPrograms) {
  json vars = sample_vars();
  auto opts = fuzz_opts();
  std::mt19937 rng(4242);
  const char* exprs[] = {"messages",
                         "messages[0]",
                         "tools",
                         "message",
                         "message.content",
                         "message['role']",
                         "loop.index",
                         "ns.a",
                         "range(5)",
                         "'s'",
                         "1",
                         "none",
                         "[1, 'a', none]",
                         "{'k': message}",
                         "x",
                         "loop.nextitem",
                         "m(1)",
                         "caller()",
                         "message.tool_calls",
                         "(message.content if message.content is string else message.content|tojson)"};
  const char* filters[] = {"|tojson",
                           "|trim",
                           "|length",
                           "|list",
                           "|first",
                           "|string",
                           "|upper",
                           "|items|list",
                           "|map('string')|join(',')",
                           "|selectattr('role')|list",
                           "|default('d')",
                           "|reverse|list",
                           "|dictsort",
                           "|unique|list",
                           "|int",
                           "|sort",
                           "|batch(2)|list",
                           "|indent(2)",
                           ""};
  std::function<std::string(int)> expr = [&](int d) -> std::string {
    std::string e = exprs[rng() % (sizeof(exprs) / sizeof(exprs[0]))];
    e += filters[rng() % (sizeof(filters) / sizeof(filters[0]))];
    if (d > 0 && rng() % 3 == 0) {
      const char* ops[] = {" ~ ", " + ", " == ", " in ", " and ", " or ", " * "};
      e = "(" + e + ops[rng() % 7] + expr(d - 1) + ")";
    }
    return e;
  };
  std::function<std::string(int)> stmt = [&](int d) -> std::string {
    switch (d <= 0 ? 0 : rng() % 7) {
      case 0:
        return "{{ " + expr(2) + " }}";
      case 1:
        return "{% for message in " + expr(1) + " %}" + stmt(d - 1) + stmt(d - 1) + "{% endfor %}";
      case 2:
        return "{% if " + expr(1) + " %}" + stmt(d - 1) + "{% else %}" + stmt(d - 1) + "{% endif %}";
      case 3:
        return "{% set ns.a = " + expr(1) + " %}" + stmt(d - 1);
      case 4:
        return "{% macro m(x, y=2) %}" + stmt(d - 1) + "{% endmacro %}{{ m(" + expr(1) + ") }}";
      case 5:
        return "{% call m(1) %}" + stmt(d - 1) + "{% endcall %}";
      default:
        return "{% set x %}" + stmt(d - 1) + "{% endset %}{{ x|length }}";
    }
  };
  Stats st;
  for (int i = 0; i < 10000; ++i) {
    std::string src =
        "{% set ns = namespace(a=0) %}{% macro m(x, y=2) %}[{{ x }}{{ caller() if false }}]{% endmacro %}" + stmt(4);
    run_one(src, vars, opts, st);
  }
  std::printf("generated programs: %d rendered, %d raised\n", st.rendered, st.errors);
  EXPECT_GT(st.rendered, 1000);
}

}  // namespace
