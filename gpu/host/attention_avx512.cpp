// AVX-512 attention chunk (this file alone of the attention is built with -mavx512f -mavx512bw
// -mavx512vl, plus AVX2/FMA/F16C; attention() calls it only on the AVX-512 path). The AVX2 kernel
// reads and converts each K and V row once per query head of the GQA group; this one once per
// piece of up to kMaxPiece query heads: positions outer, queries inner, the piece's q in
// registers. The queries of a piece are one row's group heads or, for a verify round's rows
// (attention_chunks_avx512), heads of several rows: each query's arithmetic depends on its own q
// and length only, so which piece it runs in never changes its bits. A position's dot products
// stay 16-lane partial sums until 16 positions are done, then one transposing reduction gives the
// 16 scores of each query (no horizontal sum per position). V is accumulated in registers for
// every query of the piece. The first piece over a chunk prefetches its K and V rows into L2.
// That is the kernel over a row K (an f32 cache, or fp16 rows); over a transposed fp16 K
// (KvCacheConfig::k_transposed, the host's default on this path) kt_queries below needs no
// reduction at all.
//
// No standard-library function templates here (see matmul_blocks.h).
#include <immintrin.h>

#include <cassert>
#include <cmath>
#include <cstdint>
#include <span>

#include "gpu/host/attention.h"
#include "gpu/host/attention_next.h"
#include "gpu/host/attention_pieces.h"
#include "gpu/host/simd_math.h"

#define SPECULA_ATTENTION_UNROLL _Pragma("GCC unroll 16")

namespace specula::host_kernels {

namespace {

// Query heads per pass over K and V. At 4 heads and a 64-value slice, the score pass holds
// 16 zmm of q, 4 of K and the accumulators; the V pass 16 of output, 4 of V and the weights.
constexpr int kMaxPiece = 4;
// Positions per score reduction: one per lane.
constexpr int kBlock = 16;

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// Head dims are walked in slices of 4, 2 or 1 zmm (64, 32, 16 values): as wide as the registers
// allow, and any multiple of 16 splits into them.
inline int slice_zmm(int64_t d0, int64_t hd) {
  const int64_t left = (hd - d0) / 16;
  return left >= 4 ? 4 : left >= 2 ? 2 : 1;
}

// r[j] = the sum of the 16 lanes of a[j * stride], j < 16: a transposing tree (15 adds, 30 shuffles
// for 16 positions, where a horizontal sum per position costs about 8 operations each).
inline __m512 sum_lanes16(const __m512* a, int stride) {
  __m512 t[8];  // t[i], each 128-bit lane: [x, y, x, y] partials of positions 2i (x) and 2i + 1 (y)
  SPECULA_ATTENTION_UNROLL for (int i = 0; i < 8; ++i) {
    const __m512 x = a[2 * i * stride], y = a[(2 * i + 1) * stride];
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
  }
  __m512 u[4];  // u[i], each 128-bit lane: a partial of positions 4i .. 4i + 3
  SPECULA_ATTENTION_UNROLL for (int i = 0; i < 4; ++i) {
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  __m512 w[2];  // w[i]: 128-bit lanes [u(2i) half, u(2i) half, u(2i + 1) half, u(2i + 1) half]
  SPECULA_ATTENTION_UNROLL for (int i = 0; i < 2; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// One query head of a chunk: its q (head_dim floats), its positions [p0, p0 + n), its outputs and
// its n floats of score scratch. The queries of a pass may belong to different rows of one
// sequence (attention_chunks_avx512); each one's arithmetic depends on its own q and n alone.
struct Query {
  const float* q;
  int64_t n;
  float *m, *l, *o, *s;
};

// acc[j * G + g] = (first ? 0 : acc[j * G + g]) + the 16-lane partial products of query g's
// q[d0, d0 + 16 DS) and row j's k[d0, d0 + 16 DS), for the block's rows j < nb (row j at k + off[j]).
template <int DS, int G, class T>
inline void dot_slice(const T* k, const int64_t* off, int nb, const Query* qs, int64_t d0, bool first, __m512* acc) {
  __m512 qv[G][DS];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) qv[g][s] = _mm512_loadu_ps(qs[g].q + d0 + 16 * s);
  for (int j = 0; j < nb; ++j) {
    const T* kp = k + off[j] + d0;
    __m512 kv[DS];
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) kv[s] = load16(kp + 16 * s);
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
      __m512 a = first ? _mm512_setzero_ps() : acc[j * G + g];
      SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) a = _mm512_fmadd_ps(qv[g][s], kv[s], a);
      acc[j * G + g] = a;
    }
  }
}

// qs[g].s[j] = scale * q_g . k_j for the G queries and the n rows (a query with fewer positions
// gets scores past its own n too; they are never read).
template <int G, class T>
void score_piece(const T* k, const T* v, const int64_t* off, int64_t n, int64_t hd, const Query* qs, float scale,
                 bool prefetch) {
  __m512 acc[kBlock * G];  // [position in the block][query], 16 partial sums each
  const __m512 sv = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int nb = n - j0 < kBlock ? static_cast<int>(n - j0) : kBlock;
    if (prefetch) {
      // The first pass over a chunk reads its K and V from memory: ask for the K rows two blocks
      // ahead and the V rows of this block (read by the V pass) into L2.
      const int64_t jk = j0 + 2 * kBlock, nk = n - jk < kBlock ? n - jk : kBlock;
      for (int64_t j = 0; j < nk; ++j)
        for (int64_t b = 0; b < hd * static_cast<int64_t>(sizeof(T)); b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(k + off[jk + j]) + b, _MM_HINT_T1);
      for (int64_t j = 0; j < nb; ++j)
        for (int64_t b = 0; b < hd * static_cast<int64_t>(sizeof(T)); b += 64)
          _mm_prefetch(reinterpret_cast<const char*>(v + off[j0 + j]) + b, _MM_HINT_T1);
    }
    for (int64_t d0 = 0; d0 < hd;) {
      const int w = slice_zmm(d0, hd);
      if (w == 4)
        dot_slice<4, G, T>(k, off + j0, nb, qs, d0, d0 == 0, acc);
      else if (w == 2)
        dot_slice<2, G, T>(k, off + j0, nb, qs, d0, d0 == 0, acc);
      else
        dot_slice<1, G, T>(k, off + j0, nb, qs, d0, d0 == 0, acc);
      d0 += 16 * w;
    }
    for (int j = nb * G; j < kBlock * G; ++j) acc[j] = _mm512_setzero_ps();  // a short last block
    const __mmask16 live = static_cast<__mmask16>((1u << nb) - 1);
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
      _mm512_mask_storeu_ps(qs[g].s + j0, live, _mm512_mul_ps(sum_lanes16(acc + g, G), sv));
  }
}

// *m = max s, s = exp(s - m), *l = sum s, over n >= 1 scores, in a fixed order (16 lanes, the
// masked tail into the same lanes, then the lanes).
inline void exp_scores(float* s, int64_t n, float* m, float* l) {
  const int64_t full = n / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - full)) - 1);
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < full; j += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + j));
  if (tail) mv = _mm512_max_ps(mv, _mm512_mask_loadu_ps(mv, tail, s + full));
  *m = _mm512_reduce_max_ps(mv);
  const __m512 mb = _mm512_set1_ps(*m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += 16) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mb));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (tail) {
    const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + full), mb));
    _mm512_mask_storeu_ps(s + full, tail, e);
    sum = _mm512_mask_add_ps(sum, tail, sum, e);
  }
  *l = _mm512_reduce_add_ps(sum);
}

// o_g[d0, d0 + 16 DS) = (first ? 0 : o_g[...]) + sum_j w_g[j] v_j[d0, d0 + 16 DS) for the G queries
// (w_g = qs[g].s, o_g = qs[g].o) over the rows j in [j0, j1) in order (row j at v + off[j]). A
// query's sum over [0, n) is the same chain whether it runs in one call or in two that split j.
template <int DS, int G, class T>
inline void accumulate_v_slice(const T* v, const int64_t* off, int64_t j0, int64_t j1, const Query* qs, int64_t d0,
                               bool first) {
  __m512 acc[G][DS];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s)
      acc[g][s] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(qs[g].o + d0 + 16 * s);
  for (int64_t j = j0; j < j1; ++j) {
    const T* vp = v + off[j] + d0;
    __m512 vv[DS];
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) vv[s] = load16(vp + 16 * s);
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
      const __m512 wg = _mm512_set1_ps(qs[g].s[j]);
      SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) acc[g][s] = _mm512_fmadd_ps(wg, vv[s], acc[g][s]);
    }
  }
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) _mm512_storeu_ps(qs[g].o + d0 + 16 * s, acc[g][s]);
}

template <int G, class T>
void accumulate_v(const T* v, const int64_t* off, int64_t j0, int64_t j1, const Query* qs, int64_t hd, bool first) {
  for (int64_t d0 = 0; d0 < hd;) {
    const int w = slice_zmm(d0, hd);
    if (w == 4)
      accumulate_v_slice<4, G, T>(v, off, j0, j1, qs, d0, first);
    else if (w == 2)
      accumulate_v_slice<2, G, T>(v, off, j0, j1, qs, d0, first);
    else
      accumulate_v_slice<1, G, T>(v, off, j0, j1, qs, d0, first);
    d0 += 16 * w;
  }
}

// G queries: one pass over K for all of them (as far as the longest reaches), each one's softmax,
// one pass over V as far as the shortest reaches, then each longer one's remaining positions.
template <int G, class T>
void piece(const T* k, const T* v, const int64_t* off, int64_t hd, float scale, const Query* qs, bool prefetch) {
  int64_t n_hi = qs[0].n, n_lo = qs[0].n;
  for (int g = 1; g < G; ++g) n_hi = qs[g].n > n_hi ? qs[g].n : n_hi, n_lo = qs[g].n < n_lo ? qs[g].n : n_lo;
  score_piece<G, T>(k, v, off, n_hi, hd, qs, scale, prefetch);
  for (int g = 0; g < G; ++g) exp_scores(qs[g].s, qs[g].n, qs[g].m, qs[g].l);
  accumulate_v<G, T>(v, off, 0, n_lo, qs, hd, true);
  for (int g = 0; g < G; ++g)
    if (qs[g].n > n_lo) accumulate_v<1, T>(v, off, n_lo, qs[g].n, qs + g, hd, false);
}

// The queries in as few passes as kMaxPiece allows, as even as possible (5 -> 3 + 2, 8 -> 4 + 4).
template <class T>
void run_queries(const AttentionChunk& c, int64_t n_max, const Query* qs, int64_t count) {
  assert(c.head_dim % 16 == 0 && n_max >= 1 && n_max <= kChunkTokens);
  int64_t off[kChunkTokens];
  chunk_row_offsets(c, n_max, off);
  const T* k = static_cast<const T*>(c.k);
  const T* v = static_cast<const T*>(c.v);
  pieces(count, kMaxPiece, [&](int64_t q0, int64_t size) {
    with_size<1, kMaxPiece>(size, [&]<int G>() { piece<G, T>(k, v, off, c.head_dim, c.scale, qs + q0, q0 == 0); });
  });
}

// ---- Over a transposed K (KvCacheConfig::k_transposed, fp16) ------------------------------------
// One dimension of 16 consecutive positions is one vector, so a query's 16 scores are one
// accumulator: s = fma(q[d], K[d], s) for d = 0 .. head_dim - 1 in order, lanes = positions, no
// reduction. Each score is that one chain whatever the pass holds, so a query's bits do not depend
// on the other queries (the row property). A score pass holds up to kKtGroup queries and
// kKtBlocks blocks of 16 positions (24 accumulators, every K vector converted once per pass); the
// V pass takes up to kKtV4Piece queries four 16-value slices at a time (with a head size that is a
// multiple of 64; else up to kKtVPiece queries one slice at a time). The V sums are the row-K
// kernel's chains (o = fma(w_j, v_j, o) over j in order), so only the scores differ from it. The
// queries' q are copied dimension-major and their scores kept kChunkTokens apart, so that every
// operand of the inner loops is a fixed offset from one pointer.
constexpr int kKtGroup = 6;
constexpr int kKtBlocks = 4;
constexpr int kKtVPiece = 16;
// Queries a V pass takes four slices at a time (24 accumulators, 4 of V, the weight): 4-5% faster
// than kKtVPiece one slice at a time for 5-16 rows (fifty-sixth session), the same chains.
constexpr int kKtV4Piece = 6;

// S[g * kChunkTokens + 16 (t0 + b) + lane] = scale * q_g . k at the chunk's position
// 16 (t0 + b) + lane, for G queries (qt[d * G + g] = q_g[d]) and B blocks (kb[b] at dimension 0 of
// block t0 + b). Lanes past a query's length get scores that are never read.
template <int G, int B>
inline void kt_scores(const uint16_t* const* kb, int64_t bt, int64_t hd, const float* qt, float* S, int64_t t0, float scale,
                      const uint16_t* const* prefetch_kb) {
  __m512 acc[G][B];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) acc[g][b] = _mm512_setzero_ps();
  const uint16_t* kp[B];
  SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) kp[b] = kb[b];
  for (int64_t d = 0; d < hd; ++d, qt += G) {
    if (prefetch_kb && (d & 1) == 0)
      SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b)
        if (prefetch_kb[b]) _mm_prefetch(reinterpret_cast<const char*>(prefetch_kb[b] + d * bt), _MM_HINT_T0);
    __m512 kt[B];
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) {
      kt[b] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kp[b])));
      kp[b] += bt;
    }
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
      const __m512 qd = _mm512_set1_ps(qt[g]);
      SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) acc[g][b] = _mm512_fmadd_ps(qd, kt[b], acc[g][b]);
    }
  }
  const __m512 sv = _mm512_set1_ps(scale);
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b)
      _mm512_storeu_ps(S + g * kChunkTokens + 16 * (t0 + b), _mm512_mul_ps(acc[g][b], sv));
}

// The scores of G queries over the chunk's nblk blocks, kKtBlocks at a time; with `prefetch` (the
// first group) it asks for the next blocks' K and for the V rows of these ones, up to n.
template <int G>
void kt_score_group(const uint16_t* const* kb, int64_t nblk, int64_t bt, int64_t hd, const float* qt, float* S, float scale,
                    bool prefetch, const uint16_t* v, const int64_t* voff, int64_t n, NextLines& next) {
  for (int64_t t = 0; t < nblk; t += kKtBlocks) {
    next.step();
    const uint16_t* next[kKtBlocks] = {};
    if (prefetch) {
      for (int b = 0; b < kKtBlocks && t + kKtBlocks + b < nblk; ++b) next[b] = kb[t + kKtBlocks + b];
      const int64_t j1 = (t + kKtBlocks) * 16 < n ? (t + kKtBlocks) * 16 : n;
      for (int64_t j = t * 16; j < j1; ++j)
        for (int64_t byte = 0; byte < hd * 2; byte += 64)
          _mm_prefetch(reinterpret_cast<const char*>(v + voff[j]) + byte, _MM_HINT_T1);
    }
    const uint16_t* const* pf = prefetch ? next : nullptr;
    with_size<1, kKtBlocks>(nblk - t, [&]<int B>() { kt_scores<G, B>(kb + t, bt, hd, qt, S, t, scale, pf); });
  }
}

// o_g[d0, d0 + 16 DS) = (first ? 0 : o_g[...]) + sum over j in [j0, j1) in order of
// S[g * kChunkTokens + j] v_j[d0, d0 + 16 DS), for G queries (o[g] their outputs).
template <int DS, int G>
inline void kt_v_slice(const uint16_t* v, const int64_t* off, int64_t j0, int64_t j1, const float* S, float* const* o,
                       int64_t d0, bool first, NextLines& next) {
  __m512 acc[G][DS];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s)
      acc[g][s] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(o[g] + d0 + 16 * s);
  for (int64_t j = j0; j < j1; ++j) {
    next.step();
    const uint16_t* vp = v + off[j] + d0;
    __m512 vv[DS];
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) vv[s] = load16(vp + 16 * s);
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
      const __m512 w = _mm512_set1_ps(S[g * kChunkTokens + j]);
      SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) acc[g][s] = _mm512_fmadd_ps(w, vv[s], acc[g][s]);
    }
  }
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) _mm512_storeu_ps(o[g] + d0 + 16 * s, acc[g][s]);
}

// The V pass of G queries (S their scores, o their outputs, n their lengths): every query over the
// shortest one's positions, DS slices at a time, then each longer one's remaining positions.
template <int DS, int G>
void kt_v(const uint16_t* v, const int64_t* off, int64_t hd, const float* S, float* const* o, const int64_t* n, NextLines& next) {
  int64_t n_lo = n[0];
  for (int g = 1; g < G; ++g) n_lo = n[g] < n_lo ? n[g] : n_lo;
  for (int64_t d0 = 0; d0 < hd; d0 += 16 * DS) kt_v_slice<DS, G>(v, off, 0, n_lo, S, o, d0, true, next);
  for (int g = 0; g < G; ++g)
    if (n[g] > n_lo)
      for (int64_t d0 = 0; d0 < hd; d0 += 16)
        kt_v_slice<1, 1>(v, off, n_lo, n[g], S + g * kChunkTokens, o + g, d0, false, next);
}

// `count` queries sharing the chunk's p0 (a multiple of 16) over a transposed fp16 K.
void kt_queries(const AttentionChunk& c, int64_t n_max, const Query* qs, int64_t count) {
  const int64_t bt = c.block_tokens, hd = c.head_dim, rf = c.row_stride;
  assert(hd % 16 == 0 && bt % 16 == 0 && c.p0 % 16 == 0 && n_max >= 1 && n_max <= kChunkTokens);
  assert(count <= kMaxJointQueries && hd <= 512);
  const uint16_t* k = static_cast<const uint16_t*>(c.k);
  const uint16_t* v = static_cast<const uint16_t*>(c.v);
  const int64_t nblk = (n_max + 15) / 16;
  const uint16_t* kb[kChunkTokens / 16];
  int64_t off[kChunkTokens];
  for (int64_t t = 0; t < nblk; ++t) {
    const int64_t p = c.p0 + 16 * t;
    kb[t] = k + static_cast<int64_t>(c.blocks[p / bt]) * bt * rf + p % bt;
  }
  chunk_row_offsets(c, n_max, off);
  alignas(64) static thread_local float S[kMaxJointQueries * kChunkTokens];
  alignas(64) float qt[kKtGroup * 512];
  int64_t n[kMaxJointQueries];
  float* o[kMaxJointQueries];
  for (int64_t g = 0; g < count; ++g) n[g] = qs[g].n, o[g] = qs[g].o;
  // The next chunk's lines, spread over this one's steps: every score group's runs of kKtBlocks
  // blocks and the V pass's positions (each slice's).
  const bool four = hd % 64 == 0;
  const int64_t groups = (count + kKtGroup - 1) / kKtGroup;
  const int64_t v_passes = count <= 4 ? 1 : four ? (count + kKtV4Piece - 1) / kKtV4Piece : (count + kKtVPiece - 1) / kKtVPiece;
  const int64_t steps = groups * ((nblk + kKtBlocks - 1) / kKtBlocks) + v_passes * n_max * (four ? hd / 64 : hd / 16);
  NextLines next(c.next, steps);
  // Scores, in groups of up to kKtGroup queries as even as possible; the first group's pass
  // prefetches K ahead and the V rows within its first query's length.
  pieces(count, kKtGroup, [&](int64_t q0, int64_t size) {
    for (int64_t d = 0; d < hd; ++d)
      for (int64_t g = 0; g < size; ++g) qt[d * size + g] = qs[q0 + g].q[d];
    float* Sg = S + q0 * kChunkTokens;
    with_size<1, kKtGroup>(size, [&]<int G>() {
      kt_score_group<G>(kb, nblk, bt, hd, qt, Sg, c.scale, q0 == 0, v, off, n[q0], next);
    });
  });
  for (int64_t g = 0; g < count; ++g) exp_scores(S + g * kChunkTokens, n[g], qs[g].m, qs[g].l);
  // V: four slices at a time (each weight broadcast once for 64 values) where the head size
  // allows, up to 4 queries in one pass (as the row-K kernel) and more in pieces of up to
  // kKtV4Piece; else one slice at a time, in pieces of up to kKtVPiece.
  if (count <= 4) {
    with_size<1, 4>(count, [&]<int G>() {
      four ? kt_v<4, G>(v, off, hd, S, o, n, next) : kt_v<1, G>(v, off, hd, S, o, n, next);
    });
  } else if (four) {
    pieces(count, kKtV4Piece, [&](int64_t q0, int64_t size) {
      with_size<1, kKtV4Piece>(size, [&]<int G>() { kt_v<4, G>(v, off, hd, S + q0 * kChunkTokens, o + q0, n + q0, next); });
    });
  } else {
    pieces(count, kKtVPiece, [&](int64_t q0, int64_t size) {  // 5 .. 16: the pieces are as even as possible
      with_size<5, kKtVPiece>(size, [&]<int G>() { kt_v<1, G>(v, off, hd, S + q0 * kChunkTokens, o + q0, n + q0, next); });
    });
  }
  next.finish();  // whatever the steps left (a short chunk)
}

// The group's query heads of every row in `cs` (which share p0, the pools and the block table).
template <class T>
void chunks(std::span<const AttentionChunk> cs) {
  const AttentionChunk& c0 = cs[0];
  const int64_t hd = c0.head_dim, group = c0.group;
  Query qs[kMaxJointQueries];
  assert(static_cast<int64_t>(cs.size()) * group <= kMaxJointQueries);
  int64_t count = 0, n_max = 0;
  for (const AttentionChunk& c : cs) {
    const int64_t n = c.p1 - c0.p0;
    n_max = n > n_max ? n : n_max;
    for (int64_t g = 0; g < group; ++g)
      qs[count++] = {c.q + g * hd, n, c.m + g, c.l + g, c.o + g * hd, c0.scores + (&c - cs.data()) * group * kChunkTokens + g * kChunkTokens};
  }
  if (c0.k_transposed)
    kt_queries(c0, n_max, qs, count);
  else
    run_queries<T>(c0, n_max, qs, count);
}

}  // namespace

void exp_scores_avx512(float* s, int64_t n, float* m, float* l) { exp_scores(s, n, m, l); }

void attention_chunk_avx512(const AttentionChunk& c) {
  // One row: its group's heads as the queries, the scratch holding group * (p1 - p0) scores.
  const int64_t n = c.p1 - c.p0;
  Query qs[64];
  assert(c.group <= 64);
  for (int64_t g = 0; g < c.group; ++g) qs[g] = {c.q + g * c.head_dim, n, c.m + g, c.l + g, c.o + g * c.head_dim, c.scores + g * n};
  if (c.k_transposed)
    kt_queries(c, n, qs, c.group);
  else if (c.f16)
    run_queries<uint16_t>(c, n, qs, c.group);
  else
    run_queries<float>(c, n, qs, c.group);
}

void attention_chunks_avx512(std::span<const AttentionChunk> rows) {
  if (rows.empty()) return;
  if (rows[0].f16)
    chunks<uint16_t>(rows);
  else
    chunks<float>(rows);
}

}  // namespace specula::host_kernels
