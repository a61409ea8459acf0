// AVX2 scans of the output head's logits (this file alone is built with -mavx2; call only where
// cpu_has_avx2_fma()). qmatmul_logits looks for the logits within kLogitMargin of each row's
// largest: two passes over the vocabulary (49,152 floats for SmolLM2), which the scalar loops
// took ~30-60 us a row for, a few percent of a one-token step. The results are exactly those of
// the scalar loops (logits_max and logits_at_least in qmatmul.cpp, the portable path's): a
// maximum does not depend on the order it is taken in, NaNs are skipped as `y > top ? y : top`
// skips them, and the indices come out in increasing order.
#include <immintrin.h>

#include "gpu/host/qmatmul.h"

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

}  // namespace specula::host_kernels
