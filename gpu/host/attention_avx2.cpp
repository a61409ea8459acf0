// AVX2+FMA attention chunk (this file alone of the attention is built with -mavx2 -mfma -mf16c):
// scores four positions at a time (each K row read once for them, one 4-way horizontal reduction),
// a vectorised exp, and V accumulated in registers 64 values of the head at a time.
#include <immintrin.h>

#include "gpu/host/attention.h"

namespace specula::host_kernels {

namespace {

// No standard-library function templates here (see matmul_blocks.h).

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// [sum(a0), sum(a1), sum(a2), sum(a3)]
inline __m128 hsum4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Cephes-style expf: n = round(x log2 e), r = x - n ln 2 (two-part ln 2), exp(r) by a degree-5
// polynomial, times 2^n from the exponent bits. Inputs below -87 give 0.
inline __m256 exp256(__m256 x) {
  const __m256 too_small = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(too_small, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

struct Rows {
  const float* base;
  const int32_t* blocks;
  int64_t bt, rf;
  const float* at(int64_t p) const { return base + (static_cast<int64_t>(blocks[p / bt]) * bt + p % bt) * rf; }
};

// acc[0..NV) += sum over positions of w[p] * v_p[d0 .. d0 + 8 NV), then stored to out.
template <int NV>
inline void accumulate_v(const Rows& v, int64_t p0, int64_t p1, const float* w, int64_t d0, float* out) {
  __m256 acc[NV];
  for (int k = 0; k < NV; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t p = p0; p < p1; ++p) {
    const __m256 wp = _mm256_set1_ps(w[p - p0]);
    const float* vp = v.at(p) + d0;
    for (int k = 0; k < NV; ++k) acc[k] = _mm256_fmadd_ps(wp, _mm256_loadu_ps(vp + 8 * k), acc[k]);
  }
  for (int k = 0; k < NV; ++k) _mm256_storeu_ps(out + d0 + 8 * k, acc[k]);
}

}  // namespace

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

void attention_chunk_avx2(const AttentionChunk& c) {
  const Rows k{c.k, c.blocks, c.block_tokens, c.row_floats}, v{c.v, c.blocks, c.block_tokens, c.row_floats};
  const int64_t n = c.p1 - c.p0, hd = c.head_dim;
  const __m128 scale4 = _mm_set1_ps(c.scale);
  for (int64_t g = 0; g < c.group; ++g) {
    const float* q = c.q + g * hd;
    float* s = c.scores + g * n;
    int64_t p = c.p0;
    for (; p + 4 <= c.p1; p += 4) {
      const float *k0 = k.at(p), *k1 = k.at(p + 1), *k2 = k.at(p + 2), *k3 = k.at(p + 3);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t d = 0; d < hd; d += 8) {
        const __m256 qd = _mm256_loadu_ps(q + d);
        a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k1 + d), a1);
        a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k2 + d), a2);
        a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k3 + d), a3);
      }
      _mm_storeu_ps(s + (p - c.p0), _mm_mul_ps(hsum4(a0, a1, a2, a3), scale4));
    }
    for (; p < c.p1; ++p) {
      const float* kp = k.at(p);
      __m256 a = _mm256_setzero_ps();
      for (int64_t d = 0; d < hd; d += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kp + d), a);
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
    for (; d0 + 64 <= hd; d0 += 64) accumulate_v<8>(v, c.p0, c.p1, s, d0, o);
    switch ((hd - d0) / 8) {
      case 1: accumulate_v<1>(v, c.p0, c.p1, s, d0, o); break;
      case 2: accumulate_v<2>(v, c.p0, c.p1, s, d0, o); break;
      case 3: accumulate_v<3>(v, c.p0, c.p1, s, d0, o); break;
      case 4: accumulate_v<4>(v, c.p0, c.p1, s, d0, o); break;
      case 5: accumulate_v<5>(v, c.p0, c.p1, s, d0, o); break;
      case 6: accumulate_v<6>(v, c.p0, c.p1, s, d0, o); break;
      case 7: accumulate_v<7>(v, c.p0, c.p1, s, d0, o); break;
      default: break;
    }
  }
}

}  // namespace specula::host_kernels
