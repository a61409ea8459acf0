// Roofline denominators for the host device: measured memory read bandwidth, and the achieved
// bandwidth of the matmul kernels on weight sets larger than the last-level cache.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/host/thread_pool.h"
#include "model/tensor.h"

namespace specula {

// Streams `bytes` of memory with every thread of the pool (AVX2 loads where the CPU has them,
// summed so the loads cannot be elided); best of several passes, in GB/s (1e9 bytes/s).
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes = size_t{256} << 20);

struct MatmulTiming {
  double best_s = 0;      // seconds per matmul, best run
  double median_s = 0;    // seconds per matmul, median run
  double weight_bytes = 0;  // bytes of one weight matrix (what a call reads from memory)
  double best_gbs() const { return weight_bytes / best_s * 1e-9; }
  double median_gbs() const { return weight_bytes / median_s * 1e-9; }
};

// Times matmul() of n activation rows against `copies` distinct random [rows, cols] matrices
// of `dtype` used in turn (copies x size should exceed the last-level cache so the weights come
// from DRAM, as in decoding). `runs` timed passes over all copies.
MatmulTiming time_matmul(ThreadPool& pool, DType dtype, int64_t rows, int64_t cols, int64_t n, int copies, int runs);

struct MatmulShape {
  DType dtype;
  int64_t rows, cols;
};
// Times one pass of matmul() over a distinct random matrix per shape, in order (e.g. every
// weight matrix of a decode step): best_s / median_s are seconds per pass, weight_bytes the
// bytes of all matrices.
MatmulTiming time_matmul_set(ThreadPool& pool, const std::vector<MatmulShape>& shapes, int64_t n, int runs);

}  // namespace specula
