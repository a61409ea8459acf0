// spec/gumbel_filter.h: the block filter, and its scalar half where the CPU lacks AVX2.
#include "spec/gumbel_filter.h"

#include <cmath>
#include <limits>

#include "gpu/host/matmul_kernels.h"

namespace specula {

namespace {

// The largest float <= x (x finite or infinite).
float float_at_or_below(double x) {
  float f = static_cast<float>(x);
  if (static_cast<double>(f) > x) f = std::nextafter(f, -std::numeric_limits<float>::infinity());
  return f;
}

// Whether the AVX-512 loops may run (not where SPECULA_SIMD caps the host at avx2).
bool wide_path() { return host_kernels::default_isa() == host_kernels::Isa::kAvx512; }

// ub[i] < below_reach (bit i of *out) and ub[i] <= far_bound (bit i of *far) for i < count, in
// scalar code (NaN: neither); what bound_masks_avx2 gives for 64.
void bound_masks_portable(const float* ub, int count, float below_reach, float far_bound, uint64_t* out, uint64_t* far) {
  *out = 0;
  *far = 0;
  for (int i = 0; i < count; ++i) {
    if (ub[i] < below_reach) *out |= uint64_t{1} << i;
    if (ub[i] <= far_bound) *far |= uint64_t{1} << i;
  }
}

uint64_t philox_not_far(uint64_t seed, int64_t position, RngStream stream, uint64_t first, uint32_t far_word,
                        bool vector) {
  if (vector) {
    // The widest the host path allows (SPECULA_SIMD=avx2 runs no AVX-512 instruction).
    return wide_path() ? detail::philox_not_far_avx512(seed, position, stream, first, far_word)
                       : detail::philox_not_far_avx2(seed, position, stream, first, far_word);
  }
  uint64_t mask = 0;
  for (uint64_t b = 0; b < 16; ++b) {
    const PhiloxBlock w = philox_block(seed, position, stream, (first >> 2) + b);
    for (uint64_t j = 0; j < 4; ++j)
      if (w[j] >= far_word) mask |= uint64_t{1} << (4 * b + j);
  }
  return mask;
}

}  // namespace

uint32_t far_word_below(double far_u) {
  // philox_word_uniform is increasing in w: find the first w whose uniform reaches far_u.
  uint64_t lo = 0, hi = uint64_t{1} << 32;  // the answer is in [lo, hi]
  while (lo < hi) {
    const uint64_t mid = (lo + hi) / 2;
    if (philox_word_uniform(static_cast<uint32_t>(mid)) < far_u) lo = mid + 1; else hi = mid;
  }
  return lo > 0xffffffffu ? 0xffffffffu : static_cast<uint32_t>(lo);
}

uint64_t GumbelFilter::candidates(const float* ub, uint64_t first, double best) const {
  return masks(ub, first, best, host_kernels::cpu_has_avx2_fma());
}

uint64_t GumbelFilter::candidates_portable(const float* ub, uint64_t first, double best) const {
  return masks(ub, first, best, false);
}

void GumbelFilter::thresholds(double best, float& below_reach, float& far_bound) const {
  // ub < below_reach implies ub < best - max_noise, and ub <= far_bound implies best - ub >=
  // far_noise, both as GumbelMax computes them in double (floats at or below the thresholds;
  // far_bound stepped down until best - far_bound itself passes, for a subtraction that rounds:
  // best - ub is then no smaller, the rounded subtraction being monotone).
  below_reach = float_at_or_below(best - max_noise);
  far_bound = float_at_or_below(best - far_noise);
  while (!(best - static_cast<double>(far_bound) >= far_noise))
    far_bound = std::nextafter(far_bound, -std::numeric_limits<float>::infinity());
}

uint64_t GumbelFilter::candidates_among(const float* ub, const int32_t* ids, int count, double best) const {
  const uint64_t valid = count >= 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1;
  if (!(best > -std::numeric_limits<double>::infinity())) return valid;  // no score yet: every token can win
  float below_reach, far_bound;
  thresholds(best, below_reach, far_bound);
  uint64_t out, far;
  bound_masks_portable(ub, count, below_reach, far_bound, &out, &far);
  const uint64_t in_reach = valid & ~out;
  if ((in_reach & far) == 0) return in_reach;  // no uniform can rule a token out: skip the draws
  uint64_t not_far = 0;
  if (wide_path()) {
    not_far = detail::philox_not_far_ids_avx512(seed, position, stream, ids, count, far_word);
  } else {
    for (int i = 0; i < count; ++i) {
      const uint64_t id = static_cast<uint64_t>(ids[i]);
      if (((far >> i) & 1) != 0 && philox_block(seed, position, stream, id >> 2)[id & 3] >= far_word) not_far |= uint64_t{1} << i;
    }
  }
  return in_reach & (~far | not_far);
}

uint64_t GumbelFilter::masks(const float* ub, uint64_t first, double best, bool vector) const {
  if (!(best > -std::numeric_limits<double>::infinity())) return ~uint64_t{0};  // no score yet: every token can win
  float below_reach, far_bound;
  thresholds(best, below_reach, far_bound);
  uint64_t out, far;
  if (vector) detail::bound_masks_avx2(ub, below_reach, far_bound, &out, &far);
  else bound_masks_portable(ub, 64, below_reach, far_bound, &out, &far);
  const uint64_t in_reach = ~out;
  if ((in_reach & far) == 0) return in_reach;  // no uniform can rule a token out: skip the draws
  return in_reach & (~far | philox_not_far(seed, position, stream, first, far_word, vector));
}

}  // namespace specula
