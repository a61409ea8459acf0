// What every connection of `specula serve` shares: the engine, the settings, the metrics, the
// admission count and the registries that shutdown walks. Owner only: everything here is used
// on the server's one I/O thread (the engine itself is thread-safe), but for the preparation
// thread, which runs work too long for the I/O thread (templating and tokenizing long prompts).
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "actors/engine.h"
#include "net/api_request.h"
#include "net/auth.h"
#include "net/metrics.h"
#include "net/responses.h"

namespace specula::net {

class Generation;

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  int max_queue = 256;                     // requests waiting beyond the engine's max_batch
  std::size_t max_message_bytes = 1 << 20; // WebSocket message (larger: message_too_large)
  std::size_t max_body_bytes = 1 << 20;    // HTTP request body (larger: 413)
  std::size_t send_queue_limit = 1024;     // outgoing WebSocket messages per socket
  std::size_t max_connections = 4096;      // open HTTP and WebSocket connections (more: a 503 and closed)
  std::chrono::milliseconds shutdown_timeout{10'000};  // in-flight work may finish within this
  std::string served_model_name;           // "" = the model file's name
  RequestDefaults defaults;
  // Chat replies' reasoning (<think> ... </think>) returned apart as reasoning_content
  // (--reasoning-parser; model/reasoning.h).
  bool reasoning = false;
  // ... and the vocabulary holds <think> or </think> as a special token: replies read for it keep
  // special tokens' text (their text would be skipped otherwise).
  bool reasoning_keeps_special_tokens = false;
  AccessConfig access;                     // API key and allowed WebSocket origins
  // The whole key list read again on SIGHUP (--api-key-file's keys beside --api-key's), or an
  // exception saying why not, and the keys in use stay. Empty: SIGHUP keeps its default action.
  std::function<std::vector<std::string>()> reload_keys;
};

struct ServerState {
  ServerState(actors::Engine& engine_, ServerConfig config_);

  actors::Engine& engine;
  ServerConfig config;
  std::string model_name;
  int64_t created = 0;  // unix seconds at start (OpenAI's "created")
  Metrics metrics;
  bool draining = false;  // after SIGINT / SIGTERM: refuse new work
  int64_t inflight = 0;   // generations started and not ended
  std::map<uint64_t, Generation*> generations;
  std::map<uint64_t, std::function<void()>> connections;  // closers, for the end of shutdown
  uint64_t next_key = 1;
  ResponseStore responses;  // /v1/responses' kept responses (previous_response_id, GET and DELETE)
  // The background responses still running, by id: what POST /v1/responses/{id}/cancel and DELETE stop.
  std::map<std::string, std::weak_ptr<Generation>> background_runs;
  // run_server's preparation thread: joined before the io_context goes, so that what it hands
  // back always has an I/O thread's queue to land in. Null: everything runs on the I/O thread.
  boost::asio::thread_pool* prep = nullptr;

  int64_t admission_limit() const { return engine.config().max_batch + config.max_queue; }
};

// fn() on the preparation thread, resuming on the caller's executor with its result. fn owns
// what it reads (captures by value, or references to what outlives the server such as the
// engine): the coroutine waiting here is destroyed with the io_context at shutdown, perhaps while
// the preparation thread still runs fn. Requires st.prep.
// (A forwarding reference, and callers pass a named callable: a by-value parameter, or a lambda
// written in the call, would be a temporary made within the caller's co_await, which GCC 12
// destroys twice.)
template <class F>
boost::asio::awaitable<std::invoke_result_t<std::decay_t<F>&>> on_prep_thread(ServerState& st, F&& fn) {
  using Result = std::invoke_result_t<std::decay_t<F>&>;
  auto work = [fn = std::forward<F>(fn)]() mutable -> boost::asio::awaitable<Result> { co_return fn(); };
  // (Named, not temporaries within the co_await: GCC 12 destroys such temporaries twice.)
  Result result = co_await boost::asio::co_spawn(*st.prep, std::move(work), boost::asio::use_awaitable);
  co_return result;
}

// A registration that lasts as long as this object (a connection's closer).
class ConnectionRegistration {
 public:
  ConnectionRegistration(ServerState& st, std::function<void()> close) : st_(st), key_(st.next_key++) {
    st_.connections.emplace(key_, std::move(close));
  }
  ~ConnectionRegistration() { st_.connections.erase(key_); }
  ConnectionRegistration(const ConnectionRegistration&) = delete;
  ConnectionRegistration& operator=(const ConnectionRegistration&) = delete;

 private:
  ServerState& st_;
  uint64_t key_;
};

}  // namespace specula::net
