// A model's reply read as tool calls in its own syntax (ChatTemplate::tool_syntax()), as vLLM's
// tool parsers (hermes, llama3_json, mistral) and llama.cpp's --jinja read them.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "model/chat_template.h"

namespace specula {

struct ToolReply {
  std::optional<std::string> content;  // text beside the calls (none when only calls)
  std::vector<ToolCall> calls;         // ids left empty: the server numbers them
};

// The calls in `text`, each naming one of `names` with a JSON object of arguments; when the reply
// holds none, or any call is not well formed (not JSON, an unknown name, arguments not an object),
// the whole text is the content and there are no calls (vLLM's parsers do the same).
// Hermes: <tool_call>{"name", "arguments"}</tool_call> blocks after optional text (the last block
// may lack its closing tag where generation stopped at the end of the turn). Llama3Json: the reply
// is one or more {"name", "parameters"} objects (or "arguments"), separated by ';', optionally after
// <|python_tag|>. Mistral: optional text, then [TOOL_CALLS] and a JSON array of {"name", "arguments"}.
// Generic: no calls (the generic format's reply is read by the server's schema instead).
ToolReply parse_tool_reply(ToolSyntax syntax, const std::string& text, const std::vector<std::string>& names);

// How much of a reply generated so far is content whatever follows, so may be streamed: the text
// before a call's marker (holding back an end that may begin one: "<tool_c"), all of a reply
// that cannot be Llama 3 JSON calls (it does not open with '{' or <|python_tag|>), nothing while
// it is only whitespace (a reply of whitespace and calls has no content), nothing for Generic.
// It never shrinks as the text grows, and the content parse_tool_reply gives starts with it.
size_t tool_reply_streamable(ToolSyntax syntax, std::string_view text);

// How much of a text generated so far comes before `marker`: all of it up to the marker where it
// has one, else all but an end that may begin it ("<tool_c" of "<tool_call>").
size_t before_marker(std::string_view text, std::string_view marker);

// A reply held to one of the server's tool schemas (docs/protocol.md, "Tools"), read as far as
// it has been generated, so that its calls and content can stream as they are written (as vLLM
// and llama.cpp stream them): Arguments is a named function's reply (the whole text is its
// arguments), List "required"'s [{"name", "parameters"}, ...], Wrapped llama.cpp's generic
// format, {"tool_calls": [...]} or {"response": "..."}.
// Call: one {"name", "arguments"} object (a Hermes <tool_call> block's).
enum class ToolJson { Arguments, List, Wrapped, Call };

struct PartialCall {
  std::string name;       // complete: a call is listed once its name has closed
  std::string arguments;  // its arguments' JSON text so far (the "parameters" value as written)
  bool closed = false;    // the arguments are whole
};

struct PartialToolReply {
  std::vector<PartialCall> calls;
  std::optional<std::string> content;  // Wrapped: the "response" string so far, its escapes decoded
  bool closed = false;                 // the reply's JSON value is whole
};

// Reads `text` as the start of a reply of `shape`; `name` names an Arguments reply's function.
// Reading stops where the text ends (an escape, a surrogate pair or a UTF-8 character not yet
// whole is left out) or stops being of the shape, so a longer text's reading extends a shorter
// one's: each call's arguments and the content only grow, and calls are only added. Items of a
// list that are not objects, and members other than the shape's, are passed over (a member
// written twice counts the first time); a lone surrogate escape reads as U+FFFD; a value that
// stops being JSON (a bad escape, a bracket closed by the other kind) is cut at that byte.
PartialToolReply read_tool_json(ToolJson shape, std::string_view text, std::string_view name = {});

// The calls of a Hermes reply generated so far whose blocks a grammar holds to the tools' schemas
// (net/api_request.cpp: the lazy grammar after "<tool_call>"), so that they can stream as they are
// written: each <tool_call> block's call once its name has closed, with its arguments so far
// (the Call shape). `closed`: there are calls, and every block and its arguments have closed.
// The content (the text before the first block) is the caller's; `content` is left empty.
PartialToolReply read_hermes_calls(std::string_view text);

// The same for a Llama 3 reply held to its tools' schemas (calls open the reply): its
// {"name", `arguments`} objects separated by ';', each once its name has closed; `closed`: there
// are calls, the last has closed and nothing but whitespace follows it. A reply that does not
// open with '{', or whose object names no function (a JSON answer), has none.
PartialToolReply read_llama3_calls(std::string_view text, std::string_view arguments = "parameters");

// read_hermes_calls or read_llama3_calls (with `arguments`, the template's key), by `syntax`
// (none for another).
PartialToolReply read_held_calls(ToolSyntax syntax, std::string_view text, std::string_view arguments = "parameters");

}  // namespace specula
