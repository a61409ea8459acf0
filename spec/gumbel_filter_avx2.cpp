// spec/gumbel_filter.h's 256-bit half: Philox4x32-10 on eight counters at once (the same bits as
// philox4x32 in spec/philox.h: 32 x 32 -> 64-bit products of the even and the odd lanes, joined),
// and the bound tests on eight floats at once. Built with -mavx2 -mfma; called only where
// cpu_has_avx2_fma().
#include <immintrin.h>

#include "spec/gumbel_filter.h"

namespace specula::detail {

namespace {

// The low and high words of x * m for eight 32-bit lanes.
inline void mul_wide(__m256i x, __m256i m, __m256i& lo, __m256i& hi) {
  const __m256i even = _mm256_mul_epu32(x, m);
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// Bit i -> bit 4 i, for 8 bits.
inline uint32_t spread4(uint32_t m) {
  uint32_t r = 0;
  for (int i = 0; i < 8; ++i) r |= ((m >> i) & 1u) << (4 * i);
  return r;
}

}  // namespace

uint64_t philox_not_far_avx2(uint64_t seed, int64_t position, RngStream stream, uint64_t first, uint32_t far_word) {
  using namespace philox_constants;
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0)), m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  const __m256i flip = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  // word < far_word as a signed compare of both with the top bit flipped
  const __m256i far_s = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(far_word)), flip);
  uint64_t mask = 0;
  for (int half = 0; half < 2; ++half) {
    const uint32_t block0 = static_cast<uint32_t>((first >> 2) + 8 * static_cast<uint64_t>(half));
    __m256i c0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(block0)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i c1 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(position)));
    __m256i c2 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32)));
    __m256i c3 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream)));
    uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
    for (int round = 0; round < kRounds; ++round) {
      __m256i lo0, hi0, lo1, hi1;
      mul_wide(c0, m0, lo0, hi0);
      mul_wide(c2, m1, lo1, hi1);
      const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c0 = n0;
      c1 = lo1;
      c2 = n2;
      c3 = lo0;
      k0 += kW0;
      k1 += kW1;
    }
    const __m256i words[4] = {c0, c1, c2, c3};
    uint32_t m = 0;
    for (int j = 0; j < 4; ++j) {
      const __m256i far = _mm256_cmpgt_epi32(far_s, _mm256_xor_si256(words[j], flip));
      const uint32_t not_far = ~static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(far))) & 0xffu;
      m |= spread4(not_far) << j;
    }
    mask |= static_cast<uint64_t>(m) << (32 * half);
  }
  return mask;
}

void bound_masks_avx2(const float* ub, float below_reach, float far_bound, uint64_t* out_mask, uint64_t* far_mask) {
  const __m256 reach = _mm256_set1_ps(below_reach), far = _mm256_set1_ps(far_bound);
  uint64_t out = 0, fm = 0;
  for (int i = 0; i < 64; i += 8) {
    const __m256 x = _mm256_loadu_ps(ub + i);
    out |= static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(x, reach, _CMP_LT_OQ))) << i;  // NaN: false
    fm |= static_cast<uint64_t>(_mm256_movemask_ps(_mm256_cmp_ps(x, far, _CMP_LE_OQ))) << i;
  }
  *out_mask = out;
  *far_mask = fm;
}

}  // namespace specula::detail
