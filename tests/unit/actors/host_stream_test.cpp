// Host streams and events: work in order, events completed by the worker, awaited from
// coroutines (resumed on their own executor) and waited on by other streams.
#include "streams/host_stream.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <semaphore>
#include <stdexcept>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "tests/unit/actors/test_support.h"

namespace specula::streams {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

TEST(HostStream, RunsWorkInTheOrderItWasEnqueued) {
  HostStream stream("order");
  std::vector<int> ran;  // touched only by the worker until synchronize returns
  for (int i = 0; i < 10'000; ++i) stream.enqueue([&ran, i] { ran.push_back(i); });
  stream.synchronize();
  ASSERT_EQ(ran.size(), 10'000u);
  for (int i = 0; i < 10'000; ++i) ASSERT_EQ(ran[i], i);
}

TEST(HostStream, AnEventCompletesOnlyWhenTheWorkBeforeItHasRun) {
  HostStream stream;
  std::binary_semaphore gate(0);
  bool ran = false;
  stream.enqueue([&] {
    gate.acquire();
    ran = true;
  });
  Event event = stream.record();
  std::this_thread::sleep_for(10ms);
  EXPECT_FALSE(event.ready());
  gate.release();
  event.wait();
  EXPECT_TRUE(event.ready());
  EXPECT_TRUE(ran);
}

TEST(HostStream, AnEventAwaitedFromACoroutineResumesItOnTheCoroutinesExecutor) {
  asio::io_context io;
  auto strand = asio::make_strand(io);
  HostStream stream;
  std::binary_semaphore gate(0);
  std::thread::id worker_thread, io_thread, resumed_on;
  bool on_strand = false;
  stream.enqueue([&] {
    worker_thread = std::this_thread::get_id();
    gate.acquire();
  });
  Event event = stream.record();
  asio::co_spawn(strand, [&]() -> asio::awaitable<void> {
    co_await event.async_wait(asio::use_awaitable);
    resumed_on = std::this_thread::get_id();
    on_strand = strand.running_in_this_thread();
  }, asio::detached);
  std::thread runner([&] {
    io_thread = std::this_thread::get_id();
    io.run();
  });
  std::this_thread::sleep_for(10ms);  // the coroutine is suspended on the event
  gate.release();
  runner.join();
  EXPECT_EQ(resumed_on, io_thread);
  EXPECT_NE(resumed_on, worker_thread);
  EXPECT_TRUE(on_strand);
}

TEST(HostStream, WaitingOnAnotherStreamsEventDoesNotRunAhead) {
  HostStream a("a"), b("b");
  std::binary_semaphore gate(0);
  std::atomic<bool> a_done{false}, b_ran{false};
  bool b_saw_a_done = false;
  a.enqueue([&] {
    gate.acquire();
    a_done = true;
  });
  b.wait(a.record());
  b.enqueue([&] {
    b_saw_a_done = a_done.load();
    b_ran = true;
  });
  Event b_done = b.record();
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(b_ran.load()) << "b ran ahead of the event it waits for";
  EXPECT_FALSE(b_done.ready());
  gate.release();
  b_done.wait();
  EXPECT_TRUE(b_saw_a_done);
}

TEST(HostStream, AFailedWorkItemIsCarriedByTheNextEventAndTheStreamGoesOn) {
  asio::io_context io;
  HostStream stream;
  stream.enqueue([] { throw std::runtime_error("kernel failed"); });
  Event failed = stream.record();
  bool later_ran = false;
  stream.enqueue([&] { later_ran = true; });
  Event fine = stream.record();

  EXPECT_THROW(failed.wait(), std::runtime_error);
  EXPECT_NO_THROW(fine.wait());
  EXPECT_TRUE(later_ran);

  std::string awaited_error;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    try {
      co_await failed.async_wait(asio::use_awaitable);
    } catch (const std::runtime_error& e) {
      awaited_error = e.what();
    }
  }, asio::detached);
  io.run();
  EXPECT_EQ(awaited_error, "kernel failed");
}

TEST(HostStream, DestructionRunsWhatWasQueuedAndCompletesItsEvents) {
  std::atomic<int> ran{0};
  Event last;
  {
    HostStream stream;
    for (int i = 0; i < 100; ++i) stream.enqueue([&] { ++ran; });
    last = stream.record();
  }
  EXPECT_TRUE(last.ready());
  EXPECT_EQ(ran.load(), 100);
}

TEST(Event, ADefaultEventIsAlreadyComplete) {
  Event event;
  EXPECT_TRUE(event.ready());
  EXPECT_NO_THROW(event.wait());
  asio::io_context io;
  bool resumed = false;
  asio::co_spawn(io, [&]() -> asio::awaitable<void> {
    co_await event.async_wait(asio::use_awaitable);
    resumed = true;
  }, asio::detached);
  io.run();
  EXPECT_TRUE(resumed);
}

TEST(Event, EveryCoroutineAwaitingOneEventResumes) {
  test::run_with_deadline(std::chrono::seconds(30), "fifty coroutines on one event", [] {
    asio::io_context io(2);
    HostStream stream;
    std::binary_semaphore gate(0);
    stream.enqueue([&] { gate.acquire(); });
    Event event = stream.record();
    std::atomic<int> resumed{0};
    for (int i = 0; i < 50; ++i) {
      asio::co_spawn(asio::make_strand(io), [&]() -> asio::awaitable<void> {
        co_await event.async_wait(asio::use_awaitable);
        ++resumed;
      }, asio::detached);
    }
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) threads.emplace_back([&] { io.run(); });
    std::this_thread::sleep_for(10ms);
    EXPECT_EQ(resumed.load(), 0);
    gate.release();
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(resumed.load(), 50);
  });
}

}  // namespace
}  // namespace specula::streams
