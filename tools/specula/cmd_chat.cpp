// `specula chat`: a multi-turn chat in the terminal, through the actor engine like the server
// (docs/engine.md, "The CLI"). Each turn sends the whole conversation as chat messages, as an
// OpenAI client does; the engine's prefix cache keeps the history's full KV blocks, so each turn
// prefills little more than its new message (docs/engine.md, "The prefix cache").
#include <cstdio>
#include <iostream>
#include <memory>
#include <unistd.h>

#include "actors/engine.h"
#include "tools/specula/common.h"
#include "tools/specula/commands.h"
#include "tools/specula/engine_cli.h"
#include "tools/specula/spec_cli.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula chat [--model PATH] [--system TEXT] [--max-tokens N] [--temperature T] [--top-k K]\n"
    "                    [--top-p P] [--min-p P] [--seed S] [--device D] [--threads N] [--ctx N] [--ubatch-size 512]\n"
    "                    [--presence-penalty X] [--frequency-penalty X] [--repetition-penalty X]\n"
    "                    [--logit-bias ID:BIAS,...] [--min-tokens N] [--allowed-token-ids ID,...] [--bad-words WORD,...]\n"
    "                    [--draft none|ngram[:n=3]|skip:LAYERS|eagle[:PATH]|PATH|ngram:n=3+eagle] [--spec-k K] [--adaptive]\n"
    "                    [--spec-k-min K] [--spec-k-max K] [--spec-sampling exact|block|coupled]\n"
    "                    [--pipeline off|on|always] [--chat-template chatml|llama3|plain|FILE|TEXT]\n"
    "  Type a message and press Enter. /reset starts over, /quit (or end of input) leaves.\n"
    "  Each reply is streamed through the engine (as `specula generate` does), with its speed and,\n"
    "  with --draft, its acceptance on stderr. A reply is cut where the context ends; a message that\n"
    "  no longer fits clears the conversation.\n";

}  // namespace

int cmd_chat(int argc, char** argv) {
  std::set<std::string> options = kModelOptions;
  options.insert({kChatTemplateOption, "system", "max-tokens", "temperature", "top-k", "top-p", "min-p", "presence-penalty", "frequency-penalty", "repetition-penalty", "logit-bias", "allowed-token-ids", "bad-words", "min-tokens", "seed"});
  options.insert(kEngineRunOptions.begin(), kEngineRunOptions.end());
  const Args a(argc, argv, options, {"adaptive"});
  if (a.help()) { std::fputs(kUsage, stdout); return 0; }
  SamplingParams sp = sampling_from_args(a);
  const long long max_tokens = max_tokens_from_args(a, 512);
  const SpecSampling mode = spec_sampling_from_args(a);
  auto files = std::make_shared<const LoadedModel>(load_model_from_args(a));
  token_lists_from_args(a, *files, sp);
  const actors::EngineConfig cfg = engine_config_from_args(a, files);
  const std::unique_ptr<actors::Engine> engine = open_engine(cfg);
  const bool tty = isatty(STDIN_FILENO);
  std::fprintf(stderr, "specula chat: %s on %s%s. /reset to start over, /quit to leave.\n",
               files->weights.config.name.empty() ? files->path.c_str() : files->weights.config.name.c_str(),
               engine->device_name().c_str(), cfg.drafter != "none" ? (", drafting with " + cfg.drafter).c_str() : "");

  std::vector<ChatMessage> messages;
  if (a.has("system")) messages.push_back({"system", a.str("system")});
  const size_t base_messages = messages.size();
  std::string line;
  int turn = 0;
  for (;;) {
    if (tty) std::fputs("\n> ", stdout), std::fflush(stdout);
    if (!read_line(line) || line == "/quit" || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      messages.resize(base_messages);
      std::fputs("(conversation cleared)\n", stdout);
      continue;
    }
    messages.push_back({"user", line});
    actors::EngineRequest req;
    req.messages = messages;
    req.max_tokens = static_cast<int>(max_tokens);
    req.fit_to_context = true;  // the reply stops where the context ends
    req.sampling = sp;
    req.sampling.seed = sp.seed + static_cast<uint64_t>(turn++);  // a new draw each turn, reproducible from --seed
    req.mode = mode;
    actors::Admission admitted;
    std::optional<actors::TokenStream> stream;
    try {
      stream.emplace(engine->start(std::move(req), &admitted));
    } catch (const actors::RequestError& e) {
      // The conversation outgrew the context (or similar): say so and start over.
      std::fprintf(stderr, "(%s; the conversation was cleared)\n", e.what());
      messages.resize(base_messages);
      continue;
    }
    const StreamRead got = read_stream(*stream, /*echo=*/true);
    const actors::StreamEvent& ev = got.last;
    if (ev.kind == actors::StreamEvent::Kind::Error) {
      std::fprintf(stderr, "\n(%s; the conversation was cleared)\n", ev.error.c_str());
      messages.resize(base_messages);
      continue;
    }
    std::fputs("\n", stdout);  // each reply ends its line
    messages.push_back({"assistant", got.text});
    const auto tokens = static_cast<long long>(got.ids.size());
    std::fprintf(stderr, "\n[%lld tokens, %.1f tok/s decode, %s; prompt %lld tokens, first token after %.3fs%s]\n", tokens,
                 got.decode_tokens_per_second(),
                 std::string(finish_reason_name(ev.finish_reason)).c_str(), static_cast<long long>(admitted.prompt_tokens), got.first,
                 admitted.max_tokens_clamped ? "; the reply may stop where the context ends" : "");
    if (cfg.drafter != "none") std::fprintf(stderr, "[%s: %s]\n", cfg.drafter.c_str(), spec_stats_line(ev.stats).c_str());
  }
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace specula::cli
