// What goes on the wire, kept apart from the sockets so the tests can feed it by hand: the
// request bodies (WebSocket "generate", OpenAI chat/completions with stream: true) and how each
// server message updates a RequestRecord (docs/protocol.md).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/specula-load/options.h"
#include "tools/specula-load/prompts.h"
#include "tools/specula-load/record.h"

namespace specula::load {

// {"type":"generate","id":"r<index>","messages"|"prompt",...} with the options' sampling and
// speculation settings; max_tokens from --max-tokens, else the prompt's own.
nlohmann::json ws_generate_message(const Prompt& p, const LoadOptions& o, int index);
std::string request_id(int index);

// The OpenAI body for o.target.path: /v1/completions gets "prompt" (messages joined by lines),
// /v1/responses "input" (the messages, or the prompt as a string; "max_output_tokens", and
// store false: a load test keeps nothing on the server), anything else "messages" (a plain
// prompt becomes one user message).
nlohmann::json http_request_body(const Prompt& p, const LoadOptions& o, int index);

enum class Outcome { Pending, Done, Failed };

// One WebSocket message for request `id`, received at `now_s`. Token events append to the
// record's events; "done" fills the server stats; "error" sets error_kind "server:<code>".
// A message that is not JSON or lacks required fields sets error_kind "protocol". Messages for
// other ids and unknown types are ignored (Pending).
Outcome apply_ws_message(const std::string& text, const std::string& id, double now_s, RequestRecord& r);

// Splits a server-sent-event stream into the payloads of its "data:" lines (events end at a blank
// line; "\r\n" and "\n" both end lines). Feed bytes as they come.
class SseParser {
 public:
  std::vector<std::string> feed(const char* data, size_t n);

 private:
  std::string pending_;  // bytes after the last complete line
  std::string data_;     // the data lines of the event being read
  bool has_data_ = false;
};

// One SSE data payload ("[DONE]", an OpenAI chunk, or a Responses API event: its text deltas are
// token events, response.completed / response.incomplete end it, error / response.failed fail
// it) received at `now_s`.
Outcome apply_sse_data(const std::string& payload, double now_s, RequestRecord& r);

// A non-2xx HTTP response: error_kind "server:<code>" when the body is an OpenAI-style
// {"error":{"code"|"type","message"}}, else "http:<status>".
void apply_http_error(int status, const std::string& body, RequestRecord& r);

}  // namespace specula::load
