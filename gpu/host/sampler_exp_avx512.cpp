// The sampler's exponential sum in 512-bit vectors (gpu/host/vector_math.h holds the definition;
// sampler_exp_avx2.cpp the 256-bit loops this equals bit for bit). Built with -ffp-contract=off,
// as the 256-bit file: every fused multiply-add is written as one. One vector of 8 doubles holds
// the definition's 8 lanes (lane j takes v = j, j + 8, ...), so the sum runs in its order.
#include <immintrin.h>

#include "gpu/host/vector_math.h"

namespace specula::host_kernels {

namespace {

using namespace sampler_exp_constants;

// sampler_exp of eight doubles: exp4's operations lane for lane.
inline __m512d exp8(__m512d a) {
  const __m512d shifter = _mm512_set1_pd(kShifter);
  const __m512d t = _mm512_fmadd_pd(a, _mm512_set1_pd(kLog2e), shifter);
  const __m512d k = _mm512_sub_pd(t, shifter);
  const __m512d neg_k = _mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(k), _mm512_set1_epi64(static_cast<long long>(0x8000000000000000ull))));
  __m512d r = _mm512_fmadd_pd(neg_k, _mm512_set1_pd(kLn2Hi), a);
  r = _mm512_fmadd_pd(neg_k, _mm512_set1_pd(kLn2Lo), r);
  __m512d p = _mm512_set1_pd(kCoeff[0]);
  for (int i = 1; i < kTerms; ++i) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kCoeff[i]));
  const __m512i bits = _mm512_slli_epi64(_mm512_add_epi64(_mm512_castpd_si512(t), _mm512_set1_epi64(1023)), 52);
  const __m512d e = _mm512_mul_pd(p, _mm512_castsi512_pd(bits));
  // a < floor (ordered: a NaN keeps its NaN) -> 0.
  return _mm512_maskz_mov_pd(static_cast<__mmask8>(~_mm512_cmp_pd_mask(a, _mm512_set1_pd(kFloor), _CMP_LT_OQ)), e);
}

}  // namespace

double sampler_exp_sum_avx512(const float* x, int64_t n, float inv_t, float mx) {
  const __m512d it = _mm512_set1_pd(static_cast<double>(inv_t)), nm = _mm512_set1_pd(-static_cast<double>(mx));
  __m512d acc = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm512_add_pd(acc, exp8(_mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + i)), it, nm)));
  double lane[8];
  _mm512_storeu_pd(lane, acc);
  return sampler_join_lanes_avx2(lane, x + i, n - i, inv_t, mx);
}

}  // namespace specula::host_kernels
