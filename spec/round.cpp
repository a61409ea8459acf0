#include "spec/round.h"

#include <algorithm>

namespace specula {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None: return "";
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Context: return "context";
    case FinishReason::Cancelled: return "cancelled";
  }
  return "";
}

FinishReason FinishRule::after(std::int32_t token, std::int64_t generated, std::int64_t position,
                               bool completed_stop_string, bool grammar_complete) const {
  if (completed_stop_string || std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end())
    return FinishReason::Stop;
  if (generated >= max_tokens) return FinishReason::Length;
  if (max_positions > 0 && position + 1 >= max_positions) return FinishReason::Context;
  // Without stop tokens (ignore_eos) a grammar that has ended ends the text: no token may follow.
  if (grammar_complete && stop_ids.empty()) return FinishReason::Stop;
  return FinishReason::None;
}

}  // namespace specula
