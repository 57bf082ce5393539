#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_serve(int, char**) { throw Error("'cmd_serve' is not built yet"); }
}  // namespace pg::cli
