// Tool calls in a model's own syntax (see tool_calls.h).
#include "model/tool_calls.h"

#include <algorithm>
#include <functional>
#include <string_view>

#include <nlohmann/json.hpp>

#include "model/utf8.h"

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


// The start of a JSON text, read left to right as far as it goes: each step is Done, More (the
// text ended before it did) or Bad (the text is not JSON there).
class JsonPrefix {
 public:
  enum class Step { Done, More, Bad };
  explicit JsonPrefix(std::string_view s) : s_(s) {}

  bool at_end() { space(); return pos_ >= s_.size(); }
  char next() { return at_end() ? '\0' : s_[pos_]; }
  size_t pos() const { return pos_; }
  std::string_view text() const { return s_; }

  Step expect(char c) {
    if (at_end()) return Step::More;
    if (s_[pos_] != c) return Step::Bad;
    ++pos_;
    return Step::Done;
  }

  // A string, decoded into *out as far as it goes (escapes and UTF-8 characters whole only).
  Step string(std::string* out) {
    if (at_end()) return Step::More;
    if (s_[pos_] != '"') return Step::Bad;
    std::string raw;  // the decoded bytes (checked as UTF-8 below)
    size_t i = pos_ + 1;
    const size_t n = s_.size();
    auto hex4 = [&](size_t at) -> int32_t {  // -1: not four hex digits
      const std::optional<uint32_t> v = utf8::hex(s_, at, 4);
      return v ? static_cast<int32_t>(*v) : -1;
    };
    // bad: the byte at `bad_at` is not JSON; what was read before it is kept, as the text so far
    bool closed = false, bad = false;
    size_t bad_at = 0;
    while (i < n) {
      const char c = s_[i];
      if (c == '"') {
        closed = true;
        ++i;
        break;
      }
      if (c != '\\') {
        raw += c;
        ++i;
        continue;
      }
      if (i + 1 >= n) break;
      const char e = s_[i + 1];
      if (e != 'u') {
        static constexpr std::string_view from = "\"\\/bfnrt", to = "\"\\/\b\f\n\r\t";
        const size_t k = from.find(e);
        if (k == std::string_view::npos) {
          bad = true;
          bad_at = i + 1;
          break;
        }
        raw += to[k];
        i += 2;
        continue;
      }
      // (a digit that is not hex is found as soon as it is written)
      const size_t digits_end = std::min(i + 6, n);
      for (size_t k = i + 2; k < digits_end && !bad; ++k)
        if (utf8::hex_digit(s_[k]) < 0) {
          bad = true;
          bad_at = k;
        }
      if (bad || i + 6 > n) break;
      const int32_t cp = hex4(i + 2);
      if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate: whole with the low one after it
        const size_t j = i + 6;
        if (j >= n || (s_[j] == '\\' && (j + 1 >= n || (s_[j + 1] == 'u' && j + 6 > n)))) break;
        const int32_t low = s_[j] == '\\' && s_[j + 1] == 'u' ? hex4(j + 2) : -1;
        if (low >= 0xDC00 && low < 0xE000) {
          utf8::append(raw, 0x10000 + ((static_cast<uint32_t>(cp) - 0xD800) << 10) + (static_cast<uint32_t>(low) - 0xDC00));
          i = j + 6;
        } else {
          utf8::append(raw, 0xFFFD);
          i = j;
        }
        continue;
      }
      utf8::append(raw, cp >= 0xDC00 && cp < 0xE000 ? 0xFFFD : static_cast<uint32_t>(cp));
      i += 6;
    }
    if (out) {
      out->clear();
      utf8::append_lossy(raw, *out, closed);
    }
    if (bad) {
      pos_ = bad_at;
      return Step::Bad;
    }
    pos_ = closed ? i : n;
    return closed ? Step::Done : Step::More;
  }

  // Passes over one value (brackets inside strings do not count).
  Step value() {
    if (at_end()) return Step::More;
    const char c = s_[pos_];
    if (c == '"') return string(nullptr);
    if (c == '{' || c == '[') {
      std::string open;  // the brackets open, each closed by its own kind
      while (pos_ < s_.size()) {
        const char d = s_[pos_];
        if (d == '"') {
          if (const Step r = string(nullptr); r != Step::Done) return r;
          continue;
        }
        if (d == '{' || d == '[') {
          open += d;
        } else if (d == '}' || d == ']') {
          if (open.back() != (d == '}' ? '{' : '[')) return Step::Bad;
          open.pop_back();
          if (open.empty()) {
            ++pos_;
            return Step::Done;
          }
        }
        ++pos_;
      }
      return Step::More;
    }
    const size_t from = pos_;
    while (pos_ < s_.size() && std::string_view("-+.0123456789eEtrufalsn").find(s_[pos_]) != std::string_view::npos) ++pos_;
    if (pos_ == s_.size()) return Step::More;  // a number may go on
    return pos_ == from ? Step::Bad : Step::Done;
  }

  // An object's members, each value read by `member` (at its start) given the member's key.
  Step object(const std::function<Step(const std::string&)>& member) {
    if (const Step r = expect('{'); r != Step::Done) return r;
    if (next() == '}') {
      ++pos_;
      return Step::Done;
    }
    for (;;) {
      std::string key;
      if (const Step r = string(&key); r != Step::Done) return r;
      if (const Step r = expect(':'); r != Step::Done) return r;
      if (const Step r = member(key); r != Step::Done) return r;
      if (at_end()) return Step::More;
      if (s_[pos_] == '}') {
        ++pos_;
        return Step::Done;
      }
      if (const Step r = expect(','); r != Step::Done) return r;
    }
  }

  // An array's items, each read by `item` (at its start).
  Step array(const std::function<Step()>& item) {
    if (const Step r = expect('['); r != Step::Done) return r;
    if (next() == ']') {
      ++pos_;
      return Step::Done;
    }
    for (;;) {
      if (const Step r = item(); r != Step::Done) return r;
      if (at_end()) return Step::More;
      if (s_[pos_] == ']') {
        ++pos_;
        return Step::Done;
      }
      if (const Step r = expect(','); r != Step::Done) return r;
    }
  }

 private:
  void space() {
    while (pos_ < s_.size() && std::string_view(kSpace).find(s_[pos_]) != std::string_view::npos) ++pos_;
  }
  std::string_view s_;
  size_t pos_ = 0;
};

using Step = JsonPrefix::Step;

// The text of s[from, to), left out an end that is not a whole UTF-8 character yet unless `whole`.
std::string valid_text(std::string_view s, size_t from, size_t to, bool whole) {
  std::string out;
  utf8::append_lossy(s.substr(from, to - from), out, whole);
  return out;
}

// {"name", `arguments`}: where it names a function, a call, its arguments the `arguments` value's
// text as far as it goes. (Any other value is read past.)
Step call_object(JsonPrefix& p, std::string_view arguments, std::vector<PartialCall>& calls) {
  if (p.next() != '{') return p.value();
  PartialCall call;
  bool named = false, name_seen = false, parameters_seen = false;  // (a key written twice: the first)
  const Step r = p.object([&](const std::string& key) {
    if (key == "name" && !name_seen && !p.at_end()) {
      name_seen = true;
      if (p.next() != '"') return p.value();
      std::string name;
      const Step s = p.string(&name);
      if (s == Step::Done) {
        call.name = std::move(name);
        named = true;
      }
      return s;
    }
    if (key == arguments && !parameters_seen && !p.at_end()) {
      parameters_seen = true;
      const size_t from = p.pos();
      const Step s = p.value();
      call.closed = s == Step::Done;
      // (cut where it ends, where it stops being JSON, or where the text does)
      call.arguments = valid_text(p.text(), from, s == Step::More ? p.text().size() : p.pos(), call.closed);
      return s;
    }
    return p.value();
  });
  if (named) calls.push_back(std::move(call));
  return r;
}

// [{"name", "parameters"}, ...]: each item that names a function is a call.
Step call_list(JsonPrefix& p, std::vector<PartialCall>& calls) {
  return p.array([&] { return call_object(p, "parameters", calls); });
}

}  // namespace

PartialToolReply read_tool_json(ToolJson shape, std::string_view text, std::string_view name) {
  PartialToolReply out;
  JsonPrefix p(text);
  switch (shape) {
    case ToolJson::Arguments: {
      out.closed = p.value() == Step::Done;
      // all the text (a call's arguments are the reply), what follows a closed value as text so far
      const size_t whole = out.closed ? p.pos() : 0;
      out.calls.push_back({std::string(name), valid_text(text, 0, whole, true) + valid_text(text, whole, text.size(), false),
                           out.closed});
      break;
    }
    case ToolJson::List:
      out.closed = call_list(p, out.calls) == Step::Done;
      break;
    case ToolJson::Call:
      out.closed = call_object(p, "arguments", out.calls) == Step::Done;
      break;
    case ToolJson::Wrapped: {
      bool decided = false;  // the first of "response" and "tool_calls" is the reply
      out.closed = p.object([&](const std::string& key) {
                     if (!decided && key == "response" && p.next() == '"') {
                       decided = true;
                       std::string content;
                       const Step s = p.string(&content);
                       out.content = std::move(content);
                       return s;
                     }
                     if (!decided && key == "tool_calls" && p.next() == '[') {
                       decided = true;
                       return call_list(p, out.calls);
                     }
                     return p.value();
                   }) == Step::Done;
      break;
    }
  }
  return out;
}

PartialToolReply read_hermes_calls(std::string_view text) {
  constexpr std::string_view close = "</tool_call>";
  PartialToolReply out;
  out.closed = true;
  for (size_t at = text.find(kHermesOpen); at != std::string_view::npos;) {
    // The block's object ends where the JSON reader says (a "</tool_call>" inside one of its
    // strings is text), then whitespace and the closing tag.
    JsonPrefix p(text.substr(at + kHermesOpen.size()));
    const Step s = call_object(p, "arguments", out.calls);
    const size_t after = at + kHermesOpen.size() + p.pos();
    const size_t end = s == Step::Done ? text.find(close, after) : std::string_view::npos;
    if (end == std::string_view::npos) {
      out.closed = false;
      break;
    }
    at = text.find(kHermesOpen, end + close.size());
  }
  out.closed = out.closed && !out.calls.empty();
  return out;
}

PartialToolReply read_llama3_calls(std::string_view text, std::string_view arguments) {
  PartialToolReply out;
  JsonPrefix p(text);
  if (p.next() != '{') return out;  // text, or not yet anything
  for (;;) {
    const size_t before = out.calls.size();
    // (an object that names no function is a JSON answer, not calls: nothing after it is read)
    if (call_object(p, arguments, out.calls) != Step::Done || out.calls.size() == before) return out;
    if (p.at_end()) break;  // (whole so far: closed, unless more follows)
    if (p.expect(';') != Step::Done || p.next() != '{') return out;
  }
  out.closed = !out.calls.empty();
  return out;
}

PartialToolReply read_held_calls(ToolSyntax syntax, std::string_view text, std::string_view arguments) {
  return syntax == ToolSyntax::Hermes ? read_hermes_calls(text)
         : syntax == ToolSyntax::Llama3Json ? read_llama3_calls(text, arguments)
                                            : PartialToolReply{};
}

size_t before_marker(std::string_view text, std::string_view marker) {
  if (const size_t at = text.find(marker); at != std::string_view::npos) return at;
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k)
    if (text.ends_with(marker.substr(0, k))) return text.size() - k;
  return text.size();
}

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
