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

// --- The prefix cache ---

std::vector<int32_t> iota_tokens(int n, int32_t from = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = from + i;
  return t;
}

// A sequence that has written all of `tokens` and registered its full blocks.
int registered_sequence(KvCache& kv, const std::vector<int32_t>& tokens) {
  const int s = kv.create_sequence(tokens, 1000);
  kv.reserve(s, static_cast<int64_t>(tokens.size()));
  kv.register_prefix(s, tokens);
  return s;
}

TEST(KvCachePrefix, ASequenceStartingWithARegisteredPrefixSharesItsFullBlocksUpToTheFirstDifference) {
  HostOps ops(1);
  KvCache kv(ops, small_config(16));
  kv.set_prefix_cache(true);
  const std::vector<int32_t> a_tokens = iota_tokens(10);  // blocks of 4: two full, one partial
  const int a = kv.create_sequence(a_tokens, 100);
  EXPECT_EQ(kv.length(a), 0);  // nothing registered yet
  kv.reserve(a, 10);
  kv.register_prefix(a, a_tokens);
  EXPECT_EQ(kv.blocks_registered(), 2);
  std::vector<int32_t> b_tokens = iota_tokens(12);
  const int b = kv.create_sequence(b_tokens, 100);
  EXPECT_EQ(kv.length(b), 8);
  EXPECT_EQ(kv.block_table(b), std::vector<int32_t>(kv.block_table(a).begin(), kv.block_table(a).begin() + 2));
  b_tokens[5] = 7;  // a difference in the second block: only the first is shared
  const int c = kv.create_sequence(b_tokens, 100);
  EXPECT_EQ(kv.length(c), 4);
  const int d = kv.create_sequence(iota_tokens(12), 7);  // at most 7 positions: one whole block
  EXPECT_EQ(kv.length(d), 4);
  std::vector<int32_t> shifted = iota_tokens(12);
  shifted[0] = 1;  // the same second block after another first one is another prefix
  const int e = kv.create_sequence(shifted, 100);
  EXPECT_EQ(kv.length(e), 0);
  // Off: nothing is shared.
  KvCache plain(ops, small_config(16));
  const int p = plain.create_sequence(a_tokens, 100);
  plain.reserve(p, 10);
  plain.register_prefix(p, a_tokens);
  EXPECT_EQ(plain.blocks_registered(), 0);
  EXPECT_EQ(plain.length(plain.create_sequence(a_tokens, 100)), 0);
}

TEST(KvCachePrefix, RegisteredBlocksOutliveTheirSequenceAsFreeAndAreEvictedLeastRecentlyReleasedDeepestFirst) {
  HostOps ops(1);
  KvCache kv(ops, small_config(6));
  kv.set_prefix_cache(true);
  const std::vector<int32_t> t = iota_tokens(16);
  kv.free_sequence(registered_sequence(kv, t));
  EXPECT_EQ(kv.blocks_free(), 6);          // idle registered blocks count as free
  EXPECT_EQ(kv.blocks_cached_idle(), 4);
  const int b = kv.create_sequence(t, 100);  // found again after its sequence ended
  EXPECT_EQ(kv.length(b), 16);
  EXPECT_EQ(kv.blocks_cached_idle(), 0);
  EXPECT_EQ(kv.blocks_free(), 2);
  kv.free_sequence(b);
  // Three blocks for another sequence: the two never registered, then the prefix's last block.
  const int c = kv.create_sequence();
  kv.reserve(c, 12);
  EXPECT_EQ(kv.blocks_registered(), 3);
  EXPECT_EQ(kv.length(kv.create_sequence(t, 100)), 12);  // the first three blocks are still whole
  EXPECT_THROW(kv.reserve(c, 13), KvCacheFull);  // the rest are in use
}

TEST(KvCachePrefix, CuttingIntoASharedBlockIsALogicErrorAndIntoAnOwnRegisteredOneUnregistersIt) {
  HostOps ops(1);
  KvCache kv(ops, small_config(8));
  kv.set_prefix_cache(true);
  const std::vector<int32_t> t = iota_tokens(8);
  const int a = registered_sequence(kv, t);
  const int b = kv.create_sequence(t, 100);
  EXPECT_EQ(kv.length(b), 8);
  EXPECT_THROW(kv.truncate_to(b, 6), std::logic_error);
  kv.free_sequence(b);
  kv.truncate_to(a, 6);  // its own: the second block will be written again
  EXPECT_EQ(kv.blocks_registered(), 1);
  EXPECT_EQ(kv.length(kv.create_sequence(t, 100)), 4);
}

// The property the engine relies on: a sequence created from the cache holds, at every shared
// position p, the K/V its own tokens would have written there, which depend on all of tokens
// 0..p. The pool's "K/V" here is a hash of the writer's tokens up to each position. Random
// traffic of texts made of three 4-token words (so one block's tokens recur at other depths and
// after other blocks), growth, rollback, registration, frees and evictions.
TEST(KvCachePrefix, SharedPositionsAlwaysHoldWhatTheSequencesOwnTokensWouldHaveWrittenUnderRandomTraffic) {
  HostOps ops(1);
  const int64_t blocks = 24, bt = 4;
  KvCache kv(ops, small_config(blocks));
  kv.set_prefix_cache(true);
  std::vector<uint64_t> written(static_cast<size_t>(blocks * bt), 0);
  auto prefix_hashes = [](const std::vector<int32_t>& tokens) {
    std::vector<uint64_t> h(tokens.size());
    uint64_t x = 1469598103934665603ull;
    for (size_t i = 0; i < tokens.size(); ++i) h[i] = x = (x ^ static_cast<uint64_t>(tokens[i] + 1)) * 1099511628211ull;
    return h;
  };
  std::mt19937 rng(11);
  struct Live {
    int seq;
    std::vector<int32_t> tokens;
    std::vector<uint64_t> kv;  // what its K/V at each position must be
  };
  std::vector<Live> live;
  int64_t shared_positions = 0;
  for (int step = 0; step < 20000; ++step) {
    const unsigned op = rng() % 6;
    if (op == 0 && live.size() < 4) {
      std::vector<int32_t> tokens;
      const int words = 1 + static_cast<int>(rng() % 6);
      for (int w = 0; w < words; ++w) {
        const int32_t word = static_cast<int32_t>(rng() % 3);
        for (int32_t i = 0; i < 4; ++i) tokens.push_back(word * 10 + i);
      }
      tokens.resize(tokens.size() - rng() % 4);
      const int s = kv.create_sequence(tokens, static_cast<int64_t>(tokens.size()) - 1);
      std::vector<uint64_t> own = prefix_hashes(tokens);
      const int64_t shared = kv.length(s);
      ASSERT_EQ(shared % bt, 0);
      for (int64_t p = 0; p < shared; ++p)
        ASSERT_EQ(written[static_cast<size_t>(kv.block_table(s)[static_cast<size_t>(p / bt)] * bt + p % bt)],
                  own[static_cast<size_t>(p)])
            << "step " << step << " position " << p;
      shared_positions += shared;
      live.push_back({s, std::move(tokens), std::move(own)});
      continue;
    }
    if (live.empty()) continue;
    Live& l = live[rng() % live.size()];
    const int64_t len = kv.length(l.seq);
    if (op <= 2 && len < static_cast<int64_t>(l.tokens.size())) {  // write the next positions
      const int64_t to = std::min<int64_t>(static_cast<int64_t>(l.tokens.size()), len + 1 + rng() % 6);
      try {
        kv.reserve(l.seq, to);
      } catch (const KvCacheFull&) {
        continue;
      }
      for (int64_t p = len; p < to; ++p)
        written[static_cast<size_t>(kv.block_table(l.seq)[static_cast<size_t>(p / bt)] * bt + p % bt)] =
            l.kv[static_cast<size_t>(p)];
    } else if (op == 3) {  // commit: register what it holds
      kv.register_prefix(l.seq, std::span<const int32_t>(l.tokens).first(static_cast<size_t>(len)));
    } else if (op == 4) {  // roll back, never into what it shares with others
      int64_t floor = 0;
      for (size_t b = 0; b < kv.block_table(l.seq).size(); ++b) {
        int users = 0;
        for (const Live& o : live)
          for (int32_t x : kv.block_table(o.seq)) users += x == kv.block_table(l.seq)[b];
        if (users > 1) floor = static_cast<int64_t>(b + 1) * bt;
      }
      if (len > floor) kv.truncate_to(l.seq, floor + static_cast<int64_t>(rng() % (len - floor + 1)));
    } else {
      kv.free_sequence(l.seq);
      l = std::move(live.back());
      live.pop_back();
    }
    std::set<int32_t> used;
    for (const Live& o : live) used.insert(kv.block_table(o.seq).begin(), kv.block_table(o.seq).end());
    ASSERT_EQ(static_cast<int64_t>(used.size()) + kv.blocks_free(), blocks) << "step " << step;
  }
  EXPECT_GT(shared_positions, 1000);  // the traffic did share
  for (const Live& l : live) kv.free_sequence(l.seq);
  EXPECT_EQ(kv.blocks_free(), blocks);
}

}  // namespace
}  // namespace specula
