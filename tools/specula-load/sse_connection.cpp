// The HTTP session: OpenAI-style POST with "stream": true, read as server-sent events on a
// keep-alive connection, one request at a time.
#include <stdexcept>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "tools/specula-load/connection.h"
#include "tools/specula-load/protocol.h"

namespace specula::load {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);

class SseConnection final : public Connection {
 public:
  SseConnection(const asio::any_io_executor& ex, const Target& target, const RunClock& clock)
      : stream_(ex), target_(target), clock_(clock) {}

  asio::awaitable<void> open() override {
    co_await connect_tcp(stream_, target_);
    usable_ = true;
  }

  asio::awaitable<void> run(const nlohmann::json& body, RequestRecord& r) override {
    begin_request();
    http::request<http::string_body> req{http::verb::post, target_.path, 11};
    req.set(http::field::host, target_.host_header());
    req.set(http::field::user_agent, "specula-load");
    req.set(http::field::content_type, "application/json");
    req.set(http::field::accept, "text/event-stream");
    req.keep_alive(true);
    req.body() = body.dump();
    req.prepare_payload();

    r.start_s = clock_.now();
    auto [wec, wn] = co_await http::async_write(stream_, req, kTuple);
    if (wec) co_return transport_failure(wec, r, "sending the request");

    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);
    auto [hec, hn] = co_await http::async_read_header(stream_, buffer_, parser, kTuple);
    if (hec) co_return transport_failure(hec, r, "reading the response header");
    answered_ = true;
    const int status = parser.get().result_int();

    SseParser sse;
    std::string error_body;
    Outcome outcome = Outcome::Pending;
    char chunk[16384];
    while (!parser.is_done()) {
      parser.get().body().data = chunk;
      parser.get().body().size = sizeof chunk;
      auto [ec, n] = co_await http::async_read_some(stream_, buffer_, parser, kTuple);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) co_return transport_failure(ec, r, "reading the stream");
      const size_t got = sizeof chunk - parser.get().body().size;
      const double now = clock_.now();
      if (status != 200) {
        if (error_body.size() < 4096) error_body.append(chunk, got);
        continue;
      }
      if (outcome != Outcome::Pending) continue;  // drain what follows [DONE] so the connection stays usable
      for (const std::string& data : sse.feed(chunk, got)) {
        outcome = apply_sse_data(data, now, r);
        if (outcome != Outcome::Pending) break;
      }
    }
    usable_ = parser.keep_alive();
    if (status != 200) {
      r.end_s = clock_.now();
      apply_http_error(status, error_body, r);
    } else if (outcome == Outcome::Pending) {
      r.end_s = clock_.now();
      r.error_kind = "protocol";
      r.error_message = "the event stream ended without data: [DONE] (or, from the Responses API, response.completed)";
    } else if (outcome == Outcome::Failed && r.error_kind == "protocol") {
      usable_ = false;
    }
  }

  void abort(const std::string& kind, const std::string& message) override {
    abort_kind_ = kind;
    abort_message_ = message;
    usable_ = false;
    stream_.close();
  }

  asio::awaitable<void> close() override {
    usable_ = false;
    beast::error_code ec;
    stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ec);
    stream_.close();
    co_return;
  }

 private:
  void transport_failure(const beast::error_code& ec, RequestRecord& r, const char* doing) {
    end_with_transport_error(r, clock_.now(), std::string("HTTP connection failed while ") + doing + ": " + ec.message());
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  Target target_;
  const RunClock& clock_;
};

}  // namespace

std::shared_ptr<Connection> make_sse_connection(const asio::any_io_executor& ex, const Target& target, const RunClock& clock) {
  return std::make_shared<SseConnection>(ex, target, clock);
}

}  // namespace specula::load
