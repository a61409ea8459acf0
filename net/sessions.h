// The connection coroutines of `specula serve`: one per accepted socket (HTTP/1.1 with
// keep-alive), which hands a WebSocket upgrade on /v1/ws to the WebSocket session.
#pragma once
#include <chrono>
#include <string_view>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "net/server_state.h"

namespace specula::net {

boost::asio::awaitable<void> run_http_session(ServerState& st, boost::asio::ip::tcp::socket socket);

// Counts an HTTP request in the metrics (specula_http_requests_total and its duration since
// `received`, the request's last byte read). `path` may carry a query; status 0: no answer reached
// the client (it left, or the server closed the connection first), counted as 499, nginx's code.
void count_exchange(ServerState& st, std::string_view path,
                    const boost::beast::http::request<boost::beast::http::string_body>& req, unsigned status,
                    std::chrono::steady_clock::time_point received);

// The WebSocket protocol of docs/protocol.md on an upgraded connection; returns when it closes.
// The upgrade request, read at `received`, is counted in the metrics once its handshake ends.
boost::asio::awaitable<void> run_websocket_session(ServerState& st, boost::beast::tcp_stream stream,
                                                   boost::beast::http::request<boost::beast::http::string_body> req,
                                                   std::chrono::steady_clock::time_point received);

// The bytes of net/web/index.html (generated into the build at configure time).
std::string_view chat_page_html();

}  // namespace specula::net
