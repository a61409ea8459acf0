// The OpenAI-compatible generation routes (docs/protocol.md, "OpenAI-compatible HTTP").
#pragma once
#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include "net/http_util.h"
#include "net/server_state.h"

namespace specula::net {

// POST /v1/chat/completions (chat) or /v1/completions: answers `req` on `stream`; returns
// whether the connection may read another request, and sets `status` to the response's status
// (left 0 when the client went away before one was written). `cors`: the CORS headers its
// response carries (net/auth.h, cors_answer), alive until this returns.
boost::asio::awaitable<bool> serve_openai_completion(ServerState& st, boost::beast::tcp_stream& stream,
                                                     const HttpRequest& req, bool chat, unsigned& status,
                                                     const CorsAnswer& cors);

// POST /v1/responses: OpenAI's Responses API over the chat route (net/responses.h); the same
// contract as serve_openai_completion's.
boost::asio::awaitable<bool> serve_openai_response(ServerState& st, boost::beast::tcp_stream& stream, const HttpRequest& req,
                                                   unsigned& status, const CorsAnswer& cors);

}  // namespace specula::net
