// Prompts for the load: one JSON object a line, with "messages" (chat) or "prompt" (plain text),
// and optionally "id", "max_tokens" and "priority" (see ../shared/data/prompts/chat.jsonl).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::load {

struct Prompt {
  std::string id;                 // "id" of the line, else "line N"
  nlohmann::json messages;        // [{"role", "content"}, ...], or null when the line has "prompt"
  std::string prompt;             // the plain-text prompt when messages is null
  std::optional<int> max_tokens;  // the line's own "max_tokens"
  std::optional<int> priority;    // the line's own "priority", sent with its requests (specula serve
                                  // --scheduling-policy priority, vLLM's field)
};

// Throws std::runtime_error naming the file and line: missing file, bad JSON, neither
// "messages" nor "prompt", wrong field types, no prompts at all. Blank lines are skipped.
std::vector<Prompt> load_prompts(const std::string& path);

// The same checks on one parsed line (exposed for the tests).
Prompt parse_prompt_line(const nlohmann::json& line, const std::string& where);

}  // namespace specula::load
