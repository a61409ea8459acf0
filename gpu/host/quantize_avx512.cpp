// The int8 path's activation quantizer on AVX-512 F/BW/VL (this file alone is built with those;
// quantize_rows calls it only where cpu_has_avx512()). The same values as the portable
// quantize_block (qmatmul.cpp): d = max|x| / 127 and 1 / d are IEEE divisions whether scalar or
// vector, q = round-to-nearest-even(x * (1 / d)) clamped to +-127, and the sums are exact. What
// it saves against the AVX2 quantizer is the dependency chain per block: a block is two zmm, and
// sixteen blocks' maxima go through one vector division each for d and 1 / d instead of two
// scalar divisions per block.
//
// No standard-library function templates here (see matmul_avx512.cpp).
#include <immintrin.h>

#include <cstdint>

#include "gpu/host/qmatmul.h"

namespace specula::host_kernels {

void quantize_rows_avx512(const float* x, int64_t n, int64_t cols, const int32_t* skip, int8_t* q, float* d, int32_t* isum,
                          int32_t* isum_lo, float* sx) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const int64_t nb = cols / 32;
  const __m512 lim = _mm512_set1_ps(127.0f), nlim = _mm512_set1_ps(-127.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * cols;
    int64_t skip_block[kOut];
    uint32_t skip_bit[kOut];
    for (int k = 0; k < kOut; ++k) {
      skip_block[k] = skip != nullptr ? skip[i * kOut + k] / 32 : -1;
      skip_bit[k] = skip != nullptr ? 1u << (skip[i * kOut + k] % 32) : 0u;
    }
    for (int64_t b0 = 0; b0 < nb; b0 += 16) {
      const int64_t count = nb - b0 < 16 ? nb - b0 : 16;
      alignas(64) float amax[16] = {};
      alignas(64) float inv[16];
      uint32_t keep[16];
      for (int64_t t = 0; t < count; ++t) {
        const int64_t b = b0 + t;
        uint32_t k32 = ~0u;
        for (int k = 0; k < kOut; ++k)
          if (skip_block[k] == b) k32 &= ~skip_bit[k];
        keep[t] = k32;
        const __m512 v0 = _mm512_maskz_loadu_ps(static_cast<__mmask16>(k32), xr + 32 * b);
        const __m512 v1 = _mm512_maskz_loadu_ps(static_cast<__mmask16>(k32 >> 16), xr + 32 * b + 16);
        amax[t] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      }
      const __m512 dv = _mm512_div_ps(_mm512_load_ps(amax), lim);
      const __mmask16 nonzero = _mm512_cmp_ps_mask(dv, _mm512_setzero_ps(), _CMP_NEQ_OQ);
      _mm512_store_ps(inv, _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0f), dv));
      alignas(64) float dvs[16];
      _mm512_store_ps(dvs, dv);
      for (int64_t t = 0; t < count; ++t) {
        const int64_t b = b0 + t, bi = i * nb + b;
        const __m512 vid = _mm512_set1_ps(inv[t]);
        const __m512 v0 = _mm512_maskz_loadu_ps(static_cast<__mmask16>(keep[t]), xr + 32 * b);
        const __m512 v1 = _mm512_maskz_loadu_ps(static_cast<__mmask16>(keep[t] >> 16), xr + 32 * b + 16);
        const __m512 r0 = _mm512_min_ps(
            _mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(v0, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), nlim), lim);
        const __m512 r1 = _mm512_min_ps(
            _mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(v1, vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), nlim), lim);
        const __m512i q0 = _mm512_cvtps_epi32(r0), q1 = _mm512_cvtps_epi32(r1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + bi * 32), _mm512_cvtsepi32_epi8(q0));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + bi * 32 + 16), _mm512_cvtsepi32_epi8(q1));
        const int32_t lo = _mm512_reduce_add_epi32(q0);
        const int32_t sum = lo + _mm512_reduce_add_epi32(q1);
        d[bi] = dvs[t];
        isum_lo[bi] = lo;
        isum[bi] = sum;
        sx[bi] = dvs[t] * static_cast<float>(sum);
      }
    }
  }
}

}  // namespace specula::host_kernels
