// One request through the engine as the server sees it: admission against --max-batch +
// --max-queue, the token stream read in batches (tokens that are ready together come as one
// update), the per-request statistics of docs/protocol.md and the metrics. Owner only (the I/O
// thread).
#pragma once
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <nlohmann/json.hpp>

#include "net/server_state.h"
#include "spec/sampling.h"

namespace specula::net {

struct TokenOut {
  int32_t id = -1;
  std::string text;
  bool draft = false;  // an accepted draft token
  std::optional<TokenLogprobs> logprobs;  // when the request asked
};

// Finish reasons on the wire: the WebSocket protocol spells them as spec/round.h names them; the
// OpenAI API has no "context" (a request cut by the context window ended by "length").
std::string_view openai_finish_reason(FinishReason r);

// What one read of the stream gives: the tokens ready now, or the end.
struct GenerationUpdate {
  std::string text;               // the tokens' text (at the end: whatever was held back)
  std::vector<TokenOut> tokens;
  bool terminal = false;
  FinishReason finish_reason = FinishReason::None;  // terminal and not an error
  // vLLM's stop_reason at the end: the stop string or token id that ended the text (StreamEvent's), else null.
  nlohmann::json stop_reason = nullptr;
  std::string error;              // terminal with an engine error
  bool request_fault = false;     // the error is the request's (its grammar's limits): a 400, not a 500
  // The first update, when the request asked (EngineRequest::prompt_logprobs): prompt tokens 1, 2, ...
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  // The choice's tokens generated up to and including this update's (a stream's usage so far:
  // the generation's own count runs ahead while updates wait to be sent).
  int64_t completion_tokens = 0;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of them, held by the prefix cache (known at the end)
  int64_t completion_tokens = 0;
  int64_t rounds = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  // The confidence rule's mean threshold over the rounds that drafted under it (with
  // `--draft-confidence auto`, what the request's measurements set); 0 when the rule was off.
  double mean_confidence_threshold = 0;
  int64_t preemptions = 0;        // times the engine preempted it for a request of a lower priority value
  double ttft_ms = 0;
  double elapsed_ms = 0;
  nlohmann::json to_json() const;  // the `stats` object of a WebSocket `done`
  // The choices of one request as one: each prompt counted once (choices 0, per_prompt, 2 *
  // per_prompt, ... are the prompts' first; 0: one prompt for all), tokens, rounds, drafts and
  // acceptances summed, the earliest first token and the latest end.
  static GenerationStats combine(const std::vector<GenerationStats>& choices, std::size_t per_prompt = 0);
};

// Prompt text (the prompt, or the messages' contents) up to this size is templated and tokenized
// on the I/O thread: well under a millisecond. Longer text goes to the preparation thread, since a
// megabyte takes the tokenizer about half a second (docs/serving.md, "Long prompts").
inline constexpr std::size_t kInlinePromptBytes = 16 * 1024;

// A request's JSON text (an HTTP body, a WebSocket message) of up to this size is parsed on the
// I/O thread: nlohmann's parse takes ~70 ms a megabyte, so well under a millisecond here. Longer
// text goes to the preparation thread, so that the I/O thread keeps other requests' tokens flowing.
inline constexpr std::size_t kInlineJsonBytes = 16 * 1024;

// parse_json(text) (net/api_request.h), on the preparation thread when `text` is longer than
// kInlineJsonBytes (it is copied first; the caller's text need not outlive the call's start);
// throws ApiError as parse_json does.
boost::asio::awaitable<nlohmann::json> parse_json_text(ServerState& st, std::string_view text);

// Engine::tokenize(request), on the preparation thread when the text is longer than
// kInlinePromptBytes; throws as it does (actors::RequestError).
boost::asio::awaitable<std::vector<int32_t>> tokenize_prompt(ServerState& st, const actors::EngineRequest& request);

// The request's messages less their oldest whole turns, so that the templated prompt is at most
// `budget` tokens: the leading system and developer messages stay, and the conversation after them
// starts at the latest user message with which it fits (the earliest of them that fits: as few
// turns dropped as can be; found by bisection, a few tokenizations); where not even the last user
// message's turn fits, from that message on. Returns the prompt's ids for the messages kept.
boost::asio::awaitable<std::vector<int32_t>> fit_oldest_turns(ServerState& st, actors::EngineRequest& request, std::size_t budget);

class Generation {
 public:
  using Clock = std::chrono::steady_clock;
  // The one admission sequence of the WebSocket and OpenAI routes: parses `body` (a JSON object)
  // as `kind`, checks draining and the admission limit, and starts the request in the engine,
  // which templates, tokenizes and checks it. Throws ApiError (invalid_request or
  // context_length_exceeded naming the field, overloaded, shutting_down), counted as "rejected".
  // OpenAI's `n` starts n engine requests, choice i with the request's seed + i (as vLLM seeds
  // its child requests), all or none against the admission limit.
  struct Admitted {
    // [prompts x n], prompt p's choices at p * n ..; the WebSocket's one is choices[0]
    std::vector<std::shared_ptr<Generation>> choices;
    bool stream = false;         // OpenAI: stream
    bool include_usage = false;  // OpenAI: stream_options.include_usage
    bool logprobs = false;       // OpenAI: logprobs asked for (the tokens carry them)
    std::size_t choices_per_prompt = 1;  // n
    // /v1/completions' echo: each prompt as the client sent it (its text, or its ids decoded);
    // empty without echo.
    std::vector<std::string> echo{};
    // ParsedRequest::prompt_logprobs. The engine lists max(logprobs, prompt_logprobs) alternatives
    // a prompt token; echo shows `logprobs_top`.
    int prompt_logprobs = -1;
    int logprobs_top = 0;
    // Each prompt's ids, with echo or prompt_logprobs (the tokens their entries are of); else empty.
    std::vector<std::vector<int32_t>> prompt_ids{};
    bool prompt_only = false;  // ParsedRequest::prompt_only
    ToolCalls::Mode tool_mode = ToolCalls::Mode::None;  // ParsedRequest::tools
    std::string tool_name{};
    ToolSyntax tool_syntax = ToolSyntax::Generic;  // "auto" in the model's own format: the reply parsed
    std::vector<std::string> tool_names{};
    bool tool_parallel = true;
    bool continuous_usage = false;  // vLLM: stream_options.continuous_usage_stats: usage so far in every chunk
    bool tool_held = false;  // calls held to the tools' schemas (ToolCalls::held): streamed as written
    std::string tool_arguments_key;  // their arguments' key (ToolCalls::arguments_key)
    bool tool_nine_character_ids = false;
    // A chat reply's reasoning read apart (ServerConfig::reasoning, for a reply no constraint
    // holds or whose grammar starts after the reasoning: ParsedRequest::reasoning_constrained);
    // `reasoning_open`: the prompt opened it; `include_reasoning` false: it is left out.
    bool reasoning = false;
    bool reasoning_open = false;
    bool include_reasoning = true;
  };
  // A request with a grammar or a JSON schema is parsed (its constraint compiled) on the
  // preparation thread, and a prompt of more than kInlinePromptBytes is templated and tokenized
  // there (tokenize_prompt), while the I/O thread serves the other connections; the n choices hold
  // their places against the admission limit while the prompt is tokenized, and share its ids.
  // `fit_turns` (the Responses API's truncation "auto"): a chat prompt of more tokens than this
  // loses its oldest turns (fit_oldest_turns) before truncate_prompt_tokens cuts what is left.
  static boost::asio::awaitable<Admitted> admit(ServerState& st, nlohmann::json body, PromptKind kind,
                                                Clock::time_point received,
                                                std::string_view raw = {},  // raw: body's text (parse_generation)
                                                int64_t fit_turns = 0);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // The next update; after the terminal one, do not call again.
  boost::asio::awaitable<GenerationUpdate> next();
  // Ends the request early ("cancelled" follows unless it finished first).
  void cancel();
  bool ended() const { return ended_; }
  const GenerationStats& stats() const { return stats_; }
  uint64_t seed() const { return seed_; }

 private:
  Generation(ServerState& st, actors::TokenStream stream, uint64_t seed, const actors::Admission& admission,
             Clock::time_point received);
  void on_tokens(const GenerationUpdate& u);
  void on_end(const actors::StreamEvent& ev, GenerationUpdate& u);

  ServerState& st_;
  actors::TokenStream stream_;
  uint64_t key_;
  uint64_t seed_;
  bool clamped_;
  bool ended_ = false;
  bool started_ = false;  // first token seen (waiting -> running)
  int draft_run_ = 0;     // draft tokens since the last target token (this round's accepted length)
  Clock::time_point received_;
  Clock::time_point last_token_;
  GenerationStats stats_;
};

}  // namespace specula::net
