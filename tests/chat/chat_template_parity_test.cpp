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

#include "chat/chat_template.h"
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
  auto res = pg::test::run_command({"/usr/bin/python3", (src_dir / "render_jinja2.py").string(), "--batch",
                                    jobs_path.string(), "--out", out_path.string()},
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
  std::printf("chat template parity: %zu templates x %zu conversations = %zu renders; %zu identical outputs, "
              "%zu identical errors, %zu mismatches\n",
              templates.size(), cases.size(), jobs.size(), same_text, same_error, mismatches);
  EXPECT_EQ(mismatches, 0u);
  // The corpus must mostly render (a sanity check that the conversations are realistic).
  EXPECT_GT(same_text, jobs.size() * 3 / 4);
}

}  // namespace
