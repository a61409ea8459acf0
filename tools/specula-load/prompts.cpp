#include "tools/specula-load/prompts.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace specula::load {

Prompt parse_prompt_line(const nlohmann::json& j, const std::string& where) {
  auto fail = [&](const std::string& what) { throw std::runtime_error(where + ": " + what); };
  if (!j.is_object()) fail("expected a JSON object");
  Prompt p;
  p.id = where;
  if (j.contains("id")) {
    const auto& id = j["id"];
    if (id.is_string()) p.id = id.get<std::string>();
    else if (id.is_number_integer()) p.id = std::to_string(id.get<long long>());
    else fail("\"id\" must be a string or an integer");
  }
  if (j.contains("messages")) {
    const auto& m = j["messages"];
    if (!m.is_array() || m.empty()) fail("\"messages\" must be a non-empty array");
    for (const auto& msg : m) {
      if (!msg.is_object() || !msg.contains("role") || !msg["role"].is_string() || !msg.contains("content") ||
          !msg["content"].is_string())
        fail("each message needs string \"role\" and \"content\"");
    }
    p.messages = m;
  } else if (j.contains("prompt")) {
    if (!j["prompt"].is_string()) fail("\"prompt\" must be a string");
    p.prompt = j["prompt"].get<std::string>();
  } else {
    fail("neither \"messages\" nor \"prompt\"");
  }
  if (j.contains("max_tokens")) {
    if (!j["max_tokens"].is_number_integer() || j["max_tokens"].get<long long>() < 1) fail("\"max_tokens\" must be a positive integer");
    p.max_tokens = j["max_tokens"].get<int>();
  }
  if (j.contains("priority")) {
    const auto& v = j["priority"];
    if (!v.is_number_integer() || v.get<long long>() < INT32_MIN || v.get<long long>() > INT32_MAX)
      fail("\"priority\" must be an integer");
    p.priority = v.get<int>();
  }
  return p;
}

std::vector<Prompt> load_prompts(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw std::runtime_error("prompts file '" + path + "' is a folder");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open prompts file '" + path + "'");
  std::vector<Prompt> prompts;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(n);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      throw std::runtime_error(where + ": not JSON (" + std::string(e.what()) + ")");
    }
    prompts.push_back(parse_prompt_line(j, where));
  }
  if (prompts.empty()) throw std::runtime_error("prompts file '" + path + "' has no prompts");
  return prompts;
}

}  // namespace specula::load
