// Host matrix products with weights kept in their stored type (dequantized in registers).
#pragma once
#include <cstdint>

#include "gpu/host/thread_pool.h"
#include "model/tensor.h"

namespace specula {
namespace host_kernels {
enum class Isa;
}

// y[n, rows] = x[n, cols] * W^T, W = [rows, cols] in any supported DType (row-major).
// n = 1 is decode (GEMV); n > 1 reuses each dequantized weight block across the n rows, so
// verifying K+1 tokens costs far less than K+1 single steps.
// Picks the widest path the CPU has at run time: AVX-512, AVX2, else portable.
void matmul(const TensorView& w, const float* x, int64_t n, float* y, ThreadPool& pool);

// The same with the ISA chosen by the caller (the CPU must have it).
void matmul(const TensorView& w, const float* x, int64_t n, float* y, ThreadPool& pool, host_kernels::Isa isa);

// The simple reference: dequantize_row per row, f64-free f32 dot products, single thread.
void matmul_reference(const TensorView& w, const float* x, int64_t n, float* y);

// Which path matmul takes on this machine ("avx512", "avx2" or "portable"); SPECULA_SIMD=portable
// forces the portable path, SPECULA_SIMD=avx2 caps it at AVX2.
const char* matmul_isa();

}  // namespace specula
