// AMX kernels of the int8 path (this file alone is built with -mamx-tile -mamx-int8; call only
// where cpu_has_amx_int8(), which also asks Linux for the tile state).
//
// The integer dot products of up to 16 activation rows against a group pair (16 output rows) are
// one tile multiply per 32-column block: A = the rows' int8 activations of the block (R rows x 32
// bytes, straight from the quantized rows with their row stride), B = the pair's weights as the
// eight zmm vectors the AVX-512 VNNI kernel builds (qmatmul_zmm.h: vector c, lane r = row r's
// bytes of columns 4c..4c+3, which is exactly the layout of B's row c), C = R x 16 int32 sums.
// tdpbsud (signed activation x unsigned weight byte) is exact, so C is the same int32 vpdpbusd
// gives; the offsets come out with F::correct, and the float work per output is the one qmatmul.h
// fixes: acc = fma(float(isum), fl(dw * dx), acc) [+ fma(mw, sx, acc)] in block order. Every row
// stays bit-equal to the other kernels and to the 1-row call.
//
// The tile unit costs a fixed amount per block (each block's sums must be stored and read back:
// its own scales keep them apart), so it runs only for calls of 13 to 16 rows; others, and Q6_K
// (whose two 16-column halves need their own sums), run the AVX-512 VNNI kernel, same bits.
//
// Tiles: 0/1 = C of even/odd blocks, 2/3 = their A, 4/5 = their B.
#include <sys/syscall.h>
#include <unistd.h>

#include "gpu/host/qmatmul_zmm.h"

namespace specula::host_kernels {

namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads the tile configuration for `rows` (1..16) activation rows unless this thread already has
// it (nothing else in the process uses the tile registers).
void configure(int rows) {
  thread_local int have = -1;
  if (have == rows) return;
  TileConfig c;
  for (int t = 0; t < 2; ++t) {
    c.colsb[t] = 64;  // C: 16 int32
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[2 + t] = 32;  // A: one 32-column block
    c.rows[2 + t] = static_cast<uint8_t>(rows);
    c.colsb[4 + t] = 64;  // B: 8 rows of 16 x 4 bytes
    c.rows[4 + t] = 8;
  }
  // Not _tile_loadconfig: GCC 12 treats that builtin as reading only the first bytes of `c` and
  // drops the stores of the tile shapes (every tile then faults as unconfigured). An asm whose
  // operand is the whole object keeps them.
  __asm__ volatile("ldtilecfg %0" : : "m"(c));
  have = rows;
}

// Blocks per stage of the pipeline below: the weight stores of a chunk are done (in L1) long
// before its tile loads read them, and the tile stores of a chunk long before its sums are read
// back (a tile load cannot take data from pending vector stores, nor a vector load from a pending
// tile store: with one block per stage each block waited ~100 cycles on those round trips).
constexpr int kChunk = 8;

struct Scratch {
  alignas(64) uint8_t b[2][kChunk][8 * 64];   // B tiles, two chunks
  alignas(64) int32_t c[2][kChunk][16 * 16];  // C tiles stored back, two chunks
};

// GCC's tile intrinsics paste their tile numbers into the instruction text: they must be literals.
#define SPECULA_AMX_MUL(C, A, B, b_rows, a_rows, a_stride, c_out) \
  do {                                                            \
    _tile_loadd(B, b_rows, 64);                                   \
    _tile_loadd(A, a_rows, a_stride);                             \
    _tile_zero(C);                                                \
    _tile_dpbsud(C, A, B);                                        \
    _tile_stored(C, c_out, 64);                                   \
  } while (0)

// The call's R rows against the group pair at a, b (b == a for a lone last group); `valid` output
// rows written. Per chunk of blocks, three stages: unpack the weights to B tiles in memory; the
// tile multiplies (even and odd blocks on their own tiles, so one's multiply runs while the
// other's result is stored); the float work of the previous chunk from its stored sums.
template <class F, int R>
void pair_rows(const PackedMatrix& m, const QuantizedRows& x, const uint8_t* a, const uint8_t* b, float* y, int64_t ldy,
               int64_t valid) {
  Scratch s;
  __m512 acc[R];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) acc[i] = _mm512_setzero_ps();
  const int64_t nb = m.blocks, cols = m.cols;
  const int8_t* xq = x.q.data();
  const int64_t chunks = (nb + kChunk - 1) / kChunk;
  // Written out in one loop (no lambdas capturing acc), so that acc stays in registers.
  for (int64_t ch = 0; ch <= chunks; ++ch) {
    if (ch < chunks) {
      const int64_t b0 = ch * kChunk, len = nb - b0 < kChunk ? nb - b0 : kChunk;
      for (int64_t j = 0; j < len; ++j) {  // unpack
        const size_t off = static_cast<size_t>(b0 + j) * m.block_bytes;
        for (int l = 0; l < F::kPrefetchLines; ++l) {
          prefetch(a + off + 64 * l);
          prefetch(b + off + 64 * l);
        }
        typename F::Weights wt;
        F::load(a + off, b + off, wt);
        for (int c = 0; c < 8; ++c) _mm512_store_si512(s.b[ch & 1][j] + 64 * c, wt.w[c]);
      }
      for (int64_t j = 0; j < len; ++j) {  // multiply
        const int8_t* xa = xq + (b0 + j) * 32;
        if ((j & 1) == 0) {
          SPECULA_AMX_MUL(0, 2, 4, s.b[ch & 1][j], xa, cols, s.c[ch & 1][j]);
        } else {
          SPECULA_AMX_MUL(1, 3, 5, s.b[ch & 1][j], xa, cols, s.c[ch & 1][j]);
        }
      }
    }
    if (ch == 0) continue;
    const int64_t p = ch - 1, b0 = p * kChunk, len = nb - b0 < kChunk ? nb - b0 : kChunk;
    for (int64_t j = 0; j < len; ++j) {  // scale the previous chunk
      const int64_t blk = b0 + j;
      const size_t off = static_cast<size_t>(blk) * m.block_bytes;
      const __m512 dw = F::scale(a + off, b + off);
      const int32_t* c = s.c[p & 1][j];
#pragma GCC unroll 16
      for (int i = 0; i < R; ++i) {
        const size_t xi = static_cast<size_t>(i * nb + blk);
        const __m512i s32 = F::correct(_mm512_load_si512(c + 16 * i), x.isum[xi]);
        acc[i] = accumulate_block<F>(acc[i], s32, dw, a + off, b + off, x, xi);
      }
    }
  }
  const __mmask16 keep = valid >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << valid) - 1);
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

using PairFn = void (*)(const PackedMatrix&, const QuantizedRows&, const uint8_t*, const uint8_t*, float*, int64_t, int64_t);

// pair_rows for a run-time row count (13..16, see kMinRows).
template <class F>
PairFn pair_fn(int rows) {
  switch (rows) {
    case 13: return &pair_rows<F, 13>;
    case 14: return &pair_rows<F, 14>;
    case 15: return &pair_rows<F, 15>;
    case 16: return &pair_rows<F, 16>;
    default: return nullptr;
  }
}

// Calls of fewer rows than this, or of more than one tile's 16, run the AVX-512 VNNI kernel (same
// bits): over the default model the tiles beat vpdpbusd only from 13 rows, and a prefill of
// hundreds of rows in tiles of 16 measured ~6% slower than on vpdpbusd (docs/kernels.md, "AMX").
constexpr int64_t kMinRows = 13, kMaxRows = 16;

template <class F>
void kernel(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  if (x.n < kMinRows || x.n > kMaxRows) {
    avx512vnni_packed_kernel(m.dtype)(m, x, y, ldy, g0, g1);
    return;
  }
  configure(static_cast<int>(x.n));
  const PairFn rows = pair_fn<F>(static_cast<int>(x.n));
  for_group_pairs(m, y, g0, g1, [&](const uint8_t* a, const uint8_t* b, float* yp, int64_t valid) {
    rows(m, x, a, b, yp, ldy, valid);
  });
  // The set-aside values' terms, which the VNNI kernel above adds in its tiles: the AVX2 pass.
  add_outliers_avx2(m, x, y, ldy, g0, g1);
}

}  // namespace

bool amx_int8_usable() {
  // Linux hands out the tile data state (XFEATURE_XTILEDATA, 18) only on request (5.16+).
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

PackedKernel amx_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &kernel<FormatQ4<false>>;
    case DType::Q4_1: return &kernel<FormatQ4<true>>;
    case DType::Q8_0: return &kernel<FormatQ8>;
    case DType::Q4_K: return &kernel<FormatQ4<true, true>>;
    case DType::Q5_0:  // the AVX-512 VNNI kernel at every row count (it adds the outliers in its tiles)
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::Q3_K:
    case DType::Q2_K:
    case DType::Q5_1:
    case DType::Q5_K:
    case DType::Q6_K: return avx512vnni_packed_kernel(t);
    default: return nullptr;
  }
}

}  // namespace specula::host_kernels
