#include "streams/launch_stream.h"

#include "streams/host_stream.h"

namespace specula::streams {

LaunchStream::LaunchStream(std::string name, std::unique_ptr<Stream> device)
    : name_(std::move(name)), device_(std::move(device)), launcher_(std::make_unique<HostStream>(name_ + " (launch)")) {}

LaunchStream::~LaunchStream() {
  launcher_.reset();  // runs what is queued, then joins
  try {
    device_->synchronize();
  } catch (...) {
    // Failures are reported through events; nobody is left to receive this one.
  }
}

void LaunchStream::enqueue(std::function<void()> work) { launcher_->enqueue(std::move(work)); }

Event LaunchStream::record() {
  // On the launch thread, after the work before it: record on the device stream. The joined
  // event completes when the launch thread's event does (its failure first), then the device's.
  auto device_event = std::make_shared<Event>();
  launcher_->enqueue([device = device_.get(), device_event] { *device_event = device->record(); });
  Event launched = launcher_->record();
  auto joined = std::make_shared<EventState>();
  launched.state()->on_complete([joined, device_event](std::exception_ptr error) mutable {
    if (error) {
      joined->complete(error);
      return;
    }
    // Set before `launched` completed (the same launch thread ran it first).
    std::shared_ptr<EventState> on_device = device_event->state();
    device_event.reset();
    on_device->on_complete([joined](std::exception_ptr device_error) { joined->complete(device_error); });
  });
  return Event(std::move(joined));
}

void LaunchStream::wait(const Event& event) { launcher_->wait(event); }

}  // namespace specula::streams
