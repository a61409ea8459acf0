// The statistics of a run, kept pure so the tests can check them on hand-made records:
// percentiles, the inter-token latency samples, Poisson arrivals, time series and the summary.
#pragma once
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tools/specula-load/record.h"

namespace specula::load {

// Linear interpolation between closest ranks (NumPy's default): q in [0, 1] over sorted values.
// Empty input gives 0.
double percentile(const std::vector<double>& sorted, double q);

struct Distribution {
  size_t n = 0;
  double mean = 0, min = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};
Distribution describe(std::vector<double> values);

// Inter-token latency samples (seconds) of one request: each token event after the first
// contributes its gap from the previous event, spread evenly over the tokens it carries (an event
// of n tokens after a gap g gives n samples of g / n). Tokens that share the first event are
// covered by TTFT and give no sample.
std::vector<double> inter_token_samples(const RequestRecord& r);

// Arrival times (seconds from 0) of a Poisson process at `rate` per second: cumulative sums of
// exponential gaps from a generator seeded with `seed`, so a seed gives the same schedule.
class PoissonArrivals {
 public:
  PoissonArrivals(double rate, uint64_t seed) : gen_(seed), gap_(rate) {}
  double next() { return now_ += gap_(gen_); }

 private:
  std::mt19937_64 gen_;
  std::exponential_distribution<double> gap_;
  double now_ = 0;
};
// The first n arrivals of PoissonArrivals(rate, seed).
std::vector<double> poisson_arrivals(double rate, size_t n, uint64_t seed);

// Output tokens per time bin [k * bin_s, (k+1) * bin_s), divided by bin_s (tokens/s), from the
// token events of all requests; and the requests in flight at each bin's midpoint.
struct TimeSeries {
  double bin_s = 1;
  std::vector<double> tokens_per_s;
  std::vector<int> in_flight;
};
TimeSeries time_series(const std::vector<RequestRecord>& records, double wall_s);

struct SessionSummary {
  int session = 0;
  int requests = 0;
  long long output_tokens = 0;
  double busy_s = 0;          // first send to last end
  double tokens_per_s = 0;    // output_tokens / busy_s
};

struct Acceptance {
  long long rounds = 0, drafted = 0, accepted = 0, requests_with_stats = 0;
  double acceptance_rate = -1;        // sum accepted / sum drafted; -1 when nothing was drafted
  double mean_accepted_length = -1;   // sum accepted / sum rounds
  double draft_token_share = -1;      // streamed tokens flagged draft / tokens streamed (WebSocket)
  Distribution per_request_rate;      // distribution of each request's acceptance_rate
  Distribution confidence_threshold;  // each request's mean confidence threshold, where the rule was on
};

// The requests of one priority value (a prompt line's "priority"), for a run that sends some.
struct PriorityClass {
  int requests = 0, succeeded = 0;
  long long preemptions = 0;     // the server's count over its requests (their "preemptions" stat)
  Distribution ttft_ms, e2e_ms;  // of its successful requests
};

struct Summary {
  int requests = 0, succeeded = 0, failed = 0;
  double wall_s = 0;                 // first send to last end
  long long output_tokens = 0;       // of successful requests
  long long prompt_tokens = 0;       // of successful requests that report it
  double total_tokens_per_s = 0;     // output_tokens / wall_s
  double requests_per_s = 0;         // succeeded / wall_s
  Distribution ttft_ms, itl_ms, e2e_ms, tpot_ms, queue_ms;
  Distribution request_tokens_per_s; // each request: output tokens / e2e
  Distribution session_tokens_per_s; // each session: see SessionSummary
  Acceptance acceptance;
  std::map<std::string, int> errors;               // kind -> count
  std::map<std::string, std::string> error_examples; // kind -> first message
  std::vector<SessionSummary> sessions;
  // By priority value, when any request had one (requests without one are not in it).
  std::map<int, PriorityClass> by_priority;
};

// Latencies cover successful requests only; errors are counted by kind.
Summary summarize(const std::vector<RequestRecord>& records);

}  // namespace specula::load
