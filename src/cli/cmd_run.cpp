#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_run(int, char**) { throw Error("'cmd_run' is not built yet"); }
}  // namespace pg::cli
