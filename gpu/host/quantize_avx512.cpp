// The int8 path's activation quantizer on AVX-512 F/BW/VL (this file alone is built with those;
// quantize_rows calls it only where cpu_has_avx512()). The same values as the portable
// quantize_block (qmatmul.cpp): d = max|x| / 127 and 1 / d are IEEE divisions whether scalar or
// vector, q = round-to-nearest-even(x * (1 / d)) clamped to +-127, and the sums are exact.
//
// It works on sixteen blocks at a time and keeps every per-block quantity in a vector lane:
// - the blocks' maxima are the ones the outlier search computed (quantize_rows passes them), but
//   for the few blocks that hold set-aside values;
// - d and 1 / d are one vector division each;
// - the products are converted unclamped (pack_blocks says why that is exact), and two blocks'
//   q are packed to 64 bytes with saturating packs and one dword permute;
// - the sums of q come from those bytes (vpmaddubsw and vpmaddwd against ones give sums of four)
//   and a transposed reduction, instead of two horizontal integer sums per block.
// 0.29 -> 0.17 us a row of 576 values and 0.63 -> 0.31 us a row of 1536 with the outlier search
// (docs/kernels.md, "The activation quantizer in vector lanes").
//
// No standard-library function templates here (see matmul_avx512.cpp).
#include <immintrin.h>

#include <cstdint>

#include "gpu/host/qmatmul.h"

namespace specula::host_kernels {

namespace {

// |x| of a block's two halves, the lanes whose bit in `keep` is clear read as 0, folded to one vector.
// NaNs are ignored (vmaxps returns its second operand where either is NaN), as block_amax does.
inline __m512 block_abs_max(const float* xb, uint32_t keep) {
  const __m512 v0 = _mm512_maskz_loadu_ps(static_cast<__mmask16>(keep), xb);
  const __m512 v1 = _mm512_maskz_loadu_ps(static_cast<__mmask16>(keep >> 16), xb + 16);
  return _mm512_max_ps(_mm512_abs_ps(v1), _mm512_max_ps(_mm512_abs_ps(v0), _mm512_setzero_ps()));
}

// Sixteen blocks' q as packed (block pair m in pairs[m], before the permute to block order:
// dword 4j + h is quarter h's dword j, quarters 0-1 the pair's first block, 2-3 its second).
// Returns the sums of each block's first 16 q in *lo and of its last 16 in *hi, lane b for block b.
inline void block_sums(const __m512i (&pairs)[8], __m512i* lo, __m512i* hi) {
  const __m512i ones8 = _mm512_set1_epi8(1), ones16 = _mm512_set1_epi16(1);
  __m512i p[8], s[4], r[2];
  // Sums of four bytes: lane 4j + h of p[m] is quarter h's dword j summed.
  for (int m = 0; m < 8; ++m) p[m] = _mm512_madd_epi16(_mm512_maddubs_epi16(ones8, pairs[m]), ones16);
  // Sum the four quads of each vector: quad q of the result of (a, b, c, d) is vector q's total.
  for (int k = 0; k < 4; ++k)
    s[k] = _mm512_add_epi32(_mm512_shuffle_i32x4(p[2 * k], p[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_i32x4(p[2 * k], p[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int k = 0; k < 2; ++k)
    r[k] = _mm512_add_epi32(_mm512_shuffle_i32x4(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                            _mm512_shuffle_i32x4(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // r[k] lane 4m + h: block pair 4k + m, quarter h (block 2(4k + m) + h / 2, half h % 2).
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  *lo = _mm512_permutex2var_epi32(r[0], even, r[1]);
  *hi = _mm512_permutex2var_epi32(r[0], odd, r[1]);
}

}  // namespace

namespace {

// Quantizes `count` (<= 16) blocks of the row xr from block b0 with the multipliers inv[t], the
// values whose bit in keep[t] is clear read as 0: each pair of blocks' 64 q to q_out (block
// order) and, as packed, to pairs[m]. Without kClamp the products go to the conversion unclamped
// (a finite row's |x| / d is at most 127 and a bit, which rounds to 127); a product that is NaN,
// infinite or past the int32 range converts to INT32_MIN and packs to -128, which no clamped
// value gives, so the caller redoes the blocks clamped where this returns true. Clamped, a NaN
// product gives -127 (vmaxps returns its second operand), as the other quantizers' clamp does.
template <bool kClamp>
bool pack_blocks(const float* xr, int64_t b0, int64_t count, const uint32_t* keep, const float* inv, int8_t* q_out, __m512i (&pairs)[8]) {
  const __m512 lim = _mm512_set1_ps(127.0f), nlim = _mm512_set1_ps(-127.0f);
  // The packed bytes' dword 4j + h is quarter h's dword j (vpackssdw and vpacksswb work per 128-bit lane).
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __mmask64 wrapped = 0;
#pragma GCC unroll 8
  for (int m = 0; m < 8; ++m) {
    if (2 * m >= count) {
      pairs[m] = _mm512_setzero_si512();
      continue;
    }
    __m512i h[4];  // the pair's four 16-value quarters as int32
    for (int k = 0; k < 4; ++k) {
      const int64_t t = 2 * m + k / 2;
      if (t >= count) {
        h[k] = _mm512_setzero_si512();
        continue;
      }
      const __m512 v = _mm512_maskz_loadu_ps(static_cast<__mmask16>(keep[t] >> (16 * (k % 2))), xr + 32 * (b0 + t) + 16 * (k % 2));
      __m512 r = _mm512_mul_ps(v, _mm512_set1_ps(inv[t]));
      if constexpr (kClamp) r = _mm512_min_ps(_mm512_max_ps(r, nlim), lim);
      h[k] = _mm512_cvt_roundps_epi32(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
    pairs[m] = _mm512_packs_epi16(_mm512_packs_epi32(h[0], h[1]), _mm512_packs_epi32(h[2], h[3]));
    if constexpr (!kClamp) wrapped |= _mm512_cmpeq_epi8_mask(pairs[m], _mm512_set1_epi8(-128));
    const __mmask64 bytes = 2 * m + 1 < count ? ~__mmask64{0} : __mmask64{0xffffffffu};
    _mm512_mask_storeu_epi8(q_out + 64 * m, bytes, _mm512_permutexvar_epi32(order, pairs[m]));
  }
  return wrapped != 0;
}

}  // namespace

void quantize_rows_avx512(const float* x, int64_t n, int64_t cols, const int32_t* skip, const float* amax, int8_t* q, float* d,
                          int32_t* isum, int32_t* isum_lo, float* sx) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const int64_t nb = cols / 32;
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * cols;
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
      const int64_t count = nb - b0 < 16 ? nb - b0 : 16;
      const __mmask16 in = static_cast<__mmask16>((1u << count) - 1);
      uint32_t keep[16];
      for (uint32_t& k : keep) k = ~0u;
      for (int k = 0; skip != nullptr && k < kOut; ++k) {
        const int64_t c = skip[i * kOut + k], t = c / 32 - b0;
        if (t >= 0 && t < 16) keep[t] &= ~(1u << (c % 32));
      }
      // The given maxima, but for the blocks with values set aside.
      __m512 mx = _mm512_maskz_loadu_ps(in, amax + i * nb + b0);
      for (int k = 0; skip != nullptr && k < kOut; ++k) {
        const int64_t t = skip[i * kOut + k] / 32 - b0;
        if (t >= 0 && t < count)  // (a block with two of them is done twice, the same)
          mx = _mm512_mask_mov_ps(mx, static_cast<__mmask16>(1u << t),
                                  _mm512_set1_ps(_mm512_reduce_max_ps(block_abs_max(xr + 32 * (b0 + t), keep[t]))));
      }
      const __m512 dv = _mm512_div_ps(mx, _mm512_set1_ps(127.0f));
      const __mmask16 nonzero = _mm512_cmp_ps_mask(dv, _mm512_setzero_ps(), _CMP_NEQ_OQ);
      alignas(64) float inv[16];
      _mm512_store_ps(inv, _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0f), dv));
      const int64_t bi = i * nb + b0;
      __m512i pairs[8];
      if (pack_blocks<false>(xr, b0, count, keep, inv, q + bi * 32, pairs)) pack_blocks<true>(xr, b0, count, keep, inv, q + bi * 32, pairs);
      __m512i lo, hi;
      block_sums(pairs, &lo, &hi);
      const __m512i sum = _mm512_add_epi32(lo, hi);
      _mm512_mask_storeu_ps(d + bi, in, dv);
      _mm512_mask_storeu_epi32(isum_lo + bi, in, lo);
      _mm512_mask_storeu_epi32(isum + bi, in, sum);
      _mm512_mask_storeu_ps(sx + bi, in, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(sum)));
    }
  }
}

}  // namespace specula::host_kernels
