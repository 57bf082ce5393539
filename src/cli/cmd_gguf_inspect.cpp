#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_gguf_inspect(int, char**) { throw Error("'cmd_gguf_inspect' is not built yet"); }
}  // namespace pg::cli
