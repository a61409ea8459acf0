// specula-load's statistics on hand-made records: percentiles, the inter-token samples, Poisson
// arrivals, the time series and the summary.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "tools/specula-load/stats.h"

namespace specula::load {
namespace {

RequestRecord request(int session, double start, std::vector<double> events, std::vector<int> tokens, double end) {
  RequestRecord r;
  r.session = session;
  r.start_s = start;
  r.event_s = std::move(events);
  r.event_tokens = std::move(tokens);
  r.first_token_s = r.event_s.empty() ? -1 : r.event_s.front();
  r.end_s = end;
  return r;
}

TEST(Percentile, InterpolatesBetweenClosestRanksLikeNumPy) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile(v, 0.9), 3.7);   // numpy.percentile([1,2,3,4], 90)
  EXPECT_DOUBLE_EQ(percentile(v, 0.99), 3.97);
  EXPECT_DOUBLE_EQ(percentile(v, 1.0), 4);
}

TEST(Percentile, OfOneValueIsThatValueAndOfNoneIsZero) {
  EXPECT_DOUBLE_EQ(percentile({7}, 0.99), 7);
  EXPECT_DOUBLE_EQ(percentile({}, 0.5), 0);
}

TEST(Describe, SortsItsInputAndReportsMeanAndExtremes) {
  std::vector<double> v(101);
  std::iota(v.rbegin(), v.rend(), 0.0);  // 100 .. 0, unsorted on purpose
  const Distribution d = describe(v);
  EXPECT_EQ(d.n, 101u);
  EXPECT_DOUBLE_EQ(d.mean, 50);
  EXPECT_DOUBLE_EQ(d.min, 0);
  EXPECT_DOUBLE_EQ(d.max, 100);
  EXPECT_DOUBLE_EQ(d.p50, 50);
  EXPECT_DOUBLE_EQ(d.p90, 90);
  EXPECT_DOUBLE_EQ(d.p99, 99);
}

TEST(InterTokenSamples, SpreadEachGapOverTheTokensOfTheLaterEvent) {
  // Events at 1.0 (2 tokens), 1.3 (3 tokens), 1.4 (1 token).
  const RequestRecord r = request(0, 0.5, {1.0, 1.3, 1.4}, {2, 3, 1}, 1.5);
  const std::vector<double> s = inter_token_samples(r);
  ASSERT_EQ(s.size(), 4u);  // the first event's tokens are covered by TTFT
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(s[i], 0.1, 1e-12);
  EXPECT_NEAR(s[3], 0.1, 1e-12);
}

TEST(PoissonArrivals, TheSameSeedGivesTheSameScheduleAndAnotherSeedDoesNot) {
  const auto a = poisson_arrivals(4.0, 100, 42), b = poisson_arrivals(4.0, 100, 42), c = poisson_arrivals(4.0, 100, 43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_GT(a.front(), 0);
}

TEST(PoissonArrivals, GapsAreExponentialWithTheRequestedRate) {
  const double rate = 5;
  const size_t n = 20000;
  const auto t = poisson_arrivals(rate, n, 7);
  std::vector<double> gaps(n);
  std::adjacent_difference(t.begin(), t.end(), gaps.begin());
  const double mean = t.back() / n;
  EXPECT_NEAR(mean, 1 / rate, 0.01 * 3);  // sd of the mean = (1/rate)/sqrt(n) = 0.0014
  // Exponential: P(gap > mean) = e^-1, and the coefficient of variation is 1.
  const double above = std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g > 1 / rate; }) / double(n);
  EXPECT_NEAR(above, std::exp(-1.0), 0.015);
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  EXPECT_NEAR(std::sqrt(var / n) / mean, 1.0, 0.05);
}

TEST(PoissonArrivals, TheStreamingGeneratorMatchesTheBatchOne) {
  PoissonArrivals gen(3.0, 9);
  for (double t : poisson_arrivals(3.0, 50, 9)) EXPECT_DOUBLE_EQ(gen.next(), t);
}

TEST(TimeSeries, CountsTokensPerBinAndRequestsInFlightAtBinMidpoints) {
  std::vector<RequestRecord> rs = {request(0, 0.0, {0.1, 0.6}, {2, 4}, 0.7), request(1, 0.5, {1.1}, {3}, 1.2)};
  const TimeSeries ts = time_series(rs, 1.2);
  ASSERT_DOUBLE_EQ(ts.bin_s, 0.25);
  ASSERT_EQ(ts.tokens_per_s.size(), 5u);
  EXPECT_DOUBLE_EQ(ts.tokens_per_s[0], 2 / 0.25);
  EXPECT_DOUBLE_EQ(ts.tokens_per_s[2], 4 / 0.25);
  EXPECT_DOUBLE_EQ(ts.tokens_per_s[4], 3 / 0.25);
  EXPECT_EQ(ts.in_flight, (std::vector<int>{1, 1, 2, 1, 1}));
}

TEST(Summarize, LatenciesCoverSuccessesAndErrorsAreCountedByKind) {
  std::vector<RequestRecord> rs = {request(0, 0.0, {0.2, 0.3, 0.4}, {1, 1, 1}, 0.5),
                                   request(1, 0.0, {0.4, 0.6}, {1, 3}, 0.8)};
  rs[1].server.completion_tokens = 4;
  rs[1].server.drafted = 6;
  rs[1].server.accepted = 3;
  rs[1].server.rounds = 2;
  rs[1].server.acceptance_rate = 0.5;
  rs[1].server.mean_confidence_threshold = 0.45;
  rs[1].draft_tokens = 2;
  RequestRecord bad = request(1, 0.8, {}, {}, 0.9);
  bad.error_kind = "server:overloaded";
  bad.error_message = "queue full";
  rs.push_back(bad);
  RequestRecord timeout = request(0, 0.5, {0.6}, {1}, 1.0);
  timeout.error_kind = "timeout";
  rs.push_back(timeout);

  const Summary s = summarize(rs);
  EXPECT_EQ(s.requests, 4);
  EXPECT_EQ(s.succeeded, 2);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.errors.at("server:overloaded"), 1);
  EXPECT_EQ(s.errors.at("timeout"), 1);
  EXPECT_EQ(s.error_examples.at("server:overloaded"), "queue full");
  EXPECT_DOUBLE_EQ(s.wall_s, 1.0);
  EXPECT_EQ(s.output_tokens, 3 + 4);
  EXPECT_DOUBLE_EQ(s.total_tokens_per_s, 7.0);
  EXPECT_EQ(s.ttft_ms.n, 2u);
  EXPECT_NEAR(s.ttft_ms.p50, 300, 1e-9);
  EXPECT_NEAR(s.e2e_ms.max, 800, 1e-9);
  EXPECT_EQ(s.itl_ms.n, 2u + 3u);
  // TPOT: (0.5 - 0.2) / 2 and (0.8 - 0.4) / 3.
  EXPECT_NEAR(s.tpot_ms.min, 400.0 / 3, 1e-9);
  EXPECT_NEAR(s.tpot_ms.max, 150, 1e-9);
  EXPECT_DOUBLE_EQ(s.acceptance.acceptance_rate, 0.5);
  EXPECT_DOUBLE_EQ(s.acceptance.mean_accepted_length, 1.5);
  EXPECT_DOUBLE_EQ(s.acceptance.draft_token_share, 2.0 / 7.0);
  // Only the request that drafted under the confidence rule has a threshold.
  EXPECT_EQ(s.acceptance.confidence_threshold.n, 1u);
  EXPECT_DOUBLE_EQ(s.acceptance.confidence_threshold.mean, 0.45);
  ASSERT_EQ(s.sessions.size(), 2u);
  EXPECT_DOUBLE_EQ(s.sessions[0].tokens_per_s, 3 / 0.5);
  EXPECT_DOUBLE_EQ(s.sessions[1].tokens_per_s, 4 / 0.8);
}

TEST(Summarize, RequestsWithAPriorityAreDescribedByItsValue) {
  std::vector<RequestRecord> rs = {request(0, 0.0, {0.1}, {1}, 0.5), request(1, 0.0, {0.4}, {1}, 0.9),
                                   request(0, 0.5, {0.7}, {1}, 1.0), request(1, 0.9, {1.0}, {1}, 1.2)};
  rs[0].priority = -1;
  rs[1].priority = 1;
  rs[2].priority = -1;
  rs[3].priority = 1;
  rs[3].error_kind = "timeout";
  rs[1].server.preemptions = 2;  // a low one preempted twice; the others report 0 or nothing
  rs[0].server.preemptions = 0;
  const Summary s = summarize(rs);
  ASSERT_EQ(s.by_priority.size(), 2u);
  const PriorityClass& high = s.by_priority.at(-1);
  const PriorityClass& low = s.by_priority.at(1);
  EXPECT_EQ(high.requests, 2);
  EXPECT_EQ(high.succeeded, 2);
  EXPECT_NEAR(high.ttft_ms.mean, (100 + 200) / 2.0, 1e-9);
  EXPECT_NEAR(high.e2e_ms.max, 500, 1e-9);
  EXPECT_EQ(high.preemptions, 0);
  EXPECT_EQ(low.requests, 2);
  EXPECT_EQ(low.preemptions, 2);
  EXPECT_EQ(low.succeeded, 1);  // the timed-out one is counted, not described
  EXPECT_EQ(low.ttft_ms.n, 1u);
  EXPECT_NEAR(low.ttft_ms.mean, 400, 1e-9);
  rs[0].priority = rs[1].priority = rs[2].priority = rs[3].priority = std::nullopt;
  EXPECT_TRUE(summarize(rs).by_priority.empty());
}

TEST(Summarize, WithoutSpeculationStatsAcceptanceIsAbsentNotZero) {
  const Summary s = summarize({request(0, 0, {0.1}, {1}, 0.2)});
  EXPECT_EQ(s.acceptance.requests_with_stats, 0);
  EXPECT_LT(s.acceptance.acceptance_rate, 0);
  EXPECT_LT(s.acceptance.mean_accepted_length, 0);
  EXPECT_EQ(s.acceptance.confidence_threshold.n, 0u);
}

}  // namespace
}  // namespace specula::load
