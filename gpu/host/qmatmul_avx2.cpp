// AVX2 kernels of the int8 path (this file alone of the path is built with -mavx2 -mfma -mf16c).
// Per 32-column block of a group of 8 weight rows: the nibbles are unpacked once into eight
// vectors (lane r = 4 columns of row r), then for each activation row eight broadcasts of 4
// activation bytes and eight vpmaddubsw (unsigned weight nibble x signed activation) summed in
// int16 (at most 8 x 2 x 15 x 127 = 30480, no saturation), one vpmaddwd to int32, one FMA: the
// vector lanes are the 8 output rows, so no horizontal sum is needed. Q8_0 weights are signed, so
// they use vpsignb to move the sign to the activation and widen each product pair to int32.
#include <immintrin.h>

#include <cstring>

#include "gpu/host/qmatmul.h"

namespace specula::host_kernels {

namespace {

// No standard-library function templates here (see matmul_blocks.h).

constexpr int64_t kTile = 4;  // activation rows per pass over a group's blocks (from L1 after the first)

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

inline __m256 scales8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + 1024, _MM_HINT_T0); }

inline void store_rows(float* y, __m256 v, int64_t valid) {
  if (valid >= 8) {
    _mm256_storeu_ps(y, v);
    return;
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int64_t r = 0; r < valid; ++r) y[r] = t[r];
}

// The formats: how a group-block's weights are loaded into registers once, and the exact int32
// dot product of one activation block with them (lane r = output row r).
struct Q4Weights {
  __m256i w[8];  // unsigned nibbles, columns 4c..4c+3 of each row in vector c
};

// Q4_0 (kMin = false: q - 8, so isum * 8 is subtracted) and Q4_1 (kMin = true: the min term is
// the second FMA): header 16 or 32 bytes, then 4 x 32 nibble bytes.
template <bool kMin>
struct FormatQ4 {
  static constexpr bool kHasMin = kMin;
  using Weights = Q4Weights;
  static void prefetch_block(const uint8_t* blk) { prefetch(blk); }
  static void load(const uint8_t* blk, Weights& wt) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + (kMin ? 32 : 16) + 32 * k));
      wt.w[k] = _mm256_and_si256(v, low);
      wt.w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
  }
  // Eight vpmaddubsw summed in int16 (at most 30480), one vpmaddwd to int32.
  static __m256i dot(const Weights& wt, const int8_t* xb, int32_t isum) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s16 = _mm256_maddubs_epi16(wt.w[0], bcast4(xb));
    for (int c = 1; c < 8; ++c) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wt.w[c], bcast4(xb + 4 * c)));
    const __m256i s32 = _mm256_madd_epi16(s16, ones);
    return kMin ? s32 : _mm256_sub_epi32(s32, _mm256_set1_epi32(8 * isum));
  }
};

// Q8_0: header 16 bytes, then 8 x 32 signed quant bytes. vpsignb moves each weight's sign onto
// the activation, and every product pair (up to 2 x 128 x 127) widens to int32 at once.
struct FormatQ8 {
  static constexpr bool kHasMin = false;
  struct Weights {
    __m256i w[8], aw[8];  // the quants and their absolute values
  };
  static void prefetch_block(const uint8_t* blk) {
    prefetch(blk);
    prefetch(blk + 128);
  }
  static void load(const uint8_t* blk, Weights& wt) {
    for (int c = 0; c < 8; ++c) {
      wt.w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
      wt.aw[c] = _mm256_abs_epi8(wt.w[c]);
    }
  }
  static __m256i dot(const Weights& wt, const int8_t* xb, int32_t) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(wt.aw[0], _mm256_sign_epi8(bcast4(xb), wt.w[0])), ones);
    for (int c = 1; c < 8; ++c)
      s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(_mm256_maddubs_epi16(wt.aw[c], _mm256_sign_epi8(bcast4(xb + 4 * c), wt.w[c])), ones));
    return s32;
  }
};

// One group (8 weight rows) against activation rows [i0, i0 + N): per block the weights are
// loaded once, then per row acc = fma(float(isum), dw * dx, acc) [+ fma(mw, sx, acc)], the
// arithmetic qmatmul.h fixes for every kernel.
template <class F, int N>
inline void tile(const PackedMatrix& m, const QuantizedRows& x, int64_t i0, const uint8_t* gp, float* y, int64_t ldy,
                 int64_t valid) {
  __m256 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  const int64_t nb = m.blocks, cols = m.cols;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = gp + static_cast<size_t>(b) * m.block_bytes;
    F::prefetch_block(blk);
    const __m256 dw = scales8(blk);
    typename F::Weights wt;
    F::load(blk, wt);
    for (int i = 0; i < N; ++i) {
      const size_t xi = static_cast<size_t>((i0 + i) * nb + b);
      const __m256i s32 = F::dot(wt, x.q.data() + (i0 + i) * cols + b * 32, x.isum[xi]);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
      if constexpr (F::kHasMin) acc[i] = _mm256_fmadd_ps(scales8(blk + 16), _mm256_set1_ps(x.sx[xi]), acc[i]);
    }
  }
  for (int i = 0; i < N; ++i) store_rows(y + (i0 + i) * ldy, acc[i], valid);
}

// Groups [g0, g1): per group, the activation rows in tiles of up to kTile.
template <class F>
void kernel(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = m.group(g);
    const int64_t valid = m.rows - g * 8 < 8 ? m.rows - g * 8 : 8;
    float* yg = y + g * 8;
    int64_t i0 = 0;
    for (; i0 + kTile <= x.n; i0 += kTile) tile<F, kTile>(m, x, i0, gp, yg, ldy, valid);
    switch (x.n - i0) {
      case 1: tile<F, 1>(m, x, i0, gp, yg, ldy, valid); break;
      case 2: tile<F, 2>(m, x, i0, gp, yg, ldy, valid); break;
      case 3: tile<F, 3>(m, x, i0, gp, yg, ldy, valid); break;
      default: break;
    }
  }
}

}  // namespace

PackedKernel avx2_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &kernel<FormatQ4<false>>;
    case DType::Q4_1: return &kernel<FormatQ4<true>>;
    case DType::Q8_0: return &kernel<FormatQ8>;
    default: return nullptr;
  }
}

void quantize_rows_avx2(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, int32_t* isum, float* sx) {
  const int64_t blocks = n * (cols / 32);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
  for (int64_t bi = 0; bi < blocks; ++bi) {
    const float* xb = x + bi * 32;
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float dv = amax / 127.0f;
    const float id = dv != 0.0f ? 1.0f / dv : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i s = _mm256_setzero_si256();
    __m256i qi[4];
    for (int k = 0; k < 4; ++k) {
      __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_min_ps(_mm256_max_ps(r, nlim), lim);
      qi[k] = _mm256_cvtps_epi32(r);
      s = _mm256_add_epi32(s, qi[k]);
    }
    // int32 x 32 -> int8 x 32 in order: packs interleave 128-bit lanes, the permute undoes it.
    const __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]);
    const __m256i p23 = _mm256_packs_epi32(qi[2], qi[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + bi * 32), p);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    const int32_t sum = _mm_cvtsi128_si32(s4);
    d[bi] = dv;
    isum[bi] = sum;
    sx[bi] = dv * static_cast<float>(sum);
  }
}

}  // namespace specula::host_kernels
