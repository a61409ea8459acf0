// An event marks a point in a stream's ordered work. A plain thread can block on it (wait), a
// coroutine can co_await it (async_wait: resumed on its own executor), another stream can wait
// for it (Stream::wait). Completion is pushed by the stream; nobody polls.
//
// Kept C++17 and light on Asio so that nvcc compiles it (streams/cuda_stream.cu includes it).
#pragma once

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

namespace specula::streams {

// The completion state shared by the Event handles of one recorded point. A device derives from
// it to keep its native event alongside (the CUDA stream keeps a cudaEvent_t).
class EventState {
 public:
  // Called once with the failure carried by the event (null if none). Move-only.
  using Waiter = boost::asio::any_completion_handler<void(std::exception_ptr)>;

  EventState() = default;
  EventState(const EventState&) = delete;
  EventState& operator=(const EventState&) = delete;
  virtual ~EventState() = default;

  // Any thread.
  bool ready() const { return done_.load(std::memory_order_acquire); }
  // Any thread: the first failure of the stream's work since its previous event; null if none
  // or not ready yet.
  std::exception_ptr error() const;
  // Any thread: blocks until ready. Does not throw.
  void wait() const;
  // Any thread: `waiter` is called once, on the thread that completes the event, or here at once
  // if it already is complete. It must be quick and must not block (it runs on a stream worker
  // or on CUDA's callback thread): post to an executor and return.
  void on_complete(Waiter waiter);
  // The owning stream, once: mark complete, wake blocked threads, call the waiters.
  void complete(std::exception_ptr error);

 private:
  std::atomic<bool> done_{false};
  mutable std::mutex mutex_;
  std::exception_ptr error_;      // under mutex_, written once before done_
  std::vector<Waiter> waiters_;   // under mutex_
};

// A copyable handle to an EventState. A default-constructed Event is already complete.
class Event {
 public:
  Event();
  explicit Event(std::shared_ptr<EventState> state) : state_(std::move(state)) {}

  // Any thread, for every method.
  bool ready() const { return state_->ready(); }
  std::exception_ptr error() const { return state_->error(); }
  // Blocks until the event completes; rethrows the failure it carries.
  void wait() const;

  // Completes with void(std::exception_ptr) on the handler's associated executor, never inline:
  //   co_await event.async_wait(boost::asio::use_awaitable);  // resumes on the coroutine's
  //                                                          // executor; throws its failure
  template <class CompletionToken>
  auto async_wait(CompletionToken&& token) const {
    return boost::asio::async_initiate<CompletionToken, void(std::exception_ptr)>(
        [state = state_](auto handler) {
          auto work = boost::asio::make_work_guard(boost::asio::get_associated_executor(handler));
          state->on_complete(
              [handler = std::move(handler), work = std::move(work)](std::exception_ptr error) mutable {
                boost::asio::post(boost::asio::append(std::move(handler), std::move(error)));
              });
        },
        token);
  }

  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_;
};

}  // namespace specula::streams
