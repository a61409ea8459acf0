// Microbenchmarks, not tests (DISABLED_: run with --gtest_also_run_disabled_tests
// --gtest_filter='MatmulBench.*'). Prints one JSON line per measurement: achieved GB/s of the
// host matmul on weight sets larger than the last-level cache against measured read bandwidth,
// and the cost of a 6-row verification GEMM relative to a 1-row GEMV.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

#include "gpu/host/bandwidth.h"
#include "gpu/host/matmul.h"

namespace specula {
namespace {

void print_timing(const char* what, DType t, int64_t rows, int64_t cols, int64_t n, int threads, const MatmulTiming& m, double read_gbs) {
  std::printf("{\"bench\":\"%s\",\"isa\":\"%s\",\"dtype\":\"%s\",\"rows\":%lld,\"cols\":%lld,\"n\":%lld,\"threads\":%d,"
              "\"best_us\":%.1f,\"median_us\":%.1f,\"best_gbs\":%.2f,\"median_gbs\":%.2f,\"read_gbs\":%.2f,\"roofline_best\":%.3f}\n",
              what, matmul_isa(), dtype_name(t), static_cast<long long>(rows), static_cast<long long>(cols), static_cast<long long>(n), threads,
              m.best_s * 1e6, m.median_s * 1e6, m.best_gbs(), m.median_gbs(), read_gbs, m.best_gbs() / read_gbs);
}

TEST(MatmulBench, DISABLED_GemvAndGemmBandwidthAgainstTheReadRoofline) {
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    const double read = measure_read_bandwidth_gbs(pool);
    std::printf("{\"bench\":\"read\",\"threads\":%d,\"read_gbs\":%.2f}\n", threads, read);
    struct Case { DType t; int64_t rows, cols; int copies; };
    // 128 x 0.55 MB and 3 x 30 MB: both sets are larger than the 32 MiB L3.
    for (const Case c : {Case{DType::Q4_1, 1536, 576, 128}, Case{DType::Q8_0, 49152, 576, 3}}) {
      const MatmulTiming one = time_matmul(pool, c.t, c.rows, c.cols, 1, c.copies, 15);
      print_timing("gemv", c.t, c.rows, c.cols, 1, threads, one, read);
      const MatmulTiming six = time_matmul(pool, c.t, c.rows, c.cols, 6, c.copies, 15);
      print_timing("gemm", c.t, c.rows, c.cols, 6, threads, six, read);
      std::printf("{\"bench\":\"gemm6_over_gemv\",\"dtype\":\"%s\",\"threads\":%d,\"ratio_best\":%.2f,\"ratio_median\":%.2f}\n",
                  dtype_name(c.t), threads, six.best_s / one.best_s, six.median_s / one.median_s);
    }
  }
}

// Every weight matrix of one SmolLM2-135M Q4_1 decode step, random values, in model order:
// 30 x (q 576x576, k and v 192x576, o 576x576, gate and up 1536x576, down 576x1536) Q4_1, then
// the 49152x576 Q8_0 tied embedding as the output head (~96 MB, three times the L3).
TEST(MatmulBench, DISABLED_SmolLM2DecodeStepMatmulsAgainstTheReadRoofline) {
  std::vector<MatmulShape> step;
  for (int layer = 0; layer < 30; ++layer) {
    for (auto [rows, cols] : {std::pair{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}})
      step.push_back(MatmulShape{DType::Q4_1, rows, cols});
  }
  step.push_back(MatmulShape{DType::Q8_0, 49152, 576});
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    const double read = measure_read_bandwidth_gbs(pool);
    const MatmulTiming one = time_matmul_set(pool, step, 1, 30);
    const MatmulTiming six = time_matmul_set(pool, step, 6, 15);
    std::printf("{\"bench\":\"smollm2_decode_matmuls\",\"isa\":\"%s\",\"threads\":%d,\"weight_mb\":%.1f,\"read_gbs\":%.2f,"
                "\"n1_best_ms\":%.3f,\"n1_median_ms\":%.3f,\"n1_best_gbs\":%.2f,\"roofline_best\":%.3f,\"roofline_median\":%.3f,"
                "\"n6_best_ms\":%.3f,\"n6_median_ms\":%.3f,\"n6_over_n1_best\":%.2f,\"n6_over_n1_median\":%.2f}\n",
                matmul_isa(), threads, one.weight_bytes / 1e6, read, one.best_s * 1e3, one.median_s * 1e3, one.best_gbs(), one.best_gbs() / read,
                one.median_gbs() / read, six.best_s * 1e3, six.median_s * 1e3, six.best_s / one.best_s, six.median_s / one.median_s);
  }
}

}  // namespace
}  // namespace specula
