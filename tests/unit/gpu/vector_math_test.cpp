// gpu/host/vector_math.h: the vectorised exp sum that the sampler's top-p uses as a bracket. Its
// bound must contain the sum computed term by term with std::exp (else the sampler's cut could
// differ from its definition), and be tight enough that the bracket decides nearly every row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <random>
#include <vector>

#include "gpu/host/attention.h"
#include "gpu/host/host_device.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/vector_math.h"

namespace specula {
namespace {

TEST(VectorMath, TheExpSumsBoundContainsTheExactSumAndIsAMillionthOfItOrLess) {
  if (!host_kernels::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2+FMA: the sampler sums exactly";
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  double worst_use = 0, worst_tightness = 0;
  for (size_t n : {1u, 7u, 8u, 9u, 100u, 4097u, 49152u})
    for (float spread : {0.01f, 1.0f, 3.0f, 10.0f, 40.0f})  // up to y far below exp256's -87
      for (float t : {0.2f, 0.8f, 1.0f, 2.0f})
        for (int trial = 0; trial < 3; ++trial) {
          std::vector<float> x(n);
          for (float& v : x) v = spread * g(rng);
          const float inv_t = 1.0f / t, mx = *std::max_element(x.begin(), x.end()) * inv_t;
          double sum = 0, bound = 0, exact = 0;
          ASSERT_TRUE(host_kernels::exp_sum_with_bound(x.data(), static_cast<int64_t>(n), inv_t, mx, &sum, &bound));
          for (float v : x) exact += std::exp(static_cast<double>(v) * inv_t - mx);
          ASSERT_LE(std::fabs(sum - exact), bound) << "n " << n << " spread " << spread << " T " << t;
          worst_use = std::max(worst_use, std::fabs(sum - exact) / bound);
          worst_tightness = std::max(worst_tightness, bound / exact);
        }
  EXPECT_LT(worst_tightness, 1e-6);
  // The bound is a worst case; the errors seen use a part of it (printed, not asserted).
  std::printf("largest |sum - exact| / bound: %.3g; largest bound / sum: %.3g\n", worst_use, worst_tightness);
}

// HostOps::rmsnorm takes a 256-bit kernel wherever the CPU has AVX2: it must keep the portable
// loop's bits (its eight partial sums in the same order), on the int8 and the reference paths.
// The control: the same rows normalised with a float sum of squares differ somewhere, so the
// comparison sees a change of summation that small.
TEST(VectorMath, TheVectorRmsNormGivesThePortableLoopsBitsForAnyWidthAndRowCount) {
  if (!host_kernels::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2+FMA: only the portable rmsnorm runs";
  std::mt19937_64 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  host_kernels::HostPath portable;
  HostOps plain(1, portable);
  int64_t float_sum_differs = 0;
  for (int64_t dim : {1, 7, 8, 13, 64, 576, 1536, 2049})
    for (int64_t n : {1, 5, 16}) {
      std::vector<float> x(static_cast<size_t>(n * dim)), w(static_cast<size_t>(dim));
      for (float& v : x) v = 3.0f * g(rng);
      for (float& v : w) v = 1.0f + 0.1f * g(rng);
      const TensorView wv{"norm", DType::F32, {dim}, reinterpret_cast<const std::byte*>(w.data()), w.size() * sizeof(float)};
      std::vector<float> want(x.size()), got(x.size());
      plain.rmsnorm(x.data(), plain.upload(wv), 1e-5f, n, dim, want.data());
      host_kernels::rmsnorm_avx2(x.data(), w.data(), 1e-5f, n, dim, got.data());
      ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "dim " << dim << " rows " << n;
      for (int64_t r = 0; r < n; ++r) {
        float ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += x[r * dim + i] * x[r * dim + i];
        const float inv = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ss) / static_cast<double>(dim) + 1e-5f));
        for (int64_t i = 0; i < dim; ++i) float_sum_differs += x[r * dim + i] * inv * w[i] != want[r * dim + i];
      }
    }
  EXPECT_GT(float_sum_differs, 0) << "the control: a float sum of squares went unnoticed";
}

}  // namespace
}  // namespace specula
