// The acceptance rule on synthetic distributions: its output follows p exactly (chi-square over
// 200k draws for 24 (p, q) pairs), and the same test fails for the two classic planted bugs.
// Plus the greedy and coupled rules, block verification (the token rule at one draft token, the
// paper's accepted lengths on its example), the guards, and seeded determinism.
#include <gtest/gtest.h>

#include <array>
#include <random>

#include <cmath>
#include <cstring>
#include <limits>
#include <functional>
#include <numeric>
#include <string>

#include "spec/philox.h"
#include "spec/sampling.h"
#include "spec/speculative_sampling.h"
#include "tests/unit/spec/chi_square.h"

namespace specula {
namespace {

using Dist = std::vector<float>;

struct Pair {
  std::string name;
  Dist p, q;
};

Dist normalised(std::vector<double> w) {
  const double s = std::accumulate(w.begin(), w.end(), 0.0);
  Dist d(w.size());
  for (size_t i = 0; i < w.size(); ++i) d[i] = static_cast<float>(w[i] / s);
  return d;
}

// A random distribution over `v` tokens: exp(scale * N(0,1)) weights, `zeros` entries set to 0.
Dist random_dist(uint64_t seed, int v, double scale, std::vector<int> zeros = {}) {
  std::vector<double> w(static_cast<size_t>(v));
  for (int i = 0; i < v; ++i) {
    const double u1 = philox_uniform(seed, i, RngStream::Token, 0), u2 = philox_uniform(seed, i, RngStream::Token, 1);
    w[static_cast<size_t>(i)] = std::exp(scale * std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  for (int z : zeros) w[static_cast<size_t>(z)] = 0;
  return normalised(w);
}

Dist one_hot(int v, int at) {
  Dist d(static_cast<size_t>(v), 0.0f);
  d[static_cast<size_t>(at)] = 1.0f;
  return d;
}

// 24 pairs over vocabularies of 3..12 tokens covering the cases the rule must get right.
std::vector<Pair> synthetic_pairs() {
  std::vector<Pair> out;
  for (int i = 0; i < 8; ++i) {
    const int v = 3 + i;
    out.push_back({"dense " + std::to_string(i), random_dist(100 + i, v, 1.0), random_dist(200 + i, v, 1.0)});
  }
  out.push_back({"peaked p, flat q", random_dist(301, 8, 2.5), random_dist(302, 8, 0.2)});
  out.push_back({"flat p, peaked q", random_dist(303, 8, 0.2), random_dist(304, 8, 2.5)});
  out.push_back({"q zero where p has mass", random_dist(305, 6, 1.0), random_dist(306, 6, 1.0, {0, 3})});
  out.push_back({"q zero on p's mode", random_dist(307, 10, 1.5), random_dist(308, 10, 1.0, {0, 1, 2, 3, 4})});
  out.push_back({"p zero where q has mass", random_dist(309, 6, 1.0, {1, 4}), random_dist(310, 6, 1.0)});
  out.push_back({"p zero on most of q", random_dist(311, 12, 1.0, {0, 1, 2, 3, 4, 5, 6, 7}), random_dist(312, 12, 1.0)});
  out.push_back({"disjoint supports", random_dist(313, 8, 1.0, {0, 1, 2, 3}), random_dist(314, 8, 1.0, {4, 5, 6, 7})});
  {
    const Dist p = random_dist(315, 7, 1.0);
    out.push_back({"p == q", p, p});
  }
  {
    const Dist p = random_dist(316, 12, 2.0);
    out.push_back({"p == q, peaked", p, p});
  }
  out.push_back({"one-hot q on a likely token", random_dist(317, 5, 1.0), one_hot(5, 2)});
  out.push_back({"one-hot q on an unlikely token", random_dist(318, 9, 1.5), one_hot(9, 8)});
  out.push_back({"one-hot q where p is 0", random_dist(319, 6, 1.0, {3}), one_hot(6, 3)});
  out.push_back({"one-hot p, dense q", one_hot(6, 4), random_dist(320, 6, 1.0)});
  out.push_back({"near-equal p and q", random_dist(321, 8, 1.0), random_dist(321, 8, 1.02)});
  return out;
}

enum class Bug { None, ResidualIsP, InvertedRatio };

// The first token of a k = 1 round at `position`: the draft draws t ~ q, the verifier judges it.
// A planted bug replaces one step of the rule, composed from the same primitives.
int32_t first_token(const Dist& p, const Dist& q, uint64_t seed, int64_t position, Bug bug) {
  std::vector<float> log_q(q.size());
  for (size_t v = 0; v < q.size(); ++v) log_q[v] = q[v] > 0 ? std::log(q[v]) : -INFINITY;
  const int32_t t = sample_gumbel(log_q, seed, position, RngStream::Draft);
  if (bug == Bug::None) {
    Dist p2 = p;
    p2.insert(p2.end(), p.begin(), p.end());  // p at k+1 = 2 positions; the bonus row is unused here
    return speculative_sample({&t, 1}, q, p2, static_cast<int64_t>(p.size()), seed, position).tokens[0];
  }
  const double u = acceptance_uniform(seed, position);
  if (bug == Bug::ResidualIsP) {
    if (accept_draft_token(p[t], q[t], u)) return t;
    std::vector<float> log_p(p.size());
    for (size_t v = 0; v < p.size(); ++v) log_p[v] = p[v] > 0 ? std::log(p[v]) : -INFINITY;
    return sample_gumbel(log_p, seed, position, RngStream::Residual);
  }
  if (accept_draft_token(q[t], p[t], u)) return t;  // min(1, q/p) instead of min(1, p/q)
  return sample_recovered(p, q, seed, position);
}

constexpr int64_t kDraws = 200000;

test::ChiSquare draws_against_p(const Pair& pr, uint64_t seed, Bug bug) {
  std::vector<int64_t> counts(pr.p.size(), 0);
  for (int64_t pos = 0; pos < kDraws; ++pos) ++counts[static_cast<size_t>(first_token(pr.p, pr.q, seed, pos, bug))];
  std::vector<double> p(pr.p.begin(), pr.p.end());
  return test::chi_square_test(counts, p, kDraws);
}

// The distribution a planted bug produces, worked out by hand, and its total variation from p.
double bug_total_variation(const Pair& pr, Bug bug) {
  const size_t v = pr.p.size();
  std::vector<double> out(v, 0), res(v, 0);
  double beta = 0, mass = 0;
  for (size_t i = 0; i < v; ++i) {
    beta += std::min(pr.p[i], pr.q[i]);
    res[i] = std::max(0.0, static_cast<double>(pr.p[i]) - pr.q[i]);
    mass += res[i];
  }
  for (size_t i = 0; i < v; ++i) res[i] = mass < kResidualFloor ? pr.p[i] : res[i] / mass;
  if (bug == Bug::ResidualIsP) {
    for (size_t i = 0; i < v; ++i) out[i] = std::min(pr.p[i], pr.q[i]) + (1 - beta) * pr.p[i];
  } else {
    double accepted = 0;
    for (size_t i = 0; i < v; ++i) {
      const double a = pr.p[i] > 0 ? std::min(1.0, static_cast<double>(pr.q[i]) / pr.p[i]) : 0.0;
      out[i] = pr.q[i] * a;
      accepted += out[i];
    }
    for (size_t i = 0; i < v; ++i) out[i] += (1 - accepted) * res[i];
  }
  double tv = 0;
  for (size_t i = 0; i < v; ++i) tv += std::abs(out[i] - pr.p[i]) / 2;
  return tv;
}

TEST(SpeculativeSampling, OutputFollowsPForEveryPairOfDistributions) {
  const auto pairs = synthetic_pairs();
  ASSERT_GE(pairs.size(), 20u);
  for (size_t i = 0; i < pairs.size(); ++i) {
    const auto r = draws_against_p(pairs[i], 1000 + i, Bug::None);
    EXPECT_TRUE(r.pass()) << pairs[i].name << ": " << r.str();
  }
}

TEST(SpeculativeSampling, TheTestRejectsAResidualReplacedByP) {
  int checked = 0;
  for (const Pair& pr : synthetic_pairs()) {
    if (bug_total_variation(pr, Bug::ResidualIsP) < 0.02) continue;  // the bug barely moves this pair
    const auto r = draws_against_p(pr, 77, Bug::ResidualIsP);
    EXPECT_FALSE(r.pass()) << pr.name << ": the planted bug went unnoticed, " << r.str();
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

TEST(SpeculativeSampling, TheTestRejectsAnInvertedAcceptanceRatio) {
  int checked = 0;
  for (const Pair& pr : synthetic_pairs()) {
    if (bug_total_variation(pr, Bug::InvertedRatio) < 0.02) continue;
    const auto r = draws_against_p(pr, 78, Bug::InvertedRatio);
    EXPECT_FALSE(r.pass()) << pr.name << ": the planted bug went unnoticed, " << r.str();
    ++checked;
  }
  EXPECT_GE(checked, 15);
}

TEST(SpeculativeSampling, AOneHotDraftIsAcceptedWithProbabilityPOfItsToken) {
  const Dist p = random_dist(400, 6, 1.0), q = one_hot(6, 1);
  Dist p2 = p;
  p2.insert(p2.end(), p.begin(), p.end());
  int64_t accepted = 0;
  const int64_t n = 100000;
  const int32_t t = 1;
  for (int64_t pos = 0; pos < n; ++pos) accepted += speculative_sample({&t, 1}, q, p2, 6, 5, pos).accepted;
  const double rate = static_cast<double>(accepted) / n, sd = std::sqrt(p[1] * (1 - p[1]) / n);
  EXPECT_NEAR(rate, p[1], 5 * sd);
}

TEST(SpeculativeSampling, ATokenTheDraftGaveNoMassIsRejected) {
  EXPECT_FALSE(accept_draft_token(0.5, 0.0, 1e-9));
  EXPECT_FALSE(accept_draft_token(0.0, 0.3, 1e-9));
  EXPECT_TRUE(accept_draft_token(0.3, 0.3, 0.999999));
  // The recovered token after such a rejection still comes from max(0, p - q), which keeps t.
  const Dist p = {0.2f, 0.8f}, q = {1.0f, 0.0f};
  for (int64_t pos = 0; pos < 50; ++pos) EXPECT_EQ(sample_recovered(p, q, 9, pos), 1);
}

TEST(SpeculativeSampling, AResidualWithNoMassFallsBackToP) {
  const Dist p = random_dist(401, 5, 1.0);
  std::vector<int64_t> counts(5, 0);
  for (int64_t pos = 0; pos < kDraws; ++pos) ++counts[static_cast<size_t>(sample_recovered(p, p, 3, pos))];
  const auto r = test::chi_square_test(counts, std::vector<double>(p.begin(), p.end()), kDraws);
  EXPECT_TRUE(r.pass()) << r.str();
}

TEST(SpeculativeSampling, AllKAcceptedAddsABonusTokenDrawnFromTheLastRow) {
  // p == q at both draft positions: always accepted; the bonus comes from row 3, one-hot at 4.
  const int64_t v = 5;
  const Dist d = random_dist(402, 5, 1.0), bonus = one_hot(5, 4);
  Dist q = d, p = d;
  q.insert(q.end(), d.begin(), d.end());
  p.insert(p.end(), d.begin(), d.end());
  p.insert(p.end(), bonus.begin(), bonus.end());
  const std::vector<int32_t> draft = {0, 3};
  const RoundOutcome r = speculative_sample(draft, q, p, v, 11, 40);
  EXPECT_EQ(r.accepted, 2);
  EXPECT_TRUE(r.bonus);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{0, 3, 4}));
}

TEST(SpeculativeSampling, ASeedAndPositionFixTheOutcome) {
  const Dist p = random_dist(403, 8, 1.0), q = random_dist(404, 8, 1.0);
  for (int64_t pos = 0; pos < 200; ++pos)
    EXPECT_EQ(first_token(p, q, 21, pos, Bug::None), first_token(p, q, 21, pos, Bug::None));
}

TEST(GreedyVerify, AcceptsWhileTheDraftIsTheArgmaxAndCorrectsWithTheArgmax) {
  // rows' argmax: 2, 0, 1, 3
  const std::vector<float> logits = {0, 1, 5, 0, /**/ 9, 1, 2, 0, /**/ 0, 3, 1, 0, /**/ 0, 0, 0, 1};
  const std::vector<int32_t> all_good = {2, 0, 1}, second_bad = {2, 3, 1};
  RoundOutcome r = greedy_verify(all_good, logits, 4);
  EXPECT_EQ(r.accepted, 3);
  EXPECT_TRUE(r.bonus);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{2, 0, 1, 3}));
  r = greedy_verify(second_bad, logits, 4);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_FALSE(r.bonus);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{2, 0}));
}

TEST(CoupledVerify, AcceptsExactlyTheTargetsOwnDrawAndCorrectsWithIt) {
  const int64_t v = 8;
  const SamplingParams sp{0.9f, 5, 0.9f, 1234};
  std::vector<float> logits;
  for (int i = 0; i < 4 * v; ++i) logits.push_back(static_cast<float>(std::sin(i * 1.7) * 2));
  std::vector<int32_t> y;  // what sample_token draws at positions 30..33
  for (int i = 0; i < 4; ++i) y.push_back(sample_token(std::span<const float>(logits).subspan(i * v, v), sp, 30 + i));
  RoundOutcome r = coupled_verify({y.data(), 3}, logits, v, sp, 30);
  EXPECT_EQ(r.accepted, 3);
  EXPECT_EQ(r.tokens, y);
  const std::vector<int32_t> wrong_second = {y[0], (y[1] + 1) % 8, y[2]};
  r = coupled_verify(wrong_second, logits, v, sp, 30);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{y[0], y[1]}));
}

// The pipeline judges a round's drafts, then its optimistic extra token against the round's
// last row, in two calls without a bonus row; that must decide exactly what one call over the
// joined draft decides, in every mode.
TEST(VerifyDraft, JudgingWithoutABonusRowInTwoStepsEqualsJudgingTheJoinedDraft) {
  const int64_t v = 6;
  std::vector<float> logits;  // 4 rows: t1, t2, t3 (the extra token), then the bonus row
  for (int i = 0; i < 4 * v; ++i) logits.push_back(static_cast<float>(std::sin(i * 0.9) * 1.5));
  const Dist q1 = random_dist(501, 6, 1.0), q2 = random_dist(502, 6, 1.0), q3 = random_dist(503, 6, 1.0);
  const SamplingParams sampled[] = {{1.0f, 0, 1.0f, 0}, {0.7f, 4, 0.9f, 0}, {0.0f, 0, 1.0f, 0}};
  int both_stages = 0;
  for (const SamplingParams& base : sampled)
    for (SpecSampling mode : {SpecSampling::Exact, SpecSampling::Coupled})
      for (uint64_t seed = 0; seed < 300; ++seed) {
        SamplingParams sp = base;
        sp.seed = seed;
        const int32_t t1 = static_cast<int32_t>(seed % 6), t2 = static_cast<int32_t>((seed / 6) % 6),
                      t3 = static_cast<int32_t>((seed / 36) % 6);
        DraftProposal joined;
        joined.tokens = {t1, t2, t3};
        joined.q = q1;
        joined.q.insert(joined.q.end(), q2.begin(), q2.end());
        joined.q.insert(joined.q.end(), q3.begin(), q3.end());
        const RoundOutcome want = verify_draft(joined, logits, sp, 50, mode);

        DraftProposal first = joined, extra;
        first.tokens.pop_back();
        first.q.resize(2 * v);
        extra.tokens = {t3};
        extra.q = q3;
        const std::span<const float> rows(logits);
        RoundOutcome got = verify_draft_without_bonus(first, rows.first(2 * v), sp, 50, mode);
        EXPECT_FALSE(got.bonus);
        EXPECT_EQ(got.tokens.size(), static_cast<size_t>(got.accepted == 2 ? 2 : got.accepted + 1));
        if (got.accepted == 2) {
          ++both_stages;
          const RoundOutcome second = verify_draft_without_bonus(extra, rows.subspan(2 * v, v), sp, 52, mode);
          got.accepted += second.accepted;
          got.tokens.insert(got.tokens.end(), second.tokens.begin(), second.tokens.end());
        }
        // the joined call goes on to draw a bonus after t3; the two-step one stops at t3
        std::vector<int32_t> want_tokens = want.tokens;
        if (want.bonus) want_tokens.pop_back();
        EXPECT_EQ(got.accepted, want.accepted) << "seed " << seed;
        EXPECT_EQ(got.tokens, want_tokens) << "seed " << seed;
      }
  EXPECT_GT(both_stages, 100) << "the second step should be reached often";
}

// The on-demand verdict against the whole-row rule's, counting which paths of the rule were taken.
struct PathTally {
  int accepted = 0, rejected = 0, bonus = 0;
  void expect_same(const RoundOutcome& got, const RoundOutcome& want, const std::string& where) {
    EXPECT_EQ(got.tokens, want.tokens) << where;
    EXPECT_EQ(got.accepted, want.accepted) << where;
    EXPECT_EQ(got.bonus, want.bonus) << where;
    accepted += want.accepted;
    rejected += want.bonus ? 0 : 1;
    bonus += want.bonus ? 1 : 0;
  }
};

// verify_draft transforms a row of logits only as far as the round needs it (one exp for the token
// an acceptance test reads, the whole row for a residual or bonus draw). It must judge exactly as
// the rule does on the rows transform_to_probs makes, for every sampling transform, through
// acceptances, rejections and bonus draws alike.
TEST(VerifyDraft, JudgingLogitsOnDemandEqualsJudgingTheirWholeProbabilityRows) {
  const int64_t v = 64;
  const SamplingParams transforms[] = {{0.8f, 0, 1.0f, 0}, {0.8f, 8, 1.0f, 0}, {1.0f, 0, 0.9f, 0}, {0.7f, 12, 0.95f, 0}};
  PathTally tally, block_tally;
  for (const SamplingParams& base : transforms)
    for (uint64_t seed = 0; seed < 200; ++seed) {
      SamplingParams sp = base;
      sp.seed = seed;
      const int64_t k = 1 + static_cast<int64_t>(seed % 4);
      std::vector<float> logits;
      for (int64_t i = 0; i < (k + 1) * v; ++i)
        logits.push_back(static_cast<float>(3.0 * std::sin(static_cast<double>(i * 7 + seed * 13) * 0.37)));
      DraftProposal d;
      std::vector<float> p, row_p;
      for (int64_t i = 0; i <= k; ++i) {
        transform_to_probs(std::span<const float>(logits).subspan(static_cast<size_t>(i * v), v), sp, row_p);
        p.insert(p.end(), row_p.begin(), row_p.end());
        if (i == k) break;
        // q: the target's own row (mostly accepted), another row (often rejected) or one-hot
        const Dist q = seed % 3 == 0 ? row_p : seed % 3 == 1 ? random_dist(700 + seed * 8 + i, v, 1.5) : one_hot(v, static_cast<int>(i * 5 % v));
        const int32_t t = static_cast<int32_t>((seed * 31 + i * 17) % v);
        d.tokens.push_back(seed % 3 == 2 ? static_cast<int32_t>(i * 5 % v) : t);
        d.q.insert(d.q.end(), q.begin(), q.end());
      }
      const std::string where = "seed " + std::to_string(seed) + ", top-k " + std::to_string(sp.top_k) + ", top-p " +
                                std::to_string(sp.top_p);
      tally.expect_same(verify_draft(d, logits, sp, 90, SpecSampling::Exact), speculative_sample(d.tokens, d.q, p, v, seed, 90), where);
      block_tally.expect_same(verify_draft(d, logits, sp, 90, SpecSampling::Block), block_sample(d.tokens, d.q, p, v, seed, 90),
                              "block, " + where);
    }
  // every path of both rules was taken, many times
  for (const PathTally* t : {&tally, &block_tally}) {
    EXPECT_GT(t->accepted, 200);
    EXPECT_GT(t->rejected, 100);
    EXPECT_GT(t->bonus, 50);
  }
}

// The same over rows of the default model's vocabulary size, where the residual and bonus draws
// rule tokens out 64 at a time (spec/gumbel_filter.h) before computing their probabilities: logits
// from flat to peaked, q from the head's reduced vocabulary (the first 2,048 ids), the target's own
// shape or one-hot; T 0.8 and 1.3 over the whole vocabulary and a top-p row.
TEST(VerifyDraft, JudgingLogitsOnDemandEqualsJudgingTheirWholeProbabilityRowsOverAFullVocabulary) {
  const int64_t v = 49152;
  const SamplingParams transforms[] = {{0.8f, 0, 1.0f, 0}, {1.3f, 0, 1.0f, 0}, {0.8f, 0, 0.9f, 0}};
  std::mt19937_64 rng(31);
  PathTally tally, block_tally;
  for (int trial = 0; trial < 120; ++trial) {
    SamplingParams sp = transforms[trial % 3];
    sp.seed = rng();
    const int64_t k = 1 + trial % 2;
    const float spread = std::array<float, 4>{0.5f, 2.0f, 4.0f, 8.0f}[trial % 4];
    std::normal_distribution<float> g(0.0f, spread);
    std::vector<float> logits(static_cast<size_t>((k + 1) * v));
    for (float& x : logits) x = g(rng);
    DraftProposal d;
    std::vector<float> p, row_p;
    for (int64_t i = 0; i <= k; ++i) {
      const std::span<const float> row_logits = std::span<const float>(logits).subspan(static_cast<size_t>(i * v), v);
      transform_to_probs(row_logits, sp, row_p);
      p.insert(p.end(), row_p.begin(), row_p.end());
      if (i == k) break;
      std::vector<float> q(static_cast<size_t>(v), 0.0f);
      int32_t t = 0;
      if (trial % 3 == 2) {  // one-hot on the target's likeliest token
        t = argmax(row_logits);
        q[static_cast<size_t>(t)] = 1.0f;
      } else {  // the head's vocabulary: the target's shape (mostly accepted) or blurred (often rejected)
        std::vector<float> head(row_logits.begin(), row_logits.begin() + 2048), qh;
        if (trial % 3 == 1)
          for (size_t j = 0; j < head.size(); ++j) head[j] += static_cast<float>(std::sin(static_cast<double>(j) * 0.7) * 2.0);
        transform_to_probs(head, sp, qh);
        std::copy(qh.begin(), qh.end(), q.begin());
        t = static_cast<int32_t>(rng() % 2048);
        if (trial % 2 == 0) t = argmax(qh);
      }
      d.tokens.push_back(t);
      d.q.insert(d.q.end(), q.begin(), q.end());
    }
    const std::string where = "trial " + std::to_string(trial) + ", top-p " + std::to_string(sp.top_p);
    tally.expect_same(verify_draft(d, logits, sp, 77 + trial, SpecSampling::Exact),
                      speculative_sample(d.tokens, d.q, p, v, sp.seed, 77 + trial), where);
    block_tally.expect_same(verify_draft(d, logits, sp, 77 + trial, SpecSampling::Block),
                            block_sample(d.tokens, d.q, p, v, sp.seed, 77 + trial), "block, " + where);
  }
  for (const PathTally* t : {&tally, &block_tally}) {
    EXPECT_GT(t->accepted, 10);
    EXPECT_GT(t->rejected, 10);
    EXPECT_GT(t->bonus, 5);
  }
}

// Block verification with one draft token is the token rule with its round's uniform (RngStream::
// BlockAccept): kept when u q(t) < p(t), and then or else the same bonus or recovered token as the
// token rule draws, over every synthetic pair (q zero where p has mass, one-hot q, p == q, ...).
TEST(BlockVerification, WithOneDraftTokenIsTheTokenRuleWithTheRoundsUniform) {
  int kept = 0, judged = 0, same_verdict = 0;
  for (const Pair& pr : synthetic_pairs()) {
    const int64_t v = static_cast<int64_t>(pr.p.size());
    Dist p2 = pr.p;
    p2.insert(p2.end(), pr.p.begin(), pr.p.end());
    std::vector<float> log_q(pr.q.size());
    for (size_t i = 0; i < pr.q.size(); ++i) log_q[i] = pr.q[i] > 0 ? std::log(pr.q[i]) : -INFINITY;
    for (int64_t pos = 0; pos < 2000; ++pos) {
      const int32_t t = sample_gumbel(log_q, 5, pos, RngStream::Draft);
      const RoundOutcome a = speculative_sample({&t, 1}, pr.q, p2, v, 5, pos), b = block_sample({&t, 1}, pr.q, p2, v, 5, pos);
      const double u = philox_uniform(5, pos, RngStream::BlockAccept, 0);
      const double q_t = pr.q[static_cast<size_t>(t)], p_t = pr.p[static_cast<size_t>(t)];
      ASSERT_EQ(b.accepted, q_t > 0 && u * q_t < p_t ? 1 : 0) << pr.name << " at " << pos;
      ASSERT_EQ(b.bonus, b.accepted == 1) << pr.name << " at " << pos;
      if (a.accepted == b.accepted) {
        ASSERT_EQ(a.tokens, b.tokens) << pr.name << " at " << pos;
        ++same_verdict;
      }
      kept += b.accepted;
      ++judged;
    }
  }
  EXPECT_GT(kept, judged / 4);
  EXPECT_LT(kept, judged * 3 / 4);
  EXPECT_GT(same_verdict, judged / 2);
}

// The paper's example (Sun et al. 2025, section 1): target p = (1/3, 2/3) and draft q = (2/3, 1/3)
// at every position. The token rule keeps 10/9 of a 2-token draft on average and block
// verification 11/9; of a 4-token draft 130/81 and 166/81 (worked out by enumerating every draft
// and both rules' outcomes exactly: docs/speculative.md, "Block verification"). Each round's first
// token must still follow p.
TEST(BlockVerification, KeepsWhatThePaperComputesForTwoTokensAndMoreForFour) {
  const Dist p = {1.0f / 3, 2.0f / 3}, q = {2.0f / 3, 1.0f / 3};
  constexpr int64_t kRounds = 100000;
  for (const auto& [k, token_mean, block_mean] : {std::tuple{2, 10.0 / 9, 11.0 / 9}, std::tuple{4, 130.0 / 81, 166.0 / 81}}) {
    std::vector<float> qs, ps;
    for (int i = 0; i < k; ++i) qs.insert(qs.end(), q.begin(), q.end());
    for (int i = 0; i <= k; ++i) ps.insert(ps.end(), p.begin(), p.end());
    int64_t token_kept = 0, block_kept = 0;
    std::vector<int64_t> first(2, 0);
    for (int64_t seed = 0; seed < kRounds; ++seed) {
      std::vector<int32_t> draft;
      for (int i = 0; i < k; ++i) draft.push_back(philox_uniform(static_cast<uint64_t>(seed), i, RngStream::Draft, 0) < 2.0 / 3 ? 0 : 1);
      token_kept += speculative_sample(draft, qs, ps, 2, static_cast<uint64_t>(seed), 0).accepted;
      const RoundOutcome b = block_sample(draft, qs, ps, 2, static_cast<uint64_t>(seed), 0);
      block_kept += b.accepted;
      ++first[static_cast<size_t>(b.tokens[0])];
    }
    // Standard errors below 0.005 (at most 1.5 tokens' spread over 100k rounds): 0.02 is four of them.
    EXPECT_NEAR(static_cast<double>(token_kept) / kRounds, token_mean, 0.02) << "k " << k;
    EXPECT_NEAR(static_cast<double>(block_kept) / kRounds, block_mean, 0.02) << "k " << k;
    const test::ChiSquare chi = test::chi_square_test(first, {1.0 / 3, 2.0 / 3}, kRounds);
    EXPECT_TRUE(chi.pass()) << "k " << k << ": " << chi.str();
  }
}

TEST(Sampling, ProbabilitiesFromLogProbabilitiesAreTheirExpAndZeroOutsideTheKeptSet) {
  std::vector<float> x = {0.0f, -1.5f, -std::numeric_limits<float>::infinity(), -87.0f, -200.0f, -1e-7f};
  std::vector<float> p = x;
  probs_from_log(p);
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    EXPECT_EQ(std::memcmp(&p[i], &want, sizeof(float)), 0) << "entry " << i;
  }
}

TEST(VerifyDraft, RefusesLogitsThatAreNotKPlusOneRowsAndTokensOutsideTheVocabulary) {
  DraftProposal d;
  d.tokens = {1, 2};
  d.q.assign(8, 0.25f);
  const std::vector<float> logits(10, 0.0f);  // not 3 rows
  EXPECT_THROW(verify_draft(d, logits, SamplingParams{}, 0, SpecSampling::Exact), std::invalid_argument);
  d.tokens = {1, 7};
  EXPECT_THROW(verify_draft(d, std::vector<float>(12, 0.0f), SamplingParams{}, 0, SpecSampling::Exact),
               std::invalid_argument);
  EXPECT_THROW(parse_spec_sampling("typical"), std::invalid_argument);
}

}  // namespace
}  // namespace specula
