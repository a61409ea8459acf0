// The verifier of speculative decoding (Leviathan et al. 2023, Algorithm 1; docs/design.md section 1):
// given K draft tokens with their draft distributions q and the target's distributions p at K+1
// positions, decide how many draft tokens to keep and which target token to add.
//
// Names, used the same way everywhere in Specula:
//   p                 the target's distribution at a position, after the request's transform
//                     (temperature, top-k, top-p), as spec/sampling.h computes it
//   q                 the draft's distribution at that position, after the SAME transform
//   accepted tokens   t1..tn, the longest prefix of the draft that passed the test
//   recovered token   at the first rejection (n < k): a draw from the residual
//                     norm(max(0, p - q)) at that position (vLLM's "recovered" token)
//   bonus token       when every draft token passed (n == k): a draw from p at position k+1
// A round therefore always commits n + 1 tokens.
//
// Randomness is Philox keyed by (request seed, absolute position, stream) (spec/philox.h):
// RngStream::Accept for the acceptance uniform, RngStream::Residual for the recovered token,
// RngStream::Token for the bonus token, RngStream::Draft for the draft's own sampling.
//
// Block verification's randomness: the token rule's verdict at t_i reads t_1..t_i and their
// uniforms only, so the noise of positions past a rejection is never tied to the kept text, and a
// later round may draw at those positions again with the same keys. The block rule's verdict reads
// the whole round (every draft token and every uniform), so its uniforms and its draft's noise are
// keyed by the round instead: RngStream::BlockAccept at the position of the round's first draft
// token (index j - 1 for u_j) and RngStream::BlockDraft at block_draw_position(that position, i).
// Rounds of one request start at distinct positions (each keeps at least one token), so no round
// reuses another's. Keyed by position (as the token rule's were), the chi-square test of the
// first three tokens failed (tests/unit/spec/test_speculative_exactness.cpp).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "spec/sampling.h"

namespace specula {

// How sampled (temperature > 0) requests are verified. Greedy requests always use the greedy
// rule (accept while argmax p == t_i; the recovered / bonus token is argmax p).
enum class SpecSampling {
  // Rejection sampling: accept t_i with probability min(1, p(t_i)/q(t_i)), else draw from the
  // residual. The output has exactly the target's distribution; it accepts the most.
  Exact,
  // The draft samples with the same per-position Gumbel noise as the target-only sampler
  // (RngStream::Token); t_i is accepted exactly when it equals the target's own Gumbel-max
  // choice, which is also the recovered / bonus token. The text is then identical, token for
  // token, to target-only sample_token() with the same seed.
  Coupled,
  // Block verification (Sun et al. 2025): the round's draft judged as a whole (block_sample
  // below). The output has exactly the target's distribution, as with Exact, from the same q
  // rows; it keeps at least as many draft tokens on average (the same at k = 1, more from k = 2
  // when the draft and the target disagree). Judged on the host (a device that judges rounds
  // itself implements the token rule only: its logits come to the host for this mode).
  Block,
};
const char* spec_sampling_name(SpecSampling m);
// RngStream::BlockDraft's position for draft token i of the round whose first draft token sits at
// `start`: distinct for every (start, i) with i < kBlockDrawStride.
inline constexpr int64_t kBlockDrawStride = 64;
inline int64_t block_draw_position(int64_t start, int64_t i) { return start * kBlockDrawStride + i; }
// The rules that read the draft's q rows (exact and block; not coupled).
inline bool spec_sampling_reads_q(SpecSampling m) { return m != SpecSampling::Coupled; }
// "exact", "block" or "coupled"; throws std::invalid_argument naming the value otherwise.
SpecSampling parse_spec_sampling(std::string_view s);

// What a drafter hands the verifier for one sequence and one round.
struct DraftProposal {
  std::vector<int32_t> tokens;  // [k] t1..tk, proposed after the last committed token; k may be 0
  std::vector<float> q;         // [k, vocab] row i: the distribution t_{i+1} was drawn from, after
                                // the request's transform (one-hot for a deterministic drafter);
                                // or empty for a greedy or coupled request, whose rounds are judged
                                // by the tokens alone (DraftRequest::verdict_reads_q; the eagle and
                                // n-gram drafters leave it empty then)
  // [k] or empty: entry i is the product of the draft's probabilities of t1..t_{i+1}, the
  // confidence rule's running product (DraftConfidence), where a drafter ran the rule; the
  // automatic threshold calibrates itself on it (DraftLength::observe_confidence).
  std::vector<float> confidence;
  int64_t k() const { return static_cast<int64_t>(tokens.size()); }
  void clear() {
    tokens.clear();
    q.clear();
    confidence.clear();
  }
};

// The verdict on one round.
struct RoundOutcome {
  int accepted = 0;             // n, 0 <= n <= k: accepted draft tokens
  std::vector<int32_t> tokens;  // [n + 1] t1..tn, then the recovered token (n < k) or the bonus token (n == k)
  bool bonus = false;           // the last token is the bonus token (all k accepted)
};

// --- the rule, one position at a time (exact mode) -------------------------------------
// Accepts a draft token with probability min(1, p_t / q_t) given the uniform u in (0, 1):
// u * q_t < p_t. A token the draft gave no mass (q_t <= 0; impossible for a sampled token) is
// rejected, so a drafter bug can only shrink acceptance, never bias the output toward the draft.
bool accept_draft_token(double p_t, double q_t, double u);

// The acceptance uniform for the draft token at `position`.
double acceptance_uniform(uint64_t seed, int64_t position);

// The recovered token at `position`: Gumbel-max over log max(0, p - q) (RngStream::Residual),
// an exact draw from norm(max(0, p - q)). When the residual's mass is below kResidualFloor
// (p == q up to rounding, so a rejection was a rounding artefact) it draws from p instead.
inline constexpr double kResidualFloor = 1e-7;
int32_t sample_recovered(std::span<const float> p, std::span<const float> q, uint64_t seed, int64_t position);
// The same draw from norm(max(0, w p - q)) for a weight 0 < w <= 1 (the block rule's residual;
// w = 1 is the one above, to the bit).
int32_t sample_recovered(std::span<const float> p, std::span<const float> q, double w, uint64_t seed, int64_t position);

// --- one round ------------------------------------------------------------------------
// Exact speculative sampling over probabilities: draft [k], q [k, vocab], p [k+1, vocab];
// `position` is the absolute position of t1.
RoundOutcome speculative_sample(std::span<const int32_t> draft, std::span<const float> q, std::span<const float> p,
                                int64_t vocab, uint64_t seed, int64_t position);

// Block verification over probabilities (SpecSampling::Block): the same arguments; the draft kept
// is t1..t_tau for the largest tau whose joint test passes (speculative_sampling.cpp).
RoundOutcome block_sample(std::span<const int32_t> draft, std::span<const float> q, std::span<const float> p,
                          int64_t vocab, uint64_t seed, int64_t position);

// Greedy: accept while t_i == argmax p_i; the recovered / bonus token is argmax p.
// target_logits [k+1, vocab] (raw logits; argmax is unchanged by the transform).
RoundOutcome greedy_verify(std::span<const int32_t> draft, std::span<const float> target_logits, int64_t vocab);

// Coupled: y_i = the target's Gumbel-max choice at position + i - 1 (RngStream::Token, the
// draw sample_token() makes there); accept while t_i == y_i; the last token is y_{n+1}.
RoundOutcome coupled_verify(std::span<const int32_t> draft, std::span<const float> target_logits, int64_t vocab,
                            const SamplingParams& sp, int64_t position);

// The verifier: target_logits [k+1, vocab] from one target forward over [g, t1..tk]; applies
// the request's transform to each row and dispatches on greedy / exact / coupled.
RoundOutcome verify_draft(const DraftProposal& draft, std::span<const float> target_logits,
                          const SamplingParams& sp, int64_t position, SpecSampling mode);

// The same rule without the row after the last draft token: target_logits [k, vocab], k >= 1.
// Every draft token is judged; when all pass, no bonus token is drawn (accepted == k, tokens
// t1..tk). The pipeline's optimistic continuation judges its extra draft token this way against
// the previous round's last row, where the bonus token would otherwise have been drawn: this is
// the ordinary rule at that position, so the output keeps the target's distribution.
RoundOutcome verify_draft_without_bonus(const DraftProposal& draft, std::span<const float> target_logits,
                                        const SamplingParams& sp, int64_t position, SpecSampling mode);

}  // namespace specula
