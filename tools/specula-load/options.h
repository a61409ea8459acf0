// specula-load's command line: what to drive (URL, prompts), how hard (sessions, count, duration,
// ramp, Poisson rate) and what each request asks for (sampling and speculation settings).
#pragma once
#include <optional>
#include <string>

#include "tools/specula-load/url.h"

namespace specula::load {

struct LoadOptions {
  Target target;                     // --url: ws://host:port/path or http://host:port/v1/chat/completions
  std::string prompts_path;          // --prompts: JSON lines with "messages" or "prompt"
  int concurrency = 8;               // --concurrency: sessions (one connection each)
  long long requests = 128;          // --requests: total; -1 = unbounded (with --duration)
  double duration_s = 0;             // --duration: stop sending new requests after this; 0 = none
  double ramp_s = 0;                 // --ramp: session i starts at i * ramp / concurrency
  double rate = 0;                   // --rate: Poisson arrivals per second; 0 = closed loop
  double timeout_s = 300;            // --timeout: per request, from send to done
  unsigned long long seed = 1;       // --seed: arrivals, and request seed = seed + index when sampling
  std::optional<int> max_tokens;     // --max-tokens: overrides each prompt's own
  std::optional<double> temperature; // --temperature
  std::optional<double> top_p;       // --top-p
  std::optional<int> top_k;          // --top-k
  std::optional<int> speculation_k;  // --speculation-k K: draft tokens per round (1..16)
  bool adaptive = false;             // --adaptive: ask for the adaptive K policy
  std::string speculation_mode;      // --speculation-mode exact|coupled ("" = server default)
  std::string model = "default";     // --model: the "model" field of HTTP requests
  bool json = false;                 // --json: the result JSON on stdout
  std::string out_path;              // --out: the result JSON to a file
  std::string report_path;           // --report: the HTML report
  bool quiet = false;                // --quiet: no progress line
};

// Parses argv (argv[0] = program). Throws cli::UsageError with a one-line message for unknown
// options, bad numbers, out-of-range values and a bad URL. Returns nullopt for --help (the
// usage text is printed).
std::optional<LoadOptions> parse_options(int argc, char** argv);

extern const char* const kUsage;

}  // namespace specula::load
