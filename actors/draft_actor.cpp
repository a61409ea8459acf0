// Drafting on the draft stream: each sequence's drafter is caught up (prefill for a new one,
// rollback to the committed length otherwise) and proposes up to the round's K for it.
#include "actors/draft_actor.h"

#include <algorithm>
#include <chrono>

#include "spec/make_drafter.h"

namespace specula::actors {

DraftActor::DraftActor(boost::asio::any_io_executor executor, std::unique_ptr<DrafterFactory> drafters,
                       std::unique_ptr<streams::Stream> stream, FaultHook hook)
    : Actor(std::move(executor), "draft"),
      factory_(std::move(drafters)),
      hook_(std::move(hook)),
      stream_(std::move(stream)) {}

DraftActor::~DraftActor() = default;

void DraftActor::connect(Mailbox<SchedulerMessage>::Sender to_scheduler) { to_scheduler_.emplace(std::move(to_scheduler)); }

Drafter* DraftActor::drafter_for(const DraftItem& item) {
  const RequestId id = item.request->id;
  auto it = drafters_.find(id);
  if (it != drafters_.end()) {
    // The sequential loop rolls back right after the verdict; the first `n0 - 1` tokens are
    // settled (g itself has not been fed).
    if (it->second) it->second->rollback(static_cast<int64_t>(item.context.size()) - 1);
    return it->second.get();
  }
  const SpeculativeRequest& r = item.request->request;
  const int64_t positions = static_cast<int64_t>(r.prompt.size()) + r.max_tokens + kMaxDraftTokens + 2;
  std::unique_ptr<Drafter> d = factory_->make(positions);
  if (d) d->prefill(item.context);
  return drafters_.emplace(id, std::move(d)).first->second.get();
}

boost::asio::awaitable<void> DraftActor::on(DraftRound& round) {
  DraftsReady ready;
  ready.round = round.round;
  double seconds = 0;
  stream_->enqueue([&] {
    const auto t0 = std::chrono::steady_clock::now();
    TraceScope span(trace_, Trace::DraftStream,
                    std::string(round.optimistic ? "optimistic " : "") + "draft round " + std::to_string(round.round) +
                        " (" + std::to_string(round.items.size()) + " seqs)");
    if (hook_) {
      std::vector<RequestId> ids;
      for (const DraftItem& item : round.items) ids.push_back(item.request->id);
      hook_("draft", ids);
    }
    for (DraftItem& item : round.items) {
      Drafted out{item.request, std::move(item.context), {}, false, item.min_confidence};
      item.context = out.context;  // kept for on_failure's ids only; cheap next to a forward
      // A drafter is made (and prefilled) on a request's first round that drafts, so a request
      // the load-adaptive policy keeps at K = 0 costs no draft work; one that drafted before keeps
      // its drafter, which catches up on the tokens it missed when it drafts again.
      const auto t_item = std::chrono::steady_clock::now();
      // Steady: the drafter drafted last round too, so it catches up on at most that round's
      // committed tokens (a first round, or one after rounds at K = 0, feeds it many more).
      const auto last = last_draft_.find(item.request->id);
      const int64_t context_size = static_cast<int64_t>(item.context.size());
      const bool steady = last != last_draft_.end() && context_size - last->second.context_size <= last->second.k + 1;
      Drafter* drafter = item.request->speculate && item.k > 0 ? drafter_for(item) : nullptr;
      if (drafter && item.k > 0) {
        if (!item.hidden.empty()) drafter->target_hidden(item.hidden_first, item.hidden);
        const SpeculativeRequest& r = item.request->request;
        DraftRequest dreq;
        dreq.context = out.context;
        dreq.position = static_cast<int64_t>(out.context.size());
        dreq.max_tokens = item.k;
        dreq.min_tokens = std::min(r.draft.adaptive ? r.draft.k_min : 1, item.k);
        dreq.max_entropy = r.draft.max_entropy;
        dreq.min_confidence = item.min_confidence;
        dreq.sampling = r.sampling;
        dreq.prompt_tokens = static_cast<int64_t>(r.prompt.size());
        dreq.stop_ids = r.stop_ids;
        dreq.mode = r.mode;
        drafter->propose(dreq, out.draft);
        if (out.draft.k() > 0) {
          if (steady) {
            ready.steady_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t_item).count();
            ready.steady_tokens += out.draft.k();
          }
          last_draft_[item.request->id] = {context_size, out.draft.k()};
        }
      }
      ready.items.push_back(std::move(out));
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  co_await stream_->record().async_wait(boost::asio::use_awaitable);
  ready.draft_seconds = seconds;
  to_scheduler_->send(SchedulerMessage(std::move(ready)));
}

void DraftActor::forget(const std::vector<RequestRef>& requests) {
  for (const RequestRef& r : requests) {
    drafters_.erase(r->id);
    last_draft_.erase(r->id);
  }
}

void DraftActor::on(Release& release) { forget(release.requests); }

void DraftActor::on(Preempt& preempt) { forget(preempt.requests); }

void DraftActor::on_failure(DraftMessage& message, std::exception_ptr error) {
  if (auto* round = std::get_if<DraftRound>(&message)) {
    RoundFailed failed{round->round, {}, "draft: " + describe(error)};
    for (const DraftItem& item : round->items) failed.ids.push_back(item.request->id);
    to_scheduler_->send(SchedulerMessage(std::move(failed)));
  } else {
    Actor::on_failure(message, error);
  }
}

}  // namespace specula::actors
