// spec/round.h: the one stop rule and the one table of finish-reason names.
#include "spec/round.h"

#include <gtest/gtest.h>

#include <vector>

#include "spec/speculative_generate.h"

namespace specula {
namespace {

TEST(FinishRule, AStopTokenEndsTheRequestBeforeTheLengthAndContextLimits) {
  const std::vector<int32_t> stops = {2, 7};
  const FinishRule rule{stops, 5, 100};
  EXPECT_EQ(rule.after(7, 5, 99, false), FinishReason::Stop);   // also at max_tokens and the context's end
  EXPECT_EQ(rule.after(3, 1, 10, true), FinishReason::Stop);    // a completed stop string
  EXPECT_EQ(rule.after(3, 4, 10), FinishReason::None);
}

TEST(FinishRule, MaxTokensEndsTheRequestBeforeTheContext) {
  const FinishRule rule{{}, 5, 100};
  EXPECT_EQ(rule.after(3, 5, 99), FinishReason::Length);
  EXPECT_EQ(rule.after(3, 6, 10), FinishReason::Length);
}

TEST(FinishRule, TheContextEndsTheRequestAtTheLastPositionThatFits) {
  const FinishRule rule{{}, 1000, 100};
  EXPECT_EQ(rule.after(3, 10, 98), FinishReason::None);
  EXPECT_EQ(rule.after(3, 10, 99), FinishReason::Context);
  const FinishRule unlimited{{}, 1000, 0};
  EXPECT_EQ(unlimited.after(3, 10, 1'000'000), FinishReason::None);
}

TEST(FinishReasonNames, AreTheProtocolsSpellingsAndNoneIsEmpty) {
  EXPECT_EQ(finish_reason_name(FinishReason::Stop), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::Length), "length");
  EXPECT_EQ(finish_reason_name(FinishReason::Context), "context");
  EXPECT_EQ(finish_reason_name(FinishReason::Cancelled), "cancelled");
  EXPECT_EQ(finish_reason_name(FinishReason::None), "");
}

TEST(RoundStatistics, CountJudgedDraftsPerPositionAndTheSecondHalfOfASplitRoundAtItsOffset) {
  SpeculativeStats st;
  st.count_judged(0, 4, 2);  // four drafted, two accepted: a rejection at position 3
  st.count_judged(0, 3, 3);  // all three accepted
  st.count_judged(3, 1, 1);  // the pipeline judged position 4 of that round on its own
  EXPECT_EQ(st.drafted, 8);
  EXPECT_EQ(st.accepted, 6);
  EXPECT_EQ(st.rejected, 1);
  EXPECT_EQ(st.drafted_at[0], 2);
  EXPECT_EQ(st.accepted_at[0], 2);
  EXPECT_EQ(st.drafted_at[2], 2);
  EXPECT_EQ(st.accepted_at[2], 1);
  EXPECT_EQ(st.drafted_at[3], 2);
  EXPECT_EQ(st.accepted_at[3], 1);
}

}  // namespace
}  // namespace specula
