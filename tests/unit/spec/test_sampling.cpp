// Sampling: the transform keeps exactly the top-k / top-p set, Gumbel-max draws follow the
// distribution (chi-square, with a planted-bug control), and a seed fixes every draw.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstring>
#include <random>
#include <vector>
#include <map>
#include <set>

#include "gpu/host/vector_math.h"
#include "spec/philox.h"
#include "spec/sampling.h"
#include "spec/speculative_sampling.h"

namespace specula {
namespace {

std::vector<float> logits_of(std::initializer_list<float> l) { return std::vector<float>(l); }

// Pearson chi-square of counts against expected probabilities; bins with tiny expectation merged.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n, int* dof) {
  double stat = 0, rest_obs = 0, rest_exp = 0;
  int bins = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    if (e < 5) { rest_obs += counts[i]; rest_exp += e; continue; }
    stat += (counts[i] - e) * (counts[i] - e) / e;
    ++bins;
  }
  if (rest_exp > 0) { stat += (rest_obs - rest_exp) * (rest_obs - rest_exp) / std::max(rest_exp, 1e-9); ++bins; }
  *dof = bins - 1;
  return stat;
}

// 99.9% quantile of chi-square via the Wilson-Hilferty approximation.
double chi_square_critical(int dof) {
  const double z = 3.0902;
  const double k = dof;
  return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
}

TEST(Philox, MatchesThePublishedKnownAnswerVector) {
  // Random123's kat_vectors: philox4x32_10, counter 0, key 0.
  const PhiloxBlock out = philox4x32({0, 0, 0, 0}, 0);
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
}

TEST(Sampling, TopKKeepsExactlyTheKLargestLogits) {
  SamplingParams sp{1.0f, 2, 1.0f, 0};
  std::vector<float> logp;
  transform_logits(logits_of({0.1f, 3.0f, -1.0f, 2.0f, 0.5f}), sp, logp);
  EXPECT_TRUE(std::isinf(logp[0]) && std::isinf(logp[2]) && std::isinf(logp[4]));
  const double p1 = std::exp(logp[1]), p3 = std::exp(logp[3]);
  EXPECT_NEAR(p1 + p3, 1.0, 1e-6);
  EXPECT_NEAR(p1 / p3, std::exp(1.0), 1e-5);
}

TEST(Sampling, TopPKeepsTheSmallestPrefixReachingP) {
  // softmax of log(0.5, 0.3, 0.15, 0.05): top_p 0.75 keeps {0.5, 0.3}; 0.85 adds 0.15.
  // (Values exactly at a boundary are left alone: float rounding decides those.)
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  std::vector<float> logp;
  transform_logits(l, SamplingParams{1.0f, 0, 0.75f, 0}, logp);
  EXPECT_FALSE(std::isinf(logp[0]));
  EXPECT_FALSE(std::isinf(logp[1]));
  EXPECT_TRUE(std::isinf(logp[2]));
  transform_logits(l, SamplingParams{1.0f, 0, 0.85f, 0}, logp);
  EXPECT_FALSE(std::isinf(logp[2]));
  EXPECT_TRUE(std::isinf(logp[3]));
  EXPECT_NEAR(std::exp(logp[0]), 0.5 / 0.95, 1e-5);
}

TEST(Sampling, TopPOverALargeVocabularyWidensPastTheFirstCandidates) {
  // A flat distribution over 5000 tokens: top_p 0.4999 must keep 2500 of them (2499 hold 0.4998).
  std::vector<float> l(5000, 0.0f);
  std::vector<float> logp;
  transform_logits(l, SamplingParams{1.0f, 0, 0.4999f, 0}, logp);
  int kept = 0;
  for (float x : logp) kept += !std::isinf(x);
  EXPECT_EQ(kept, 2500);
}

TEST(Sampling, MinPKeepsTheTokensAtLeastMinPTimesTheMostProbableAfterTemperature) {
  // p = (0.5, 0.3, 0.15, 0.05) at T 1: min_p 0.25 keeps tokens with p >= 0.125, so {0.5, 0.3, 0.15}
  // renormalised; at T 0.5 the ratios square (0.36, 0.09, 0.01 of the first), so only two remain.
  std::vector<float> l = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};
  std::vector<float> logp;
  transform_logits(l, SamplingParams{1.0f, 0, 1.0f, 0, 0.25f}, logp);
  EXPECT_TRUE(std::isinf(logp[3]));
  EXPECT_NEAR(std::exp(logp[0]), 0.5 / 0.95, 1e-5);
  EXPECT_NEAR(std::exp(logp[2]), 0.15 / 0.95, 1e-5);
  transform_logits(l, SamplingParams{0.5f, 0, 1.0f, 0, 0.25f}, logp);
  EXPECT_FALSE(std::isinf(logp[1]));
  EXPECT_TRUE(std::isinf(logp[2]));
  EXPECT_NEAR(std::exp(logp[0]), 0.25 / (0.25 + 0.09), 1e-5);
  // min_p 1 keeps the most probable token and any tied with it; 0 is off.
  transform_logits(logits_of({3.0f, 1.0f, 3.0f, 2.0f}), SamplingParams{1.0f, 0, 1.0f, 0, 1.0f}, logp);
  EXPECT_NEAR(std::exp(logp[0]), 0.5, 1e-6);
  EXPECT_NEAR(std::exp(logp[2]), 0.5, 1e-6);
  EXPECT_TRUE(std::isinf(logp[1]) && std::isinf(logp[3]));
  transform_logits(l, SamplingParams{1.0f, 0, 1.0f, 0, 0.0f}, logp);
  for (float x : logp) EXPECT_FALSE(std::isinf(x));
}

TEST(Sampling, MinPOverALargeVocabularyWidensPastTheFirstCandidatesAndTopPTakesItsMassAfterIt) {
  // 3,000 tokens at logit 0 and 2,000 at -1 (e^-1 = 0.37 of the first): min_p 0.3 keeps all 5,000,
  // 0.4 the first 3,000.
  std::vector<float> l(5000, 0.0f);
  for (size_t i = 3000; i < l.size(); ++i) l[i] = -1.0f;
  std::vector<float> logp;
  auto kept = [&] {
    int n = 0;
    for (float x : logp) n += !std::isinf(x);
    return n;
  };
  transform_logits(l, SamplingParams{1.0f, 0, 1.0f, 0, 0.3f}, logp);
  EXPECT_EQ(kept(), 5000);
  transform_logits(l, SamplingParams{1.0f, 0, 1.0f, 0, 0.4f}, logp);
  EXPECT_EQ(kept(), 3000);
  EXPECT_NEAR(std::exp(logp[0]), 1.0 / 3000, 1e-7);
  // Top-p after min-p takes its mass within min-p's set: 0.5 of the 3,000 is 1,500 tokens (of the
  // whole vocabulary's mass it would be fewer: 3,000 hold 0.80 of it).
  transform_logits(l, SamplingParams{1.0f, 0, 0.4999f, 0, 0.4f}, logp);
  EXPECT_EQ(kept(), 1500);
}

// The transform's definition (spec/sampling.cpp, transform_logits), written plainly: every token
// sorted, every term computed one at a time with the definition's scalar exponential
// (gpu/host/vector_math.h), the whole vocabulary's sums in its eight lanes. The production
// transform skips most of the vocabulary and sums with the 256-bit loops; it must give these bits
// exactly.
std::vector<float> transform_by_definition(const std::vector<float>& x, const SamplingParams& sp) {
  const size_t V = x.size();
  std::vector<float> logp(V, -std::numeric_limits<float>::infinity());
  const float inv_t = 1.0f / sp.temperature;
  std::vector<int32_t> order(V);
  for (size_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  const float mx = x[order[0]] * inv_t;
  auto a = [&](int32_t v) { return host_kernels::sampler_arg(x[v], inv_t, mx); };
  auto e = [&](int32_t v) { return host_kernels::sampler_exp(a(v)); };
  auto whole_sum = [&] {  // eight lanes over the whole eights, joined pairwise, then the tail
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const size_t whole = V / 8 * 8;
    for (size_t v = 0; v < whole; ++v) lane[v % 8] += e(static_cast<int32_t>(v));
    double s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (size_t v = whole; v < V; ++v) s += e(static_cast<int32_t>(v));
    return s;
  };
  const bool use_k = sp.top_k > 0 && static_cast<size_t>(sp.top_k) < V, use_p = sp.top_p < 1.0f, use_m = sp.min_p > 0.0f;
  size_t m = V;  // min-p's prefix: every e at least min_p times the first's
  if (use_m)
    for (size_t i = 0; i < V; ++i)
      if (!(e(order[i]) >= static_cast<double>(sp.min_p) * e(order[0]))) {
        m = i;
        break;
      }
  const size_t k = use_k ? std::min(m, static_cast<size_t>(sp.top_k)) : m;
  size_t n = k;
  if (use_p) {
    double z = 0;
    if (use_k || use_m)
      for (size_t i = 0; i < k; ++i) z += e(order[i]);
    else
      z = whole_sum();
    double cum = 0;
    for (size_t i = 0; i < k; ++i) {
      cum += e(order[i]) / z;
      if (cum >= sp.top_p) {
        n = i + 1;
        break;
      }
    }
  }
  double sum = 0;
  if (n == V)
    sum = whole_sum();
  else
    for (size_t i = 0; i < n; ++i) sum += e(order[i]);
  const double log_sum = std::log(sum);
  for (size_t i = 0; i < n; ++i) logp[order[i]] = static_cast<float>(a(order[i]) - log_sum);
  return logp;
}

TEST(Sampling, TheTransformGivesItsDefinitionsBitsForAnyVocabularyTemperatureTopKTopPAndMinP) {
  // Vocabularies of 1 to 49,152 tokens; logits like a language model's (a few large, a long flat
  // tail), flat ones, and ones on a coarse grid so that ties straddle every cut; top-p from 0.05 to
  // 0.999, with and without top-k. Among them rows whose running sum lands exactly on top_p
  // (equal logits, top_p 0.5, and top_p set to a running sum), where the cut turns on the
  // normaliser's last bits: a sum in another order, or another exponential, fails here.
  std::mt19937_64 rng(20261125);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const size_t sizes[] = {1, 2, 7, 100, 256, 257, 1000, 5000, 49152};
  const float temps[] = {0.3f, 0.8f, 1.0f, 1.7f};
  const int ks[] = {0, 0, 1, 3, 40, 300};
  const float ps[] = {1.0f, 0.999f, 0.95f, 0.9f, 0.5f, 0.05f};
  const float mins[] = {0.0f, 0.0f, 0.0f, 1e-4f, 0.05f, 0.3f};
  std::vector<float> got;
  int rows = 0;
  for (size_t V : sizes)
    for (int shape = 0; shape < 5; ++shape)
      for (int trial = 0; trial < (V > 5000 ? 6 : 24); ++trial) {
        std::vector<float> x(V);
        for (size_t i = 0; i < V; ++i) {
          const float z = g(rng);
          x[i] = shape == 0 ? 2.0f * z + (i % 97 == 0 ? 8.0f + 4.0f * std::fabs(g(rng)) : 0.0f)  // peaked
                 : shape == 1 ? 0.3f * z                                                      // flat
                 : shape == 2 ? std::round(2.0f * z) / 2.0f                                   // ties
                 : shape == 3 ? 1.0f                                                          // all equal
                              : 3.0f * z;                                                     // top_p on a sum
        }
        SamplingParams sp{temps[rng() % 4], ks[rng() % 6], shape == 3 ? 0.5f : ps[rng() % 6], 0, mins[rng() % 6]};
        if (shape == 4 && V > 1) {
          // top_p at (the float nearest) the exact running sum after a token of the order: the cut
          // then turns on the normaliser's last bits, which the vectorised sum does not have.
          sp.top_k = 0;
          sp.min_p = 0;
          std::vector<size_t> order(V);
          for (size_t i = 0; i < V; ++i) order[i] = i;
          std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
          const float inv_t = 1.0f / sp.temperature, mx = x[order[0]] * inv_t;
          auto e = [&](size_t v) { return host_kernels::sampler_exp(host_kernels::sampler_arg(x[v], inv_t, mx)); };
          const double z = host_kernels::sampler_exp_sum(x.data(), static_cast<int64_t>(V), inv_t, mx);
          double cum = 0;
          const size_t j = std::min<size_t>(V - 1, 1 + rng() % 20);
          for (size_t i = 0; i < j; ++i) cum += e(order[i]) / z;
          sp.top_p = static_cast<float>(cum);
          if (!(sp.top_p > 0.0f && sp.top_p < 1.0f)) sp.top_p = 0.5f;
        }
        transform_logits(x, sp, got);
        const std::vector<float> want = transform_by_definition(x, sp);
        ++rows;
        for (size_t v = 0; v < V; ++v)
          ASSERT_EQ(std::memcmp(&got[v], &want[v], sizeof(float)), 0)
              << "V " << V << " shape " << shape << " trial " << trial << " T " << sp.temperature << " top_k " << sp.top_k
              << " top_p " << sp.top_p << " min_p " << sp.min_p << ": token " << v << " got " << got[v] << " want " << want[v];
      }
  EXPECT_GT(rows, 500);
}

TEST(Sampling, AGumbelDrawAmongSomeIdsIsTheDrawOverTheRowWithEveryOtherTokenExcluded) {
  // The trained head draws among its N ids (2,048 shipped; spec/eagle_drafter.cpp); the verifier's exactness
  // argument needs it to be the draw over the full row. Equal log-probabilities included, where
  // the lower id must win on a tie as the full row's scan gives it.
  std::mt19937_64 rng(3);
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t V = 50 + rng() % 3000;
    std::vector<float> row(V, -std::numeric_limits<float>::infinity());
    std::vector<int32_t> ids;
    std::vector<float> lp;
    for (size_t v = 0; v < V; ++v)
      if (rng() % 5 == 0) {
        // spreads that leave every token in reach, and that put many far below the best (the
        // draw's filter rules those out 64 entries at a time)
        const float spread = trial % 4 == 1 ? 8.0f : trial % 4 == 2 ? 40.0f : 1.0f;
        const float x = trial % 3 == 0 ? -2.0f : spread * g(rng);
        row[v] = x;
        ids.push_back(static_cast<int32_t>(v));
        lp.push_back(x);
      }
    if (ids.empty()) continue;
    for (int64_t position : {0, 17, 4096})
      for (RngStream stream : {RngStream::Token, RngStream::Draft})
        ASSERT_EQ(sample_gumbel_among(ids, lp, 11 + trial, position, stream), sample_gumbel(row, 11 + trial, position, stream))
            << "trial " << trial << " position " << position;
  }
}

// The definition of a Gumbel-max draw, every token's score computed: argmax over tokens not at
// -inf of logp[v] - log(-log(U_v)), the lowest id among equal scores.
int32_t gumbel_by_definition(const std::vector<float>& logp, uint64_t seed, int64_t position, RngStream stream) {
  int32_t best = -1;
  double best_score = -std::numeric_limits<double>::infinity();
  for (size_t v = 0; v < logp.size(); ++v) {
    if (logp[v] == -std::numeric_limits<float>::infinity()) continue;
    const double score = static_cast<double>(logp[v]) - std::log(-std::log(philox_uniform(seed, position, stream, v)));
    if (score > best_score) {
      best_score = score;
      best = static_cast<int32_t>(v);
    }
  }
  return best;
}

TEST(Sampling, AGumbelDrawIsTheDefinitionsDrawThoughItSkipsTokensThatCannotWin) {
  // sample_gumbel skips tokens too far below the best score to win and compares a uniform
  // instead of taking two logarithms where only a large noise could win (spec/sampling.cpp):
  // rows from flat to very peaked (so that most tokens are skipped), a full vocabulary, rows with
  // a top-k cut, equal log-probabilities (the lower id must win), many seeds and positions.
  std::mt19937_64 rng(5);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  int draws = 0, off_top = 0;
  for (int trial = 0; trial < 240; ++trial) {
    const size_t V = trial % 8 == 0 ? 49152 : 100 + rng() % 5000;
    const float spread = std::array<float, 6>{0.0f, 0.5f, 2.0f, 5.0f, 12.0f, 30.0f}[trial % 6];
    std::normal_distribution<float> g(0.0f, spread > 0 ? spread : 1.0f);
    std::vector<float> row(V);
    for (size_t v = 0; v < V; ++v) row[v] = spread > 0 ? g(rng) : -1.0f;
    if (trial % 5 == 1)  // a top-k row: all but 40 tokens excluded
      for (size_t v = 0; v < V; ++v)
        if (rng() % (V / 40 + 1) != 0) row[v] = kNegInf;
    if (trial % 7 == 3)  // ties at the top
      for (int t = 0; t < 4; ++t) row[rng() % V] = 3 * spread + 1;
    if (std::all_of(row.begin(), row.end(), [&](float x) { return x == kNegInf; })) row[rng() % V] = 0.0f;
    for (int64_t position : {int64_t{0}, int64_t{1} + trial, int64_t{5000000000}})
      for (RngStream stream : {RngStream::Token, RngStream::Residual}) {
        const uint64_t seed = rng();
        const int32_t want = gumbel_by_definition(row, seed, position, stream);
        ASSERT_EQ(sample_gumbel(row, seed, position, stream), want) << "trial " << trial << " spread " << spread;
        ++draws;
        off_top += want != argmax(row);
      }
  }
  // The rows are random enough that the draws are not just the argmax.
  EXPECT_GT(off_top, draws / 4);
}

// The verifier's residual draw (sample_recovered) and bonus draw (speculative_sample after every
// draft passes) take the logarithm only for tokens that can win (spec/gumbel_max.h). Each must be
// the definition's draw over the whole row it used to build: float(log(p - q)) where positive
// (std::log(p) when the residual has no mass), and std::log(p) for the bonus. Rows of probabilities
// from flat to very peaked, q covering all, part or none of the vocabulary, a q equal to p (no
// residual mass), many seeds and positions.
TEST(Sampling, TheResidualAndBonusDrawsAreTheDefinitionsDrawsThoughTheyTakeFewLogarithms) {
  std::mt19937_64 rng(9);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  auto softmax = [](const std::vector<float>& x) {
    const float m = *std::max_element(x.begin(), x.end());
    std::vector<double> e(x.size());
    double z = 0;
    for (size_t v = 0; v < x.size(); ++v) z += e[v] = std::exp(static_cast<double>(x[v] - m));
    std::vector<float> p(x.size());
    for (size_t v = 0; v < x.size(); ++v) p[v] = static_cast<float>(e[v] / z);
    return p;
  };
  int draws = 0, off_top = 0, no_mass = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const size_t V = trial % 6 == 0 ? 49152 : 50 + rng() % 4000;
    const float spread = std::array<float, 5>{0.3f, 1.5f, 3.0f, 6.0f, 15.0f}[trial % 5];
    std::normal_distribution<float> g(0.0f, spread);
    std::vector<float> x(V), y(V);
    for (size_t v = 0; v < V; ++v) x[v] = g(rng), y[v] = g(rng);
    const std::vector<float> p = softmax(x);
    std::vector<float> q = softmax(y);
    if (trial % 4 == 1)  // q on a sixth of the vocabulary (the trained head's reduced one)
      for (size_t v = 0; v < V; ++v)
        if (v % 6 != 0) q[v] = 0.0f;
    if (trial % 4 == 2) std::fill(q.begin(), q.end(), 0.0f);
    if (trial % 9 == 4) q = p;
    std::vector<float> log_r(V, kNegInf), log_p(V, kNegInf);
    double mass = 0;
    for (size_t v = 0; v < V; ++v) {
      const double r = static_cast<double>(p[v]) - static_cast<double>(q[v]);
      if (r > 0) mass += r, log_r[v] = static_cast<float>(std::log(r));
      if (p[v] > 0) log_p[v] = std::log(p[v]);
    }
    if (mass < kResidualFloor) log_r = log_p, ++no_mass;
    for (int64_t position : {int64_t{0}, int64_t{7} + trial, int64_t{3000000000}}) {
      const uint64_t seed = rng();
      const int32_t want_r = gumbel_by_definition(log_r, seed, position, RngStream::Residual);
      ASSERT_EQ(sample_recovered(p, q, seed, position), want_r) << "trial " << trial << ", spread " << spread;
      const int32_t want_b = gumbel_by_definition(log_p, seed, position, RngStream::Token);
      const RoundOutcome bonus = speculative_sample({}, {}, p, static_cast<int64_t>(V), seed, position);
      ASSERT_TRUE(bonus.bonus);
      ASSERT_EQ(bonus.tokens, std::vector<int32_t>{want_b}) << "trial " << trial << ", spread " << spread;
      draws += 2;
      off_top += (want_r != argmax(log_r)) + (want_b != argmax(log_p));
    }
  }
  EXPECT_GT(off_top, draws / 4);  // the draws are not just the argmax
  EXPECT_GT(no_mass, 5);          // and the residual's fallback to p was taken
}

TEST(Sampling, ATokensLogprobsAreTheLogSoftmaxOfTheRawLogitsWithTheMostProbableFirst) {
  // Against the definition in long double over a vocabulary-sized row of logits spread as a
  // model's are; a sampling transform would not change them (they are the model's own).
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> logits(49152);
  for (float& x : logits) x = n(rng);
  logits[1234] = 30.0f;  // one clear winner, and a tie below it
  logits[77] = logits[4000] = 25.0f;
  long double sum = 0;
  const float m = *std::max_element(logits.begin(), logits.end());
  for (const float x : logits) sum += std::exp(static_cast<long double>(x) - m);
  auto exact = [&](int32_t v) { return static_cast<double>(static_cast<long double>(logits[v]) - m - std::log(sum)); };
  std::vector<float> sampler_row;  // the sampler's own row at temperature 1
  transform_logits(logits, SamplingParams{1.0f, 0, 1.0f, 0}, sampler_row);
  for (const int32_t tok : {1234, 77, 4000, 0, 49151, 31337}) {
    const TokenLogprobs t = token_logprobs(logits, tok, 4);
    EXPECT_NEAR(t.logprob, exact(tok), 1e-5 * std::max(1.0, std::abs(exact(tok)))) << tok;
    float want = sampler_row[static_cast<size_t>(tok)];
    EXPECT_EQ(std::memcmp(&t.logprob, &want, sizeof want), 0) << "not the transform's bits at " << tok;
    ASSERT_EQ(t.top.size(), 4u);
    EXPECT_EQ(t.top[0].first, 1234);
    EXPECT_EQ(t.top[1].first, 77) << "ties: the lower id first";
    EXPECT_EQ(t.top[2].first, 4000);
    std::vector<float> rest(logits);
    rest[1234] = rest[77] = rest[4000] = -1e30f;
    EXPECT_EQ(t.top[3].first, argmax(rest));
    for (const auto& [id, lp] : t.top) EXPECT_NEAR(lp, exact(id), 1e-5 * std::max(1.0, std::abs(exact(id)))) << id;
  }
  // The probabilities sum to one; no alternatives when none are asked; more than the vocabulary
  // gives the whole of it; a token outside the row is an error.
  const std::vector<float> row(logits.begin(), logits.begin() + 1000);
  double total = 0;
  for (int32_t v = 0; v < 1000; ++v) total += std::exp(static_cast<double>(token_logprobs(row, v, 0).logprob));
  EXPECT_NEAR(total, 1.0, 1e-5);
  EXPECT_TRUE(token_logprobs(logits, 5, 0).top.empty());
  const std::vector<float> three = logits_of({1.0f, 2.0f, 3.0f});
  const TokenLogprobs all = token_logprobs(three, 0, 20);
  ASSERT_EQ(all.top.size(), 3u);
  EXPECT_EQ(all.top[0].first, 2);
  EXPECT_EQ(all.top[2].first, 0);
  EXPECT_THROW(token_logprobs(three, 3, 1), std::invalid_argument);
  EXPECT_THROW(token_logprobs(three, -1, 1), std::invalid_argument);
  // vLLM's rank: 1 + the tokens of a larger logit (tied tokens share it).
  const std::vector<float> ties = logits_of({1.0f, 3.0f, 3.0f, 0.0f, 2.0f});
  std::vector<int32_t> ranks;
  for (int32_t v = 0; v < 5; ++v) ranks.push_back(token_logprobs(ties, v, 0).rank);
  EXPECT_EQ(ranks, (std::vector<int32_t>{4, 1, 1, 5, 3}));
}

TEST(Sampling, TemperatureZeroIsArgmaxWithTheLowestIndexOnTies) {
  EXPECT_EQ(sample_token(logits_of({1.0f, 5.0f, 5.0f, 2.0f}), SamplingParams{0.0f, 0, 1.0f, 9}, 3), 1);
}

TEST(Sampling, ArgmaxIsThePlainScansFirstLargestIndexOnTiesInfinitiesAndNaNs) {
  auto plain = [](const std::vector<float>& x) {
    int32_t best = 0;
    for (size_t i = 1; i < x.size(); ++i)
      if (x[i] > x[best]) best = static_cast<int32_t>(i);
    return best;
  };
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  uint32_t state = 7;
  auto next = [&] { return philox4x32({state++, 0, 0, 0}, 3)[0]; };
  for (size_t n : {1u, 2u, 15u, 16u, 17u, 255u, 256u, 257u, 1000u, 49152u}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(n);
      // Few distinct values, so ties are common; some -inf, +inf and NaN.
      for (float& v : x) {
        const uint32_t r = next();
        v = static_cast<float>(r % 7) - 3.0f;
        if (r % 97 == 0) v = -inf;
        if (trial % 5 == 1 && r % 301 == 0) v = inf;
        if (trial % 5 == 2 && r % 53 == 0) v = nan;
      }
      if (trial % 5 == 3) std::fill(x.begin(), x.end(), -inf);
      if (trial % 5 == 4 && n > 1) x[0] = nan;
      ASSERT_EQ(argmax(x), plain(x)) << "n " << n << ", trial " << trial;
    }
  }
}

TEST(Sampling, ASeedAndPositionFixTheDrawAndOtherPositionsVary) {
  const std::vector<float> l(64, 0.0f);
  SamplingParams sp{1.0f, 0, 1.0f, 1234};
  std::set<int32_t> seen;
  for (int pos = 0; pos < 50; ++pos) {
    const int32_t a = sample_token(l, sp, pos);
    EXPECT_EQ(a, sample_token(l, sp, pos));
    seen.insert(a);
  }
  EXPECT_GT(seen.size(), 20u);
}

TEST(Sampling, InvalidParametersAreRejectedWithTheirValues) {
  EXPECT_THROW((SamplingParams{-0.5f, 0, 1.0f, 0}.validate()), std::invalid_argument);
  EXPECT_THROW((SamplingParams{1.0f, -1, 1.0f, 0}.validate()), std::invalid_argument);
  EXPECT_THROW((SamplingParams{1.0f, 0, 0.0f, 0}.validate()), std::invalid_argument);
  EXPECT_THROW((SamplingParams{1.0f, 0, 1.5f, 0}.validate()), std::invalid_argument);
  EXPECT_THROW((SamplingParams{1.0f, 0, 1.0f, 0, -0.1f}.validate()), std::invalid_argument);
  EXPECT_THROW((SamplingParams{1.0f, 0, 1.0f, 0, 1.5f}.validate()), std::invalid_argument);
  EXPECT_THROW((SamplingParams{1.0f, 0, 1.0f, 0, std::nanf("")}.validate()), std::invalid_argument);
  EXPECT_NO_THROW((SamplingParams{1.0f, 0, 1.0f, 0, 1.0f}.validate()));
}

// Draws n tokens at positions 0..n-1 and returns the chi-square verdict against softmax(l/T).
bool gumbel_draws_match_softmax(const std::vector<float>& l, float temperature, bool planted_bug) {
  SamplingParams sp{temperature, 0, 1.0f, 42};
  std::vector<float> logp;
  transform_logits(l, sp, logp);
  if (planted_bug)  // the classic bug: forgetting the temperature in the transform
    transform_logits(l, SamplingParams{1.0f, 0, 1.0f, 42}, logp);
  const int64_t n = 200000;
  std::vector<int64_t> counts(l.size(), 0);
  for (int64_t pos = 0; pos < n; ++pos) ++counts[sample_gumbel(logp, sp.seed, pos, RngStream::Token)];
  std::vector<float> ref;
  transform_logits(l, sp, ref);
  std::vector<double> p(l.size());
  for (size_t i = 0; i < l.size(); ++i) p[i] = std::exp(static_cast<double>(ref[i]));
  int dof = 0;
  const double stat = chi_square(counts, p, n, &dof);
  return stat < chi_square_critical(dof);
}

TEST(Sampling, GumbelMaxDrawsFollowTheTemperedSoftmax) {
  const std::vector<float> l = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.5f, 0.2f, -0.3f};
  EXPECT_TRUE(gumbel_draws_match_softmax(l, 0.7f, false));
  EXPECT_TRUE(gumbel_draws_match_softmax(l, 1.0f, false));
}

TEST(Sampling, TheChiSquareTestCatchesAPlantedTemperatureBug) {
  const std::vector<float> l = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 1.5f, 0.2f, -0.3f};
  EXPECT_FALSE(gumbel_draws_match_softmax(l, 0.7f, true));
}

}  // namespace
}  // namespace specula
