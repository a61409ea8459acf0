// One accepted connection: HTTP/1.1 requests with keep-alive, routed to the chat page, health,
// metrics, models, the token routes and the OpenAI routes; a WebSocket upgrade on /v1/ws leaves for its session.
#include <cctype>
#include <chrono>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/websocket/rfc6455.hpp>

#include "net/auth.h"
#include "net/generation.h"
#include "net/http_util.h"
#include "net/openai_routes.h"
#include "net/sessions.h"

namespace specula::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using nlohmann::json;

namespace {

constexpr auto kAwait = asio::as_tuple(asio::use_awaitable);
constexpr std::chrono::seconds kIdleTimeout{120};  // a keep-alive connection with no request
constexpr std::chrono::seconds kWriteTimeout{30};  // a client that stops reading a response is dropped

// Every response is written under a deadline, so a client that stops reading does not hold the
// connection, and the response's bytes, past it. `cors`: the request's CORS headers (cors_answer);
// `head`: the request was a HEAD.
asio::awaitable<std::tuple<beast::error_code, std::size_t>> timed_write(beast::tcp_stream& stream, HttpResponse& res,
                                                                        const CorsAnswer& cors, bool head = false) {
  apply_cors(res, cors);
  if (head) res.body().clear();  // HEAD: the headers (Content-Length too) of what GET would answer, no body
  stream.expires_after(kWriteTimeout);
  auto result = co_await http::async_write(stream, res, kAwait);
  stream.expires_never();
  co_return result;
}

json models_json(const ServerState& st) {
  return {{"object", "list"},
          {"data", json::array({{{"id", st.model_name},
                                 {"object", "model"},
                                 {"created", st.created},
                                 {"owned_by", "specula"},
                                 {"max_model_len", st.engine.context_length()}}})}};
}

// Whether a GET's query asks for the kept response as a stream again (stream=true or 1, in any case).
bool streamed_again(std::string_view target) {
  const std::size_t q = target.find('?');
  if (q == std::string_view::npos) return false;
  std::string_view query = target.substr(q + 1);
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    std::string pair(query.substr(0, amp));
    for (char& ch : pair) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (pair == "stream=true" || pair == "stream=1") return true;
    if (amp == std::string_view::npos) break;
    query.remove_prefix(amp + 1);
  }
  return false;
}

// The routes without a generation. Returns nothing for a path it does not serve.
std::optional<HttpResponse> simple_route(ServerState& st, const HttpRequest& req, std::string_view path) {
  const bool ka = req.keep_alive();
  const unsigned v = req.version();
  const bool get = req.method() == http::verb::get || req.method() == http::verb::head;
  if (path == "/" || path == "/index.html") {
    if (!get) return error_response(ApiError("method_not_allowed", "use GET"), ka, v);
    HttpResponse res = make_response(200, std::string(chat_page_html()), "text/html; charset=utf-8", ka, v);
    res.set(http::field::cache_control, "no-cache");
    return res;
  }
  if (path == "/health") {
    if (st.draining) return json_response(503, {{"status", "shutting_down"}}, ka, v);
    return json_response(200, {{"status", "ok"}}, ka, v);
  }
  if (path == "/metrics") {
    if (!get) return error_response(ApiError("method_not_allowed", "use GET"), ka, v);
    return make_response(200, st.metrics.render({st.engine.kv_blocks_free(), st.engine.kv_blocks_total(), st.engine.prefix_queried_tokens(),
                                                st.engine.prefix_hit_tokens(), st.engine.preemptions(),
                                                st.engine.preempted_waiting()}),
                         "text/plain; version=0.0.4; charset=utf-8", ka, v);
  }
  if (path == "/v1/models") {
    if (!get) return error_response(ApiError("method_not_allowed", "use GET"), ka, v);
    return json_response(200, models_json(st), ka, v);
  }
  if (path == "/tokenize" || path == "/detokenize") {  // /tokenize's POST is serve_tokenize's
    if (req.method() != http::verb::post) return error_response(ApiError("method_not_allowed", "use POST"), ka, v);
    try {
      return json_response(200, detokenize_body(parse_json(req.body()), st.engine), ka, v);
    } catch (const ApiError& e) {
      return error_response(e, ka, v);
    } catch (const std::exception& e) {  // a value of a type the reader did not expect
      return error_response(ApiError("invalid_request", std::string("the request could not be read: ") + e.what()), ka, v);
    }
  }
  if (path.starts_with("/v1/responses/")) {  // a kept response read back, forgotten or cancelled (net/responses.h)
    const bool cancel = path.ends_with("/cancel");
    const std::string id(path.substr(14, path.size() - 14 - (cancel ? 7 : 0)));
    const ApiError missing("not_found", "Response with id '" + id + "' not found");
    const std::string owner = key_owner(st.config.access, req);  // (another key's response: not found)
    // A background response still running: its generation, to stop.
    auto stop_run = [&st, &id] {
      if (auto it = st.background_runs.find(id); it != st.background_runs.end())
        if (std::shared_ptr<Generation> g = it->second.lock()) g->cancel();
    };
    if (cancel) {  // POST /v1/responses/{id}/cancel: a background response stops where it is
      if (req.method() != http::verb::post) return error_response(ApiError("method_not_allowed", "use POST"), ka, v);
      ResponseStore::Stored* stored = st.responses.find_mutable(id, owner);
      if (!stored) return error_response(missing, ka, v);
      if (stored->response.value("background", false) != true)
        return error_response(ApiError("invalid_request", "only background responses can be cancelled: response '" + id +
                                                              "' was answered when it was made"),
                              ka, v);
      const std::string was = stored->response.value("status", "");
      if (was == "queued" || was == "in_progress") {  // (its run ends cancelled and keeps its items so far)
        stored->response["status"] = "cancelled";
        stop_run();
      }
      return json_response(200, stored->response, ka, v);
    }
    if (req.method() == http::verb::delete_) {
      if (!st.responses.erase(id, owner)) return error_response(missing, ka, v);
      stop_run();
      return json_response(200, {{"id", id}, {"object", "response"}, {"deleted", true}}, ka, v);
    }
    if (!get) return error_response(ApiError("method_not_allowed", "use GET or DELETE"), ka, v);
    if (streamed_again(std::string_view(req.target().data(), req.target().size())))
      return error_response(ApiError("invalid_request", "a kept response is read back whole here, not streamed again: ask without stream",
                                     "stream"),
                            ka, v);
    const ResponseStore::Stored* stored = st.responses.find(id, owner);
    if (!stored) return error_response(missing, ka, v);
    return json_response(200, stored->response, ka, v);
  }
  if (path.starts_with("/v1/models/")) {
    if (path.substr(11) != st.model_name)
      return error_response(ApiError("not_found", "the model '" + std::string(path.substr(11)) + "' does not exist", "model"), ka, v);
    return json_response(200, models_json(st)["data"][0], ka, v);
  }
  return std::nullopt;
}

// POST /tokenize: a long prompt is tokenized on the preparation thread, as a generation's is.
asio::awaitable<HttpResponse> serve_tokenize(ServerState& st, const HttpRequest& req) {
  const bool ka = req.keep_alive();
  const unsigned v = req.version();
  std::optional<ApiError> refused;
  try {
    const std::string_view text = req.body();  // (named: no temporaries in a co_await)
    const json body = co_await parse_json_text(st, text);
    const actors::EngineRequest r = parse_tokenize(body, st.engine, text);
    const std::vector<int32_t> ids = co_await tokenize_prompt(st, r);
    co_return json_response(200, tokenize_reply(ids, st.engine), ka, v);
  } catch (const ApiError& e) {
    refused = e;
  } catch (const actors::RequestError& e) {
    refused = ApiError(e.code, e.what(), e.field);
  } catch (const std::exception& e) {  // a value of a type the reader did not expect
    refused = ApiError("invalid_request", std::string("the request could not be read: ") + e.what());
  }
  co_return error_response(*refused, ka, v);
}

}  // namespace

void count_exchange(ServerState& st, std::string_view path, const HttpRequest& req, unsigned status,
                    std::chrono::steady_clock::time_point received) {
  if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - received;
  const beast::string_view method = req.method_string();
  st.metrics.count_http(http_route_label(path), http_method_label(std::string_view(method.data(), method.size())),
                        status == 0 ? 499 : status, took.count());
}

asio::awaitable<void> run_http_session(ServerState& st, asio::ip::tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  bool closed = false;
  std::optional<ConnectionRegistration> registration;
  registration.emplace(st, [&stream, &closed] {
    closed = true;
    beast::error_code ignored;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    stream.socket().close(ignored);
  });
  beast::flat_buffer buffer;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.body_limit(st.config.max_body_bytes);
    parser.header_limit(64 * 1024);
    stream.expires_after(kIdleTimeout);
    auto [ec, n] = co_await http::async_read(stream, buffer, parser, kAwait);
    stream.expires_never();
    const auto received = std::chrono::steady_clock::now();
    if (ec == http::error::body_limit) {  // the header was read: the route and the Origin are known
      const HttpRequest& head = parser.get();
      HttpResponse res = error_response(
          ApiError("message_too_large", "request bodies are limited to " + std::to_string(st.config.max_body_bytes) + " bytes"),
          false);
      const CorsAnswer cors = cors_answer(st.config.access, head);  // (named: no temporaries in a co_await)
      auto [wec, wn] = co_await timed_write(stream, res, cors);
      const std::string_view target(head.target().data(), head.target().size());
      count_exchange(st, target, head, wec ? 0 : res.result_int(), received);
      break;
    }
    if (ec) break;  // closed, timed out, or not HTTP
    HttpRequest req = parser.release();
    std::string_view path(req.target().data(), req.target().size());
    if (auto q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
    const bool head = req.method() == http::verb::head;
    bool keep_alive = req.keep_alive();
    unsigned status = 0;  // the response's once written, for the metrics (0: none reached the client)
    // Writes `res` and notes its status; a failed write ends the connection.
    // (Called as `co_await answer(res)` with `res` named: no temporaries in a co_await.)
    auto answer = [&](HttpResponse& res, const CorsAnswer& cors) -> asio::awaitable<void> {
      auto [wec, wn] = co_await timed_write(stream, res, cors, head);
      status = wec ? 0 : res.result_int();
      if (wec) keep_alive = false;
    };

    const bool upgrade = path == "/v1/ws" && beast::websocket::is_upgrade(req);
    const CorsAnswer cors = upgrade ? CorsAnswer() : cors_answer(st.config.access, req);
    if (req.method() == http::verb::options) {  // before the key: a browser's preflight carries none
      HttpResponse res = preflight_response(st.config.access, req);
      co_await answer(res, cors);
    } else if (std::optional<ApiError> refused =
                   upgrade || needs_key(path) ? check_access(st.config.access, req, upgrade) : std::nullopt) {
      HttpResponse res = error_response(*refused, keep_alive, req.version());
      co_await answer(res, cors);
    } else if (upgrade) {
      registration.reset();  // the WebSocket session registers itself, and counts the upgrade
      co_await run_websocket_session(st, std::move(stream), std::move(req), received);
      co_return;
    } else if (path == "/v1/ws") {
      HttpResponse res = error_response(ApiError("invalid_request", "/v1/ws takes a WebSocket upgrade"), keep_alive,
                                        req.version());
      co_await answer(res, cors);
    } else if (path == "/tokenize" && req.method() == http::verb::post) {
      HttpResponse res = co_await serve_tokenize(st, req);
      co_await answer(res, cors);
    } else if (std::optional<HttpResponse> res = simple_route(st, req, path)) {
      co_await answer(*res, cors);
    } else if (path == "/v1/responses") {
      if (req.method() != http::verb::post) {
        HttpResponse res = error_response(ApiError("method_not_allowed", "use POST"), keep_alive, req.version());
        co_await answer(res, cors);
      } else {
        keep_alive = co_await serve_openai_response(st, stream, req, status, cors);
      }
    } else if (path == "/v1/chat/completions" || path == "/v1/completions") {
      if (req.method() != http::verb::post) {
        HttpResponse res = error_response(ApiError("method_not_allowed", "use POST"), keep_alive, req.version());
        co_await answer(res, cors);
      } else {
        keep_alive = co_await serve_openai_completion(st, stream, req, path == "/v1/chat/completions", status, cors);
      }
    } else {
      HttpResponse res = error_response(ApiError("not_found", "no route for " + std::string(path)), keep_alive, req.version());
      co_await answer(res, cors);
    }
    count_exchange(st, path, req, status, received);
    if (!keep_alive || closed || st.draining) break;
  }
  if (!closed) {
    beast::error_code ignored;
    stream.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ignored);
  }
}

}  // namespace specula::net
