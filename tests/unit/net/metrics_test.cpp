// The /metrics page's gauges of requests (net/metrics.h): a preempted request is past its first
// token, yet while it waits to resume it is shown as waiting, as vLLM shows it.
#include "net/metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace specula::net {
namespace {

// The value of the unlabelled sample `name` on the page.
std::string sample(const std::string& page, const std::string& name) {
  const std::string at = "\n" + name + " ";
  const size_t from = page.find(at);
  if (from == std::string::npos) return "(missing)";
  const size_t start = from + at.size();
  return page.substr(start, page.find('\n', start) - start);
}

TEST(Metrics, APreemptedRequestWaitingToResumeIsShownAsWaitingNotRunning) {
  Metrics m;
  m.running = 3;  // past their first token, two of which the engine has preempted
  m.waiting = 1;
  Metrics::EngineReadings engine{.kv_blocks_free = 10, .kv_blocks_total = 64, .preemptions = 2, .preempted_waiting = 2};
  std::string page = m.render(engine);
  EXPECT_EQ(sample(page, "specula_requests_running"), "1");
  EXPECT_EQ(sample(page, "specula_requests_waiting"), "3");
  EXPECT_EQ(sample(page, "specula_preemptions_total"), "2");
  engine.preempted_waiting = 0;
  page = m.render(engine);
  EXPECT_EQ(sample(page, "specula_requests_running"), "3");
  EXPECT_EQ(sample(page, "specula_requests_waiting"), "1");
}

// The engine's count and the server's are read apart: a preempted request the server has not yet
// seen past its first token (it counts it as waiting already) is not taken from the running twice.
TEST(Metrics, MorePreemptedRequestsThanRunningOnesNeverMakeTheRunningGaugeNegative) {
  Metrics m;
  m.running = 1;
  m.waiting = 2;
  const std::string page = m.render({.kv_blocks_free = 0, .kv_blocks_total = 8, .preemptions = 3, .preempted_waiting = 3});
  EXPECT_EQ(sample(page, "specula_requests_running"), "0");
  EXPECT_EQ(sample(page, "specula_requests_waiting"), "3");
}

}  // namespace
}  // namespace specula::net
