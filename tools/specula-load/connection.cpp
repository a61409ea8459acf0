#include "tools/specula-load/connection.h"

#include <stdexcept>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace specula::load {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

asio::awaitable<void> connect_tcp(beast::tcp_stream& stream, const Target& target) {
  const std::string& where = target.url;
  tcp::resolver resolver(stream.get_executor());
  auto [rec, endpoints] = co_await resolver.async_resolve(target.host, target.port, asio::as_tuple(asio::use_awaitable));
  if (rec) throw std::runtime_error("cannot resolve " + target.host + ": " + rec.message());
  stream.expires_after(std::chrono::seconds(10));
  auto [cec, ep] = co_await stream.async_connect(endpoints, asio::as_tuple(asio::use_awaitable));
  stream.expires_never();
  if (cec == beast::error::timeout) throw std::runtime_error("cannot connect to " + where + ": timed out after 10 s");
  if (cec) throw std::runtime_error("cannot connect to " + where + ": " + cec.message() + " (is the server running?)");
  stream.socket().set_option(tcp::no_delay(true));
}

void Connection::end_with_transport_error(RequestRecord& r, double now_s, const std::string& message) {
  usable_ = false;
  failed_unanswered_ = !answered_ && abort_kind_.empty();
  r.end_s = now_s;
  r.error_kind = abort_kind_.empty() ? "disconnected" : abort_kind_;
  r.error_message = abort_kind_.empty() ? message : abort_message_;
}

std::shared_ptr<Connection> make_connection(const asio::any_io_executor& ex, const Target& target, const RunClock& clock) {
  return target.protocol == Protocol::WebSocket ? make_ws_connection(ex, target, clock)
                                                : make_sse_connection(ex, target, clock);
}

}  // namespace specula::load
