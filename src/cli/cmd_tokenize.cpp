#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_tokenize(int, char**) { throw Error("'cmd_tokenize' is not built yet"); }
int cmd_detokenize(int, char**) { throw Error("'cmd_detokenize' is not built yet"); }
}  // namespace pg::cli
