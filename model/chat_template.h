// Chat prompts: the model's own Jinja template run as written (model/jinja.h), or the built-in
// ChatML (SmolLM2) and Llama 3 formats where a model has none or it does not parse.
#pragma once
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace specula {

// A call an assistant made in an earlier turn (OpenAI's message.tool_calls[i]).
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON text (an object, as OpenAI sends it)
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role_, std::string content_) : role(std::move(role_)), content(std::move(content_)) {}
  std::string role;  // "system", "user", "assistant", "tool" (a tool call's result)
  std::string content;
  std::vector<ToolCall> tool_calls;  // assistant: the calls it made
  std::string tool_call_id;          // tool: the call this is the result of ("" when not given)
  std::string name;                  // tool: the function's name ("" when not given)
  // assistant: the reasoning it wrote before its content (OpenAI-style reasoning_content, which
  // reasoning models' templates such as Qwen3's read); none when not given
  std::optional<std::string> reasoning_content;
};

// How a model writes its tool calls, recognised from what its template makes of one
// (model/tool_calls.h parses a reply in it). Generic: none recognised; the server then uses
// llama.cpp's generic JSON format.
enum class ToolSyntax { Generic, Hermes, Llama3Json, Mistral };
const char* tool_syntax_name(ToolSyntax s);
// The syntax a name (hermes, llama3_json, mistral, generic) stands for; none for another name.
std::optional<ToolSyntax> tool_syntax_of(std::string_view name);
// `--tool-call-parser`'s value: auto (none: what the template writes) or a syntax's name.
// Throws std::invalid_argument naming the choices for another.
std::optional<ToolSyntax> tool_call_parser_of(std::string_view name);

namespace jinja {
class Template;
}

// How a conversation becomes a prompt beyond its messages: vLLM's chat request fields.
struct RenderOptions {
  // The prompt ends with the assistant's header, so that generation is the assistant's turn.
  bool add_generation_prompt = true;
  // The last message is left open (its end-of-turn and what follows cut off) so that generation
  // continues it: a prefill of the reply (Hugging Face's apply_chat_template does the cut). Goes
  // with add_generation_prompt false.
  bool continue_final_message = false;
  // OpenAI's tool list (render()'s `tools`); nullptr or null: none.
  const nlohmann::ordered_json* tools = nullptr;
  // chat_template_kwargs: more variables for a Jinja template (an object; e.g. Qwen3's
  // enable_thinking); nullptr: none. The built-in formats have no variables.
  const nlohmann::ordered_json* variables = nullptr;
};

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
  // `tools`: OpenAI's tool list, handed to a Jinja template that uses it (supports_tools()) as
  // Hugging Face's apply_chat_template(tools=...) does; nullptr or null: none. An assistant's
  // tool_calls go to a template that writes them (supports_tool_calls()) as OpenAI's objects with
  // their arguments parsed (Hugging Face's form); to any other format as the generic JSON
  // {"tool_calls": [{"name", "parameters"}]} after the message's text.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                     const nlohmann::ordered_json* tools = nullptr) const;
  // The same with every option. continue_final_message with add_generation_prompt, with a last
  // message without text, or where the template does not write the last message's text (so it
  // cannot be left open) throws std::invalid_argument saying so.
  std::string render(const std::vector<ChatMessage>& messages, const RenderOptions& options) const;
  // The Jinja template run with `variables` beyond the usual ones (bos_token, eos_token, tools and
  // documents as None), e.g. tools or messages carrying tool calls, as Hugging Face's
  // apply_chat_template passes them. std::invalid_argument as render(), or when no Jinja runs.
  std::string render_variables(const nlohmann::ordered_json& variables) const;
  Kind kind() const { return kind_; }
  bool runs_jinja() const { return jinja_ != nullptr; }
  // Why the model's Jinja template is not run ("" when it is, or there is none).
  const std::string& problem() const { return problem_; }
  // Text that ends an assistant turn in the built-in format (e.g. "<|im_end|>" or "<|eot_id|>").
  std::string end_of_turn() const;
  // Every end-of-turn marker this template writes: end_of_turn(), and the known markers (as
  // llama.cpp lists its end-of-generation tokens: Gemma's <end_of_turn>, Phi-3's <|end|>, Llama
  // 3.1's <|eom_id|>, ...) that the Jinja template's text holds. Generation stops at those that
  // are single tokens of the model (spec/generate.h, default_stop_ids).
  std::vector<std::string> end_of_turn_markers() const;
  // What the Jinja template does with tools, found at load by rendering a probe conversation (as
  // llama.cpp's --jinja does): whether it writes the `tools` it is given, whether it writes an
  // assistant's structured tool_calls, and the syntax it writes a call in.
  bool supports_tools() const { return supports_tools_; }
  bool supports_tool_calls() const { return supports_tool_calls_; }
  ToolSyntax tool_syntax() const { return tool_syntax_; }
  // The key a JSON call's arguments go under as the template writes them: "parameters" (Llama
  // 3.1's) or "arguments" (found by the probe, whatever the syntax, so that a syntax forced by
  // --tool-call-parser llama3_json keeps it; "parameters" where the probe did not say).
  const std::string& tool_arguments_key() const { return tool_arguments_key_; }
  // Whether tool_choice "auto" is served in the model's own syntax: the template writes tools,
  // and calls in a syntax model/tool_calls.h reads.
  bool reads_own_tool_calls() const { return supports_tools_ && tool_syntax_ != ToolSyntax::Generic; }
  // `--tool-call-parser NAME` (vLLM's option): "auto" keeps what the probe found, "generic" serves
  // tools in llama.cpp's generic format whatever the template writes (the template then gets
  // neither tools nor structured calls), a syntax's name reads calls in it. Throws
  // std::invalid_argument for another name (tool_call_parser_of), or a syntax with a template
  // that does not write tools (the model would never see them).
  void set_tool_call_parser(std::string_view name);
  // The Jinja template writes a reasoning block's end (</think>: DeepSeek R1, QwQ, Qwen3): its
  // model reasons before it answers, and the server reads the reasoning apart (model/reasoning.h).
  bool writes_reasoning() const { return writes_reasoning_; }

 private:
  Kind kind_ = Kind::Plain;
  std::string default_system_;
  std::shared_ptr<const jinja::Template> jinja_;
  SpecialTokens tokens_;
  std::string problem_;
  std::vector<std::string> markers_;  // the known end-of-turn markers in the Jinja template's text
  bool supports_tools_ = false;
  bool supports_tool_calls_ = false;
  ToolSyntax tool_syntax_ = ToolSyntax::Generic;
  std::string tool_arguments_key_ = "parameters";
  bool writes_reasoning_ = false;
  void probe_tools();
  // The Jinja template on a conversation: `tools` as they are (nullptr: None), an assistant's
  // calls as OpenAI's objects (structured_calls) or as the generic format's JSON in its text.
  // The built-in format's prompt (ChatML, Llama 3, plain); calls as the generic format's JSON.
  std::string render_builtin(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  std::string render_jinja(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                           const nlohmann::ordered_json* tools, bool structured_calls,
                           const nlohmann::ordered_json* variables = nullptr) const;
};

}  // namespace specula
