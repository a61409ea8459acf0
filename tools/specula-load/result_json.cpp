#include "tools/specula-load/result_json.h"

namespace specula::load {

using nlohmann::json;

namespace {

// -1 (absent) becomes null.
json or_null(double x) { return x < 0 ? json(nullptr) : json(x); }
json or_null(long long x) { return x < 0 ? json(nullptr) : json(x); }

json config_json(const LoadOptions& o, size_t prompt_count) {
  json c = {{"url", o.target.url},
            {"protocol", o.target.protocol == Protocol::WebSocket ? "websocket" : "http-sse"},
            {"prompts_file", o.prompts_path},
            {"prompts", prompt_count},
            {"concurrency", o.concurrency},
            {"requests", o.requests >= 0 ? json(o.requests) : json(nullptr)},
            {"duration_s", o.duration_s > 0 ? json(o.duration_s) : json(nullptr)},
            {"ramp_s", o.ramp_s},
            {"rate", o.rate > 0 ? json(o.rate) : json(nullptr)},
            {"timeout_s", o.timeout_s},
            {"seed", o.seed},
            {"max_tokens", o.max_tokens ? json(*o.max_tokens) : json(nullptr)},
            {"temperature", o.temperature ? json(*o.temperature) : json(nullptr)},
            {"top_p", o.top_p ? json(*o.top_p) : json(nullptr)},
            {"top_k", o.top_k ? json(*o.top_k) : json(nullptr)},
            {"speculation_k", o.speculation_k ? json(*o.speculation_k) : json(nullptr)},
            {"adaptive", o.adaptive},
            {"speculation_mode", o.speculation_mode.empty() ? json(nullptr) : json(o.speculation_mode)}};
  return c;
}

json request_json(const RequestRecord& r) {
  const bool started = r.start_s >= 0;
  json j = {{"index", r.index},
            {"session", r.session},
            {"prompt_id", r.prompt_id},
            {"ok", r.ok()},
            {"start_ms", started ? json(r.start_s * 1e3) : json(nullptr)},
            {"ttft_ms", started && r.first_token_s >= 0 ? json((r.first_token_s - r.start_s) * 1e3) : json(nullptr)},
            {"e2e_ms", started && r.end_s >= 0 ? json((r.end_s - r.start_s) * 1e3) : json(nullptr)},
            {"output_tokens", r.output_tokens()},
            {"events", r.event_s.size()},
            {"draft_tokens", r.draft_tokens},
            {"finish_reason", r.finish_reason.empty() ? json(nullptr) : json(r.finish_reason)},
            {"prompt_tokens", or_null(r.server.prompt_tokens)},
            {"drafted", or_null(r.server.drafted)},
            {"accepted", or_null(r.server.accepted)},
            {"rounds", or_null(r.server.rounds)},
            {"acceptance_rate", or_null(r.server.acceptance_rate)},
            {"mean_accepted_length", or_null(r.server.mean_accepted_length)},
            {"mean_confidence_threshold", or_null(r.server.mean_confidence_threshold)},
            {"preemptions", or_null(r.server.preemptions)}};
  if (r.scheduled_s >= 0) j["scheduled_ms"] = r.scheduled_s * 1e3;
  if (r.priority) j["priority"] = *r.priority;
  if (!r.ok()) j["error"] = {{"kind", r.error_kind}, {"message", r.error_message}};
  return j;
}

}  // namespace

json distribution_json(const Distribution& d) {
  if (d.n == 0) return {{"n", 0}};
  return {{"n", d.n}, {"mean", d.mean}, {"min", d.min}, {"p50", d.p50}, {"p90", d.p90}, {"p99", d.p99}, {"max", d.max}};
}

json result_json(const LoadOptions& o, size_t prompt_count, const RunResult& run, const Summary& s, const TimeSeries& ts) {
  const Acceptance& a = s.acceptance;
  json errors = json::object();
  for (const auto& [kind, n] : s.errors) errors[kind] = {{"count", n}, {"example", s.error_examples.at(kind)}};
  json summary = {{"requests", s.requests},
                  {"succeeded", s.succeeded},
                  {"failed", s.failed},
                  {"interrupted", run.interrupted},
                  {"wall_s", s.wall_s},
                  {"output_tokens", s.output_tokens},
                  {"prompt_tokens", s.prompt_tokens},
                  {"total_tokens_per_s", s.total_tokens_per_s},
                  {"requests_per_s", s.requests_per_s},
                  {"ttft_ms", distribution_json(s.ttft_ms)},
                  {"itl_ms", distribution_json(s.itl_ms)},
                  {"e2e_ms", distribution_json(s.e2e_ms)},
                  {"tpot_ms", distribution_json(s.tpot_ms)},
                  {"request_tokens_per_s", distribution_json(s.request_tokens_per_s)},
                  {"session_tokens_per_s", distribution_json(s.session_tokens_per_s)},
                  {"acceptance",
                   {{"requests_with_stats", a.requests_with_stats},
                    {"rounds", a.rounds},
                    {"drafted", a.drafted},
                    {"accepted", a.accepted},
                    {"acceptance_rate", or_null(a.acceptance_rate)},
                    {"mean_accepted_length", or_null(a.mean_accepted_length)},
                    {"draft_token_share", or_null(a.draft_token_share)},
                    {"per_request_acceptance_rate", distribution_json(a.per_request_rate)},
                    {"per_request_confidence_threshold", distribution_json(a.confidence_threshold)}}},
                  {"errors", s.failed},
                  {"errors_by_kind", errors}};
  if (o.rate > 0) summary["queue_ms"] = distribution_json(s.queue_ms);
  if (!s.by_priority.empty()) {
    json classes = json::object();
    for (const auto& [priority, c] : s.by_priority)
      classes[std::to_string(priority)] = {{"requests", c.requests}, {"succeeded", c.succeeded},
                                           {"preemptions", c.preemptions}, {"ttft_ms", distribution_json(c.ttft_ms)},
                                           {"e2e_ms", distribution_json(c.e2e_ms)}};
    summary["by_priority"] = classes;
  }
  json sessions = json::array();
  for (const auto& ss : s.sessions)
    sessions.push_back({{"session", ss.session},
                        {"requests", ss.requests},
                        {"output_tokens", ss.output_tokens},
                        {"busy_s", ss.busy_s},
                        {"tokens_per_s", ss.tokens_per_s}});
  json requests = json::array();
  for (const auto& r : run.records) requests.push_back(request_json(r));
  return {{"tool", "specula-load"},
          {"started_at", run.started_at},
          {"config", config_json(o, prompt_count)},
          {"summary", summary},
          {"sessions", sessions},
          {"timeseries", {{"bin_s", ts.bin_s}, {"tokens_per_s", ts.tokens_per_s}, {"in_flight", ts.in_flight}}},
          {"requests", requests}};
}

}  // namespace specula::load
