// AVX2+FMA element-wise ops of the host device (built with -mavx2 -mfma -mf16c).
#include <immintrin.h>

#include <cmath>

#include "gpu/host/attention.h"
#include "gpu/host/simd_math.h"

namespace specula::host_kernels {

void swiglu_avx2(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp256(_mm256_xor_ps(g, sign));  // exp(-g)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    float g[8] = {0, 0, 0, 0, 0, 0, 0, 0}, u[8] = {0, 0, 0, 0, 0, 0, 0, 0}, o[8];
    for (int64_t j = i; j < n; ++j) { g[j - i] = gate[j]; u[j - i] = up[j]; }
    swiglu_avx2(g, u, 8, o);
    for (int64_t j = i; j < n; ++j) out[j] = o[j - i];
  }
}

void rmsnorm_avx2(const float* x, const float* g, float eps, int64_t n, int64_t dim, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    // Lanes 0-3 and 4-7 are HostOps::rmsnorm's partial sums 0-7, in the same order.
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int64_t i0 = 0;
    for (; i0 + 8 <= dim; i0 += 8) {
      const __m256 v = _mm256_loadu_ps(xr + i0);
      const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), b = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
      lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
      hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
    }
    double part[8];
    _mm256_storeu_pd(part, lo);
    _mm256_storeu_pd(part + 4, hi);
    for (int64_t i = i0; i < dim; ++i) part[i - i0] += static_cast<double>(xr[i]) * xr[i];
    const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(dim) + eps));
    const __m256 vi = _mm256_set1_ps(inv);
    int64_t i = 0;
    for (; i + 8 <= dim; i += 8)
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vi), _mm256_loadu_ps(g + i)));
    for (; i < dim; ++i) o[i] = xr[i] * inv * g[i];
  }
}

}  // namespace specula::host_kernels
