// Placeholder while the command is being written; replaced in the same session.
#include <cstdio>
#include "tools/specula/commands.h"
namespace specula::cli {
int cmd_info(int, char**) { std::fputs("specula info: not built yet\n", stderr); return 2; }
}  // namespace specula::cli
