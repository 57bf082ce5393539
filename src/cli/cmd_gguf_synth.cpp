#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_gguf_synth(int, char**) { throw Error("'cmd_gguf_synth' is not built yet"); }
}  // namespace pg::cli
