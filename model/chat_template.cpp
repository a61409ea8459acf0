// ChatML, Llama 3 and plain prompt rendering (see chat_template.h). The Jinja template itself is
// not executed; its kind is recognised from the marker tokens it writes.
#include "model/chat_template.h"

#include <stdexcept>
#include <string_view>

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

}  // namespace

ChatTemplate ChatTemplate::from_template_text(const std::string& jinja) {
  if (jinja.find("<|im_start|>") != std::string::npos) return ChatTemplate(Kind::ChatML, chatml_default_system(jinja));
  if (jinja.find("<|start_header_id|>") != std::string::npos) return ChatTemplate(Kind::Llama3);
  return ChatTemplate(Kind::Plain);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  check_messages(messages);
  std::string out;
  switch (kind_) {
    case Kind::ChatML:
      if (messages.front().role != "system" && !default_system_.empty()) {
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      }
      for (const ChatMessage& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case Kind::Llama3:
      out += "<|begin_of_text|>";
      for (const ChatMessage& m : messages) {
        // A tool's result is Llama 3.1's "ipython" turn.
        out += "<|start_header_id|>" + (m.role == "tool" ? std::string("ipython") : m.role) + "<|end_header_id|>\n\n";
        out += trim(m.content);
        out += "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case Kind::Plain:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i) out += '\n';
        out += messages[i].content;
      }
      break;
  }
  return out;
}

std::string ChatTemplate::end_of_turn() const {
  switch (kind_) {
    case Kind::ChatML: return "<|im_end|>";
    case Kind::Llama3: return "<|eot_id|>";
    case Kind::Plain: break;
  }
  return {};
}

}  // namespace specula
