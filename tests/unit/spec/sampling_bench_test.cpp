// What the exact verifier's sampling work costs on one 49,152-token row (the default model's
// vocabulary), outside any forward. Disabled: a measurement, not a test (speed never gates CI).
//   build/tests/test_spec --gtest_also_run_disabled_tests --gtest_filter='SamplingBench.*'
// Prints one JSON line per case: microseconds per call, the median of several bursts.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "spec/sampling.h"
#include "spec/speculative_sampling.h"

namespace specula {
namespace {

constexpr int64_t kVocab = 49152;
constexpr int64_t kHeadVocab = 2048;  // the shipped head's reduced vocabulary

// Logits shaped like a chat model's: a broad normal floor and a few dozen plausible tokens.
std::vector<float> model_like_row(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> floor(-4.0f, 2.0f);
  std::vector<float> x(kVocab);
  for (float& v : x) v = floor(rng);
  std::uniform_int_distribution<int64_t> at(0, kHeadVocab - 1);  // where the head can propose them
  for (int i = 0; i < 40; ++i) x[static_cast<size_t>(at(rng))] = 8.0f + 6.0f * std::generate_canonical<float, 24>(rng);
  return x;
}

// q on the head's vocabulary (the first 2,048 ids here), the target's own shape blurred: what a
// draft that roughly agrees with the target proposes.
std::vector<float> head_like_q(const std::vector<float>& target_logits, const SamplingParams& sp) {
  std::vector<float> head(target_logits.begin(), target_logits.begin() + kHeadVocab), qh;
  for (size_t i = 0; i < head.size(); ++i) head[i] += static_cast<float>(std::sin(i * 0.7) * 1.5);
  transform_to_probs(head, sp, qh);
  std::vector<float> q(kVocab, 0.0f);
  std::copy(qh.begin(), qh.end(), q.begin());
  return q;
}

template <class F>
double median_us(F&& f, int calls = 50, int bursts = 7) {
  std::vector<double> us;
  for (int b = 0; b < bursts; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) f();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

TEST(SamplingBench, DISABLED_TheExactVerifiersWorkOnAFullVocabularyRow) {
  for (const SamplingParams& base :
       {SamplingParams{0.8f, 0, 1.0f, 0}, SamplingParams{0.8f, 40, 0.95f, 0}, SamplingParams{0.8f, 0, 0.95f, 0}}) {
    SamplingParams sp = base;
    // two rows: the first judges the draft token, the second is the bonus row
    std::vector<float> logits = model_like_row(1), second = model_like_row(2);
    logits.insert(logits.end(), second.begin(), second.end());
    const std::vector<float> q = head_like_q(logits, sp);
    std::vector<float> tmp;
    const std::span<const float> row0(logits.data(), kVocab);
    const int32_t top = argmax(row0);
    // a draft token the target likes (accepted for most seeds) and one it does not (rejected)
    std::vector<float> p0;
    transform_to_probs(row0, sp, p0);
    int32_t unlikely = 0;  // the token q overrates most
    for (int32_t v = 1; v < kHeadVocab; ++v)
      if (q[static_cast<size_t>(v)] - p0[static_cast<size_t>(v)] > q[static_cast<size_t>(unlikely)] - p0[static_cast<size_t>(unlikely)])
        unlikely = v;
    DraftProposal liked{{top}, q}, disliked{{unlikely}, q}, none{};
    uint64_t seed = 0;
    auto judge = [&](const DraftProposal& d, int rows) {
      sp.seed = ++seed;
      return verify_draft(d, std::span<const float>(logits).first(static_cast<size_t>(rows * kVocab)), sp, 100,
                          SpecSampling::Exact);
    };
    int accepted = 0, rejected = 0;
    for (int i = 0; i < 200; ++i) accepted += judge(liked, 2).accepted, rejected += 1 - judge(disliked, 2).accepted;
    const double transform = median_us([&] { transform_logits(row0, sp, tmp); });
    const double target_only = median_us([&] {
      sp.seed = ++seed;
      return sample_token(row0, sp, 100);
    });
    const double bonus_only = median_us([&] { judge(none, 1); });
    const double accept_then_bonus = median_us([&] { judge(liked, 2); });
    const double reject = median_us([&] { judge(disliked, 2); });
    std::printf(
        "{\"top_k\":%d,\"top_p\":%.2f,\"transform_us\":%.1f,\"sample_token_us\":%.1f,\"bonus_draw_us\":%.1f,\"accept_then_bonus_us\":%.1f,"
        "\"reject_and_residual_us\":%.1f,\"liked_accepted\":%d,\"disliked_rejected\":%d}\n",
        sp.top_k, sp.top_p, transform, target_only, bonus_only, accept_then_bonus, reject, accepted, rejected);
  }
}

}  // namespace
}  // namespace specula
