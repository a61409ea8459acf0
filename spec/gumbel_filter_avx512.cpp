// spec/gumbel_filter.h's 512-bit half: Philox4x32-10 on the sixteen counters of a 64-token block at
// once (the same bits as philox4x32 in spec/philox.h, and as the 256-bit half's two passes of
// eight). Built with AVX-512 F; called only where cpu_has_avx512() and SPECULA_SIMD allows it.
#include <immintrin.h>

#include "spec/gumbel_filter.h"

namespace specula::detail {

namespace {

// The low and high words of x * m for sixteen 32-bit lanes.
inline void mul_wide(__m512i x, __m512i m, __m512i& lo, __m512i& hi) {
  const __m512i even = _mm512_mul_epu32(x, m);
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), m);
  lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
  hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

// Bit i -> bit 4 i, for 16 bits.
inline uint64_t spread4(uint32_t m) {
  uint64_t r = 0;
  for (int i = 0; i < 16; ++i) r |= static_cast<uint64_t>((m >> i) & 1u) << (4 * i);
  return r;
}

// Philox4x32-10 with block counter c0 in each lane (the other counter words from position and
// stream): the block's four words.
inline void philox16(__m512i c0, uint64_t seed, int64_t position, RngStream stream, __m512i words[4]) {
  using namespace philox_constants;
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kM0)), m1 = _mm512_set1_epi32(static_cast<int>(kM1));
  __m512i c1 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(position)));
  __m512i c2 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32)));
  __m512i c3 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(stream)));
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < kRounds; ++round) {
    __m512i lo0, hi0, lo1, hi1;
    mul_wide(c0, m0, lo0, hi0);
    mul_wide(c2, m1, lo1, hi1);
    const __m512i n0 = _mm512_xor_si512(_mm512_xor_si512(hi1, c1), _mm512_set1_epi32(static_cast<int>(k0)));
    const __m512i n2 = _mm512_xor_si512(_mm512_xor_si512(hi0, c3), _mm512_set1_epi32(static_cast<int>(k1)));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  words[0] = c0;
  words[1] = c1;
  words[2] = c2;
  words[3] = c3;
}

}  // namespace

uint64_t philox_not_far_avx512(uint64_t seed, int64_t position, RngStream stream, uint64_t first, uint32_t far_word) {
  const uint32_t block0 = static_cast<uint32_t>(first >> 2);
  __m512i words[4];
  philox16(_mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(block0)), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
           seed, position, stream, words);
  const __m512i far = _mm512_set1_epi32(static_cast<int>(far_word));
  uint64_t mask = 0;
  for (int j = 0; j < 4; ++j) mask |= spread4(_mm512_cmpge_epu32_mask(words[j], far)) << j;
  return mask;
}

uint64_t philox_not_far_ids_avx512(uint64_t seed, int64_t position, RngStream stream, const int32_t* ids, int count,
                                   uint32_t far_word) {
  const __m512i far = _mm512_set1_epi32(static_cast<int>(far_word)), three = _mm512_set1_epi32(3);
  uint64_t mask = 0;
  for (int i = 0; i < count; i += 16) {
    const __mmask16 live = count - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (count - i)) - 1);
    const __m512i id = _mm512_maskz_loadu_epi32(live, ids + i);
    __m512i words[4];
    philox16(_mm512_srli_epi32(id, 2), seed, position, stream, words);  // the id's block (ids are >= 0)
    // Each lane's own word: words[id & 3].
    const __m512i j = _mm512_and_si512(id, three);
    __m512i w = words[0];
    w = _mm512_mask_mov_epi32(w, _mm512_cmpeq_epi32_mask(j, _mm512_set1_epi32(1)), words[1]);
    w = _mm512_mask_mov_epi32(w, _mm512_cmpeq_epi32_mask(j, _mm512_set1_epi32(2)), words[2]);
    w = _mm512_mask_mov_epi32(w, _mm512_cmpeq_epi32_mask(j, three), words[3]);
    mask |= static_cast<uint64_t>(_mm512_mask_cmpge_epu32_mask(live, w, far)) << i;
  }
  return mask;
}

}  // namespace specula::detail
