// The CLI forms external checks rely on: run, logits, perplexity, bench, help and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "testutil.h"

namespace pg {
namespace {

using test::run_command;

std::string exe() { return test::peregrine_exe().string(); }
std::string stories() { return test::shared_path("testdata/models/stories260K.gguf").string(); }

TEST(Cli, RunStoriesGreedyMatchesLlamaCpp) {
  const auto meta = nlohmann::json::parse(test::read_text(test::shared_path("golden/stories260K/stories260K.json")));
  const std::string expected = meta["greedy_text"];
  auto r = run_command({exe(), "run", "-m", stories(), "-p", "Once upon a time", "-n", "32", "--temp", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, expected);
}

TEST(Cli, RunIsDeterministicForASeed) {
  auto a = run_command({exe(), "run", "-m", stories(), "-p", "Lily", "-n", "24", "--temp", "0.9", "--seed", "7"});
  auto b = run_command({exe(), "run", "-m", stories(), "-p", "Lily", "-n", "24", "--temp", "0.9", "--seed", "7"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
}

TEST(Cli, LogitsMatchGolden) {
  test::TempDir tmp;
  const auto out = (tmp.path() / "l.f32").string();
  auto r = run_command({exe(), "logits", "-m", stories(), "--tokens", "1,403,407,261,378", "--out", out});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = test::read_f32(out);
  const auto ref = test::read_f32(test::shared_path("golden/stories260K/stories260K.prompt_logits.f32"));
  ASSERT_EQ(got.size(), ref.size());
  double mx = 0;
  for (size_t i = 0; i < got.size(); ++i) mx = std::max(mx, static_cast<double>(std::fabs(got[i] - ref[i])));
  EXPECT_LE(mx, 1e-3);
}

TEST(Cli, LogitsRejectsBadTokens) {
  test::TempDir tmp;
  const auto out = (tmp.path() / "l.f32").string();
  for (const char* bad : {"1,999999", "1,,2", "a,b", "-3"}) {
    auto r = run_command({exe(), "logits", "-m", stories(), "--tokens", bad, "--out", out});
    EXPECT_EQ(r.exit_code, 1) << bad;
    EXPECT_NE(r.err.find("error:"), std::string::npos) << bad;
  }
}

// perplexity = exp(mean NLL of the second half of each window), recomputed here from `logits`.
TEST(Cli, PerplexityFollowsLlamaPerplexityWindows) {
  test::TempDir tmp;
  const auto text_path = (tmp.path() / "t.txt").string();
  const std::string text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big "
      "tree with a red ball. She wanted the ball, so she asked her mom for help. Her mom smiled and said yes.";
  std::ofstream(text_path) << text;
  const int ctx = 16;
  auto r = run_command({exe(), "perplexity", "-m", stories(), "-f", text_path, "-c", std::to_string(ctx)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto last = r.out.substr(r.out.rfind("PPL = "));
  const double ppl = std::stod(last.substr(6));

  auto tk = run_command({exe(), "tokenize", "-m", stories(), "-p", text, "--ids"});
  ASSERT_EQ(tk.exit_code, 0) << tk.err;
  std::vector<int> ids;
  std::istringstream is(tk.out);
  for (int v; is >> v;) ids.push_back(v);
  ASSERT_GE(ids.size(), 2u * ctx);
  double nll = 0;
  int count = 0;
  for (size_t c = 0; c + ctx <= ids.size(); c += ctx) {
    std::string list = "1";  // first token of each window is BOS
    for (int j = 1; j < ctx; ++j) list.append(",").append(std::to_string(ids[c + static_cast<size_t>(j)]));
    const auto out = (tmp.path() / "w.f32").string();
    auto lr = run_command({exe(), "logits", "-m", stories(), "--tokens", list, "--out", out});
    ASSERT_EQ(lr.exit_code, 0) << lr.err;
    const auto lg = test::read_f32(out);
    const size_t nv = lg.size() / ctx;
    for (int j = ctx / 2; j < ctx - 1; ++j) {
      const float* row = lg.data() + static_cast<size_t>(j) * nv;
      double mx = row[0], s = 0;
      for (size_t v = 0; v < nv; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (size_t v = 0; v < nv; ++v) s += std::exp(row[v] - mx);
      nll += -(row[ids[c + static_cast<size_t>(j) + 1]] - mx - std::log(s));
      ++count;
    }
  }
  EXPECT_NEAR(ppl, std::exp(nll / count), 1e-3 * ppl);
}

TEST(Cli, BenchPrintsSpeedAndBytes) {
  auto r = run_command({exe(), "bench", "-m", stories(), "-p", "32", "-n", "8", "-r", "1", "--bandwidth", "10"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("| pp32 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| tg8 |"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bytes per generated token"), std::string::npos) << r.out;
}

TEST(Cli, HelpAndErrors) {
  for (const char* cmd : {"run", "logits", "perplexity", "bench", "tokenize", "detokenize", "chat-template", "serve"}) {
    auto r = run_command({exe(), cmd, "--help"});
    EXPECT_EQ(r.exit_code, 0) << cmd << ": " << r.err;
    EXPECT_NE(r.out.find("usage: peregrine"), std::string::npos) << cmd;
  }
  auto top = run_command({exe(), "--help"});
  EXPECT_EQ(top.exit_code, 0);
  auto unknown = run_command({exe(), "frobnicate"});
  EXPECT_EQ(unknown.exit_code, 2);
  auto badflag = run_command({exe(), "run", "-m", stories(), "--no-such-flag"});
  EXPECT_EQ(badflag.exit_code, 1);
  EXPECT_NE(badflag.err.find("unknown option"), std::string::npos);
  auto missing = run_command({exe(), "run", "-m", "/nonexistent.gguf", "-p", "x"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("/nonexistent.gguf"), std::string::npos);
  auto badnum = run_command({exe(), "run", "-m", stories(), "-p", "x", "-n", "lots"});
  EXPECT_EQ(badnum.exit_code, 1);
  auto nan = run_command({exe(), "run", "-m", stories(), "-p", "x", "--temp", "nan"});
  EXPECT_EQ(nan.exit_code, 1);
  auto notmodel = run_command({exe(), "run", "-m", test::shared_path("testdata/tokenizer/ggml-vocab-qwen3.gguf").string(), "-p", "x"});
  EXPECT_EQ(notmodel.exit_code, 1);
}

// Speculative decoding surface: the bundled target speculates with the bundled draft by default and
// prints exactly one `spec:` line on stderr after the text, whose text equals plain decoding's; the
// flags' bad values are one clear error before anything runs.
TEST(Cli, RunSpeculatesWithTheBundledDraftByDefault) {
  const std::string p = "<|im_start|>user\nWhat is 4821 + 377?<|im_end|>\n<|im_start|>assistant\n";
  auto plain = run_command({exe(), "run", "-p", p, "-n", "64", "--temp", "0", "--spec-type", "none"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.err.find("spec:"), std::string::npos);
  for (std::vector<std::string> extra : {std::vector<std::string>{}, {"--ddtree", "--ddtree-budget", "12", "--spec-draft-n-max", "6"},
                                         {"--spec-type", "ngram"}}) {
    std::vector<std::string> cmd = {exe(), "run", "-p", p, "-n", "64", "--temp", "0"};
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    auto r = run_command(cmd);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, plain.out);
    size_t n_lines = 0, at = 0;
    std::string line;
    for (size_t pos = r.err.find("spec: "); pos != std::string::npos; pos = r.err.find("spec: ", pos + 1)) {
      ++n_lines;
      at = pos;
    }
    ASSERT_EQ(n_lines, 1u) << r.err;
    line = r.err.substr(at, r.err.find('\n', at) - at);
    int drafted = -1, accepted = -1, steps = -1;
    double mean = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "spec: drafted %d accepted %d steps %d mean_accept_len %lf", &drafted, &accepted, &steps, &mean), 4)
        << line;
    EXPECT_GE(drafted, accepted);
    EXPECT_GE(accepted, 0);
    if (extra.empty()) {
      EXPECT_GT(accepted, 0) << line;
      EXPECT_NEAR(mean, static_cast<double>(accepted + steps) / steps, 0.01);
    }
  }
}

TEST(Cli, SpeculativeFlagsRejectBadValues) {
  const std::string other_vocab = test::shared_path("golden/models/tiny-qwen3-f16.gguf").string();
  const std::string not_model = std::string(PEREGRINE_SOURCE_DIR) + "/models/README.md";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--spec-type", "eagle9"}, "--spec-type"},
      {{"--ddtree-budget", "0"}, "--ddtree-budget"},
      {{"--ddtree-budget", "500"}, "--ddtree-budget"},
      {{"--spec-tree", "forest"}, "--spec-tree"},
      {{"--spec-draft-n-max", "-1"}, "--spec-draft-n-max"},
      {{"-md", other_vocab}, "vocabulary"},
      {{"--draft", not_model}, "draft model"},
      {{"--spec-type", "draft", "-m", stories()}, "needs a draft model"},
  };
  for (const auto& [flags, what] : cases) {
    for (const char* cmd : {"run", "bench"}) {
      std::vector<std::string> c = {exe(), cmd};
      if (std::string(cmd) == "run") c.insert(c.end(), {"-p", "hi", "-n", "4"});
      c.insert(c.end(), flags.begin(), flags.end());
      auto r = run_command(c);
      EXPECT_EQ(r.exit_code, 1) << cmd << " " << flags[0] << ": " << r.err;
      EXPECT_NE(r.err.find("error:"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(what), std::string::npos) << cmd << " " << flags[0] << ": " << r.err;
    }
  }
}

}  // namespace
}  // namespace pg
