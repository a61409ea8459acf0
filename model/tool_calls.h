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

}  // namespace specula
