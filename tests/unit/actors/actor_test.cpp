// Actor: messages dispatched by type on the actor's strand, failures reported and survived,
// clean shutdown.
#include "actors/actor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "tests/unit/actors/test_support.h"

namespace specula::actors {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

struct Add {
  int value = 0;
};
struct Fail {
  std::string why;
};
struct AddLater {  // handled by a coroutine that waits on a timer first
  int value = 0;
  bool then_fail = false;
};
using CounterMessage = std::variant<Add, Fail, AddLater>;

class Counter : public Actor<Counter, CounterMessage> {
 public:
  Counter(asio::any_io_executor executor, bool report_failures = true)
      : Actor(std::move(executor), "counter"), report_failures_(report_failures) {}

  void on(Add& m) {
    enter();
    log.push_back(m.value);
    leave();
  }
  void on(Fail& m) { throw std::runtime_error(m.why); }
  asio::awaitable<void> on(AddLater& m) {
    asio::steady_timer timer(co_await asio::this_coro::executor, 1ms);
    co_await timer.async_wait(asio::use_awaitable);
    if (m.then_fail) throw std::runtime_error("failed after waiting");
    log.push_back(m.value);
  }

  // Touched only on the actor's strand.
  std::vector<int> log;
  std::vector<std::string> failures_seen;
  // Any thread: handlers that ran concurrently or off the strand.
  std::atomic<int> overlaps{0};
  std::atomic<int> off_strand{0};

 protected:
  void on_failure(CounterMessage& message, std::exception_ptr error) override {
    if (!report_failures_) return Actor::on_failure(message, error);
    failures_seen.push_back(std::to_string(message.index()) + ": " + describe(error));
  }

 private:
  void enter() {
    if (inside_.exchange(true)) ++overlaps;
    if (!get_executor().running_in_this_thread()) ++off_strand;
  }
  void leave() { inside_.store(false); }

  bool report_failures_;
  std::atomic<bool> inside_{false};
};

TEST(Actor, HandlesMessagesInTheOrderOneSenderSentThem) {
  asio::io_context io;
  Counter counter(io.get_executor());
  counter.start();
  auto sender = counter.make_sender();
  for (int i = 0; i < 10'000; ++i) ASSERT_TRUE(accepted(sender.send(Add{i})));
  counter.stop();
  io.run();
  ASSERT_TRUE(counter.stopped());
  ASSERT_EQ(counter.log.size(), 10'000u);
  for (int i = 0; i < 10'000; ++i) ASSERT_EQ(counter.log[i], i);
}

TEST(Actor, ThatThrowsOnOneMessageReportsTheFailureAndGoesOn) {
  asio::io_context io;
  Counter counter(io.get_executor());
  counter.start();
  counter.send(Add{1});
  counter.send(Fail{"boom"});
  counter.send(Add{2});
  counter.stop();
  io.run();
  EXPECT_EQ(counter.log, (std::vector<int>{1, 2}));
  EXPECT_EQ(counter.failures(), 1u);
  EXPECT_EQ(counter.failures_seen, (std::vector<std::string>{"1: boom"}));
}

TEST(Actor, ThatThrowsInsideAnAwaitedHandlerReportsTheFailureAndGoesOn) {
  asio::io_context io;
  Counter counter(io.get_executor());
  counter.start();
  counter.send(AddLater{1, true});
  counter.send(AddLater{2, false});
  counter.stop();
  io.run();
  EXPECT_EQ(counter.log, (std::vector<int>{2}));
  EXPECT_EQ(counter.failures_seen, (std::vector<std::string>{"2: failed after waiting"}));
}

TEST(Actor, FinishesAnAwaitedHandlerBeforeTheNextMessage) {
  asio::io_context io;
  Counter counter(io.get_executor());
  counter.start();
  counter.send(AddLater{1});
  counter.send(Add{2});
  counter.send(AddLater{3});
  counter.send(Add{4});
  counter.stop();
  io.run();
  EXPECT_EQ(counter.log, (std::vector<int>{1, 2, 3, 4}));
}

TEST(Actor, WithoutAFailureHookWritesTheFailureToStderr) {
  asio::io_context io;
  Counter counter(io.get_executor(), /*report_failures=*/false);
  counter.start();
  counter.send(Fail{"disk on fire"});
  counter.stop();
  testing::internal::CaptureStderr();
  io.run();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("actor 'counter': disk on fire"), std::string::npos) << err;
  EXPECT_EQ(counter.failures(), 1u);
}

TEST(Actor, StopHandlesWhatWasAcceptedThenRefusesAndEnds) {
  asio::io_context io;
  Counter counter(io.get_executor());
  counter.start();
  for (int i = 0; i < 3; ++i) counter.send(Add{i});
  counter.stop();
  EXPECT_EQ(counter.send(Add{99}), SendResult::refused);
  EXPECT_FALSE(counter.stopped());
  std::thread runner([&] { io.run(); });
  counter.wait_stopped();
  runner.join();
  EXPECT_TRUE(counter.stopped());
  EXPECT_EQ(counter.log, (std::vector<int>{0, 1, 2}));
}

TEST(Actor, AnIdleActorStopsWhenAsked) {
  test::run_with_deadline(std::chrono::seconds(30), "stopping an idle actor", [] {
    asio::io_context io;
    Counter counter(io.get_executor());
    counter.start();
    std::thread runner([&] { io.run(); });
    std::this_thread::sleep_for(10ms);  // the loop is suspended on an empty mailbox
    counter.stop();
    counter.wait_stopped();
    runner.join();  // nothing keeps the io_context busy any more
    EXPECT_TRUE(counter.stopped());
  });
}

TEST(Actor, RunsOneHandlerAtATimeOnItsStrandWhateverThreadRunsIt) {
  constexpr int kSenders = 4;
  const int per_sender = 20'000 / test::kScale;
  test::run_with_deadline(std::chrono::seconds(60), "actor on a two-thread pool", [&] {
    asio::io_context io(2);
    Counter counter(io.get_executor());
    counter.start();
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) threads.emplace_back([&] { io.run(); });
    std::vector<std::thread> senders;
    for (int s = 0; s < kSenders; ++s) {
      senders.emplace_back([&] {
        for (int i = 0; i < per_sender; ++i) counter.send(Add{i});
      });
    }
    for (std::thread& t : senders) t.join();
    counter.stop();
    counter.wait_stopped();
    for (std::thread& t : threads) t.join();
    EXPECT_EQ(counter.log.size(), static_cast<size_t>(kSenders * per_sender));
    EXPECT_EQ(counter.overlaps.load(), 0);
    EXPECT_EQ(counter.off_strand.load(), 0);
  });
}

TEST(Actor, CannotBeStartedTwice) {
  asio::io_context io;
  Counter counter(io.get_executor());
  counter.start();
  EXPECT_THROW(counter.start(), std::logic_error);
  counter.stop();
  io.run();
}

}  // namespace
}  // namespace specula::actors
