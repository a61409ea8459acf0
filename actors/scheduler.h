// The scheduler actor: admission against the target's KV block budget, the active set, each
// request's K (fixed or adaptive), and the rounds. Continuous batching: requests join and leave
// only between rounds; each round drafts and verifies the whole active set (at most max_batch
// requests, admitted first come first served, so every active request advances every round).
#pragma once
#include <atomic>
#include <deque>
#include <optional>
#include <vector>

#include "actors/actor.h"
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
  // Two rounds in flight over disjoint halves of the active set (ping-pong micro-batches): the
  // draft actor drafts one half while the verifier verifies the other. Off: one round at a time.
  bool pipeline = false;
};

class Scheduler : public Actor<Scheduler, SchedulerMessage> {
 public:
  Scheduler(boost::asio::any_io_executor executor, SchedulerLimits limits);
  // Owner only, before start(): record spans into `trace` (null: off); it must outlive the actor.
  void set_trace(Trace* trace) { trace_ = trace; }
  // Owner only, before start().
  void connect(Actor<DraftActor, DraftMessage>& draft, Actor<Verifier, VerifierMessage>& verifier,
               Actor<Sampler, SamplerMessage>& sampler);

  void on(SubmitRequest& submit);
  void on(Cancel& cancel);
  void on(DraftsReady& ready);
  void on(Verdict& verdict);
  void on(RoundFailed& failed);

  // Any thread: no request queued or active and no round in flight.
  bool idle() const { return pending_.load(std::memory_order_acquire) == 0; }

 private:
  struct Active {
    RequestRef request;
    std::vector<int32_t> context;  // prompt + committed tokens
    DraftLength length;
    int64_t blocks = 0;            // reserved for prompt + max_tokens + a full draft window
    bool busy = false;             // in a round in flight
    bool cancelled = false, finished = false, failed = false;
    std::string error;
  };
  int64_t blocks_for(const SpeculativeRequest& r) const;
  Active* find(RequestId id);
  void release(std::vector<RequestRef> requests, const std::string& error);
  // At a round boundary: let finished / cancelled / failed requests go, admit from the queue,
  // and start rounds for the requests not in one (two halves when pipelining and none is in flight).
  void next_round();
  void start_round(std::vector<Active*> members);
  void publish();

  SchedulerLimits limits_;
  std::deque<RequestRef> queue_;
  std::vector<Active> active_;
  std::vector<RequestId> cancel_queued_;
  int64_t blocks_reserved_ = 0;
  int in_flight_ = 0;              // rounds in flight (at most 2 with pipelining, else 1)
  std::uint64_t round_ = 0;
  std::atomic<int64_t> pending_{0};
  std::optional<Mailbox<DraftMessage>::Sender> to_draft_;
  std::optional<Mailbox<VerifierMessage>::Sender> to_verifier_;
  std::optional<Mailbox<SamplerMessage>::Sender> to_sampler_;
  Trace* trace_ = nullptr;
};

}  // namespace specula::actors
