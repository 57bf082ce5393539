#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_perplexity(int, char**) { throw Error("'cmd_perplexity' is not built yet"); }
}  // namespace pg::cli
