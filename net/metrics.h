// The server's Prometheus metrics (docs/protocol.md, "Metrics"): counters, histograms and
// gauges, rendered in the text exposition format 0.0.4. Owner only: the server's one I/O thread
// updates and renders them.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace specula::net {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double x);
  // Appends the _bucket / _sum / _count lines of metric `name`.
  void render(std::string& out, const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

struct Metrics {
  Metrics();

  std::map<std::string, uint64_t> requests;  // outcome -> finished requests
  uint64_t prompt_tokens = 0;
  uint64_t generation_tokens = 0;
  uint64_t draft_tokens = 0;
  uint64_t accepted_tokens = 0;
  Histogram acceptance_rate;       // per request
  Histogram accepted_length;       // per round
  Histogram confidence_threshold;  // per request that drafted under the confidence rule: its mean threshold
  Histogram ttft;                  // seconds
  Histogram inter_token;           // seconds
  Histogram e2e;                   // seconds
  int64_t running = 0;           // started and past their first token
  int64_t waiting = 0;           // started, no token yet
  int64_t websocket_connections = 0;

  void count_request(const std::string& outcome) { ++requests[outcome]; }
  // What the engine reports at render time (any thread may ask it).
  struct EngineReadings {
    int64_t kv_blocks_free = 0, kv_blocks_total = 0;
    int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;  // Engine::prefix_*_tokens
  };
  // The text page.
  std::string render(const EngineReadings& engine) const;
};

}  // namespace specula::net
