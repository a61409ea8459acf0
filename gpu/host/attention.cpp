// The host's attention and K/V store (gpu/host/attention.h): work items, the portable chunk
// kernel, and the merge of a row's chunks; the AVX2 and AVX-512 chunk kernels are in
// attention_avx2.cpp and attention_avx512.cpp.
#include "gpu/host/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu/host/hmatmul.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/quant.h"
#include "gpu/kv_cache.h"

namespace specula::host_kernels {

namespace {

inline float kv_value(const float* p) { return *p; }
inline float kv_value(const uint16_t* p) { return fp16_to_f32(*p); }

// m = max s, s = exp(s - m), l = sum s over the n >= 1 scores at s (the portable kernels' softmax).
void exp_scores_portable(float* s, int64_t n, float* m, float* l) {
  *m = s[0];
  for (int64_t j = 1; j < n; ++j) *m = std::max(*m, s[j]);
  *l = 0;
  for (int64_t j = 0; j < n; ++j) *l += (s[j] = std::exp(s[j] - *m));
}

template <class T>
void chunk_portable(const AttentionChunk& c) {
  const int64_t n = c.p1 - c.p0, hd = c.head_dim, bt = c.block_tokens, rf = c.row_stride;
  auto row = [&](const void* base, int64_t p) {
    return static_cast<const T*>(base) + (static_cast<int64_t>(c.blocks[p / bt]) * bt + p % bt) * rf;
  };
  // K's dimension j of position p is at k_at(p) + j * k_step, in either K layout.
  const int64_t k_step = c.k_transposed ? bt : 1;
  auto k_at = [&](int64_t p) {
    if (!c.k_transposed) return row(c.k, p);
    return static_cast<const T*>(c.k) + static_cast<int64_t>(c.blocks[p / bt]) * bt * rf + p % bt;
  };
  for (int64_t g = 0; g < c.group; ++g) {
    const float* q = c.q + g * hd;
    float* s = c.scores + g * n;
    for (int64_t p = c.p0; p < c.p1; ++p) {
      const T* k = k_at(p);
      float d = 0;
      for (int64_t j = 0; j < hd; ++j) d += q[j] * kv_value(k + j * k_step);
      s[p - c.p0] = d * c.scale;
    }
    exp_scores_portable(s, n, c.m + g, c.l + g);
    float* o = c.o + g * hd;
    std::fill(o, o + hd, 0.0f);
    for (int64_t p = c.p0; p < c.p1; ++p) {
      const T* v = row(c.v, p);
      for (int64_t j = 0; j < hd; ++j) o[j] += s[p - c.p0] * kv_value(v + j);
    }
  }
}

// Over bf16 pairs (AttentionChunk::bf16): vdpbf16ps's arithmetic (dpbf16_pair), the scores one
// chain over the dimension pairs and each output one chain over the position pairs, as
// attention_avx512bf16.cpp computes them.
void chunk_portable_bf16(const AttentionChunk& c) {
  const int64_t n = c.p1 - c.p0, hd = c.head_dim, bt = c.block_tokens, rf = c.row_stride;
  const uint16_t* k = static_cast<const uint16_t*>(c.k);
  const uint16_t* v = static_cast<const uint16_t*>(c.v);
  auto base = [&](int64_t p) { return static_cast<int64_t>(c.blocks[p / bt]) * bt; };
  std::vector<uint16_t> qb(static_cast<size_t>(hd)), pb(static_cast<size_t>(n + 1));
  for (int64_t g = 0; g < c.group; ++g) {
    const float* q = c.q + g * hd;
    for (int64_t d = 0; d < hd; ++d) qb[static_cast<size_t>(d)] = f32_to_bf16_ftz(q[d]);
    float* s = c.scores + g * n;
    for (int64_t p = c.p0; p < c.p1; ++p) {
      const uint16_t* kp = k + base(p) * rf + 2 * (p % bt);
      float a = 0;
      for (int64_t d = 0; d < hd; d += 2, kp += 2 * bt) a = dpbf16_pair(a, kp[0], kp[1], qb[d], qb[d + 1]);
      s[p - c.p0] = a * c.scale;
    }
    exp_scores_portable(s, n, c.m + g, c.l + g);
    for (int64_t j = 0; j < n; ++j) pb[static_cast<size_t>(j)] = f32_to_bf16_ftz(s[j]);
    pb[static_cast<size_t>(n)] = 0;
    float* o = c.o + g * hd;
    std::fill(o, o + hd, 0.0f);
    for (int64_t p = c.p0; p < c.p1; p += 2) {  // p0 is even, so p is the pair's first position
      const uint16_t* vp = v + (base(p) + (p % bt)) * rf;
      const bool both = p + 1 < c.p1;  // an odd length's last pair: its second half counts as zero
      const uint16_t w0 = pb[static_cast<size_t>(p - c.p0)], w1 = both ? pb[static_cast<size_t>(p + 1 - c.p0)] : 0;
      for (int64_t d = 0; d < hd; ++d) o[d] = dpbf16_pair(o[d], vp[2 * d], both ? vp[2 * d + 1] : 0, w0, w1);
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

void chunk_row_offsets(const AttentionChunk& c, int64_t n, int64_t* off) {
  const int64_t bt = c.block_tokens;
  for (int64_t j = 0, b = c.p0 / bt, i = c.p0 % bt; j < n; ++j) {
    off[j] = (static_cast<int64_t>(c.blocks[b]) * bt + i) * c.row_stride;
    if (++i == bt) {
      i = 0;
      ++b;
    }
  }
}

void attention_chunk_portable(const AttentionChunk& c) {
  if (c.bf16)
    chunk_portable_bf16(c);
  else if (c.f16)
    chunk_portable<uint16_t>(c);
  else
    chunk_portable<float>(c);
}

void kv_store(KvCache& kv, int layer, const float* k, const float* v, std::span<const SeqSlice> slices) {
  const KvCacheConfig& cfg = kv.config();
  const int64_t rf = kv.row_floats(), hd = cfg.head_dim, bt = cfg.block_tokens;
  if (!cfg.f16) {
    float* kp = kv.k_pool(layer);
    float* vp = kv.v_pool(layer);
    for (const SeqSlice& s : slices)
      for (int64_t i = 0; i < s.n; ++i)
        for (int64_t j = 0; j < rf; j += hd) {  // a head's dimensions are contiguous in a row K and V
          std::memcpy(kp + kv.k_offset(s.seq, s.start + i, j), k + (s.row + i) * rf + j, hd * sizeof(float));
          std::memcpy(vp + kv.v_offset(s.seq, s.start + i, j), v + (s.row + i) * rf + j, hd * sizeof(float));
        }
    return;
  }
  uint16_t* kp = kv.k_pool_f16(layer);
  uint16_t* vp = kv.v_pool_f16(layer);
  thread_local std::vector<uint16_t> row;  // one position's K and V in fp16, before they are placed
  row.resize(static_cast<size_t>(2 * rf));
  for (const SeqSlice& s : slices)
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t p = s.start + i;
      const float* kr = k + (s.row + i) * rf;
      const float* vr = v + (s.row + i) * rf;
      uint16_t* kh = row.data();
      uint16_t* vh = row.data() + rf;
      if (cfg.bf16) {
        for (int64_t j = 0; j < rf; ++j) kh[j] = f32_to_bf16_ftz(kr[j]), vh[j] = f32_to_bf16_ftz(vr[j]);
      } else {
        to_fp16(kr, kh, rf);
        to_fp16(vr, vh, rf);
      }
      // Head by head: K element d lands block_tokens apart when transposed (the bf16 pairs' two
      // halves side by side), V element d two apart in bf16 pairs (the other position's beside it).
      for (int64_t j = 0; j < rf; j += hd, kh += hd, vh += hd) {  // j: the head's first element
        uint16_t* kd = kp + kv.k_offset(s.seq, p, j);
        uint16_t* vd = vp + kv.v_offset(s.seq, p, j);
        if (cfg.bf16)
          for (int64_t d = 0; d < hd; d += 2) kd[d * bt] = kh[d], kd[d * bt + 1] = kh[d + 1];
        else if (cfg.k_transposed)
          for (int64_t d = 0; d < hd; ++d) kd[d * bt] = kh[d];
        else
          std::memcpy(kd, kh, hd * sizeof(uint16_t));
        if (cfg.bf16)
          for (int64_t d = 0; d < hd; ++d) vd[2 * d] = vh[d];
        else
          std::memcpy(vd, vh, hd * sizeof(uint16_t));
      }
    }
}

void attention(const float* q, const KvCache& kv, int layer, std::span<const SeqSlice> slices, int64_t heads, float* out,
               ThreadPool& pool, Isa isa) {
  const int64_t hd = kv.config().head_dim, kvh = kv.config().kv_heads, group = heads / kvh;
  const int64_t bt = kv.config().block_tokens;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const bool kt = kv.config().k_transposed, bf16 = kv.config().bf16;
  // The widest kernel isa and hd allow; the joint one, where there is one, takes a round's rows.
  void (*chunk_kernel)(const AttentionChunk&) = attention_chunk_portable;
  void (*joint_kernel)(std::span<const AttentionChunk>) = nullptr;
  if (bf16) {
    if (isa == Isa::kAvx512 && hd % 16 == 0 && hd <= 512 && cpu_has_avx512_bf16()) {
      chunk_kernel = attention_chunk_avx512bf16;
      joint_kernel = attention_chunks_avx512bf16;
    }
  } else if (isa == Isa::kAvx512 && hd % 16 == 0) {
    chunk_kernel = attention_chunk_avx512;
    joint_kernel = attention_chunks_avx512;
  } else if (isa != Isa::kPortable && hd % 8 == 0) {
    chunk_kernel = attention_chunk_avx2;
    if (kt) joint_kernel = attention_chunks_avx2;
  }

  // Partials per (token row, kv head, chunk of kChunkTokens positions), a row's contiguous. Work
  // items are (slice, kv head, chunk, range of the slice's rows): one item scores that chunk for
  // every row of its range that reaches it, so a verify round reads each K/V chunk from memory
  // once for all its rows (and the joint kernels convert each K/V vector once per pass of several
  // query heads across the rows); each row's chunk is computed as if it were alone. A slice's rows
  // share one item per (kv head, chunk) unless that leaves the threads short of work (a verify
  // round at a short context: 3 items for 2 threads), when they are split into ranges.
  struct Row { const SeqSlice* s; int64_t i, first_partial, chunks; };
  struct Item { size_t first_row, rows; int64_t kh, chunk; };
  std::vector<Row> rows;
  std::vector<Item> items;
  int64_t partials = 0, work = 0, max_chunk = 0, base_items = 0;
  for (const SeqSlice& s : slices) {
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t ctx = s.start + i + 1, chunks = (ctx + kChunkTokens - 1) / kChunkTokens;
      rows.push_back({&s, i, partials, chunks});
      partials += chunks * kvh;
      work += ctx;
      max_chunk = std::max(max_chunk, std::min(ctx, kChunkTokens));
    }
    if (s.n > 0) base_items += kvh * rows.back().chunks;
  }
  const bool joint = joint_kernel != nullptr;
  const int64_t want_items = pool.threads() > 1 ? 2 * pool.threads() : 1;
  const int64_t splits = base_items > 0 && base_items < want_items ? (want_items + base_items - 1) / base_items : 1;
  const int64_t max_range = joint ? std::max<int64_t>(1, kMaxJointQueries / group) : INT64_MAX;
  int64_t max_range_rows = 1;
  for (size_t first = 0; const SeqSlice& s : slices) {
    if (s.n == 0) continue;
    const int64_t per = std::min(max_range, std::max<int64_t>(1, (s.n + splits - 1) / splits));
    max_range_rows = std::max(max_range_rows, std::min(per, s.n));
    const int64_t chunks = rows[first + static_cast<size_t>(s.n) - 1].chunks;
    for (int64_t kh = 0; kh < kvh; ++kh)
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t r = 0; r < s.n; r += per)
          items.push_back({first + static_cast<size_t>(r), static_cast<size_t>(std::min(per, s.n - r)), kh, c});
    first += static_cast<size_t>(s.n);
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

  // An item's chunk for one of its rows: the pools, block table and positions (the kernel's inputs
  // but the row's query and outputs).
  auto chunk_of = [&](const Item& item, const Row& row) {
    AttentionChunk c;
    c.k = static_cast<const char*>(kp) + kv.k_head_base(item.kh) * esize;
    c.v = static_cast<const char*>(vp) + kv.v_head_base(item.kh) * esize;
    c.f16 = f16;
    c.k_transposed = kt;
    c.bf16 = bf16;
    c.blocks = kv.block_table(row.s->seq).data();
    c.block_tokens = bt;
    c.row_stride = kv.row_stride();
    c.head_dim = hd;
    c.group = group;
    c.p0 = item.chunk * kChunkTokens;
    c.p1 = std::min(row.s->start + row.i + 1, c.p0 + kChunkTokens);
    c.scale = scale;
    return c;
  };
  auto run = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scores;
    thread_local std::vector<AttentionChunk> batch;
    scores.resize(static_cast<size_t>(joint ? max_range_rows * group * kChunkTokens : group * max_chunk));
    for (int64_t it = begin; it < end; ++it) {
      const Item& item = items[static_cast<size_t>(it)];
      // The next item's chunk as its longest row reads it (the last of its rows).
      AttentionChunk next;
      const bool has_next = it + 1 < end;
      if (has_next) {
        const Item& ni = items[static_cast<size_t>(it + 1)];
        next = chunk_of(ni, rows[ni.first_row + ni.rows - 1]);
      }
      batch.clear();
      for (size_t r = item.first_row; r < item.first_row + item.rows; ++r) {
        const Row& row = rows[r];
        if (item.chunk >= row.chunks) continue;  // this row's context ends before the chunk
        const int64_t trow = row.s->row + row.i;
        AttentionChunk c = chunk_of(item, row);
        c.q = q + (trow * heads + item.kh * group) * hd;
        c.next = has_next ? &next : nullptr;
        float* pi = part + (row.first_partial + item.kh * row.chunks + item.chunk) * per_item;
        c.m = pi;
        c.l = pi + group;
        c.o = pi + 2 * group;
        c.scores = scores.data();
        if (joint)
          batch.push_back(c);
        else
          chunk_kernel(c);
      }
      if (!batch.empty()) joint_kernel(batch);
    }
  };
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (work * heads * hd < (1 << 16) || pool.threads() == 1)
    run(0, n_items);
  else
    pool.parallel_for(n_items, 1, run);

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

}  // namespace specula::host_kernels
