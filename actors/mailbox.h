// A many-producer, one-consumer mailbox on moodycamel::ConcurrentQueue. Its one reader is a
// Boost.Asio coroutine (or a plain thread): an empty mailbox suspends the reader and the next send
// resumes it on the reader's own executor. No lost wake-ups, no polling.
#pragma once

#include <concurrentqueue.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <new>
#include <optional>
#include <semaphore>
#include <utility>
#include <vector>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace specula::actors {

// What a send did, as CAF's lifo_inbox reports it.
enum class SendResult {
  queued,       // queued; the reader was not suspended, so nobody had to be woken
  woke_reader,  // queued, and this send resumed the suspended reader
  refused,      // the mailbox is closed: nothing was queued and the message is still the caller's
};

inline bool accepted(SendResult result) { return result != SendResult::refused; }

// How the reader and the senders meet without a lock (the proof is in docs/actors.md):
//
//   state_ = generation << 22 | senders in flight << 2 | parked << 1 | closed
//
// A sender enters (senders + 1; refused if closed), enqueues, and leaves (senders - 1 and
// generation + 1 in one atomic add). If the reader was parked when it left, it clears the parked
// bit; whoever clears the bit (a sender or close) owns the stored waker and calls it, once.
// The reader reads state_ (s), then looks in the queue; if the queue is empty it stores a waker
// and sets the parked bit with a compare-exchange that expects exactly s. So either no sender
// entered or left since s, and every sender still in flight will see the parked bit when it
// leaves; or the exchange fails and the reader looks again. The generation makes "nothing
// changed" exact (without it a sender that entered and left would restore the same value).
template <class T>
class Mailbox {
 public:
  class Sender;

  Mailbox() = default;
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;
  // Owner only, with no send in flight. A reader still suspended here is destroyed unresumed
  // (for a coroutine: its frame is freed). Senders made by make_sender() must be gone.
  ~Mailbox() = default;

  // Any thread. Messages sent from one OS thread arrive in the order sent (one moodycamel
  // implicit producer per thread); a coroutine that may hop threads uses a Sender instead.
  // Refused after close(), leaving `message` untouched. Throws std::bad_alloc if the queue
  // cannot grow.
  SendResult send(T&& message) {
    return send_with([&] { return queue_.enqueue(std::move(message)); });
  }
  SendResult send(const T& message) {
    return send_with([&] { return queue_.enqueue(message); });
  }

  // Any thread. Every message of `messages`, in order, as one send: one moodycamel bulk enqueue
  // publishes them together, and a parked reader is woken once, after the last is queued, so a
  // reader that receives the first can take the rest with try_receive(). Refused after close(),
  // leaving `messages` untouched.
  SendResult send_all(std::vector<T>&& messages) {
    if (messages.empty()) return SendResult::queued;
    return send_with([&] { return queue_.enqueue_bulk(std::make_move_iterator(messages.begin()), messages.size()); });
  }

  // Any thread. A handle whose messages arrive in the order they were sent through it, whatever
  // thread each send ran on (a moodycamel explicit producer). It must not outlive the mailbox.
  Sender make_sender() { return Sender(*this); }

  // Owner only (the one reader). The next message; suspends the calling coroutine while the
  // mailbox is empty and resumes it on its own executor. nullopt once the mailbox is closed and
  // every accepted message has been received.
  boost::asio::awaitable<std::optional<T>> receive() {
    for (;;) {
      const std::uint64_t seen = state_.load(std::memory_order_acquire);
      if (std::optional<T> message = try_receive()) co_return std::move(message);
      if (drained_after_close(seen)) co_return std::nullopt;
      co_await boost::asio::async_initiate<const boost::asio::use_awaitable_t<>&, void()>(
          [this, seen](auto handler) {
            auto work = boost::asio::make_work_guard(boost::asio::get_associated_executor(handler));
            park(seen, [handler = std::move(handler), work = std::move(work)]() mutable {
              boost::asio::post(std::move(handler));  // to the reader's executor, never inline
            });
          },
          boost::asio::use_awaitable);
    }
  }

  // Owner only, for a reader that is a plain thread: like receive(), blocking the thread.
  std::optional<T> receive_blocking() {
    for (;;) {
      const std::uint64_t seen = state_.load(std::memory_order_acquire);
      if (std::optional<T> message = try_receive()) return message;
      if (drained_after_close(seen)) return std::nullopt;
      park(seen, [this] { wakeup_.release(); });
      wakeup_.acquire();
    }
  }

  // Owner only. A message if one is queued now, without waiting.
  std::optional<T> try_receive() {
    std::optional<T> message;
    if (!queue_.try_dequeue(consumer_, message)) return std::nullopt;
    return message;
  }

  // Any thread. Later sends are refused; the reader still receives every message accepted before,
  // then nullopt. Returns whether this call woke the suspended reader.
  bool close() {
    std::uint64_t s = state_.load(std::memory_order_relaxed);
    while (!state_.compare_exchange_weak(s, (s | kClosed) & ~kParked, std::memory_order_acq_rel,
                                         std::memory_order_relaxed)) {
    }
    if (!(s & kParked)) return false;
    call_waker();  // the exchange cleared the parked bit, so the waker is ours
    return true;
  }

  // Any thread.
  bool closed() const { return state_.load(std::memory_order_acquire) & kClosed; }
  // Any thread. Approximate while senders or the reader are active.
  std::size_t size_approx() const { return queue_.size_approx(); }

 private:
  // Type-erased and move-only. Moved with swap: Asio 1.81's move assignment of
  // any_completion_handler wraps the source instead of moving it.
  using Waker = boost::asio::any_completion_handler<void()>;

  static constexpr std::uint64_t kClosed = 1;
  static constexpr std::uint64_t kParked = 2;
  static constexpr std::uint64_t kSender = 4;  // one sender in flight (20 bits of them)
  static constexpr std::uint64_t kSenderMask = ((std::uint64_t{1} << 20) - 1) * kSender;
  static constexpr std::uint64_t kGeneration = std::uint64_t{1} << 22;  // one send completed

  static bool drained_after_close(std::uint64_t seen) {
    // Closed with no sender in flight when `seen` was read, and the queue was empty after it:
    // every accepted message has been received.
    return (seen & kClosed) && (seen & kSenderMask) == 0;
  }

  template <class Enqueue>
  SendResult send_with(Enqueue&& enqueue) {
    const std::uint64_t before = state_.fetch_add(kSender, std::memory_order_acquire);
    if (before & kClosed) {
      leave();
      return SendResult::refused;
    }
    bool queued = false;
    try {
      queued = enqueue();
    } catch (...) {
      leave();
      throw;
    }
    const bool woke = leave();
    if (!queued) throw std::bad_alloc();
    return woke ? SendResult::woke_reader : SendResult::queued;
  }

  // A sender is done: one fewer in flight, one more generation. Wakes the reader if it is parked
  // (also after a refused send: a reader parked after close() waits for the last sender to leave).
  bool leave() {
    const std::uint64_t before = state_.fetch_add(kGeneration - kSender, std::memory_order_acq_rel);
    if (!(before & kParked)) return false;
    if (!(state_.fetch_and(~kParked, std::memory_order_acq_rel) & kParked)) return false;
    call_waker();  // we cleared the parked bit, so the waker is ours
    return true;
  }

  // Reader only. `seen` is the state read before the queue looked empty.
  template <class Wake>
  void park(std::uint64_t seen, Wake&& wake) {
    Waker waker(std::forward<Wake>(wake));
    waker_.swap(waker);
    if (state_.compare_exchange_strong(seen, seen | kParked, std::memory_order_acq_rel,
                                       std::memory_order_relaxed)) {
      return;  // a sender's leave() or close() will call the waker
    }
    call_waker();  // something changed since `seen`: look again at once
  }

  void call_waker() {
    Waker waker;
    waker.swap(waker_);
    std::move(waker)();
  }

  moodycamel::ConcurrentQueue<T> queue_;
  moodycamel::ConsumerToken consumer_{queue_};  // reader only
  std::atomic<std::uint64_t> state_{0};
  Waker waker_;                         // written by the reader, taken by whoever clears kParked
  std::binary_semaphore wakeup_{0};     // receive_blocking's waker releases it
};

// A producer handle (see Mailbox::make_sender). Use from one thread at a time.
template <class T>
class Mailbox<T>::Sender {
 public:
  Sender(Sender&&) noexcept = default;
  Sender& operator=(Sender&&) noexcept = default;

  SendResult send(T&& message) {
    return mailbox_->send_with([&] { return mailbox_->queue_.enqueue(token_, std::move(message)); });
  }
  SendResult send(const T& message) {
    return mailbox_->send_with([&] { return mailbox_->queue_.enqueue(token_, message); });
  }

 private:
  friend class Mailbox;
  explicit Sender(Mailbox& mailbox) : mailbox_(&mailbox), token_(mailbox.queue_) {}

  Mailbox* mailbox_;
  moodycamel::ProducerToken token_;
};

}  // namespace specula::actors
