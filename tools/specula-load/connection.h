// One session's connection to the server, WebSocket or HTTP (SSE), running one request at a time.
// Everything runs on one io_context thread; a Connection is owned through shared_ptr so that a
// timeout timer can close it.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <nlohmann/json.hpp>

#include "tools/specula-load/record.h"
#include "tools/specula-load/url.h"

namespace specula::load {

// Seconds since the run began (steady clock).
class RunClock {
 public:
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  void reset() { t0_ = std::chrono::steady_clock::now(); }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

class Connection {
 public:
  virtual ~Connection() = default;
  // TCP connect (and the WebSocket handshake). Throws std::runtime_error with a one-line reason.
  virtual boost::asio::awaitable<void> open() = 0;
  // Sends `body` and reads until the request ends, filling `r` (start, events, end, server stats,
  // or error_kind). Does not throw. A transport failure leaves the connection unusable.
  virtual boost::asio::awaitable<void> run(const nlohmann::json& body, RequestRecord& r) = 0;
  // Closes the socket at once so that a pending read ends; the request in flight fails with
  // `kind` ("timeout", "interrupted") and `message`.
  virtual void abort(const std::string& kind, const std::string& message) = 0;
  // A polite close (WebSocket close frame), bounded in time; errors are ignored.
  virtual boost::asio::awaitable<void> close() = 0;
  bool usable() const { return usable_; }
  // The last request failed on the transport before any answer came back (and not by abort()):
  // on a reused connection that is a connection the server had already closed, and the request
  // may be sent again on a new one.
  bool failed_unanswered() const { return failed_unanswered_; }

 protected:
  // Call at the start of run().
  void begin_request() {
    abort_kind_.clear();
    answered_ = failed_unanswered_ = false;
  }
  // Ends `r` after a failed read or write and marks the connection unusable: the abort reason
  // when abort() caused the failure, else "disconnected" with `message`.
  void end_with_transport_error(RequestRecord& r, double now_s, const std::string& message);

  bool usable_ = false;
  bool answered_ = false;           // something came back for the request in flight
  bool failed_unanswered_ = false;
  std::string abort_kind_, abort_message_;
};

// The two kinds, and what they share.
std::shared_ptr<Connection> make_ws_connection(const boost::asio::any_io_executor& ex, const Target& target,
                                               const RunClock& clock);
std::shared_ptr<Connection> make_sse_connection(const boost::asio::any_io_executor& ex, const Target& target,
                                                const RunClock& clock);
// Resolves and connects within 10 s; throws std::runtime_error("cannot connect to HOST:PORT: why").
boost::asio::awaitable<void> connect_tcp(boost::beast::tcp_stream& stream, const Target& target);

std::shared_ptr<Connection> make_connection(const boost::asio::any_io_executor& ex, const Target& target,
                                            const RunClock& clock);

}  // namespace specula::load
