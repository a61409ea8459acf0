// The 16-bit weight path (gpu/host/hmatmul.h): the portable emulation against AVX-512 BF16's
// vdpbf16ps itself (denormals and cancellations included), every kernel against the portable one
// bit for bit, the row property (each row bit-equal to the 1-row call, n = 1..16, 1 or 2
// threads), accuracy against the product in double, and the host device's choice of path.
#include <gtest/gtest.h>


#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/host/hmatmul.h"
#include "gpu/host/host_device.h"
#include "gpu/host/quant.h"

namespace specula {
namespace {

struct Stored {
  std::vector<uint16_t> bits;
  TensorView view;
};

uint16_t to_bits(DType t, float v) { return t == DType::F16 ? f32_to_fp16(v) : f32_to_bf16(v); }
float from_bits(DType t, uint16_t h) { return t == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h); }

// Random weights; `tiny` mixes in values near and below FLT_MIN (BF16) to exercise DAZ and FTZ.
Stored random_weights(DType t, int64_t rows, int64_t cols, uint32_t seed, bool tiny = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> val(0.0f, 0.05f);
  std::uniform_int_distribution<int> pick(0, 15);
  Stored w;
  w.bits.resize(static_cast<size_t>(rows * cols));
  for (auto& b : w.bits) {
    float v = val(rng);
    if (tiny && t == DType::BF16 && pick(rng) == 0) v *= 1e-36f;
    if (pick(rng) == 1) v = 0.0f;
    b = to_bits(t, v);
  }
  w.view = TensorView{"w", t, {rows, cols}, reinterpret_cast<const std::byte*>(w.bits.data()), w.bits.size() * 2};
  return w;
}

std::vector<float> random_x(int64_t n, int64_t cols, uint32_t seed, bool tiny = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> val(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 31);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) {
    v = val(rng) * (pick(rng) == 0 ? 20.0f : 1.0f);
    if (tiny && pick(rng) == 1) v *= 1e-37f;
  }
  return x;
}

std::vector<float> run(const PackedMatrix& m, const std::vector<float>& x, int64_t n, int threads, bool portable) {
  ThreadPool pool(threads);
  std::vector<float> y(static_cast<size_t>(n * m.rows), std::nanf(""));
  const PackedMatrix* w = &m;
  float* out = y.data();
  hmatmul({&w, 1}, x.data(), n, {&out, 1}, pool, portable);
  return y;
}

bool bit_equal(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// The kernels this CPU runs for a type: the portable emulation, and the AVX-512 one if present.
std::vector<bool> kernels(DType t) {
  std::vector<bool> v{true};
  if (hmatmul_supports(t, false)) v.push_back(false);
  return v;
}

TEST(Bf16Path, ThePortableEmulationIsVdpbf16psBitForBit) {
  if (!host_kernels::cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX-512 BF16: nothing to compare with";
  // One instruction against the emulation's two steps (odd element first, each rounded, DAZ,
  // FTZ), on random pairs whose exponents span 2^-10..2^10 and on tiny values.
  const Stored w = random_weights(DType::BF16, 16, 2, 1, true);
  ThreadPool pool(1);
  const auto m = pack_matrix16(w.view, pool);
  std::mt19937 rng(2);
  std::normal_distribution<float> val(0.0f, 1.0f);
  int64_t checked = 0;
  for (int it = 0; it < 20000; ++it) {
    const Stored wi = random_weights(DType::BF16, 16, 2, static_cast<uint32_t>(100 + it), true);
    const auto mi = pack_matrix16(wi.view, pool);
    const std::vector<float> x = random_x(1, 2, static_cast<uint32_t>(50000 + it), true);
    const std::vector<float> got = run(*mi, x, 1, 1, false), want = run(*mi, x, 1, 1, true);
    for (int r = 0; r < 16; ++r, ++checked) ASSERT_TRUE(bit_equal(got[r], want[r])) << "pair " << it << " row " << r;
  }
  EXPECT_EQ(checked, 320000);
}

TEST(HalfKernels, EveryKernelMatchesTheProductInDoubleWithinItsRounding) {
  for (DType t : {DType::F16, DType::BF16})
    for (bool portable : kernels(t)) {
      const int64_t rows = 37, cols = 70, n = 5;
      const Stored w = random_weights(t, rows, cols, 3);
      ThreadPool pool(1);
      const auto m = pack_matrix16(w.view, pool);
      const auto x = random_x(n, cols, 4);
      const auto y = run(*m, x, n, 1, portable);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          double want = 0, mag = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double wv = from_bits(t, w.bits[static_cast<size_t>(r * cols + c)]), xv = x[static_cast<size_t>(i * cols + c)];
            want += wv * xv;
            mag += std::fabs(wv * xv);
          }
          // F16: f32 accumulation only. BF16: x rounded to 8 significant bits first (2^-9 relative).
          const double bound = (t == DType::F16 ? 1e-6 : 4e-3) * mag + 1e-30;
          EXPECT_NEAR(y[static_cast<size_t>(i * rows + r)], want, bound) << dtype_name(t) << " portable " << portable;
        }
    }
}

TEST(HalfKernels, EachRowIsBitEqualToTheOneRowCallWhateverTheRowCountOrThreads) {
  for (DType t : {DType::F16, DType::BF16})
    for (bool portable : kernels(t)) {
      const int64_t rows = 45, cols = 64;
      const Stored w = random_weights(t, rows, cols, 5);
      ThreadPool pool(1);
      const auto m = pack_matrix16(w.view, pool);
      const auto x = random_x(16, cols, 6);
      std::vector<std::vector<float>> alone(16);
      for (int64_t i = 0; i < 16; ++i)
        alone[static_cast<size_t>(i)] = run(*m, std::vector<float>(x.begin() + i * cols, x.begin() + (i + 1) * cols), 1, 1, portable);
      for (int64_t n = 1; n <= 16; ++n)
        for (int threads : {1, 2}) {
          const auto y = run(*m, x, n, threads, portable);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows; ++r)
              ASSERT_TRUE(bit_equal(y[static_cast<size_t>(i * rows + r)], alone[static_cast<size_t>(i)][static_cast<size_t>(r)]))
                  << dtype_name(t) << " portable " << portable << " n " << n << " row " << i << " out " << r;
        }
    }
}

TEST(HalfKernels, TheVectorKernelAgreesWithThePortableOneBitForBit) {
  int compared = 0;
  for (DType t : {DType::F16, DType::BF16}) {
    if (!hmatmul_supports(t, false)) continue;
    const int64_t rows = 50, cols = 96, n = 11;
    const Stored w = random_weights(t, rows, cols, 7, true);
    ThreadPool pool(2);
    const auto m = pack_matrix16(w.view, pool);
    const auto x = random_x(n, cols, 8, true);
    const auto a = run(*m, x, n, 2, false), b = run(*m, x, n, 1, true);
    for (size_t k = 0; k < a.size(); ++k) ASSERT_TRUE(bit_equal(a[k], b[k])) << dtype_name(t) << " output " << k;
    ++compared;
  }
  if (compared == 0) GTEST_SKIP() << "this CPU has no AVX-512: only the portable kernels run";
}

TEST(HalfKernels, AFusedCallEqualsSeparateCallsAndTheHostDeviceTakesThePath) {
  for (DType t : {DType::F16, DType::BF16}) {
    const Stored a = random_weights(t, 24, 64, 9), b = random_weights(t, 40, 64, 10);
    const auto x = random_x(3, 64, 11);
    HostOps fast(2, host_kernels::host_path_for(nullptr)), portable(1, host_kernels::host_path_for("portable"));
    for (HostOps* ops : {&fast, &portable}) {
      const bool port = ops == &portable;
      const Weight wa = ops->upload(a.view), wb = ops->upload(b.view);
      if (!hmatmul_supports(t, port)) {
        EXPECT_EQ(wa.device, nullptr) << "no kernel here: the f32 kernels";
        continue;
      }
      ASSERT_NE(wa.device, nullptr) << dtype_name(t);
      EXPECT_EQ(static_cast<const PackedMatrix*>(wa.device)->dtype, t);
      std::vector<float> ya(3 * 24), yb(3 * 40), fa(3 * 24), fb(3 * 40);
      ops->matmul(x.data(), wa, 3, ya.data());
      ops->matmul(x.data(), wb, 3, yb.data());
      const Weight* ws[] = {&wa, &wb};
      float* ys[] = {fa.data(), fb.data()};
      ops->matmul_many(x.data(), ws, 3, ys);
      for (size_t k = 0; k < ya.size(); ++k) ASSERT_TRUE(bit_equal(ya[k], fa[k]));
      for (size_t k = 0; k < yb.size(); ++k) ASSERT_TRUE(bit_equal(yb[k], fb[k]));
    }
  }
}

}  // namespace
}  // namespace specula
