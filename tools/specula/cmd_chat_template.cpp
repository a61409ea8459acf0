// `specula chat-template`: the prompt text a chat template makes of a conversation, as the
// server renders it. For checking a model's template or a --chat-template before serving, and
// the oracle of tests/oracle/test_chat_templates.py (JSON lines in and out, against Jinja2).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "tools/specula/args.h"
#include "tools/specula/commands.h"
#include "tools/specula/common.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula chat-template [--model PATH] [--chat-template NAME|FILE|TEXT] [--bos TEXT] [--eos TEXT]\n"
    "                             (--messages JSON [--tools JSON] [--no-generation-prompt] [--continue-final-message]\n"
    "                              [--kwargs JSON] | --input IN.jsonl --output OUT.jsonl)\n"
    "  Prints the prompt text the model's chat template makes of a conversation.\n"
    "  --chat-template: chatml, llama3 or plain (the built-in formats), a file holding a Jinja\n"
    "      template, or the template's text; as `serve --chat-template`. Without --model it is\n"
    "      rendered alone, its bos_token and eos_token from --bos and --eos (default empty).\n"
    "  --messages: a JSON array of OpenAI's messages ({\"role\", \"content\"}, an assistant's tool_calls, a\n"
    "      tool's tool_call_id); the prompt text goes to stdout as is.\n"
    "  --tools: OpenAI's tool list, handed to a template that writes tools, as the server hands it for\n"
    "      tool_choice \"required\", a named function, and \"auto\" where it reads the template's call\n"
    "      syntax (the template's tool support and call syntax go to stderr).\n"
    "  --no-generation-prompt, --continue-final-message, --kwargs: the chat request's add_generation_prompt\n"
    "      false, continue_final_message true (the last message left open, to be continued; it implies\n"
    "      --no-generation-prompt) and chat_template_kwargs (a JSON object of more template variables).\n"
    "  --input/--output: JSON lines {\"messages\": [...], \"tools\": [...], \"add_generation_prompt\": true,\n"
    "      \"continue_final_message\": false, \"chat_template_kwargs\": {...}} in,\n"
    "      {\"text\": \"...\"} or {\"error\": \"...\"} out (one per line); a line with \"variables\": {...}\n"
    "      runs the Jinja template on those (messages with tool calls, tools, ...) as they stand.\n";

const std::string* string_at(const nlohmann::ordered_json& o, const char* key) {
  const auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
}

// OpenAI's messages: {"role", "content"}, an assistant's "tool_calls" ([{"id", "function": {"name",
// "arguments": JSON text}}], content then null or left out), a tool's "tool_call_id" and "name".
std::vector<ChatMessage> messages_of(const nlohmann::ordered_json& j) {
  if (!j.is_array()) throw std::invalid_argument("messages must be a JSON array");
  std::vector<ChatMessage> out;
  for (const auto& m : j) {
    const std::string* role = m.is_object() ? string_at(m, "role") : nullptr;
    const std::string* content = role ? string_at(m, "content") : nullptr;
    const auto calls = role ? m.find("tool_calls") : m.end();
    const bool has_calls = role && calls != m.end() && !calls->is_null();
    if (!role || !(content || (has_calls && (!m.contains("content") || m["content"].is_null()))))
      throw std::invalid_argument("each message must be {\"role\": string, \"content\": string} (or an assistant's tool_calls)");
    ChatMessage msg(*role, content ? *content : std::string());
    if (has_calls) {
      if (!calls->is_array()) throw std::invalid_argument("tool_calls must be an array");
      for (const auto& c : *calls) {
        const auto fn = c.is_object() ? c.find("function") : c.end();
        const std::string* name = fn != c.end() && fn->is_object() ? string_at(*fn, "name") : nullptr;
        const std::string* args = name ? string_at(*fn, "arguments") : nullptr;
        if (!args) throw std::invalid_argument("tool_calls items must be {\"function\": {\"name\": string, \"arguments\": string}}");
        const std::string* id = string_at(c, "id");
        msg.tool_calls.push_back({id ? *id : "", *name, *args});
      }
    }
    if (const std::string* reasoning = *role == "assistant" ? string_at(m, "reasoning_content") : nullptr)
      msg.reasoning_content = *reasoning;
    if (*role == "tool") {  // as the server takes them
      if (const std::string* id = string_at(m, "tool_call_id")) msg.tool_call_id = *id;
      if (const std::string* name = string_at(m, "name")) msg.name = *name;
    }
    out.push_back(std::move(msg));
  }
  return out;
}

nlohmann::ordered_json json_arg(const Args& a, const char* name) {
  try {
    return nlohmann::ordered_json::parse(a.str(name));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("--") + name + " is not JSON: " + e.what());
  }
}

}  // namespace

int cmd_chat_template(int argc, char** argv) {
  Args a(argc, argv, {"model", "chat-template", "bos", "eos", "messages", "tools", "kwargs", "input", "output"},
         {"no-generation-prompt", "continue-final-message"});
  if (a.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (a.has("messages") == a.has("input")) throw UsageError("give exactly one of --messages and --input");
  if (a.has("input") != a.has("output")) throw UsageError("--input and --output go together");
  ChatTemplate t;
  if (a.has("model") || !a.has("chat-template")) {
    if (a.has("bos") || a.has("eos")) throw UsageError("--bos and --eos are for a --chat-template without --model");
    t = load_model_from_args(a).chat_template;
  } else {
    try {
      t = ChatTemplate::from_option(a.str("chat-template"), SpecialTokens{a.str("bos"), a.str("eos")});
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--chat-template: ") + e.what());
    }
  }
  for (const char* name : {"tools", "kwargs", "no-generation-prompt", "continue-final-message"})
    if (a.has(name) && !a.has("messages")) throw UsageError(std::string("--") + name + " goes with --messages");
  if (a.has("messages")) {
    const nlohmann::ordered_json j = json_arg(a, "messages");
    const nlohmann::ordered_json tools = a.has("tools") ? json_arg(a, "tools") : nlohmann::ordered_json();
    if (!tools.is_null() && !tools.is_array()) throw UsageError("--tools must be a JSON array of tools");
    if (a.has("tools"))
      std::cerr << "chat template: " << (t.supports_tools() ? "writes tools" : "does not write tools") << ", "
                << (t.supports_tool_calls() ? "writes tool calls" : "tool calls as the generic format's JSON")
                << ", call syntax " << tool_syntax_name(t.tool_syntax()) << "\n";
    std::vector<ChatMessage> msgs;
    try {
      msgs = messages_of(j);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--messages: ") + e.what());
    }
    const nlohmann::ordered_json kwargs = a.has("kwargs") ? json_arg(a, "kwargs") : nlohmann::ordered_json();
    if (!kwargs.is_null() && !kwargs.is_object()) throw UsageError("--kwargs must be a JSON object of template variables");
    const bool open = a.flag("continue-final-message");
    std::cout << t.render(msgs, RenderOptions{!a.flag("no-generation-prompt") && !open, open, &tools, &kwargs});
    return 0;
  }
  std::ifstream in(a.str("input"), std::ios::binary);
  if (!in) throw std::runtime_error("cannot open --input '" + a.str("input") + "': " + std::strerror(errno));
  std::ofstream out(a.str("output"), std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot create --output '" + a.str("output") + "': " + std::strerror(errno));
  size_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::ordered_json result;
    try {
      const nlohmann::ordered_json j = nlohmann::ordered_json::parse(line);
      const bool gen = j.value("add_generation_prompt", true);
      if (j.contains("variables")) {  // the Jinja template run on these variables as they stand
        result["text"] = t.render_variables(j["variables"]);
      } else {
        const nlohmann::ordered_json tools = j.value("tools", nlohmann::ordered_json());
        const nlohmann::ordered_json kwargs = j.value("chat_template_kwargs", nlohmann::ordered_json());
        if (!kwargs.is_null() && !kwargs.is_object()) throw std::invalid_argument("chat_template_kwargs must be a JSON object");
        result["text"] = t.render(messages_of(j.at("messages")),
                                  RenderOptions{gen, j.value("continue_final_message", false), &tools, &kwargs});
      }
    } catch (const nlohmann::json::exception& e) {
      throw std::runtime_error("--input line " + std::to_string(line_no) + ": " + e.what());
    } catch (const std::invalid_argument& e) {
      result["error"] = e.what();
    }
    out << result.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  }
  return 0;
}

}  // namespace specula::cli
