// A stream for a device whose work is queued by host code: a launch thread (a HostStream) runs
// the enqueued host functions in order, and those queue the device's work on the device's own
// stream (for CUDA, kernels on the cudaStream_t the ops launch on). An event completes when the
// launch thread has reached it *and* the device stream has run everything queued before it, so
// a coroutine that co_awaits it resumes once the device's work is done, not just launched.
//
// This is what the draft and verifier actors get from a CUDA device (gpu/ops.h, make_stream):
// their host code (a forward pass) must not run on CUDA's callback thread, where a CudaStream
// runs enqueued work, because it calls CUDA.
#pragma once

#include <memory>
#include <string>

#include "streams/stream.h"

namespace specula::streams {

class LaunchStream final : public Stream {
 public:
  // `device`: the stream the launched work lands on (events are recorded there).
  LaunchStream(std::string name, std::unique_ptr<Stream> device);
  // The launch thread finishes first, then the device stream synchronizes.
  ~LaunchStream() override;

  const std::string& name() const override { return name_; }
  // Runs `work` on the launch thread, after everything enqueued before it was launched.
  void enqueue(std::function<void()> work) override;
  // Carries the first failure of the launch thread's work, else of the device stream's.
  Event record() override;
  // The launch thread waits (the host, not the device): later work is launched after `event`.
  void wait(const Event& event) override;

  Stream& device() { return *device_; }

 private:
  std::string name_;
  std::unique_ptr<Stream> device_;
  std::unique_ptr<Stream> launcher_;
};

}  // namespace specula::streams
