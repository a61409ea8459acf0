// Vector math the host's CPU offers to code outside the device: the sampler's exponential
// (spec/sampling.cpp's transform_logits).
//
// The transform's probabilities are exp(a_v) / S with a_v = x_v / T - mx and S the sum of the
// exponentials over the vocabulary. Its definition fixes every operation, so that the target's own
// sampler and the speculative verifier (and every CPU) compute the same bits:
//   a_v       = fma(double(x_v), double(inv_t), -double(mx))            (sampler_arg)
//   e_v       = sampler_exp(a_v): exp by one fixed sequence of IEEE double operations, each product
//               that feeds a sum an explicit fused multiply-add (within 2 ulp of exp; 0 below -708)
//   S         = the e_v summed in 8 lanes (lane j takes v = j, j + 8, ... up to the last whole 8),
//               the lanes joined ((0+1)+(2+3))+((4+5)+(6+7)), then the tail v in order
//   log p_v   = float(a_v - log S)
// The 256-bit loops (sampler_exp_avx2.cpp, built with -ffp-contract=off so that the compiler fuses
// nothing the definition does not) and the scalar ones here give the same bits; the sampler calls
// these functions and never writes the arithmetic itself. A whole-vocabulary sum takes ~55 us of
// one core where std::exp term by term took ~280 us (docs/speculative.md, "The transform"); the
// 512-bit sum (sampler_exp_avx512.cpp, the same bits) about half of the 256-bit one's time.
#pragma once
#include <cstdint>

namespace specula::host_kernels {

// a = fma(double(x), double(inv_t), -double(mx)).
double sampler_arg(float x, float inv_t, float mx);
// exp(a) by the fixed sequence (vector_math.cpp); 0 for a < -708, NaN for NaN.
double sampler_exp(double a);
// S over x[0..n) in the definition's order.
double sampler_exp_sum(const float* x, int64_t n, float inv_t, float mx);
// e[i] = sampler_exp(sampler_arg(x[i], inv_t, mx)).
void sampler_exp_terms(const float* x, int64_t n, float inv_t, float mx, double* e);
// out[i] = float(sampler_arg(x[i], inv_t, mx) - log_sum).
void sampler_log_probs(const float* x, int64_t n, float inv_t, float mx, double log_sum, float* out);

// The 256-bit loops (sampler_exp_avx2.cpp); call only where cpu_has_avx2_fma().
double sampler_exp_sum_avx2(const float* x, int64_t n, float inv_t, float mx);
void sampler_exp_terms_avx2(const float* x, int64_t n, float inv_t, float mx, double* e);
void sampler_log_probs_avx2(const float* x, int64_t n, float inv_t, float mx, double log_sum, float* out);
// S from the 8 lanes' sums and the tail_n (< 8) terms after the last whole 8: the lanes joined
// in the definition's order, then the tail's terms in order (the 256-bit and 512-bit sums' end).
double sampler_join_lanes_avx2(const double* lane, const float* tail_x, int64_t tail_n, float inv_t, float mx);
// S in 512-bit vectors (sampler_exp_avx512.cpp), the same bits; call only where cpu_has_avx512().
// sampler_exp_sum takes it unless SPECULA_SIMD caps the host at avx2 (or below).
double sampler_exp_sum_avx512(const float* x, int64_t n, float inv_t, float mx);

// The definition's constants, shared by both halves.
namespace sampler_exp_constants {
inline constexpr double kFloor = -708.0;               // below it e = 0 (exp would leave the normal range)
inline constexpr double kLog2e = 1.4426950408889634;   // 1 / ln 2
inline constexpr double kShifter = 0x1.8p52;           // t = fma(a, log2e, shifter): round(a / ln 2) in t's low bits
inline constexpr double kLn2Hi = 0x1.62e42fee00000p-1; // ln 2 = hi + lo (fdlibm's split)
inline constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
// exp(r) on |r| <= ln2 / 2 by Taylor's polynomial of degree 13 (the next term is below 4e-18),
// Horner's rule from the top: coefficient 1/k! for k = 13, 12, ..., 0.
inline constexpr int kTerms = 14;
inline constexpr double kCoeff[kTerms] = {
    1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0, 1.0 / 362880.0,
    1.0 / 40320.0,      1.0 / 5040.0,      1.0 / 720.0,      1.0 / 120.0,     1.0 / 24.0,
    1.0 / 6.0,          0.5,               1.0,              1.0};
}  // namespace sampler_exp_constants

}  // namespace specula::host_kernels
