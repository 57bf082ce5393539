// shared/golden/tokenizer/*.tokenize.json: llama.cpp's llama_tokenize(text, add_special=true,
// parse_special=false) ids and llama_token_to_piece(id, special=true) bytes for nine strings on six
// vocabularies (synthetic SPM and BPE vocabularies of the tiny models, real SPM ones).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "testutil.h"
#include "tok_testutil.h"

namespace pg::test {
namespace {

std::string model_path(const std::string& model) {
  // The tiny random models live in golden/models, the real ones in testdata/models.
  if (std::filesystem::exists(shared_dir() / "golden/models" / model)) return "golden/models/" + model;
  return "testdata/models/" + model;
}

std::vector<std::string> golden_files() {
  std::vector<std::string> v;
  for (const auto& e : std::filesystem::directory_iterator(shared_path("golden/tokenizer"))) {
    const std::string n = e.path().filename().string();
    if (n.size() > 14 && n.compare(n.size() - 14, 14, ".tokenize.json") == 0) v.push_back(n);
  }
  std::sort(v.begin(), v.end());
  return v;
}

TEST(GoldenTokenize, AllFilesAllCases) {
  const auto files = golden_files();
  ASSERT_EQ(files.size(), 6u) << "expected the six golden tokenizer files";
  for (const auto& name : files) {
    const auto j = nlohmann::json::parse(read_text(shared_path("golden/tokenizer/" + name)));
    const std::string model = j.at("model").get<std::string>();
    const bool add_special = j.at("add_special").get<bool>();
    const bool parse_special = j.at("parse_special").get<bool>();
    const tok::Tokenizer& tok = cached_vocab(model_path(model));
    size_t passed = 0, total = 0;
    for (const auto& c : j.at("cases")) {
      ++total;
      const std::string text = c.at("text").get<std::string>();
      const auto want = c.at("ids").get<std::vector<int32_t>>();
      const auto got = tok.encode(text, add_special, parse_special);
      bool ok = got == want;
      EXPECT_EQ(ids_str(got), ids_str(want)) << model << " text '" << text << "'";
      const auto hexes = c.at("pieces_hex").get<std::vector<std::string>>();
      EXPECT_EQ(hexes.size(), want.size());
      for (size_t k = 0; k < want.size() && k < hexes.size(); ++k) {
        const std::string piece = tok.token_to_piece(want[k], /*special=*/true);
        if (hex(piece) != hexes[k]) {
          ok = false;
          ADD_FAILURE() << model << " piece of id " << want[k] << ": got " << hex(piece) << " want " << hexes[k];
        }
      }
      passed += ok;
    }
    std::printf("[ golden   ] %-32s %zu/%zu cases (ids and pieces)\n", name.c_str(), passed, total);
    EXPECT_EQ(passed, total) << name;
  }
}

}  // namespace
}  // namespace pg::test
