#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_bench(int, char**) { throw Error("'cmd_bench' is not built yet"); }
}  // namespace pg::cli
