// `peregrine gguf inspect FILE`: header, metadata and tensor table of a GGUF file. The file is parsed
// completely before anything is printed, so a damaged file yields one error line and no output.
#include <iostream>
#include <string>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "gguf/inspect.h"
#include "model/dflash.h"

namespace pg::cli {

int cmd_gguf_inspect(int argc, char** argv) {
  std::string path;
  int max_items = 8;
  int max_string = 80;
  bool no_tensors = false;
  bool full = false;
  Args args("gguf inspect", "Print a GGUF file's version, alignment, metadata (with types) and tensor table with totals.");
  args.positional("FILE", &path, "GGUF file to inspect")
      .opt("--max-items", &max_items, "array items shown per metadata value (0 = all)")
      .opt("--max-string", &max_string, "string bytes shown per metadata value (0 = all)")
      .flag("--no-tensors", &no_tensors, "skip the tensor table (totals are still printed)")
      .flag("--full", &full, "show every array item and whole strings");
  if (!args.parse(argc, argv)) return 0;
  if (max_items < 0 || max_string < 0) throw Error("--max-items and --max-string must not be negative");

  const auto file = gguf::File::open(path);
  gguf::InspectOptions opt;
  opt.max_array_items = full ? 0 : static_cast<size_t>(max_items);
  opt.max_string_bytes = full ? 0 : static_cast<size_t>(max_string);
  opt.tensors = !no_tensors;
  gguf::print_inspect(*file, std::cout, opt);
  if (is_dflash_arch(file->architecture())) print_dflash_summary(*file, std::cout);
  std::cout.flush();
  return std::cout ? 0 : 1;
}

}  // namespace pg::cli
