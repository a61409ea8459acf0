// OpenAI's Responses API read as chat requests, and the responses kept for later (net/responses.h).
#include "net/responses.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include "net/api_request.h"

namespace specula::net {

using nlohmann::json;
using nlohmann::ordered_json;

namespace {

[[noreturn]] void refuse(const std::string& param, const std::string& message) {
  throw ApiError("invalid_request", message, param);
}

const ordered_json* member(const ordered_json& o, const char* name) {
  const auto it = o.find(name);
  return it == o.end() || it->is_null() ? nullptr : &*it;
}

std::string brief(const ordered_json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

// A message's or an output's content: a string, or text parts (input_text, output_text, text,
// refusal) joined; anything else (images, files, audio) is refused naming where it is.
std::string content_text(const ordered_json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) refuse("input", where + " must be a string or an array of text parts, got " + brief(content));
  std::string text;
  for (std::size_t j = 0; j < content.size(); ++j) {
    const ordered_json& part = content[j];
    const std::string at = where + "[" + std::to_string(j) + "]";
    const ordered_json* type = part.is_object() ? member(part, "type") : nullptr;
    const std::string t = type && type->is_string() ? type->get<std::string>() : "";
    const char* key = t == "refusal" ? "refusal" : "text";
    if (t != "input_text" && t != "output_text" && t != "text" && t != "refusal")
      refuse("input", at + ".type " + (type ? brief(*type) : std::string("(none)")) +
                          " is not served: this server reads text parts only (input_text, output_text)");
    const ordered_json* value = member(part, key);
    if (!value || !value->is_string()) refuse("input", at + "." + key + " must be a string");
    text += value->get<std::string>();
  }
  return text;
}

// `input` as chat messages, appended to `out`: messages, calls (consecutive ones in one assistant
// message, as a chat reply carries them) and their outputs; reasoning items are left out (chat
// templates drop a turn's reasoning).
void append_input(const ordered_json& input, ordered_json& out) {
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return;
  }
  if (!input.is_array()) refuse("input", "input must be a string or an array of items, got " + brief(input));
  for (std::size_t i = 0; i < input.size(); ++i) {
    const ordered_json& item = input[i];
    const std::string where = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) refuse("input", where + " must be an object, got " + brief(item));
    const ordered_json* type = member(item, "type");
    const std::string t = type && type->is_string() ? type->get<std::string>() : type ? "?" : "message";
    if (t == "message") {
      const ordered_json* role = member(item, "role");
      const std::string r = role && role->is_string() ? role->get<std::string>() : "";
      if (r != "user" && r != "assistant" && r != "system" && r != "developer")
        refuse("input", where + ".role must be user, assistant, system or developer, got " + (role ? brief(*role) : "(none)"));
      const ordered_json* content = member(item, "content");
      if (!content) refuse("input", where + ".content is required");
      out.push_back({{"role", r}, {"content", content_text(*content, where + ".content")}});
    } else if (t == "function_call") {
      const ordered_json *call_id = member(item, "call_id"), *name = member(item, "name"), *arguments = member(item, "arguments");
      if (!call_id || !call_id->is_string() || !name || !name->is_string() || !arguments || !arguments->is_string())
        refuse("input", where + ": a function_call needs call_id, name and arguments, strings");
      ordered_json call = {{"id", *call_id}, {"type", "function"}, {"function", {{"name", *name}, {"arguments", *arguments}}}};
      // After the assistant's own message (its text, or its calls so far): one more of its calls,
      // as a stored reply keeps them.
      const bool joins = !out.empty() && out.back()["role"] == "assistant";
      if (joins && !out.back().contains("tool_calls")) out.back()["tool_calls"] = ordered_json::array();
      if (joins) out.back()["tool_calls"].push_back(std::move(call));
      else out.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ordered_json::array({std::move(call)})}});
    } else if (t == "function_call_output") {
      const ordered_json *call_id = member(item, "call_id"), *output = member(item, "output");
      if (!call_id || !call_id->is_string() || !output)
        refuse("input", where + ": a function_call_output needs call_id (a string) and output");
      out.push_back({{"role", "tool"}, {"tool_call_id", *call_id}, {"content", content_text(*output, where + ".output")}});
    } else if (t == "reasoning") {
      continue;
    } else {
      refuse("input", where + ".type " + (type ? brief(*type) : std::string()) +
                          " is not served (message, function_call, function_call_output and reasoning items are)");
    }
  }
}

}  // namespace

const ResponseStore::Stored* ResponseStore::find(const std::string& id, const std::string& owner) const {
  const auto it = map_.find(id);
  return it == map_.end() || it->second.owner != owner ? nullptr : &it->second;
}

ResponseStore::Stored* ResponseStore::find_mutable(const std::string& id, const std::string& owner) {
  return const_cast<Stored*>(find(id, owner));
}

bool ResponseStore::put(const std::string& id, Stored s) {
  s.bytes = s.conversation.dump(-1, ' ', false, json::error_handler_t::replace).size() +
            s.response.dump(-1, ' ', false, json::error_handler_t::replace).size();
  if (s.bytes > kMaxEntryBytes) return false;  // kept, it would push out a good part of the others
  drop(id);
  bytes_ += s.bytes;
  auto& [count, bytes] = by_owner_[s.owner];
  ++count;
  bytes += s.bytes;
  map_.emplace(id, std::move(s));
  order_.push_back(id);
  while ((map_.size() > kMaxResponses || bytes_ > kMaxBytes) && push_out_one(id)) {
  }
  return true;
}

bool ResponseStore::push_out_one(const std::string& kept) {
  const bool by_bytes = map_.size() <= kMaxResponses;  // (else over by count)
  // The owners from the one holding the most: its oldest unpinned entry goes, else the next's.
  std::vector<std::pair<std::size_t, std::string>> owners;
  for (const auto& [owner, held] : by_owner_) owners.emplace_back(by_bytes ? held.second : held.first, owner);
  std::sort(owners.begin(), owners.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  for (const auto& [amount, owner] : owners)
    for (const std::string& id : order_) {
      const Stored& s = map_.at(id);
      if (s.owner == owner && !s.pinned && id != kept) {
        drop(std::string(id));  // (a copy: drop erases it from order_)
        return true;
      }
    }
  return false;
}

bool ResponseStore::erase(const std::string& id, const std::string& owner) {
  if (!find(id, owner)) return false;
  drop(id);
  return true;
}

void ResponseStore::drop(const std::string& id) {
  const auto it = map_.find(id);
  if (it == map_.end()) return;
  bytes_ -= it->second.bytes;
  const auto held = by_owner_.find(it->second.owner);
  held->second.second -= it->second.bytes;
  if (--held->second.first == 0) by_owner_.erase(held);
  map_.erase(it);
  order_.erase(std::find(order_.begin(), order_.end(), id));  // (at most kMaxResponses to look through)
}

ordered_json chat_request_of_response(const ordered_json& body, const ResponseStore& store, const std::string& owner,
                                      int64_t context, int64_t default_max_tokens, ordered_json& conversation) {
  if (!body.is_object()) throw ApiError("invalid_json", "the request must be a JSON object");
  if (const ordered_json* v = member(body, "background"); v && *v != false) {
    if (*v != true) refuse("background", "background must be true or false, got " + brief(*v));
    if (const ordered_json* st = member(body, "store"); st && *st == false)
      refuse("store", "a background response is kept to be read back: background needs store true");
    if (const ordered_json* st = member(body, "stream"); st && *st == true)
      refuse("stream", "background responses are not streamed here: ask without stream and read it with GET /v1/responses/{id}");
  }
  bool logprobs = false;
  if (const ordered_json* v = member(body, "include")) {
    if (!v->is_array()) refuse("include", "include must be an array, got " + brief(*v));
    for (const ordered_json& what : *v) {  // (no reasoning is encrypted here: nothing to add for that one)
      if (what == "message.output_text.logprobs") logprobs = true;
      else if (what != "reasoning.encrypted_content")
        refuse("include", "include " + brief(what) +
                              " is not served (message.output_text.logprobs and reasoning.encrypted_content are; no tool outputs to add)");
    }
  }
  if (member(body, "conversation")) refuse("conversation", "conversation objects are not served: continue with previous_response_id");
  if (member(body, "prompt")) refuse("prompt", "prompt templates are not served: send input");
  const ordered_json* top = member(body, "top_logprobs");
  if (top && !(top->is_number_integer() && *top >= 0 && *top <= 20))
    refuse("top_logprobs", "top_logprobs must be an integer from 0 to 20, got " + brief(*top));

  if (const ordered_json* v = member(body, "store"); v && !v->is_boolean()) refuse("store", "store must be true or false, got " + brief(*v));
  if (const ordered_json* v = member(body, "metadata"); v && !v->is_object())
    refuse("metadata", "metadata must be an object of strings, got " + brief(*v));
  conversation = ordered_json::array();
  if (const ordered_json* prev = member(body, "previous_response_id")) {
    if (!prev->is_string()) refuse("previous_response_id", "previous_response_id must be a string");
    const ResponseStore::Stored* stored = store.find(prev->get<std::string>(), owner);
    if (!stored)
      refuse("previous_response_id", "Previous response with id '" + prev->get<std::string>() +
                                          "' not found (responses are kept in memory while the server runs, unless made with store: false)");
    const auto status = stored->response.find("status");
    if (status != stored->response.end() && (*status == "queued" || *status == "in_progress"))
      refuse("previous_response_id", "Previous response with id '" + prev->get<std::string>() +
                                          "' is still in progress: continue it once it has ended (GET /v1/responses/{id})");
    conversation = stored->conversation;
  }
  const ordered_json* input = member(body, "input");
  if (!input) refuse("input", "input is required");
  append_input(*input, conversation);

  ordered_json chat = body;
  for (const char* own : {"input", "instructions", "max_output_tokens", "text", "previous_response_id", "store", "metadata",
                          "truncation", "tools", "tool_choice", "reasoning", "include", "background", "stream_options", "user",
                          "service_tier", "max_tool_calls", "top_logprobs", "prompt_cache_key", "safety_identifier",
                          // the chat route's own, which a Responses request does not carry
                          "messages", "n", "max_tokens", "max_completion_tokens", "response_format", "logprobs", "prompt",
                          "echo", "suffix", "best_of", "prompt_logprobs"})
    chat.erase(own);
  ordered_json messages = ordered_json::array();
  if (const ordered_json* v = member(body, "instructions")) {
    if (!v->is_string()) refuse("instructions", "instructions must be a string, got " + brief(*v));
    messages.push_back({{"role", "system"}, {"content", *v}});
  }
  for (const ordered_json& m : conversation) messages.push_back(m);
  chat["messages"] = std::move(messages);
  if (const ordered_json* v = member(body, "max_output_tokens")) chat["max_tokens"] = *v;
  if (logprobs) {  // each token's log-probability and top_logprobs alternatives (without include: none, as vLLM)
    chat["logprobs"] = true;
    if (top) chat["top_logprobs"] = *top;
  }
  if (const ordered_json* text = member(body, "text")) {
    if (!text->is_object()) refuse("text", "text must be an object, got " + brief(*text));
    if (const ordered_json* format = member(*text, "format")) {
      const ordered_json* type = format->is_object() ? member(*format, "type") : nullptr;
      if (type && *type == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if (type && *type == "json_schema") {
        ordered_json spec = {{"name", format->value("name", "response")}};
        if (const ordered_json* schema = member(*format, "schema")) spec["schema"] = *schema;
        if (const ordered_json* strict = member(*format, "strict")) spec["strict"] = *strict;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(spec)}};
      } else if (!(type && *type == "text")) {
        refuse("text.format", "text.format.type must be \"text\", \"json_object\" or \"json_schema\", got " + brief(*format));
      }
    }
  }
  if (const ordered_json* v = member(body, "truncation")) {
    if (*v == "auto") {  // the prompt's latest tokens, with room for the reply
      const ordered_json* most = member(body, "max_output_tokens");
      const int64_t reply = most && most->is_number_integer() ? most->get<int64_t>() : default_max_tokens;
      if (!member(body, "truncate_prompt_tokens")) chat["truncate_prompt_tokens"] = std::clamp<int64_t>(context - reply, 1, context - 1);
    } else if (*v != "disabled") {
      refuse("truncation", "truncation must be \"auto\" or \"disabled\", got " + brief(*v));
    }
  }
  if (const ordered_json* tools = member(body, "tools")) {
    if (!tools->is_array()) refuse("tools", "tools must be an array of function tools");
    ordered_json out = ordered_json::array();
    for (std::size_t i = 0; i < tools->size(); ++i) {
      const ordered_json& t = (*tools)[i];
      const ordered_json* type = t.is_object() ? member(t, "type") : nullptr;
      if (!type || *type != "function")
        refuse("tools", "tools[" + std::to_string(i) + "].type must be \"function\" (built-in tools such as web_search are not served), got " +
                            (type ? brief(*type) : std::string("(none)")));
      ordered_json fn = t;
      fn.erase("type");
      fn.erase("strict");  // (the arguments are held to the schema where the grammar can keep it)
      out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    chat["tools"] = std::move(out);
  }
  if (const ordered_json* choice = member(body, "tool_choice")) {
    if (choice->is_object()) {
      const ordered_json* type = member(*choice, "type");
      const ordered_json* name = member(*choice, "name");
      if (!type || *type != "function" || !name || !name->is_string())
        refuse("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}, got " +
                                  brief(*choice));
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", *name}}}};
    } else {
      chat["tool_choice"] = *choice;  // "auto", "none", "required": the chat route checks them
    }
  }
  return chat;
}

json response_output_items(const json& message, const std::string& id, const char* status) {
  const std::string suffix = id.starts_with("resp_") ? id.substr(5) : id;
  json items = json::array();
  const auto reasoning = message.find("reasoning_content");
  // (an empty block is no item: a stream opens an item with its first text)
  const bool reasoned = reasoning != message.end() && reasoning->is_string() && !reasoning->get_ref<const std::string&>().empty();
  if (reasoned)
    items.push_back({{"type", "reasoning"},
                     {"id", "rs_" + suffix},
                     {"summary", json::array()},
                     {"content", json::array({{{"type", "reasoning_text"}, {"text", *reasoning}}})},
                     {"status", status}});
  const auto calls = message.find("tool_calls");
  const bool called = calls != message.end() && calls->is_array() && !calls->empty();
  const auto content = message.find("content");
  const std::string text = content != message.end() && content->is_string() ? content->get<std::string>() : std::string();
  if (!text.empty() || (!called && !reasoned))
    items.push_back({{"type", "message"},
                     {"id", "msg_" + suffix},
                     {"status", status},
                     {"role", "assistant"},
                     {"content", json::array({{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}});
  if (called)
    for (std::size_t k = 0; k < calls->size(); ++k) {
      const json& c = (*calls)[k];
      items.push_back({{"type", "function_call"},
                       {"id", "fc_" + suffix + "_" + std::to_string(k)},
                       {"call_id", c["id"]},
                       {"name", c["function"]["name"]},
                       {"arguments", c["function"]["arguments"]},
                       {"status", status}});
    }
  return items;
}

}  // namespace specula::net
