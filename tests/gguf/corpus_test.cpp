// The hostile corpus: tests/gguf/corpus/*.gguf (written by make_corpus.py, listed with the expected
// error in corpus/expected.tsv). Each must fail to load with one pg::Error line, and the CLI must turn
// each into exit code 1, exactly one "error:" line on stderr and nothing on stdout, quickly.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/error.h"
#include "gguf/gguf.h"
#include "testutil.h"

namespace pg::gguf {
namespace {

const std::filesystem::path kDir = std::filesystem::path(PG_GGUF_TEST_DIR) / "corpus";

std::map<std::string, std::string> expectations() {
  std::map<std::string, std::string> out;
  std::ifstream f(kDir / "expected.tsv");
  EXPECT_TRUE(f) << "missing " << kDir / "expected.tsv";
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto tab = line.find('\t');
    EXPECT_NE(tab, std::string::npos) << line;
    if (tab != std::string::npos) out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

std::vector<std::filesystem::path> corpus_files() {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(kDir))
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

TEST(GgufCorpus, IsCompleteAndSmall) {
  const auto exp = expectations();
  const auto files = corpus_files();
  EXPECT_GE(files.size(), 60u);
  EXPECT_EQ(files.size(), exp.size());
  uintmax_t total = 0;
  for (const auto& p : files) {
    EXPECT_TRUE(exp.count(p.filename().string())) << p << " has no line in expected.tsv";
    total += std::filesystem::file_size(p);
  }
  EXPECT_LT(total, 200u * 1024);
}

// The committed files are exactly what make_corpus.py writes, so the script stays their documentation.
TEST(GgufCorpus, MatchesItsGenerator) {
  test::TempDir dir;
  const auto out = dir.path() / "corpus";
  const auto r = test::run_command(
      {"/usr/bin/python3", (std::filesystem::path(PG_GGUF_TEST_DIR) / "make_corpus.py").string(), out.string()}, "", 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t n = 0;
  for (const auto& e : std::filesystem::directory_iterator(out)) {
    const auto committed = kDir / e.path().filename();
    ASSERT_TRUE(std::filesystem::exists(committed)) << committed << " is not committed";
    EXPECT_EQ(test::read_bytes(e.path()), test::read_bytes(committed)) << e.path().filename();
    ++n;
  }
  EXPECT_EQ(n, corpus_files().size() + 1);  // + expected.tsv
  EXPECT_EQ(test::read_bytes(dir.path() / "valid_base.gguf"),
            test::read_bytes(std::filesystem::path(PG_GGUF_TEST_DIR) / "valid_base.gguf"));
}

TEST(GgufCorpus, ValidBaseLoads) {
  // The files are mutations of this one, so it must load: otherwise they would prove nothing.
  const auto f = File::open((std::filesystem::path(PG_GGUF_TEST_DIR) / "valid_base.gguf").string());
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->find_tensor("b.weight")->type, DType::Q8_0);
}

TEST(GgufCorpus, EveryFileFailsWithOneClearError) {
  const auto exp = expectations();
  for (const auto& p : corpus_files()) {
    SCOPED_TRACE(p.filename().string());
    const auto t0 = std::chrono::steady_clock::now();
    try {
      File::open(p.string());
      ADD_FAILURE() << "loaded without error";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_EQ(msg.rfind(p.string(), 0), 0u) << "message does not start with the path: " << msg;
      const auto it = exp.find(p.filename().string());
      if (it != exp.end()) {
        EXPECT_NE(msg.find(it->second), std::string::npos) << "expected '" << it->second << "' in: " << msg;
      }
    }
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  }
}

TEST(GgufCorpus, FromMemoryAgrees) {
  for (const auto& p : corpus_files()) {
    const auto bytes = test::read_bytes(p);
    EXPECT_THROW(File::from_memory(bytes), Error) << p;
  }
}

TEST(GgufCorpusCli, InspectPrintsOneErrorLineForEveryFile) {
  const auto exe = test::peregrine_exe().string();
  for (const auto& p : corpus_files()) {
    SCOPED_TRACE(p.filename().string());
    const auto r = test::run_command({exe, "gguf", "inspect", p.string()}, "", 10);
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(r.out, "");
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_EQ(r.err.back(), '\n');
  }
}

TEST(GgufCorpusCli, InspectMissingFileAndDirectory) {
  const auto exe = test::peregrine_exe().string();
  for (const std::string& path : {std::string("/nonexistent/x.gguf"), kDir.string()}) {
    const auto r = test::run_command({exe, "gguf", "inspect", path}, "", 10);
    EXPECT_EQ(r.exit_code, 1) << path;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  }
}

TEST(GgufCorpusCli, InspectAValidModel) {
  const auto exe = test::peregrine_exe().string();
  const auto model = test::shared_path("golden/models/tiny-qwen3-Q4_K_M.gguf").string();
  const auto r = test::run_command({exe, "gguf", "inspect", model}, "", 30);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* want :
       {"version:     3", "alignment:   32", "general.architecture", "\"qwen3\"", "arr[str,512]", "... (512 items)]",
        "blk.1.ffn_down.weight", "Q6_K", "{512, 256}", "tensors:    24", "parameters: 1,312,256"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  const auto no_t = test::run_command({exe, "gguf", "inspect", "--no-tensors", model}, "", 30);
  EXPECT_EQ(no_t.exit_code, 0);
  EXPECT_EQ(no_t.out.find("blk.1.ffn_down.weight"), std::string::npos);
  const auto help = test::run_command({exe, "gguf", "inspect", "--help"}, "", 30);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("usage: peregrine gguf inspect FILE"), std::string::npos) << help.out;
  const auto bad = test::run_command({exe, "gguf", "inspect", "--bogus", model}, "", 30);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(bad.out, "");
}

}  // namespace
}  // namespace pg::gguf
