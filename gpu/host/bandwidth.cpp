// Read-bandwidth and matmul-bandwidth measurements (the host roofline). Both report the best of
// several passes since the machines are shared and noisy; time_matmul also gives the median.
#include "gpu/host/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gpu/host/matmul.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/quant.h"
#include "gpu/host/weight_arena.h"

namespace specula {

namespace host_kernels {
uint64_t sum_words_avx2(const std::byte* p, size_t bytes);  // bandwidth_avx2.cpp
}

namespace {

using Clock = std::chrono::steady_clock;

volatile uint64_t g_sink = 0;

uint64_t sum_words_portable(const std::byte* p, size_t bytes) {
  uint64_t s[4] = {};
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  for (size_t i = 0; i < bytes / 8; i += 4)
    for (int k = 0; k < 4; ++k) s[k] += w[i + k];
  return s[0] + s[1] + s[2] + s[3];
}

}  // namespace

double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes) {
  constexpr size_t kUnit = size_t{1} << 20;  // parallel work unit: 1 MiB
  const size_t units = std::max<size_t>(1, bytes / kUnit);
  bytes = units * kUnit;
  const std::shared_ptr<uint8_t> mapped = map_huge_pages(bytes);  // the weights' kind of page
  auto* const buf_bytes = reinterpret_cast<std::byte*>(mapped.get());
  std::memset(buf_bytes, 1, bytes);  // faults every page in before timing

  const bool avx2 = host_kernels::cpu_has_avx2_fma() && std::strcmp(matmul_isa(), "portable") != 0;
  std::atomic<uint64_t> sink{0};
  double best = 1e30;
  constexpr int kPasses = 6;  // the first warms the TLB and caches; best of all counts
  for (int pass = 0; pass < kPasses; ++pass) {
    const auto t0 = Clock::now();
    pool.parallel_for(static_cast<int64_t>(units), 1, [&](int64_t u0, int64_t u1) {
      const std::byte* p = buf_bytes + static_cast<size_t>(u0) * kUnit;
      const size_t len = static_cast<size_t>(u1 - u0) * kUnit;
      sink.fetch_add(avx2 ? host_kernels::sum_words_avx2(p, len) : sum_words_portable(p, len), std::memory_order_relaxed);
    });
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  g_sink = sink.load();  // keeps the sums observable so the loads cannot be dropped
  return static_cast<double>(bytes) / best * 1e-9;
}

namespace {

// A [rows, cols] matrix of random values in `t` with sane fp16 scales (no nan/inf/subnormal).
std::vector<std::byte> random_matrix(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  const size_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<std::byte> data(row_bytes * static_cast<size_t>(rows));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  for (auto& b : data) b = std::byte(byte(rng));
  auto put16 = [&](size_t off, uint16_t h) { std::memcpy(data.data() + off, &h, 2); };
  const DTypeInfo& info = dtype_info(t);
  const size_t blocks = data.size() / static_cast<size_t>(info.block_bytes);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t o = b * static_cast<size_t>(info.block_bytes);
    switch (t) {
      case DType::F32: { const float f = val(rng); std::memcpy(data.data() + o, &f, 4); break; }
      case DType::F16: put16(o, f32_to_fp16(val(rng))); break;
      case DType::BF16: put16(o, f32_to_bf16(val(rng))); break;
      case DType::Q4_0: case DType::Q5_0: case DType::Q8_0: case DType::IQ4_NL: case DType::IQ4_XS:
        put16(o, f32_to_fp16(0.01f + 0.01f * val(rng)));
        break;
      case DType::Q4_1: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K:
        put16(o, f32_to_fp16(0.01f + 0.01f * val(rng)));
        put16(o + 2, f32_to_fp16(0.01f * val(rng)));
        break;
      case DType::Q2_K:
        put16(o + 80, f32_to_fp16(0.01f + 0.01f * val(rng)));
        put16(o + 82, f32_to_fp16(0.01f * val(rng)));
        break;
      case DType::Q3_K: put16(o + 108, f32_to_fp16(0.01f + 0.01f * val(rng))); break;
      case DType::Q6_K: put16(o + 208, f32_to_fp16(0.01f + 0.01f * val(rng))); break;
      case DType::IQ2_XXS: case DType::IQ2_XS: case DType::IQ2_S: case DType::IQ3_XXS: case DType::IQ3_S: case DType::IQ1_S:
        put16(o, f32_to_fp16(0.001f + 0.001f * val(rng)));
        break;
      case DType::IQ1_M:
        set_iq1_m_d(reinterpret_cast<uint8_t*>(data.data() + o), f32_to_fp16(0.001f + 0.001f * val(rng)));
        break;
    }
  }
  return data;
}

}  // namespace

MatmulTiming time_matmul_set(ThreadPool& pool, const std::vector<MatmulShape>& shapes, int64_t n, int runs) {
  std::mt19937 rng(1234);
  std::vector<std::vector<std::byte>> mats;
  std::vector<TensorView> views;
  int64_t max_rows = 1, max_cols = 1;
  for (const MatmulShape& m : shapes) {
    mats.push_back(random_matrix(m.dtype, m.rows, m.cols, rng));
    views.push_back(TensorView{"bench", m.dtype, {m.rows, m.cols}, mats.back().data(), mats.back().size()});
    max_rows = std::max(max_rows, m.rows);
    max_cols = std::max(max_cols, m.cols);
  }
  std::vector<float> x(static_cast<size_t>(n * max_cols)), y(static_cast<size_t>(n * max_rows));
  std::uniform_real_distribution<float> val(-1.0f, 1.0f);
  for (auto& v : x) v = val(rng);

  for (auto& v : views) matmul(v, x.data(), n, y.data(), pool);  // warm-up pass
  std::vector<double> per_pass;
  for (int r = 0; r < runs; ++r) {
    const auto t0 = Clock::now();
    for (auto& v : views) matmul(v, x.data(), n, y.data(), pool);
    per_pass.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(per_pass.begin(), per_pass.end());
  MatmulTiming t;
  t.best_s = per_pass.front();
  t.median_s = per_pass[per_pass.size() / 2];
  for (auto& m : mats) t.weight_bytes += static_cast<double>(m.size());
  return t;
}

MatmulTiming time_matmul(ThreadPool& pool, DType dtype, int64_t rows, int64_t cols, int64_t n, int copies, int runs) {
  MatmulTiming t = time_matmul_set(pool, std::vector<MatmulShape>(static_cast<size_t>(copies), MatmulShape{dtype, rows, cols}), n, runs);
  // Per call, not per pass over the copies.
  t.best_s /= copies;
  t.median_s /= copies;
  t.weight_bytes /= copies;
  return t;
}

}  // namespace specula
