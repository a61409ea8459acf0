// Tool calls in a model's own syntax (see tool_calls.h).
#include "model/tool_calls.h"

#include <algorithm>
#include <string_view>

#include <nlohmann/json.hpp>

namespace specula {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr const char* kSpace = " \t\n\r";

std::string_view trimmed(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// A call's JSON may nest as deep as a request body may, and hold as many members (net/api_request.cpp's
// limits): deeper, printing it again would recurse without bound; larger, an object's members
// (looked up one by one in an ordered object) would take time quadratic in their number. Either
// way it is not a call.
constexpr int kMaxDepth = 64;
constexpr int kMaxMembers = 4096;

// The end of the JSON object or array that opens at s[0] ('{' or '['): one past its closing
// bracket, or npos when it does not close, nests past kMaxDepth or holds more than kMaxMembers
// members and items in all. Brackets and commas inside strings do not count.
size_t closing(std::string_view s) {
  int depth = 0, commas = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == ',') {
      if (++commas >= kMaxMembers) return std::string_view::npos;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) return std::string_view::npos;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// One call object: {"name": one of names, "arguments" (or "parameters"): {...}}.
std::optional<ToolCall> call_of(const ordered_json& j, const std::vector<std::string>& names) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  if (std::find(names.begin(), names.end(), name->get<std::string>()) == names.end()) return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || !args->is_object()) return std::nullopt;
  return ToolCall{"", name->get<std::string>(), args->dump(-1, ' ', false, ordered_json::error_handler_t::replace)};
}

std::optional<ToolCall> call_of(std::string_view text, const std::vector<std::string>& names) {
  if (!text.starts_with("{") || closing(text) != text.size()) return std::nullopt;
  const ordered_json j = ordered_json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return call_of(j, names);
}

// The text before the calls, as written (vLLM's parsers keep it so); none when only whitespace.
std::optional<std::string> content_of(std::string_view before) {
  if (trimmed(before).empty()) return std::nullopt;
  return std::string(before);
}

constexpr std::string_view kHermesOpen = "<tool_call>", kMistralMarker = "[TOOL_CALLS]", kPythonTag = "<|python_tag|>";

bool hermes(std::string_view text, const std::vector<std::string>& names, ToolReply& out) {
  constexpr std::string_view open = kHermesOpen, close = "</tool_call>";
  size_t at = text.find(open);
  if (at == std::string_view::npos) return false;
  out.content = content_of(text.substr(0, at));
  while (at != std::string_view::npos) {
    const size_t body = at + open.size();
    size_t end = text.find(close, body);
    const bool last = end == std::string_view::npos;
    if (last) end = text.size();
    const auto call = call_of(trimmed(text.substr(body, end - body)), names);
    if (!call) return false;
    out.calls.push_back(*call);
    if (last) break;
    const size_t next = end + close.size();
    at = text.find(open, next);
    // only whitespace between and after the blocks
    const size_t stop = at == std::string_view::npos ? text.size() : at;
    if (!trimmed(text.substr(next, stop - next)).empty()) return false;
  }
  return true;
}

bool llama3_json(std::string_view text, const std::vector<std::string>& names, ToolReply& out) {
  std::string_view s = trimmed(text);
  if (s.starts_with(kPythonTag)) s = trimmed(s.substr(kPythonTag.size()));
  if (!s.starts_with("{")) return false;
  while (!s.empty()) {
    const size_t end = closing(s);
    if (end == std::string_view::npos) return false;
    const auto call = call_of(s.substr(0, end), names);
    if (!call) return false;
    out.calls.push_back(*call);
    s = trimmed(s.substr(end));
    if (s.starts_with(";")) s = trimmed(s.substr(1));
    if (!s.empty() && !s.starts_with("{")) return false;
  }
  return true;
}

bool mistral(std::string_view text, const std::vector<std::string>& names, ToolReply& out) {
  constexpr std::string_view marker = kMistralMarker;
  const size_t at = text.find(marker);
  if (at == std::string_view::npos) return false;
  out.content = content_of(text.substr(0, at));
  const std::string_view rest = trimmed(text.substr(at + marker.size()));
  if (!rest.starts_with("[") || closing(rest) != rest.size()) return false;
  const ordered_json list = ordered_json::parse(rest.begin(), rest.end(), nullptr, false);
  if (!list.is_array() || list.empty()) return false;
  for (const ordered_json& c : list) {
    const auto call = call_of(c, names);
    if (!call) return false;
    out.calls.push_back(*call);
  }
  return true;
}

// The text before `marker`, less an end that may begin it.
size_t before_marker(std::string_view text, std::string_view marker) {
  if (const size_t at = text.find(marker); at != std::string_view::npos) return at;
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k)
    if (text.ends_with(marker.substr(0, k))) return text.size() - k;
  return text.size();
}

}  // namespace

size_t tool_reply_streamable(ToolSyntax syntax, std::string_view text) {
  const std::string_view body = trimmed(text);
  if (body.empty()) return 0;
  switch (syntax) {
    case ToolSyntax::Hermes:
    case ToolSyntax::Mistral: {
      const size_t n = before_marker(text, syntax == ToolSyntax::Hermes ? kHermesOpen : kMistralMarker);
      return trimmed(text.substr(0, n)).empty() ? 0 : n;
    }
    case ToolSyntax::Llama3Json:
      if (body.starts_with("{") || body.starts_with(kPythonTag) || kPythonTag.starts_with(body)) return 0;
      return text.size();
    case ToolSyntax::Generic: break;
  }
  return 0;
}

ToolReply parse_tool_reply(ToolSyntax syntax, const std::string& text, const std::vector<std::string>& names) {
  ToolReply out;
  bool ok = false;
  switch (syntax) {
    case ToolSyntax::Hermes: ok = hermes(text, names, out); break;
    case ToolSyntax::Llama3Json: ok = llama3_json(text, names, out); break;
    case ToolSyntax::Mistral: ok = mistral(text, names, out); break;
    case ToolSyntax::Generic: break;
  }
  if (ok && !out.calls.empty()) return out;
  return ToolReply{text, {}};
}

}  // namespace specula
