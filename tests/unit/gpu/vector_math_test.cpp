// gpu/host/vector_math.h: the sampler's exponential. It is a definition (every operation fixed),
// so the 256-bit loops must give the scalar functions' bits on every input, and the scalar
// function must be an exponential: within a few ulp of exp wherever the sampler uses it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gpu/host/attention.h"
#include "gpu/host/host_device.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/vector_math.h"

namespace specula {
namespace {

// Logits the way a language model's look (a few large, a long flat tail), flat ones, and
// spreads that put a_v far below the definition's floor of -708.
std::vector<float> sampler_row(size_t n, float spread, std::mt19937_64& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = spread * g(rng) + (i % 97 == 0 ? 3.0f * spread : 0.0f);
  return x;
}

TEST(VectorMath, TheSamplersExpIsWithinTwoUlpsOfExpFromItsFloorToZeroAndZeroBelowIt) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    // Uniform on [-708, 0] and, more densely, near 0 where the sampler's large terms are.
    const double a = i % 2 ? -708.0 * u(rng) : -4.0 * u(rng) * u(rng);
    const double want = std::exp(a), got = host_kernels::sampler_exp(a);
    const double ulps = std::fabs(got - want) / (std::nextafter(want, 2 * want + 1) - want);
    worst = std::max(worst, ulps);
    ASSERT_LE(ulps, 2.0) << "a = " << a << ": got " << got << ", exp " << want;
  }
  std::printf("largest distance from std::exp: %.2f ulp\n", worst);
  EXPECT_EQ(host_kernels::sampler_exp(0.0), 1.0);
  EXPECT_EQ(host_kernels::sampler_exp(-708.5), 0.0);
  EXPECT_EQ(host_kernels::sampler_exp(-std::numeric_limits<double>::infinity()), 0.0);
  EXPECT_TRUE(std::isnan(host_kernels::sampler_exp(std::nan(""))));
  // Slightly above zero, as a_v can be by the rounding of mx.
  EXPECT_NEAR(host_kernels::sampler_exp(1e-6), std::exp(1e-6), 1e-15);
}

TEST(VectorMath, TheSamplersVectorLoopsGiveTheScalarDefinitionsBitsForAnyLengthAndSpread) {
  // The sum in the definition's order written here from the scalar functions, the terms and the
  // log-probabilities one by one; sampler_exp_sum / _terms / _log_probs take their 256-bit loops
  // on this CPU. The control: the same terms summed in index order differ from the lane order
  // in some row, so the comparison sees a change of summation order.
  if (!host_kernels::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2+FMA: only the scalar loops run";
  std::mt19937_64 rng(13);
  int rows = 0, order_matters = 0;
  for (size_t n : {0u, 1u, 3u, 4u, 7u, 8u, 9u, 15u, 100u, 4097u, 49152u})
    for (float spread : {0.01f, 1.0f, 3.0f, 40.0f, 400.0f})
      for (float t : {0.2f, 0.8f, 1.0f, 2.0f}) {
        const std::vector<float> x = sampler_row(n, spread, rng);
        const float inv_t = 1.0f / t;
        const float mx = n ? *std::max_element(x.begin(), x.end()) * inv_t : 0.0f;
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0}, in_order = 0;
        std::vector<double> e(n);
        for (size_t i = 0; i < n; ++i) in_order += e[i] = host_kernels::sampler_exp(host_kernels::sampler_arg(x[i], inv_t, mx));
        const size_t whole = n / 8 * 8;
        for (size_t i = 0; i < whole; ++i) lane[i % 8] += e[i];
        double want = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        for (size_t i = whole; i < n; ++i) want += e[i];
        const double got = host_kernels::sampler_exp_sum(x.data(), static_cast<int64_t>(n), inv_t, mx);
        ASSERT_EQ(std::memcmp(&got, &want, sizeof got), 0) << "n " << n << " spread " << spread << " T " << t;
        // Both vector loops, whichever sampler_exp_sum took (the 512-bit one where the CPU has
        // AVX-512 and SPECULA_SIMD does not cap it at avx2).
        const double got2 = host_kernels::sampler_exp_sum_avx2(x.data(), static_cast<int64_t>(n), inv_t, mx);
        ASSERT_EQ(std::memcmp(&got2, &want, sizeof got2), 0) << "256-bit: n " << n << " spread " << spread << " T " << t;
        if (host_kernels::cpu_has_avx512()) {
          const double got5 = host_kernels::sampler_exp_sum_avx512(x.data(), static_cast<int64_t>(n), inv_t, mx);
          ASSERT_EQ(std::memcmp(&got5, &want, sizeof got5), 0) << "512-bit: n " << n << " spread " << spread << " T " << t;
        }
        order_matters += in_order != want;
        std::vector<double> terms(n);
        host_kernels::sampler_exp_terms(x.data(), static_cast<int64_t>(n), inv_t, mx, terms.data());
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(std::memcmp(&terms[i], &e[i], sizeof(double)), 0) << "term " << i << " of " << n;
        const double log_sum = n ? std::log(want) : 0.0;
        std::vector<float> lp(n);
        host_kernels::sampler_log_probs(x.data(), static_cast<int64_t>(n), inv_t, mx, log_sum, lp.data());
        for (size_t i = 0; i < n; ++i) {
          const float w = static_cast<float>(host_kernels::sampler_arg(x[i], inv_t, mx) - log_sum);
          ASSERT_EQ(std::memcmp(&lp[i], &w, sizeof w), 0) << "log-probability " << i << " of " << n;
        }
        ++rows;
      }
  EXPECT_GT(order_matters, 0) << "no row's sum depends on its order: the comparison above could not see one";
  std::printf("%d rows; the index-order sum differs from the definition's in %d\n", rows, order_matters);
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

TEST(VectorMath, TheAvx512SwigluGivesTheAvx2OnesBitsForAnyLengthAndEveryRangeOfGate) {
  if (!host_kernels::cpu_has_avx512() || !host_kernels::cpu_has_avx2_fma())
    GTEST_SKIP() << "this CPU lacks AVX-512 or AVX2+FMA: only one of the two SwiGLU kernels runs here";
  // Gates from the exponential's floor (below -87 its lanes are zeroed) and ceiling (88) through
  // the usual range, signed zeros, and lengths that leave every tail of a 16-lane vector.
  std::mt19937_64 rng(11);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const float special[] = {-100.0f, -88.0f, -87.0f, -86.9f, -0.0f, 0.0f, 1e-30f, -1e-30f, 87.9f, 88.0f, 95.0f};
  int64_t moved_by_a_lane_shift = 0;
  for (int64_t n : {1, 7, 8, 15, 16, 17, 31, 33, 576, 1536, 7680, 8191}) {
    std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      gate[static_cast<size_t>(i)] = i % 13 == 5 ? special[static_cast<size_t>(i / 13) % std::size(special)] : 4.0f * g(rng);
      up[static_cast<size_t>(i)] = 2.0f * g(rng);
    }
    std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), 12345.0f);
    host_kernels::swiglu_avx2(gate.data(), up.data(), n, want.data());
    host_kernels::swiglu_avx512(gate.data(), up.data(), n, got.data());
    ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << "length " << n;
    // The control: the comparison sees one lane's value taken from its neighbour.
    for (int64_t i = 1; i < n; ++i) moved_by_a_lane_shift += want[static_cast<size_t>(i)] != want[static_cast<size_t>(i - 1)];
  }
  EXPECT_GT(moved_by_a_lane_shift, 0);
}

}  // namespace
}  // namespace specula
