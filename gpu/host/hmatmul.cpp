// The 16-bit weight path's packing, activation rounding, portable kernels and dispatch
// (hmatmul.h); the AVX-512 kernels are in hmatmul_avx512.cpp (F16) and hmatmul_avx512bf16.cpp.
#include "gpu/host/hmatmul.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/host/quant.h"

namespace specula {

namespace {

constexpr int64_t kGroupRows = 16;
constexpr size_t kPairBytes = 64;  // 16 rows x 2 values x 2 bytes
constexpr int64_t kChains = 4;     // partial sums per output (hmatmul.h)

float bf16_daz(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  if (((u >> 23) & 0xFF) == 0) u &= 0x80000000u;  // denormal inputs read as zero
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float ftz(float f) { return std::fabs(f) < 1.17549435e-38f ? std::copysign(0.0f, f) : f; }

uint16_t lane(const uint8_t* pair, int64_t r, int64_t j) {
  uint16_t v;
  std::memcpy(&v, pair + 4 * r + 2 * j, 2);
  return v;
}

template <DType T>
void portable16(const PackedMatrix& m, const host_kernels::HalfRows& x, float* y, int64_t ldy, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* gp = m.group(g);
    for (int64_t r = 0; r < kGroupRows && g * kGroupRows + r < m.rows; ++r)
      for (int64_t i = 0; i < x.n; ++i) {
        float acc[kChains] = {};
        for (int64_t p = 0; p < m.blocks; ++p) {
          const uint8_t* pair = gp + static_cast<size_t>(p) * kPairBytes;
          float& a = acc[p % kChains];
          if constexpr (T == DType::F16) {
            const float* xr = x.f32 + i * x.cols + 2 * p;
            a = std::fma(fp16_to_f32(lane(pair, r, 0)), xr[0], a);
            a = std::fma(fp16_to_f32(lane(pair, r, 1)), xr[1], a);
          } else {
            const uint16_t* xr = x.bf16 + i * x.cols + 2 * p;
            a = host_kernels::dpbf16_pair(a, lane(pair, r, 0), lane(pair, r, 1), xr[0], xr[1]);
          }
        }
        y[i * ldy + g * kGroupRows + r] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      }
  }
}

host_kernels::Packed16Kernel kernel_for(DType t, bool portable) {
  host_kernels::Packed16Kernel k = nullptr;
  if (portable) k = host_kernels::portable_packed16_kernel(t);
  else if (t == DType::F16) k = host_kernels::avx512_packed16_kernel(t);
  else if (t == DType::BF16) k = host_kernels::avx512bf16_packed16_kernel(t);
  if (k == nullptr || !hmatmul_supports(t, portable))
    throw std::invalid_argument(std::string("16-bit path: no kernel for ") + dtype_name(t) + " on this CPU");
  return k;
}

}  // namespace

namespace host_kernels {

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__)
  static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

uint16_t f32_to_bf16_ftz(float v) { return f32_to_bf16(ftz(v)); }

float dpbf16_pair(float acc, uint16_t a_even, uint16_t a_odd, uint16_t b_even, uint16_t b_odd) {
  acc = ftz(std::fma(bf16_daz(a_odd), bf16_daz(b_odd), acc));
  return ftz(std::fma(bf16_daz(a_even), bf16_daz(b_even), acc));
}

Packed16Kernel portable_packed16_kernel(DType t) {
  switch (t) {
    case DType::F16: return &portable16<DType::F16>;
    case DType::BF16: return &portable16<DType::BF16>;
    default: return nullptr;
  }
}

}  // namespace host_kernels

bool hmatmul_supports(DType t, bool portable) {
  if (t != DType::F16 && t != DType::BF16) return false;
  if (portable) return true;
  return t == DType::F16 ? host_kernels::cpu_has_avx512() : host_kernels::cpu_has_avx512_bf16();
}

std::shared_ptr<PackedMatrix> pack_matrix16(const TensorView& w, ThreadPool& pool, WeightArena* arena) {
  if (w.dtype != DType::F16 && w.dtype != DType::BF16)
    throw std::invalid_argument(std::string("16-bit path: no packed layout for ") + dtype_name(w.dtype));
  if (w.shape.size() != 2 || w.cols() % 2 != 0)
    throw std::invalid_argument("16-bit path: weight '" + w.name + "' is not a matrix of an even width");
  const size_t row_bytes = static_cast<size_t>(w.cols()) * 2;
  if (w.data == nullptr || w.nbytes < row_bytes * static_cast<size_t>(w.rows()))
    throw std::invalid_argument("16-bit path: weight '" + w.name + "' holds too few bytes");
  auto m = std::make_shared<PackedMatrix>();
  m->dtype = w.dtype;
  m->stored = w.dtype;
  m->rows = w.rows();
  m->cols = w.cols();
  m->groups = (m->rows + kGroupRows - 1) / kGroupRows;
  m->blocks = m->cols / 2;
  m->block_bytes = kPairBytes;
  m->data = packed_storage(m->bytes(), arena);
  const auto* base = reinterpret_cast<const uint8_t*>(w.data);
  pool.parallel_for(m->groups, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      uint8_t* dst = m->data.get() + m->group_bytes() * static_cast<size_t>(g);
      std::memset(dst, 0, m->group_bytes());
      for (int64_t r = 0; r < kGroupRows && g * kGroupRows + r < m->rows; ++r) {
        const uint8_t* src = base + static_cast<size_t>(g * kGroupRows + r) * row_bytes;
        for (int64_t p = 0; p < m->blocks; ++p) std::memcpy(dst + static_cast<size_t>(p) * kPairBytes + 4 * r, src + 4 * p, 4);
      }
    }
  });
  return m;
}

void hmatmul(std::span<const PackedMatrix* const> ws, const float* x, int64_t n, std::span<float* const> ys,
             ThreadPool& pool, bool portable) {
  if (ws.empty() || n <= 0) return;
  if (ws.size() != ys.size()) throw std::invalid_argument("hmatmul: as many outputs as weights");
  if (ws.size() > 8) throw std::invalid_argument("hmatmul: at most 8 fused weights");
  const int64_t cols = ws[0]->cols;
  const DType t = ws[0]->dtype;
  for (const PackedMatrix* w : ws)
    if (w->cols != cols || w->dtype != t) throw std::invalid_argument("hmatmul: fused weights differ in width or type");
  host_kernels::HalfRows hx{n, cols, x, nullptr};
  thread_local std::vector<uint16_t> bf;
  if (t == DType::BF16) {
    bf.resize(static_cast<size_t>(n * cols));
    for (size_t i = 0; i < bf.size(); ++i) bf[i] = host_kernels::f32_to_bf16_ftz(x[i]);
    hx.bf16 = bf.data();
  }
  const host_kernels::Packed16Kernel kernel = kernel_for(t, portable);
  struct Part { const PackedMatrix* w; float* y; int64_t first; };
  Part parts[8];
  int64_t total = 0;
  for (size_t k = 0; k < ws.size(); ++k) {
    parts[k] = {ws[k], ys[k], total};
    total += ws[k]->groups;
  }
  const size_t nparts = ws.size();
  pool.parallel_for(total, 1, [&](int64_t g0, int64_t g1) {
    for (size_t k = 0; k < nparts && g0 < g1; ++k) {
      const Part& p = parts[k];
      const int64_t end = p.first + p.w->groups;
      if (g0 >= end) continue;
      const int64_t e = std::min(g1, end);
      kernel(*p.w, hx, p.y, p.w->rows, g0 - p.first, e - p.first);
      g0 = e;
    }
  });
}

}  // namespace specula
