// The subcommands of the `specula` program; each lives in its own cmd_*.cpp.
#pragma once

namespace specula::cli {

int cmd_generate(int argc, char** argv);  // stream text (or --json ids) from a prompt
int cmd_chat(int argc, char** argv);      // interactive terminal chat
int cmd_logits(int argc, char** argv);    // dump logits as .npy (numerics oracle)
int cmd_draft_data(int argc, char** argv);  // self-distillation data for the draft head (docs/draft.md)
int cmd_draft_eval(int argc, char** argv);  // a draft head's depth-1 top-1 on a draft data file
int cmd_tokenize(int argc, char** argv);  // JSON-lines strings -> ids (tokenizer oracle)
int cmd_chat_template(int argc, char** argv);  // a conversation -> the chat template's prompt text
int cmd_bench(int argc, char** argv);     // benchmarks, JSON out
int cmd_info(int argc, char** argv);      // print a model's config and tensor types
int cmd_serve(int argc, char** argv);     // the HTTP / WebSocket server (net/)

}  // namespace specula::cli
