// Prompt-lookup drafting: find the last few tokens earlier in the prompt + output and propose
// what followed them. No model, and no state but a constrained request's history; q is one-hot,
// which the acceptance rule handles exactly (no q rows where the verdict does not read them:
// DraftRequest::verdict_reads_q).
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "spec/drafter.h"

namespace specula {

class NgramDrafter final : public Drafter {
 public:
  // Matches the last n tokens for n = max_n down to min_n (1 <= min_n <= max_n <= 16); `vocab`
  // is the width of the q rows. Throws std::invalid_argument for a bad max_n, min_n or vocab.
  NgramDrafter(int64_t vocab, int max_n = 3, int min_n = 1);

  std::string name() const override {
    return "ngram:n=" + std::to_string(max_n_) + (min_n_ > 1 ? ",min=" + std::to_string(min_n_) : "");
  }
  void propose(const DraftRequest& req, DraftProposal& out) override;
  void rollback(int64_t) override {}

  // Where the continuation starts: the index after the most recent earlier occurrence of the
  // context's last n tokens (the longest n >= min_n that occurs), or -1 when none does. The
  // proposal is what follows there, read on periodically past the context's end.
  static int64_t find_continuation(std::span<const int32_t> context, int max_n, int min_n = 1);

 private:
  int64_t vocab_;
  int max_n_, min_n_;
  DraftPenalties constraint_;  // JSON mode or a grammar: the proposal ends where it would leave it
};

}  // namespace specula
