// The CLI paths that run through the actor engine (actors/engine.h) rather than the sequential
// loop: `specula bench spec --concurrency/--pipeline` and `specula generate --pipeline/--trace`.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "actors/engine.h"
#include "model/weights.h"

#include "tools/specula/args.h"

namespace specula::cli {

// A prompt of `bench spec`'s set: JSON lines with "messages", an optional "id" and "max_tokens".
struct BenchPrompt {
  std::string id;
  std::vector<int32_t> tokens;  // chat-templated
  int max_tokens = 128;
};
// The first `limit` prompts (0 = all), max_tokens capped at `max_tokens` (0 = no cap). Defined in
// cmd_bench.cpp; UsageError for an unreadable file or a bad line.
std::vector<BenchPrompt> read_prompts(const std::string& path, const LoadedModel& m, long long limit, long long max_tokens);

// Options of `bench spec` that select the engine benchmark.
inline const std::set<std::string> kEngineBenchOptions = {"concurrency", "pipeline", "load-adaptive", "requests",
                                                          "trace", "repeat", "draft-threads", "prefix-cache"};

// --pipeline off|on|always (default off) into `cfg`: on pipelines where the draft stream has
// compute of its own (EngineConfig::pipeline_on_shared_cores), always regardless. UsageError for
// another value. Defined in cmd_generate.cpp.
void pipelining_from_args(const Args& a, actors::EngineConfig& cfg);
// --prefix-cache on|off (default on): EngineConfig::prefix_cache. UsageError for anything else.
void prefix_cache_from_args(const Args& a, actors::EngineConfig& cfg);
// One line on stderr when `--pipeline on` was asked for and the engine does not pipeline.
void report_pipelining(const actors::Engine& engine);

// `specula bench spec --concurrency 1,4,16,64 --pipeline on|off|both ...`: JSON on stdout.
int bench_spec_engine(const Args& a);

// The options `specula generate` and `specula chat` share for the engine they run on.
inline const std::set<std::string> kEngineRunOptions = {"draft", "spec-k", "spec-k-min", "spec-k-max", "spec-k-max-greedy", "draft-entropy",
                                                        "draft-confidence", "draft-confidence-greedy",
                                                        "spec-sampling", "pipeline", "trace", "prefix-cache"};

// The engine of `specula generate` / `specula chat` (batch 1): the target loaded once (`target`),
// --device, --threads, --ctx (KV positions, default min(the model's context, 8192)), --draft and
// K (--spec-k, --adaptive, ...), --pipeline on|off, --trace FILE. UsageError for a bad setting.
actors::EngineConfig engine_config_from_args(const Args& a, std::shared_ptr<const LoadedModel> target);
// The engine for `config`; a bad setting (e.g. the drafter's) is a UsageError naming --draft.
std::unique_ptr<actors::Engine> open_engine(const actors::EngineConfig& config);

// One request's stream read to its end, its text echoed to stdout as it comes when `echo`.
struct StreamRead {
  std::vector<int32_t> ids;
  std::string text;
  double first = 0, total = 0;  // seconds to the first token and to the end
  actors::StreamEvent last;     // Done or Error
  // The tokens after the first over the time after it (the first comes with the prompt's forward).
  double decode_tokens_per_second() const {
    return ids.size() > 1 && total > first ? static_cast<double>(ids.size() - 1) / (total - first) : 0;
  }
};
StreamRead read_stream(actors::TokenStream& stream, bool echo);

// The fraction of the verify stream's busy time during which the draft stream was busy, and each
// stream's busy seconds, from an engine trace (actors/trace.h; lanes 2 = draft, 3 = verify).
struct StreamOverlap {
  double draft_busy = 0, verify_busy = 0, both_busy = 0;  // seconds
  double extent = 0;  // seconds from the first span's start to the last span's end (all lanes)
  double overlap() const { return verify_busy > 0 ? both_busy / verify_busy : 0; }
};
StreamOverlap stream_overlap(const std::string& trace_json);

}  // namespace specula::cli
