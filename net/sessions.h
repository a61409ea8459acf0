// The connection coroutines of `specula serve`: one per accepted socket (HTTP/1.1 with
// keep-alive), which hands a WebSocket upgrade on /v1/ws to the WebSocket session.
#pragma once
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "net/server_state.h"

namespace specula::net {

boost::asio::awaitable<void> run_http_session(ServerState& st, boost::asio::ip::tcp::socket socket);

// The WebSocket protocol of docs/protocol.md on an upgraded connection; returns when it closes.
boost::asio::awaitable<void> run_websocket_session(ServerState& st, boost::beast::tcp_stream stream,
                                                   boost::beast::http::request<boost::beast::http::string_body> req);

// The bytes of net/web/index.html (generated into the build at configure time).
std::string_view chat_page_html();

}  // namespace specula::net
