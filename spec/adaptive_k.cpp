// Draft length control: the K that maximises expected tokens per second.
#include "spec/adaptive_k.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace specula {

namespace {
constexpr double kDecay = 0.95;  // per round: the estimates follow the last ~20 rounds

void check_k(const char* field, int k) {
  if (k < 1 || k > kMaxDraftTokens)
    throw std::invalid_argument(std::string(field) + " must be between 1 and " + std::to_string(kMaxDraftTokens) +
                                ", got " + std::to_string(k));
}
}  // namespace

void DraftLengthConfig::validate() const {
  check_k("K (draft tokens per round)", k);
  if (adaptive) {
    check_k("K_min", k_min);
    check_k("K_max", k_max);
    if (k_min > k_max)
      throw std::invalid_argument("K_min " + std::to_string(k_min) + " is larger than K_max " + std::to_string(k_max));
  }
  if (k_max_greedy != 0) {
    check_k("K_max for greedy requests", k_max_greedy);
    if (adaptive && k_min > k_max_greedy)
      throw std::invalid_argument("K_min " + std::to_string(k_min) + " is larger than K_max for greedy requests " +
                                  std::to_string(k_max_greedy));
  }
  if (!std::isfinite(max_entropy) || max_entropy < 0)
    throw std::invalid_argument("the draft entropy threshold must be >= 0 nats (0 = off), got " + std::to_string(max_entropy));
  if (!std::isfinite(min_confidence) || min_confidence < 0 || min_confidence >= 1)
    throw std::invalid_argument("the draft confidence threshold must be in [0, 1) (0 = off), got " +
                                std::to_string(min_confidence));
  if (!std::isfinite(min_confidence_greedy) || min_confidence_greedy < 0 || min_confidence_greedy >= 1)
    throw std::invalid_argument("the greedy draft confidence threshold must be in [0, 1) (0 = the other's), got " +
                                std::to_string(min_confidence_greedy));
  if (confidence_warmup < 0 || confidence_warmup > 1000)
    throw std::invalid_argument("the automatic draft confidence warm-up must be 0..1000 rounds, got " +
                                std::to_string(confidence_warmup));
  if (confidence_auto && min_confidence <= 0 && min_confidence_greedy <= 0)
    throw std::invalid_argument("the automatic draft confidence threshold needs a threshold > 0 to start from");
}

double expected_tokens_per_round(double a, double k) {
  if (a >= 1.0) return k + 1;
  return (1 - std::pow(a, k + 1)) / (1 - a);
}

double theorem_3_8_speedup(double a, double k, double c) { return expected_tokens_per_round(a, k) / (k * c + 1); }

void ForgettingLinearFit::observe(double x, double y) {
  w_ = w_ * decay_ + 1;
  sx_ = sx_ * decay_ + x;
  sy_ = sy_ * decay_ + y;
  sxx_ = sxx_ * decay_ + x * x;
  sxy_ = sxy_ * decay_ + x * y;
}

bool ForgettingLinearFit::slope_known() const { return w_ > 0 && sxx_ * w_ - sx_ * sx_ > 1e-9 * w_ * w_; }

double ForgettingLinearFit::slope() const {
  if (!slope_known()) return 0;
  return std::max(0.0, (sxy_ * w_ - sx_ * sy_) / (sxx_ * w_ - sx_ * sx_));
}

double ForgettingLinearFit::intercept() const {
  if (w_ <= 0) return 0;
  return std::max(0.0, (sy_ - slope() * sx_) / w_);
}

DraftLength::DraftLength(const DraftLengthConfig& cfg)
    : cfg_(cfg), k_(cfg.k), draft_time_(kDecay), verify_fit_(kDecay), draft_fit_(kDecay), round_rate_(kDecay) {
  cfg_.validate();
  if (cfg_.adaptive) k_ = cfg_.min_confidence > 0 ? cfg_.k_max : std::clamp(k_, cfg_.k_min, cfg_.k_max);
}

void DraftLength::observe(int drafted, int accepted, double draft_seconds, double verify_seconds) {
  // One Bernoulli judgement per accepted token, plus the rejection if there was one.
  accepted_ = accepted_ * kDecay + accepted;
  judged_ = judged_ * kDecay + accepted + (accepted < drafted ? 1 : 0);
  if (drafted > 0) {
    draft_time_.observe(draft_seconds, drafted);
    draft_fit_.observe(drafted, draft_seconds);
  }
  verify_fit_.observe(drafted, verify_seconds);
  round_rate_.observe(accepted + 1, draft_seconds + verify_seconds);
  ++rounds_;
  // With the confidence rule, the rule ends each draft where the draft's own confidence runs out,
  // which is per round what the i.i.d. model below can only average: K stays at k_max.
  if (!cfg_.adaptive || cfg_.min_confidence > 0) return;

  const double a = acceptance(), d = draft_seconds_per_token();
  const double v0 = std::max(verify_intercept(), 1e-9), v1 = verify_slope();
  int best = k_;
  double best_rate = -1;
  for (int k = cfg_.k_min; k <= cfg_.k_max; ++k) {
    const double rate = expected_tokens_per_round(a, k) / (k * d + v0 + v1 * k);
    if (rate > best_rate * (1 + 1e-9)) { best_rate = rate; best = k; }
  }
  k_ = best;
}

float DraftLength::confidence_threshold() const {
  return confidence_threshold(round_rate_.ratio(), verify_slope());
}

float DraftLength::confidence_threshold(double round_tokens_per_second, double verify_row_seconds) const {
  const float given = cfg_.min_confidence;
  if (!cfg_.confidence_auto || !cfg_.adaptive || given <= 0) return given;
  if (rounds_ < std::max(1, cfg_.confidence_warmup) || round_tokens_per_second <= 0) return given;
  const double t = round_tokens_per_second * (draft_slope() + verify_row_seconds) / confidence_calibration();
  return static_cast<float>(std::clamp(t, kAutoConfidenceMin, kAutoConfidenceMax));
}

void DraftLength::observe_confidence(std::span<const float> products, int drafted, int accepted) {
  if (drafted <= 0 || static_cast<int>(products.size()) != drafted) return;
  cal_hit_ *= kDecay;
  cal_pred_ *= kDecay;
  for (int i = 1; i <= drafted; ++i) {
    cal_pred_ += i == 1 ? 1.0 : static_cast<double>(products[static_cast<size_t>(i - 2)]);
    if (accepted >= i) cal_hit_ += 1;
  }
}

}  // namespace specula
