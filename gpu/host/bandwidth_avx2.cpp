// AVX2 streaming read for measure_read_bandwidth_gbs (built with -mavx2; called only after a
// run-time CPU check in bandwidth.cpp).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace specula::host_kernels {

// Sum of all 64-bit words of [p, p + bytes); bytes is a multiple of 256. Four independent
// integer accumulators (latency 1) keep the loop bound by the loads, not by the adds.
uint64_t sum_words_avx2(const std::byte* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t off = 0; off < bytes; off += 256) {
    const auto* v = reinterpret_cast<const __m256i*>(p + off);
    a0 = _mm256_add_epi64(a0, _mm256_add_epi64(_mm256_load_si256(v + 0), _mm256_load_si256(v + 1)));
    a1 = _mm256_add_epi64(a1, _mm256_add_epi64(_mm256_load_si256(v + 2), _mm256_load_si256(v + 3)));
    a2 = _mm256_add_epi64(a2, _mm256_add_epi64(_mm256_load_si256(v + 4), _mm256_load_si256(v + 5)));
    a3 = _mm256_add_epi64(a3, _mm256_add_epi64(_mm256_load_si256(v + 6), _mm256_load_si256(v + 7)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

}  // namespace specula::host_kernels
