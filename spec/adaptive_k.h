// How many tokens to draft per round: fixed K, or K chosen each round from the request's running
// acceptance and measured costs (Leviathan et al. 2023, Theorem 3.8), plus two rules that end a
// draft early: where the draft distribution is flat (entropy), and where the draft's own
// probability that all its tokens so far are right has fallen low (confidence, EAGLE-2's signal).
#pragma once
#include <cstdint>
#include <span>

namespace specula {

inline constexpr int kMaxDraftTokens = 16;  // the largest K a request may ask for

struct DraftLengthConfig {
  int k = 4;              // fixed K; with `adaptive`, the K of the first round
  bool adaptive = false;  // choose K per round within [k_min, k_max]
  int k_min = 1;
  int k_max = 8;
  // k_max for greedy requests, where a draft token's acceptance is the head's calibrated top
  // probability and a longer draft pays where sampling's does not (docs/benchmarks.md, "K_max by
  // sampling mode"); 0 = k_max.
  int k_max_greedy = 0;
  float max_entropy = 0;  // nats; stop a draft once H(q_i) exceeds this (after k_min tokens); 0 = off
  // Draft no further once the product of the draft's probabilities of the tokens drafted so far
  // is below this (never before k_min tokens); 0 = off.
  float min_confidence = 0;
  // The same threshold for greedy requests, where the draft's top probability is a calibrated
  // estimate of acceptance and a stricter one pays (docs/benchmarks.md); 0 = min_confidence.
  float min_confidence_greedy = 0;
  // The confidence rule's threshold chosen each round from the request's own measurements
  // (DraftLength::confidence_threshold), starting from min_confidence (or the greedy one) until
  // they are in; off: the thresholds as given. Spelled `--draft-confidence auto`. Like K, it
  // follows timing only with `adaptive`: with a fixed K the starting threshold holds, so the
  // drafts stay a function of the request alone (docs/protocol.md, "The seed promise").
  bool confidence_auto = false;
  int confidence_warmup = 8;  // rounds a request drafts at the starting threshold first (0..1000)

  // The settings a request drafts with: min_confidence_greedy and k_max_greedy folded into
  // min_confidence and k_max for a greedy request, and cleared.
  DraftLengthConfig resolved(bool greedy) const {
    DraftLengthConfig c = *this;
    if (greedy && min_confidence_greedy > 0) c.min_confidence = min_confidence_greedy;
    if (greedy && k_max_greedy > 0) c.k_max = k_max_greedy;
    c.min_confidence_greedy = 0;
    c.k_max_greedy = 0;
    return c;
  }

  // Throws std::invalid_argument naming the field: K, k_min, k_max, k_max_greedy (unless 0) outside
  // 1..kMaxDraftTokens, k_min > k_max or k_max_greedy, a negative or non-finite entropy
  // threshold, a confidence (either) outside [0, 1), confidence_auto without a threshold to start
  // from.
  void validate() const;
};

// Theorem 3.8: expected tokens per round with per-token acceptance a and draft length k,
// (1 - a^(k+1)) / (1 - a) (k + 1 at a = 1).
double expected_tokens_per_round(double a, double k);
// Theorem 3.8's expected walltime improvement (1 - a^(k+1)) / ((1 - a)(k c + 1)) for cost
// ratio c = draft step time / target step time; it assumes verifying k+1 tokens costs one step.
double theorem_3_8_speedup(double a, double k, double c);

// y ~ v0 + v1 x by least squares with exponential forgetting: each observation first scales the
// running sums by `decay`. The slope reads 0 until two different x were seen; both are >= 0.
class ForgettingLinearFit {
 public:
  explicit ForgettingLinearFit(double decay) : decay_(decay) {}
  void observe(double x, double y);
  double intercept() const;
  double slope() const;
  bool slope_known() const;  // two different x were seen

 private:
  double decay_;
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
};

// num / den of two sums forgotten alike (seconds per draft token, tokens per second of rounds):
// each observation first scales both by `decay`. Reads 0 until den is positive.
class ForgettingRatio {
 public:
  explicit ForgettingRatio(double decay) : decay_(decay) {}
  void observe(double num, double den) {
    num_ = num_ * decay_ + num;
    den_ = den_ * decay_ + den;
  }
  double ratio() const { return den_ > 0 ? num_ / den_ : 0; }

 private:
  double decay_;
  double num_ = 0, den_ = 0;
};

// The starting threshold of `--draft-confidence auto`: the fixed rule's default for sampled
// requests (docs/speculative.md, "The automatic confidence threshold").
inline constexpr float kAutoConfidenceStart = 0.3f;
// The range the measured threshold is held to.
inline constexpr double kAutoConfidenceMin = 0.05, kAutoConfidenceMax = 0.95;

// The per-request controller. Estimates, with exponential forgetting, (a) the per-token
// acceptance a = accepted / judged (judged = accepted + rejections: drafts after the first
// rejection were never judged), (b) draft seconds per drafted token, (c) verify seconds as
// v0 + v1 * k. Picks the K in [k_min, k_max] maximising expected tokens per second:
// E[tokens](a, K) / (K * draft + v0 + v1 * K), which is Theorem 3.8 when v1 = 0. With the
// confidence rule on, K is k_max: the rule sets each round's length from the draft's own
// confidence, which the model of i.i.d. acceptance can only average (docs/speculative.md).
class DraftLength {
 public:
  explicit DraftLength(const DraftLengthConfig& cfg);
  int next() const { return k_; }
  void observe(int drafted, int accepted, double draft_seconds, double verify_seconds);

  double acceptance() const { return judged_ > 0 ? accepted_ / judged_ : 0.5; }
  double draft_seconds_per_token() const { return draft_time_.ratio(); }
  // Verify time fit v0 + v1 * k (seconds); v1 is 0 until two different k were seen.
  double verify_intercept() const { return verify_fit_.intercept(); }
  double verify_slope() const { return verify_fit_.slope(); }

  // The confidence rule's threshold for the next round. Fixed (or K fixed): min_confidence. With
  // confidence_auto and adaptive, once confidence_warmup rounds (at least one) were seen, the
  // threshold at which one more draft token pays for what it costs: token i adds A_i = P(t1..ti
  // all accepted) tokens to a round and costs d1 + v1 seconds (the slopes of the draft and the
  // verify time on the draft length, fitted with forgetting: one more depth of the draft and one
  // more verify row; a round's first draft token also pays the drafter's catch-up. Until two
  // lengths were seen, the draft's mean time per token and no verify slope), so it
  // raises the round's tokens per second R = E[tokens] / E[seconds] while A_i > R (d1 + v1). A_i is
  // estimated as r P_{i-1}, the product of the draft's probabilities of the tokens before it times
  // the request's calibration r = sum 1[t1..ti accepted] / sum P_{i-1} over its drafted tokens
  // (observe_confidence); so token i is drafted while P_{i-1} >= R (d1 + v1) / r, held to
  // [kAutoConfidenceMin, kAutoConfidenceMax]. 0 when the rule is off.
  float confidence_threshold() const;
  // The same with R and v1 as the caller measured them: the engine's scheduler prices a token by
  // the batch's rounds (its tokens per second and the batched forward's cost of a row), which a
  // request's own rounds understate B times over in a batch of B.
  float confidence_threshold(double round_tokens_per_second, double verify_row_seconds) const;
  // d1: the draft time's slope on the draft length, or its mean per token until two lengths were seen.
  double draft_slope() const { return draft_fit_.slope_known() ? draft_fit_.slope() : draft_seconds_per_token(); }
  // A judged proposal's confidence row (DraftProposal::confidence, one product per draft token)
  // and how many of its tokens were accepted: the calibration's sums, with forgetting. A row
  // whose length is not the proposal's (a drafter that does not run the rule) is not counted.
  void observe_confidence(std::span<const float> products, int drafted, int accepted);
  double confidence_calibration() const { return cal_hit_ / cal_pred_; }

 private:
  DraftLengthConfig cfg_;
  int k_;
  // Sums with forgetting factor kDecay per round.
  double accepted_ = 1, judged_ = 2;  // prior: a = 0.5 with the weight of two judgements
  ForgettingRatio draft_time_;      // draft seconds per drafted token, over the rounds that drafted
  ForgettingLinearFit verify_fit_;  // verify time on k
  ForgettingLinearFit draft_fit_;   // draft time on k, over the rounds that drafted
  ForgettingRatio round_rate_;      // tokens a round (accepted + 1) per its draft + verify seconds
  int rounds_ = 0;
  double cal_hit_ = 1, cal_pred_ = 1;  // prior: calibrated, with the weight of one token
};

}  // namespace specula
