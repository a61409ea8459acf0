// AVX-512 VNNI kernels of the int8 path (this file alone is built with -mavx512vnni; call only
// where cpu_has_avx512_vnni()).
//
// Same packed layout as the AVX2 kernels (qmatmul.h), two groups at a time: a zmm holds a
// group-block's 32-byte vector of group g in its low half and the same vector of group g + 1 in
// its high half, so its 16 int32 lanes are 16 consecutive output rows. The integer dot product of
// one activation block is eight vpdpbusd (unsigned weight byte x signed activation byte, four
// products summed into each int32 lane) in two independent chains; it is exact, so the result is
// the same int32 the AVX2 and portable kernels compute, and the float work per output is the one
// qmatmul.h fixes: acc = fma(float(isum), fl(dw * dx), acc) [+ fma(mw, sx, acc)] in block order.
// Every row therefore stays bit-equal to the other kernels and to the 1-row call.
//
// Q8_0 weights are signed; vpdpbusd wants an unsigned operand, so the weights are offset by 128
// (w ^ 0x80 = w + 128 as a byte) and 128 * sum(x) is taken back out: exact in int32.
#include <vector>

#include "gpu/host/qmatmul_zmm.h"

namespace specula::host_kernels {

namespace {

// An outlier column's place in a group-block (column_location) and its weights in 16 rows.
template <DType T>
struct ColumnAt {
  ColumnLocation at;
  __m128i shift = _mm_setzero_si128();  // at.shift for the vector shifts
  ColumnAt() = default;
  ColumnAt(const PackedMatrix& m, int64_t c) : at(column_location(m, c)), shift(_mm_cvtsi32_si128(at.shift)) {}
  // The column's weights in the 16 rows of groups g and g + 1, from their blocks (pa, pb) and
  // the blocks' scales dw and mins mw (Q4_1, Q4_K), dequantized as add_outliers_portable does,
  // lane by lane (so the same bits).
  __m512 in_block(const uint8_t* pa, const uint8_t* pb, __m512 dw, __m512 mw) const {
    const __m512i word = load_pair(pa + at.word_off, pb + at.word_off);
    if constexpr (T == DType::Q8_0) {
      return _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_sll_epi32(word, shift), 24)));
    } else if constexpr (T == DType::Q2_K) {  // fma(d, sc q, -dmin m), as add_outliers_portable
      const __m512i q = _mm512_and_si512(_mm512_srl_epi32(word, shift), _mm512_set1_epi32(3));
      const __m512i sm = FormatQ2K::bytes_u32(pa + (at.high ? 40 : 32), pb + (at.high ? 40 : 32));
      const __m512i sc = _mm512_and_si512(sm, _mm512_set1_epi32(15));
      return _mm512_fmadd_ps(dw, _mm512_cvtepi32_ps(_mm512_mullo_epi32(sc, q)), _mm512_mul_ps(mw, _mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 4))));
    } else if constexpr (T == DType::Q6_K || T == DType::Q3_K) {  // Q3_K: the nibble, q - 4 for q6 - 32
      constexpr bool kNibbles = T == DType::Q3_K;
      const __m512i q = _mm512_and_si512(_mm512_srl_epi32(word, shift), _mm512_set1_epi32(kNibbles ? 0x0F : 0xFF));
      const __m512i s = FormatQ6K<>::scales_i32(pa + (at.high ? 24 : 16), pb + (at.high ? 24 : 16));
      return _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_mullo_epi32(s, _mm512_sub_epi32(q, _mm512_set1_epi32(kNibbles ? 4 : 32)))));
    } else if constexpr (T == DType::IQ4_NL || T == DType::IQ4_XS) {
      // The nibble, then its level (a 16-entry table: one vpermd).
      const __m512i nib = _mm512_and_si512(_mm512_srl_epi32(word, shift), _mm512_set1_epi32(0x0F));
      const __m512i levels = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlLevels)));
      return _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_permutexvar_epi32(nib, levels)));  // the Q8_0 layout's d * q
    } else if constexpr (is_five_bit(T)) {
      // The nibble, and the fifth bit from the pair's words (lane r of a group: bit 4r + i).
      const __m512i nib = _mm512_and_si512(_mm512_srl_epi32(word, shift), _mm512_set1_epi32(0x0F));
      uint32_t lo, hi;
      __builtin_memcpy(&lo, pa + at.five_off, 4);
      __builtin_memcpy(&hi, pb + at.five_off, 4);
      const __m512i words = _mm512_mask_blend_epi32(0xFF00, _mm512_set1_epi32(static_cast<int>(lo)), _mm512_set1_epi32(static_cast<int>(hi)));
      const __m512i at_bit = _mm512_add_epi32(_mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28),
                                              _mm512_set1_epi32(at.five_bit));
      const __m512i fifth = _mm512_and_si512(_mm512_srlv_epi32(words, at_bit), _mm512_set1_epi32(1));
      const __m512i q = _mm512_or_si512(nib, _mm512_slli_epi32(fifth, 4));
      if constexpr (T == DType::Q5_0)  // the Q8_0 layout's d * q
        return _mm512_mul_ps(dw, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(16))));
      else
        return _mm512_fmadd_ps(dw, _mm512_cvtepi32_ps(q), mw);
    } else {
      const __m512 q = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srl_epi32(word, shift), _mm512_set1_epi32(0x0F)));
      if constexpr (T == DType::Q4_0) return _mm512_mul_ps(dw, _mm512_sub_ps(q, _mm512_set1_ps(8.0f)));
      else return _mm512_fmadd_ps(dw, q, mw);
    }
  }
};

// Activation rows per pass over a group pair's blocks, at most: accumulators, the eight weight
// vectors and the temporaries fit the 32 registers. 9 measured as fast per row as 6 and 8 and
// takes a verify round of K = 8 in one pass.
constexpr int kTile = 9;

// The passes over a pair's blocks for n rows: as few as tiles of at most kTile rows allow, their
// sizes within one of each other (a pass re-unpacks every weight block: 7 rows as 6 + 1 cost a
// second unpack for one row); pass p of `passes` starting at row i0 has this many rows.
inline int64_t pass_count(int64_t n) { return (n + kTile - 1) / kTile; }
inline int64_t pass_rows(int64_t n, int64_t passes, int64_t p, int64_t i0) { return (n - i0) / (passes - p); }

// The activation rows in the order the tiles read them: pass by pass (the passes of
// pass_rows), and within a pass of N rows block by block, row i of block b at
// (i0 * blocks + b * N + i) * 32 and its scalars at i0 * blocks + b * N + i. A pass then reads
// one contiguous run of N * cols bytes and reaches its rows at fixed offsets from one pointer a
// block: with the rows' own strides (the width known at run time) the compiler kept a pointer a
// row, spilled them and reloaded one before each row's products; the default model's 9- and
// 16-row forwards ran 5-7% longer on Zen 5 (docs/kernels.md, "Block-major activation rows").
// The same values, so the same bits. One row is already in this order and is read in place.
struct PassMajor {
  const int8_t* q;
  const float *d, *sx;
  const int32_t *isum, *isum_lo;
};

// Each thread keeps its own copy for the rows of the call in hand (x.generation), so that the
// kernel needs nothing from its callers and the two threads of a call write nothing shared.
inline PassMajor pass_major(const QuantizedRows& x) {
  if (x.n == 1) return {x.q.data(), x.d.data(), x.sx.data(), x.isum.data(), x.isum_lo.data()};
  struct Copy {
    std::vector<int8_t> q;
    std::vector<float> d, sx;
    std::vector<int32_t> isum, isum_lo;
    uint64_t generation = 0;
  };
  thread_local Copy c;
  const int64_t n = x.n, nb = x.blocks;
  if (c.generation != x.generation || x.generation == 0) {
    c.q.resize(static_cast<size_t>(n * x.cols));
    const size_t scalars = static_cast<size_t>(n * nb);
    c.d.resize(scalars);
    c.sx.resize(scalars);
    c.isum.resize(scalars);
    c.isum_lo.resize(scalars);
    // One pointer per array, held in registers: the loop is ~1 ns a row and block (through the
    // vectors' members it was ~4.6, 2% of a 5-token forward's samples on Zen 5).
    const int8_t* const sq = x.q.data();
    const float *const sd = x.d.data(), *const ss = x.sx.data();
    const int32_t *const si = x.isum.data(), *const sl = x.isum_lo.data();
    int8_t* const dq = c.q.data();
    float *const dd = c.d.data(), *const ds = c.sx.data();
    int32_t *const di = c.isum.data(), *const dl = c.isum_lo.data();
    const int64_t passes = pass_count(n);
    for (int64_t p = 0, i0 = 0; p < passes; ++p) {
      const int64_t rows = pass_rows(n, passes, p, i0);
      for (int64_t i = 0; i < rows; ++i) {
        // Row i0 + i's blocks, in order, to their places in the pass (stride `rows`).
        const int64_t from0 = (i0 + i) * nb;
        int64_t to = i0 * nb + i;
        for (int64_t b = 0; b < nb; ++b, to += rows) {
          const int64_t from = from0 + b;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dq + to * 32), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sq + from * 32)));
          dd[to] = sd[from];
          ds[to] = ss[from];
          di[to] = si[from];
          dl[to] = sl[from];
        }
      }
      i0 += rows;
    }
    c.generation = x.generation;
  }
  return {c.q.data(), c.d.data(), c.sx.data(), c.isum.data(), c.isum_lo.data()};
}

// One pass's outlier columns, for adding the outliers' terms inside the tile: the distinct
// columns of its rows in column order (so by block), and for each of its rows and outliers the
// column's index among them. The tile dequantizes a column's weights while its block is in
// hand (the block's scales already loaded), and after the last block adds each row's terms in
// order, as add_outliers_portable does after the kernel: the same bits.
template <DType T>
struct PassOutliers {
  static constexpr int kOut = QuantizedRows::kOutliers;
  int count = 0;
  ColumnAt<T> column[kTile * kOut];
  uint8_t index[kTile * kOut];  // [row - first, k]
  void plan(const PackedMatrix& m, const QuantizedRows& x, int64_t first, int64_t rows) {
    int32_t cols[kTile * kOut];
    count = 0;
    for (int64_t o = first * kOut; o < (first + rows) * kOut; ++o) {
      const int32_t c = x.outlier_col[static_cast<size_t>(o)];
      int e = 0;
      while (e < count && cols[e] < c) ++e;
      if (e < count && cols[e] == c) continue;
      for (int f = count; f > e; --f) cols[f] = cols[f - 1];
      cols[e] = c;
      ++count;
    }
    for (int e = 0; e < count; ++e) column[e] = ColumnAt<T>(m, cols[e]);
    for (int64_t o = first * kOut; o < (first + rows) * kOut; ++o) {
      const int32_t c = x.outlier_col[static_cast<size_t>(o)];
      int e = 0;
      while (cols[e] != c) ++e;
      index[o - first * kOut] = static_cast<uint8_t>(e);
    }
  }
};

// The int32 dot products of a pass's N rows against one block's weights (formats whose dot is
// F::correct(dot8(...))): the rows' chains side by side, two a row (four deep) up to 6 rows and one
// (eight deep) from 7, where two would not fit the registers, so that the pipes always have N or
// 2N independent chains in flight where dot8 row after row gives two. The sums are exact, so they
// are dot8's whatever the order: the same bits. Measured on Zen 5 (cache-resident 576 x 576 Q4_1,
// docs/kernels.md, "The rows' chains side by side"): 9 rows 13.9 -> 12.2-12.6 us, 16 rows 24.4 ->
// 22.2-22.8.
template <class F, int N>
inline void row_dots(const typename F::Weights& wt, const int8_t* xq, const PassMajor& px, size_t xs, __m512i* s) {
  if constexpr (N <= 6) {
    __m512i t[N];
    for (int i = 0; i < N; ++i) s[i] = dpbusd_bcast(_mm512_setzero_si512(), wt.w[0], xq + 32 * i);
    for (int i = 0; i < N; ++i) t[i] = dpbusd_bcast(_mm512_setzero_si512(), wt.w[1], xq + 32 * i + 4);
    for (int c = 2; c < 8; c += 2) {
      for (int i = 0; i < N; ++i) s[i] = dpbusd_bcast(s[i], wt.w[c], xq + 32 * i + 4 * c);
      for (int i = 0; i < N; ++i) t[i] = dpbusd_bcast(t[i], wt.w[c + 1], xq + 32 * i + 4 * c + 4);
    }
    for (int i = 0; i < N; ++i) s[i] = _mm512_add_epi32(s[i], t[i]);
  } else {
    for (int i = 0; i < N; ++i) s[i] = dpbusd_bcast(_mm512_setzero_si512(), wt.w[0], xq + 32 * i);
    for (int c = 1; c < 8; ++c)
      for (int i = 0; i < N; ++i) s[i] = dpbusd_bcast(s[i], wt.w[c], xq + 32 * i + 4 * c);
  }
  for (int i = 0; i < N; ++i) s[i] = F::correct(s[i], px.isum[xs + static_cast<size_t>(i)]);
}

// Groups g (at a) and g + 1 (at b; b == a for a lone last group) against activation rows
// [i0, i0 + N): per block the weights are loaded once, then per row the arithmetic of qmatmul.h;
// the outlier columns' weights as their blocks pass; then each row's outlier terms. `valid`
// output rows are written (16 for a full pair).
template <class F, int N>
inline void tile(const PackedMatrix& m, const QuantizedRows& x, const PassMajor& px, int64_t i0, const uint8_t* a,
                 const uint8_t* b, float* y, int64_t ldy, int64_t valid, const PassOutliers<F::kType>& out) {
  constexpr int kOut = QuantizedRows::kOutliers;
  // Every loop over the pass's rows is unrolled whole, so that acc[] lives in registers: with a
  // loop left rolled GCC kept a copy of the accumulators on the stack and stored them every block
  // (9 stores a block at 9 rows); without them 8-16 rows take ~5% less (docs/kernels.md, "The
  // rows' chains side by side").
  __m512 acc[N];
  _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
  __m512 wo[N * kOut];
  int next = 0;  // out.column[next] is the next column to dequantize, in block order
  const int64_t nb = m.blocks;
  const int8_t* xq = px.q + i0 * nb * 32;  // this pass's rows of block 0
  for (int64_t blk = 0; blk < nb; ++blk, xq += N * 32) {
    const size_t xs = static_cast<size_t>(i0 * nb + blk * N);  // row i's scalars at xs + i
    const size_t off = static_cast<size_t>(blk) * m.block_bytes;
    const uint8_t* pa = a + off;
    const uint8_t* pb = b + off;
    for (int l = 0; l < F::kPrefetchLines; ++l) {
      prefetch(pa + 64 * l);
      prefetch(pb + 64 * l);
    }
    const __m512 dw = F::scale(pa, pb);
    constexpr bool kQ2K = F::kType == DType::Q2_K;  // its own load and dot for the pass's rows, and its mins
    typename F::Weights wt;
    if constexpr (kQ2K) F::template load<N>(pa, pb, wt);
    else F::load(pa, pb, wt);
    const __m512 mw = F::min(pa, pb);  // the mins (Q2_K: -dmin) for Q2_K's term and the outlier columns
    if constexpr (F::kDot8) {
      __m512i s[N];
      row_dots<F, N>(wt, xq, px, xs, s);
      _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) {
        const size_t xi = xs + static_cast<size_t>(i);
        acc[i] = accumulate_block<F>(acc[i], s[i], dw, mw, px.d[xi], px.sx[xi]);
      }
    } else
    for (int i = 0; i < N; ++i) {
      const int8_t* xb = xq + 32 * i;
      const size_t xi = xs + static_cast<size_t>(i);
      if constexpr (kQ2K)
        acc[i] = accumulate_block_q2_k(acc[i], F::template dot<N>(wt, xb), F::min_dot(wt, px.isum[xi], px.isum_lo[xi]), dw, mw, px.d[xi]);
      else
        acc[i] = accumulate_block<F>(acc[i], F::dot(wt, xb, px.isum[xi], px.isum_lo[xi]), dw, mw, px.d[xi], px.sx[xi]);
    }
    for (; next < out.count && out.column[next].at.blk_off == off; ++next)
      wo[next] = out.column[next].in_block(pa, pb, dw, mw);
  }
  _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i)
    _Pragma("GCC unroll 4") for (int k = 0; k < kOut; ++k)
      acc[i] = _mm512_fmadd_ps(wo[out.index[i * kOut + k]], _mm512_set1_ps(x.outlier_x[static_cast<size_t>((i0 + i) * kOut + k)]),
                               acc[i]);
  const __mmask16 keep = valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
  _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) _mm512_mask_storeu_ps(y + (i0 + i) * ldy, keep, acc[i]);
}

template <class F>
void rows_of_pair(const PackedMatrix& m, const QuantizedRows& x, const PassMajor& px, const uint8_t* a, const uint8_t* b,
                  float* y, int64_t ldy, int64_t valid, int64_t passes, const PassOutliers<F::kType>* plans) {
  for (int64_t p = 0, i0 = 0; p < passes; ++p) {
    const int64_t rows = pass_rows(x.n, passes, p, i0);
    const PassOutliers<F::kType>& out = plans[p];
    switch (rows) {
      case 1: tile<F, 1>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      case 2: tile<F, 2>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      case 3: tile<F, 3>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      case 4: tile<F, 4>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      case 5: tile<F, 5>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      case 6: tile<F, 6>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      case 7: tile<F, 7>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      case 8: tile<F, 8>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      case 9: tile<F, 9>(m, x, px, i0, a, b, y, ldy, valid, out); break;
      default: break;
    }
    i0 += rows;
  }
}

template <class F>
void kernel(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  const int64_t passes = pass_count(x.n);
  // The plans depend on the matrix and the rows alone, so a thread that runs several chunks of a
  // call (the caller, when the worker is late) makes them once.
  thread_local std::vector<PassOutliers<F::kType>> plans;
  thread_local const PackedMatrix* planned_for = nullptr;
  thread_local uint64_t planned_generation = 0;
  if (planned_for != &m || planned_generation != x.generation || x.generation == 0) {
    if (plans.size() < static_cast<size_t>(passes)) plans.resize(static_cast<size_t>(passes));
    for (int64_t p = 0, i0 = 0; p < passes; ++p) {
      const int64_t rows = pass_rows(x.n, passes, p, i0);
      plans[static_cast<size_t>(p)].plan(m, x, i0, rows);
      i0 += rows;
    }
    planned_for = &m;
    planned_generation = x.generation;
  }
  const PassMajor px = pass_major(x);
  for_group_pairs(m, y, g0, g1, [&](const uint8_t* a, const uint8_t* b, float* yp, int64_t valid) {
    rows_of_pair<F>(m, x, px, a, b, yp, ldy, valid, passes, plans.data());
  });
}

}  // namespace

PackedKernel avx512vnni_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &kernel<FormatQ4<false>>;
    case DType::Q4_1: return &kernel<FormatQ4<true>>;
    case DType::Q8_0: return &kernel<FormatQ8>;
    case DType::Q5_0: return &kernel<FormatQ5>;
    case DType::IQ4_NL: return &kernel<FormatIQ4NL<>>;
    case DType::IQ4_XS: return &kernel<FormatIQ4NL<true>>;
    case DType::Q5_1: return &kernel<FormatQ4<true, false, true>>;
    case DType::Q5_K: return &kernel<FormatQ4<true, true, true>>;
    case DType::Q4_K: return &kernel<FormatQ4<true, true>>;
    case DType::Q6_K: return &kernel<FormatQ6K<>>;
    case DType::Q3_K: return &kernel<FormatQ6K<true>>;
    case DType::Q2_K: return &kernel<FormatQ2K>;
    default: return nullptr;
  }
}

}  // namespace specula::host_kernels
