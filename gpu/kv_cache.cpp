// Paged KV cache bookkeeping (the storage itself lives on the device).
#include "gpu/kv_cache.h"

#include <cassert>
#include <string>

namespace specula {

KvCache::KvCache(Ops& ops, const KvCacheConfig& cfg) : cfg_(cfg) {
  if (cfg.layers <= 0 || cfg.kv_heads <= 0 || cfg.head_dim <= 0 || cfg.block_tokens <= 0 || cfg.num_blocks <= 0)
    throw std::invalid_argument("KV cache config must be positive (layers, kv_heads, head_dim, block_tokens, blocks)");
  if (cfg.k_transposed && (!cfg.f16 || cfg.block_tokens % 16 != 0 || cfg.head_dim % 16 != 0))
    throw std::invalid_argument("KV cache: a transposed K needs fp16 and block_tokens, head_dim multiples of 16");
  if (cfg.bf16 && !cfg.k_transposed)
    throw std::invalid_argument("KV cache: bf16 pairs need the transposed K's 2-byte layout");
  const size_t elements = static_cast<size_t>(cfg.layers * layer_stride());
  const size_t n = cfg.f16 ? (elements + 1) / 2 : elements;  // floats of storage
  k_ = DeviceBuffer(ops, n);
  v_ = DeviceBuffer(ops, n);
  free_.reserve(cfg.num_blocks);
  for (int64_t b = cfg.num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int KvCache::create_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = Seq{true, 0, {}};
      return static_cast<int>(i);
    }
  seqs_.push_back(Seq{true, 0, {}});
  return static_cast<int>(seqs_.size() - 1);
}

void KvCache::free_sequence(int id) {
  Seq& s = seq(id);
  truncate_to(id, 0);
  s.live = false;
}

bool KvCache::has_sequence(int id) const {
  return id >= 0 && static_cast<size_t>(id) < seqs_.size() && seqs_[id].live;
}

const KvCache::Seq& KvCache::seq(int id) const {
  if (!has_sequence(id)) throw std::out_of_range("KV cache has no sequence " + std::to_string(id));
  return seqs_[id];
}
KvCache::Seq& KvCache::seq(int id) { return const_cast<Seq&>(static_cast<const KvCache&>(*this).seq(id)); }

int64_t KvCache::length(int id) const { return seq(id).length; }

const std::vector<int32_t>& KvCache::block_table(int id) const { return seq(id).blocks; }

void KvCache::reserve(int id, int64_t new_length) {
  Seq& s = seq(id);
  if (new_length < s.length) throw std::invalid_argument("KV reserve cannot shrink; use truncate_to");
  const int64_t need = blocks_needed(new_length) - static_cast<int64_t>(s.blocks.size());
  if (need > blocks_free())
    throw KvCacheFull("KV cache full: sequence needs " + std::to_string(need) + " more blocks, " +
                      std::to_string(blocks_free()) + " free of " + std::to_string(cfg_.num_blocks));
  for (int64_t i = 0; i < need; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  s.length = new_length;
}

void KvCache::truncate_to(int id, int64_t len) {
  Seq& s = seq(id);
  if (len < 0 || len > s.length)
    throw std::invalid_argument("KV truncate_to(" + std::to_string(len) + ") outside [0, " + std::to_string(s.length) + "]");
  const int64_t keep = blocks_needed(len);
  while (static_cast<int64_t>(s.blocks.size()) > keep) {
    free_.push_back(s.blocks.back());
    s.blocks.pop_back();
  }
  s.length = len;
}

int64_t KvCache::block_base(int id, int64_t position) const {
  const Seq& s = seqs_[id];
  assert(position < static_cast<int64_t>(s.blocks.size()) * cfg_.block_tokens);
  return static_cast<int64_t>(s.blocks[position / cfg_.block_tokens]) * cfg_.block_tokens * row_stride();
}

int64_t KvCache::offset(int id, int64_t position) const {
  if (cfg_.head_major) throw std::logic_error("KV cache: a head-major cache has no position rows");
  return block_base(id, position) + position % cfg_.block_tokens * row_floats();
}

int64_t KvCache::k_head_base(int64_t h) const {
  if (cfg_.head_major) return h * cfg_.num_blocks * cfg_.block_tokens * cfg_.head_dim;
  return h * cfg_.head_dim * (cfg_.k_transposed ? cfg_.block_tokens : 1);
}

int64_t KvCache::v_head_base(int64_t h) const {
  if (cfg_.head_major) return h * cfg_.num_blocks * cfg_.block_tokens * cfg_.head_dim;
  return h * cfg_.head_dim * (cfg_.bf16 ? 2 : 1);
}

int64_t KvCache::k_offset(int id, int64_t position, int64_t j) const {
  const int64_t bt = cfg_.block_tokens, i = position % bt, d = j % cfg_.head_dim;
  const int64_t base = k_head_base(j / cfg_.head_dim) + block_base(id, position);
  if (cfg_.bf16) return base + (d & ~int64_t{1}) * bt + 2 * i + (d & 1);
  if (cfg_.k_transposed) return base + d * bt + i;
  return base + i * row_stride() + d;
}

int64_t KvCache::v_offset(int id, int64_t position, int64_t j) const {
  const int64_t i = position % cfg_.block_tokens, d = j % cfg_.head_dim;
  const int64_t base = v_head_base(j / cfg_.head_dim) + block_base(id, position);
  // bf16 pairs: the pair's row starts where the even position's row would; the odd position is
  // its second half.
  if (cfg_.bf16) return base + (i & ~int64_t{1}) * row_stride() + 2 * d + (i & 1);
  return base + i * row_stride() + d;
}

}  // namespace specula
