// llama.cpp's tokenizer test vectors (shared/testdata/tokenizer/*.inp/*.out): ids of
// encode(text, add_special=false, parse_special=false) must match every line exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "testutil.h"
#include "tok_testutil.h"
#include "tokenizer/impl.h"

namespace pg::test {
namespace {

struct VectorCase {
  const char* vectors;  // ggml-vocab-<vectors>.gguf.inp/.out
  const char* vocab;    // ggml-vocab-<vocab>.gguf that reproduces them
  const char* pre;      // pre-tokenizer override ("" = the file's)
};

// Every vector set in shared/testdata/tokenizer whose vocabulary is available. The generated
// qwen3 and llama3 vocabularies stand in for the unobtainable qwen2 and llama-bpe ones
// (SOURCES.md). No Qwen3.5 vocabulary is available; its vectors (all ids < 151643) reproduce on the
// qwen3 vocabulary with the qwen35 pre-tokenizer, so they run there (they do not separate qwen35
// from qwen2 splitting, which Qwen35LetterRunsTakeCombiningMarks checks).
const VectorCase kCases[] = {
    {"bert-bge", "bert-bge", ""},
    {"deepseek-coder", "deepseek-coder", ""},
    {"deepseek-llm", "deepseek-llm", ""},
    {"falcon", "falcon", ""},
    {"gpt-2", "gpt-2", ""},
    {"llama-spm", "llama-spm", ""},
    {"mpt", "mpt", ""},
    {"phi-3", "phi-3", ""},
    {"refact", "refact", ""},
    {"starcoder", "starcoder", ""},
    {"qwen2", "qwen3", ""},
    {"llama-bpe", "llama3", ""},
    {"qwen35", "qwen3", "qwen35"},
};

// Vector sets with no vocabulary here at all (SOURCES.md: the files are over 4 MiB upstream).
const std::set<std::string> kNoVocab = {"command-r", "gemma-4"};

class Vectors : public ::testing::TestWithParam<VectorCase> {};

TEST_P(Vectors, AllLinesMatch) {
  const VectorCase& c = GetParam();
  const std::string base = std::string("testdata/tokenizer/ggml-vocab-") + c.vectors + ".gguf";
  const auto inputs = read_vector_inputs(shared_path(base + ".inp"));
  const auto expected = read_vector_outputs(shared_path(base + ".out"));
  ASSERT_EQ(inputs.size(), expected.size()) << base;
  ASSERT_GT(inputs.size(), 40u);
  const tok::Tokenizer& tok = cached_vocab(std::string("testdata/tokenizer/ggml-vocab-") + c.vocab + ".gguf", c.pre);
  size_t passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto got = tok.encode(inputs[i], /*add_special=*/false, /*parse_special=*/false);
    if (got == expected[i]) {
      ++passed;
    } else {
      ADD_FAILURE() << c.vectors << " line " << i + 1 << " text hex " << hex(inputs[i]) << "\n  expected " << ids_str(expected[i])
                    << "\n  got      " << ids_str(got);
    }
  }
  std::printf("[ vectors  ] %-15s with ggml-vocab-%s.gguf%s: %zu/%zu passed\n", c.vectors, c.vocab,
              *c.pre ? (std::string(" (pre ") + c.pre + ")").c_str() : "", passed, inputs.size());
  EXPECT_EQ(passed, inputs.size());
}

INSTANTIATE_TEST_SUITE_P(Tokenizer, Vectors, ::testing::ValuesIn(kCases), [](const auto& info) {
  std::string n = info.param.vectors;
  for (auto& ch : n) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return n;
});

// The qwen35 vector set tokenizes the same under Qwen2's pre-tokenizer, so it cannot show the one
// difference: Qwen3.5's letter runs take in combining marks ([\p{L}\p{M}]+). Check that directly.
TEST(Vectors, Qwen35LetterRunsTakeCombiningMarks) {
  const auto pieces = [](const std::string& pre, const std::string& text) {
    tok::PreTokenizer p(tok::pre_config(pre).regexes);
    std::vector<std::string> out;
    for (const auto& [a, b] : p.split(text)) out.push_back(text.substr(a, b - a));
    return out;
  };
  const std::string hindi = "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";  // नमस्ते
  const std::string text = hindi + " cafe\xCC\x81!";                                                     // "e" + U+0301
  EXPECT_EQ(pieces("qwen35", text), (std::vector<std::string>{hindi, " cafe\xCC\x81", "!"}));
  const auto q2 = pieces("qwen2", text);
  EXPECT_GT(q2.size(), 3u);  // marks split the words
  const tok::Tokenizer& q35 = cached_vocab("testdata/tokenizer/ggml-vocab-qwen3.gguf", "qwen35");
  EXPECT_EQ(q35.decode(q35.encode(text, false, false)), text);
}

// A vector set added to shared/ later must not go unnoticed: each is either tested above or listed
// as having no vocabulary; and every vocabulary .gguf present is either tested or has no vectors.
TEST(Vectors, EveryVectorFileIsCovered) {
  std::set<std::string> tested;
  for (const auto& c : kCases) tested.insert(c.vectors);
  const auto dir = shared_path("testdata/tokenizer");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    const std::string prefix = "ggml-vocab-", suffix = ".gguf.inp";
    if (name.rfind(prefix, 0) != 0 || name.size() <= prefix.size() + suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string v = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    EXPECT_TRUE(tested.count(v) || kNoVocab.count(v)) << "vector set " << v << " is not tested";
    if (kNoVocab.count(v)) {
      EXPECT_FALSE(std::filesystem::exists(dir / (prefix + v + ".gguf"))) << v << " now has a vocabulary: test it";
    }
  }
}

}  // namespace
}  // namespace pg::test
