// The host fork-join pool: coverage of every index, deterministic chunks, dispatch that
// survives 100k back-to-back jobs, errors carried back to the caller.
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
Chunks chunks_of(ThreadPool& pool, int64_t n, int64_t grain) {
  std::mutex m;
  Chunks out;
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    std::lock_guard lock(m);
    out.emplace_back(b, e);
  });
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
    for (int64_t n : {0, 1, 2, 3, 7, 8, 64, 100, 1000, 4097}) {
      for (int64_t grain : {1, 2, 3, 8, 64, 5000}) {
        std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          EXPECT_LT(b, e);
          EXPECT_EQ(b % grain, 0) << "chunk start not on a grain boundary";
          EXPECT_TRUE(e == n || e % grain == 0) << "chunk end not on a grain boundary";
          for (int64_t i = b; i < e; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << "index " << i << " n=" << n << " grain=" << grain << " threads=" << threads;
      }
    }
  }
}

TEST(ThreadPool, SplitsTheSameRangeIntoTheSameChunksEveryTime) {
  ThreadPool pool(2);
  for (int64_t n : {5, 100, 49152}) {
    const Chunks first = chunks_of(pool, n, 1);
    EXPECT_GT(first.size(), 1u) << "n=" << n << " should be split between two threads";
    for (int run = 0; run < 50; ++run) ASSERT_EQ(chunks_of(pool, n, 1), first) << "n=" << n << " run " << run;
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
}

}  // namespace
}  // namespace specula
