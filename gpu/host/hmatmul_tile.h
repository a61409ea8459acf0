// The 16-bit path's AVX-512 skeleton (hmatmul.h), shared by the F16 and BF16 kernels: a group of
// 16 rows against tiles of up to 6 activation rows, four partial sums per output (column pair p
// into chain p % 4, in pair order; then (s0 + s1) + (s2 + s3)). A format F supplies
//   template <int N> static void pair(const uint8_t* v, const HalfRows& x, int64_t i0, int64_t p, __m512* acc)
// which adds column pair p (its 64 packed bytes at v) of activation rows i0..i0+N-1 into acc[0..N).
// Include only from files built with AVX-512 F.
#pragma once
#include <immintrin.h>

#include "gpu/host/hmatmul.h"

namespace specula::host_kernels::half_tile {

constexpr int kTile = 6;    // activation rows per pass over a group
constexpr int kChains = 4;  // partial sums per output

template <class F, int N>
void tile(const PackedMatrix& m, const HalfRows& x, int64_t i0, const uint8_t* gp, float* y, int64_t ldy, __mmask16 keep) {
  __m512 acc[kChains][N];
  for (int c = 0; c < kChains; ++c)
    for (int i = 0; i < N; ++i) acc[c][i] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + kChains <= m.blocks; p += kChains) {
    // 4 KiB ahead: one 16-row group is a single stream, which the hardware prefetcher alone
    // does not keep far enough ahead of a one-row call.
    for (int c = 0; c < kChains; ++c) _mm_prefetch(reinterpret_cast<const char*>(gp + 64 * (p + c)) + 4096, _MM_HINT_T0);
    for (int c = 0; c < kChains; ++c) F::template pair<N>(gp + 64 * (p + c), x, i0, p + c, acc[c]);
  }
  for (; p < m.blocks; ++p) F::template pair<N>(gp + 64 * p, x, i0, p, acc[p % kChains]);
  for (int i = 0; i < N; ++i)
    _mm512_mask_storeu_ps(y + (i0 + i) * ldy, keep,
                          _mm512_add_ps(_mm512_add_ps(acc[0][i], acc[1][i]), _mm512_add_ps(acc[2][i], acc[3][i])));
}

// Groups [g0, g1), every activation row.
template <class F>
void kernel(const PackedMatrix& m, const HalfRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    const int64_t left = m.rows - g * 16;
    const __mmask16 keep = left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
    const uint8_t* gp = m.group(g);
    float* yg = y + g * 16;
    int64_t i0 = 0;
    for (; i0 + kTile <= x.n; i0 += kTile) tile<F, kTile>(m, x, i0, gp, yg, ldy, keep);
    switch (x.n - i0) {
      case 1: tile<F, 1>(m, x, i0, gp, yg, ldy, keep); break;
      case 2: tile<F, 2>(m, x, i0, gp, yg, ldy, keep); break;
      case 3: tile<F, 3>(m, x, i0, gp, yg, ldy, keep); break;
      case 4: tile<F, 4>(m, x, i0, gp, yg, ldy, keep); break;
      case 5: tile<F, 5>(m, x, i0, gp, yg, ldy, keep); break;
      default: break;
    }
  }
}

}  // namespace specula::host_kernels::half_tile
