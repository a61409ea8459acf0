// AVX-512 BF16 attention over K and V in bf16 pairs (KvCacheConfig::bf16; this file alone is built
// with -mavx512bf16, and attention() calls it only where the CPU has AVX-512 BF16).
//
// The layout is the transposed K's with one more step: a 32-bit word of K holds a position's
// dimensions 2i and 2i + 1, and a word of V a dimension's positions 2i and 2i + 1, so one
// vdpbf16ps (two products and two adds a lane) does the work of two FMAs of the fp16 kernel
// (kt_queries in attention_avx512.cpp), whose loops this one follows:
// - Scores: 16 positions of a block are one accumulator; per dimension pair one 64-byte load of K
//   and, per query, one vdpbf16ps against the query's pair (q rounded to bf16) broadcast. A pass
//   holds up to kGroup queries x kBlocks blocks; each query's score is one chain over the pairs in
//   order, whatever the pass holds.
// - Weights: exp(s - m) in f32 (exp_scores_avx512, so m and l are the fp16 kernel's arithmetic),
//   then rounded to bf16 in pairs of positions (an odd length's last pair with a zero second).
// - V: per position pair and 16-value slice one 64-byte load, per query one vdpbf16ps against its
//   weight pair broadcast; each output one chain over the pairs in order: the common pairs of the
//   pass's queries together, then each longer query's own, then an odd length's half pair with
//   the second position's value masked to zero (it may be a position not yet written).
// So a query's m, l and o do not depend on the other queries (the row property), and
// chunk_portable_bf16 (attention.cpp) computes the same scores and sums with dpbf16_pair.
//
// No standard-library function templates here (see matmul_blocks.h).
#include <immintrin.h>

#include <cassert>
#include <cstdint>
#include <cstring>
#include <span>

#include "gpu/host/attention.h"
#include "gpu/host/attention_next.h"
#include "gpu/host/attention_pieces.h"
#include "gpu/host/hmatmul.h"

#define SPECULA_ATTENTION_UNROLL _Pragma("GCC unroll 16")

namespace specula::host_kernels {

namespace {

constexpr int kGroup = 6;    // queries a score pass (6 x 4 accumulators)
constexpr int kBlocks = 4;   // blocks of 16 positions a score pass
constexpr int kVPiece = 16;  // queries a V pass (one 16-value slice at a time)
constexpr int kV4Piece = 6;  // queries a V pass four slices at a time (6 x 4 accumulators)
constexpr int64_t kPairs = kChunkTokens / 2;

inline __m512bh as_bh(__m512i v) { return reinterpret_cast<__m512bh>(v); }

// S[g * kChunkTokens + 16 (t0 + b) + lane] = scale * q_g . k at the chunk's position
// 16 (t0 + b) + lane, for G queries (qp[i * G + g] = query g's bf16 pair i) and B blocks (kb[b] at
// pair 0 of block t0 + b; a block's pair rows are 2 bt elements apart).
template <int G, int B>
inline void scores(const uint16_t* const* kb, int64_t bt, int64_t hd, const uint32_t* qp, float* S, int64_t t0, float scale,
                   const uint16_t* const* prefetch_kb) {
  __m512 acc[G][B];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) acc[g][b] = _mm512_setzero_ps();
  const uint16_t* kp[B];
  SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) kp[b] = kb[b];
  const int64_t step = 2 * bt;
  for (int64_t i = 0; i < hd / 2; ++i, qp += G) {
    if (prefetch_kb)
      SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b)
        if (prefetch_kb[b]) _mm_prefetch(reinterpret_cast<const char*>(prefetch_kb[b] + i * step), _MM_HINT_T0);
    __m512i kv[B];
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) {
      kv[b] = _mm512_loadu_si512(kp[b]);
      kp[b] += step;
    }
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
      const __m512bh qv = as_bh(_mm512_set1_epi32(static_cast<int>(qp[g])));
      SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) acc[g][b] = _mm512_dpbf16_ps(acc[g][b], as_bh(kv[b]), qv);
    }
  }
  const __m512 sv = _mm512_set1_ps(scale);
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b)
      _mm512_storeu_ps(S + g * kChunkTokens + 16 * (t0 + b), _mm512_mul_ps(acc[g][b], sv));
}

// The scores of G queries over the chunk's nblk blocks, kBlocks at a time; with `prefetch` (the
// first group) it asks for the next blocks' K and for the V pairs of these ones, up to n positions.
template <int G>
void score_group(const uint16_t* const* kb, int64_t nblk, int64_t bt, int64_t hd, const uint32_t* qp, float* S, float scale,
                 bool prefetch, const uint16_t* v, const int64_t* off, int64_t n, NextLines& next_chunk) {
  for (int64_t t = 0; t < nblk; t += kBlocks) {
    next_chunk.step();
    const uint16_t* next[kBlocks] = {};
    if (prefetch) {
      for (int b = 0; b < kBlocks && t + kBlocks + b < nblk; ++b) next[b] = kb[t + kBlocks + b];
      const int64_t j1 = (t + kBlocks) * 16 < n ? (t + kBlocks) * 16 : n;
      for (int64_t j = t * 16; j < j1; j += 2)
        for (int64_t byte = 0; byte < hd * 4; byte += 64)
          _mm_prefetch(reinterpret_cast<const char*>(v + off[j]) + byte, _MM_HINT_T1);
    }
    const uint16_t* const* pf = prefetch ? next : nullptr;
    with_size<1, kBlocks>(nblk - t, [&]<int B>() { scores<G, B>(kb + t, bt, hd, qp, S, t, scale, pf); });
  }
}

// o_g[d0, d0 + 16 DS) = (first ? 0 : o_g[...]) + the pairs [i0, i1) in order of
// W[g * kPairs + i] . v's pair i at [d0, d0 + 16 DS), for G queries; `half`: the pairs' second
// positions are masked to zero (an odd length's last pair).
template <int DS, int G>
inline void v_slice(const uint16_t* v, const int64_t* off, int64_t i0, int64_t i1, const uint32_t* W, float* const* o,
                    int64_t d0, bool first, bool half, NextLines& next) {
  __m512 acc[G][DS];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s)
      acc[g][s] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(o[g] + d0 + 16 * s);
  const __m512i keep = _mm512_set1_epi32(half ? 0x0000FFFF : -1);
  for (int64_t i = i0; i < i1; ++i) {
    next.step();
    const uint16_t* vp = v + off[2 * i] + 2 * d0;
    __m512i vv[DS];
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) vv[s] = _mm512_and_si512(_mm512_loadu_si512(vp + 32 * s), keep);
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
      const __m512bh w = as_bh(_mm512_set1_epi32(static_cast<int>(W[g * kPairs + i])));
      SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) acc[g][s] = _mm512_dpbf16_ps(acc[g][s], as_bh(vv[s]), w);
    }
  }
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) _mm512_storeu_ps(o[g] + d0 + 16 * s, acc[g][s]);
}

// The V pass of G queries (W their weight pairs, o their outputs, n their lengths): every query
// over the full pairs of the shortest one, DS slices at a time, then each one's own remaining full
// pairs and its half pair.
template <int DS, int G>
void v_pass(const uint16_t* v, const int64_t* off, int64_t hd, const uint32_t* W, float* const* o, const int64_t* n, NextLines& next) {
  int64_t n_lo = n[0];
  for (int g = 1; g < G; ++g) n_lo = n[g] < n_lo ? n[g] : n_lo;
  for (int64_t d0 = 0; d0 < hd; d0 += 16 * DS) v_slice<DS, G>(v, off, 0, n_lo / 2, W, o, d0, true, false, next);
  for (int g = 0; g < G; ++g) {
    const int64_t full = n[g] / 2;
    if (full > n_lo / 2)
      for (int64_t d0 = 0; d0 < hd; d0 += 16)
        v_slice<1, 1>(v, off, n_lo / 2, full, W + g * kPairs, o + g, d0, false, false, next);
    if (n[g] % 2 == 1)
      for (int64_t d0 = 0; d0 < hd; d0 += 16)
        v_slice<1, 1>(v, off, full, full + 1, W + g * kPairs, o + g, d0, false, true, next);
  }
}

// vcvtne2ps2bf16 of 32 floats: 16 words, word i the pair (x[2i], x[2i + 1]) rounded to nearest
// even with denormals as zero, as f32_to_bf16_ftz rounds each (a test holds it).
inline __m512i pairs32(const float* x) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x)));
}

// Query g's q rounded to bf16, pair i at qp[i * G + g] (32 values at a time; a head size that is
// an odd multiple of 16 takes its last 16 alone).
void q_pairs(const float* q, int64_t hd, int64_t G, int64_t g, uint32_t* qp) {
  alignas(64) uint32_t w[256];
  for (int64_t d = 0; d < hd; d += 32) {
    if (hd - d >= 32)
      _mm512_store_si512(w + d / 2, pairs32(q + d));
    else
      _mm256_store_si256(reinterpret_cast<__m256i*>(w + d / 2),
                         reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_loadu_ps(q + d))));
  }
  for (int64_t i = 0; i < hd / 2; ++i) qp[i * G + g] = w[i];
}

// A query's n weights (S, f32) as bf16 pairs in W, the pair past an odd n's end zero in its second
// half. vcvtne2ps2bf16 rounds to nearest even with denormals as zero, as f32_to_bf16_ftz.
void weight_pairs(float* S, int64_t n, uint32_t* W) {
  if (n % 2 == 1) S[n] = 0.0f;
  for (int64_t j = 0; j < n; j += 32) _mm512_storeu_si512(W + j / 2, pairs32(S + j));
}

// `count` queries sharing the chunk's p0 (a multiple of 16).
void queries(const AttentionChunk& c, int64_t n_max, const float* const* q, float* const* o, float* const* m, float* const* l,
             const int64_t* n, int64_t count) {
  const int64_t bt = c.block_tokens, hd = c.head_dim, rf = c.row_stride;
  assert(hd % 16 == 0 && bt % 16 == 0 && c.p0 % 16 == 0 && n_max >= 1 && n_max <= kChunkTokens);
  assert(count <= kMaxJointQueries && hd <= 512);
  const uint16_t* k = static_cast<const uint16_t*>(c.k);
  const uint16_t* v = static_cast<const uint16_t*>(c.v);
  const int64_t nblk = (n_max + 15) / 16;
  int64_t off[kChunkTokens];
  chunk_row_offsets(c, n_max, off);  // V pair i starts at off[2 i] (p0 is even)
  alignas(64) static thread_local float S[kMaxJointQueries * kChunkTokens + 32];
  alignas(64) static thread_local uint32_t W[kMaxJointQueries * kPairs + 16];
  const uint16_t* kb[kChunkTokens / 16];
  for (int64_t t = 0; t < nblk; ++t) {
    const int64_t p = c.p0 + 16 * t;
    kb[t] = k + static_cast<int64_t>(c.blocks[p / bt]) * bt * rf + 2 * (p % bt);
  }
  // The next chunk's lines, spread over this one's steps (every score group's runs of kBlocks
  // blocks, the V pass's pairs of each slice), the rest asked for at the end.
  const bool four = hd % 64 == 0;
  const int64_t v_passes = count <= 4 ? 1 : four ? (count + kV4Piece - 1) / kV4Piece : (count + kVPiece - 1) / kVPiece;
  const int64_t steps = (count + kGroup - 1) / kGroup * ((nblk + kBlocks - 1) / kBlocks) +
                        v_passes * ((n_max + 1) / 2) * (four ? hd / 64 : hd / 16);
  NextLines next(c.next, steps);
  alignas(64) uint32_t qp[kGroup * 256];
  pieces(count, kGroup, [&](int64_t q0, int64_t size) {
    for (int64_t g = 0; g < size; ++g) q_pairs(q[q0 + g], hd, size, g, qp);
    float* Sg = S + q0 * kChunkTokens;
    with_size<1, kGroup>(size, [&]<int G>() {
      score_group<G>(kb, nblk, bt, hd, qp, Sg, c.scale, q0 == 0, v, off, n[q0], next);
    });
  });
  for (int64_t g = 0; g < count; ++g) {
    exp_scores_avx512(S + g * kChunkTokens, n[g], m[g], l[g]);
    weight_pairs(S + g * kChunkTokens, n[g], W + g * kPairs);
  }
  // V: four slices at a time where the head size allows (up to 4 queries in one pass, more in
  // pieces of up to kV4Piece), else one slice at a time (pieces of up to kVPiece).
  if (count <= 4) {
    with_size<1, 4>(count, [&]<int G>() {
      four ? v_pass<4, G>(v, off, hd, W, o, n, next) : v_pass<1, G>(v, off, hd, W, o, n, next);
    });
  } else if (four) {
    pieces(count, kV4Piece, [&](int64_t q0, int64_t size) {
      with_size<1, kV4Piece>(size, [&]<int G>() { v_pass<4, G>(v, off, hd, W + q0 * kPairs, o + q0, n + q0, next); });
    });
  } else {
    pieces(count, kVPiece, [&](int64_t q0, int64_t size) {  // 5 .. 16: the pieces are as even as possible
      with_size<5, kVPiece>(size, [&]<int G>() { v_pass<1, G>(v, off, hd, W + q0 * kPairs, o + q0, n + q0, next); });
    });
  }
  next.finish();  // whatever the steps left
}

}  // namespace

void attention_chunk_avx512bf16(const AttentionChunk& c) {
  attention_chunks_avx512bf16(std::span<const AttentionChunk>(&c, 1));
}

void attention_chunks_avx512bf16(std::span<const AttentionChunk> rows) {
  if (rows.empty()) return;
  const AttentionChunk& c0 = rows[0];
  const int64_t hd = c0.head_dim, group = c0.group;
  assert(static_cast<int64_t>(rows.size()) * group <= kMaxJointQueries);
  const float* q[kMaxJointQueries];
  float *o[kMaxJointQueries], *m[kMaxJointQueries], *l[kMaxJointQueries];
  int64_t n[kMaxJointQueries];
  int64_t count = 0, n_max = 0;
  for (const AttentionChunk& c : rows) {
    const int64_t len = c.p1 - c0.p0;
    n_max = len > n_max ? len : n_max;
    for (int64_t g = 0; g < group; ++g, ++count) {
      q[count] = c.q + g * hd;
      o[count] = c.o + g * hd;
      m[count] = c.m + g;
      l[count] = c.l + g;
      n[count] = len;
    }
  }
  queries(c0, n_max, q, o, m, l, n, count);
}

}  // namespace specula::host_kernels
