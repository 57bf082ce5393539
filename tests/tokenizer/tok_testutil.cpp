#include "tok_testutil.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "testutil.h"

namespace pg::test {

LoadedVocab load_vocab(const std::filesystem::path& path, const tok::LoadOptions& opt) {
  LoadedVocab v;
  v.file = gguf::File::open(path.string());
  v.tok = tok::Tokenizer::from_gguf(*v.file, opt);
  return v;
}

const tok::Tokenizer& cached_vocab(const std::string& shared_rel, const std::string& pre_override) {
  static std::mutex mu;
  static std::map<std::string, LoadedVocab> cache;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = shared_rel + "|" + pre_override;
  auto it = cache.find(key);
  if (it == cache.end()) {
    tok::LoadOptions opt;
    opt.pre_override = pre_override;
    it = cache.emplace(key, load_vocab(shared_path(shared_rel), opt)).first;
  }
  return *it->second.tok;
}

std::vector<std::string> read_vector_inputs(const std::filesystem::path& p) {
  const std::string text = read_text(p);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  for (;;) {
    const size_t hit = text.find(sep, pos);
    if (hit == std::string::npos) break;
    out.push_back(text.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  if (pos != text.size()) throw std::runtime_error(p.string() + ": text after the last separator");
  return out;
}

std::vector<std::vector<int32_t>> read_vector_outputs(const std::filesystem::path& p) {
  const std::string text = read_text(p);
  std::vector<std::vector<int32_t>> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream ws(line);
    std::vector<int32_t> ids;
    long long x;
    while (ws >> x) ids.push_back(static_cast<int32_t>(x));
    out.push_back(std::move(ids));
  }
  return out;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return "[" + s + "]";
}

std::string hex(const std::string& s) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : s) {
    o += d[c >> 4];
    o += d[c & 15];
  }
  return o;
}

const char* const kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const char* const kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

using json = nlohmann::json;

json split_then_bytelevel(const std::string& regex) {
  return json{
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({json{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                    json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
}

static void write_file(const std::filesystem::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
  if (!f.good()) throw std::runtime_error("cannot write " + p.string());
}

void make_llama3_fixture(const std::filesystem::path& dir, const gguf::File& ref) {
  const json encoder = json::parse(read_text(shared_path("testdata/tokenizer/llama3.2-bpe-text/encoder.json")));
  std::vector<std::string> merges;
  {
    std::istringstream ls(read_text(shared_path("testdata/tokenizer/llama3.2-bpe-text/vocab.bpe")));
    std::string line;
    while (std::getline(ls, line)) {
      if (!line.empty()) merges.push_back(line);
    }
  }
  const auto ref_tokens = ref.get_string_array("tokenizer.ggml.tokens");
  json added = json::array();
  for (size_t id = encoder.size(); id < ref_tokens.size(); ++id) {
    added.push_back(json{{"id", id},
                         {"content", ref_tokens[id]},
                         {"single_word", false},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}});
  }
  const json tj = {{"version", "1.0"},
                   {"truncation", nullptr},
                   {"padding", nullptr},
                   {"added_tokens", added},
                   {"normalizer", nullptr},
                   {"pre_tokenizer", split_then_bytelevel(kLlama3Regex)},
                   {"post_processor",
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({json{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                             json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}},
                   {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
                   {"model",
                    {{"type", "BPE"},
                     {"dropout", nullptr},
                     {"unk_token", nullptr},
                     {"fuse_unk", false},
                     {"byte_fallback", false},
                     {"ignore_merges", true},
                     {"vocab", encoder},
                     {"merges", merges}}}};
  const json cfg = {{"bos_token", "<|begin_of_text|>"},
                    {"eos_token", "<|end_of_text|>"},
                    {"chat_template", ref.get_string("tokenizer.chat_template")}};
  write_file(dir / "tokenizer.json", tj.dump());
  write_file(dir / "tokenizer_config.json", cfg.dump(2));
}

size_t check_llama3_import(const gguf::File& got, const gguf::File& ref) {
  EXPECT_EQ(got.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(got.get_string("tokenizer.ggml.pre"), "llama-bpe");
  EXPECT_TRUE(got.get_string_array("tokenizer.ggml.tokens") == ref.get_string_array("tokenizer.ggml.tokens"));
  EXPECT_TRUE(got.get_int_array("tokenizer.ggml.token_type") == ref.get_int_array("tokenizer.ggml.token_type"));
  EXPECT_TRUE(got.get_string_array("tokenizer.ggml.merges") == ref.get_string_array("tokenizer.ggml.merges"));
  EXPECT_EQ(got.get_int("tokenizer.ggml.bos_token_id"), ref.get_int("tokenizer.ggml.bos_token_id"));
  EXPECT_EQ(got.get_int("tokenizer.ggml.eos_token_id"), ref.get_int("tokenizer.ggml.eos_token_id"));
  EXPECT_EQ(got.get_bool("tokenizer.ggml.add_bos_token"), ref.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(got.get_string("tokenizer.chat_template"), ref.get_string("tokenizer.chat_template"));

  auto tok = tok::Tokenizer::from_gguf(got);
  const tok::Tokenizer& ref_tok = cached_vocab("testdata/tokenizer/ggml-vocab-llama3.gguf");
  const auto inputs = read_vector_inputs(shared_path("testdata/tokenizer/ggml-vocab-llama-bpe.gguf.inp"));
  const auto expected = read_vector_outputs(shared_path("testdata/tokenizer/ggml-vocab-llama-bpe.gguf.out"));
  EXPECT_EQ(inputs.size(), expected.size());
  size_t passed = 0;
  for (size_t i = 0; i < inputs.size() && i < expected.size(); ++i) {
    const auto ids = tok->encode(inputs[i], false, false);
    EXPECT_EQ(ids_str(ids), ids_str(expected[i])) << "line " << i + 1;
    EXPECT_EQ(ids, ref_tok.encode(inputs[i], false, false));
    passed += ids == expected[i];
  }
  EXPECT_EQ(tok->encode("Hello", true, false).front(), 128000);
  EXPECT_TRUE(tok->is_eog(tok->text_to_token("<|eot_id|>")));
  return passed;
}

}  // namespace pg::test
