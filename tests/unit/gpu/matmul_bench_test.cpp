// Microbenchmarks, not tests (DISABLED_: run with --gtest_also_run_disabled_tests
// --gtest_filter='MatmulBench.*'). Prints one JSON line per measurement: achieved GB/s of the
// host matmul on weight sets larger than the last-level cache against measured read bandwidth,
// and the cost of a 6-row verification GEMM relative to a 1-row GEMV.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
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

}  // namespace
}  // namespace specula
