#include "tools/specula-load/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace specula::load {

long long RequestRecord::streamed_tokens() const {
  return std::accumulate(event_tokens.begin(), event_tokens.end(), 0LL);
}

long long RequestRecord::output_tokens() const {
  return server.completion_tokens >= 0 ? server.completion_tokens : streamed_tokens();
}

double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = std::clamp(q, 0.0, 1.0) * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

Distribution describe(std::vector<double> v) {
  Distribution d;
  d.n = v.size();
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  d.min = v.front();
  d.max = v.back();
  d.p50 = percentile(v, 0.50);
  d.p90 = percentile(v, 0.90);
  d.p99 = percentile(v, 0.99);
  return d;
}

std::vector<double> inter_token_samples(const RequestRecord& r) {
  std::vector<double> out;
  for (size_t i = 1; i < r.event_s.size(); ++i) {
    const int n = std::max(1, r.event_tokens[i]);
    const double gap = (r.event_s[i] - r.event_s[i - 1]) / n;
    out.insert(out.end(), static_cast<size_t>(n), gap);
  }
  return out;
}

std::vector<double> poisson_arrivals(double rate, size_t n, uint64_t seed) {
  PoissonArrivals arrivals(rate, seed);
  std::vector<double> t(n);
  for (double& x : t) x = arrivals.next();
  return t;
}

TimeSeries time_series(const std::vector<RequestRecord>& records, double wall_s) {
  TimeSeries ts;
  // About 100 bins, at least 0.25 s each, rounded to 0.25 s.
  ts.bin_s = std::max(0.25, std::ceil(wall_s / 100.0 / 0.25) * 0.25);
  const size_t bins = std::max<size_t>(1, static_cast<size_t>(std::ceil(wall_s / ts.bin_s)));
  ts.tokens_per_s.assign(bins, 0);
  ts.in_flight.assign(bins, 0);
  for (const auto& r : records) {
    for (size_t i = 0; i < r.event_s.size(); ++i) {
      const size_t b = std::min(bins - 1, static_cast<size_t>(std::max(0.0, r.event_s[i]) / ts.bin_s));
      ts.tokens_per_s[b] += r.event_tokens[i];
    }
    if (r.start_s < 0) continue;
    for (size_t b = 0; b < bins; ++b) {
      const double mid = (static_cast<double>(b) + 0.5) * ts.bin_s;
      if (r.start_s <= mid && (r.end_s < 0 || mid < r.end_s)) ++ts.in_flight[b];
    }
  }
  for (double& x : ts.tokens_per_s) x /= ts.bin_s;
  return ts;
}

Summary summarize(const std::vector<RequestRecord>& records) {
  Summary s;
  std::vector<double> ttft, itl, e2e, tpot, queue, req_tps, acc_rates, thresholds;
  double first = INFINITY, last = -INFINITY;
  long long streamed = 0, draft_flagged = 0;
  std::map<int, SessionSummary> sessions;
  std::map<int, std::pair<double, double>> session_span;
  std::map<int, std::pair<std::vector<double>, std::vector<double>>> by_priority;  // ttft, e2e in ms
  for (const auto& r : records) {
    ++s.requests;
    if (r.priority) ++s.by_priority[*r.priority].requests;
    if (r.start_s >= 0) first = std::min(first, r.start_s);
    if (r.end_s >= 0) last = std::max(last, r.end_s);
    if (!r.ok()) {
      ++s.failed;
      ++s.errors[r.error_kind];
      s.error_examples.emplace(r.error_kind, r.error_message);
      continue;
    }
    ++s.succeeded;
    const long long out = r.output_tokens();
    const double e2e_s = r.end_s - r.start_s;
    s.output_tokens += out;
    if (r.server.prompt_tokens >= 0) s.prompt_tokens += r.server.prompt_tokens;
    e2e.push_back(e2e_s * 1e3);
    if (r.priority) {
      ++s.by_priority[*r.priority].succeeded;
      s.by_priority[*r.priority].preemptions += std::max(0LL, r.server.preemptions);
      by_priority[*r.priority].second.push_back(e2e_s * 1e3);
      if (r.first_token_s >= 0) by_priority[*r.priority].first.push_back((r.first_token_s - r.start_s) * 1e3);
    }
    if (r.first_token_s >= 0) {
      const double ttft_s = r.first_token_s - r.start_s;
      ttft.push_back(ttft_s * 1e3);
      if (out > 1) tpot.push_back((e2e_s - ttft_s) / static_cast<double>(out - 1) * 1e3);
    }
    for (double x : inter_token_samples(r)) itl.push_back(x * 1e3);
    if (r.scheduled_s >= 0) queue.push_back((r.start_s - r.scheduled_s) * 1e3);
    if (e2e_s > 0) req_tps.push_back(static_cast<double>(out) / e2e_s);
    streamed += r.streamed_tokens();
    draft_flagged += r.draft_tokens;

    auto& a = s.acceptance;
    if (r.server.drafted >= 0) {
      ++a.requests_with_stats;
      a.drafted += r.server.drafted;
      a.accepted += std::max(0LL, r.server.accepted);
      a.rounds += std::max(0LL, r.server.rounds);
      if (r.server.acceptance_rate >= 0) acc_rates.push_back(r.server.acceptance_rate);
      if (r.server.mean_confidence_threshold > 0) thresholds.push_back(r.server.mean_confidence_threshold);
    }

    auto& ss = sessions[r.session];
    ss.session = r.session;
    ++ss.requests;
    ss.output_tokens += out;
    auto [it, fresh] = session_span.emplace(r.session, std::make_pair(r.start_s, r.end_s));
    if (!fresh) {
      it->second.first = std::min(it->second.first, r.start_s);
      it->second.second = std::max(it->second.second, r.end_s);
    }
  }
  s.wall_s = last > first ? last - first : 0;
  if (s.wall_s > 0) {
    s.total_tokens_per_s = static_cast<double>(s.output_tokens) / s.wall_s;
    s.requests_per_s = s.succeeded / s.wall_s;
  }
  s.ttft_ms = describe(ttft);
  s.itl_ms = describe(itl);
  s.e2e_ms = describe(e2e);
  s.tpot_ms = describe(tpot);
  s.queue_ms = describe(queue);
  s.request_tokens_per_s = describe(req_tps);
  auto& a = s.acceptance;
  if (a.drafted > 0) a.acceptance_rate = static_cast<double>(a.accepted) / static_cast<double>(a.drafted);
  if (a.rounds > 0) a.mean_accepted_length = static_cast<double>(a.accepted) / static_cast<double>(a.rounds);
  if (streamed > 0) a.draft_token_share = static_cast<double>(draft_flagged) / static_cast<double>(streamed);
  a.per_request_rate = describe(acc_rates);
  a.confidence_threshold = describe(thresholds);

  std::vector<double> session_tps;
  for (auto& [id, ss] : sessions) {
    const auto& span = session_span[id];
    ss.busy_s = span.second - span.first;
    ss.tokens_per_s = ss.busy_s > 0 ? static_cast<double>(ss.output_tokens) / ss.busy_s : 0;
    session_tps.push_back(ss.tokens_per_s);
    s.sessions.push_back(ss);
  }
  s.session_tokens_per_s = describe(session_tps);
  for (auto& [priority, c] : s.by_priority) {  // a class whose requests all failed has no samples
    auto& samples = by_priority[priority];
    c.ttft_ms = describe(std::move(samples.first));
    c.e2e_ms = describe(std::move(samples.second));
  }
  return s;
}

}  // namespace specula::load
