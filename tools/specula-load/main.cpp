// specula-load: concurrent sessions against a Specula server over WebSocket or HTTP SSE; JSON
// results and an HTML report. Errors a user can cause end in one line on stderr (exit 2 for
// usage, 1 when the server cannot be reached), never a crash.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "tools/specula-load/options.h"
#include "tools/specula-load/prompts.h"
#include "tools/specula-load/report_html.h"
#include "tools/specula-load/result_json.h"
#include "tools/specula-load/runner.h"
#include "tools/specula-load/stats.h"
#include "tools/specula/args.h"

namespace {

using namespace specula::load;

// A file we will write at the end must have an existing folder, checked before the load runs.
void check_writable(const std::string& path, const char* option) {
  if (path.empty()) return;
  const auto dir = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(dir))
    throw specula::cli::UsageError(std::string("--") + option + ": folder '" + dir.string() + "' does not exist");
  if (std::filesystem::is_directory(path)) throw specula::cli::UsageError(std::string("--") + option + ": '" + path + "' is a folder");
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
  if (!f.good()) throw std::runtime_error("cannot write '" + path + "'");
}

void print_summary(const Summary& s, const RunResult& run) {
  auto dist = [](const char* name, const Distribution& d, const char* unit) {
    std::printf("  %-26s p50 %9.2f  p90 %9.2f  p99 %9.2f  %s (n=%zu)\n", name, d.p50, d.p90, d.p99, unit, d.n);
  };
  std::printf("requests: %d succeeded, %d failed%s, wall %.2f s\n", s.succeeded, s.failed,
              run.interrupted ? " (interrupted)" : "", s.wall_s);
  std::printf("throughput: %.1f output tokens/s total, %.2f requests/s, %lld output tokens\n", s.total_tokens_per_s,
              s.requests_per_s, s.output_tokens);
  dist("time to first token", s.ttft_ms, "ms");
  dist("inter-token latency", s.itl_ms, "ms");
  dist("end-to-end latency", s.e2e_ms, "ms");
  dist("tokens/s per session", s.session_tokens_per_s, "tokens/s");
  const Acceptance& a = s.acceptance;
  if (a.drafted > 0)
    std::printf("speculation: acceptance %.3f (%lld of %lld drafted), mean accepted length %.2f\n", a.acceptance_rate,
                a.accepted, a.drafted, a.mean_accepted_length);
  if (a.confidence_threshold.n > 0)
    std::printf("confidence threshold per request: mean %.3f, p50 %.3f (%lld requests)\n", a.confidence_threshold.mean,
                a.confidence_threshold.p50, static_cast<long long>(a.confidence_threshold.n));
  for (const auto& [kind, n] : s.errors)
    std::printf("errors %s: %d (e.g. %s)\n", kind.c_str(), n, s.error_examples.at(kind).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  LoadOptions o;
  std::vector<Prompt> prompts;
  try {
    auto parsed = parse_options(argc, argv);
    if (!parsed) return 0;
    o = *parsed;
    check_writable(o.out_path, "out");
    check_writable(o.report_path, "report");
    prompts = load_prompts(o.prompts_path);
  } catch (const specula::cli::UsageError& e) {
    std::fprintf(stderr, "specula-load: %s (see 'specula-load --help')\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specula-load: %s\n", e.what());
    return 2;
  }
  try {
    const RunResult run = run_load(o, prompts);
    const Summary s = summarize(run.records);
    double last = 0;
    for (const auto& r : run.records) last = std::max(last, r.end_s);
    const TimeSeries ts = time_series(run.records, last);
    const nlohmann::json result = result_json(o, prompts.size(), run, s, ts);
    if (!o.out_path.empty()) write_file(o.out_path, result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
    if (!o.report_path.empty()) write_file(o.report_path, html_report(o, prompts.size(), run, s, ts));
    if (o.json) std::printf("%s\n", result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    else print_summary(s, run);
    if (run.interrupted) return 130;
    return s.failed > 0 ? 3 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specula-load: %s\n", e.what());
    return 1;
  }
}
