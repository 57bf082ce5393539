// Regression tests for what the chat fuzzers (fuzz/fuzz_jinja.cpp, fuzz/fuzz_chat_parse.cpp) found, one test per bug.
// Each input is the minimised form of the finding; the comment says what went wrong before the fix. All are Jinja
// engine bugs: fuzz_chat_parse has not found any in the output parsers.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include "chat/jinja/jinja.h"

#if defined(__SANITIZE_ADDRESS__)
#define PG_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define PG_TEST_ASAN 1
#endif
#endif

namespace {

using json = nlohmann::ordered_json;
using pg::jinja::ErrorKind;

// ASan's shadow memory and quarantine make resident memory meaningless as a bound.
#ifdef PG_TEST_ASAN
constexpr bool kCheckRss = false;
#else
constexpr bool kCheckRss = true;
#endif

struct Outcome {
  bool ok = false;
  std::string text;  // output, or the error's message
  ErrorKind kind = ErrorKind::kRuntime;
  double seconds = 0;
};

Outcome render(const std::string& src, const json& vars = json::object(), const pg::jinja::Limits& limits = {}) {
  Outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    pg::jinja::RenderOptions opts;
    opts.limits = limits;
    o.text = pg::jinja::Template(src).render(vars, opts);
    o.ok = true;
  } catch (const pg::jinja::Error& e) {
    o.text = e.message();
    o.kind = e.kind();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return o;
}

void expect_error(const Outcome& o, ErrorKind kind, std::string_view what) {
  EXPECT_FALSE(o.ok) << "rendered: " << o.text.substr(0, 200);
  EXPECT_EQ(o.kind, kind) << o.text;
  EXPECT_NE(o.text.find(what), std::string::npos) << o.text;
}

// Peak resident memory of this process so far, in MiB.
double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;
}

// ---------------------------------------------------------------------------------------------------------------------
// Jinja: undefined behaviour (UBSan findings)

// filesizeformat converted any size below the base to int64_t, so -1e300 was an out-of-range float-to-int conversion.
TEST(JinjaFuzzRegression, FilesizeformatHugeNegativeSize) {
  expect_error(render("{{ (-1e300)|filesizeformat }}"), ErrorKind::kValue, "integer overflow");
  expect_error(render("{{ (-1e300 * 1e300)|filesizeformat }}"), ErrorKind::kValue, "infinity");
  // In range it is unchanged (Python: int(bytes) + " Bytes").
  EXPECT_EQ(render("{{ (-5.7)|filesizeformat }}|{{ 999|filesizeformat }}|{{ 1|filesizeformat }}").text,
            "-5 Bytes|999 Bytes|1 Byte");
}

// '%*d' negated a negative width taken from the arguments: INT64_MIN overflowed (UB), and no width from '*' was capped,
// so '%*d' % (10**11, 1) tried to allocate 100 GB (std::bad_alloc / length_error escaped as non-pg exceptions).
TEST(JinjaFuzzRegression, PercentFormatStarWidthAndPrecision) {
  expect_error(render("{{ '%*d'|format(-9223372036854775807 - 1, 1) }}"), ErrorKind::kValue, "width too big");
  expect_error(render("{{ '%*d'|format(100000000000, 1) }}"), ErrorKind::kValue, "width too big");
  expect_error(render("{{ '%*s' % (-100000000000, 'x') }}"), ErrorKind::kValue, "width too big");
  expect_error(render("{{ '%.*f'|format(100000000000, 1.5) }}"), ErrorKind::kValue, "precision too big");
  // Widths and precisions in range behave as before (as in Python).
  EXPECT_EQ(render("[{{ '%*d'|format(-5, 1) }}][{{ '%*d'|format(4, 7) }}][{{ '%.*f'|format(2, 1.5) }}]").text,
            "[1    ][   7][1.50]");
}

// ---------------------------------------------------------------------------------------------------------------------
// Jinja: stack overflow

// Left-associative chains were built in a loop without a depth limit, and evaluating (and freeing) the resulting tree
// recursed once per link: {{ 1 + 1 + ... }} with 300k terms, x.b.b.b..., v|string|string..., x(1)(1)..., x[0][0]...
// crashed the process with a stack overflow (ASan: at 8k links). Chains now count towards the parser's nesting limit.
TEST(JinjaFuzzRegression, LongChainsAreRefusedNotOverflowed) {
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  const std::string sources[] = {
      "{{ " + repeat("1 + ", 300000) + "1 }}",    "{{ " + repeat("2 * ", 300000) + "1 }}",
      "{{ 1" + repeat(" ** 1", 300000) + " }}",   "{{ x" + repeat(".b", 300000) + " }}",
      "{{ x" + repeat("[0]", 300000) + " }}",     "{{ x" + repeat("(1)", 300000) + " }}",
      "{{ 1" + repeat("|string", 300000) + " }}", "{{ 1" + repeat(" is number", 1) + repeat(" and 1", 300000) + " }}",
      "{{ 1" + repeat(" or 1", 300000) + " }}",   "{{ 1" + repeat(" if 1 else 1", 300000) + " }}",
  };
  for (const auto& src : sources) {
    SCOPED_TRACE(src.substr(0, 40));
    const Outcome o = render(src);
    expect_error(o, ErrorKind::kSyntax, "nested too deeply");
  }
  // Chains of ordinary length are unaffected.
  EXPECT_EQ(render("{{ " + repeat("1 + ", 100) + "1 }}|{{ 'ab'" + repeat("|upper", 50) + " }}").text, "101|AB");
}

// ---------------------------------------------------------------------------------------------------------------------
// Jinja: work the step counter did not see (renders of minutes under the default limits)

// std::string_view::find is O(len(text) * len(needle)) on needles like "aaa...ab": one find of a 500 kB needle in a
// 1 MB string took 9 s. Searches now stay linear.
TEST(JinjaFuzzRegression, SubstringSearchIsLinear) {
  const Outcome o = render(
      "{% set h = 'a' * 1000000 ~ 'b' %}{% set n = 'a' * 500000 ~ 'b' %}"
      "{{ h.find(n) }}|{{ h.rfind(n) }}|{{ h.count(n) }}|{{ n in h }}|{{ h.split(n)|length }}|{{ h.rsplit(n)|length }}|"
      "{{ h.replace(n, 'x')|length }}|{{ h.partition(n)[0]|length }}|{{ h.rpartition(n)[2]|length }}|{{ h is in(h) }}");
  ASSERT_TRUE(o.ok) << o.text;
  EXPECT_EQ(o.text, "500000|500000|1|True|2|2|500001|500000|0|True");
  EXPECT_LT(o.seconds, 5.0);
}

// The linear search (Knuth-Morris-Pratt for needles over 32 bytes) must agree with std::string_view everywhere:
// random texts over a small alphabet with periodic needles, through every method that searches.
TEST(JinjaFuzzRegression, LongNeedleSearchAgreesWithStd) {
  std::mt19937 rng(2024);
  pg::jinja::Template t(
      "{{ h.find(n) }} {{ h.rfind(n) }} {{ h.count(n) }} {{ n in h }} {{ h.split(n)|join('/') }} {{ h.rsplit(n, 2)|join('/') }} "
      "{{ h.replace(n, '#') }} {{ h.partition(n)|join('/') }} {{ h.rpartition(n)|join('/') }} {{ h.find(n, 7, -3) }} "
      "{{ h.rfind(n, 5, -2) }}");
  for (int iter = 0; iter < 300; ++iter) {
    const std::string unit = std::string(1 + rng() % 3, 'a') + (rng() % 2 ? "b" : "");
    std::string n;
    while (n.size() < 33 + rng() % 40) n += unit;
    if (rng() % 3 == 0) n += "ba";
    std::string h;
    const size_t len = 40 + rng() % 600;
    while (h.size() < len) h += rng() % 4 ? unit : (rng() % 2 ? n : std::string(1, "ab"[rng() % 2]));
    // Reference, computed with std::string_view on ASCII text (byte offsets are code point offsets).
    const std::string_view hv(h);
    auto count = [&](std::string_view s) {
      size_t c = 0;
      for (size_t p = s.find(n); p != std::string_view::npos; p = s.find(n, p + n.size())) ++c;
      return c;
    };
    auto split = [&](std::string_view s) {
      std::string out;
      size_t from = 0;
      for (size_t p = s.find(n); p != std::string_view::npos; p = s.find(n, from)) {
        out += std::string(s.substr(from, p - from)) + "/";
        from = p + n.size();
      }
      return out + std::string(s.substr(from));
    };
    auto rsplit2 = [&](std::string_view s) {
      std::vector<std::string> parts;
      size_t end = s.size();
      for (int k = 0; k < 2 && end >= n.size(); ++k) {
        const size_t p = s.rfind(n, end - n.size());
        if (p == std::string_view::npos) break;
        parts.insert(parts.begin(), std::string(s.substr(p + n.size(), end - p - n.size())));
        end = p;
      }
      parts.insert(parts.begin(), std::string(s.substr(0, end)));
      std::string out;
      for (size_t i = 0; i < parts.size(); ++i) out += (i ? "/" : "") + parts[i];
      return out;
    };
    auto replace = [&](std::string_view s) {
      std::string out;
      size_t from = 0;
      for (size_t p = s.find(n); p != std::string_view::npos; p = s.find(n, from)) {
        out += std::string(s.substr(from, p - from)) + "#";
        from = p + n.size();
      }
      return out + std::string(s.substr(from));
    };
    auto num = [](size_t p) { return p == std::string_view::npos ? std::string("-1") : std::to_string(p); };
    const size_t f = hv.find(n), r = hv.rfind(n);
    const std::string part = f == std::string_view::npos ? h + "//" : h.substr(0, f) + "/" + n + "/" + h.substr(f + n.size());
    const std::string rpart = r == std::string_view::npos ? "//" + h : h.substr(0, r) + "/" + n + "/" + h.substr(r + n.size());
    // find(n, 7, -3): the window [7, len - 3); rfind(n, 5, -2): [5, len - 2).
    const std::string_view w1 = hv.substr(7, h.size() - 3 - 7), w2 = hv.substr(5, h.size() - 2 - 5);
    const size_t f1 = w1.find(n), r2 = w2.rfind(n);
    const std::string want = num(f) + " " + num(r) + " " + std::to_string(count(hv)) + " " +
                             (f == std::string_view::npos ? "False" : "True") + " " + split(hv) + " " + rsplit2(hv) + " " +
                             replace(hv) + " " + part + " " + rpart + " " + (f1 == std::string_view::npos ? "-1" : num(f1 + 7)) +
                             " " + (r2 == std::string_view::npos ? "-1" : num(r2 + 5));
    const std::string got = t.render(json{{"h", h}, {"n", n}});
    ASSERT_EQ(got, want) << "h=" << h << "\nn=" << n;
  }
}

// Each of these did O(size of an operand) work per interpreter step without charging it, so a loop of 100k of them
// over a 60 MB string (or a 100k-item list or dict) ran for minutes under the default 50M-step cap. Now the work is
// charged (work.h): with a small cap, the same loop over a 1 MB string or a 20k-item container stops after a few
// iterations, where before it ran all 200 on a few hundred steps.
TEST(JinjaFuzzRegression, OperandSizedWorkIsCharged) {
  pg::jinja::Limits limits;
  limits.max_steps = 200'000;
  const std::string ascii = "{% set big = 'a' * 1000000 %}{% set other = 'a' * 1000000 %}";
  const std::string wide = "{% set big = 'é' * 500000 %}";
  const std::string list = "{% set big = range(20000)|list %}{% set other = range(20000)|list %}";
  const char* loop = "{% for i in range(200) %}";
  struct Case {
    std::string setup, body;
  } cases[] = {
      {ascii, "{{ 'b' in big }}"},             // substring search
      {ascii, "{{ big.count('b') }}"},         // str.count
      {ascii, "{{ big == other }}"},           // string equality (memcmp)
      {ascii, "{{ big < other }}"},            // string ordering
      {ascii, "{{ big.startswith(other) }}"},  // prefix comparison
      {wide, "{{ big.isalpha() }}"},           // code point loops (decode)
      {wide, "{{ big[-1] }}"},                 // code point indexing in non-ASCII text
      {list, "{{ big|max }}"},                 // list walks inside filters
      {list, "{{ big|sum }}"},                 // more list walks
      {list, "{{ big == other }}"},            // list equality
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    const Outcome o = render(c.setup + loop + c.body + "{% endfor %}", json::object(), limits);
    expect_error(o, ErrorKind::kLimit, "work limit");
  }
  // Dict lookups are linear in the dict (value.h): a loop of lookups in a large dict is charged per entry scanned.
  json vars;
  for (int i = 0; i < 20000; ++i) vars["big"][std::to_string(i)] = i;
  expect_error(render(std::string(loop) + "{{ big[19999|string] }}{{ big.get('x') }}{% endfor %}", vars, limits),
               ErrorKind::kLimit, "work limit");
  // The same loops over small values stay far below the cap: ordinary templates are not affected.
  const Outcome small = render(std::string(loop) + "{{ 'b' in 'abc' }}{{ [1, 2]|max }}{{ 'é'[0] }}{% endfor %}", {}, limits);
  EXPECT_TRUE(small.ok) << small.text;
}

// striptags searched for the next '>' from every '<': a text of '<' without '>' was quadratic (fuzz_jinja timeout on
// ('<a~' * 569434)|striptags, 4 s in a release build; hours for a 64 MB string).
TEST(JinjaFuzzRegression, StriptagsUnclosedTagsIsLinear) {
  const Outcome o =
      render("{{ ('<a~' * 2000000)|striptags|length }}|{{ ('x<b>y<' * 3)|striptags }}|{{ 'a <b>c</b> <d'|striptags }}");
  ASSERT_TRUE(o.ok) << o.text;
  EXPECT_EQ(o.text, "6000000|xyyy<|a c <d");  // as jinja2 (markupsafe) renders them
  EXPECT_LT(o.seconds, 5.0);
}

// str.strip(chars) tested every code point against a linear scan of `chars`: quadratic, ~45 s for 300k by 300k.
TEST(JinjaFuzzRegression, StripWithLongCharSet) {
  const Outcome o = render("{{ ('a' * 300000).strip('b' * 300000 ~ 'a')|length }}|{{ ('xyzzy' * 3).strip('zy') }}");
  ASSERT_TRUE(o.ok) << o.text;
  EXPECT_EQ(o.text, "0|xyzzyxyzzyx");
  EXPECT_LT(o.seconds, 5.0);
  EXPECT_EQ(render("{{ 'xyzzyx'.strip('zyx') }}|{{ 'abcba'.strip('ab') }}|{{ 'ébé'.strip('é') }}").text, "|c|b");
}

// ---------------------------------------------------------------------------------------------------------------------
// Jinja: memory the allocation cap did not see

// A string value costs ~100 bytes besides its text, which was not charged, and str.split / splitlines built all their
// parts before anything was charged: ('\n' * 60000000).splitlines() reached 9.4 GB of resident memory before the
// 256 MB cap stopped it, "|list" or "|sort" of a 60 MB string 6.5 GB. Now each part and each string value is charged as
// it is made, so these stop near the cap.
TEST(JinjaFuzzRegression, ManySmallStringsAreChargedAsMade) {
  const char* inputs[] = {
      "{{ ('\\n' * 60000000).splitlines()|length }}", "{{ ('a,' * 30000000).split(',')|length }}",
      "{{ ('a,' * 30000000).rsplit(',')|length }}",   "{{ ('a ' * 30000000).split()|length }}",
      "{{ ('a' * 60000000)|list|length }}",           "{{ ('a' * 60000000)|sort|length }}",
      "{{ ('a' * 60000000)|batch(1)|list|length }}",  "{{ ('\\n' * 60000000)|indent|length }}",
  };
  for (const char* src : inputs) {
    SCOPED_TRACE(src);
    const Outcome o = render(src);
    expect_error(o, ErrorKind::kLimit, "allocated more than");
    // Peak memory of the whole test process: the cap is 256 MB of values; with the text, the decoded copy and the
    // allocator's slack the peak stays well under 1.5 GB (it was 2-9 GB per input before).
    if (kCheckRss) {
      EXPECT_LT(peak_rss_mib(), 1536.0) << src;
    }
  }
  // With a small cap the accounting is visible directly: 100k one-byte parts cost ~130 bytes each, not 32.
  pg::jinja::Limits limits;
  limits.max_alloc_bytes = 8u << 20;
  expect_error(render("{{ ('x\\n' * 100000).splitlines()|length }}", {}, limits), ErrorKind::kLimit, "allocated more than");
  EXPECT_EQ(render("{{ ('x\\n' * 1000).splitlines()|length }}", {}, limits).text, "1000");
}

}  // namespace
