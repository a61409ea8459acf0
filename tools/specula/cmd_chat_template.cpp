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
    "                             (--messages JSON [--no-generation-prompt] | --input IN.jsonl --output OUT.jsonl)\n"
    "  Prints the prompt text the model's chat template makes of a conversation.\n"
    "  --chat-template: chatml, llama3 or plain (the built-in formats), a file holding a Jinja\n"
    "      template, or the template's text; as `serve --chat-template`. Without --model it is\n"
    "      rendered alone, its bos_token and eos_token from --bos and --eos (default empty).\n"
    "  --messages: a JSON array of {\"role\", \"content\"}; the prompt text goes to stdout as is.\n"
    "  --input/--output: JSON lines {\"messages\": [...], \"add_generation_prompt\": true} in,\n"
    "      {\"text\": \"...\"} or {\"error\": \"...\"} out (one per line); a line with \"variables\": {...}\n"
    "      runs the Jinja template on those (messages with tool calls, tools, ...) as they stand.\n";

std::vector<ChatMessage> messages_of(const nlohmann::ordered_json& j) {
  if (!j.is_array()) throw std::invalid_argument("messages must be a JSON array");
  std::vector<ChatMessage> out;
  for (const auto& m : j) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") || !m["content"].is_string())
      throw std::invalid_argument("each message must be {\"role\": string, \"content\": string}");
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return out;
}

}  // namespace

int cmd_chat_template(int argc, char** argv) {
  Args a(argc, argv, {"model", "chat-template", "bos", "eos", "messages", "input", "output"}, {"no-generation-prompt"});
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
  if (a.has("messages")) {
    nlohmann::ordered_json j;
    try {
      j = nlohmann::ordered_json::parse(a.str("messages"));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(std::string("--messages is not JSON: ") + e.what());
    }
    std::vector<ChatMessage> msgs;
    try {
      msgs = messages_of(j);
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--messages: ") + e.what());
    }
    std::cout << t.render(msgs, !a.flag("no-generation-prompt"));
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
        result["text"] = t.render(messages_of(j.at("messages")), gen);
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
