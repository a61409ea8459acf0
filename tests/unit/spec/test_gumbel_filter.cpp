// The Gumbel draw's block filter (spec/gumbel_filter.h): its 256- and 512-bit Philox give the scalar
// generator's words, its word threshold splits the uniforms exactly where GumbelMax's far test
// does, and it never drops a token that could still win.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gpu/host/matmul_kernels.h"
#include "spec/gumbel_filter.h"
#include "spec/gumbel_max.h"
#include "spec/philox.h"

namespace specula {
namespace {

uint64_t scalar_not_far(uint64_t seed, int64_t position, RngStream stream, uint64_t first, uint32_t far_word) {
  uint64_t mask = 0;
  for (uint64_t i = 0; i < 64; ++i) {
    const uint64_t id = first + i;
    if (philox_block(seed, position, stream, id >> 2)[id & 3] >= far_word) mask |= uint64_t{1} << i;
  }
  return mask;
}

TEST(GumbelFilter, TheVectorPhiloxGivesTheScalarGeneratorsWordsForAnyKeyAndCounter) {
  if (!host_kernels::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2 and FMA: the scalar half runs alone";
  std::mt19937_64 rng(17);
  const uint32_t thresholds[] = {0u, 1u, 0x80000000u, far_word_below(GumbelMax::kFarU), 0xffffffffu};
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const uint64_t seed = rng();
    // small and large positions (the high counter word), ids near 2^34 (block counters that wrap)
    const int64_t position = trial % 3 == 0 ? static_cast<int64_t>(rng() % 4096) : static_cast<int64_t>(rng() >> 1);
    const uint64_t first = 64 * (trial % 4 == 0 ? (uint64_t{1} << 28) - 1 - rng() % 2 : rng() % 100000);
    const RngStream stream = static_cast<RngStream>(trial % 4);
    for (uint32_t far_word : {thresholds[trial % 5], static_cast<uint32_t>(rng())}) {
      const uint64_t want = scalar_not_far(seed, position, stream, first, far_word);
      ASSERT_EQ(detail::philox_not_far_avx2(seed, position, stream, first, far_word), want)
          << "seed " << seed << " position " << position << " first " << first << " far_word " << far_word;
      if (host_kernels::cpu_has_avx512()) {
        ASSERT_EQ(detail::philox_not_far_avx512(seed, position, stream, first, far_word), want)
            << "512-bit: seed " << seed << " position " << position << " first " << first << " far_word " << far_word;
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 800);
}

TEST(GumbelFilter, TheVectorPhiloxAmongAnyIdsGivesTheScalarGeneratorsWords) {
  if (!host_kernels::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512: the among-ids draw runs its scalar loop";
  // A drafter's reduced vocabulary: ascending ids, sometimes four to a Philox block, sometimes
  // far apart, ids near 2^31, and counts that leave every tail of a 16-lane pass.
  std::mt19937_64 rng(29);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const uint64_t seed = rng();
    const int64_t position = trial % 3 == 0 ? static_cast<int64_t>(rng() % 4096) : static_cast<int64_t>(rng() >> 1);
    const RngStream stream = static_cast<RngStream>(trial % 4);
    const int count = 1 + static_cast<int>(rng() % 64);
    std::vector<int32_t> ids(static_cast<size_t>(count));
    int64_t id = trial % 5 == 0 ? (int64_t{1} << 31) - 10 * count - 1 : static_cast<int64_t>(rng() % 50000);  // ids stay below 2^31
    for (int32_t& v : ids) {
      id += trial % 2 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 9);
      v = static_cast<int32_t>(id);
    }
    const uint32_t far_word = trial % 2 == 0 ? far_word_below(GumbelMax::kFarU) : static_cast<uint32_t>(rng());
    uint64_t want = 0;
    for (int i = 0; i < count; ++i) {
      const uint64_t u = static_cast<uint64_t>(ids[static_cast<size_t>(i)]);
      if (philox_block(seed, position, stream, u >> 2)[u & 3] >= far_word) want |= uint64_t{1} << i;
    }
    ASSERT_EQ(detail::philox_not_far_ids_avx512(seed, position, stream, ids.data(), count, far_word), want)
        << "seed " << seed << " position " << position << " count " << count << " first id " << ids[0];
    ++checked;
  }
  EXPECT_EQ(checked, 400);
}

TEST(GumbelFilter, TheWordThresholdSplitsTheUniformsWhereTheFarTestDoes) {
  for (double far_u : {GumbelMax::kFarU, 0.5, 1e-9, 0.999999}) {
    const uint32_t w = far_word_below(far_u);
    ASSERT_GT(w, 0u);
    EXPECT_LT(philox_word_uniform(w - 1), far_u) << far_u;
    EXPECT_GE(philox_word_uniform(w), far_u) << far_u;
  }
}

// Every token the filter drops is one GumbelMax could not let win: below the reach of the best
// score, or far below it with a uniform under kFarU, tested here in double against the scalar
// generator's uniform. And it does drop most far tokens (a filter that keeps everything fails).
// The portable half (a CPU without AVX2) gives the same mask.
TEST(GumbelFilter, ItDropsOnlyTokensThatCannotWinAndMostOfThoseFarBelowTheBest) {
  std::mt19937_64 rng(23);
  std::normal_distribution<float> g(0.0f, 8.0f);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  int far_tokens = 0, far_dropped = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    GumbelMax gm{rng(), static_cast<int64_t>(rng() % 100000), static_cast<RngStream>(trial % 4)};
    const GumbelFilter f = gm.filter();
    std::vector<float> ub(64);
    for (float& x : ub) x = g(rng);
    if (trial % 10 == 0) ub[rng() % 64] = kNegInf;
    if (trial % 10 == 1) ub[rng() % 64] = kNaN;
    if (trial % 10 == 2) ub[rng() % 64] = 1e30f;
    // the best score near the row's top, at a tie with an entry's bound plus a threshold, or -inf
    double best = static_cast<double>(g(rng)) + 20.0;
    if (trial % 7 == 0) best = static_cast<double>(ub[rng() % 64]) + (trial % 2 ? GumbelMax::kFarNoise : GumbelMax::kMaxNoise);
    if (trial % 97 == 0) best = -std::numeric_limits<double>::infinity();
    const uint64_t first = 64 * (rng() % 1000);
    const uint64_t kept = f.candidates(ub.data(), first, best);
    ASSERT_EQ(f.candidates_portable(ub.data(), first, best), kept) << "trial " << trial;  // without AVX2, the same mask
    for (int i = 0; i < 64; ++i) {
      const double x = static_cast<double>(ub[static_cast<size_t>(i)]);
      const double u = philox_uniform(gm.seed, gm.position, gm.stream, first + static_cast<uint64_t>(i));
      const bool out_of_reach = x < best - GumbelMax::kMaxNoise;
      const bool far = best - x >= GumbelMax::kFarNoise && u < GumbelMax::kFarU;
      if (!((kept >> i) & 1)) {
        ASSERT_TRUE(out_of_reach || far) << "trial " << trial << " token " << i << " bound " << x << " best " << best;
      }
      if (!out_of_reach && far) {
        ++far_tokens;
        far_dropped += !((kept >> i) & 1);
      }
    }
  }
  ASSERT_GT(far_tokens, 10000);
  EXPECT_GT(far_dropped, far_tokens * 99 / 100);
}

}  // namespace
}  // namespace specula
