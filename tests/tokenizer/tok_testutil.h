// Helpers shared by the tokenizer tests.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace pg::test {

// A loaded vocabulary: the File must outlive the Tokenizer only during loading, but keeping both
// is simplest.
struct LoadedVocab {
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<tok::Tokenizer> tok;
};
LoadedVocab load_vocab(const std::filesystem::path& path, const tok::LoadOptions& opt = {});
// Cached per (path, pre_override) for the whole test binary: big vocabularies load once.
const tok::Tokenizer& cached_vocab(const std::string& shared_rel, const std::string& pre_override = "");

// llama.cpp's test-vector files: inputs separated by "\n__ggml_vocab_test__\n"; one line of
// " id id id" per input.
std::vector<std::string> read_vector_inputs(const std::filesystem::path& p);
std::vector<std::vector<int32_t>> read_vector_outputs(const std::filesystem::path& p);

std::string ids_str(const std::vector<int32_t>& ids);

// tokenizer.json regexes (original Hugging Face spelling).
extern const char* const kLlama3Regex;
extern const char* const kQwen2Regex;
// A pre_tokenizer: Split(regex, Isolated) then ByteLevel without its own regex (Llama 3, Qwen2).
nlohmann::json split_then_bytelevel(const std::string& regex);
// Writes dir/tokenizer.json and dir/tokenizer_config.json for Llama 3, built from the text
// vocabulary in shared/testdata/tokenizer/llama3.2-bpe-text (encoder.json + vocab.bpe: the regular
// tokens and merges of ggml-vocab-llama3.gguf); the 256 special token names and the chat template
// come from ref (ggml-vocab-llama3.gguf), since the text files do not have them.
void make_llama3_fixture(const std::filesystem::path& dir, const gguf::File& ref);
// Checks an imported Llama 3 vocabulary against the reference GGUF (tokens, types, merges, special
// ids, add_bos, chat template) and on the llama-bpe test vectors; returns the vectors passed.
size_t check_llama3_import(const gguf::File& got, const gguf::File& ref);
std::string hex(const std::string& s);

}  // namespace pg::test
