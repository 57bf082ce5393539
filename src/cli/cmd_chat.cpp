#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_chat(int, char**) { throw Error("'cmd_chat' is not built yet"); }
}  // namespace pg::cli
