// Prompt lookup (Saxena 2023; vLLM's n-gram proposer): the continuation of the most recent
// earlier match of the context's suffix.
#include "spec/ngram_drafter.h"

#include <algorithm>
#include <stdexcept>

namespace specula {

NgramDrafter::NgramDrafter(int64_t vocab, int max_n, int min_n) : vocab_(vocab), max_n_(max_n), min_n_(min_n) {
  if (max_n < 1 || max_n > 16) throw std::invalid_argument("ngram n must be between 1 and 16, got " + std::to_string(max_n));
  if (min_n < 1 || min_n > max_n)
    throw std::invalid_argument("ngram min must be between 1 and n = " + std::to_string(max_n) + ", got " + std::to_string(min_n));
  if (vocab < 1) throw std::invalid_argument("ngram drafter: vocabulary of " + std::to_string(vocab));
}

int64_t NgramDrafter::find_continuation(std::span<const int32_t> context, int max_n, int min_n) {
  const int64_t len = static_cast<int64_t>(context.size());
  for (int64_t n = std::min<int64_t>(max_n, len - 1); n >= std::max(1, min_n); --n) {
    const auto suffix = context.subspan(static_cast<size_t>(len - n));
    // Most recent first: start j < len - n, so the match is not the suffix itself.
    for (int64_t j = len - n - 1; j >= 0; --j)
      if (std::equal(suffix.begin(), suffix.end(), context.begin() + j)) return j + n;
  }
  return -1;
}

void NgramDrafter::propose(const DraftRequest& req, DraftProposal& out) {
  out.clear();
  const int64_t start = find_continuation(req.context, max_n_, min_n_);
  if (start < 0) return;
  const int64_t len = static_cast<int64_t>(req.context.size());
  // Under JSON mode, a grammar, allowed_token_ids or bad_words the verifier masks each row after
  // the drafts before it, so a token the constraint refuses there is never accepted: the proposal
  // ends before it (a function of the context alone, so q stays one-hot at the token proposed).
  PenaltyHistory* constraint = nullptr;
  if (req.sampling.masks_tokens()) {
    constraint = constraint_.sync(req, vocab_);
    if (constraint && !constraint->constrained()) constraint = nullptr;
  }
  for (int64_t i = 0; i < req.max_tokens; ++i) {
    // Past the context's end the proposal continues periodically (from its own tokens), so a
    // repeating span yields a full draft rather than the few tokens before the end.
    const int64_t s = start + i;
    const int32_t t = s < len ? req.context[static_cast<size_t>(s)] : out.tokens[static_cast<size_t>(s - len)];
    if (t < 0 || t >= vocab_) break;
    if (constraint) {
      if (!constraint->constraint_keeps(t)) break;
      constraint_.push_draft(t);
    }
    out.tokens.push_back(t);
    if (!req.verdict_reads_q()) continue;  // no q rows where the verdict does not read them
    out.q.resize(out.q.size() + static_cast<size_t>(vocab_), 0.0f);
    out.q[out.q.size() - static_cast<size_t>(vocab_) + static_cast<size_t>(t)] = 1.0f;  // one-hot
  }
}

}  // namespace specula
