// AVX2+FMA+F16C matmul kernels (this file alone is built with -mavx2 -mfma -mf16c; matmul.cpp
// calls it only after checking the CPU). Activations stay f32: each 32-value weight block is
// dequantized into four registers once and FMA'd against a tile of up to 8 activation rows, so
// a 6-row verification GEMM reads the weights once instead of six times.
#include <immintrin.h>

#include "gpu/host/matmul_blocks.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/quant.h"
#include "gpu/host/simd_math.h"

namespace specula::host_kernels {

namespace {

// No standard-library function templates here (std::min, std::fill, ...): a copy instantiated in
// this file is compiled with AVX2, and the linker may keep it for callers on any CPU.

// 8 bytes -> 8 int32 lanes (sign-extended), straight from memory.
inline __m256i load_i8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }

// ---- float types: 32 stored values -> w[0..3] = values 0-7, 8-15, 16-23, 24-31 ------------

struct DecodeF32 {
  static constexpr size_t kBytes = 128;
  static void decode(const uint8_t* b, __m256 w[4]) {
    for (int k = 0; k < 4; ++k) w[k] = _mm256_loadu_ps(reinterpret_cast<const float*>(b) + 8 * k);
  }
};

struct DecodeF16 {
  static constexpr size_t kBytes = 64;
  static void decode(const uint8_t* b, __m256 w[4]) {
    for (int k = 0; k < 4; ++k) w[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * k)));
  }
};

struct DecodeBF16 {
  static constexpr size_t kBytes = 64;
  static void decode(const uint8_t* b, __m256 w[4]) {
    for (int k = 0; k < 4; ++k) {
      const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16 * k)));
      w[k] = _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    }
  }
};

// Kernel v1 (blocked): for one weight row and a tile of N activation rows, per 32-value block:
// decode once, then two independent mul+fma pairs per activation row summed with one add into
// the row's accumulator (the loop-carried chain is a single vaddps, latency 3, instead of four
// dependent FMAs).
template <class Dec, int N>
inline void block_row_tile(const uint8_t* wr, int64_t nb, const float* x, int64_t ldx, float* y, int64_t ldy) {
  __m256 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256 w[4];
    Dec::decode(wr + static_cast<size_t>(b) * Dec::kBytes, w);
    const float* xb = x + b * 32;
    for (int i = 0; i < N; ++i) {
      const float* xi = xb + i * ldx;
      __m256 p = _mm256_mul_ps(w[0], _mm256_loadu_ps(xi));
      __m256 q = _mm256_mul_ps(w[2], _mm256_loadu_ps(xi + 16));
      p = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xi + 8), p);
      q = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xi + 24), q);
      acc[i] = _mm256_add_ps(acc[i], _mm256_add_ps(p, q));
    }
  }
  for (int i = 0; i < N; ++i) y[i * ldy] = hsum(acc[i]);
}

template <class Dec>
void blocked_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  const auto* w = reinterpret_cast<const uint8_t*>(a.w);
  const int64_t nb = a.cols / 32;
  for_row_tiles(a, r0, r1, [&](int64_t r, int64_t i0, int64_t tile) {
    with_tile(tile, [&]<int N>() {
      block_row_tile<Dec, N>(w + static_cast<size_t>(r) * a.row_bytes, nb, a.x + i0 * a.cols, a.cols, a.y + i0 * a.rows + r, a.rows);
    });
  });
}

// ---- kernel v3 (Q4_0, Q4_1, Q8_0): integer-valued blocks, scales applied once per block ---
// A block contributes d * (q . x) + m * sum(x) (m = -8 d for Q4_0, none for Q8_0). So per
// block and activation row: four multiplies of q (converted to f32 exactly) by x, one FMA by the
// broadcast d, and the m * sum(x) term from precomputed block sums - instead of four FMAs to
// dequantize plus four to multiply. Profiling (llvm-mca, znver3) showed the kernel bound by FP
// pipe and issue pressure, not memory, so every uop per block counts:
//  - d and m are converted together by one vcvtph2ps of the block's first 4 bytes;
//  - nibbles: the activations are prepared once per call as x'_j = x_j - x_{j+16}/16 and
//    x''_j = x_{j+16}/16 (j < 16), so that with a byte b_j = lo_j + 16 hi_j,
//    lo_j x_j + hi_j x_{j+16} = lo_j x'_j + b_j x''_j: the high nibble needs no shift;
//  - the GEMV (n = 1) takes two weight rows per pass so each x register feeds both.
// What changed from v2 (scales gathered to a stack array per row, then vcvtph2ps): the narrow
// stores followed by a wide load of the same bytes failed store forwarding and cost ~40%.
// Measured on this machine (EPYC Zen 3, one thread, L2-resident Q4_1 rows of 576 and 1536):
// v1 dequant-then-FMA 2.7-2.85 ns/block, v3 1.9-2.0 ns/block.

// The block's quants as exact f32 in the order the prepared activations expect:
// nibbles: lo(bytes 0-7), lo(bytes 8-15), byte(0-7), byte(8-15); Q8_0: values 0-7 ... 24-31.
template <class L>
inline void unpack(const uint8_t* qs, __m256 v[4]) {
  if constexpr (L::kNibbles) {
    const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
    // Byte k of each 128-bit lane to the low byte of 32-bit lane k (-1 zeroes the rest).
    const __m256i spread0 = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,  //
                                             4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
    const __m256i spread1 = _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,  //
                                             12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1);
    const __m256i b0 = _mm256_shuffle_epi8(bytes, spread0), b1 = _mm256_shuffle_epi8(bytes, spread1);
    const __m256i low = _mm256_set1_epi32(0x0f);
    v[0] = _mm256_cvtepi32_ps(_mm256_and_si256(b0, low));
    v[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b1, low));
    v[2] = _mm256_cvtepi32_ps(b0);
    v[3] = _mm256_cvtepi32_ps(b1);
  } else {
    for (int k = 0; k < 4; ++k) v[k] = _mm256_cvtepi32_ps(load_i8x8(qs + 8 * k));
  }
}

// (v . xb) as 8 partial sums: two independent mul+fma chains joined by one add.
inline __m256 block_dot(const __m256 v[4], const float* xb) {
  __m256 p = _mm256_mul_ps(v[0], _mm256_loadu_ps(xb));
  __m256 r = _mm256_mul_ps(v[2], _mm256_loadu_ps(xb + 16));
  p = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(xb + 8), p);
  r = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(xb + 24), r);
  return _mm256_add_ps(p, r);
}

// GEMV, weight rows A = w0 and B = w0 + row_bytes against one prepared activation row (for
// R = 1 only A is stored). sums: the GEMV block-sum layout, 8 floats per block whose first four
// line up with pair_scales: [0, S, 0, S] for Q4_1, [-8S, 0, -8S, 0] for Q4_0, so one 4-wide FMA
// per block pair accumulates both rows' m * sum(x) terms.
template <class L, int R>
inline void gemv_rows(const uint8_t* w0, size_t row_bytes, int64_t nb, const float* xp, const float* sums, float* y) {
  const uint8_t* w1 = R == 2 ? w0 + row_bytes : w0;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m128 macc = _mm_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = xp + b * 32;
    const uint8_t* blk0 = w0 + static_cast<size_t>(b) * L::kBytes;
    const uint8_t* blk1 = w1 + static_cast<size_t>(b) * L::kBytes;
    prefetch_ahead(blk0);
    if constexpr (R == 2) prefetch_ahead(blk1);
    const __m128 dm = pair_scales<L>(blk0, blk1);
    if constexpr (L::kHasMin) macc = _mm_fmadd_ps(dm, _mm_loadu_ps(sums + 8 * b), macc);
    __m256 v[4];
    unpack<L>(blk0 + L::kQs, v);
    acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), block_dot(v, xb), acc0);
    if constexpr (R == 2) {
      unpack<L>(blk1 + L::kQs, v);
      acc1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(_mm_movehl_ps(dm, dm)), block_dot(v, xb), acc1);
    }
  }
  alignas(16) float m[4];
  _mm_store_ps(m, macc);
  y[0] = hsum(acc0) + (m[0] + m[1]);
  if constexpr (R == 2) y[1] = hsum(acc1) + (m[2] + m[3]);
}

// GEMM, one weight row against N <= 8 prepared activation rows (stride ldx); sums: the tile's
// block sums [nb][8], lane i for activation row i.
template <class L, int N>
inline void gemm_row(const uint8_t* wr, int64_t nb, const float* xp, int64_t ldx, const float* sums, float* y, int64_t ldy) {
  __m256 acc[N];
  __m256 macc = _mm256_setzero_ps();
  SPECULA_UNROLL for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = wr + static_cast<size_t>(b) * L::kBytes;
    prefetch_ahead(blk);
    const __m128 dmf = scales(blk);
    const __m256 d = _mm256_broadcastss_ps(dmf);
    if constexpr (L::kHasMin) macc = _mm256_fmadd_ps(_mm256_broadcastss_ps(L::min(dmf)), _mm256_loadu_ps(sums + 8 * b), macc);
    __m256 v[4];
    unpack<L>(blk + L::kQs, v);
    const float* xb = xp + b * 32;
    SPECULA_UNROLL for (int i = 0; i < N; ++i) acc[i] = _mm256_fmadd_ps(d, block_dot(v, xb + i * ldx), acc[i]);
  }
  alignas(32) float m[8];
  _mm256_store_ps(m, macc);
  SPECULA_UNROLL for (int i = 0; i < N; ++i) y[i * ldy] = hsum(acc[i]) + (L::kHasMin ? m[i] : 0.0f);
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

// Buffered kernel (Q4_K, Q6_K, float rows not a multiple of 32): dequantize 256 values of a
// row to the stack with the reference dequantize_row, then AVX2 dots against up to 8 rows.
constexpr int64_t kSliceCols = 256;

void buffered_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  alignas(32) float buf[kSliceCols];
  const int64_t block = dtype_info(a.dtype).block_elems;
  const int64_t slice = max64(block, kSliceCols / block * block);
  for (int64_t r = r0; r < r1; ++r) {
    const std::byte* wr = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t i0 = 0; i0 < a.n; i0 += 8) {
      const int64_t tile = min64(8, a.n - i0);
      __m256 acc[8];
      float tail[8] = {};
      for (int64_t i = 0; i < tile; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t c0 = 0; c0 < a.cols; c0 += slice) {
        const int64_t len = min64(slice, a.cols - c0);
        dequantize_row(a.dtype, wr + dtype_row_bytes(a.dtype, c0), buf, len);
        const int64_t len8 = len / 8 * 8;
        for (int64_t i = 0; i < tile; ++i) {
          const float* xi = a.x + (i0 + i) * a.cols + c0;
          for (int64_t j = 0; j < len8; j += 8) acc[i] = _mm256_fmadd_ps(_mm256_load_ps(buf + j), _mm256_loadu_ps(xi + j), acc[i]);
          for (int64_t j = len8; j < len; ++j) tail[i] += buf[j] * xi[j];
        }
      }
      for (int64_t i = 0; i < tile; ++i) a.y[(i0 + i) * a.rows + r] = hsum(acc[i]) + tail[i];
    }
  }
}

}  // namespace

RowsKernel avx2_rows_kernel(DType t, int64_t cols) {
  const bool whole_blocks = cols % 32 == 0;
  switch (t) {
    case DType::Q4_0: return &quant_rows<LayoutQ4_0>;
    case DType::Q4_1: return &quant_rows<LayoutQ4_1>;
    case DType::Q8_0: return &quant_rows<LayoutQ8_0>;
    case DType::F32: return whole_blocks ? &blocked_rows<DecodeF32> : &buffered_rows;
    case DType::F16: return whole_blocks ? &blocked_rows<DecodeF16> : &buffered_rows;
    case DType::BF16: return whole_blocks ? &blocked_rows<DecodeBF16> : &buffered_rows;
    default: return &buffered_rows;
  }
}

}  // namespace specula::host_kernels

namespace specula::host_kernels {

void prepare_activations_avx2(DType t, const float* x, int64_t n, int64_t cols, float* xprep, float* xsum) {
  const int64_t nb = cols / 32;
  const float min_scale = t == DType::Q4_0 ? -8.0f : 1.0f;  // Q4_0: m = -8 d, so sums carry the -8
  const int64_t tiles = (n + 7) / 8;
  for (int64_t k = 0; k < tiles * nb * 8; ++k) xsum[k] = 0.0f;
  const __m256 sixteenth = _mm256_set1_ps(1.0f / 16.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * cols;
    float* pi = xprep + i * cols;
    float* si = xsum + (i / 8) * nb * 8 + (i % 8);
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xi + b * 32;
      const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8), x2 = _mm256_loadu_ps(xb + 16), x3 = _mm256_loadu_ps(xb + 24);
      const __m256 h2 = _mm256_mul_ps(x2, sixteenth), h3 = _mm256_mul_ps(x3, sixteenth);  // exact
      _mm256_storeu_ps(pi + b * 32, _mm256_sub_ps(x0, h2));
      _mm256_storeu_ps(pi + b * 32 + 8, _mm256_sub_ps(x1, h3));
      _mm256_storeu_ps(pi + b * 32 + 16, h2);
      _mm256_storeu_ps(pi + b * 32 + 24, h3);
      const float sum = min_scale * hsum(_mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3)));
      if (n == 1) {  // the GEMV layout (see gemv_rows)
        const int lane = t == DType::Q4_1 ? 1 : 0;
        si[b * 8 + lane] = si[b * 8 + lane + 2] = sum;
      } else {
        si[b * 8] = sum;
      }
    }
  }
}

}  // namespace specula::host_kernels
