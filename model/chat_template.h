// Chat prompt formats: ChatML (SmolLM2) and Llama 3, chosen from the model's metadata.
#pragma once
#include <string>
#include <vector>

namespace specula {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool" (a tool call's result)
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { ChatML, Llama3, Plain };
  ChatTemplate() = default;
  explicit ChatTemplate(Kind k, std::string default_system = {}) : kind_(k), default_system_(std::move(default_system)) {}
  // Picks the format from a Jinja chat template string (GGUF tokenizer.chat_template or
  // tokenizer_config.json); ChatML's default system line is taken from the template when present.
  static ChatTemplate from_template_text(const std::string& jinja);

  // The prompt text, ending with the assistant header so generation continues as the assistant.
  // Throws std::invalid_argument for an unknown role or an empty conversation.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  Kind kind() const { return kind_; }
  // Text that ends an assistant turn (e.g. "<|im_end|>" or "<|eot_id|>").
  std::string end_of_turn() const;

 private:
  Kind kind_ = Kind::Plain;
  std::string default_system_;
};

}  // namespace specula
