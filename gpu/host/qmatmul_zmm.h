// The 512-bit weight formats of the int8 path, included by qmatmul_avx512vnni.cpp (vpdpbusd) and
// by qmatmul_amx.cpp (AMX tiles), each built with its own instruction set; everything here has
// internal linkage, so each file keeps its own copy.
//
// A zmm holds a group-block's 32-byte vector of group g in its low half and the same vector of
// group g + 1 in its high half, so its 16 int32 lanes are 16 consecutive output rows. F::load
// unpacks one group pair's block into eight such vectors: vector c holds, in lane r, the weight
// bytes of columns 4c..4c+3 of output row r (unsigned: Q8_0 offset by 128, w ^ 0x80), which is
// both vpdpbusd's operand and the row c of an AMX B tile. F::correct takes the offsets back out of
// the exact int32 dot product (Q4_0: 8 * sum(x); Q8_0: 128 * sum(x)).
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "gpu/host/qmatmul.h"

namespace specula::host_kernels {

namespace {

// No standard-library function templates here (see matmul_blocks.h).

// 32 bytes of group g (a) in the low half, 32 bytes of group g + 1 (b) in the high half.
inline __m512i load_pair(const uint8_t* a, const uint8_t* b) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

// 8 bytes of group g (a) in the low half, 8 bytes of group g + 1 (b) in the high half.
inline __m128i load8_pair(const uint8_t* a, const uint8_t* b) {
  return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)), _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
}

// The 8 fp16 scales of each group as 16 floats.
inline __m512 scales16(const uint8_t* a, const uint8_t* b) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

// Software prefetch 12 KiB ahead into L2: a group pair's blocks are consecutive, and so are the
// pairs of a thread's range, so this is the stream a few hundred nanoseconds ahead (the DRAM
// latency at this kernel's pace). Measured on the default model (Zen 4, 2 threads): one-token
// decode 4.5 -> 3.2 ms against 1 KiB ahead into L1, 3.6 ms at 4 KiB into L2, 3.3 ms at 16 KiB;
// since each thread streams one range a call (one chunk a thread), 12 KiB against 8 KiB: the
// same one-token forward, 3-5 rows 3-5% shorter (docs/kernels.md, "One chunk a thread").
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + 12288, _MM_HINT_T1); }

// acc + vpdpbusd(w, the 4 activation bytes at xb broadcast), the broadcast folded into the
// instruction's memory operand ({1to16}, AT&T syntax, GCC's default); GCC 12 emits a separate
// vpbroadcastd for the intrinsic. 2-9% faster cache-resident (docs/kernels.md, "The activation
// broadcast folded into vpdpbusd"); the same exact int32 sums.
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* xb) {
  asm("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(xb)));
  return acc;
}

// Eight vpdpbusd of the weight vectors against broadcasts of 4 activation bytes, in two chains.
inline __m512i dot8(const __m512i* w, const int8_t* xb) {
  __m512i s0 = dpbusd_bcast(_mm512_setzero_si512(), w[0], xb);
  __m512i s1 = dpbusd_bcast(_mm512_setzero_si512(), w[1], xb + 4);
  for (int c = 2; c < 8; c += 2) {
    s0 = dpbusd_bcast(s0, w[c], xb + 4 * c);
    s1 = dpbusd_bcast(s1, w[c + 1], xb + 4 * c + 4);
  }
  return _mm512_add_epi32(s0, s1);
}

// The 8 f32 scales of each group as 16 floats.
inline __m512 scales16_f32(const uint8_t* a, const uint8_t* b) {
  const __m256 lo = _mm256_loadu_ps(reinterpret_cast<const float*>(a));
  const __m256 hi = _mm256_loadu_ps(reinterpret_cast<const float*>(b));
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

// Q4_0 (kMin = false: nibble - 8, so 8 * isum is subtracted) and Q4_1 (kMin = true: the min term
// is the second FMA). Vector c < 4 is the low nibbles of packed vector c, c >= 4 the high ones,
// matching activation bytes 4c..4c+3 (see qmatmul.h). kF32: Q4_K repacked as Q4_1 with f32
// scales and mins (64 header bytes).
// kFive: the five-bit layouts (Q5_0 from Q4_0's, Q5_1 from Q4_1's, Q5_K from Q4_K's): after the
// nibbles, one 32-bit word of fifth bits per unpacked vector and group (bit 4r + i: row r's byte
// i in it), joined for the pair into a 64-bit mask that adds 16 to those bytes. Q5_0 takes 16 *
// isum out where Q4_0 takes 8.
template <bool kMin, bool kF32 = false, bool kFive = false>
struct FormatQ4 {
  static constexpr DType kType = kFive ? (kF32 ? DType::Q5_K : kMin ? DType::Q5_1 : DType::Q5_0)
                                       : (kF32 ? DType::Q4_K : kMin ? DType::Q4_1 : DType::Q4_0);
  static constexpr bool kHasMin = kMin;
  static constexpr bool kDot8 = true;  // dot is correct(dot8(...)): the tile may run row_dots
  static constexpr int kHeader = kF32 ? 64 : kMin ? 32 : 16;
  static constexpr int kBytes = kHeader + static_cast<int>(kNibbleBytes) + (kFive ? 32 : 0);  // 144 .. 224
  static constexpr int kPrefetchLines = (kBytes + 63) / 64;
  struct Weights {
    __m512i w[8];
  };
  static __m512 scale(const uint8_t* a, const uint8_t* b) { return kF32 ? scales16_f32(a, b) : scales16(a, b); }
  static __m512 min(const uint8_t* a, const uint8_t* b) { return kF32 ? scales16_f32(a + 32, b + 32) : scales16(a + 16, b + 16); }
  static void load(const uint8_t* a, const uint8_t* b, Weights& wt) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m512i v = load_pair(a + kHeader + 32 * k, b + kHeader + 32 * k);
      wt.w[k] = _mm512_and_si512(v, low);
      wt.w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    if constexpr (kFive) {
      const __m512i sixteen = _mm512_set1_epi8(16);
      for (int c = 0; c < 8; ++c) {
        uint32_t lo, hi;
        __builtin_memcpy(&lo, a + kHeader + kNibbleBytes + 4 * c, 4);
        __builtin_memcpy(&hi, b + kHeader + kNibbleBytes + 4 * c, 4);
        const __mmask64 five = _cvtu64_mask64(static_cast<uint64_t>(hi) << 32 | lo);
        wt.w[c] = _mm512_mask_add_epi8(wt.w[c], five, wt.w[c], sixteen);
      }
    }
  }
  static __m512i correct(__m512i s, int32_t isum) {
    return kMin ? s : _mm512_sub_epi32(s, _mm512_set1_epi32((kFive ? 16 : 8) * isum));
  }
  static __m512i dot(const Weights& wt, const int8_t* xb, int32_t isum, int32_t) { return correct(dot8(wt.w, xb), isum); }
};
// Q5_0 (a five-bit Q8_0 matrix, qmatmul.h): Q4_0's nibbles of u = q + 16 and the fifth bits.
using FormatQ5 = FormatQ4<false, false, true>;

// IQ4_NL (qmatmul.h): Q4_0's nibbles, each the index of a level; one vpshufb per vector looks the
// level + 128 up (an unsigned byte, as Q8_0's w ^ 0x80), and 128 * isum is taken out as Q8_0 takes
// it. kF32: IQ4_XS, the same nibbles after f32 scales (32 header bytes).
template <bool kF32 = false>
struct FormatIQ4NL {
  static constexpr DType kType = kF32 ? DType::IQ4_XS : DType::IQ4_NL;
  static constexpr bool kHasMin = false;
  static constexpr bool kDot8 = true;
  static constexpr int kHeader = kF32 ? 32 : 16;
  static constexpr int kPrefetchLines = 3;  // 144 or 160 bytes per group-block
  struct Weights {
    __m512i w[8];
  };
  static __m512 scale(const uint8_t* a, const uint8_t* b) { return kF32 ? scales16_f32(a, b) : scales16(a, b); }
  static __m512 min(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
  // The sixteen levels + 128, broadcast to every 128-bit lane (vpshufb looks up within a lane).
  struct Levels {
    alignas(16) uint8_t u[16];
  };
  static constexpr Levels kLevels = [] {
    Levels l{};
    for (int i = 0; i < 16; ++i) l.u[i] = static_cast<uint8_t>(kIq4NlLevels[i] + 128);
    return l;
  }();
  static void load(const uint8_t* a, const uint8_t* b, Weights& wt) {
    const __m512i levels = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kLevels.u)));
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
      const __m512i v = load_pair(a + kHeader + 32 * k, b + kHeader + 32 * k);
      wt.w[k] = _mm512_shuffle_epi8(levels, _mm512_and_si512(v, low));
      wt.w[k + 4] = _mm512_shuffle_epi8(levels, _mm512_and_si512(_mm512_srli_epi16(v, 4), low));
    }
  }
  static __m512i correct(__m512i s, int32_t isum) { return _mm512_sub_epi32(s, _mm512_set1_epi32(128 * isum)); }
  static __m512i dot(const Weights& wt, const int8_t* xb, int32_t isum, int32_t) { return correct(dot8(wt.w, xb), isum); }
};

// Q8_0: 16 bytes of scales, then 8 x 32 signed quant bytes, used as w + 128.
struct FormatQ8 {
  static constexpr DType kType = DType::Q8_0;
  static constexpr bool kHasMin = false;
  static constexpr bool kDot8 = true;
  static constexpr int kPrefetchLines = 5;  // 272 bytes per group-block
  static __m512 scale(const uint8_t* a, const uint8_t* b) { return scales16(a, b); }
  static __m512 min(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
  struct Weights {
    __m512i w[8];
  };
  static void load(const uint8_t* a, const uint8_t* b, Weights& wt) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int c = 0; c < 8; ++c) wt.w[c] = _mm512_xor_si512(load_pair(a + 16 + 32 * c, b + 16 + 32 * c), bias);
  }
  static __m512i correct(__m512i s, int32_t isum) { return _mm512_sub_epi32(s, _mm512_set1_epi32(128 * isum)); }
  static __m512i dot(const Weights& wt, const int8_t* xb, int32_t isum, int32_t) { return correct(dot8(wt.w, xb), isum); }
};

// Q6_K: fp16 d, the two sub-blocks' int8 scales, then 8 x 32 bytes of 6-bit quants (qmatmul.h):
// isum = s_lo * (dot_lo - 32 sum_lo x) + s_hi * (dot_hi - 32 sum_hi x), exact in int32.
// kNibbles: Q3_K, the same header, then Q4_0's nibbles of the 3-bit q (unpacked as FormatQ4 does),
// with 4 for 32: the Q6_K layout's integer sums (q6 - 32 = q - 4), so its bits.
template <bool kNibbles = false>
struct FormatQ6K {
  static constexpr DType kType = kNibbles ? DType::Q3_K : DType::Q6_K;
  static constexpr bool kHasMin = false;
  static constexpr bool kDot8 = false;  // two sub-blocks' scaled sums
  static constexpr int kPrefetchLines = kNibbles ? 3 : 5;  // 160 or 288 bytes per group-block
  static constexpr int32_t kOffset = kNibbles ? 4 : 32;
  static __m512 scale(const uint8_t* a, const uint8_t* b) { return scales16(a, b); }
  static __m512 min(const uint8_t*, const uint8_t*) { return _mm512_setzero_ps(); }
  struct Weights {
    __m512i w[8], s_lo, s_hi;
  };
  static __m512i scales_i32(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepi8_epi32(load8_pair(a, b)); }
  static void load(const uint8_t* a, const uint8_t* b, Weights& wt) {
    if constexpr (kNibbles) {
      const __m512i low = _mm512_set1_epi8(0x0F);
      for (int k = 0; k < 4; ++k) {
        const __m512i v = load_pair(a + 32 + 32 * k, b + 32 + 32 * k);
        wt.w[k] = _mm512_and_si512(v, low);
        wt.w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    } else {
      for (int c = 0; c < 8; ++c) wt.w[c] = load_pair(a + 32 + 32 * c, b + 32 + 32 * c);
    }
    wt.s_lo = scales_i32(a + 16, b + 16);
    wt.s_hi = scales_i32(a + 24, b + 24);
  }
  static __m512i dot(const Weights& wt, const int8_t* xb, int32_t isum, int32_t isum_lo) {
    __m512i lo = dpbusd_bcast(_mm512_setzero_si512(), wt.w[0], xb);
    __m512i lo1 = dpbusd_bcast(_mm512_setzero_si512(), wt.w[1], xb + 4);
    __m512i hi = dpbusd_bcast(_mm512_setzero_si512(), wt.w[4], xb + 16);
    __m512i hi1 = dpbusd_bcast(_mm512_setzero_si512(), wt.w[5], xb + 20);
    lo = dpbusd_bcast(lo, wt.w[2], xb + 8);
    lo1 = dpbusd_bcast(lo1, wt.w[3], xb + 12);
    hi = dpbusd_bcast(hi, wt.w[6], xb + 24);
    hi1 = dpbusd_bcast(hi1, wt.w[7], xb + 28);
    lo = _mm512_sub_epi32(_mm512_add_epi32(lo, lo1), _mm512_set1_epi32(kOffset * isum_lo));
    hi = _mm512_sub_epi32(_mm512_add_epi32(hi, hi1), _mm512_set1_epi32(kOffset * (isum - isum_lo)));
    return _mm512_add_epi32(_mm512_mullo_epi32(lo, wt.s_lo), _mm512_mullo_epi32(hi, wt.s_hi));
  }
};

// Q2_K (qmatmul.h): d and -dmin as fp16, each row's two sub-blocks' scale | min << 4 bytes, then
// two vectors of 2-bit q. load unpacks vector c = 4h + s (bits 2s of vector h) and, for a pass of
// more than kPerRowScaleRows rows, multiplies each byte by its sub-block's scale in 16-bit lanes
// (sc q <= 45: no carry into the next byte), so dot is Q8_0's eight products with no offset; for
// fewer, dot scales each half's sum instead. Either way sum (sc q) x over both sub-blocks. min_dot is the mins'
// sum m_lo sum_lo x + m_hi sum_hi x, one vpdpwssd of the rows' (m_lo, m_hi) int16 pairs against the
// activation block's two half sums (|sum| <= 16 * 127: int16). Both exact in int32; the tile then
// does acc = fma(float(dot), fl(d * dx), acc), acc = fma(float(min_dot), fl(-dmin * dx), acc).
struct FormatQ2K {
  static constexpr DType kType = DType::Q2_K;
  static constexpr bool kHasMin = false;  // its mins are per 16 values: the tile's own branch
  static constexpr bool kDot8 = false;
  static constexpr int kPrefetchLines = 2;  // 112 bytes per group-block
  // Passes of at most this many rows scale the two halves' sums per row (two vpmulld a row)
  // instead of every quant byte at unpacking (eight vpmullw a pass): the same exact sums.
  static constexpr int kPerRowScaleRows = 3;
  struct Weights {
    __m512i w[8], mins, s_lo, s_hi;
  };
  static __m512 scale(const uint8_t* a, const uint8_t* b) { return scales16(a, b); }
  static __m512 min(const uint8_t* a, const uint8_t* b) { return scales16(a + 16, b + 16); }
  // The 8 bytes of each group at a and b, zero-extended to 16 int32 lanes.
  static __m512i bytes_u32(const uint8_t* a, const uint8_t* b) { return _mm512_cvtepu8_epi32(load8_pair(a, b)); }
  // For a pass of N rows: w[c] the quants (times their scale where N > kPerRowScaleRows).
  template <int N>
  static void load(const uint8_t* a, const uint8_t* b, Weights& wt) {
    const __m512i lo = bytes_u32(a + 32, b + 32), hi = bytes_u32(a + 40, b + 40);
    const __m512i fifteen = _mm512_set1_epi32(15);
    wt.s_lo = _mm512_and_si512(lo, fifteen);
    wt.s_hi = _mm512_and_si512(hi, fifteen);
    wt.mins = _mm512_or_si512(_mm512_srli_epi32(lo, 4), _mm512_slli_epi32(_mm512_srli_epi32(hi, 4), 16));
    const __m512i three = _mm512_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m512i v = load_pair(a + 48 + 32 * h, b + 48 + 32 * h);
      for (int s = 0; s < 4; ++s) wt.w[4 * h + s] = _mm512_and_si512(s == 0 ? v : _mm512_srli_epi16(v, 2 * s), three);
    }
    if constexpr (N > kPerRowScaleRows) {
      const __m512i s16[2] = {_mm512_or_si512(wt.s_lo, _mm512_slli_epi32(wt.s_lo, 16)), _mm512_or_si512(wt.s_hi, _mm512_slli_epi32(wt.s_hi, 16))};
      for (int c = 0; c < 8; ++c) wt.w[c] = _mm512_mullo_epi16(wt.w[c], s16[c / 4]);
    }
  }
  template <int N>
  static __m512i dot(const Weights& wt, const int8_t* xb) {
    if constexpr (N > kPerRowScaleRows) {
      return dot8(wt.w, xb);
    } else {
      __m512i lo = dpbusd_bcast(_mm512_setzero_si512(), wt.w[0], xb);
      __m512i hi = dpbusd_bcast(_mm512_setzero_si512(), wt.w[4], xb + 16);
      for (int c = 1; c < 4; ++c) {
        lo = dpbusd_bcast(lo, wt.w[c], xb + 4 * c);
        hi = dpbusd_bcast(hi, wt.w[4 + c], xb + 16 + 4 * c);
      }
      return _mm512_add_epi32(_mm512_mullo_epi32(lo, wt.s_lo), _mm512_mullo_epi32(hi, wt.s_hi));
    }
  }
  static __m512i min_dot(const Weights& wt, int32_t isum, int32_t isum_lo) {
    const uint32_t halves = static_cast<uint16_t>(isum_lo) | static_cast<uint32_t>(static_cast<uint16_t>(isum - isum_lo)) << 16;
    return _mm512_dpwssd_epi32(_mm512_setzero_si512(), wt.mins, _mm512_set1_epi32(static_cast<int>(halves)));
  }
};

// The float work qmatmul.h fixes for one block of one activation row, given the block's exact
// int32 sums s32, the pair's weight scales dw and mins mw, and the row's block scale dx and sum sx:
// acc = fma(float(isum), fl(dw * dx), acc) [+ fma(mw, sx, acc)]. Every kernel here runs this,
// so their rows are bit-equal.
template <class F>
inline __m512 accumulate_block(__m512 acc, __m512i s32, __m512 dw, __m512 mw, float dx, float sx) {
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s32), _mm512_mul_ps(dw, _mm512_set1_ps(dx)), acc);
  if constexpr (F::kHasMin) acc = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx), acc);
  return acc;
}

// The same from the pair's blocks (pa, pb: the block in groups g and g + 1) and row-major rows
// (the AMX tiles).
template <class F>
inline __m512 accumulate_block(__m512 acc, __m512i s32, __m512 dw, const uint8_t* pa, const uint8_t* pb,
                               const QuantizedRows& x, size_t xi) {
  const __m512 mw = F::kHasMin ? F::min(pa, pb) : _mm512_setzero_ps();
  return accumulate_block<F>(acc, s32, dw, mw, x.d[xi], x.sx[xi]);
}

// Q2_K's: the scale term as every type's, then its mins' term (FormatQ2K).
inline __m512 accumulate_block_q2_k(__m512 acc, __m512i s32, __m512i mins32, __m512 dw, __m512 mw, float dx) {
  const __m512 x = _mm512_set1_ps(dx);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s32), _mm512_mul_ps(dw, x), acc);
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins32), _mm512_mul_ps(mw, x), acc);
}

// Groups [g0, g1) of m in pairs: rows(a, b, y + 8 g, valid) for group g at a and g + 1 at b, with
// `valid` output rows to write (16 for a full pair); a lone last group runs as a pair with itself
// (b == a), writing its own rows.
template <class Rows>
inline void for_group_pairs(const PackedMatrix& m, float* y, int64_t g0, int64_t g1, Rows rows) {
  for (int64_t g = g0; g < g1; g += 2) {
    const bool pair = g + 1 < g1;
    const int64_t left = m.rows - g * 8;
    const int64_t valid = pair ? (left < 16 ? left : 16) : (left < 8 ? left : 8);
    const uint8_t* a = m.group(g);
    rows(a, pair ? m.group(g + 1) : a, y + g * 8, valid);
  }
}

}  // namespace

}  // namespace specula::host_kernels
