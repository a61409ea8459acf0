// AVX-512 attention chunk (this file alone of the attention is built with -mavx512f -mavx512bw
// -mavx512vl, plus AVX2/FMA/F16C; attention() calls it only on the AVX-512 path). The AVX2 kernel
// reads and converts each K and V row once per query head of the GQA group; this one once per
// piece of up to kMaxPiece heads (the whole group for groups up to 4): positions outer, heads inner,
// the piece's q in registers. A position's dot products stay 16-lane partial sums until 16
// positions are done, then one transposing reduction gives the 16 scores of each head (no
// horizontal sum per position). V is accumulated in registers for every head of the piece.
//
// No standard-library function templates here (see matmul_blocks.h).
#include <immintrin.h>

#include <cassert>
#include <cmath>
#include <cstdint>

#include "gpu/host/attention.h"
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

// acc[j * G + g] = (first ? 0 : acc[j * G + g]) + the 16-lane partial products of head g's
// q[d0, d0 + 16 DS) and row j's k[d0, d0 + 16 DS), for the block's rows j < nb (row j at k + off[j]).
// q: head g at q + g * hd.
template <int DS, int G, class T>
inline void dot_slice(const T* k, const int64_t* off, int nb, const float* q, int64_t hd, int64_t d0, bool first,
                      __m512* acc) {
  __m512 qv[G][DS];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) qv[g][s] = _mm512_loadu_ps(q + g * hd + d0 + 16 * s);
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

// s[g * n + j] = scale * q_g . k_j for the G heads of q (head g at q + g * hd) and the n rows.
template <int G, class T>
void score_piece(const T* k, const int64_t* off, int64_t n, int64_t hd, const float* q, float scale, float* s) {
  __m512 acc[kBlock * G];  // [position in the block][head], 16 partial sums each
  const __m512 sv = _mm512_set1_ps(scale);
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int nb = n - j0 < kBlock ? static_cast<int>(n - j0) : kBlock;
    for (int64_t d0 = 0; d0 < hd;) {
      const int w = slice_zmm(d0, hd);
      if (w == 4)
        dot_slice<4, G, T>(k, off + j0, nb, q, hd, d0, d0 == 0, acc);
      else if (w == 2)
        dot_slice<2, G, T>(k, off + j0, nb, q, hd, d0, d0 == 0, acc);
      else
        dot_slice<1, G, T>(k, off + j0, nb, q, hd, d0, d0 == 0, acc);
      d0 += 16 * w;
    }
    for (int j = nb * G; j < kBlock * G; ++j) acc[j] = _mm512_setzero_ps();  // a short last block
    const __mmask16 live = static_cast<__mmask16>((1u << nb) - 1);
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
      _mm512_mask_storeu_ps(s + g * n + j0, live, _mm512_mul_ps(sum_lanes16(acc + g, G), sv));
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

// o_g[d0, d0 + 16 DS) = sum_j w_g[j] v_j[d0, d0 + 16 DS) for the G heads (w_g at w + g * n,
// o_g at o + g * hd) over the n rows (row j at v + off[j]).
template <int DS, int G, class T>
inline void accumulate_v_slice(const T* v, const int64_t* off, int64_t n, const float* w, int64_t hd, int64_t d0, float* o) {
  __m512 acc[G][DS];
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) acc[g][s] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const T* vp = v + off[j] + d0;
    __m512 vv[DS];
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) vv[s] = load16(vp + 16 * s);
    SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g) {
      const __m512 wg = _mm512_set1_ps(w[g * n + j]);
      SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) acc[g][s] = _mm512_fmadd_ps(wg, vv[s], acc[g][s]);
    }
  }
  SPECULA_ATTENTION_UNROLL for (int g = 0; g < G; ++g)
    SPECULA_ATTENTION_UNROLL for (int s = 0; s < DS; ++s) _mm512_storeu_ps(o + g * hd + d0 + 16 * s, acc[g][s]);
}

// Query heads [g0, g0 + G) of the item: one pass over K, the softmax, one pass over V.
template <int G, class T>
void piece(const AttentionChunk& c, const T* k, const T* v, const int64_t* off, int64_t g0) {
  const int64_t n = c.p1 - c.p0, hd = c.head_dim;
  float* s = c.scores + g0 * n;
  score_piece<G, T>(k, off, n, hd, c.q + g0 * hd, c.scale, s);
  for (int g = 0; g < G; ++g) exp_scores(s + g * n, n, c.m + g0 + g, c.l + g0 + g);
  float* o = c.o + g0 * hd;
  for (int64_t d0 = 0; d0 < hd;) {
    const int w = slice_zmm(d0, hd);
    if (w == 4)
      accumulate_v_slice<4, G, T>(v, off, n, s, hd, d0, o);
    else if (w == 2)
      accumulate_v_slice<2, G, T>(v, off, n, s, hd, d0, o);
    else
      accumulate_v_slice<1, G, T>(v, off, n, s, hd, d0, o);
    d0 += 16 * w;
  }
}

template <class T>
void chunk(const AttentionChunk& c) {
  const int64_t n = c.p1 - c.p0, bt = c.block_tokens;
  assert(c.head_dim % 16 == 0 && n >= 1 && n <= kChunkTokens);
  // Element offset of each of the chunk's rows in the K and V pools (the same for both), walked
  // once instead of a division per row and pass.
  int64_t off[kChunkTokens];
  for (int64_t j = 0, b = c.p0 / bt, i = c.p0 % bt; j < n; ++j) {
    off[j] = (static_cast<int64_t>(c.blocks[b]) * bt + i) * c.row_floats;
    if (++i == bt) {
      i = 0;
      ++b;
    }
  }
  const T* k = static_cast<const T*>(c.k);
  const T* v = static_cast<const T*>(c.v);
  // The group in as few pieces as kMaxPiece allows, as even as possible (5 -> 3 + 2, 8 -> 4 + 4).
  const int64_t pieces = (c.group + kMaxPiece - 1) / kMaxPiece;
  for (int64_t p = 0, g0 = 0; p < pieces; ++p) {
    const int64_t heads = c.group / pieces + (p < c.group % pieces ? 1 : 0);
    switch (heads) {
      case 1: piece<1, T>(c, k, v, off, g0); break;
      case 2: piece<2, T>(c, k, v, off, g0); break;
      case 3: piece<3, T>(c, k, v, off, g0); break;
      default: piece<4, T>(c, k, v, off, g0); break;
    }
    g0 += heads;
  }
}

}  // namespace

void attention_chunk_avx512(const AttentionChunk& c) {
  if (c.f16)
    chunk<uint16_t>(c);
  else
    chunk<float>(c);
}

}  // namespace specula::host_kernels
