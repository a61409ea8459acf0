// The paged KV cache's bookkeeping: blocks are handed out, given back on truncate_to and free,
// and a full pool refuses a reservation without changing anything.
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
  KvCache kv(ops, small_config(8));
  const int a = kv.create_sequence(), b = kv.create_sequence();
  kv.reserve(a, 7);
  kv.reserve(b, 9);
  std::set<int64_t> offsets;
  for (int64_t p = 0; p < 7; ++p) offsets.insert(kv.offset(a, p));
  for (int64_t p = 0; p < 9; ++p) offsets.insert(kv.offset(b, p));
  EXPECT_EQ(offsets.size(), 16u);
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
