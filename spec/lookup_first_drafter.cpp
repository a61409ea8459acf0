// Prompt lookup in front of another drafter: lookup's proposal where it has one, else the other's.
#include "spec/lookup_first_drafter.h"

#include <stdexcept>

namespace specula {

LookupFirstDrafter::LookupFirstDrafter(NgramDrafter lookup, std::unique_ptr<Drafter> other)
    : lookup_(std::move(lookup)), other_(std::move(other)) {
  if (!other_) throw std::invalid_argument("prompt lookup needs a drafter behind it (got none)");
}

void LookupFirstDrafter::propose(const DraftRequest& req, DraftProposal& out) {
  lookup_.propose(req, out);
  if (out.k() > 0) {
    ++lookup_rounds_;
    return;
  }
  other_->propose(req, out);
  if (out.k() > 0) ++other_rounds_;
}

}  // namespace specula
