// AVX2+FMA attention (this file alone of the attention is built with -mavx2 -mfma -mf16c).
//
// Over a row K (an f32 cache, or fp16 rows), `chunk` takes one query head at a time: scores four
// positions at a time (each K row read once for them, one 4-way horizontal reduction), a vectorised
// exp, and V accumulated in registers 64 values of the head at a time.
//
// Over a transposed fp16 K (KvCacheConfig::k_transposed, the host's default on this path),
// kt_queries takes the query heads of one or several rows of a round together, as the AVX-512
// kernel does (attention_avx512.cpp): one dimension of 8 consecutive positions is one vector, so a
// query's 8 scores are one accumulator, s = fma(q[d], K[d], s) for d in order, and each K vector is
// converted once per pass of up to kKtGroup queries; V is converted once per pass of up to
// kKtVPiece queries. Every query's arithmetic depends on its own q and length only (the row
// property), and its scores are the AVX-512 transposed kernel's chains.
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

// No standard-library function templates here (see matmul_blocks.h).

// [sum(a0), sum(a1), sum(a2), sum(a3)]
inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

template <class T>
struct Rows {
  const T* base;
  const int32_t* blocks;
  int64_t bt, rf;
  const T* at(int64_t p) const { return base + (static_cast<int64_t>(blocks[p / bt]) * bt + p % bt) * rf; }
};

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// acc[0..NV) += sum over positions of w[p] * v_p[d0 .. d0 + 8 NV), then stored to out.
template <int NV, class T>
inline void accumulate_v(const Rows<T>& v, int64_t p0, int64_t p1, const float* w, int64_t d0, float* out) {
  __m256 acc[NV];
  for (int k = 0; k < NV; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    const __m256 wp = _mm256_set1_ps(w[p - p0]);
    const T* vp = v.at(p) + d0;
    for (int k = 0; k < NV; ++k) acc[k] = _mm256_fmadd_ps(wp, load8(vp + 8 * k), acc[k]);
  }
  for (int k = 0; k < NV; ++k) _mm256_storeu_ps(out + d0 + 8 * k, acc[k]);
}

// exp of n floats in place; the tail through a padded vector.
void exp_inplace_avx2(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, exp256(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) t[j - i] = x[j];
    _mm256_storeu_ps(t, exp256(_mm256_loadu_ps(t)));
    for (int64_t j = i; j < n; ++j) x[j] = t[j - i];
  }
}

}  // namespace

template <class T>
static void chunk(const AttentionChunk& c) {
  const Rows<T> k{static_cast<const T*>(c.k), c.blocks, c.block_tokens, c.row_stride};
  const Rows<T> v{static_cast<const T*>(c.v), c.blocks, c.block_tokens, c.row_stride};
  const int64_t n = c.p1 - c.p0, hd = c.head_dim;
  const __m128 scale4 = _mm_set1_ps(c.scale);
  for (int64_t g = 0; g < c.group; ++g) {
    const float* q = c.q + g * hd;
    float* s = c.scores + g * n;
    int64_t p = c.p0;
    for (; p + 4 <= c.p1; p += 4) {
      const T *k0 = k.at(p), *k1 = k.at(p + 1), *k2 = k.at(p + 2), *k3 = k.at(p + 3);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t d = 0; d < hd; d += 8) {
        const __m256 qd = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qd, load8(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qd, load8(k1 + d), a1);
        a2 = _mm256_fmadd_ps(qd, load8(k2 + d), a2);
        a3 = _mm256_fmadd_ps(qd, load8(k3 + d), a3);
      }
      _mm_storeu_ps(s + (p - c.p0), _mm_mul_ps(hsum4(a0, a1, a2, a3), scale4));
    }
    for (; p < c.p1; ++p) {
      const T* kp = k.at(p);
      __m256 a = _mm256_setzero_ps();
      for (int64_t d = 0; d < hd; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), load8(kp + d), a);
      s[p - c.p0] = hsum(a) * c.scale;
    }
    // m, then s = exp(s - m) and l = sum s, in a fixed order (8 lanes, then the lanes, then the tail).
    float m = s[0];
    for (int64_t j = 1; j < n; ++j) m = s[j] > m ? s[j] : m;
    const __m256 mv = _mm256_set1_ps(m);
    __m256 lsum = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv));
      _mm256_storeu_ps(s + j, e);
      lsum = _mm256_add_ps(lsum, e);
    }
    float l = hsum(lsum);
    if (j < n) {
      for (int64_t t = j; t < n; ++t) s[t] -= m;
      exp_inplace_avx2(s + j, n - j);
      for (int64_t t = j; t < n; ++t) l += s[t];
    }
    c.m[g] = m;
    c.l[g] = l;
    float* o = c.o + g * hd;
    int64_t d0 = 0;
    for (; d0 + 64 <= hd; d0 += 64) accumulate_v<8, T>(v, c.p0, c.p1, s, d0, o);
    switch ((hd - d0) / 8) {
      case 1: accumulate_v<1, T>(v, c.p0, c.p1, s, d0, o); break;
      case 2: accumulate_v<2, T>(v, c.p0, c.p1, s, d0, o); break;
      case 3: accumulate_v<3, T>(v, c.p0, c.p1, s, d0, o); break;
      case 4: accumulate_v<4, T>(v, c.p0, c.p1, s, d0, o); break;
      case 5: accumulate_v<5, T>(v, c.p0, c.p1, s, d0, o); break;
      case 6: accumulate_v<6, T>(v, c.p0, c.p1, s, d0, o); break;
      case 7: accumulate_v<7, T>(v, c.p0, c.p1, s, d0, o); break;
      default: break;
    }
  }
}

// ---- Over a transposed K (KvCacheConfig::k_transposed, fp16) ------------------------------------
namespace {

// Queries per score pass and per V pass. A score pass over B blocks of 8 positions holds G x B
// accumulators and B converted K vectors (at most 15 of the 16 ymm: kt_blocks), its q read as
// memory operands from a buffer of broadcast values; a V pass holds G x DS accumulators, DS V
// vectors and a broadcast weight.
constexpr int kKtGroup = 6;
constexpr int kKtVPiece = 6;
// The maximum of B for G queries: 6, 4, 3, 3, 2, 2 blocks (48 .. 16 positions) for G = 1 .. 6.
constexpr int kt_blocks(int g) { return g == 1 ? 6 : g == 2 ? 4 : g <= 4 ? 3 : 2; }
// The AVX-512 kernel's limit on a head (its score pass); the q buffer below is sized by it.
constexpr int64_t kKtMaxHead = 512;

struct KtQuery {
  const float* q;
  int64_t n;
  float *m, *l, *o;
};

// S[g * kChunkTokens + 8 (t0 + b) + lane] = scale * q_g . k at the chunk's position
// 8 (t0 + b) + lane, for G queries (qb[(d G + g) 8 + lane] = q_g[d]) and B blocks of 8 positions
// (kb[b] at dimension 0 of block t0 + b). Lanes past a query's length get scores never read.
template <int G, int B>
inline void kt_scores(const uint16_t* const* kb, int64_t bt, int64_t hd, const float* qb, float* S, int64_t t0, float scale,
                      const uint16_t* const* prefetch_kb) {
  __m256 acc[G][B];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) acc[g][b] = _mm256_setzero_ps();
  const uint16_t* kp[B];
  SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) kp[b] = kb[b];
  for (int64_t d = 0; d < hd; ++d, qb += 8 * G) {
    if (prefetch_kb && (d & 1) == 0)
      SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b)
        if (prefetch_kb[b]) _mm_prefetch(reinterpret_cast<const char*>(prefetch_kb[b] + d * bt), _MM_HINT_T0);
    __m256 kt[B];
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) {
      kt[b] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kp[b])));
      kp[b] += bt;
    }
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
      const __m256 qd = _mm256_load_ps(qb + 8 * g);
      SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) acc[g][b] = _mm256_fmadd_ps(qd, kt[b], acc[g][b]);
    }
  }
  const __m256 sv = _mm256_set1_ps(scale);
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int b = 0; b < B; ++b) _mm256_storeu_ps(S + g * kChunkTokens + 8 * (t0 + b), _mm256_mul_ps(acc[g][b], sv));
}

// kt_scores over nb <= B blocks.
template <int G, int B>
inline void kt_scores_upto(int64_t nb, const uint16_t* const* kb, int64_t bt, int64_t hd, const float* qb, float* S, int64_t t0,
                           float scale, const uint16_t* const* prefetch_kb) {
  if constexpr (B > 1)
    if (nb < B) return kt_scores_upto<G, B - 1>(nb, kb, bt, hd, qb, S, t0, scale, prefetch_kb);
  kt_scores<G, B>(kb, bt, hd, qb, S, t0, scale, prefetch_kb);
}

// The scores of G queries over the chunk's nblk blocks of 8 positions, kt_blocks(G) at a time;
// with `prefetch` (the first pass) it asks for the next blocks' K, and for these blocks' V rows up
// to n into L2.
template <int G>
void kt_score_group(const uint16_t* const* kb, int64_t nblk, int64_t bt, int64_t hd, const float* qb, float* S, float scale,
                    bool prefetch, const uint16_t* v, const int64_t* voff, int64_t n, NextLines& next_chunk) {
  constexpr int B = kt_blocks(G);
  for (int64_t t = 0; t < nblk; t += B) {
    next_chunk.step();
    const uint16_t* next[B] = {};
    if (prefetch) {
      for (int b = 0; b < B && t + B + b < nblk; ++b) next[b] = kb[t + B + b];
      const int64_t j1 = (t + B) * 8 < n ? (t + B) * 8 : n;
      for (int64_t j = t * 8; j < j1; ++j)
        for (int64_t byte = 0; byte < hd * 2; byte += 64) _mm_prefetch(reinterpret_cast<const char*>(v + voff[j]) + byte, _MM_HINT_T1);
    }
    kt_scores_upto<G, B>(nblk - t, kb + t, bt, hd, qb, S, t, scale, prefetch ? next : nullptr);
  }
}

// *m = max s, s = exp(s - m), *l = sum s, over n >= 1 scores, in a fixed order (8 lanes, the tail
// in the same lanes, then the lanes).
inline void exp_scores(float* s, int64_t n, float* m, float* l) {
  const int64_t full = n / 8 * 8, rem = n - full;
  __m256 mv = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < full; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
  alignas(32) float t[8];
  for (int i = 0; i < 8; ++i) t[i] = i < rem ? s[full + i] : -INFINITY;
  mv = _mm256_max_ps(mv, _mm256_load_ps(t));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  *m = _mm_cvtss_f32(m4);
  const __m256 mb = _mm256_set1_ps(*m);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t j = 0; j < full; j += 8) {
    const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mb));
    _mm256_storeu_ps(s + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  if (rem) {
    for (int i = 0; i < 8; ++i) t[i] = i < rem ? s[full + i] - *m : 0.0f;
    _mm256_store_ps(t, exp256(_mm256_load_ps(t)));
    for (int i = 0; i < 8; ++i) t[i] = i < rem ? (s[full + i] = t[i]) : 0.0f;
    sum = _mm256_add_ps(sum, _mm256_load_ps(t));
  }
  *l = hsum(sum);
}

// o_g[d0, d0 + 8 DS) = (first ? 0 : o_g[...]) + sum over j in [j0, j1) in order of
// S[g * kChunkTokens + j] v_j[d0, d0 + 8 DS), for G queries (o[g] their outputs; row j of V at
// v + off[j]). A query's sum is the same chain whether it runs in one call or in two that split j.
template <int DS, int G>
inline void kt_v_slice(const uint16_t* v, const int64_t* off, int64_t j0, int64_t j1, const float* S, float* const* o, int64_t d0,
                       bool first, NextLines& next) {
  __m256 acc[G][DS];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) acc[g][s] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(o[g] + d0 + 8 * s);
  // The accumulators, and either all DS V vectors and one weight, or all G weights and one V
  // vector, in the 16 ymm: 3 queries x 4 vectors hold the weights (12 + 3 + 1).
  constexpr bool kHoldWeights = G * DS + DS + 1 > 16;
  static_assert(G * DS + (kHoldWeights ? G : DS) + 1 <= 16, "the accumulators and operands fit the registers");
  for (int64_t j = j0; j < j1; ++j) {
    next.step();
    const uint16_t* vp = v + off[j] + d0;
    if constexpr (kHoldWeights) {
      __m256 w[G];
      SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) w[g] = _mm256_broadcast_ss(S + g * kChunkTokens + j);
      SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) {
        const __m256 vs = load8(vp + 8 * s);
        SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) acc[g][s] = _mm256_fmadd_ps(w[g], vs, acc[g][s]);
      }
    } else {
      __m256 vv[DS];
      SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) vv[s] = load8(vp + 8 * s);
      SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
        const __m256 w = _mm256_broadcast_ss(S + g * kChunkTokens + j);
        SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) acc[g][s] = _mm256_fmadd_ps(w, vv[s], acc[g][s]);
      }
    }
  }
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) _mm256_storeu_ps(o[g] + d0 + 8 * s, acc[g][s]);
}

// The V pass of G queries (S their scores, o their outputs, n their lengths): every query over the
// shortest one's positions, DS vectors of the head at a time, then each longer one's remaining
// positions.
template <int DS, int G>
void kt_v(const uint16_t* v, const int64_t* off, int64_t hd, const float* S, float* const* o, const int64_t* n, NextLines& next) {
  int64_t n_lo = n[0];
  for (int g = 1; g < G; ++g) n_lo = n[g] < n_lo ? n[g] : n_lo;
  for (int64_t d0 = 0; d0 < hd; d0 += 8 * DS) kt_v_slice<DS, G>(v, off, 0, n_lo, S, o, d0, true, next);
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    if (n[g] > n_lo)
      for (int64_t d0 = 0; d0 < hd; d0 += 8 * DS)
        kt_v_slice<DS, 1>(v, off, n_lo, n[g], S + g * kChunkTokens, o + g, d0, false, next);
}

// `count` queries sharing the chunk's p0 (a multiple of 8) over a transposed fp16 K.
void kt_queries(const AttentionChunk& c, int64_t n_max, const KtQuery* qs, int64_t count) {
  const int64_t bt = c.block_tokens, hd = c.head_dim, rf = c.row_stride;
  assert(hd % 16 == 0 && hd <= kKtMaxHead && bt % 8 == 0 && c.p0 % 8 == 0 && n_max >= 1 && n_max <= kChunkTokens);
  assert(count <= kMaxJointQueries);
  const uint16_t* k = static_cast<const uint16_t*>(c.k);
  const uint16_t* v = static_cast<const uint16_t*>(c.v);
  const int64_t nblk = (n_max + 7) / 8;
  const uint16_t* kb[kChunkTokens / 8];
  int64_t off[kChunkTokens];
  for (int64_t t = 0; t < nblk; ++t) {
    const int64_t p = c.p0 + 8 * t;
    kb[t] = k + static_cast<int64_t>(c.blocks[p / bt]) * bt * rf + p % bt;
  }
  chunk_row_offsets(c, n_max, off);
  alignas(32) static thread_local float S[kMaxJointQueries * kChunkTokens];
  alignas(32) static thread_local float qb[kKtGroup * kKtMaxHead * 8];
  int64_t n[kMaxJointQueries];
  float* o[kMaxJointQueries];
  for (int64_t g = 0; g < count; ++g) n[g] = qs[g].n, o[g] = qs[g].o;
  // The next chunk's lines, spread over this one's steps (about: a score pass's steps take 2 to 4
  // blocks of 8), the rest asked for at the end.
  const bool wide_v = count <= 3 && hd % 32 == 0;
  const int64_t v_steps = wide_v ? n_max * (hd / 32) : (count + kKtVPiece - 1) / kKtVPiece * n_max * (hd / 16);
  const int64_t steps = (count + kKtGroup - 1) / kKtGroup * ((nblk + 1) / 2) + v_steps;
  NextLines next(c.next, steps);
  pieces(count, kKtGroup, [&](int64_t q0, int64_t size) {
    for (int64_t d = 0; d < hd; ++d)
      for (int64_t g = 0; g < size; ++g) _mm256_store_ps(qb + (d * size + g) * 8, _mm256_set1_ps(qs[q0 + g].q[d]));
    float* Sg = S + q0 * kChunkTokens;
    const bool pf = q0 == 0;
    with_size<1, kKtGroup>(size, [&]<int G>() {
      kt_score_group<G>(kb, nblk, bt, hd, qb, Sg, c.scale, pf, v, off, n[q0], next);
    });
  });
  for (int64_t g = 0; g < count; ++g) exp_scores(S + g * kChunkTokens, n[g], qs[g].m, qs[g].l);
  // V: up to three queries four vectors of the head at a time (12 accumulators: enough chains in
  // flight for two FMA pipes of latency 4), more in pieces of up to kKtVPiece two vectors at a time.
  if (wide_v) {
    with_size<1, 3>(count, [&]<int G>() { kt_v<4, G>(v, off, hd, S, o, n, next); });
  } else {
    pieces(count, kKtVPiece, [&](int64_t q0, int64_t size) {
      with_size<1, kKtVPiece>(size, [&]<int G>() { kt_v<2, G>(v, off, hd, S + q0 * kChunkTokens, o + q0, n + q0, next); });
    });
  }
  next.finish();  // whatever the steps left
}

// The group's query heads of `rows` chunks (which share p0, the pools and the block table).
void kt_rows(const AttentionChunk* rows, int64_t count_rows) {
  const AttentionChunk& c0 = rows[0];
  assert(c0.f16 && c0.k_transposed && count_rows * c0.group <= kMaxJointQueries);
  KtQuery qs[kMaxJointQueries];
  int64_t count = 0, n_max = 0;
  for (int64_t r = 0; r < count_rows; ++r) {
    const AttentionChunk& c = rows[r];
    const int64_t n = c.p1 - c0.p0;
    n_max = n > n_max ? n : n_max;
    for (int64_t g = 0; g < c0.group; ++g) qs[count++] = {c.q + g * c0.head_dim, n, c.m + g, c.l + g, c.o + g * c0.head_dim};
  }
  kt_queries(c0, n_max, qs, count);
}

}  // namespace

void attention_chunks_avx2(std::span<const AttentionChunk> rows) {
  if (!rows.empty()) kt_rows(rows.data(), static_cast<int64_t>(rows.size()));
}

void to_fp16_avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = static_cast<uint16_t>(_cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

void attention_chunk_avx2(const AttentionChunk& c) {
  if (c.k_transposed)
    kt_rows(&c, 1);
  else if (c.f16)
    chunk<uint16_t>(c);
  else
    chunk<float>(c);
}

}  // namespace specula::host_kernels
