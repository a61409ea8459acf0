// The int8 path (gpu/host/qmatmul.h): the activation quantizer against its definition, the packed
// kernels against an emulation in double written here from the stored (unpacked) blocks, the row
// property (each row bit-equal to the 1-row call, n = 1..16, any position, 1 or 2 threads), the
// AVX2 and portable kernels bit-equal, fused calls bit-equal to separate ones, and the
// SPECULA_SIMD values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu/host/host_device.h"
#include "gpu/host/matmul.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/qmatmul.h"
#include "gpu/host/quant.h"

namespace specula {
namespace {

using host_kernels::Isa;

struct Stored {
  std::vector<std::byte> bytes;
  TensorView view;
};

// Random stored blocks with sane fp16 scales; Q8_0 quants span the full [-128, 127].
Stored random_stored(DType t, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  Stored w;
  w.bytes.resize(dtype_row_bytes(t, cols) * static_cast<size_t>(rows));
  for (auto& b : w.bytes) b = std::byte(byte(rng));
  const size_t bb = static_cast<size_t>(dtype_info(t).block_bytes);
  for (size_t o = 0; o < w.bytes.size(); o += bb) {
    const uint16_t d = f32_to_fp16(0.05f * val(rng)), m = f32_to_fp16(0.05f * val(rng));
    std::memcpy(w.bytes.data() + o, &d, 2);
    if (t == DType::Q4_1 || t == DType::Q5_1 || t == DType::Q4_K || t == DType::Q5_K)
      std::memcpy(w.bytes.data() + o + 2, &m, 2);  // Q4_K, Q5_K: dmin
    if (t == DType::Q6_K) std::memcpy(w.bytes.data() + o + 208, &d, 2);                     // Q6_K: d is last
    if (t == DType::Q2_K) {                                                                 // Q2_K: d, dmin last
      std::memcpy(w.bytes.data() + o + 80, &d, 2);
      std::memcpy(w.bytes.data() + o + 82, &m, 2);
    }
  }
  w.view = TensorView{"w", t, {rows, cols}, w.bytes.data(), w.bytes.size()};
  return w;
}

// Activations with the spread of real hidden states: mostly N(0, 1), a few large outliers.
std::vector<float> random_x(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> val(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 63);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = val(rng) * (pick(rng) == 0 ? 20.0f : 1.0f);
  return x;
}

using host_kernels::Int8Kernel;

// The stored types the int8 path packs, and whether a type's rows are whole 256-value super-blocks.
constexpr DType kInt8Types[] = {DType::Q4_0, DType::Q4_1, DType::Q5_1, DType::Q8_0, DType::Q4_K,
                                DType::Q5_K, DType::Q6_K, DType::IQ4_XS, DType::Q2_K};
bool k_quant(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::IQ4_XS || t == DType::Q2_K; }

// Every int8 kernel this CPU can run, the portable one first (each reads every packed layout).
std::vector<Int8Kernel> int8_kernels() {
  std::vector<Int8Kernel> v;
  for (Int8Kernel k : {Int8Kernel::kPortable, Int8Kernel::kAvx2, Int8Kernel::kAvxVnni, Int8Kernel::kAvx512Vnni, Int8Kernel::kAmx})
    if (host_kernels::cpu_has_int8_kernel(k)) v.push_back(k);
  return v;
}

std::vector<float> run(const PackedMatrix& m, const std::vector<float>& x, int64_t n, int threads, Int8Kernel isa) {
  ThreadPool pool(threads);
  std::vector<float> y(static_cast<size_t>(n * m.rows), std::nanf(""));
  const PackedMatrix* w = &m;
  float* out = y.data();
  qmatmul({&w, 1}, x.data(), n, {&out, 1}, pool, isa);
  return y;
}

bool bit_equal(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

// n rows of `cols` (768 unless given) sharing two massive channels (column 100, and 700 (the last
// column if fewer) or a column of their own), as a hidden state's rows do: the kernels dequantize a
// shared column once for all the rows.
void add_massive_channels(std::vector<float>& x, int64_t n, int64_t cols = 768) {
  const int64_t shared = std::min<int64_t>(700, cols - 1);
  for (int64_t i = 0; i < n; ++i) {
    x.at(static_cast<size_t>(i * cols + 100)) = 300.0f;
    x.at(static_cast<size_t>(i * cols + (i % 3 ? shared : 20 + i))) = -250.0f;
  }
}

// Each row of an n-row call (n = 1..16; rows first..first+n-1 of `all`, so that each sits at
// another position than alone; one thread and two) bit-equal to the same row called alone.
// call(x, n, threads) returns the [n, rows] outputs; `what` names the case.
template <class Call>
void expect_each_row_equal_to_its_one_row_call(const std::vector<float>& all, int64_t cols, int64_t rows, Call call,
                                               const std::string& what) {
  std::vector<std::vector<float>> single;
  for (int64_t i = 0; i < 16; ++i)
    single.push_back(call(std::vector<float>(all.begin() + i * cols, all.begin() + (i + 1) * cols), 1, 1));
  for (int64_t n = 1; n <= 16; ++n)
    for (int threads : {1, 2}) {
      const int64_t first = (16 - n) / 2;
      const std::vector<float> x(all.begin() + first * cols, all.begin() + (first + n) * cols);
      const auto y = call(x, n, threads);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_TRUE(bit_equal(y[i * rows + r], single[first + i][r]))
              << what << " n=" << n << " threads=" << threads << " row " << i << " out " << r << ": " << y[i * rows + r]
              << " vs " << single[first + i][r];
    }
}

// The row's QuantizedRows::kOutliers largest |x|, ties to the lower column, by a plain sort.
std::vector<int64_t> largest_columns(const float* xr, int64_t cols) {
  std::vector<int64_t> c(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) c[j] = j;
  std::stable_sort(c.begin(), c.end(), [&](int64_t a, int64_t b) { return std::fabs(xr[a]) > std::fabs(xr[b]); });
  c.resize(QuantizedRows::kOutliers);
  return c;
}

// The blocks of x with each row's outliers set to 0, quantized as the header defines.
void expect_quantized_as_defined(const std::vector<float>& x0, int64_t n, int64_t cols, const QuantizedRows& q) {
  std::vector<float> x = x0;
  for (int64_t i = 0; i < n; ++i) {
    const auto top = largest_columns(x0.data() + i * cols, cols);
    for (int k = 0; k < QuantizedRows::kOutliers; ++k) {
      EXPECT_EQ(q.outlier_col[i * QuantizedRows::kOutliers + k], top[k]) << "row " << i;
      EXPECT_TRUE(bit_equal(q.outlier_x[i * QuantizedRows::kOutliers + k], x0[i * cols + top[k]]));
      x[i * cols + top[k]] = 0.0f;
    }
  }
  for (int64_t b = 0; b < n * cols / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
    int32_t sum = 0, sum_lo = 0;
    for (int j = 0; j < 32; ++j) {
      const int want = static_cast<int>(std::clamp(std::nearbyint(x[b * 32 + j] * id), -127.0f, 127.0f));
      ASSERT_EQ(q.q[b * 32 + j], want) << "block " << b << " value " << j;
      sum += want;
      if (j < 16) sum_lo += want;
      EXPECT_LE(std::fabs(x[b * 32 + j] - d * want), 0.5001f * d + 1e-37f);
    }
    EXPECT_TRUE(bit_equal(q.d[b], d));
    EXPECT_EQ(q.isum[b], sum);
    EXPECT_EQ(q.isum_lo[b], sum_lo);
    EXPECT_TRUE(bit_equal(q.sx[b], d * static_cast<float>(sum)));
  }
}

TEST(Int8Activations, EachBlockIsQuantizedAsDefinedWithTheRowsLargestValuesSetAside) {
  constexpr int kOut = QuantizedRows::kOutliers;
  static_assert(kOut >= 2, "the cases below set two values aside in one row");
  const int64_t n = 3, cols = 96;
  auto x = random_x(n, cols, 1);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;  // an all-zero block: d = 0, q = 0
  x[70] = 1e-30f;                              // a tiny block value among others
  x[cols + 5] = 1000.0f;                       // row 1: both outliers in one block
  x[cols + 9] = -900.0f;
  x[2 * cols + 40] = 500.0f;                   // row 2: a tie, the lower column first
  x[2 * cols + 80] = -500.0f;
  QuantizedRows q;
  quantize_rows(x.data(), n, cols, q);
  expect_quantized_as_defined(x, n, cols, q);
  EXPECT_EQ(q.outlier_col[kOut], 5);
  EXPECT_EQ(q.outlier_col[kOut + 1], 9);
  EXPECT_EQ(q.outlier_col[2 * kOut], 40);
  EXPECT_EQ(q.outlier_col[2 * kOut + 1], 80);
  // Ties everywhere (an all-equal row) and a row of zeros: still the lowest columns, in order.
  std::vector<float> flat(2 * cols, 0.25f);
  for (int64_t j = cols; j < 2 * cols; ++j) flat[j] = 0.0f;
  quantize_rows(flat.data(), 2, cols, q);
  expect_quantized_as_defined(flat, 2, cols, q);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < kOut; ++k) EXPECT_EQ(q.outlier_col[i * kOut + k], k) << "row " << i;
}

// A prefill's many rows (quantized on both threads), rows wider than the AVX-512 quantizer's
// 16 blocks at a time, a block whose scale's inverse overflows, and every vector quantizer the
// CPU has called directly on the same rows, given their block maxima:
// all as defined, bit for bit. The shared-column slots: each slot names its outlier's column, and
// an outlier goes without one only when all are taken by other columns.
TEST(Int8Activations, EveryQuantizerAndAPooledCallQuantizeAsDefinedAndSlotTheSharedColumns) {
  ThreadPool pool(2);
  for (int64_t cols : {576, 1536})
    for (int64_t n : {1, 5, 40}) {
      auto x = random_x(n, cols, 70 + static_cast<uint32_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        x[i * cols + 100] = 300.0f;  // a massive channel every row shares, and one most rows share
        if (i % 4) x[i * cols + 500] = -250.0f;
      }
      // A block of denormals whose 1 / d overflows: every x / d is infinite and rounds to +-127
      // (the vector quantizers' unclamped conversion wraps there and each redoes the block clamped).
      for (int64_t j = 160; j < 192; ++j) x[(n - 1) * cols + j] = (j % 3 ? 1e-41f : -1e-41f);
      QuantizedRows q;
      quantize_rows(x.data(), n, cols, q, &pool);
      expect_quantized_as_defined(x, n, cols, q);
      for (size_t o = 0; o < q.outlier_col.size(); ++o) {
        const int32_t slot = q.outlier_slot[o];
        if (slot >= 0) {
          ASSERT_LT(static_cast<size_t>(slot), q.outlier_distinct.size());
          EXPECT_EQ(q.outlier_distinct[static_cast<size_t>(slot)], q.outlier_col[o]);
        } else {
          EXPECT_EQ(q.outlier_distinct.size(), QuantizedRows::kMaxShared);
          EXPECT_EQ(std::find(q.outlier_distinct.begin(), q.outlier_distinct.end(), q.outlier_col[o]), q.outlier_distinct.end());
        }
      }
      EXPECT_EQ(q.outlier_slot[0], 0);  // column 100, first seen in row 0
      using Quantizer = void (*)(const float*, int64_t, int64_t, const int32_t*, const float*, int8_t*, float*, int32_t*, int32_t*,
                                 float*);
      std::vector<std::pair<const char*, Quantizer>> quantizers;
      if (host_kernels::cpu_has_avx2_fma()) quantizers.emplace_back("avx2", &host_kernels::quantize_rows_avx2);
      if (host_kernels::cpu_has_avx512()) quantizers.emplace_back("avx512", &host_kernels::quantize_rows_avx512);
      // Each block's largest |x| with nothing set aside, as quantize_rows hands them to the quantizers.
      std::vector<float> amax(static_cast<size_t>(n * cols / 32), 0.0f);
      for (int64_t j = 0; j < n * cols; ++j) amax[j / 32] = std::max(amax[j / 32], std::fabs(x[j]));
      for (const auto& [name, quantize] : quantizers) {
        QuantizedRows r = q;
        std::fill(r.q.begin(), r.q.end(), int8_t{99});
        quantize(x.data(), n, cols, q.outlier_col.data(), amax.data(), r.q.data(), r.d.data(), r.isum.data(), r.isum_lo.data(),
                 r.sx.data());
        EXPECT_EQ(r.q, q.q) << name << " cols " << cols << " n " << n;
        for (size_t b = 0; b < q.d.size(); ++b) {
          ASSERT_TRUE(bit_equal(r.d[b], q.d[b]) && bit_equal(r.sx[b], q.sx[b])) << name << " block " << b;
          ASSERT_EQ(r.isum[b], q.isum[b]) << name << " block " << b;
          ASSERT_EQ(r.isum_lo[b], q.isum_lo[b]) << name << " block " << b;
        }
      }
      if (n == 40) {
        EXPECT_EQ(q.outlier_distinct.size(), QuantizedRows::kMaxShared);  // more columns than slots
      }
    }
}

// One large value per row takes its block's scale: set aside, the other 31 keep their precision,
// so the product is far closer to the f32 one than with the value inside the block.
TEST(Int8Activations, SettingTheOutliersAsideKeepsTheirBlocksPrecision) {
  const int64_t cols = 576, rows = 64;
  const Stored w = random_stored(DType::Q4_1, rows, cols, 5);
  ThreadPool pool(1);
  auto m = pack_matrix(w.view, pool);
  auto x = random_x(1, cols, 6);
  for (auto& v : x) v = std::clamp(v, -3.0f, 3.0f);
  x[100] = 400.0f;  // one massive activation, as hidden states have
  std::vector<float> ref(rows);
  matmul_reference(w.view, x.data(), 1, ref.data());
  const auto y = run(*m, x, 1, 1, int8_kernels().back());
  // The same values with the outlier inside its block: the block's other values round to 0
  // (400 / 127 = 3.1 > 2 * 3), so their terms are lost.
  QuantizedRows q;
  quantize_rows(x.data(), 1, cols, q);
  std::vector<float> row(cols);
  double err_aside = 0, err_inside = 0;
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(DType::Q4_1, w.view.row(r), row.data(), cols);
    double inside = 0;
    for (int64_t b = 0; b < cols / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float d = amax / 127.0f;
      for (int j = 0; j < 32; ++j) inside += static_cast<double>(row[b * 32 + j]) * d * std::nearbyint(x[b * 32 + j] / d);
    }
    err_aside += std::fabs(y[r] - ref[r]);
    err_inside += std::fabs(inside - ref[r]);
  }
  EXPECT_LT(err_aside, err_inside / 4) << "set aside " << err_aside / rows << ", inside " << err_inside / rows << " per row";
}

// The outliers' terms: the reference dequantizer's weight of each outlier column times its value.
void add_outliers(const TensorView& w, const QuantizedRows& q, std::vector<double>& y) {
  std::vector<float> row(static_cast<size_t>(w.cols()));
  for (int64_t r = 0; r < w.rows(); ++r) {
    dequantize_row(w.dtype, w.row(r), row.data(), w.cols());
    for (int64_t i = 0; i < q.n; ++i)
      for (int k = 0; k < QuantizedRows::kOutliers; ++k) {
        const size_t o = static_cast<size_t>(i * QuantizedRows::kOutliers + k);
        y[i * w.rows() + r] += static_cast<double>(row[q.outlier_col[o]]) * q.outlier_x[o];
      }
  }
}

// y[i, r] in double from the stored blocks and the quantized activations: the definition the
// kernels implement, with none of their layout.
std::vector<double> emulate(const TensorView& w, const QuantizedRows& q) {
  const int64_t rows = w.rows(), cols = w.cols(), nb = cols / 32;
  const size_t bb = static_cast<size_t>(dtype_info(w.dtype).block_bytes);
  std::vector<double> y(static_cast<size_t>(q.n * rows));
  if (w.dtype == DType::Q4_K || w.dtype == DType::Q5_K || w.dtype == DType::Q6_K || w.dtype == DType::Q5_1 ||
      w.dtype == DType::IQ4_XS || w.dtype == DType::Q2_K) {
    // The reference dequantizer's values (Q2_K, Q4_K, Q5_K: d * sc * q - dmin * m; Q6_K: d * sc * (q -
    // 32); Q5_1: d * q + m; IQ4_XS: d * (ls - 32) * level) against the int8 activations.
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(w.dtype, w.row(r), row.data(), cols);
      for (int64_t i = 0; i < q.n; ++i) {
        double acc = 0;
        for (int64_t j = 0; j < cols; ++j) acc += static_cast<double>(row[j]) * q.d[i * nb + j / 32] * q.qrow(i)[j];
        y[i * rows + r] = acc;
      }
    }
    add_outliers(w, q, y);
    return y;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < q.n; ++i) {
      double acc = 0;
      for (int64_t b = 0; b < nb; ++b) {
        const auto* blk = reinterpret_cast<const uint8_t*>(w.row(r)) + b * bb;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        const double dw = fp16_to_f32(h);
        const int8_t* xq = q.qrow(i) + b * 32;
        double dot = 0, mterm = 0;
        if (w.dtype == DType::Q8_0) {
          for (int j = 0; j < 32; ++j) dot += static_cast<int8_t>(blk[2 + j]) * xq[j];
        } else {
          const uint8_t* qs = blk + (w.dtype == DType::Q4_1 ? 4 : 2);
          const int off = w.dtype == DType::Q4_0 ? 8 : 0;
          for (int j = 0; j < 16; ++j) dot += ((qs[j] & 15) - off) * xq[j] + ((qs[j] >> 4) - off) * xq[16 + j];
          if (w.dtype == DType::Q4_1) {
            std::memcpy(&h, blk + 2, 2);
            mterm = fp16_to_f32(h) * static_cast<double>(q.d[i * nb + b]) * q.isum[i * nb + b];
          }
        }
        acc += dw * q.d[i * nb + b] * dot + mterm;
      }
      y[i * rows + r] = acc;
    }
  add_outliers(w, q, y);
  return y;
}

// Every int8 kernel the CPU has, on two threads, over the n rows x ([n, w.cols]) against the
// definition computed in double (emulate): the f32 accumulation of 18-48 block terms, a few ulps of
// the terms' magnitude.
void expect_every_kernel_to_give_the_definition(const PackedMatrix& m, const TensorView& w, const std::vector<float>& x, int64_t n) {
  const int64_t rows = w.rows(), cols = w.cols();
  QuantizedRows q;
  quantize_rows(x.data(), n, cols, q);
  const auto want = emulate(w, q);
  for (Int8Kernel isa : int8_kernels()) {
    const std::string label = std::string(dtype_name(w.dtype)) + " " + host_kernels::int8_kernel_name(isa) + " n=" + std::to_string(n);
    const auto y = run(m, x, n, 2, isa);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      double mag = 0;
      for (int64_t j = 0; j < cols; ++j) mag += std::fabs(x[i * cols + j]) * 0.05 * 128;
      for (int64_t r = 0; r < rows; ++r) {
        const double got = y[i * rows + r], ref = want[i * rows + r];
        if (!(std::fabs(got - ref) <= 1e-6 * mag) && ++bad <= 3)
          ADD_FAILURE() << label << " y[" << i << "," << r << "] = " << got << ", definition " << ref;
      }
    }
    EXPECT_EQ(bad, 0) << label;
  }
}

TEST(Int8Kernels, EveryTypeAndPathMatchesTheDefinitionComputedInDouble) {
  for (DType t : kInt8Types)
    for (int64_t rows : {8, 37}) {
      const int64_t cols = k_quant(t) ? 768 : 576;
      const Stored w = random_stored(t, rows, cols, 10 + static_cast<uint32_t>(t));
      ThreadPool pool(2);
      auto m = pack_matrix(w.view, pool);
      for (int64_t n : {1, 5, 16}) {
        expect_every_kernel_to_give_the_definition(*m, w.view, random_x(n, cols, 20 + static_cast<uint32_t>(n)), n);
      }
    }
}

// The kernels that leave the outliers' terms to a pass after them (portable, and AVX2 and AVX-VNNI
// past six rows) run kernel and pass over 128 KiB of weights at a time within a thread's chunk: a
// matrix of several such pieces a thread (Q8_0 and Q4_1 at 1,024 x 576 are 627 and 369 KB) must get
// every piece's terms, on every path, as the definition does (1 and 3 rows: the 256-bit kernels add
// them in their tiles).
TEST(Int8Kernels, AMatrixOfManyOutlierPassPiecesGetsTheOutliersTermsOnEveryPiece) {
  for (DType t : {DType::Q8_0, DType::Q4_1}) {
    const int64_t rows = 1024, cols = 576;
    const Stored w = random_stored(t, rows, cols, 95 + static_cast<uint32_t>(t));
    ThreadPool pool(2);
    auto m = pack_matrix(w.view, pool);
    for (int64_t n : {1, 3, 7}) {
      auto x = random_x(n, cols, 96 + static_cast<uint32_t>(n));
      add_massive_channels(x, n, cols);
      expect_every_kernel_to_give_the_definition(*m, w.view, x, n);
    }
  }
}

// The AVX2 kernel reads a call's rows wide where they fit the L1 beside a group of weights: the
// default model's 576-column matrices at 2-5 rows, never its 1,536-column one (2 rows there are
// 30 KiB of wide rows, and measured slower than broadcasts), and never past the 30 KiB copy each
// thread keeps (many rows of a narrow matrix).
TEST(Int8Kernels, WideRowsAreReadWhereTheyFitTheL1BesideAGroupOfWeights) {
  EXPECT_FALSE(host_kernels::wide_rows_pay(1, 576));
  for (int64_t n = 2; n <= 5; ++n) EXPECT_TRUE(host_kernels::wide_rows_pay(n, 576)) << n;
  EXPECT_FALSE(host_kernels::wide_rows_pay(6, 576));
  EXPECT_FALSE(host_kernels::wide_rows_pay(2, 1536));
  EXPECT_TRUE(host_kernels::wide_rows_pay(96, 32));  // 30,720 bytes: the copy's size
  EXPECT_FALSE(host_kernels::wide_rows_pay(97, 32));
}

// The 256-bit kernels (AVX2 and AVX-VNNI) add the outliers' terms in their tiles for calls of 1 to
// 6 rows of the four-bit types without fifth bits and Q8_0 (decode steps and verify rounds of up to
// five drafts), and qmatmul then runs no pass after them; past 6 rows, for the other types and on
// the portable kernel the pass runs; the AVX-512 VNNI and AMX kernels always add them themselves.
// (The bits are the pass's either way: the tests above and below compare every path.)
TEST(Int8Kernels, TheTwoHundredFiftySixBitKernelsAddTheOutliersTermsInTheirTilesForUpToSixRowsOfTheTypesTheyFold) {
  using host_kernels::kernel_adds_outliers;
  for (Int8Kernel k : {Int8Kernel::kAvx2, Int8Kernel::kAvxVnni}) {
    const char* name = host_kernels::int8_kernel_name(k);
    for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q8_0}) {
      for (int64_t n = 1; n <= 6; ++n) EXPECT_TRUE(kernel_adds_outliers(k, t, n)) << name << " " << dtype_name(t) << " " << n;
      EXPECT_FALSE(kernel_adds_outliers(k, t, 7)) << name << " " << dtype_name(t);
    }
    for (DType t : {DType::Q5_0, DType::Q5_1, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::Q2_K})
      EXPECT_FALSE(kernel_adds_outliers(k, t, 1)) << name << " " << dtype_name(t);
  }
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q8_0}) {
    EXPECT_FALSE(kernel_adds_outliers(Int8Kernel::kPortable, t, 1)) << dtype_name(t);
    EXPECT_TRUE(kernel_adds_outliers(Int8Kernel::kAvx512Vnni, t, 40)) << dtype_name(t);
  }
}

// Two widths: at 576 columns (the default model's) the AVX2 kernel takes 2 to 5 rows from wide
// activations (host_kernels::wide_rows_pay), at 1536 from broadcasts, and one row runs its
// holding tile; the AVX-VNNI kernel holds up to 4 rows and streams 5 and more (in tiles of six
// where the rows are sixes and fives). Both add the outliers' terms in their tiles up to 6 rows.
// Every row must come out the same either way.
TEST(Int8Kernels, EachRowIsBitEqualToTheOneRowCallWhateverTheRowCountPositionOrThreads) {
  for (const int64_t cols : {1536, 576})
  for (DType t : kInt8Types) {
    if (cols % 256 != 0 && k_quant(t)) continue;  // K-quants: rows of whole super-blocks
    const int64_t rows = 43;
    const Stored w = random_stored(t, rows, cols, 30 + static_cast<uint32_t>(t));
    ThreadPool pool(1);
    auto m = pack_matrix(w.view, pool);
    const auto all = random_x(16, cols, 40);
    for (Int8Kernel isa : int8_kernels())
      expect_each_row_equal_to_its_one_row_call(
          all, cols, rows, [&](const std::vector<float>& x, int64_t n, int threads) { return run(*m, x, n, threads, isa); },
          std::string(dtype_name(t)) + " " + host_kernels::int8_kernel_name(isa));
  }
}

// Past 16 rows (prefill, batched rounds) the 512-bit kernel runs several passes of up to 9 rows
// and the AMX kernel hands the call to AVX-512 VNNI, and on two threads the call's last groups go
// in tail pieces (200 outputs are 25 groups: on the 512-bit kernels chunks of 4 and 5 pairs, then
// three pieces of a pair and a lone group; on the others 10 and 11 groups and four pieces of one).
// From 32 rows the AVX2 kernel's four-bit types run the lane kernel (40 rows: one pass of 32 and 8
// rows on the streaming tile; 48: passes of 32 and 16). Every row of a 17-, 31-, 40- or 48-row call
// still equals its 1-row call.
TEST(Int8Kernels, EachRowOfACallPastSixteenRowsIsBitEqualToTheOneRowCall) {
  for (DType t : kInt8Types) {
    // 576 columns (the default model's width) where the type allows, else whole super-blocks.
    const int64_t rows = 200, c = k_quant(t) ? 768 : 576;
    const Stored w = random_stored(t, rows, c, 70 + static_cast<uint32_t>(t));
    ThreadPool pool(1);
    auto m = pack_matrix(w.view, pool);
    const auto all = random_x(48, c, 80);
    for (Int8Kernel isa : int8_kernels()) {
      std::vector<std::vector<float>> single;  // each row alone
      for (int64_t i = 0; i < 48; ++i)
        single.push_back(run(*m, std::vector<float>(all.begin() + i * c, all.begin() + (i + 1) * c), 1, 1, isa));
      for (int64_t n : {17, 31, 40, 48}) {
        const std::vector<float> x(all.begin(), all.begin() + n * c);
        const auto y = run(*m, x, n, 2, isa);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_TRUE(bit_equal(y[i * rows + r], single[i][r]))
                << dtype_name(t) << " " << host_kernels::int8_kernel_name(isa) << " n=" << n << " row " << i << " out " << r;
      }
    }
  }
}

// 50 rows are 7 groups: the 512-bit kernels run three pairs and a lone last group with padding
// rows, and two threads split the groups (at an odd boundary for the kernels that take groups one
// at a time; the 512-bit kernels' grain is a pair).
TEST(Int8Kernels, EveryVectorKernelTheCpuHasAgreesWithThePortableKernelBitForBit) {
  const auto kernels = int8_kernels();
  if (kernels.size() == 1) GTEST_SKIP() << "this CPU has no AVX2+FMA+F16C: only the portable kernels run here";
  for (DType t : kInt8Types)
    for (int64_t rows : {50, 64, 8}) {
      const Stored w = random_stored(t, rows, 768, 50 + static_cast<uint32_t>(t));
      ThreadPool pool(1);
      auto m = pack_matrix(w.view, pool);
      for (int64_t n : {1, 2, 3, 5, 6, 7, 12, 13, 16, 23, 40, 48})  // AVX2: 2, 3 wide; 6, 12, 16, 23 with tiles of six; 40, 48 lanes
        for (bool massive : {false, true}) {
          // Random rows have outliers of their own (the pass goes row by row); rows with massive
          // channels share them (column by column, once for all rows), some rows with a third.
          auto x = random_x(n, 768, 60);
          if (massive) add_massive_channels(x, n);
          const auto want = run(*m, x, n, 2, Int8Kernel::kPortable);
          for (size_t k = 1; k < kernels.size(); ++k) {
            const auto got = run(*m, x, n, 2, kernels[k]);
            for (size_t j = 0; j < got.size(); ++j)
              ASSERT_TRUE(bit_equal(got[j], want[j])) << dtype_name(t) << " " << host_kernels::int8_kernel_name(kernels[k]) << " rows "
                                                      << rows << " n " << n << (massive ? " massive" : "") << " at " << j << ": "
                                                      << got[j] << " vs " << want[j];
          }
        }
    }
  std::string ran;
  for (Int8Kernel k : kernels) ran += std::string(" ") + host_kernels::int8_kernel_name(k);
  RecordProperty("kernels", ran);
}

// A stored Q5_0, IQ4_NL or Q3_K matrix (a Q4_K_M, Q3_K_M or Q2_K file's) is packed straight from
// the file, a group-block at a time through its exact Q8_0 or Q6_K conversion: without `narrow` into
// the very bytes its converted copy packs to, with it in five bits (176 bytes a group-block against
// Q8_0's 272), as the levels' 4-bit indices (144) or as 3-bit nibbles under Q6_K's header (160
// against 288), which every kernel reads. Each gives its conversion's results bit
// for bit: every quant value, rows with outliers of their own and rows sharing massive channels, a
// lone last group, 1 to 40 rows, two threads.
TEST(Int8Kernels, AQ5_0IQ4_NLOrQ3_KMatrixPackedFromTheFileGivesItsConversionsBits) {
  struct Case {
    DType t;
    size_t narrow_bytes;
    int64_t cols;
  };
  for (const Case c : {Case{DType::Q5_0, 176, 768}, Case{DType::IQ4_NL, 144, 768}, Case{DType::Q3_K, 160, 768}})
    for (int64_t rows : {50, 8}) {
      SCOPED_TRACE(std::string(dtype_name(c.t)) + " rows " + std::to_string(rows));
      Stored w = random_stored(c.t, rows, c.cols, 71);
      if (c.t == DType::Q3_K)  // d is last
        for (size_t o = 0; o < w.bytes.size(); o += 110) {
          const uint16_t d = f32_to_fp16(0.002f * static_cast<float>(o % 7 + 1));
          std::memcpy(w.bytes.data() + o + 108, &d, 2);
        }
      std::vector<std::shared_ptr<const void>> storage;
      const TensorView conv = kernel_view(w.view, storage);
      ThreadPool pool(2);
      const auto mc = pack_matrix(conv, pool);
      const auto wide = pack_matrix(w.view, pool);
      const auto narrow = pack_matrix(w.view, pool, nullptr, true);
      ASSERT_EQ(wide->dtype, kernel_dtype(c.t));
      EXPECT_EQ(wide->stored, c.t);
      ASSERT_EQ(wide->bytes(), mc->bytes());
      EXPECT_EQ(std::memcmp(wide->data.get(), mc->data.get(), mc->bytes()), 0);
      ASSERT_EQ(narrow->dtype, c.t);
      EXPECT_EQ(narrow->stored, c.t);
      EXPECT_EQ(narrow->block_bytes, c.narrow_bytes);
      for (int64_t n : {1, 2, 3, 5, 9, 13, 16, 17, 40})
        for (bool massive : {false, true}) {
          auto x = random_x(n, c.cols, 73);
          if (massive) add_massive_channels(x, n, c.cols);
          const auto want = run(*mc, x, n, 2, Int8Kernel::kPortable);
          for (Int8Kernel k : int8_kernels()) {
            const auto got = run(*narrow, x, n, 2, k);
            for (size_t j = 0; j < got.size(); ++j)
              ASSERT_TRUE(bit_equal(got[j], want[j])) << host_kernels::int8_kernel_name(k) << " n " << n << (massive ? " massive" : "")
                                                      << " at " << j << ": " << got[j] << " vs " << want[j];
          }
        }
    }
}

TEST(Int8Kernels, Q8WeightsAtTheEndsOfTheirRangeGiveTheExactIntegerSumOnEveryKernel) {
  const int64_t rows = 16, cols = 64;
  Stored w = random_stored(DType::Q8_0, rows, cols, 55);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < 2; ++b) {
      auto* blk = reinterpret_cast<uint8_t*>(w.bytes.data()) + r * 68 + b * 34;
      const uint16_t one = f32_to_fp16(1.0f);
      std::memcpy(blk, &one, 2);
      for (int j = 0; j < 32; ++j) blk[2 + j] = static_cast<uint8_t>((r + j) % 2 ? 0x80 : 0x7F);
    }
  ThreadPool pool(1);
  auto m = pack_matrix(w.view, pool);
  std::vector<float> x(cols);
  for (int64_t j = 0; j < cols; ++j) x[j] = j % 3 ? 1.0f : -1.0f;  // quantized to +-127, d = 1/127
  for (Int8Kernel k : int8_kernels()) {
    const auto y = run(*m, x, 1, 1, k);
    for (int64_t r = 0; r < rows; ++r) {
      double want = 0;
      for (int64_t j = 0; j < cols; ++j) want += ((r + j % 32) % 2 ? -128.0 : 127.0) * (j % 3 ? 127.0 : -127.0);
      EXPECT_NEAR(y[r], want / 127.0, 1e-3) << host_kernels::int8_kernel_name(k) << " row " << r;
    }
  }
}

// The first matrix has an odd number of groups (73), so the later ones start on an odd group and
// the 512-bit kernels pair their groups differently than alone; at 16 rows the call's last groups
// go in tail pieces.
TEST(Int8Kernels, AFusedCallEqualsSeparateCallsBitForBit) {
  const int64_t cols = 576;
  const Stored q = random_stored(DType::Q4_1, 584, cols, 70), k = random_stored(DType::Q4_1, 192, cols, 71),
               v = random_stored(DType::Q8_0, 200, cols, 72);
  ThreadPool pool(2);
  auto pq = pack_matrix(q.view, pool), pk = pack_matrix(k.view, pool), pv = pack_matrix(v.view, pool);
  for (int64_t n : {6, 16}) {
    const auto x = random_x(n, cols, 73);
    for (Int8Kernel isa : int8_kernels()) {
      std::vector<float> yq(static_cast<size_t>(n * 584)), yk(static_cast<size_t>(n * 192)), yv(static_cast<size_t>(n * 200));
      const PackedMatrix* ws[] = {pq.get(), pk.get(), pv.get()};
      float* ys[] = {yq.data(), yk.data(), yv.data()};
      qmatmul(ws, x.data(), n, ys, pool, isa);
      const auto sq = run(*pq, x, n, 2, isa), sk = run(*pk, x, n, 2, isa), sv = run(*pv, x, n, 2, isa);
      const std::string at = std::string(host_kernels::int8_kernel_name(isa)) + " n=" + std::to_string(n);
      for (size_t j = 0; j < yq.size(); ++j) ASSERT_TRUE(bit_equal(yq[j], sq[j])) << at << " q " << j;
      for (size_t j = 0; j < yk.size(); ++j) ASSERT_TRUE(bit_equal(yk[j], sk[j])) << at << " k " << j;
      for (size_t j = 0; j < yv.size(); ++j) ASSERT_TRUE(bit_equal(yv[j], sv[j])) << at << " v " << j;
    }
  }
}

std::vector<float> run_refined(const PackedMatrix& m, const std::vector<float>& x, int64_t n, int threads, Int8Kernel isa) {
  ThreadPool pool(threads);
  std::vector<float> y(static_cast<size_t>(n * m.rows), std::nanf(""));
  qmatmul_refined(m, x.data(), n, y.data(), pool, isa);
  return y;
}

// The fast path's error against f32 activations is the activation rounding: per block at most
// d_x / 2 per value, so |y_fast - y_f32| <= sum_b (d_xb / 2) * sum_j |w_j| (plus f32 rounding).
// The refined product's (qmatmul_refined) is its residual's rounding: the same bound with the
// residual's scales, d_r <= d_x / 254, which the plain product breaks at most outputs (so the
// bound tells them apart); its worst error is under a twentieth of the plain one's.
TEST(Int8Kernels, TheFastPathStaysWithinTheActivationRoundingOfTheF32ReferenceAndTheRefinedOneWithinItsResiduals) {
  for (DType t : kInt8Types) {
    const int64_t rows = 24, cols = k_quant(t) ? 768 : 576, n = 3;
    const Stored w = random_stored(t, rows, cols, 80 + static_cast<uint32_t>(t));
    ThreadPool pool(2);
    auto m = pack_matrix(w.view, pool);
    const auto x = random_x(n, cols, 81);
    QuantizedRows q;
    quantize_rows(x.data(), n, cols, q);
    std::vector<float> ref(n * rows), row(cols);
    matmul_reference(w.view, x.data(), n, ref.data());
    const auto y = run(*m, x, n, 2, int8_kernels().back());
    QuantizedRows qr;
    std::vector<float> res(x.size());
    residual_rows(x.data(), q, res.data());
    quantize_rows(res.data(), n, cols, qr);
    const auto refined = run_refined(*m, x, n, 2, int8_kernels().back());
    double worst = 0, worst_refined = 0;
    int plain_outside = 0;
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t, w.view.row(r), row.data(), cols);
      for (int64_t i = 0; i < n; ++i) {
        double bound = 0, bound_refined = 0, mag = 0;
        for (int64_t j = 0; j < cols; ++j) {
          bound += q.d[i * (cols / 32) + j / 32] / 2 * std::fabs(row[j]);
          bound_refined += qr.d[i * (cols / 32) + j / 32] / 2 * std::fabs(row[j]);
          mag += std::fabs(row[j] * x[i * cols + j]);
        }
        const size_t at = static_cast<size_t>(i * rows + r);
        EXPECT_LE(std::fabs(y[at] - ref[at]), bound * 1.001 + 1e-5 * mag) << dtype_name(t) << " " << i << "," << r;
        EXPECT_LE(std::fabs(refined[at] - ref[at]), bound_refined * 1.001 + 1e-5 * mag) << dtype_name(t) << " " << i << "," << r;
        plain_outside += std::fabs(y[at] - ref[at]) > bound_refined * 1.001 + 1e-5 * mag;
        worst = std::max(worst, std::fabs(double(y[at]) - ref[at]));
        worst_refined = std::max(worst_refined, std::fabs(double(refined[at]) - ref[at]));
      }
    }
    EXPECT_GT(plain_outside, rows * n / 2) << dtype_name(t);
    EXPECT_LT(worst_refined, worst / 20) << dtype_name(t);
  }
}

// qmatmul_refined (the last layer's down projection) is, bit for bit, the product of the rows
// plus the product of their residuals, each an ordinary int8 call; so it inherits the kernels'
// agreement with one another. Every type and kernel, at row counts that fit one pass of the
// 512-bit tiles and that take two (2n > 9); and each row against its own 1-row call.
TEST(RefinedInt8Products, EqualTheProductOfTheRowsPlusTheProductOfTheirResidualsBitForBit) {
  for (DType t : kInt8Types) {
    const int64_t rows = 50, cols = k_quant(t) ? 768 : 576;
    const Stored w = random_stored(t, rows, cols, 90 + static_cast<uint32_t>(t));
    ThreadPool pool(1);
    auto m = pack_matrix(w.view, pool);
    const auto all = random_x(16, cols, 91);
    for (Int8Kernel isa : int8_kernels()) {
      for (int64_t n : {1, 2, 5, 9, 16}) {
        const std::vector<float> x(all.begin(), all.begin() + n * cols);
        QuantizedRows first;
        quantize_rows(x.data(), n, cols, first);
        std::vector<float> r(x.size());
        residual_rows(x.data(), first, r.data());
        const auto yx = run(*m, x, n, 2, isa), yr = run(*m, r, n, 2, isa), y = run_refined(*m, x, n, 2, isa);
        for (size_t j = 0; j < y.size(); ++j)
          ASSERT_TRUE(bit_equal(y[j], yx[j] + yr[j])) << dtype_name(t) << " " << host_kernels::int8_kernel_name(isa) << " n=" << n;
      }
      expect_each_row_equal_to_its_one_row_call(
          all, cols, rows, [&](const std::vector<float>& x, int64_t n, int threads) { return run_refined(*m, x, n, threads, isa); },
          std::string("refined ") + dtype_name(t) + " " + host_kernels::int8_kernel_name(isa));
    }
  }
}

TEST(RefinedInt8Products, TheResidualIsWhatTheRoundingLeftAndZeroAtTheSetAsideValues) {
  const int64_t n = 3, cols = 576;
  const auto x = random_x(n, cols, 92);
  QuantizedRows q;
  quantize_rows(x.data(), n, cols, q);
  std::vector<float> r(x.size());
  residual_rows(x.data(), q, r.data());
  for (int64_t i = 0; i < n; ++i) {
    const auto aside = largest_columns(x.data() + i * cols, cols);
    for (int64_t j = 0; j < cols; ++j) {
      const size_t at = static_cast<size_t>(i * cols + j);
      const float d = q.d[static_cast<size_t>(i * (cols / 32) + j / 32)];
      if (std::find(aside.begin(), aside.end(), j) != aside.end()) {
        EXPECT_EQ(r[at], 0.0f) << i << "," << j;
      } else {
        EXPECT_EQ(r[at], x[at] - d * static_cast<float>(q.q[at])) << i << "," << j;
        EXPECT_LE(std::fabs(r[at]), d / 2 * 1.0001f) << i << "," << j;  // rounded to nearest
      }
    }
  }
}

std::vector<float> run_logits(const PackedMatrix& m, const TensorView& stored, const std::vector<float>& x, int64_t n,
                              int threads, Int8Kernel isa) {
  ThreadPool pool(threads);
  std::vector<float> y(static_cast<size_t>(n * m.rows), std::nanf(""));
  qmatmul_logits(m, stored, x.data(), n, y.data(), pool, isa);
  return y;
}

// The output head's product: in each row the outputs within kLogitMargin of the row's largest
// int8 product are the f32 product of the stored row (within f32 rounding of the exact sum, and
// far closer to it than the int8 product was), the others stay the int8 products bit for bit.
TEST(OutputHeadLogits, TheLogitsNearTheRowsLargestAreTheF32ProductsAndTheOthersTheInt8Ones) {
  for (DType t : {DType::Q8_0, DType::Q4_1, DType::Q6_K}) {
    const int64_t rows = 300, cols = t == DType::Q6_K ? 768 : 576, n = 4;
    const Stored w = random_stored(t, rows, cols, 100 + static_cast<uint32_t>(t));
    ThreadPool pool(1);
    auto m = pack_matrix(w.view, pool);
    auto x = random_x(n, cols, 101);
    for (float& v : x) v *= t == DType::Q6_K ? 0.0008f : 0.1f;  // logits a few units apart, as a model's top ones are
    std::vector<float> row(cols), buf(cols);
    for (Int8Kernel isa : int8_kernels()) {
      const auto plain = run(*m, x, n, 2, isa);
      const auto y = run_logits(*m, w.view, x, n, 2, isa);
      int64_t near = 0, closer = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float* p = plain.data() + i * rows;
        const float largest = *std::max_element(p, p + rows);
        std::vector<int64_t> taken;  // within the margin, the largest kLogitCap, ties to the lower index
        for (int64_t o = 0; o < rows; ++o)
          if (p[o] >= largest - kLogitMargin) taken.push_back(o);
        std::stable_sort(taken.begin(), taken.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
        if (static_cast<int64_t>(taken.size()) > kLogitCap) taken.resize(static_cast<size_t>(kLogitCap));
        for (int64_t o = 0; o < rows; ++o) {
          const size_t at = static_cast<size_t>(i * rows + o);
          if (std::find(taken.begin(), taken.end(), o) == taken.end()) {
            ASSERT_TRUE(bit_equal(y[at], plain[at])) << dtype_name(t) << " row " << i << " out " << o;
            continue;
          }
          ++near;
          ASSERT_TRUE(bit_equal(y[at], stored_row_dot(w.view, o, x.data() + i * cols, buf.data()))) << dtype_name(t) << " row " << i << " out " << o;
          dequantize_row(t, w.view.row(o), row.data(), cols);
          double exact = 0, mag = 0;
          for (int64_t j = 0; j < cols; ++j) {
            exact += double(row[j]) * x[i * cols + j];
            mag += std::fabs(double(row[j]) * x[i * cols + j]);
          }
          EXPECT_NEAR(y[at], exact, 1e-5 * mag) << dtype_name(t) << " row " << i << " out " << o;
          closer += std::fabs(y[at] - exact) * 10 < std::fabs(plain[at] - exact);
        }
      }
      // Several outputs a row are near the top, and the f32 ones are closer where computed.
      EXPECT_GT(near, 2 * n) << dtype_name(t);
      EXPECT_GT(closer, near / 2) << dtype_name(t);
    }
  }
}

TEST(OutputHeadLogits, EachRowIsBitEqualToTheOneRowCallWhateverTheRowCountOrThreads) {
  for (DType t : {DType::Q8_0, DType::Q4_1}) {
    const int64_t rows = 200, cols = 576;
    const Stored w = random_stored(t, rows, cols, 110 + static_cast<uint32_t>(t));
    ThreadPool pool(1);
    auto m = pack_matrix(w.view, pool);
    auto all = random_x(16, cols, 111);
    for (float& v : all) v *= 0.1f;  // several logits a row within the margin
    for (Int8Kernel isa : int8_kernels())
      expect_each_row_equal_to_its_one_row_call(
          all, cols, rows,
          [&](const std::vector<float>& x, int64_t n, int threads) { return run_logits(*m, w.view, x, n, threads, isa); },
          std::string(dtype_name(t)) + " " + host_kernels::int8_kernel_name(isa));
  }
}

// A row whose outputs are all equal (every weight row the same) has all of them within the
// margin: the first kLogitCap by index are computed again, no more.
TEST(OutputHeadLogits, AtMostTheCapAreComputedAgainTheLargestFirstAndTiesToTheLowerIndex) {
  const int64_t rows = 200, cols = 576;
  Stored w = random_stored(DType::Q8_0, rows, cols, 120);
  const size_t row_bytes = dtype_row_bytes(DType::Q8_0, cols);
  for (int64_t r = 1; r < rows; ++r) std::memcpy(w.bytes.data() + r * row_bytes, w.bytes.data(), row_bytes);
  ThreadPool pool(1);
  auto m = pack_matrix(w.view, pool);
  const auto x = random_x(1, cols, 121);
  std::vector<float> buf(cols);
  const float f32 = stored_row_dot(w.view, 0, x.data(), buf.data());
  for (Int8Kernel isa : int8_kernels()) {
    const auto plain = run(*m, x, 1, 1, isa);
    ASSERT_FALSE(bit_equal(plain[0], f32)) << "the test needs the two products to differ";
    const auto y = run_logits(*m, w.view, x, 1, 1, isa);
    for (int64_t o = 0; o < rows; ++o)
      ASSERT_TRUE(bit_equal(y[o], o < kLogitCap ? f32 : plain[o])) << host_kernels::int8_kernel_name(isa) << " out " << o;
  }
  // One output raised a little above the tied rest (one weight of the last row one step, the
  // way that adds to its product): it is the largest, so it is taken first, then the first
  // kLogitCap - 1 of the rest by index.
  int64_t j = 0;
  while (x[j] < 0.5f) ++j;
  uint8_t* blk = reinterpret_cast<uint8_t*>(w.bytes.data()) + (rows - 1) * row_bytes + (j / 32) * 34;
  uint16_t h;
  std::memcpy(&h, blk, 2);
  auto* q = reinterpret_cast<int8_t*>(blk + 2 + j % 32);
  *q = static_cast<int8_t>(*q + (fp16_to_f32(h) > 0 ? (*q < 127 ? 1 : 0) : (*q > -128 ? -1 : 0)));
  auto m2 = pack_matrix(w.view, pool);
  const float raised = stored_row_dot(w.view, rows - 1, x.data(), buf.data());
  for (Int8Kernel isa : int8_kernels()) {
    const auto plain = run(*m2, x, 1, 1, isa);
    ASSERT_GT(plain[rows - 1], plain[0]);
    ASSERT_LT(plain[rows - 1], plain[0] + kLogitMargin);
    const auto y = run_logits(*m2, w.view, x, 1, 1, isa);
    ASSERT_TRUE(bit_equal(y[rows - 1], raised));
    for (int64_t o = 0; o + 1 < rows; ++o)
      ASSERT_TRUE(bit_equal(y[o], o < kLogitCap - 1 ? f32 : plain[o])) << host_kernels::int8_kernel_name(isa) << " out " << o;
  }
}

// The head's vector scans against the scalar loops they replace: the largest with NaNs skipped,
// then every index at or above the floor, in order; lengths around the 8- and 32-value steps,
// NaNs and infinities anywhere, values exactly at the floor, rows with no number at all.
TEST(OutputHeadLogits, TheVectorScansFindTheScalarLoopsLargestAndIndicesWithNaNsInfinitiesAndTiesAtTheFloor) {
  if (!host_kernels::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2 path";
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(140);
  std::uniform_real_distribution<float> u(-10.0f, 10.0f);
  for (int64_t n : {0, 1, 7, 8, 9, 31, 32, 33, 63, 100, 300, 1000}) {
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> y(static_cast<size_t>(n));
      for (float& v : y) v = std::round(u(rng) * 4) / 4;  // quarters: many values exactly at the floor
      for (int64_t o = 0; o < n; ++o) {
        if (kind == 1 && o % 5 == 2) y[o] = nan;
        if (kind == 2 && o % 11 == 3) y[o] = o % 2 ? -inf : nan;
        if (kind == 3) y[o] = nan;                          // no number: the largest is -inf
        if (kind == 4 && o == n - 1) y[o] = 50.0f;          // the largest in the scalar tail
      }
      if (kind == 5 && n > 0) {  // a lone largest, then NaNs in its lane one and four vectors on
        const int64_t p = n / 3;
        y[p] = 50.0f;
        for (int64_t o : {p + 8, p + 32, p + 40})
          if (o < n) y[o] = nan;
      }
      float largest = -inf;
      for (float v : y) largest = v > largest ? v : largest;
      ASSERT_TRUE(bit_equal(host_kernels::logits_max_avx2(y.data(), n), largest)) << "n " << n << " kind " << kind;
      for (float floor : {largest - kLogitMargin, largest, -inf, 0.0f}) {
        std::vector<int64_t> want, got(static_cast<size_t>(n) + 1);
        for (int64_t o = 0; o < n; ++o)
          if (y[o] >= floor) want.push_back(o);
        got.resize(static_cast<size_t>(host_kernels::logits_at_least_avx2(y.data(), n, floor, got.data())));
        ASSERT_EQ(got, want) << "n " << n << " kind " << kind << " floor " << floor;
      }
    }
  }
}

TEST(OutputHeadLogits, AStoredMatrixOtherThanThePackedOneIsRefused) {
  const Stored w = random_stored(DType::Q8_0, 16, 64, 130), other = random_stored(DType::Q8_0, 8, 64, 131);
  ThreadPool pool(1);
  auto m = pack_matrix(w.view, pool);
  std::vector<float> x(64, 1.0f), y(16);
  EXPECT_THROW(qmatmul_logits(*m, other.view, x.data(), 1, y.data(), pool, Int8Kernel::kPortable), std::invalid_argument);
}

TEST(HostPath, SpeculaSimdNamesAPathAndABadOrMissingOneIsOneClearError) {
  const bool avx2 = host_kernels::cpu_has_avx2_fma(), avx512 = host_kernels::cpu_has_avx512();
  const Isa widest = avx512 ? Isa::kAvx512 : avx2 ? Isa::kAvx2 : Isa::kPortable;
  EXPECT_EQ(host_kernels::host_path_for(nullptr).isa, widest);
  EXPECT_FALSE(host_kernels::host_path_for(nullptr).reference);
  EXPECT_FALSE(host_kernels::host_path_for("").reference);
  EXPECT_TRUE(host_kernels::host_path_for("reference").reference);
  EXPECT_EQ(host_kernels::host_path_for("reference").isa, widest);
  EXPECT_EQ(host_kernels::host_path_for("portable").isa, Isa::kPortable);
  EXPECT_TRUE(host_kernels::host_path_for("reference-portable").reference);
  try {
    host_kernels::host_path_for("avx9");
    ADD_FAILURE() << "an unknown path was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("SPECULA_SIMD=avx9: not a host path"), std::string::npos) << e.what();
  }
  if (!avx512) {
    try {
      host_kernels::host_path_for("avx512");
      ADD_FAILURE() << "avx512 was accepted on a CPU without it";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("this CPU has no AVX-512"), std::string::npos) << e.what();
    }
  } else {
    EXPECT_EQ(host_kernels::host_path_for("avx512").isa, Isa::kAvx512);
  }
  if (avx2) {
    EXPECT_EQ(host_kernels::host_path_for("avx2").isa, Isa::kAvx2);
  }
}

TEST(HostPath, TheInt8PathRunsTheWidestKernelTheCpuHasAndNamesIt) {
  using host_kernels::int8_kernel_for;
  EXPECT_EQ(int8_kernel_for(Isa::kPortable), Int8Kernel::kPortable);
  if (host_kernels::cpu_has_avx2_fma()) {
    EXPECT_EQ(int8_kernel_for(Isa::kAvx2), host_kernels::cpu_has_avx_vnni() ? Int8Kernel::kAvxVnni : Int8Kernel::kAvx2);
  }
  if (host_kernels::cpu_has_avx512_vnni()) {
    EXPECT_EQ(int8_kernel_for(Isa::kAvx512), host_kernels::cpu_has_amx_int8() ? Int8Kernel::kAmx : Int8Kernel::kAvx512Vnni);
    EXPECT_EQ(int8_kernel_for(Isa::kAvx512, false), Int8Kernel::kAvx512Vnni);
    EXPECT_EQ(host_kernels::host_path_for("avx512-vnni").name(), "avx512-vnni");
  }
  if (host_kernels::cpu_has_amx_int8()) {
    EXPECT_EQ(host_kernels::host_path_for("amx").name(), "amx");
  } else {
    try {
      host_kernels::host_path_for("amx");
      ADD_FAILURE() << "SPECULA_SIMD=amx was accepted on a CPU without AMX";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("no AMX-INT8"), std::string::npos) << e.what();
    }
  }
  const auto widest = int8_kernels().back();
  EXPECT_EQ(int8_kernel_for(host_kernels::host_path_for(nullptr).isa), widest);
  EXPECT_EQ(host_kernels::host_path_for(nullptr).name(), host_kernels::int8_kernel_name(widest));
  EXPECT_EQ(host_kernels::host_path_for("reference-portable").name(), "portable reference");
  for (Int8Kernel k : {Int8Kernel::kAvx2, Int8Kernel::kAvxVnni, Int8Kernel::kAvx512Vnni, Int8Kernel::kAmx})
    if (!host_kernels::cpu_has_int8_kernel(k)) {
      try {
        host_kernels::packed_kernel(k, DType::Q4_0);
        ADD_FAILURE() << host_kernels::int8_kernel_name(k) << " was handed out on a CPU without it";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("this CPU cannot run"), std::string::npos) << e.what();
      }
    }
}

TEST(HostPath, TheInt8PathRepacksMatricesOnceAndTheReferencePathUsesTheFileInPlace) {
  const Stored w = random_stored(DType::Q4_1, 16, 64, 90);
  HostOps fast(1, host_kernels::host_path_for(nullptr)), ref(1, host_kernels::host_path_for("reference"));
  const Weight a = fast.upload(w.view), b = fast.upload(w.view), table = fast.upload_table(w.view), r = ref.upload(w.view);
  EXPECT_NE(a.device, nullptr);
  EXPECT_EQ(a.device, b.device) << "the same stored tensor is repacked once per device";
  EXPECT_EQ(table.device, nullptr);
  EXPECT_EQ(r.device, nullptr);
  EXPECT_EQ(fast.packed_bytes(), size_t{16 * 2 * 20});
  EXPECT_EQ(ref.packed_bytes(), size_t{0});
  // What a product reads (bench decode's roofline counts it): the packed copy, or the file's bytes.
  EXPECT_EQ(fast.read_bytes(a), fast.packed_bytes());
  EXPECT_EQ(ref.read_bytes(r), w.view.nbytes);
  // Both give a product; they agree within the activation rounding.
  const auto x = random_x(2, 64, 91);
  std::vector<float> ya(32), yr(32);
  fast.matmul(x.data(), a, 2, ya.data());
  ref.matmul(x.data(), r, 2, yr.data());
  for (int k = 0; k < 32; ++k) EXPECT_NEAR(ya[k], yr[k], 0.05 * (1 + std::fabs(yr[k])));
}

TEST(HostPath, AWeightTypeWithoutAFastKernelOnThePathRunsOnTheF32KernelsWithOneLineNamingIt) {
  // Every stored type has a fast kernel on an AVX-512 CPU; on the AVX2 path BF16 has none.
  if (!host_kernels::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has no AVX2 path";
  const int64_t rows = 4, cols = 64;
  std::vector<uint16_t> bits(static_cast<size_t>(rows * cols));
  for (size_t k = 0; k < bits.size(); ++k) bits[k] = f32_to_bf16(0.01f * static_cast<float>(static_cast<int>(k % 7) - 3));
  const TensorView w{"blk.0.ffn_down.weight", DType::BF16, {rows, cols}, reinterpret_cast<const std::byte*>(bits.data()),
                     bits.size() * 2};
  HostOps fast(1, host_kernels::host_path_for("avx2"));
  testing::internal::CaptureStderr();
  const Weight a = fast.upload(w), b = fast.upload(w);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(a.device, nullptr);
  EXPECT_EQ(b.device, nullptr);
  // One line for the type, once per process (CTest runs each test in a process of its own, and no
  // other test of this binary uploads a BF16 weight to an AVX2 host device).
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  EXPECT_NE(err.find("no fast kernel for BF16 weights (first: blk.0.ffn_down.weight)"), std::string::npos) << err;
  const auto x = random_x(2, cols, 92);
  std::vector<float> y(2 * rows), ref(2 * rows);
  fast.matmul(x.data(), a, 2, y.data());
  matmul_reference(w, x.data(), 2, ref.data());
  for (size_t k = 0; k < y.size(); ++k) EXPECT_NEAR(y[k], ref[k], 1e-4 * (1 + std::fabs(ref[k])));
}

// Q5_1 and Q5_K (a Q5_K_M file) are packed with a plane of fifth bits, IQ4_XS as IQ4_NL's indices
// with f32 scales, Q2_K in its 2-bit layout: every path's int8 kernel reads them (the avx2 path
// runs AVX-VNNI where the CPU has it), silently, and the product is the stored matrix's.
TEST(HostPath, FiveBitIQ4_XSAndQ2_KTypesRunOnTheInt8KernelsOfEveryPath) {
  for (DType t : {DType::Q5_1, DType::Q5_K, DType::IQ4_XS, DType::Q2_K}) {
    const int64_t rows = 8, cols = 256;
    const Stored w = random_stored(t, rows, cols, 93 + static_cast<uint32_t>(t));
    const auto x = random_x(2, cols, 94);
    std::vector<float> ref(2 * rows);
    matmul_reference(w.view, x.data(), 2, ref.data());
    std::vector<std::string> paths = {"portable"};
    if (host_kernels::cpu_has_avx2_fma()) paths.push_back("avx2");
    if (host_kernels::cpu_has_avx512_vnni()) paths.push_back("avx512-vnni");
    for (const std::string& path : paths) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + path);
      const host_kernels::HostPath hp = host_kernels::host_path_for(path.c_str());
      const Int8Kernel kernel = host_kernels::int8_kernel_for(hp.isa);
      HostOps ops(1, hp);
      testing::internal::CaptureStderr();
      const Weight a = ops.upload(w.view), b = ops.upload(w.view);
      const std::string err = testing::internal::GetCapturedStderr();
      std::vector<float> y(2 * rows);
      ops.matmul(x.data(), a, 2, y.data());
      EXPECT_NE(a.device, nullptr) << host_kernels::int8_kernel_name(kernel);
      EXPECT_EQ(a.device, b.device);
      EXPECT_EQ(ops.packed_bytes(), size_t{8} * (t == DType::Q5_1 ? 192 : t == DType::Q5_K ? 224 : t == DType::Q2_K ? 112 : 160));
      EXPECT_EQ(err, "");
      for (size_t k = 0; k < y.size(); ++k) EXPECT_NEAR(y[k], ref[k], 0.05 * (1 + std::fabs(ref[k])));
    }
  }
}

// The types no kernel reads as stored (Q5_0, IQ4_NL, Q3_K) stay in the file: the int8 path packs
// them from it (the view it keeps is the file's, the packed bytes are their conversion's); the
// reference path keeps one converted copy of its own (kernel_view) and reads that. Each product is
// the conversion's on the same path.
TEST(HostPath, TypesNoKernelReadsAreReadFromTheFileByTheInt8PathAndAsAConvertedCopyByTheReference) {
  for (DType t : {DType::Q5_0, DType::IQ4_NL, DType::Q3_K}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t rows = 16, cols = 256;
    Stored w = random_stored(t, rows, cols, 95);
    if (t == DType::Q3_K)
      for (size_t o = 0; o < w.bytes.size(); o += 110) {
        const uint16_t d = f32_to_fp16(0.01f);
        std::memcpy(w.bytes.data() + o + 108, &d, 2);
      }
    std::vector<std::shared_ptr<const void>> storage;
    const TensorView conv = kernel_view(w.view, storage);
    const auto x = random_x(3, cols, 96);
    HostOps fast(1, host_kernels::host_path_for(nullptr)), ref(1, host_kernels::host_path_for("reference"));
    HostOps fast_conv(1, host_kernels::host_path_for(nullptr)), ref_conv(1, host_kernels::host_path_for("reference"));
    const Weight a = fast.upload(w.view), b = fast.upload(w.view), r = ref.upload(w.view), r2 = ref.upload(w.view);
    EXPECT_NE(a.device, nullptr);
    EXPECT_EQ(a.device, b.device);
    EXPECT_EQ(a.view.data, w.view.data) << "the int8 path keeps the file's view";
    EXPECT_EQ(a.view.dtype, t);
    EXPECT_EQ(r.device, nullptr);
    EXPECT_EQ(r.view.dtype, kernel_dtype(t));
    EXPECT_EQ(r.view.data, r2.view.data) << "one converted copy per tensor";
    EXPECT_NE(r.view.data, w.view.data);
    EXPECT_EQ(ref.read_bytes(r), conv.nbytes);
    std::vector<float> y(3 * rows), want(3 * rows);
    for (const auto& [ops, own, other] : {std::tuple{&fast, a, &fast_conv}, std::tuple{&ref, r, &ref_conv}}) {
      ops->matmul(x.data(), own, 3, y.data());
      other->matmul(x.data(), other->upload(conv), 3, want.data());
      for (size_t k = 0; k < y.size(); ++k) ASSERT_TRUE(bit_equal(y[k], want[k])) << k << ": " << y[k] << " vs " << want[k];
    }
  }
}

}  // namespace
}  // namespace specula
