// gpu/host/vector_math.h: the sampler's exponential, scalar, and dispatch to the 256-bit loops
// where the CPU has AVX2 and FMA. Built with -ffp-contract=off (CMakeLists.txt): the definition's
// arithmetic is exactly the operations written here.
#include "gpu/host/vector_math.h"

#include <cmath>
#include <cstring>

#include "gpu/host/matmul_kernels.h"

namespace specula::host_kernels {

using namespace sampler_exp_constants;

double sampler_arg(float x, float inv_t, float mx) {
  return std::fma(static_cast<double>(x), static_cast<double>(inv_t), -static_cast<double>(mx));
}

double sampler_exp(double a) {
  if (a < kFloor) return 0.0;  // -inf included; NaN goes on and comes out NaN
  const double t = std::fma(a, kLog2e, kShifter);
  const double k = t - kShifter;  // round(a / ln 2), exact
  double r = std::fma(-k, kLn2Hi, a);
  r = std::fma(-k, kLn2Lo, r);
  double p = kCoeff[0];
  for (int i = 1; i < kTerms; ++i) p = std::fma(p, r, kCoeff[i]);
  // 2^k: t's low mantissa bits hold 2^51 + k; (that + 1023) << 52 is k's biased exponent alone.
  uint64_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits = (bits + 1023u) << 52;
  double scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

double sampler_exp_sum(const float* x, int64_t n, float inv_t, float mx) {
  // The widest loop the host path allows (SPECULA_SIMD=avx2 runs no AVX-512 instruction).
  if (default_isa() == Isa::kAvx512) return sampler_exp_sum_avx512(x, n, inv_t, mx);
  if (cpu_has_avx2_fma()) return sampler_exp_sum_avx2(x, n, inv_t, mx);
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lane[j] += sampler_exp(sampler_arg(x[i + j], inv_t, mx));
  double s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  for (; i < n; ++i) s += sampler_exp(sampler_arg(x[i], inv_t, mx));
  return s;
}

void sampler_exp_terms(const float* x, int64_t n, float inv_t, float mx, double* e) {
  if (cpu_has_avx2_fma()) return sampler_exp_terms_avx2(x, n, inv_t, mx, e);
  for (int64_t i = 0; i < n; ++i) e[i] = sampler_exp(sampler_arg(x[i], inv_t, mx));
}

void sampler_log_probs(const float* x, int64_t n, float inv_t, float mx, double log_sum, float* out) {
  if (cpu_has_avx2_fma()) return sampler_log_probs_avx2(x, n, inv_t, mx, log_sum, out);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(sampler_arg(x[i], inv_t, mx) - log_sum);
}

}  // namespace specula::host_kernels
