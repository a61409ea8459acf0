// Host implementations of the small ops; the matmul lives in matmul*.cpp.
#include "gpu/host/host_device.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <map>
#include <mutex>
#include <vector>

#include <sys/mman.h>

#include "gpu/host/attention.h"
#include "gpu/host/hmatmul.h"
#include "gpu/host/matmul.h"
#include "gpu/host/quant.h"
#include "gpu/kv_cache.h"
#include "model/mapped_file.h"

namespace specula {

HostOps::HostOps(int threads) : HostOps(threads, host_kernels::host_path_for(std::getenv("SPECULA_SIMD"))) {}

HostOps::HostOps(int threads, host_kernels::HostPath path)
    : path_(path), int8_(host_kernels::int8_kernel_for(path.isa, path.amx)), pool_(std::max(1, threads)) {
  if (path_.isa == host_kernels::Isa::kAvx512 && !host_kernels::cpu_has_avx512())
    throw std::invalid_argument("host path avx512: this CPU has no AVX-512 F/BW/VL");
  if (path_.isa == host_kernels::Isa::kAvx2 && !host_kernels::cpu_has_avx2_fma())
    throw std::invalid_argument("host path avx2: this CPU has no AVX2+FMA+F16C");
  if (const char* kv = std::getenv("SPECULA_KV"); kv != nullptr && *kv != '\0') {
    if (std::strcmp(kv, "bf16") == 0)
      kv_bf16_wanted_ = true;
    else if (std::strcmp(kv, "fp16") != 0)
      throw std::invalid_argument(std::string("SPECULA_KV=") + kv + ": expected fp16 or bf16");
  }
}

bool HostOps::kv_f16() const { return !path_.reference; }

// The layout the AVX-512 and AVX2 attention kernels read fastest (gpu/host/attention.h), wherever
// they run (their score passes take q of up to 512 dimensions).
bool HostOps::kv_k_transposed(int64_t head_dim, int64_t block_tokens) const {
  return kv_f16() && path_.isa != host_kernels::Isa::kPortable && head_dim % 16 == 0 && head_dim <= 512 &&
         block_tokens % 16 == 0;
}

// With SPECULA_KV=bf16, bf16 pairs where the AVX-512 attention can multiply them (AVX-512 BF16);
// the fp16 cache otherwise (docs/kernels.md, "K and V in bf16 pairs": faster at long context, a
// little further from the reference).
bool HostOps::kv_bf16(int64_t head_dim, int64_t block_tokens) const {
  return kv_bf16_wanted_ && kv_k_transposed(head_dim, block_tokens) && path_.isa == host_kernels::Isa::kAvx512 &&
         host_kernels::cpu_has_avx512_bf16();
}

std::string HostOps::name() const {
  return "host (" + path_.name() + ", " + std::to_string(pool_.threads()) + " threads)";
}

float* HostOps::alloc(size_t n) {
  // 64-byte aligned so SIMD loads of activation rows never split cache lines.
  const size_t bytes = ((std::max<size_t>(n, 1) * sizeof(float)) + 63) / 64 * 64;
  if (bytes >= kMapThreshold) {
    // Large pools (the KV cache) come zeroed from the kernel page by page as they are touched,
    // so an 8192-position cache costs nothing until it is used.
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    std::lock_guard<std::mutex> lock(mapped_mutex_);
    mapped_[p] = bytes;
    return static_cast<float*>(p);
  }
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, bytes);
  return static_cast<float*>(p);
}

void HostOps::release(float* p) {
  {
    std::lock_guard<std::mutex> lock(mapped_mutex_);
    if (auto it = mapped_.find(p); it != mapped_.end()) {
      munmap(p, it->second);
      mapped_.erase(it);
      return;
    }
  }
  std::free(p);
}
void HostOps::copy_to_host(const float* src, float* dst, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void HostOps::copy_to_device(const float* src, float* dst, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }

Weight HostOps::upload(const TensorView& t) {
  Weight w;
  w.view = t;  // the stored tensor: the mapped file
  if (t.shape.size() != 2) return w;
  if (!path_.reference) {
    const bool half = hmatmul_supports(t.dtype, path_.isa == host_kernels::Isa::kPortable) && t.cols() % 2 == 0 &&
                      (path_.isa != host_kernels::Isa::kAvx2);
    if (half || (qmatmul_supports(t.dtype) && t.cols() % 32 == 0)) {
      std::lock_guard<std::mutex> lock(packed_mutex_);
      auto& slot = packed_[t.data];
      std::shared_ptr<PackedMatrix> p = slot.lock();
      if (!p || p->stored != t.dtype || p->rows != t.rows() || p->cols != t.cols()) {
        p = half ? pack_matrix16(t, pool_, &arena_) : pack_matrix(t, pool_, &arena_, /*narrow=*/true);
        slot = p;
      }
      w.device = p.get();
      w.owner = p;
      return w;
    }
    // One line per type and process: which weights run on the f32 kernels.
    static std::mutex m;
    static std::map<DType, bool> said;
    std::lock_guard<std::mutex> lock(m);
    if (t.dtype != DType::F32 && !said[t.dtype]) {
      said[t.dtype] = true;
      std::fprintf(stderr, "specula: no fast kernel for %s weights (first: %s); they use the f32 reference kernels\n",
                   dtype_name(t.dtype), t.name.c_str());
    }
  }
  // The f32 kernels read the stored tensor, or a type they do not read (Q5_0, IQ4_NL, Q3_K) as its
  // exact conversion (kernel_view), made once per tensor and kept by the device.
  if (dtype_has_kernels(t.dtype)) return w;
  std::lock_guard<std::mutex> lock(packed_mutex_);
  auto& view = converted_[t.data];
  if (view.empty()) view = kernel_view(t, converted_storage_);
  w.view = view;
  return w;
}

Weight HostOps::upload_table(const TensorView& t) {
  Weight w;
  w.view = t;
  return w;
}

void HostOps::release_stored(const Weight& w) {
  if (w.device != nullptr) release_mapped_pages(w.view.data, w.view.nbytes);
}

size_t HostOps::read_bytes(const Weight& w) const {
  return w.device != nullptr ? static_cast<const PackedMatrix*>(w.device)->bytes() : w.view.nbytes;
}

size_t HostOps::packed_bytes() const {
  std::lock_guard<std::mutex> lock(packed_mutex_);
  size_t b = 0;
  for (const auto& [data, weak] : packed_)
    if (auto p = weak.lock()) b += p->bytes();
  return b;
}

void HostOps::embed(const Weight& table, std::span<const int32_t> tokens, float* out) {
  const int64_t dim = table.cols(), vocab = table.rows();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab)
      throw std::out_of_range("token id " + std::to_string(tokens[i]) + " outside the vocabulary of " +
                              std::to_string(vocab));
    dequantize_row(table.view.dtype, table.view.row(tokens[i]), out + i * dim, dim);
  }
}

void HostOps::rmsnorm(const float* x, const Weight& w, float eps, int64_t n, int64_t dim, float* out) {
  const float* g = reinterpret_cast<const float*>(w.view.data);
  if (path_.isa != host_kernels::Isa::kPortable) {
    host_kernels::rmsnorm_avx2(x, g, eps, n, dim, out);  // the loop below, bit for bit
    return;
  }
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    // Mean of squares in double: the reference (HF) accumulates in float32 but with a tree
    // reduction; double keeps us within rounding of either.
    // Eight partial sums (lane j takes i = j mod 8) added pairwise: the same order whatever
    // the call, and no chain of dim dependent additions.
    double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i0 = 0;
    for (; i0 + 8 <= dim; i0 += 8)
      for (int j = 0; j < 8; ++j) part[j] += static_cast<double>(xr[i0 + j]) * xr[i0 + j];
    for (int64_t i = i0; i < dim; ++i) part[i - i0] += static_cast<double>(xr[i]) * xr[i];
    const double ss = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * g[i];
  }
}

void HostOps::matmul(const float* x, const Weight& w, int64_t n, float* y) {
  if (w.device != nullptr) {
    const PackedMatrix* m = static_cast<const PackedMatrix*>(w.device);
    if (qmatmul_supports(m->stored)) qmatmul({&m, 1}, x, n, {&y, 1}, pool_, int8_);
    else hmatmul({&m, 1}, x, n, {&y, 1}, pool_, path_.isa == host_kernels::Isa::kPortable);
    return;
  }
  specula::matmul(w.view, x, n, y, pool_, path_.isa);
}

namespace {

// w's matrix as repacked for the int8 path; nullptr where it runs elsewhere (the reference path,
// the 16-bit path, a type without an int8 kernel). By the stored type: a five-bit Q8_0 matrix is
// packed as Q5_0 (pack_matrix).
const PackedMatrix* int8_matrix(const Weight& w) {
  const auto* m = static_cast<const PackedMatrix*>(w.device);
  return m != nullptr && qmatmul_supports(m->stored) ? m : nullptr;
}

}  // namespace

void HostOps::matmul_logits(const float* x, const Weight& w, int64_t n, float* y) {
  if (const PackedMatrix* m = int8_matrix(w)) qmatmul_logits(*m, w.view, x, n, y, pool_, int8_);
  else matmul(x, w, n, y);
}

void HostOps::matmul_refined(const float* x, const Weight& w, int64_t n, float* y) {
  if (const PackedMatrix* m = int8_matrix(w)) qmatmul_refined(*m, x, n, y, pool_, int8_);
  else matmul(x, w, n, y);
}

void HostOps::matmul_many(const float* x, std::span<const Weight* const> ws, int64_t n, std::span<float* const> ys) {
  const PackedMatrix* packed[8];
  bool all = ws.size() <= 8;
  for (size_t k = 0; all && k < ws.size(); ++k) {
    packed[k] = static_cast<const PackedMatrix*>(ws[k]->device);
    all = packed[k] != nullptr && packed[k]->cols == packed[0]->cols &&
          qmatmul_supports(packed[k]->stored) == qmatmul_supports(packed[0]->stored) &&
          (qmatmul_supports(packed[k]->stored) || packed[k]->dtype == packed[0]->dtype);
  }
  if (!all) {
    Ops::matmul_many(x, ws, n, ys);
    return;
  }
  if (qmatmul_supports(packed[0]->stored)) qmatmul({packed, ws.size()}, x, n, ys, pool_, int8_);
  else hmatmul({packed, ws.size()}, x, n, ys, pool_, path_.isa == host_kernels::Isa::kPortable);
}

void HostOps::rope(float* x, int64_t n, int64_t heads, int64_t head_dim, std::span<const int32_t> positions,
                   std::span<const float> inv_freq, RopeStyle style) {
  const int64_t half = head_dim / 2;
  // cos/sin per (row, frequency), kept for the next call with the same positions and frequencies
  // (q and k of every layer of one forward).
  thread_local std::vector<int32_t> cached_positions;
  thread_local std::vector<float> cached_freq, cs, sn;
  positions = positions.first(static_cast<size_t>(n));
  if (!std::equal(positions.begin(), positions.end(), cached_positions.begin(), cached_positions.end()) ||
      !std::equal(inv_freq.begin(), inv_freq.begin() + half, cached_freq.begin(), cached_freq.end())) {
    cached_positions.assign(positions.begin(), positions.end());
    cached_freq.assign(inv_freq.begin(), inv_freq.begin() + half);
    cs.resize(static_cast<size_t>(n * half));
    sn.resize(cs.size());
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < half; ++i) {
        // Angle in float32 as the reference implementations compute it.
        const float a = static_cast<float>(positions[t]) * inv_freq[i];
        cs[t * half + i] = std::cos(a);
        sn[t * half + i] = std::sin(a);
      }
  }
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cs.data() + t * half;
    const float* s = sn.data() + t * half;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // Interleaved rotates (2i, 2i+1); HalfSplit rotates (i, i + d/2).
        const int64_t a = style == RopeStyle::Interleaved ? 2 * i : i;
        const int64_t b = style == RopeStyle::Interleaved ? 2 * i + 1 : i + half;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c[i] - x1 * s[i];
        v[b] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}

void HostOps::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  if (!path_.reference && path_.isa != host_kernels::Isa::kPortable) {
    // Element-wise, so any split gives the same bits; one thread below a few microseconds' work.
    // The 512-bit kernel's values are the 256-bit one's, at half the instructions (a 5-token
    // forward's SwiGLU, 7,680 values a layer on the calling thread, is on its critical path).
    const auto kernel = path_.isa == host_kernels::Isa::kAvx512 ? &host_kernels::swiglu_avx512 : &host_kernels::swiglu_avx2;
    if (n < 8192) {
      kernel(gate, up, n, out);
    } else {
      pool_.parallel_for(n, 1024, [&](int64_t b, int64_t e) { kernel(gate + b, up + b, e - b, out + b); });
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void HostOps::add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void HostOps::kv_store(KvCache& kv, int layer, const float* k, const float* v, std::span<const SeqSlice> slices) {
  host_kernels::kv_store(kv, layer, k, v, slices);
}

void HostOps::attention(const float* q, KvCache& kv, int layer, std::span<const SeqSlice> slices, int64_t heads,
                        float* out) {
  host_kernels::attention(q, kv, layer, slices, heads, out, pool_, path_.isa);
}

void HostOps::gather_rows(const float* src, int64_t cols, std::span<const int64_t> rows, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i) std::memcpy(dst + i * cols, src + rows[i] * cols, cols * sizeof(float));
}

}  // namespace specula
