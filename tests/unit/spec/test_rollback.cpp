// Rollback: after a thousand rounds of drafting, verifying and truncating at random acceptance
// lengths, the target's and the draft's caches give the logits a fresh prefill of the same
// tokens gives (F32 tiny models, max abs error < 1e-4), and no block leaks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "gpu/host/host_device.h"
#include "gpu/llama.h"
#include "spec/model_drafter.h"
#include "spec/speculative_generate.h"
#include "tests/unit/spec/draft_probe.h"
#include "tests/unit/spec/tiny_llama.h"

namespace specula {
namespace {

constexpr int64_t kCtx = 8192;

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// Next-token logits of `model` after `context`, from a cache that has never been rolled back.
std::vector<float> fresh_logits(LlamaModel& model, const std::vector<int32_t>& context) {
  KvCache kv(model.ops(), model.kv_config(kCtx));
  const int seq = kv.create_sequence();
  ForwardSeq fs{seq, context, false};
  std::vector<float> logits;
  model.forward({&fs, 1}, kv, logits);
  return logits;
}

// q_1 of a drafter for `context` (temperature 1: q = softmax of the draft's logits).
std::vector<float> first_q(Drafter& d, const std::vector<int32_t>& context) { return test::propose_one(d, context).q; }

TEST(Rollback, AfterAThousandRandomRoundsBothCachesMatchAFreshPrefill) {
  HostOps ops(1);
  const ModelWeights tw = test::tiny_llama(11, {.layers = 2, .max_positions = kCtx});
  const ModelWeights dw = test::tiny_llama(12, {.layers = 1, .max_positions = kCtx});
  LlamaModel target(tw, ops), draft(dw, ops);
  KvCache kv(ops, target.kv_config(kCtx));
  const int seq = kv.create_sequence();
  ModelDrafter drafter(draft, kCtx);

  std::vector<int32_t> context = {1, 2, 3};
  std::vector<float> logits;
  {
    ForwardSeq fs{seq, std::span<const int32_t>(context).first(2), false};
    target.forward({&fs, 1}, kv, logits);
    drafter.prefill(context);
  }
  auto rnd = [n = int64_t{0}](int64_t bound) mutable {
    return static_cast<int64_t>(philox_uniform(99, n++, RngStream::Token, 0) * static_cast<double>(bound));
  };
  auto expect_caches_match_a_fresh_prefill = [&](int round) {
    // target: feed g on the rolled-back cache, compare, and take it back out
    const int32_t g = context.back();
    ForwardSeq fs{seq, {&g, 1}, false};
    target.forward({&fs, 1}, kv, logits);
    kv.truncate_to(seq, static_cast<int64_t>(context.size()) - 1);
    EXPECT_LT(max_abs_diff(logits, fresh_logits(target, context)), 1e-4f) << "target, round " << round;
    ModelDrafter fresh(draft, kCtx);
    EXPECT_LT(max_abs_diff(first_q(drafter, context), first_q(fresh, context)), 1e-4f) << "draft, round " << round;
  };

  DraftRequest req;
  req.sampling = SamplingParams{1.0f, 0, 1.0f, 5};
  DraftProposal d;
  std::vector<int32_t> verify;
  for (int round = 1; round <= 1000; ++round) {
    const int64_t n0 = static_cast<int64_t>(context.size());
    req.context = context;
    req.position = n0;
    req.max_tokens = static_cast<int>(1 + rnd(5));
    drafter.propose(req, d);
    verify.assign(1, context.back());
    verify.insert(verify.end(), d.tokens.begin(), d.tokens.end());
    ForwardSeq fs{seq, verify, true};
    target.forward({&fs, 1}, kv, logits);
    ASSERT_EQ(static_cast<int64_t>(logits.size()), (d.k() + 1) * 16);

    const int64_t n = rnd(d.k() + 1);  // a random acceptance length, then a random correction
    kv.truncate_to(seq, n0 + n);
    drafter.rollback(n0 + n);
    context.insert(context.end(), d.tokens.begin(), d.tokens.begin() + n);
    context.push_back(static_cast<int32_t>(rnd(16)));

    ASSERT_EQ(kv.length(seq), static_cast<int64_t>(context.size()) - 1);
    ASSERT_LE(drafter.cached_length(), static_cast<int64_t>(context.size()) - 1);
    ASSERT_EQ(kv.blocks_free(), kv.blocks_total() - kv.blocks_needed(kv.length(seq))) << "blocks leaked";
    if (round % 250 == 0) expect_caches_match_a_fresh_prefill(round);
  }
  EXPECT_GT(context.size(), 1500u);
}

TEST(Rollback, SpeculativeGenerateLeavesTheCacheAsGenerateDoes) {
  HostOps ops(1);
  const ModelWeights tw = test::tiny_llama(11, {.layers = 2}), dw = test::tiny_llama(12, {.layers = 1});
  LlamaModel target(tw, ops), draft(dw, ops);
  KvCache kv(ops, target.kv_config(512));
  const int seq = kv.create_sequence();
  ModelDrafter drafter(draft, 512);
  SpeculativeRequest req;
  req.prompt = {4, 8, 15, 1, 3, 10};
  req.max_tokens = 37;
  req.sampling = SamplingParams{1.0f, 0, 1.0f, 3};
  req.draft.k = 5;
  std::vector<int32_t> out;
  const SpeculativeStats st = speculative_generate(target, kv, seq, drafter, req, [&](int32_t t, TokenOrigin) {
    out.push_back(t);
    return true;
  });
  EXPECT_EQ(st.finish_reason, FinishReason::Length);
  EXPECT_EQ(st.generated, 37);
  EXPECT_EQ(kv.length(seq), static_cast<int64_t>(req.prompt.size() + out.size()) - 1);
  EXPECT_LE(drafter.cached_length(), kv.length(seq));
}

}  // namespace
}  // namespace specula
