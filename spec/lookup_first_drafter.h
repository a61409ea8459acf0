// Prompt lookup in front of another drafter (`--draft ngram:n=N+eagle`): a round takes prompt
// lookup's proposal where the context's last tokens occur earlier in it, and the other drafter's
// otherwise. Copies, lists and code repeat their own context, and there lookup drafts long runs
// for nothing; elsewhere the trained head drafts. Which one drafts a round depends on the context
// alone, so the proposal is still a draw from a q fixed by the prefix, and the acceptance rule
// keeps the target's distribution exactly (docs/speculative.md, "Drafters").
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "spec/drafter.h"
#include "spec/ngram_drafter.h"

namespace specula {

class LookupFirstDrafter final : public Drafter {
 public:
  // `lookup` should require a match of a few tokens (min_n > 1): a one-token match is a guess the
  // other drafter usually beats. Throws std::invalid_argument for a null `other`.
  LookupFirstDrafter(NgramDrafter lookup, std::unique_ptr<Drafter> other);

  std::string name() const override { return lookup_.name() + "+" + other_->name(); }
  void prefill(std::span<const int32_t> context) override { other_->prefill(context); }
  void propose(const DraftRequest& req, DraftProposal& out) override;
  void rollback(int64_t length) override { other_->rollback(length); }
  bool wants_target_hidden() const override { return other_->wants_target_hidden(); }
  std::vector<int> target_feature_layers() const override { return other_->target_feature_layers(); }
  void target_hidden(int64_t first, std::span<const float> rows) override { other_->target_hidden(first, rows); }

  // Rounds drafted by each since construction (bench and tests read them).
  int64_t lookup_rounds() const { return lookup_rounds_; }
  int64_t other_rounds() const { return other_rounds_; }

 private:
  NgramDrafter lookup_;
  std::unique_ptr<Drafter> other_;
  int64_t lookup_rounds_ = 0, other_rounds_ = 0;
};

}  // namespace specula
