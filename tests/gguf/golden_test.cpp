// Every model and vocabulary file in shared/ loads, and what it holds matches what
// shared/golden/manifest.json (golden models) and shared/testdata/SOURCES.md (the others) record.
// Truncated copies of each golden model must fail cleanly.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/inspect.h"
#include "testutil.h"

namespace pg::gguf {
namespace {

using nlohmann::json;

json manifest() { return json::parse(test::read_text(test::shared_path("golden/manifest.json"))); }

void check_value(const std::string& key, const Value& v, const json& want) {
  SCOPED_TRACE(key);
  if (want.is_string()) {
    const std::string s = want.get<std::string>();
    if (s.rfind("[array of ", 0) == 0) {
      ASSERT_EQ(v.type, ValueType::ARRAY);
      EXPECT_EQ(std::to_string(v.as_array().items.size()), s.substr(10, s.size() - 11));
    } else {
      EXPECT_EQ(v.as_string(), s);
    }
  } else if (want.is_boolean()) {
    ASSERT_EQ(v.type, ValueType::BOOL);
    EXPECT_EQ(v.as_bool(), want.get<bool>());
  } else if (want.is_number_integer()) {
    ASSERT_TRUE(v.is_integer());
    EXPECT_EQ(v.as_int(), want.get<int64_t>());
  } else if (want.is_number_float()) {
    ASSERT_TRUE(v.is_float());
    EXPECT_EQ(v.as_float(), want.get<double>());
  } else if (want.is_array()) {
    ASSERT_EQ(v.type, ValueType::ARRAY);
    ASSERT_EQ(v.as_array().items.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) check_value(key + "[" + std::to_string(i) + "]", v.as_array().items[i], want[i]);
  } else {
    ADD_FAILURE() << "unexpected manifest value " << want.dump();
  }
}

TEST(GgufGolden, ModelsMatchTheManifest) {
  const json m = manifest();
  const auto root = test::shared_path("golden");
  std::set<std::string> listed;
  for (const auto& entry : m.at("models")) {
    const std::string rel = entry.at("file").get<std::string>();
    SCOPED_TRACE(rel);
    listed.insert(std::filesystem::path(rel).filename().string());
    const auto f = File::open((root / rel).string());
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->file_size(), entry.at("size_bytes").get<uint64_t>());
    EXPECT_EQ(f->architecture(), entry.at("arch").get<std::string>());
    EXPECT_EQ(f->get_int("general.file_type"), entry.at("general.file_type").get<int64_t>());

    const json& tensors = entry.at("tensors");
    ASSERT_EQ(f->tensors().size(), tensors.size());
    std::map<std::string, int> counts;
    for (const auto& t : f->tensors()) {
      ASSERT_TRUE(tensors.contains(t.name)) << t.name;
      const json& want = tensors.at(t.name);
      EXPECT_EQ(std::string(dtype_name(t.type)), want.at(0).get<std::string>()) << t.name;
      const auto shape = want.at(1).get<std::vector<int64_t>>();
      ASSERT_EQ(static_cast<size_t>(t.n_dims), shape.size()) << t.name;
      for (int d = 0; d < t.n_dims; ++d) EXPECT_EQ(t.ne[d], shape[d]) << t.name;
      counts[std::string(dtype_name(t.type))]++;
    }
    const json& type_counts = entry.at("tensor_type_counts");
    EXPECT_EQ(counts.size(), type_counts.size());
    for (const auto& [type, n] : type_counts.items()) EXPECT_EQ(counts[type], n.get<int>()) << type;

    for (const auto& [key, want] : entry.at("metadata").items()) {
      const Value* v = f->find(key);
      ASSERT_NE(v, nullptr) << key;
      check_value(key, *v, want);
    }
    // The totals are what inspect prints.
    EXPECT_EQ(tensor_totals(*f).tensors, tensors.size());
  }
  // Every model file on disk is in the manifest.
  for (const auto& e : std::filesystem::directory_iterator(root / "models"))
    if (e.path().extension() == ".gguf") {
      EXPECT_TRUE(listed.count(e.path().filename().string())) << e.path();
    }
  EXPECT_GE(listed.size(), 29u);
}

// shared/testdata/models and the vocabulary files are not in the manifest; their contents are
// recorded in shared/testdata/SOURCES.md, which these numbers come from.
struct Known {
  const char* rel;
  size_t n_kv, n_tensors;
  const char* tokenizer_model;
  size_t n_tokens, n_merges;  // n_merges 0: no merges key
};
const Known kKnown[] = {
    {"testdata/models/stories260K.gguf", 19, 48, "llama", 512, 0},
    {"testdata/models/llama-2-tiny-random.gguf", 18, 12, "llama", 32000, 0},
    {"testdata/tokenizer/ggml-vocab-baichuan.gguf", 18, 0, "llama", 64000, 0},
    {"testdata/tokenizer/ggml-vocab-bert-bge.gguf", 20, 0, "bert", 30522, 0},
    {"testdata/tokenizer/ggml-vocab-deepseek-coder.gguf", 25, 0, "gpt2", 32256, 31757},
    {"testdata/tokenizer/ggml-vocab-deepseek-llm.gguf", 23, 0, "gpt2", 102400, 99757},
    {"testdata/tokenizer/ggml-vocab-falcon.gguf", 18, 0, "gpt2", 65024, 64784},
    {"testdata/tokenizer/ggml-vocab-gpt-2.gguf", 16, 0, "gpt2", 50257, 50000},
    {"testdata/tokenizer/ggml-vocab-gpt-neox.gguf", 17, 0, "gpt2", 50432, 50009},
    {"testdata/tokenizer/ggml-vocab-llama-spm.gguf", 22, 0, "llama", 32000, 0},
    {"testdata/tokenizer/ggml-vocab-mpt.gguf", 17, 0, "gpt2", 50432, 50009},
    {"testdata/tokenizer/ggml-vocab-phi-3.gguf", 26, 0, "llama", 32064, 0},
    {"testdata/tokenizer/ggml-vocab-refact.gguf", 18, 0, "gpt2", 49216, 48891},
    {"testdata/tokenizer/ggml-vocab-starcoder.gguf", 19, 0, "gpt2", 49152, 48872},
    {"testdata/tokenizer/ggml-vocab-qwen3.gguf", 12, 0, "gpt2", 151936, 151387},
    {"testdata/tokenizer/ggml-vocab-llama3.gguf", 12, 0, "gpt2", 128256, 280147},
};

TEST(GgufGolden, TestdataFilesMatchSources) {
  std::set<std::string> known;
  for (const auto& k : kKnown) {
    SCOPED_TRACE(k.rel);
    known.insert(std::filesystem::path(k.rel).filename().string());
    const auto f = File::open(test::shared_path(k.rel).string());
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->metadata().size(), k.n_kv);
    EXPECT_EQ(f->tensors().size(), k.n_tensors);
    EXPECT_EQ(f->get_string("tokenizer.ggml.model"), k.tokenizer_model);
    EXPECT_EQ(f->get("tokenizer.ggml.tokens").as_array().items.size(), k.n_tokens);
    if (k.n_merges) {
      EXPECT_EQ(f->get("tokenizer.ggml.merges").as_array().items.size(), k.n_merges);
    } else {
      EXPECT_FALSE(f->has("tokenizer.ggml.merges"));
    }
    if (f->has("tokenizer.ggml.scores")) {
      EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores").size(), k.n_tokens);
    }
    EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type").size(), k.n_tokens);
  }
  const auto stories = File::open(test::shared_path("testdata/models/stories260K.gguf").string());
  for (const auto& t : stories->tensors()) EXPECT_EQ(t.type, DType::F32) << t.name;
  const auto tiny = File::open(test::shared_path("testdata/models/llama-2-tiny-random.gguf").string());
  auto totals = tensor_totals(*tiny);
  EXPECT_EQ(totals.by_type[DType::F16].tensors, 9u);
  EXPECT_EQ(totals.by_type[DType::F32].tensors, 3u);
  // Every vocabulary file on disk is covered.
  for (const auto& e : std::filesystem::directory_iterator(test::shared_path("testdata/tokenizer")))
    if (e.path().extension() == ".gguf") {
      EXPECT_TRUE(known.count(e.path().filename().string())) << e.path();
    }
}

// Truncating a real model anywhere must give one clean error: every byte of the header region of two
// models (kv arrays, tensor infos), and 256 spread offsets plus the last bytes for all of them.
TEST(GgufGolden, TruncatedModelsFailCleanly) {
  const json m = manifest();
  const auto root = test::shared_path("golden");
  size_t checked = 0;
  for (const auto& entry : m.at("models")) {
    const std::string rel = entry.at("file").get<std::string>();
    SCOPED_TRACE(rel);
    const auto bytes = test::read_bytes(root / rel);
    const auto full = File::from_memory(bytes);
    uint64_t end_of_data = 0;
    for (const auto& t : full->tensors()) end_of_data = std::max(end_of_data, full->data_offset() + t.offset + t.nbytes);
    std::vector<size_t> cuts;
    const bool every = rel.find("tiny-llama-Q4_K_M") != std::string::npos || rel.find("tiny-qwen3moe-f16") != std::string::npos;
    if (every)
      for (size_t n = 0; n <= full->data_offset(); ++n) cuts.push_back(n);
    for (size_t i = 0; i < 256; ++i) cuts.push_back(bytes.size() * i / 256);
    for (size_t back = 1; back <= 64; ++back) cuts.push_back(end_of_data - back);
    for (size_t n : cuts) {
      try {
        File::from_memory(std::span<const uint8_t>(bytes.data(), n), "cut");
        ADD_FAILURE() << "prefix of " << n << " bytes loaded";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_EQ(msg.rfind("cut: invalid GGUF: ", 0), 0u) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 20000u);
}

}  // namespace
}  // namespace pg::gguf
