// The load-adaptive draft-length policy: under load the batched verify forward is compute-bound,
// so every draft token costs nearly what a committed token does and speculation pays less. The
// scheduler measures the verify forward's cost as a function of the rows in the round and the
// draft's cost per token, and chooses each request's K for the round (down to 0 = a plain decode
// step) to maximise the round's expected committed tokens per second.
#pragma once
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "spec/adaptive_k.h"

namespace specula::actors {

// Seconds of one batched target forward over T rows, fitted as v0 + v1 * T by least squares with
// exponential forgetting (factor kDecay per observation). The verify forwards alone once they have
// shown two different T; until then also the prefill forwards, which give a slope early (a large T)
// but not the right one for a round of a few rows: a forward of 2-5 rows costs little more than
// one where reading the weights dominates (0.25 ms a row against a 3.4 ms step on the 2-core
// machine) while a 40-row prefill costs ~0.5 ms a row, and a fit through both kept the
// policy from drafting at batch 1. Until two different T were seen the slope is not known.
class VerifyCostModel {
 public:
  static constexpr double kDecay = 0.98;
  static constexpr double kOutlier = 1.25;
  void observe_verify(int64_t rows, double seconds) {
    same_rows_ = rows == last_rows_ ? same_rows_ + 1 : 1;
    last_rows_ = rows;
    const auto t = static_cast<double>(rows);
    early_.observe(t, seconds);
    // Once the slope is known, a forward is counted as at most kOutlier times (and at least
    // 1 / kOutlier of) what the fit predicts for its rows: on a shared machine one forward in a
    // few dozen takes twice its time, and one such forward at a row count seen rarely (the only
    // 4-row round of a request) set the slope to ~1 ms a row against ~0.2, after which the policy
    // kept the trained head at K = 0. A lasting change still moves the fit, by up to kOutlier per
    // forward.
    if (verify_.slope_known()) {
      const double predicted = verify_.intercept() + verify_.slope() * t;
      if (predicted > 0) seconds = std::clamp(seconds, predicted / kOutlier, predicted * kOutlier);
    }
    verify_.observe(t, seconds);
  }
  void observe_prefill(int64_t rows, double seconds) {
    if (!verify_.slope_known()) early_.observe(static_cast<double>(rows), seconds);
  }
  double intercept() const { return fit().intercept(); }  // v0 >= 0
  double slope() const { return fit().slope(); }          // v1 >= 0
  bool known() const { return fit().slope_known(); }
  // The last kStale verify forwards all had one row count: the slope is what older forwards left
  // (with every round at K = 0, only one-row forwards), and no forward to come can move it. At
  // batch 1 a slope set by the first, slow two-row round priced every draft out for the rest of
  // the run (the Engine test below drafted 1 token in 16 requests once in a fresh-clone CI run);
  // the scheduler then drafts one token to measure a row again (Scheduler::draft_lengths).
  static constexpr int kStale = 24;
  bool stale() const { return known() && same_rows_ >= kStale; }

 private:
  const ForgettingLinearFit& fit() const { return verify_.slope_known() ? verify_ : early_; }
  ForgettingLinearFit verify_{kDecay}, early_{kDecay};
  int64_t last_rows_ = -1;
  int same_rows_ = 0;  // verify forwards in a row with last_rows_ rows
};

struct RoundCosts {
  double verify_intercept = 0;   // v0: seconds of a verify forward independent of its rows
  double verify_per_row = 0;     // v1: seconds per row (one per committed position, one per draft token)
  double draft_per_token = 0;    // d: draft seconds per drafted token (drafting is per sequence)
};

// One request of the round as the policy sees it.
struct PolicyRequest {
  double acceptance = 0.5;  // a: per-token acceptance (Theorem 3.8's alpha), its running estimate
  int k_max = 0;            // the most it may draft this round (its K cap, length and context limits)
  bool fixed = false;       // not the policy's to choose: it drafts k_max
  // Its drafts end by the confidence rule (DraftLengthConfig::min_confidence): the policy chooses
  // whether it drafts at all, and if it does, it drafts up to k_max (the rule sets the length).
  bool rule_sets_length = false;
};

// Expected committed tokens of a round with K drafts at per-token acceptance a (Theorem 3.8).
double expected_committed(double a, int k);

// Chooses K_i in [0, k_max_i] (k_max_i for fixed requests) maximising
//   sum_i E(a_i, K_i) / (v0 + v1 * sum_i (K_i + 1) + d * sum_i K_i).
// Every extra draft token costs the same (v1 + d) and request i's j-th one gains a_i^j, so adding
// the tokens in order of decreasing gain while a gain beats the current ratio is optimal. Then a
// request whose rule sets the length and that drafts at all gets k_max.
std::vector<int> choose_draft_lengths(std::span<const PolicyRequest> requests, const RoundCosts& costs);

}  // namespace specula::actors
