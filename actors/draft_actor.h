// The draft actor: one drafter per active sequence (each with its own KV cache where it has one)
// and the draft stream. It drafts a round for every sequence in it and hands the drafts back.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "actors/actor.h"
#include "actors/messages.h"
#include "actors/trace.h"
#include "gpu/llama.h"
#include "model/weights.h"
#include "spec/drafter.h"
#include "spec/make_drafter.h"
#include "streams/stream.h"

namespace specula::actors {


class DraftActor : public Actor<DraftActor, DraftMessage> {
 public:
  // `drafters` makes each request's drafter (spec/make_drafter.h); the models it uses must
  // outlive the actor. `stream`: made by the device the drafters run on (Ops::make_stream), the
  // draft stream whose events the actor co_awaits.
  DraftActor(boost::asio::any_io_executor executor, std::unique_ptr<DrafterFactory> drafters,
             std::unique_ptr<streams::Stream> stream, FaultHook hook);
  ~DraftActor() override;
  // Owner only, before start(): record spans into `trace` (null: off); it must outlive the actor.
  void set_trace(Trace* trace) { trace_ = trace; }
  // Owner only, before start().
  void connect(Mailbox<SchedulerMessage>::Sender to_scheduler);

  boost::asio::awaitable<void> on(DraftRound& round);
  void on(Release& release);
  void on(Preempt& preempt);  // drops the drafters as Release does; the requests come back later

 protected:
  void on_failure(DraftMessage& message, std::exception_ptr error) override;

 private:
  // Drops the requests' drafters (Release, Preempt).
  void forget(const std::vector<RequestRef>& requests);
  Drafter* drafter_for(const DraftItem& item);

  std::unique_ptr<DrafterFactory> factory_;  // before drafters_: they use its models
  FaultHook hook_;
  std::unique_ptr<streams::Stream> stream_;
  std::map<RequestId, std::unique_ptr<Drafter>> drafters_;  // nullptr for the "none" drafter
  // Each request's last round that drafted: its context size and draft length (DraftsReady::steady_*).
  struct LastDraft {
    int64_t context_size = 0;
    int64_t k = 0;
  };
  std::map<RequestId, LastDraft> last_draft_;
  std::optional<Mailbox<SchedulerMessage>::Sender> to_scheduler_;
  Trace* trace_ = nullptr;
};

}  // namespace specula::actors
