// A request's token stream (TokenStream, the caller's end) and what it carries (sampler ->
// caller): one event per committed token, then one terminal event (done, with statistics and the
// finish reason, or an error).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <boost/asio/awaitable.hpp>

#include "actors/mailbox.h"
#include "actors/request_id.h"
#include "spec/sampling.h"
#include "spec/speculative_generate.h"

namespace specula::actors {

struct StreamEvent {
  enum class Kind { Token, Done, Error };
  Kind kind = Kind::Token;
  std::string text;            // Token: the text this token completes (may be empty mid-UTF-8);
                               // Done: whatever the detokenizer still held back
  int32_t token = -1;          // Token: the token id
  bool from_draft = false;     // Token: an accepted draft token (not the target's recovered / bonus one)
  std::optional<TokenLogprobs> logprobs;  // Token, when the request asked (EngineRequest::logprobs)
  // The request's first event, when it asked (EngineRequest::prompt_logprobs): one a prompt token
  // but the first (empty for a prompt of one token).
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  FinishReason finish_reason = FinishReason::None;  // Done: why the request ended
  // Done with FinishReason::Stop (vLLM's stop_reason): the stop string that ended the text, or the
  // token of the request's own stop_token_ids; neither (-1, empty) for the model's end tokens or a
  // grammar's end.
  int32_t stop_token = -1;
  std::string stop_string;
  std::string error;           // Error: what failed, in one line
  bool request_fault = false;  // Error: the request asked for more than can be kept (an HTTP 400, not a 500)
  SpeculativeStats stats;      // Done and Error: the request's statistics so far

  bool terminal() const { return kind != Kind::Token; }
};

// Many writers (the sampler, the scheduler for admission errors), one reader (the TokenStream).
using EventChannel = Mailbox<StreamEvent>;

class Engine;
struct StreamRegistry;

// One request's events, in order. Move-only. Dropping it before the terminal event cancels the
// request. A stream may outlive its Engine: once the engine is destroyed, the events it had sent
// are still read, then an Error ("the engine shut down before the request finished").
class TokenStream {
 public:
  TokenStream(TokenStream&& other) noexcept;
  TokenStream& operator=(TokenStream&& other) noexcept;
  ~TokenStream();

  // The one reader. The next event; after the terminal one, that event again.
  boost::asio::awaitable<StreamEvent> next();
  // The same for a plain thread (blocks).
  StreamEvent next_blocking();
  // The next event if one is ready, without waiting (the server coalesces a round's tokens).
  std::optional<StreamEvent> try_next();
  // Any thread: stop the request; a Done event with FinishReason::Cancelled follows (unless
  // it finished first). Its KV is freed at the next round boundary.
  void cancel();
  RequestId id() const { return id_; }
  bool ended() const { return last_.has_value(); }

 private:
  friend class Engine;
  TokenStream(Engine* engine, std::shared_ptr<StreamRegistry> registry, RequestId id,
              std::shared_ptr<EventChannel> events);
  StreamEvent take(std::optional<StreamEvent> ev);
  void release();  // cancel unless ended, and leave the engine's registry

  Engine* engine_ = nullptr;
  std::shared_ptr<StreamRegistry> registry_;
  RequestId id_ = 0;
  std::shared_ptr<EventChannel> events_;
  std::optional<StreamEvent> last_;  // the terminal event, once seen
};

}  // namespace specula::actors
