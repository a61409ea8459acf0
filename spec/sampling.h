// Sampling: the logits transform (temperature, top-k, top-p) and Gumbel-max draws keyed by
// (seed, position), so the same seed gives the same text whatever else runs.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "spec/philox.h"

namespace specula {

class JsonVocabulary;  // spec/json_mode.h
class GrammarMatcher;  // spec/grammar.h
class TokenTrie;       // spec/grammar.h

// OpenAI's limit on logit_bias entries (vLLM takes any number; 300 is what OpenAI documents).
inline constexpr size_t kMaxLogitBias = 300;
// vLLM's limits on bad_words once tokenized: 128 sequences, 1,024 tokens in all.
inline constexpr size_t kMaxBadWords = 128, kMaxBadWordTokens = 1024;

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off; must be in (0, 1]
  uint64_t seed = 0;
  float min_p = 0.0f;        // 0 = off; in [0, 1]: keep the tokens at least min_p x the most probable
  // Changes to a row's raw logits that read the request's own tokens (spec/penalties.h; vLLM's
  // definitions and order): logit_bias, then repetition over the prompt's and the output's tokens,
  // then frequency and presence over the output's. All off by default.
  float presence_penalty = 0.0f;    // in [-2, 2]: minus this for a token the output holds
  float frequency_penalty = 0.0f;   // in [-2, 2]: minus this times the token's count in the output
  float repetition_penalty = 1.0f;  // in (0, 2]: a seen token's logit divided by it (> 0) or times it
  std::vector<std::pair<int32_t, float>> logit_bias{};  // token id, bias in [-100, 100], added to its logit
  // vLLM's min_tokens: the request's stop tokens get -inf logits (and its stop strings are not
  // looked for) until this many tokens are out; 0 = off. At most the request's max_tokens.
  int min_tokens = 0;
  // JSON mode (OpenAI's response_format {"type": "json_object"}; spec/json_mode.h): set, the
  // rows are masked to the tokens that keep the output a prefix of one JSON object, then to the
  // stop tokens once it is closed. The model's vocabulary as JSON mode reads it
  // (Engine::json_vocabulary, or one made from the tokenizer).
  std::shared_ptr<const JsonVocabulary> json_object{};
  // A grammar (spec/grammar.h: GBNF, or JSON Schema compiled to it): set, the rows are masked to
  // the tokens that keep the output a prefix of a sentence of it, and the stop tokens are kept
  // only where it may end. At most one of json_object and grammar.
  std::shared_ptr<const GrammarMatcher> grammar{};
  // vLLM's allowed_token_ids: when not empty, every other token's logit is -inf (the end tokens
  // too, unless listed: then only max_tokens or a stop string ends the text).
  std::vector<int32_t> allowed_token_ids{};
  // vLLM's bad_words, as token sequences (bad_words_token_ids in spec/penalties.h makes them from
  // words as vLLM does): a sequence's last token is -inf wherever the output ends with the tokens
  // before it; a one-token sequence's, everywhere.
  std::vector<std::vector<int32_t>> bad_words{};

  bool greedy() const { return temperature <= 0.0f; }
  // Any of the nine above away from its neutral value: the rows must be adjusted before judging.
  bool penalized() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f || !logit_bias.empty() ||
           min_tokens > 0 || masks_tokens();
  }
  // JSON mode, a grammar, allowed_token_ids or bad_words: tokens may be masked out of a row.
  bool masks_tokens() const { return json_object != nullptr || grammar != nullptr || !allowed_token_ids.empty() || !bad_words.empty(); }
  // Throws std::invalid_argument naming the bad field and value.
  void validate() const;
  // The same, and every token named (logit_bias, allowed_token_ids, bad_words) inside a vocabulary
  // of `vocab`.
  void validate(int64_t vocab) const;
  // The part of both for allowed_token_ids and bad_words alone (their limits, their tokens, and
  // that they leave some token at the first position).
  void validate_lists() const;
  void validate_lists(int64_t vocab) const;

 private:
  void lists_within(int64_t vocab) const;  // their tokens inside a vocabulary of `vocab`
};

// logp[v] = log softmax(logits / T) restricted to the min-p / top-k / top-p set (renormalised),
// -inf outside it; min-p and top-k each keep a prefix of the tokens by logit, top-p cuts the
// shorter of the two by its own mass (vLLM's order). Greedy params give a one-hot at the argmax
// (log 1 = 0).
void transform_logits(std::span<const float> logits, const SamplingParams& sp, std::vector<float>& logp);

// The same transform as probabilities (p[v] = exp(logp[v])).
void transform_to_probs(std::span<const float> logits, const SamplingParams& sp, std::vector<float>& probs);

// p = exp(logp) for an entry of a row transform_logits made. exp(-inf) is +0 exactly, so the
// tokens a top-k / top-p row leaves out (nearly all of it) need no call.
inline float prob_from_log(float logp) {
  return logp == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(logp);
}

// In place, logp[v] -> prob_from_log(logp[v]): transform_to_probs's second half.
void probs_from_log(std::span<float> logp);

// argmax, lowest index on ties.
int32_t argmax(std::span<const float> x);

// Gumbel-max: argmax_v logp[v] + G(seed, position, stream, v), G = -log(-log(U)); this is an
// exact draw from softmax(logp). Entries at -inf are never chosen.
int32_t sample_gumbel(std::span<const float> logp, uint64_t seed, int64_t position, RngStream stream);

// The same draw as sample_gumbel over a vocabulary holding logp[i] at token ids[i] (ascending) and
// -inf everywhere else: a drafter whose q lives on a few ids (the trained head's reduced
// vocabulary) draws without a vocabulary-wide row.
int32_t sample_gumbel_among(std::span<const int32_t> ids, std::span<const float> logp, uint64_t seed, int64_t position,
                            RngStream stream);

// Draws the token for `position` from raw logits with the request's params (greedy: argmax).
int32_t sample_token(std::span<const float> logits, const SamplingParams& sp, int64_t position);

// A token's log-probability under the model's own distribution at its position (log softmax of
// the raw logits, temperature 1: what vLLM reports by default, not the sampling transform; the
// bits of transform_logits's row at temperature 1 without top-k / top-p), and the `top` most
// probable tokens with theirs, most probable first (the lower id first on ties).
struct TokenLogprobs {
  float logprob = 0;
  int32_t rank = 1;  // 1 + the tokens of a larger logit (vLLM's rank: 1 is the likeliest)
  std::vector<std::pair<int32_t, float>> top;  // the likeliest first, ties to the lower id
};
TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top);

}  // namespace specula
