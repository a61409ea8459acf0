// Private to matmul_avx2.cpp and matmul_avx512.cpp: what their kernels share that does not depend
// on the vector width: the Q4_0 / Q4_1 / Q8_0 block layouts, the fp16 scales (F16C), the weight
// prefetch, and the loops that split a range of weight rows into row groups and activation tiles.
// Everything is in an unnamed namespace, so each kernel file compiles its own copy with its own
// instruction set: a shared (weak) copy could be the AVX-512 one and fault on an AVX2-only CPU.
// For the same reason nothing here calls a standard-library function template.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gpu/host/matmul_kernels.h"

namespace specula::host_kernels {
namespace {

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Fully unroll the short loops over activation rows so accumulator arrays live in registers.
#define SPECULA_UNROLL _Pragma("GCC unroll 8")

// Rows of W handled together: their weights stay in L1 while every activation tile passes over
// them. Activation rows per tile: the kernels' accumulators for 8 rows fit the register file.
constexpr int64_t kRowGroup = 4;
constexpr int64_t kTile = 8;

// Software prefetch of the weight stream, this many bytes ahead of the block being read. The
// hardware prefetcher alone left a single-thread Q8_0 GEMV of the output head at ~7 GB/s from
// DRAM against ~20 GB/s of plain streaming reads; 1 KiB ahead (one prefetch per block, mostly to
// a line already requested) brought it to ~14 GB/s. 2 KiB ahead was worse.
constexpr size_t kPrefetchBytes = 1024;
inline void prefetch_ahead(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0); }

// The block's leading fp16 pair converted in one go: lane 0 = d, lane 1 = m (Q4_1) or the first
// quant bytes (ignored). One vcvtph2ps per block; a 256 KiB f32 lookup table indexed by the half
// measured the same on the real model and costs cache, so it was dropped.
inline __m128 scales(const uint8_t* blk) {
  int32_t v;
  std::memcpy(&v, blk, 4);
  return _mm_cvtph_ps(_mm_cvtsi32_si128(v));
}

// Block layouts: byte size, where the quant bytes start, and where m comes from (lane 0 of
// scales() is d; Q4_0's m = -8 d reuses d, its block sums are prepared pre-multiplied by -8).
struct LayoutQ4_0 {
  static constexpr size_t kBytes = 18, kQs = 2;
  static constexpr bool kNibbles = true, kHasMin = true;
  static __m128 min(__m128 dm) { return dm; }
};
struct LayoutQ4_1 {
  static constexpr size_t kBytes = 20, kQs = 4;
  static constexpr bool kNibbles = true, kHasMin = true;
  static __m128 min(__m128 dm) { return _mm_movehdup_ps(dm); }
};
struct LayoutQ8_0 {
  static constexpr size_t kBytes = 34, kQs = 2;
  static constexpr bool kNibbles = false, kHasMin = false;
  static __m128 min(__m128) { return _mm_setzero_ps(); }
};

// GEMV scales of two rows' blocks in one vcvtph2ps: [dA, mA, dB, mB] for Q4_1, [dA, 0, dB, 0]
// otherwise (Q4_0 reads only d's two bytes: the next two are quants, possibly an fp16 nan). The
// GEMV block sums of prepare_activations_avx2 line up with these lanes.
template <class L>
inline __m128 pair_scales(const uint8_t* a, const uint8_t* b) {
  __m128i h;
  if constexpr (std::is_same_v<L, LayoutQ4_1>) {
    int32_t va, vb;
    std::memcpy(&va, a, 4);
    std::memcpy(&vb, b, 4);
    h = _mm_insert_epi32(_mm_cvtsi32_si128(va), vb, 1);
  } else {
    uint16_t va, vb;
    std::memcpy(&va, a, 2);
    std::memcpy(&vb, b, 2);
    h = _mm_insert_epi16(_mm_cvtsi32_si128(va), vb, 2);
  }
  return _mm_cvtph_ps(h);
}

// Calls f.template operator()<N>() with N = n (1..kTile) known at compile time.
template <class F>
inline void with_tile(int64_t n, F&& f) {
  switch (n) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    case 6: f.template operator()<6>(); break;
    case 7: f.template operator()<7>(); break;
    default: f.template operator()<8>(); break;
  }
}

// The GEMV's walk over rows [r0, r1): two rows a pass (f.template operator()<2>(r)), then one.
template <class F>
inline void for_row_pairs(int64_t r0, int64_t r1, F&& f) {
  int64_t r = r0;
  for (; r + 2 <= r1; r += 2) f.template operator()<2>(r);
  if (r < r1) f.template operator()<1>(r);
}

// The GEMM's walk over rows [r0, r1): per group of kRowGroup weight rows, per tile of up to kTile
// activation rows starting at i0, f(r, i0, tile) for each row r of the group.
template <class F>
inline void for_row_tiles(const MatmulArgs& a, int64_t r0, int64_t r1, F&& f) {
  for (int64_t g0 = r0; g0 < r1; g0 += kRowGroup) {
    const int64_t g1 = min64(r1, g0 + kRowGroup);
    for (int64_t i0 = 0; i0 < a.n; i0 += kTile)
      for (int64_t r = g0; r < g1; ++r) f(r, i0, min64(kTile, a.n - i0));
  }
}

}  // namespace
}  // namespace specula::host_kernels
