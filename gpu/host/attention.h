// Private to gpu/host: the attention kernels behind HostOps::attention.
//
// The work is cut into items (token row, kv head, context chunk of kChunkTokens positions): each
// item computes, for the `group` query heads that share the kv head, the chunk's score maximum m,
// the sum l of exp(score - m) and the unnormalised output o = sum exp(score - m) v; a combine step
// then merges a row's chunks in chunk order (flash-decoding). The chunks depend only on the row's
// own context length, and every item is computed alone, so a row's output does not depend on
// which other rows share the call (the row property, docs/kernels.md) nor on the thread count;
// and a long context gives both threads work even for a single decoding row.
#pragma once
#include <cstdint>
#include <span>

#include "gpu/host/thread_pool.h"
#include "gpu/ops.h"

namespace specula {
class KvCache;
}

namespace specula::host_kernels {

enum class Isa;  // matmul_kernels.h

// Ops::kv_store and Ops::attention on the host (shapes in gpu/ops.h), for an f32 or fp16 cache.
// The chunk kernel is the widest `isa` allows for the head size: AVX-512 for head_dim % 16 == 0,
// AVX2 for head_dim % 8 == 0 (on kAvx2 or kAvx512), else portable. The caller has checked that
// the CPU has `isa`.
void kv_store(KvCache& kv, int layer, const float* k, const float* v, std::span<const SeqSlice> slices);
void attention(const float* q, const KvCache& kv, int layer, std::span<const SeqSlice> slices, int64_t heads, float* out,
               ThreadPool& pool, Isa isa);

constexpr int64_t kChunkTokens = 256;

struct AttentionChunk {
  const float* q = nullptr;      // [group, head_dim] query heads of one row and kv head (pre-scaled by nothing)
  // K and V of one kv head (float, or uint16_t fp16 with f16; k and v point at the head's base,
  // KvCache::k_head_base and v_head_base): position p at
  // k + (blocks[p / block_tokens] * block_tokens + p % block_tokens) * row_stride elements; with
  // k_transposed (KvCacheConfig::k_transposed, fp16) K's dimension d of position p is at
  // k + blocks[p / block_tokens] * block_tokens * row_stride + d * block_tokens + p % block_tokens.
  // row_stride is the cache's (KvCache::row_stride: the row's floats, or head_dim in a head-major
  // cache).
  const void* k = nullptr;
  const void* v = nullptr;
  bool f16 = false;
  bool k_transposed = false;
  // bf16 pairs (KvCacheConfig::bf16, with f16 and k_transposed): K's dimension d of position p at
  // k + blocks[p / block_tokens] * block_tokens * row_stride + (d & ~1) * block_tokens +
  // 2 (p % block_tokens) + (d & 1); V's at v + (blocks[p / block_tokens] * block_tokens +
  // (p % block_tokens & ~1)) * row_stride + 2 d + (p & 1).
  bool bf16 = false;
  const int32_t* blocks = nullptr;  // the sequence's block table
  int64_t block_tokens = 0, row_stride = 0, head_dim = 0, group = 0;
  int64_t p0 = 0, p1 = 0;        // positions [p0, p1) of this chunk (the kv head's offset is in k and v)
  float scale = 1.0f;
  // Outputs: m[group], l[group], o[group * head_dim].
  float* m = nullptr;
  float* l = nullptr;
  float* o = nullptr;
  float* scores = nullptr;       // scratch of group * (p1 - p0) floats
  // The chunk the calling thread computes next (its pools, block table and positions; null: none):
  // the transposed-K kernels ask for its K and V lines into L2 a few at a time while this chunk
  // computes, so that the next chunk's reads overlap this one's arithmetic. Never read otherwise.
  const AttentionChunk* next = nullptr;
};

// One chunk. The AVX2 version needs head_dim % 8 == 0 and cpu_has_avx2_fma(), and with K
// transposed head_dim % 16 == 0, head_dim <= 512 and p0 % 8 == 0;
// the AVX-512 version (attention_avx512.cpp) head_dim % 16 == 0, p1 - p0 <= kChunkTokens and
// cpu_has_avx512(), and with K transposed p0 % 16 == 0 and head_dim <= 512. Each is deterministic, but they differ
// from one another in summation order (not bit-equal), and the AVX-512 kernel over a transposed K
// (each score one chain of FMAs over the head's dimensions in order) from itself over a row K.
void attention_chunk_portable(const AttentionChunk& c);
void attention_chunk_avx2(const AttentionChunk& c);
void attention_chunk_avx512(const AttentionChunk& c);

// off[j] = element offset from the chunk's k and v (the kv head's base) of its position p0 + j,
// j < n (V's row in either K layout, and K's with a row K): the block table walked once instead of
// a division per row and pass. Not inline: the vector kernels' files are built with their
// instruction sets.
void chunk_row_offsets(const AttentionChunk& c, int64_t n, int64_t* off);

// Several rows of one sequence in one chunk (a verify round's rows, all with the same p0, pools,
// block table, head_dim and group; each with its own q, p1 and outputs): the AVX-512 kernel over
// all rows' query heads together, in passes of several queries across rows (up to 4 over a row K;
// over a transposed K, 6 a score pass and 16 a V pass), so each K and V row is read and converted
// once per pass rather than once per row. Each query's arithmetic is the
// single-row kernel's: every row's m, l and o are bit-equal to attention_chunk_avx512 on that row
// alone. Scratch: rows[0].scores holds rows.size() * group * kChunkTokens floats; at most
// kMaxJointQueries query heads (rows x group) per call.
constexpr int64_t kMaxJointQueries = 64;
void attention_chunks_avx512(std::span<const AttentionChunk> rows);
// The same over a transposed fp16 K in 256-bit vectors (attention_avx2.cpp), in passes of up to 6
// queries across rows: every row's m, l and o are bit-equal to attention_chunk_avx2 on that row
// alone. It needs what attention_chunk_avx2 needs over a transposed K, and uses no scratch of the
// caller's.
void attention_chunks_avx2(std::span<const AttentionChunk> rows);

// Over bf16 pairs (attention_avx512bf16.cpp; cpu_has_avx512_bf16(), head_dim % 16 == 0, head_dim
// <= 512, p0 % 16 == 0): each query's q is rounded to bf16 and its scores are one vdpbf16ps chain
// over the head's dimension pairs in order; its weights exp(s - m) are rounded to bf16 and its
// output is one vdpbf16ps chain over the position pairs in order (an odd length's last pair with
// its second position's weight and value zero); m and l come from the f32 scores as in the fp16
// kernels. The joint version takes a round's rows as attention_chunks_avx512 does, every row's
// m, l and o bit-equal to the one-row call; the portable kernel over this layout gives the same
// scores and V sums bit for bit (its exponential is std::exp, so not always the same weights).
void attention_chunk_avx512bf16(const AttentionChunk& c);
void attention_chunks_avx512bf16(std::span<const AttentionChunk> rows);
// attention_avx512.cpp's *m = max s, s = exp(s - m), *l = sum s over n >= 1 scores (exp512).
void exp_scores_avx512(float* s, int64_t n, float* m, float* l);

// dst[i] = fp16(src[i]), round to nearest even (F16C where the CPU has it; the same values).
void to_fp16(const float* src, uint16_t* dst, int64_t n);
void to_fp16_avx2(const float* src, uint16_t* dst, int64_t n);

// out[i] = silu(gate[i]) * up[i] with the vectorised exp (elementwise_avx2.cpp).
void swiglu_avx2(const float* gate, const float* up, int64_t n, float* out);
// The same values in 512-bit vectors (elementwise_avx512.cpp; call only where cpu_has_avx512()).
void swiglu_avx512(const float* gate, const float* up, int64_t n, float* out);
// HostOps::rmsnorm's arithmetic, bit for bit, in 256-bit vectors.
void rmsnorm_avx2(const float* x, const float* g, float eps, int64_t n, int64_t dim, float* out);

}  // namespace specula::host_kernels
