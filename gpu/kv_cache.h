// Paged KV cache: a pool of fixed-size blocks per layer, a block table per sequence, append by
// reserving positions and rollback with truncate_to.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "gpu/ops.h"

namespace specula {

struct KvCacheConfig {
  int64_t layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_tokens = 16;  // positions per block
  int64_t num_blocks = 0;     // blocks in the pool (shared by all sequences)
  // K/V stored as fp16 (the host's int8 path; half the bytes a decode step reads) instead of f32.
  // Offsets and row_floats count elements either way.
  bool f16 = false;
  // K of each block stored transposed, [kv_heads, head_dim, block_tokens] (V stays
  // [block_tokens, kv_heads, head_dim]): one dimension of 16 consecutive positions is one
  // contiguous vector, which the host's AVX-512 attention multiplies by every query of a verify
  // round without a reduction (docs/kernels.md). fp16 only, block_tokens and head_dim multiples of
  // 16; the device says whether it wants it (Ops::kv_k_transposed).
  bool k_transposed = false;
  // bf16 pairs (with f16 and k_transposed): the 2-byte elements are bf16, each block's K stored
  // [kv_heads, head_dim / 2, block_tokens, 2] (dimensions 2i and 2i + 1 of a position side by
  // side) and its V [block_tokens / 2, kv_heads, head_dim, 2] (positions 2i and 2i + 1 of a
  // dimension side by side), so that every 32-bit word is a pair AVX-512 BF16's vdpbf16ps
  // multiplies, two multiply-adds per lane (docs/kernels.md, "K and V in bf16 pairs"). The device
  // says whether it wants it (Ops::kv_bf16).
  bool bf16 = false;
  // Head-major pools: each layer pool is [kv_heads, num_blocks, block] instead of [num_blocks,
  // block] with the heads inside each block, where a head's block holds what one head of the
  // layouts above holds (K [block_tokens, head_dim] or transposed [head_dim, block_tokens] or its
  // bf16 pairs; V [block_tokens, head_dim] or its bf16 pairs). So one kv head's K (and V) of a
  // sequence whose blocks are consecutive is one contiguous run, which the hardware prefetchers
  // stream (docs/kernels.md, "A head-major K/V cache"). The device says whether it wants it
  // (Ops::kv_head_major).
  bool head_major = false;

  // Sets f16, k_transposed and bf16 to the layouts the device wants for this head_dim and
  // block_tokens (Ops::kv_f16, kv_k_transposed, kv_bf16), each only where the one before holds,
  // and head_major to Ops::kv_head_major.
  void use_device_layouts(const Ops& ops) {
    f16 = ops.kv_f16();
    k_transposed = f16 && ops.kv_k_transposed(head_dim, block_tokens);
    bf16 = k_transposed && ops.kv_bf16(head_dim, block_tokens);
    head_major = ops.kv_head_major();
  }
};

// Thrown when a reservation needs more blocks than are free; the cache is unchanged.
class KvCacheFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Thread-safety: none; one owner (the actor or loop that runs the model) uses it.
class KvCache {
 public:
  KvCache(Ops& ops, const KvCacheConfig& cfg);
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheConfig& config() const { return cfg_; }
  int create_sequence();
  void free_sequence(int seq);
  bool has_sequence(int seq) const;
  int64_t length(int seq) const;
  // Makes room for positions [length, new_length) and sets length = new_length.
  void reserve(int seq, int64_t new_length);
  // Rolls the sequence back to `len` positions (len <= length) and frees the blocks past it.
  void truncate_to(int seq, int64_t len);
  const std::vector<int32_t>& block_table(int seq) const;

  int64_t blocks_free() const { return static_cast<int64_t>(free_.size()); }
  int64_t blocks_total() const { return cfg_.num_blocks; }
  int64_t blocks_needed(int64_t positions) const { return (positions + cfg_.block_tokens - 1) / cfg_.block_tokens; }

  // Pools of one layer, [num_blocks, block_tokens, kv_heads, head_dim] (or the layouts of
  // KvCacheConfig), in device memory: f32 (k_pool, v_pool; throws std::logic_error on an fp16
  // cache) or fp16 (k_pool_f16, v_pool_f16).
  float* k_pool(int layer) const { return f32_pool(k_, layer); }
  float* v_pool(int layer) const { return f32_pool(v_, layer); }
  uint16_t* k_pool_f16(int layer) const { return f16_pool(k_, layer); }
  uint16_t* v_pool_f16(int layer) const { return f16_pool(v_, layer); }
  // Bytes of one element (4 or 2).
  int64_t element_bytes() const { return cfg_.f16 ? 2 : 4; }
  int64_t row_floats() const { return cfg_.kv_heads * cfg_.head_dim; }
  // Offset in floats of (position) inside a layer pool, through the sequence's block table: where
  // the position's V row starts (and its K row, unless K is transposed). Not for a head-major
  // cache, whose rows are not contiguous (throws std::logic_error).
  int64_t offset(int seq, int64_t position) const;
  // Elements from one position's row of a kv head to the next position's inside a block (V, and
  // K unless transposed): head_dim in a head-major cache, row_floats otherwise; a block's part
  // of one head starts block * block_tokens * row_stride() after the head's base.
  int64_t row_stride() const { return cfg_.head_major ? cfg_.head_dim : row_floats(); }
  // Where kv head h's elements start inside a layer pool of K or of V, in elements: element
  // (position p, dimension d) of the head lies at this base + (p's block) * block_tokens *
  // row_stride() + the head's layout inside a block (KvCacheConfig).
  int64_t k_head_base(int64_t h) const;
  int64_t v_head_base(int64_t h) const;
  // Offset of K element j (j < row_floats) of (position) inside a layer pool, for any K layout.
  int64_t k_offset(int seq, int64_t position, int64_t j) const;
  // Offset of V element j of (position) inside a layer pool, for any V layout.
  int64_t v_offset(int seq, int64_t position, int64_t j) const;

 private:
  struct Seq {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  int64_t layer_stride() const { return cfg_.num_blocks * cfg_.block_tokens * row_floats(); }
  // Where (position)'s block starts inside a head's (or, not head-major, the heads') elements:
  // its pool block * block_tokens * row_stride(), through the sequence's block table.
  int64_t block_base(int seq, int64_t position) const;
  float* f32_pool(const DeviceBuffer& b, int layer) const {
    if (cfg_.f16) throw std::logic_error("KV cache: f32 pool asked of an fp16 cache");
    return b.get() + layer * layer_stride();
  }
  uint16_t* f16_pool(const DeviceBuffer& b, int layer) const {
    if (!cfg_.f16) throw std::logic_error("KV cache: fp16 pool asked of an f32 cache");
    return reinterpret_cast<uint16_t*>(b.get()) + layer * layer_stride();
  }
  const Seq& seq(int id) const;
  Seq& seq(int id);

  KvCacheConfig cfg_;
  DeviceBuffer k_, v_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> free_;  // free block ids (a stack)
};

}  // namespace specula
