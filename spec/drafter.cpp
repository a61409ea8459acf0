// What every drafter shares: how a draft token is drawn from q, q's entropy, the confidence rule.
#include "spec/drafter.h"

#include <algorithm>
#include <cmath>

namespace specula {

DrawKey draft_draw_key(const DraftRequest& req, int64_t i) {
  switch (req.mode) {
    case SpecSampling::Coupled: return {req.position + i, RngStream::Token};
    case SpecSampling::Block: return {block_draw_position(req.position, i), RngStream::BlockDraft};
    default: return {req.position + i, RngStream::Draft};
  }
}

int32_t draw_draft_token(std::span<const float> logq, const DraftRequest& req, int64_t i) {
  if (req.sampling.greedy()) return argmax(logq);
  const DrawKey key = draft_draw_key(req, i);
  return sample_gumbel(logq, req.sampling.seed, key.position, key.stream);
}

bool draft_from_logits(std::span<const float> logits, const DraftRequest& req, int64_t i, std::vector<float>& q,
                       std::vector<float>& logq, int32_t& token, DraftConfidence& confidence) {
  const bool judge_entropy = req.max_entropy > 0 && i >= req.min_tokens;
  if (req.sampling.greedy()) {
    // q is one-hot at the argmax (entropy 0, probability 1), so the rules judge the untempered softmax.
    token = argmax(logits);
    if (judge_entropy || confidence.on()) {
      transform_to_probs(logits, SamplingParams{1.0f, 0, 1.0f, 0}, q);
      if (judge_entropy && entropy_nats(q) > req.max_entropy) return false;
      confidence.take(q[static_cast<size_t>(token)]);
    }
    q.assign(logits.size(), 0.0f);
    q[static_cast<size_t>(token)] = 1.0f;
    return true;
  }
  transform_logits(logits, req.sampling, logq);
  q.assign(logq.begin(), logq.end());
  probs_from_log(q);
  if (judge_entropy && entropy_nats(q) > req.max_entropy) return false;
  token = draw_draft_token(logq, req, i);
  confidence.take(q[static_cast<size_t>(token)]);
  return true;
}

PenaltyHistory* DraftPenalties::sync(const DraftRequest& req, int64_t vocab) {
  end_round();
  if (!req.sampling.penalized()) {
    history_.reset();
    output_.clear();
    return nullptr;
  }
  const size_t P = std::min(req.context.size(), static_cast<size_t>(std::max<int64_t>(0, req.prompt_tokens)));
  const std::span<const int32_t> prompt = req.context.first(P), output = req.context.subspan(P);
  if (!history_ || history_->vocab() != vocab || !history_->made_for(req.sampling, prompt, req.stop_ids)) {
    history_.emplace(req.sampling, prompt, vocab, req.stop_ids);
    output_.clear();
  }
  size_t common = 0;
  while (common < output_.size() && common < output.size() && output_[common] == output[common]) ++common;
  while (output_.size() > common) {
    history_->pop(output_.back());
    output_.pop_back();
  }
  for (size_t i = common; i < output.size(); ++i) {
    history_->push(output[i]);
    output_.push_back(output[i]);
  }
  return &*history_;
}

void DraftPenalties::push_draft(int32_t token) {
  if (!history_) return;
  history_->push(token);
  drafts_.push_back(token);
}

void DraftPenalties::end_round() {
  if (history_)
    for (auto it = drafts_.rbegin(); it != drafts_.rend(); ++it) history_->pop(*it);
  drafts_.clear();
}

double entropy_nats(std::span<const float> q) {
  double h = 0;
  for (float x : q)
    if (x > 0.0f) h -= static_cast<double>(x) * std::log(static_cast<double>(x));
  return h;
}

}  // namespace specula
