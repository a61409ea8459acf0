#include "tools/specula-load/options.h"

#include <cstdio>

#include "tools/specula/args.h"

namespace specula::load {

using cli::UsageError;

const char* const kUsage =
    "usage: specula-load --url URL --prompts FILE [options]\n"
    "Drives a Specula server (or any OpenAI-compatible streaming server) with concurrent sessions\n"
    "and reports TTFT, inter-token and end-to-end latency, tokens/s, acceptance and errors.\n"
    "  --url URL             ws://HOST:PORT/v1/ws (WebSocket protocol) or\n"
    "                        http://HOST:PORT/v1/chat/completions (OpenAI SSE; /v1/completions and\n"
    "                        /v1/responses, OpenAI's Responses API, too)\n"
    "  --prompts FILE        JSON lines, each with \"messages\" or \"prompt\" (optional \"id\", \"max_tokens\",\n"
    "                        \"priority\": sent with the line's requests, and the summary's by_priority\n"
    "                        gives each value's TTFT and end-to-end latency)\n"
    "  --concurrency N       sessions, one connection each, one request at a time (8)\n"
    "  --requests N          requests in total (128; with --duration alone: unbounded)\n"
    "  --duration S          stop sending new requests after S seconds\n"
    "  --ramp S              start the sessions evenly over S seconds (0)\n"
    "  --rate R              open loop: Poisson arrivals at R requests/s, served by the sessions\n"
    "  --timeout S           per-request limit from send to done (300)\n"
    "  --seed N              seed for arrivals and per-request sampling seeds (1)\n"
    "  --max-tokens N        override each prompt's max_tokens\n"
    "  --temperature T  --top-p P  --top-k K   sampling settings sent with each request\n"
    "  --speculation-k K     draft tokens per round, 1..16 (speculation on or off is the\n"
    "                        server's choice: specula serve --draft none switches it off)\n"
    "  --adaptive            ask for the adaptive draft-length policy\n"
    "  --speculation-mode M  exact, block or coupled\n"
    "  --model NAME          \"model\" of HTTP requests (default)\n"
    "  --json                print the result JSON on stdout\n"
    "  --out FILE            write the result JSON to FILE\n"
    "  --report FILE         write a self-contained HTML report (inline SVG charts)\n"
    "  --quiet               no progress line on stderr\n"
    "exit status: 0 all requests succeeded, 3 some failed (results still written),\n"
    "             1 the server could not be reached, 2 bad usage\n";

namespace {

void check(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

}  // namespace

std::optional<LoadOptions> parse_options(int argc, char** argv) {
  const cli::Args a(argc, argv,
                    {"url", "prompts", "concurrency", "requests", "duration", "ramp", "rate", "timeout", "seed",
                     "max-tokens", "temperature", "top-p", "top-k", "speculation-k", "speculation-mode", "model", "out",
                     "report"},
                    {"json", "quiet", "adaptive"});
  if (a.help()) {
    std::fputs(kUsage, stdout);
    return std::nullopt;
  }
  LoadOptions o;
  check(a.has("url"), "--url is required (e.g. ws://127.0.0.1:8080/v1/ws)");
  check(a.has("prompts"), "--prompts is required (a JSON-lines file)");
  o.target = parse_url(a.str("url"));
  o.prompts_path = a.str("prompts");

  const long long concurrency = a.integer("concurrency", o.concurrency);
  check(concurrency >= 1 && concurrency <= 10000, "--concurrency must be in [1, 10000], got " + std::to_string(concurrency));
  o.concurrency = static_cast<int>(concurrency);
  o.duration_s = a.number("duration", 0);
  check(o.duration_s >= 0, "--duration must be >= 0");
  o.requests = a.integer("requests", a.has("duration") ? -1 : 128);
  check(o.requests >= 1 || (o.requests == -1 && !a.has("requests")),
        "--requests must be >= 1, got " + std::to_string(o.requests));
  o.ramp_s = a.number("ramp", 0);
  check(o.ramp_s >= 0, "--ramp must be >= 0");
  o.rate = a.number("rate", 0);
  check(o.rate >= 0, "--rate must be >= 0 (requests per second; 0 = closed loop)");
  check(o.rate == 0 || o.requests > 0 || o.duration_s > 0, "--rate needs --requests or --duration");
  o.timeout_s = a.number("timeout", o.timeout_s);
  check(o.timeout_s > 0, "--timeout must be > 0");
  const long long seed = a.integer("seed", 1);
  check(seed >= 0, "--seed must be >= 0");
  o.seed = static_cast<unsigned long long>(seed);

  if (a.has("max-tokens")) {
    const long long m = a.integer("max-tokens", 0);
    check(m >= 1 && m <= 1000000, "--max-tokens must be in [1, 1000000], got " + std::to_string(m));
    o.max_tokens = static_cast<int>(m);
  }
  if (a.has("temperature")) {
    o.temperature = a.number("temperature", 0);
    check(*o.temperature >= 0, "--temperature must be >= 0");
  }
  if (a.has("top-p")) {
    o.top_p = a.number("top-p", 1);
    check(*o.top_p > 0 && *o.top_p <= 1, "--top-p must be in (0, 1]");
  }
  if (a.has("top-k")) {
    const long long k = a.integer("top-k", 0);
    check(k >= 0 && k <= 1000000, "--top-k must be >= 0");
    o.top_k = static_cast<int>(k);
  }
  if (a.has("speculation-k")) {
    const std::string k = a.str("speculation-k");
    check(k != "off" && k != "none" && k != "0",
          "--speculation-k " + k + ": the protocol has no per-request switch-off; run the server with --draft none");
    const long long v = a.integer("speculation-k", 0);
    check(v >= 1 && v <= 16, "--speculation-k must be in [1, 16], got " + k);
    o.speculation_k = static_cast<int>(v);
  }
  if (a.has("speculation-mode")) {
    o.speculation_mode = a.str("speculation-mode");
    check(o.speculation_mode == "exact" || o.speculation_mode == "block" || o.speculation_mode == "coupled",
          "--speculation-mode must be exact, block or coupled, got '" + o.speculation_mode + "'");
  }
  o.adaptive = a.flag("adaptive");
  o.model = a.str("model", o.model);
  o.json = a.flag("json");
  o.out_path = a.str("out");
  o.report_path = a.str("report");
  o.quiet = a.flag("quiet");
  return o;
}

}  // namespace specula::load
