// Which tokens of a 64-token block can still win a Gumbel-max draw (spec/gumbel_max.h), decided for
// the whole block at once: the uniforms of its 64 ids come from 16 Philox blocks computed side by
// side (8 at a time in 256-bit lanes where the CPU has AVX2; the same bits as philox_block, which
// the scalar half calls). Internal to spec/.
#pragma once
#include <cstdint>

#include "spec/philox.h"

namespace specula {

// The tokens a draw must still visit in [first, first + 64): bit i is clear only when token
// first + i provably cannot beat `best` (the best score so far), given ub[i] >= its log weight:
//   out of reach  ub[i] < best - max_noise                (its noise is at most max_noise), or
//   far           best - ub[i] >= far_noise and its uniform's word < far_word (its noise is then
//                 below far_noise - 0.1, GumbelMax::kFarU).
// The thresholds are rounded to float toward keeping tokens, and NaN bounds are kept, so the mask
// holds every token that GumbelMax::visit_bounded could let win, and usually few others.
// `first` is a multiple of 64 (= 4 x 16 Philox blocks).
struct GumbelFilter {
  uint64_t seed;
  int64_t position;
  RngStream stream;
  double max_noise, far_noise;
  uint32_t far_word;
  uint64_t candidates(const float* ub, uint64_t first, double best) const;
  // The same mask without the 256-bit half (what a CPU without AVX2 computes; tests compare them).
  uint64_t candidates_portable(const float* ub, uint64_t first, double best) const;
  // The mask for `count` (<= 64) tokens with ids ids[0..count) (any ids: a drafter's reduced
  // vocabulary) and bounds ub[0..count); bits from `count` on are clear. On the AVX-512 path
  // their uniforms come 16 at a time (one Philox block a lane); elsewhere one by one.
  uint64_t candidates_among(const float* ub, const int32_t* ids, int count, double best) const;

 private:
  // The two bound thresholds for `best` (see masks in gumbel_filter.cpp).
  void thresholds(double best, float& below_reach, float& far_bound) const;
  uint64_t masks(const float* ub, uint64_t first, double best, bool vector) const;
};

// The uniforms' far test as a word threshold: philox_word_uniform(w) < far_u exactly when w < the result.
uint32_t far_word_below(double far_u);

namespace detail {
// The 64-bit mask of ids first .. first + 63 whose word is >= far_word (AVX2 and FMA only).
uint64_t philox_not_far_avx2(uint64_t seed, int64_t position, RngStream stream, uint64_t first, uint32_t far_word);
// The same mask in one pass of sixteen 512-bit lanes (AVX-512 F only).
uint64_t philox_not_far_avx512(uint64_t seed, int64_t position, RngStream stream, uint64_t first, uint32_t far_word);
// The mask of ids[0..count) (count <= 64, any ids >= 0) whose word is >= far_word, sixteen ids a pass
// (each its own Philox block in a lane; AVX-512 F only).
uint64_t philox_not_far_ids_avx512(uint64_t seed, int64_t position, RngStream stream, const int32_t* ids, int count,
                                   uint32_t far_word);
// ub[i] < below_reach (bit set in *out_mask) and ub[i] <= far_bound (bit set in *far_mask), i < 64.
void bound_masks_avx2(const float* ub, float below_reach, float far_bound, uint64_t* out_mask, uint64_t* far_mask);
}  // namespace detail

}  // namespace specula
