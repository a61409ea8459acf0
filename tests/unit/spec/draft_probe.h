// One draft token, as the tests that compare a drafter's first q row read it: temperature 1 (q is
// the softmax of the draft's logits), the context's next position, the given seed.
#pragma once
#include <cstdint>
#include <span>

#include "spec/drafter.h"

namespace specula::test {

inline DraftProposal propose_one(Drafter& d, std::span<const int32_t> context, uint64_t seed = 0) {
  DraftRequest req;
  req.context = context;
  req.position = static_cast<int64_t>(context.size());
  req.max_tokens = 1;
  req.sampling = SamplingParams{1.0f, 0, 1.0f, seed};
  DraftProposal out;
  d.propose(req, out);
  return out;
}

}  // namespace specula::test
