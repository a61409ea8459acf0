// What the CUDA device tests share: a fixture that skips, with the reason, where no CUDA GPU can
// run them (never a silent pass), device buffers filled from host vectors, random inputs, and
// the comparison that reports the worst element.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda/cuda_probe.h"
#include "gpu/host/quant.h"
#include "gpu/ops.h"

namespace specula::test {

// Empty when a CUDA GPU can run the tests, else why not.
inline std::string no_gpu_reason() {
#ifndef SPECULA_HAVE_CUDA
  return "the CUDA parts were not built (nvcc was not found at configure time)";
#else
  std::string why;
  return cuda_device_count(&why) > 0 ? std::string() : why;
#endif
}

class GpuTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string why = no_gpu_reason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA GPU: " << why;
  }
};

// A seed drawn fresh per run (inputs differ run to run) and printed on failure.
inline uint64_t fresh_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

inline std::vector<float> uniform(std::mt19937_64& rng, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Rounds every value to the nearest BF16, so a BF16 device copy of it is exact.
inline void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
}

inline DeviceBuffer to_device(Ops& ops, const std::vector<float>& h) {
  DeviceBuffer b(ops, h.size());
  ops.copy_to_device(h.data(), b.get(), h.size());
  return b;
}

inline std::vector<float> to_host(Ops& ops, const float* d, size_t n) {
  std::vector<float> h(n);
  ops.copy_to_host(d, h.data(), n);
  return h;
}

// An F32 tensor view over `data` (which must outlive it).
inline TensorView f32_view(const std::vector<float>& data, std::vector<int64_t> shape, std::string name = "t") {
  TensorView v;
  v.name = std::move(name);
  v.dtype = DType::F32;
  v.shape = std::move(shape);
  v.data = reinterpret_cast<const std::byte*>(data.data());
  v.nbytes = data.size() * sizeof(float);
  return v;
}

// Every |got - want| <= abs + rel * |want| (or <= bound[i] when bounds are given); on failure
// the first offender and the worst ratio of error to tolerance.
inline testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& want, double abs,
                                          double rel, const std::vector<double>* bound = nullptr) {
  if (got.size() != want.size())
    return testing::AssertionFailure() << got.size() << " values, expected " << want.size();
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = bound ? (*bound)[i] : abs + rel * std::fabs(want[i]);
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= tol)) {
      return testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i]
                                         << " (|err| " << err << " > tolerance " << tol << ")";
    }
    if (tol > 0 && err / tol > worst) worst = err / tol, worst_i = i;
  }
  return testing::AssertionSuccess() << "worst error/tolerance " << worst << " at " << worst_i;
}

// ||got - want|| / ||want||
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace specula::test
