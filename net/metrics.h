// The server's Prometheus metrics (docs/protocol.md, "Metrics"): counters, histograms and
// gauges, rendered in the text exposition format 0.0.4. Owner only: the server's one I/O thread
// updates and renders them.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace specula::net {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double x);
  // Appends the _bucket / _sum / _count lines of metric `name`; `labels` ("route=\"/x\"", or
  // "") go before each line's own.
  void render(std::string& out, const std::string& name, const std::string& labels = {}) const;

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
  // Started and past their first token (a preempted one among them is shown as waiting: render),
  // and started with no token yet.
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t websocket_connections = 0;
  // Every HTTP request answered (a WebSocket upgrade counts once, as its 101), by route label
  // (http_route_label), method and status, and the seconds from its last byte read to its
  // response's last byte written, by route.
  std::map<std::tuple<std::string, std::string, unsigned>, uint64_t> http_requests;
  std::map<std::string, Histogram, std::less<>> http_duration;
  std::map<std::string, uint64_t> key_reloads;  // "ok" / "error": SIGHUP reads of --api-key-file

  void count_request(const std::string& outcome) { ++requests[outcome]; }
  void count_http(std::string_view route, std::string_view method, unsigned status, double seconds);
  // What the engine reports at render time (any thread may ask it).
  struct EngineReadings {
    int64_t kv_blocks_free = 0, kv_blocks_total = 0;
    int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;  // Engine::prefix_*_tokens
    uint64_t preemptions = 0;                                    // Engine::preemptions
    int64_t preempted_waiting = 0;                               // Engine::preempted_waiting
  };
  // The text page.
  std::string render(const EngineReadings& engine) const;
};

// The route label of a request's path: one of the server's routes ("/v1/models/{model}" for
// any model's), or "other", so that requests for made-up paths do not add series.
std::string_view http_route_label(std::string_view path);

// The method label: GET, HEAD, POST, OPTIONS, or "other".
std::string_view http_method_label(std::string_view method);

}  // namespace specula::net
