#include "tools/specula-load/report_html.h"

#include <cstdio>
#include <sstream>

#include "tools/specula-load/svg.h"

namespace specula::load {

namespace {

using svg::escape;

std::string fmt(double v, const char* f = "%.1f") {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string row(std::initializer_list<std::string> cells, const char* tag = "td") {
  std::string r = "<tr>";
  for (const auto& c : cells) r += std::string("<") + tag + ">" + c + "</" + tag + ">";
  return r + "</tr>\n";
}

std::string dist_row(const std::string& name, const Distribution& d, const char* f = "%.1f") {
  if (d.n == 0) return row({escape(name), "0", "", "", "", "", "", ""});
  return row({escape(name), std::to_string(d.n), fmt(d.mean, f), fmt(d.p50, f), fmt(d.p90, f), fmt(d.p99, f), fmt(d.min, f),
              fmt(d.max, f)});
}

std::string opt(const std::optional<double>& v) { return v ? fmt(*v, "%g") : "server default"; }
std::string opt(const std::optional<int>& v) { return v ? std::to_string(*v) : "server default"; }

constexpr const char* kStyle = R"(
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
th { background: #f3f3f3; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
.chart { border: 1px solid #ddd; background: #fff; }
.note { color: #555; font-size: 12px; max-width: 900px; }
)";

}  // namespace

std::string html_report(const LoadOptions& o, size_t prompt_count, const RunResult& run, const Summary& s,
                        const TimeSeries& ts) {
  std::ostringstream h;
  h << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>specula-load report</title>\n<style>"
    << kStyle << "</style></head><body>\n<h1>specula-load: " << escape(o.target.url) << "</h1>\n"
    << "<p class=\"note\">Started " << escape(run.started_at) << (run.interrupted ? " (interrupted)" : "")
    << ". Times are measured by the client from the moment a request is written to the socket.</p>\n";

  h << "<h2>Configuration</h2><table>\n"
    << row({"protocol", o.target.protocol == Protocol::WebSocket ? "WebSocket" : "HTTP SSE"})
    << row({"prompts", escape(o.prompts_path) + " (" + std::to_string(prompt_count) + ")"})
    << row({"concurrency (sessions)", std::to_string(o.concurrency)})
    << row({"requests", o.requests >= 0 ? std::to_string(o.requests) : "unbounded"})
    << row({"duration", o.duration_s > 0 ? fmt(o.duration_s, "%g s") : "none"})
    << row({"ramp", fmt(o.ramp_s, "%g s")})
    << row({"arrivals", o.rate > 0 ? "Poisson, " + fmt(o.rate, "%g") + " requests/s, seed " + std::to_string(o.seed) : "closed loop"})
    << row({"max_tokens", o.max_tokens ? std::to_string(*o.max_tokens) : "per prompt"})
    << row({"temperature", opt(o.temperature)}) << row({"top_p", opt(o.top_p)}) << row({"top_k", opt(o.top_k)})
    << row({"speculation k", o.speculation_k ? std::to_string(*o.speculation_k) : "server default"})
    << row({"speculation mode", o.speculation_mode.empty() ? "server default" : escape(o.speculation_mode)})
    << row({"adaptive", o.adaptive ? "requested" : "server default"}) << "</table>\n";

  h << "<h2>Summary</h2><table>\n"
    << row({"requests", std::to_string(s.requests)}) << row({"succeeded", std::to_string(s.succeeded)})
    << row({"failed", std::to_string(s.failed)}) << row({"wall time (first send to last end)", fmt(s.wall_s, "%.2f s")})
    << row({"output tokens (successful requests)", std::to_string(s.output_tokens)})
    << row({"total output tokens/s", fmt(s.total_tokens_per_s)}) << row({"requests/s", fmt(s.requests_per_s, "%.2f")})
    << "</table>\n";

  h << "<h2>Latency and throughput</h2><table>\n"
    << row({"metric", "n", "mean", "p50", "p90", "p99", "min", "max"}, "th")
    << dist_row("time to first token (ms)", s.ttft_ms) << dist_row("inter-token latency (ms)", s.itl_ms, "%.2f")
    << dist_row("end-to-end latency (ms)", s.e2e_ms) << dist_row("time per output token after the first (ms)", s.tpot_ms, "%.2f");
  if (o.rate > 0) h << dist_row("queued before send (ms)", s.queue_ms);
  h << dist_row("request tokens/s (output / end-to-end)", s.request_tokens_per_s)
    << dist_row("session tokens/s", s.session_tokens_per_s) << "</table>\n";
  if (!s.by_priority.empty()) {
    h << "<h2>By priority</h2><table>\n" << row({"metric", "n", "mean", "p50", "p90", "p99", "min", "max"}, "th");
    for (const auto& [priority, c] : s.by_priority)
      h << dist_row("priority " + std::to_string(priority) + ": time to first token (ms)", c.ttft_ms)
        << dist_row("priority " + std::to_string(priority) + ": end-to-end latency (ms)", c.e2e_ms);
    h << "</table>\n<p>Preempted by the server:";
    for (const auto& [priority, c] : s.by_priority)
      h << " priority " << priority << ": " << c.preemptions << (c.preemptions == 1 ? " time;" : " times;");
    h << "</p>\n";
  }

  const Acceptance& a = s.acceptance;
  h << "<h2>Speculation</h2><table>\n"
    << row({"requests with speculation stats", std::to_string(a.requests_with_stats)})
    << row({"drafted / accepted / rounds", std::to_string(a.drafted) + " / " + std::to_string(a.accepted) + " / " + std::to_string(a.rounds)})
    << row({"acceptance rate (accepted / drafted)", a.acceptance_rate >= 0 ? fmt(a.acceptance_rate, "%.3f") : "n/a"})
    << row({"mean accepted length (accepted / rounds)", a.mean_accepted_length >= 0 ? fmt(a.mean_accepted_length, "%.2f") : "n/a"})
    << row({"share of streamed tokens from the draft", a.draft_token_share >= 0 ? fmt(a.draft_token_share, "%.3f") : "n/a"})
    << row({"confidence threshold, per request (mean / p50)",
            a.confidence_threshold.n > 0
                ? fmt(a.confidence_threshold.mean, "%.3f") + " / " + fmt(a.confidence_threshold.p50, "%.3f")
                : "n/a (the rule was off)"})
    << "</table>\n";

  h << "<h2>Errors</h2>";
  if (s.errors.empty()) {
    h << "<p>none</p>\n";
  } else {
    h << "<table>" << row({"kind", "count", "first message"}, "th");
    for (const auto& [kind, n] : s.errors) h << row({escape(kind), std::to_string(n), escape(s.error_examples.at(kind))});
    h << "</table>\n";
  }

  // Charts.
  svg::Series tps{"output tokens/s", "#1f77b4", {}, {}}, flight{"requests in flight", "#ff7f0e", {}, {}};
  for (size_t b = 0; b < ts.tokens_per_s.size(); ++b) {
    const double t = (static_cast<double>(b) + 0.5) * ts.bin_s;
    tps.x.push_back(t), tps.y.push_back(ts.tokens_per_s[b]);
    flight.x.push_back(t), flight.y.push_back(ts.in_flight[b]);
  }
  std::vector<double> ttft, e2e, itl, acc;
  std::vector<svg::Span> spans;
  for (const auto& r : run.records) {
    if (r.start_s < 0 || r.end_s < 0) continue;
    std::string tip = "request " + std::to_string(r.index) + " (" + r.prompt_id + "), session " + std::to_string(r.session) +
                      ": " + fmt((r.end_s - r.start_s) * 1e3, "%.0f ms") + ", " + std::to_string(r.output_tokens()) + " tokens";
    if (!r.ok()) tip += ", " + r.error_kind + ": " + r.error_message;
    spans.push_back({r.session, r.start_s, r.first_token_s, r.end_s, r.ok(), tip});
    if (!r.ok()) continue;
    if (r.first_token_s >= 0) ttft.push_back((r.first_token_s - r.start_s) * 1e3);
    e2e.push_back((r.end_s - r.start_s) * 1e3);
    for (double x : inter_token_samples(r)) itl.push_back(x * 1e3);
    if (r.server.acceptance_rate >= 0) acc.push_back(r.server.acceptance_rate);
  }
  h << "<h2>Charts</h2><div class=\"charts\">\n"
    << svg::line_chart({"Output tokens/s over time (" + fmt(ts.bin_s, "%g") + " s bins)", "seconds since start", "tokens/s"}, {tps})
    << svg::line_chart({"Requests in flight", "seconds since start", "requests"}, {flight})
    << svg::cdf_chart({"Latency CDF: TTFT and end-to-end", "milliseconds", "fraction of requests"},
                      {{"TTFT", "#2ca02c", ttft}, {"end-to-end", "#9467bd", e2e}})
    << svg::cdf_chart({"Inter-token latency CDF", "milliseconds", "fraction of tokens"}, {{"ITL", "#1f77b4", itl}})
    << svg::histogram({"Inter-token latency histogram", "milliseconds", "tokens"}, {"ITL", "#1f77b4", itl}, 40)
    << svg::histogram({"TTFT histogram", "milliseconds", "requests"}, {"TTFT", "#2ca02c", ttft}, 30);
  if (!acc.empty())
    h << svg::histogram({"Per-request acceptance rate", "accepted / drafted", "requests"}, {"acceptance", "#8c564b", acc}, 20);
  svg::Axes tl{"Per-request timeline (one row per session)", "seconds since start", "session"};
  tl.width = 1300;
  tl.height = std::min(900, 90 + 12 * o.concurrency);
  h << svg::timeline(tl, spans, o.concurrency) << "</div>\n";

  h << "<h2>Sessions</h2><details><summary>" << s.sessions.size() << " sessions</summary><table>\n"
    << row({"session", "requests", "output tokens", "busy s", "tokens/s"}, "th");
  for (const auto& ss : s.sessions)
    h << row({std::to_string(ss.session), std::to_string(ss.requests), std::to_string(ss.output_tokens), fmt(ss.busy_s, "%.2f"),
              fmt(ss.tokens_per_s)});
  h << "</table></details>\n"
    << "<p class=\"note\">TTFT: send to the first event carrying text. Inter-token latency: the gap between "
       "consecutive token events divided over the tokens of the later event (a speculative round may deliver "
       "several tokens at once). Time per output token: (end-to-end - TTFT) / (output tokens - 1). Total tokens/s: "
       "output tokens of successful requests / wall time. See docs/load.md.</p>\n"
    << "</body></html>\n";
  return h.str();
}

}  // namespace specula::load
