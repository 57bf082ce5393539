// peregrine gguf import-tokenizer: Hugging Face tokenizer files -> a vocab-only GGUF carrying the
// tokenizer.ggml.* metadata llama.cpp's converter writes.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "tokenizer/hf_import.h"
#include "tokenizer/tokenizer.h"

namespace pg::cli {

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  PG_CHECK(f.good(), "cannot read '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  PG_CHECK(!f.bad(), "error reading '" + path + "'");
  return ss.str();
}
}  // namespace

int cmd_gguf_import_tokenizer(int argc, char** argv) {
  std::string tokenizer_json, config_json, out, pre, name = "imported tokenizer", arch = "llama";
  int64_t vocab_size = 0;
  Args args("gguf import-tokenizer",
            "Convert Hugging Face tokenizer files (tokenizer.json, tokenizer_config.json) into a vocab-only GGUF with the\n"
            "tokenizer.ggml.* metadata llama.cpp writes. Byte-level BPE, SentencePiece-style BPE and WordPiece are supported.");
  args.positional("tokenizer.json", &tokenizer_json, "the tokenizer.json file")
      .positional("tokenizer_config.json", &config_json, "special tokens, add_bos/add_eos, chat template (optional)", false)
      .opt("-o,--output", &out, "GGUF file to write", "FILE")
      .opt("--pre", &pre, "BPE pre-tokenizer name (default: detected from tokenizer.json's regexes)", "NAME")
      .opt("--vocab-size", &vocab_size, "pad the vocabulary with unused [PAD<id>] tokens up to N (config.json vocab_size)")
      .opt("--name", &name, "general.name to write", "TEXT")
      .opt("--arch", &arch, "general.architecture to write", "ARCH")
      .footer("A chat_template.jinja beside tokenizer.json is used when tokenizer_config.json has no chat_template.");
  if (!args.parse(argc, argv)) return 0;
  PG_CHECK(!out.empty(), "missing -o FILE");
  PG_CHECK(vocab_size >= 0, "--vocab-size must not be negative");

  tok::HfImportOptions opt;
  opt.pre = pre;
  opt.vocab_size = vocab_size;
  const auto jinja = std::filesystem::path(tokenizer_json).parent_path() / "chat_template.jinja";
  if (std::filesystem::is_regular_file(jinja)) opt.chat_template = slurp(jinja.string());

  gguf::Writer w;
  w.set_string("general.architecture", arch);
  w.set_string("general.name", name);
  const auto res =
      tok::import_hf_tokenizer(slurp(tokenizer_json), config_json.empty() ? std::string() : slurp(config_json), opt, w);
  w.write(out);

  // Read the result back through the loader the rest of peregrine uses, so a bad file fails here.
  auto file = gguf::File::open(out);
  auto tok = tok::Tokenizer::from_gguf(*file);
  for (const auto& note : res.notes) std::fprintf(stderr, "%s\n", note.c_str());
  std::fprintf(stderr, "wrote %s: model %s, pre %s, %zu tokens, %zu merges, bos %d, eos %d, add_bos %s\n", out.c_str(),
               res.model.c_str(), res.pre.c_str(), res.n_tokens, res.n_merges, tok->bos(), tok->eos(),
               tok->add_bos() ? "true" : "false");
  return 0;
}

}  // namespace pg::cli
