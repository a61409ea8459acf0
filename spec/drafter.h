// Drafters: whatever proposes the next few tokens of a sequence (a smaller model, prompt lookup,
// the target with layers skipped), behind one interface the speculative loop drives.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "spec/penalties.h"
#include "spec/sampling.h"
#include "spec/speculative_sampling.h"

namespace specula {

// What the loop asks of a drafter in one round.
struct DraftRequest {
  std::span<const int32_t> context;  // the request's tokens so far: prompt + committed output; the last is g
  int64_t position = 0;              // absolute position of t1 (the RNG key of the first draft token)
  int max_tokens = 1;                // K for this round; propose at most this many (>= 0)
  int min_tokens = 1;                // the entropy and confidence rules never stop a draft shorter than this
  float max_entropy = 0;             // stop once H(q_i) in nats exceeds this (0 = off)
  float min_confidence = 0;          // draft no further once the product of the tokens' draft probabilities is below this (0 = off)
  SamplingParams sampling;           // the request's transform, applied to q as the verifier applies it to p
  int64_t prompt_tokens = 0;         // context[0, prompt_tokens) is the prompt, the rest the output (penalties)
  std::span<const int32_t> stop_ids; // the request's stop tokens (held back until sampling.min_tokens)
  SpecSampling mode = SpecSampling::Exact;  // how t_i is drawn when sampling: draft_draw_key

  // Whether the verdict on this request's rounds reads q: only exact and block sampling do (greedy
  // and coupled rounds are judged by the tokens alone), so drafters may leave q empty otherwise.
  bool verdict_reads_q() const { return !sampling.greedy() && spec_sampling_reads_q(mode); }
};

// Where the noise that draws the round's draft token i (0-based) comes from: exact, at t_i's
// position with RngStream::Draft; coupled, the target's own (RngStream::Token); block, fresh for
// every round (RngStream::BlockDraft at block_draw_position(req.position, i)), because the block
// rule's verdict reads every draft token of the round, so noise a later round drew again at the
// same positions would be tied to the text already kept.
struct DrawKey {
  int64_t position;
  RngStream stream;
};
DrawKey draft_draw_key(const DraftRequest& req, int64_t i);

// The request's penalties and logit bias as a drafter applies them to its own rows, so that its
// drafts follow the adjusted target (spec/penalties.h). Exactness never depends on it: any q is
// judged exactly; a draft that ignores the penalties is only accepted less. The history follows
// the contexts propose() is handed (an optimistic context may be cut back the round after) and the
// round's own drafts, pushed as they are made and taken out by end_round().
class DraftPenalties {
 public:
  // Brings the history to req's context; null when the request has no penalties.
  PenaltyHistory* sync(const DraftRequest& req, int64_t vocab);
  void push_draft(int32_t token);
  void end_round();

 private:
  std::optional<PenaltyHistory> history_;
  std::vector<int32_t> output_;  // the output tokens pushed, in order
  std::vector<int32_t> drafts_;  // this round's
};

// Thread-safety: none; one owner (the loop or the draft actor) drives it.
class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string name() const = 0;
  // Start of a request whose context is `context` (a stateful drafter fills its cache now, so
  // the time counts as prefill, not drafting). Optional: propose() catches up on its own.
  virtual void prefill(std::span<const int32_t> context) {}
  // Proposes up to req.max_tokens tokens continuing req.context, each with its q row
  // (full vocabulary, after req.sampling's transform; left out where !req.verdict_reads_q(),
  // DraftProposal::q). `out` is overwritten.
  virtual void propose(const DraftRequest& req, DraftProposal& out) = 0;
  // The first `length` tokens of the context are settled and agree with what the drafter was
  // shown or proposed; forget everything after them (a model drafter truncates its cache).
  virtual void rollback(int64_t length) = 0;
  // A drafter that reads the target's final hidden states (the trained head, spec/eagle_drafter.h)
  // says so; the loop then hands it the rows of settled positions: rows [n, hidden] (after the
  // final norm, as LlamaModel::last_hidden gives them) of context indices first..first+n-1, the
  // prompt's at prefill and each verify forward's committed ones (g and the accepted tokens).
  // The rows are LlamaModel::last_hidden's with the target's feature layers set to
  // target_feature_layers() (final hidden state, then those layers' normed residuals).
  virtual bool wants_target_hidden() const { return false; }
  virtual std::vector<int> target_feature_layers() const { return {}; }
  virtual void target_hidden(int64_t first, std::span<const float> rows) {}
};

// The confidence rule over one proposal: the product of the draft's probabilities of the tokens
// proposed so far (for greedy params, of the untempered softmax: q itself is one-hot), the
// draft's own estimate that all of them are right. Token i >= req.min_tokens is drafted only
// while the product over the tokens before it is at least req.min_confidence. The decision to
// draft token i never looks at token i itself: dropping a drawn token for its own probability
// would make the proposal's distribution differ from the q the verifier is given (the chi-square
// test catches that), while stopping on what was already drawn keeps every token a draw from q.
// Each product taken goes to `products` as well, when given (the proposal's confidence row).
class DraftConfidence {
 public:
  explicit DraftConfidence(const DraftRequest& req, std::vector<float>* products = nullptr)
      : threshold_(req.min_confidence), min_tokens_(req.min_tokens), products_(products) {}
  bool on() const { return threshold_ > 0; }
  // The token just proposed had draft probability p.
  void take(double p) {
    product_ *= p;
    if (products_) products_->push_back(static_cast<float>(product_));
  }
  // Whether token i is drafted (the drafter need not compute it otherwise).
  bool may_reach(int64_t i) const { return !(on() && i >= min_tokens_ && product_ < threshold_); }

 private:
  double threshold_;
  int64_t min_tokens_;
  std::vector<float>* products_;
  double product_ = 1;
};

// The draft token at req.position + i drawn from q_i = exp(logq): greedy params -> argmax,
// coupled -> Gumbel-max with RngStream::Token (the target-only sampler's noise), exact ->
// Gumbel-max with RngStream::Draft.
int32_t draw_draft_token(std::span<const float> logq, const DraftRequest& req, int64_t i);

// Draft token i of a round from a logits row over the vocabulary: q = the request's transform of
// the logits (one-hot at the argmax for greedy params) and the token drawn from it. False (no
// token) when the entropy rule stops the draft here: i >= req.min_tokens and H(q) > max_entropy
// (for greedy params, H of the untempered softmax). The token's probability goes to `confidence`.
bool draft_from_logits(std::span<const float> logits, const DraftRequest& req, int64_t i, std::vector<float>& q,
                       std::vector<float>& logq, int32_t& token, DraftConfidence& confidence);

// Shannon entropy in nats of a probability vector.
double entropy_nats(std::span<const float> q);

}  // namespace specula
