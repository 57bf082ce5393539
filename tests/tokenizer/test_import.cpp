// Hugging Face tokenizer files -> tokenizer.ggml.* metadata (the library side of
// `gguf import-tokenizer`; test_import_cli.cpp runs the command on a full Llama 3 tokenizer).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "testutil.h"
#include "tok_testutil.h"
#include "tokenizer/hf_import.h"

namespace pg::test {
namespace {

using json = nlohmann::json;

TEST(Import, Llama3FromTextVocabularyMatchesReference) {
  TempDir d;
  auto ref = gguf::File::open(shared_path("testdata/tokenizer/ggml-vocab-llama3.gguf").string());
  make_llama3_fixture(d.path(), *ref);
  gguf::Writer w;
  w.set_string("general.architecture", "llama");
  const auto res =
      tok::import_hf_tokenizer(read_text(d.path() / "tokenizer.json"), read_text(d.path() / "tokenizer_config.json"), {}, w);
  EXPECT_EQ(res.pre, "llama-bpe");
  const auto bytes = w.write_to_memory();
  auto got = gguf::File::from_memory(bytes);
  const size_t passed = check_llama3_import(*got, *ref);
  std::printf("[ import   ] llama-bpe vectors with the imported llama3 vocabulary: %zu/46 passed\n", passed);
  EXPECT_EQ(passed, 46u);
}

TEST(Import, DetectsPreTokenizers) {
  EXPECT_EQ(tok::detect_pre_name({kLlama3Regex}, true), "llama-bpe");
  EXPECT_EQ(tok::detect_pre_name({kLlama3Regex}, false), "smaug-bpe");
  EXPECT_EQ(tok::detect_pre_name({kQwen2Regex}, false), "qwen2");
  EXPECT_EQ(tok::detect_pre_name({"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"}, false),
            "gpt-2");
  EXPECT_EQ(
      tok::detect_pre_name({"\\p{N}", "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"}, false),
      "starcoder");
  EXPECT_EQ(tok::detect_pre_name({"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}, false),
            "deepseek-coder");
  EXPECT_EQ(tok::detect_pre_name({"\\w+"}, false), "");
}

// A small byte-level BPE tokenizer.json built here: "ab" and "abc" by merges, one special token.
json tiny_bpe(const json& pre) {
  json vocab = json::object();
  int id = 0;
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = id++;
  vocab["\xC4\xA0"] = id++;  // Ġ (space)
  vocab["ab"] = id++;
  vocab["abc"] = id++;
  vocab
      ["\xC4\xA0"
       "a"] = id++;
  return json{
      {"added_tokens", json::array({json{{"id", id}, {"content", "<|end|>"}, {"special", true}, {"normalized", false}},
                                    json{{"id", id + 1}, {"content", "<tool>"}, {"special", false}, {"normalized", false}}})},
      {"pre_tokenizer", pre},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", json::array({json::array({"a", "b"}), json::array({"ab", "c"}), json::array({"\xC4\xA0", "a"})})}}}};
}

TEST(Import, SmallByteLevelBpe) {
  gguf::Writer w;
  w.set_string("general.architecture", "qwen2");
  const json tj = tiny_bpe(split_then_bytelevel(kQwen2Regex));
  const json cfg = {{"eos_token", {{"content", "<|end|>"}}}, {"add_bos_token", false}};
  const auto res = tok::import_hf_tokenizer(tj.dump(), cfg.dump(), {}, w);
  EXPECT_EQ(res.model, "gpt2");
  EXPECT_EQ(res.pre, "qwen2");
  EXPECT_EQ(res.n_merges, 3u);
  const auto bytes = w.write_to_memory();
  auto f = gguf::File::from_memory(bytes);
  auto t = tok::Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->n_vocab(), 32);
  const int32_t end = t->text_to_token("<|end|>"), tool = t->text_to_token("<tool>");
  EXPECT_EQ(t->eos(), end);
  EXPECT_TRUE(t->is_control(end));
  EXPECT_EQ(t->attr(tool) & tok::ATTR_USER_DEFINED, tok::ATTR_USER_DEFINED);
  EXPECT_FALSE(t->add_bos());
  EXPECT_EQ(t->encode("abc ab<tool>", false, false),
            (std::vector<int32_t>{t->text_to_token("abc"), t->text_to_token("\xC4\xA0"), t->text_to_token("ab"), tool}));
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.merges"), (std::vector<std::string>{"a b", "ab c", "\xC4\xA0 a"}));
}

TEST(Import, UnknownPreTokenizerAsksForPre) {
  gguf::Writer w;
  const json tj = tiny_bpe(split_then_bytelevel("\\w+|\\s+"));
  try {
    tok::import_hf_tokenizer(tj.dump(), "", {}, w);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--pre"), std::string::npos) << e.what();
  }
  tok::HfImportOptions opt;
  opt.pre = "gpt-2";
  EXPECT_EQ(tok::import_hf_tokenizer(tj.dump(), "", opt, w).pre, "gpt-2");
  opt.pre = "nonsense";
  EXPECT_THROW(tok::import_hf_tokenizer(tj.dump(), "", opt, w), Error);
}

TEST(Import, SentencePieceStyleBpe) {
  // <unk> <s> </s>, byte fallback tokens, pieces with U+2581 and merges; the Llama-2 layout.
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  int id = 3;
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    vocab[buf] = id++;
  }
  const std::string sp = "\xE2\x96\x81";
  for (const std::string& p : {sp, std::string("h"), std::string("i"), sp + "h", sp + "hi"}) vocab[p] = id++;
  const json tj = {{"added_tokens", json::array({json{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                                 json{{"id", 1}, {"content", "<s>"}, {"special", true}},
                                                 json{{"id", 2}, {"content", "</s>"}, {"special", true}}})},
                   {"normalizer",
                    {{"type", "Sequence"},
                     {"normalizers", json::array({json{{"type", "Prepend"}, {"prepend", sp}},
                                                  json{{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}})}}},
                   {"pre_tokenizer", nullptr},
                   {"model",
                    {{"type", "BPE"},
                     {"byte_fallback", true},
                     {"unk_token", "<unk>"},
                     {"vocab", vocab},
                     {"merges", json::array({sp + " h", sp + "h i"})}}}};
  const json cfg = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}, {"add_bos_token", true}};
  gguf::Writer w;
  const auto res = tok::import_hf_tokenizer(tj.dump(), cfg.dump(), {}, w);
  EXPECT_EQ(res.model, "llama");
  auto f = gguf::File::from_memory(w.write_to_memory());
  auto t = tok::Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->type(), tok::VocabType::SPM);
  EXPECT_EQ(t->bos(), 1);
  EXPECT_EQ(t->eos(), 2);
  EXPECT_EQ(t->unk(), 0);
  EXPECT_EQ(t->attr(0) & tok::ATTR_UNKNOWN, tok::ATTR_UNKNOWN);
  EXPECT_TRUE(t->is_byte(3 + 0x41));
  EXPECT_TRUE(t->add_space_prefix());
  // "hi" -> "▁hi"; "é" is not in the vocabulary -> two byte tokens.
  EXPECT_EQ(t->encode("hi\xC3\xA9", true, false), (std::vector<int32_t>{1, t->text_to_token(sp + "hi"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t->decode(t->encode("hi hi", false, false)), "hi hi");
}

TEST(Import, WordPiece) {
  json vocab = {{"[PAD]", 0}, {"[UNK]", 1}, {"[CLS]", 2}, {"[SEP]", 3}, {"hello", 4}, {"world", 5}, {"##s", 6}, {"!", 7}};
  const json tj = {{"added_tokens", json::array({json{{"id", 0}, {"content", "[PAD]"}, {"special", true}},
                                                 json{{"id", 1}, {"content", "[UNK]"}, {"special", true}},
                                                 json{{"id", 2}, {"content", "[CLS]"}, {"special", true}},
                                                 json{{"id", 3}, {"content", "[SEP]"}, {"special", true}}})},
                   {"normalizer", {{"type", "BertNormalizer"}, {"lowercase", true}}},
                   {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
                   {"model", {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"vocab", vocab}}}};
  const json cfg = {{"cls_token", "[CLS]"}, {"sep_token", "[SEP]"}, {"unk_token", "[UNK]"}, {"pad_token", "[PAD]"}};
  gguf::Writer w;
  EXPECT_EQ(tok::import_hf_tokenizer(tj.dump(), cfg.dump(), {}, w).model, "bert");
  auto f = gguf::File::from_memory(w.write_to_memory());
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")[4], "\xE2\x96\x81hello");
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")[6], "s");
  auto t = tok::Tokenizer::from_gguf(*f);
  EXPECT_EQ(t->encode("Hello worlds! xyz", true, false), (std::vector<int32_t>{2, 4, 5, 6, 7, 1, 3}));
}

TEST(Import, BadInputIsAnError) {
  gguf::Writer w;
  EXPECT_THROW(tok::import_hf_tokenizer("{not json", "", {}, w), Error);
  EXPECT_THROW(tok::import_hf_tokenizer("{}", "", {}, w), Error);
  EXPECT_THROW(tok::import_hf_tokenizer(R"({"model": {"type": "Unigram", "vocab": []}})", "", {}, w), Error);
  EXPECT_THROW(tok::import_hf_tokenizer(R"({"model": {"type": "BPE", "vocab": {"a": "x"}}})", "", {}, w), Error);
  EXPECT_THROW(tok::import_hf_tokenizer(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [7]}})", "", {}, w), Error);
}

}  // namespace
}  // namespace pg::test
