// The paged KV cache's bookkeeping: blocks are handed out, given back on truncate_to and free,
// a full pool refuses a reservation without changing anything, and every layout gives each
// element its own place.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "gpu/host/host_device.h"
#include "gpu/kv_cache.h"

namespace specula {
namespace {

KvCacheConfig small_config(int64_t blocks) {
  KvCacheConfig c;
  c.layers = 2;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.block_tokens = 4;
  c.num_blocks = blocks;
  return c;
}

TEST(KvCache, ReserveTakesWholeBlocksAndTruncateGivesThemBack) {
  HostOps ops(1);
  KvCache kv(ops, small_config(8));
  const int s = kv.create_sequence();
  kv.reserve(s, 5);
  EXPECT_EQ(kv.length(s), 5);
  EXPECT_EQ(kv.block_table(s).size(), 2u);
  EXPECT_EQ(kv.blocks_free(), 6);
  kv.truncate_to(s, 4);
  EXPECT_EQ(kv.block_table(s).size(), 1u);
  EXPECT_EQ(kv.blocks_free(), 7);
  kv.truncate_to(s, 0);
  EXPECT_EQ(kv.blocks_free(), 8);
}

TEST(KvCache, AFullPoolRefusesAReservationAndChangesNothing) {
  HostOps ops(1);
  KvCache kv(ops, small_config(3));
  const int a = kv.create_sequence(), b = kv.create_sequence();
  kv.reserve(a, 8);
  EXPECT_THROW(kv.reserve(b, 8), KvCacheFull);
  EXPECT_EQ(kv.length(b), 0);
  EXPECT_EQ(kv.blocks_free(), 1);
  kv.reserve(b, 4);
  EXPECT_EQ(kv.blocks_free(), 0);
}

TEST(KvCache, FreeingSequencesReturnsThePoolToFullAfterRandomTraffic) {
  HostOps ops(1);
  KvCache kv(ops, small_config(64));
  std::mt19937 rng(7);
  std::vector<int> seqs;
  for (int i = 0; i < 4; ++i) seqs.push_back(kv.create_sequence());
  for (int step = 0; step < 5000; ++step) {
    const int s = seqs[rng() % seqs.size()];
    if (rng() % 3 == 0)
      kv.truncate_to(s, static_cast<int64_t>(rng() % (kv.length(s) + 1)));
    else
      try { kv.reserve(s, kv.length(s) + 1 + rng() % 6); } catch (const KvCacheFull&) {}
    int64_t used = 0;
    for (int q : seqs) used += static_cast<int64_t>(kv.block_table(q).size());
    ASSERT_EQ(used + kv.blocks_free(), 64);
  }
  for (int s : seqs) kv.free_sequence(s);
  EXPECT_EQ(kv.blocks_free(), 64);
}

TEST(KvCache, PositionsOfDifferentSequencesNeverShareStorage) {
  HostOps ops(1);
  KvCacheConfig c = small_config(8);
  c.head_major = false;  // position rows (KvCache::offset)
  KvCache kv(ops, c);
  const int a = kv.create_sequence(), b = kv.create_sequence();
  kv.reserve(a, 7);
  kv.reserve(b, 9);
  std::set<int64_t> offsets;
  for (int64_t p = 0; p < 7; ++p) offsets.insert(kv.offset(a, p));
  for (int64_t p = 0; p < 9; ++p) offsets.insert(kv.offset(b, p));
  EXPECT_EQ(offsets.size(), 16u);
}

TEST(KvCache, EveryElementOfEveryPositionHasItsOwnPlaceInThePoolInEveryLayout) {
  // f32, fp16, fp16 with K transposed and bf16 pairs, each with the heads inside the blocks and
  // head-major: K's and V's offsets of every (sequence, position, element) are distinct and inside
  // the layer pool; with the heads inside the blocks they are where they were before head-major
  // pools (from the position's row offset); and head-major, a kv head of a sequence whose blocks
  // are consecutive is one run of exactly its blocks' elements (what the layout is for).
  HostOps ops(1);
  for (int layout = 0; layout < 4; ++layout)
    for (const bool head_major : {false, true}) {
      KvCacheConfig c;
      c.layers = 1;
      c.kv_heads = 3;
      c.head_dim = 32;
      c.block_tokens = 16;
      c.num_blocks = 14;  // a: 144 positions, b: 80
      c.f16 = layout > 0;
      c.k_transposed = layout >= 2;
      c.bf16 = layout == 3;
      c.head_major = head_major;
      KvCache kv(ops, c);
      const int a = kv.create_sequence(), b = kv.create_sequence();
      kv.reserve(a, 64);  // blocks 0..3, consecutive
      for (int64_t len = 16; len <= 80; len += 16) kv.reserve(b, len), kv.reserve(a, 64 + len);  // then interleaved
      const int64_t rf = kv.row_floats(), pool = c.num_blocks * c.block_tokens * rf;
      std::set<int64_t> k_at, v_at;
      for (const int seq : {a, b})
        for (int64_t p = 0; p < kv.length(seq); ++p)
          for (int64_t j = 0; j < rf; ++j) {
            const int64_t ko = kv.k_offset(seq, p, j), vo = kv.v_offset(seq, p, j);
            ASSERT_TRUE(ko >= 0 && ko < pool && vo >= 0 && vo < pool) << "layout " << layout << " position " << p << " element " << j;
            if (!head_major) {  // the places every layout had before head-major pools, from the row's offset
              const int64_t bt = c.block_tokens, i = p % bt, block_base = kv.offset(seq, p) - i * rf;
              const int64_t want_k = !c.k_transposed ? kv.offset(seq, p) + j
                                     : c.bf16        ? block_base + (j & ~int64_t{1}) * bt + 2 * i + (j & 1)
                                                     : block_base + j * bt + i;
              const int64_t want_v = c.bf16 ? kv.offset(seq, p & ~int64_t{1}) + 2 * j + (p & 1) : kv.offset(seq, p) + j;
              ASSERT_EQ(ko, want_k) << "layout " << layout << " position " << p << " element " << j;
              ASSERT_EQ(vo, want_v) << "layout " << layout << " position " << p << " element " << j;
            }
            k_at.insert(ko);
            v_at.insert(vo);
          }
      EXPECT_EQ(k_at.size(), static_cast<size_t>((kv.length(a) + kv.length(b)) * rf)) << "layout " << layout;
      EXPECT_EQ(v_at.size(), k_at.size()) << "layout " << layout;
      if (!head_major) continue;
      EXPECT_THROW(kv.offset(a, 0), std::logic_error);
      for (int64_t h = 0; h < c.kv_heads; ++h) {
        std::set<int64_t> k_run, v_run;
        for (int64_t p = 0; p < 64; ++p)
          for (int64_t d = 0; d < c.head_dim; ++d) {
            k_run.insert(kv.k_offset(a, p, h * c.head_dim + d));
            v_run.insert(kv.v_offset(a, p, h * c.head_dim + d));
          }
        for (const auto* run : {&k_run, &v_run}) {
          ASSERT_EQ(static_cast<int64_t>(run->size()), 64 * c.head_dim);
          EXPECT_EQ(*run->rbegin() - *run->begin() + 1, 64 * c.head_dim) << "layout " << layout << " kv head " << h;
        }
        EXPECT_EQ(*k_run.begin(), kv.k_head_base(h));
        EXPECT_EQ(*v_run.begin(), kv.v_head_base(h));
      }
    }
}

TEST(KvCache, TruncateBeyondTheLengthIsAClearError) {
  HostOps ops(1);
  KvCache kv(ops, small_config(4));
  const int s = kv.create_sequence();
  kv.reserve(s, 3);
  EXPECT_THROW(kv.truncate_to(s, 4), std::invalid_argument);
  EXPECT_THROW(kv.length(99), std::out_of_range);
}

}  // namespace
}  // namespace specula
