// Rounds through draft -> verifier -> sampler. Without pipelining one round is in flight at a
// time; with it, two rounds over disjoint requests, so a request still sees its rounds one after
// another (exactly the sequential loop) while the draft and verify streams overlap. With a single
// active request, pipelining is the optimistic continuation instead: its next round is drafted
// while this one is verified, from the context that assumes every draft accepted.
#include "actors/scheduler.h"

#include <algorithm>
#include <cassert>


namespace specula::actors {

Scheduler::Scheduler(boost::asio::any_io_executor executor, SchedulerLimits limits)
    : Actor(std::move(executor), "scheduler"), limits_(limits) {}

void Scheduler::connect(Mailbox<DraftMessage>::Sender to_draft, Mailbox<VerifierMessage>::Sender to_verifier,
                        Mailbox<SamplerMessage>::Sender to_sampler) {
  to_draft_.emplace(std::move(to_draft));
  to_verifier_.emplace(std::move(to_verifier));
  to_sampler_.emplace(std::move(to_sampler));
}

int64_t Scheduler::blocks_for(const SpeculativeRequest& r) const {
  // The verify window may run kMaxDraftTokens + 1 past the committed tokens before rollback.
  const int64_t positions = static_cast<int64_t>(r.prompt.size()) + r.max_tokens + kMaxDraftTokens + 1;
  return blocks_of(positions);
}

int64_t Scheduler::blocks_for_round(const Active& a) const {
  const int64_t whole = blocks_for(a.request->request);
  if (limits_.reserve_max_tokens) return whole;
  const int64_t positions = static_cast<int64_t>(a.context.size()) + kMaxDraftTokens + 1;
  return std::min(whole, blocks_of(positions));
}

std::vector<int64_t> Scheduler::freed_by(const std::vector<Active*>& requests) const {
  std::vector<RequestId> ids;
  for (const Active* a : requests) ids.push_back(a->request->id);
  return ledger_.freed_by(ids);
}

std::vector<int32_t> Scheduler::expected_shares(const Active& w) const {
  std::vector<int32_t> best;
  if (!limits_.prefix_cache || w.request->prompt_logprobs >= 0) return best;
  const auto bt = static_cast<size_t>(limits_.block_tokens);
  const int64_t shareable = static_cast<int64_t>(w.context.size()) - 1 - limits_.prefix_tail;
  const size_t most = shareable > 0 ? static_cast<size_t>(shareable) / bt : 0;
  for (const Active& a : active_) {
    const std::vector<int32_t>& shared = ledger_.shared(a.request->id);
    const size_t bound = std::min({most, shared.size(), a.context.size() / bt});
    size_t n = 0;
    while (n < bound && ledger_.expectable(shared[n]) &&
           std::equal(w.context.begin() + static_cast<std::ptrdiff_t>(n * bt),
                      w.context.begin() + static_cast<std::ptrdiff_t>((n + 1) * bt),
                      a.context.begin() + static_cast<std::ptrdiff_t>(n * bt)))
      ++n;
    if (n > best.size()) best.assign(shared.begin(), shared.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return best;
}

Scheduler::Active* Scheduler::find(RequestId id) {
  for (Active& a : active_)
    if (a.request->id == id) return &a;
  return nullptr;
}

void Scheduler::release(std::vector<RequestRef> requests, const std::string& error) {
  if (requests.empty()) return;
  Release r{std::move(requests), error};
  releases_sent_.fetch_add(1, std::memory_order_release);  // before publish() can report idle
  to_draft_->send(DraftMessage(r));
  to_verifier_->send(VerifierMessage(r));
  to_sampler_->send(SamplerMessage(std::move(r)));
}

void Scheduler::publish() {
  preempted_waiting_.store(std::count_if(queue_.begin(), queue_.end(),
                                         [](const Active& w) { return w.context.size() > w.request->request.prompt.size(); }),
                           std::memory_order_relaxed);
  pending_.store(static_cast<int64_t>(queue_.size() + active_.size() + optimistic_.size()) + in_flight_,
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
  const RequestRef& r = submit.request;
  enqueue(Active{.request = r, .context = r->request.prompt, .length = DraftLength(r->request.draft)});
  next_round();
}

bool Scheduler::admitted_before(const RequestInfo& x, const RequestInfo& y) {
  return x.priority != y.priority ? x.priority < y.priority : x.id < y.id;
}

bool Scheduler::fits(int64_t running, int64_t reserved, int64_t blocks) const {
  // A round adds at most kMaxDraftTokens + 1 positions to a request. (Alone, a request's whole
  // reservation fits the pool: on(SubmitRequest).)
  const int64_t round = blocks_of(kMaxDraftTokens + 1);
  const int64_t room = limits_.reserve_max_tokens || running == 0 ? 0 : (running + 1) * round;
  return running < limits_.max_batch && reserved + blocks + room <= limits_.kv_blocks;
}

void Scheduler::enqueue(Active a) {
  const auto behind = std::find_if(queue_.begin(), queue_.end(),
                                   [&](const Active& w) { return admitted_before(*a.request, *w.request); });
  queue_.insert(behind, std::move(a));
}

bool Scheduler::preempt_for(int priority, int64_t blocks) {
  std::vector<Active*> victims;
  for (Active& a : active_)
    if (!a.busy && a.request->priority > priority) victims.push_back(&a);
  // The last to be admitted first.
  std::sort(victims.begin(), victims.end(),
            [](const Active* x, const Active* y) { return admitted_before(*y->request, *x->request); });
  auto running = static_cast<int64_t>(active_.size());
  int64_t reserved = ledger_.reserved();
  size_t n = 0;
  const std::vector<int64_t> freed = freed_by(victims);
  const auto fits = [&] { return this->fits(running, reserved, blocks); };
  for (; !fits() && n < victims.size(); ++n) {
    --running;
    reserved -= freed[n];
  }
  if (!fits()) return false;
  // The KV budget may be met without some of them (a small one taken before a large one): from the
  // last taken back, keep running each that is not needed (counting all it holds, shared blocks
  // too: the others it shares them with may be kept as well).
  std::vector<RequestId> ids;
  for (size_t i = n; i-- > 0;) {
    ++running;
    reserved += blocks_held(*victims[i]);
    if (fits()) continue;
    --running;
    reserved -= blocks_held(*victims[i]);
    ids.push_back(victims[i]->request->id);
  }
  preempt(ids);
  return true;
}

void Scheduler::preempt(const std::vector<RequestId>& ids) {
  if (ids.empty()) return;
  Preempt preempt;
  for (const RequestId id : ids) {
    const auto it = std::find_if(active_.begin(), active_.end(), [&](const Active& a) { return a.request->id == id; });
    Active& a = *it;
    assert(!a.busy);
    ledger_.leave(a.request->id);
    preempt.requests.push_back(a.request);
    // What it keeps: its committed tokens and its draft-length measurements; the rest is state of
    // a KV sequence and a drafter that are freed now.
    enqueue(Active{.request = a.request, .context = std::move(a.context), .length = std::move(a.length)});
    active_.erase(it);
  }
  preemptions_.fetch_add(ids.size(), std::memory_order_relaxed);
  to_draft_->send(DraftMessage(preempt));
  to_verifier_->send(VerifierMessage(std::move(preempt)));
}

GrowthPlan plan_growth(const std::vector<GrowthCandidate>& order, int64_t reserved, int64_t kv_blocks) {
  GrowthPlan plan;
  plan.kept = order.size();  // `reserved` below: without the blocks of candidates [kept, end)
  for (size_t i = 0; i < plan.kept; ++i) {
    const GrowthCandidate& c = order[i];
    if (c.more <= 0) continue;
    if (reserved + c.more > kv_blocks) {
      int64_t later = 0;
      for (size_t j = i + 1; j < plan.kept; ++j) later += order[j].freed;
      if (reserved - later + c.more > kv_blocks && c.later_in_flight) {
        plan.sit_out.push_back(i);
        continue;
      }
      while (plan.kept > i + 1 && reserved + c.more > kv_blocks) reserved -= order[--plan.kept].freed;
      if (reserved + c.more > kv_blocks) {  // the latest left: preempted itself, with every later one
        plan.kept = i;
        break;
      }
    }
    plan.grown.push_back(i);
    reserved += c.more;
  }
  return plan;
}

std::vector<RequestId> Scheduler::grow() {
  sitting_out_.clear();
  std::vector<Active*> order;
  for (Active& a : active_)
    if (!a.busy) order.push_back(&a);
  std::sort(order.begin(), order.end(),
            [](const Active* x, const Active* y) { return admitted_before(*x->request, *y->request); });
  // (Preempted, if at all, the latest first.)
  const std::vector<int64_t> freed = freed_by({order.rbegin(), order.rend()});
  // The latest admitted of the requests in a round in flight.
  const Active* last_busy = nullptr;
  for (const Active& b : active_)
    if (b.busy && (!last_busy || admitted_before(*last_busy->request, *b.request))) last_busy = &b;
  std::vector<GrowthCandidate> candidates;
  for (size_t i = 0; i < order.size(); ++i) {
    const Active& a = *order[i];
    const bool later_in_flight = last_busy && admitted_before(*a.request, *last_busy->request);
    candidates.push_back({freed[order.size() - 1 - i], blocks_for_round(a) - blocks_held(a), later_in_flight});
  }
  const GrowthPlan plan = plan_growth(candidates, ledger_.reserved(), limits_.kv_blocks);
  for (const size_t i : plan.grown) ledger_.grow(order[i]->request->id, candidates[i].more);
  for (const size_t i : plan.sit_out) sitting_out_.push_back(order[i]->request->id);
  std::vector<RequestId> ids;
  for (size_t i = order.size(); i-- > plan.kept;) ids.push_back(order[i]->request->id);
  preempt(ids);
  return ids;
}

void Scheduler::on(Cancel& cancel) {
  if (Active* a = find(cancel.id)) {
    a->cancelled = true;
  } else {
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Active& w) { return w.request->id == cancel.id; });
    if (it != queue_.end()) {
      RequestRef r = it->request;
      queue_.erase(it);
      release({r}, "");
    }
  }
  next_round();
}

void Scheduler::on(DraftsReady& ready) {
  if (optimistic_.erase(ready.round)) return on_optimistic_draft(ready);
  TraceScope span(trace_, Trace::Scheduler, "drafts ready round " + std::to_string(ready.round));
  // The cost per draft token from the sequences that drafted before (DraftsReady::steady_*);
  // forgotten only as new measurements come in.
  if (ready.steady_tokens > 0) draft_time_.observe(ready.steady_seconds, static_cast<double>(ready.steady_tokens));
  for (const Drafted& d : ready.items)
    if (Active* a = find(d.request->id)) a->confidence = d.draft.confidence;
  std::optional<DraftRound> optimistic;
  if (ready.items.size() == 1 && active_.size() == 1)
    if (Active* a = find(ready.items.front().request->id)) optimistic = draft_optimistically(*a, ready.items.front());
  VerifyRound round{ready.round, std::move(ready.items), ready.draft_seconds};
  to_verifier_->send(VerifierMessage(std::move(round)));
  if (optimistic) to_draft_->send(DraftMessage(std::move(*optimistic)));
}

int64_t Scheduler::k_limit(const Active& a, int64_t context_size, int64_t generated) const {
  const SpeculativeRequest& r = a.request->request;
  int64_t k = std::min<int64_t>(kMaxDraftTokens, r.max_tokens - generated - 1);
  if (limits_.max_positions > 0) k = std::min<int64_t>(k, limits_.max_positions - context_size);
  return std::max<int64_t>(k, 0);
}

std::optional<DraftRound> Scheduler::draft_optimistically(Active& a, Drafted& window) {
  if (!limits_.pipeline || !a.request->speculate || a.prefilling || a.cancelled || a.spec_round != 0) return std::nullopt;
  // The context if every draft of `window` is accepted; the optimistic draft's first token
  // t_{k+1} then stands where the bonus token would be drawn, the rest are the next window.
  std::vector<int32_t> context = window.context;
  context.insert(context.end(), window.draft.tokens.begin(), window.draft.tokens.end());
  const int64_t after = static_cast<int64_t>(context.size()) + 1;  // with t_{k+1}
  const int k_next = draft_lengths({&a}, {after}).front();
  a.undrafted = k_next > 0 ? 0 : a.undrafted + 1;
  const std::uint64_t id = ++round_;
  DraftRound round{id, {draft_item(a, std::move(context), static_cast<int>(1 + k_next))}, true};
  a.spec_round = id;
  a.spec.reset();
  optimistic_.insert(id);
  window.continued = true;
  return round;
}

void Scheduler::on_optimistic_draft(DraftsReady& ready) {
  TraceScope span(trace_, Trace::Scheduler, "optimistic draft ready round " + std::to_string(ready.round));
  Active* a = ready.items.empty() ? nullptr : find(ready.items.front().request->id);
  // Stale: its round rejected a draft (or failed, or the request left) before it was ready.
  if (!a || a->spec_round != ready.round || !a->busy) return publish();
  Drafted& d = ready.items.front();
  Continuation c{a->round, d.request, {}};
  if (d.draft.k() > 0) {
    const auto vocab = static_cast<std::ptrdiff_t>(d.draft.q.size() / static_cast<size_t>(d.draft.k()));
    c.draft.tokens.assign(1, d.draft.tokens.front());
    c.draft.q.assign(d.draft.q.begin(), d.draft.q.begin() + vocab);
  }
  a->spec = std::move(d);
  to_sampler_->send(SamplerMessage(std::move(c)));
  publish();
}

void Scheduler::on(Verdict& verdict) {
  TraceScope span(trace_, Trace::Scheduler, "verdict round " + std::to_string(verdict.round));
  if (verdict.forward_tokens > 0) verify_cost_.observe_verify(verdict.forward_tokens, verdict.forward_seconds);
  // A prefill forward serves to learn the slope early, until the verify forwards show it.
  if (verdict.prefill_tokens > 0) verify_cost_.observe_prefill(verdict.prefill_tokens, verdict.prefill_seconds);
  // The batch's committed tokens per second of its rounds: the automatic confidence threshold's R
  // (draft_item, which an optimistic draft below already calls).
  size_t committed = 0;
  for (const Judged& j : verdict.items) committed += j.tokens.size();
  // (A round that only prefilled part of a prompt commits nothing and says nothing of the rate.)
  if (committed > 0) round_rate_.observe(static_cast<double>(committed), verdict.draft_seconds + verdict.verify_seconds);
  for (const Judged& j : verdict.items) {
    Active* a = find(j.id);
    if (!a) continue;
    if (j.started) ledger_.settle(j.id);
    ledger_.share(j.id, j.registered_blocks);
    a->context.insert(a->context.end(), j.tokens.begin(), j.tokens.end());
    if (!j.hidden.empty()) {
      if (a->hidden.empty()) a->hidden_first = j.hidden_first;
      a->hidden.insert(a->hidden.end(), j.hidden.begin(), j.hidden.end());
    }
    // A round that only prefilled part of the prompt drafted for nothing: no measurement.
    a->prefilling = j.prefilling;
    if (!j.prefilling) {
      // The round's verify time without its prefill forwards (a prompt's, maybe another request's
      // piece): not a cost of drafting.
      a->length.observe(j.drafted, j.accepted, verdict.draft_seconds,
                        std::max(0.0, verdict.verify_seconds - verdict.prefill_seconds));
      a->length.observe_confidence(a->confidence, j.drafted, j.accepted);
    }
    a->confidence.clear();
    a->finished = a->finished || j.finished;
    a->busy = false;
    // (A waiting request of a lower priority value breaks the chain: only a request between rounds
    // can be preempted for it.)
    const bool outranked = !queue_.empty() && queue_.front().request->priority < a->request->priority;
    // (Nor can its next window be verified without the blocks it writes: it comes between rounds,
    // where growing may preempt.)
    const int64_t more = std::max<int64_t>(0, blocks_for_round(*a) - blocks_held(*a));
    const bool no_room = ledger_.reserved() + more > limits_.kv_blocks;
    if (!j.continued || !a->spec || a->finished || a->cancelled || a->failed || outranked || no_room) {
      a->spec_round = 0;  // discarded; if still in flight it is dropped when it arrives
      a->spec.reset();
      continue;
    }
    // The continuation token was accepted: the optimistic draft's other tokens are the next
    // window, already drafted; verify them at once (and draft the round after meanwhile).
    ledger_.grow(a->request->id, more);
    Drafted spec = std::move(*a->spec);
    assert(spec.draft.k() >= 1);
    const std::uint64_t id = a->spec_round;
    a->spec.reset();
    a->spec_round = 0;
    assert(spec.context.size() + 1 == a->context.size() && a->context.back() == spec.draft.tokens.front());
    Drafted window{a->request, a->context, {}, false, 0.0f};
    const auto vocab = static_cast<std::ptrdiff_t>(spec.draft.q.size() / static_cast<size_t>(spec.draft.k()));
    window.draft.tokens.assign(spec.draft.tokens.begin() + 1, spec.draft.tokens.end());
    window.draft.q.assign(spec.draft.q.begin() + vocab, spec.draft.q.end());
    a->busy = true;
    a->round = id;
    ++in_flight_;
    std::optional<DraftRound> optimistic;
    if (active_.size() == 1) optimistic = draft_optimistically(*a, window);
    VerifyRound round{id, {}, 0};
    round.items.push_back(std::move(window));
    to_verifier_->send(VerifierMessage(std::move(round)));
    if (optimistic) to_draft_->send(DraftMessage(std::move(*optimistic)));
  }
  --in_flight_;
  next_round();
}

void Scheduler::on(RoundFailed& failed) {
  if (optimistic_.erase(failed.round)) {
    // An optimistic draft failed: its request fails once its round in flight ends. The sampler may
    // be waiting for the continuation; an empty one makes it draw the bonus token.
    for (RequestId id : failed.ids) {
      Active* a = find(id);
      if (!a || a->spec_round != failed.round) continue;
      a->failed = true;
      a->error = failed.error;
      a->spec_round = 0;
      if (a->busy) to_sampler_->send(SamplerMessage(Continuation{a->round, a->request, {}}));
    }
    return publish();
  }
  for (RequestId id : failed.ids) {
    if (Active* a = find(id)) {
      a->failed = true;
      a->error = failed.error;
      a->busy = false;
      a->spec_round = 0;
      a->spec.reset();
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
    ledger_.leave(a.request->id);
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

  // The running requests' blocks for their next rounds first. One preempted for them here does not
  // come back in this boundary (when two were, the earlier may find the later's blocks free).
  const std::vector<RequestId> out_of_room = limits_.reserve_max_tokens ? std::vector<RequestId>{} : grow();
  // Join in the queue's order (priority, then first come first served) while the batch and the KV
  // budget allow, or while preempting running requests of higher priority values makes them allow.
  while (!queue_.empty()) {
    if (std::ranges::find(out_of_room, queue_.front().request->id) != out_of_room.end()) break;
    const int64_t need = blocks_for_round(queue_.front());
    std::vector<int32_t> expected = expected_shares(queue_.front());
    // (The preempted go into the queue behind it: their priority values are higher. Preempting
    // may take the holders of what it expected to share: counted whole for that, and then again.)
    if (!fits(static_cast<int64_t>(active_.size()), ledger_.reserved(), need - static_cast<int64_t>(expected.size()))) {
      if (!preempt_for(queue_.front().request->priority, need)) break;
      expected = expected_shares(queue_.front());
    }
    Active a = std::move(queue_.front());
    queue_.pop_front();
    ledger_.admit(a.request->id, need - static_cast<int64_t>(expected.size()), expected);
    a.prefilling = limits_.prefill_budget > 0 && static_cast<int64_t>(a.context.size()) - 1 > limits_.prefill_budget;
    active_.push_back(std::move(a));
  }
  std::vector<Active*> idle;
  for (Active& a : active_)
    if (!a.busy && std::ranges::find(sitting_out_, a.request->id) == sitting_out_.end()) idle.push_back(&a);
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

std::vector<int> Scheduler::draft_lengths(const std::vector<Active*>& members,
                                          const std::vector<int64_t>& context_sizes) const {
  std::vector<PolicyRequest> policy;
  bool chosen_here = false;
  for (size_t i = 0; i < members.size(); ++i) {
    const Active& a = *members[i];
    const SpeculativeRequest& r = a.request->request;
    const int64_t size = context_sizes[i];
    const int64_t limit =
        a.request->speculate && !a.prefilling ? k_limit(a, size, size - static_cast<int64_t>(r.prompt.size())) : 0;
    PolicyRequest p{a.length.acceptance(), static_cast<int>(std::min<int64_t>(a.length.next(), limit)), true};
    if (limits_.load_adaptive && r.draft.adaptive && limit > 0) {
      // Until the cost of a row is known, draft at most one token: a full window for a large
      // batch costs several seconds on a CPU if rows turn out to be expensive.
      p.k_max = static_cast<int>(std::min<int64_t>(verify_cost_.known() ? r.draft.k_max : 1, limit));
      p.fixed = false;
      p.rule_sets_length = r.draft.min_confidence > 0;
      chosen_here = true;
    }
    policy.push_back(p);
  }
  std::vector<int> k;
  if (!chosen_here) {
    for (const PolicyRequest& p : policy) k.push_back(p.k_max);
    return k;
  }
  const RoundCosts costs{verify_cost_.intercept(), verify_cost_.slope(),
                         draft_time_.ratio()};
  k = choose_draft_lengths(policy, costs);
  // Probes: a request held at K = 0 for kProbeAfter rounds drafts one token if a good draft
  // (acceptance kProbeAcceptance) would pay in this round; under a compute-bound load none does.
  std::vector<PolicyRequest> hopeful = policy;
  bool stale = false;
  for (size_t i = 0; i < members.size(); ++i)
    if (!policy[i].fixed && k[i] == 0 && members[i]->undrafted >= kProbeAfter) {
      hopeful[i].acceptance = std::max(hopeful[i].acceptance, kProbeAcceptance);
      stale = true;
    }
  if (stale) {
    const std::vector<int> k_hopeful = choose_draft_lengths(hopeful, costs);
    for (size_t i = 0; i < members.size(); ++i)
      if (hopeful[i].acceptance != policy[i].acceptance && k_hopeful[i] > 0) k[i] = 1;
  }
  // A cost probe: the verify forwards have long had one row count, so their slope cannot move;
  // one policy-controlled request drafts one token (one more row in the round) to measure it.
  if (verify_cost_.stale() && std::all_of(k.begin(), k.end(), [](int x) { return x == 0; }))
    for (size_t i = 0; i < members.size(); ++i)
      if (!policy[i].fixed && policy[i].k_max > 0) {
        k[i] = 1;
        break;
      }
  return k;
}

DraftItem Scheduler::draft_item(Active& a, std::vector<int32_t> context, int k) const {
  const float threshold = verify_cost_.known() && round_rate_.ratio() > 0
                              ? a.length.confidence_threshold(round_rate_.ratio(), verify_cost_.slope())
                              : a.length.confidence_threshold();
  DraftItem item{a.request, std::move(context), k, 0, {}, threshold};
  if (k > 0) {
    item.hidden_first = a.hidden_first;
    item.hidden = std::move(a.hidden);
    a.hidden.clear();
  }
  return item;
}

void Scheduler::start_round(std::vector<Active*> members) {
  std::vector<int64_t> sizes;
  for (Active* a : members) sizes.push_back(static_cast<int64_t>(a->context.size()));
  const std::vector<int> k = draft_lengths(members, sizes);
  DraftRound round{++round_, {}, false};
  for (size_t i = 0; i < members.size(); ++i) {
    Active* a = members[i];
    if (!a->prefilling) a->undrafted = k[i] > 0 ? 0 : a->undrafted + 1;
    round.items.push_back(draft_item(*a, a->context, k[i]));
    a->busy = true;
    a->round = round.round;
  }
  ++in_flight_;
  to_draft_->send(DraftMessage(std::move(round)));
}

}  // namespace specula::actors
