// What the WebSocket and the OpenAI routes share about a generation request: the error type every
// refusal travels as, and the parsing of prompt, sampling and speculation fields into an
// EngineRequest, with the checks that name the offending field (docs/protocol.md).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/engine.h"

namespace specula::net {

// A refusal the client caused (or the server's state: overloaded, shutting down). `code` is the
// protocol's error code; `param` the offending field, when there is one.
struct ApiError : std::runtime_error {
  std::string code;
  std::string param;
  ApiError(std::string code_, const std::string& message, std::string param_ = {})
      : std::runtime_error(message), code(std::move(code_)), param(std::move(param_)) {}
  // The HTTP status of the code (400, 413, 429, 500, 503, ...).
  int http_status() const;
};

// Server-wide defaults and limits for requests that leave a field out.
struct RequestDefaults {
  int max_tokens = 512;
  float temperature = 0.8f;  // llama.cpp's defaults, as `specula generate`
  int top_k = 40;
  float top_p = 0.95f;
  DraftLengthConfig draft;   // the server's --spec-k / --adaptive
  // --scheduling-policy priority: requests may set `priority` (EngineRequest::priority); with
  // fcfs (the default) a priority other than 0 is refused, as vLLM refuses it.
  bool priority_scheduling = false;
  // Chat replies' reasoning is read apart (ServerConfig::reasoning) and its markers are text in
  // the vocabulary: a constrained reply may reason first, its grammar starting after </think>.
  bool reasoning_grammar = false;
  // "auto"'s calls in a model's own syntax (Hermes', Llama 3's) are held to the tools' schemas, as
  // llama.cpp holds them (serve --tool-call-grammar; off: read as written, as vLLM reads them).
  // Serve start sets it off too where <tool_call>, </tool_call>, <think> or </think> is a special
  // token of the vocabulary (no grammar writes one).
  bool tool_call_grammar = true;
};

// /v1/chat/completions' tool calls (OpenAI's tools and tool_choice): a named function's arguments,
// "required"'s list of calls, or "auto"'s calls-or-response object, are generated under `schema`
// (guided decoding) and returned as message.tool_calls (or "auto"'s response as content). None:
// no tools, or tool_choice "none".
struct ToolCalls {
  enum class Mode { None, Named, Required, Auto };
  Mode mode = Mode::None;
  std::string name;                // Named: the function
  nlohmann::ordered_json schema;   // what the output is held to
  std::string system;              // Auto: the tools described, added to the conversation's system message
  std::vector<std::string> names;  // the tools' names (not for None)
  bool parallel = true;            // parallel_tool_calls: false keeps "auto"'s first call in the model's own format
  // Call ids of 9 letters and digits: the template writes calls as Mistral's do, and refuses others.
  bool nine_character_ids = false;
  // Auto in the model's own format (its chat template writes tools and calls in a syntax
  // model/tool_calls.h reads): the reply parsed. Generic: held to `schema`.
  ToolSyntax syntax = ToolSyntax::Generic;
  // Auto in Hermes' or Llama 3's syntax: `schema` is one call's, and with `held` the reply's calls
  // are held to it (RequestDefaults::tool_call_grammar) and streamed as they are written.
  bool held = false;
  std::string arguments_key;  // held: the key of a call's arguments ("arguments", or Llama 3's template's)
  // The tools as the request wrote them, for a chat template that writes tools (null otherwise).
  std::shared_ptr<const nlohmann::ordered_json> template_tools;
};

// A request ready for Engine::start, and what the server needs to report on it.
struct ParsedRequest {
  actors::EngineRequest request;   // messages, prompt text or token ids: the engine tokenizes
  bool stream = false;             // OpenAI: stream
  bool include_usage = false;      // OpenAI: stream_options.include_usage
  bool continuous_usage = false;   // vLLM: stream_options.continuous_usage_stats (with include_usage): usage in every chunk
  int n = 1;                       // OpenAI: choices, each its own engine request (choice i: seed + i)
  bool echo = false;               // /v1/completions: the prompt before each choice's text (and tokens)
  // echo with max_tokens 0: the prompt alone. `request` runs one token, which is not shown.
  bool prompt_only = false;
  ToolCalls tools;                 // /v1/chat/completions
  bool include_reasoning = true;   // vLLM's include_reasoning: false leaves a reply's reasoning out
  // The constraint starts after the reasoning (RequestDefaults::reasoning_grammar), whose block
  // the prompt opened or not (reasoning_open): the reply is read apart as an unconstrained one.
  bool reasoning_constrained = false;
  bool reasoning_open = false;
  // vLLM's prompt_logprobs: the alternatives listed for each prompt token (0..20); -1: not asked.
  // (request.prompt_logprobs is the larger of it and echo's logprobs: one prefill scores both.)
  int prompt_logprobs = -1;
  // vLLM's truncate_prompt_tokens: the prompt's last k tokens only (after templating); 0: all.
  int64_t truncate_prompt_tokens = 0;
  // /v1/completions with several prompts (an array of strings or of token-id arrays): each is
  // `request` with its prompt, as if sent alone; prompt p's n choices are choices p * n .. p * n + n - 1.
  // Empty: the one prompt is in `request`.
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;  // used when not empty
  };
  std::vector<Prompt> batch;
};

// The most prompts one /v1/completions request may carry.
inline constexpr int kMaxPrompts = 64;

// The most choices one OpenAI request may ask for (`n`); each is a request of its own against the
// admission limit.
inline constexpr int kMaxChoices = 16;

enum class PromptKind { Chat, Completion, WebSocket };  // messages only / prompt only / either

// Parses the fields of docs/protocol.md from `body` (a JSON object) into an engine request;
// Engine::start templates and tokenizes it and checks it against the context. Throws ApiError
// (invalid_request naming the field). `raw`: the text `body` was parsed from, where a JSON schema
// is read again to keep its members' order ("" : in key order).
ParsedRequest parse_generation(const nlohmann::json& body, PromptKind kind, const actors::Engine& engine,
                               const RequestDefaults& defaults, std::string_view raw = {});

// Whether a chat request's reply starts inside a reasoning block: its prefilled last message
// (continue_final_message) leaves one open, or its prompt, whose tokens are `prompt_ids`, ends
// with <think> (model/reasoning.h).
bool reply_opens_reasoning(const actors::Engine& engine, const actors::EngineRequest& request,
                           const std::vector<int32_t>& prompt_ids);

// vLLM's token routes, for clients that count or inspect tokens before they send a request.
// /tokenize: {"messages": [...]} templated as /v1/chat/completions would, or {"prompt": "text"} as
// /v1/completions would (no template) -> {"count", "max_model_len", "tokens"}: the count is the
// prompt_tokens that request would report. /detokenize: {"tokens": [ids]} -> {"prompt": text}.
// Throw ApiError (invalid_request naming the field). /tokenize's body is read into the request to
// tokenize (the server tokenizes it as a generation's prompt: net/generation.h, tokenize_prompt),
// and the ids into its reply.
// raw: the body's text, for the tools' members in the order it wrote them (as parse_generation).
actors::EngineRequest parse_tokenize(const nlohmann::json& body, const actors::Engine& engine, std::string_view raw = {});
nlohmann::json tokenize_reply(const std::vector<int32_t>& ids, const actors::Engine& engine);
nlohmann::json detokenize_body(const nlohmann::json& body, const actors::Engine& engine);

// Parses a request body or message. Throws ApiError invalid_json for text that is not JSON or
// nests deeper than 64 levels (nlohmann's printer and destructor recurse: a deep enough document
// would overflow the stack).
nlohmann::json parse_json(std::string_view text);

// The name clients see in /v1/models and responses: the model file's name without ".gguf".
std::string model_name_from_path(const std::string& path);

}  // namespace specula::net
