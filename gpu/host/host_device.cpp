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
#include "gpu/host/matmul.h"
#include "gpu/host/quant.h"
#include "gpu/kv_cache.h"

namespace specula {

namespace {

// Eight independent partial sums so the compiler can vectorise without -ffast-math; cloned
// for AVX2+FMA and picked at load time (GCC ifunc), the default clone for other CPUs.
__attribute__((target_clones("avx2,fma", "default"))) float dot(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

__attribute__((target_clones("avx2,fma", "default"))) void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace

namespace host_kernels {

namespace {

inline float kv_value(const float* p) { return *p; }
inline float kv_value(const uint16_t* p) { return fp16_to_f32(*p); }

template <class T>
void chunk_portable(const AttentionChunk& c) {
  const int64_t n = c.p1 - c.p0, hd = c.head_dim, bt = c.block_tokens, rf = c.row_floats;
  auto row = [&](const void* base, int64_t p) {
    return static_cast<const T*>(base) + (static_cast<int64_t>(c.blocks[p / bt]) * bt + p % bt) * rf;
  };
  for (int64_t g = 0; g < c.group; ++g) {
    const float* q = c.q + g * hd;
    float* s = c.scores + g * n;
    for (int64_t p = c.p0; p < c.p1; ++p) {
      const T* k = row(c.k, p);
      float d = 0;
      for (int64_t j = 0; j < hd; ++j) d += q[j] * kv_value(k + j);
      s[p - c.p0] = d * c.scale;
    }
    float m = s[0];
    for (int64_t j = 1; j < n; ++j) m = std::max(m, s[j]);
    float l = 0;
    for (int64_t j = 0; j < n; ++j) l += (s[j] = std::exp(s[j] - m));
    c.m[g] = m;
    c.l[g] = l;
    float* o = c.o + g * hd;
    std::fill(o, o + hd, 0.0f);
    for (int64_t p = c.p0; p < c.p1; ++p) {
      const T* v = row(c.v, p);
      for (int64_t j = 0; j < hd; ++j) o[j] += s[p - c.p0] * kv_value(v + j);
    }
  }
}

}  // namespace

void to_fp16(const float* src, uint16_t* dst, int64_t n) {
  if (cpu_has_avx2_fma()) {
    to_fp16_avx2(src, dst, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_fp16(src[i]);
}

void attention_chunk_portable(const AttentionChunk& c) {
  if (c.f16)
    chunk_portable<uint16_t>(c);
  else
    chunk_portable<float>(c);
}

}  // namespace host_kernels

HostOps::HostOps(int threads) : HostOps(threads, host_kernels::host_path_for(std::getenv("SPECULA_SIMD"))) {}

HostOps::HostOps(int threads, host_kernels::HostPath path) : path_(path), pool_(std::max(1, threads)) {
  if (path_.isa == host_kernels::Isa::kAvx512 && !host_kernels::cpu_has_avx512())
    throw std::invalid_argument("host path avx512: this CPU has no AVX-512 F/BW/VL");
  if (path_.isa == host_kernels::Isa::kAvx2 && !host_kernels::cpu_has_avx2_fma())
    throw std::invalid_argument("host path avx2: this CPU has no AVX2+FMA+F16C");
}

bool HostOps::kv_f16() const { return !path_.reference; }

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
  w.view = t;  // the reference path computes straight from the mapped file
  if (path_.reference || t.shape.size() != 2) return w;
  if (!qmatmul_supports(t.dtype) || t.cols() % 32 != 0) {
    // One line per type and process: which weights run on the f32 kernels.
    static std::mutex m;
    static std::map<DType, bool> said;
    std::lock_guard<std::mutex> lock(m);
    if (t.dtype != DType::F32 && !said[t.dtype]) {
      said[t.dtype] = true;
      std::fprintf(stderr, "specula: no int8 kernel for %s weights (first: %s); they use the f32 reference kernels\n",
                   dtype_name(t.dtype), t.name.c_str());
    }
    return w;
  }
  std::lock_guard<std::mutex> lock(packed_mutex_);
  auto& slot = packed_[t.data];
  std::shared_ptr<PackedMatrix> p = slot.lock();
  if (!p || p->dtype != t.dtype || p->rows != t.rows() || p->cols != t.cols()) {
    p = pack_matrix(t, pool_);
    slot = p;
  }
  w.device = p.get();
  w.owner = p;
  return w;
}

Weight HostOps::upload_table(const TensorView& t) {
  Weight w;
  w.view = t;
  return w;
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
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    // Mean of squares in double: the reference (HF) accumulates in float32 but with a tree
    // reduction; double keeps us within rounding of either.
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * g[i];
  }
}

void HostOps::matmul(const float* x, const Weight& w, int64_t n, float* y) {
  if (w.device != nullptr) {
    const PackedMatrix* m = static_cast<const PackedMatrix*>(w.device);
    qmatmul({&m, 1}, x, n, {&y, 1}, pool_, path_.isa);
    return;
  }
  specula::matmul(w.view, x, n, y, pool_, path_.isa);
}

void HostOps::matmul_many(const float* x, std::span<const Weight* const> ws, int64_t n, std::span<float* const> ys) {
  const PackedMatrix* packed[8];
  bool all = ws.size() <= 8;
  for (size_t k = 0; all && k < ws.size(); ++k) {
    packed[k] = static_cast<const PackedMatrix*>(ws[k]->device);
    all = packed[k] != nullptr && packed[k]->cols == packed[0]->cols;
  }
  if (!all) {
    Ops::matmul_many(x, ws, n, ys);
    return;
  }
  qmatmul({packed, ws.size()}, x, n, ys, pool_, path_.isa);
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
    host_kernels::swiglu_avx2(gate, up, n, out);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void HostOps::add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void HostOps::kv_store(KvCache& kv, int layer, const float* k, const float* v, std::span<const SeqSlice> slices) {
  const int64_t rf = kv.row_floats();
  if (kv.config().f16) {
    uint16_t* kp = kv.k_pool_f16(layer);
    uint16_t* vp = kv.v_pool_f16(layer);
    for (const SeqSlice& s : slices)
      for (int64_t i = 0; i < s.n; ++i) {
        const int64_t off = kv.offset(s.seq, s.start + i);
        host_kernels::to_fp16(k + (s.row + i) * rf, kp + off, rf);
        host_kernels::to_fp16(v + (s.row + i) * rf, vp + off, rf);
      }
    return;
  }
  float* kp = kv.k_pool(layer);
  float* vp = kv.v_pool(layer);
  for (const SeqSlice& s : slices)
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t off = kv.offset(s.seq, s.start + i);
      std::memcpy(kp + off, k + (s.row + i) * rf, rf * sizeof(float));
      std::memcpy(vp + off, v + (s.row + i) * rf, rf * sizeof(float));
    }
}

void HostOps::attention(const float* q, KvCache& kv, int layer, std::span<const SeqSlice> slices, int64_t heads,
                        float* out) {
  const int64_t hd = kv.config().head_dim, kvh = kv.config().kv_heads, group = heads / kvh;
  const int64_t bt = kv.config().block_tokens, rf = kv.row_floats();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool simd = path_.isa != host_kernels::Isa::kPortable && hd % 8 == 0;

  // Partials per (token row, kv head, chunk of kChunkTokens positions), a row's contiguous. Work
  // items are (slice, kv head, chunk): one item scores that chunk for every row of the slice
  // that reaches it, so a verify round reads each K/V chunk from memory once for all its rows;
  // each row's chunk is computed by the same call as if it were alone.
  struct Row { const SeqSlice* s; int64_t i, first_partial, chunks; };
  struct Item { size_t first_row, rows; int64_t kh, chunk; };
  std::vector<Row> rows;
  std::vector<Item> items;
  int64_t partials = 0, work = 0, max_chunk = 0;
  for (const SeqSlice& s : slices) {
    const size_t first_row = rows.size();
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t ctx = s.start + i + 1, chunks = (ctx + host_kernels::kChunkTokens - 1) / host_kernels::kChunkTokens;
      rows.push_back({&s, i, partials, chunks});
      partials += chunks * kvh;
      work += ctx;
      max_chunk = std::max(max_chunk, std::min(ctx, host_kernels::kChunkTokens));
    }
    if (s.n == 0) continue;
    for (int64_t kh = 0; kh < kvh; ++kh)
      for (int64_t c = 0; c < rows.back().chunks; ++c) items.push_back({first_row, static_cast<size_t>(s.n), kh, c});
  }
  // Per partial: m[group], l[group], o[group * hd].
  const int64_t per_item = group * (2 + hd);
  thread_local std::vector<float> partial;
  partial.resize(static_cast<size_t>(partials * per_item));
  float* const part = partial.data();
  const bool f16 = kv.config().f16;
  const void* kp = f16 ? static_cast<const void*>(kv.k_pool_f16(layer)) : kv.k_pool(layer);
  const void* vp = f16 ? static_cast<const void*>(kv.v_pool_f16(layer)) : kv.v_pool(layer);
  const int64_t esize = f16 ? 2 : 4;

  auto run = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(group * max_chunk));
    for (int64_t it = begin; it < end; ++it) {
      const Item& item = items[static_cast<size_t>(it)];
      for (size_t r = item.first_row; r < item.first_row + item.rows; ++r) {
        const Row& row = rows[r];
        if (item.chunk >= row.chunks) continue;  // this row's context ends before the chunk
        const int64_t ctx = row.s->start + row.i + 1, trow = row.s->row + row.i;
        host_kernels::AttentionChunk c;
        c.q = q + (trow * heads + item.kh * group) * hd;
        c.k = static_cast<const char*>(kp) + item.kh * hd * esize;
        c.v = static_cast<const char*>(vp) + item.kh * hd * esize;
        c.f16 = f16;
        c.blocks = kv.block_table(row.s->seq).data();
        c.block_tokens = bt;
        c.row_floats = rf;
        c.head_dim = hd;
        c.group = group;
        c.p0 = item.chunk * host_kernels::kChunkTokens;
        c.p1 = std::min(ctx, c.p0 + host_kernels::kChunkTokens);
        c.scale = scale;
        float* pi = part + (row.first_partial + item.kh * row.chunks + item.chunk) * per_item;
        c.m = pi;
        c.l = pi + group;
        c.o = pi + 2 * group;
        c.scores = scores.data();
        if (simd)
          host_kernels::attention_chunk_avx2(c);
        else
          host_kernels::attention_chunk_portable(c);
      }
    }
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (work * heads * hd < (1 << 16) || pool_.threads() == 1)
    run(0, n_items);
  else
    pool_.parallel_for(n_items, 1, run);

  // Combine each (row, kv head)'s chunks in chunk order.
  for (const Row& row : rows) {
    const int64_t trow = row.s->row + row.i;
    for (int64_t kh = 0; kh < kvh; ++kh) {
      const float* first = part + (row.first_partial + kh * row.chunks) * per_item;
      for (int64_t g = 0; g < group; ++g) {
        float* o = out + (trow * heads + kh * group + g) * hd;
        if (row.chunks == 1) {
          const float inv = 1.0f / first[group + g];
          for (int64_t d = 0; d < hd; ++d) o[d] = first[2 * group + g * hd + d] * inv;
          continue;
        }
        float m = -INFINITY;
        for (int64_t c = 0; c < row.chunks; ++c) m = std::max(m, first[c * per_item + g]);
        float l = 0;
        std::fill(o, o + hd, 0.0f);
        for (int64_t c = 0; c < row.chunks; ++c) {
          const float* pc = first + c * per_item;
          const float f = std::exp(pc[g] - m);
          l += f * pc[group + g];
          for (int64_t d = 0; d < hd; ++d) o[d] += f * pc[2 * group + g * hd + d];
        }
        const float inv = 1.0f / l;
        for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
      }
    }
  }
}

void HostOps::gather_rows(const float* src, int64_t cols, std::span<const int64_t> rows, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i) std::memcpy(dst + i * cols, src + rows[i] * cols, cols * sizeof(float));
}

}  // namespace specula
