#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_logits(int, char**) { throw Error("'cmd_logits' is not built yet"); }
}  // namespace pg::cli
