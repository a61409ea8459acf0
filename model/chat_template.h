// Chat prompts: the model's own Jinja template run as written (model/jinja.h), or the built-in
// ChatML (SmolLM2) and Llama 3 formats where a model has none or it does not parse.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specula {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool" (a tool call's result)
  std::string content;
};

namespace jinja {
class Template;
}

// The texts a template may write as `bos_token` and `eos_token` (Hugging Face passes them).
struct SpecialTokens {
  std::string bos, eos;
};

class ChatTemplate {
 public:
  enum class Kind { ChatML, Llama3, Plain };
  ChatTemplate() = default;
  explicit ChatTemplate(Kind k, std::string default_system = {}) : kind_(k), default_system_(std::move(default_system)) {}
  // A Jinja chat template (GGUF tokenizer.chat_template or tokenizer_config.json): run as written
  // when it parses. `kind()` is the family recognised from its marker tokens (for the end-of-turn
  // token), and what renders when the template does not parse (`problem()` then says why);
  // ChatML's default system line is taken from the template text.
  static ChatTemplate from_template_text(const std::string& jinja, SpecialTokens tokens = {});
  // `--chat-template`: a built-in name (chatml, llama3, plain), a file holding a Jinja template,
  // or the template's text itself. Throws std::invalid_argument naming what is wrong, including
  // a template that does not parse.
  static ChatTemplate from_option(const std::string& spec, SpecialTokens tokens = {});

  // The prompt text, ending with the assistant header so generation continues as the assistant.
  // Throws std::invalid_argument for an unknown role, an empty conversation, or the template's
  // own refusal (raise_exception: "Conversation roles must alternate ...").
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // The Jinja template run with `variables` beyond the usual ones (bos_token, eos_token, tools and
  // documents as None), e.g. tools or messages carrying tool calls, as Hugging Face's
  // apply_chat_template passes them. std::invalid_argument as render(), or when no Jinja runs.
  std::string render_variables(const nlohmann::ordered_json& variables) const;
  Kind kind() const { return kind_; }
  bool runs_jinja() const { return jinja_ != nullptr; }
  // Why the model's Jinja template is not run ("" when it is, or there is none).
  const std::string& problem() const { return problem_; }
  // Text that ends an assistant turn (e.g. "<|im_end|>" or "<|eot_id|>").
  std::string end_of_turn() const;

 private:
  Kind kind_ = Kind::Plain;
  std::string default_system_;
  std::shared_ptr<const jinja::Template> jinja_;
  SpecialTokens tokens_;
  std::string problem_;
};

}  // namespace specula
