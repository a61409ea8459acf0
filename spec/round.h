// The rules of a round that every generation path shares (the plain loop, the sequential
// speculative loop and the sampler actor): when a request is finished, and why. A change to the
// stop rule or to a finish reason is a change to this file and its .cpp alone.
#pragma once
#include <cstdint>
#include <ostream>
#include <span>
#include <string_view>

namespace specula {

enum class FinishReason : std::uint8_t {
  None,       // still running (or ended by an error, which is reported as an error)
  Stop,       // emitted a stop token, or its text completed a stop string
  Length,     // generated max_tokens
  Context,    // the next token would not fit in the model's context
  Cancelled,  // the caller stopped it (or the engine shut down)
};

// The one table of finish-reason names ("stop", "length", "context", "cancelled"; "" for None).
// The WebSocket protocol and the CLI print these; net/ maps them to the OpenAI wire spelling.
std::string_view finish_reason_name(FinishReason r);
inline std::ostream& operator<<(std::ostream& os, FinishReason r) {
  return os << (r == FinishReason::None ? std::string_view("none") : finish_reason_name(r));
}

// When a request ends. Checked after each committed token, in this order: a stop token or stop
// string, max_tokens, then the context (the token at `position` is the last one that fits when
// position + 1 reaches max_positions; 0 = unlimited). Cancellation is the caller's, not a rule.
struct FinishRule {
  std::span<const std::int32_t> stop_ids;
  std::int64_t max_tokens = 0;
  std::int64_t max_positions = 0;

  // `generated` counts the tokens so far including `token`, which sits at `position`;
  // `grammar_complete`: the request's grammar has ended after it (PenaltyHistory::constraint_complete).
  FinishReason after(std::int32_t token, std::int64_t generated, std::int64_t position,
                     bool completed_stop_string = false, bool grammar_complete = false) const;
};

}  // namespace specula
