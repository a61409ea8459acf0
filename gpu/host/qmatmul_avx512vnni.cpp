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
#include "gpu/host/qmatmul_zmm.h"

namespace specula::host_kernels {

namespace {

// Activation rows per pass over a group pair's blocks, at most: accumulators, the eight weight
// vectors and the temporaries fit the 32 registers. 9 measured as fast per row as 6 and 8 and
// takes a verify round of K = 8 in one pass.
constexpr int kTile = 9;

// Groups g (at a) and g + 1 (at b; b == a for a lone last group) against activation rows
// [i0, i0 + N): per block the weights are loaded once, then per row the arithmetic of qmatmul.h.
// `valid` output rows are written (16 for a full pair).
template <class F, int N>
inline void tile(const PackedMatrix& m, const QuantizedRows& x, int64_t i0, const uint8_t* a, const uint8_t* b, float* y,
                 int64_t ldy, int64_t valid) {
  __m512 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
  const int64_t nb = m.blocks, cols = m.cols;
  for (int64_t blk = 0; blk < nb; ++blk) {
    const size_t off = static_cast<size_t>(blk) * m.block_bytes;
    const uint8_t* pa = a + off;
    const uint8_t* pb = b + off;
    for (int l = 0; l < F::kPrefetchLines; ++l) {
      prefetch(pa + 64 * l);
      prefetch(pb + 64 * l);
    }
    const __m512 dw = F::scale(pa, pb);
    typename F::Weights wt;
    F::load(pa, pb, wt);
    for (int i = 0; i < N; ++i) {
      const size_t xi = static_cast<size_t>((i0 + i) * nb + blk);
      const __m512i s32 = F::dot(wt, x.q.data() + (i0 + i) * cols + blk * 32, x.isum[xi], x.isum_lo[xi]);
      acc[i] = accumulate_block<F>(acc[i], s32, dw, pa, pb, x, xi);
    }
  }
  const __mmask16 keep = valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
  for (int i = 0; i < N; ++i) _mm512_mask_storeu_ps(y + (i0 + i) * ldy, keep, acc[i]);
}

template <class F>
void rows_of_pair(const PackedMatrix& m, const QuantizedRows& x, const uint8_t* a, const uint8_t* b, float* y, int64_t ldy,
                  int64_t valid) {
  // As few passes over the pair's blocks as tiles of at most kTile rows allow, their sizes within
  // one of each other (a pass re-unpacks every weight block: 7 rows as 6 + 1 cost a second
  // unpack for one row).
  const int64_t passes = (x.n + kTile - 1) / kTile;
  for (int64_t p = 0, i0 = 0; p < passes; ++p) {
    const int64_t rows = (x.n - i0) / (passes - p);
    switch (rows) {
      case 1: tile<F, 1>(m, x, i0, a, b, y, ldy, valid); break;
      case 2: tile<F, 2>(m, x, i0, a, b, y, ldy, valid); break;
      case 3: tile<F, 3>(m, x, i0, a, b, y, ldy, valid); break;
      case 4: tile<F, 4>(m, x, i0, a, b, y, ldy, valid); break;
      case 5: tile<F, 5>(m, x, i0, a, b, y, ldy, valid); break;
      case 6: tile<F, 6>(m, x, i0, a, b, y, ldy, valid); break;
      case 7: tile<F, 7>(m, x, i0, a, b, y, ldy, valid); break;
      case 8: tile<F, 8>(m, x, i0, a, b, y, ldy, valid); break;
      case 9: tile<F, 9>(m, x, i0, a, b, y, ldy, valid); break;
      default: break;
    }
    i0 += rows;
  }
}

template <class F>
void kernel(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  for_group_pairs(m, y, g0, g1, [&](const uint8_t* a, const uint8_t* b, float* yp, int64_t valid) {
    rows_of_pair<F>(m, x, a, b, yp, ldy, valid);
  });
}

}  // namespace

PackedKernel avx512vnni_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &kernel<FormatQ4<false>>;
    case DType::Q4_1: return &kernel<FormatQ4<true>>;
    case DType::Q8_0: return &kernel<FormatQ8>;
    case DType::Q4_K: return &kernel<FormatQ4<true, true>>;
    case DType::Q6_K: return &kernel<FormatQ6K>;
    default: return nullptr;
  }
}

}  // namespace specula::host_kernels
