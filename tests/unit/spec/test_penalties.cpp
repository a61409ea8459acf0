// Penalties and logit bias (spec/penalties.h): the definitions on hand-worked values, the rows of
// a round against one-row adjustments, the raw values put back, and the settings' checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "spec/drafter.h"
#include "spec/grammar.h"
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

// What validate(100) says of the settings `change` makes: its message, or "accepted".
template <class Change>
std::string refusal(Change change) {
  SamplingParams sp;
  change(sp);
  try {
    sp.validate(100);
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
  return std::string("accepted");
}

TEST(Penalties, OutOfRangeSettingsAreRefusedWithTheFieldsName) {
  EXPECT_NE(refusal([](SamplingParams& s) { s.presence_penalty = 2.5f; }).find("presence_penalty must be in [-2, 2]"), std::string::npos);
  EXPECT_NE(refusal([](SamplingParams& s) { s.frequency_penalty = -3.0f; }).find("frequency_penalty"), std::string::npos);
  EXPECT_NE(refusal([](SamplingParams& s) { s.repetition_penalty = 0.0f; }).find("repetition_penalty must be in (0, 2]"),
            std::string::npos);
  EXPECT_NE(refusal([](SamplingParams& s) { s.logit_bias = {{100, 1.0f}}; }).find("outside the vocabulary of 100"),
            std::string::npos);
  EXPECT_NE(refusal([](SamplingParams& s) { s.logit_bias = {{-1, 1.0f}}; }).find("negative"), std::string::npos);
  EXPECT_NE(refusal([](SamplingParams& s) { s.logit_bias = {{5, 101.0f}}; }).find("[-100, 100]"), std::string::npos);
  EXPECT_NE(refusal([](SamplingParams& s) { s.min_tokens = -1; }).find("min_tokens must be >= 0"), std::string::npos);
  EXPECT_EQ(refusal([](SamplingParams& s) { s.logit_bias = {{99, -100.0f}}; s.presence_penalty = -2.0f; }), "accepted");
}


// vLLM's allowed_token_ids and bad_words against an oracle written from their definition: in
// every row of a round (the row after the output and the round's first i drafts), -inf for a
// token outside the allowed set and for a bad word's last token where that history ends with the
// word's other tokens, and the row as it was where that would leave no token; the masks after a
// grammar's (the emptiness judged on the row the grammar left) and after the penalties'. The rows
// come back raw, and refuses() names the tokens the one-row masks take out.
TEST(TokenLists, EveryRowOfARoundIsMaskedAsTheDefinitionSaysAfterItsHistoryAndRestoreGivesBackTheRawRows) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const std::vector<std::string> pieces = {"a", "b", "c", "d", "1", "2", ",", " ", "{", "}", "[", "]", ":", "x", "y", "z"};
  constexpr int64_t V = 16;
  const auto matcher = std::make_shared<const GrammarMatcher>(Grammar::parse(R"(root ::= ("a" | "b" | "c" "d" | "1" | " ")+)"),
                                                              std::make_shared<const TokenTrie>(pieces));
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> any(0, V - 1), few(0, 4);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  int emptied = 0, masked_rows = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    SamplingParams sp;
    if (trial % 3 != 0) {  // a few tokens, or most
      const int n = trial % 2 ? 1 + few(rng) : 10 + few(rng);
      for (int j = 0; j < n; ++j) sp.allowed_token_ids.push_back(trial % 2 ? few(rng) : any(rng));
    }
    const int words = trial % 3 == 0 ? 1 + few(rng) : few(rng);
    for (int w = 0; w < words; ++w) {
      std::vector<int32_t> word(static_cast<size_t>(1 + few(rng) % 3));
      for (int32_t& t : word) t = few(rng);
      sp.bad_words.push_back(word);
    }
    if (trial % 5 == 0) sp.grammar = matcher;
    if (trial % 7 == 0) sp.presence_penalty = 0.5f;
    std::vector<int32_t> output(static_cast<size_t>(trial % 6)), draft(static_cast<size_t>(trial % 5));
    for (int32_t& t : output) t = few(rng);
    for (int32_t& t : draft) t = few(rng);
    if (sp.grammar)  // a history the grammar allows, so that its rows are masked rows
      for (auto* seq : {&output, &draft})
        for (int32_t& t : *seq) t = std::vector<int32_t>{0, 1, 4, 7}[static_cast<size_t>(t) % 4];
    const int n = 1 + static_cast<int>(draft.size());
    std::vector<float> rows(static_cast<size_t>(n * V));
    for (float& x : rows) x = trial % 4 == 0 && any(rng) < 6 ? kNegInf : logit(rng);
    const std::vector<float> raw = rows;
    PenaltyHistory h(sp, {}, V);
    for (int32_t t : output) h.push(t);
    PenaltyHistory::Undo undo;
    h.apply(rows, draft, undo);
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> history = output;
      history.insert(history.end(), draft.begin(), draft.begin() + i);
      // The row before the lists: the same settings without them, after the same history.
      SamplingParams before = sp;
      before.allowed_token_ids.clear();
      before.bad_words.clear();
      std::vector<float> want(raw.begin() + i * V, raw.begin() + (i + 1) * V);
      PenaltyHistory other(before, {}, V);
      for (int32_t t : history) other.push(t);
      other.apply(want, {});
      std::vector<bool> out(V, false);
      for (int32_t v = 0; v < V; ++v)
        out[static_cast<size_t>(v)] = !sp.allowed_token_ids.empty() &&
                                      std::find(sp.allowed_token_ids.begin(), sp.allowed_token_ids.end(), v) == sp.allowed_token_ids.end();
      for (const auto& w : sp.bad_words) {
        const size_t k = w.size() - 1;
        if (k <= history.size() && std::equal(w.begin(), w.end() - 1, history.end() - static_cast<std::ptrdiff_t>(k)))
          out[static_cast<size_t>(w.back())] = true;
      }
      bool left = false;
      for (int32_t v = 0; v < V; ++v) left = left || (!out[static_cast<size_t>(v)] && want[static_cast<size_t>(v)] != kNegInf);
      if (left) {
        for (int32_t v = 0; v < V; ++v)
          if (out[static_cast<size_t>(v)]) want[static_cast<size_t>(v)] = kNegInf;
        ++masked_rows;
      } else {
        ++emptied;
      }
      ASSERT_EQ(std::memcmp(want.data(), rows.data() + i * V, V * sizeof(float)), 0) << "trial " << trial << ", row " << i;
      PenaltyHistory after(sp, {}, V);  // the one-row history of row i: refuses() names what its masks took out
      for (int32_t t : history) after.push(t);
      for (int32_t v = 0; v < V; ++v)
        ASSERT_EQ(after.refuses(v), out[static_cast<size_t>(v)]) << "trial " << trial << ", row " << i << ", token " << v;
    }
    PenaltyHistory::restore(rows, undo);
    ASSERT_EQ(std::memcmp(rows.data(), raw.data(), rows.size() * sizeof(float)), 0) << "trial " << trial;
  }
  // Both branches taken many times.
  EXPECT_GT(emptied, 50);
  EXPECT_GT(masked_rows, 3000);
}

// Where the lists would leave no token the row is left as it was, and whatever is drawn there is a
// token they refuse (the sampler ends the request with an error then).
TEST(TokenLists, ARowTheyWouldLeaveEmptyIsLeftAsItWasAndEveryTokenIsRefusedThere) {
  SamplingParams sp;
  sp.allowed_token_ids = {2};
  sp.bad_words = {{2, 2}};
  PenaltyHistory h(sp, {}, 4);
  std::vector<float> row{1.0f, 2.0f, 3.0f, 4.0f};
  h.apply(row, {});
  EXPECT_EQ(row, (std::vector<float>{-std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), 3.0f,
                                     -std::numeric_limits<float>::infinity()}));
  EXPECT_FALSE(h.refuses(2));
  EXPECT_TRUE(h.refuses(1));
  h.push(2);
  row = {1.0f, 2.0f, 3.0f, 4.0f};
  h.apply(row, {});
  EXPECT_EQ(row, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
  for (int32_t v = 0; v < 4; ++v) EXPECT_TRUE(h.refuses(v)) << v;
  EXPECT_FALSE(h.constraint_keeps(2));
  h.pop(2);
  EXPECT_FALSE(h.refuses(2));
}

TEST(TokenLists, BadSettingsAreRefusedWithTheFieldsName) {
  EXPECT_EQ(refusal([](SamplingParams& s) { s.allowed_token_ids = {100}; }),
            "allowed_token_ids: token id 100 is outside the vocabulary of 100");
  EXPECT_EQ(refusal([](SamplingParams& s) { s.allowed_token_ids = {-3}; }), "allowed_token_ids: token id -3 is negative");
  EXPECT_EQ(refusal([](SamplingParams& s) { s.bad_words = {{1, 100}}; }), "bad_words: token id 100 is outside the vocabulary of 100");
  EXPECT_EQ(refusal([](SamplingParams& s) { s.bad_words = {{}}; }), "bad_words: a token sequence is empty");
  EXPECT_EQ(refusal([](SamplingParams& s) { s.bad_words.assign(kMaxBadWords + 1, {1}); }),
            "bad_words: at most 128 token sequences, got 129");
  EXPECT_EQ(refusal([](SamplingParams& s) { s.bad_words.assign(2, std::vector<int32_t>(kMaxBadWordTokens / 2 + 1, 1)); }),
            "bad_words: at most 1024 tokens in all, got 1026");
  EXPECT_EQ(refusal([](SamplingParams& s) { s.allowed_token_ids = {4, 5}; s.bad_words = {{5}, {4}}; }),
            "bad_words: every token of allowed_token_ids is a one-token bad word, so no token may be generated");
  EXPECT_EQ(refusal([](SamplingParams& s) { s.allowed_token_ids = {4, 5}; s.bad_words = {{5}, {3, 4}}; }), "accepted");
}

// vLLM's tokenization of bad_words, on the default model's tokenizer: the word without its leading
// whitespace, then " word" where that is as many tokens and starts with another one.
TEST(TokenLists, BadWordsAreTheWordAndTheWordAfterASpaceWhereThatIsAsManyTokensAsVllmTokenizesThem) {
  const char* cache = std::getenv("SPECULA_CACHE");
  const auto path = std::filesystem::path(cache && *cache ? cache : "/root/.cache/specula") / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "the default model is missing at " << path << "; scripts/setup.sh fetches it";
  const GgufFile file(path.string());
  const auto tok = Tokenizer::from_gguf(file);
  const auto id = [&](const char* piece) { return tok->token_id(piece); };  // "\xc4\xa0" is the byte-level space
  ASSERT_GE(id("Paris"), 0);
  ASSERT_GE(id("\xc4\xa0Paris"), 0);
  // (leading whitespace as Python's lstrip() sees it: U+00A0 and U+3000 too)
  const std::vector<std::string> words = {"Paris", "  Paris", "2024", "\xc2\xa0\xe3\x80\x80Paris"};
  const auto ids = bad_words_token_ids(*tok, words);
  const std::vector<int32_t> paris{id("Paris")}, spaced{id("\xc4\xa0Paris")};
  // "2024" is four digit tokens; " 2024" five (the space its own piece): only the first.
  const std::vector<int32_t> digits{id("2"), id("0"), id("2"), id("4")};
  EXPECT_EQ(ids, (std::vector<std::vector<int32_t>>{paris, spaced, paris, spaced, digits, paris, spaced}));
  EXPECT_THROW(bad_words_token_ids(*tok, std::vector<std::string>{"ok", " \t "}), std::invalid_argument);
  EXPECT_THROW(bad_words_token_ids(*tok, std::vector<std::string>{"\xe2\x80\x83\x1f"}), std::invalid_argument);
}

}  // namespace
}  // namespace specula
