// AVX2+FMA+F16C matmul kernels (this file alone is built with -mavx2 -mfma -mf16c; matmul.cpp
// calls it only after checking the CPU). Activations stay f32: each 32-value weight block is
// dequantized into four registers once and FMA'd against a tile of up to 8 activation rows, so
// a 6-row verification GEMM reads the weights once instead of six times.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "gpu/host/matmul_kernels.h"
#include "gpu/host/quant.h"

namespace specula::host_kernels {

namespace {

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 broadcast_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_set1_ps(_cvtsh_ss(h));
}

// 8 bytes -> 8 int32 lanes (zero-extended), straight from memory.
inline __m256i load_u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline __m256i load_i8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }

// ---- block decoders: 32 stored values -> w[0..3] = values 0-7, 8-15, 16-23, 24-31 ----------
// Nibble order (Q4_0/Q4_1): value j < 16 is the low nibble of byte j, value j + 16 the high one;
// zero-extending bytes 0-7 and 8-15 into int32 lanes then masking / shifting gives both halves.

struct DecodeQ4_0 {
  static constexpr size_t kBytes = 18;
  static void decode(const uint8_t* b, __m256 w[4]) {
    const __m256 d = broadcast_fp16(b);
    const __m256 neg8d = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));  // exact: (q - 8) d = q d - 8 d
    const __m256i lo = load_u8x8(b + 2), hi = load_u8x8(b + 10), mask = _mm256_set1_epi32(0x0f);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(lo, mask)), d, neg8d);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(hi, mask)), d, neg8d);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4)), d, neg8d);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4)), d, neg8d);
  }
};

struct DecodeQ4_1 {
  static constexpr size_t kBytes = 20;
  static void decode(const uint8_t* b, __m256 w[4]) {
    const __m256 d = broadcast_fp16(b), m = broadcast_fp16(b + 2);
    const __m256i lo = load_u8x8(b + 4), hi = load_u8x8(b + 12), mask = _mm256_set1_epi32(0x0f);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(lo, mask)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(hi, mask)), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(lo, 4)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(hi, 4)), d, m);
  }
};

struct DecodeQ8_0 {
  static constexpr size_t kBytes = 34;
  static void decode(const uint8_t* b, __m256 w[4]) {
    const __m256 d = broadcast_fp16(b);
    for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(load_i8x8(b + 2 + 8 * k)), d);
  }
};

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

// Rows of W handled together in the blocked kernels: their weights stay in L1 while every
// activation tile passes over them.
constexpr int64_t kRowGroup = 4;

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
  for (int64_t g0 = r0; g0 < r1; g0 += kRowGroup) {
    const int64_t g1 = std::min(r1, g0 + kRowGroup);
    for (int64_t i0 = 0; i0 < a.n; i0 += 8) {
      const float* x = a.x + i0 * a.cols;
      for (int64_t r = g0; r < g1; ++r) {
        const uint8_t* wr = w + static_cast<size_t>(r) * a.row_bytes;
        float* y = a.y + i0 * a.rows + r;
        switch (std::min<int64_t>(8, a.n - i0)) {
          case 1: block_row_tile<Dec, 1>(wr, nb, x, a.cols, y, a.rows); break;
          case 2: block_row_tile<Dec, 2>(wr, nb, x, a.cols, y, a.rows); break;
          case 3: block_row_tile<Dec, 3>(wr, nb, x, a.cols, y, a.rows); break;
          case 4: block_row_tile<Dec, 4>(wr, nb, x, a.cols, y, a.rows); break;
          case 5: block_row_tile<Dec, 5>(wr, nb, x, a.cols, y, a.rows); break;
          case 6: block_row_tile<Dec, 6>(wr, nb, x, a.cols, y, a.rows); break;
          case 7: block_row_tile<Dec, 7>(wr, nb, x, a.cols, y, a.rows); break;
          default: block_row_tile<Dec, 8>(wr, nb, x, a.cols, y, a.rows); break;
        }
      }
    }
  }
}

// Buffered kernel (Q4_K, Q6_K, float rows not a multiple of 32): dequantize 256 values of a
// row to the stack with the reference dequantize_row, then AVX2 dots against up to 8 rows.
constexpr int64_t kSliceCols = 256;

void buffered_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  alignas(32) float buf[kSliceCols];
  const int64_t block = dtype_info(a.dtype).block_elems;
  const int64_t slice = std::max(block, kSliceCols / block * block);
  for (int64_t r = r0; r < r1; ++r) {
    const std::byte* wr = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t i0 = 0; i0 < a.n; i0 += 8) {
      const int64_t tile = std::min<int64_t>(8, a.n - i0);
      __m256 acc[8];
      float tail[8] = {};
      for (int64_t i = 0; i < tile; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t c0 = 0; c0 < a.cols; c0 += slice) {
        const int64_t len = std::min(slice, a.cols - c0);
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
    case DType::Q4_0: return &blocked_rows<DecodeQ4_0>;
    case DType::Q4_1: return &blocked_rows<DecodeQ4_1>;
    case DType::Q8_0: return &blocked_rows<DecodeQ8_0>;
    case DType::F32: return whole_blocks ? &blocked_rows<DecodeF32> : &buffered_rows;
    case DType::F16: return whole_blocks ? &blocked_rows<DecodeF16> : &buffered_rows;
    case DType::BF16: return whole_blocks ? &blocked_rows<DecodeBF16> : &buffered_rows;
    default: return &buffered_rows;
  }
}

}  // namespace specula::host_kernels
