// The AVX-512 BF16 kernel of the 16-bit path for BF16 weights (hmatmul.h): this file alone is
// built with AVX-512 BF16; call only where the CPU has it. One vdpbf16ps per column pair and
// activation row: the pair's two products of 16 rows, odd element first, into f32 lanes.
#include <cstring>

#include "gpu/host/hmatmul_tile.h"

namespace specula::host_kernels {

namespace {

struct FormatBf16 {
  template <int N>
  static void pair(const uint8_t* v, const HalfRows& x, int64_t i0, int64_t p, __m512* acc) {
    const __m512bh w = (__m512bh)_mm512_loadu_si512(v);
    for (int i = 0; i < N; ++i) {
      int32_t xi;
      std::memcpy(&xi, x.bf16 + (i0 + i) * x.cols + 2 * p, 4);
      acc[i] = _mm512_dpbf16_ps(acc[i], w, (__m512bh)_mm512_set1_epi32(xi));
    }
  }
};

}  // namespace

Packed16Kernel avx512bf16_packed16_kernel(DType t) { return t == DType::BF16 ? &half_tile::kernel<FormatBf16> : nullptr; }

}  // namespace specula::host_kernels
