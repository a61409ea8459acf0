// gpu/host/vector_math.h: the vectorised exp sum that the sampler's top-p uses as a bracket. Its
// bound must contain the sum computed term by term with std::exp (else the sampler's cut could
// differ from its definition), and be tight enough that the bracket decides nearly every row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

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

}  // namespace
}  // namespace specula
