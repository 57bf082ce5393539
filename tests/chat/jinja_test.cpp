// Unit tests of the Jinja engine: golden cases from Python's jinja2 (gen_jinja_cases.py), plus
// API behaviour, error reporting and the sandbox limits.
#include "chat/jinja/jinja.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "testutil.h"

namespace {

using json = nlohmann::ordered_json;
using pg::jinja::Error;
using pg::jinja::ErrorKind;
using pg::jinja::RenderOptions;
using pg::jinja::Template;

ErrorKind kind_for_python(const std::string& py) {
  if (py == "TemplateSyntaxError" || py == "TemplateAssertionError" || py == "SyntaxError") return ErrorKind::kSyntax;
  if (py == "UndefinedError") return ErrorKind::kUndefined;
  if (py == "TypeError") return ErrorKind::kType;
  if (py == "ValueError" || py == "ZeroDivisionError" || py == "OverflowError" || py == "KeyError" || py == "IndexError")
    return ErrorKind::kValue;
  if (py == "SecurityError") return ErrorKind::kSecurity;
  if (py == "TemplateError") return ErrorKind::kRaised;
  if (py == "RecursionError") return ErrorKind::kLimit;
  return ErrorKind::kRuntime;  // TemplateRuntimeError, FilterArgumentError, AssertionError
}

std::string render(const std::string& src, const json& vars = json::object(), const RenderOptions& opts = {}) {
  return Template(src).render(vars, opts);
}

// Renders and returns the error kind; fails the test when no error is raised.
ErrorKind render_error(const std::string& src, const json& vars = json::object(), const RenderOptions& opts = {},
                       std::string* what = nullptr) {
  try {
    std::string out = render(src, vars, opts);
    ADD_FAILURE() << "expected an error, got " << out.size() << " bytes from: " << src.substr(0, 200);
  } catch (const Error& e) {
    if (what) *what = e.what();
    return e.kind();
  }
  return ErrorKind::kRuntime;
}

TEST(JinjaGolden, MatchesPythonJinja2) {
  auto path = std::filesystem::path(PEREGRINE_SOURCE_DIR) / "tests" / "chat" / "jinja_cases.json";
  json doc = json::parse(pg::test::read_text(path));
  RenderOptions opts;
  opts.now = pg::jinja::parse_iso8601(doc["now"].get<std::string>());
  int checked = 0, outputs = 0, errors = 0;
  for (const auto& c : doc["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    const std::string src = c["template"];
    try {
      Template t(src);
      std::string out = t.render(c["vars"], opts);
      if (c.contains("expect")) {
        EXPECT_EQ(out, c["expect"].get<std::string>());
        ++outputs;
      } else {
        ADD_FAILURE() << "jinja2 raised " << c["error"] << " (" << c["message"] << ") but we rendered: " << out;
      }
    } catch (const Error& e) {
      if (c.contains("expect")) {
        ADD_FAILURE() << "unexpected error: " << e.what();
      } else {
        EXPECT_EQ(e.kind(), kind_for_python(c["error"]))
            << "ours: " << e.what() << "\njinja2: " << c["error"] << ": " << c["message"];
        if (c["error"] == "TemplateError") {
          EXPECT_EQ(e.message(), c["message"].get<std::string>());
        }
        ++errors;
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 240);
  std::printf("golden jinja2 cases: %d (%d outputs, %d errors)\n", checked, outputs, errors);
}

TEST(Jinja, ParseOnceRenderMany) {
  Template t("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{{ extra | default('-') }}");
  json a = {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  json b = {{"messages", json::array({{{"role", "a"}, {"content", "x"}}, {{"role", "b"}, {"content", "y"}}})}, {"extra", "E"}};
  EXPECT_EQ(t.render(a), "user:hi;-");
  EXPECT_EQ(t.render(b), "a:x;b:y;E");
  EXPECT_EQ(t.render(a), "user:hi;-");
  // Concurrent renders of one parsed template.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 200; ++k)
        if (t.render(b) == "a:x;b:y;E") ++ok;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 800);
  Template moved = std::move(t);
  EXPECT_EQ(moved.render(a), "user:hi;-");
}

TEST(Jinja, VariablesKeepInsertionOrder) {
  json vars = json::parse(R"({"d": {"zeta": 1, "alpha": 2, "mid": 3}})");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}{{ v }} {% endfor %}{{ d|tojson }}", vars),
            "zeta1 alpha2 mid3 {\"zeta\": 1, \"alpha\": 2, \"mid\": 3}");
}

TEST(Jinja, ErrorsAreTypedAndCarryLines) {
  std::string what;
  EXPECT_EQ(render_error("line1\n{{ 1 +\n 'a' }}", json::object(), {}, &what), ErrorKind::kType);
  EXPECT_NE(what.find("line 2"), std::string::npos) << what;
  EXPECT_EQ(render_error("a\nb\n{% if %}", json::object(), {}, &what), ErrorKind::kSyntax);
  EXPECT_NE(what.find("line 3"), std::string::npos) << what;
  // raise_exception's message reaches the caller unchanged, as a pg::Error.
  try {
    render("{{ raise_exception('Only user and assistant roles are supported!') }}");
    FAIL();
  } catch (const pg::Error& e) {
    EXPECT_STREQ(e.what(), "Only user and assistant roles are supported!");
  }
  EXPECT_EQ(render_error("{{ x.y }}"), ErrorKind::kUndefined);
  EXPECT_EQ(render_error("{% set l = [] %}{{ l.append(1) }}"), ErrorKind::kSecurity);
  EXPECT_THROW(Template("{{ \xff }}"), Error);  // not UTF-8
  EXPECT_THROW(render("{{ x }}", json::array()), pg::Error);
}

TEST(Jinja, StrftimeNow) {
  RenderOptions opts;
  opts.now = pg::jinja::parse_iso8601("2024-02-29T23:59:58.000001+05:30");
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y %H:%M:%S.%f %z %Z %A %j') }}", json::object(), opts),
            "29 Feb 2024 23:59:58.000001 +0530 UTC+05:30 Thursday 060");
  // Default: the current local time.
  auto year = render("{{ strftime_now('%Y') }}");
  EXPECT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
  EXPECT_THROW(pg::jinja::parse_iso8601("2024-13-01"), pg::Error);
  EXPECT_THROW(pg::jinja::parse_iso8601("yesterday"), pg::Error);
  EXPECT_THROW(pg::jinja::parse_iso8601("2024-01-01T10:00:00junk"), pg::Error);
}

// --- sandbox limits -----------------------------------------------------------------------------

TEST(JinjaLimits, InfiniteMacroRecursion) {
  std::string what;
  EXPECT_EQ(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", json::object(), {}, &what), ErrorKind::kLimit);
  EXPECT_NE(what.find("recursion"), std::string::npos) << what;
  EXPECT_EQ(render_error("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}"),
            ErrorKind::kLimit);
  EXPECT_EQ(render_error("{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}"), ErrorKind::kLimit);
}

// Deep recursion must hit the depth limit well before a small thread stack overflows.
TEST(JinjaLimits, RecursionFitsInSmallStack) {
  struct Ctx {
    bool limit = false;
  } ctx;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 2u << 20);
  pthread_t th;
  auto fn = [](void* p) -> void* {
    auto* c = static_cast<Ctx*>(p);
    try {
      Template(
          "{% macro f(n) %}{% for i in [1] %}{% if true %}{{ (f(n + 1) ~ [n, {'k': n}]|tojson)|trim }}{% endif %}"
          "{% endfor %}{% endmacro %}{{ f(0) }}")
          .render(json::object());
    } catch (const Error& e) {
      c->limit = e.kind() == ErrorKind::kLimit;
    }
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&th, &attr, fn, &ctx), 0);
  pthread_join(th, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_TRUE(ctx.limit);
}

TEST(JinjaLimits, HugeLoops) {
  RenderOptions opts;
  opts.limits.max_steps = 2'000'000;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(
      render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", json::object(), opts),
      ErrorKind::kLimit);
  EXPECT_EQ(render_error("{% for i in range(100000) %}{% for j in range(100000) %}{{ j is odd }}{% endfor %}{% endfor %}"),
            ErrorKind::kLimit);  // default limits
  auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 30.0);
  // jinja2's sandbox refuses range() over 100000 items.
  EXPECT_EQ(render_error("{{ range(200000)|length }}"), ErrorKind::kValue);
}

TEST(JinjaLimits, HugeOutputAndStrings) {
  RenderOptions opts;
  opts.limits.max_output_bytes = 1 << 20;
  EXPECT_EQ(render_error("{% for i in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", json::object(), opts),
            ErrorKind::kLimit);
  // Output captured by a macro or set block is bounded too.
  EXPECT_EQ(render_error("{% set s %}{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}{% endset %}", json::object(), opts),
            ErrorKind::kLimit);
  // Repetition and doubling cannot allocate without bound.
  EXPECT_NE(render_error("{{ 'x' * 100000000000 }}"), ErrorKind::kRaised);
  EXPECT_EQ(render_error("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                         "{% endfor %}{{ ns.s|length }}"),
            ErrorKind::kLimit);
  EXPECT_EQ(render_error("{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
                         "{% endfor %}{{ ns.l|length }}"),
            ErrorKind::kLimit);
}

TEST(JinjaLimits, DeepNesting) {
  // Deeply nested values and generator chains are refused instead of overflowing the stack later.
  EXPECT_EQ(render_error("{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}"),
            ErrorKind::kLimit);
  EXPECT_EQ(render_error("{% set ns = namespace(g=[1, 2]) %}{% for i in range(5000) %}"
                         "{% set ns.g = ns.g|map('string') %}{% endfor %}{{ ns.g|list }}"),
            ErrorKind::kLimit);
  EXPECT_EQ(render_error("{% set ns = namespace() %}{% for i in range(5000) %}{% set ns.n = namespace(x=ns.n) %}"
                         "{% endfor %}"),
            ErrorKind::kLimit);
  // Deeply nested source is a syntax error, not a crash.
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_EQ(render_error(deep), ErrorKind::kSyntax);
  std::string deep_if;
  for (int i = 0; i < 3000; ++i) deep_if += "{% if true %}";
  EXPECT_EQ(render_error(deep_if), ErrorKind::kSyntax);
  // Deep JSON input is refused cleanly.
  json v = 1;
  for (int i = 0; i < 2000; ++i) v = json::array({v});
  EXPECT_EQ(render_error("{{ v }}", json{{"v", v}}), ErrorKind::kLimit);
}

TEST(JinjaLimits, SelfReferenceDoesNotHangOrLeak) {
  // A namespace holding itself prints like CPython's recursive repr.
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"), "<Namespace {'me': <Namespace {...}>}>");
  EXPECT_EQ(render("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns.me.me.me is defined }}"), "True");
  EXPECT_EQ(render_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns|tojson }}"), ErrorKind::kType);
}

}  // namespace
