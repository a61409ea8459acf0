// The engine against the sequential reference loop (spec/speculative_generate.h) on the default
// model (SmolLM2-135M-Instruct Q4_1): greedy equality token for token for the n-gram, skip and
// draft-model drafters (the model file itself given as the draft model's path: the only model
// with that vocabulary), alone and 16 at a time, pipelining off and on; a seeded sampled request
// unchanged by company; cancellation returns the KV pool; an injected failure ends only its
// round's requests, also while the other ping-pong half is in flight; the coroutine API gives
// what the blocking wrapper gives. Generations are short (32 tokens) to keep the binary's
// runtime down on two cores.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include "tests/unit/engine/default_model.h"
#include "actors/engine.h"
#include "specula/specula.h"
#include "gpu/host/host_device.h"
#include "spec/eagle_drafter.h"
#include "spec/grammar.h"
#include "spec/json_mode.h"
#include "spec/json_schema.h"
#include "spec/make_drafter.h"
#include "spec/speculative_generate.h"

namespace specula::actors {
namespace {

constexpr int kTokens = 32;
constexpr int kPrompts = 4;

// Which round the fault hook should fail: the actor and a request id (0 = none); the first
// `pass` rounds of that actor holding the id go through. It throws once and records the ids of
// the round it failed.
struct Fault {
  std::mutex mu;
  std::string actor;
  RequestId id = 0;
  int pass = 0;
  std::vector<RequestId> thrown;  // the failed round's request ids (empty: not thrown yet)

  void arm(const std::string& a, RequestId i, int p = 0) {
    std::lock_guard lock(mu);
    actor = a;
    id = i;
    pass = p;
    thrown.clear();
  }
  void disarm() {
    std::lock_guard lock(mu);
    id = 0;
  }
  std::vector<RequestId> failed_round() {
    std::lock_guard lock(mu);
    return thrown;
  }
};
Fault& fault() {
  static Fault f;
  return f;
}
// Disarms the hook when a test leaves, also through a failed ASSERT.
struct Disarm {
  ~Disarm() { fault().disarm(); }
};

void fault_hook(const std::string& actor, const std::vector<RequestId>& ids) {
  Fault& f = fault();
  std::lock_guard lock(f.mu);
  if (actor != f.actor || f.id == 0 || !f.thrown.empty()) return;
  if (std::find(ids.begin(), ids.end(), f.id) == ids.end()) return;
  if (f.pass-- > 0) return;
  f.thrown = ids;
  throw std::runtime_error("injected fault in " + actor);
}

struct Drafting {
  std::string spelling;
  DraftLengthConfig k;
  bool pipeline = false;
  int tokens = kTokens;  // per request
};
const Drafting kNgram{"ngram", {.k = 4}};
const Drafting kSkip{"skip:4-7", {.k = 2}};
const Drafting kNgramPipelined{"ngram", {.k = 4}, true};
const Drafting kSkipPipelined{"skip:4-7", {.k = 2}, true};
// A separate draft model given by its path (the model file itself: the only one with its
// vocabulary; each request's drafter loads it and keeps its own KV cache). It costs a target
// forward per draft token, so its requests are 16 tokens long.
const Drafting kModel{default_model_path(), {.k = 3}, false, 16};
const Drafting kModelPipelined{default_model_path(), {.k = 3}, true, 16};
// Adaptive K: the load-adaptive policy (on by default) chooses each request's K per round, down to 0.
const Drafting kNgramLoadAdaptive{"ngram", {.k = 4, .adaptive = true, .k_min = 1, .k_max = 6}};

// An engine per drafter plus the sequential reference, built once for the binary.
struct Shared {
  std::unique_ptr<Engine> ngram, skip, ngram_pipelined, skip_pipelined, ngram_load_adaptive, model_drafter,
      model_drafter_pipelined;
  std::map<std::pair<std::string, int>, std::vector<int32_t>> greedy_reference;  // (drafter, prompt) ->
  HostOps ops{2};
  std::unique_ptr<LlamaModel> model;  // the reference loop's own target, on the engine's weights
  std::unique_ptr<KvCache> kv;
  int seq = -1;
  std::vector<std::vector<int32_t>> prompts;  // the first chat.jsonl prompts, chat-templated

  static Shared* get() {
    static std::unique_ptr<Shared> s = [] {
      std::unique_ptr<Shared> d;
      if (!std::filesystem::exists(default_model_path())) return d;
      d = std::make_unique<Shared>();
      auto config = [](const Drafting& dr) {
        return EngineConfig{.target = default_model_path(), .drafter = dr.spelling, .device = "host", .target_model = {}, .draft_model = {}, .draft = dr.k,
                            .max_batch = 16, .kv_tokens = 16 * 128, .threads = 2, .io_threads = 1,
                            .pipeline = dr.pipeline, .pipeline_on_shared_cores = true, .trace_path = "", .fault_hook = fault_hook, .judge_rule = {}};
      };
      d->ngram = std::make_unique<Engine>(config(kNgram));
      d->skip = std::make_unique<Engine>(config(kSkip));
      d->ngram_pipelined = std::make_unique<Engine>(config(kNgramPipelined));
      d->skip_pipelined = std::make_unique<Engine>(config(kSkipPipelined));
      d->ngram_load_adaptive = std::make_unique<Engine>(config(kNgramLoadAdaptive));
      d->model_drafter = std::make_unique<Engine>(config(kModel));
      d->model_drafter_pipelined = std::make_unique<Engine>(config(kModelPipelined));
      const LoadedModel& files = d->ngram->model();
      d->model = std::make_unique<LlamaModel>(files.weights, d->ops);
      d->kv = std::make_unique<KvCache>(d->ops, d->model->kv_config(1024));
      d->seq = d->kv->create_sequence();
      std::ifstream in(std::string(SPECULA_SHARED_DIR) + "/data/prompts/chat.jsonl");
      std::string line;
      while (static_cast<int>(d->prompts.size()) < kPrompts && std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        std::vector<ChatMessage> msgs;
        for (const auto& m : j["messages"]) msgs.push_back({m["role"], m["content"]});
        d->prompts.push_back(files.tokenizer->encode(files.chat_template.render(msgs)));
      }
      return d;
    }();
    return s.get();
  }
  Engine& engine(const Drafting& d) {
    if (d.k.adaptive) return *ngram_load_adaptive;
    if (d.spelling == kModel.spelling) return d.pipeline ? *model_drafter_pipelined : *model_drafter;
    if (d.pipeline) return d.spelling == "ngram" ? *ngram_pipelined : *skip_pipelined;
    return d.spelling == "ngram" ? *ngram : *skip;
  }
  const std::vector<int32_t>& greedy(const Drafting& d, int prompt) {
    auto key = std::make_pair(d.spelling, prompt);
    auto it = greedy_reference.find(key);
    if (it == greedy_reference.end()) it = greedy_reference.emplace(key, reference(d, request(prompt, d.tokens))).first;
    return it->second;
  }

  // No stop ids: every run is exactly `tokens` long.
  EngineRequest request(int prompt, SamplingParams sp = {0.0f, 0, 1.0f, 0}) const { return request(prompt, kTokens, sp); }
  EngineRequest request(int prompt, int tokens, SamplingParams sp = {0.0f, 0, 1.0f, 0}) const {
    return EngineRequest{.prompt = {}, .prompt_ids = prompts[static_cast<size_t>(prompt)], .max_tokens = tokens, .sampling = sp,
                         .draft = std::nullopt, .stop_ids = std::vector<int32_t>{}, .stop = {}};
  }

  std::vector<int32_t> reference(const Drafting& d, const EngineRequest& r) {
    std::unique_ptr<Drafter> drafter = make_drafter(d.spelling, ngram->model(), *model, 1024);
    SpeculativeRequest sreq;
    sreq.prompt = r.prompt_ids;
    sreq.max_tokens = r.max_tokens;
    sreq.sampling = r.sampling;
    sreq.draft = d.k;
    sreq.mode = r.mode;
    kv->truncate_to(seq, 0);
    std::vector<int32_t> out;
    speculative_generate(*model, *kv, seq, *drafter, sreq, [&](int32_t t, TokenOrigin) {
      out.push_back(t);
      return true;
    });
    return out;
  }
};

#define REQUIRE_SETUP(s)                                                        \
  Shared* s = Shared::get();                                                      \
  if (!s) GTEST_FAIL() << "no default model at " << default_model_path();      \
  ASSERT_EQ(static_cast<int>(s->prompts.size()), kPrompts) << "chat.jsonl not found under " << SPECULA_SHARED_DIR

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  StreamEvent last;
};

Collected collect(TokenStream& stream) {
  Collected c;
  for (;;) {
    StreamEvent ev = stream.next_blocking();
    c.text += ev.text;
    if (!ev.terminal()) {
      c.tokens.push_back(ev.token);
      continue;
    }
    c.last = std::move(ev);
    return c;
  }
}

// Adds `stream`'s events to `into` (which may hold events read before) up to its terminal one.
void read_rest(TokenStream& stream, GenerateResult& into) {
  while (!into.add(stream.next_blocking())) {
  }
}
void read_rest(TokenStream& stream) {
  GenerateResult ignored;
  read_rest(stream, ignored);
}

// Polls (the verifier frees KV after the last event is sent) until the engine is idle with a full pool.
bool wait_until_idle_with_full_pool(Engine& e) {
  for (int i = 0; i < 1000; ++i) {
    if (e.idle() && e.kv_blocks_free() == e.kv_blocks_total()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

void expect_greedy_equality(const Drafting& d, int concurrent) {
  REQUIRE_SETUP(s);
  Engine& e = s->engine(d);
  std::vector<std::vector<int32_t>> want;
  for (int p = 0; p < kPrompts; ++p) want.push_back(s->greedy(d, p));
  std::vector<TokenStream> streams;
  std::vector<Collected> got;
  if (concurrent == 1) {
    for (int p = 0; p < kPrompts; ++p) {
      streams.push_back(e.start(s->request(p, d.tokens)));
      got.push_back(collect(streams.back()));
    }
  } else {
    for (int i = 0; i < concurrent; ++i) streams.push_back(e.start(s->request(i % kPrompts, d.tokens)));
    for (TokenStream& st : streams) got.push_back(collect(st));
  }
  int64_t accepted = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].last.kind, StreamEvent::Kind::Done) << got[i].last.error;
    EXPECT_EQ(got[i].last.finish_reason, FinishReason::Length);
    EXPECT_EQ(got[i].tokens, want[i % kPrompts]) << d.spelling << ", request " << i;
    EXPECT_EQ(got[i].last.stats.generated, d.tokens);
    accepted += got[i].last.stats.accepted;
  }
  // The load-adaptive policy may rightly draft little or nothing: on 2 CPU threads each verify
  // row costs ~0.37 of a step, more than an n-gram draft token is worth (docs/benchmarks.md).
  if (!d.k.adaptive) {
    EXPECT_GT(accepted, 0) << d.spelling << " never had a draft token accepted";
  }
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

TEST(Engine, GreedyOutputWithTheNgramDrafterAloneEqualsTheSequentialLoop) { expect_greedy_equality(kNgram, 1); }
TEST(Engine, GreedyOutputWithTheSkipDrafterAloneEqualsTheSequentialLoop) { expect_greedy_equality(kSkip, 1); }
TEST(Engine, GreedyOutputOfSixteenConcurrentNgramRequestsEqualsTheSequentialLoop) { expect_greedy_equality(kNgram, 16); }
TEST(Engine, GreedyOutputOfSixteenConcurrentSkipRequestsEqualsTheSequentialLoop) { expect_greedy_equality(kSkip, 16); }

TEST(Engine, PipelinedGreedyOutputOfOneNgramRequestEqualsTheSequentialLoop) { expect_greedy_equality(kNgramPipelined, 1); }
TEST(Engine, PipelinedGreedyOutputOfOneSkipRequestEqualsTheSequentialLoop) { expect_greedy_equality(kSkipPipelined, 1); }
TEST(Engine, PipelinedGreedyOutputOfSixteenConcurrentNgramRequestsEqualsTheSequentialLoop) {
  expect_greedy_equality(kNgramPipelined, 16);
}
TEST(Engine, PipelinedGreedyOutputOfSixteenConcurrentSkipRequestsEqualsTheSequentialLoop) {
  expect_greedy_equality(kSkipPipelined, 16);
}

TEST(Engine, GreedyOutputWithADraftModelGivenByPathAloneEqualsTheSequentialLoop) { expect_greedy_equality(kModel, 1); }
TEST(Engine, GreedyOutputOfSixteenConcurrentRequestsWithADraftModelGivenByPathEqualsTheSequentialLoop) {
  expect_greedy_equality(kModel, 16);
}
TEST(Engine, PipelinedGreedyOutputOfOneRequestWithADraftModelGivenByPathEqualsTheSequentialLoop) {
  expect_greedy_equality(kModelPipelined, 1);
}
TEST(Engine, PipelinedGreedyOutputOfSixteenConcurrentRequestsWithADraftModelGivenByPathEqualsTheSequentialLoop) {
  expect_greedy_equality(kModelPipelined, 16);
}

TEST(Engine, GreedyOutputWithTheLoadAdaptivePolicyAloneEqualsTheSequentialLoop) {
  expect_greedy_equality(kNgramLoadAdaptive, 1);
}
TEST(Engine, GreedyOutputOfSixteenConcurrentRequestsWithTheLoadAdaptivePolicyEqualsTheSequentialLoop) {
  expect_greedy_equality(kNgramLoadAdaptive, 16);
}

// An engine of its own for `d` (no pipelining), each prompt's greedy text through it against the
// sequential loop's; the requests' statistics summed.
SpeculativeStats expect_greedy_text_alone(Shared* s, const Drafting& d) {
  Engine e(EngineConfig{.target = default_model_path(), .drafter = d.spelling, .device = "host", .target_model = {},
                        .draft_model = {}, .draft = d.k, .max_batch = 16, .kv_tokens = 16 * 128, .threads = 2,
                        .io_threads = 1, .pipeline = false, .trace_path = "", .fault_hook = {}, .judge_rule = {}});
  SpeculativeStats total;
  for (int p = 0; p < kPrompts; ++p) {
    TokenStream stream = e.start(s->request(p, 96));
    const Collected c = collect(stream);
    EXPECT_EQ(c.last.kind, StreamEvent::Kind::Done) << c.last.error;
    EXPECT_EQ(c.tokens, s->reference(d, s->request(p, 96))) << "prompt " << p;
    total.drafted += c.last.stats.drafted;
    total.accepted += c.last.stats.accepted;
    total.rounds += c.last.stats.rounds;
    total.confidence_threshold_sum += c.last.stats.confidence_threshold_sum;
    total.confidence_rounds += c.last.stats.confidence_rounds;
  }
  return total;
}

TEST(Engine, TheMainJobsDrafterWithTheAutomaticConfidenceThresholdKeepsTheGreedyText) {
  // Prompt lookup in front of the head, the threshold set per round from each request's own
  // measurements (scripts/main_job.args): the scheduler hands each draft item its request's
  // threshold and feeds the proposal's products back to its calibration; greedy requests draft
  // up to 5 tokens a round (k_max_greedy), the others up to 4.
  REQUIRE_SETUP(s);
  const Drafting main_job{"ngram:n=3+eagle", {.k = 4, .adaptive = true, .k_min = 1, .k_max = 4, .k_max_greedy = 5,
                                              .min_confidence = 0.5f, .confidence_auto = true}};
  const SpeculativeStats st = expect_greedy_text_alone(s, main_job);
  EXPECT_GT(st.accepted, 0);
  EXPECT_LT(st.drafted, 5 * st.rounds) << "the rule never ended a draft early";
  EXPECT_LE(st.per_position_acceptance().size(), 5u) << "a greedy round drafted past k_max_greedy";
  // The sampler's statistics carry the thresholds the rounds drafted under; after the warm-up
  // they are the requests' own, not the start.
  ASSERT_GT(st.confidence_rounds, 0);
  EXPECT_GE(st.mean_confidence_threshold(), kAutoConfidenceMin);
  EXPECT_LE(st.mean_confidence_threshold(), kAutoConfidenceMax);
  EXPECT_NE(st.mean_confidence_threshold(), 0.5) << "the threshold never left its start";
}

TEST(Engine, TheTrainedHeadDraftsAtBatchOneUnderTheLoadAdaptivePolicyAndKeepsTheGreedyText) {
  // The head's first drafting round also feeds it every prompt position (a prefill's worth of
  // work for one token); counted as the cost of a draft token it kept the load-adaptive policy at
  // K = 0 for good (0-3 tokens drafted in 16 requests). And where reading the weights dominates, a
  // verify row costs far less than a prefill's rows suggest. Alone, the head must draft.
  REQUIRE_SETUP(s);
  const Drafting head{"eagle", {.k = 4, .adaptive = true, .k_min = 1, .k_max = 6, .max_entropy = 2.0f}};
  const SpeculativeStats st = expect_greedy_text_alone(s, head);
  EXPECT_GE(st.drafted, 20) << "the policy kept the head from drafting";
  EXPECT_GT(st.accepted, 0);
}

TEST(Engine, ARequestWithSpeculationOffDecodesOneTokenPerRoundAndEqualsTheSequentialLoop) {
  REQUIRE_SETUP(s);
  for (Engine* e : {s->ngram.get(), s->ngram_pipelined.get()}) {
    EngineRequest r = s->request(2);
    r.speculate = false;
    TokenStream stream = e->start(r);
    const Collected c = collect(stream);
    ASSERT_EQ(c.last.kind, StreamEvent::Kind::Done) << c.last.error;
    EXPECT_EQ(c.tokens, s->greedy(kNgram, 2));
    EXPECT_EQ(c.last.stats.drafted, 0);
    EXPECT_EQ(c.last.stats.rounds, kTokens);
  }
}

// Every token's log-probabilities through the engine, as the blocking wrapper collects them.
std::vector<TokenLogprobs> logprobs_of(Engine& e, EngineRequest r, int top, std::vector<int32_t>* tokens = nullptr) {
  r.logprobs = top;
  GenerateResult g = e.generate_blocking(std::move(r));
  EXPECT_EQ(g.finish_reason, FinishReason::Length) << g.error;
  EXPECT_EQ(g.logprobs.size(), g.tokens.size());
  if (tokens) *tokens = g.tokens;
  return g.logprobs;
}

void expect_same_bits(const std::vector<TokenLogprobs>& a, const std::vector<TokenLogprobs>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(a[i].logprob), std::bit_cast<uint32_t>(b[i].logprob)) << what << ", token " << i;
    ASSERT_EQ(a[i].top.size(), b[i].top.size()) << what << ", token " << i;
    for (size_t j = 0; j < a[i].top.size(); ++j) {
      EXPECT_EQ(a[i].top[j].first, b[i].top[j].first) << what << ", token " << i << ", alternative " << j;
      EXPECT_EQ(std::bit_cast<uint32_t>(a[i].top[j].second), std::bit_cast<uint32_t>(b[i].top[j].second))
          << what << ", token " << i << ", alternative " << j;
    }
  }
}

TEST(Engine, TheLogprobsOfSpeculativeGreedyTokensAreTheTargetsOwnBitForBit) {
  // A speculative round scores its tokens on verify rows of up to K + 1 tokens; decoding alone
  // scores one row a forward. The int8 path's rows do not depend on the call (issue 12), so the
  // log-probabilities a client reads are the same bits with speculation on or off, pipelined or
  // not, and equal those of one teacher-forced forward over the prompt and the text.
  REQUIRE_SETUP(s);
  constexpr int kTop = 5;
  for (int p = 0; p < 2; ++p) {
    EngineRequest off = s->request(p);
    off.speculate = false;
    std::vector<int32_t> tokens;
    const std::vector<TokenLogprobs> alone = logprobs_of(*s->ngram, off, kTop, &tokens);
    ASSERT_EQ(tokens, s->greedy(kNgram, p));
    SpeculativeStats st;
    {
      EngineRequest on = s->request(p);
      on.logprobs = kTop;
      GenerateResult g = s->ngram->generate_blocking(on);
      ASSERT_EQ(g.tokens, tokens) << g.error;
      EXPECT_GT(g.stats.accepted, 0) << "no round scored more than one token";
      expect_same_bits(g.logprobs, alone, "speculative against speculation off");
    }
    expect_same_bits(logprobs_of(*s->ngram_pipelined, s->request(p), kTop), alone, "pipelined against speculation off");

    // The teacher-forced forward: rows for positions prompt.size() - 1 .. of prompt + text.
    std::vector<int32_t> seqtokens = s->prompts[static_cast<size_t>(p)];
    const size_t first = seqtokens.size() - 1;
    seqtokens.insert(seqtokens.end(), tokens.begin(), tokens.end() - 1);
    s->kv->truncate_to(s->seq, 0);
    ForwardSeq fs{s->seq, seqtokens, true};
    std::vector<float> logits;
    s->model->forward({&fs, 1}, *s->kv, logits);
    const size_t vocab = logits.size() / seqtokens.size();
    std::vector<TokenLogprobs> forced;
    for (size_t i = 0; i < tokens.size(); ++i)
      forced.push_back(token_logprobs(std::span<const float>(logits).subspan((first + i) * vocab, vocab), tokens[i], kTop));
    expect_same_bits(alone, forced, "engine against one teacher-forced forward");
    for (const TokenLogprobs& t : alone) {
      EXPECT_EQ(t.top.size(), static_cast<size_t>(kTop));
      EXPECT_EQ(std::bit_cast<uint32_t>(t.top[0].second), std::bit_cast<uint32_t>(t.logprob)) << "greedy: the token is the most probable";
    }
  }
  // Without the ask, no event carries them.
  EXPECT_TRUE(s->ngram->generate_blocking(s->request(0, 4)).logprobs.empty());
}

// The prompt's log-probabilities (what /v1/completions lists with echo): one a prompt token but the
// first, the same bits as one teacher-forced forward over the prompt, for a prompt longer than a
// piece of kPromptLogprobsRows, on an engine whose prefix cache holds that prompt already (a
// request asking for them takes nothing from it) and whose trained head reads the prefill's
// hidden states. The text and its own log-probabilities do not change.
TEST(Engine, ThePromptsLogprobsAreThoseOfOneTeacherForcedForwardBitForBitPastThePrefixCache) {
  REQUIRE_SETUP(s);
  EngineConfig c{.target = default_model_path(), .drafter = "eagle", .device = "host", .draft = {.k = 4}, .max_batch = 4,
                 .kv_tokens = 4096, .threads = 2};
  c.prefix_cache = true;
  Engine e(c);
  std::vector<int32_t> prompt;
  for (const std::vector<int32_t>& p : s->prompts) prompt.insert(prompt.end(), p.begin(), p.end());
  ASSERT_GT(prompt.size(), static_cast<size_t>(2 * kPromptLogprobsRows)) << "the prompt should span three pieces";
  EngineRequest r = s->request(0, 24);
  r.prompt_ids = prompt;
  r.logprobs = 5;
  const GenerateResult plain = e.generate_blocking(r);
  ASSERT_EQ(plain.finish_reason, FinishReason::Length) << plain.error;
  EXPECT_TRUE(plain.prompt_logprobs.empty()) << "not asked for";

  r.prompt_logprobs = 3;
  const GenerateResult scored = e.generate_blocking(r);
  ASSERT_EQ(scored.finish_reason, FinishReason::Length) << scored.error;
  EXPECT_EQ(scored.tokens, plain.tokens);
  expect_same_bits(scored.logprobs, plain.logprobs, "the text's log-probabilities with the prompt's asked for");
  EXPECT_EQ(scored.stats.cached_prompt_tokens, 0) << "a prompt scored row by row took positions from the cache";
  EXPECT_GT(scored.stats.accepted, 0) << "the head did not draft from the scored prefill's hidden states";

  s->kv->truncate_to(s->seq, 0);
  const ForwardSeq fs{s->seq, std::span<const int32_t>(prompt).first(prompt.size() - 1), true};
  std::vector<float> logits;
  s->model->forward({&fs, 1}, *s->kv, logits);
  const size_t vocab = logits.size() / (prompt.size() - 1);
  std::vector<TokenLogprobs> forced;
  for (size_t i = 0; i + 1 < prompt.size(); ++i)
    forced.push_back(token_logprobs(std::span<const float>(logits).subspan(i * vocab, vocab), prompt[i + 1], 3));
  expect_same_bits(scored.prompt_logprobs, forced, "the prompt's log-probabilities against one teacher-forced forward");

  // A prompt of one token has none to list; the request still runs.
  r.prompt_ids = {prompt.front()};
  const GenerateResult one = e.generate_blocking(r);
  EXPECT_EQ(one.finish_reason, FinishReason::Length) << one.error;
  EXPECT_TRUE(one.prompt_logprobs.empty());
  r.prompt_logprobs = kMaxTopLogprobs + 1;
  EXPECT_THROW(e.start(r), RequestError);
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

// The public API (include/specula/specula.h) carries them on the first event, as the engine gives them.
TEST(Engine, ThePublicApiCarriesThePromptsLogprobsOnItsFirstEventAsTheEngineGivesThem) {
  REQUIRE_SETUP(s);
  specula::Engine api(specula::EngineOptions{.model = default_model_path(), .drafter = "ngram", .threads = 2});
  const std::string text = "The capital of France is Paris. The capital of Italy is";
  EngineRequest r;
  r.prompt = text;
  r.max_tokens = 4;
  r.prompt_logprobs = 2;
  const GenerateResult want = s->ngram->generate_blocking(r);
  ASSERT_TRUE(want.error.empty()) << want.error;
  ASSERT_EQ(want.prompt_logprobs.size(), s->ngram->tokenize(r).size() - 1);
  specula::Request q;
  q.prompt = text;
  q.max_tokens = 4;
  q.prompt_logprobs = 2;
  specula::Stream stream = api.start(q);
  const specula::Event first = stream.next_blocking();
  ASSERT_EQ(first.kind, specula::Event::Kind::Token) << first.error;
  ASSERT_EQ(first.prompt_logprobs.size(), want.prompt_logprobs.size());
  for (size_t i = 0; i < want.prompt_logprobs.size(); ++i) {
    EXPECT_EQ(std::bit_cast<uint32_t>(first.prompt_logprobs[i].logprob), std::bit_cast<uint32_t>(want.prompt_logprobs[i].logprob));
    ASSERT_EQ(first.prompt_logprobs[i].top.size(), 2u);
    EXPECT_EQ(first.prompt_logprobs[i].top[0].token, want.prompt_logprobs[i].top[0].first);
  }
  for (specula::Event ev = stream.next_blocking(); !ev.terminal(); ev = stream.next_blocking())
    EXPECT_TRUE(ev.prompt_logprobs.empty()) << "a later event carries them again";
}

// The public API's stop_token_ids end the text before the token (its text left out, or kept with
// include_stop_str_in_output) and the Done event names it; a stop string is named too.
TEST(Engine, ThePublicApiEndsTheTextAtAStopTokenIdAndNamesWhatEndedIt) {
  REQUIRE_SETUP(s);
  specula::Engine api(specula::EngineOptions{.model = default_model_path(), .drafter = "ngram", .threads = 2});
  const auto run = [&](specula::Request q) {
    std::pair<std::string, specula::Event> out;
    specula::Stream stream = api.start(std::move(q));
    for (specula::Event ev = stream.next_blocking();; ev = stream.next_blocking()) {
      out.first += ev.text;
      if (ev.terminal()) {
        out.second = std::move(ev);
        return out;
      }
    }
  };
  specula::Request q;
  q.prompt = "The capital of France is Paris. The capital of Italy is";
  q.max_tokens = 12;
  q.ignore_eos = true;
  const auto [whole, end] = run(q);
  ASSERT_EQ(end.finish_reason, "length") << end.error;
  EXPECT_EQ(end.stop_token, std::nullopt);
  const std::vector<int32_t> ids = s->ngram->model().tokenizer->encode(whole);
  ASSERT_GE(ids.size(), 4u);
  // A token of the greedy text (its third, once the text is tokenized again; the text generated
  // may have spelled it with other tokens first, so the cut is wherever the token first came).
  const int32_t stop = ids[2];
  q.stop_token_ids = {stop};
  const auto [cut, cut_end] = run(q);
  EXPECT_EQ(cut_end.finish_reason, "stop");
  EXPECT_EQ(cut_end.stop_token, stop);
  EXPECT_TRUE(cut_end.stop_string.empty());
  q.include_stop_str_in_output = true;
  const auto [kept, kept_end] = run(q);
  EXPECT_EQ(kept_end.stop_token, stop);
  EXPECT_EQ(kept, cut + s->ngram->model().tokenizer->decode(std::vector<int32_t>{stop}));
  EXPECT_TRUE(whole.starts_with(kept)) << whole << " / " << kept;
  q.stop_token_ids.clear();
  q.include_stop_str_in_output = false;
  q.stop = {"no such text", whole.substr(cut.size(), 3)};
  const auto [by_string, string_end] = run(q);
  EXPECT_EQ(string_end.stop_string, q.stop[1]);
  EXPECT_EQ(string_end.stop_token, std::nullopt);
  EXPECT_EQ(by_string, whole.substr(0, whole.find(q.stop[1])));
}

// The public API's continue_final_message: the last message left open, the text continuing it,
// what the same prompt's tokens give as a plain prompt; a kwargs string that is not a JSON object
// is one clear error.
TEST(Engine, ThePublicApiContinuesAPrefilledFinalMessageAsThePromptOfItsTemplatedText) {
  REQUIRE_SETUP(s);
  specula::Engine api(specula::EngineOptions{.model = default_model_path(), .drafter = "ngram", .threads = 2});
  const auto text_of = [&](specula::Request q) {
    std::string text;
    specula::Stream stream = api.start(std::move(q));
    for (specula::Event ev = stream.next_blocking();; ev = stream.next_blocking()) {
      text += ev.text;
      if (ev.terminal()) {
        EXPECT_TRUE(ev.error.empty()) << ev.error;
        return std::make_pair(text, ev.stats.prompt_tokens);
      }
    }
  };
  specula::Request q;
  q.messages = {{"user", "What is the capital of France?"}, {"assistant", "The capital of France is"}};
  q.add_generation_prompt = false;
  q.continue_final_message = true;
  q.max_tokens = 8;
  const auto [continued, prompt_tokens] = text_of(q);
  const ChatTemplate& chat = s->ngram->model().chat_template;
  RenderOptions open;
  open.add_generation_prompt = false;
  open.continue_final_message = true;
  const std::string prompt = chat.render({{"user", "What is the capital of France?"}, {"assistant", "The capital of France is"}}, open);
  ASSERT_TRUE(prompt.ends_with("The capital of France is")) << prompt;
  specula::Request plain;
  plain.prompt = prompt;
  plain.max_tokens = 8;
  const auto [as_prompt, plain_tokens] = text_of(plain);
  EXPECT_EQ(continued, as_prompt);
  EXPECT_EQ(prompt_tokens, plain_tokens);
  EXPECT_FALSE(continued.empty());
  q.chat_template_kwargs = "[1]";
  EXPECT_THROW(api.start(q), std::invalid_argument);
  q.chat_template_kwargs = R"({"enable_thinking": false})";  // the default model's template has no such variable
  EXPECT_EQ(text_of(q).first, continued);
}

// The stop token that ends a request has no log-probabilities on its event unless the request
// keeps them (stop_token_logprobs, the server's echo): then every token has its entry.
TEST(Engine, TheStopTokensLogprobsAreKeptOnlyWhenTheRequestAsks) {
  REQUIRE_SETUP(s);
  std::vector<int32_t> tokens;
  const std::vector<TokenLogprobs> all = logprobs_of(*s->ngram, s->request(0, 8), 2, &tokens);
  ASSERT_EQ(tokens.size(), 8u);
  const auto stop_at = static_cast<size_t>(std::find(tokens.begin(), tokens.end(), tokens[5]) - tokens.begin());
  EngineRequest r = s->request(0, 8);
  r.stop_ids = std::vector<int32_t>{tokens[stop_at]};
  r.logprobs = 2;
  const GenerateResult dropped = s->ngram->generate_blocking(r);
  r.stop_token_logprobs = true;
  const GenerateResult kept = s->ngram->generate_blocking(r);
  for (const GenerateResult* g : {&dropped, &kept}) {
    ASSERT_EQ(g->finish_reason, FinishReason::Stop) << g->error;
    EXPECT_EQ(g->tokens, std::vector<int32_t>(tokens.begin(), tokens.begin() + static_cast<std::ptrdiff_t>(stop_at) + 1));
  }
  EXPECT_EQ(dropped.logprobs.size(), stop_at);
  expect_same_bits(kept.logprobs, std::vector<TokenLogprobs>(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(stop_at) + 1),
                   "every token's, the stop token's included");
}

// The prefix cache: a chat's second turn (the first turn's prompt, its reply and a new message)
// on an engine that served the first turn shares the blocks of everything before the new message.
// Its tokens, their log-probabilities (bit for bit), the head's drafts and acceptances, and a
// seeded sampled answer equal an engine without the cache, which prefills the whole history.
TEST(Engine, ASecondTurnSharingTheFirstTurnsBlocksGivesTheSameTokensLogprobsAndDraftsAsAFreshPrefill) {
  REQUIRE_SETUP(s);
  auto config = [](bool prefix_cache) {
    EngineConfig c{.target = default_model_path(), .drafter = "eagle", .device = "host", .draft = {.k = 4}, .max_batch = 4,
                   .kv_tokens = 4096, .threads = 2};
    c.prefix_cache = prefix_cache;
    return c;
  };
  Engine cached(config(true)), fresh(config(false));
  const std::vector<int32_t>& turn1 = s->prompts[0];
  EngineRequest first = s->request(0, 48);
  GenerateResult reply = cached.generate_blocking(first);
  ASSERT_EQ(reply.finish_reason, FinishReason::Length) << reply.error;
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), reply.tokens.begin(), reply.tokens.end());
  const std::vector<int32_t> next = cached.model().tokenizer->encode(
      "<|im_end|>\n<|im_start|>user\nAnd what comes after that?<|im_end|>\n<|im_start|>assistant\n");
  turn2.insert(turn2.end(), next.begin(), next.end());
  EngineRequest second = s->request(0, kTokens);
  second.prompt_ids = turn2;
  second.logprobs = 5;

  const int64_t hits_before = cached.prefix_hit_tokens();
  GenerateResult a = cached.generate_blocking(second), b = fresh.generate_blocking(second);
  ASSERT_EQ(a.finish_reason, FinishReason::Length) << a.error;
  // Every full block of the first turn's prompt and reply, less the head's last 32 rows.
  EXPECT_GE(cached.prefix_hit_tokens() - hits_before, static_cast<int64_t>(turn1.size()));
  EXPECT_EQ(fresh.prefix_hit_tokens(), 0);
  EXPECT_EQ(a.tokens, b.tokens);
  expect_same_bits(a.logprobs, b.logprobs, "a prompt from cached blocks against a fresh prefill");
  EXPECT_GT(a.stats.accepted, 0);
  EXPECT_EQ(a.stats.drafted, b.stats.drafted) << "the head drafted otherwise";
  EXPECT_EQ(a.stats.accepted, b.stats.accepted);

  EngineRequest sampled = second;
  sampled.logprobs = -1;
  sampled.sampling = SamplingParams{0.8f, 40, 0.95f, 7};
  const GenerateResult c = cached.generate_blocking(sampled), d = fresh.generate_blocking(sampled);
  EXPECT_EQ(c.tokens, d.tokens);
  EXPECT_TRUE(wait_until_idle_with_full_pool(cached));
}

// The prefix cache within one round: requests of one prompt that arrive together (OpenAI's n
// choices; one system prompt that many clients send) prefill it once. A verifier hook holds the
// round before them until all four have been started, so they come new into one round: the first
// prefills the whole prompt, and the others start with its blocks in a second forward of the same
// round. Each one's tokens, log-probabilities (bit for bit), drafts and seeded sampled text equal
// an engine without the cache.
TEST(Engine, RequestsOfOnePromptNewInOneRoundPrefillItOnceAndGiveWhatFreshPrefillsGive) {
  REQUIRE_SETUP(s);
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false, open = false;
    std::vector<std::vector<RequestId>> rounds;
  };
  auto gate = std::make_shared<Gate>();
  auto config = [&](bool prefix_cache) {
    EngineConfig c{.target = default_model_path(), .drafter = "eagle", .device = "host", .draft = {.k = 4}, .max_batch = 8,
                   .kv_tokens = 4096, .threads = 2};
    c.prefix_cache = prefix_cache;
    if (prefix_cache)
      c.fault_hook = [gate](const std::string& actor, const std::vector<RequestId>& ids) {
        if (actor != "verifier") return;
        std::unique_lock lock(gate->mu);
        gate->rounds.push_back(ids);
        gate->entered = true;
        gate->cv.notify_all();
        gate->cv.wait(lock, [&] { return gate->open; });
      };
    return c;
  };
  Engine cached(config(true)), fresh(config(false));
  std::vector<int32_t> prompt = cached.model().tokenizer->encode(
      "<|im_start|>system\nYou are a careful assistant for a museum of clocks. Answer visitors' questions about "
      "the collection in short paragraphs, name the clockmakers where you know them, and say so when you do not "
      "know something rather than guessing. Keep to what the labels in the galleries say about each clock's maker, "
      "year and movement.<|im_end|>\n<|im_start|>user\n");
  const std::vector<int32_t>& question = s->prompts[0];
  prompt.insert(prompt.end(), question.begin(), question.end());
  ASSERT_GT(prompt.size(), 100u);  // more than the head's 32 rows and a block
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r = s->request(0, kTokens);
    r.prompt_ids = prompt;
    if (i < 2) {
      r.logprobs = 5;
    } else {
      r.sampling = SamplingParams{0.8f, 40, 0.95f, static_cast<uint64_t>(7 + i)};
    }
    requests.push_back(r);
  }

  // A request of another prompt takes the first round and is held in the verifier ...
  TokenStream other = cached.start(s->request(1, 8));
  {
    std::unique_lock lock(gate->mu);
    ASSERT_TRUE(gate->cv.wait_for(lock, std::chrono::seconds(60), [&] { return gate->entered; }));
  }
  // ... while the four arrive.
  std::vector<TokenStream> streams;
  for (const EngineRequest& r : requests) streams.push_back(cached.start(r));
  {
    std::lock_guard lock(gate->mu);
    gate->open = true;
  }
  gate->cv.notify_all();
  std::vector<GenerateResult> got(4);
  for (size_t i = 0; i < 4; ++i)
    read_rest(streams[i], got[i]);
  GenerateResult other_result;
  read_rest(other, other_result);
  ASSERT_TRUE(other_result.error.empty()) << other_result.error;
  {
    std::lock_guard lock(gate->mu);
    const bool together = std::any_of(gate->rounds.begin(), gate->rounds.end(), [&](const std::vector<RequestId>& ids) {
      return std::all_of(streams.begin(), streams.end(),
                         [&](const TokenStream& t) { return std::count(ids.begin(), ids.end(), t.id()) == 1; });
    });
    ASSERT_TRUE(together) << "the four requests never came into one round; the test shows nothing";
  }

  // The first prefilled the whole prompt; each other one shared every whole block of it but the
  // head's last 32 rows (and g's position).
  const int64_t shareable = static_cast<int64_t>(prompt.size()) - 1 - kEagleCatchUpWindow;
  int64_t first = -1;
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_EQ(got[i].stats.prompt_tokens, static_cast<int64_t>(prompt.size()));
    if (got[i].stats.cached_prompt_tokens < shareable - 15) {
      EXPECT_EQ(first, -1) << "more than one request prefilled the whole prompt";
      first = static_cast<int64_t>(i);
    } else {
      EXPECT_LE(got[i].stats.cached_prompt_tokens, shareable) << "request " << i;
    }
  }
  EXPECT_GE(first, 0) << "every request found the prompt cached: it was not new to the engine";

  for (size_t i = 0; i < 4; ++i) {
    const GenerateResult want = fresh.generate_blocking(requests[i]);
    ASSERT_TRUE(want.error.empty()) << want.error;
    EXPECT_EQ(want.stats.cached_prompt_tokens, 0);
    EXPECT_EQ(got[i].tokens, want.tokens) << "request " << i;
    if (i < 2) {
      expect_same_bits(got[i].logprobs, want.logprobs, "a prompt shared within its round against a fresh prefill");
      EXPECT_EQ(got[i].stats.drafted, want.stats.drafted) << "the head drafted otherwise, request " << i;
      EXPECT_EQ(got[i].stats.accepted, want.stats.accepted) << "request " << i;
    }
  }
  EXPECT_GT(got[0].stats.accepted, 0);
  EXPECT_TRUE(wait_until_idle_with_full_pool(cached));
}

// The request ids of each verifier round, recorded by a fault hook that fails nothing; and a long
// prompt of ~600 tokens made of the chat prompts after the first.
struct VerifierRounds {
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;
  std::vector<std::vector<RequestId>> rounds;

  // While closed, each verify round waits, once recorded, until open() (the scheduler meanwhile
  // takes the requests sent, so they all wait for the round in flight).
  static FaultHook hook(std::shared_ptr<VerifierRounds> r) {
    return [r](const std::string& actor, const std::vector<RequestId>& ids) {
      if (actor != "verifier") return;
      std::unique_lock lock(r->mu);
      r->rounds.push_back(ids);
      r->cv.notify_all();
      r->cv.wait(lock, [&] { return !r->closed; });
    };
  }
  void close() {
    std::lock_guard lock(mu);
    closed = true;
  }
  // Until `n` rounds have been recorded (with close(): the n-th is held).
  void wait_recorded(size_t n) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return rounds.size() >= n; });
  }
  void open() {
    {
      std::lock_guard lock(mu);
      closed = false;
    }
    cv.notify_all();
  }
  // Rounds recorded so far.
  size_t recorded() {
    std::lock_guard lock(mu);
    return rounds.size();
  }
  // The indices of the rounds that held request `id`.
  std::vector<size_t> with(RequestId id) {
    std::lock_guard lock(mu);
    std::vector<size_t> at;
    for (size_t i = 0; i < rounds.size(); ++i)
      if (std::count(rounds[i].begin(), rounds[i].end(), id)) at.push_back(i);
    return at;
  }
};

// An engine of its own with the n-gram drafter (K 4) that records each verify round's requests.
// (`pipeline`: pipelined on the machine's shared cores too, so at batch 1 with the optimistic continuation.)
EngineConfig ngram_config_with_rounds(const std::shared_ptr<VerifierRounds>& rounds, int max_batch, int64_t kv_tokens,
                                      bool pipeline = false, JudgeRule rule = {}) {
  EngineConfig c{.target = default_model_path(), .drafter = "ngram", .device = "host", .draft = {.k = 4},
                 .max_batch = max_batch, .kv_tokens = kv_tokens, .threads = 2};
  c.pipeline = c.pipeline_on_shared_cores = pipeline;
  c.judge_rule = std::move(rule);
  c.fault_hook = VerifierRounds::hook(rounds);
  return c;
}
std::unique_ptr<Engine> ngram_engine_with_rounds(const std::shared_ptr<VerifierRounds>& rounds, int max_batch, int64_t kv_tokens,
                                                 bool pipeline = false, JudgeRule rule = {}) {
  return std::make_unique<Engine>(ngram_config_with_rounds(rounds, max_batch, kv_tokens, pipeline, std::move(rule)));
}

EngineRequest at_priority(EngineRequest r, int priority) {
  r.priority = priority;
  return r;
}

// Sends `first` and then `second` while `first`'s first verify round is held, so that the scheduler
// has both when that round ends (with one place in the batch and `second` of a lower priority
// value, `second` preempts `first` then).
std::pair<TokenStream, TokenStream> start_during_first_round(Engine& e, VerifierRounds& rounds, const EngineRequest& first,
                                                             const EngineRequest& second) {
  rounds.close();
  const size_t before = rounds.recorded();
  TokenStream a = e.start(first);
  rounds.wait_recorded(before + 1);
  TokenStream b = e.start(second);
  rounds.open();
  return {std::move(a), std::move(b)};
}

// Each of `got` came without error or preemption and with the text its request gets alone.
void expect_each_as_alone_unpreempted(Engine& e, const std::vector<EngineRequest>& requests,
                                      const std::vector<GenerateResult>& got) {
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].error.empty()) << got[i].error;
    const GenerateResult alone = e.generate_blocking(requests[i]);
    ASSERT_TRUE(alone.error.empty()) << alone.error;
    EXPECT_EQ(got[i].tokens, alone.tokens) << i;
    EXPECT_EQ(got[i].stats.preemptions, 0) << i;
  }
}

std::vector<int32_t> long_prompt(const Shared& s) {
  std::vector<int32_t> longer;
  while (longer.size() < 600)
    for (int p = 1; p < kPrompts; ++p) longer.insert(longer.end(), s.prompts[p].begin(), s.prompts[p].end());
  return longer;
}

// Prefill in pieces across rounds (docs/engine.md, "Prefill in pieces"): with a budget of 32 prompt
// rows a round, a prompt of ~600 tokens goes into the cache over ~19 rounds, and a request already
// decoding is verified in every one of them instead of waiting for the whole prefill. The long
// request's text, and the trained head's drafts (it reads the target's rows of the prompt, handed
// over piece by piece), equal those of the same request prefilled in one forward; a second request
// of that prompt arriving meanwhile waits for its blocks rather than prefilling its own copy; and
// a pipelined request alone (its first round drafts optimistically, then turns out to be a
// prefill) gives the same text too.
TEST(Engine, ALongPromptIsPrefilledInPiecesWhileAnotherRequestKeepsDecodingAndGivesWhatOneForwardGives) {
  REQUIRE_SETUP(s);
  constexpr int64_t kBudget = 32;
  auto rounds = std::make_shared<VerifierRounds>();
  auto config = [&](int64_t ubatch, bool pipeline) {
    EngineConfig c{.target = default_model_path(), .drafter = "eagle", .device = "host", .draft = {.k = 4}, .max_batch = 4,
                   .kv_tokens = 4096, .threads = 2};
    c.ubatch = ubatch;
    c.pipeline = c.pipeline_on_shared_cores = pipeline;
    c.fault_hook = VerifierRounds::hook(rounds);
    return c;
  };
  Engine pieces(config(kBudget, false)), whole(config(4096, false));
  const std::vector<int32_t> longer = long_prompt(*s);
  EngineRequest decoding = s->request(0, 160);
  EngineRequest b = s->request(1, kTokens), c = s->request(1, kTokens, SamplingParams{0.8f, 40, 0.95f, 11});
  b.prompt_ids = c.prompt_ids = longer;

  // The first request decodes; the two of the long prompt arrive while it does.
  TokenStream first = pieces.start(decoding);
  GenerateResult first_result;
  ASSERT_FALSE(first_result.add(first.next_blocking())) << first_result.error;
  TokenStream tb = pieces.start(b), tc = pieces.start(c);
  GenerateResult got_b, got_c;
  read_rest(tb, got_b);
  read_rest(tc, got_c);
  read_rest(first, first_result);
  ASSERT_TRUE(first_result.error.empty() && got_b.error.empty() && got_c.error.empty())
      << first_result.error << got_b.error << got_c.error;

  // b's rounds: its prefill-only rounds first, then one verify round each (stats.rounds).
  const int64_t rows = static_cast<int64_t>(longer.size()) - 1 - got_b.stats.cached_prompt_tokens;
  const int64_t pieces_needed = (rows + kBudget - 1) / kBudget;
  std::vector<std::vector<RequestId>> with_b;
  for (const size_t r : rounds->with(tb.id())) with_b.push_back(rounds->rounds[r]);
  ASSERT_EQ(static_cast<int64_t>(with_b.size()), pieces_needed - 1 + got_b.stats.rounds)
      << "the prompt's " << rows << " rows not cached should take " << pieces_needed << " rounds of " << kBudget;
  for (int64_t r = 0; r + 1 < pieces_needed; ++r)
    EXPECT_EQ(std::count(with_b[static_cast<size_t>(r)].begin(), with_b[static_cast<size_t>(r)].end(), first.id()), 1)
        << "the decoding request was not verified in the long prompt's prefill round " << r;
  // c came while b's prompt was going in: it waited for b's blocks (all but the head's last rows).
  const int64_t shareable = static_cast<int64_t>(longer.size()) - 1 - kEagleCatchUpWindow;
  EXPECT_GE(got_c.stats.cached_prompt_tokens, shareable - 15) << "the second copy of the prompt prefilled it again";
  EXPECT_LT(got_b.stats.cached_prompt_tokens, 64) << "b's prompt was in the cache before it came (the chat template's start is)";

  for (const auto& [got, request] : {std::pair{&first_result, &decoding}, {&got_b, &b}, {&got_c, &c}}) {
    const GenerateResult want = whole.generate_blocking(*request);
    ASSERT_TRUE(want.error.empty()) << want.error;
    EXPECT_EQ(got->tokens, want.tokens);
    EXPECT_EQ(got->stats.drafted, want.stats.drafted) << "the head drafted otherwise after its rows came in pieces";
    EXPECT_EQ(got->stats.accepted, want.stats.accepted);
  }
  EXPECT_GT(got_b.stats.accepted, 0);
  EXPECT_TRUE(wait_until_idle_with_full_pool(pieces));

  Engine pipelined(config(kBudget, true)), pipelined_whole(config(4096, true));
  const GenerateResult alone = pipelined.generate_blocking(b), alone_whole = pipelined_whole.generate_blocking(b);
  ASSERT_TRUE(alone.error.empty() && alone_whole.error.empty()) << alone.error << alone_whole.error;
  EXPECT_EQ(alone.tokens, got_b.tokens) << "pipelined, alone";
  EXPECT_EQ(alone.stats.drafted, alone_whole.stats.drafted) << "pipelined, alone: the head drafted otherwise";
  EXPECT_EQ(alone.stats.accepted, alone_whole.stats.accepted) << "pipelined, alone";
  EXPECT_TRUE(wait_until_idle_with_full_pool(pipelined));
}

// A short prompt arriving while a long one goes in piece by piece is prefilled in the next round
// (it fits in half a round's rows, which new short prompts get before the prompts going in) and is
// verified there, before the long prompt is in; its text is what it is alone.
TEST(Engine, AShortPromptArrivingBehindALongOneGoesInAtOnceAndKeepsItsText) {
  REQUIRE_SETUP(s);
  constexpr int64_t kBudget = 32;
  auto rounds = std::make_shared<VerifierRounds>();
  EngineConfig c{.target = default_model_path(), .drafter = "ngram", .device = "host", .draft = {.k = 4}, .max_batch = 4,
                 .kv_tokens = 4096, .threads = 2};
  c.ubatch = kBudget;
  c.fault_hook = VerifierRounds::hook(rounds);
  Engine e(c);
  const std::vector<int32_t> longer = long_prompt(*s);
  // The short prompt's blocks but its last partial one are in the cache after a first request of it.
  EngineRequest shorter = s->request(0, 8);
  const GenerateResult alone = e.generate_blocking(shorter);
  ASSERT_TRUE(alone.error.empty()) << alone.error;
  EngineRequest b = s->request(1, 4);
  b.prompt_ids = longer;
  TokenStream tb = e.start(b);
  const auto rounds_with = [&](RequestId id) { return rounds->with(id); };
  // Once the long prompt has had two rounds, the short one comes.
  for (int i = 0; i < 6000 && rounds_with(tb.id()).size() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GE(rounds_with(tb.id()).size(), 2u);
  TokenStream td = e.start(shorter);
  GenerateResult got_b, got_d;
  read_rest(td, got_d);
  read_rest(tb, got_b);
  ASSERT_TRUE(got_b.error.empty() && got_d.error.empty()) << got_b.error << got_d.error;
  EXPECT_EQ(got_d.tokens, alone.tokens);
  const std::vector<size_t> with_b = rounds_with(tb.id()), with_d = rounds_with(td.id());
  const int64_t prefill_only = static_cast<int64_t>(with_b.size()) - got_b.stats.rounds;
  ASSERT_GE(prefill_only, 3) << "the long prompt went in too fast for the test to show anything";
  ASSERT_GE(static_cast<int64_t>(with_d.size()), got_d.stats.rounds);
  // The short request's first verify round came before the long prompt's last prefill-only round.
  const size_t d_verified = with_d[with_d.size() - static_cast<size_t>(got_d.stats.rounds)];
  EXPECT_LT(d_verified, with_b[static_cast<size_t>(prefill_only - 1)]) << "the short prompt waited for the long one's pieces";
  EXPECT_EQ(got_d.stats.rounds, static_cast<int64_t>(with_d.size())) << "the short prompt had a prefill-only round";
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

// Priority (EngineRequest::priority, vLLM's sense): with one place in the batch, requests that
// wait for it are admitted lowest value first, equal values in the order they came; the running one
// (0) is preempted by the -1s, not by the 0s that came after it nor the 1, resumes before those 0s,
// and each gives the text it gives alone.
TEST(Engine, WaitingRequestsAreAdmittedLowestPriorityFirstAndPreemptARunningOneOfHigherValue) {
  REQUIRE_SETUP(s);
  auto rounds = std::make_shared<VerifierRounds>();
  const std::unique_ptr<Engine> engine = ngram_engine_with_rounds(rounds, 1, 4096);
  Engine& e = *engine;
  EngineRequest first = s->request(0, 48);
  const GenerateResult first_alone = e.generate_blocking(first);
  ASSERT_TRUE(first_alone.error.empty()) << first_alone.error;
  ASSERT_EQ(first_alone.stats.preemptions, 0);
  rounds->close();
  TokenStream running = e.start(first);
  // Sent in this order while the first (priority 0) is in its first round: priorities 1, -1, 0, -1, 0.
  const std::vector<int> priorities = {1, -1, 0, -1, 0};
  std::vector<TokenStream> waiting;
  for (size_t i = 0; i < priorities.size(); ++i) {
    EngineRequest r = s->request(static_cast<int>(1 + i % 3), 4);
    r.priority = priorities[i];
    waiting.push_back(e.start(r));
  }
  rounds->open();
  std::vector<GenerateResult> got(waiting.size());
  GenerateResult got_first;
  read_rest(running, got_first);
  for (size_t i = 0; i < waiting.size(); ++i)
    read_rest(waiting[i], got[i]);
  ASSERT_TRUE(got_first.error.empty()) << got_first.error;
  // The -1s preempted it (max_batch 1); it resumed after them with the text it has alone.
  EXPECT_EQ(got_first.stats.preemptions, 1);
  EXPECT_EQ(got_first.tokens, first_alone.tokens);
  EXPECT_EQ(e.preemptions(), 1u);
  std::vector<std::pair<size_t, size_t>> start_of;  // (first round, index in `waiting`)
  for (size_t i = 0; i < waiting.size(); ++i) {
    ASSERT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_EQ(got[i].stats.preemptions, 0) << i;
    const std::vector<int32_t>& alone = s->greedy(kNgram, static_cast<int>(1 + i % 3));
    ASSERT_GE(alone.size(), 4u);
    EXPECT_EQ(got[i].tokens, std::vector<int32_t>(alone.begin(), alone.begin() + 4)) << i;
    const std::vector<size_t> at = rounds->with(waiting[i].id());
    ASSERT_FALSE(at.empty());
    start_of.emplace_back(at.front(), i);
  }
  std::sort(start_of.begin(), start_of.end());
  std::vector<size_t> order;
  for (const auto& [round, i] : start_of) order.push_back(i);
  EXPECT_EQ(order, (std::vector<size_t>{1, 3, 2, 4, 0}));
  // The first ran, stopped while the -1s ran, and went on before the later 0s (it came first).
  const std::vector<size_t> first_at = rounds->with(running.id());
  const size_t minus_from = rounds->with(waiting[1].id()).front(), minus_to = rounds->with(waiting[3].id()).back();
  EXPECT_LT(first_at.front(), minus_from);
  EXPECT_GT(first_at.back(), minus_to);
  EXPECT_EQ(std::count_if(first_at.begin(), first_at.end(), [&](size_t r) { return r > minus_from && r < minus_to; }), 0);
  EXPECT_LT(first_at.back(), rounds->with(waiting[2].id()).front()) << "an equal priority preempted it";
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

// The KV budget, with each request's prompt + max_tokens reserved at admission: a request that fits
// the batch but not the pool preempts a running one of a higher priority value, which then resumes
// with the text it has alone, here sampled in coupled mode (its seed's text, drafts or none); one of
// the same value waits instead.
TEST(Engine, ReservingMaxTokensARequestThatDoesNotFitTheKvPoolPreemptsAHigherValueOneWhichResumesWithItsOwnText) {
  REQUIRE_SETUP(s);
  EngineRequest big = s->request(0, 96, SamplingParams{0.8f, 0, 1.0f, 17});
  big.mode = SpecSampling::Coupled;
  big.priority = 1;
  EngineRequest small = s->request(1, 8);
  const auto blocks = [](const EngineRequest& r) {
    return (static_cast<int64_t>(r.prompt_ids.size()) + r.max_tokens + kMaxDraftTokens + 1 + 15) / 16;
  };
  const int64_t pool = blocks(big) + blocks(small) - 1;  // either fits alone, not both
  auto rounds = std::make_shared<VerifierRounds>();
  EngineConfig config = ngram_config_with_rounds(rounds, 4, pool * 16);
  config.reserve_max_tokens = true;
  config.prefix_cache = false;  // (whole contexts: the prompts' common beginning, the chat template's, not shared)
  Engine e(config);
  ASSERT_EQ(e.kv_blocks_total(), pool);
  const GenerateResult big_alone = e.generate_blocking(big);
  ASSERT_TRUE(big_alone.error.empty()) << big_alone.error;
  for (const int priority : {1, 0}) {
    SCOPED_TRACE("the small request's priority " + std::to_string(priority));
    const std::uint64_t before = e.preemptions();
    rounds->close();
    TokenStream running = e.start(big);
    small.priority = priority;
    TokenStream late = e.start(small);  // while the big one is in its first round
    rounds->open();
    GenerateResult got_big, got_small;
    read_rest(late, got_small);
    read_rest(running, got_big);
    ASSERT_TRUE(got_big.error.empty()) << got_big.error;
    ASSERT_TRUE(got_small.error.empty()) << got_small.error;
    EXPECT_EQ(got_big.tokens, big_alone.tokens);
    const std::vector<int32_t>& alone = s->greedy(kNgram, 1);
    EXPECT_EQ(got_small.tokens, std::vector<int32_t>(alone.begin(), alone.begin() + 8));
    const std::vector<size_t> big_at = rounds->with(running.id()), small_at = rounds->with(late.id());
    ASSERT_FALSE(big_at.empty());
    ASSERT_FALSE(small_at.empty());
    if (priority == 0) {
      EXPECT_EQ(got_big.stats.preemptions, 1);
      EXPECT_EQ(e.preemptions() - before, 1u);
      EXPECT_LT(small_at.back(), big_at.back()) << "the small request did not run before the big one ended";
    } else {
      EXPECT_EQ(got_big.stats.preemptions, 0);
      EXPECT_EQ(e.preemptions(), before);
      EXPECT_GT(small_at.front(), big_at.back()) << "it ran beside the big one: the pool holds only one";
    }
    EXPECT_TRUE(wait_until_idle_with_full_pool(e));
  }
}

// Reserving KV as requests grow (the default, vLLM's): two requests whose prompt + max_tokens do not
// fit the pool together both run at once; when the pool runs out the later one is preempted, waits
// while the earlier one goes on, and resumes with the text it has alone (greedy, and sampled in
// coupled mode); the earlier one is never preempted, also with pipelining, where the two run in
// alternate rounds and the earlier may need blocks while the later one's round holds them.
// Reserving max_tokens at admission, the later one waits for the earlier one's end.
TEST(Engine, ReservingAsTheyGrowTwoRequestsThatDoNotFitTogetherRunAtOnceAndTheLaterIsPreemptedWithItsOwnText) {
  REQUIRE_SETUP(s);
  EngineRequest first = s->request(0, 112), later = s->request(1, 112, SamplingParams{0.8f, 0, 1.0f, 23});
  later.mode = SpecSampling::Coupled;
  const auto blocks = [](const EngineRequest& r) {
    return (static_cast<int64_t>(r.prompt_ids.size()) + r.max_tokens + kMaxDraftTokens + 1 + 15) / 16;
  };
  const int64_t pool = std::max(blocks(first), blocks(later)) + 2;  // either fits alone, not both to their ends
  ASSERT_LT(pool, blocks(first) + blocks(later));
  for (const auto& [reserve_max_tokens, pipeline] : {std::pair{false, false}, {false, true}, {true, false}}) {
    SCOPED_TRACE(std::string(reserve_max_tokens ? "reserving max_tokens" : "reserving as they grow") +
                 (pipeline ? ", pipelined" : ""));
    auto rounds = std::make_shared<VerifierRounds>();
    EngineConfig config = ngram_config_with_rounds(rounds, 4, pool * 16, pipeline);
    config.reserve_max_tokens = reserve_max_tokens;
    Engine e(config);
    ASSERT_EQ(e.kv_blocks_total(), pool);
    const GenerateResult first_alone = e.generate_blocking(first), later_alone = e.generate_blocking(later);
    ASSERT_TRUE(first_alone.error.empty()) << first_alone.error;
    ASSERT_TRUE(later_alone.error.empty()) << later_alone.error;
    ASSERT_EQ(first_alone.tokens.size(), 112u);
    ASSERT_EQ(later_alone.tokens.size(), 112u);
    auto [a, b] = start_during_first_round(e, *rounds, first, later);
    GenerateResult got_first, got_later;
    read_rest(a, got_first);
    read_rest(b, got_later);
    ASSERT_TRUE(got_first.error.empty()) << got_first.error;
    ASSERT_TRUE(got_later.error.empty()) << got_later.error;
    EXPECT_EQ(got_first.tokens, first_alone.tokens);
    EXPECT_EQ(got_later.tokens, later_alone.tokens);
    EXPECT_EQ(got_first.stats.preemptions, 0);
    const std::vector<size_t> first_at = rounds->with(a.id()), later_at = rounds->with(b.id());
    ASSERT_FALSE(first_at.empty());
    ASSERT_FALSE(later_at.empty());
    if (reserve_max_tokens) {
      EXPECT_EQ(got_later.stats.preemptions, 0);
      EXPECT_EQ(e.preemptions(), 0u);
      EXPECT_GT(later_at.front(), first_at.back()) << "it ran beside the first: the pool holds only one";
    } else {
      EXPECT_GE(got_later.stats.preemptions, 1);
      EXPECT_EQ(e.preemptions(), static_cast<std::uint64_t>(got_later.stats.preemptions));
      EXPECT_LT(later_at.front(), first_at.back()) << "it did not run beside the first";
      EXPECT_GT(later_at.back(), first_at.back()) << "it ended before the first: nothing was preempted";
      // Preempted, it stopped while the first went on: rounds of the first alone after it had begun.
      EXPECT_TRUE(std::any_of(first_at.begin(), first_at.end(), [&](size_t r) {
        return r > later_at.front() && !std::binary_search(later_at.begin(), later_at.end(), r);
      }));
    }
    EXPECT_TRUE(wait_until_idle_with_full_pool(e));
  }
}

// Blocks that requests share through the prefix cache count once in the KV budget: four requests
// that start with one ~600-token prompt each reserve ~41 blocks at admission (its 38 and their own), so only two fit a
// pool of 110 blocks at first; once the verifier has named the blocks they share, each holds its
// own few, and all four run in one round, each with the text it has alone. Without the prefix
// cache (nothing shared) no more than two run at once.
TEST(Engine, RequestsSharingAPromptsBlocksCountThemOnceAndRunTogetherWhereTheirWholeContextsWouldNotFit) {
  REQUIRE_SETUP(s);
  const std::vector<int32_t> common = long_prompt(*s);
  std::vector<EngineRequest> requests;
  for (int p = 0; p < 4; ++p) {
    EngineRequest r = s->request(p, 32);
    r.prompt_ids.insert(r.prompt_ids.begin(), common.begin(), common.end());
    requests.push_back(std::move(r));
  }
  const int64_t pool = 110;
  const auto blocks = [](const EngineRequest& r) {
    return (static_cast<int64_t>(r.prompt_ids.size()) + kMaxDraftTokens + 1 + 15) / 16;
  };
  ASSERT_GT(blocks(requests[0]) + blocks(requests[1]) + blocks(requests[2]), pool) << "three would fit unshared";
  for (const bool prefix_cache : {true, false}) {
    SCOPED_TRACE(prefix_cache ? "prefix cache on" : "prefix cache off");
    auto rounds = std::make_shared<VerifierRounds>();
    EngineConfig config = ngram_config_with_rounds(rounds, 4, pool * 16);
    config.prefix_cache = prefix_cache;
    Engine e(config);
    std::vector<TokenStream> streams;
    for (const EngineRequest& r : requests) streams.push_back(e.start(r));
    std::vector<GenerateResult> got(streams.size());
    for (size_t i = 0; i < streams.size(); ++i)
      read_rest(streams[i], got[i]);
    size_t most = 0;
    {
      std::lock_guard lock(rounds->mu);
      for (const std::vector<RequestId>& round : rounds->rounds) most = std::max(most, round.size());
    }
    EXPECT_EQ(most, prefix_cache ? 4u : 2u);
    expect_each_as_alone_unpreempted(e, requests, got);
    EXPECT_TRUE(wait_until_idle_with_full_pool(e));
  }
}

// A request joining while another holds the blocks that its context starts with is charged only
// for the rest (vLLM's scheduler counts prefix-cache hits at admission too): two requests starting
// with a running request's ~600-token prompt, sent during its first round, join a pool that has
// room for one whole context and a little more (the first when that round has named the blocks,
// the second a round later, when the first's sequence has taken them: a block is expected by one
// joining request at a time), and both run while the first does (unpipelined, all three in one
// round), each with its text alone; reserving max_tokens too. Without the prefix cache they wait
// for it to end; and they did with it too while a joining request was charged its whole context
// until its first round.
TEST(Engine, RequestsStartingWithBlocksARunningRequestHoldsAreChargedOnlyForTheRestWhenTheyJoin) {
  REQUIRE_SETUP(s);
  const std::vector<int32_t> common = long_prompt(*s);
  EngineRequest running = s->request(0, 64);
  running.prompt_ids.insert(running.prompt_ids.begin(), common.begin(), common.end());
  std::vector<EngineRequest> joining;
  for (int p = 1; p <= 2; ++p) {
    EngineRequest r = s->request(p, 24);
    r.prompt_ids.insert(r.prompt_ids.begin(), common.begin(), common.end());
    joining.push_back(std::move(r));
  }
  const auto blocks = [](const EngineRequest& r, int tokens) {
    return (static_cast<int64_t>(r.prompt_ids.size()) + tokens + kMaxDraftTokens + 1 + 15) / 16;
  };
  const int64_t pool = blocks(running, running.max_tokens) + 24;
  // (Reserving as they grow, a request joins with its context's blocks and a round's.)
  ASSERT_GT(blocks(running, 0) + blocks(joining[0], 0), pool) << "two whole contexts would fit";
  struct Case {
    bool prefix_cache, pipeline, reserve_max_tokens;
  };
  for (const Case c : {Case{true, false, false}, Case{true, true, false}, Case{true, false, true}, Case{false, false, false}}) {
    SCOPED_TRACE(std::string(c.prefix_cache ? "prefix cache on" : "prefix cache off") + (c.pipeline ? ", pipelined" : "") +
                 (c.reserve_max_tokens ? ", reserving max_tokens" : ""));
    auto rounds = std::make_shared<VerifierRounds>();
    EngineConfig config = ngram_config_with_rounds(rounds, 4, pool * 16, c.pipeline);
    config.prefix_cache = c.prefix_cache;
    config.reserve_max_tokens = c.reserve_max_tokens;
    Engine e(config);
    rounds->close();  // (the others arrive while its first round is held)
    TokenStream first = e.start(running);
    rounds->wait_recorded(1);
    std::vector<TokenStream> streams;
    for (const EngineRequest& r : joining) streams.push_back(e.start(r));
    rounds->open();
    GenerateResult got_first;
    std::vector<GenerateResult> got(streams.size());
    for (size_t i = 0; i < streams.size(); ++i) read_rest(streams[i], got[i]);
    read_rest(first, got_first);
    // (Pipelined, the batch goes in two halves: rounds of two and one.)
    const size_t first_ends = rounds->with(first.id()).back();
    for (const TokenStream& joined : streams)
      EXPECT_EQ(rounds->with(joined.id()).front() < first_ends, c.prefix_cache) << joined.id();
    if (!c.pipeline) {
      size_t most = 0;
      std::lock_guard lock(rounds->mu);
      for (const std::vector<RequestId>& round : rounds->rounds) most = std::max(most, round.size());
      EXPECT_EQ(most, c.prefix_cache ? 3u : 1u);
    }
    ASSERT_TRUE(got_first.error.empty()) << got_first.error;
    EXPECT_EQ(got_first.tokens, e.generate_blocking(running).tokens);
    expect_each_as_alone_unpreempted(e, joining, got);
    EXPECT_TRUE(wait_until_idle_with_full_pool(e));
  }
}

// With pipelining at batch 1 a request whose drafts keep being accepted goes from round to round
// without a boundary between them (the optimistic continuation); a waiting request of a lower value
// breaks that chain and preempts it, and it resumes with its own text. (A rule that accepts every
// draft, the bonus token the target's argmax, makes the chain: the text is not the target's, but it
// is a function of the context, so the same alone and preempted.)
TEST(Engine, WithPipeliningAtBatchOneARunningRequestIsPreemptedAndResumesWithItsOwnText) {
  REQUIRE_SETUP(s);
  auto rounds = std::make_shared<VerifierRounds>();
  JudgeRule accept_all = [](const DraftProposal& d, std::span<const float> logits, const SamplingParams&, int64_t,
                            SpecSampling, bool bonus) {
    RoundOutcome out{static_cast<int>(d.k()), d.tokens, bonus};
    if (bonus) {
      const size_t vocab = logits.size() / static_cast<size_t>(d.k() + 1);
      out.tokens.push_back(static_cast<int32_t>(argmax(logits.subspan(static_cast<size_t>(d.k()) * vocab, vocab))));
    }
    return out;
  };
  const std::unique_ptr<Engine> engine = ngram_engine_with_rounds(rounds, 1, 4096, true, accept_all);
  Engine& e = *engine;
  ASSERT_TRUE(e.pipelined());
  EngineRequest low = at_priority(s->request(0, 96), 1);
  const GenerateResult alone = e.generate_blocking(low);
  ASSERT_TRUE(alone.error.empty()) << alone.error;
  auto [running, high] = start_during_first_round(e, *rounds, low, s->request(2, 8));
  GenerateResult got_low, got_high;
  read_rest(high, got_high);
  read_rest(running, got_low);
  ASSERT_TRUE(got_low.error.empty()) << got_low.error;
  ASSERT_TRUE(got_high.error.empty()) << got_high.error;
  EXPECT_EQ(got_low.stats.preemptions, 1);
  EXPECT_EQ(got_low.tokens, alone.tokens);
  EXPECT_GT(alone.stats.accepted, 48) << "the rule accepted too few drafts to chain rounds";
  // Preempted at the end of the round it was in when the high one came, continued or not.
  const std::vector<size_t> low_at = rounds->with(running.id()), high_at = rounds->with(high.id());
  EXPECT_EQ(std::count_if(low_at.begin(), low_at.end(), [&](size_t r) { return r < high_at.front(); }), 1);
  EXPECT_LT(high_at.back(), low_at.back());
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

// A request that asked for its prompt's log-probabilities gets them once, on its first event, and
// a preemption after that neither scores the prompt again nor changes its text.
TEST(Engine, APreemptedRequestsPromptLogprobsComeOnceAndItsTextIsItsOwn) {
  REQUIRE_SETUP(s);
  auto rounds = std::make_shared<VerifierRounds>();
  const std::unique_ptr<Engine> engine = ngram_engine_with_rounds(rounds, 1, 4096);
  Engine& e = *engine;
  EngineRequest low = at_priority(s->request(0, 32), 1);
  low.prompt_logprobs = 2;
  const GenerateResult alone = e.generate_blocking(low);
  ASSERT_TRUE(alone.error.empty()) << alone.error;
  ASSERT_EQ(alone.prompt_logprobs.size(), low.prompt_ids.size() - 1);
  auto [running, high] = start_during_first_round(e, *rounds, low, s->request(1, 8));
  int with_prompt_logprobs = 0;
  GenerateResult got;
  for (bool end = false; !end;) {
    StreamEvent ev = running.next_blocking();
    with_prompt_logprobs += ev.prompt_logprobs.has_value();
    end = got.add(std::move(ev));
  }
  ASSERT_TRUE(got.error.empty()) << got.error;
  EXPECT_EQ(got.stats.preemptions, 1);
  EXPECT_EQ(with_prompt_logprobs, 1);
  ASSERT_EQ(got.prompt_logprobs.size(), alone.prompt_logprobs.size());
  for (size_t i = 0; i < alone.prompt_logprobs.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(got.prompt_logprobs[i].logprob), std::bit_cast<uint32_t>(alone.prompt_logprobs[i].logprob));
  EXPECT_EQ(got.tokens, alone.tokens);
  read_rest(high);
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

// A preempted request cancelled while it waits to resume ends as cancelled, its text so far kept.
TEST(Engine, APreemptedRequestCancelledWhileItWaitsEndsCancelledWithItsTextSoFar) {
  REQUIRE_SETUP(s);
  auto rounds = std::make_shared<VerifierRounds>();
  const std::unique_ptr<Engine> engine = ngram_engine_with_rounds(rounds, 1, 4096);
  Engine& e = *engine;
  EngineRequest low = at_priority(s->request(0, 64), 1);
  const std::vector<int32_t> alone = e.generate_blocking(low).tokens;
  auto [running, first] = start_during_first_round(e, *rounds, low, s->request(1, 64));
  GenerateResult got_high, got_low;
  ASSERT_FALSE(got_high.add(first.next_blocking()));  // running: the low one is preempted (max_batch 1)
  rounds->close();  // the high one cannot end while the low one is cancelled
  running.cancel();
  read_rest(running, got_low);
  rounds->open();
  read_rest(first, got_high);
  ASSERT_TRUE(got_low.error.empty()) << got_low.error;
  EXPECT_EQ(got_low.finish_reason, FinishReason::Cancelled);
  EXPECT_EQ(got_low.stats.preemptions, 0) << "it never resumed";
  ASSERT_FALSE(got_low.tokens.empty()) << "its first round's tokens";
  ASSERT_LT(got_low.tokens.size(), alone.size());
  EXPECT_EQ(got_low.tokens, std::vector<int32_t>(alone.begin(), alone.begin() + static_cast<std::ptrdiff_t>(got_low.tokens.size())));
  EXPECT_EQ(e.preemptions(), 1u);
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

// Penalties and logit bias on the default model: the engine's greedy text with them, alone, among
// others, pipelined, and with speculation off, equals target-only generate() with them (each
// verify row adjusted by the output before it, the round's drafts included), and it is not the
// text without them.
TEST(Engine, WithPenaltiesGreedyOutputAloneAmongOthersAndPipelinedEqualsTargetOnlyGenerate) {
  REQUIRE_SETUP(s);
  SamplingParams sp{0.0f, 0, 1.0f, 0};
  sp.frequency_penalty = 0.6f;
  sp.presence_penalty = 0.4f;
  sp.repetition_penalty = 1.15f;
  sp.logit_bias = {{28, 3.0f}};
  for (int p = 0; p < 2; ++p) {
    const EngineRequest r = s->request(p, sp);
    GenerateRequest g;
    g.prompt = r.prompt_ids;
    g.max_tokens = r.max_tokens;
    g.sampling = sp;
    std::vector<int32_t> want;
    s->kv->truncate_to(s->seq, 0);
    generate(*s->model, *s->kv, s->seq, g, [&](int32_t t) { want.push_back(t); return true; });
    EXPECT_NE(want, s->greedy(kNgram, p)) << "the penalties changed nothing on prompt " << p;
    int64_t accepted = 0;
    for (Engine* e : {s->ngram.get(), s->ngram_pipelined.get(), s->skip.get()}) {
      const GenerateResult got = e->generate_blocking(r);
      ASSERT_TRUE(got.error.empty()) << got.error;
      EXPECT_EQ(got.tokens, want) << "prompt " << p;
      accepted += got.stats.accepted;
    }
    EngineRequest off = r;
    off.speculate = false;
    EXPECT_EQ(s->ngram->generate_blocking(off).tokens, want) << "speculation off, prompt " << p;
    EXPECT_GT(accepted, 0) << "no draft was accepted: the rows after a draft were never judged";
    std::vector<TokenStream> streams;
    for (int i = 0; i < 6; ++i) streams.push_back(s->ngram->start(i == 3 ? r : s->request(i % kPrompts)));
    std::vector<Collected> got;
    for (TokenStream& st : streams) got.push_back(collect(st));
    EXPECT_EQ(got[3].tokens, want) << "among others, prompt " << p;
  }
  EXPECT_TRUE(wait_until_idle_with_full_pool(*s->ngram));
}

// Greedy output under a constraint (JSON mode or a grammar) on the default model: the engine's
// text, alone, among others, pipelined and with the layer-skip draft, equals target-only
// generate() under it (the masks are per row, the round's drafts in the constraint's state).
// Returns the texts, stop token dropped, for the caller to check against the constraint.
// `with_stops` false: no stop tokens (vLLM's ignore_eos), so only the constraint or max_tokens ends a text.
std::vector<std::string> constrained_greedy_texts(Shared* s, const SamplingParams& sp, bool with_stops = true) {
  const Tokenizer& tok = *s->ngram->model().tokenizer;
  const std::vector<int32_t> stops = with_stops ? tok.eos_ids() : std::vector<int32_t>{};
  auto without_stop = [&](std::vector<int32_t> t) {
    if (!t.empty() && std::find(stops.begin(), stops.end(), t.back()) != stops.end()) t.pop_back();
    return t;
  };
  int64_t accepted = 0;
  std::vector<std::string> texts;
  for (int p = 0; p < kPrompts; ++p) {
    EngineRequest r = s->request(p, 64, sp);
    r.stop_ids = stops;
    GenerateRequest g;
    g.prompt = r.prompt_ids;
    g.max_tokens = r.max_tokens;
    g.sampling = sp;
    g.stop_ids = stops;
    std::vector<int32_t> want;
    s->kv->truncate_to(s->seq, 0);
    generate(*s->model, *s->kv, s->seq, g, [&](int32_t t) { want.push_back(t); return true; });
    want = without_stop(want);
    texts.push_back(tok.decode(want));
    for (Engine* e : {s->ngram.get(), s->ngram_pipelined.get(), s->skip.get()}) {
      const GenerateResult got = e->generate_blocking(r);
      EXPECT_TRUE(got.error.empty()) << got.error;
      EXPECT_EQ(without_stop(got.tokens), want) << "prompt " << p;
      accepted += got.stats.accepted;
    }
    std::vector<TokenStream> streams;
    for (int i = 0; i < 6; ++i) streams.push_back(s->ngram->start(i == 3 ? r : s->request(i % kPrompts)));
    std::vector<Collected> got;
    for (TokenStream& st : streams) got.push_back(collect(st));
    EXPECT_EQ(without_stop(got[3].tokens), want) << "among others, prompt " << p;
  }
  if (with_stops) EXPECT_GT(accepted, 0) << "no draft was accepted: the rows after a draft were never judged";
  EXPECT_TRUE(wait_until_idle_with_full_pool(*s->ngram));
  return texts;
}

// JSON mode (spec/json_mode.h): the text is a JSON object's start, or a whole object when a stop
// token ended it.
TEST(Engine, InJsonModeGreedyOutputAloneAmongOthersAndPipelinedEqualsTargetOnlyGenerateAndIsJson) {
  REQUIRE_SETUP(s);
  SamplingParams sp{0.0f, 0, 1.0f, 0};
  sp.json_object = s->ngram->json_vocabulary();
  ASSERT_TRUE(sp.json_object);
  int closed = 0;
  for (const std::string& text : constrained_greedy_texts(s, sp)) {
    const JsonState state = JsonState{}.feed(text);
    EXPECT_FALSE(state.dead()) << text;
    if (state.done()) {
      ++closed;
      EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << text;
    }
  }
  EXPECT_GT(closed, 0) << "no answer closed its object within 64 tokens";
}

// A JSON schema (spec/json_schema.h, compiled by Engine::grammar): the text is a prefix of the
// schema's grammar, and where whole, JSON with the schema's members in its order.
TEST(Engine, UnderAJsonSchemaGreedyOutputAloneAmongOthersAndPipelinedEqualsTargetOnlyGenerateAndKeepsTheSchema) {
  REQUIRE_SETUP(s);
  const auto schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"topic":{"type":"string","maxLength":24},"answer":{"enum":["yes","no"]},"score":{"type":"integer"}},"required":["topic","answer","score"]})");
  SamplingParams sp{0.0f, 0, 1.0f, 0};
  sp.grammar = s->ngram->grammar(gbnf_of_json_schema(schema));
  ASSERT_TRUE(sp.grammar);
  EXPECT_EQ(s->ngram->grammar(gbnf_of_json_schema(schema)), sp.grammar) << "the same text compiles once";
  int whole = 0;
  for (const std::string& text : constrained_greedy_texts(s, sp)) {
    const GrammarMatcher::State st = sp.grammar->feed(sp.grammar->start(), text);
    EXPECT_NE(st, GrammarMatcher::kDead) << text;
    if (!sp.grammar->accepting(st)) continue;
    ++whole;
    const auto j = nlohmann::ordered_json::parse(text);
    ASSERT_EQ(j.size(), 3u) << text;
    EXPECT_EQ(j.begin().key(), "topic");
    EXPECT_TRUE(j["answer"] == "yes" || j["answer"] == "no") << text;
    EXPECT_TRUE(j["score"].is_number_integer()) << text;
  }
  EXPECT_GT(whole, 0) << "no answer finished the schema's object within 64 tokens";
}

// A grammar that needs more parses at once than a matcher holds (a run of a's cut into parts of
// one to ten): the request ends with an error that says so, not a silent early stop; the engine
// goes on serving; and a matcher whose cache of states is full is not handed to the next request.
TEST(Engine, ARequestWhoseGrammarPassesTheMatchersLimitsEndsWithAnErrorAndTheEngineGoesOn) {
  REQUIRE_SETUP(s);
  Engine& e = *s->ngram;
  const std::string gbnf = "root ::= (\"a\"{1,10}){1000}\n";
  SamplingParams sp{0.0f, 0, 1.0f, 0};
  sp.grammar = e.grammar(gbnf);
  ASSERT_TRUE(sp.grammar);
  TokenStream stream = e.start(s->request(0, 400, sp));
  const Collected got = collect(stream);
  ASSERT_EQ(got.last.kind, StreamEvent::Kind::Error) << "finished after " << got.tokens.size() << " tokens: " << got.text;
  EXPECT_NE(got.last.error.find("the grammar needs more parse states"), std::string::npos) << got.last.error;
  EXPECT_FALSE(got.text.empty());
  EXPECT_EQ(got.text.find_first_not_of('a'), std::string::npos) << got.text;
  EXPECT_EQ(e.grammar(gbnf), sp.grammar) << "too many parses at once is the grammar's own: its matcher stays cached";
  // A matcher whose cache of states is full is spent: the next request with its grammar gets a new one.
  const std::string runs = "root ::= (\"a\"{0,10000} \"b\"){7}\n";
  const auto spent = e.grammar(runs);
  std::string text;
  for (int k = 0; k < 7; ++k) text += std::string(10000, 'a') + "b";
  ASSERT_EQ(spent->feed(spent->start(), text), GrammarMatcher::kOverLimit);
  ASSERT_TRUE(spent->full());
  const auto fresh = e.grammar(runs);
  EXPECT_NE(fresh, spent);
  EXPECT_FALSE(fresh->full());
  EXPECT_EQ(e.grammar(runs), fresh);
  TokenStream after = e.start(s->request(1));
  const Collected plain = collect(after);
  EXPECT_EQ(plain.last.kind, StreamEvent::Kind::Done) << plain.last.error;
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

// Without stop tokens (ignore_eos) a grammar's end ends the text, in the engine as in target-only
// generate: before, the rows after it were left unmasked and the text ran on past the grammar.
TEST(Engine, WithoutStopTokensAGrammarsEndEndsTheTextAloneAmongOthersAndPipelinedAsTargetOnly) {
  REQUIRE_SETUP(s);
  SamplingParams sp{0.0f, 0, 1.0f, 0};
  sp.grammar = s->ngram->grammar("root ::= \"{\\\"answer\\\": \\\"\" (\"yes\" | \"no\") \"\\\"}\"\n");
  ASSERT_TRUE(sp.grammar);
  for (const std::string& text : constrained_greedy_texts(s, sp, false))
    EXPECT_TRUE(text == R"({"answer": "yes"})" || text == R"({"answer": "no"})") << text;
}

TEST(Engine, ASeededSampledRequestGivesTheSameTextAloneAndAmongFifteenOthers) {
  REQUIRE_SETUP(s);
  Engine& e = *s->ngram;
  const SamplingParams sp{0.8f, 0, 0.95f, 1234};
  TokenStream alone_stream = e.start(s->request(0, sp));
  const Collected alone = collect(alone_stream);
  ASSERT_EQ(alone.last.kind, StreamEvent::Kind::Done) << alone.last.error;
  EXPECT_EQ(alone.tokens, s->reference(kNgram, s->request(0, sp)));

  std::vector<TokenStream> streams;
  for (int i = 0; i < 16; ++i) {
    SamplingParams other{0.8f, 0, 0.95f, static_cast<uint64_t>(100 + i)};
    streams.push_back(e.start(i == 7 ? s->request(0, sp) : s->request(i % kPrompts, other)));
  }
  std::vector<Collected> got;
  for (TokenStream& st : streams) got.push_back(collect(st));
  EXPECT_EQ(got[7].text, alone.text);
  EXPECT_EQ(got[7].tokens, alone.tokens);
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

TEST(Engine, CancellingRequestsMidwayReturnsTheKvPoolToFullWhenIdle) {
  REQUIRE_SETUP(s);
  Engine& e = *s->ngram;
  std::vector<TokenStream> streams;
  for (int i = 0; i < 8; ++i) {
    EngineRequest r = s->request(i % kPrompts);
    r.max_tokens = 96;
    streams.push_back(e.start(r));
  }
  for (TokenStream& st : streams) ASSERT_EQ(st.next_blocking().kind, StreamEvent::Kind::Token);
  for (int i = 0; i < 4; ++i) streams[static_cast<size_t>(i)].cancel();
  streams.erase(streams.begin() + 4, streams.begin() + 6);  // dropping a stream cancels it too
  for (int i = 0; i < 4; ++i) {
    const Collected c = collect(streams[static_cast<size_t>(i)]);
    EXPECT_EQ(c.last.kind, StreamEvent::Kind::Done);
    EXPECT_EQ(c.last.finish_reason, FinishReason::Cancelled) << "request " << i;
    EXPECT_LT(c.last.stats.generated, 96);
  }
  for (size_t i = 4; i < streams.size(); ++i) EXPECT_EQ(collect(streams[i]).last.finish_reason, FinishReason::Length);
  EXPECT_TRUE(wait_until_idle_with_full_pool(e)) << e.kv_blocks_free() << " of " << e.kv_blocks_total() << " blocks free";
}

// 64 requests with mixed lengths, K and sampling through the pipelined engine; 16 of them are
// cancelled after their first token. Greedy ones must be prefixes of the 32-token reference.
TEST(Engine, SixtyFourMixedRequestsCompleteAndCancellingSixteenFreesTheirKv) {
  REQUIRE_SETUP(s);
  Engine& e = *s->ngram_pipelined;
  struct Sent {
    TokenStream stream;
    int prompt, max_tokens;
    bool greedy, cancel;
  };
  std::vector<Sent> sent;
  for (int i = 0; i < 64; ++i) {
    const int prompt = i % kPrompts;
    const bool greedy = i % 3 == 0, cancel = i % 4 == 3;
    EngineRequest r = s->request(prompt, greedy ? SamplingParams{0.0f, 0, 1.0f, 0}
                                                : SamplingParams{0.7f, i % 2 ? 40 : 0, 0.9f, static_cast<uint64_t>(i)});
    r.max_tokens = cancel ? 48 : 4 + (i * 7) % 13;
    r.mode = i % 2 ? SpecSampling::Coupled : SpecSampling::Exact;
    r.draft = DraftLengthConfig{.k = 1 + i % 6};
    sent.push_back({e.start(r), prompt, r.max_tokens, greedy, cancel});
  }
  for (Sent& x : sent)
    if (x.cancel) {
      ASSERT_EQ(x.stream.next_blocking().kind, StreamEvent::Kind::Token);
      x.stream.cancel();
    }
  int cancelled = 0, finished_first = 0;  // the latter: all 48 tokens before the cancel arrived
  for (Sent& x : sent) {
    const Collected c = collect(x.stream);
    ASSERT_EQ(c.last.kind, StreamEvent::Kind::Done) << c.last.error;
    if (x.cancel) {
      const size_t tokens = c.tokens.size() + 1;  // with the one read before cancel()
      EXPECT_EQ(c.last.stats.generated, static_cast<int64_t>(tokens));
      if (c.last.finish_reason == FinishReason::Cancelled) {
        ++cancelled;
        EXPECT_LT(tokens, 48u);
      } else if (c.last.finish_reason == FinishReason::Length && tokens == 48u) {
        ++finished_first;
      } else {
        ADD_FAILURE() << "a cancelled request ended with '" << c.last.finish_reason << "' after " << tokens << " tokens";
      }
      continue;
    }
    EXPECT_EQ(c.last.finish_reason, FinishReason::Length);
    EXPECT_EQ(static_cast<int>(c.tokens.size()), x.max_tokens);
    if (x.greedy) {
      const std::vector<int32_t>& want = s->greedy(kNgram, x.prompt);
      EXPECT_EQ(c.tokens, std::vector<int32_t>(want.begin(), want.begin() + x.max_tokens));
    }
  }
  EXPECT_EQ(cancelled + finished_first, 16) << cancelled << " cancelled, " << finished_first << " finished first";
  EXPECT_GT(cancelled, 8) << "most of the 16 should have been cancelled midway (48 tokens each)";
  std::printf("[ cancel   ] %d of 16 cancelled midway, %d finished before the cancel arrived\n", cancelled, finished_first);
  EXPECT_TRUE(wait_until_idle_with_full_pool(e)) << e.kv_blocks_free() << " of " << e.kv_blocks_total() << " blocks free";
}

TEST(Engine, AnExceptionInOneRoundFailsOnlyThatRoundsRequestsAndLaterRequestsSucceed) {
  REQUIRE_SETUP(s);
  Engine& e = *s->ngram;
  const std::vector<int32_t> want = s->greedy(kNgram, 1);
  const Disarm disarm;
  for (const char* actor : {"draft", "verifier", "sampler"}) {
    const uint64_t failures = e.failures();
    TokenStream doomed = e.start(s->request(1));
    fault().arm(actor, doomed.id());
    const Collected c = collect(doomed);
    EXPECT_EQ(c.last.kind, StreamEvent::Kind::Error) << actor;
    EXPECT_NE(c.last.error.find("injected fault in " + std::string(actor)), std::string::npos) << c.last.error;
    EXPECT_EQ(e.failures(), failures + 1) << actor;
    EXPECT_TRUE(wait_until_idle_with_full_pool(e)) << actor;

    TokenStream later = e.start(s->request(1));
    const Collected ok = collect(later);
    ASSERT_EQ(ok.last.kind, StreamEvent::Kind::Done) << actor << ": " << ok.last.error;
    EXPECT_EQ(ok.tokens, want) << actor;
  }
}

// Pipelined, several requests: the scheduler keeps two rounds in flight over disjoint halves of
// the active set. A fault in the doomed request's second round (draft, verify or sampler) fails
// exactly the requests of that round (the hook records them); the other half, in flight at the
// time, and requests submitted after the failure all finish with the reference's tokens.
TEST(Engine, AnExceptionInOnePingPongRoundFailsOnlyItsRequestsWhileTheOtherHalfAndLaterRequestsSucceed) {
  REQUIRE_SETUP(s);
  Engine& e = *s->ngram_pipelined;
  constexpr int kEarlier = 5, kDoomed = 2, kLater = 2, kLength = 16;
  auto prefix = [&](int prompt) {
    const std::vector<int32_t>& want = s->greedy(kNgram, prompt);
    return std::vector<int32_t>(want.begin(), want.begin() + kLength);
  };
  const Disarm disarm;
  for (const char* actor : {"draft", "verifier", "sampler"}) {
    const uint64_t failures = e.failures();
    std::vector<TokenStream> earlier;
    for (int i = 0; i < kEarlier; ++i) {
      earlier.push_back(e.start(s->request(i % kPrompts, kLength)));
      if (i == kDoomed) fault().arm(actor, earlier.back().id(), 1);  // its second round at `actor` fails
    }
    // Wait for the failure, then submit more while the survivors are still running.
    const Collected doomed = collect(earlier[kDoomed]);
    ASSERT_EQ(doomed.last.kind, StreamEvent::Kind::Error) << actor;
    EXPECT_NE(doomed.last.error.find("injected fault in " + std::string(actor)), std::string::npos) << doomed.last.error;
    const std::vector<RequestId> thrown = fault().failed_round();
    const std::set<RequestId> failed_round(thrown.begin(), thrown.end());
    ASSERT_TRUE(failed_round.count(earlier[kDoomed].id())) << actor;
    std::vector<TokenStream> later;
    for (int i = 0; i < kLater; ++i) later.push_back(e.start(s->request(i % kPrompts, kLength)));

    int survivors_in_flight = 0;  // earlier requests outside the failed round
    for (int i = 0; i < kEarlier; ++i) {
      const Collected c = i == kDoomed ? doomed : collect(earlier[static_cast<size_t>(i)]);
      if (failed_round.count(earlier[static_cast<size_t>(i)].id())) {
        EXPECT_EQ(c.last.kind, StreamEvent::Kind::Error) << actor << ", request " << i << " was in the failed round";
        EXPECT_NE(c.last.error.find("injected fault in " + std::string(actor)), std::string::npos) << c.last.error;
        continue;
      }
      ++survivors_in_flight;
      ASSERT_EQ(c.last.kind, StreamEvent::Kind::Done) << actor << ", request " << i << ": " << c.last.error;
      EXPECT_EQ(c.last.finish_reason, FinishReason::Length) << actor << ", request " << i;
      EXPECT_EQ(c.tokens, prefix(i % kPrompts)) << actor << ", request " << i;
    }
    // With two lanes the first two requests start in different rounds, so the doomed one's round
    // never holds every earlier request.
    EXPECT_GE(survivors_in_flight, 1) << actor << ": the failed round held every earlier request";
    for (int i = 0; i < kLater; ++i) {
      const Collected c = collect(later[static_cast<size_t>(i)]);
      ASSERT_EQ(c.last.kind, StreamEvent::Kind::Done) << actor << ", later request " << i << ": " << c.last.error;
      EXPECT_EQ(c.tokens, prefix(i % kPrompts)) << actor << ", later request " << i;
    }
    EXPECT_EQ(e.failures(), failures + 1) << actor;
    EXPECT_TRUE(wait_until_idle_with_full_pool(e)) << actor;
    std::printf("[ fault    ] %s: the failed round held %zu of %d earlier requests\n", actor, failed_round.size(), kEarlier);
  }
}

// The coroutine API driven from an asio coroutine on the test's own io_context: the same tokens,
// text, origins and statistics as the blocking wrapper, and every event resumes the coroutine on
// the io_context's thread (the caller's executor).
TEST(Engine, TheCoroutineApiGivesWhatTheBlockingWrapperGives) {
  REQUIRE_SETUP(s);
  Engine& e = *s->ngram;
  const GenerateResult blocking = e.generate_blocking(s->request(3));
  ASSERT_EQ(blocking.finish_reason, FinishReason::Length) << blocking.error;
  ASSERT_EQ(blocking.tokens, s->greedy(kNgram, 3));

  boost::asio::io_context io;
  GenerateResult got;
  int events = 0, off_thread = 0;
  bool finished = false;
  std::exception_ptr error;
  std::thread::id io_thread;
  boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<void> {
        EngineRequest request = s->request(3);  // named: see actors/engine.h on GCC 12
        TokenStream stream = co_await e.generate(std::move(request));
        for (bool ended = false; !ended;) {
          StreamEvent ev = co_await stream.next();
          ++events;
          off_thread += std::this_thread::get_id() != io_thread;
          ended = got.add(std::move(ev));
        }
        finished = true;
      },
      [&](std::exception_ptr thrown) { error = thrown; });
  io_thread = std::this_thread::get_id();
  io.run();
  ASSERT_FALSE(error);
  ASSERT_TRUE(finished);
  EXPECT_EQ(got.finish_reason, FinishReason::Length) << got.error;
  EXPECT_EQ(got.tokens, blocking.tokens);
  EXPECT_EQ(got.text, blocking.text);
  EXPECT_EQ(got.from_draft, blocking.from_draft);
  EXPECT_EQ(got.stats.generated, blocking.stats.generated);
  EXPECT_EQ(got.stats.rounds, blocking.stats.rounds);
  EXPECT_EQ(got.stats.drafted, blocking.stats.drafted);
  EXPECT_EQ(got.stats.accepted, blocking.stats.accepted);
  EXPECT_EQ(events, kTokens + 1);
  EXPECT_EQ(off_thread, 0) << "events resumed the coroutine off the io_context's thread";
  EXPECT_TRUE(wait_until_idle_with_full_pool(e));
}

TEST(Engine, ABadRequestIsRefusedAtTheBoundaryNamingTheProblem) {
  REQUIRE_SETUP(s);
  EngineRequest r = s->request(0);
  r.max_tokens = 0;
  EXPECT_THROW(s->ngram->start(r), std::invalid_argument);
  r = s->request(0);
  r.sampling.top_p = 0;
  EXPECT_THROW(s->ngram->start(r), std::invalid_argument);
  r = s->request(0);
  r.logprobs = kMaxTopLogprobs + 1;
  EXPECT_THROW(s->ngram->start(r), std::invalid_argument);
  r = s->request(0);
  r.max_tokens = 100000;  // more KV than the whole pool: an error event, not a hang
  TokenStream st = s->ngram->start(r);
  const Collected c = collect(st);
  EXPECT_EQ(c.last.kind, StreamEvent::Kind::Error);
  EXPECT_NE(c.last.error.find("KV blocks"), std::string::npos) << c.last.error;
}

}  // namespace
}  // namespace specula::actors
