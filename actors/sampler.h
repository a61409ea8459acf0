// The sampler actor: the acceptance rule (spec/speculative_sampling.h) for each sequence of a
// round, stop ids and max_tokens, incremental detokenization, each request's token stream, and
// the verdict (accepted length and committed tokens) back to the scheduler.
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/actor.h"
#include "actors/messages.h"
#include "actors/trace.h"
#include "model/tokenizer.h"
#include "spec/penalties.h"

namespace specula::actors {


inline constexpr std::size_t kMaxStopStrings = 16;
inline constexpr std::size_t kMaxStopStringBytes = 256;
// Throws std::invalid_argument for an empty stop string, more than kMaxStopStrings, or one longer
// than kMaxStopStringBytes.
void validate_stop_strings(const std::vector<std::string>& stops);

// Moves from `held` what can be shown now. If a stop string occurs in it, returns the text before
// the first occurrence (through its end with `keep_stop`: the first of `stops` found there), clears
// `held` and sets `stopped`; otherwise returns all but the longest tail of `held` that is the start
// of some stop string, which stays held.
// `which`, if given, is set to the index in `stops` of the one found.
std::string release_text(std::string& held, const std::vector<std::string>& stops, bool& stopped, bool keep_stop = false,
                         std::size_t* which = nullptr);

class Sampler : public Actor<Sampler, SamplerMessage> {
 public:
  // `max_positions`: the target's context (0 = unlimited), as the sequential loop's "context" rule.
  Sampler(boost::asio::any_io_executor executor, std::shared_ptr<const Tokenizer> tokenizer, int64_t max_positions,
          FaultHook hook);
  // Owner only, before start(): record spans into `trace` (null: off); it must outlive the actor.
  void set_trace(Trace* trace) { trace_ = trace; }
  // Owner only, before start().
  void connect(Mailbox<SchedulerMessage>::Sender to_scheduler);
  // Owner only, before start(); tests only: judge with `rule` instead of spec/'s verify_draft.
  void set_judge_rule(JudgeRule rule) { rule_ = std::move(rule); }

  void on(Judge& judge);
  void on(Continuation& continuation);
  void on(Release& release);

 protected:
  void on_failure(SamplerMessage& message, std::exception_ptr error) override;

 private:
  struct Parked {
    std::uint64_t round = 0;
    Scored scored;
    Judged judged;
    Verdict verdict;  // the round's, without this item yet
  };
  struct Open {
    Open(RequestRef r, std::shared_ptr<const Tokenizer> tok)
        : request(std::move(r)), decoder(std::move(tok), request->skip_special_tokens) {}
    RequestRef request;
    StreamDecoder decoder;
    SpeculativeStats stats;
    std::string held;    // decoded text not shown yet: it may be the start of a stop string
    bool ended = false;  // the terminal event was sent
    // Optimistic continuation: the round whose drafts all passed, waiting for its continuation
    // token (its verdict is sent once that is judged), and a continuation that came first.
    std::optional<Parked> parked;
    std::optional<Continuation> continuation;
    std::uint64_t judged_round = 0;  // the last round judged
    // The output so far, for a request with penalties or logit bias (made at its first round,
    // when the rows' width is known; every emitted token is pushed).
    std::optional<PenaltyHistory> penalties;
    // The prompt's log-probabilities (Scored::prompt_logprobs), until the first event carries them.
    std::optional<std::vector<TokenLogprobs>> prompt_logprobs;
  };
  Open& open(const RequestRef& request);
  // Judges `draft` against `target_logits` (k + 1 rows with the bonus row, k without), adjusted
  // for the request's penalties while the rule runs (the raw values are back on return).
  RoundOutcome apply_rule(Open& o, const DraftProposal& draft, std::span<float> target_logits, int64_t position,
                          bool bonus) const;
  // Sends `tokens` (the first `from_draft` accepted drafts; the first at absolute `position`) to
  // the request's stream through the stop rules; true if the request finished. `rows`: the
  // target's logits rows the tokens were judged against, a row a token from the first, `vocab`
  // wide (for the log-probabilities a request may ask for; empty where the device judged).
  bool emit(Open& o, const RequestRef& request, std::span<const int32_t> tokens, int from_draft, int64_t position,
            Judged& j, std::span<const float> rows, size_t vocab);
  // Judges the parked round's continuation token against its last row; sends the verdict.
  void judge_continuation(Open& o);
  // The text still held back at the end of a request, up to a stop string in it.
  std::string flush(Open& o) const;

  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t max_positions_;
  FaultHook hook_;
  JudgeRule rule_;
  std::map<RequestId, Open> open_;
  std::optional<Mailbox<SchedulerMessage>::Sender> to_scheduler_;
  Trace* trace_ = nullptr;
};

}  // namespace specula::actors
