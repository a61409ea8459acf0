// The engine against the sequential reference loop (spec/speculative_generate.h) on the default
// model (SmolLM2-135M-Instruct Q4_1): greedy equality token for token for the n-gram and skip
// drafters, alone and 16 at a time; a seeded sampled request unchanged by company; cancellation
// returns the KV pool; an injected failure ends only its round's requests. Generations are short
// (32 tokens) to keep the binary near a minute on two cores.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "actors/engine.h"
#include "gpu/host/host_device.h"
#include "spec/make_drafter.h"
#include "spec/speculative_generate.h"

namespace specula::actors {
namespace {

constexpr int kTokens = 32;
constexpr int kPrompts = 4;

std::string default_model_path() {
  const char* cache = std::getenv("SPECULA_CACHE");
  return (std::filesystem::path(cache && *cache ? cache : "/root/.cache/specula") / "models" /
          "SmolLM2-135M-Instruct.Q4_1.gguf")
      .string();
}

// Which round the fault hook should fail: the actor and a request id (0 = none).
struct Fault {
  std::mutex mu;
  std::string actor;
  RequestId id = 0;
};
Fault& fault() {
  static Fault f;
  return f;
}

void fault_hook(const std::string& actor, const std::vector<RequestId>& ids) {
  std::lock_guard lock(fault().mu);
  if (actor != fault().actor) return;
  for (RequestId id : ids)
    if (id == fault().id) throw std::runtime_error("injected fault in " + actor);
}

struct Drafting {
  std::string spelling;
  DraftLengthConfig k;
  bool pipeline = false;
};
const Drafting kNgram{"ngram", {.k = 4}};
const Drafting kSkip{"skip:4-7", {.k = 2}};
const Drafting kNgramPipelined{"ngram", {.k = 4}, true};
const Drafting kSkipPipelined{"skip:4-7", {.k = 2}, true};
// Adaptive K: the load-adaptive policy (on by default) chooses each request's K per round, down to 0.
const Drafting kNgramLoadAdaptive{"ngram", {.k = 4, .adaptive = true, .k_min = 1, .k_max = 6}};

// An engine per drafter plus the sequential reference, built once for the binary.
struct Shared {
  std::unique_ptr<Engine> ngram, skip, ngram_pipelined, skip_pipelined, ngram_load_adaptive;
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
        return EngineConfig{.target = default_model_path(), .drafter = dr.spelling, .device = "host", .draft = dr.k,
                            .max_batch = 16, .kv_tokens = 16 * 128, .threads = 2, .io_threads = 1,
                            .pipeline = dr.pipeline, .trace_path = "", .fault_hook = fault_hook};
      };
      d->ngram = std::make_unique<Engine>(config(kNgram));
      d->skip = std::make_unique<Engine>(config(kSkip));
      d->ngram_pipelined = std::make_unique<Engine>(config(kNgramPipelined));
      d->skip_pipelined = std::make_unique<Engine>(config(kSkipPipelined));
      d->ngram_load_adaptive = std::make_unique<Engine>(config(kNgramLoadAdaptive));
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
    if (d.pipeline) return d.spelling == "ngram" ? *ngram_pipelined : *skip_pipelined;
    return d.spelling == "ngram" ? *ngram : *skip;
  }
  const std::vector<int32_t>& greedy(const Drafting& d, int prompt) {
    auto key = std::make_pair(d.spelling, prompt);
    auto it = greedy_reference.find(key);
    if (it == greedy_reference.end()) it = greedy_reference.emplace(key, reference(d, request(prompt))).first;
    return it->second;
  }

  // No stop ids: every run is exactly kTokens long.
  EngineRequest request(int prompt, SamplingParams sp = {0.0f, 0, 1.0f, 0}) const {
    return EngineRequest{.prompt = {}, .prompt_ids = prompts[static_cast<size_t>(prompt)], .max_tokens = kTokens, .sampling = sp,
                         .draft = std::nullopt, .stop_ids = std::vector<int32_t>{}};
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
      streams.push_back(e.start(s->request(p)));
      got.push_back(collect(streams.back()));
    }
  } else {
    for (int i = 0; i < concurrent; ++i) streams.push_back(e.start(s->request(i % kPrompts)));
    for (TokenStream& st : streams) got.push_back(collect(st));
  }
  int64_t accepted = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].last.kind, StreamEvent::Kind::Done) << got[i].last.error;
    EXPECT_EQ(got[i].last.finish_reason, "length");
    EXPECT_EQ(got[i].tokens, want[i % kPrompts]) << d.spelling << ", request " << i;
    EXPECT_EQ(got[i].last.stats.generated, kTokens);
    accepted += got[i].last.stats.accepted;
  }
  // The load-adaptive policy may rightly draft little or nothing: on 2 CPU threads each verify
  // row costs ~0.37 of a step, more than an n-gram draft token is worth (docs/benchmarks.md).
  if (!d.k.adaptive) EXPECT_GT(accepted, 0) << d.spelling << " never had a draft token accepted";
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

TEST(Engine, GreedyOutputWithTheLoadAdaptivePolicyAloneEqualsTheSequentialLoop) {
  expect_greedy_equality(kNgramLoadAdaptive, 1);
}
TEST(Engine, GreedyOutputOfSixteenConcurrentRequestsWithTheLoadAdaptivePolicyEqualsTheSequentialLoop) {
  expect_greedy_equality(kNgramLoadAdaptive, 16);
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
    EXPECT_EQ(c.last.finish_reason, "cancelled") << "request " << i;
    EXPECT_LT(c.last.stats.generated, 96);
  }
  for (size_t i = 4; i < streams.size(); ++i) EXPECT_EQ(collect(streams[i]).last.finish_reason, "length");
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
  int cancelled = 0;
  for (Sent& x : sent) {
    const Collected c = collect(x.stream);
    ASSERT_EQ(c.last.kind, StreamEvent::Kind::Done) << c.last.error;
    if (x.cancel) {
      cancelled += c.last.finish_reason == "cancelled";
      continue;
    }
    EXPECT_EQ(c.last.finish_reason, "length");
    EXPECT_EQ(static_cast<int>(c.tokens.size()), x.max_tokens);
    if (x.greedy) {
      const std::vector<int32_t>& want = s->greedy(kNgram, x.prompt);
      EXPECT_EQ(c.tokens, std::vector<int32_t>(want.begin(), want.begin() + x.max_tokens));
    }
  }
  EXPECT_GT(cancelled, 8) << "most of the 16 should have been cancelled midway (48 tokens each)";
  EXPECT_TRUE(wait_until_idle_with_full_pool(e)) << e.kv_blocks_free() << " of " << e.kv_blocks_total() << " blocks free";
}

TEST(Engine, AnExceptionInOneRoundFailsOnlyThatRoundsRequestsAndLaterRequestsSucceed) {
  REQUIRE_SETUP(s);
  Engine& e = *s->ngram;
  const std::vector<int32_t> want = s->greedy(kNgram, 1);
  for (const char* actor : {"draft", "verifier", "sampler"}) {
    const uint64_t failures = e.failures();
    TokenStream doomed = e.start(s->request(1));
    {
      std::lock_guard lock(fault().mu);
      fault().actor = actor;
      fault().id = doomed.id();
    }
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
  std::lock_guard lock(fault().mu);
  fault().id = 0;
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
  r.max_tokens = 100000;  // more KV than the whole pool: an error event, not a hang
  TokenStream st = s->ngram->start(r);
  const Collected c = collect(st);
  EXPECT_EQ(c.last.kind, StreamEvent::Kind::Error);
  EXPECT_NE(c.last.error.find("KV blocks"), std::string::npos) << c.last.error;
}

}  // namespace
}  // namespace specula::actors
