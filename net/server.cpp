// The acceptor, the signal handling and the shutdown sequence, all on one I/O thread.
#include "net/server.h"

#include <csignal>
#include <cstdio>
#include <ctime>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "net/generation.h"
#include "net/sessions.h"

namespace specula::net {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr auto kAwait = asio::as_tuple(asio::use_awaitable);

asio::awaitable<void> accept_loop(ServerState& st, tcp::acceptor& acceptor) {
  asio::steady_timer backoff(acceptor.get_executor());
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(kAwait);
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) co_return;
    if (ec) {  // e.g. out of file descriptors: wait a moment rather than spin the I/O thread on it
      backoff.expires_after(std::chrono::milliseconds(100));
      co_await backoff.async_wait(kAwait);
      continue;
    }
    if (st.connections.size() >= st.config.max_connections) {
      // Past the cap a connection gets a 503 and is closed (the kernel takes these few bytes at once).
      static constexpr std::string_view kBusy =
          "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: 92\r\n\r\n"
          "{\"error\":{\"code\":\"overloaded\",\"message\":\"too many open connections\",\"type\":\"server_error\"}}\n";
      socket.non_blocking(true, ec);
      socket.write_some(asio::buffer(kBusy), ec);
      socket.close(ec);
      continue;
    }
    socket.set_option(tcp::no_delay(true), ec);
    asio::co_spawn(acceptor.get_executor(), run_http_session(st, std::move(socket)), asio::detached);
  }
}

// Polls (every 20 ms) until no generation is in flight or the deadline passes.
asio::awaitable<bool> wait_idle(ServerState& st, std::chrono::steady_clock::time_point deadline) {
  asio::steady_timer timer(co_await asio::this_coro::executor);
  while (st.inflight > 0 && std::chrono::steady_clock::now() < deadline) {
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(kAwait);
  }
  co_return st.inflight == 0;
}

asio::awaitable<void> shutdown_on_signal(ServerState& st, asio::signal_set& signals, tcp::acceptor& acceptor,
                                         asio::io_context& io) {
  auto [ec, signo] = co_await signals.async_wait(kAwait);
  if (ec) co_return;
  std::fprintf(stderr, "specula serve: %s: draining %lld request(s), at most %.1f s\n",
               signo == SIGINT ? "SIGINT" : "SIGTERM", static_cast<long long>(st.inflight),
               st.config.shutdown_timeout.count() / 1000.0);
  st.draining = true;
  boost::system::error_code ignored;
  acceptor.close(ignored);
  // A second signal skips the wait.
  signals.async_wait([&st](const boost::system::error_code& e, int) {
    if (!e) st.config.shutdown_timeout = std::chrono::milliseconds(0);
  });
  const auto start = std::chrono::steady_clock::now();
  asio::steady_timer timer(io);
  while (st.inflight > 0 && std::chrono::steady_clock::now() - start < st.config.shutdown_timeout) {
    timer.expires_after(std::chrono::milliseconds(20));
    co_await timer.async_wait(kAwait);
  }
  if (st.inflight > 0) {
    std::fprintf(stderr, "specula serve: cancelling %lld request(s) still running\n", static_cast<long long>(st.inflight));
    for (auto& [key, g] : st.generations) g->cancel();
    co_await wait_idle(st, std::chrono::steady_clock::now() + std::chrono::seconds(5));
  }
  // Let the last events reach the sockets, then close them (WebSockets with 1001).
  auto closers = st.connections;
  for (auto& [key, close] : closers) close();
  co_await wait_idle(st, std::chrono::steady_clock::now());
  timer.expires_after(std::chrono::milliseconds(200));
  co_await timer.async_wait(kAwait);
  signals.cancel(ignored);
  io.stop();
}

// SIGHUP: the key list read again (ServerConfig::reload_keys). Requests check the key each time,
// so a key taken out is refused from the next request on; open WebSocket connections go on.
asio::awaitable<void> reload_keys_on_signal(ServerState& st, asio::signal_set& hup) {
  for (;;) {
    auto [ec, signo] = co_await hup.async_wait(kAwait);
    if (ec) co_return;
    try {
      std::vector<std::string> keys = st.config.reload_keys();
      st.config.access.api_keys = std::move(keys);
      ++st.metrics.key_reloads["ok"];
      std::fprintf(stderr, "specula serve: SIGHUP: keys read again, %zu accepted now\n", st.config.access.api_keys.size());
    } catch (const std::exception& e) {
      ++st.metrics.key_reloads["error"];
      std::fprintf(stderr, "specula serve: SIGHUP: %s; the %zu key(s) in use stay\n", e.what(),
                   st.config.access.api_keys.size());
    }
  }
}

}  // namespace

ServerState::ServerState(actors::Engine& engine_, ServerConfig config_)
    : engine(engine_), config(std::move(config_)), created(static_cast<int64_t>(std::time(nullptr))) {
  model_name = config.served_model_name.empty() ? model_name_from_path(engine.config().target) : config.served_model_name;
}

int run_server(actors::Engine& engine, const ServerConfig& config,
               const std::function<void(const std::string& url)>& on_listening) {
  // The state outlives the io_context: coroutine frames destroyed with it still touch the state.
  ServerState st(engine, config);
  asio::io_context io(1);
  tcp::acceptor acceptor(io);
  try {
    const tcp::endpoint endpoint(asio::ip::make_address(config.host), static_cast<unsigned short>(config.port));
    acceptor.open(endpoint.protocol());
    acceptor.set_option(tcp::acceptor::reuse_address(true));
    acceptor.bind(endpoint);
    acceptor.listen(asio::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    throw std::runtime_error("cannot listen on " + config.host + ":" + std::to_string(config.port) + ": " +
                             e.code().message());
  }
  // Declared after the io_context, so destroyed (joined) before it.
  asio::thread_pool prep(1);
  st.prep = &prep;
  asio::signal_set signals(io, SIGINT, SIGTERM);
  asio::co_spawn(io, accept_loop(st, acceptor), asio::detached);
  asio::co_spawn(io, shutdown_on_signal(st, signals, acceptor, io), asio::detached);
  asio::signal_set hup(io);
  if (st.config.reload_keys) {
    hup.add(SIGHUP);
    st.metrics.key_reloads = {{"ok", 0}, {"error", 0}};
    asio::co_spawn(io, reload_keys_on_signal(st, hup), asio::detached);
  }
  if (on_listening) {
    const tcp::endpoint local = acceptor.local_endpoint();
    std::string host = local.address().to_string();
    if (local.address().is_v6()) host = "[" + host + "]";
    on_listening("http://" + host + ":" + std::to_string(local.port()));
  }
  io.run();
  return 0;
}

}  // namespace specula::net
