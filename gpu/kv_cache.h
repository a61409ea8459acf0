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

  // Pools of one layer, [num_blocks, block_tokens, kv_heads, head_dim], in device memory.
  float* k_pool(int layer) const { return k_.get() + layer * layer_stride(); }
  float* v_pool(int layer) const { return v_.get() + layer * layer_stride(); }
  int64_t row_floats() const { return cfg_.kv_heads * cfg_.head_dim; }
  // Offset in floats of (position) inside a layer pool, through the sequence's block table.
  int64_t offset(int seq, int64_t position) const;

 private:
  struct Seq {
    bool live = false;
    int64_t length = 0;
    std::vector<int32_t> blocks;
  };
  int64_t layer_stride() const { return cfg_.num_blocks * cfg_.block_tokens * row_floats(); }
  const Seq& seq(int id) const;
  Seq& seq(int id);

  KvCacheConfig cfg_;
  DeviceBuffer k_, v_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> free_;  // free block ids (a stack)
};

}  // namespace specula
