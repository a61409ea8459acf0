// Plain (target-only) autoregressive generation: prefill, then one token per step.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpu/llama.h"
#include "spec/round.h"
#include "spec/sampling.h"

namespace specula {

struct GenerateRequest {
  std::vector<int32_t> prompt;      // tokens appended after what `seq` already caches
  int max_tokens = 256;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;    // generation ends after emitting one of these

  // min_tokens (sampling) at most max_tokens; std::invalid_argument naming both otherwise.
  void check_min_tokens() const {
    if (sampling.min_tokens > max_tokens)
      throw std::invalid_argument("min_tokens (" + std::to_string(sampling.min_tokens) + ") must be at most max_tokens (" +
                                  std::to_string(max_tokens) + ")");
  }
  // spec/round.h's rule for this request in a context of `max_positions` (0 = unlimited).
  FinishRule finish_rule(int64_t max_positions) const { return {stop_ids, max_tokens, max_positions}; }
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of them, those whose K/V the engine's prefix cache held
  int64_t generated = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;        // from the first sampled token to the last
  FinishReason finish_reason = FinishReason::None;
  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  double decode_tokens_per_second() const {
    return decode_seconds > 0 && generated > 1 ? (generated - 1) / decode_seconds : 0;
  }
};

// Called with each new token; return false to stop (FinishReason::Cancelled).
using TokenCallback = std::function<bool(int32_t token)>;

// Feeds the prompt into `seq` of `kv` and samples up to max_tokens tokens. Each token is drawn
// with the sampler keyed by the position it will occupy, so a seeded request always gives the
// same text. The last sampled token is not fed (the KV holds prompt + generated[0..n-1)).
GenerateStats generate(LlamaModel& model, KvCache& kv, int seq, const GenerateRequest& req, const TokenCallback& on_token);

// The model's own end tokens: config EOS ids (with GGUF's EOT and EOM ids), the tokenizer's,
// and the chat template's end-of-turn markers that are single tokens (and `chat`'s too when
// given: a --chat-template).
std::vector<int32_t> default_stop_ids(const LoadedModel& m, const ChatTemplate* chat = nullptr);

}  // namespace specula
