// The AVX-512 kernel of the 16-bit path for F16 weights (hmatmul.h): this file alone of the path
// is built with AVX-512 F; call only where the CPU has it. A zmm holds one column pair of the 16
// rows of a group; its even and odd halves are converted to f32 once per pair and serve every
// activation row of the tile, with the fma order and the four chains hmatmul.h fixes.
#include "gpu/host/hmatmul_tile.h"

namespace specula::host_kernels {

namespace {

struct FormatF16 {
  template <int N>
  static void pair(const uint8_t* v, const HalfRows& x, int64_t i0, int64_t p, __m512* acc) {
    const __m512i w = _mm512_loadu_si512(v);
    const __m512 we = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w));
    const __m512 wo = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w, 16)));
    for (int i = 0; i < N; ++i) {
      const float* xi = x.f32 + (i0 + i) * x.cols + 2 * p;
      acc[i] = _mm512_fmadd_ps(we, _mm512_set1_ps(xi[0]), acc[i]);
      acc[i] = _mm512_fmadd_ps(wo, _mm512_set1_ps(xi[1]), acc[i]);
    }
  }
};

}  // namespace

Packed16Kernel avx512_packed16_kernel(DType t) { return t == DType::F16 ? &half_tile::kernel<FormatF16> : nullptr; }

}  // namespace specula::host_kernels
