// The WebSocket session: one "generate" at a time on a kept-open socket (docs/protocol.md).
#include <stdexcept>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>

#include "tools/specula-load/connection.h"
#include "tools/specula-load/protocol.h"

namespace specula::load {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

class WsConnection final : public Connection {
 public:
  WsConnection(const asio::any_io_executor& ex, const Target& target, const RunClock& clock)
      : ws_(ex), target_(target), clock_(clock) {}

  asio::awaitable<void> open() override {
    co_await connect_tcp(beast::get_lowest_layer(ws_), target_);
    websocket::stream_base::timeout t{};
    t.handshake_timeout = std::chrono::seconds(10);  // also bounds the closing handshake
    t.idle_timeout = websocket::stream_base::none();
    t.keep_alive_pings = false;
    ws_.set_option(t);
    ws_.read_message_max(64 << 20);
    websocket::response_type res;
    auto [ec] = co_await ws_.async_handshake(res, target_.host_header(), target_.path, kTuple);
    if (ec == websocket::error::upgrade_declined)
      throw std::runtime_error("WebSocket handshake to " + target_.url + " declined: HTTP " +
                               std::to_string(res.result_int()) + " " + std::string(res.reason()));
    if (ec) throw std::runtime_error("WebSocket handshake to " + target_.url + " failed: " + ec.message());
    ws_.text(true);
    usable_ = true;
  }

  asio::awaitable<void> run(const nlohmann::json& body, RequestRecord& r) override {
    begin_request();
    const std::string id = body.value("id", std::string());
    const std::string text = body.dump();
    r.start_s = clock_.now();
    auto [wec, wn] = co_await ws_.async_write(asio::buffer(text), kTuple);
    if (wec) {
      transport_failure(wec, r);
      co_return;
    }
    for (;;) {
      auto [ec, n] = co_await ws_.async_read(buffer_, kTuple);
      if (ec) {
        transport_failure(ec, r);
        co_return;
      }
      const double now = clock_.now();
      answered_ = true;
      const std::string message = beast::buffers_to_string(buffer_.data());
      buffer_.consume(buffer_.size());
      const Outcome o = apply_ws_message(message, id, now, r);
      if (o == Outcome::Done) co_return;
      if (o == Outcome::Failed) {
        // A protocol error leaves the socket in an unknown state; server errors do not.
        if (r.error_kind == "protocol") usable_ = false;
        co_return;
      }
    }
  }

  void abort(const std::string& kind, const std::string& message) override {
    abort_kind_ = kind;
    abort_message_ = message;
    usable_ = false;
    beast::get_lowest_layer(ws_).close();
  }

  asio::awaitable<void> close() override {
    if (!usable_) co_return;
    usable_ = false;
    co_await ws_.async_close(websocket::close_code::normal, kTuple);
  }

 private:
  void transport_failure(const beast::error_code& ec, RequestRecord& r) {
    const auto& why = ws_.reason();
    end_with_transport_error(r, clock_.now(),
                             ec == websocket::error::closed
                                 ? "server closed the WebSocket (code " + std::to_string(why.code) + " " +
                                       std::string(why.reason.c_str()) + ") before \"done\""
                                 : "WebSocket " + ec.message());
  }

  websocket::stream<beast::tcp_stream> ws_;
  beast::flat_buffer buffer_;
  Target target_;
  const RunClock& clock_;
};

}  // namespace

std::shared_ptr<Connection> make_ws_connection(const asio::any_io_executor& ex, const Target& target, const RunClock& clock) {
  return std::make_shared<WsConnection>(ex, target, clock);
}

}  // namespace specula::load
