// OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) over the chat
// route: a request read as the chat request it means, a reply's message turned into output
// items, and the responses kept for a later request's previous_response_id (docs/protocol.md,
// "POST /v1/responses").
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace specula::net {

// The responses a later request may continue (previous_response_id) or read back. Past
// kMaxResponses of them or kMaxBytes of their JSON, one goes: the oldest of the owner that holds
// the most (by count, or by bytes where the bytes are over), so that one key's flood pushes out its
// own first; pinned ones (background responses still running) and the one just kept stay, even
// where only they are left over the bounds (the running ones are bounded by the admission limit).
// Each is its owner's (key_owner: the API key that made it, on a server that requires keys): to a
// request of another owner it is not there, as one never kept. Owner: the I/O thread.
class ResponseStore {
 public:
  static constexpr std::size_t kMaxResponses = 1024, kMaxBytes = std::size_t{64} << 20, kMaxEntryBytes = kMaxBytes / 8;
  struct Stored {
    // The conversation after it as chat messages: its input (after its previous response's, its
    // instructions left out, as OpenAI carries none over) and its reply.
    nlohmann::ordered_json conversation;
    nlohmann::json response;  // the response object as it was returned
    std::string owner;        // key_owner of the request that made it
    bool pinned = false;      // not pushed out by newer ones (a background response that runs)
    std::size_t bytes = 0;
  };
  // The response `id` where `owner`'s; nullptr where there is none or it is another's.
  const Stored* find(const std::string& id, const std::string& owner) const;
  // The same, to change in place (a background response's status; its size is not counted again).
  Stored* find_mutable(const std::string& id, const std::string& owner);
  // Kept, unless it alone is over kMaxEntryBytes (then false, and the others stay).
  bool put(const std::string& id, Stored s);
  // Forgets the response `id` where `owner`'s; false where there is none or it is another's.
  bool erase(const std::string& id, const std::string& owner);
  std::size_t size() const { return map_.size(); }

 private:
  std::unordered_map<std::string, Stored> map_;
  std::deque<std::string> order_;  // the kept ids, oldest first
  std::size_t bytes_ = 0;
  std::unordered_map<std::string, std::pair<std::size_t, std::size_t>> by_owner_;  // owner -> count, bytes
  void drop(const std::string& id);
  bool push_out_one(const std::string& kept);  // false: nothing may go (`kept`, just put, stays)
};

// A Responses request as the chat completions request that serves it: `input` (a string, or
// message, function_call and function_call_output items) after `instructions` (a system message)
// and the previous response's conversation; max_output_tokens, text.format, tools (flat function
// tools), tool_choice, truncation and include's message.output_text.logprobs (with top_logprobs)
// in the chat fields' spelling; the sampling fields both take as they are. `conversation` gets the
// messages a stored response keeps (the input without the instructions). `owner`: the request's
// key_owner (a previous response of another's is not found). Throws ApiError naming the field for
// what the route cannot serve. `context`: the model's context length, `default_max_tokens` the
// server's; truncation "auto" sets truncate_prompt_tokens to the room left for max_output_tokens
// (or that default), which the route hands Generation::admit as its `fit_turns` too: whole turns
// go first, and the cut takes what is left of a lone turn.
nlohmann::ordered_json chat_request_of_response(const nlohmann::ordered_json& body, const ResponseStore& store,
                                                const std::string& owner, int64_t context, int64_t default_max_tokens,
                                                nlohmann::ordered_json& conversation);

// A chat reply's message (role, content, reasoning_content, tool_calls, as the chat route reads
// it) as the Responses API's output items: a reasoning item, a message item with its text, and a
// function_call item a call, in that order, their ids made from `id` (a response's, "resp_..."),
// each with `status` ("completed", or "incomplete" for a reply cut short); no reasoning item where
// the reasoning is empty. The message item is there where the content is text, or where nothing
// else is.
nlohmann::json response_output_items(const nlohmann::json& message, const std::string& id, const char* status);

}  // namespace specula::net
