// AVX2+FMA element-wise ops of the host device (built with -mavx2 -mfma -mf16c).
#include <immintrin.h>

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

}  // namespace specula::host_kernels
