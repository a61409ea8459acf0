// Host matmul: every dtype, every ISA path the CPU has (portable, AVX2, AVX-512), many activation-row counts and thread counts,
// against matmul_reference (itself checked here against a hand-computed product).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "gpu/host/matmul.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/quant.h"

namespace specula {
namespace {

using host_kernels::Isa;

// A [rows, cols] weight of random stored values with sane fp16 scales (no nan or inf).
struct Weight {
  std::vector<std::byte> bytes;
  TensorView view;
};

Weight random_weight(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  Weight w;
  w.bytes.resize(dtype_row_bytes(t, cols) * static_cast<size_t>(rows));
  for (auto& b : w.bytes) b = std::byte(byte(rng));
  auto put16 = [&](size_t off, uint16_t h) { std::memcpy(w.bytes.data() + off, &h, 2); };
  const DTypeInfo& info = dtype_info(t);
  for (size_t o = 0; o < w.bytes.size(); o += static_cast<size_t>(info.block_bytes)) {
    switch (t) {
      case DType::F32: { const float f = val(rng); std::memcpy(w.bytes.data() + o, &f, 4); break; }
      case DType::F16: put16(o, f32_to_fp16(val(rng))); break;
      case DType::BF16: put16(o, f32_to_bf16(val(rng))); break;
      case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: case DType::IQ4_NL: case DType::IQ4_XS:
        put16(o, f32_to_fp16(0.1f * val(rng)));
        break;
      case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K:
        put16(o, f32_to_fp16(0.1f * val(rng)));
        put16(o + 2, f32_to_fp16(0.1f * val(rng)));
        break;
      case DType::Q2_K:
        put16(o + 80, f32_to_fp16(0.1f * val(rng)));
        put16(o + 82, f32_to_fp16(0.1f * val(rng)));
        break;
      case DType::Q3_K: put16(o + 108, f32_to_fp16(0.1f * val(rng))); break;
      case DType::Q6_K: put16(o + 208, f32_to_fp16(0.1f * val(rng))); break;
      case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S: case DType::IQ1_S:
        put16(o, f32_to_fp16(0.005f * val(rng)));
        break;
      case DType::IQ1_M: set_iq1_m_d(reinterpret_cast<uint8_t*>(w.bytes.data() + o), f32_to_fp16(0.005f * val(rng))); break;
    }
  }
  w.view = TensorView{"w", t, {rows, cols}, w.bytes.data(), w.bytes.size()};
  return w;
}

std::vector<float> random_activations(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> val(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = val(rng);
  return x;
}

// Fast and reference results are f32 sums of the same `cols` products in different orders
// (8 lanes, pairs, blocks), and Q4_0/Q4_1 weights may be formed with one fused rounding instead
// of two. Each ordering's error is at most ~cols * 2^-24 * sum|w x| in the worst case and about
// sqrt(cols) * 2^-24 * sum|w x| in practice (~1.5e-6 sum|w x| at cols = 576); 2e-5 sum|w x|
// leaves a wide margin for the worst case yet is far below what any indexing bug produces
// (an error of the order of a whole product, ~sum|w x| / sqrt(cols)).
void expect_matches_reference(const TensorView& w, const std::vector<float>& x, int64_t n, const std::vector<float>& y,
                              const std::string& what) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  std::vector<float> ref(static_cast<size_t>(n * rows));
  matmul_reference(w, x.data(), n, ref.data());
  std::vector<float> row(static_cast<size_t>(cols));
  int failures = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(w.dtype, w.row(r), row.data(), cols);
    for (int64_t i = 0; i < n; ++i) {
      double mag = 0;
      for (int64_t j = 0; j < cols; ++j) mag += std::fabs(static_cast<double>(row[j]) * x[i * cols + j]);
      const double tol = 2e-5 * mag + 1e-30;
      const float got = y[i * rows + r], want = ref[i * rows + r];
      if (!(std::fabs(got - want) <= tol) && ++failures <= 5)
        ADD_FAILURE() << what << ": y[" << i << ", " << r << "] = " << got << ", reference " << want << " (tolerance " << tol << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

const DType kAllTypes[] = {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                           DType::Q5_1, DType::Q2_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS,
                           DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S, DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S, DType::IQ1_M};
const int64_t kRowCounts[] = {1, 2, 3, 5, 6, 8, 9, 17};

bool have_avx2() { return host_kernels::cpu_has_avx2_fma(); }
bool have_avx512() { return host_kernels::cpu_has_avx512(); }
bool have(Isa isa) { return isa == Isa::kPortable || (isa == Isa::kAvx2 && have_avx2()) || (isa == Isa::kAvx512 && have_avx512()); }
const Isa kAllIsas[] = {Isa::kPortable, Isa::kAvx2, Isa::kAvx512};

TEST(Matmul, ReferenceMatchesAHandComputedProduct) {
  // W = [[1, 2, 3, 4], [-1, 0.5, 0, 2]] in F16, x = [[1, 1, 1, 1], [2, 0, -1, 0.5]].
  const uint16_t w16[8] = {0x3c00, 0x4000, 0x4200, 0x4400, 0xbc00, 0x3800, 0x0000, 0x4000};
  const TensorView w{"w", DType::F16, {2, 4}, reinterpret_cast<const std::byte*>(w16), sizeof w16};
  const float x[8] = {1, 1, 1, 1, 2, 0, -1, 0.5f};
  float y[4];
  matmul_reference(w, x, 2, y);
  EXPECT_EQ(y[0], 10.0f);   // 1 + 2 + 3 + 4
  EXPECT_EQ(y[1], 1.5f);    // -1 + 0.5 + 0 + 2
  EXPECT_EQ(y[2], 1.0f);    // 2 + 0 - 3 + 2
  EXPECT_EQ(y[3], -1.0f);   // -2 + 0 + 0 + 1
  ThreadPool pool(1);
  float fast[4];
  matmul(w, x, 2, fast, pool);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(fast[k], y[k]);
}

// Every dtype x every activation-row count x threads 1 and 2 x every path in `isas` the CPU has.
void check_all_paths(DType t, int64_t rows, int64_t cols, std::initializer_list<Isa> isas = {Isa::kPortable, Isa::kAvx2, Isa::kAvx512}) {
  const Weight w = random_weight(t, rows, cols, 100 + static_cast<uint32_t>(t));
  for (int64_t n : kRowCounts) {
    const auto x = random_activations(n, cols, 7 + static_cast<uint32_t>(n));
    for (int threads : {1, 2}) {
      ThreadPool pool(threads);
      for (Isa isa : isas) {
        if (!have(isa)) continue;
        host_kernels::MatmulArgs a{t, w.view.data, dtype_row_bytes(t, cols), rows, cols, x.data(), n, nullptr};
        std::vector<float> y(static_cast<size_t>(n * rows), std::nanf(""));
        a.y = y.data();
        host_kernels::matmul_isa_path(isa, a, pool);
        expect_matches_reference(w.view, x, n, y,
                                 std::string(dtype_name(t)) + " n=" + std::to_string(n) + " threads=" + std::to_string(threads) +
                                     " " + host_kernels::isa_name(isa));
      }
    }
  }
}

TEST(Matmul, EveryDtypeMatchesTheReferenceForEveryRowCountThreadCountAndPath) {
  for (DType t : kAllTypes) {
    const int64_t cols = dtype_info(t).block_elems == 256 ? 512 : 96;
    check_all_paths(t, 37, cols);  // odd row count: the last row group and chunk are partial
  }
}

TEST(Matmul, Q4_1GemmMatchesTheReferenceAtTheDefaultModelsWidths) {
  check_all_paths(DType::Q4_1, 67, 576);
  check_all_paths(DType::Q4_1, 13, 1536);
}

TEST(Matmul, Q8_0GemmMatchesTheReferenceAtTheOutputHeadsWidth) { check_all_paths(DType::Q8_0, 101, 576); }

TEST(Matmul, FloatRowsOfAnyLengthTakeTheBufferedPathAndStillMatch) {
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    check_all_paths(t, 5, 45);   // 45 = 5 * 8 + 5: vector body and scalar tail
    check_all_paths(t, 3, 300);  // longer than one 256-value slice
  }
}

TEST(Matmul, SingleWeightRowAndSingleActivationRowWork) {
  for (DType t : kAllTypes) check_all_paths(t, 1, dtype_info(t).block_elems == 256 ? 256 : 32);
}

TEST(Matmul, ResultsAreBitIdenticalAcrossRunsAndThreadCounts) {
  const Weight w = random_weight(DType::Q4_1, 301, 576, 3);
  const auto x = random_activations(6, 576, 4);
  std::vector<float> first(6 * 301), again(6 * 301);
  ThreadPool one(1), two(2);
  matmul(w.view, x.data(), 6, first.data(), one);
  for (int run = 0; run < 20; ++run) {
    matmul(w.view, x.data(), 6, again.data(), two);
    ASSERT_EQ(std::memcmp(first.data(), again.data(), first.size() * sizeof(float)), 0) << "run " << run;
  }
}

TEST(Matmul, RejectsWeightsThatAreNotWholeMatrices) {
  ThreadPool pool(1);
  std::vector<std::byte> bytes(20 * 4);
  float x[64] = {}, y[8];
  const TensorView three_d{"w3", DType::Q4_1, {2, 2, 32}, bytes.data(), bytes.size()};
  EXPECT_THROW(matmul(three_d, x, 1, y, pool), std::invalid_argument);
  const TensorView ragged{"wr", DType::Q4_1, {2, 40}, bytes.data(), bytes.size()};
  EXPECT_THROW(matmul(ragged, x, 1, y, pool), std::invalid_argument);
  const TensorView short_data{"ws", DType::Q4_1, {8, 64}, bytes.data(), bytes.size()};
  EXPECT_THROW(matmul(short_data, x, 1, y, pool), std::invalid_argument);
}

TEST(Matmul, TheWidestPathIsChosenAndSpeculaSimdCapsOrForcesIt) {
  EXPECT_EQ(host_kernels::isa_for_env("portable"), Isa::kPortable);
  const Isa avx2_or_less = have_avx2() ? Isa::kAvx2 : Isa::kPortable;
  const Isa native = have_avx512() ? Isa::kAvx512 : avx2_or_less;
  EXPECT_EQ(host_kernels::isa_for_env(nullptr), native);
  EXPECT_EQ(host_kernels::isa_for_env("avx512"), native);
  EXPECT_EQ(host_kernels::isa_for_env("avx2"), avx2_or_less);
  const char* env = std::getenv("SPECULA_SIMD");
  EXPECT_STREQ(matmul_isa(), host_kernels::isa_name(host_kernels::isa_for_env(env)));
}

TEST(Matmul, AskingForAPathTheCpuLacksIsRefusedNotRun) {
  float x[32] = {}, y[1];
  std::vector<std::byte> bytes(20);
  host_kernels::MatmulArgs a{DType::Q4_1, bytes.data(), 20, 1, 32, x, 1, y};
  ThreadPool pool(1);
  for (Isa isa : kAllIsas) {
    if (!have(isa)) {
      EXPECT_THROW(host_kernels::matmul_isa_path(isa, a, pool), std::invalid_argument) << host_kernels::isa_name(isa);
    }
  }
}

// The AVX-512 kernels are checked by every test above where the CPU has AVX-512; this test says
// so explicitly (and is reported SKIPPED, with the reason, where it has not), so a run on a CPU
// without AVX-512 cannot be mistaken for a check of them.
TEST(Matmul, TheAvx512KernelsMatchTheReferenceForEveryDtypeAndRowCount) {
  if (!have_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 F/BW/VL: the AVX-512 kernels cannot run here";
  for (DType t : kAllTypes) check_all_paths(t, 37, dtype_info(t).block_elems == 256 ? 512 : 96, {Isa::kAvx512});
  check_all_paths(DType::Q4_1, 67, 576, {Isa::kAvx512});
  check_all_paths(DType::Q4_0, 13, 1536, {Isa::kAvx512});
  check_all_paths(DType::Q8_0, 101, 576, {Isa::kAvx512});
  check_all_paths(DType::BF16, 9, 45, {Isa::kAvx512});  // not whole blocks: the AVX2 fallback
}

}  // namespace
}  // namespace specula
