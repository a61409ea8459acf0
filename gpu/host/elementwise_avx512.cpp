// AVX-512 element-wise ops of the host device (built with -mavx512f; call only where
// cpu_has_avx512()).
#include <immintrin.h>

#include "gpu/host/attention.h"
#include "gpu/host/simd_math.h"

namespace specula::host_kernels {

void swiglu_avx512(const float* gate, const float* up, int64_t n, float* out) {
  // swiglu_avx2's operations at 16 lanes (exp512 is exp256 lane for lane): the same values. The
  // tail is masked: a lane past n computes on zeros and is not stored.
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp512(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), sign)));  // exp(-g)
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(m, up + i)));
  }
}

}  // namespace specula::host_kernels
