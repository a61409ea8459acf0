// Verification on the verify stream: new sequences are prefilled (prompt minus its last token),
// every sequence is rolled back to its committed length, then one forward scores all windows.
#include "actors/verifier.h"

#include <algorithm>
#include <cassert>
#include <chrono>


namespace specula::actors {

Verifier::Verifier(boost::asio::any_io_executor executor, LlamaModel& target, int64_t kv_tokens, FaultHook hook,
                   bool hand_hidden, bool device_judge)
    : Actor(std::move(executor), "verifier"),
      target_(target),
      kv_(target.ops(), target.kv_config(kv_tokens)),
      hook_(std::move(hook)),
      stream_(target.ops().make_stream("verify")),
      blocks_free_(kv_.blocks_free()),
      hand_hidden_(hand_hidden) {
  device_judge_ = device_judge && target.ops().judges_on_device();
}

Verifier::~Verifier() = default;

void Verifier::connect(Mailbox<SchedulerMessage>::Sender to_scheduler, Mailbox<SamplerMessage>::Sender to_sampler) {
  to_scheduler_.emplace(std::move(to_scheduler));
  to_sampler_.emplace(std::move(to_sampler));
}

void Verifier::set_prefill_budget(int64_t rows) {
  if (rows < 1) throw std::invalid_argument("the prefill budget must be at least 1 row, got " + std::to_string(rows));
  prefill_budget_ = rows;
}

void Verifier::set_prefix_cache(bool on, int64_t hidden_tail) {
  kv_.set_prefix_cache(on);
  hidden_tail_ = hidden_tail;
}

void Verifier::verify(VerifyRound& round, Judge& judge) {
  if (hook_) {
    std::vector<RequestId> ids;
    for (const Drafted& d : round.items) ids.push_back(d.request->id);
    hook_("verifier", ids);
  }
  // Prefill: new prompts that fit in half the round's rows, then the sequences whose prompt is
  // partly in the cache, then the other sequences seen for the first time, at most
  // prefill_budget_ prompt rows in all (docs/engine.md, "Prefill in pieces"); a prompt with rows
  // left when the budget runs out goes on next round, and a new one that gets no rows waits as it
  // was. With the prefix cache, a prompt that shares more whole blocks with a prompt prefilled
  // this round (or still going in) than the cache holds waits for that one's blocks and then
  // starts with them (the n choices of one OpenAI request, requests with one system prompt that
  // arrive together), so a round prefills in as many forwards as it has such layers, usually one
  // or two.
  const auto prompt_of = [&](size_t i) {
    const std::vector<int32_t>& c = round.items[i].context;
    return std::span<const int32_t>(c).first(c.size() - 1);
  };
  const auto shareable = [&](size_t i) { return static_cast<int64_t>(prompt_of(i).size()) - hidden_tail_; };
  const auto id_of = [&](size_t i) { return round.items[i].request->id; };
  // Admitted again after a preemption: its context is its prompt and the tokens it had committed.
  const auto again = [&](size_t i) { return preempted_.count(id_of(i)) > 0; };
  std::vector<char> made(round.items.size(), 0);  // its KV sequence was made this round
  std::vector<size_t> waiting, going;
  for (size_t i = 0; i < round.items.size(); ++i) {
    if (!seqs_.count(id_of(i)))
      waiting.push_back(i);
    else if (partial_.count(id_of(i)))
      going.push_back(i);
  }
  std::vector<int64_t> cached(round.items.size(), 0);  // prompt tokens each new sequence shares
  std::vector<int64_t> prefill_from(round.items.size(), 0);  // the first prompt position this round's rows are of
  std::vector<std::vector<float>> prefill_rows(round.items.size());
  std::vector<std::optional<std::vector<TokenLogprobs>>> prompt_logprobs(round.items.size());
  std::vector<ForwardSeq> batch;
  const int64_t bt = kv_.config().block_tokens;
  int64_t budget = prefill_budget_;
  // Item i's next piece: at most the budget's rows of what its prompt has left.
  std::vector<size_t> prefilled;  // round.items index of each sequence in `batch`
  const auto take_piece = [&](size_t i) {
    const int seq = seqs_.at(id_of(i));
    const std::span<const int32_t> prompt = prompt_of(i);
    const int64_t at = kv_.length(seq), left = static_cast<int64_t>(prompt.size()) - at;
    const int64_t n = std::min(left, budget);
    if (n < left)
      partial_.insert(id_of(i));
    else
      partial_.erase(id_of(i));
    if (n == 0) return;
    prefill_from[i] = at;
    batch.push_back({seq, prompt.subspan(static_cast<size_t>(at), static_cast<size_t>(n)), false, hand_hidden_});
    prefilled.push_back(i);
    budget -= n;
  };
  const auto run_batch = [&] {
    if (batch.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    target_.forward(batch, kv_, logits_);
    judge.prefill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const ForwardSeq& f : batch) judge.prefill_tokens += static_cast<int64_t>(f.tokens.size());
    if (hand_hidden_) {
      target_.last_hidden_all(hidden_);
      const size_t H = static_cast<size_t>(target_.feature_width());
      size_t at = 0;
      for (size_t b = 0; b < batch.size(); ++b) {
        const size_t n = batch[b].tokens.size() * H;
        prefill_rows[prefilled[b]].assign(hidden_.begin() + static_cast<std::ptrdiff_t>(at),
                                          hidden_.begin() + static_cast<std::ptrdiff_t>(at + n));
        at += n;
      }
    }
    for (size_t b = 0; b < batch.size(); ++b) kv_.register_prefix(batch[b].seq, prompt_of(prefilled[b]));
    batch.clear();
    prefilled.clear();
  };
  // A new sequence: its KV sequence, with what the cache holds of its prompt, and its first piece
  // (`later`: where it goes when the round has no rows left for it).
  const auto start = [&](size_t i, std::vector<size_t>& later) {
    const std::span<const int32_t> prompt = prompt_of(i);
    // (The prompt's log-probabilities go out once: a resumed request whose prompt was scored
    // before its preemption is prefilled as any other.)
    const int top = scored_.count(id_of(i)) ? -1 : round.items[i].request->prompt_logprobs;
    if (top >= 0) {  // its own forwards, every row scored, nothing taken from the prefix cache
      const int seq = kv_.create_sequence(prompt, 0);
      seqs_.emplace(id_of(i), seq);
      made[i] = 1;
      prefix_queried_.fetch_add(static_cast<int64_t>(prompt.size()), std::memory_order_relaxed);
      prompt_logprobs[i] = prefill_scored(seq, round.items[i].context, top, prefill_rows[i], judge);
      scored_.insert(id_of(i));
      kv_.register_prefix(seq, prompt);
      budget = std::max<int64_t>(0, budget - static_cast<int64_t>(prompt.size()));
      return;
    }
    // Nothing to start with: it waits for a round with rows to spare, as a request not yet here.
    const int64_t hit = kv_.cached_positions(prompt, shareable(i));
    if (budget == 0 && hit < static_cast<int64_t>(prompt.size())) {
      later.push_back(i);
      return;
    }
    const int seq = kv_.create_sequence(prompt, shareable(i));
    seqs_.emplace(id_of(i), seq);
    made[i] = 1;
    cached[i] = kv_.length(seq);
    if (!again(i)) {  // (the prefix cache's counters are of prompts)
      prefix_queried_.fetch_add(static_cast<int64_t>(prompt.size()), std::memory_order_relaxed);
      prefix_hit_.fetch_add(cached[i], std::memory_order_relaxed);
    }
    take_piece(i);
    if (partial_.count(id_of(i))) going.push_back(i);
  };
  const std::vector<size_t> resumed = going;  // prompts going in since an earlier round
  bool resumed_taken = false;
  for (bool first = true; !waiting.empty() && (first || budget > 0); first = false) {
    std::vector<size_t> now, later;
    for (const size_t i : waiting) {
      const std::span<const int32_t> p = prompt_of(i);
      int64_t from_now = 0;  // whole blocks' positions a sequence being prefilled would register for it
      if (kv_.prefix_cache()) {
        const auto share = [&](size_t j) {
          const std::span<const int32_t> q = prompt_of(j);
          const auto differ = std::mismatch(p.begin(), p.end(), q.begin(), q.end()).first;
          from_now = std::max<int64_t>(from_now, std::min<int64_t>(differ - p.begin(), shareable(i)));
        };
        for (const size_t j : now) share(j);
        for (const size_t j : going) share(j);
      }
      (from_now >= bt && from_now / bt > kv_.cached_positions(p, shareable(i)) / bt ? later : now).push_back(i);
    }
    if (!resumed_taken) {
      // New prompts short enough to fit in half the round's rows go before the prompts going in
      // (as vLLM lets short prefills past long ones), so that a chat turn arriving behind a long
      // prompt does not wait for all of its pieces; then the prompts going in; then the rest.
      int64_t short_rows = resumed.empty() ? 0 : budget / 2;
      std::vector<size_t> rest;
      for (const size_t i : now) {
        const int64_t need =
            static_cast<int64_t>(prompt_of(i).size()) - kv_.cached_positions(prompt_of(i), shareable(i));
        if ((scored_.count(id_of(i)) || round.items[i].request->prompt_logprobs < 0) && need <= short_rows) {
          short_rows -= need;
          start(i, later);
        } else {
          rest.push_back(i);
        }
      }
      for (const size_t i : resumed) take_piece(i);
      resumed_taken = true;
      now = std::move(rest);
    }
    for (const size_t i : now) start(i, later);
    run_batch();
    // The sequences still partly in: only their blocks so far are registered; prompts sharing
    // more wait for the next round.
    std::erase_if(going, [&](size_t j) { return !partial_.count(id_of(j)); });
    waiting = std::move(later);
  }
  if (!resumed_taken)
    for (const size_t i : resumed) take_piece(i);
  run_batch();  // the going sequences' pieces, when no new sequence came

  // One forward over every sequence's [g, t1..tk], after rolling each back to n0 - 1 positions;
  // a sequence whose prompt is not all in the cache yet has no rows in it this round.
  const auto prefilling = [&](size_t i) { return !seqs_.count(id_of(i)) || partial_.count(id_of(i)); };
  std::vector<std::vector<int32_t>> windows(round.items.size());
  for (size_t i = 0; i < round.items.size(); ++i) {
    if (prefilling(i)) continue;
    const Drafted& d = round.items[i];
    const int seq = seqs_.at(d.request->id);
    kv_.truncate_to(seq, static_cast<int64_t>(d.context.size()) - 1);
    windows[i].assign(1, d.context.back());
    windows[i].insert(windows[i].end(), d.draft.tokens.begin(), d.draft.tokens.end());
    batch.push_back({seq, windows[i], true});
  }
  // Where the device judges, the logits stay there and only verdicts come back; a round with an
  // optimistic continuation keeps its rows on the host (the sampler judges the continuation
  // token against the last row once it arrives), and so does one with a request that asked for
  // log-probabilities (the sampler reads them off the rows) or penalties (the sampler adjusts the
  // rows by the request's output: spec/penalties.h).
  const bool on_device = device_judge_ && std::none_of(round.items.begin(), round.items.end(), [](const Drafted& d) {
                           return d.continued || d.request->logprobs >= 0 || d.request->request.sampling.penalized();
                         });
  LlamaModel::DeviceLogits device_logits;
  if (!batch.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    if (on_device)
      device_logits = target_.forward_on_device(batch, kv_);
    else
      target_.forward(batch, kv_, logits_);
    judge.forward_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (hand_hidden_) target_.last_hidden(hidden_);
  }
  const int64_t vocab = target_.config().vocab_size;
  const size_t H = static_cast<size_t>(target_.feature_width());
  size_t row = 0, b = 0;
  for (size_t i = 0; i < round.items.size(); ++i) {
    Drafted& d = round.items[i];
    Scored s{d.request, static_cast<int64_t>(d.context.size()), std::move(d.draft), {}, d.continued, {}, {}, std::nullopt,
             d.min_confidence};
    s.started = made[i];
    s.resumed = made[i] && again(i);
    s.cached_tokens = s.resumed ? 0 : cached[i];  // prompt tokens the cache held, counted once
    if (made[i]) preempted_.erase(d.request->id);
    s.prompt_logprobs = std::move(prompt_logprobs[i]);
    s.prefill_first = prefill_from[i];
    if (hand_hidden_) s.prefill_hidden = std::move(prefill_rows[i]);
    if (prefilling(i)) {
      s.prefilling = true;
      s.continued = false;
      report_registered(s);
      judge.items.push_back(std::move(s));
      continue;
    }
    const size_t rows = windows[i].size();
    judge.forward_tokens += static_cast<int64_t>(rows);
    if (on_device) {
      const SpeculativeRequest& r = d.request->request;
      const LlamaModel::DeviceLogits mine{device_logits.data + row * vocab, static_cast<int64_t>(rows)};
      s.verdict = verify_draft_on_device(target_.ops(), mine, vocab, s.draft, r.sampling, s.position, r.mode, q_device_);
    } else {
      s.target_logits.assign(logits_.begin() + static_cast<std::ptrdiff_t>(row * vocab),
                             logits_.begin() + static_cast<std::ptrdiff_t>((row + rows) * vocab));
    }
    if (hand_hidden_)
      s.hidden.assign(hidden_.begin() + static_cast<std::ptrdiff_t>(row * H),
                      hidden_.begin() + static_cast<std::ptrdiff_t>((row + rows) * H));
    row += rows;
    // The committed positions (the context, g included, whose K/V this forward wrote) for later
    // sequences that start with them.
    kv_.register_prefix(batch[b++].seq, d.context);
    report_registered(s);
    judge.items.push_back(std::move(s));
  }
}

void Verifier::report_registered(Scored& s) {
  const auto it = seqs_.find(s.request->id);
  if (it == seqs_.end()) return;
  const std::vector<int32_t>& table = kv_.block_table(it->second);
  size_t& named = reported_[s.request->id];
  const size_t registered = kv_.registered_blocks(it->second);
  // (A rollback never reaches a registered block: a round commits at least one token.)
  assert(named <= registered && registered <= table.size());
  s.registered_blocks.assign(table.begin() + static_cast<std::ptrdiff_t>(named),
                             table.begin() + static_cast<std::ptrdiff_t>(registered));
  named = registered;
}

std::vector<TokenLogprobs> Verifier::prefill_scored(int seq, std::span<const int32_t> context, int top,
                                                    std::vector<float>& hidden, Judge& judge) {
  std::vector<TokenLogprobs> out;
  const size_t prompt = context.size() - 1;
  out.reserve(prompt);
  const auto vocab = static_cast<size_t>(target_.config().vocab_size);
  const size_t H = static_cast<size_t>(target_.feature_width());
  for (size_t at = 0; at < prompt; at += static_cast<size_t>(kPromptLogprobsRows)) {
    const size_t rows = std::min(prompt - at, static_cast<size_t>(kPromptLogprobsRows));
    const ForwardSeq piece{seq, context.subspan(at, rows), true, hand_hidden_};
    const auto t0 = std::chrono::steady_clock::now();
    target_.forward({&piece, 1}, kv_, logits_);
    judge.prefill_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    judge.prefill_tokens += static_cast<int64_t>(rows);
    // Row r read the tokens up to at + r: it is the distribution of token at + r + 1.
    for (size_t r = 0; r < rows; ++r)
      out.push_back(token_logprobs(std::span<const float>(logits_).subspan(r * vocab, vocab), context[at + r + 1], top));
    if (hand_hidden_) {
      target_.last_hidden_all(hidden_);
      hidden.insert(hidden.end(), hidden_.begin(), hidden_.begin() + static_cast<std::ptrdiff_t>(rows * H));
    }
  }
  return out;
}

boost::asio::awaitable<void> Verifier::on(VerifyRound& round) {
  Judge judge;
  judge.round = round.round;
  judge.draft_seconds = round.draft_seconds;
  stream_->enqueue([&] {
    const auto t0 = std::chrono::steady_clock::now();
    TraceScope span(trace_, Trace::VerifyStream,
                    "verify round " + std::to_string(round.round) + " (" + std::to_string(round.items.size()) + " seqs)");
    verify(round, judge);
    judge.verify_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  });
  streams::Event done = stream_->record();
  std::exception_ptr error;
  try {
    co_await done.async_wait(boost::asio::use_awaitable);
  } catch (...) {
    error = std::current_exception();
  }
  blocks_free_.store(kv_.blocks_free(), std::memory_order_release);
  if (error) std::rethrow_exception(error);
  to_sampler_->send(SamplerMessage(std::move(judge)));
}

void Verifier::forget(const std::vector<RequestRef>& requests) {
  for (const RequestRef& r : requests) {
    preempted_.erase(r->id);
    auto it = seqs_.find(r->id);
    if (it == seqs_.end()) continue;
    kv_.free_sequence(it->second);
    seqs_.erase(it);
    partial_.erase(r->id);
    reported_.erase(r->id);
  }
  blocks_free_.store(kv_.blocks_free(), std::memory_order_release);
}

void Verifier::on(Release& release) {
  forget(release.requests);
  for (const RequestRef& r : release.requests) scored_.erase(r->id);
  releases_done_.fetch_add(1, std::memory_order_release);
}

void Verifier::on(Preempt& preempt) {
  forget(preempt.requests);
  for (const RequestRef& r : preempt.requests) preempted_.insert(r->id);
}

void Verifier::on_failure(VerifierMessage& message, std::exception_ptr error) {
  if (auto* round = std::get_if<VerifyRound>(&message)) {
    RoundFailed failed{round->round, {}, "verifier: " + describe(error)};
    for (const Drafted& d : round->items) failed.ids.push_back(d.request->id);
    to_scheduler_->send(SchedulerMessage(std::move(failed)));
  } else {
    Actor::on_failure(message, error);
  }
}

}  // namespace specula::actors
