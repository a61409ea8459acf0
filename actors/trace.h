// Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev): one lane per stream and actor
// (draft stream, verify stream, sampler, scheduler), complete events ("ph": "X") in microseconds.
#pragma once
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace specula::actors {

class Trace {
 public:
  enum Lane { Scheduler = 1, DraftStream = 2, VerifyStream = 3, Sampler = 4 };
  using Clock = std::chrono::steady_clock;

  Trace() : start_(Clock::now()) {}
  // Any thread: a span on `lane` from t0 to t1.
  void span(Lane lane, std::string name, Clock::time_point t0, Clock::time_point t1);
  // Any thread: {"traceEvents": [...]} with the lanes named.
  std::string json() const;
  // Any thread. Throws std::runtime_error if the file cannot be written.
  void write(const std::string& path) const;

 private:
  struct Span {
    Lane lane;
    std::string name;
    double ts_us, dur_us;
  };
  Clock::time_point start_;
  mutable std::mutex mu_;
  std::vector<Span> spans_;
};

// Records a span from construction to destruction (nothing when `trace` is null).
class TraceScope {
 public:
  TraceScope(Trace* trace, Trace::Lane lane, std::string name)
      : trace_(trace), lane_(lane), name_(std::move(name)), t0_(Trace::Clock::now()) {}
  ~TraceScope() {
    if (trace_) trace_->span(lane_, std::move(name_), t0_, Trace::Clock::now());
  }

 private:
  Trace* trace_;
  Trace::Lane lane_;
  std::string name_;
  Trace::Clock::time_point t0_;
};

}  // namespace specula::actors
