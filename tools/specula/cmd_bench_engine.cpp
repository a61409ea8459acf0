// `specula bench spec --concurrency/--pipeline`: the prompt set through the actor engine, for each
// concurrency level and configuration (drafter x pipelining x load-adaptive policy), configurations
// alternated within a level so that changes in machine load hit them alike. Per run: total and
// per-request tokens/s, acceptance, and from the engine's trace the busy time of the draft and
// verify streams and their overlap. Also `specula generate --pipeline/--trace` through the engine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>

#include "actors/engine.h"
#include "spec/generate.h"
#include "tools/specula/common.h"
#include "tools/specula/engine_cli.h"
#include "tools/specula/spec_cli.h"

namespace specula::cli {

namespace {

using Clock = std::chrono::steady_clock;
using actors::Engine;
using actors::EngineConfig;
using actors::EngineRequest;
using actors::StreamEvent;
using actors::TokenStream;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }


// "on" / "off" / "both" -> the values to run.
std::vector<bool> switch_values(const Args& a, const std::string& name, const std::string& fallback) {
  const std::string v = a.str(name, fallback);
  if (v == "on") return {true};
  if (v == "off") return {false};
  if (v == "both") return {false, true};
  throw UsageError("--" + name + " must be on, off or both, got '" + v + "'");
}

struct Config {
  std::string draft;
  bool pipeline = false;
  bool load_adaptive = true;
  std::string name() const {
    return draft + (pipeline ? " pipelined" : "") + (draft != "none" && !load_adaptive ? " no-load-policy" : "");
  }
};

// What one request saw.
struct Seen {
  int64_t tokens = 0;
  double first = 0, done = 0;  // seconds from the run's start
  SpeculativeStats stats;
  std::string error;
};

struct Result {
  Config config;
  int concurrency = 0, repeat = 0;
  bool pipelined = false;  // the engine pipelined (Engine::pipelined)
  bool prefix_cache = true;
  int64_t tokens = 0;
  double wall = 0;
  std::vector<double> per_request_tps, ttft;
  SpeculativeStats spec;
  StreamOverlap streams;
  int errors = 0;
};

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}
double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

Result run_once(const Args& a, const Config& c, int concurrency, int64_t requests, const std::vector<BenchPrompt>& prompts,
                SamplingParams base, const std::string& gbnf, const DraftLengthConfig& draft, const std::string& trace_path) {
  int64_t longest = 0;
  for (const BenchPrompt& p : prompts) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.tokens.size()) + p.max_tokens);
  EngineConfig cfg;
  cfg.target = a.str("model", default_model_path());
  cfg.drafter = c.draft;
  cfg.device = a.str("device", "auto");
  cfg.draft = draft;
  cfg.max_batch = concurrency;
  cfg.kv_tokens = concurrency * (longest + kMaxDraftTokens + 2 + 16) + 64;
  cfg.threads = static_cast<int>(a.integer("threads", 2));
  cfg.ubatch = ubatch_from_args(a);
  cfg.draft_threads = static_cast<int>(a.integer("draft-threads", 0));
  cfg.pipeline = c.pipeline;
  cfg.pipeline_on_shared_cores = a.flag("pipeline-always");
  cfg.load_adaptive = c.load_adaptive;
  prefix_cache_from_args(a, cfg);
  cfg.trace_path = trace_path;
  Result r;
  r.config = c;
  r.concurrency = concurrency;
  r.prefix_cache = cfg.prefix_cache;
  std::string trace;
  {
    Engine engine(cfg);
    r.pipelined = engine.pipelined();
    if (a.flag("json-object")) base.json_object = engine.json_vocabulary();
    if (!gbnf.empty()) base.grammar = engine.grammar(gbnf);
    {  // warm-up: page in the weights, size the workspaces (not counted)
      EngineRequest w;
      w.prompt_ids = prompts.front().tokens;
      w.max_tokens = 4;
      engine.generate_blocking(w);
    }
    // All requests at once: the scheduler admits `concurrency` and queues the rest, so that many
    // are active until the queue drains. One reader thread per request stamps its events.
    std::vector<Seen> seen(static_cast<size_t>(requests));
    std::vector<TokenStream> streams;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < requests; ++i) {
      const BenchPrompt& p = prompts[static_cast<size_t>(i) % prompts.size()];
      EngineRequest req;
      req.prompt_ids = p.tokens;
      req.max_tokens = p.max_tokens;
      req.sampling = base;
      req.sampling.seed = base.seed + static_cast<uint64_t>(i);
      streams.push_back(engine.start(req));
    }
    std::vector<std::thread> readers;
    for (int64_t i = 0; i < requests; ++i)
      readers.emplace_back([&, i] {
        Seen& s = seen[static_cast<size_t>(i)];
        for (;;) {
          StreamEvent ev = streams[static_cast<size_t>(i)].next_blocking();
          const double at = seconds(Clock::now() - t0);
          if (ev.kind == StreamEvent::Kind::Token) {
            if (s.tokens++ == 0) s.first = at;
            continue;
          }
          s.done = at;
          s.stats = ev.stats;
          s.error = ev.error;
          return;
        }
      });
    for (std::thread& t : readers) t.join();
    for (const Seen& s : seen) {
      r.wall = std::max(r.wall, s.done);
      r.tokens += s.tokens;
      if (!s.error.empty()) ++r.errors;
      if (s.tokens > 1 && s.done > s.first) r.per_request_tps.push_back(static_cast<double>(s.tokens - 1) / (s.done - s.first));
      r.ttft.push_back(s.first);
      r.spec.rounds += s.stats.rounds;
      r.spec.drafted += s.stats.drafted;
      r.spec.accepted += s.stats.accepted;
      r.spec.rejected += s.stats.rejected;
    }
    trace = engine.trace_json();
  }
  r.streams = stream_overlap(trace);
  return r;
}

nlohmann::json to_json(const Result& r, const Result* none) {
  nlohmann::json j;
  j["concurrency"] = r.concurrency;
  j["config"] = r.config.name();
  j["draft"] = r.config.draft;
  j["pipeline"] = r.config.pipeline;
  j["pipelined"] = r.pipelined;
  j["load_adaptive"] = r.config.load_adaptive;
  j["prefix_cache"] = r.prefix_cache;
  j["repeat"] = r.repeat;
  j["tokens"] = r.tokens;
  j["seconds"] = r.wall;
  j["total_tokens_per_second"] = r.tokens / r.wall;
  j["per_request_tokens_per_second"] = mean(r.per_request_tps);
  j["ttft_p50_seconds"] = percentile(r.ttft, 0.5);  // from submission: queueing included
  j["errors"] = r.errors;
  j["rounds"] = r.spec.rounds;
  j["drafted"] = r.spec.drafted;
  j["accepted"] = r.spec.accepted;
  j["acceptance_rate"] = r.spec.acceptance_rate();
  j["alpha"] = r.spec.alpha();
  j["tokens_per_round"] = r.spec.tokens_per_round();
  // of the trace's extent (warm-up included, as in the busy times)
  j["draft_busy_fraction"] = r.streams.extent > 0 ? r.streams.draft_busy / r.streams.extent : 0;
  j["verify_busy_fraction"] = r.streams.extent > 0 ? r.streams.verify_busy / r.streams.extent : 0;
  j["draft_busy_seconds"] = r.streams.draft_busy;
  j["verify_busy_seconds"] = r.streams.verify_busy;
  j["overlap"] = r.streams.overlap();
  if (none) j["total_speedup_vs_none"] = (r.tokens / r.wall) / (none->tokens / none->wall);
  return j;
}

}  // namespace


StreamOverlap stream_overlap(const std::string& trace_json) {
  StreamOverlap o;
  if (trace_json.empty()) return o;
  std::vector<std::pair<double, double>> draft, verify;
  const nlohmann::json trace = nlohmann::json::parse(trace_json);
  double first = 1e300, last = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    const double t0 = e["ts"].get<double>() * 1e-6, t1 = t0 + e["dur"].get<double>() * 1e-6;
    first = std::min(first, t0);
    last = std::max(last, t1);
    if (e["tid"] == 2) draft.emplace_back(t0, t1);
    if (e["tid"] == 3) verify.emplace_back(t0, t1);
  }
  o.extent = last > first ? last - first : 0;
  // Spans of one lane do not overlap (one stream, one worker), so pairwise intersections add up.
  std::sort(draft.begin(), draft.end());
  for (const auto& d : draft) o.draft_busy += d.second - d.first;
  for (const auto& v : verify) {
    o.verify_busy += v.second - v.first;
    auto it = std::lower_bound(draft.begin(), draft.end(), std::make_pair(v.first, v.first));
    if (it != draft.begin()) --it;
    for (; it != draft.end() && it->first < v.second; ++it)
      o.both_busy += std::max(0.0, std::min(v.second, it->second) - std::max(v.first, it->first));
  }
  return o;
}

int bench_spec_engine(const Args& a) {
  SamplingParams base = sampling_from_args(a, kBenchSamplingDefaults);
  const std::string gbnf = grammar_from_args(a);
  const DraftLengthConfig draft = draft_length_from_args(a);
  std::vector<int> levels = a.has("concurrency") ? a.int_list("concurrency") : std::vector<int>{1};
  for (int c : levels)
    if (c < 1 || c > 1024) throw UsageError("--concurrency: each level must be 1..1024, got " + std::to_string(c));
  const std::vector<bool> pipelines = switch_values(a, "pipeline", "both");
  const std::vector<bool> policies = switch_values(a, "load-adaptive", "on");
  const int repeat = static_cast<int>(a.integer("repeat", 1));
  const int max_tokens = static_cast<int>(a.integer("max-tokens", 64));
  if (repeat < 1 || max_tokens < 1) throw UsageError("--repeat and --max-tokens must be >= 1");
  const std::vector<std::string> drafts = split(a.str("drafts", "none;ngram"), ';');
  if (drafts.empty()) throw UsageError("--drafts names nothing");

  std::vector<Config> configs;
  for (const std::string& d : drafts)
    for (bool pipeline : pipelines) {
      if (d == "none") {
        if (!pipeline || pipelines.size() == 1) configs.push_back({d, pipeline, true});
        continue;
      }
      for (bool policy : policies)
        if (draft.adaptive || policy == policies.back()) configs.push_back({d, pipeline, policy});
    }

  const LoadedModel files = load_model(a.str("model", default_model_path()));
  token_lists_from_args(a, files, base);
  const std::vector<BenchPrompt> prompts =
      read_prompts(a.str("prompts", "../shared/data/prompts/chat.jsonl"), files, a.integer("limit", 0), max_tokens);
  const std::string trace_prefix = a.str("trace", "");
  nlohmann::json runs = nlohmann::json::array();
  for (int level : levels) {
    const int64_t requests = a.integer("requests", std::max(level, 4));
    std::vector<Result> results;
    for (int rep = 0; rep < repeat; ++rep)
      for (const Config& c : configs) {
        // The trace is always recorded (for the overlap); kept only where --trace asks.
        std::string path = trace_prefix.empty()
                               ? (std::filesystem::temp_directory_path() / ("specula-bench-" + std::to_string(::getpid()) + ".json")).string()
                               : trace_prefix + "-c" + std::to_string(level) + "-" + c.draft + (c.pipeline ? "-pipelined" : "") +
                                     (c.load_adaptive ? "" : "-no-load-policy") + "-" + std::to_string(rep) + ".json";
        std::replace(path.begin() + static_cast<std::ptrdiff_t>(trace_prefix.size()), path.end(), ':', '_');
        Result r = run_once(a, c, level, requests, prompts, base, gbnf, draft, path);
        r.repeat = rep;
        if (trace_prefix.empty()) std::filesystem::remove(path);
        std::fprintf(stderr, "[bench spec] concurrency %d, %s%s: %lld tokens in %.2fs = %.1f tok/s, overlap %.2f\n", level,
                     c.name().c_str(), c.pipeline && !r.pipelined ? " (declined: shared cores, ran unpipelined)" : "",
                     static_cast<long long>(r.tokens), r.wall, r.tokens / r.wall, r.streams.overlap());
        results.push_back(std::move(r));
      }
    for (const Result& r : results) {
      const Result* none = nullptr;
      for (const Result& o : results)
        if (o.config.draft == "none" && o.repeat == r.repeat) none = &o;
      runs.push_back(to_json(r, none));
    }
  }
  nlohmann::json j;
  j["bench"] = "spec-engine";
  j["model"] = files.path;
  j["threads"] = a.integer("threads", 2);
  j["max_tokens"] = max_tokens;
  j["prompt_file"] = a.str("prompts", "../shared/data/prompts/chat.jsonl");
  j["sampling"] = sampling_json(base);
  j["constraint"] = constraint_name(a);
  j.update(draft_length_json(draft));
  j["runs"] = runs;
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace specula::cli
