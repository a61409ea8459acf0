// Judging a round: the same rule, stop checks and order of checks as spec/speculative_generate.cpp.
#include "actors/sampler.h"

#include <algorithm>
#include <stdexcept>

#include "actors/scheduler.h"

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

std::string release_text(std::string& held, const std::vector<std::string>& stops, bool& stopped) {
  stopped = false;
  size_t first = std::string::npos;
  for (const std::string& s : stops) first = std::min(first, held.find(s));
  if (first != std::string::npos) {
    std::string shown = held.substr(0, first);
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

void Sampler::connect(Actor<Scheduler, SchedulerMessage>& scheduler) { to_scheduler_.emplace(scheduler.make_sender()); }

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
  std::string shown = release_text(o.held, o.request->stop, stopped);
  if (!stopped) shown += o.held;  // the end: a partial stop string is text after all
  o.held.clear();
  return shown;
}

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
  for (Scored& s : judge.items) {
    const SpeculativeRequest& req = s.request->request;
    Open& o = open(s.request);
    const RoundOutcome outcome = verify_draft(s.draft, s.target_logits, req.sampling, s.position, req.mode);
    const int n = outcome.accepted;
    const int k = static_cast<int>(s.draft.k());
    SpeculativeStats& st = o.stats;
    ++st.rounds;
    st.drafted += k;
    st.accepted += n;
    st.rejected += n < k ? 1 : 0;
    for (int i = 0; i < k; ++i) {
      ++st.drafted_at[static_cast<size_t>(i)];
      if (i < n) ++st.accepted_at[static_cast<size_t>(i)];
    }
    st.draft_seconds += judge.draft_seconds;
    st.verify_seconds += judge.verify_seconds;

    Judged j{s.request->id, k, n, {}, false};
    for (int i = 0; i <= n; ++i) {
      const int32_t tok = outcome.tokens[static_cast<size_t>(i)];
      const int64_t tok_position = s.position + i;
      j.tokens.push_back(tok);
      ++st.generated;
      StreamEvent ev;
      ev.token = tok;
      ev.from_draft = i < n;
      o.held += o.decoder.push(tok);
      bool stopped = false;
      ev.text = release_text(o.held, s.request->stop, stopped);
      s.request->events->send(std::move(ev));
      const char* finish = nullptr;
      if (stopped || std::find(req.stop_ids.begin(), req.stop_ids.end(), tok) != req.stop_ids.end()) finish = "stop";
      else if (st.generated >= req.max_tokens) finish = "length";
      else if (max_positions_ > 0 && tok_position + 1 >= max_positions_) finish = "context";
      if (finish) {
        StreamEvent done;
        done.kind = StreamEvent::Kind::Done;
        done.text = stopped ? std::string() : flush(o);
        done.finish_reason = finish;
        st.finish_reason = finish;
        done.stats = st;
        s.request->events->send(std::move(done));
        o.ended = true;
        j.finished = true;
        break;
      }
    }
    verdict.items.push_back(std::move(j));
  }
  to_scheduler_->send(SchedulerMessage(std::move(verdict)));
}

void Sampler::on(Release& release) {
  for (const RequestRef& r : release.requests) {
    Open& o = open(r);
    if (!o.ended) {
      StreamEvent ev;
      if (release.error.empty()) {
        ev.kind = StreamEvent::Kind::Done;
        ev.text = flush(o);
        ev.finish_reason = o.stats.finish_reason = "cancelled";
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
  } else {
    Actor::on_failure(message, error);
  }
}

}  // namespace specula::actors
