// Chat prompt rendering (see chat_template.h): the model's Jinja template through model/jinja.h,
// and the built-in ChatML, Llama 3 and plain formats.
#include "model/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>

#include <nlohmann/json.hpp>

#include "model/jinja.h"

namespace specula {
namespace {

// The literal system line a ChatML template writes when the conversation has none, as in
// SmolLM2's `'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\n'`.
// The newline may be a real one (tokenizer_config.json) or Jinja's `\n` escape. A line built
// from message fields (`' + message['content'] + '`) is not a default and is skipped.
std::string chatml_default_system(const std::string& jinja) {
  const std::string_view head = "<|im_start|>system";
  const std::string_view end = "<|im_end|>";
  for (size_t at = jinja.find(head); at != std::string::npos; at = jinja.find(head, at + 1)) {
    size_t begin = at + head.size();
    if (jinja.compare(begin, 1, "\n") == 0) {
      begin += 1;
    } else if (jinja.compare(begin, 2, "\\n") == 0) {
      begin += 2;
    } else {
      continue;
    }
    const size_t stop = jinja.find(end, begin);
    if (stop == std::string::npos) continue;
    const std::string text = jinja.substr(begin, stop - begin);
    if (!text.empty() && text.find_first_of("'\"{}") == std::string::npos) return text;
  }
  return {};
}

// Jinja's `| trim`, which the Llama 3 templates apply to every message (llama.cpp does too).
std::string_view trim(std::string_view s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// A message on one line: a template's own text (a string token, raise_exception's argument) may
// hold newlines, and errors here become one stderr line or one JSON error message.
std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

void check_messages(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) throw std::invalid_argument("chat template: the conversation has no messages");
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      throw std::invalid_argument("chat template: message " + std::to_string(i) + " has role '" + r +
                                  "' (expected system, user, assistant or tool)");
    }
  }
}

using ordered_json = nlohmann::ordered_json;

// A call's arguments as a JSON value (templates write them with `tojson`, as Hugging Face passes
// them). The server has checked them; other callers (specula chat-template) get a clear error.
ordered_json arguments_of(const ToolCall& c) {
  ordered_json v = ordered_json::parse(c.arguments, nullptr, false);
  if (v.is_discarded())
    throw std::invalid_argument("chat template: the arguments of the call to '" + c.name + "' are not JSON");
  return v;
}

// A message's text with an assistant's calls as the generic format writes them after it
// (docs/protocol.md, "Tools").
std::string text_with_generic_calls(const ChatMessage& m) {
  if (m.tool_calls.empty()) return m.content;
  ordered_json written = ordered_json::array();
  for (const ToolCall& c : m.tool_calls) written.push_back({{"name", c.name}, {"parameters", arguments_of(c)}});
  std::string text = m.content;
  if (!text.empty()) text += '\n';
  return text + ordered_json{{"tool_calls", std::move(written)}}.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// Texts that end a turn in the chat formats of common model families (llama.cpp's
// end-of-generation list): a template that writes one ends its turns with it.
constexpr std::string_view kEndOfTurnMarkers[] = {
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>", "<|return|>", "<|call|>"};

// The probe's names: unlikely in any template's own text.
constexpr std::string_view kProbeTool = "specula_probe_tool";
constexpr std::string_view kProbeCall = "specula_probe_call";

}  // namespace

const char* tool_syntax_name(ToolSyntax s) {
  switch (s) {
    case ToolSyntax::Hermes: return "hermes";
    case ToolSyntax::Llama3Json: return "llama3_json";
    case ToolSyntax::Mistral: return "mistral";
    case ToolSyntax::Generic: break;
  }
  return "generic";
}

std::optional<ToolSyntax> tool_syntax_of(std::string_view name) {
  for (ToolSyntax s : {ToolSyntax::Generic, ToolSyntax::Hermes, ToolSyntax::Llama3Json, ToolSyntax::Mistral})
    if (name == tool_syntax_name(s)) return s;
  return std::nullopt;
}

std::optional<ToolSyntax> tool_call_parser_of(std::string_view name) {
  if (name == "auto") return std::nullopt;
  if (const std::optional<ToolSyntax> s = tool_syntax_of(name)) return s;
  throw std::invalid_argument("--tool-call-parser must be auto, generic, hermes, llama3_json or mistral, got '" +
                              std::string(name) + "'");
}

void ChatTemplate::set_tool_call_parser(std::string_view name) {
  const std::optional<ToolSyntax> s = tool_call_parser_of(name);
  if (!s) return;
  if (*s != ToolSyntax::Generic && !supports_tools_)
    throw std::invalid_argument("--tool-call-parser " + std::string(name) +
                                ": the chat template does not write the tools it is handed, so the model would not see them "
                                "(give one that does with --chat-template, or use generic)");
  tool_syntax_ = *s;
  if (*s == ToolSyntax::Generic) supports_tools_ = supports_tool_calls_ = false;  // as a template without tools
}

// Renders a conversation with a probe tool and one with a probe call and its result, and reads
// what the template wrote. A template that fails on them is taken as not supporting tools.
void ChatTemplate::probe_tools() {
  const ordered_json tools = ordered_json::array(
      {{{"type", "function"},
        {"function",
         {{"name", kProbeTool},
          {"description", "A probe."},
          {"parameters", {{"type", "object"}, {"properties", {{"a", {{"type", "string"}}}}}, {"required", {"a"}}}}}}}});
  auto attempt = [&](const std::vector<ChatMessage>& conversation, const ordered_json* with_tools) -> std::string {
    for (int with_system = 0; with_system < 2; ++with_system) {  // some templates want a system message first
      std::vector<ChatMessage> c = conversation;
      if (with_system) c.insert(c.begin(), ChatMessage{"system", "You are a probe."});
      try {
        return render_jinja(c, true, with_tools, /*structured_calls=*/true);
      } catch (const std::exception&) {
      }
    }
    return {};
  };
  supports_tools_ = attempt({{"user", "Hi"}}, &tools).find(kProbeTool) != std::string::npos;
  ChatMessage call{"assistant", ""};
  call.tool_calls.push_back({"call12345", std::string(kProbeCall), R"({"a": "b"})"});
  ChatMessage result{"tool", "ok"};
  result.tool_call_id = "call12345";
  result.name = "specula_probe_result";  // not the call's name: a template writing only results must not pass
  const std::string text = attempt({{"user", "Hi"}, call, result}, supports_tools_ ? &tools : nullptr);
  const size_t at = text.find(kProbeCall);
  supports_tool_calls_ = at != std::string::npos;
  if (!supports_tool_calls_) return;
  const std::string before = text.substr(at >= 64 ? at - 64 : 0, at >= 64 ? 64 : at);
  const std::string after = text.substr(at + kProbeCall.size(), 16);
  // (the key the template writes a call's arguments under, kept for a syntax forced later too)
  if (after.starts_with("\", \"arguments\"")) tool_arguments_key_ = "arguments";
  if (before.find("<tool_call>") != std::string::npos)
    tool_syntax_ = ToolSyntax::Hermes;
  else if (before.find("[TOOL_CALLS]") != std::string::npos)
    tool_syntax_ = ToolSyntax::Mistral;
  else if (before.ends_with("{\"name\": \"") && (after.starts_with("\", \"parameters\"") || after.starts_with("\", \"arguments\"")))
    tool_syntax_ = ToolSyntax::Llama3Json;
}

ChatTemplate ChatTemplate::from_template_text(const std::string& jinja, SpecialTokens tokens) {
  ChatTemplate t;
  if (jinja.find("<|im_start|>") != std::string::npos)
    t = ChatTemplate(Kind::ChatML, chatml_default_system(jinja));
  else if (jinja.find("<|start_header_id|>") != std::string::npos)
    t = ChatTemplate(Kind::Llama3);
  if (jinja.empty()) return t;
  t.tokens_ = std::move(tokens);
  try {
    // A template that parses is run; one that then fails on a conversation fails that request (a
    // 400 naming the line), as Hugging Face and llama.cpp's --jinja fail it: some templates are
    // written for conversations of one shape (tools given, a system message first).
    t.jinja_ = std::make_shared<const jinja::Template>(jinja);
    t.probe_tools();
    for (std::string_view m : kEndOfTurnMarkers)
      if (jinja.find(m) != std::string::npos) t.markers_.emplace_back(m);
    t.writes_reasoning_ = jinja.find("</think>") != std::string::npos;
  } catch (const jinja::Error& e) {
    t.problem_ = one_line(e.what());
  } catch (const std::exception& e) {  // e.g. bad_alloc on an absurd template: not run, as a parse error
    t.problem_ = one_line(std::string("chat template: ") + e.what());
  }
  return t;
}

ChatTemplate ChatTemplate::from_option(const std::string& spec, SpecialTokens tokens) {
  if (spec == "chatml") return ChatTemplate(Kind::ChatML);
  if (spec == "llama3") return ChatTemplate(Kind::Llama3);
  if (spec == "plain") return ChatTemplate(Kind::Plain);
  std::string text = spec;
  std::error_code ec;
  if (spec.find("{{") == std::string::npos && spec.find("{%") == std::string::npos) {
    if (!std::filesystem::is_regular_file(spec, ec))
      throw std::invalid_argument("chat template '" + spec +
                                  "' is neither a built-in name (chatml, llama3, plain), a file, nor a Jinja template");
    std::ifstream in(spec, std::ios::binary);
    std::ostringstream body;
    body << in.rdbuf();
    if (!in) throw std::invalid_argument("cannot read the chat template file '" + spec + "'");
    text = body.str();
  }
  ChatTemplate t = from_template_text(text, std::move(tokens));
  if (!t.problem_.empty()) throw std::invalid_argument(t.problem_);
  if (!t.jinja_) throw std::invalid_argument("the chat template '" + spec + "' is empty");
  return t;
}

std::string ChatTemplate::render_jinja(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                       const nlohmann::ordered_json* tools, bool structured_calls,
                                       const nlohmann::ordered_json* more) const {
  ordered_json turns = ordered_json::array();
  for (const ChatMessage& m : messages) {
    ordered_json turn = {{"role", m.role}};
    if (m.tool_calls.empty() || !structured_calls) {
      turn["content"] = text_with_generic_calls(m);
    } else {  // OpenAI's form, the arguments parsed (as Hugging Face's templates expect them)
      turn["content"] = m.content.empty() ? ordered_json() : ordered_json(m.content);
      ordered_json calls = ordered_json::array();
      for (const ToolCall& c : m.tool_calls)
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", arguments_of(c)}}}});
      turn["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) turn["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) turn["name"] = m.name;
    if (m.reasoning_content) turn["reasoning_content"] = *m.reasoning_content;
    turns.push_back(std::move(turn));
  }
  // chat_template_kwargs first, so that the conversation's own variables are the ones rendered
  ordered_json variables = more && more->is_object() ? *more : ordered_json::object();
  variables["messages"] = std::move(turns);
  variables["add_generation_prompt"] = add_generation_prompt;
  if (tools && !tools->is_null()) variables["tools"] = *tools;
  return render_variables(variables);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const RenderOptions& o) const {
  if (o.continue_final_message && o.add_generation_prompt)
    throw std::invalid_argument("continue_final_message leaves the last message open; it goes with add_generation_prompt false");
  check_messages(messages);
  const std::string text =
      jinja_ ? render_jinja(messages, o.add_generation_prompt, supports_tools_ ? o.tools : nullptr, supports_tool_calls_, o.variables)
             : render_builtin(messages, o.add_generation_prompt);
  if (!o.continue_final_message) return text;
  // Hugging Face's cut: the text up to the last place the final message's text (less its outer
  // whitespace) appears, with its trailing whitespace where the template kept it.
  // (Python's str.strip on ASCII: \x1c-\x1f among it; the Unicode spaces it also strips, such as
  // U+00A0 and U+3000, are not stripped here, as the interpreter's trim does not strip them)
  static constexpr std::string_view kPythonSpace = " \t\n\r\f\v\x1c\x1d\x1e\x1f";
  const std::string& last = messages.back().content;
  const size_t b = last.find_first_not_of(kPythonSpace);
  if (b == std::string::npos)
    throw std::invalid_argument("continue_final_message needs a last message with text to continue");
  const size_t e = last.find_last_not_of(kPythonSpace) + 1;
  const std::string_view stripped = std::string_view(last).substr(b, e - b);
  const size_t at = text.rfind(stripped);
  if (at == std::string::npos)
    throw std::invalid_argument(
        "continue_final_message: the chat template does not write the last message's text as it is, so it cannot be left open");
  // Written as it is (no leading whitespace, and its trailing whitespace kept): all of it.
  const size_t lstripped = last.size() - b;
  if (text.compare(at, lstripped, last) == 0) return text.substr(0, at + lstripped);
  return text.substr(0, at + stripped.size());
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json* tools) const {
  return render(messages, RenderOptions{add_generation_prompt, false, tools, nullptr});
}

std::string ChatTemplate::render_builtin(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  switch (kind_) {
    case Kind::ChatML:
      if (messages.front().role != "system" && !default_system_.empty()) {
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      }
      for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + text_with_generic_calls(m) + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case Kind::Llama3:
      out += "<|begin_of_text|>";
      for (const ChatMessage& m : messages) {
        // A tool's result is Llama 3.1's "ipython" turn.
        out += "<|start_header_id|>" + (m.role == "tool" ? std::string("ipython") : m.role) + "<|end_header_id|>\n\n";
        out += trim(text_with_generic_calls(m));
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case Kind::Plain:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i) out += '\n';
        out += text_with_generic_calls(messages[i]);
      }
      break;
  }
  return out;
}

std::string ChatTemplate::render_variables(const nlohmann::ordered_json& variables) const {
  if (!jinja_) throw std::invalid_argument("the chat template is a built-in format, not a Jinja template");
  // What Hugging Face's apply_chat_template passes besides the conversation (tools and documents
  // as None unless `variables` has them: render() hands a template that writes tools the request's).
  jinja::Value context = jinja::Value::object();
  jinja::Object& c = context.object_ref();
  c.set("bos_token", jinja::Value(tokens_.bos));
  c.set("eos_token", jinja::Value(tokens_.eos));
  c.set("tools", jinja::Value(nullptr));
  c.set("documents", jinja::Value(nullptr));
  c.set("add_generation_prompt", jinja::Value(false));
  if (variables.is_object())
    for (const auto& [k, v] : variables.items()) c.set(k, jinja::Value::from_json(v));
  try {
    return jinja_->render(context);
  } catch (const jinja::Raised& e) {
    throw std::invalid_argument(one_line(std::string("the model's chat template refuses the conversation: ") + e.what()));
  } catch (const std::exception& e) {  // jinja::Error, or bad_alloc on an absurd template
    throw std::invalid_argument(one_line(std::string("the model's chat template fails on the conversation: ") + e.what()));
  }
}

std::string ChatTemplate::end_of_turn() const {
  switch (kind_) {
    case Kind::ChatML: return "<|im_end|>";
    case Kind::Llama3: return "<|eot_id|>";
    case Kind::Plain: break;
  }
  return {};
}

std::vector<std::string> ChatTemplate::end_of_turn_markers() const {
  std::vector<std::string> out;
  if (std::string e = end_of_turn(); !e.empty()) out.push_back(std::move(e));
  for (const std::string& m : markers_)
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  return out;
}

}  // namespace specula
