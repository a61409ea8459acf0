// Microbenchmark, not a test (DISABLED_: run with --gtest_also_run_disabled_tests
// --gtest_filter='TileParts.*'): the int8 AVX-512 tile's work taken apart on a cache-resident
// 576 x 576 matrix in Q4_1's packed layout (36 group pairs of 18 blocks, 144 bytes a group's
// block, as qmatmul_zmm.h reads it), one thread, n = 1..9 activation rows in one pass. Three
// versions of one block's work, each adding a part of the real tile (qmatmul_avx512vnni.cpp):
//   products: the n rows' eight vpdpbusd a block, each activation quad an embedded broadcast
//             ({1to16}), against fixed weight vectors;
//   + unpack: the weight vectors loaded from the block and unpacked (two 32-byte halves joined,
//             the nibbles split by and/shift) and the block's fp16 scales and mins converted;
//   + float:  each row's block scaled into its f32 accumulator as the tile does it (the int32 sum
//             converted, times fl(dw * dx), plus the min term: four operations a row and block).
// Not the tile's numbers (the weights are fixed bytes, the outliers and the quantizer are left
// out); what each part adds to a pass, so that the floor of the format's arithmetic is seen
// beside the real kernel (QmatmulBench.DISABLED_CacheResidentKernelsPerRowCount). Measured on
// Zen 5 in docs/kernels.md, "Where the tile's time goes, again".
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "gpu/host/qmatmul.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The section below is compiled for AVX-512 VNNI whatever the file's flags (GCC's target pragma),
// and only run where the CPU has it.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12 in its own intrinsics headers, as for the ISA files
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define SPECULA_TILE_PARTS 1
#endif

namespace specula {
namespace {

#ifdef SPECULA_TILE_PARTS

constexpr int kBlocks = 18, kPairs = 36, kBlockBytes = 144, kHeader = 32;

enum class Part { kProducts, kUnpack, kFloat };

// acc + vpdpbusd(w, the 4 bytes at xb broadcast), as qmatmul_zmm.h's dpbusd_bcast. volatile so
// that the compiler keeps every row's products even where two rows' operands look alike.
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* xb) {
  asm volatile("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*reinterpret_cast<const int32_t*>(xb)));
  return acc;
}

struct Data {
  std::vector<uint8_t> w = std::vector<uint8_t>(static_cast<size_t>(kPairs) * 2 * kBlocks * kBlockBytes, 0x11);
  std::vector<int8_t> x = std::vector<int8_t>(static_cast<size_t>(9) * kBlocks * 32, 1);
  std::vector<float> d = std::vector<float>(static_cast<size_t>(9) * kBlocks, 1.0f);
  std::vector<float> sx = std::vector<float>(static_cast<size_t>(9) * kBlocks, 1.0f);
  std::vector<float> y = std::vector<float>(static_cast<size_t>(9) * 576);
};

template <int N, Part P>
void pass(Data& data) {
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int p = 0; p < kPairs; ++p) {
    const uint8_t* a = data.w.data() + static_cast<size_t>(2 * p) * kBlocks * kBlockBytes;
    const uint8_t* b = a + static_cast<size_t>(kBlocks) * kBlockBytes;
    __m512 acc[N];
    _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
    __m512i w[8];
    _Pragma("GCC unroll 8") for (int c = 0; c < 8; ++c) w[c] = _mm512_set1_epi8(static_cast<char>(c + 1));
    for (int blk = 0; blk < kBlocks; ++blk) {
      const uint8_t* pa = a + blk * kBlockBytes;
      const uint8_t* pb = b + blk * kBlockBytes;
      __m512 dw = _mm512_set1_ps(1.0f), mw = _mm512_set1_ps(0.5f);
      if constexpr (P != Part::kProducts) {
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; ++k) {
          const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pa + kHeader + 32 * k));
          const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + kHeader + 32 * k));
          const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
          w[k] = _mm512_and_si512(v, low);
          w[k + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
        auto halves = [](const uint8_t* s, const uint8_t* t) {
          const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(t));
          return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(l), h, 1));
        };
        dw = halves(pa, pb);
        mw = halves(pa + 16, pb + 16);
      }
      const int8_t* xq = data.x.data() + blk * N * 32;
      __m512i s[N];
      _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) s[i] = dpbusd_bcast(_mm512_setzero_si512(), w[0], xq + 32 * i);
      _Pragma("GCC unroll 8") for (int c = 1; c < 8; ++c)
        _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) s[i] = dpbusd_bcast(s[i], w[c], xq + 32 * i + 4 * c);
      _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) {
        if constexpr (P == Part::kFloat) {
          const size_t xi = static_cast<size_t>(blk * N + i);
          acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(dw, _mm512_set1_ps(data.d[xi])), acc[i]);
          acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(data.sx[xi]), acc[i]);
        } else {
          acc[i] = _mm512_add_ps(acc[i], _mm512_castsi512_ps(s[i]));  // keep the sums live
        }
      }
    }
    _Pragma("GCC unroll 16") for (int i = 0; i < N; ++i) _mm512_storeu_ps(data.y.data() + i * 576 + 16 * p, acc[i]);
  }
}

template <int N, Part P>
double best_us(Data& data) {
  double best = 1e9;
  for (int rep = 0; rep < 9; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 400; ++k) pass<N, P>(data);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 400 * 1e6);
  }
  return best;
}

template <int N>
void report(Data& data) {
  const double products = best_us<N, Part::kProducts>(data);
  const double unpack = best_us<N, Part::kUnpack>(data);
  const double full = best_us<N, Part::kFloat>(data);
  // 36 pairs x 18 blocks x 8 products a row.
  const double gdp = static_cast<double>(kPairs) * kBlocks * 8 * N / products / 1e3;
  std::printf("{\"rows\":%d,\"products_us\":%.2f,\"plus_unpack_us\":%.2f,\"plus_float_us\":%.2f,"
              "\"products_g_per_s\":%.2f,\"float_share\":%.2f}\n",
              N, products, unpack, full, gdp, (full - unpack) / full);
}

TEST(TileParts, DISABLED_ProductsUnpackAndFloatWorkOfTheInt8TilePerRowCount) {
  if (!host_kernels::cpu_has_int8_kernel(host_kernels::Int8Kernel::kAvx512Vnni))
    GTEST_SKIP() << "the CPU has no AVX-512 VNNI";
  Data data;
  report<1>(data);
  report<3>(data);
  report<5>(data);
  report<8>(data);
  report<9>(data);
}

#endif

}  // namespace
}  // namespace specula

#ifdef SPECULA_TILE_PARTS
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
