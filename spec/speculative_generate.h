// The sequential speculative loop: draft, verify in one target forward, accept, roll back.
// It is the reference (oracle) for the actor pipeline and mirrors spec/generate.h's generate().
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "gpu/llama.h"
#include "spec/adaptive_k.h"
#include "spec/drafter.h"
#include "spec/generate.h"
#include "spec/penalties.h"
#include "spec/speculative_sampling.h"

namespace specula {

struct SpeculativeRequest : GenerateRequest {
  DraftLengthConfig draft;                    // K per round (fixed or adaptive), entropy cut-off
  SpecSampling mode = SpecSampling::Exact;    // ignored for greedy sampling params
};

// Where a committed token came from (see spec/speculative_sampling.h for the names).
enum class TokenOrigin {
  Accepted,   // a draft token that passed the test
  Recovered,  // the target's token at the first rejection
  Bonus,      // the target's token after all k draft tokens passed (or a round with no draft)
};
inline bool from_draft(TokenOrigin o) { return o == TokenOrigin::Accepted; }

struct SpeculativeStats : GenerateStats {
  int64_t rounds = 0;     // target verify forwards
  int64_t drafted = 0;    // draft tokens proposed
  int64_t accepted = 0;   // draft tokens accepted
  int64_t rejected = 0;   // rounds that ended at a rejection
  // [kMaxDraftTokens] index i: rounds with a draft token at position i+1 / rounds whose first
  // i+1 draft tokens were all accepted (vLLM's per-position acceptance counts)
  std::vector<int64_t> drafted_at = std::vector<int64_t>(kMaxDraftTokens, 0);
  std::vector<int64_t> accepted_at = std::vector<int64_t>(kMaxDraftTokens, 0);
  double draft_seconds = 0;   // in Drafter::propose (prefill excluded)
  double verify_seconds = 0;  // the target forward over [g, t1..tk] plus the acceptance rule
  // [kMaxDraftTokens + 1] index k: rounds that verified k draft tokens (k + 1 rows) and their
  // verify seconds, so a benchmark can price each round size as the loop ran it.
  std::vector<int64_t> rounds_by_draft = std::vector<int64_t>(kMaxDraftTokens + 1, 0);
  std::vector<double> verify_seconds_by_draft = std::vector<double>(kMaxDraftTokens + 1, 0);
  // The confidence rule's thresholds over the rounds that drafted with it on (with
  // `--draft-confidence auto` they change round by round): their sum and count. The engine's
  // sampler counts them too (Scored::min_confidence).
  double confidence_threshold_sum = 0;
  int64_t confidence_rounds = 0;
  // The engine's: times the request was preempted for one of a lower priority value and its
  // prompt and output prefilled again on resumption (docs/engine.md, "Preemption").
  int64_t preemptions = 0;

  double acceptance_rate() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0; }
  // Per-token acceptance a of Theorem 3.8: accepted / judged (drafts after a rejection are never judged).
  double alpha() const { return accepted + rejected > 0 ? static_cast<double>(accepted) / (accepted + rejected) : 0; }
  double mean_accepted_length() const { return rounds > 0 ? static_cast<double>(accepted) / rounds : 0; }
  double mean_draft_length() const { return rounds > 0 ? static_cast<double>(drafted) / rounds : 0; }
  double tokens_per_round() const { return rounds > 0 ? static_cast<double>(accepted + rounds) / rounds : 0; }
  double mean_confidence_threshold() const { return confidence_rounds > 0 ? confidence_threshold_sum / confidence_rounds : 0; }
  // accepted_at[i] / drafted_at[i] for positions that were drafted.
  std::vector<double> per_position_acceptance() const;
  // Counts one round's judged drafts: k tokens at draft offsets offset.., the first n accepted
  // (offset > 0 for the second half of a round the pipeline judged in two parts).
  void count_judged(int offset, int k, int n);
  // Counts the threshold a round of k drafts was drafted under, if it drafted with the rule on.
  void count_confidence(int64_t k, float threshold) {
    if (k <= 0 || threshold <= 0) return;
    confidence_threshold_sum += threshold;
    ++confidence_rounds;
  }
  // decode_seconds here run from the end of prefill to the last token: every token is decoded.
  double speculative_tokens_per_second() const { return decode_seconds > 0 ? generated / decode_seconds : 0; }
};

// verify_draft on a round's target logits where the device left them
// (LlamaModel::forward_on_device, k + 1 rows): on the host device the same call over that memory;
// where the device judges (Ops::judges_on_device, the CUDA device: gpu/cuda/device_verify.h) the
// acceptance step runs there and only the
// verdict crosses to the host, not k + 1 rows of the vocabulary. For exact sampling the draft's
// q rows are first copied into `q_device` (grown as needed, kept between rounds). With
// `penalties` active (the request's output so far: spec/penalties.h) the rows are adjusted on a
// host copy and judged there.
RoundOutcome verify_draft_on_device(Ops& ops, const LlamaModel::DeviceLogits& target_logits, int64_t vocab,
                                    const DraftProposal& draft, const SamplingParams& sp, int64_t position,
                                    SpecSampling mode, DeviceBuffer& q_device, PenaltyHistory* penalties = nullptr);

// A request's sampling as the device's acceptance step takes it (gpu/device_judge.h).
DeviceSampling device_sampling(const SamplingParams& sp, SpecSampling mode);

// Called with each committed token and where it came from; return false to stop (Cancelled).
using SpecTokenCallback = std::function<bool(int32_t token, TokenOrigin origin)>;

// generate() with a drafter: the same prompt handling, stop rules, finish reasons and
// per-position randomness, several tokens per target forward. `kv` holds the target's cache
// (`seq` as for generate(); on return it holds prompt + generated[0..n-1)). The drafter keeps
// its own state and is rolled back with the target after every round. Greedy output equals
// generate()'s; coupled output equals it at any temperature; exact output has its distribution.
SpeculativeStats speculative_generate(LlamaModel& target, KvCache& kv, int seq, Drafter& drafter,
                                      const SpeculativeRequest& req, const SpecTokenCallback& on_token);

}  // namespace specula
