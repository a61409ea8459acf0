// One round boundary's growth of the KV reservations (actors/scheduler.h, plan_growth): who grows,
// who is preempted, who waits, when requests reserve their blocks as they grow.
#include <gtest/gtest.h>

#include <vector>

#include "actors/scheduler.h"

namespace specula::actors {
namespace {

using Order = std::vector<GrowthCandidate>;
using Indices = std::vector<size_t>;

TEST(KvGrowth, WithRoomForEveryNextRoundEveryRequestGrowsAndNoneIsPreempted) {
  const Order order = {{4, 1, false}, {3, 0, false}, {5, 2, false}};
  const GrowthPlan plan = plan_growth(order, 12, 15);
  EXPECT_EQ(plan.grown, (Indices{0, 2}));
  EXPECT_TRUE(plan.sit_out.empty());
  EXPECT_EQ(plan.kept, 3u);
}

TEST(KvGrowth, AShortRequestPreemptsTheLatestAdmittedFirstAndOnlyAsManyAsItNeeds) {
  // 20 of 20 reserved; the first needs 2 more: the last (3 blocks) is enough, the third stays, and
  // the second grows in what is left.
  const Order order = {{8, 2, false}, {6, 1, false}, {3, 0, false}, {3, 0, false}};
  const GrowthPlan plan = plan_growth(order, 20, 20);
  EXPECT_EQ(plan.kept, 3u);
  EXPECT_EQ(plan.grown, (Indices{0, 1}));
  // Needing 4, the first takes the last and then the third.
  Order more = order;
  more[0].more = 4;
  const GrowthPlan two = plan_growth(more, 20, 20);
  EXPECT_EQ(two.kept, 2u);
  EXPECT_EQ(two.grown, (Indices{0, 1}));
}

TEST(KvGrowth, TheLatestRequestLeftThatIsShortIsPreemptedItselfAndTheEarlierOnesGoOn) {
  // The second needs 3 more and only the third is after it: both go.
  const Order order = {{8, 0, false}, {6, 3, false}, {1, 0, false}};
  const GrowthPlan plan = plan_growth(order, 15, 16);
  EXPECT_EQ(plan.kept, 1u);
  EXPECT_TRUE(plan.grown.empty());
  EXPECT_TRUE(plan.sit_out.empty());
}

TEST(KvGrowth, AShortRequestWhoseBlocksALaterRoundInFlightHoldsWaitsInsteadOfBeingPreempted) {
  // With pipelining a later request's round may be in flight; the first is short even with the
  // later one between rounds preempted, so it waits for the next boundary (where the one in flight
  // can be preempted instead) and nobody is preempted now; the later one between rounds grows.
  const Order order = {{6, 4, true}, {2, 1, true}};
  const GrowthPlan plan = plan_growth(order, 19, 20);
  EXPECT_EQ(plan.sit_out, (Indices{0}));
  EXPECT_EQ(plan.grown, (Indices{1}));
  EXPECT_EQ(plan.kept, 2u);
  // Without a later round in flight the same request is preempted, and the later one with it.
  const GrowthPlan alone = plan_growth({{6, 4, false}, {2, 1, false}}, 19, 20);
  EXPECT_EQ(alone.kept, 0u);
  EXPECT_TRUE(alone.sit_out.empty());
}

TEST(KvGrowth, AShortRequestThatPreemptingLaterOnesBetweenRoundsSatisfiesGrowsThoughAnotherRoundIsInFlight) {
  const Order order = {{6, 2, true}, {3, 0, false}};
  const GrowthPlan plan = plan_growth(order, 20, 20);
  EXPECT_EQ(plan.grown, (Indices{0}));
  EXPECT_TRUE(plan.sit_out.empty());
  EXPECT_EQ(plan.kept, 1u);
}

}  // namespace
}  // namespace specula::actors
