// `specula serve`: the engine behind the HTTP / WebSocket server of net/ (docs/serving.md).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "actors/engine.h"
#include "model/tokenizer.h"
#include "net/server.h"
#include "tools/specula/common.h"
#include "tools/specula/commands.h"
#include "tools/specula/engine_cli.h"
#include "tools/specula/spec_cli.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula serve [--model PATH] [--draft none|ngram[:n=3]|skip:LAYERS|eagle[:PATH]|PATH|ngram:n=3+eagle] [--host 127.0.0.1] [--port 8080]\n"
    "                     [--max-batch 16] [--kv-tokens 16384] [--kv-reserve as-needed|max-tokens] [--max-queue 256] [--threads 2]\n"
    "                     [--ubatch-size 512] [--device auto] [--pipeline off|on|always] [--prefix-cache on|off]\n"
    "                     [--spec-k 4] [--adaptive] [--spec-k-min 1] [--spec-k-max 8]\n"
    "                     [--spec-k-max-greedy K] [--draft-entropy NATS] [--draft-confidence P] [--draft-confidence-greedy P]\n"
    "                     [--max-tokens 512] [--served-model-name NAME] [--shutdown-timeout 10] [--max-connections 4096]\n"
    "                     [--scheduling-policy fcfs|priority] [--chat-template chatml|llama3|plain|FILE|TEXT]\n"
    "                     [--tool-call-parser auto|generic|hermes|llama3_json|mistral] [--tool-call-grammar on|off]\n"
    "                     [--reasoning-parser auto|deepseek_r1|none]\n"
    "                     [--api-key KEY] [--api-key-file FILE] [--allowed-origins ORIGIN,...|*]\n"
    "  Serves the model on one port: the chat page at /, the WebSocket protocol at /v1/ws, the\n"
    "  OpenAI-compatible /v1/chat/completions, /v1/completions and /v1/models, /health and /metrics\n"
    "  (docs/protocol.md). --max-batch requests run together, --max-queue more wait; beyond that\n"
    "  requests get 429 / overloaded; past --max-connections open connections a new one gets a 503.\n"
    "  --scheduling-policy priority: waiting requests are admitted by their `priority` (lower first,\n"
    "  then first come first served), and one that finds the batch or the KV pool full preempts\n"
    "  running requests of higher values, which resume where they stopped (docs/engine.md,\n"
    "  \"Preemption\"); with fcfs (the default) a request's priority other than 0 is refused.\n"
    "  --kv-tokens: target KV positions shared by all requests. --kv-reserve: a request's blocks are\n"
    "  reserved as it grows, and when the pool runs out the latest admitted request is preempted and\n"
    "  resumes later where it stopped (as-needed, the default, as vLLM); or its whole prompt +\n"
    "  max_tokens at admission, so that a running request never waits (max-tokens). With\n"
    "  --prefix-cache on (the default) full blocks of finished requests stay there for later prompts\n"
    "  that start with the same tokens (docs/engine.md, \"The prefix cache\").\n"
    "  --ubatch-size: the most rows a forward runs at a time; a longer prompt is prefilled in pieces\n"
    "  of that many, which bounds the memory its prefill takes (docs/engine.md, \"Prefill in pieces\").\n"
    "  --draft as for `specula generate` (scripts/run.sh serves with ngram:n=3+eagle).\n"
    "  --chat-template: how `messages` become the prompt, instead of the model's own Jinja template: a\n"
    "  built-in format, a file holding a Jinja template, or its text (`specula chat-template` shows\n"
    "  what a template makes of a conversation; docs/serving.md, \"Chat template\").\n"
    "  --tool-call-parser: how tool_choice \"auto\" reads calls: auto (the default) in the syntax the\n"
    "  template writes calls in, where it writes tools (`specula info`, \"tool calls\"), else\n"
    "  llama.cpp's generic JSON format; generic: that format always; hermes, llama3_json, mistral:\n"
    "  that syntax (the template must write tools). docs/protocol.md, \"Tools\".\n"
    "  --tool-call-grammar: on (the default), calls in Hermes' and Llama 3's syntax are held to the\n"
    "  tools' schemas (llama.cpp's lazy grammar: from <tool_call> on, or where the reply opens with\n"
    "  '{'; other text is free) and stream as they are written; off, they are read as written, as\n"
    "  vLLM reads them.\n"
    "  --reasoning-parser: a chat reply's reasoning (<think> ... </think>) returned apart as\n"
    "  reasoning_content (vLLM's deepseek_r1 parser, llama.cpp's reasoning_format deepseek): auto (the\n"
    "  default) where the chat template writes </think>, deepseek_r1 always, none never.\n"
    "  --spec-k / --adaptive / --draft-entropy / --draft-confidence: the draft length for requests\n"
    "  that set none (the entropy rule ends a draft where the draft's distribution has more than\n"
    "  NATS, the confidence rule where the product of its tokens' draft probabilities falls below\n"
    "  P; 0 = off; auto = set per request each round from its measured acceptance and costs;\n"
    "  --draft-confidence-greedy: greedy requests' P, default the same; --spec-k-max-greedy: greedy\n"
    "  requests' --spec-k-max, default the same).\n"
    "  --max-tokens: the default for requests that set none. SIGINT / SIGTERM drain: running\n"
    "  requests get --shutdown-timeout seconds to finish, then are cancelled; the exit status is 0.\n"
    "  --api-key (or SPECULA_API_KEY): required as 'Authorization: Bearer KEY' on /v1/* and /metrics\n"
    "  (/health and the chat page stay open; the page asks for the key); --api-key-file: more keys,\n"
    "  one a line ('#' comments), any of them accepted, read again on SIGHUP (a file that cannot be\n"
    "  read or holds no key then leaves the keys in use, with one line on stderr). Without a key the server\n"
    "  listens on loopback unless --host says otherwise. A WebSocket upgrade whose Origin is not\n"
    "  this server is refused unless --allowed-origins lists it, and pages of the origins it lists\n"
    "  may call the HTTP routes (CORS; the key is still needed) (docs/serving.md).\n";

// A key as the server takes it (printable ASCII without spaces: it travels in a header); `what`
// names where it came from in the error.
const std::string& checked_key(const std::string& key, const std::string& what) {
  for (unsigned char c : key)
    if (c < 0x21 || c > 0x7e) throw UsageError(what + " must be printable ASCII without spaces");
  return key;
}

// --api-key-file: one key a line (as llama.cpp's server reads it), blank lines and lines starting
// with '#' skipped, spaces around a key trimmed.
std::vector<std::string> read_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("--api-key-file: cannot read " + path);
  std::vector<std::string> keys;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    const size_t last = line.find_last_not_of(" \t\r");
    keys.push_back(checked_key(line.substr(first, last - first + 1), "--api-key-file " + path + " line " + std::to_string(n)));
  }
  if (keys.empty()) throw UsageError("--api-key-file " + path + " holds no key");
  return keys;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.starts_with("127.");
}

}  // namespace

int cmd_serve(int argc, char** argv) {
  const Args a(argc, argv,
               {"model", "draft", "host", "port", "max-batch", "kv-tokens", "kv-reserve", "max-queue", "threads", "ubatch-size", "device", "pipeline", "prefix-cache",
                "spec-k", "spec-k-min", "spec-k-max", "spec-k-max-greedy", "draft-entropy", "draft-confidence", "draft-confidence-greedy", "max-tokens", "served-model-name",
                "shutdown-timeout", "api-key", "api-key-file", "allowed-origins", "max-connections", "scheduling-policy", "chat-template",
                "tool-call-parser", "tool-call-grammar", "reasoning-parser"},
               {"adaptive"});
  if (a.help()) { std::fputs(kUsage, stdout); return 0; }
  actors::EngineConfig ec;
  ec.target = a.has("model") ? a.str("model") : default_model_path();
  ec.chat_template = a.str("chat-template");
  if (a.has("chat-template")) {  // a bad one named before the model loads (the engine applies it with the model's BOS/EOS)
    try {
      (void)ChatTemplate::from_option(ec.chat_template);
    } catch (const std::invalid_argument& e) {
      throw UsageError("--chat-template: " + std::string(e.what()));
    }
  }
  ec.tool_call_parser = a.str("tool-call-parser", "auto");
  try {  // a bad name refused before the model loads
    (void)tool_call_parser_of(ec.tool_call_parser);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const std::string tool_call_grammar = a.str("tool-call-grammar", "on");
  if (tool_call_grammar != "on" && tool_call_grammar != "off")
    throw UsageError("--tool-call-grammar must be on or off, got '" + tool_call_grammar + "'");
  const std::string reasoning = a.str("reasoning-parser", "auto");
  if (reasoning != "auto" && reasoning != "deepseek_r1" && reasoning != "none")
    throw UsageError("--reasoning-parser must be auto, deepseek_r1 or none, got '" + reasoning + "'");
  ec.drafter = a.str("draft", "ngram");
  ec.device = a.str("device", "auto");
  ec.draft = draft_length_from_args(a);
  ec.max_batch = static_cast<int>(a.integer("max-batch", 16));
  ec.kv_tokens = a.integer("kv-tokens", 16384);
  const std::string reserve = a.str("kv-reserve", "as-needed");
  if (reserve != "as-needed" && reserve != "max-tokens")
    throw UsageError("--kv-reserve must be as-needed or max-tokens, got '" + reserve + "'");
  ec.reserve_max_tokens = reserve == "max-tokens";
  ec.threads = static_cast<int>(a.integer("threads", 2));
  ec.ubatch = ubatch_from_args(a);
  pipelining_from_args(a, ec);
  prefix_cache_from_args(a, ec);
  if (ec.max_batch < 1 || ec.max_batch > 1024) throw UsageError("--max-batch must be between 1 and 1024");
  if (ec.threads < 1 || ec.threads > 256) throw UsageError("--threads must be between 1 and 256");

  net::ServerConfig sc;
  sc.host = a.str("host", "127.0.0.1");
  const long long port = a.integer("port", 8080);
  if (port < 0 || port > 65535) throw UsageError("--port must be between 0 and 65535");
  sc.port = static_cast<int>(port);
  sc.max_queue = static_cast<int>(a.integer("max-queue", 256));
  if (sc.max_queue < 0) throw UsageError("--max-queue must be >= 0");
  const long long max_connections = a.integer("max-connections", 4096);
  if (max_connections < 1 || max_connections > 1000000) throw UsageError("--max-connections must be between 1 and 1000000");
  sc.max_connections = static_cast<std::size_t>(max_connections);
  const double shutdown_s = a.number("shutdown-timeout", 10);
  if (!(shutdown_s >= 0 && shutdown_s <= 3600)) throw UsageError("--shutdown-timeout must be between 0 and 3600 seconds");
  sc.shutdown_timeout = std::chrono::milliseconds(static_cast<int64_t>(shutdown_s * 1000));
  sc.served_model_name = a.str("served-model-name", "");
  sc.defaults.draft = ec.draft;
  const long long max_tokens = a.integer("max-tokens", 512);
  if (max_tokens < 1 || max_tokens > 1'000'000) throw UsageError("--max-tokens must be between 1 and 1000000");
  sc.defaults.max_tokens = static_cast<int>(max_tokens);
  const std::string policy = a.str("scheduling-policy", "fcfs");
  if (policy != "fcfs" && policy != "priority") throw UsageError("--scheduling-policy must be fcfs or priority, got '" + policy + "'");
  sc.defaults.priority_scheduling = policy == "priority";
  if (a.has("api-key")) {
    if (a.str("api-key").empty()) throw UsageError("--api-key must not be empty");
    sc.access.api_keys.push_back(checked_key(a.str("api-key"), "the API key"));
  } else if (const char* env = std::getenv("SPECULA_API_KEY"); env && *env) {
    sc.access.api_keys.push_back(checked_key(env, "SPECULA_API_KEY"));
  }
  if (a.has("api-key-file")) {
    const std::string path = a.str("api-key-file");
    sc.reload_keys = [fixed = sc.access.api_keys, path] {  // on SIGHUP: the file again, beside --api-key's
      std::vector<std::string> keys = fixed;
      const std::vector<std::string> read = read_key_file(path);
      keys.insert(keys.end(), read.begin(), read.end());
      return keys;
    };
    sc.access.api_keys = sc.reload_keys();
  }
  if (a.has("allowed-origins")) sc.access.allowed_origins = split(a.str("allowed-origins"), ',');

  std::fprintf(stderr, "specula serve: loading %s (draft %s)\n", ec.target.c_str(), ec.drafter.c_str());
  actors::Engine engine(ec);
  report_pipelining(engine);
  if (const ChatTemplate& ct = engine.chat_template(); ct.reads_own_tool_calls())
    std::fprintf(stderr, "specula serve: tool calls in the model's own %s syntax (its chat template writes tools)\n",
                 tool_syntax_name(ct.tool_syntax()));
  sc.reasoning = reasoning == "deepseek_r1" || (reasoning == "auto" && engine.chat_template().writes_reasoning());
  // Whether any of `markers` is one special token of the vocabulary (no grammar writes one).
  const Tokenizer* tok = engine.model().tokenizer.get();
  auto special = [tok](std::initializer_list<const char*> markers) {
    for (const char* marker : markers)
      if (const std::vector<int32_t> ids = tok->encode(marker); ids.size() == 1 && tok->is_special(ids[0])) return true;
    return false;
  };
  const bool think_special = tok && special({"<think>", "</think>"});
  sc.reasoning_keeps_special_tokens = sc.reasoning && think_special;
  // A constrained reply reasons first where the grammar can write </think> (a special token is no
  // grammar's text: then the grammar holds the whole reply, as before).
  sc.defaults.reasoning_grammar = sc.reasoning && !sc.reasoning_keeps_special_tokens;
  // Calls are held where the grammar can write their markers, and the free text before them a
  // model's special <think> and </think> (else they are read as written).
  sc.defaults.tool_call_grammar = tool_call_grammar == "on" && tok && !think_special && !special({"<tool_call>", "</tool_call>"});
  if (sc.reasoning)
    std::fprintf(stderr, "specula serve: reasoning (<think> ... </think>) returned apart as reasoning_content%s\n",
                 reasoning == "auto" ? " (the chat template writes </think>)" : "");
  return net::run_server(engine, sc, [&](const std::string& url) {
    std::printf("specula serve: %s with draft %s, max batch %d; listening on %s (chat page: %s/)\n",
                net::model_name_from_path(ec.target).c_str(), ec.drafter.c_str(), ec.max_batch, url.c_str(),
                url.c_str());
    if (!sc.access.api_keys.empty())
      std::printf("specula serve: an API key is required on /v1/* and /metrics (%zu key%s accepted%s)\n",
                  sc.access.api_keys.size(), sc.access.api_keys.size() == 1 ? "" : "s",
                  sc.reload_keys ? "; SIGHUP reads --api-key-file again" : "");
    else if (is_loopback(sc.host))
      std::printf("specula serve: no API key, so listening on loopback only (--api-key or SPECULA_API_KEY to "
                  "require one; --host to listen elsewhere)\n");
    else
      std::printf("specula serve: WARNING: no API key and listening on %s: anyone who reaches this port can use "
                  "the model (--api-key or SPECULA_API_KEY to require one)\n", sc.host.c_str());
    std::fflush(stdout);
  });
}

}  // namespace specula::cli
