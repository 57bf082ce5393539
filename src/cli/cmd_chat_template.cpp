#include "cli/commands.h"
#include "core/error.h"

namespace pg::cli {
int cmd_chat_template(int, char**) { throw Error("'cmd_chat_template' is not built yet"); }
}  // namespace pg::cli
