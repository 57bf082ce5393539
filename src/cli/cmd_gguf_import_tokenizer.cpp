#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_gguf_import_tokenizer(int, char**) { throw Error("'cmd_gguf_import_tokenizer' is not built yet"); }
}  // namespace pg::cli
