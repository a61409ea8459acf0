// The actor base: a mailbox of one std::variant of plain message structs, drained by a coroutine
// on the actor's own strand; each message goes to the derived actor's on(...) overload for its
// type. An exception while handling one message is reported to on_failure and the actor goes on.
//
//   using DraftMessage = std::variant<DraftRound, Release>;   // actors/messages.h
//   class DraftActor : public Actor<DraftActor, DraftMessage> {
//    public:
//     boost::asio::awaitable<void> on(DraftRound& round);  // may co_await; the next message waits
//     void on(Release& release);                           // handled at once
//     void on_failure(DraftMessage& message, std::exception_ptr error) override;
//   };
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/strand.hpp>

#include "actors/mailbox.h"

namespace specula::actors {

// The exception's what(), or a fixed text for something that is not a std::exception.
std::string describe(const std::exception_ptr& error);

// One line on stderr: "specula: actor '<actor>': <what>".
void report_to_stderr(std::string_view actor, std::string_view what);

template <class Derived, class Message>
class Actor {
 public:
  using message_type = Message;
  using Sender = typename Mailbox<Message>::Sender;
  using executor_type = boost::asio::strand<boost::asio::any_io_executor>;

  // Owner only (construction). The actor's handlers run on a strand of `executor`: one at a
  // time, on whichever thread runs the executor.
  Actor(boost::asio::any_io_executor executor, std::string name)
      : strand_(boost::asio::make_strand(std::move(executor))), name_(std::move(name)) {}

  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  // Owner only. Precondition: the loop has ended (wait_stopped), or the executor will never run
  // again; otherwise the loop would resume on a destroyed actor.
  virtual ~Actor() { mailbox_.close(); }

  // Owner only, once: spawn the message loop on the strand.
  void start() {
    if (started_.exchange(true)) throw std::logic_error("actor '" + name_ + "' started twice");
    // The completion handler owns `ended` so that it never touches an actor already destroyed
    // by a thread that saw the flag.
    boost::asio::co_spawn(strand_, run(), [ended = ended_, name = name_](std::exception_ptr error) {
      if (error) report_to_stderr(name, "the message loop ended: " + describe(error));
      ended->store(true, std::memory_order_release);
      ended->notify_all();
    });
  }

  // Any thread. Refused once stop() has been called.
  SendResult send(Message&& message) { return mailbox_.send(std::move(message)); }
  SendResult send(const Message& message) { return mailbox_.send(message); }

  // Any thread: a handle whose messages arrive in the order sent through it (give one to each
  // actor that talks to this one). It must not outlive this actor.
  Sender make_sender() { return mailbox_.make_sender(); }

  // Any thread: refuse new messages; the loop handles those already accepted, then ends.
  void stop() { mailbox_.close(); }

  // Any thread: the loop has ended (or never started).
  bool stopped() const {
    return !started_.load(std::memory_order_acquire) || ended_->load(std::memory_order_acquire);
  }

  // Any thread except one running this actor's executor: blocks until the loop has ended.
  // Call stop() first, or it waits for someone else to.
  void wait_stopped() const {
    if (!started_.load(std::memory_order_acquire)) return;
    ended_->wait(false, std::memory_order_acquire);
  }

  // Any thread: how many messages have failed so far.
  std::uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

  // Any thread.
  const std::string& name() const { return name_; }
  const executor_type& get_executor() const { return strand_; }

 protected:
  // Supervision, on the actor's strand: handling `message` threw `error`. `message` is in
  // whatever state the handler left it. An actor that serves requests overrides this to send
  // an error event to each request the message was about; the default writes to stderr.
  // It should not throw; if it does, that is written to stderr and the loop goes on.
  virtual void on_failure(Message& message, std::exception_ptr error) {
    report_to_stderr(name_, describe(error));
  }

 private:
  boost::asio::awaitable<void> run() {
    while (std::optional<Message> message = co_await mailbox_.receive()) {
      std::exception_ptr error;
      try {
        boost::asio::awaitable<void> pending =
            std::visit([this](auto& m) { return handle(m); }, *message);
        if (pending.valid()) co_await std::move(pending);
      } catch (...) {
        error = std::current_exception();
      }
      if (error) report(*message, error);
    }
  }

  // Calls the derived actor's handler; an asynchronous one is returned to be awaited.
  template <class M>
  boost::asio::awaitable<void> handle(M& m) {
    Derived& self = static_cast<Derived&>(*this);
    static_assert(requires { self.on(m); },
                  "the actor has no accessible on(...) for one of the message types it accepts");
    if constexpr (std::is_same_v<decltype(self.on(m)), boost::asio::awaitable<void>>) {
      return self.on(m);
    } else {
      self.on(m);
      return {};
    }
  }

  void report(Message& message, const std::exception_ptr& error) {
    failures_.fetch_add(1, std::memory_order_relaxed);
    try {
      on_failure(message, error);
    } catch (...) {
      report_to_stderr(name_, "on_failure threw: " + describe(std::current_exception()));
    }
  }

  executor_type strand_;
  std::string name_;
  Mailbox<Message> mailbox_;
  std::atomic<bool> started_{false};
  std::shared_ptr<std::atomic<bool>> ended_ = std::make_shared<std::atomic<bool>>(false);
  std::atomic<std::uint64_t> failures_{0};
};

}  // namespace specula::actors
