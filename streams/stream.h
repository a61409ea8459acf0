// A device stream: an ordered queue of work with events that mark points in it. The host device
// runs a worker thread per stream; the CUDA device wraps a cudaStream_t. Callers cannot tell
// which one they hold.
#pragma once

#include <functional>
#include <string>

#include "streams/event.h"

namespace specula::streams {

class Stream {
 public:
  virtual ~Stream() = default;

  virtual const std::string& name() const = 0;

  // Any thread, for every method; from several threads the order is the order of the calls.
  //
  // Run `work` on the host after everything enqueued before it. An exception from it does not
  // stop the stream: the next recorded event carries it. On a CUDA stream the work runs on
  // CUDA's callback thread and must not call CUDA.
  virtual void enqueue(std::function<void()> work) = 0;

  // An event that completes when the stream reaches this point. It carries the first failure of
  // the work enqueued since the previous record() (failures do not cross wait()).
  virtual Event record() = 0;

  // Work enqueued after this call starts only once `event` is complete.
  virtual void wait(const Event& event) = 0;

  // Blocks until everything enqueued so far has run; rethrows the failure it carried.
  virtual void synchronize() { record().wait(); }
};

}  // namespace specula::streams
