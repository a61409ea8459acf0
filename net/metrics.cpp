// Prometheus text exposition of the server's metrics.
#include "net/metrics.h"

#include "spec/round.h"

#include <algorithm>
#include <charconv>

namespace specula::net {

namespace {

// The shortest text that reads back as x ("0.95", not "0.94999999999999996"): bucket bounds are
// label values, which Prometheus and people match as written.
std::string num(double x) {
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

// A counter family with one label: a line for each (label value, count).
void counters_by(std::string& out, const char* name, const char* help, const char* label,
                 const std::map<std::string, uint64_t>& counts) {
  header(out, name, "counter", help);
  for (const auto& [value, n] : counts)
    out += std::string(name) + '{' + label + "=\"" + value + "\"} " + std::to_string(n) + '\n';
}

void scalar(std::string& out, const char* name, const char* type, const char* help, double value) {
  header(out, name, type, help);
  out += name;
  out += ' ' + num(value) + '\n';
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double x) {
  size_t i = 0;
  while (i < bounds_.size() && x > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += x;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  const std::string bucket = name + "_bucket{" + labels + (labels.empty() ? "" : ",") + "le=\"";
  const std::string own = labels.empty() ? std::string(" ") : "{" + labels + "} ";
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += bucket + num(bounds_[i]) + "\"} " + std::to_string(cumulative) + '\n';
  }
  out += bucket + "+Inf\"} " + std::to_string(count_) + '\n';
  out += name + "_sum" + own + num(sum_) + '\n';
  out += name + "_count" + own + std::to_string(count_) + '\n';
}

std::string_view http_route_label(std::string_view path) {
  static constexpr std::string_view kRoutes[] = {"/",         "/health",     "/metrics",       "/v1/models",
                                                 "/tokenize", "/detokenize", "/v1/completions", "/v1/chat/completions",
                                                 "/v1/ws",    "/v1/responses"};
  if (path == "/index.html") return "/";
  for (std::string_view r : kRoutes)
    if (path == r) return r;
  if (path.starts_with("/v1/models/")) return "/v1/models/{model}";
  if (path.starts_with("/v1/responses/")) return path.ends_with("/cancel") ? "/v1/responses/{id}/cancel" : "/v1/responses/{id}";
  return "other";
}

std::string_view http_method_label(std::string_view method) {
  for (std::string_view m : {"GET", "HEAD", "POST", "DELETE", "OPTIONS"})
    if (method == m) return m;
  return "other";
}

void Metrics::count_http(std::string_view route, std::string_view method, unsigned status, double seconds) {
  ++http_requests[{std::string(route), std::string(method), status}];
  auto it = http_duration.find(route);
  if (it == http_duration.end())
    it = http_duration.emplace(std::string(route), Histogram({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300})).first;
  it->second.observe(seconds);
}

Metrics::Metrics()
    : acceptance_rate({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0}),
      accepted_length({0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16}),
      confidence_threshold({0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95}),
      ttft({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      inter_token({0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5}),
      e2e({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}) {
  for (FinishReason r : {FinishReason::Stop, FinishReason::Length, FinishReason::Context, FinishReason::Cancelled})
    requests[std::string(finish_reason_name(r))] = 0;
  for (const char* outcome : {"error", "rejected"}) requests[outcome] = 0;
}

std::string Metrics::render(const EngineReadings& engine) const {
  const int64_t kv_blocks_free = engine.kv_blocks_free, kv_blocks_total = engine.kv_blocks_total;
  std::string out;
  counters_by(out, "specula_requests_total", "Finished requests by outcome (rejected: refused before starting).", "outcome",
              requests);
  scalar(out, "specula_prompt_tokens_total", "counter", "Prompt tokens of started requests.", prompt_tokens);
  scalar(out, "specula_generation_tokens_total", "counter", "Generated tokens.", generation_tokens);
  scalar(out, "specula_draft_tokens_total", "counter", "Draft tokens proposed.", draft_tokens);
  scalar(out, "specula_accepted_tokens_total", "counter", "Draft tokens accepted.", accepted_tokens);
  header(out, "specula_request_acceptance_rate", "histogram", "Per finished request: accepted / drafted draft tokens.");
  acceptance_rate.render(out, "specula_request_acceptance_rate");
  header(out, "specula_accepted_length", "histogram", "Per verify round: accepted draft tokens.");
  accepted_length.render(out, "specula_accepted_length");
  header(out, "specula_request_confidence_threshold", "histogram",
         "Per finished request that drafted under the confidence rule: its mean threshold (set per round "
         "with --draft-confidence auto).");
  confidence_threshold.render(out, "specula_request_confidence_threshold");
  header(out, "specula_time_to_first_token_seconds", "histogram", "Request received to first token sent.");
  ttft.render(out, "specula_time_to_first_token_seconds");
  header(out, "specula_inter_token_latency_seconds", "histogram",
         "Per token after the first: time since the previous token event over the tokens in this one.");
  inter_token.render(out, "specula_inter_token_latency_seconds");
  header(out, "specula_e2e_request_latency_seconds", "histogram", "Request received to its end.");
  e2e.render(out, "specula_e2e_request_latency_seconds");
  // A preempted request is past its first token; while it waits to resume it counts as waiting, as
  // vLLM counts it. (The engine's count and the server's are read apart: clamped, so that a
  // request the server has not yet seen past its first token is not taken twice.)
  const int64_t preempted = std::clamp<int64_t>(engine.preempted_waiting, 0, running);
  scalar(out, "specula_requests_running", "gauge", "Requests generating (past their first token, not preempted).",
         running - preempted);
  scalar(out, "specula_requests_waiting", "gauge",
         "Requests submitted and without a token yet, or preempted and waiting to resume.", waiting + preempted);
  scalar(out, "specula_kv_blocks_used", "gauge", "Target KV cache blocks in use.", kv_blocks_total - kv_blocks_free);
  scalar(out, "specula_kv_blocks_free", "gauge", "Target KV cache blocks free.", kv_blocks_free);
  scalar(out, "specula_kv_blocks_capacity", "gauge", "Target KV cache blocks in all (used + free).", kv_blocks_total);
  scalar(out, "specula_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache (every prompt token but the last).", engine.prefix_queried_tokens);
  scalar(out, "specula_prefix_cache_hits_total", "counter", "Prompt tokens whose KV the prefix cache held.",
         engine.prefix_hit_tokens);
  scalar(out, "specula_preemptions_total", "counter",
         "Running requests preempted, for waiting requests of lower priority values or for the KV blocks of "
         "their own or an earlier admitted request's next round (their prompt and output prefilled again when "
         "they resume).",
         engine.preemptions);
  scalar(out, "specula_websocket_connections", "gauge", "Open WebSocket connections.", websocket_connections);
  header(out, "specula_http_requests_total", "counter",
         "HTTP requests, by route (other: no such route), method and status (499: no answer reached the client, "
         "which left or was closed at shutdown first; a WebSocket upgrade counts once, as 101).");
  for (const auto& [key, n] : http_requests) {
    const auto& [route, method, status] = key;
    out += "specula_http_requests_total{route=\"" + route + "\",method=\"" + method + "\",status=\"" +
           std::to_string(status) + "\"} " + std::to_string(n) + '\n';
  }
  header(out, "specula_http_request_duration_seconds", "histogram",
         "Per HTTP request: its last byte read to its response's last byte written (a stream's whole length).");
  for (const auto& [route, h] : http_duration) h.render(out, "specula_http_request_duration_seconds", "route=\"" + route + "\"");
  if (!key_reloads.empty())
    counters_by(out, "specula_api_key_reloads_total", "SIGHUP reads of --api-key-file, by result (error: the keys in use stayed).",
                "result", key_reloads);
  return out;
}

}  // namespace specula::net
