// The sampler's exponential in 256-bit vectors (gpu/host/vector_math.h holds the definition and
// the scalar functions these must equal bit for bit). Built with -mavx2 -mfma -ffp-contract=off:
// every fused multiply-add below is written as one, and no product and sum are fused by the
// compiler, so each lane runs the scalar sequence's operations in its order.
#include <immintrin.h>

#include "gpu/host/vector_math.h"

namespace specula::host_kernels {

namespace {

using namespace sampler_exp_constants;

// sampler_arg of four floats.
inline __m256d args4(const float* x, __m256d inv_t, __m256d neg_mx) {
  return _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(x)), inv_t, neg_mx);
}

// sampler_exp of four doubles: vector_math.cpp's sequence lane by lane.
inline __m256d exp4(__m256d a) {
  const __m256d shifter = _mm256_set1_pd(kShifter);
  const __m256d t = _mm256_fmadd_pd(a, _mm256_set1_pd(kLog2e), shifter);
  const __m256d k = _mm256_sub_pd(t, shifter);
  const __m256d neg_k = _mm256_xor_pd(k, _mm256_set1_pd(-0.0));
  __m256d r = _mm256_fmadd_pd(neg_k, _mm256_set1_pd(kLn2Hi), a);
  r = _mm256_fmadd_pd(neg_k, _mm256_set1_pd(kLn2Lo), r);
  __m256d p = _mm256_set1_pd(kCoeff[0]);
  for (int i = 1; i < kTerms; ++i) p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(kCoeff[i]));
  const __m256i bits = _mm256_slli_epi64(_mm256_add_epi64(_mm256_castpd_si256(t), _mm256_set1_epi64x(1023)), 52);
  const __m256d e = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
  // a < floor (ordered: a NaN keeps its NaN) -> 0.
  return _mm256_andnot_pd(_mm256_cmp_pd(a, _mm256_set1_pd(kFloor), _CMP_LT_OQ), e);
}

}  // namespace

double sampler_exp_sum_avx2(const float* x, int64_t n, float inv_t, float mx) {
  const __m256d it = _mm256_set1_pd(static_cast<double>(inv_t)), nm = _mm256_set1_pd(-static_cast<double>(mx));
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();  // lanes 0-3 and 4-7
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lo = _mm256_add_pd(lo, exp4(args4(x + i, it, nm)));
    hi = _mm256_add_pd(hi, exp4(args4(x + i + 4, it, nm)));
  }
  double lane[8];
  _mm256_storeu_pd(lane, lo);
  _mm256_storeu_pd(lane + 4, hi);
  return sampler_join_lanes_avx2(lane, x + i, n - i, inv_t, mx);
}

double sampler_join_lanes_avx2(const double* lane, const float* tail_x, int64_t tail_n, float inv_t, float mx) {
  double s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  if (tail_n > 0) {
    double tail[8];
    sampler_exp_terms_avx2(tail_x, tail_n, inv_t, mx, tail);
    for (int64_t j = 0; j < tail_n; ++j) s += tail[j];
  }
  return s;
}

void sampler_exp_terms_avx2(const float* x, int64_t n, float inv_t, float mx, double* e) {
  const __m256d it = _mm256_set1_pd(static_cast<double>(inv_t)), nm = _mm256_set1_pd(-static_cast<double>(mx));
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm256_storeu_pd(e + i, exp4(args4(x + i, it, nm)));
  if (i < n) {
    float pad[4] = {0, 0, 0, 0};
    double out[4];
    for (int64_t j = i; j < n; ++j) pad[j - i] = x[j];
    _mm256_storeu_pd(out, exp4(args4(pad, it, nm)));
    for (int64_t j = i; j < n; ++j) e[j] = out[j - i];
  }
}

void sampler_log_probs_avx2(const float* x, int64_t n, float inv_t, float mx, double log_sum, float* out) {
  const __m256d it = _mm256_set1_pd(static_cast<double>(inv_t)), nm = _mm256_set1_pd(-static_cast<double>(mx));
  const __m256d ls = _mm256_set1_pd(log_sum);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, _mm256_cvtpd_ps(_mm256_sub_pd(args4(x + i, it, nm), ls)));
  for (; i < n; ++i) out[i] = static_cast<float>(sampler_arg(x[i], inv_t, mx) - log_sum);
}

}  // namespace specula::host_kernels
