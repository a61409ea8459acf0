// Chrome trace-event JSON writer.
#include "actors/trace.h"

#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace specula::actors {

void Trace::span(Lane lane, std::string name, Clock::time_point t0, Clock::time_point t1) {
  using us = std::chrono::duration<double, std::micro>;
  std::lock_guard lock(mu_);
  spans_.push_back({lane, std::move(name), us(t0 - start_).count(), us(t1 - t0).count()});
}

std::string Trace::json() const {
  nlohmann::json events = nlohmann::json::array();
  const std::pair<Lane, const char*> lanes[] = {
      {Scheduler, "scheduler"}, {DraftStream, "draft stream"}, {VerifyStream, "verify stream"}, {Sampler, "sampler"}};
  for (const auto& [lane, name] : lanes) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", 1}, {"tid", static_cast<int>(lane)},
                      {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", 1}, {"tid", static_cast<int>(lane)},
                      {"args", {{"sort_index", static_cast<int>(lane)}}}});
  }
  std::lock_guard lock(mu_);
  for (const Span& s : spans_)
    events.push_back({{"ph", "X"}, {"name", s.name}, {"pid", 1}, {"tid", static_cast<int>(s.lane)},
                      {"ts", s.ts_us}, {"dur", s.dur_us}});
  return nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

void Trace::write(const std::string& path) const {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write the trace to " + path);
  f << json() << '\n';
  if (!f) throw std::runtime_error("failed writing the trace to " + path);
}

}  // namespace specula::actors
