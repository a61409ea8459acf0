// AVX-512 (F, BW, VL) matmul kernels. This file alone is built with -mavx512f -mavx512bw
// -mavx512vl (plus AVX2/FMA/F16C); matmul.cpp calls it only after checking the CPU at run time.
// It mirrors matmul_avx2.cpp's kernels at twice the width: a 32-value block is two zmm
// registers instead of four ymm, so decoding a block and multiplying it into an activation row
// take about half the instructions. The kernels there were bound by FP issue, not by memory,
// so the width is what counts. Activations stay f32 and use the same prepared layout
// (prepare_activations_avx2), so the results match the AVX2 path to f32 rounding. Block layouts,
// scales and the row loops are shared with it through matmul_blocks.h.
//
// No standard-library function templates here: an inline or template function instantiated in
// this file is compiled with AVX-512 and the linker may keep that copy for the whole program,
// which would then fault on a CPU without AVX-512.
#include <immintrin.h>

#include <cstdint>

#include "gpu/host/matmul_blocks.h"
#include "gpu/host/matmul_kernels.h"

namespace specula::host_kernels {

namespace {

// ---- float types: 32 stored values -> w[0] = values 0-15, w[1] = values 16-31 -------------

struct DecodeF32 {
  static constexpr size_t kBytes = 128;
  static void decode(const uint8_t* b, __m512 w[2]) {
    w[0] = _mm512_loadu_ps(b);
    w[1] = _mm512_loadu_ps(b + 64);
  }
};

struct DecodeF16 {
  static constexpr size_t kBytes = 64;
  static void decode(const uint8_t* b, __m512 w[2]) {
    w[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
    w[1] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32)));
  }
};

struct DecodeBF16 {
  static constexpr size_t kBytes = 64;
  static void decode(const uint8_t* b, __m512 w[2]) {
    for (int k = 0; k < 2; ++k) {
      const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 32 * k)));
      w[k] = _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
    }
  }
};

// Blocked float kernel: one weight row against a tile of N activation rows; per block two
// independent products per row (mul, then fma) joined into the row's accumulator.
template <class Dec, int N>
inline void float_row_tile(const uint8_t* wr, int64_t nb, const float* x, int64_t ldx, float* y, int64_t ldy) {
  __m512 acc[N];
  SPECULA_UNROLL for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512 w[2];
    Dec::decode(wr + static_cast<size_t>(b) * Dec::kBytes, w);
    const float* xb = x + b * 32;
    SPECULA_UNROLL for (int i = 0; i < N; ++i) {
      const float* xi = xb + i * ldx;
      acc[i] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xi), acc[i]);
      acc[i] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xi + 16), acc[i]);
    }
  }
  SPECULA_UNROLL for (int i = 0; i < N; ++i) y[i * ldy] = _mm512_reduce_add_ps(acc[i]);
}

// ---- Q4_0, Q4_1, Q8_0: integer-valued blocks, one scale multiply per block -----------------
// As in matmul_avx2.cpp: a block contributes d * (q . x) + m * sum(x). Nibble blocks read the
// prepared activations (x'_j = x_j - x_{j+16}/16 in the first 16 floats, x''_j = x_{j+16}/16
// in the next 16), so with a byte b_j = lo_j + 16 hi_j the block's dot is lo . x' + b . x''.

// The block's quants as exact f32: nibbles -> v[0] = low nibbles of bytes 0-15, v[1] = bytes
// 0-15 (the order of the prepared activations); Q8_0 -> values 0-15 and 16-31.
template <class L>
inline void unpack(const uint8_t* qs, __m512 v[2]) {
  if constexpr (L::kNibbles) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    v[0] = _mm512_cvtepi32_ps(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0f)));
    v[1] = _mm512_cvtepi32_ps(bytes);
  } else {
    v[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
    v[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))));
  }
}

inline __m512 block_dot(const __m512 v[2], const float* xb) {
  return _mm512_fmadd_ps(v[1], _mm512_loadu_ps(xb + 16), _mm512_mul_ps(v[0], _mm512_loadu_ps(xb)));
}

// GEMV over weight rows A = w0 and (R = 2) B = w0 + row_bytes: each prepared x block feeds both.
template <class L, int R>
inline void gemv_rows(const uint8_t* w0, size_t row_bytes, int64_t nb, const float* xp, const float* sums, float* y) {
  const uint8_t* w1 = R == 2 ? w0 + row_bytes : w0;
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  __m128 macc = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = xp + b * 32;
    const uint8_t* blk0 = w0 + static_cast<size_t>(b) * L::kBytes;
    const uint8_t* blk1 = w1 + static_cast<size_t>(b) * L::kBytes;
    prefetch_ahead(blk0);
    if constexpr (R == 2) prefetch_ahead(blk1);
    const __m128 dm = pair_scales<L>(blk0, blk1);
    if constexpr (L::kHasMin) macc = _mm_fmadd_ps(dm, _mm_loadu_ps(sums + 8 * b), macc);
    __m512 v[2];
    unpack<L>(blk0 + L::kQs, v);
    acc0 = _mm512_fmadd_ps(_mm512_broadcastss_ps(dm), block_dot(v, xb), acc0);
    if constexpr (R == 2) {
      unpack<L>(blk1 + L::kQs, v);
      acc1 = _mm512_fmadd_ps(_mm512_broadcastss_ps(_mm_movehl_ps(dm, dm)), block_dot(v, xb), acc1);
    }
  }
  alignas(16) float m[4];
  _mm_store_ps(m, macc);
  y[0] = _mm512_reduce_add_ps(acc0) + (m[0] + m[1]);
  if constexpr (R == 2) y[1] = _mm512_reduce_add_ps(acc1) + (m[2] + m[3]);
}

// GEMM: one weight row against N <= 8 prepared activation rows; sums: the tile's block sums
// [nb][8], lane i for activation row i (already times -8 for Q4_0).
template <class L, int N>
inline void gemm_row(const uint8_t* wr, int64_t nb, const float* xp, int64_t ldx, const float* sums, float* y, int64_t ldy) {
  __m512 acc[N];
  __m256 macc = _mm256_setzero_ps();
  SPECULA_UNROLL for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = wr + static_cast<size_t>(b) * L::kBytes;
    prefetch_ahead(blk);
    const __m128 dmf = scales(blk);
    if constexpr (L::kHasMin) {
      macc = _mm256_fmadd_ps(_mm256_broadcastss_ps(L::min(dmf)), _mm256_loadu_ps(sums + 8 * b), macc);
    }
    // Scale the decoded block once (d * q, the reference's own rounding) so that each row
    // costs two FMAs.
    const __m512 d = _mm512_broadcastss_ps(dmf);
    __m512 v[2];
    unpack<L>(blk + L::kQs, v);
    v[0] = _mm512_mul_ps(v[0], d);
    v[1] = _mm512_mul_ps(v[1], d);
    const float* xb = xp + b * 32;
    SPECULA_UNROLL for (int i = 0; i < N; ++i) {
      acc[i] = _mm512_fmadd_ps(v[0], _mm512_loadu_ps(xb + i * ldx), acc[i]);
      acc[i] = _mm512_fmadd_ps(v[1], _mm512_loadu_ps(xb + i * ldx + 16), acc[i]);
    }
  }
  alignas(32) float m[8];
  _mm256_store_ps(m, macc);
  SPECULA_UNROLL for (int i = 0; i < N; ++i) y[i * ldy] = _mm512_reduce_add_ps(acc[i]) + (L::kHasMin ? m[i] : 0.0f);
}

template <class Dec>
void float_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const auto* w = reinterpret_cast<const uint8_t*>(a.w);
  const int64_t nb = a.cols / 32;
  for_row_tiles(a, r0, r1, [&](int64_t r, int64_t i0, int64_t tile) {
    with_tile(tile, [&]<int N>() {
      float_row_tile<Dec, N>(w + static_cast<size_t>(r) * a.row_bytes, nb, a.x + i0 * a.cols, a.cols, a.y + i0 * a.rows + r, a.rows);
    });
  });
}

template <class L>
void quant_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const auto* w = reinterpret_cast<const uint8_t*>(a.w);
  const int64_t nb = a.cols / 32;
  const float* xp = L::kNibbles ? a.xprep : a.x;
  if (a.n == 1) {
    for_row_pairs(r0, r1, [&]<int R>(int64_t r) {
      gemv_rows<L, R>(w + static_cast<size_t>(r) * a.row_bytes, a.row_bytes, nb, xp, a.xsum, a.y + r);
    });
    return;
  }
  for_row_tiles(a, r0, r1, [&](int64_t r, int64_t i0, int64_t tile) {
    const float* sums = L::kHasMin ? a.xsum + (i0 / kTile) * nb * 8 : nullptr;
    with_tile(tile, [&]<int N>() {
      gemm_row<L, N>(w + static_cast<size_t>(r) * a.row_bytes, nb, xp + i0 * a.cols, a.cols, sums, a.y + i0 * a.rows + r, a.rows);
    });
  });
}

}  // namespace

RowsKernel avx512_rows_kernel(DType t, int64_t cols) {
  const bool whole_blocks = cols % 32 == 0;
  switch (t) {
    case DType::Q4_0: return &quant_rows<LayoutQ4_0>;
    case DType::Q4_1: return &quant_rows<LayoutQ4_1>;
    case DType::Q8_0: return &quant_rows<LayoutQ8_0>;
    case DType::F32: return whole_blocks ? &float_rows<DecodeF32> : avx2_rows_kernel(t, cols);
    case DType::F16: return whole_blocks ? &float_rows<DecodeF16> : avx2_rows_kernel(t, cols);
    case DType::BF16: return whole_blocks ? &float_rows<DecodeBF16> : avx2_rows_kernel(t, cols);
    default: return avx2_rows_kernel(t, cols);  // K-quants: the buffered AVX2 kernel
  }
}

}  // namespace specula::host_kernels
