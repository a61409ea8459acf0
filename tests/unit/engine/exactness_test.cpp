// Sampled output through the Engine has the target's distribution: a tiny random Llama (vocab 16,
// 2 layers, written as a GGUF file) with the skip:1 self-drafter, the n-gram drafter (on a
// prompt that repeats, so it proposes), or a second tiny Llama with other random weights and the
// same vocabulary as a separate draft model; the joint distribution of the first 2 or 3 tokens
// over thousands of seeded requests passes chi-square against target-only sampling, computed
// exactly by enumeration. With pipelining on and one request at a time, every round is continued
// optimistically, so the last token is judged as the continuation token whenever the drafts
// before it pass; with pipelining on and 8 at a time, the rounds are ping-pong micro-batches
// (two rounds over disjoint requests in flight; the fault hook, used as an observer, counts
// them); with pipelining off, 32 requests run at a time.
// Negative controls: an inverted acceptance ratio planted only in the no-bonus rule (the one the
// continuation uses) fails with pipelining on and is invisible with it off; a residual replaced
// by p fails with pipelining off, in ping-pong micro-batches, and with the n-gram drafter and the
// draft model; the inverted no-bonus ratio fails with the n-gram drafter's continuation.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "actors/engine.h"
#include "gpu/host/host_device.h"
#include "gpu/llama.h"
#include "spec/penalties.h"
#include "spec/sampling.h"
#include "tests/unit/model/model_file_writer.h"
#include "tests/unit/spec/chi_square.h"
#include "tests/unit/spec/tiny_llama.h"

namespace specula::actors {
namespace {

constexpr int64_t kVocab = 16;
const std::vector<int32_t> kPrompt = {5, 11, 2};
// The n-gram drafter finds "5 11" earlier and proposes what followed: 2, then 5, 11, 2, ...
const std::vector<int32_t> kRepeatingPrompt = {5, 11, 2, 5, 11};
const int64_t kRuns = std::getenv("SPECULA_ENGINE_RUNS") ? std::atoll(std::getenv("SPECULA_ENGINE_RUNS")) : 20000;

// A tiny model as a GGUF file: random weights (tests/unit/spec/tiny_llama.h), 16 one-letter
// tokens, no end token. Seed 7 is the target; another seed, a draft model with its vocabulary.
std::string write_tiny_gguf(const test::TempDir& dir, uint64_t seed, const std::string& name) {
  const ModelWeights w = test::tiny_llama(seed, {.vocab = kVocab, .layers = 2, .max_positions = 256});
  const LlamaConfig& c = w.config;
  test::GgufWriter g;
  g.add_string("general.architecture", "llama");
  g.add_string("general.name", name);
  g.add_u32("llama.block_count", static_cast<uint32_t>(c.layers));
  g.add_u32("llama.context_length", static_cast<uint32_t>(c.max_positions));
  g.add_u32("llama.embedding_length", static_cast<uint32_t>(c.hidden));
  g.add_u32("llama.feed_forward_length", static_cast<uint32_t>(c.intermediate));
  g.add_u32("llama.attention.head_count", static_cast<uint32_t>(c.heads));
  g.add_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.kv_heads));
  g.add_u32("llama.attention.key_length", static_cast<uint32_t>(c.head_dim));
  g.add_u32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  g.add_f32("llama.rope.freq_base", c.rope_theta);
  g.add_f32("llama.attention.layer_norm_rms_epsilon", c.rms_eps);
  g.add_string("tokenizer.ggml.model", "gpt2");
  g.add_string("tokenizer.ggml.pre", "gpt-2");
  std::vector<std::string> tokens;
  for (int i = 0; i < kVocab; ++i) tokens.push_back(std::string(1, static_cast<char>('a' + i)));
  g.add_strings("tokenizer.ggml.tokens", tokens);
  g.add_strings("tokenizer.ggml.merges", {});
  auto add = [&](const std::string& name, const TensorView& t) {
    const auto* f = reinterpret_cast<const float*>(t.data);
    g.add_f32_tensor(name, t.shape, std::vector<float>(f, f + t.numel()));
  };
  add("token_embd.weight", w.embed);
  add("output_norm.weight", w.output_norm);
  add("output.weight", w.output);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", L.attn_norm);
    add(p + "attn_q.weight", L.wq);
    add(p + "attn_k.weight", L.wk);
    add(p + "attn_v.weight", L.wv);
    add(p + "attn_output.weight", L.wo);
    add(p + "ffn_norm.weight", L.ffn_norm);
    add(p + "ffn_gate.weight", L.w_gate);
    add(p + "ffn_up.weight", L.w_up);
    add(p + "ffn_down.weight", L.w_down);
  }
  const std::string path = dir.file(name + ".gguf");
  test::write_file(path, g.bytes());
  return path;
}

struct Tiny {
  test::TempDir dir;
  std::string target = write_tiny_gguf(dir, 7, "tiny-engine");
  std::string draft = write_tiny_gguf(dir, 8, "tiny-draft");
};
Tiny& tiny() {
  static Tiny t;
  return t;
}

// P(x1..xn | prompt) under target-only sampling with `sp`, by enumeration (1 + 16 + 256 forwards).
std::vector<double> target_joint(const LoadedModel& files, const SamplingParams& sp, int n,
                                 const std::vector<int32_t>& prompt) {
  HostOps ops(1);
  LlamaModel model(files.weights, ops);
  KvCache kv(ops, model.kv_config(256));
  const int seq = kv.create_sequence();
  std::vector<double> joint(static_cast<size_t>(std::pow(kVocab, n)), 0.0);
  std::vector<float> logits, probs;
  // Extends `prefix` (already in the cache up to its last token) by one token, recursively.
  std::function<void(std::vector<int32_t>&, double)> walk = [&](std::vector<int32_t>& ctx, double mass) {
    const int depth = static_cast<int>(ctx.size() - prompt.size());
    if (depth == n) {
      size_t cell = 0;
      for (int i = 0; i < n; ++i) cell = cell * kVocab + static_cast<size_t>(ctx[prompt.size() + static_cast<size_t>(i)]);
      joint[cell] = mass;
      return;
    }
    kv.truncate_to(seq, 0);
    ForwardSeq fs{seq, ctx, false};
    model.forward({&fs, 1}, kv, logits);
    // Penalties read the output so far (generate()'s adjustment; none without them).
    PenaltyHistory history(sp, prompt, kVocab);
    for (size_t i = prompt.size(); i < ctx.size(); ++i) history.push(ctx[i]);
    PenaltyHistory::Undo undo;
    history.apply(std::span<float>(logits).last(kVocab), {}, undo);
    transform_to_probs(std::span<const float>(logits).last(kVocab), sp, probs);
    const std::vector<float> p = probs;
    for (int32_t t = 0; t < kVocab; ++t) {
      if (p[static_cast<size_t>(t)] == 0) continue;
      ctx.push_back(t);
      walk(ctx, mass * p[static_cast<size_t>(t)]);
      ctx.pop_back();
    }
  };
  std::vector<int32_t> ctx = prompt;
  walk(ctx, 1.0);
  return joint;
}

enum class Bug { None, InvertedRatioWithoutBonus, ResidualIsP };

// The exact rule composed from spec/'s primitives with one step replaced (or none).
RoundOutcome planted(Bug bug, const DraftProposal& draft, std::span<const float> logits, const SamplingParams& sp,
                     int64_t position, SpecSampling mode, bool bonus) {
  if (bug == Bug::None || (bug == Bug::InvertedRatioWithoutBonus && bonus))
    return bonus ? verify_draft(draft, logits, sp, position, mode)
                 : verify_draft_without_bonus(draft, logits, sp, position, mode);
  RoundOutcome out;
  std::vector<float> p;
  for (int64_t i = 0; i < draft.k(); ++i) {
    transform_to_probs(logits.subspan(static_cast<size_t>(i * kVocab), kVocab), sp, p);
    const std::span<const float> q(draft.q.data() + i * kVocab, kVocab);
    const int32_t t = draft.tokens[static_cast<size_t>(i)];
    const double u = acceptance_uniform(sp.seed, position + i);
    const bool accept = bug == Bug::InvertedRatioWithoutBonus ? accept_draft_token(q[t], p[t], u)  // min(1, q/p)
                                                               : accept_draft_token(p[t], q[t], u);
    if (accept) {
      out.tokens.push_back(t);
      ++out.accepted;
      continue;
    }
    std::vector<float> log_p(p.size());
    for (size_t v = 0; v < p.size(); ++v) log_p[v] = p[v] > 0 ? std::log(p[v]) : -INFINITY;
    out.tokens.push_back(bug == Bug::ResidualIsP ? sample_gumbel(log_p, sp.seed, position + i, RngStream::Residual)
                                                 : sample_recovered(p, q, sp.seed, position + i));
    return out;
  }
  if (bonus) {
    transform_to_probs(logits.subspan(static_cast<size_t>(draft.k() * kVocab), kVocab), sp, p);
    std::vector<float> log_p(p.size());
    for (size_t v = 0; v < p.size(); ++v) log_p[v] = p[v] > 0 ? std::log(p[v]) : -INFINITY;
    out.tokens.push_back(sample_gumbel(log_p, sp.seed, position + draft.k(), RngStream::Token));
    out.bonus = true;
  }
  return out;
}

enum class Draft { Skip, Ngram, Model };

struct Setting {
  SamplingParams sp;
  int k = 1;       // K; each request generates k + 1 tokens: one round, its last token the continuation
  bool pipeline = true;
  Bug bug = Bug::None;
  Draft draft = Draft::Skip;
  int wave = 0;    // requests submitted at a time; 0: 1 with pipelining (each alone, continued), else 32
  SpecSampling mode = SpecSampling::Exact;
};

struct Outcome {
  test::ChiSquare chi;
  int64_t drafted = 0, accepted = 0;
  int64_t last_from_draft = 0;  // requests whose last token was an accepted draft token
  int64_t ping_pong = 0;        // draft rounds started while a round over other requests was verified
};

// The fault hook as an observer (it never throws): a request is "in verification" from the
// verifier's hook (the verify stream starts its round) to the sampler's (its Judge arrives). A
// draft round over requests none of which is in verification, started while some are, is the
// ping-pong: two rounds over disjoint halves in flight at once. (An optimistic draft is over the
// very request being verified, so it does not count.)
// On the tiny model a round takes microseconds, less than submitting a request, so a wave would
// mostly run one request at a time; `hold()` makes the next draft round wait (on the draft
// stream) until `release()`, so that a whole wave is submitted before its first draft is ready.
struct PingPongObserver {
  std::mutex mu;
  std::condition_variable cv;
  std::multiset<RequestId> verifying;
  int64_t overlapping_drafts = 0;
  bool holding = false;

  void hold() {
    std::lock_guard lock(mu);
    holding = true;
  }
  void release() {
    {
      std::lock_guard lock(mu);
      holding = false;
    }
    cv.notify_all();
  }
  void see(const std::string& actor, const std::vector<RequestId>& ids) {
    std::unique_lock lock(mu);
    if (actor == "draft" && holding) cv.wait_for(lock, std::chrono::seconds(10), [&] { return !holding; });
    if (actor == "verifier") verifying.insert(ids.begin(), ids.end());
    if (actor == "sampler")
      for (RequestId id : ids)
        if (auto it = verifying.find(id); it != verifying.end()) verifying.erase(it);
    if (actor == "draft" && !verifying.empty() &&
        std::none_of(ids.begin(), ids.end(), [&](RequestId id) { return verifying.count(id) > 0; }))
      ++overlapping_drafts;
  }
};

Outcome run_through_engine(const Setting& s) {
  EngineConfig cfg;
  cfg.target = tiny().target;
  cfg.drafter = s.draft == Draft::Skip ? "skip:1" : s.draft == Draft::Ngram ? "ngram" : tiny().draft;
  cfg.device = "host";
  cfg.draft.k = s.k;
  cfg.max_batch = 32;
  cfg.kv_tokens = 32 * 64;
  cfg.threads = 1;
  cfg.pipeline = s.pipeline;
  cfg.pipeline_on_shared_cores = true;
  if (s.bug != Bug::None)
    cfg.judge_rule = [bug = s.bug](const DraftProposal& d, std::span<const float> l, const SamplingParams& sp, int64_t pos,
                                   SpecSampling mode, bool bonus) { return planted(bug, d, l, sp, pos, mode, bonus); };
  auto observer = std::make_shared<PingPongObserver>();
  cfg.fault_hook = [observer](const std::string& actor, const std::vector<RequestId>& ids) { observer->see(actor, ids); };
  const std::vector<int32_t>& prompt = s.draft == Draft::Ngram ? kRepeatingPrompt : kPrompt;
  const auto t0 = std::chrono::steady_clock::now();
  Engine engine(cfg);
  const int n = s.k + 1;
  std::vector<int64_t> counts(static_cast<size_t>(std::pow(kVocab, n)), 0);
  Outcome run;
  // By default one request at a time with pipelining (so each is alone and continued), else 32.
  const int64_t wave = s.wave > 0 ? s.wave : s.pipeline ? 1 : 32;
  // Other seeds for each drafter and for ping-pong waves (the original settings keep theirs).
  const int seed_set = s.k + 7 * static_cast<int>(s.bug) + 31 * static_cast<int>(s.draft) +
                       (s.pipeline && wave > 1 ? 131 : 0) + (s.mode == SpecSampling::Block ? 257 : 0);
  const bool ping_pong = s.pipeline && wave > 1;
  for (int64_t first = 0; first < kRuns; first += wave) {
    if (ping_pong) observer->hold();
    std::vector<TokenStream> streams;
    for (int64_t i = first; i < std::min(kRuns, first + wave); ++i) {
      EngineRequest r;
      r.prompt_ids = prompt;
      r.max_tokens = n;
      r.sampling = s.sp;
      r.sampling.seed = static_cast<uint64_t>(1000003 * seed_set + i);
      r.mode = s.mode;
      r.stop_ids = std::vector<int32_t>{};
      streams.push_back(engine.start(r));
    }
    if (ping_pong) observer->release();
    for (TokenStream& st : streams) {
      size_t cell = 0;
      int got = 0;
      bool from_draft = false;
      for (;;) {
        StreamEvent ev = st.next_blocking();
        if (ev.kind == StreamEvent::Kind::Token) {
          cell = cell * kVocab + static_cast<size_t>(ev.token);
          ++got;
          from_draft = ev.from_draft;
          continue;
        }
        EXPECT_EQ(ev.kind, StreamEvent::Kind::Done) << ev.error;
        run.drafted += ev.stats.drafted;
        run.accepted += ev.stats.accepted;
        run.last_from_draft += from_draft;
        break;
      }
      EXPECT_EQ(got, n);
      ++counts[cell];
    }
  }
  run.chi = test::chi_square_test(counts, target_joint(engine.model(), s.sp, n, prompt), kRuns);
  {
    std::lock_guard lock(observer->mu);
    run.ping_pong = observer->overlapping_drafts;
  }
  static const char* const kDraftNames[] = {"skip:1", "ngram", "draft model"};
  std::printf("[ engine   ] %s k=%d T=%.1f top-k %d top-p %.2f pipeline %s wave %lld bug %d: %s; accepted %lld of %lld "
              "drafted, last token an accepted draft in %lld of %lld requests, %lld ping-pong draft rounds; %.1f s\n",
              kDraftNames[static_cast<int>(s.draft)], s.k, s.sp.temperature, s.sp.top_k, s.sp.top_p,
              s.pipeline ? "on" : "off", static_cast<long long>(wave), static_cast<int>(s.bug), run.chi.str().c_str(),
              static_cast<long long>(run.accepted), static_cast<long long>(run.drafted),
              static_cast<long long>(run.last_from_draft), static_cast<long long>(kRuns),
              static_cast<long long>(run.ping_pong),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return run;
}

const SamplingParams kPlain{1.0f, 0, 1.0f, 0};
const SamplingParams kTruncated{0.8f, 6, 0.9f, 0};

TEST(EngineExactness, PipelinedSampledOutputOfOneRequestAtATimeHasTheTargetsJointDistribution) {
  const Outcome two = run_through_engine({kPlain, 1, true});
  EXPECT_TRUE(two.chi.pass()) << two.chi.str();
  // Each request is one round whose last token is the continuation token (K = 1, 2 tokens).
  EXPECT_GT(two.last_from_draft, kRuns / 4) << "the continuation token should often be accepted";
  EXPECT_LT(two.accepted, two.drafted) << "some drafts should be rejected";
  const Outcome three = run_through_engine({kTruncated, 2, true});
  EXPECT_TRUE(three.chi.pass()) << three.chi.str();
  EXPECT_GT(three.last_from_draft, kRuns / 20);
}

TEST(EngineExactness, SampledOutputOfThirtyTwoConcurrentRequestsWithoutPipeliningHasTheTargetsJointDistribution) {
  const Outcome two = run_through_engine({kPlain, 1, false});
  EXPECT_TRUE(two.chi.pass()) << two.chi.str();
  EXPECT_EQ(two.last_from_draft, 0) << "without pipelining the second token is always the target's";
  const Outcome three = run_through_engine({kTruncated, 2, false});
  EXPECT_TRUE(three.chi.pass()) << three.chi.str();
}

TEST(EngineExactness, AnInvertedRatioInTheContinuationsRuleFailsWithPipeliningAndIsUnusedWithout) {
  const Outcome on = run_through_engine({kPlain, 1, true, Bug::InvertedRatioWithoutBonus});
  EXPECT_FALSE(on.chi.pass()) << "the planted bug went unnoticed: " << on.chi.str();
  const Outcome off = run_through_engine({kPlain, 1, false, Bug::InvertedRatioWithoutBonus});
  EXPECT_TRUE(off.chi.pass()) << "without pipelining the no-bonus rule is never used: " << off.chi.str();
}

TEST(EngineExactness, AResidualReplacedByPFails) {
  const Outcome r = run_through_engine({kPlain, 1, false, Bug::ResidualIsP});
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
}

// Pipelining with 8 requests at a time: two rounds over disjoint halves in flight (a request
// left alone at the end of a wave is continued optimistically).
TEST(EngineExactness, PipelinedSampledOutputOfEightConcurrentRequestsInPingPongMicroBatchesHasTheTargetsJointDistribution) {
  const Outcome two = run_through_engine({kPlain, 1, true, Bug::None, Draft::Skip, 8});
  EXPECT_TRUE(two.chi.pass()) << two.chi.str();
  EXPECT_GT(two.ping_pong, 0) << "no draft round overlapped the verification of the other half";
  EXPECT_LT(two.accepted, two.drafted) << "some drafts should be rejected";
  const Outcome three = run_through_engine({kTruncated, 2, true, Bug::None, Draft::Skip, 8});
  EXPECT_TRUE(three.chi.pass()) << three.chi.str();
  EXPECT_GT(three.ping_pong, 0);
}

TEST(EngineExactness, AResidualReplacedByPFailsInPingPongMicroBatches) {
  const Outcome r = run_through_engine({kPlain, 1, true, Bug::ResidualIsP, Draft::Skip, 8});
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
  EXPECT_GT(r.ping_pong, 0);
}

// The n-gram drafter (one-hot q) on a repeating prompt: pipelining off (32 at a time), on with
// each request alone (the continuation token is an n-gram proposal) and in ping-pong halves.
TEST(EngineExactness, SampledOutputWithTheNgramDrafterHasTheTargetsJointDistributionWithPipeliningOffAndOn) {
  const Outcome off = run_through_engine({kTruncated, 2, false, Bug::None, Draft::Ngram});
  EXPECT_TRUE(off.chi.pass()) << off.chi.str();
  EXPECT_GT(off.accepted, 0) << "the n-gram drafter should propose and sometimes be right";
  EXPECT_LT(off.accepted, off.drafted);
  const Outcome alone = run_through_engine({kPlain, 1, true, Bug::None, Draft::Ngram});
  EXPECT_TRUE(alone.chi.pass()) << alone.chi.str();
  EXPECT_GT(alone.last_from_draft, 0) << "the continuation token should sometimes be accepted";
  const Outcome ping_pong = run_through_engine({kPlain, 1, true, Bug::None, Draft::Ngram, 8});
  EXPECT_TRUE(ping_pong.chi.pass()) << ping_pong.chi.str();
  EXPECT_GT(ping_pong.ping_pong, 0);
}

TEST(EngineExactness, WithTheNgramDrafterAResidualReplacedByPAndAnInvertedContinuationRatioFail) {
  const Outcome residual = run_through_engine({kPlain, 1, false, Bug::ResidualIsP, Draft::Ngram});
  EXPECT_FALSE(residual.chi.pass()) << "the planted bug went unnoticed: " << residual.chi.str();
  const Outcome inverted = run_through_engine({kPlain, 1, true, Bug::InvertedRatioWithoutBonus, Draft::Ngram});
  EXPECT_FALSE(inverted.chi.pass()) << "the planted bug went unnoticed: " << inverted.chi.str();
}

// A separate draft model (a second tiny Llama, other weights, same vocabulary) by its path, loaded
// once by the engine. It runs without pipelining and in ping-pong halves only (the continuation
// of a model drafter is covered by skip:1, a model drafter on the target's weights).
TEST(EngineExactness, SampledOutputWithASeparateDraftModelHasTheTargetsJointDistributionWithPipeliningOffAndOn) {
  const Outcome off = run_through_engine({kTruncated, 2, false, Bug::None, Draft::Model});
  EXPECT_TRUE(off.chi.pass()) << off.chi.str();
  EXPECT_GT(off.accepted, 0);
  EXPECT_LT(off.accepted, off.drafted) << "a draft model with other weights should be rejected sometimes";
  const Outcome ping_pong = run_through_engine({kPlain, 1, true, Bug::None, Draft::Model, 8});
  EXPECT_TRUE(ping_pong.chi.pass()) << ping_pong.chi.str();
  EXPECT_GT(ping_pong.ping_pong, 0);
}

// Block verification (SpecSampling::Block) through the engine: a draft model at K 2 without
// pipelining, and the skip drafter at K 2 pipelined (each request alone: its round judged as a
// block, then its continuation token by the token rule at the bonus row).
TEST(EngineExactness, BlockVerifiedOutputHasTheTargetsJointDistributionWithPipeliningOffAndOn) {
  const Outcome off = run_through_engine({kTruncated, 2, false, Bug::None, Draft::Model, 0, SpecSampling::Block});
  EXPECT_TRUE(off.chi.pass()) << off.chi.str();
  EXPECT_GT(off.accepted, 0);
  EXPECT_LT(off.accepted, off.drafted);
  const Outcome on = run_through_engine({kTruncated, 2, true, Bug::None, Draft::Skip, 0, SpecSampling::Block});
  EXPECT_TRUE(on.chi.pass()) << on.chi.str();
  EXPECT_GT(on.last_from_draft, kRuns / 20);
}

// Penalties and logit bias through the engine: the sampler adjusts each row by the request's output
// before it, the round's own drafts included, and the continuation's row by the output after the
// round's accepted drafts. Pipelined with each request alone (the last token judged as the
// continuation), 32 at a time without pipelining, and the n-gram drafter on a repeating prompt
// (its proposals are repeats, which the penalties push down). The control: a verifier that leaves
// the round's drafts out of its later rows (test_seams::set_penalties_ignore_draft) fails.
const SamplingParams kPenalized{0.9f, 0, 1.0f, 0, 0.0f, 0.7f, 0.5f, 1.4f, {{3, 1.0f}}};

TEST(EngineExactness, PenalizedSampledOutputHasTheTargetsJointDistributionWithPipeliningOffAndOn) {
  const Outcome alone = run_through_engine({kPenalized, 1, true});
  EXPECT_TRUE(alone.chi.pass()) << alone.chi.str();
  EXPECT_GT(alone.last_from_draft, kRuns / 20) << "the continuation token should often be accepted";
  const Outcome off = run_through_engine({kPenalized, 2, false});
  EXPECT_TRUE(off.chi.pass()) << off.chi.str();
  EXPECT_GT(off.accepted, 0);
  EXPECT_LT(off.accepted, off.drafted);
  const Outcome ngram = run_through_engine({kPenalized, 2, false, Bug::None, Draft::Ngram});
  EXPECT_TRUE(ngram.chi.pass()) << ngram.chi.str();
  EXPECT_GT(ngram.accepted, 0);
}

TEST(EngineExactness, AVerifierThatLeavesTheRoundsDraftsOutOfItsLaterRowsPenaltiesFails) {
  test_seams::set_penalties_ignore_draft(true);
  const Outcome r = run_through_engine({kPenalized, 2, false});
  test_seams::set_penalties_ignore_draft(false);
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
}

TEST(EngineExactness, WithASeparateDraftModelAResidualReplacedByPFails) {
  const Outcome r = run_through_engine({kPlain, 1, false, Bug::ResidualIsP, Draft::Model});
  EXPECT_FALSE(r.chi.pass()) << "the planted bug went unnoticed: " << r.chi.str();
}

}  // namespace
}  // namespace specula::actors
