// The verifier actor: the target model, its KV cache and the verify stream. Each round is one
// batched target forward over every active sequence's [g, t1..tk] window.
#pragma once
#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "actors/actor.h"
#include "actors/messages.h"
#include "actors/trace.h"
#include "gpu/kv_cache.h"
#include "gpu/llama.h"
#include "streams/stream.h"

namespace specula::actors {


class Verifier : public Actor<Verifier, VerifierMessage> {
 public:
  // `target` must outlive the actor; the KV cache holds `kv_tokens` positions over all sequences.
  // `hand_hidden`: the drafter reads the target's hidden states (Scored::prefill_hidden, hidden).
  // The verify stream is the target's device's (Ops::make_stream).
  // `device_judge`: where the target's device judges rounds (Ops::judges_on_device), judge each
  // round there and hand the sampler only the verdict (off when a test replaces the rule).
  Verifier(boost::asio::any_io_executor executor, LlamaModel& target, int64_t kv_tokens, FaultHook hook,
           bool hand_hidden = false, bool device_judge = true);
  ~Verifier() override;
  // Owner only, before start(): record spans into `trace` (null: off); it must outlive the actor.
  void set_trace(Trace* trace) { trace_ = trace; }
  // Owner only, before start().
  void connect(Mailbox<SchedulerMessage>::Sender to_scheduler, Mailbox<SamplerMessage>::Sender to_sampler);
  // Owner only, before start(): the prefix cache (gpu/kv_cache.h; docs/engine.md, "The prefix
  // cache"). A new sequence shares the registered blocks its prompt starts with, except that the
  // last `hidden_tail` prompt positions are always computed (the drafter reads their hidden
  // states); every round registers the committed positions' full blocks.
  void set_prefix_cache(bool on, int64_t hidden_tail);
  // Owner only, before start(): the most prompt rows a round prefills, over all its new sequences
  // (docs/engine.md, "Prefill in pieces"). A prompt with more left goes on in the next rounds
  // while the other sequences keep decoding; it is verified in the round its last piece runs.
  // Throws std::invalid_argument below 1.
  void set_prefill_budget(int64_t rows);

  // Any thread: prompt tokens the prefill was asked for and those the prefix cache held, so far.
  int64_t prefix_queried_tokens() const { return prefix_queried_.load(std::memory_order_relaxed); }
  int64_t prefix_hit_tokens() const { return prefix_hit_.load(std::memory_order_relaxed); }

  boost::asio::awaitable<void> on(VerifyRound& round);
  void on(Release& release);
  void on(Preempt& preempt);  // frees the KV sequences as Release does (not counted as a release)

  // Any thread: the pool as of the last message handled.
  int64_t blocks_free() const { return blocks_free_.load(std::memory_order_acquire); }
  // Any thread: Release messages handled so far (their KV is in blocks_free()).
  std::uint64_t releases_done() const { return releases_done_.load(std::memory_order_acquire); }
  int64_t blocks_total() const { return kv_.blocks_total(); }
  int64_t block_tokens() const { return kv_.config().block_tokens; }

 protected:
  void on_failure(VerifierMessage& message, std::exception_ptr error) override;

 private:
  // Frees the requests' KV sequences (Release, Preempt).
  void forget(const std::vector<RequestRef>& requests);
  void verify(VerifyRound& round, Judge& judge);
  // Prefills sequence `seq` (new, empty) with `prompt` = context minus its last token, in pieces
  // of kPromptLogprobsRows with every row's logits, each row reduced at once to the log-probability
  // of the context's next token and `top` alternatives; the final hidden states of every row are
  // appended to `hidden` when the drafter reads them.
  std::vector<TokenLogprobs> prefill_scored(int seq, std::span<const int32_t> context, int top,
                                            std::vector<float>& hidden, Judge& judge);
  // Names in `s` the blocks of its request's sequence registered since the last report.
  void report_registered(Scored& s);

  LlamaModel& target_;
  KvCache kv_;
  FaultHook hook_;
  std::unique_ptr<streams::Stream> stream_;
  std::map<RequestId, int> seqs_;  // request -> KV sequence
  // Requests whose prompt is partly in the cache: their sequence's length is how far it is.
  std::set<RequestId> partial_;
  // Preempted (Preempt) and not yet made again: the round that makes its sequence is its resumption.
  std::set<RequestId> preempted_;
  // Those whose prompt was scored (EngineRequest::prompt_logprobs): not again when they resume.
  std::set<RequestId> scored_;
  // Of each sequence's registered blocks, how many its Scored::registered_blocks have named.
  std::map<RequestId, size_t> reported_;
  int64_t prefill_budget_ = LlamaModel::kDefaultMaxForwardRows;
  std::atomic<int64_t> blocks_free_;
  std::atomic<std::uint64_t> releases_done_{0};
  std::vector<float> logits_;
  bool device_judge_ = false;  // the device judges rounds (and may: no test rule)
  DeviceBuffer q_device_;      // exact sampling's q rows, copied for the device's judge
  bool hand_hidden_ = false;
  int64_t hidden_tail_ = 0;
  std::atomic<int64_t> prefix_queried_{0}, prefix_hit_{0};
  std::vector<float> hidden_;
  std::optional<Mailbox<SchedulerMessage>::Sender> to_scheduler_;
  std::optional<Mailbox<SamplerMessage>::Sender> to_sampler_;
  Trace* trace_ = nullptr;
};

}  // namespace specula::actors
