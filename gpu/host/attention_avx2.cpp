// AVX2+FMA attention chunk (this file alone of the attention is built with -mavx2 -mfma -mf16c):
// scores four positions at a time (each K row read once for them, one 4-way horizontal reduction),
// a vectorised exp, and V accumulated in registers 64 values of the head at a time.
#include <immintrin.h>

#include "gpu/host/attention.h"
#include "gpu/host/simd_math.h"

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
  const Rows<T> k{static_cast<const T*>(c.k), c.blocks, c.block_tokens, c.row_floats};
  const Rows<T> v{static_cast<const T*>(c.v), c.blocks, c.block_tokens, c.row_floats};
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

void to_fp16_avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = static_cast<uint16_t>(_cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

void attention_chunk_avx2(const AttentionChunk& c) {
  if (c.f16)
    chunk<uint16_t>(c);
  else
    chunk<float>(c);
}

}  // namespace specula::host_kernels
