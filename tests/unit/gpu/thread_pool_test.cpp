// The host fork-join pool: coverage of every index, deterministic chunks (tail pieces included),
// tail pieces claimed by whichever thread is free, dispatch that survives 100k back-to-back jobs,
// errors carried back to the caller.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "gpu/host/thread_pool.h"

namespace specula {
namespace {

using Chunks = std::vector<std::pair<int64_t, int64_t>>;

// The chunks one parallel_for produced, sorted by begin.
Chunks chunks_of(ThreadPool& pool, int64_t n, int64_t grain, int tail_pieces = 0) {
  std::mutex m;
  Chunks out;
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    std::lock_guard lock(m);
    out.emplace_back(b, e);
  }, tail_pieces);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ThreadPool, CountsTheCallerAsOneOfItsThreads) {
  EXPECT_EQ(ThreadPool(1).threads(), 1);
  EXPECT_EQ(ThreadPool(3).threads(), 3);
}

TEST(ThreadPool, VisitsEveryIndexExactlyOnceInChunksThatAreMultiplesOfTheGrain) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    for (int tail : {0, 1, 4, 7}) {
      for (int64_t n : {0, 1, 2, 3, 7, 8, 64, 100, 1000, 4097}) {
        for (int64_t grain : {1, 2, 3, 8, 64, 5000}) {
          std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
          pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
            EXPECT_LT(b, e);
            EXPECT_EQ(b % grain, 0) << "chunk start not on a grain boundary";
            EXPECT_TRUE(e == n || e % grain == 0) << "chunk end not on a grain boundary";
            for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
          }, tail);
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1)
                << "index " << i << " n=" << n << " grain=" << grain << " threads=" << threads << " tail pieces=" << tail;
        }
      }
    }
  }
}

TEST(ThreadPool, SplitsTheSameRangeIntoTheSameChunksEveryTime) {
  ThreadPool pool(2);
  for (int tail : {0, 4}) {
    for (int64_t n : {5, 100, 49152}) {
      const Chunks first = chunks_of(pool, n, 1, tail);
      EXPECT_GT(first.size(), 1u) << "n=" << n << " should be split between two threads";
      for (int run = 0; run < 50; ++run) ASSERT_EQ(chunks_of(pool, n, 1, tail), first) << "n=" << n << " run " << run;
    }
  }
}

// One chunk a thread over the first nine tenths or so, then the pieces: 100 units on two threads
// are 45 + 45 and four pieces of the last 10 (10 / 4 each, to within one unit); with too few units
// for a piece besides each thread's chunk, no tail.
TEST(ThreadPool, CutsTheLastTenthIntoTheTailPiecesAskedFor) {
  ThreadPool pool(2);
  EXPECT_EQ(chunks_of(pool, 100, 1, 4), (Chunks{{0, 45}, {45, 90}, {90, 92}, {92, 95}, {95, 97}, {97, 100}}));
  EXPECT_EQ(chunks_of(pool, 100, 1, 0), (Chunks{{0, 50}, {50, 100}}));
  EXPECT_EQ(chunks_of(pool, 200, 2, 4), (Chunks{{0, 90}, {90, 180}, {180, 184}, {184, 190}, {190, 194}, {194, 200}}));
  EXPECT_EQ(chunks_of(pool, 5, 1, 4), (Chunks{{0, 2}, {2, 5}}));
  EXPECT_EQ(chunks_of(pool, 6, 1, 4), (Chunks{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}}));
}

// The thread that runs the first chunk holds it until every tail piece is done: the job can only
// finish if the pieces go to the other thread as it comes free, not by a fixed share.
TEST(ThreadPool, HandsTheTailPiecesToWhicheverThreadIsFreeFirst) {
  ThreadPool pool(2);
  for (int job = 0; job < 20; ++job) {
    std::atomic<int> pieces_done{0};
    std::atomic<bool> timed_out{false};
    std::mutex m;
    std::vector<std::thread::id> piece_threads;
    std::thread::id first_chunk_thread;
    pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
      if (b == 0) {
        {
          std::lock_guard lock(m);
          first_chunk_thread = std::this_thread::get_id();
        }
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (pieces_done.load() < 4)
          if (std::chrono::steady_clock::now() > deadline) {
            timed_out = true;
            return;
          } else {
            std::this_thread::yield();
          }
      } else if (b >= 90) {
        std::lock_guard lock(m);
        piece_threads.push_back(std::this_thread::get_id());
        pieces_done++;
      }
      (void)e;
    }, 4);
    ASSERT_FALSE(timed_out.load()) << "job " << job << ": the tail pieces waited for the thread holding the first chunk";
    ASSERT_EQ(piece_threads.size(), 4u);
    for (const auto& t : piece_threads) EXPECT_NE(t, first_chunk_thread) << "job " << job;
  }
}

TEST(ThreadPool, SurvivesOneHundredThousandBackToBackDispatches) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int k = 0; k < 100000; ++k)
    pool.parallel_for(2, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b, std::memory_order_relaxed); });
  EXPECT_EQ(sum.load(), 200000);
}

TEST(ThreadPool, WakesSleepingWorkersForALaterJob) {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  pool.parallel_for(2, 1, [&](int64_t, int64_t) { calls++; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin: the worker sleeps
  std::atomic<bool> worker_ran{false};
  const auto caller = std::this_thread::get_id();
  // Chunks wait for each other, so the job can only finish if the sleeping worker woke up.
  std::atomic<int> arrived{0};
  pool.parallel_for(2, 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() != caller) worker_ran = true;
    arrived++;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  });
  EXPECT_TRUE(worker_ran.load());
}

TEST(ThreadPool, RethrowsAnExceptionFromAnyChunkInTheCaller) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, 1, [](int64_t b, int64_t e) {
    if (b <= 77 && 77 < e) throw std::runtime_error("chunk failed");
  }), std::runtime_error);
  // And the pool still works afterwards.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 100);
}

TEST(ThreadPool, RunsANestedParallelForInlineInsteadOfDeadlocking) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) pool.parallel_for(10, 1, [&](int64_t b2, int64_t e2) { sum += e2 - b2; });
  });
  EXPECT_EQ(sum.load(), 40);
  // With tail pieces too: inline, the same chunks in order, every index once.
  std::vector<std::atomic<int>> seen(4 * 100);
  pool.parallel_for(4, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(100, 1, [&](int64_t b2, int64_t e2) {
        for (int64_t j = b2; j < e2; ++j) seen[static_cast<size_t>(i * 100 + j)]++;
      }, 4);
  }, 4);
  for (size_t k = 0; k < seen.size(); ++k) ASSERT_EQ(seen[k].load(), 1) << "index " << k;
}

}  // namespace
}  // namespace specula
