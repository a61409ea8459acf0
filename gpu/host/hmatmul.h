// The host's fast path for 16-bit weights (F16, BF16): weights repacked once at load into groups
// of 16 interleaved rows, so that one 512-bit vector holds a column pair of 16 output rows and a
// pass over the weights serves every activation row of the call; AVX-512 kernels, chosen at run
// time, with a portable C++ emulation that gives the same bits.
//
// The arithmetic per output, fixed whatever the call's row count or the row's place in it (the
// row property of qmatmul.h, so a verify forward's rows equal decode steps bit for bit): four
// partial sums a_0..a_3, column pair (2p, 2p+1) going to a = a_(p mod 4) in pair order, and
// y = (a_0 + a_1) + (a_2 + a_3) (four chains keep the FMA units busy at one activation row):
//   F16:  a = fma(w[2p], x[2p], a); a = fma(w[2p+1], x[2p+1], a)      (x in f32)
//   BF16: x is rounded to bf16 once per call (nearest even; values below FLT_MIN become zero);
//         a = ftz(fma(w[2p+1], x[2p+1], a)); a = ftz(fma(w[2p], x[2p], a))
//         which is AVX-512 BF16's vdpbf16ps (odd element first, each step rounded, denormal
//         inputs read as zero and denormal results flushed; checked against the instruction
//         bit for bit by the tests).
// F16 needs AVX-512 F (+F16C) and BF16 AVX-512 BF16; elsewhere these weights stay on the f32
// kernels of matmul.h.
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "gpu/host/qmatmul.h"
#include "gpu/host/thread_pool.h"
#include "model/tensor.h"

namespace specula {

// Whether weights of type `t` take the 16-bit path on this CPU: `portable` asks for the portable
// emulation (SPECULA_SIMD=portable, tests), otherwise the AVX-512 kernel must exist here.
bool hmatmul_supports(DType t, bool portable);

// Repacks a stored [rows, cols] F16 or BF16 matrix (cols even): per group of 16 rows (the last
// padded with zero rows), per column pair p, 64 bytes whose lane r (4 bytes) holds row r's values
// at columns 2p and 2p + 1 as stored. PackedMatrix::blocks counts column pairs and block_bytes is
// 64. Throws std::invalid_argument for another type, an odd width or too few bytes.
std::shared_ptr<PackedMatrix> pack_matrix16(const TensorView& w, ThreadPool& pool, WeightArena* arena = nullptr);

namespace host_kernels {

// Activations as a 16-bit kernel reads them: f32 rows (F16 weights) or bf16 rows (BF16 weights).
struct HalfRows {
  int64_t n = 0, cols = 0;
  const float* f32 = nullptr;   // [n, cols]
  const uint16_t* bf16 = nullptr;  // [n, cols]
};
// y[i, g*16 + r] for every activation row i, r < 16 (rows < m.rows written), groups [g0, g1).
using Packed16Kernel = void (*)(const PackedMatrix& m, const HalfRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1);
Packed16Kernel portable_packed16_kernel(DType t);
Packed16Kernel avx512_packed16_kernel(DType t);      // F16 (hmatmul_avx512.cpp)
Packed16Kernel avx512bf16_packed16_kernel(DType t);  // BF16 (hmatmul_avx512bf16.cpp)
bool cpu_has_avx512_bf16();
// f32 -> bf16 as the BF16 path rounds activations: nearest even, |v| < FLT_MIN -> signed zero.
uint16_t f32_to_bf16_ftz(float v);
// acc + a * b as one lane of vdpbf16ps multiplies a pair (odd elements first, each step rounded,
// denormal inputs read as zero and denormal results flushed): for the portable kernels that give
// its bits (this one and the attention's over bf16 pairs).
float dpbf16_pair(float acc, uint16_t a_even, uint16_t a_odd, uint16_t b_even, uint16_t b_odd);

}  // namespace host_kernels

// y_k[n, W_k.rows] = x[n, cols] * W_k^T for 16-bit packed W_k of one type and width, in one
// parallel region; `portable` runs the emulation instead of the AVX-512 kernels.
void hmatmul(std::span<const PackedMatrix* const> ws, const float* x, int64_t n, std::span<float* const> ys,
             ThreadPool& pool, bool portable);

}  // namespace specula
