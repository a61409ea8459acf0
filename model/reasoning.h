// A reply's reasoning apart from its answer: the text a reasoning model writes inside
// <think> ... </think> before it answers (DeepSeek R1 and its distillations, QwQ, Qwen3), read as
// vLLM's deepseek_r1 reasoning parser and llama.cpp's reasoning_format "deepseek" read it.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace specula {

struct ReasoningSplit {  // (views of the text split)
  std::optional<std::string_view> reasoning;  // the reasoning (so far); none when the reply has none
  std::string_view content;                   // the answer (so far): the text after </think>, or all of it
  bool answering = true;                      // false while (or, at the end, where) the reasoning never closed
};

// Splits a reply generated so far. `open`: the prompt opened the reasoning (it ends with <think>,
// as DeepSeek R1's template ends it), so the reply starts inside it; otherwise a reply opening
// with <think> (after whitespace) starts it. Until `final`, the end of the reasoning that may
// begin </think>, and a start of the reply that may still become <think>, are held back, so that
// a longer text's split extends a shorter one's (each part only grows). A reasoning that never
// closes is all reasoning at the end (a reply cut by max_tokens while it thinks), as vLLM's.
ReasoningSplit split_reasoning(std::string_view text, bool open, bool final);

// Whether a prompt ends inside an opened reasoning block: its text ends with <think> and whitespace.
bool opens_reasoning(std::string_view prompt_end);
// Whether a text leaves a reasoning block open: its last <think> is not closed after it (a
// prefilled reply, continue_final_message, that stops while it reasons).
bool leaves_reasoning_open(std::string_view text);

}  // namespace specula
