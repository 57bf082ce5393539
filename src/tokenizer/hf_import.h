// Hugging Face tokenizer files -> the tokenizer.ggml.* metadata llama.cpp's convert_hf_to_gguf.py
// writes, so a vocab-only GGUF can be made without Python.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace pg::gguf {
class Writer;
}

namespace pg::tok {

struct HfImportOptions {
  std::string pre;                           // tokenizer.ggml.pre; empty: detect from the pre-tokenizer regexes
  int64_t vocab_size = 0;                    // pad the vocabulary with [PAD<id>] up to this size (config.json's vocab_size)
  std::optional<std::string> chat_template;  // used when tokenizer_config.json has none (chat_template.jinja)
};

struct HfImportResult {
  std::string model;  // "gpt2", "llama" or "bert"
  std::string pre;
  size_t n_tokens = 0;
  size_t n_merges = 0;
  std::vector<std::string> notes;  // what was inferred, for the user
};

// tokenizer_json: the text of tokenizer.json; tokenizer_config_json: tokenizer_config.json's text or
// empty. Sets tokenizer.* keys on w (nothing else). Throws pg::Error for malformed or unsupported
// input (a Unigram model, an unrecognisable pre-tokenizer without options.pre, ...).
HfImportResult import_hf_tokenizer(const std::string& tokenizer_json, const std::string& tokenizer_config_json,
                                   const HfImportOptions& options, gguf::Writer& w);

// The tokenizer.ggml.pre name whose regexes equal these pre-tokenizer regexes (in order), or "".
std::string detect_pre_name(const std::vector<std::string>& regexes, bool ignore_merges);

}  // namespace pg::tok
