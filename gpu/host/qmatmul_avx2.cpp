// AVX2 kernels of the int8 path (this file alone of the path is built with -mavx2 -mfma -mf16c):
// the vpmaddubsw variant of the 256-bit kernels (qmatmul_ymm.h) and the activation quantizer.
#include "gpu/host/qmatmul_ymm.h"

#include <array>
#include <vector>

namespace specula::host_kernels {

PackedKernel avx2_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &stream_kernel<StreamQ4<false>>;
    case DType::Q4_1: return &stream_kernel<StreamQ4<true>>;
    case DType::Q8_0: return &stream_kernel<StreamQ8>;
    case DType::Q4_K: return &stream_kernel<StreamQ4<true, true>>;
    case DType::Q6_K: return &kernel<FormatQ6K<>>;
    case DType::Q3_K: return &kernel<FormatQ6K<true>>;
    case DType::Q2_K: return &kernel<FormatQ2K>;
    case DType::Q5_0: return &stream_kernel<StreamQ4<false, false, true>>;
    case DType::Q5_1: return &stream_kernel<StreamQ4<true, false, true>>;
    case DType::Q5_K: return &stream_kernel<StreamQ4<true, true, true>>;
    case DType::IQ4_NL: return &stream_kernel<StreamIQ4NL<>>;
    case DType::IQ4_XS: return &stream_kernel<StreamIQ4NL<true>>;
    default: return nullptr;
  }
}

namespace {

// The IQ4_NL levels as int32, for the outlier columns' gather.
const int32_t* iq4_nl_levels_i32() {
  static const auto levels = [] {
    std::array<int32_t, 16> l{};
    for (int i = 0; i < 16; ++i) l[static_cast<size_t>(i)] = kIq4NlLevels[i];
    return l;
  }();
  return levels.data();
}

// One group's weights of one outlier column (8 rows), dequantized as add_outliers_portable does.
// `word` is the 32-bit lane word holding the column's quant for each row, `blk` the group-block,
// `at` the column's place in it.
template <DType T>
inline __m256 column_weights(const uint8_t* blk, __m256i word, __m128i shift, const ColumnLocation& at) {
  const bool high_sub_block = at.high;
  const size_t five_off = at.five_off;
  const int five_bit = at.five_bit;
  if constexpr (T == DType::Q8_0) {
    return FormatQ8::column(blk, word, shift);
  } else if constexpr (T == DType::Q4_0 || T == DType::Q4_1 || T == DType::Q4_K) {  // as the tiles' Fold
    return FormatQ4<T != DType::Q4_0, T == DType::Q4_K>::column(blk, word, shift);
  } else if constexpr (T == DType::Q2_K) {  // fma(d, sc q, -dmin m)
    const __m256i q = _mm256_and_si256(_mm256_srl_epi32(word, shift), _mm256_set1_epi32(3));
    const __m256i sm = FormatQ2K::bytes_u32(blk + (high_sub_block ? 40 : 32));
    const __m256i sc = _mm256_and_si256(sm, _mm256_set1_epi32(15));
    return _mm256_fmadd_ps(scales8(blk), _mm256_cvtepi32_ps(_mm256_mullo_epi32(sc, q)),
                           _mm256_mul_ps(scales8(blk + 16), _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 4))));
  } else if constexpr (T == DType::Q6_K || T == DType::Q3_K) {  // Q3_K: the nibble, q - 4 for q6 - 32
    constexpr bool kNibbles = T == DType::Q3_K;
    const __m256i q = _mm256_and_si256(_mm256_srl_epi32(word, shift), _mm256_set1_epi32(kNibbles ? 0x0F : 0xFF));
    const __m256i s = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + (high_sub_block ? 24 : 16))));
    return _mm256_mul_ps(scales8(blk), _mm256_cvtepi32_ps(_mm256_mullo_epi32(s, _mm256_sub_epi32(q, _mm256_set1_epi32(kNibbles ? 4 : 32)))));
  } else {
    __m256i qi = _mm256_and_si256(_mm256_srl_epi32(word, shift), _mm256_set1_epi32(0x0F));
    if constexpr (T == DType::IQ4_NL || T == DType::IQ4_XS) {  // the nibble's level; IQ4_XS's scales are f32
      const __m256 d = T == DType::IQ4_XS ? _mm256_loadu_ps(reinterpret_cast<const float*>(blk)) : scales8(blk);
      return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_i32gather_epi32(iq4_nl_levels_i32(), qi, 4)));
    } else if constexpr (is_five_bit(T)) {  // the fifth bit from the column's word (lane r: bit 4r + i)
      int32_t w5;
      std::memcpy(&w5, blk + five_off, 4);
      const __m256i at_bit = _mm256_add_epi32(_mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28), _mm256_set1_epi32(five_bit));
      qi = _mm256_or_si256(qi, _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(w5), at_bit), _mm256_set1_epi32(1)), 4));
    }
    const __m256 q = _mm256_cvtepi32_ps(qi);
    if constexpr (T == DType::Q5_0) return _mm256_mul_ps(scales8(blk), _mm256_sub_ps(q, _mm256_set1_ps(16.0f)));
    else if constexpr (T == DType::Q5_1) return _mm256_fmadd_ps(scales8(blk), q, scales8(blk + 16));
    else
      return _mm256_fmadd_ps(_mm256_loadu_ps(reinterpret_cast<const float*>(blk)), q,
                             _mm256_loadu_ps(reinterpret_cast<const float*>(blk + 32)));
  }
}

// An outlier column's place in a group-block (column_location) and its 8 rows' weights.
template <DType T>
struct ColumnPlace {
  ColumnLocation at;
  __m128i shift = _mm_setzero_si128();  // at.shift for the vector shifts
  ColumnPlace() = default;
  ColumnPlace(const PackedMatrix& m, int64_t c) : at(column_location(m, c)), shift(_mm_cvtsi32_si128(at.shift)) {}
  __m256 weights(const uint8_t* group) const {
    const uint8_t* blk = group + at.blk_off;
    return column_weights<T>(blk, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + at.word_off)), shift, at);
  }
};

// Row i's terms for group g, added to y in order, with the outliers' weights from `weight(k)`.
template <typename WeightOf>
inline void add_row_terms(const QuantizedRows& x, int64_t i, float* yr, int64_t valid, WeightOf weight) {
  constexpr int kOut = QuantizedRows::kOutliers;
  alignas(32) float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (valid < 8)
    for (int64_t r = 0; r < valid; ++r) part[r] = yr[r];
  __m256 acc = valid == 8 ? _mm256_loadu_ps(yr) : _mm256_load_ps(part);
  for (int k = 0; k < kOut; ++k)
    acc = _mm256_fmadd_ps(weight(k), _mm256_set1_ps(x.outlier_x[static_cast<size_t>(i * kOut + k)]), acc);
  store_rows(yr, acc, valid);
}

// Group by group: the call's shared columns (QuantizedRows::outlier_distinct) are dequantized
// once for all the rows that have them, a row's other columns for that row alone.
template <DType T>
void add_outliers_t(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const size_t shared = x.outlier_distinct.size();
  const size_t outliers = static_cast<size_t>(x.n * kOut);
  const int64_t full = g1 < m.rows / 8 ? g1 : m.rows / 8;  // groups of 8 real rows
  ColumnPlace<T> place[QuantizedRows::kMaxShared];
  for (size_t d = 0; d < shared; ++d) place[d] = ColumnPlace<T>(m, x.outlier_distinct[d]);
  thread_local std::vector<ColumnPlace<T>> own;  // by outlier, for those without a slot
  if (own.size() < outliers) own.resize(outliers);
  for (size_t o = 0; o < outliers; ++o)
    if (x.outlier_slot[o] < 0) own[o] = ColumnPlace<T>(m, x.outlier_col[o]);
  __m256 w[QuantizedRows::kMaxShared];
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = m.group(g);
    for (size_t d = 0; d < shared; ++d) w[d] = place[d].weights(gp);
    for (int64_t i = 0; i < x.n; ++i)
      add_row_terms(x, i, y + i * ldy + g * 8, g < full ? 8 : m.rows - g * 8, [&](int k) {
        const size_t o = static_cast<size_t>(i * kOut + k);
        const int32_t slot = x.outlier_slot[o];
        return slot >= 0 ? w[slot] : own[o].weights(gp);
      });
  }
}

}  // namespace

void add_outliers_avx2(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  switch (m.dtype) {
    case DType::Q4_0: return add_outliers_t<DType::Q4_0>(m, x, y, ldy, g0, g1);
    case DType::Q4_1: return add_outliers_t<DType::Q4_1>(m, x, y, ldy, g0, g1);
    case DType::Q8_0: return add_outliers_t<DType::Q8_0>(m, x, y, ldy, g0, g1);
    case DType::Q4_K: return add_outliers_t<DType::Q4_K>(m, x, y, ldy, g0, g1);
    case DType::Q6_K: return add_outliers_t<DType::Q6_K>(m, x, y, ldy, g0, g1);
    case DType::Q5_0: return add_outliers_t<DType::Q5_0>(m, x, y, ldy, g0, g1);
    case DType::Q5_1: return add_outliers_t<DType::Q5_1>(m, x, y, ldy, g0, g1);
    case DType::Q5_K: return add_outliers_t<DType::Q5_K>(m, x, y, ldy, g0, g1);
    case DType::IQ4_NL: return add_outliers_t<DType::IQ4_NL>(m, x, y, ldy, g0, g1);
    case DType::IQ4_XS: return add_outliers_t<DType::IQ4_XS>(m, x, y, ldy, g0, g1);
    case DType::Q3_K: return add_outliers_t<DType::Q3_K>(m, x, y, ldy, g0, g1);
    case DType::Q2_K: return add_outliers_t<DType::Q2_K>(m, x, y, ldy, g0, g1);
    default: return;
  }
}

const uint8_t* wide_rows_avx2(const QuantizedRows& x) {
  struct Copy {
    alignas(32) uint8_t bytes[QuantizedRows::kWideBytes];
    uint64_t generation;
  };
  thread_local Copy c;  // zero-initialised: no call has generation 0 (quantize_rows counts from 1)
  if (c.generation != x.generation || x.generation == 0) {
    // Row-major blocks in q and in the copy alike: block bi of the call is row bi / blocks's block bi % blocks.
    const size_t blocks = static_cast<size_t>(x.n * x.blocks);
    const int8_t* const q = x.q.data();
    const float *const d = x.d.data(), *const sx = x.sx.data();
    uint8_t* dst = c.bytes;
    for (size_t bi = 0; bi < blocks; ++bi, dst += QuantizedRows::kWideBlock) {
      for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32 * k), bcast4(q + bi * 32 + 4 * k));
      _mm256_store_ps(reinterpret_cast<float*>(dst + 256), _mm256_set1_ps(d[bi]));
      _mm256_store_ps(reinterpret_cast<float*>(dst + 288), _mm256_set1_ps(sx[bi]));
    }
    c.generation = x.generation;
  }
  return c.bytes;
}

namespace {
struct alignas(32) Line32 {
  uint8_t bytes[32];
};
uint8_t* at_least(std::vector<Line32>& v, int64_t lines) {
  if (v.size() < static_cast<size_t>(lines)) v.resize(static_cast<size_t>(lines));
  return v.data()->bytes;
}
}  // namespace

LaneScratch lane_scratch_avx2(int64_t blocks, int64_t row_groups) {
  thread_local std::vector<Line32> bytes, floats, sums;
  float* const f = reinterpret_cast<float*>(at_least(floats, blocks * 2));
  return {at_least(bytes, blocks * 8), f, f + 8 * blocks, reinterpret_cast<float*>(at_least(sums, row_groups * 8))};
}

const uint8_t* lane_rows_avx2(const QuantizedRows& x) {
  struct Copy {
    std::vector<Line32> lines;
    uint64_t generation = 0;
  };
  thread_local Copy c;
  if (c.generation != x.generation || x.generation == 0) {
    const int64_t groups = lane_row_groups(x.n);
    uint8_t* dst = at_least(c.lines, groups * x.blocks * static_cast<int64_t>(kLaneBlock / 32));
    // One pointer per array (through the vectors' members such a loop ran ~4x slower:
    // qmatmul_avx512vnni.cpp's pass_major).
    const int8_t* const q = x.q.data();
    const float *const d = x.d.data(), *const sx = x.sx.data();
    const int32_t* const isum = x.isum.data();
    for (int64_t rg = 0; rg < groups; ++rg)
      for (int64_t b = 0; b < x.blocks; ++b, dst += kLaneBlock) {
        // Row r's block as eight 4-byte words, transposed: vector c gathers word c of the 8 rows.
        __m256 w[8];
        for (int r = 0; r < 8; ++r)
          w[r] = _mm256_loadu_ps(reinterpret_cast<const float*>(q + (rg * 8 + r) * x.cols + b * 32));
        transpose8(w);
        for (int c = 0; c < 8; ++c) _mm256_store_ps(reinterpret_cast<float*>(dst + 32 * c), w[c]);
        float* f = reinterpret_cast<float*>(dst + 256);
        int32_t* is = reinterpret_cast<int32_t*>(dst + 320);
        for (int r = 0; r < 8; ++r) {
          const size_t at = static_cast<size_t>((rg * 8 + r) * x.blocks + b);
          f[r] = d[at];
          f[8 + r] = sx[at];
          is[r] = isum[at];
        }
      }
    c.generation = x.generation;
  }
  return c.lines.data()->bytes;
}

namespace {

// The largest |x| of a block (NaNs ignored: vmaxps returns its second operand where either is NaN).
inline float block_max_avx2(const float* xb) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 mx = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * k)), mx);
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  return _mm_cvtss_f32(m4);
}

// A block's 32 q in order, from x * inv: without kClamp the products are converted unclamped (a
// finite block's |x| / d is at most 127 and a bit, which rounds to 127 in the current rounding
// mode, nearest-even as nearbyint's); a NaN, infinite or out-of-range product converts to
// INT32_MIN and packs to -128, which no clamped value gives: `wrapped` tells the caller to redo
// the block clamped (a NaN product then gives -127, as the portable clamp's max does).
template <bool kClamp>
inline __m256i quantize_block_avx2(const float* xb, __m256 vid, bool* wrapped) {
  const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
  __m256i qi[4];
  for (int k = 0; k < 4; ++k) {
    __m256 r = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), vid);
    if constexpr (kClamp) r = _mm256_min_ps(_mm256_max_ps(r, nlim), lim);
    qi[k] = _mm256_cvtps_epi32(r);
  }
  // int32 x 32 -> int8 x 32 in order: packs interleave 128-bit lanes, the permute undoes it.
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  if constexpr (!kClamp) *wrapped = _mm256_movemask_epi8(_mm256_cmpeq_epi8(p, _mm256_set1_epi8(-128))) != 0;
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

}  // namespace

void block_amax_avx2(const float* x, int64_t blocks, float* amax) {
  for (int64_t b = 0; b < blocks; ++b) amax[b] = block_max_avx2(x + 32 * b);
}

// Eight blocks at a time: their d and 1 / d by one vector division each (the same IEEE values as
// scalar ones), their q sums from the packed bytes (vpmaddubsw and vpmaddwd against ones, then
// a tree of vphaddd over the eight blocks) instead of two horizontal sums per block.
void quantize_rows_avx2(const float* x, int64_t n, int64_t cols, const int32_t* skip, const float* amax, int8_t* q, float* d,
                        int32_t* isum, int32_t* isum_lo, float* sx) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const int64_t nb = cols / 32;
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * cols;
    const int32_t* skip_row = skip != nullptr ? skip + i * kOut : nullptr;
    for (int64_t b0 = 0; b0 < nb; b0 += 8) {
      const int64_t count = nb - b0 < 8 ? nb - b0 : 8;
      alignas(32) float zeroed[8][32];
      const float* blk[8];
      // The maxima: a full batch's given ones straight from `amax` (no store of eight floats to
      // reload as a vector, which does not forward), then each other one put in its lane: given,
      // or computed here for a block with values set aside.
      const bool loaded = count == 8;
      __m256 mx = loaded ? _mm256_loadu_ps(amax + i * nb + b0) : _mm256_setzero_ps();
      for (int64_t t = 0; t < count; ++t) {
        const float* xb = xr + 32 * (b0 + t);
        blk[t] = skip_row != nullptr ? block_with_values_set_aside(xb, b0 + t, skip_row, zeroed[t]) : xb;
        if (loaded && blk[t] == xb) continue;
        const float m = blk[t] == xb ? amax[i * nb + b0 + t] : block_max_avx2(blk[t]);
        mx = _mm256_blendv_ps(mx, _mm256_set1_ps(m), _mm256_castsi256_ps(_mm256_cmpeq_epi32(lane, _mm256_set1_epi32(static_cast<int>(t)))));
      }
      const __m256 dv = _mm256_div_ps(mx, _mm256_set1_ps(127.0f));
      const __m256 nonzero = _mm256_cmp_ps(dv, _mm256_setzero_ps(), _CMP_NEQ_OQ);
      alignas(32) float inv[8];
      _mm256_store_ps(inv, _mm256_and_ps(nonzero, _mm256_div_ps(_mm256_set1_ps(1.0f), dv)));
      __m256i s[8];  // per block, sums of four q: lanes 0-3 its first 16, 4-7 its last 16
      for (int64_t t = 0; t < 8; ++t) {
        if (t >= count) {
          s[t] = _mm256_setzero_si256();
          continue;
        }
        const __m256 vid = _mm256_set1_ps(inv[t]);
        bool wrapped = false;
        __m256i p = quantize_block_avx2<false>(blk[t], vid, &wrapped);
        if (wrapped) p = quantize_block_avx2<true>(blk[t], vid, nullptr);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + (i * nb + b0 + t) * 32), p);
        s[t] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, p), ones16);
      }
      // Low 128 bits: blocks 4k..4k+3's first-16 sums; high: their last-16 sums.
      const __m256i s0 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
      const __m256i s1 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
      const __m256i lo = _mm256_permute2x128_si256(s0, s1, 0x20), hi = _mm256_permute2x128_si256(s0, s1, 0x31);
      const __m256i sum = _mm256_add_epi32(lo, hi);
      const int64_t bi = i * nb + b0;
      const __m256 sxv = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(sum));
      if (count == 8) {
        _mm256_storeu_ps(d + bi, dv);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(isum_lo + bi), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(isum + bi), sum);
        _mm256_storeu_ps(sx + bi, sxv);
      } else {  // the row's last blocks (vmaskmov stores are slow on AMD)
        alignas(32) float dt[8], st[8];
        alignas(32) int32_t lt[8], ut[8];
        _mm256_store_ps(dt, dv);
        _mm256_store_ps(st, sxv);
        _mm256_store_si256(reinterpret_cast<__m256i*>(lt), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(ut), sum);
        for (int64_t t = 0; t < count; ++t) d[bi + t] = dt[t], sx[bi + t] = st[t], isum_lo[bi + t] = lt[t], isum[bi + t] = ut[t];
      }
    }
  }
}

}  // namespace specula::host_kernels
