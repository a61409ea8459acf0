// The host device's stream: one worker thread runs the queue in order and completes each event
// when it reaches it.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "streams/stream.h"

namespace specula::streams {

class HostStream final : public Stream {
 public:
  explicit HostStream(std::string name = "host");
  // Runs everything already queued (completing its events), then joins the worker.
  ~HostStream() override;

  const std::string& name() const override { return name_; }
  void enqueue(std::function<void()> work) override;
  Event record() override;
  void wait(const Event& event) override;

 private:
  // Exactly one of the three is set.
  struct Item {
    std::function<void()> work;
    std::shared_ptr<EventState> completes;  // record(): complete this when reached
    std::shared_ptr<EventState> waits_for;  // wait(): block the worker until this is complete
  };

  void push(Item item);
  void run();  // the worker

  std::string name_;
  std::mutex mutex_;
  std::condition_variable wakeup_;
  std::deque<Item> queue_;     // under mutex_
  bool stopping_ = false;      // under mutex_
  std::exception_ptr failure_; // worker only: first failure since the previous event
  std::thread worker_;         // last: starts after the members it uses exist
};

}  // namespace specula::streams
