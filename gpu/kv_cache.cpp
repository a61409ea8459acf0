// Paged KV cache bookkeeping (the storage itself lives on the device).
#include "gpu/kv_cache.h"

#include <algorithm>
#include <cassert>
#include <string>

namespace specula {

KvCache::KvCache(Ops& ops, const KvCacheConfig& cfg) : cfg_(cfg), ops_(&ops) {
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
  meta_.resize(static_cast<size_t>(cfg.num_blocks));
}

void KvCache::set_prefix_cache(bool on) {
  if (!on)  // idle registered blocks go back to the free stack; blocks in use stay with their sequences
    for (size_t b = 0; b < meta_.size(); ++b) forget(static_cast<int32_t>(b));
  if (on && !prefix_cache_) {
    // With the cache on every block ends up holding K/V (registered blocks are kept, and a
    // reservation takes a never-used block before evicting one), so the whole pool becomes
    // resident as the cache fills. Take it now, as llama.cpp and vLLM take their KV memory at
    // start: the process's memory does not creep up under traffic, and a pool the machine cannot
    // hold fails here, not mid-request.
    const std::vector<float> zeros(size_t{1} << 18);
    for (DeviceBuffer* pool : {&k_, &v_})
      for (size_t at = 0; at < pool->size(); at += zeros.size())
        ops_->copy_to_device(zeros.data(), pool->get() + at, std::min(zeros.size(), pool->size() - at));
  }
  prefix_cache_ = on;
}

uint64_t KvCache::block_key(int32_t parent, std::span<const int32_t> tokens) const {
  // splitmix64 steps over the parent's identity and the tokens; a match is confirmed against the
  // stored tokens and parent, so a collision only costs a miss.
  auto mix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  const uint64_t generation = parent >= 0 ? meta_[static_cast<size_t>(parent)].generation : 0;
  uint64_t h = mix((static_cast<uint64_t>(static_cast<uint32_t>(parent)) << 32) | generation);
  for (const int32_t t : tokens) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

int32_t KvCache::find_block(int32_t parent, std::span<const int32_t> tokens) const {
  const auto it = index_.find(block_key(parent, tokens));
  if (it == index_.end()) return -1;
  const Block& m = meta_[static_cast<size_t>(it->second)];
  const uint32_t parent_generation = parent >= 0 ? meta_[static_cast<size_t>(parent)].generation : 0;
  if (!m.registered || m.parent != parent || m.parent_generation != parent_generation ||
      !std::equal(tokens.begin(), tokens.end(), m.tokens.begin(), m.tokens.end()))
    return -1;
  return it->second;
}

void KvCache::unregister(int32_t b) {
  Block& m = meta_[static_cast<size_t>(b)];
  if (!m.registered) return;
  if (m.users == 0) idle_.erase(m.idle_at);
  if (auto it = index_.find(m.key); it != index_.end() && it->second == b) index_.erase(it);
  m.registered = false;
  ++m.generation;  // blocks registered after it no longer match (their parent_generation)
  m.tokens.clear();
}

void KvCache::forget(int32_t b) {
  if (!meta_[static_cast<size_t>(b)].registered) return;
  unregister(b);
  if (meta_[static_cast<size_t>(b)].users == 0) free_.push_back(b);
}

int32_t KvCache::take_block() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else {
    b = idle_.front();
    unregister(b);
  }
  meta_[static_cast<size_t>(b)].users = 1;
  return b;
}

void KvCache::release_block(int32_t b) {
  Block& m = meta_[static_cast<size_t>(b)];
  if (--m.users > 0) return;
  if (m.registered)
    m.idle_at = idle_.insert(idle_.end(), b);
  else
    free_.push_back(b);
}

std::vector<int32_t> KvCache::find_chain(std::span<const int32_t> tokens, int64_t max_positions) const {
  std::vector<int32_t> chain;
  if (!prefix_cache_) return chain;
  const int64_t bt = cfg_.block_tokens;
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(tokens.size()), max_positions) / bt;
  int32_t parent = -1;
  for (int64_t i = 0; i < n; ++i) {
    parent = find_block(parent, tokens.subspan(static_cast<size_t>(i * bt), static_cast<size_t>(bt)));
    if (parent < 0) break;
    chain.push_back(parent);
  }
  return chain;
}

int64_t KvCache::cached_positions(std::span<const int32_t> tokens, int64_t max_positions) const {
  return static_cast<int64_t>(find_chain(tokens, max_positions).size()) * cfg_.block_tokens;
}

int KvCache::create_sequence(std::span<const int32_t> tokens, int64_t max_positions) {
  const int id = create_sequence();
  Seq& s = seqs_[static_cast<size_t>(id)];
  s.blocks = find_chain(tokens, max_positions);
  for (const int32_t b : s.blocks) {
    Block& m = meta_[static_cast<size_t>(b)];
    if (m.users++ == 0) idle_.erase(m.idle_at);
  }
  s.registered = s.blocks.size();
  s.length = static_cast<int64_t>(s.blocks.size()) * cfg_.block_tokens;
  return id;
}

void KvCache::register_prefix(int id, std::span<const int32_t> tokens) {
  if (!prefix_cache_) return;
  Seq& s = seq(id);
  const int64_t bt = cfg_.block_tokens;
  const size_t full = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(tokens.size()), s.length) / bt);
  while (s.registered < full) {
    const size_t i = s.registered;
    const int32_t parent = i == 0 ? -1 : s.blocks[i - 1];
    // A parent that stopped being registered (its content may change) ends the chain: no lookup
    // could reach what follows it.
    if (parent >= 0 && !meta_[static_cast<size_t>(parent)].registered) return;
    const int32_t b = s.blocks[i];
    Block& m = meta_[static_cast<size_t>(b)];
    const std::span<const int32_t> content = tokens.subspan(i * static_cast<size_t>(bt), static_cast<size_t>(bt));
    if (!m.registered) {
      const uint64_t key = block_key(parent, content);
      if (auto it = index_.find(key); it != index_.end()) {
        if (find_block(parent, content) >= 0) return;  // another sequence's block holds it
        // An entry whose block no sequence uses (stale: its parent went; or a collision) is
        // replaced; one in use stays, since the scheduler counts on a held block staying findable
        // (docs/engine.md, "Shared blocks charged at admission").
        if (meta_[static_cast<size_t>(it->second)].users > 0) return;
        forget(it->second);
      }
      // A new content for this block: entries recorded under its old generation (children
      // registered while it was unregistered) must not match under it.
      ++m.generation;
      m.registered = true;
      m.key = key;
      m.parent = parent;
      m.parent_generation = parent >= 0 ? meta_[static_cast<size_t>(parent)].generation : 0;
      m.tokens.assign(content.begin(), content.end());
      index_.emplace(key, b);
    }
    ++s.registered;
  }
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

size_t KvCache::registered_blocks(int id) const { return seq(id).registered; }

void KvCache::reserve(int id, int64_t new_length) {
  Seq& s = seq(id);
  if (new_length < s.length) throw std::invalid_argument("KV reserve cannot shrink; use truncate_to");
  const int64_t need = blocks_needed(new_length) - static_cast<int64_t>(s.blocks.size());
  if (need > blocks_free())
    throw KvCacheFull("KV cache full: sequence needs " + std::to_string(need) + " more blocks, " +
                      std::to_string(blocks_free()) + " free of " + std::to_string(cfg_.num_blocks));
  // In increasing id: blocks evicted from the prefix cache come deepest first, and a run of
  // consecutive blocks is what the head-major layout streams best (KvCacheConfig::head_major).
  const size_t from = s.blocks.size();
  for (int64_t i = 0; i < need; ++i) s.blocks.push_back(take_block());
  std::sort(s.blocks.begin() + static_cast<std::ptrdiff_t>(from), s.blocks.end());
  s.length = new_length;
}

void KvCache::truncate_to(int id, int64_t len) {
  Seq& s = seq(id);
  if (len < 0 || len > s.length)
    throw std::invalid_argument("KV truncate_to(" + std::to_string(len) + ") outside [0, " + std::to_string(s.length) + "]");
  const int64_t keep = blocks_needed(len);
  while (static_cast<int64_t>(s.blocks.size()) > keep) {  // the deepest first: evicted first
    release_block(s.blocks.back());
    s.blocks.pop_back();
  }
  s.registered = std::min(s.registered, static_cast<size_t>(len / cfg_.block_tokens));
  // Positions from len on will be written again: a registered block they fall in stops being
  // registered (a block other sequences share is never cut into: they would read the new K/V).
  if (len % cfg_.block_tokens != 0) {
    const int32_t b = s.blocks.back();
    if (meta_[static_cast<size_t>(b)].users > 1)
      throw std::logic_error("KV truncate_to(" + std::to_string(len) + ") cuts into a block other sequences share");
    unregister(b);
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
