// Presence, frequency and repetition penalties and logit bias: changes to a row's raw logits that
// read the request's own tokens, made before the transform (spec/sampling.h), so that greedy,
// exact, coupled and block judging and target-only sampling all see the same adjusted row.
//
// The definitions are vLLM's, in its order, for each token v of a row:
//   x_v += bias_v                                    (logit_bias)
//   x_v = x_v > 0 ? x_v / r : x_v * r                (repetition r, if v is in the prompt or the output)
//   x_v -= f * c_v                                   (frequency f, c_v = v's count in the output)
//   x_v -= p                                         (presence p, if c_v > 0)
// each a float operation in that order; and while fewer than min_tokens tokens are out, x_v = -inf
// for the request's stop tokens (vLLM's min_tokens). Then, in JSON mode, x_v = -inf for every token
// that would not keep the output a prefix of one JSON object (spec/json_mode.h); once the object is
// closed, for all but whitespace and the stop tokens. A grammar (spec/grammar.h) masks the same way.
// Last, vLLM's allowed_token_ids and bad_words: x_v = -inf for every token outside the allowed set,
// and for the last token of each bad word whose other tokens end the output (the masks commute;
// last, because a row they would leave with no token is left as the grammar left it: a token drawn
// there is one they refuse, refuses(), and the request ends with an error). A drafter's own rows may leave these masks out
// (a proposal outside them is rejected like any token the target gives p = 0); the drafters apply
// them (constraint_keeps) to be accepted more. "The output" is what the request generated before the
// row's position: in a verify round, row i's output is the committed output plus the round's draft
// tokens t1..ti, the text that row is the target's distribution after. A row judged only when
// t1..ti were all accepted therefore sees exactly the output target-only sampling would have had
// there, which is what keeps speculation exact with penalties (docs/speculative.md, "Penalties").
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "spec/grammar.h"
#include "spec/json_mode.h"
#include "spec/sampling.h"

namespace specula {

class Tokenizer;  // model/tokenizer.h

// The error that ends a request whose allowed_token_ids and bad_words leave no token to draw.
inline constexpr const char* kListsLeaveNoToken =
    "allowed_token_ids and bad_words leave no token that may follow the text so far (with the request's other constraints)";

// vLLM's bad_words as token sequences: each word with its leading whitespace stripped, as the
// tokenizer writes it, then with one space in front where that is as many tokens and starts with
// a different one (the word inside a text). Throws std::invalid_argument naming a word that is
// empty or only whitespace.
std::vector<std::vector<int32_t>> bad_words_token_ids(const Tokenizer& tokenizer, std::span<const std::string> words);

// vLLM's allowed_token_ids and bad_words (words, tokenized by bad_words_token_ids) into `sp`,
// checked as every front end checks them: at most kMaxBadWords words and a tokenizer for them,
// vLLM's limits once tokenized, every token inside a vocabulary of `vocab`, and some token left at
// the first position. Throws std::invalid_argument whose message starts with the field at fault
// ("allowed_token_ids" or "bad_words").
void set_token_lists(SamplingParams& sp, std::vector<int32_t> allowed, std::span<const std::string> words,
                     const Tokenizer* tokenizer, int64_t vocab);

class PenaltyHistory {
 public:
  // `prompt`: the request's prompt tokens (read by the repetition penalty only). Tokens outside
  // [0, vocab) are ignored there; logit_bias must name tokens inside it (SamplingParams::validate).
  // `stop_ids`: the request's stop tokens, held at -inf until min_tokens tokens are out.
  PenaltyHistory(const SamplingParams& sp, std::span<const int32_t> prompt, int64_t vocab,
                 std::span<const int32_t> stop_ids = {});

  // The request asks for any adjustment at all.
  bool active() const { return active_; }
  int64_t vocab() const { return vocab_; }

  // One more output token; pop takes one pushed token out again.
  void push(int32_t token);
  void pop(int32_t token);

  // The tokens whose logits change, and one token's adjusted logit with the history as it stands
  // (a drafter adjusting a few entries of its own row: spec/drafter.h, DraftPenalties).
  std::span<const int32_t> touched() const { return touched_; }
  // JSON mode, a grammar, allowed_token_ids or bad_words constrains the output; whether they keep
  // token v after the history as it stands (a drafter masking the few tokens it can propose).
  bool constrained() const { return json_ != nullptr || grammar_ != nullptr || lists_; }
  // The output has met its grammar's limits (GrammarMatcher::kOverLimit): it cannot go on.
  bool over_limit() const {
    return grammar_ && !grammar_states_.empty() && grammar_states_.back() == GrammarMatcher::kOverLimit;
  }
  // The grammar has ended after the output: nothing but a stop token may follow.
  bool constraint_complete() const { return grammar_ && !grammar_states_.empty() && grammar_->complete(grammar_states_.back()); }
  bool constraint_keeps(int32_t v) const {
    if (refuses(v)) return false;
    if (grammar_) return grammar_->keeps(grammar_states_.back(), v, stop_ids_, length_ >= min_tokens_);
    if (json_) return json_->keeps(json_states_.back(), v, stop_ids_, length_ >= min_tokens_);
    return true;
  }
  // allowed_token_ids leaves v out, or a bad word ends with it after the history as it stands:
  // drawn only from a row those lists would have left with no token (the request cannot go on).
  bool refuses(int32_t v) const {
    if (!lists_) return false;
    if (v < 0 || v >= vocab_) return true;
    const uint8_t f = flags_[static_cast<size_t>(v)];
    return (!allowed_.empty() && !(f & kAllowedFlag)) || (f & kBannedFlag);
  }
  float adjusted(float x, int32_t v) const { return adjusted(x, v, count_[static_cast<size_t>(v)], length_); }
  // The settings, prompt and stop tokens this history was made for.
  bool made_for(const SamplingParams& sp, std::span<const int32_t> prompt, std::span<const int32_t> stop_ids) const;

  // The entries apply() changed, to put back with restore().
  struct Undo {
    std::vector<std::pair<size_t, float>> saved;  // index into the rows, raw value
    // JSON mode, a grammar and allowed_token_ids mask most of a row: the rows as they were before
    // each, whole (after the entries above were changed, so put back first, last to first).
    // rows_at[k]: where row k of `rows` starts.
    std::vector<float> rows;
    std::vector<size_t> rows_at;
    void clear();  // forgets them (rows that will not be read again); `rows`' memory is kept for the thread's next
  };

  // Adjusts rows [n, vocab] in place: row i as after draft[0..i-1] on top of the output so far
  // (draft holds at least n - 1 tokens; entries past n - 1 are not read). Appends what it
  // changed to `undo`.
  void apply(std::span<float> rows, std::span<const int32_t> draft, Undo& undo);
  // The same for rows the caller will not read raw again (nothing kept to put back).
  void apply(std::span<float> rows, std::span<const int32_t> draft);
  static void restore(std::span<float> rows, Undo& undo);

  // The adjusted value of one logit x of token v given its output count and the output's length
  // (the definition above; -inf for a stop token while length < min_tokens).
  float adjusted(float x, int32_t v, int32_t count, int64_t length) const;

 private:
  static constexpr uint8_t kAllowedFlag = 16, kBannedFlag = 32;  // flags_: in allowed_token_ids; banned now
  void touch(int32_t v);
  // The bad words' last tokens banned after the output followed by `extra` (sorted, unique).
  void banned_after(std::span<const int32_t> extra, std::vector<int32_t>& out) const;
  // kBannedFlag on the tokens banned after the output as it stands, and on no other.
  void refresh_banned();
  // allowed_token_ids and bad_words on one row, the row after the output and `extra`; the row
  // starts at rows[at] (for `undo`).
  void mask_lists(std::span<float> row, std::span<const int32_t> extra, Undo* undo, size_t at);
  void adjust(std::span<float> rows, std::span<const int32_t> draft, Undo* undo);
  // The constraint's state after one more token (JSON mode's or the grammar's, whichever is on).
  void advance(JsonState& js, GrammarMatcher::State& gs, int32_t token) const;

  float presence_ = 0, frequency_ = 0, repetition_ = 1;
  std::vector<std::pair<int32_t, float>> bias_list_;
  std::vector<int32_t> prompt_, stop_ids_;
  int min_tokens_ = 0;
  int64_t length_ = 0;  // output tokens pushed
  std::shared_ptr<const JsonVocabulary> json_;  // JSON mode: the state after each output token, json_states_[0] before any
  std::vector<JsonState> json_states_;
  std::shared_ptr<const GrammarMatcher> grammar_;  // a grammar: the state after each output token, as json_states_
  std::vector<GrammarMatcher::State> grammar_states_;
  bool active_ = false;
  int64_t vocab_ = 0;
  std::vector<int32_t> count_;   // [vocab] output counts (allocated only when active)
  std::vector<uint8_t> flags_;   // [vocab] kInPrompt | kBiased | kTouched
  std::vector<float> bias_;      // [vocab] where kBiased
  std::vector<int32_t> touched_; // the tokens whose logits change: biased, in the prompt (repetition), or in the output
  bool lists_ = false;              // allowed_token_ids or bad_words
  std::vector<int32_t> allowed_given_, allowed_;  // allowed_token_ids as given; sorted, unique
  std::vector<std::vector<int32_t>> bad_words_;
  std::vector<int32_t> output_;     // the output tokens pushed (kept where there are bad words)
  std::vector<int32_t> banned_;     // the tokens banned after the output as it stands
};

// Rows adjusted for as long as this object lives (the raw values back on destruction): the
// sampler's rows, which the log-probabilities read raw after the verdict.
class PenalizedRows {
 public:
  PenalizedRows(PenaltyHistory* history, std::span<float> rows, std::span<const int32_t> draft);
  ~PenalizedRows();
  PenalizedRows(const PenalizedRows&) = delete;
  PenalizedRows& operator=(const PenalizedRows&) = delete;

 private:
  std::span<float> rows_;
  PenaltyHistory::Undo undo_;
};

namespace test_seams {
// A planted bug for the exactness tests' negative control only: when set, every row of a round
// is adjusted as if it were the first (the round's draft tokens left out of the later rows' output).
void set_penalties_ignore_draft(bool on);
}  // namespace test_seams

}  // namespace specula
