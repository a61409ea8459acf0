// The sequential speculative loop (docs/design.md section 1, steps 1-6), one sequence at a time.
#include "spec/speculative_generate.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <stdexcept>


namespace specula {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

std::vector<double> SpeculativeStats::per_position_acceptance() const {
  std::vector<double> out;
  for (size_t i = 0; i < drafted_at.size() && drafted_at[i] > 0; ++i)
    out.push_back(static_cast<double>(accepted_at[i]) / drafted_at[i]);
  return out;
}

void SpeculativeStats::count_judged(int offset, int k, int n) {
  drafted += k;
  accepted += n;
  rejected += n < k ? 1 : 0;
  for (int i = 0; i < k; ++i) {
    const auto at = static_cast<size_t>(offset + i);
    if (at >= drafted_at.size()) break;
    ++drafted_at[at];
    if (i < n) ++accepted_at[at];
  }
}

DeviceSampling device_sampling(const SamplingParams& sp, SpecSampling mode) {
  return DeviceSampling{sp.greedy() ? 0.0f : sp.temperature, sp.top_k, sp.top_p, sp.seed, mode == SpecSampling::Coupled};
}

RoundOutcome verify_draft_on_device(Ops& ops, const LlamaModel::DeviceLogits& target_logits, int64_t vocab,
                                    const DraftProposal& draft, const SamplingParams& sp, int64_t position,
                                    SpecSampling mode, DeviceBuffer& q_device, PenaltyHistory* penalties) {
  const int64_t k = draft.k();
  if (target_logits.rows != k + 1)
    throw std::invalid_argument("verify_draft: " + std::to_string(target_logits.rows) + " rows of target logits are not k+1 = " +
                                std::to_string(k + 1) + " rows");
  // Penalties adjust each row by the output before it (spec/penalties.h): on a host copy of the
  // rows, which the device's logits buffer and its judge know nothing of.
  if (penalties != nullptr && penalties->active()) {
    thread_local std::vector<float> host;  // kept: fresh pages every round cost more than the copy
    host.resize(static_cast<size_t>((k + 1) * vocab));
    if (ops.judges_on_device())
      ops.copy_to_host(target_logits.data, host.data(), host.size());
    else
      std::copy(target_logits.data, target_logits.data + host.size(), host.begin());
    penalties->apply(host, draft.tokens);
    return verify_draft(draft, host, sp, position, mode);
  }
  // A device that judges rounds itself implements the token rules (greedy, exact, coupled) over
  // temperature, top-k and top-p; the block rule and min-p run on the host over a copy of the rows.
  if (ops.judges_on_device() && (mode == SpecSampling::Block || sp.min_p > 0.0f) && !sp.greedy()) {
    std::vector<float> host(static_cast<size_t>((k + 1) * vocab));
    ops.copy_to_host(target_logits.data, host.data(), host.size());
    return verify_draft(draft, host, sp, position, mode);
  }
  if (ops.judges_on_device()) {
    const float* q = nullptr;
    if (!sp.greedy() && mode == SpecSampling::Exact && k > 0) {
      if (static_cast<int64_t>(draft.q.size()) != k * vocab)
        throw std::invalid_argument("verify_draft: the draft has " + std::to_string(draft.q.size()) +
                                    " q values for k = " + std::to_string(k) + " rows of " + std::to_string(vocab));
      q_device.ensure(ops, draft.q.size());
      ops.copy_to_device(draft.q.data(), q_device.get(), draft.q.size());
      q = q_device.get();
    }
    DeviceVerdict v = ops.judge(target_logits.data, q, draft.tokens, vocab, device_sampling(sp, mode), position);
    return RoundOutcome{v.accepted, std::move(v.tokens), v.bonus};
  }
  return verify_draft(draft, std::span<const float>(target_logits.data, static_cast<size_t>((k + 1) * vocab)), sp,
                      position, mode);
}

SpeculativeStats speculative_generate(LlamaModel& target, KvCache& kv, int seq, Drafter& drafter,
                                      const SpeculativeRequest& req, const SpecTokenCallback& on_token) {
  req.sampling.validate(target.config().vocab_size);
  req.draft.validate();
  if (req.max_tokens < 1) throw std::invalid_argument("max_tokens must be >= 1, got " + std::to_string(req.max_tokens));
  req.check_min_tokens();
  if (req.prompt.empty()) throw std::invalid_argument("the prompt is empty");
  const int64_t ctx = target.config().max_positions;
  const int64_t base = kv.length(seq);  // positions cached before this request
  if (ctx > 0 && base + static_cast<int64_t>(req.prompt.size()) >= ctx)
    throw std::invalid_argument("the prompt has " + std::to_string(base + req.prompt.size()) +
                                " tokens; the context holds " + std::to_string(ctx));

  const FinishRule rule = req.finish_rule(ctx);
  SpeculativeStats st;
  st.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  // Invariant between rounds: the target cache holds base + context minus its last token g,
  // which the next verify forward feeds.
  std::vector<int32_t> context = req.prompt;
  std::vector<float> logits;
  const auto t_prefill = Clock::now();
  const bool hand_hidden = drafter.wants_target_hidden();
  // The rows the drafter reads (none for most): a target shared by runs with several drafters
  // computes only what the current one needs.
  const std::vector<int> feature_layers = hand_hidden ? drafter.target_feature_layers() : std::vector<int>{};
  if (target.feature_layers() != feature_layers) target.set_feature_layers(feature_layers);
  std::vector<float> hidden;
  if (context.size() > 1) {
    ForwardSeq fs{seq, std::span<const int32_t>(context).first(context.size() - 1), false, hand_hidden};
    target.forward({&fs, 1}, kv, logits);
  }
  drafter.prefill(context);
  if (hand_hidden && context.size() > 1) {
    target.last_hidden_all(hidden);
    drafter.target_hidden(0, hidden);
  }
  st.prefill_seconds = since(t_prefill);

  const DraftLengthConfig lengths = req.draft.resolved(req.sampling.greedy());
  DraftLength draft_length(lengths);
  DraftRequest dreq;
  dreq.min_tokens = lengths.adaptive ? lengths.k_min : 1;
  dreq.max_entropy = lengths.max_entropy;
  dreq.sampling = req.sampling;
  dreq.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  dreq.stop_ids = req.stop_ids;
  dreq.mode = req.mode;
  DraftProposal draft;
  std::vector<int32_t> verify_tokens;
  const int64_t vocab = target.config().vocab_size;
  DeviceBuffer q_device;  // the draft's q rows on the CUDA device (exact sampling)
  PenaltyHistory penalties(req.sampling, req.prompt, vocab, req.stop_ids);  // the output so far, for penalties

  const auto t_decode = Clock::now();
  for (;;) {
    const int64_t n0 = static_cast<int64_t>(context.size());
    const int64_t position = base + n0;  // where t1 (or this round's target token) will sit
    // No more drafts than could be emitted (the round adds one target token) or fit the context.
    int64_t k = std::min<int64_t>(draft_length.next(), req.max_tokens - st.generated - 1);
    if (ctx > 0) k = std::min<int64_t>(k, ctx - position);

    // 1. Draft t1..tk with their q rows.
    auto t0 = Clock::now();
    draft.clear();
    if (k > 0) {
      dreq.context = context;
      dreq.position = position;
      dreq.max_tokens = static_cast<int>(k);
      dreq.min_confidence = draft_length.confidence_threshold();
      drafter.propose(dreq, draft);
      assert(draft.k() <= k);
      st.count_confidence(draft.k(), dreq.min_confidence);
    }
    const double draft_s = since(t0);

    // 2-5. One target forward over [g, t1..tk] gives p at k+1 positions; judge the draft.
    t0 = Clock::now();
    verify_tokens.assign(1, context.back());
    verify_tokens.insert(verify_tokens.end(), draft.tokens.begin(), draft.tokens.end());
    ForwardSeq fs{seq, verify_tokens, true};
    const LlamaModel::DeviceLogits p = target.forward_on_device({&fs, 1}, kv);
    const RoundOutcome verdict = verify_draft_on_device(target.ops(), p, vocab, draft, req.sampling, position, req.mode,
                                                        q_device, &penalties);
    const int n = verdict.accepted;

    // 6. Roll both caches back to the committed tokens (g, t1..tn; the new last token is not fed),
    //    handing a drafter that reads them the target's rows of those tokens.
    if (hand_hidden) {
      target.last_hidden(hidden);
      drafter.target_hidden(n0 - 1, std::span<const float>(hidden).first(static_cast<size_t>((n + 1) * target.feature_width())));
    }
    kv.truncate_to(seq, base + n0 + n);
    drafter.rollback(n0 + n);
    const double verify_s = since(t0);

    ++st.rounds;
    st.count_judged(0, static_cast<int>(draft.k()), n);
    st.draft_seconds += draft_s;
    st.verify_seconds += verify_s;
    ++st.rounds_by_draft[draft.k()];
    st.verify_seconds_by_draft[draft.k()] += verify_s;
    draft_length.observe(static_cast<int>(draft.k()), n, draft_s, verify_s);
    draft_length.observe_confidence(draft.confidence, static_cast<int>(draft.k()), n);

    // Emit the round's tokens one at a time with generate()'s stop rules.
    for (int j = 0; j <= n; ++j) {
      const int32_t tok = verdict.tokens[static_cast<size_t>(j)];
      const int64_t tok_position = position + j;
      const TokenOrigin origin = j < n ? TokenOrigin::Accepted : verdict.bonus ? TokenOrigin::Bonus : TokenOrigin::Recovered;
      if (penalties.refuses(tok)) throw std::runtime_error(kListsLeaveNoToken);  // as the sampler ends such a request
      context.push_back(tok);
      penalties.push(tok);
      ++st.generated;
      const FinishReason finish =
          on_token(tok, origin) ? rule.after(tok, st.generated, tok_position, false, penalties.constraint_complete()) : FinishReason::Cancelled;
      if (finish != FinishReason::None) {
        // As generate() leaves it: everything but the last emitted token in the cache.
        kv.truncate_to(seq, tok_position);
        drafter.rollback(static_cast<int64_t>(context.size()) - 1);
        st.finish_reason = finish;
        st.decode_seconds = since(t_decode);
        return st;
      }
    }
  }
}

}  // namespace specula
