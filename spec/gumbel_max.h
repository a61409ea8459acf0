// The Gumbel-max draw that computes few scores (spec/sampling.cpp's sample_gumbel and the verifier's
// residual and bonus draws in spec/speculative_sampling.cpp; docs/speculative.md, "The Gumbel draw
// computes few scores"), and the block maximum it and the transform's top-k scan skip blocks by.
// Internal to spec/.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>

#include "spec/gumbel_filter.h"
#include "spec/philox.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace specula {

// The largest of x[0..n) (NaN never wins); SSE2, which every x86-64 CPU has, four lanes at a time.
inline float block_max(const float* x, size_t n) {
  size_t i = 0;
  float m = -std::numeric_limits<float>::infinity();
#if defined(__SSE2__)
  __m128 a = _mm_set1_ps(m), b = a;
  for (; i + 8 <= n; i += 8) {
    a = _mm_max_ps(_mm_loadu_ps(x + i), a);  // the second operand when either is NaN
    b = _mm_max_ps(_mm_loadu_ps(x + i + 4), b);
  }
  float lanes[4];
  _mm_storeu_ps(lanes, _mm_max_ps(a, b));
  for (float l : lanes) m = l > m ? l : m;
#endif
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// The Gumbel-max draw, exactly as if every token's score logp[v] - log(-log(U_v)) were computed
// and the largest taken (the lowest id among equal scores), but computing few of them. A score
// is logp[v] plus noise of at most kMaxNoise (U_v <= 1 - 2^-33, so -log(U_v) >= 1.16e-10 and
// the noise -log(-log(U_v)) <= 22.87), so a token whose logp is more than kMaxNoise below the
// best score so far cannot win and needs no draw. Of the rest, a token that would need noise of
// at least kFarNoise to win cannot win with U_v < kFarU (there the noise is below 3.9): its
// uniform is compared, without the two logarithms. Both margins (0.13 and 0.1) are far larger
// than the rounding of the score. The uniforms come four to a Philox block, one block for four
// consecutive ids. The result does not depend on the order the tokens are visited in, so the
// caller visits a likely winner (the largest logp) first, which makes the best score high from
// the start.
struct GumbelMax {
  static constexpr double kMaxNoise = 23.0;
  static constexpr double kFarNoise = 4.0;
  static inline const double kFarU = std::exp(-std::exp(-(kFarNoise - 0.1)));
  uint64_t seed;
  int64_t position;
  RngStream stream;
  int32_t best = -1;
  double best_score = -std::numeric_limits<double>::infinity();
  uint64_t cached = ~uint64_t{0};
  PhiloxBlock words{};

  // The block filter with these margins (spec/gumbel_filter.h): which of 64 tokens can still win.
  GumbelFilter filter() const {
    static const uint32_t far_word = far_word_below(kFarU);
    return {seed, position, stream, kMaxNoise, kFarNoise, far_word};
  }

  // Whether no token with this logp (or with any logp up to this bound) can beat the best score so far.
  bool out_of_reach(double logp) const { return logp < best_score - kMaxNoise; }
  void visit(int32_t v, float logp) {
    visit_bounded(v, logp, [logp] { return logp; });
  }
  // visit(v, logp()) where `upper` >= logp(): logp() is called only for a token the bound leaves
  // in reach, near enough to the best score for its uniform.
  template <class LogP>
  void visit_bounded(int32_t v, double upper, LogP&& logp) {
    if (out_of_reach(upper)) return;
    const uint64_t index = static_cast<uint64_t>(v);
    if (index >> 2 != cached) {
      cached = index >> 2;
      words = philox_block(seed, position, stream, cached);
    }
    const double u = philox_word_uniform(words[index & 3]);
    if (best_score - upper >= kFarNoise && u < kFarU) return;
    const double x = static_cast<double>(logp());
    if (out_of_reach(x)) return;
    if (best_score - x >= kFarNoise && u < kFarU) return;
    const double score = x - std::log(-std::log(u));
    if (score > best_score || (score == best_score && v < best)) {
      best_score = score;
      best = v;
    }
  }
};

// Tokens per block that the draws below pass over whole when the block's cover says none can win.
inline constexpr size_t kGumbelBlock = 64;

// The draw sample_gumbel makes over the row log_w(v) (-inf where weight(v) <= 0) for v < n, where
// log_w(v) is a float rounding of log(weight(v)) for non-negative weights (probabilities, a
// residual's masses), taking the logarithm only for the tokens that can win. block_cover(b) bounds
// the weights of the kGumbelBlock tokens from b from above: a whole block whose cover is 0 or
// below the floor is passed over. A token's weight below the floor exp(best - kMaxNoise) (1 - 1e-4)
// is out of reach (log_w is within half a float ulp, at most 4e-6, of the log); one in reach first
// meets the far-noise test with the bound e ln 2 + 1e-5 from its binary exponent e (weight < 2^e),
// and only then is its log taken. `likely` (or -1) is visited first. Returns -1 when every weight
// is 0. `bound` (or null): a row with log_w(v) <= bound[v] + kBoundMargin for every v, which lets
// a whole block's tokens be tested at once (GumbelFilter) before any weight is computed.
inline constexpr double kBoundMargin = 1e-3;
template <class BlockCover, class Weight, class LogW>
int32_t sample_gumbel_of_weights_by_block(size_t n, BlockCover&& block_cover, Weight&& weight, LogW&& log_w,
                                          int32_t likely, uint64_t seed, int64_t position, RngStream stream,
                                          const float* bound = nullptr) {
  constexpr double kLn2 = 0.6931471805599453;
  GumbelMax g{seed, position, stream};
  double floor_w = 0;  // weights below this cannot win
  auto visit = [&](int32_t v) {
    const double w = weight(v);
    if (!(w > 0) || w < floor_w) return;
    // w < 2^e for the biased exponent field E of w: e = E - 1022 (a subnormal's E is 0).
    const int e = static_cast<int>((std::bit_cast<uint64_t>(w) >> 52) & 0x7ff) - 1022;
    const double before = g.best_score;
    g.visit_bounded(v, e * kLn2 + 1e-5, [&] { return log_w(v); });
    if (g.best_score != before) floor_w = std::exp(g.best_score - GumbelMax::kMaxNoise) * (1 - 1e-4);
  };
  if (likely >= 0) visit(likely);
  const GumbelFilter filter = g.filter();
  for (size_t b = 0; b < n; b += kGumbelBlock) {
    const size_t end = std::min(n, b + kGumbelBlock);
    if (end - b == kGumbelBlock) {
      const double m = block_cover(b);
      if (!(m > 0) || m < floor_w) continue;
      if (bound != nullptr) {
        for (uint64_t left = filter.candidates(bound + b, b, g.best_score - kBoundMargin); left != 0; left &= left - 1)
          visit(static_cast<int32_t>(b + static_cast<size_t>(std::countr_zero(left))));
        continue;
      }
    }
    for (size_t v = b; v < end; ++v) visit(static_cast<int32_t>(v));
  }
  return g.best;
}

// The same draw with the cover as a row: cover[v] >= weight(v), a block bounded by its maximum.
template <class Weight, class LogW>
int32_t sample_gumbel_of_weights(std::span<const float> cover, Weight&& weight, LogW&& log_w, int32_t likely,
                                 uint64_t seed, int64_t position, RngStream stream) {
  return sample_gumbel_of_weights_by_block(
      cover.size(), [&](size_t b) { return static_cast<double>(block_max(cover.data() + b, kGumbelBlock)); }, weight,
      log_w, likely, seed, position, stream);
}

}  // namespace specula
