// `peregrine tokenize` and `peregrine detokenize` end to end.
#include <gtest/gtest.h>

#include <fstream>

#include "testutil.h"

namespace pg::test {
namespace {

std::string exe() { return peregrine_exe().string(); }
std::string stories() { return shared_path("testdata/models/stories260K.gguf").string(); }

TEST(Cli, TokenizeIdsStories) {
  const auto r = run_command({exe(), "tokenize", "-m", stories(), "-p", "Once upon a time", "--ids"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "1 403 407 261 378\n");
  const auto nb = run_command({exe(), "tokenize", "-m", stories(), "-p", "Once upon a time", "--ids", "--no-bos"});
  EXPECT_EQ(nb.out, "403 407 261 378\n");
}

TEST(Cli, TokenizePiecesStories) {
  const auto r = run_command({exe(), "tokenize", "-m", stories(), "-p", "Once upon a time"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "     1 -> '<s>'\n   403 -> ' Once'\n   407 -> ' upon'\n   261 -> ' a'\n   378 -> ' time'\n");
}

TEST(Cli, TokenizeFromFileAndStdin) {
  TempDir d;
  const auto path = d.path() / "prompt.txt";
  std::ofstream(path) << "Once upon a time";
  const auto f = run_command({exe(), "tokenize", "-m", stories(), "-f", path.string(), "--ids"});
  EXPECT_EQ(f.out, "1 403 407 261 378\n") << f.err;
  const auto s = run_command({exe(), "tokenize", "-m", stories(), "-f", "-", "--ids"}, "Once upon a time");
  EXPECT_EQ(s.out, "1 403 407 261 378\n") << s.err;
}

TEST(Cli, DetokenizeStories) {
  const auto r = run_command({exe(), "detokenize", "-m", stories(), "--ids", "1,403,407,261,378"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, " Once upon a time");
  const auto nb = run_command({exe(), "detokenize", "-m", stories(), "--ids", "403,407,261,378"});
  EXPECT_EQ(nb.out, "Once upon a time");
  const auto sp = run_command({exe(), "detokenize", "-m", stories(), "--ids", "1,403", "--special"});
  EXPECT_EQ(sp.out, "<s> Once");
}

TEST(Cli, ParseSpecialWithVocabOnlyFile) {
  const std::string qwen = shared_path("testdata/tokenizer/ggml-vocab-qwen3.gguf").string();
  const auto p = run_command({exe(), "tokenize", "-m", qwen, "-p", "<|im_start|>user hi", "--ids", "--parse-special"});
  EXPECT_EQ(p.out, "151644 872 15588\n") << p.err;
  const auto plain = run_command({exe(), "tokenize", "-m", qwen, "-p", "<|im_start|>user hi", "--ids"});
  EXPECT_NE(plain.out.substr(0, 7), "151644 ");
  const auto back = run_command({exe(), "detokenize", "-m", qwen, "--ids", "151644,872,15588", "--special"});
  EXPECT_EQ(back.out, "<|im_start|>user hi");
}

TEST(Cli, Errors) {
  const auto bad_id = run_command({exe(), "detokenize", "-m", stories(), "--ids", "1,99999"});
  EXPECT_EQ(bad_id.exit_code, 1);
  EXPECT_NE(bad_id.err.find("outside the vocabulary"), std::string::npos) << bad_id.err;
  const auto no_text = run_command({exe(), "tokenize", "-m", stories()});
  EXPECT_EQ(no_text.exit_code, 1);
  const auto missing = run_command({exe(), "tokenize", "-m", "/nonexistent.gguf", "-p", "x"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("error:"), std::string::npos);
  const auto pre = run_command(
      {exe(), "tokenize", "-m", shared_path("testdata/tokenizer/ggml-vocab-gpt-2.gguf").string(), "-p", "x", "--pre", "bogus"});
  EXPECT_EQ(pre.exit_code, 1);
  EXPECT_NE(pre.err.find("'bogus'"), std::string::npos) << pre.err;
}

}  // namespace
}  // namespace pg::test
