// peregrine tokenize | detokenize: the vocabulary of any GGUF with tokenizer metadata (a model or a
// vocab-only file), as llama-tokenize does it.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace pg::cli {

namespace {

std::unique_ptr<tok::Tokenizer> load_tokenizer(const std::string& model, const std::string& pre) {
  PG_CHECK(!model.empty(), "missing -m MODEL (a GGUF file with tokenizer metadata)");
  auto file = gguf::File::open(model);
  tok::LoadOptions opt;
  opt.pre_override = pre;
  return tok::Tokenizer::from_gguf(*file, opt);
}

std::string read_input_file(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream f(path, std::ios::binary);
  PG_CHECK(f.good(), "cannot read '" + path + "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  PG_CHECK(!f.bad(), "error reading '" + path + "'");
  return ss.str();
}

void write_all(const std::string& s) {
  if (!s.empty() && std::fwrite(s.data(), 1, s.size(), stdout) != s.size()) throw Error("cannot write to standard output");
}

}  // namespace

int cmd_tokenize(int argc, char** argv) {
  std::string model, prompt_file, pre;
  std::optional<std::string> prompt;
  bool no_bos = false, parse_special = false, ids_only = false;
  Args args("tokenize", "Tokenize text with the vocabulary stored in a GGUF file.");
  args.opt("-m,--model", &model, "GGUF file with tokenizer metadata (a model or a vocab-only file)", "FILE")
      .opt("-p,--prompt", &prompt, "text to tokenize")
      .opt("-f,--file", &prompt_file, "read the text from FILE ('-' for standard input)", "FILE")
      .flag("--no-bos", &no_bos, "do not add BOS/EOS even if the vocabulary asks for them")
      .flag("--parse-special", &parse_special, "text spelling a control token (<|im_start|>...) becomes that token")
      .flag("--ids", &ids_only, "print only the ids, on one line separated by spaces")
      .opt("--pre", &pre, "override the BPE pre-tokenizer (tokenizer.ggml.pre)", "NAME")
      .footer("Without --ids each token is printed as \"id -> 'piece'\", one per line.");
  if (!args.parse(argc, argv)) return 0;
  PG_CHECK(prompt.has_value() != !prompt_file.empty(), "give exactly one of -p TEXT and -f FILE");
  const std::string text = prompt ? *prompt : read_input_file(prompt_file);
  const auto tok = load_tokenizer(model, pre);
  const auto ids = tok->encode(text, !no_bos, parse_special);
  std::string out;
  if (ids_only) {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ' ';
      out += std::to_string(ids[i]);
    }
    out += '\n';
  } else {
    for (int32_t id : ids) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%6d", id);
      out += buf;
      out += " -> '";
      out += tok->token_to_piece(id, true);
      out += "'\n";
    }
  }
  write_all(out);
  return 0;
}

int cmd_detokenize(int argc, char** argv) {
  std::string model, ids_text, pre;
  bool special = false, raw = false;
  Args args("detokenize", "Turn token ids back into text with the vocabulary stored in a GGUF file.");
  args.opt("-m,--model", &model, "GGUF file with tokenizer metadata", "FILE")
      .opt("--ids", &ids_text, "comma-separated token ids, e.g. 1,403,407", "LIST")
      .flag("--special", &special, "render control tokens (<s>, <|im_end|>...) instead of dropping them")
      .flag("--raw", &raw, "write the exact bytes, even when they are not valid UTF-8")
      .opt("--pre", &pre, "override the BPE pre-tokenizer (tokenizer.ggml.pre)", "NAME")
      .footer("The text is written without a trailing newline; invalid UTF-8 becomes U+FFFD unless --raw.");
  if (!args.parse(argc, argv)) return 0;
  PG_CHECK(args.given("ids"), "missing --ids LIST");
  const std::vector<int32_t> ids = ids_text.empty() ? std::vector<int32_t>{} : parse_id_list(ids_text);
  const auto tok = load_tokenizer(model, pre);
  write_all(raw ? tok->decode(ids, special) : tok->detokenize(ids, special));
  std::fflush(stdout);
  return 0;
}

}  // namespace pg::cli
