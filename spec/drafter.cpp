// What every drafter shares: how a draft token is drawn from q, and q's entropy.
#include "spec/drafter.h"

#include <cmath>

namespace specula {

int32_t draw_draft_token(std::span<const float> logq, const DraftRequest& req, int64_t i) {
  if (req.sampling.greedy()) return argmax(logq);
  const RngStream stream = req.mode == SpecSampling::Coupled ? RngStream::Token : RngStream::Draft;
  return sample_gumbel(logq, req.sampling.seed, req.position + i, stream);
}

double entropy_nats(std::span<const float> q) {
  double h = 0;
  for (float x : q)
    if (x > 0.0f) h -= static_cast<double>(x) * std::log(static_cast<double>(x));
  return h;
}

}  // namespace specula
