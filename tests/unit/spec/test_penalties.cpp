// Penalties and logit bias (spec/penalties.h): the definitions on hand-worked values, the rows of
// a round against one-row adjustments, the raw values put back, and the settings' checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "spec/drafter.h"
#include "spec/penalties.h"

namespace specula {
namespace {

// Every value below is exact in float, so the expectations are the definition's own numbers.
TEST(Penalties, EachTokensLogitIsBiasedThenRepetitionThenFrequencyThenPresenceAsVllmDefinesThem) {
  SamplingParams sp;
  sp.repetition_penalty = 2.0f;
  sp.frequency_penalty = 0.5f;
  sp.presence_penalty = 0.25f;
  sp.logit_bias = {{4, 2.5f}, {3, -1.0f}};
  const std::vector<int32_t> prompt{1, 2, 6};
  PenaltyHistory h(sp, prompt, 8);
  ASSERT_TRUE(h.active());
  for (int32_t t : {2, 3, 3}) h.push(t);
  std::vector<float> row{1.0f, 2.0f, -1.0f, 3.0f, 0.5f, -2.0f, 0.0f, 4.0f};
  PenaltyHistory::Undo undo;
  h.apply(row, {}, undo);
  EXPECT_EQ(row[0], 1.0f);     // untouched
  EXPECT_EQ(row[1], 1.0f);     // in the prompt: 2 / 2
  EXPECT_EQ(row[2], -2.75f);   // prompt and output once: -1 * 2 - 0.5 - 0.25
  EXPECT_EQ(row[3], -0.25f);   // bias -1, output twice: (3 - 1) / 2 - 0.5 * 2 - 0.25
  EXPECT_EQ(row[4], 3.0f);     // bias only: 0.5 + 2.5
  EXPECT_EQ(row[5], -2.0f);    // untouched
  EXPECT_EQ(row[6], 0.0f);     // in the prompt at 0: 0 * 2
  EXPECT_EQ(row[7], 4.0f);     // untouched
}

TEST(Penalties, WithoutRepetitionThePromptsTokensAreLeftAlone) {
  SamplingParams sp;
  sp.presence_penalty = 1.0f;
  const std::vector<int32_t> prompt{0, 1};
  PenaltyHistory h(sp, prompt, 4);
  h.push(1);
  std::vector<float> row{2.0f, 2.0f, 2.0f, 2.0f};
  PenaltyHistory::Undo undo;
  h.apply(row, {}, undo);
  EXPECT_EQ(row, (std::vector<float>{2.0f, 1.0f, 2.0f, 2.0f}));
}

TEST(Penalties, NeutralSettingsAreInactiveAndChangeNoRow) {
  const SamplingParams sp;
  EXPECT_FALSE(sp.penalized());
  PenaltyHistory h(sp, std::vector<int32_t>{1, 2}, 4);
  EXPECT_FALSE(h.active());
  h.push(2);
  std::vector<float> row{1.0f, -1.0f, 3.0f, 0.5f};
  const std::vector<float> raw = row;
  PenaltyHistory::Undo undo;
  h.apply(row, {}, undo);
  EXPECT_EQ(row, raw);
  EXPECT_TRUE(undo.saved.empty());
}

// Row i of a round is adjusted as a one-row call after the round's drafts t1..ti were pushed, bit
// for bit; the history is unchanged by the call; restore puts back every raw bit. Random rows,
// histories and drafts (repeats inside the draft, tokens new to the history, prompt tokens).
TEST(Penalties, RowIOfARoundEqualsTheOneRowAdjustmentAfterTheRoundsFirstIDraftsAndRestoreGivesBackTheRawRows) {
  std::mt19937 rng(11);
  constexpr int64_t V = 64;
  std::uniform_int_distribution<int32_t> token(0, V - 1);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  for (int trial = 0; trial < 200; ++trial) {
    SamplingParams sp;
    sp.presence_penalty = std::uniform_real_distribution<float>(-2, 2)(rng);
    sp.frequency_penalty = std::uniform_real_distribution<float>(-2, 2)(rng);
    sp.repetition_penalty = trial % 3 == 0 ? 1.0f : std::uniform_real_distribution<float>(0.5f, 2.0f)(rng);
    if (trial % 2) sp.logit_bias = {{token(rng), 3.0f}, {token(rng), -7.5f}};
    std::vector<int32_t> prompt(static_cast<size_t>(trial % 7));
    for (int32_t& t : prompt) t = token(rng);
    std::vector<int32_t> output(static_cast<size_t>(trial % 11));
    for (int32_t& t : output) t = token(rng);
    const int n = 1 + trial % 7;
    std::vector<int32_t> draft(static_cast<size_t>(n - 1 + trial % 2));  // k or k - 1 entries for n rows
    for (int32_t& t : draft) t = trial % 4 == 0 && !output.empty() ? output[static_cast<size_t>(token(rng)) % output.size()] : token(rng);
    std::vector<float> rows(static_cast<size_t>(n * V));
    for (float& x : rows) x = logit(rng);
    const std::vector<float> raw = rows;

    PenaltyHistory h(sp, prompt, V);
    for (int32_t t : output) h.push(t);
    PenaltyHistory::Undo undo;
    h.apply(rows, draft, undo);
    for (int i = 0; i < n; ++i) {
      PenaltyHistory one(sp, prompt, V);
      for (int32_t t : output) one.push(t);
      for (int j = 0; j < i; ++j) one.push(draft[static_cast<size_t>(j)]);
      std::vector<float> row(raw.begin() + i * V, raw.begin() + (i + 1) * V);
      PenaltyHistory::Undo u;
      one.apply(row, {}, u);
      ASSERT_EQ(std::memcmp(row.data(), rows.data() + i * V, V * sizeof(float)), 0) << "trial " << trial << ", row " << i;
    }
    // The call left the history as it was: a one-row call now gives the round's first row.
    std::vector<float> first(raw.begin(), raw.begin() + V);
    PenaltyHistory::Undo u;
    h.apply(first, {}, u);
    ASSERT_EQ(std::memcmp(first.data(), rows.data(), V * sizeof(float)), 0) << "trial " << trial;
    PenaltyHistory::restore(rows, undo);
    ASSERT_EQ(std::memcmp(rows.data(), raw.data(), rows.size() * sizeof(float)), 0) << "trial " << trial;
  }
}

TEST(Penalties, PenalizedRowsPutTheRawValuesBackWhenTheyGoOutOfScope) {
  SamplingParams sp;
  sp.frequency_penalty = 1.0f;
  PenaltyHistory h(sp, {}, 4);
  h.push(0);
  std::vector<float> rows{1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  const std::vector<int32_t> draft{0};
  {
    const PenalizedRows adjusted(&h, rows, draft);
    EXPECT_EQ(rows, (std::vector<float>{0.0f, 1.0f, 1.0f, 1.0f, -1.0f, 1.0f, 1.0f, 1.0f}));
  }
  EXPECT_EQ(rows, std::vector<float>(8, 1.0f));
}

// A drafter's history follows the contexts it is handed, growing, cut back and diverging, plus the
// round's drafts: at every step each token's adjustment is a fresh history's for that output.
TEST(Penalties, ADraftersHistoryFollowsItsContextsAndTheRoundsDraftsAsAFreshOneWould) {
  constexpr int64_t V = 12;
  SamplingParams sp;
  sp.presence_penalty = 0.5f;
  sp.frequency_penalty = 0.25f;
  sp.repetition_penalty = 1.5f;
  sp.logit_bias = {{11, -1.0f}};
  const std::vector<std::vector<int32_t>> contexts = {
      {1, 2, 3, 5, 5, 7}, {1, 2, 3, 5, 5, 7, 9, 9}, {1, 2, 3, 5, 6}, {1, 2, 3}, {1, 2, 3, 8, 8, 8, 8}};
  DraftPenalties drafter;
  for (const auto& context : contexts) {
    DraftRequest req;
    req.context = context;
    req.prompt_tokens = 3;
    req.sampling = sp;
    PenaltyHistory* h = drafter.sync(req, V);
    ASSERT_NE(h, nullptr);
    std::vector<int32_t> output(context.begin() + 3, context.end());
    for (int32_t draft : {4, 5, 4}) {
      drafter.push_draft(draft);
      output.push_back(draft);
      PenaltyHistory fresh(sp, std::vector<int32_t>{1, 2, 3}, V);
      for (int32_t t : output) fresh.push(t);
      for (int32_t v = 0; v < V; ++v)
        for (float x : {-2.0f, 0.5f, 3.0f})
          ASSERT_EQ(h->adjusted(x, v), fresh.adjusted(x, v)) << "token " << v << " after " << output.size() << " tokens";
      std::vector<int32_t> a(h->touched().begin(), h->touched().end()), b(fresh.touched().begin(), fresh.touched().end());
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      ASSERT_EQ(a, b);
    }
  }
  DraftRequest plain;
  plain.context = contexts[0];
  EXPECT_EQ(drafter.sync(plain, V), nullptr) << "a request without penalties has nothing to apply";
}

// min_tokens: the stop tokens are -inf while fewer than min_tokens tokens are out, row by row in a
// round (row i has the output plus i drafts), and untouched from then on.
TEST(Penalties, MinTokensHoldsTheStopTokensAtMinusInfinityUntilThatManyTokensAreOut) {
  SamplingParams sp;
  sp.min_tokens = 3;
  const std::vector<int32_t> stops{2, 5};
  PenaltyHistory h(sp, {}, 6, stops);
  ASSERT_TRUE(h.active());
  h.push(1);  // one token out
  std::vector<float> rows(4 * 6, 1.5f);
  const std::vector<int32_t> draft{0, 4, 4};
  PenaltyHistory::Undo undo;
  h.apply(rows, draft, undo);
  const float inf = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 4; ++i)
    for (int v = 0; v < 6; ++v) {
      const bool held = (v == 2 || v == 5) && 1 + i < 3;
      EXPECT_EQ(rows[static_cast<size_t>(i * 6 + v)], held ? -inf : 1.5f) << "row " << i << ", token " << v;
    }
  PenaltyHistory::restore(rows, undo);
  EXPECT_EQ(rows, std::vector<float>(24, 1.5f));
  h.push(3);
  h.push(3);
  EXPECT_EQ(h.adjusted(1.5f, 2), 1.5f) << "three tokens are out";
  h.pop(3);
  EXPECT_EQ(h.adjusted(1.5f, 2), -inf) << "back to two";
}

TEST(Penalties, OutOfRangeSettingsAreRefusedWithTheFieldsName) {
  auto message = [](auto change) {
    SamplingParams sp;
    change(sp);
    try {
      sp.validate(100);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message([](SamplingParams& s) { s.presence_penalty = 2.5f; }).find("presence_penalty must be in [-2, 2]"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& s) { s.frequency_penalty = -3.0f; }).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& s) { s.repetition_penalty = 0.0f; }).find("repetition_penalty must be in (0, 2]"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& s) { s.logit_bias = {{100, 1.0f}}; }).find("outside the vocabulary of 100"),
            std::string::npos);
  EXPECT_NE(message([](SamplingParams& s) { s.logit_bias = {{-1, 1.0f}}; }).find("negative"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& s) { s.logit_bias = {{5, 101.0f}}; }).find("[-100, 100]"), std::string::npos);
  EXPECT_NE(message([](SamplingParams& s) { s.min_tokens = -1; }).find("min_tokens must be >= 0"), std::string::npos);
  EXPECT_EQ(message([](SamplingParams& s) { s.logit_bias = {{99, -100.0f}}; s.presence_penalty = -2.0f; }), "accepted");
}

}  // namespace
}  // namespace specula
