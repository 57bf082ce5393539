// ChatTemplate API (render arguments like transformers), chat template selection from GGUF
// metadata, and the `peregrine chat-template` command.
#include "chat/chat_template.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "testutil.h"

namespace {

using json = nlohmann::ordered_json;
using pg::chat::ChatTemplate;

const char* kProbe =
    "{{ bos_token }}|{{ tools is none }}|{{ documents is none }}|{{ add_generation_prompt }}|"
    "{% for m in messages %}{{ m.role }}={{ m.content }};{% endfor %}|{{ enable_thinking | default('unset') }}|"
    "{{ eos_token }}";

TEST(ChatTemplate, RenderArgumentsLikeTransformers) {
  ChatTemplate t(kProbe, "<s>", "</s>");
  json msgs = json::parse(R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])");
  EXPECT_EQ(t.render(msgs, json(), true), "<s>|True|True|True|user=hi;assistant=yo;|unset|</s>");
  EXPECT_EQ(t.render(msgs, json::array(), false, {{"enable_thinking", false}}),
            "<s>|False|True|False|user=hi;assistant=yo;|False|</s>");
  // extra variables may replace the special tokens, not the render arguments.
  EXPECT_EQ(t.render(msgs, json(), true, {{"bos_token", "[BOS]"}, {"eos_token", ""}}),
            "[BOS]|True|True|True|user=hi;assistant=yo;|unset|");
  EXPECT_THROW(t.render(msgs, json(), true, {{"messages", json::array()}}), pg::Error);
  EXPECT_THROW(t.render(json::object(), json(), true), pg::Error);
  EXPECT_EQ(t.bos_token(), "<s>");
  EXPECT_EQ(t.source(), kProbe);
}

TEST(ChatTemplate, FixedNowAndErrors) {
  ChatTemplate t("{{ strftime_now('%d %b %Y') }}{% if messages|length == 0 %}{{ raise_exception('empty!') }}{% endif %}", "", "");
  auto now = pg::jinja::parse_iso8601("2024-07-04T12:00:00");
  EXPECT_EQ(t.render(json::parse(R"([{"role":"user","content":"x"}])"), json(), true, json::object(), now), "04 Jul 2024");
  try {
    t.render(json::array(), json(), true, json::object(), now);
    FAIL();
  } catch (const pg::jinja::Error& e) {
    EXPECT_EQ(e.kind(), pg::jinja::ErrorKind::kRaised);
    EXPECT_STREQ(e.what(), "empty!");
  }
  EXPECT_THROW(ChatTemplate("{% if %}", "", ""), pg::jinja::Error);
}

// --- GGUF selection -----------------------------------------------------------------------------

class GgufBuilder {
 public:
  void str(const std::string& key, const std::string& v) {
    kv_header(key, 8);
    put_str(v);
    ++n_;
  }
  void u32(const std::string& key, uint32_t v) {
    kv_header(key, 4);
    put(&v, 4);
    ++n_;
  }
  void str_array(const std::string& key, const std::vector<std::string>& items) {
    kv_header(key, 9);
    uint32_t et = 8;
    put(&et, 4);
    uint64_t n = items.size();
    put(&n, 8);
    for (const auto& s : items) put_str(s);
    ++n_;
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
    uint32_t version = 3;
    uint64_t tensors = 0, kvs = n_;
    auto app = [&](const void* p, size_t n) {
      auto b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    app(&version, 4);
    app(&tensors, 8);
    app(&kvs, 8);
    out.insert(out.end(), body_.begin(), body_.end());
    while (out.size() % 32) out.push_back(0);
    return out;
  }

 private:
  void put(const void* p, size_t n) {
    auto b = static_cast<const uint8_t*>(p);
    body_.insert(body_.end(), b, b + n);
  }
  void put_str(const std::string& s) {
    uint64_t n = s.size();
    put(&n, 8);
    put(s.data(), s.size());
  }
  void kv_header(const std::string& key, uint32_t type) {
    put_str(key);
    put(&type, 4);
  }
  std::vector<uint8_t> body_;
  uint64_t n_ = 0;
};

TEST(ChatTemplateGguf, SelectsDefaultAndNamedVariants) {
  GgufBuilder b;
  b.str("general.architecture", "llama");
  b.str("tokenizer.chat_template", "DEFAULT {{ bos_token }}{{ messages[0].content }}");
  b.str("tokenizer.chat_template.tool_use", "TOOLS {{ tools|length }}{{ eos_token }}");
  b.str("tokenizer.chat_template.rag", "RAG");
  b.str_array("tokenizer.ggml.tokens", {"<unk>", "<|begin|>", "<|end|>", "a"});
  b.u32("tokenizer.ggml.bos_token_id", 1);
  b.u32("tokenizer.ggml.eos_token_id", 2);
  auto bytes = b.bytes();
  auto f = pg::gguf::File::from_memory(bytes);

  EXPECT_EQ(pg::chat::gguf_chat_template_names(*f), (std::vector<std::string>{"", "tool_use", "rag"}));
  EXPECT_EQ(pg::chat::gguf_chat_template(*f).value(), "DEFAULT {{ bos_token }}{{ messages[0].content }}");
  EXPECT_EQ(pg::chat::gguf_chat_template(*f, "rag").value(), "RAG");
  EXPECT_FALSE(pg::chat::gguf_chat_template(*f, "nope").has_value());
  EXPECT_EQ(pg::chat::select_gguf_chat_template(*f, "", false), "DEFAULT {{ bos_token }}{{ messages[0].content }}");
  EXPECT_EQ(pg::chat::select_gguf_chat_template(*f, "", true), "TOOLS {{ tools|length }}{{ eos_token }}");
  EXPECT_EQ(pg::chat::select_gguf_chat_template(*f, "rag", true), "RAG");
  EXPECT_THROW(pg::chat::select_gguf_chat_template(*f, "nope", false), pg::Error);
  EXPECT_EQ(pg::chat::gguf_token_text(*f, "tokenizer.ggml.bos_token_id"), "<|begin|>");

  json msgs = json::parse(R"([{"role": "user", "content": "hello"}])");
  auto def = pg::chat::chat_template_from_gguf(*f);
  EXPECT_EQ(def.render(msgs, json(), true), "DEFAULT <|begin|>hello");
  auto tools = pg::chat::chat_template_from_gguf(*f, "", true);
  EXPECT_EQ(tools.render(msgs, json::parse(R"([{"type": "function"}])"), true), "TOOLS 1<|end|>");
}

TEST(ChatTemplateGguf, NoTemplateIsAnError) {
  GgufBuilder b;
  b.str("general.architecture", "llama");
  auto bytes = b.bytes();
  auto f = pg::gguf::File::from_memory(bytes);
  EXPECT_TRUE(pg::chat::gguf_chat_template_names(*f).empty());
  EXPECT_THROW(pg::chat::select_gguf_chat_template(*f, "", false), pg::Error);
  EXPECT_EQ(pg::chat::gguf_token_text(*f, "tokenizer.ggml.bos_token_id"), "");
}

TEST(ChatTemplateGguf, RealVocabFile) {
  auto f = pg::gguf::File::open(pg::test::shared_path("testdata/tokenizer/ggml-vocab-qwen3.gguf").string());
  auto t = pg::chat::chat_template_from_gguf(*f);
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  json msgs = json::parse(R"([{"role": "user", "content": "Hi"}])");
  std::string out = t.render(msgs, json(), true, {{"enable_thinking", false}});
  EXPECT_EQ(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

// --- CLI ----------------------------------------------------------------------------------------

void write(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

TEST(ChatTemplateCli, RendersExactly) {
  pg::test::TempDir tmp;
  auto tpl = tmp.path() / "t.jinja", conv = tmp.path() / "c.json";
  write(tpl, std::string(kProbe) + "|{{ strftime_now('%Y-%m-%d') }}\n");
  write(conv, R"({"messages": [{"role": "user", "content": "héllo"}], "tools": [{"type": "function"}]})");
  auto exe = pg::test::peregrine_exe().string();
  auto r = pg::test::run_command(
      {exe, "chat-template", "--template", tpl.string(), "--messages", conv.string(), "--now", "2025-01-31T08:00:00"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The template's final newline is dropped (keep_trailing_newline=False) and none is added.
  EXPECT_EQ(r.out, "<s>|False|True|True|user=héllo;|unset|</s>|2025-01-31");

  r = pg::test::run_command({exe, "chat-template", "--template", tpl.string(), "--messages", conv.string(),
                             "--no-generation-prompt", "--vars", R"({"enable_thinking": false, "bos_token": "B"})", "--now",
                             "2025-01-31"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "B|False|True|False|user=héllo;|False|</s>|2025-01-31");
}

TEST(ChatTemplateCli, ErrorsExitNonZero) {
  pg::test::TempDir tmp;
  auto tpl = tmp.path() / "t.jinja", conv = tmp.path() / "c.json";
  write(tpl, "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}");
  write(conv, R"({"messages": []})");
  auto exe = pg::test::peregrine_exe().string();
  auto r = pg::test::run_command({exe, "chat-template", "--template", tpl.string(), "--messages", conv.string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("Conversation roles must alternate user/assistant/user/assistant/..."), std::string::npos) << r.err;

  write(tpl, "{% for %}");
  r = pg::test::run_command({exe, "chat-template", "--template", tpl.string(), "--messages", conv.string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("TemplateSyntaxError"), std::string::npos) << r.err;

  r = pg::test::run_command({exe, "chat-template", "--template", (tmp.path() / "missing").string(), "--messages", conv.string()});
  EXPECT_NE(r.exit_code, 0);
  write(conv, "{not json");
  r = pg::test::run_command({exe, "chat-template", "--template", tpl.string(), "--messages", conv.string()});
  EXPECT_NE(r.exit_code, 0);
  r = pg::test::run_command({exe, "chat-template", "--messages", conv.string()});
  EXPECT_NE(r.exit_code, 0);
  r = pg::test::run_command({exe, "chat-template", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--no-generation-prompt"), std::string::npos);
}

}  // namespace
