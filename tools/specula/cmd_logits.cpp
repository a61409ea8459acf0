// Placeholder while the command is being written; replaced in the same session.
#include <cstdio>
#include "tools/specula/commands.h"
namespace specula::cli {
int cmd_logits(int, char**) { std::fputs("specula logits: not built yet\n", stderr); return 2; }
}  // namespace specula::cli
