// Prometheus text exposition of the server's metrics.
#include "net/metrics.h"

#include "spec/round.h"

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

void Histogram::render(std::string& out, const std::string& name) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cumulative) + '\n';
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + '\n';
  out += name + "_sum " + num(sum_) + '\n';
  out += name + "_count " + std::to_string(count_) + '\n';
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
  header(out, "specula_requests_total", "counter",
         "Finished requests by outcome (rejected: refused before starting).");
  for (const auto& [outcome, n] : requests)
    out += "specula_requests_total{outcome=\"" + outcome + "\"} " + std::to_string(n) + '\n';
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
  scalar(out, "specula_requests_running", "gauge", "Requests generating (past their first token).", running);
  scalar(out, "specula_requests_waiting", "gauge", "Requests submitted and without a token yet.", waiting);
  scalar(out, "specula_kv_blocks_used", "gauge", "Target KV cache blocks in use.", kv_blocks_total - kv_blocks_free);
  scalar(out, "specula_kv_blocks_free", "gauge", "Target KV cache blocks free.", kv_blocks_free);
  scalar(out, "specula_kv_blocks_total", "gauge", "Target KV cache blocks.", kv_blocks_total);
  scalar(out, "specula_prefix_cache_queries_total", "counter",
         "Prompt tokens looked up in the prefix cache (every prompt token but the last).", engine.prefix_queried_tokens);
  scalar(out, "specula_prefix_cache_hits_total", "counter", "Prompt tokens whose KV the prefix cache held.",
         engine.prefix_hit_tokens);
  scalar(out, "specula_websocket_connections", "gauge", "Open WebSocket connections.", websocket_connections);
  return out;
}

}  // namespace specula::net
