// The scheduler's count of KV blocks (actors/kv_ledger.h): own blocks, shared ones counted once,
// and the blocks a joining request expects to share, which count as shared until the verifier has
// made its sequence or their last other holder leaves, and never below what the pool may hold.
#include <gtest/gtest.h>

#include <vector>

#include "actors/kv_ledger.h"

namespace specula::actors {
namespace {

using Blocks = std::vector<int32_t>;
using Freed = std::vector<int64_t>;

// Request 1 holds 5 own blocks and then shares 3 of them (blocks 10, 11, 12).
KvLedger one_sharing() {
  KvLedger l;
  l.admit(1, 5, {});
  l.share(1, {10, 11, 12});
  return l;
}

TEST(KvLedger, SharedBlocksCountOnceHoweverManyHoldThem) {
  KvLedger l = one_sharing();
  EXPECT_EQ(l.reserved(), 5);
  l.admit(2, 6, {});
  l.share(2, {10, 11});  // found in the cache when its sequence was made
  EXPECT_EQ(l.reserved(), 9);
  EXPECT_EQ(l.held(2), 6);
  // Request 2 alone frees its own 4; after it request 1 frees its 2 and the 3 shared.
  EXPECT_EQ(l.freed_by({2, 1}), (Freed{4, 5}));
  l.leave(1);
  EXPECT_EQ(l.reserved(), 6);
  l.leave(2);
  EXPECT_EQ(l.reserved(), 0);
}

TEST(KvLedger, AJoiningRequestExpectingBlocksIsChargedOnlyForTheRestAndMadeItCountsWhatItShares) {
  KvLedger l = one_sharing();
  l.admit(2, 2, {10, 11});
  EXPECT_EQ(l.reserved(), 7);
  EXPECT_EQ(l.held(2), 4);
  EXPECT_FALSE(l.expectable(10));
  EXPECT_TRUE(l.expectable(12));
  // Its sequence made, the verifier names the two it found and nothing else yet: the same count.
  l.settle(2);
  l.share(2, {10, 11});
  EXPECT_EQ(l.reserved(), 7);
  EXPECT_EQ(l.held(2), 4);
  EXPECT_TRUE(l.expectable(10));
  EXPECT_EQ(l.shared(2), (Blocks{10, 11}));
  // Made, it counts all it expected as its own until the verifier names what it shares: here one of
  // the two (which the verifier does not do while their holder holds them; the count stays whole
  // for the other).
  KvLedger fewer = one_sharing();
  fewer.admit(2, 2, {10, 11});
  fewer.settle(2);
  EXPECT_EQ(fewer.reserved(), 9);
  fewer.share(2, {10});
  EXPECT_EQ(fewer.reserved(), 8);
}

TEST(KvLedger, WhenTheLastHolderOfAnExpectedBlockLeavesTheExpectationBecomesAnOwnBlock) {
  // The verifier may evict the block before it makes the joining request's sequence, which then
  // needs a block of its own: the count must not fall below that.
  KvLedger l = one_sharing();
  l.admit(2, 2, {10, 11});
  l.admit(3, 4, {});
  l.share(3, {10});  // another holder of block 10 only
  EXPECT_EQ(l.reserved(), 10);
  // Request 1 leaves: its 2 own blocks and 12 go; 11 is only expected now (request 2's own), 10
  // is still held by request 3.
  EXPECT_EQ(l.freed_by({1}), (Freed{3}));
  l.leave(1);
  EXPECT_EQ(l.reserved(), 7);
  EXPECT_EQ(l.held(2), 4);
  EXPECT_TRUE(l.expectable(11));
  EXPECT_FALSE(l.expectable(10));
  // Request 3 leaves too: 10 becomes request 2's own; all it holds is its own.
  l.leave(3);
  EXPECT_EQ(l.reserved(), 4);
  EXPECT_TRUE(l.expectable(10));
  EXPECT_EQ(l.freed_by({2}), (Freed{4}));
  // Made, it shares both after all (they were still in the cache): counted once, as shared.
  l.settle(2);
  l.share(2, {10, 11});
  EXPECT_EQ(l.reserved(), 4);
  l.leave(2);
  EXPECT_EQ(l.reserved(), 0);
}

TEST(KvLedger, WhatLettingRequestsGoFreesCountsAnExpectedBlockOnlyWithItsLastHolder) {
  KvLedger l = one_sharing();
  l.admit(2, 3, {10, 11, 12});
  EXPECT_EQ(l.reserved(), 8);
  // The joining request first: its own; then the holder: its own and the three.
  EXPECT_EQ(l.freed_by({2, 1}), (Freed{3, 5}));
  // The holder first: its own only (the three become the joining request's own), then all of it.
  EXPECT_EQ(l.freed_by({1, 2}), (Freed{2, 6}));
  l.leave(1);
  EXPECT_EQ(l.reserved(), 6);
  l.leave(2);
  EXPECT_EQ(l.reserved(), 0);
}

TEST(KvLedger, AJoiningRequestThatLeavesBeforeItsSequenceIsMadeGivesBackOnlyItsOwn) {
  KvLedger l = one_sharing();
  l.admit(2, 2, {10});
  l.grow(2, 1);
  EXPECT_EQ(l.reserved(), 8);
  l.leave(2);
  EXPECT_EQ(l.reserved(), 5);
  EXPECT_TRUE(l.expectable(10));
  EXPECT_EQ(l.held(1), 5);
}

}  // namespace
}  // namespace specula::actors
