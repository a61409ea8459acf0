// AVX2 scans of the output head's logits (this file alone is built with -mavx2; call only where
// cpu_has_avx2_fma()). qmatmul_logits looks for the logits within kLogitMargin of each row's
// largest: two passes over the vocabulary (49,152 floats for SmolLM2), which the scalar loops
// took ~30-60 us a row for, a few percent of a one-token step. The results are exactly those of
// the scalar loops (logits_max and logits_at_least in qmatmul.cpp, the portable path's): a
// maximum does not depend on the order it is taken in, NaNs are skipped as `y > top ? y : top`
// skips them, and the indices come out in increasing order.
#include <immintrin.h>

#include "gpu/host/qmatmul.h"
#include "gpu/host/quant.h"

namespace specula::host_kernels {

float logits_max_avx2(const float* y, int64_t n) {
  const float ninf = -__builtin_inff();
  __m256 m0 = _mm256_set1_ps(ninf), m1 = m0, m2 = m0, m3 = m0;
  int64_t o = 0;
  // vmaxps returns its second operand when either is a NaN: max(y, m) keeps m at a NaN y.
  for (; o + 32 <= n; o += 32) {
    m0 = _mm256_max_ps(_mm256_loadu_ps(y + o), m0);
    m1 = _mm256_max_ps(_mm256_loadu_ps(y + o + 8), m1);
    m2 = _mm256_max_ps(_mm256_loadu_ps(y + o + 16), m2);
    m3 = _mm256_max_ps(_mm256_loadu_ps(y + o + 24), m3);
  }
  alignas(32) float lanes[32];
  _mm256_store_ps(lanes, m0);
  _mm256_store_ps(lanes + 8, m1);
  _mm256_store_ps(lanes + 16, m2);
  _mm256_store_ps(lanes + 24, m3);
  float largest = ninf;
  for (float t : lanes) largest = t > largest ? t : largest;
  for (; o < n; ++o) largest = y[o] > largest ? y[o] : largest;
  return largest;
}

int64_t logits_at_least_avx2(const float* y, int64_t n, float floor, int64_t* idx) {
  const __m256 f = _mm256_set1_ps(floor);
  int64_t count = 0, o = 0;
  for (; o + 8 <= n; o += 8) {
    // Ordered compare: a NaN is never at least the floor, as in `y[o] >= floor`.
    unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(y + o), f, _CMP_GE_OQ)));
    while (mask != 0) {
      idx[count++] = o + __builtin_ctz(mask);
      mask &= mask - 1;
    }
  }
  for (; o < n; ++o)
    if (y[o] >= floor) idx[count++] = o;
  return count;
}

float stored_row_dot_q8_0_avx2(const uint8_t* row, const float* x, int64_t cols) {
  // stored_row_dot's arithmetic lane for lane: w_j = float(q_j) * d (dequantize_q8_0), then
  // acc[j % 16] = acc[j % 16] + w_j * x_j, a rounded product and a rounded sum (this file is
  // built with -ffp-contract=off, and qmatmul.cpp, where the scalar loop lives, for x86-64's
  // baseline, which has no FMA), then the 16 sums added in lane order. A 32-value block's
  // values 0-7 and 16-23 fall in lanes 0-7 (lo), 8-15 and 24-31 in lanes 8-15 (hi).
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  const int64_t nb = cols / 32;
  for (int64_t b = 0; b < nb; ++b, row += 34, x += 32) {
    const __m256 d = _mm256_set1_ps(fp16_to_f32(static_cast<uint16_t>(row[0] | row[1] << 8)));
    const int8_t* q = reinterpret_cast<const int8_t*>(row + 2);
    for (int k = 0; k < 4; ++k) {
      const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 8 * k));
      const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), d);
      const __m256 p = _mm256_mul_ps(w, _mm256_loadu_ps(x + 8 * k));
      if (k % 2 == 0) lo = _mm256_add_ps(lo, p);
      else hi = _mm256_add_ps(hi, p);
    }
  }
  alignas(32) float acc[16];
  _mm256_store_ps(acc, lo);
  _mm256_store_ps(acc + 8, hi);
  float s = 0.0f;
  for (float a : acc) s += a;
  return s;
}

}  // namespace specula::host_kernels
