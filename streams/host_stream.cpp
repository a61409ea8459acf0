// HostStream: a mutex-guarded queue drained by one worker thread, which sleeps while it is empty.
#include "streams/host_stream.h"

#include <cstdio>
#include <utility>

namespace specula::streams {
namespace {

std::string what(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

HostStream::HostStream(std::string name) : name_(std::move(name)), worker_([this] { run(); }) {}

HostStream::~HostStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wakeup_.notify_one();
  worker_.join();
}

void HostStream::push(Item item) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(item));
  }
  wakeup_.notify_one();
}

void HostStream::enqueue(std::function<void()> work) { push(Item{std::move(work), nullptr, nullptr}); }

Event HostStream::record() {
  auto state = std::make_shared<EventState>();
  push(Item{nullptr, state, nullptr});
  return Event(std::move(state));
}

void HostStream::wait(const Event& event) {
  if (event.ready()) return;
  push(Item{nullptr, nullptr, event.state()});
}

void HostStream::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock lock(mutex_);
      wakeup_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping, and everything queued has run
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    if (item.waits_for) {
      item.waits_for->wait();
    } else if (item.completes) {
      item.completes->complete(std::exchange(failure_, nullptr));
    } else {
      try {
        item.work();
      } catch (...) {
        if (!failure_) failure_ = std::current_exception();
      }
    }
  }
  if (failure_) {  // no event was recorded after it; do not lose it silently
    std::fprintf(stderr, "specula: stream '%s': work failed and no later event reported it: %s\n",
                 name_.c_str(), what(failure_).c_str());
  }
}

}  // namespace specula::streams
