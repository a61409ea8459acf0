// The 256-bit kernels of the int8 path, included by qmatmul_avx2.cpp (vpmaddubsw) and by
// qmatmul_avxvnni.cpp (AVX-VNNI vpdpbusd, with SPECULA_YMM_VNNI defined), each built with its own
// instruction set; everything here has internal linkage, so each file keeps its own copy.
//
// Per 32-column block of a group of 8 weight rows: the nibbles are unpacked once into eight
// vectors (lane r = 4 columns of row r), then for each activation row eight broadcasts of 4
// activation bytes against them: the vector lanes are the 8 output rows, so no horizontal sum is
// needed. The int32 result is exact in both variants, and the float work per output is the one
// qmatmul.h fixes, so the two variants and the portable kernel agree bit for bit.
//   maddubs: eight vpmaddubsw (unsigned weight nibble x signed activation) summed in int16 (at
//     most 8 x 2 x 15 x 127 = 30480, no saturation), one vpmaddwd to int32. Q8_0 weights are
//     signed, so vpsignb moves their sign to the activation and each product pair widens to int32.
//   VNNI: eight vpdpbusd in two chains; Q8_0 weights are offset by 128 (w ^ 0x80) and
//     128 * sum(x) is taken back out.
// That holding tile serves one-row calls of the maddubs variant and calls of up to 4 rows of the
// VNNI one (and every call for Q6_K, Q3_K and Q2_K); the others run the streaming tile further
// down (one weight vector at a time through all the tile's rows; the maddubs variant's
// activations pre-broadcast in memory where they fit the L1: docs/kernels.md, "An AVX2-only
// machine" and "AVX-VNNI reads every layout").
#pragma once
#include <immintrin.h>

#include <cstdint>
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

// The VNNI variant asks for one line 12 KiB ahead of a block into L2, as the 512-bit kernel does:
// on an Intel core (the CPUs that run this variant: AVX-VNNI without AVX-512) the 1 KiB-into-L1
// prefetch it had before left one-token forwards 1.2-1.4x slower for several forwards after each
// forward of several rows, and the main job 0.87x as fast (docs/kernels.md, "The AVX-VNNI
// prefetch"). The maddubs variant asks for every line of the block 32 KiB ahead into L2: on a
// 2-core Zen 3 (AVX2 only), the default model's matrices streamed from DRAM took 0.71-0.89x the
// time of the 1 KiB prefetch at 1 to 5 rows (docs/kernels.md, "An AVX2-only machine").
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + 12288, _MM_HINT_T1); }
template <int kBytes>
inline void prefetch_lines(const uint8_t* blk) {
  for (int o = 0; o < kBytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(blk) + 32768 + o, _MM_HINT_T1);
}

inline void store_rows(float* y, __m256 v, int64_t valid) {
  if (valid >= 8) {
    _mm256_storeu_ps(y, v);
    return;
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, v);
  for (int64_t r = 0; r < valid; ++r) y[r] = t[r];
}

#ifdef SPECULA_YMM_VNNI
// Eight vpdpbusd (unsigned weight byte x signed activation byte) in two chains.
inline __m256i dot8(const __m256i* w, const int8_t* xb) {
  __m256i s0 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w[0], bcast4(xb));
  __m256i s1 = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w[1], bcast4(xb + 4));
  for (int c = 2; c < 8; c += 2) {
    s0 = _mm256_dpbusd_avx_epi32(s0, w[c], bcast4(xb + 4 * c));
    s1 = _mm256_dpbusd_avx_epi32(s1, w[c + 1], bcast4(xb + 4 * c + 4));
  }
  return _mm256_add_epi32(s0, s1);
}
#else
// Eight vpmaddubsw summed in int16 (at most 30480 for nibbles), one vpmaddwd to int32.
inline __m256i dot8(const __m256i* w, const int8_t* xb) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s16 = _mm256_maddubs_epi16(w[0], bcast4(xb));
  for (int c = 1; c < 8; ++c) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[c], bcast4(xb + 4 * c)));
  return _mm256_madd_epi16(s16, ones);
}
// The same for 5-bit weights (0..31): four vpmaddubsw at a time in int16 (at most 4 x 2 x 31 x 127
// = 31496), each four to int32.
inline __m256i dot8_five(const __m256i* w, const int8_t* xb) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s[2];
  for (int h = 0; h < 2; ++h) {
    __m256i s16 = _mm256_maddubs_epi16(w[4 * h], bcast4(xb + 16 * h));
    for (int c = 1; c < 4; ++c) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[4 * h + c], bcast4(xb + 16 * h + 4 * c)));
    s[h] = _mm256_madd_epi16(s16, ones);
  }
  return _mm256_add_epi32(s[0], s[1]);
}
#endif

#ifndef SPECULA_YMM_VNNI
// Signed weights w (|w| <= 128) against 4-byte activation broadcasts: vpsignb moves each weight's
// sign onto the activation, vpmaddubsw multiplies by |w|, and every pair widens to int32 at once.
inline __m256i sign_dot8(const __m256i* w, const __m256i* aw, const int8_t* xb) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(aw[0], _mm256_sign_epi8(bcast4(xb), w[0])), ones);
  for (int c = 1; c < 8; ++c)
    s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(_mm256_maddubs_epi16(aw[c], _mm256_sign_epi8(bcast4(xb + 4 * c), w[c])), ones));
  return s32;
}
#endif

// 16 in each byte j of a vector whose bit j is set in the 32-bit word at p (a five-bit layout's
// word for one unpacked vector: bit 4r + i is row r's byte i), 0 elsewhere.
inline __m256i fifth_bits(const uint8_t* p) {
  int32_t word;
  std::memcpy(&word, p, 4);
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i bytes = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(word), spread), bit);
  return _mm256_and_si256(_mm256_cmpeq_epi8(bytes, bit), _mm256_set1_epi8(16));
}

// Q4_0 (kMin = false: q - 8, so isum * 8 is subtracted) and Q4_1 (kMin = true: the min term is
// the second FMA): header 16 or 32 bytes of fp16 scales, then 4 x 32 nibble bytes. kF32: Q4_K
// repacked as Q4_1 with f32 scales and mins (64 header bytes). kFive: the five-bit layouts (Q5_0,
// Q5_1, Q5_K; qmatmul.h): 16 added to the bytes whose fifth bit is set, Q5_0 taking 16 * isum out;
// the maddubs variant sums them four products at a time (dot8_five).
template <bool kMin, bool kF32 = false, bool kFive = false>
struct FormatQ4 {
  static constexpr bool kHasMin = kMin;
  static constexpr int kHeader = kF32 ? 64 : kMin ? 32 : 16;
  static constexpr bool kFolds = !kFive;  // the tiles add the outliers' terms (Fold); not the five-bit layouts
  struct Weights {
    __m256i w[8];  // unsigned nibbles, columns 4c..4c+3 of each row in vector c
  };
  static __m256 scale(const uint8_t* blk) {
    return kF32 ? _mm256_loadu_ps(reinterpret_cast<const float*>(blk)) : scales8(blk);
  }
  static __m256 min(const uint8_t* blk) {
    return kF32 ? _mm256_loadu_ps(reinterpret_cast<const float*>(blk + 32)) : scales8(blk + 16);
  }
  static void prefetch_block(const uint8_t* blk) {
#ifdef SPECULA_YMM_VNNI
    prefetch(blk);
    if constexpr (kF32) prefetch(blk + 128);
#else
    prefetch_lines<kHeader + 128 + (kFive ? 32 : 0)>(blk);
#endif
  }
  // Packed vector k's two unpacked vectors: k (its low nibbles) and k + 4 (its high), with their
  // fifth bits in the five-bit layouts.
  static void unpack(const uint8_t* blk, int k, __m256i& lo, __m256i& hi) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kHeader + 32 * k));
    lo = _mm256_and_si256(v, low);
    hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    if constexpr (kFive) {
      lo = _mm256_add_epi8(lo, fifth_bits(blk + kHeader + kNibbleBytes + 4 * k));
      hi = _mm256_add_epi8(hi, fifth_bits(blk + kHeader + kNibbleBytes + 4 * (k + 4)));
    }
  }
  static void load(const uint8_t* blk, Weights& wt) {
    for (int k = 0; k < 4; ++k) unpack(blk, k, wt.w[k], wt.w[k + 4]);
  }
  static __m256i dot(const Weights& wt, const int8_t* xb, int32_t isum, int32_t) {
#ifdef SPECULA_YMM_VNNI
    const __m256i s32 = dot8(wt.w, xb);
#else
    const __m256i s32 = kFive ? dot8_five(wt.w, xb) : dot8(wt.w, xb);
#endif
    return kMin ? s32 : _mm256_sub_epi32(s32, _mm256_set1_epi32((kFive ? 16 : 8) * isum));
  }
  // One column's weights in the block's 8 rows, dequantized in f32 (the outliers' terms;
  // ColumnLocation): `word` the 32-bit lane words holding its nibble, `shift` the right shift to
  // it. fma(d, q, m), or d * (q - 8) without mins.
  static __m256 column(const uint8_t* blk, __m256i word, __m128i shift) {
    static_assert(!kFive, "the five-bit layouts' columns need their fifth bits (add_outliers_avx2)");
    const __m256 q = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(word, shift), _mm256_set1_epi32(0x0F)));
    if constexpr (kMin) return _mm256_fmadd_ps(scale(blk), q, min(blk));
    else return _mm256_mul_ps(scale(blk), _mm256_sub_ps(q, _mm256_set1_ps(8.0f)));
  }
};

// Q8_0: header 16 bytes, then 8 x 32 signed quant bytes.
struct FormatQ8 {
  static constexpr bool kHasMin = false;
  static constexpr bool kFolds = true;
  static __m256 scale(const uint8_t* blk) { return scales8(blk); }
  static __m256 min(const uint8_t*) { return _mm256_setzero_ps(); }
  // As FormatQ4::column: `shift` the left shift that brings the quant to the word's top byte, d * q.
  static __m256 column(const uint8_t* blk, __m256i word, __m128i shift) {
    return _mm256_mul_ps(scales8(blk), _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sll_epi32(word, shift), 24)));
  }
  static void prefetch_block(const uint8_t* blk) {
#ifdef SPECULA_YMM_VNNI
    prefetch(blk);
    prefetch(blk + 128);
#else
    prefetch_lines<272>(blk);
#endif
  }
#ifdef SPECULA_YMM_VNNI
  struct Weights {
    __m256i w[8];  // the quants + 128, as unsigned bytes
  };
  static void load(const uint8_t* blk, Weights& wt) {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int c = 0; c < 8; ++c)
      wt.w[c] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c)), bias);
  }
  static __m256i dot(const Weights& wt, const int8_t* xb, int32_t isum, int32_t) {
    return _mm256_sub_epi32(dot8(wt.w, xb), _mm256_set1_epi32(128 * isum));
  }
#else
  // vpsignb moves each weight's sign onto the activation, and every product pair (up to
  // 2 x 128 x 127) widens to int32 at once (sign_dot8).
  struct Weights {
    __m256i w[8], aw[8];  // the quants and their absolute values
  };
  static void load(const uint8_t* blk, Weights& wt) {
    for (int c = 0; c < 8; ++c) {
      wt.w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
      wt.aw[c] = _mm256_abs_epi8(wt.w[c]);
    }
  }
  static __m256i dot(const Weights& wt, const int8_t* xb, int32_t, int32_t) { return sign_dot8(wt.w, wt.aw, xb); }
#endif
};

// IQ4_NL (qmatmul.h): Q4_0's nibbles, each the index of a level, looked up by vpshufb; the
// products go as FormatQ8's. maddubs: the level and its absolute value, the sign moved onto the
// activation and each pair widened to int32 at once (level + 128 would overflow a vpmaddubsw pair).
// VNNI: the level + 128 (its sign bit flipped) against the activation, 128 * isum taken back out.
// kF32: IQ4_XS, the same nibbles after f32 scales (32 header bytes).
template <bool kF32 = false>
struct FormatIQ4NL {
  static constexpr bool kHasMin = false;
  static constexpr int kHeader = kF32 ? 32 : 16;
  static __m256 scale(const uint8_t* blk) {
    return kF32 ? _mm256_loadu_ps(reinterpret_cast<const float*>(blk)) : scales8(blk);
  }
  static __m256 min(const uint8_t*) { return _mm256_setzero_ps(); }
  struct Table {
    alignas(16) int8_t v[16];
  };
  // kTables[0]: the levels; kTables[1]: their magnitudes.
  struct Tables {
    Table t[2];
  };
  static constexpr Tables kTables = [] {
    Tables ts{};
    for (int i = 0; i < 16; ++i) {
      ts.t[0].v[i] = kIq4NlLevels[i];
      ts.t[1].v[i] = static_cast<int8_t>(kIq4NlLevels[i] < 0 ? -kIq4NlLevels[i] : kIq4NlLevels[i]);
    }
    return ts;
  }();
  // The levels (or their magnitudes) in both 128-bit lanes (vpshufb looks up within a lane).
  static __m256i table(bool absolute) {
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kTables.t[absolute ? 1 : 0].v)));
  }
  // The nibble vector of columns 4c..4c+3 (c < 4: low nibbles of packed vector c, else high of c - 4).
  static __m256i index(const uint8_t* blk, int c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kHeader + 32 * (c % 4)));
    return _mm256_and_si256(c < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  }
#ifdef SPECULA_YMM_VNNI
  static void prefetch_block(const uint8_t* blk) {
    prefetch(blk);
    if constexpr (kF32) prefetch(blk + 128);
  }
  struct Weights {
    __m256i w[8];  // the levels + 128, as unsigned bytes
  };
  // The levels + 128 (their sign bits flipped), for vpshufb to look up.
  static __m256i biased_table() { return _mm256_xor_si256(table(false), _mm256_set1_epi8(static_cast<char>(0x80))); }
  static void load(const uint8_t* blk, Weights& wt) {
    const __m256i biased = biased_table();
    for (int c = 0; c < 8; ++c) wt.w[c] = _mm256_shuffle_epi8(biased, index(blk, c));
  }
  static __m256i dot(const Weights& wt, const int8_t* xb, int32_t isum, int32_t) {
    return _mm256_sub_epi32(dot8(wt.w, xb), _mm256_set1_epi32(128 * isum));
  }
#else
  static void prefetch_block(const uint8_t* blk) { prefetch_lines<kHeader + 128>(blk); }
  struct Weights {
    __m256i w[8], aw[8];  // the levels and their absolute values
  };
  static void load(const uint8_t* blk, Weights& wt) {
    const __m256i levels = table(false), magnitudes = table(true);
    for (int c = 0; c < 8; ++c) {
      const __m256i i = index(blk, c);
      wt.w[c] = _mm256_shuffle_epi8(levels, i);
      wt.aw[c] = _mm256_shuffle_epi8(magnitudes, i);
    }
  }
  static __m256i dot(const Weights& wt, const int8_t* xb, int32_t, int32_t) { return sign_dot8(wt.w, wt.aw, xb); }
#endif
};

#ifdef SPECULA_YMM_VNNI
// Four vpdpbusd (columns 4c..4c+3 for c < 4 of w) in two chains.
inline __m256i dot4(const __m256i* w, const int8_t* xb) {
  const __m256i s0 = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w[0], bcast4(xb)), w[2], bcast4(xb + 8));
  const __m256i s1 = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), w[1], bcast4(xb + 4)), w[3], bcast4(xb + 12));
  return _mm256_add_epi32(s0, s1);
}
#else
// Four vpmaddubsw of 6-bit weights: two summed in int16 (at most 2 x 2 x 63 x 127 = 32004), then to int32.
inline __m256i dot4(const __m256i* w, const int8_t* xb) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i a = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], bcast4(xb)), _mm256_maddubs_epi16(w[1], bcast4(xb + 4)));
  const __m256i b = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], bcast4(xb + 8)), _mm256_maddubs_epi16(w[3], bcast4(xb + 12)));
  return _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
}
#endif

// Q6_K: fp16 d, the two sub-blocks' int8 scales, then 8 x 32 bytes of 6-bit quants (qmatmul.h):
// isum = s_lo * (dot_lo - 32 sum_lo x) + s_hi * (dot_hi - 32 sum_hi x), exact in int32.
// kNibbles: Q3_K, the same header, then Q4_0's nibbles of the 3-bit q, with 4 for 32 (the Q6_K
// layout's integer sums, q6 - 32 = q - 4).
template <bool kNibbles = false>
struct FormatQ6K {
  static constexpr bool kHasMin = false;
  static constexpr int32_t kOffset = kNibbles ? 4 : 32;
  static __m256 scale(const uint8_t* blk) { return scales8(blk); }
  static __m256 min(const uint8_t*) { return _mm256_setzero_ps(); }
  struct Weights {
    __m256i w[8], s_lo, s_hi;
  };
  static void prefetch_block(const uint8_t* blk) {
#ifdef SPECULA_YMM_VNNI
    prefetch(blk);
    prefetch(blk + 128);
    prefetch(blk + 256);
#else
    prefetch_lines<kNibbles ? 160 : 288>(blk);
#endif
  }
  static void load(const uint8_t* blk, Weights& wt) {
    if constexpr (kNibbles) {
      const __m256i low = _mm256_set1_epi8(0x0F);
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * k));
        wt.w[k] = _mm256_and_si256(v, low);
        wt.w[k + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
    } else {
      for (int c = 0; c < 8; ++c) wt.w[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 + 32 * c));
    }
    wt.s_lo = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 16)));
    wt.s_hi = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 24)));
  }
  static __m256i dot(const Weights& wt, const int8_t* xb, int32_t isum, int32_t isum_lo) {
    const __m256i lo = _mm256_sub_epi32(dot4(wt.w, xb), _mm256_set1_epi32(kOffset * isum_lo));
    const __m256i hi = _mm256_sub_epi32(dot4(wt.w + 4, xb + 16), _mm256_set1_epi32(kOffset * (isum - isum_lo)));
    return _mm256_add_epi32(_mm256_mullo_epi32(lo, wt.s_lo), _mm256_mullo_epi32(hi, wt.s_hi));
  }
};

// Q2_K (qmatmul.h; the 512-bit FormatQ2K's arithmetic for one group): a pass of more than
// kPerRowScaleRows rows multiplies each byte of q by its sub-block's scale in 16-bit lanes
// (sc q <= 45) at unpacking, a shorter one scales each half's sum per row; either way dot is
// sum (sc q) x with no offset. min_dot is the mins' sum m_lo sum_lo x + m_hi sum_hi x (vpmaddwd of
// the rows' (m_lo, m_hi) int16 pairs against the block's two half sums).
struct FormatQ2K {
  static constexpr bool kHasMin = false;  // its mins are per 16 values: tile's min_dot branch
  static constexpr bool kSubMins = true;
  // Passes of at most this many rows scale the two halves' sums per row (two vpmulld a row)
  // instead of every quant byte at unpacking (eight vpmullw a pass): the same exact sums.
  static constexpr int kPerRowScaleRows = 3;
  static __m256 scale(const uint8_t* blk) { return scales8(blk); }
  static __m256 min(const uint8_t* blk) { return scales8(blk + 16); }
  struct Weights {
    __m256i w[8], mins, s_lo, s_hi;
  };
  static void prefetch_block(const uint8_t* blk) {
#ifdef SPECULA_YMM_VNNI
    prefetch(blk);
    prefetch(blk + 64);
#else
    prefetch_lines<112>(blk);
#endif
  }
  static __m256i bytes_u32(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  // For a pass of N rows: w[c] the quants (times their scale where N > kPerRowScaleRows).
  template <int N>
  static void load(const uint8_t* blk, Weights& wt) {
    const __m256i lo = bytes_u32(blk + 32), hi = bytes_u32(blk + 40);
    const __m256i fifteen = _mm256_set1_epi32(15);
    wt.s_lo = _mm256_and_si256(lo, fifteen);
    wt.s_hi = _mm256_and_si256(hi, fifteen);
    wt.mins = _mm256_or_si256(_mm256_srli_epi32(lo, 4), _mm256_slli_epi32(_mm256_srli_epi32(hi, 4), 16));
    const __m256i three = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; ++h) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * h));
      for (int k = 0; k < 4; ++k) wt.w[4 * h + k] = _mm256_and_si256(k == 0 ? v : _mm256_srli_epi16(v, 2 * k), three);
    }
    if constexpr (N > kPerRowScaleRows) {
      const __m256i s16[2] = {_mm256_or_si256(wt.s_lo, _mm256_slli_epi32(wt.s_lo, 16)), _mm256_or_si256(wt.s_hi, _mm256_slli_epi32(wt.s_hi, 16))};
      for (int c = 0; c < 8; ++c) wt.w[c] = _mm256_mullo_epi16(wt.w[c], s16[c / 4]);
    }
  }
  // The scaled bytes (<= 45): the maddubs variant widens every two products (at most
  // 2 x 2 x 45 x 127 = 22860 in int16). The plain quants (<= 3): each half's four in int16 (at most
  // 4 x 2 x 3 x 127 = 3048), then scaled in int32.
  template <int N>
  static __m256i dot(const Weights& wt, const int8_t* xb) {
#ifdef SPECULA_YMM_VNNI
    if constexpr (N > kPerRowScaleRows) return dot8(wt.w, xb);
    __m256i half[2];
    for (int h = 0; h < 2; ++h) {
      half[h] = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), wt.w[4 * h], bcast4(xb + 16 * h));
      for (int k = 1; k < 4; ++k) half[h] = _mm256_dpbusd_avx_epi32(half[h], wt.w[4 * h + k], bcast4(xb + 16 * h + 4 * k));
    }
#else
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (N > kPerRowScaleRows) {
      __m256i s32 = _mm256_setzero_si256();
      for (int c = 0; c < 8; c += 2) {
        const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(wt.w[c], bcast4(xb + 4 * c)),
                                             _mm256_maddubs_epi16(wt.w[c + 1], bcast4(xb + 4 * c + 4)));
        s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, ones));
      }
      return s32;
    }
    __m256i half[2];
    for (int h = 0; h < 2; ++h) {
      __m256i s16 = _mm256_maddubs_epi16(wt.w[4 * h], bcast4(xb + 16 * h));
      for (int k = 1; k < 4; ++k) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(wt.w[4 * h + k], bcast4(xb + 16 * h + 4 * k)));
      half[h] = _mm256_madd_epi16(s16, ones);
    }
#endif
    return _mm256_add_epi32(_mm256_mullo_epi32(half[0], wt.s_lo), _mm256_mullo_epi32(half[1], wt.s_hi));
  }
  static __m256i min_dot(const Weights& wt, int32_t isum, int32_t isum_lo) {
    const uint32_t halves = static_cast<uint16_t>(isum_lo) | static_cast<uint32_t>(static_cast<uint16_t>(isum - isum_lo)) << 16;
    return _mm256_madd_epi16(wt.mins, _mm256_set1_epi32(static_cast<int>(halves)));
  }
};

// The outliers' terms inside the tiles (calls of up to kFoldRows rows of the formats with kFolds;
// kernel_adds_outliers): per row, where its set-aside columns sit in a group-block (column_location)
// and their values, found once a call. After a group's last block each row's terms are added to its
// accumulator in order, each column dequantized from the group-block by F::column, the arithmetic
// of the pass after the kernel (add_outliers_avx2) on the same values: the same bits.
struct Fold {
  struct Term {
    size_t blk_off, word_off;
    __m128i shift;
    float x;
  };
  Term t[kFoldRows][QuantizedRows::kOutliers];
};
inline void make_fold(const PackedMatrix& m, const QuantizedRows& x, Fold& f) {
  for (int64_t i = 0; i < x.n; ++i)
    for (int k = 0; k < QuantizedRows::kOutliers; ++k) {
      const size_t o = static_cast<size_t>(i * QuantizedRows::kOutliers + k);
      const ColumnLocation at = column_location(m, x.outlier_col[o]);
      f.t[i][k] = {at.blk_off, at.word_off, _mm_cvtsi32_si128(at.shift), x.outlier_x[o]};
    }
}
// acc plus row i's terms for the group at gp, when there is a fold.
template <class F>
inline __m256 fold_terms(const Fold* f, const uint8_t* gp, int64_t i, __m256 acc) {
  if constexpr (requires { F::kFolds; }) {
    if constexpr (F::kFolds)
      if (f != nullptr)
        for (const Fold::Term& t : f->t[i]) {
          const uint8_t* blk = gp + t.blk_off;
          const __m256i word = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + t.word_off));
          acc = _mm256_fmadd_ps(F::column(blk, word, t.shift), _mm256_set1_ps(t.x), acc);
        }
  }
  return acc;
}

// One group (8 weight rows) against activation rows [i0, i0 + N): per block the weights are
// loaded once, then per row acc = fma(float(isum), dw * dx, acc) [+ fma(mw, sx, acc)], the
// arithmetic qmatmul.h fixes for every kernel.
template <class F, int N>
inline void tile(const PackedMatrix& m, const QuantizedRows& x, int64_t i0, const uint8_t* gp, float* y, int64_t ldy,
                 int64_t valid, const Fold* fold = nullptr) {
  __m256 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  const int64_t nb = m.blocks, cols = m.cols;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = gp + static_cast<size_t>(b) * m.block_bytes;
    F::prefetch_block(blk);
    const __m256 dw = F::scale(blk);
    typename F::Weights wt;
    constexpr bool kQ2K = requires { F::kSubMins; };
    if constexpr (kQ2K) F::template load<N>(blk, wt);
    else F::load(blk, wt);
    for (int i = 0; i < N; ++i) {
      const size_t xi = static_cast<size_t>((i0 + i) * nb + b);
      const int8_t* xb = x.q.data() + (i0 + i) * cols + b * 32;
      __m256i s32;
      if constexpr (kQ2K) s32 = F::template dot<N>(wt, xb);
      else s32 = F::dot(wt, xb, x.isum[xi], x.isum_lo[xi]);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(dw, _mm256_set1_ps(x.d[xi])), acc[i]);
      if constexpr (F::kHasMin) acc[i] = _mm256_fmadd_ps(F::min(blk), _mm256_set1_ps(x.sx[xi]), acc[i]);
      if constexpr (kQ2K)  // Q2_K's mins: fma(float(min_dot), fl(-dmin * dx), acc)
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(F::min_dot(wt, x.isum[xi], x.isum_lo[xi])),
                                 _mm256_mul_ps(F::min(blk), _mm256_set1_ps(x.d[xi])), acc[i]);
    }
  }
  for (int i = 0; i < N; ++i) store_rows(y + (i0 + i) * ldy, fold_terms<F>(fold, gp, i0 + i, acc[i]), valid);
}

// An empty asm that claims to change v: GCC cannot move additions across it. Without it GCC
// reassociates a row's chain of additions into a tree over all of a block's products and
// spills them (32 live vectors for 4 rows); with it each row's sum stays one register.
inline void in_register(__m256i& v) { asm("" : "+x"(v)); }

// Where a tile's activations come from, per row i, block b and 4-column group c (a vector with
// those 4 bytes in every lane) and the block's d and sx (in every lane).
// Narrow: broadcasts from QuantizedRows::q, d, sx (one vector-pipe operation each on Zen 3).
struct NarrowRows {
  const QuantizedRows& x;
  int64_t i0;
  __m256i q(int i, int64_t b, int c) const { return bcast4(x.q.data() + (i0 + i) * x.cols + b * 32 + 4 * c); }
  __m256 d(int i, int64_t b) const { return _mm256_set1_ps(x.d[static_cast<size_t>((i0 + i) * x.blocks + b)]); }
  __m256 sx(int i, int64_t b) const { return _mm256_set1_ps(x.sx[static_cast<size_t>((i0 + i) * x.blocks + b)]); }
  NarrowRows from(int64_t i) const { return {x, i0 + i}; }  // the rows from this one's row i on
};
// Wide: plain loads from this thread's wide rows (wide_rows_avx2), which the multiplies take as
// memory operands.
struct WideRows {
  const QuantizedRows& x;
  const uint8_t* wide;  // the call's row 0, block 0
  int64_t i0;
  const uint8_t* at(int i, int64_t b) const { return wide + static_cast<size_t>((i0 + i) * x.blocks + b) * QuantizedRows::kWideBlock; }
  __m256i q(int i, int64_t b, int c) const { return _mm256_load_si256(reinterpret_cast<const __m256i*>(at(i, b)) + c); }
  __m256 d(int i, int64_t b) const { return _mm256_load_ps(reinterpret_cast<const float*>(at(i, b) + 256)); }
  __m256 sx(int i, int64_t b) const { return _mm256_load_ps(reinterpret_cast<const float*>(at(i, b) + 288)); }
  WideRows from(int64_t i) const { return {x, wide, i0 + i}; }
};

// The maddubs variant's tile for the nibble formats and Q8_0, streaming: per block, each weight
// vector is unpacked (or loaded) and used by every row of the tile before the next one, so only
// the tile's accumulators live across it (int16 or int32 per row, plus the f32 acc). The tile
// above holds all eight unpacked vectors and, with 4 rows, spilled its accumulators to the stack
// (16 ymm registers); this order does the same integer additions in another order (exact: every
// partial sum of a row's int16 chain is bounded by the same 30480) and the same float work.
template <class F, int N, class X>
inline void stream_tile(const PackedMatrix& m, const X& rows, int64_t g, float* y, int64_t ldy, const Fold* fold = nullptr) {
  __m256 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  const uint8_t* gp = m.group(g);
  for (int64_t b = 0; b < m.blocks; ++b) {
    const uint8_t* blk = gp + static_cast<size_t>(b) * m.block_bytes;
    F::prefetch_block(blk);
    __m256i s[N];
    for (int i = 0; i < N; ++i) s[i] = _mm256_setzero_si256();
    F::accumulate(blk, rows, b, s);
    const __m256 dw = F::scale(blk);
    for (int i = 0; i < N; ++i) {
      const __m256i s32 = F::finish(s[i], rows.x.isum[static_cast<size_t>((rows.i0 + i) * m.blocks + b)]);
      acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(dw, rows.d(i, b)), acc[i]);
      if constexpr (F::kHasMin) acc[i] = _mm256_fmadd_ps(F::min(blk), rows.sx(i, b), acc[i]);
    }
  }
  const int64_t valid = m.rows - g * 8 < 8 ? m.rows - g * 8 : 8;
  for (int i = 0; i < N; ++i) store_rows(y + g * 8 + (rows.i0 + i) * ldy, fold_terms<F>(fold, gp, rows.i0 + i, acc[i]), valid);
}

// Nibble formats (Q4_0, Q4_1, Q4_K as Q4_1; kFive: Q5_0, Q5_1, Q5_K with the fifth bits added to
// the unpacked bytes). VNNI: s[i] is row i's int32 sum, one vpdpbusd a vector (exact, so the
// order is free). maddubs: s[i] is row i's int16 sum of the block's sixteen pairs (at most
// 8 x 2 x 15 x 127 = 30480 in magnitude at every step); with five bits an int32 sum, each packed
// vector's two pairs (at most 2 x 2 x 31 x 127 = 15748) widened to it.
template <bool kMin, bool kF32 = false, bool kFive = false>
struct StreamQ4 : FormatQ4<kMin, kF32, kFive> {
  using Base = FormatQ4<kMin, kF32, kFive>;
#ifdef SPECULA_YMM_VNNI
  static constexpr bool kWide = false;  // broadcasts (wide_rows_pay)
#else
  static constexpr bool kWide = true;
#endif
  template <int N, class X>
  static void accumulate(const uint8_t* blk, const X& rows, int64_t b, __m256i (&s)[N]) {
    for (int k = 0; k < 4; ++k) {
      __m256i lo, hi;
      Base::unpack(blk, k, lo, hi);
#ifdef SPECULA_YMM_VNNI
      for (int i = 0; i < N; ++i) s[i] = _mm256_dpbusd_avx_epi32(s[i], lo, rows.q(i, b, k));
      for (int i = 0; i < N; ++i) s[i] = _mm256_dpbusd_avx_epi32(s[i], hi, rows.q(i, b, k + 4));
#else
      if constexpr (kFive) {
        const __m256i ones = _mm256_set1_epi16(1);
        for (int i = 0; i < N; ++i)
          s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, rows.q(i, b, k)),
                                                                           _mm256_maddubs_epi16(hi, rows.q(i, b, k + 4))),
                                                          ones));
      } else {
        for (int i = 0; i < N; ++i) s[i] = _mm256_add_epi16(s[i], _mm256_maddubs_epi16(lo, rows.q(i, b, k)));
        for (int i = 0; i < N; ++i) s[i] = _mm256_add_epi16(s[i], _mm256_maddubs_epi16(hi, rows.q(i, b, k + 4)));
      }
      for (int i = 0; i < N; ++i) in_register(s[i]);
#endif
    }
  }
#ifndef SPECULA_YMM_VNNI
  static constexpr bool kLanes = !kFive;  // lane_groups: the four-bit layouts (kFive's chains are int32)
#endif
  static __m256i finish(__m256i s, int32_t isum) {
#ifdef SPECULA_YMM_VNNI
    const __m256i s32 = s;
#else
    const __m256i s32 = kFive ? s : _mm256_madd_epi16(s, _mm256_set1_epi16(1));
#endif
    return kMin ? s32 : _mm256_sub_epi32(s32, _mm256_set1_epi32((kFive ? 16 : 8) * isum));
  }
};

// IQ4_NL (IQ4_XS: kF32) and Q8_0: s[i] is row i's int32 sum. VNNI: IQ4_NL's levels + 128 and
// Q8_0's quants + 128 against the activations, 128 * isum taken out in finish, as the holding
// tile's formats do; maddubs: the sign trick per vector, as FormatIQ4NL and FormatQ8.
#ifdef SPECULA_YMM_VNNI
template <bool kF32 = false>
struct StreamIQ4NL : FormatIQ4NL<kF32> {
  using Base = FormatIQ4NL<kF32>;
  static constexpr bool kWide = false;  // broadcasts (wide_rows_pay)
  template <int N, class X>
  static void accumulate(const uint8_t* blk, const X& rows, int64_t b, __m256i (&s)[N]) {
    const __m256i biased = Base::biased_table();
    for (int c = 0; c < 8; ++c) {
      const __m256i w = _mm256_shuffle_epi8(biased, Base::index(blk, c));
      for (int i = 0; i < N; ++i) s[i] = _mm256_dpbusd_avx_epi32(s[i], w, rows.q(i, b, c));
    }
  }
  static __m256i finish(__m256i s32, int32_t isum) { return _mm256_sub_epi32(s32, _mm256_set1_epi32(128 * isum)); }
};

struct StreamQ8 : FormatQ8 {
  static constexpr bool kWide = false;  // broadcasts (wide_rows_pay)
  template <int N, class X>
  static void accumulate(const uint8_t* blk, const X& rows, int64_t b, __m256i (&s)[N]) {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int c = 0; c < 8; ++c) {
      const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c)), bias);
      for (int i = 0; i < N; ++i) s[i] = _mm256_dpbusd_avx_epi32(s[i], w, rows.q(i, b, c));
    }
  }
  static __m256i finish(__m256i s32, int32_t isum) { return _mm256_sub_epi32(s32, _mm256_set1_epi32(128 * isum)); }
};
#else
// IQ4_NL (IQ4_XS: kF32): s[i] is row i's int32 sum; the levels and the sign trick per vector as
// FormatIQ4NL.
template <bool kF32 = false>
struct StreamIQ4NL : FormatIQ4NL<kF32> {
  using Base = FormatIQ4NL<kF32>;
  static constexpr bool kWide = false;
  template <int N, class X>
  static void accumulate(const uint8_t* blk, const X& rows, int64_t b, __m256i (&s)[N]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i levels = Base::table(false), magnitudes = Base::table(true);
    for (int c = 0; c < 8; ++c) {
      const __m256i idx = Base::index(blk, c);
      const __m256i w = _mm256_shuffle_epi8(levels, idx);
      const __m256i aw = _mm256_shuffle_epi8(magnitudes, idx);
      for (int i = 0; i < N; ++i)
        s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(rows.q(i, b, c), w)), ones));
      for (int i = 0; i < N; ++i) in_register(s[i]);
    }
  }
  static __m256i finish(__m256i s32, int32_t) { return s32; }
};

// Q8_0: s[i] is row i's int32 sum; the sign trick per vector as FormatQ8.
struct StreamQ8 : FormatQ8 {
  static constexpr bool kWide = false;
  template <int N, class X>
  static void accumulate(const uint8_t* blk, const X& rows, int64_t b, __m256i (&s)[N]) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int c = 0; c < 8; ++c) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * c));
      const __m256i aw = _mm256_abs_epi8(w);
      for (int i = 0; i < N; ++i)
        s[i] = _mm256_add_epi32(s[i], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(rows.q(i, b, c), w)), ones));
      for (int i = 0; i < N; ++i) in_register(s[i]);
    }
  }
  static __m256i finish(__m256i s32, int32_t) { return s32; }
};
#endif

// Groups [g0, g1): per group, the activation rows in tiles of up to kTile (with the outliers'
// terms where there is a fold).
template <class F>
void held_groups(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1, const Fold* fold) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = m.group(g);
    const int64_t valid = m.rows - g * 8 < 8 ? m.rows - g * 8 : 8;
    float* yg = y + g * 8;
    int64_t i0 = 0;
    for (; i0 + kTile <= x.n; i0 += kTile) tile<F, kTile>(m, x, i0, gp, yg, ldy, valid, fold);
    switch (x.n - i0) {
      case 1: tile<F, 1>(m, x, i0, gp, yg, ldy, valid, fold); break;
      case 2: tile<F, 2>(m, x, i0, gp, yg, ldy, valid, fold); break;
      case 3: tile<F, 3>(m, x, i0, gp, yg, ldy, valid, fold); break;
      default: break;
    }
  }
}
// The same as a PackedKernel (no fold: the pass adds the terms).
template <class F>
void kernel(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  held_groups<F>(m, x, y, ldy, g0, g1, nullptr);
}

// How many of r rows go in tiles of six, the rest in fives and one smaller tile: r % 5 where r is a
// sum of sixes and fives (6 = 6, 11 = 6 + 5, 12 = 6 + 6, 16 = 6 + 5 + 5), else none (7 = 5 + 2,
// 13 = 5 + 5 + 3). maddubs: a tile of six rows took 0.88 of the time of 5 + 1 on Zen 3; VNNI: the
// default model's forward of 6 / 11 / 16 tokens 0.93 / 0.96 / 0.98 of its time with fives on a
// Raptor Cove core (docs/kernels.md, "A streaming tile of six rows", "The AVX-VNNI tiles fold the
// outliers and take six rows").
constexpr int64_t six_row_tiles(int64_t r) { return r % 5 <= r / 5 ? r % 5 : 0; }

// The six-row tile out of line: inlined into the loop beside the others, it slowed some of them
// (the two-row Q8_0 tile took 1.11x its time).
template <class F, class X>
__attribute__((noinline)) void stream_tile6(const PackedMatrix& m, const X& rows, int64_t g, float* y, int64_t ldy, const Fold* fold) {
  stream_tile<F, 6>(m, rows, g, y, ldy, fold);
}

// Groups [g0, g1) in tiles of six (six_row_tiles), then five, then one of the rest, the call's
// rows read through `rows`.
template <class F, class X>
void stream_groups(const PackedMatrix& m, const QuantizedRows& x, const X& rows, float* y, int64_t ldy, int64_t g0, int64_t g1,
                   int64_t i_begin = 0, const Fold* fold = nullptr) {
  const int64_t sixes = six_row_tiles(x.n - i_begin);
  for (int64_t g = g0; g < g1; ++g) {
    int64_t i0 = i_begin;
    for (int64_t k = 0; k < sixes; ++k, i0 += 6) stream_tile6<F>(m, rows.from(i0), g, y, ldy, fold);
    for (; i0 + 5 <= x.n; i0 += 5) stream_tile<F, 5>(m, rows.from(i0), g, y, ldy, fold);
    switch (x.n - i0) {
      case 1: stream_tile<F, 1>(m, rows.from(i0), g, y, ldy, fold); break;
      case 2: stream_tile<F, 2>(m, rows.from(i0), g, y, ldy, fold); break;
      case 3: stream_tile<F, 3>(m, rows.from(i0), g, y, ldy, fold); break;
      case 4: stream_tile<F, 4>(m, rows.from(i0), g, y, ldy, fold); break;
      default: break;
    }
  }
}
#ifndef SPECULA_YMM_VNNI
// The lane kernel (maddubs, calls of 32 or more narrow rows: prefill, batches; docs/kernels.md,
// "The lane kernel"). The streaming tile's vector lanes are 8 weight rows, so each activation row
// costs a broadcast of its 4 bytes per weight vector and per group. Here the lanes are 8
// activation rows (lane_rows_avx2: this thread's copy of the call's rows, eight to a vector, with
// their d, sx and isum as vectors), the group's nibbles are unpacked once into bytes, and each
// broadcast of a weight row's 4 bytes serves the activation vectors of up to 4 groups of 8 rows
// (32 rows), two weight rows at a time, the activations loaded once for both. Per output element
// the integer sum is exact and the float work is the streaming tile's (the block's scales'
// product, then fma(sum, product, acc) and fma(min, sx, acc) per block in block order), so every
// row's bits are the streaming tile's and the one-row call's. Each group's results are
// transposed once at the end (lanes back to weight rows).
constexpr int64_t kLaneChunk = 16;  // blocks per pass: 4 groups of rows' 16 blocks (22.5 KB) stay in L1
constexpr int64_t kLaneMinRows = 32;  // calls from 32 rows on (fewer measured no faster)

// One 4-column step c of a block: weight rows o0 and o0 + 1 (their 4 bytes broadcast, from w and
// w + 4) against the R activation vectors at x[r] (8 rows each): s0[r] += maddubs(w0, x[r]) and
// s1[r] += maddubs(w1, x[r]), each sum at most 8 x 2 x 15 x 127 = 30480 as the streaming tile's.
// In assembly because GCC, given these as intrinsics, spilled the eight int16 sums to the stack
// around the `in_register` barriers or, without them, reassociated the chains into trees (9.4 to
// 23 cycles per 256 products on a Zen 3 against 8.2-8.5 so).
#define SPECULA_LANE_ROW(X, S0, S1)                                   \
  "vmovdqa " X ", %[t]\n\t"                                           \
  "vpmaddubsw %[t], %[v0], %[m]\n\t"                                  \
  "vpaddw %[m], " S0 ", " S0 "\n\t"                                   \
  "vpmaddubsw %[t], %[v1], %[m]\n\t"                                  \
  "vpaddw %[m], " S1 ", " S1 "\n\t"
template <int R>
inline void lane_step(const uint8_t* w, const uint8_t* const (&x)[R], __m256i (&s0)[R], __m256i (&s1)[R]) {
  __m256i v0, v1, t, m;
  using V = __m256i;
  using W = int32_t;
  if constexpr (R == 4) {
    __asm__("vpbroadcastd %[w0], %[v0]\n\t"
            "vpbroadcastd %[w1], %[v1]\n\t"
            SPECULA_LANE_ROW("%[x0]", "%[a0]", "%[b0]") SPECULA_LANE_ROW("%[x1]", "%[a1]", "%[b1]")
            SPECULA_LANE_ROW("%[x2]", "%[a2]", "%[b2]") SPECULA_LANE_ROW("%[x3]", "%[a3]", "%[b3]")
            : [a0] "+x"(s0[0]), [a1] "+x"(s0[1]), [a2] "+x"(s0[2]), [a3] "+x"(s0[3]), [b0] "+x"(s1[0]), [b1] "+x"(s1[1]),
              [b2] "+x"(s1[2]), [b3] "+x"(s1[3]), [v0] "=&x"(v0), [v1] "=&x"(v1), [t] "=&x"(t), [m] "=&x"(m)
            : [w0] "m"(*reinterpret_cast<const W*>(w)), [w1] "m"(*reinterpret_cast<const W*>(w + 4)),
              [x0] "m"(*reinterpret_cast<const V*>(x[0])), [x1] "m"(*reinterpret_cast<const V*>(x[1])),
              [x2] "m"(*reinterpret_cast<const V*>(x[2])), [x3] "m"(*reinterpret_cast<const V*>(x[3])));
  } else {
    static_assert(R == 2);
    __asm__("vpbroadcastd %[w0], %[v0]\n\t"
            "vpbroadcastd %[w1], %[v1]\n\t"
            SPECULA_LANE_ROW("%[x0]", "%[a0]", "%[b0]") SPECULA_LANE_ROW("%[x1]", "%[a1]", "%[b1]")
            : [a0] "+x"(s0[0]), [a1] "+x"(s0[1]), [b0] "+x"(s1[0]), [b1] "+x"(s1[1]), [v0] "=&x"(v0), [v1] "=&x"(v1),
              [t] "=&x"(t), [m] "=&x"(m)
            : [w0] "m"(*reinterpret_cast<const W*>(w)), [w1] "m"(*reinterpret_cast<const W*>(w + 4)),
              [x0] "m"(*reinterpret_cast<const V*>(x[0])), [x1] "m"(*reinterpret_cast<const V*>(x[1])));
  }
}
#undef SPECULA_LANE_ROW

// Weight rows o0 and o0 + 1 of the group, blocks [b0, b1), against activation row groups rg0 ..
// rg0 + R - 1: acc + 64 r + 8 j holds row group rg0 + r's 8 sums for weight row o0 + j (in and
// out). wbuf: the group's unpacked bytes (block b's vector c at wbuf + 256 b + 32 c, lane o: weight
// row o's 4 bytes); dw and mn: the group's scales and mins as floats, [b][o].
template <class F, int R>
inline void lane_tile(const uint8_t* wbuf, const float* dw, const float* mn, const uint8_t* lanes, int64_t blocks, int64_t rg0,
                      int o0, int64_t b0, int64_t b1, float* acc) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* at[R];
    for (int r = 0; r < R; ++r) at[r] = lanes + static_cast<size_t>((rg0 + r) * blocks + b) * kLaneBlock;
    const uint8_t* wb = wbuf + 256 * b + 4 * o0;
    __m256i s0[R], s1[R];
    for (int r = 0; r < R; ++r) s0[r] = s1[r] = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
      const uint8_t* xc[R];
      for (int r = 0; r < R; ++r) xc[r] = at[r] + 32 * c;
      lane_step<R>(wb + 32 * c, xc, s0, s1);
    }
    for (int j = 0; j < 2; ++j) {
      const __m256 dwo = _mm256_broadcast_ss(dw + 8 * b + o0 + j);
      const __m256 mno = F::kHasMin ? _mm256_broadcast_ss(mn + 8 * b + o0 + j) : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r) {
        __m256i s32 = _mm256_madd_epi16(j == 0 ? s0[r] : s1[r], ones);
        if constexpr (!F::kHasMin)
          s32 = _mm256_sub_epi32(s32, _mm256_slli_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(at[r] + 320)), 3));
        float* ar = acc + 64 * r + 8 * j;
        __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(dwo, _mm256_load_ps(reinterpret_cast<const float*>(at[r] + 256))),
                                   _mm256_load_ps(ar));
        if constexpr (F::kHasMin) a = _mm256_fmadd_ps(mno, _mm256_load_ps(reinterpret_cast<const float*>(at[r] + 288)), a);
        _mm256_store_ps(ar, a);
      }
    }
  }
}

// An 8 x 8 transpose of 32-bit elements: lane j of v[i] goes to lane i of v[j] (data movement
// only: the lane kernel's sums, weight rows to lanes, and its activations' 4-byte words).
inline void transpose8(__m256 (&v)[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(v[0], v[1]), t1 = _mm256_unpackhi_ps(v[0], v[1]);
  const __m256 t2 = _mm256_unpacklo_ps(v[2], v[3]), t3 = _mm256_unpackhi_ps(v[2], v[3]);
  const __m256 t4 = _mm256_unpacklo_ps(v[4], v[5]), t5 = _mm256_unpackhi_ps(v[4], v[5]);
  const __m256 t6 = _mm256_unpacklo_ps(v[6], v[7]), t7 = _mm256_unpackhi_ps(v[6], v[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  v[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  v[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  v[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  v[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  v[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  v[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  v[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  v[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// Weight rows 0..7 of a group, two at a time, against row groups rg0 .. rg0 + R - 1.
template <class F, int R>
inline void lane_pass(const uint8_t* wbuf, const float* dw, const float* mn, const uint8_t* lanes, int64_t blocks, int64_t rg0,
                      int64_t b0, int64_t b1, float* acc) {
  for (int o = 0; o < 8; o += 2) lane_tile<F, R>(wbuf, dw, mn, lanes, blocks, rg0, o, b0, b1, acc + 64 * rg0 + 8 * o);
}

// Groups [g0, g1): the call's first lane_row_groups(x.n) * 8 rows by the lane kernel, in passes of
// 4 groups of rows and a last one of 2, the rest by the streaming tile.
template <class F>
void lane_groups(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  const int64_t rgs = lane_row_groups(x.n), blocks = m.blocks;
  const uint8_t* lanes = lane_rows_avx2(x);
  const LaneScratch scratch = lane_scratch_avx2(blocks, rgs);
  uint8_t* const wbuf = scratch.bytes;
  float *const dw = scratch.scales, *const mn = scratch.mins, *const acc = scratch.sums;
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = m.group(g);
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = gp + static_cast<size_t>(b) * m.block_bytes;
      F::prefetch_block(blk);
      __m256i* wv = reinterpret_cast<__m256i*>(wbuf + 256 * b);
      for (int k = 0; k < 4; ++k) F::unpack(blk, k, wv[k], wv[k + 4]);
      _mm256_store_ps(dw + 8 * b, F::scale(blk));
      if constexpr (F::kHasMin) _mm256_store_ps(mn + 8 * b, F::min(blk));
    }
    std::memset(acc, 0, static_cast<size_t>(rgs) * 64 * sizeof(float));
    for (int64_t b0 = 0; b0 < blocks; b0 += kLaneChunk) {
      const int64_t b1 = b0 + kLaneChunk < blocks ? b0 + kLaneChunk : blocks;
      int64_t rg = 0;
      for (; rg + 4 <= rgs; rg += 4) lane_pass<F, 4>(wbuf, dw, mn, lanes, blocks, rg, b0, b1, acc);
      if (rg < rgs) lane_pass<F, 2>(wbuf, dw, mn, lanes, blocks, rg, b0, b1, acc);
    }
    const int64_t valid = m.rows - g * 8 < 8 ? m.rows - g * 8 : 8;
    for (int64_t rg = 0; rg < rgs; ++rg) {
      __m256 v[8];
      for (int o = 0; o < 8; ++o) v[o] = _mm256_load_ps(acc + 64 * rg + 8 * o);
      transpose8(v);
      for (int r = 0; r < 8; ++r) store_rows(y + g * 8 + (rg * 8 + r) * ldy, v[r], valid);
    }
  }
  if (rgs * 8 < x.n) stream_groups<F>(m, x, NarrowRows{x, 0}, y, ldy, g0, g1, rgs * 8);
}
template <class F>
constexpr bool lanes_of_rows() {
  if constexpr (requires { F::kLanes; }) return F::kLanes;
  else return false;
}
#endif

// Calls of up to kHoldRows rows run the holding tile above (measured faster there: its eight
// vectors are loaded once and nothing else competes for registers). maddubs: one row. VNNI: up to
// 4 rows (one pass of its 4-row tile; the stream took 1.04-1.4x its time there); from 5 rows the
// streaming tile's 5-row passes take 0.88-0.98x the time of 4 + 1 (the five-bit formats
// 0.70-0.81x; docs/kernels.md, "AVX-VNNI reads every layout"). The maddubs nibble formats take
// wide activations when the call's fit the L1 beside the weights (wide_rows_pay); its Q8_0 and
// IQ4_NL sign trick needs the activations in a register anyway, and measured no faster wide.
#ifdef SPECULA_YMM_VNNI
constexpr int64_t kHoldRows = 4;
#else
constexpr int64_t kHoldRows = 1;
#endif
template <class F>
void stream_kernel(const PackedMatrix& m, const QuantizedRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  // Calls of up to kFoldRows rows of the formats that fold (Q4_0, Q4_1, Q4_K, Q8_0) add the
  // outliers' terms in their tiles (Fold; kernel_adds_outliers says so to qmatmul), both variants.
  Fold terms;
  const Fold* fold = nullptr;
  if constexpr (requires { F::kFolds; })
    if (F::kFolds && x.n <= kFoldRows) {
      make_fold(m, x, terms);
      fold = &terms;
    }
  if (x.n <= kHoldRows) return held_groups<F>(m, x, y, ldy, g0, g1, fold);
  if constexpr (F::kWide)
    if (x.wide_ready) return stream_groups<F>(m, x, WideRows{x, wide_rows_avx2(x), 0}, y, ldy, g0, g1, 0, fold);
#ifndef SPECULA_YMM_VNNI
  if constexpr (lanes_of_rows<F>())
    if (x.n >= kLaneMinRows) return lane_groups<F>(m, x, y, ldy, g0, g1);
#endif
  stream_groups<F>(m, x, NarrowRows{x, 0}, y, ldy, g0, g1, 0, fold);
}

}  // namespace

}  // namespace specula::host_kernels
