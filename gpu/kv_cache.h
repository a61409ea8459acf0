// Paged KV cache: a pool of fixed-size blocks per layer, a block table per sequence, append by
// reserving positions and rollback with truncate_to; with the prefix cache on, full blocks of
// committed tokens are kept after their sequence ends and shared by later sequences that start
// with the same tokens (vLLM's automatic prefix caching; docs/engine.md, "The prefix cache").
#pragma once
#include <cstdint>
#include <list>
#include <span>
#include <stdexcept>
#include <unordered_map>
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
  // The sequence's first blocks that it registered or found registered (block_table's first ones):
  // the only ones another sequence may have come to share. (One may since have been unregistered,
  // e.g. replaced in the index; it stays in the tables that hold it.)
  size_t registered_blocks(int seq) const;

  // --- The prefix cache (off by default; turning it on makes the whole pool resident) ---
  // A block is registered under its tokens and the registered block before it, so a block stands
  // for the whole prefix up to its end. Registered blocks no sequence uses stay filled and count
  // as free; a reservation takes a never-registered free block first, then evicts the least
  // recently released registered one (the deepest of a prefix first).
  void set_prefix_cache(bool on);
  bool prefix_cache() const { return prefix_cache_; }
  // A new sequence holding the longest run of registered blocks that spell `tokens`' first
  // positions, at most `max_positions` of them (whole blocks): its length is what it shares.
  // Without the prefix cache, create_sequence().
  int create_sequence(std::span<const int32_t> tokens, int64_t max_positions);
  // The positions create_sequence(tokens, max_positions) would share now (0 with the cache off).
  int64_t cached_positions(std::span<const int32_t> tokens, int64_t max_positions) const;
  // Registers the sequence's full blocks that `tokens` (its tokens from position 0, whose K/V
  // it holds: at most length()) cover, after those registered before. A block whose content
  // another registered block already holds is not registered, nor any after it; nor is one whose
  // key collides with a block in use (which stays findable), nor any after it.
  void register_prefix(int seq, std::span<const int32_t> tokens);
  // Registered blocks, and those of them no sequence uses (counted in blocks_free()).
  int64_t blocks_registered() const { return static_cast<int64_t>(index_.size()); }
  int64_t blocks_cached_idle() const { return static_cast<int64_t>(idle_.size()); }

  int64_t blocks_free() const { return static_cast<int64_t>(free_.size() + idle_.size()); }
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
    size_t registered = 0;  // its first blocks that are registered (or were found registered)
  };
  // A pool block's prefix-cache state.
  struct Block {
    int32_t users = 0;            // sequences whose tables hold it
    uint32_t generation = 0;      // bumped each time it stops being registered
    bool registered = false;
    uint64_t key = 0;             // hash of (parent, parent's generation, tokens)
    int32_t parent = -1;          // the registered block before it (-1: the prefix's first)
    uint32_t parent_generation = 0;
    std::vector<int32_t> tokens;  // block_tokens of them
    std::list<int32_t>::iterator idle_at;  // in idle_ while registered and unused
  };
  int32_t take_block();
  void release_block(int32_t b);
  void unregister(int32_t b);
  // Unregisters a registered block; an unused one goes back to the free stack.
  void forget(int32_t b);
  // The registered blocks spelling `tokens`' first whole blocks, at most max_positions of them.
  std::vector<int32_t> find_chain(std::span<const int32_t> tokens, int64_t max_positions) const;
  uint64_t block_key(int32_t parent, std::span<const int32_t> tokens) const;
  // The registered block continuing `parent` with `tokens`, or -1.
  int32_t find_block(int32_t parent, std::span<const int32_t> tokens) const;
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
  Ops* ops_;
  DeviceBuffer k_, v_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> free_;  // free block ids (a stack)
  bool prefix_cache_ = false;
  std::vector<Block> meta_;                       // [num_blocks]
  std::list<int32_t> idle_;                       // registered, unused: least recently released first
  std::unordered_map<uint64_t, int32_t> index_;   // key -> registered block
};

}  // namespace specula
