// The scheduler actor: admission against the target's KV block budget (each request's blocks
// reserved as it grows, or its whole prompt + max_tokens at admission), the active set, each
// request's K (fixed, adaptive, or chosen for the whole round by the load-adaptive policy), and
// the rounds. Continuous batching: requests join and leave only between rounds; each round drafts
// and verifies the whole active set (at most max_batch requests, admitted by priority and then first
// come first served (RequestInfo::priority), so every active request advances every round).
#pragma once
#include <atomic>
#include <deque>
#include <optional>
#include <set>
#include <vector>

#include "actors/actor.h"
#include "actors/kv_ledger.h"
#include "actors/load_policy.h"
#include "actors/messages.h"
#include "actors/trace.h"
#include "spec/adaptive_k.h"

namespace specula::actors {

class DraftActor;
class Verifier;
class Sampler;

struct SchedulerLimits {
  int max_batch = 16;          // requests in the active set
  int64_t kv_blocks = 0;       // the target cache's pool
  int64_t block_tokens = 16;   // positions per block
  int64_t max_positions = 0;   // the target's context (0 = unlimited)
  // A request's KV blocks: reserved for prompt + max_tokens at admission (llama.cpp's slots: a
  // running request can always finish), or, false, as it grows, a round's window at a time, with
  // the latest admitted request preempted when the pool runs out (vLLM's scheduler).
  bool reserve_max_tokens = false;
  // Two rounds in flight over disjoint halves of the active set (ping-pong micro-batches): the
  // draft actor drafts one half while the verifier verifies the other; with one active request,
  // the optimistic continuation (its next round drafted while this one is verified). Off: one
  // round at a time.
  bool pipeline = false;
  // Requests with adaptive K get their K from the load-adaptive policy (actors/load_policy.h),
  // chosen over the whole round, down to 0; off: from their own DraftLength.
  bool load_adaptive = true;
  // The verifier's prefill budget (Verifier::set_prefill_budget; 0: none): a request whose prompt
  // has more rows starts as prefilling, so that its first round drafts nothing either (a drafter
  // made then would take in the whole prompt at once, and its draft would be dropped).
  int64_t prefill_budget = 0;
  // The verifier's prefix cache is on (Verifier::set_prefix_cache), and the positions at the end of
  // a context but its last token that it computes even where the cache holds them (its
  // hidden_tail): a joining request is charged no blocks for the ones it will share
  // (expected_shares).
  bool prefix_cache = false;
  int64_t prefix_tail = 0;
};

// One round boundary's growth of the reservations (Scheduler::grow), apart from the actor: the
// requests between rounds in admission order.
struct GrowthCandidate {
  int64_t freed = 0;             // what preempting it frees, once every later candidate is preempted
  int64_t more = 0;              // the blocks its next round needs beyond those it holds
  bool later_in_flight = false;  // a request admitted after it is in a round in flight (its blocks
                                 // no preemption can take now)
};
struct GrowthPlan {
  std::vector<size_t> grown;    // candidates given their `more`
  std::vector<size_t> sit_out;  // short, starting no round until a later request's round in flight ends
  size_t kept = 0;              // candidates [kept, end) are preempted
};
// Earliest first, each short candidate preempts the latest candidates (those not yet grown or
// sitting out) until its `more` fits `kv_blocks` with `reserved` (all reservations now); if even
// all of them would not do, it sits out when a later request is in flight (none preempted for
// it), else it is preempted itself with every later one.
GrowthPlan plan_growth(const std::vector<GrowthCandidate>& order, int64_t reserved, int64_t kv_blocks);

class Scheduler : public Actor<Scheduler, SchedulerMessage> {
 public:
  Scheduler(boost::asio::any_io_executor executor, SchedulerLimits limits);
  // Owner only, before start(): record spans into `trace` (null: off); it must outlive the actor.
  void set_trace(Trace* trace) { trace_ = trace; }
  // Owner only, before start().
  void connect(Mailbox<DraftMessage>::Sender to_draft, Mailbox<VerifierMessage>::Sender to_verifier,
               Mailbox<SamplerMessage>::Sender to_sampler);

  void on(SubmitRequest& submit);
  void on(Cancel& cancel);
  void on(DraftsReady& ready);
  void on(Verdict& verdict);
  void on(RoundFailed& failed);

  // Any thread: no request queued or active and no round in flight.
  bool idle() const { return pending_.load(std::memory_order_acquire) == 0; }
  // Any thread: running requests preempted so far (Preempt).
  std::uint64_t preemptions() const { return preemptions_.load(std::memory_order_relaxed); }
  // Any thread: preempted requests with committed tokens waiting in the queue to resume.
  int64_t preempted_waiting() const { return preempted_waiting_.load(std::memory_order_relaxed); }
  // Any thread: Release messages sent so far (the verifier counts those it has handled; the
  // engine is settled, its KV freed, when the two agree).
  std::uint64_t releases_sent() const { return releases_sent_.load(std::memory_order_acquire); }

 private:
  // A request in the active set, or waiting in the queue: new (context = its prompt) or preempted
  // (its committed tokens kept, its KV and drafter freed, its round state cleared).
  struct Active {
    RequestRef request;
    std::vector<int32_t> context;  // prompt + committed tokens
    DraftLength length;
    // (Its KV blocks, while active: ledger_.)
    bool busy = false;             // in a round in flight
    bool cancelled = false, finished = false, failed = false;
    std::string error{};
    std::uint64_t round = 0;       // the round it is in, while busy
    // Its optimistic draft of the next round (in flight, or `spec` once ready); 0: none.
    std::uint64_t spec_round = 0;
    std::optional<Drafted> spec{}; // context = this round's context + drafts; draft = t_{k+1}, then the window
    int undrafted = 0;             // rounds in a row the load-adaptive policy gave it K = 0
    // The target's rows from verdicts not yet handed to the draft side (Judged::hidden): they go
    // with its next draft item that drafts (k > 0), when its drafter exists or is made.
    int64_t hidden_first = 0;
    std::vector<float> hidden{};
    // The confidence row of its draft in the round in flight (DraftProposal::confidence), for
    // its DraftLength's calibration when the verdict comes.
    std::vector<float> confidence{};
    // Its last round prefilled part of its prompt (Judged::prefilling): it drafts nothing until
    // the prompt is in.
    bool prefilling = false;
  };
  // A draft item for `a`; one that drafts takes its pending rows along (moved out of `a`). Its
  // confidence threshold is priced by the batch's rounds once the verify cost model knows a row's
  // cost (DraftLength::confidence_threshold), before that by the request's own.
  DraftItem draft_item(Active& a, std::vector<int32_t> context, int k) const;
  // After this many rounds at K = 0 a request drafts one token if a draft accepted with
  // probability kProbeAcceptance would pay, so that its acceptance estimate (which only drafting
  // updates) can recover: a few bad rounds do not lock it out while drafting could pay.
  static constexpr int kProbeAfter = 8;
  static constexpr double kProbeAcceptance = 0.8;
  // The blocks that hold `positions` positions.
  int64_t blocks_of(int64_t positions) const { return (positions + limits_.block_tokens - 1) / limits_.block_tokens; }
  // KV blocks for prompt + max_tokens and a full verify window past them: the most a request holds.
  int64_t blocks_for(const SpeculativeRequest& r) const;
  // KV blocks `a` must hold to run its next round from its context (every position its verify
  // window may write: kMaxDraftTokens + 1 past it), or all of blocks_for under reserve_max_tokens.
  int64_t blocks_for_round(const Active& a) const;
  // The blocks `a` holds (KvLedger::held).
  int64_t blocks_held(const Active& a) const { return ledger_.held(a.request->id); }
  // What preempting `requests` one after another frees (KvLedger::freed_by).
  std::vector<int64_t> freed_by(const std::vector<Active*>& requests) const;
  // The blocks the verifier's prefix cache will hand a waiting request's new sequence, as far as
  // the active requests' shared blocks tell (KvLedger: from admission on they count once): the
  // longest run of one active request's shared blocks (its sequence's first, named by the
  // verifier) that spell `w`'s context's first whole blocks, within what the verifier shares (its
  // context but the last token and prefix_tail; none for a request that asked for its prompt's
  // log-probabilities, whose prompt the verifier scores anew), up to a block another request
  // already expects (KvLedger::expectable). The verifier may share more; never less while those
  // holders hold them, since it frees blocks only when the scheduler lets their holders go.
  std::vector<int32_t> expected_shares(const Active& w) const;
  Active* find(RequestId id);
  // The queue's order: a lower priority value first, then the earlier arrival (ids are given in
  // arrival order), so a preempted request goes back before those of its value that came after it.
  static bool admitted_before(const RequestInfo& x, const RequestInfo& y);
  // Whether a request of `blocks` KV blocks can join `running` requests holding `reserved` blocks.
  // Reserving as requests grow, the most one round may add to a request's blocks must stay free
  // for each running request and for the newcomer besides, so that the admission does not make
  // one of them be preempted at the next round boundary (not beyond it).
  bool fits(int64_t running, int64_t reserved, int64_t blocks) const;
  // Into the queue, in admitted_before's order.
  void enqueue(Active a);
  // Makes room for a waiting request of `priority` that needs `blocks` KV blocks by preempting
  // running requests of higher priority values that are between rounds, the highest value and
  // latest arrival first, as few as make it fit; false (and none preempted) if they cannot.
  bool preempt_for(int priority, int64_t blocks);
  // Reserving as requests grow: each request between rounds gets the blocks of its next round, the
  // earliest admitted first; when the pool has too few, the latest admitted between rounds are
  // preempted, as vLLM's scheduler preempts, down to the one growing itself, unless a request
  // admitted after it holds blocks in a round in flight (pipelining): then it sits this boundary
  // out (sitting_out_) and grows at the next, where that one can be preempted instead. Returns the
  // preempted.
  std::vector<RequestId> grow();
  // Takes the active requests `ids` (between rounds) out of the batch into the queue with their
  // committed tokens, and tells the draft actor and the verifier to free their drafters and KV.
  void preempt(const std::vector<RequestId>& ids);
  void release(std::vector<RequestRef> requests, const std::string& error);
  // At a round boundary: let finished / cancelled / failed requests go, admit from the queue,
  // and start rounds for the requests not in one (two halves when pipelining and none is in flight).
  void next_round();
  void start_round(std::vector<Active*> members);
  // Each member's K for the round: its own (fixed or adaptive), or the load-adaptive policy's.
  // `context_sizes`: each member's context length at the round's start.
  std::vector<int> draft_lengths(const std::vector<Active*>& members, const std::vector<int64_t>& context_sizes) const;
  // The most `a` may draft in a round starting from `context_size` tokens of which `generated`
  // are output: no more than could be emitted (the round adds one target token) or fit.
  int64_t k_limit(const Active& a, int64_t context_size, int64_t generated) const;
  // Batch-1 pipelining: while `window` (a's round) is verified, draft a's next round assuming
  // every draft of `window` is accepted. Marks the window continued and returns the optimistic
  // round, for the caller to send after the window's VerifyRound; nullopt if not started.
  std::optional<DraftRound> draft_optimistically(Active& a, Drafted& window);
  // The optimistic draft of a round: a Continuation to the sampler, or dropped when stale.
  void on_optimistic_draft(DraftsReady& ready);
  void publish();

  SchedulerLimits limits_;
  std::deque<Active> queue_;
  std::vector<Active> active_;
  KvLedger ledger_;                // the active requests' KV blocks
  std::vector<RequestId> sitting_out_;  // between rounds, waiting for blocks a later request's round holds (grow)
  int in_flight_ = 0;              // rounds in flight (at most 2 with pipelining, else 1)
  std::set<std::uint64_t> optimistic_;  // optimistic draft rounds in flight (current or stale)
  std::uint64_t round_ = 0;
  VerifyCostModel verify_cost_;    // the batched verify forward's seconds by rows
  ForgettingRatio draft_time_{VerifyCostModel::kDecay};  // draft seconds per draft token, forgotten like verify_cost_
  ForgettingRatio round_rate_{VerifyCostModel::kDecay};  // a round's committed tokens per its draft + verify seconds
  std::atomic<int64_t> pending_{0};
  std::atomic<std::uint64_t> releases_sent_{0};
  std::atomic<std::uint64_t> preemptions_{0};
  std::atomic<int64_t> preempted_waiting_{0};
  std::optional<Mailbox<DraftMessage>::Sender> to_draft_;
  std::optional<Mailbox<VerifierMessage>::Sender> to_verifier_;
  std::optional<Mailbox<SamplerMessage>::Sender> to_sampler_;
  Trace* trace_ = nullptr;
};

}  // namespace specula::actors
