// The load-adaptive draft-length policy on synthetic costs: speculation where the verify forward
// is memory-bound, none where it is compute-bound, the exhaustive optimum on small rounds, and
// the verify cost fit.
#include "actors/load_policy.h"

#include <gtest/gtest.h>

#include <functional>

#include "spec/philox.h"

namespace specula::actors {
namespace {

double round_rate(const std::vector<PolicyRequest>& r, const std::vector<int>& k, const RoundCosts& c) {
  double tokens = 0, rows = 0, drafted = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    tokens += expected_committed(r[i].acceptance, k[i]);
    rows += k[i] + 1;
    drafted += k[i];
  }
  return tokens / (c.verify_intercept + c.verify_per_row * rows + c.draft_per_token * drafted);
}

// Every K vector in the box, the best rate.
double exhaustive_best(const std::vector<PolicyRequest>& r, const RoundCosts& c) {
  std::vector<int> k(r.size(), 0);
  double best = 0;
  std::function<void(size_t)> go = [&](size_t i) {
    if (i == r.size()) {
      best = std::max(best, round_rate(r, k, c));
      return;
    }
    const int lo = r[i].fixed ? r[i].k_max : 0;
    for (k[i] = lo; k[i] <= r[i].k_max; ++k[i]) go(i + 1);
  };
  go(0);
  return best;
}

// The CPU numbers of docs/benchmarks.md, roughly: a decode step ~15 ms of weight reads, each
// extra row of a batched forward ~4 ms of compute.
const RoundCosts kCpu{0.015, 0.004, 0.0};

TEST(LoadPolicy, OneRequestAloneDraftsWhereTheVerifyForwardIsMemoryBound) {
  const std::vector<PolicyRequest> one = {{0.7, 8, false}};
  const std::vector<int> k = choose_draft_lengths(one, kCpu);
  EXPECT_GE(k[0], 2);
  EXPECT_NEAR(round_rate(one, k, kCpu), exhaustive_best(one, kCpu), 1e-12);
}

TEST(LoadPolicy, SixtyFourRequestsDraftNothingWhereTheVerifyForwardIsComputeBound) {
  const std::vector<PolicyRequest> many(64, PolicyRequest{0.7, 8, false});
  for (int k : choose_draft_lengths(many, kCpu)) EXPECT_EQ(k, 0);
}

TEST(LoadPolicy, ADraftThatIsAlmostAlwaysRightStillPaysUnderLoad) {
  // gain 0.97 per extra row against 64 / (0.015 + 64 * 0.004) = 236 tokens/s: 0.97 / 0.004 = 242.
  const std::vector<PolicyRequest> many(64, PolicyRequest{0.97, 8, false});
  int drafted = 0;
  for (int k : choose_draft_lengths(many, kCpu)) drafted += k;
  EXPECT_GE(drafted, 64);
}

TEST(LoadPolicy, LikelierDraftsGetLongerWindows) {
  std::vector<PolicyRequest> r;
  for (int i = 0; i < 8; ++i) r.push_back({0.3 + 0.08 * i, 8, false});
  const std::vector<int> k = choose_draft_lengths(r, {0.015, 0.0008, 0.0002});
  for (size_t i = 1; i < k.size(); ++i) EXPECT_GE(k[i], k[i - 1]) << "request " << i;
  EXPECT_GT(k.back(), k.front());
}

TEST(LoadPolicy, MatchesTheExhaustiveOptimumOnRandomSmallRounds) {
  for (uint64_t seed = 0; seed < 300; ++seed) {
    auto u = [&](int i) { return philox_uniform(seed, i, RngStream::Token, 0); };
    std::vector<PolicyRequest> r;
    const int n = 1 + static_cast<int>(u(0) * 4);
    for (int i = 0; i < n; ++i) r.push_back({u(10 + i), 1 + static_cast<int>(u(20 + i) * 5), u(30 + i) < 0.2});
    const RoundCosts c{0.02 * u(1), 0.01 * u(2), 0.005 * u(3)};
    const std::vector<int> k = choose_draft_lengths(r, c);
    for (size_t i = 0; i < r.size(); ++i) {
      EXPECT_LE(k[i], r[i].k_max);
      if (r[i].fixed) EXPECT_EQ(k[i], r[i].k_max) << "a fixed request keeps its K";
    }
    EXPECT_NEAR(round_rate(r, k, c), exhaustive_best(r, c), 1e-9 * exhaustive_best(r, c)) << "seed " << seed;
  }
}

TEST(LoadPolicy, ARequestWhoseConfidenceRuleSetsTheLengthDraftsItsCapOrNothing) {
  // Alone, a request at a = 0.6 drafts a couple of tokens; with the rule it drafts its cap.
  std::vector<PolicyRequest> one{{0.6, 6}};
  const int plain = choose_draft_lengths(one, kCpu)[0];
  ASSERT_GT(plain, 0);
  ASSERT_LT(plain, 6);
  one[0].rule_sets_length = true;
  EXPECT_EQ(choose_draft_lengths(one, kCpu)[0], 6);
  // Under a compute-bound load the policy still keeps it from drafting at all.
  std::vector<PolicyRequest> many(64, PolicyRequest{0.6, 6, false, true});
  for (int k : choose_draft_lengths(many, kCpu)) EXPECT_EQ(k, 0);
}

TEST(LoadPolicy, UnknownCostsDraftTheMostAllowed) {
  const std::vector<PolicyRequest> r = {{0.5, 3, false}, {0.2, 6, false}, {0.0, 4, false}};
  const std::vector<int> k = choose_draft_lengths(r, {});
  EXPECT_EQ(k, (std::vector<int>{3, 6, 0}));  // a draft that is never accepted gains nothing
}

TEST(VerifyCostModel, RecoversTheInterceptAndSlopeAndReadsNoSlopeFromOneRowCount) {
  VerifyCostModel m;
  m.observe_verify(10, 0.05);
  m.observe_verify(10, 0.05);
  EXPECT_EQ(m.slope(), 0);
  EXPECT_NEAR(m.intercept(), 0.05, 1e-12);
  for (int64_t t : {1, 5, 64, 320, 17}) m.observe_verify(t, 0.015 + 0.004 * static_cast<double>(t));
  VerifyCostModel clean;
  for (int64_t t : {1, 5, 64, 320, 17}) clean.observe_verify(t, 0.015 + 0.004 * static_cast<double>(t));
  EXPECT_NEAR(clean.intercept(), 0.015, 1e-9);
  EXPECT_NEAR(clean.slope(), 0.004, 1e-12);
  EXPECT_GT(m.slope(), 0.003);
}

TEST(VerifyCostModel, APrefillGivesTheSlopeOnlyUntilTheVerifyForwardsShowTheirOwn) {
  // One request on the 2-core machine: a 40-row prefill at 0.5 ms a row, then verify forwards of
  // one and two rows at 3.4 and 3.65 ms (a row costs 0.25 ms where the weight read dominates).
  VerifyCostModel m;
  m.observe_prefill(40, 0.0034 + 0.0005 * 39);
  m.observe_verify(1, 0.0034);
  ASSERT_TRUE(m.known());
  EXPECT_NEAR(m.slope(), 0.0005, 1e-9);  // early: the prefill's slope
  m.observe_verify(2, 0.00365);
  m.observe_prefill(40, 0.0034 + 0.0005 * 39);  // ignored now
  EXPECT_NEAR(m.slope(), 0.00025, 1e-9);
  EXPECT_NEAR(m.intercept(), 0.00315, 1e-9);
}

TEST(VerifyCostModel, OneSlowForwardAtARareRowCountDoesNotMakeRowsLookExpensiveButALastingChangeMovesTheFit) {
  // Rounds of one and two rows at 3.4 and 3.65 ms (0.25 ms a row), then the request's only
  // 4-row round taking 9.65 ms, as one did on a shared machine. The control: a plain least-squares
  // fit of the same forwards prices a row at ~1 ms.
  VerifyCostModel m;
  ForgettingLinearFit plain(VerifyCostModel::kDecay);
  const auto both = [&](int64_t rows, double seconds) {
    m.observe_verify(rows, seconds);
    plain.observe(static_cast<double>(rows), seconds);
  };
  for (int i = 0; i < 60; ++i) both(1 + i % 2, i % 2 ? 0.00365 : 0.0034);
  EXPECT_NEAR(m.slope(), 0.00025, 1e-9);
  both(4, 0.00965);
  EXPECT_GT(plain.slope(), 0.0009) << "the control: one slow forward moves a plain fit";
  EXPECT_LT(m.slope(), 0.0005);
  // Every forward twice as slow from now on: the fit follows within the forgetting window.
  for (int i = 0; i < 250; ++i) m.observe_verify(1 + i % 2, i % 2 ? 0.0073 : 0.0068);
  EXPECT_NEAR(m.intercept() + m.slope(), 0.0068, 0.0003);
  EXPECT_NEAR(m.slope(), 0.0005, 0.0002);
}

TEST(VerifyCostModel, IsStaleAfterManyForwardsOfOneRowCountAndFreshAfterAnother) {
  // One- and two-row rounds give a slope; then only one-row rounds (every request at K = 0),
  // which cannot move it: stale from the kStale-th on, fresh again at the next two-row round.
  VerifyCostModel m;
  EXPECT_FALSE(m.stale()) << "no slope yet";
  for (int i = 0; i < 10; ++i) m.observe_verify(1 + i % 2, i % 2 ? 0.0040 : 0.0034);
  ASSERT_TRUE(m.known());
  EXPECT_FALSE(m.stale());
  for (int i = 1; i < VerifyCostModel::kStale; ++i) {
    m.observe_verify(1, 0.0034);
    EXPECT_FALSE(m.stale()) << i << " one-row forwards in a row (the last two-row one before them)";
  }
  m.observe_verify(1, 0.0034);
  EXPECT_TRUE(m.stale());
  m.observe_verify(2, 0.0037);
  EXPECT_FALSE(m.stale());
}

}  // namespace
}  // namespace specula::actors
