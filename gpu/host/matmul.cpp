// Host matmul: argument checks, run-time ISA dispatch, the single-thread reference and the
// portable kernel. The AVX2 kernels live in matmul_avx2.cpp (the only file built with AVX2).
#include "gpu/host/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/host/matmul_kernels.h"
#include "gpu/host/qmatmul.h"
#include "gpu/host/quant.h"

namespace specula {

namespace host_kernels {

bool cpu_has_avx2_fma() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
  static const bool has = cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512_vnni() {
#if defined(__x86_64__)
  static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

bool cpu_has_amx_int8() {
#if defined(__x86_64__)
  // The CPU's tile unit, the kernel's XSAVE of its state (XCR0 bits 17 and 18), and Linux's
  // permission for this process (amx_int8_usable asks for it once).
  static const bool has = [] {
    if (!cpu_has_avx512_vnni() || !__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    return amx_int8_usable();
  }();
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx_vnni() {
#if defined(__x86_64__)
  static const bool has = cpu_has_avx2_fma() && __builtin_cpu_supports("avxvnni");
  return has;
#else
  return false;
#endif
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    default: return "portable";
  }
}

namespace {

// Values of a row dequantized at a time by the buffered kernels: one Q4_K/Q6_K super-block,
// eight 32-value blocks; 1 KiB of stack.
constexpr int64_t kSliceCols = 256;
// Activation rows sharing one dequantized slice (matches the AVX2 kernels' widest tile).
constexpr int64_t kPortableTile = 8;

// Plain f32 dot with 8 independent partial sums, which the compiler can keep in SSE registers.
float dot_portable(const float* a, const float* b, int64_t len) {
  float s[8] = {};
  int64_t j = 0;
  for (; j + 8 <= len; j += 8)
    for (int k = 0; k < 8; ++k) s[k] += a[j + k] * b[j + k];
  for (; j < len; ++j) s[0] += a[j] * b[j];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

// Portable kernel v1: per weight row, dequantize kSliceCols values to the stack, then dot them
// with up to kPortableTile activation rows; each row of W is decoded n / 8 times.
void portable_rows(const MatmulArgs& a, int64_t r0, int64_t r1) {
  alignas(32) float buf[kSliceCols];
  const int64_t block = dtype_info(a.dtype).block_elems;
  const int64_t slice = std::max(block, kSliceCols / block * block);
  for (int64_t r = r0; r < r1; ++r) {
    const std::byte* wr = a.w + static_cast<size_t>(r) * a.row_bytes;
    for (int64_t i0 = 0; i0 < a.n; i0 += kPortableTile) {
      const int64_t tile = std::min(kPortableTile, a.n - i0);
      float acc[kPortableTile] = {};
      for (int64_t c0 = 0; c0 < a.cols; c0 += slice) {
        const int64_t len = std::min(slice, a.cols - c0);
        dequantize_row(a.dtype, wr + dtype_row_bytes(a.dtype, c0), buf, len);
        for (int64_t i = 0; i < tile; ++i) acc[i] += dot_portable(buf, a.x + (i0 + i) * a.cols + c0, len);
      }
      for (int64_t i = 0; i < tile; ++i) a.y[(i0 + i) * a.rows + r] = acc[i];
    }
  }
}

}  // namespace

// Read once: matmul runs a few hundred times per decode step.
Isa default_isa() {
  static const Isa isa = isa_for_env(std::getenv("SPECULA_SIMD"));
  return isa;
}

Isa isa_for_env(const char* specula_simd) {
  const std::string v = specula_simd ? specula_simd : "";
  if (v == "portable" || v == "reference-portable") return Isa::kPortable;
  const bool cap_avx2 = v == "avx2" || v == "reference-avx2";
  if (!cap_avx2 && cpu_has_avx512()) return Isa::kAvx512;
  return cpu_has_avx2_fma() ? Isa::kAvx2 : Isa::kPortable;
}

std::string HostPath::name() const {
  return reference ? std::string(isa_name(isa)) + " reference" : int8_kernel_name(int8_kernel_for(isa, amx));
}

HostPath host_path_for(const char* specula_simd) {
  std::string v = specula_simd ? specula_simd : "";
  HostPath p;
  if (v == "reference" || v.rfind("reference-", 0) == 0) {
    p.reference = true;
    v = v == "reference" ? "" : v.substr(10);
  }
  const Isa widest = cpu_has_avx512() ? Isa::kAvx512 : cpu_has_avx2_fma() ? Isa::kAvx2 : Isa::kPortable;
  if (v.empty()) {
    p.isa = widest;
  } else if (v == "portable") {
    p.isa = Isa::kPortable;
  } else if (v == "avx2") {
    if (!cpu_has_avx2_fma())
      throw std::invalid_argument("SPECULA_SIMD=" + std::string(specula_simd) + ": this CPU has no AVX2+FMA+F16C (its widest path is " + isa_name(widest) + ")");
    p.isa = Isa::kAvx2;
  } else if (v == "avx512" || (!p.reference && v == "avx512-vnni")) {
    if (!cpu_has_avx512())
      throw std::invalid_argument("SPECULA_SIMD=" + std::string(specula_simd) + ": this CPU has no AVX-512 F/BW/VL (its widest path is " + isa_name(widest) + ")");
    p.isa = Isa::kAvx512;
    p.amx = v == "avx512";
  } else if (!p.reference && v == "amx") {
    if (!cpu_has_amx_int8())
      throw std::invalid_argument("SPECULA_SIMD=" + std::string(specula_simd) +
                                  ": this CPU (or its kernel) offers no AMX-INT8 tile unit (its widest path is " +
                                  int8_kernel_name(int8_kernel_for(widest)) + ")");
    p.isa = Isa::kAvx512;
  } else {
    throw std::invalid_argument("SPECULA_SIMD=" + std::string(specula_simd) +
                                ": not a host path (expected reference, amx, avx512, avx512-vnni, avx2, portable, reference-avx512, "
                                "reference-avx2 or reference-portable)");
  }
  return p;
}

RowsKernel portable_rows_kernel(DType) { return &portable_rows; }

int64_t matmul_grain_rows(size_t row_bytes) {
  // ~4 KiB of weights per unit, at least 4 rows (the AVX2 kernels' row group is 4).
  const int64_t rows = static_cast<int64_t>(4096 / std::max<size_t>(row_bytes, 1));
  return std::max<int64_t>(4, (rows + 3) / 4 * 4);
}

void matmul_isa_path(Isa isa, const MatmulArgs& a, ThreadPool& pool) {
  if (isa == Isa::kAvx2 && !cpu_has_avx2_fma()) throw std::invalid_argument("matmul: AVX2+FMA+F16C path requested on a CPU without it");
  if (isa == Isa::kAvx512 && !cpu_has_avx512()) throw std::invalid_argument("matmul: AVX-512 path requested on a CPU without AVX-512 F/BW/VL");
  const RowsKernel kernel = isa == Isa::kAvx512 ? avx512_rows_kernel(a.dtype, a.cols)
                            : isa == Isa::kAvx2 ? avx2_rows_kernel(a.dtype, a.cols)
                                                : portable_rows_kernel(a.dtype);
  if (a.n <= 0 || a.rows <= 0) return;
  MatmulArgs args = a;
  // The AVX-512 kernels read the same prepared activations as the AVX2 ones.
  if (isa != Isa::kPortable && avx2_needs_prepared_activations(a.dtype)) {
    // Reused across calls (a decode step makes hundreds): n * cols plus n * cols / 32 floats.
    thread_local std::vector<float> xprep, xsum;
    xprep.resize(static_cast<size_t>(a.n * a.cols));
    xsum.resize(prepared_xsum_floats(a.n, a.cols));
    prepare_activations_avx2(a.dtype, a.x, a.n, a.cols, xprep.data(), xsum.data());
    args.xprep = xprep.data();
    args.xsum = xsum.data();
  }
  pool.parallel_for(args.rows, matmul_grain_rows(args.row_bytes), [&](int64_t r0, int64_t r1) { kernel(args, r0, r1); });
}

}  // namespace host_kernels

namespace {

host_kernels::MatmulArgs checked_args(const TensorView& w, const float* x, int64_t n, float* y) {
  if (w.shape.size() != 2)
    throw std::invalid_argument("matmul: weight '" + w.name + "' must be a matrix, has " + std::to_string(w.shape.size()) + " dims");
  if (n < 0) throw std::invalid_argument("matmul: n = " + std::to_string(n) + " is negative");
  host_kernels::MatmulArgs a;
  a.dtype = w.dtype;
  a.rows = w.shape[0];
  a.cols = w.shape[1];
  const int64_t block = dtype_info(w.dtype).block_elems;
  if (a.cols % block != 0)
    throw std::invalid_argument("matmul: weight '" + w.name + "' has " + std::to_string(a.cols) + " columns, not a multiple of the " +
                                dtype_name(w.dtype) + " block size " + std::to_string(block));
  a.row_bytes = dtype_row_bytes(w.dtype, a.cols);
  if (w.data == nullptr || w.nbytes < a.row_bytes * static_cast<size_t>(a.rows))
    throw std::invalid_argument("matmul: weight '" + w.name + "' holds " + std::to_string(w.nbytes) + " bytes, needs " +
                                std::to_string(a.row_bytes * static_cast<size_t>(a.rows)));
  a.w = w.data;
  a.x = x;
  a.n = n;
  a.y = y;
  return a;
}

}  // namespace

void matmul(const TensorView& w, const float* x, int64_t n, float* y, ThreadPool& pool, host_kernels::Isa isa) {
  host_kernels::matmul_isa_path(isa, checked_args(w, x, n, y), pool);
}

void matmul(const TensorView& w, const float* x, int64_t n, float* y, ThreadPool& pool) {
  host_kernels::matmul_isa_path(host_kernels::default_isa(), checked_args(w, x, n, y), pool);
}

void matmul_reference(const TensorView& w, const float* x, int64_t n, float* y) {
  const host_kernels::MatmulArgs a = checked_args(w, x, n, y);
  std::vector<float> row(static_cast<size_t>(a.cols));
  for (int64_t r = 0; r < a.rows; ++r) {
    dequantize_row(a.dtype, a.w + static_cast<size_t>(r) * a.row_bytes, row.data(), a.cols);
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + i * a.cols;
      float s = 0.0f;
      for (int64_t j = 0; j < a.cols; ++j) s += row[static_cast<size_t>(j)] * xi[j];
      y[i * a.rows + r] = s;
    }
  }
}

const char* matmul_isa() { return host_kernels::isa_name(host_kernels::default_isa()); }

}  // namespace specula
