// The messages between the engine and its four actors (docs/design.md section 3): plain structs named
// for what they ask. A round flows scheduler -> draft (DraftRound) -> scheduler (DraftsReady)
// -> verifier (VerifyRound) -> sampler (Judge) -> scheduler (Verdict); a failure anywhere comes
// back as RoundFailed and the scheduler ends that round's requests with Release.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "actors/token_stream.h"
#include "spec/speculative_generate.h"

namespace specula::actors {

// The rows of one prefill forward of a prompt whose log-probabilities were asked for
// (EngineRequest::prompt_logprobs): each row's logits, a vocabulary of floats, are reduced to its
// TokenLogprobs before the next piece runs.
inline constexpr int64_t kPromptLogprobsRows = 64;

// A request as admitted: immutable, shared by every actor that serves it.
struct RequestInfo {
  RequestId id = 0;
  SpeculativeRequest request;              // prompt ids, max_tokens, sampling, stop ids, K, mode
  std::vector<std::string> stop;           // stop strings (the sampler ends the text before one)
  bool include_stop = false;               // EngineRequest::include_stop_str_in_output
  std::vector<int32_t> stop_token_ids;     // EngineRequest::stop_token_ids (also in request.stop_ids)
  bool skip_special_tokens = true;         // EngineRequest::skip_special_tokens
  bool speculate = true;                   // false: plain decode rounds (K = 0), no drafting
  int logprobs = -1;                       // EngineRequest::logprobs
  int prompt_logprobs = -1;                // EngineRequest::prompt_logprobs
  bool stop_token_logprobs = false;        // EngineRequest::stop_token_logprobs
  int priority = 0;                        // EngineRequest::priority: its place in the waiting queue
  std::shared_ptr<EventChannel> events;    // the caller's token stream
};
using RequestRef = std::shared_ptr<const RequestInfo>;

// --- to the scheduler ----------------------------------------------------------------------
struct SubmitRequest {
  RequestRef request;
};

// Stop a request; its KV is freed at the next round boundary.
struct Cancel {
  RequestId id = 0;
};

// One sequence's draft in a round.
struct Drafted {
  RequestRef request;
  std::vector<int32_t> context;  // [n0] prompt + committed tokens; the last is g
  DraftProposal draft;           // tokens [k], q [k, vocab]
  // Batch-1 pipelining: an optimistic draft of the next round is in flight, so the sampler judges
  // its first token (a Continuation) against the last row instead of drawing the bonus token.
  bool continued = false;
  float min_confidence = 0;      // the confidence rule's threshold it was drafted under (DraftItem's)
};

// draft -> scheduler: the round's drafts.
struct DraftsReady {
  std::uint64_t round = 0;
  std::vector<Drafted> items;
  double draft_seconds = 0;      // the draft stream's time for the whole round
  // The time and draft tokens of the sequences whose drafter also drafted in their last round:
  // what a draft token costs while drafting goes on. A drafter's first drafting round catches it
  // up on the whole prompt (the trained head feeds every prompt position), and one after rounds at
  // K = 0 on every token since; counted, they make a draft token look as dear as a prefill and keep
  // the load-adaptive policy from drafting again.
  double steady_seconds = 0;
  std::int64_t steady_tokens = 0;
};

// One sequence's verdict.
struct Judged {
  RequestId id = 0;
  int drafted = 0;                // k (+ 1 when a continuation token was judged)
  int accepted = 0;               // n
  std::vector<int32_t> tokens;    // [n + 1] committed: t1..tn then the recovered / bonus token
  bool finished = false;          // the sampler ended the request (stop id, length, context)
  bool continued = false;         // the last token is the accepted continuation token: the
                                  // optimistic draft's remaining tokens are the next window
  // For a drafter that reads them (Drafter::wants_target_hidden): the target's final hidden
  // states of the tokens this round settled, [rows, hidden], for context indices hidden_first..
  // (the prompt's rows in the round that prefilled it, then g and the accepted drafts).
  int64_t hidden_first = 0;
  std::vector<float> hidden;
  bool prefilling = false;        // Scored::prefilling: nothing judged, the prompt goes on next round
  std::vector<int32_t> registered_blocks{};  // Scored::registered_blocks
  bool started = false;           // Scored::started
};

// sampler -> scheduler.
struct Verdict {
  std::uint64_t round = 0;
  std::vector<Judged> items;
  double draft_seconds = 0, verify_seconds = 0;
  int64_t forward_tokens = 0;     // rows of the round's batched verify forward (sum of k + 1)
  double forward_seconds = 0;     // its time (prefill excluded): the scheduler's verify cost model
  int64_t prefill_tokens = 0;     // rows of the round's prefill forwards (new sequences), 0 if none
  double prefill_seconds = 0;
};

// any actor -> scheduler: the round could not be completed; its requests fail with `error`.
struct RoundFailed {
  std::uint64_t round = 0;
  std::vector<RequestId> ids;
  std::string error;
};

using SchedulerMessage = std::variant<SubmitRequest, Cancel, DraftsReady, Verdict, RoundFailed>;

// --- to the draft, verifier and sampler ------------------------------------------------------
// One sequence's part of a draft round.
struct DraftItem {
  RequestRef request;
  std::vector<int32_t> context;  // [n0] prompt + committed tokens; the last is g
  int k = 0;                     // draft at most this many (0: the target alone this round)
  // With k > 0: the target's rows that reached the scheduler since the request last drafted
  // (Judged::hidden), for its drafter before it proposes.
  int64_t hidden_first = 0;
  std::vector<float> hidden;
  // The confidence rule's threshold for this draft (DraftLength::confidence_threshold: the
  // request's own, or with `--draft-confidence auto` the one its measurements set); 0 = off.
  float min_confidence = 0;
};

// scheduler -> draft: draft every active sequence (continuous batching: the set may change
// between rounds).
struct DraftRound {
  std::uint64_t round = 0;
  std::vector<DraftItem> items;
  bool optimistic = false;       // batch-1 pipelining: drafted ahead, while the previous round verifies
};

// scheduler -> verifier: one target forward over every sequence's [g, t1..tk].
struct VerifyRound {
  std::uint64_t round = 0;
  std::vector<Drafted> items;
  double draft_seconds = 0;
};

// One sequence's target output.
struct Scored {
  RequestRef request;
  int64_t position = 0;               // absolute position of t1
  DraftProposal draft;                // tokens [k], q [k, vocab]
  std::vector<float> target_logits;   // [k + 1, vocab] raw logits at g, t1..tk, on the host; empty
                                      // when the device judged the round (`verdict`)
  bool continued = false;             // a Continuation for this round follows (Drafted::continued)
  // With a drafter that reads them: the target's final hidden states of the prompt's rows (when
  // this round prefilled the sequence) and of the verify rows g, t1..tk, [rows, hidden].
  std::vector<float> prefill_hidden, hidden;
  // Where the target's device judges rounds (Ops::judges_on_device, the CUDA device): the
  // verifier ran the acceptance step there and only this verdict crossed to the host.
  std::optional<RoundOutcome> verdict;
  float min_confidence = 0;           // Drafted::min_confidence, for the request's statistics
  int64_t cached_tokens = 0;          // the round that prefilled it: prompt tokens the prefix cache held
  // The round that prefilled it, when the request asked (RequestInfo::prompt_logprobs).
  std::optional<std::vector<TokenLogprobs>> prompt_logprobs{};
  // Its prompt is not all in the cache yet (docs/engine.md, "Prefill in pieces"): this round
  // prefilled part of it or none, and verified nothing; `draft` is dropped.
  bool prefilling = false;
  int64_t prefill_first = 0;          // the context index of prefill_hidden's first row
  // This round made its KV sequence again after a preemption (Preempt): the context it prefills
  // is its prompt and the tokens it had committed (no cached tokens counted again; its prompt's
  // log-probabilities, if it asked, are not scored again once sent).
  bool resumed = false;
  // This round made its KV sequence (new, or again after a preemption): registered_blocks names
  // its table's registered blocks from the first.
  bool started = false;
  // The pool blocks of its sequence that became registered (or were found registered) since the
  // last round said: those other sequences may share, which the scheduler counts once.
  std::vector<int32_t> registered_blocks{};
};

// verifier -> sampler: the target's distributions for the round (TargetProbsReady and Judge in one).
struct Judge {
  std::uint64_t round = 0;
  std::vector<Scored> items;
  double draft_seconds = 0, verify_seconds = 0;
  int64_t forward_tokens = 0;         // as Verdict's
  double forward_seconds = 0;
  int64_t prefill_tokens = 0;
  double prefill_seconds = 0;
};

// scheduler -> sampler (batch-1 pipelining): the first token of the optimistic draft of the round
// after `round`, drafted while `round` was verified from the context that assumes all of
// `round`'s drafts accepted. If they are, the sampler judges this token against `round`'s last
// row with the ordinary rule (verify_draft_without_bonus) where it would otherwise draw the bonus
// token; an empty draft (the drafter proposed nothing) means: draw the bonus token after all.
struct Continuation {
  std::uint64_t round = 0;
  RequestRef request;
  DraftProposal draft;                // tokens [0 or 1], q [that many, vocab]
};

// scheduler -> draft, verifier, sampler: these requests have left the active set (between
// rounds): free their KV / drafter / stream state. The sampler ends each stream not yet ended:
// with `error` if it is not empty, else as "cancelled".
struct Release {
  std::vector<RequestRef> requests;
  std::string error;
};

// scheduler -> draft, verifier: these requests were preempted (between rounds) for a waiting
// request of a lower priority value: free their KV sequence and drafter. Their streams stay open
// (the sampler keeps each one's text, stop and penalty state); they wait in the queue with their
// committed tokens, and on admission the verifier prefills prompt + committed tokens again, so
// the output goes on where it stopped (docs/engine.md, "Preemption").
struct Preempt {
  std::vector<RequestRef> requests;
};

using DraftMessage = std::variant<DraftRound, Release, Preempt>;
using VerifierMessage = std::variant<VerifyRound, Release, Preempt>;
using SamplerMessage = std::variant<Judge, Continuation, Release>;

// A test hook: called inside each actor's round work with the actor's name ("draft",
// "verifier", "sampler") and the round's requests; an exception it throws fails that round.
using FaultHook = std::function<void(const std::string& actor, const std::vector<RequestId>& ids)>;

// A test hook: replaces the acceptance rule in the sampler so that a statistical test can show it
// catches a planted bug. `bonus` says which rule is asked for: verify_draft (target_logits has
// k + 1 rows) or verify_draft_without_bonus (k rows).
using JudgeRule = std::function<RoundOutcome(const DraftProposal& draft, std::span<const float> target_logits,
                                             const SamplingParams& sp, int64_t position, SpecSampling mode, bool bonus)>;

}  // namespace specula::actors
