// AVX2 kernels of the int8 path (this file alone of the path is built with -mavx2 -mfma -mf16c):
// the vpmaddubsw variant of the 256-bit kernels (qmatmul_ymm.h) and the activation quantizer.
#include "gpu/host/qmatmul_ymm.h"

namespace specula::host_kernels {

PackedKernel avx2_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &stream_kernel<StreamQ4<false>>;
    case DType::Q4_1: return &stream_kernel<StreamQ4<true>>;
    case DType::Q8_0: return &stream_kernel<StreamQ8>;
    case DType::Q4_K: return &stream_kernel<StreamQ4<true, true>>;
    case DType::Q6_K: return &kernel<FormatQ6K>;
    default: return nullptr;
  }
}

void broadcast_rows_avx2(QuantizedRows& x) {
  const size_t need = static_cast<size_t>(x.n * x.blocks) * QuantizedRows::kWideBlock + 32;
  if (x.wide.size() < need) x.wide.resize(need);
  x.wide_offset = (32 - reinterpret_cast<uintptr_t>(x.wide.data()) % 32) % 32;
  // Row-major blocks in q and in wide alike: block bi of the call is row bi / blocks's block bi % blocks.
  uint8_t* dst = x.wide.data() + x.wide_offset;
  for (size_t bi = 0; bi < x.d.size(); ++bi, dst += QuantizedRows::kWideBlock) {
    const int8_t* q = x.q.data() + bi * 32;
    for (int c = 0; c < 8; ++c) _mm256_store_si256(reinterpret_cast<__m256i*>(dst + 32 * c), bcast4(q + 4 * c));
    _mm256_store_ps(reinterpret_cast<float*>(dst + 256), _mm256_set1_ps(x.d[bi]));
    _mm256_store_ps(reinterpret_cast<float*>(dst + 288), _mm256_set1_ps(x.sx[bi]));
  }
  x.wide_ready = true;
}

void quantize_rows_avx2(const float* x, int64_t n, int64_t cols, int8_t* q, float* d, int32_t* isum, int32_t* isum_lo,
                        float* sx) {
  const int64_t blocks = n * (cols / 32);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 lim = _mm256_set1_ps(127.0f), nlim = _mm256_set1_ps(-127.0f);
  for (int64_t bi = 0; bi < blocks; ++bi) {
    const float* xb = x + bi * 32;
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float dv = amax / 127.0f;
    const float id = dv != 0.0f ? 1.0f / dv : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i s = _mm256_setzero_si256();
    __m256i qi[4];
    for (int k = 0; k < 4; ++k) {
      __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], vid), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      r = _mm256_min_ps(_mm256_max_ps(r, nlim), lim);
      qi[k] = _mm256_cvtps_epi32(r);
      s = _mm256_add_epi32(s, qi[k]);
    }
    // int32 x 32 -> int8 x 32 in order: packs interleave 128-bit lanes, the permute undoes it.
    const __m256i p01 = _mm256_packs_epi32(qi[0], qi[1]);
    const __m256i p23 = _mm256_packs_epi32(qi[2], qi[3]);
    __m256i p = _mm256_packs_epi16(p01, p23);
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + bi * 32), p);
    const auto hsum = [](__m256i v) {
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
      return _mm_cvtsi128_si32(s4);
    };
    const int32_t sum = hsum(s);
    isum_lo[bi] = hsum(_mm256_add_epi32(qi[0], qi[1]));
    d[bi] = dv;
    isum[bi] = sum;
    sx[bi] = dv * static_cast<float>(sum);
  }
}

}  // namespace specula::host_kernels
