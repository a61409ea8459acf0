// Rounds through draft -> verifier -> sampler. Without pipelining one round is in flight at a
// time; with it, two rounds over disjoint requests, so a request still sees its rounds one after
// another (exactly the sequential loop) while the draft and verify streams overlap.
#include "actors/scheduler.h"

#include <algorithm>

#include "actors/draft_actor.h"
#include "actors/sampler.h"
#include "actors/verifier.h"

namespace specula::actors {

Scheduler::Scheduler(boost::asio::any_io_executor executor, SchedulerLimits limits)
    : Actor(std::move(executor), "scheduler"), limits_(limits) {}

void Scheduler::connect(Actor<DraftActor, DraftMessage>& draft, Actor<Verifier, VerifierMessage>& verifier,
                        Actor<Sampler, SamplerMessage>& sampler) {
  to_draft_.emplace(draft.make_sender());
  to_verifier_.emplace(verifier.make_sender());
  to_sampler_.emplace(sampler.make_sender());
}

int64_t Scheduler::blocks_for(const SpeculativeRequest& r) const {
  // The verify window may run kMaxDraftTokens + 1 past the committed tokens before rollback.
  const int64_t positions = static_cast<int64_t>(r.prompt.size()) + r.max_tokens + kMaxDraftTokens + 1;
  return (positions + limits_.block_tokens - 1) / limits_.block_tokens;
}

Scheduler::Active* Scheduler::find(RequestId id) {
  for (Active& a : active_)
    if (a.request->id == id) return &a;
  return nullptr;
}

void Scheduler::release(std::vector<RequestRef> requests, const std::string& error) {
  if (requests.empty()) return;
  Release r{std::move(requests), error};
  to_draft_->send(DraftMessage(r));
  to_verifier_->send(VerifierMessage(r));
  to_sampler_->send(SamplerMessage(std::move(r)));
}

void Scheduler::publish() {
  pending_.store(static_cast<int64_t>(queue_.size() + active_.size()) + in_flight_,
                 std::memory_order_release);
}

void Scheduler::on(SubmitRequest& submit) {
  const int64_t need = blocks_for(submit.request->request);
  if (need > limits_.kv_blocks) {
    release({submit.request}, "the request needs " + std::to_string(need) + " KV blocks (prompt " +
                                  std::to_string(submit.request->request.prompt.size()) + " + max_tokens " +
                                  std::to_string(submit.request->request.max_tokens) + " tokens); the pool has " +
                                  std::to_string(limits_.kv_blocks));
    return;
  }
  queue_.push_back(std::move(submit.request));
  next_round();
}

void Scheduler::on(Cancel& cancel) {
  if (Active* a = find(cancel.id)) {
    a->cancelled = true;
  } else {
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const RequestRef& r) { return r->id == cancel.id; });
    if (it != queue_.end()) {
      RequestRef r = *it;
      queue_.erase(it);
      release({r}, "");
    }
  }
  next_round();
}

void Scheduler::on(DraftsReady& ready) {
  TraceScope span(trace_, Trace::Scheduler, "drafts ready round " + std::to_string(ready.round));
  VerifyRound round{ready.round, std::move(ready.items), ready.draft_seconds};
  to_verifier_->send(VerifierMessage(std::move(round)));
}

void Scheduler::on(Verdict& verdict) {
  TraceScope span(trace_, Trace::Scheduler, "verdict round " + std::to_string(verdict.round));
  for (const Judged& j : verdict.items) {
    Active* a = find(j.id);
    if (!a) continue;
    a->context.insert(a->context.end(), j.tokens.begin(), j.tokens.end());
    a->length.observe(j.drafted, j.accepted, verdict.draft_seconds, verdict.verify_seconds);
    a->finished = a->finished || j.finished;
    a->busy = false;
  }
  --in_flight_;
  next_round();
}

void Scheduler::on(RoundFailed& failed) {
  for (RequestId id : failed.ids) {
    if (Active* a = find(id)) {
      a->failed = true;
      a->error = failed.error;
      a->busy = false;
    }
  }
  --in_flight_;
  next_round();
}

void Scheduler::next_round() {
  // Leave: finished and cancelled requests, and failed ones grouped by their error.
  std::vector<RequestRef> done;
  std::vector<std::pair<std::string, std::vector<RequestRef>>> failed;
  std::erase_if(active_, [&](Active& a) {
    if (a.busy || (!a.cancelled && !a.finished && !a.failed)) return false;
    blocks_reserved_ -= a.blocks;
    if (a.failed && !a.finished) {
      auto it = std::find_if(failed.begin(), failed.end(), [&](const auto& f) { return f.first == a.error; });
      if (it == failed.end()) it = failed.insert(failed.end(), {a.error, {}});
      it->second.push_back(a.request);
    } else {
      done.push_back(a.request);
    }
    return true;
  });
  release(std::move(done), "");
  for (auto& [error, requests] : failed) release(std::move(requests), error);

  // Join: first come, first served, while the batch and the KV budget allow.
  while (!queue_.empty() && static_cast<int>(active_.size()) < limits_.max_batch) {
    const int64_t need = blocks_for(queue_.front()->request);
    if (blocks_reserved_ + need > limits_.kv_blocks) break;
    RequestRef r = std::move(queue_.front());
    queue_.pop_front();
    blocks_reserved_ += need;
    active_.push_back(Active{r, r->request.prompt, DraftLength(r->request.draft), need, false, false, false, false, {}});
  }
  std::vector<Active*> idle;
  for (Active& a : active_)
    if (!a.busy) idle.push_back(&a);
  const int lanes = limits_.pipeline ? 2 : 1;
  if (idle.empty() || in_flight_ >= lanes) return publish();
  if (lanes == 2 && in_flight_ == 0 && idle.size() >= 2) {
    // Ping-pong: split so that one half drafts while the other verifies.
    const auto half = static_cast<std::ptrdiff_t>((idle.size() + 1) / 2);
    start_round({idle.begin(), idle.begin() + half});
    start_round({idle.begin() + half, idle.end()});
  } else {
    start_round(std::move(idle));
  }
  publish();
}

void Scheduler::start_round(std::vector<Active*> members) {
  // K as the sequential loop picks it: no more drafts than could be emitted (the round adds one
  // target token) or fit in the context.
  DraftRound round{++round_, {}};
  for (Active* a : members) {
    const SpeculativeRequest& r = a->request->request;
    const int64_t generated = static_cast<int64_t>(a->context.size() - r.prompt.size());
    int64_t k = std::min<int64_t>(a->length.next(), r.max_tokens - generated - 1);
    if (limits_.max_positions > 0)
      k = std::min<int64_t>(k, limits_.max_positions - static_cast<int64_t>(a->context.size()));
    round.items.push_back(DraftItem{a->request, a->context, static_cast<int>(std::max<int64_t>(k, 0))});
    a->busy = true;
  }
  ++in_flight_;
  to_draft_->send(DraftMessage(std::move(round)));
}

}  // namespace specula::actors
