// `peregrine gguf import-tokenizer` on a full Llama 3 tokenizer.json (rebuilt from the text
// vocabulary in shared/testdata/tokenizer/llama3.2-bpe-text): the written GGUF must equal
// ggml-vocab-llama3.gguf in tokens, types, merges and special ids and reproduce the llama-bpe vectors.
#include <gtest/gtest.h>

#include <fstream>

#include "testutil.h"
#include "tok_testutil.h"

namespace pg::test {
namespace {

TEST(ImportCli, Llama3FromTextVocabulary) {
  TempDir d;
  auto ref = gguf::File::open(shared_path("testdata/tokenizer/ggml-vocab-llama3.gguf").string());
  make_llama3_fixture(d.path(), *ref);
  const auto out = d.path() / "vocab.gguf";
  const auto r = run_command({peregrine_exe().string(), "gguf", "import-tokenizer", (d.path() / "tokenizer.json").string(),
                              (d.path() / "tokenizer_config.json").string(), "-o", out.string()},
                             "", 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("pre-tokenizer detected as 'llama-bpe'"), std::string::npos) << r.err;
  auto got = gguf::File::open(out.string());
  EXPECT_EQ(check_llama3_import(*got, *ref), 46u);
  // The written file works with the tokenize command too.
  const auto t = run_command({peregrine_exe().string(), "tokenize", "-m", out.string(), "-p", "Hello world", "--ids"});
  EXPECT_EQ(t.out, "128000 9906 1917\n") << t.err;
}

TEST(ImportCli, Errors) {
  TempDir d;
  const auto bad = d.path() / "tokenizer.json";
  { std::ofstream(bad) << "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}"; }
  const auto r =
      run_command({peregrine_exe().string(), "gguf", "import-tokenizer", bad.string(), "-o", (d.path() / "x.gguf").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("Unigram"), std::string::npos) << r.err;
  const auto no_out = run_command({peregrine_exe().string(), "gguf", "import-tokenizer", bad.string()});
  EXPECT_EQ(no_out.exit_code, 1);
  const auto missing =
      run_command({peregrine_exe().string(), "gguf", "import-tokenizer", "/nonexistent.json", "-o", "/tmp/x.gguf"});
  EXPECT_EQ(missing.exit_code, 1);
}

}  // namespace
}  // namespace pg::test
