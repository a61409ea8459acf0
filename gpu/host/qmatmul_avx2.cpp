// AVX2 kernels of the int8 path (this file alone of the path is built with -mavx2 -mfma -mf16c):
// the vpmaddubsw variant of the 256-bit kernels (qmatmul_ymm.h) and the activation quantizer.
#include "gpu/host/qmatmul_ymm.h"

namespace specula::host_kernels {

PackedKernel avx2_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &stream_kernel<StreamQ4<false>>;
    case DType::Q4_1: return &stream_kernel<StreamQ4<true>>;
    case DType::Q8_0: return &stream_kernel<StreamQ8>;
    case DType::Q4_K: return &stream_kernel<StreamQ4<true, true>>;
    case DType::Q6_K: return &kernel<FormatQ6K>;
    default: return nullptr;
  }
}

namespace {

// One group's weights of one outlier column (8 rows), dequantized as add_outliers_portable does.
// `word` is the 32-bit lane word holding the column's quant for each row, `blk` the group-block.
template <DType T>
inline __m256 column_weights(const uint8_t* blk, __m256i word, __m128i shift, bool high_sub_block) {
  if constexpr (T == DType::Q8_0) {
    return _mm256_mul_ps(scales8(blk), _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sll_epi32(word, shift), 24)));
  } else if constexpr (T == DType::Q6_K) {
    const __m256i q = _mm256_and_si256(_mm256_srl_epi32(word, shift), _mm256_set1_epi32(0xFF));
    const __m256i s = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + (high_sub_block ? 24 : 16))));
    return _mm256_mul_ps(scales8(blk), _mm256_cvtepi32_ps(_mm256_mullo_epi32(s, _mm256_sub_epi32(q, _mm256_set1_epi32(32)))));
  } else {
    const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(word, shift), _mm256_set1_epi32(0x0F)));
    if constexpr (T == DType::Q4_0) return _mm256_mul_ps(scales8(blk), _mm256_sub_ps(q, _mm256_set1_ps(8.0f)));
    else if constexpr (T == DType::Q4_1) return _mm256_fmadd_ps(scales8(blk), q, scales8(blk + 16));
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
    return column_weights<T>(blk, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + at.word_off)), shift, at.high);
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
    default: return;
  }
}

void broadcast_rows_avx2(QuantizedRows& x) {
  const size_t need = static_cast<size_t>(x.n * x.blocks) * QuantizedRows::kWideBlock + 32;
  if (x.wide.size() < need) x.wide.resize(need);
  x.wide_offset = (32 - reinterpret_cast<uintptr_t>(x.wide.data()) % 32) % 32;
  // Row-major blocks in q and in wide alike: block bi of the call is row bi / blocks's block bi % blocks.
  uint8_t* dst = x.wide.data() + x.wide_offset;
  for (size_t bi = 0; bi < x.d.size(); ++bi, dst += QuantizedRows::kWideBlock) {
    const int8_t* q = x.q.data() + bi * 32;
    for (int c = 0; c < 8; ++c) _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32 * c), bcast4(q + 4 * c));
    _mm256_store_ps(reinterpret_cast<float*>(dst + 256), _mm256_set1_ps(x.d[bi]));
    _mm256_store_ps(reinterpret_cast<float*>(dst + 288), _mm256_set1_ps(x.sx[bi]));
  }
  x.wide_ready = true;
}

void block_amax_avx2(const float* x, int64_t blocks, float* amax) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) mx = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 32 * b + 8 * k)), mx);  // NaN: mx
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    amax[b] = _mm_cvtss_f32(m4);
  }
}

void quantize_rows_avx2(const float* x, int64_t n, int64_t cols, const int32_t* skip, int8_t* q, float* d, int32_t* isum,
                        int32_t* isum_lo, float* sx) {
  constexpr int kOut = QuantizedRows::kOutliers;
  const int64_t nb = cols / 32, blocks = n * nb;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
  for (int64_t bi = 0; bi < blocks; ++bi) {
    alignas(32) float zeroed[32];
    const float* xb = x + bi * 32;
    if (skip != nullptr) xb = block_with_values_set_aside(xb, bi % nb, skip + (bi / nb) * kOut, zeroed);
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
    const auto hsum = [](__m256i v) {
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      return _mm_cvtsi128_si32(s4);
    };
    const int32_t sum = hsum(s);
    isum_lo[bi] = hsum(_mm256_add_epi32(qi[0], qi[1]));
    d[bi] = dv;
    isum[bi] = sum;
    sx[bi] = dv * static_cast<float>(sum);
  }
}

}  // namespace specula::host_kernels
