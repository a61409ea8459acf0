// EventState: completion pushed by the owning stream to blocked threads and registered waiters.
#include "streams/event.h"

namespace specula::streams {

std::exception_ptr EventState::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void EventState::wait() const { done_.wait(false, std::memory_order_acquire); }

void EventState::on_complete(Waiter waiter) {
  {
    std::lock_guard lock(mutex_);
    if (!done_.load(std::memory_order_relaxed)) {
      waiters_.push_back(std::move(waiter));
      return;
    }
  }
  std::move(waiter)(error());
}

void EventState::complete(std::exception_ptr error) {
  std::vector<Waiter> waiters;
  {
    std::lock_guard lock(mutex_);
    error_ = error;
    done_.store(true, std::memory_order_release);
    waiters.swap(waiters_);
  }
  done_.notify_all();
  for (Waiter& waiter : waiters) std::move(waiter)(error);
}

namespace {
std::shared_ptr<EventState> completed_state() {
  auto state = std::make_shared<EventState>();
  state->complete(nullptr);
  return state;
}
}  // namespace

Event::Event() {
  static const std::shared_ptr<EventState> completed = completed_state();
  state_ = completed;
}

void Event::wait() const {
  state_->wait();
  if (std::exception_ptr failure = state_->error()) std::rethrow_exception(failure);
}

}  // namespace specula::streams
