#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {

int cmd_gguf(int argc, char** argv) {
  const std::string usage =
      "usage: peregrine gguf <inspect|synth|import-tokenizer> [options]\n\n"
      "  inspect FILE            print metadata and the tensor table\n"
      "  synth --preset NAME ... write a random-weight model with real shapes\n"
      "  import-tokenizer ...    convert Hugging Face tokenizer files to GGUF vocabulary metadata\n";
  if (argc < 2) throw Error("missing gguf subcommand\n" + usage);
  const std::string sub = argv[1];
  if (sub == "-h" || sub == "--help") {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  if (sub == "inspect") return cmd_gguf_inspect(argc - 1, argv + 1);
  if (sub == "synth") return cmd_gguf_synth(argc - 1, argv + 1);
  if (sub == "import-tokenizer") return cmd_gguf_import_tokenizer(argc - 1, argv + 1);
  throw Error("unknown gguf subcommand '" + sub + "'\n" + usage);
}

}  // namespace pg::cli
