// `specula chat`: a multi-turn chat in the terminal. The KV cache keeps the conversation; each
// turn re-renders the template, rolls the cache back to the longest common prefix and feeds
// only the new tokens.
#include <cstdio>
#include <iostream>
#include <unistd.h>

#include "spec/generate.h"
#include "tools/specula/common.h"
#include "tools/specula/commands.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula chat [--model PATH] [--system TEXT] [--max-tokens N] [--temperature T] [--top-k K]\n"
    "                    [--top-p P] [--seed S] [--device D] [--threads N] [--ctx N]\n"
    "  Type a message and press Enter. /reset starts over, /quit (or end of input) leaves.\n";

}  // namespace

int cmd_chat(int argc, char** argv) {
  std::set<std::string> options = kModelOptions;
  options.insert({"system", "max-tokens", "temperature", "top-k", "top-p", "seed"});
  const Args a(argc, argv, options, {});
  if (a.help()) { std::fputs(kUsage, stdout); return 0; }
  SamplingParams sp = sampling_from_args(a);
  const long long max_tokens = a.integer("max-tokens", 512);
  if (max_tokens < 1) throw UsageError("--max-tokens must be >= 1");

  Session s = open_session(a);
  const Tokenizer& tok = *s.loaded.tokenizer;
  const std::vector<int32_t> stops = default_stop_ids(s.loaded);
  const bool tty = isatty(STDIN_FILENO);
  std::fprintf(stderr, "specula chat: %s on %s. /reset to start over, /quit to leave.\n",
               s.loaded.weights.config.name.empty() ? s.loaded.path.c_str() : s.loaded.weights.config.name.c_str(),
               s.ops->name().c_str());

  std::vector<ChatMessage> messages;
  if (a.has("system")) messages.push_back({"system", a.str("system")});
  const size_t base_messages = messages.size();
  int seq = s.kv->create_sequence();
  std::vector<int32_t> cached;  // tokens whose K/V the cache holds, in order
  std::string line;
  int turn = 0;
  for (;;) {
    if (tty) std::fputs("\n> ", stdout), std::fflush(stdout);
    if (!read_line(line) || line == "/quit" || line == "/exit") break;
    if (line.empty()) continue;
    if (line == "/reset") {
      messages.resize(base_messages);
      s.kv->truncate_to(seq, 0);
      cached.clear();
      std::fputs("(conversation cleared)\n", stdout);
      continue;
    }
    messages.push_back({"user", line});
    std::vector<int32_t> prompt = tok.encode(s.loaded.chat_template.render(messages));
    size_t common = 0;
    while (common < cached.size() && common + 1 < prompt.size() && cached[common] == prompt[common]) ++common;
    s.kv->truncate_to(seq, static_cast<int64_t>(common));
    cached.resize(common);

    GenerateRequest req;
    req.prompt.assign(prompt.begin() + static_cast<int64_t>(common), prompt.end());
    req.max_tokens = static_cast<int>(max_tokens);
    sp.seed += static_cast<uint64_t>(turn++);  // a new draw each turn, reproducible from --seed
    req.sampling = sp;
    req.stop_ids = stops;
    std::vector<int32_t> reply;
    StreamDecoder dec(s.loaded.tokenizer, /*skip_special=*/true);
    GenerateStats st;
    try {
      st = generate(*s.model, *s.kv, seq, req, [&](int32_t t) {
        reply.push_back(t);
        std::fputs(dec.push(t).c_str(), stdout);
        std::fflush(stdout);
        return true;
      });
    } catch (const std::exception& e) {
      // The conversation outgrew the context (or similar): say so and start over.
      std::fprintf(stderr, "\n(%s; the conversation was cleared)\n", e.what());
      messages.resize(base_messages);
      s.kv->free_sequence(seq);
      seq = s.kv->create_sequence();
      cached.clear();
      continue;
    }
    std::fputs(dec.flush().c_str(), stdout);
    cached.insert(cached.end(), req.prompt.begin(), req.prompt.end());
    if (!reply.empty()) cached.insert(cached.end(), reply.begin(), reply.end() - 1);
    std::vector<int32_t> content = reply;
    if (!content.empty() && std::find(stops.begin(), stops.end(), content.back()) != stops.end()) content.pop_back();
    messages.push_back({"assistant", tok.decode(content, /*skip_special=*/true)});
    std::fprintf(stderr, "\n[%lld tokens, %.1f tok/s decode, prefill %lld at %.1f tok/s]\n",
                 static_cast<long long>(st.generated), st.decode_tokens_per_second(),
                 static_cast<long long>(st.prompt_tokens), st.prefill_tokens_per_second());
  }
  std::fputs("\n", stdout);
  return 0;
}

}  // namespace specula::cli
