// A reply's reasoning apart from its answer (see reasoning.h).
#include "model/reasoning.h"

#include "model/tool_calls.h"  // before_marker

namespace specula {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>", kSpace = " \t\n\r";

std::string_view without_leading_space(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpace);
  return b == std::string_view::npos ? std::string_view() : s.substr(b);
}

}  // namespace

ReasoningSplit split_reasoning(std::string_view text, bool open, bool final) {
  if (!open) {
    const std::string_view start = without_leading_space(text);
    if (start.starts_with(kOpen)) {
      text = start.substr(kOpen.size());
    } else if (!final && kOpen.starts_with(start)) {  // may still open one: nothing yet
      return {std::nullopt, std::string_view(), false};
    } else {
      return {std::nullopt, text, true};
    }
  }
  if (const size_t at = text.find(kClose); at != std::string_view::npos)
    return {text.substr(0, at), text.substr(at + kClose.size()), true};
  // (less an end that may begin </think>, until the end)
  return {text.substr(0, final ? text.size() : before_marker(text, kClose)), std::string_view(), false};
}

bool opens_reasoning(std::string_view prompt_end) {
  const size_t e = prompt_end.find_last_not_of(kSpace);
  return e != std::string_view::npos && prompt_end.substr(0, e + 1).ends_with(kOpen);
}

bool leaves_reasoning_open(std::string_view text) {
  const size_t open = text.rfind(kOpen);
  return open != std::string_view::npos && text.find(kClose, open) == std::string_view::npos;
}

}  // namespace specula
