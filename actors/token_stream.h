// What a request's token stream carries (sampler -> caller): one event per committed token, then
// one terminal event (done, with statistics and the finish reason, or an error).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "actors/mailbox.h"
#include "spec/speculative_generate.h"

namespace specula::actors {

using RequestId = std::uint64_t;

struct StreamEvent {
  enum class Kind { Token, Done, Error };
  Kind kind = Kind::Token;
  std::string text;            // Token: the text this token completes (may be empty mid-UTF-8);
                               // Done: whatever the detokenizer still held back
  int32_t token = -1;          // Token: the token id
  bool from_draft = false;     // Token: an accepted draft token (not the target's recovered / bonus one)
  FinishReason finish_reason = FinishReason::None;  // Done: why the request ended
  std::string error;           // Error: what failed, in one line
  SpeculativeStats stats;      // Done and Error: the request's statistics so far

  bool terminal() const { return kind != Kind::Token; }
};

// Many writers (the sampler, the scheduler for admission errors), one reader (the TokenStream).
using EventChannel = Mailbox<StreamEvent>;

}  // namespace specula::actors
