// Placeholder while the command is being written; replaced in the same session.
#include <cstdio>
#include "tools/specula/commands.h"
namespace specula::cli {
int cmd_tokenize(int, char**) { std::fputs("specula tokenize: not built yet\n", stderr); return 2; }
}  // namespace specula::cli
