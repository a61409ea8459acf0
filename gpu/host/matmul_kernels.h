// Private to gpu/host/matmul*.cpp and their tests: the per-ISA row-range kernels behind matmul().
// matmul_avx2.cpp and matmul_avx512.cpp are the only files built with those instruction sets;
// matmul.cpp calls into them only after checking the CPU at run time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "gpu/host/thread_pool.h"
#include "model/tensor.h"

namespace specula::host_kernels {

// y[n, rows] = x[n, cols] * W^T for W = [rows, cols] stored row-major in `dtype`.
struct MatmulArgs {
  DType dtype = DType::F32;
  const std::byte* w = nullptr;  // row 0 of W
  size_t row_bytes = 0;          // bytes of one stored row (dtype_row_bytes(dtype, cols))
  int64_t rows = 0, cols = 0;
  const float* x = nullptr;      // [n, cols], row-major
  int64_t n = 0;
  float* y = nullptr;            // [n, rows], row-major
  // Prepared activations for the AVX2 Q4_0/Q4_1 kernels (filled by matmul_isa_path):
  // xprep [n, cols]: per 32-value block, x_j - x_{j+16}/16 then x_{j+16}/16 for j < 16
  // xsum [ceil(n/8), cols/32, 8]: block sums of x, lane i for activation
  // row 8 * tile + i, times -8 for Q4_0 (for n = 1 the GEMV's own lane pattern, see gemv_rows).
  const float* xprep = nullptr;
  const float* xsum = nullptr;
};

// Whether avx2_rows_kernel(t, ...) reads MatmulArgs::xprep / xsum.
inline bool avx2_needs_prepared_activations(DType t) { return t == DType::Q4_0 || t == DType::Q4_1; }
inline size_t prepared_xsum_floats(int64_t n, int64_t cols) { return static_cast<size_t>((n + 7) / 8 * (cols / 32) * 8); }
// Fills xprep (n * cols floats) and xsum (prepared_xsum_floats) for x[n, cols], cols % 32 == 0.
void prepare_activations_avx2(DType t, const float* x, int64_t n, int64_t cols, float* xprep, float* xsum);

// Computes y[i, r] for every i < n and r in [r0, r1); a row range is the unit of parallel work.
using RowsKernel = void (*)(const MatmulArgs& a, int64_t r0, int64_t r1);

enum class Isa { kPortable, kAvx2, kAvx512 };

// Plain C++ kernel for any dtype: dequantize a slice of a row to a stack buffer, dot it with
// every activation row. Always available.
RowsKernel portable_rows_kernel(DType t);

// AVX2+FMA+F16C kernels (matmul_avx2.cpp): Q4_0, Q4_1, Q8_0, F32, F16, BF16 dequantize each
// 32-value block in registers and FMA it against up to 8 activation rows; other types (and
// float rows whose length is not a multiple of 32) dequantize a slice to a stack buffer.
// Call only where cpu_has_avx2_fma() is true.
RowsKernel avx2_rows_kernel(DType t, int64_t cols);

// AVX-512 F/BW/VL kernels (matmul_avx512.cpp), the same algorithms at twice the width, for
// Q4_0, Q4_1, Q8_0 and whole-block F32/F16/BF16 rows; other cases fall back to the AVX2 kernels.
// They read the same prepared activations as the AVX2 kernels. Call only where cpu_has_avx512().
RowsKernel avx512_rows_kernel(DType t, int64_t cols);

bool cpu_has_avx2_fma();
// AVX-512 F, BW and VL, and AVX2+FMA+F16C (the fallbacks and the shared preparation need them).
bool cpu_has_avx512();
// cpu_has_avx512() and AVX-512 VNNI (the int8 path's 512-bit kernels).
bool cpu_has_avx512_vnni();
// cpu_has_avx512_vnni() and AMX-TILE + AMX-INT8 with the tile state enabled by the OS and
// granted to this process (Linux's arch_prctl(ARCH_REQ_XCOMP_PERM), asked once).
bool cpu_has_amx_int8();
// Asks Linux for this process's permission to use the AMX tile data (qmatmul_amx.cpp).
bool amx_int8_usable();
// AVX2+FMA+F16C and AVX-VNNI (VEX-encoded vpdpbusd on 256-bit vectors).
bool cpu_has_avx_vnni();

// The name matmul_isa() reports for a path: "portable", "avx2" or "avx512".
const char* isa_name(Isa isa);

// The path for a value of env SPECULA_SIMD (nullptr when unset): "portable" forces the portable
// kernels, "avx2" caps the choice at AVX2; anything else takes the widest path the CPU has
// (AVX-512, then AVX2, then portable).
Isa isa_for_env(const char* specula_simd);
// isa_for_env of this process's SPECULA_SIMD, read once: the widest the host may run, for code
// outside the device (the sampler's and the Gumbel draw's vector loops) as for the f32 kernels.
Isa default_isa();

// The host device's path: the ISA, and whether activations are quantized to int8 (the fast path,
// gpu/host/qmatmul.h) or kept in f32 (the reference path, the kernels of this header).
struct HostPath {
  Isa isa = Isa::kPortable;
  bool reference = false;
  bool amx = true;  // the int8 path may take the AMX kernel where the CPU has it (AVX-512 only)
  // The int8 kernel ("avx512-vnni", "avx-vnni", "avx2", "portable"), or the ISA and
  // " reference" ("avx512 reference", ...).
  std::string name() const;
};

// The path a value of SPECULA_SIMD asks for (nullptr or "" when unset): unset takes the widest ISA
// the CPU has with the int8 path; "reference" the widest ISA with f32 activations; "avx512",
// "avx2" or "portable" that ISA with the int8 path ("avx512" takes AMX where the CPU has it;
// "avx512-vnni" is AVX-512 without AMX, "amx" insists on AMX), and "reference-avx2" / "reference-portable"
// that ISA with f32 activations. Throws std::invalid_argument naming the value for one this CPU
// lacks or that is not a path.
HostPath host_path_for(const char* specula_simd);

// matmul() with the ISA chosen by the caller (tests compare both paths on one machine).
// Throws std::invalid_argument for a path the CPU does not have.
void matmul_isa_path(Isa isa, const MatmulArgs& a, ThreadPool& pool);

// Rows per unit of parallel work for a matrix with rows of `row_bytes`: a few KiB of weights,
// so a chunk amortises its dispatch yet the 49152-row output head splits finely.
int64_t matmul_grain_rows(size_t row_bytes);

}  // namespace specula::host_kernels
