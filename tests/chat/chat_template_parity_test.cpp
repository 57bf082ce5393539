// Byte-for-byte parity with Hugging Face's apply_chat_template: every real chat template in
// shared/testdata/chat_templates (llama.cpp and ollama collections) is rendered with every
// conversation of conversations.json, by our engine and by Python's jinja2 (render_jinja2.py,
// run now with /usr/bin/python3 and configured like transformers). Where jinja2 renders, the bytes
// must be identical; where it raises, we must raise the same kind of error (and, for
// raise_exception(), the same message). A missing python3-jinja2 fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "chat/chat_template.h"
#include "chat/jinja/pystr.h"
#include "testutil.h"

namespace {

using json = nlohmann::ordered_json;
using pg::jinja::ErrorKind;

constexpr const char* kNow = "2025-03-07T14:05:09";

ErrorKind kind_for_python(const std::string& py) {
  if (py == "TemplateSyntaxError" || py == "TemplateAssertionError" || py == "SyntaxError") return ErrorKind::kSyntax;
  if (py == "UndefinedError") return ErrorKind::kUndefined;
  if (py == "TypeError") return ErrorKind::kType;
  if (py == "ValueError" || py == "ZeroDivisionError" || py == "OverflowError" || py == "KeyError" || py == "IndexError")
    return ErrorKind::kValue;
  if (py == "SecurityError") return ErrorKind::kSecurity;
  if (py == "TemplateError") return ErrorKind::kRaised;
  if (py == "RecursionError") return ErrorKind::kLimit;
  if (py == "AttributeError") return ErrorKind::kType;  // e.g. dictsort of a str: 'str' object has no attribute 'items'
  return ErrorKind::kRuntime;
}

std::string show(const std::string& s, size_t max = 400) {
  return s.size() <= max ? s : s.substr(0, max) + "...(" + std::to_string(s.size()) + " bytes)";
}

TEST(ChatTemplateParity, AllTemplatesAllConversationsMatchJinja2) {
  // Templates.
  std::vector<std::filesystem::path> templates;
  for (const char* sub : {"testdata/chat_templates/llama.cpp", "testdata/chat_templates/ollama"}) {
    for (const auto& e : std::filesystem::directory_iterator(pg::test::shared_path(sub))) {
      auto ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".jinja" || ext == ".jinja2")) templates.push_back(e.path());
    }
  }
  std::sort(templates.begin(), templates.end());
  ASSERT_GE(templates.size(), 60u);

  // Conversations.
  const auto src_dir = std::filesystem::path(PEREGRINE_SOURCE_DIR) / "tests" / "chat";
  json cases = json::parse(pg::test::read_text(src_dir / "conversations.json"));
  ASSERT_GE(cases.size(), 12u);

  // Reference renders from Python's jinja2, all in one process.
  pg::test::TempDir tmp;
  json jobs = json::array();
  for (const auto& t : templates) {
    for (const auto& c : cases) {
      jobs.push_back({{"template", t.string()},
                      {"conversation", c["conversation"]},
                      {"add_generation_prompt", c["add_generation_prompt"]},
                      {"vars", c["vars"]},
                      {"now", kNow}});
    }
  }
  const auto jobs_path = tmp.path() / "jobs.json", out_path = tmp.path() / "results.json";
  {
    std::ofstream f(jobs_path, std::ios::binary);
    f << jobs.dump();
  }
  auto res = pg::test::run_command(
      {"/usr/bin/python3", (src_dir / "render_jinja2.py").string(), "--batch", jobs_path.string(), "--out", out_path.string()},
      "", 900);
  ASSERT_EQ(res.exit_code, 0) << "Python jinja2 reference failed (is python3-jinja2 installed?):\n" << res.err;
  json results = json::parse(pg::test::read_text(out_path));
  ASSERT_EQ(results.size(), jobs.size());

  const auto now = pg::jinja::parse_iso8601(kNow);
  size_t same_text = 0, same_error = 0, mismatches = 0, job = 0;
  std::map<std::string, int> per_template_ok;
  for (const auto& t : templates) {
    const std::string source = pg::test::read_text(t);
    const std::string tname = t.parent_path().filename().string() + "/" + t.filename().string();
    std::optional<pg::chat::ChatTemplate> tpl;
    std::optional<pg::jinja::Error> parse_error;
    try {
      tpl.emplace(source, "<s>", "</s>");
    } catch (const pg::jinja::Error& e) {
      parse_error = e;
    }
    for (const auto& c : cases) {
      const json& ref = results[job++];
      const std::string cname = c["name"];
      const json& conv = c["conversation"];
      std::string out;
      std::optional<pg::jinja::Error> err = parse_error;
      if (!err) {
        try {
          out = tpl->render(conv["messages"], conv.contains("tools") ? conv["tools"] : json(), c["add_generation_prompt"],
                            c["vars"], now);
        } catch (const pg::jinja::Error& e) {
          err = e;
        }
      }
      bool ok;
      if (ref["ok"].get<bool>()) {
        ok = !err && out == ref["text"].get<std::string>();
        if (ok) ++same_text;
        if (!ok) {
          ADD_FAILURE() << tname << " x " << cname << ": jinja2 rendered\n"
                        << show(ref["text"]) << "\nbut we "
                        << (err ? std::string("raised: ") + err->what() : "rendered\n" + show(out));
        }
      } else {
        const std::string full = ref["error"];
        const std::string type = full.substr(0, full.find(':'));
        const std::string msg = full.size() > type.size() + 2 ? full.substr(type.size() + 2) : "";
        ok = err && err->kind() == kind_for_python(type) && (type != "TemplateError" || err->message() == msg);
        if (ok) ++same_error;
        if (!ok) {
          ADD_FAILURE() << tname << " x " << cname << ": jinja2 raised " << full << "\nbut we "
                        << (err ? std::string("raised: ") + err->what() : "rendered\n" + show(out));
        }
      }
      if (ok) {
        ++per_template_ok[tname];
      } else {
        ++mismatches;
      }
    }
  }
  std::printf(
      "chat template parity: %zu templates x %zu conversations = %zu renders; %zu identical outputs, "
      "%zu identical errors, %zu mismatches\n",
      templates.size(), cases.size(), jobs.size(), same_text, same_error, mismatches);
  EXPECT_EQ(mismatches, 0u);
  // The corpus must mostly render (a sanity check that the conversations are realistic).
  EXPECT_GT(same_text, jobs.size() * 3 / 4);
}

// Differential fuzzing against jinja2: thousands of deterministic mutations of the real templates
// and of the golden unit-test templates are rendered by both engines. Whatever jinja2 does with a
// mutated template (render, or raise during parsing or rendering) we must do too. Cases are only
// skipped where exact agreement is impossible by design: Python reprs with memory addresses,
// integers beyond 64 bits, jinja2 timeouts and Python recursion limits.
TEST(ChatTemplateParity, MutatedTemplatesMatchJinja2) {
  const auto src_dir = std::filesystem::path(PEREGRINE_SOURCE_DIR) / "tests" / "chat";
  json golden = json::parse(pg::test::read_text(src_dir / "jinja_cases.json"));
  std::vector<std::string> seeds;
  json vars;
  for (const auto& c : golden["cases"]) {
    seeds.push_back(c["template"].get<std::string>());
    if (c["name"] == "print_scalars") vars = c["vars"];
  }
  for (const char* sub : {"testdata/chat_templates/llama.cpp", "testdata/chat_templates/ollama"}) {
    for (const auto& e : std::filesystem::directory_iterator(pg::test::shared_path(sub))) {
      auto ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".jinja" || ext == ".jinja2")) seeds.push_back(pg::test::read_text(e.path()));
    }
  }
  json cases = json::parse(pg::test::read_text(src_dir / "conversations.json"));
  for (const auto& c : cases) {
    if (c["name"] == "agent_full_no_gen") {
      vars["messages"] = c["conversation"]["messages"];
      vars["tools"] = c["conversation"]["tools"];
    }
  }
  vars["bos_token"] = "<s>";
  vars["eos_token"] = "</s>";
  vars["add_generation_prompt"] = true;
  ASSERT_TRUE(vars.contains("xs") && vars.contains("messages"));

  static const char* kTokens[] = {"{%",    "%}",    "{{",       "}}",     "{#",   "#}",     "{%-",   "-%}",     "{{-",    "-}}",
                                  "(",     ")",     "[",        "]",      ",",    ":",      ".",     "|",       "~",      "+",
                                  "-",     "*",     "/",        "//",     "%",    "==",     "<",     "=",       " ",      "\n",
                                  "'",     "\"",    "x",        "in",     "if",   "else",   "not",   "and",     "or",     "none",
                                  "true",  "loop",  "messages", "tojson", "trim", "length", "join",  "string",  "upper",  "list",
                                  "first", "'abc'", "0",        "1",      "-1",   "2.5",    "[1,2]", "{'k':1}", "[::-1]", "é"};
  std::mt19937 rng(20250307);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  json jobs = json::array();
  std::vector<std::string> sources;
  const int kCases = 3000;
  for (int i = 0; i < kCases; ++i) {
    std::string s = seeds[pick(seeds.size())];
    int n = 1 + static_cast<int>(pick(3));
    for (int k = 0; k < n; ++k) {
      size_t pos = pick(s.size() + 1);
      switch (pick(5)) {
        case 0:
          s.insert(pos, kTokens[pick(sizeof(kTokens) / sizeof(kTokens[0]))]);
          break;
        case 1:
          s.erase(std::min(pos, s.size()), 1 + pick(10));
          break;
        case 2:
          if (!s.empty()) s.insert(pos, s.substr(pick(s.size()), 1 + pick(60)));
          break;
        case 3:
          if (pos < s.size()) s[pos] = "{}%#-+()[]|'\"\n "[pick(15)];
          break;
        default: {
          const std::string& o = seeds[pick(seeds.size())];
          if (!o.empty()) s.insert(pos, o.substr(pick(o.size()), 1 + pick(80)));
        }
      }
    }
    // Byte edits may split a UTF-8 sequence; both engines get the same valid text.
    s = pg::jinja::py::encode(pg::jinja::py::decode(s));
    sources.push_back(s);
    jobs.push_back({{"source", s}, {"vars", vars}, {"now", kNow}, {"timeout", 5}});
  }

  pg::test::TempDir tmp;
  const auto jobs_path = tmp.path() / "jobs.json", out_path = tmp.path() / "results.json";
  {
    std::ofstream f(jobs_path, std::ios::binary);
    f << jobs.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  auto res = pg::test::run_command(
      {"/usr/bin/python3", (src_dir / "render_jinja2.py").string(), "--batch", jobs_path.string(), "--out", out_path.string()},
      "", 900);
  ASSERT_EQ(res.exit_code, 0) << "Python jinja2 reference failed (is python3-jinja2 installed?):\n" << res.err;
  json results = json::parse(pg::test::read_text(out_path));
  ASSERT_EQ(results.size(), jobs.size());

  pg::jinja::RenderOptions opts;
  opts.now = pg::jinja::parse_iso8601(kNow);
  size_t same_text = 0, same_error = 0, skipped = 0, mismatches = 0;
  for (size_t i = 0; i < sources.size(); ++i) {
    const json& ref = results[i];
    std::string out;
    std::optional<pg::jinja::Error> err;
    try {
      out = pg::jinja::Template(sources[i]).render(vars, opts);
    } catch (const pg::jinja::Error& e) {
      err = e;
    }
    const bool ref_ok = ref["ok"].get<bool>();
    const std::string ref_err = ref_ok ? "" : ref["error"].get<std::string>();
    const std::string type = ref_err.substr(0, ref_err.find(':'));
    if ((ref_ok && ref["text"].get<std::string>().find(" at 0x") != std::string::npos) || type == "JobTimeout" ||
        type == "RecursionError" || type == "NameError" ||
        (err && (err->kind() == pg::jinja::ErrorKind::kLimit || err->message().find("integer overflow") != std::string::npos))) {
      ++skipped;
      continue;
    }
    bool ok;
    if (ref_ok) {
      ok = !err && out == ref["text"].get<std::string>();
      if (ok) ++same_text;
    } else {
      const std::string msg = ref_err.size() > type.size() + 2 ? ref_err.substr(type.size() + 2) : "";
      ok = err && err->kind() == kind_for_python(type) && (type != "TemplateError" || err->message() == msg);
      if (ok) ++same_error;
    }
    if (!ok) {
      ++mismatches;
      ADD_FAILURE() << "mutated template #" << i << ":\n"
                    << show(sources[i], 3000) << "\njinja2: " << (ref_ok ? "rendered\n" + show(ref["text"]) : ref_err)
                    << "\nours: " << (err ? std::string("raised: ") + err->what() : "rendered\n" + show(out));
    }
  }
  std::printf(
      "differential fuzz vs jinja2: %zu mutated templates; %zu identical outputs, %zu identical errors, "
      "%zu skipped, %zu mismatches\n",
      sources.size(), same_text, same_error, skipped, mismatches);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_LT(skipped, sources.size() / 20);
  EXPECT_GT(same_text, sources.size() / 10);
}

}  // namespace
