// The WebSocket protocol (docs/protocol.md): a reader that parses and dispatches messages, a
// writer that drains a bounded outbox, and one coroutine per generation, which admits it and
// streams it. All three run on the server's I/O thread, so the session's state needs no lock.
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/websocket.hpp>

#include "model/reasoning.h"
#include "net/generation.h"
#include "net/sessions.h"

namespace specula::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using nlohmann::json;

namespace {

constexpr auto kAwait = asio::as_tuple(asio::use_awaitable);
constexpr std::size_t kHardMessageMax = 64u << 20;  // beyond this Beast closes the socket (1009)
constexpr std::size_t kMaxIdBytes = 256;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

class WsSession : public std::enable_shared_from_this<WsSession> {
 public:
  WsSession(ServerState& st, beast::tcp_stream stream) : st_(st), ws_(std::move(stream)), wake_(ws_.get_executor()) {}

  asio::awaitable<void> run(beast::http::request<beast::http::string_body> req, std::chrono::steady_clock::time_point received) {
    auto self = shared_from_this();
    ws_.set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
    ws_.set_option(websocket::stream_base::decorator([protocol = websocket_subprotocol(req)](websocket::response_type& res) {
      res.set(beast::http::field::server, "specula");
      if (!protocol.empty()) res.set(beast::http::field::sec_websocket_protocol, protocol);
    }));
    ws_.read_message_max(kHardMessageMax);
    auto [ec] = co_await ws_.async_accept(req, kAwait);
    // Counted once the handshake ends: 101; a request Beast refused (no key, another version) as
    // its 400 / 426; a client gone first as no answer.
    const unsigned status = !ec                                             ? 101
                            : ec == websocket::error::bad_sec_version       ? 426
                            : ec == websocket::condition::handshake_failed ? 400
                                                                            : 0;
    count_exchange(st_, "/v1/ws", req, status, received);
    if (ec) co_return;
    ++st_.metrics.websocket_connections;
    std::weak_ptr<WsSession> weak = self;
    ConnectionRegistration registration(st_, [weak] {
      if (auto s = weak.lock()) s->close_going_away();
    });
    asio::co_spawn(ws_.get_executor(), writer(self), asio::detached);
    co_await read_loop();
    --st_.metrics.websocket_connections;
    end();
  }

 private:
  asio::awaitable<void> read_loop() {
    beast::flat_buffer buf;
    for (;;) {
      buf.clear();
      bool too_big = false;
      do {
        auto [ec, n] = co_await ws_.async_read_some(buf, 64 * 1024, kAwait);
        if (ec) co_return;  // closed by the client (websocket::error::closed), lost, or shut down
        if (buf.size() > st_.config.max_message_bytes) {
          too_big = true;  // read the rest of the message and drop it
          buf.clear();
        }
      } while (!ws_.is_message_done());
      if (!open_) co_return;
      if (too_big) {
        send_error(nullptr, "message_too_large",
                   "messages are limited to " + std::to_string(st_.config.max_message_bytes) + " bytes");
        continue;
      }
      if (!ws_.got_text()) {
        send_error(nullptr, "invalid_json", "binary messages are not accepted; send JSON text");
        continue;
      }
      const auto received = Generation::Clock::now();
      const auto data = buf.cdata();
      const std::string_view text(static_cast<const char*>(data.data()), data.size());
      // A long message is parsed on the preparation thread; this socket's next message waits for it.
      json msg;
      std::optional<ApiError> unreadable;
      try {
        json parsed = co_await parse_json_text(st_, text);
        msg = std::move(parsed);
      } catch (const ApiError& e) {
        unreadable = e;
      } catch (const std::exception& e) {  // out of memory for the copy or the value: this message fails, not the socket
        unreadable = ApiError("internal", std::string("the message could not be read: ") + e.what());
      }
      if (!open_) co_return;
      if (unreadable) {
        send_error(nullptr, unreadable->code, unreadable->what());
        continue;
      }
      handle(text, std::move(msg), received);
    }
  }

  // A message, parsed from `text`.
  void handle(std::string_view text, json msg, Generation::Clock::time_point received) {
    if (!msg.is_object()) return send_error(nullptr, "invalid_json", "the message must be a JSON object");
#ifdef SPECULA_PLANTED_CRASH
    // Only in the specula-planted-crash build, the message fuzzer's control (tests/integration/
    // test_fuzz.py): a crash that its mutations reach, to prove the fuzzer reports one.
    if (auto it = msg.find("max_tokens"); it != msg.end() && it->is_number_float()) std::abort();
#endif
    json id = nullptr;
    if (auto it = msg.find("id"); it != msg.end() && !it->is_null()) {
      if (!(it->is_string() || it->is_number_integer()))
        return send_error(nullptr, "invalid_request", "id must be a string or an integer", "id");
      if (it->is_string() && it->get_ref<const std::string&>().size() > kMaxIdBytes)
        return send_error(nullptr, "invalid_request", "id is longer than " + std::to_string(kMaxIdBytes) + " bytes", "id");
      id = *it;
    }
    auto type = msg.find("type");
    if (type == msg.end() || !type->is_string())
      return send_error(id, "unknown_type", "type must be \"generate\" or \"cancel\"", "type");
    const std::string& t = type->get_ref<const std::string&>();
    if (t == "cancel") {
      if (id.is_null()) return send_error(nullptr, "invalid_request", "cancel needs the id of a generation", "id");
      if (auto g = running_.find(dump(id)); g != running_.end()) {
        if (g->second)
          g->second->cancel();
        else
          cancelled_early_.insert(g->first);  // still being admitted
      }
      return;  // an id that is not running: ignored (it races with done)
    }
    if (t != "generate")
      return send_error(id, "unknown_type",
                        "unknown message type \"" + (t.size() > 40 ? t.substr(0, 37) + "..." : t) + "\"; expected generate or cancel", "type");
    if (id.is_null()) return send_error(nullptr, "invalid_request", "generate needs an id (a string or an integer)", "id");
    const std::string key = dump(id);
    if (running_.count(key)) return send_error(id, "duplicate_id", "a generation with id " + key + " is still running", "id");
    // The id is taken while the request is admitted (a long prompt is tokenized off the I/O thread,
    // and the next messages are read meanwhile): a cancel then is kept for when it starts.
    running_.emplace(key, nullptr);
    asio::co_spawn(ws_.get_executor(), run_generation(shared_from_this(), std::move(id), key, std::move(msg),
                                                      std::string(text), received),
                   asio::detached);
  }

  asio::awaitable<void> run_generation(std::shared_ptr<WsSession> self, json id, std::string key, json msg,
                                       std::string text, Generation::Clock::time_point received) {
    std::shared_ptr<Generation> g;
    std::optional<ApiError> refused;
    // The reasoning parser reads the reply (a reasoning model's, to messages): its reasoning and
    // its answer go apart in each token event, beside the raw text.
    bool reasoning = false, reasoning_open = false, include_reasoning = true;
    try {
      Generation::Admitted admitted = co_await Generation::admit(st_, std::move(msg), PromptKind::WebSocket, received, text);
      g = admitted.choices.front();
      reasoning = admitted.reasoning;
      reasoning_open = admitted.reasoning_open;
      include_reasoning = admitted.include_reasoning;
    } catch (const ApiError& e) {
      refused = e;
    } catch (const std::exception& e) {  // a value of a type the reader did not expect: the request's fault
      refused = ApiError("invalid_request", std::string("the request could not be read: ") + e.what());
    }
    const bool cancelled = cancelled_early_.erase(key) > 0;
    if (refused) {
      running_.erase(key);
      co_return send_error(id, refused->code, refused->what(), refused->param);
    }
    running_[key] = g;
    if (cancelled || !open_) g->cancel();
    std::string reply;                               // with `reasoning`: the raw text so far
    std::size_t sent_content = 0, sent_reasoning = 0;  // how much of each part has gone out
    for (;;) {
      GenerationUpdate u = co_await g->next();
      std::string content_delta, reasoning_delta;
      if (reasoning) {  // (at the end, what the split held back as a possible tag goes out too)
        reply += u.text;
        const ReasoningSplit split = split_reasoning(reply, reasoning_open, u.terminal);
        if (split.content.size() > sent_content) content_delta = std::string(split.content.substr(sent_content));
        sent_content = std::max(sent_content, split.content.size());
        if (split.reasoning && split.reasoning->size() > sent_reasoning)
          reasoning_delta = std::string(split.reasoning->substr(sent_reasoning));
        if (split.reasoning) sent_reasoning = std::max(sent_reasoning, split.reasoning->size());
        if (!include_reasoning) reasoning_delta.clear();
      }
      if (!u.tokens.empty() || !u.text.empty() || !content_delta.empty() || !reasoning_delta.empty()) {
        json tokens = json::array();
        for (const TokenOut& t : u.tokens) tokens.push_back({{"id", t.id}, {"text", t.text}, {"draft", t.draft}});
        json event{{"type", "token"}, {"id", id}, {"text", u.text}, {"count", u.tokens.size()}, {"tokens", std::move(tokens)}};
        if (reasoning) {
          event["content"] = std::move(content_delta);
          if (include_reasoning) event["reasoning"] = std::move(reasoning_delta);
        }
        send(event);
      }
      if (!u.terminal) continue;
      if (!u.error.empty()) {
        send_error(id, u.request_fault ? "invalid_request" : "internal", u.error);
      } else {
        send(json{{"type", "done"},
                  {"id", id},
                  {"finish_reason", finish_reason_name(u.finish_reason)},
                  {"stop_reason", u.stop_reason},
                  {"seed", g->seed()},
                  {"stats", g->stats().to_json()}});
      }
      break;
    }
    running_.erase(key);
  }

  asio::awaitable<void> writer(std::shared_ptr<WsSession> self) {
    ws_.text(true);
    for (;;) {
      if (outbox_.empty()) {
        if (!open_) break;
        if (closing_) {
          co_await ws_.async_close(websocket::close_code::going_away, kAwait);
          break;
        }
        wake_.expires_at(asio::steady_timer::time_point::max());
        co_await wake_.async_wait(kAwait);
        continue;
      }
      std::string msg = std::move(outbox_.front());
      outbox_.pop_front();
      auto [ec, n] = co_await ws_.async_write(asio::buffer(msg), kAwait);
      if (ec) {
        end();
        break;
      }
    }
  }

  void send(const json& msg) {
    if (!open_) return;
    if (outbox_.size() >= st_.config.send_queue_limit) {
      // The client stopped reading: free its generations and drop it.
      end();
      beast::error_code ignored;
      beast::get_lowest_layer(ws_).socket().close(ignored);
      return;
    }
    outbox_.push_back(dump(msg));
    wake_.cancel();
  }

  void send_error(const json& id, const std::string& code, const std::string& message, const std::string& param = {}) {
    json e{{"type", "error"}, {"id", id}, {"code", code}, {"message", message}};
    if (!param.empty()) e["param"] = param;
    send(e);
  }

  // The socket is done: cancel the generations (their KV returns) and stop the writer.
  void end() {
    if (!open_) return;
    open_ = false;
    outbox_.clear();
    for (auto& [key, g] : running_)
      if (g) g->cancel();  // those still being admitted see open_ and cancel once they start
    wake_.cancel();
  }

  // Shutdown: once the outbox is written, close with 1001.
  void close_going_away() {
    closing_ = true;
    wake_.cancel();
  }

  ServerState& st_;
  websocket::stream<beast::tcp_stream> ws_;
  asio::steady_timer wake_;            // the writer waits on it while the outbox is empty
  std::deque<std::string> outbox_;
  bool open_ = true;
  bool closing_ = false;
  // By the id's JSON text; null while the request is being admitted.
  std::map<std::string, std::shared_ptr<Generation>> running_;
  std::set<std::string> cancelled_early_;  // cancels that came while their request was being admitted
};

}  // namespace

asio::awaitable<void> run_websocket_session(ServerState& st, beast::tcp_stream stream,
                                            beast::http::request<beast::http::string_body> req,
                                            std::chrono::steady_clock::time_point received) {
  auto session = std::make_shared<WsSession>(st, std::move(stream));
  co_await session->run(std::move(req), received);
}

}  // namespace specula::net
