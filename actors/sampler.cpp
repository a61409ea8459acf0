// Judging a round: the same rule, stop checks and order of checks as spec/speculative_generate.cpp.
#include "actors/sampler.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>
#include <utility>


namespace specula::actors {

void validate_stop_strings(const std::vector<std::string>& stops) {
  if (stops.size() > kMaxStopStrings)
    throw std::invalid_argument("stop: at most " + std::to_string(kMaxStopStrings) + " strings, got " +
                                std::to_string(stops.size()));
  for (const std::string& s : stops) {
    if (s.empty()) throw std::invalid_argument("stop: a stop string is empty");
    if (s.size() > kMaxStopStringBytes)
      throw std::invalid_argument("stop: a stop string has " + std::to_string(s.size()) + " bytes; the limit is " +
                                  std::to_string(kMaxStopStringBytes));
  }
}

std::string release_text(std::string& held, const std::vector<std::string>& stops, bool& stopped, bool keep_stop,
                         std::size_t* which) {
  stopped = false;
  size_t first = std::string::npos, length = 0;
  for (size_t i = 0; i < stops.size(); ++i)
    if (const size_t at = held.find(stops[i]); at < first) {
      first = at;
      length = stops[i].size();
      if (which) *which = i;
    }
  if (first != std::string::npos) {
    std::string shown = held.substr(0, first + (keep_stop ? length : 0));
    held.clear();
    stopped = true;
    return shown;
  }
  size_t keep = 0;  // the longest tail of `held` that a stop string starts with
  for (const std::string& s : stops)
    for (size_t n = std::min(s.size() - 1, held.size()); n > keep; --n)
      if (held.compare(held.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string shown = held.substr(0, held.size() - keep);
  held.erase(0, held.size() - keep);
  return shown;
}

Sampler::Sampler(boost::asio::any_io_executor executor, std::shared_ptr<const Tokenizer> tokenizer,
                 int64_t max_positions, FaultHook hook)
    : Actor(std::move(executor), "sampler"),
      tokenizer_(std::move(tokenizer)),
      max_positions_(max_positions),
      hook_(std::move(hook)) {}

void Sampler::connect(Mailbox<SchedulerMessage>::Sender to_scheduler) { to_scheduler_.emplace(std::move(to_scheduler)); }

Sampler::Open& Sampler::open(const RequestRef& request) {
  auto it = open_.find(request->id);
  if (it == open_.end()) {
    it = open_.try_emplace(request->id, request, tokenizer_).first;  // the decoder skips special tokens
    it->second.stats.prompt_tokens = static_cast<int64_t>(request->request.prompt.size());
  }
  return it->second;
}

std::string Sampler::flush(Open& o) const {
  o.held += o.decoder.flush();
  bool stopped = false;
  std::string shown = release_text(o.held, o.request->stop, stopped, o.request->include_stop);
  if (!stopped) shown += o.held;  // the end: a partial stop string is text after all
  o.held.clear();
  return shown;
}

RoundOutcome Sampler::apply_rule(Open& o, const DraftProposal& draft, std::span<float> target_logits, int64_t position,
                                 bool bonus) const {
  const SpeculativeRequest& req = o.request->request;
  if (!o.penalties && req.sampling.penalized()) {
    const size_t rows = static_cast<size_t>(draft.k()) + (bonus ? 1 : 0);
    o.penalties.emplace(req.sampling, req.prompt, static_cast<int64_t>(target_logits.size() / rows), req.stop_ids);
  }
  const PenalizedRows adjusted(o.penalties ? &*o.penalties : nullptr, target_logits, draft.tokens);
  if (rule_) return rule_(draft, target_logits, req.sampling, position, req.mode, bonus);
  return bonus ? verify_draft(draft, target_logits, req.sampling, position, req.mode)
               : verify_draft_without_bonus(draft, target_logits, req.sampling, position, req.mode);
}

bool Sampler::emit(Open& o, const RequestRef& request, std::span<const int32_t> tokens, int from_draft,
                   int64_t position, Judged& j, std::span<const float> rows, size_t vocab) {
  const SpeculativeRequest& req = request->request;
  SpeculativeStats& st = o.stats;
  // The round's events go out in one send, so the reader sees them together (the server
  // coalesces them into one event) instead of racing the sampler token by token.
  std::vector<StreamEvent> batch;
  batch.reserve(tokens.size() + 1);
  auto send = [&] {
    if (batch.empty()) return;
    if (o.prompt_logprobs) batch.front().prompt_logprobs = std::exchange(o.prompt_logprobs, std::nullopt);
    request->events->send_all(std::move(batch));
  };
  auto end_with = [&](StreamEvent last) {
    last.stats = st;
    batch.push_back(std::move(last));
    send();
    o.ended = true;
    j.finished = true;
    return true;
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t tok = tokens[i];
    const int64_t tok_position = position + static_cast<int64_t>(i);
    if (o.penalties && o.penalties->refuses(tok)) {
      // Drawn from a row that allowed_token_ids and bad_words would have left with no token: the
      // text so far goes out, then an error (spec/penalties.h).
      StreamEvent err;
      err.kind = StreamEvent::Kind::Error;
      err.request_fault = true;
      err.error = kListsLeaveNoToken;
      err.text = flush(o);  // what was held back (a stop string's possible start) goes out too
      return end_with(std::move(err));
    }
    j.tokens.push_back(tok);
    if (o.penalties) o.penalties->push(tok);
    if (o.penalties && o.penalties->over_limit()) {
      // The grammar needs more states than its matcher may hold: the text so far goes out (a
      // prefix the grammar allows), then an error rather than a silent early stop.
      StreamEvent err;
      err.kind = StreamEvent::Kind::Error;
      err.request_fault = true;
      err.error = "the grammar needs more parse states than one request may use (" + std::to_string(GrammarMatcher::kMaxStates) +
                  " states, " + std::to_string(GrammarMatcher::kMaxStacks) + " parses at once); simplify it";
      err.text = flush(o);
      return end_with(std::move(err));
    }
    ++st.generated;
    StreamEvent ev;
    ev.token = tok;
    ev.from_draft = static_cast<int>(i) < from_draft;
    if (request->logprobs >= 0 && vocab > 0 && rows.size() >= (i + 1) * vocab)
      ev.logprobs = token_logprobs(rows.subspan(i * vocab, vocab), tok, request->logprobs);
    // A stop token's text is not the request's (vLLM's rule; the end tokens are special and have
    // none shown), unless it asked for it (include_stop_str_in_output).
    const bool stop_id = std::find(req.stop_ids.begin(), req.stop_ids.end(), tok) != req.stop_ids.end();
    if (!stop_id || request->include_stop) o.held += o.decoder.push(tok);
    bool stopped = false;
    std::size_t which = 0;
    // Before min_tokens tokens are out no stop string ends the text (vLLM's rule): all of it goes.
    static const std::vector<std::string> kNoStops;
    ev.text = release_text(o.held, st.generated < req.sampling.min_tokens ? kNoStops : request->stop, stopped,
                           request->include_stop, &which);
    batch.push_back(std::move(ev));
    const bool complete = o.penalties && o.penalties->constraint_complete();
    const FinishReason finish = req.finish_rule(max_positions_).after(tok, st.generated, tok_position, stopped, complete);
    // The stop token that ends the request is not part of its text, nor of its log-probabilities
    // (as OpenAI's API leaves it out), unless include_stop_str_in_output kept its text. (A grammar's
    // end with no stop tokens ends after a text token.)
    const bool stop_token = !stopped && !(complete && req.stop_ids.empty());
    if (finish == FinishReason::Stop && stop_token && !request->stop_token_logprobs && !(stop_id && request->include_stop))
      batch.back().logprobs.reset();
    if (finish != FinishReason::None) {
      StreamEvent done;
      done.kind = StreamEvent::Kind::Done;
      done.text = stopped ? std::string() : flush(o);
      done.finish_reason = finish;
      st.finish_reason = finish;
      if (finish == FinishReason::Stop && stopped) done.stop_string = request->stop[which];
      const auto& own = request->stop_token_ids;
      if (finish == FinishReason::Stop && !stopped && std::find(own.begin(), own.end(), tok) != own.end())
        done.stop_token = tok;
      return end_with(std::move(done));
    }
  }
  send();
  return false;
}

namespace {

// The target's rows this round settled, for a drafter that reads them: the prompt's (if the round
// prefilled it), then g and the n accepted drafts (the recovered or bonus token is not fed yet).
void attach_hidden(Scored& s, int n, Judged& j) {
  if (s.hidden.empty()) return;
  const size_t H = s.hidden.size() / static_cast<size_t>(s.draft.k() + 1);
  const int64_t prefill_rows = static_cast<int64_t>(s.prefill_hidden.size() / H);
  j.hidden_first = s.position - 1 - prefill_rows;
  j.hidden = std::move(s.prefill_hidden);
  j.hidden.insert(j.hidden.end(), s.hidden.begin(), s.hidden.begin() + static_cast<std::ptrdiff_t>((n + 1) * H));
}

}  // namespace

void Sampler::on(Judge& judge) {
  TraceScope span(trace_, Trace::Sampler, "judge round " + std::to_string(judge.round));
  if (hook_) {
    std::vector<RequestId> ids;
    for (const Scored& s : judge.items) ids.push_back(s.request->id);
    hook_("sampler", ids);
  }
  Verdict verdict;
  verdict.round = judge.round;
  verdict.draft_seconds = judge.draft_seconds;
  verdict.verify_seconds = judge.verify_seconds;
  verdict.forward_tokens = judge.forward_tokens;
  verdict.forward_seconds = judge.forward_seconds;
  verdict.prefill_tokens = judge.prefill_tokens;
  verdict.prefill_seconds = judge.prefill_seconds;
  for (Scored& s : judge.items) {
    Open& o = open(s.request);
    o.judged_round = judge.round;  // a continuation of an earlier round is stale from now on
    if (s.resumed) ++o.stats.preemptions;
    if (s.prefilling) {
      // Nothing to judge: its prompt's rows so far go to the drafter's side, and the next round
      // goes on with the prompt (an optimistic continuation of this round is stale).
      o.stats.cached_prompt_tokens += s.cached_tokens;
      Judged j{s.request->id, 0, 0, {}, false, false, s.prefill_first, std::move(s.prefill_hidden), true,
               std::move(s.registered_blocks), s.started};
      verdict.items.push_back(std::move(j));
      continue;
    }
    const int k = static_cast<int>(s.draft.k());
    SpeculativeStats& st = o.stats;
    ++st.rounds;
    st.draft_seconds += judge.draft_seconds;
    st.verify_seconds += judge.verify_seconds;
    st.count_confidence(k, s.min_confidence);
    st.cached_prompt_tokens += s.cached_tokens;
    if (s.prompt_logprobs) o.prompt_logprobs = std::move(s.prompt_logprobs);
    Judged j{s.request->id, k, 0, {}, false, false, 0, {}};
    j.registered_blocks = std::move(s.registered_blocks);
    j.started = s.started;
    if (!s.continued) {
      const RoundOutcome outcome = s.verdict ? std::move(*s.verdict) : apply_rule(o, s.draft, s.target_logits, s.position, true);
      st.count_judged(0, k, outcome.accepted);
      j.accepted = outcome.accepted;
      attach_hidden(s, outcome.accepted, j);
      emit(o, s.request, outcome.tokens, outcome.accepted, s.position, j, s.target_logits,
           s.target_logits.size() / static_cast<size_t>(k + 1));
      verdict.items.push_back(std::move(j));
      continue;
    }
    // Optimistic continuation (the scheduler continues only single-request rounds): judge the
    // drafts against their rows without the bonus row; if all pass, the last row judges the
    // continuation token, which may still be on its way.
    assert(judge.items.size() == 1);
    const size_t vocab = s.target_logits.size() / static_cast<size_t>(k + 1);
    if (k == 0) attach_hidden(s, 0, j);
    if (k > 0) {
      const RoundOutcome first =
          apply_rule(o, s.draft, std::span<float>(s.target_logits).first(static_cast<size_t>(k) * vocab), s.position, false);
      st.count_judged(0, k, first.accepted);
      j.accepted = first.accepted;
      attach_hidden(s, first.accepted, j);
      if (emit(o, s.request, first.tokens, first.accepted, s.position, j, s.target_logits, vocab) ||
          first.accepted < k) {
        o.continuation.reset();
        verdict.items.push_back(std::move(j));
        continue;
      }
    }
    o.parked = Parked{judge.round, std::move(s), std::move(j), std::move(verdict)};
    if (o.continuation && o.continuation->round == judge.round) judge_continuation(o);
    return;
  }
  to_scheduler_->send(SchedulerMessage(std::move(verdict)));
}

void Sampler::on(Continuation& c) {
  TraceScope span(trace_, Trace::Sampler, "continuation of round " + std::to_string(c.round));
  Open& o = open(c.request);
  if (o.parked && o.parked->round == c.round) {
    o.continuation = std::move(c);
    return judge_continuation(o);
  }
  // Before its round's Judge: keep it. After (the round rejected a draft): stale.
  if (c.round > o.judged_round) o.continuation = std::move(c);
}

void Sampler::judge_continuation(Open& o) {
  Parked p = std::move(*o.parked);
  Continuation c = std::move(*o.continuation);
  o.parked.reset();
  o.continuation.reset();
  const int k = static_cast<int>(p.scored.draft.k());
  const size_t vocab = p.scored.target_logits.size() / static_cast<size_t>(k + 1);
  const auto last = std::span<float>(p.scored.target_logits).subspan(static_cast<size_t>(k) * vocab, vocab);
  const int64_t position = p.scored.position + k;
  RoundOutcome second;
  if (c.draft.k() == 0) {
    second = apply_rule(o, c.draft, last, position, true);  // nothing drafted: the bonus token
  } else {
    // the ordinary rule at the bonus position: accept t_{k+1} with min(1, p/q), else the residual
    second = apply_rule(o, c.draft, last, position, false);
    o.stats.count_judged(k, 1, second.accepted);
    p.judged.drafted += 1;
    p.judged.accepted += second.accepted;
    p.judged.continued = second.accepted == 1;
  }
  emit(o, p.scored.request, second.tokens, second.accepted, position, p.judged, last, vocab);
  p.verdict.items.push_back(std::move(p.judged));
  to_scheduler_->send(SchedulerMessage(std::move(p.verdict)));
}

void Sampler::on(Release& release) {
  for (const RequestRef& r : release.requests) {
    Open& o = open(r);
    if (!o.ended) {
      StreamEvent ev;
      if (release.error.empty()) {
        ev.kind = StreamEvent::Kind::Done;
        ev.text = flush(o);
        ev.finish_reason = o.stats.finish_reason = FinishReason::Cancelled;
      } else {
        ev.kind = StreamEvent::Kind::Error;
        ev.error = release.error;
      }
      ev.stats = o.stats;
      r->events->send(std::move(ev));
    }
    open_.erase(r->id);
  }
}

void Sampler::on_failure(SamplerMessage& message, std::exception_ptr error) {
  if (auto* judge = std::get_if<Judge>(&message)) {
    RoundFailed failed{judge->round, {}, "sampler: " + describe(error)};
    for (const Scored& s : judge->items) failed.ids.push_back(s.request->id);
    to_scheduler_->send(SchedulerMessage(std::move(failed)));
  } else if (auto* c = std::get_if<Continuation>(&message)) {
    to_scheduler_->send(SchedulerMessage(RoundFailed{c->round, {c->request->id}, "sampler: " + describe(error)}));
  } else {
    Actor::on_failure(message, error);
  }
}

}  // namespace specula::actors
