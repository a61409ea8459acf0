// Vector math the host's CPU offers to code outside the device (the sampler, spec/sampling.cpp).
#pragma once
#include <cstdint>

namespace specula::host_kernels {

// Where the CPU has AVX2 and FMA: *sum ~ sum_i exp(double(x[i]) * inv_t - mx) with the vectorised
// float exp (the host device's), summed in double, and *bound >= the distance between *sum and that
// sum computed term by term with std::exp in double in any order (so that a decision that holds
// for every value within *bound of *sum holds for the exact sum); true. Elsewhere false, and the
// caller computes the sum exactly. mx >= x[i] * inv_t for every i (up to rounding).
bool exp_sum_with_bound(const float* x, int64_t n, float inv_t, float mx, double* sum, double* bound);

// The AVX2 half of it (elementwise_avx2.cpp), without the final summation margin.
void exp_sum_bound_avx2(const float* x, int64_t n, float inv_t, float mx, double* sum, double* bound);

}  // namespace specula::host_kernels
