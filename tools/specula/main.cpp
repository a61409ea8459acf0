// `specula`: one program, subcommands. Errors a user can cause end in one line on stderr and
// exit status 1 (2 for a usage error), never a crash.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "tools/specula/args.h"
#include "tools/specula/commands.h"

namespace {

const char* kUsage =
    "usage: specula <command> [options]\n"
    "commands:\n"
    "  serve      the server: chat page, WebSocket and OpenAI-compatible HTTP API, metrics\n"
    "  chat       interactive chat in the terminal (default model unless --model)\n"
    "  generate   generate text from --prompt (add --chat to apply the chat template)\n"
    "  bench      benchmarks (bench decode), JSON on stdout\n"
    "  info       print a model's configuration and tensor types\n"
    "  logits     write logits for a token sequence as .npy (test oracle)\n"
    "  draft-data write the target's own text, hidden states and top-k for training the draft head\n"
    "  draft-eval a draft head's depth-1 top-1 on a draft data file, as the runtime drafts\n"
    "  tokenize   tokenize JSON-lines strings (test oracle)\n"
    "  chat-template  the prompt text the model's chat template makes of a conversation\n"
    "run 'specula <command> --help' for its options\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace specula::cli;
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  std::string cmd = argv[1];
  try {
    if (cmd == "generate") return cmd_generate(argc - 1, argv + 1);
    if (cmd == "chat") return cmd_chat(argc - 1, argv + 1);
    if (cmd == "serve") return cmd_serve(argc - 1, argv + 1);
    if (cmd == "logits") return cmd_logits(argc - 1, argv + 1);
    if (cmd == "draft-data") return cmd_draft_data(argc - 1, argv + 1);
    if (cmd == "draft-eval") return cmd_draft_eval(argc - 1, argv + 1);
    if (cmd == "tokenize") return cmd_tokenize(argc - 1, argv + 1);
    if (cmd == "chat-template") return cmd_chat_template(argc - 1, argv + 1);
    if (cmd == "bench") return cmd_bench(argc - 1, argv + 1);
    if (cmd == "info") return cmd_info(argc - 1, argv + 1);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "specula %s: %s (see 'specula %s --help')\n", cmd.c_str(), e.what(), cmd.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specula %s: error: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "specula: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return 2;
}
