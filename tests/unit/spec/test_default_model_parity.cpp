// Parity on the default model (SmolLM2-135M-Instruct Q4_1): greedy speculative output with each
// drafter (n-gram, layer skip, the model itself as a separate draft model, prompt lookup in
// front of the trained head) equals target-only
// greedy output token for token, 10 chat prompts x 128 tokens; coupled sampling (temperature
// 0.8, top-p 0.95, a seed per prompt; 48 tokens, to keep the binary short) equals target-only
// sampling token for token. Skips when
// the model is not on disk ($SPECULA_CACHE/models, /root/.cache/specula by default).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "gpu/host/host_device.h"
#include "spec/generate.h"
#include "spec/make_drafter.h"
#include "spec/speculative_generate.h"

namespace specula {
namespace {

constexpr int64_t kCtx = 1024;
constexpr int kPrompts = 10;

std::filesystem::path default_model_path() {
  const char* cache = std::getenv("SPECULA_CACHE");
  return std::filesystem::path(cache && *cache ? cache : "/root/.cache/specula") / "models" /
         "SmolLM2-135M-Instruct.Q4_1.gguf";
}

// The target, loaded once for the binary (two threads, as the CLI defaults to).
struct DefaultModel {
  LoadedModel files;
  HostOps ops{2};
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvCache> kv;
  int seq = -1;
  std::vector<std::vector<int32_t>> prompts;  // the first 10 prompts of chat.jsonl, chat-templated

  static DefaultModel* get() {
    static std::unique_ptr<DefaultModel> m = [] {
      std::unique_ptr<DefaultModel> d;
      if (!std::filesystem::exists(default_model_path())) return d;
      d = std::make_unique<DefaultModel>();
      d->files = load_model(default_model_path().string());
      d->model = std::make_unique<LlamaModel>(d->files.weights, d->ops);
      d->kv = std::make_unique<KvCache>(d->ops, d->model->kv_config(kCtx));
      d->seq = d->kv->create_sequence();
      std::ifstream in(std::string(SPECULA_SHARED_DIR) + "/data/prompts/chat.jsonl");
      std::string line;
      while (static_cast<int>(d->prompts.size()) < kPrompts && std::getline(in, line)) {
        const auto j = nlohmann::json::parse(line);
        std::vector<ChatMessage> msgs;
        for (const auto& m : j["messages"]) msgs.push_back({m["role"], m["content"]});
        d->prompts.push_back(d->files.tokenizer->encode(d->files.chat_template.render(msgs)));
      }
      return d;
    }();
    return m.get();
  }
};

// No stop ids: every run is exactly 128 tokens, so parity covers text past the end of turn too.
GenerateRequest request(const std::vector<int32_t>& prompt, const SamplingParams& sp, int max_tokens) {
  GenerateRequest r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sampling = sp;
  return r;
}

std::vector<int32_t> target_only(DefaultModel& m, const GenerateRequest& req) {
  std::vector<int32_t> out;
  m.kv->truncate_to(m.seq, 0);
  generate(*m.model, *m.kv, m.seq, req, [&](int32_t t) { out.push_back(t); return true; });
  return out;
}

// Runs every prompt through each drafter and compares with target-only output.
void expect_parity(const SamplingParams& base, SpecSampling mode, int max_tokens) {
  DefaultModel* m = DefaultModel::get();
  ASSERT_TRUE(m) << "no default model at " << default_model_path() << ": run scripts/setup.sh (the test command always fetches it)";
  ASSERT_EQ(static_cast<int>(m->prompts.size()), kPrompts) << "chat.jsonl not found under " << SPECULA_SHARED_DIR;
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < kPrompts; ++i) {
    SamplingParams sp = base;
    sp.seed = base.seed + static_cast<uint64_t>(i);
    reqs.push_back(request(m->prompts[static_cast<size_t>(i)], sp, max_tokens));
    want.push_back(target_only(*m, reqs.back()));
    ASSERT_EQ(static_cast<int>(want.back().size()), max_tokens);
  }
  // The model drafting for itself loads the file a second time: a separate draft model that
  // goes through the vocabulary check. The skip drafter (about half its drafts accepted on this
  // model) runs with adaptive K, which also shows parity holds whatever K each round gets.
  struct Draft {
    std::string spelling;
    DraftLengthConfig k;
  };
  const std::vector<Draft> drafts = {{"ngram", {.k = 4}},
                                     {"skip:4-7", {.k = 2, .adaptive = true, .k_min = 1, .k_max = 4}},
                                     {default_model_path().string(), {.k = 4}},
                                     // Prompt lookup in front of the shipped head with adaptive K
                                     // and the entropy rule (the main job's until the seventeenth
                                     // session), with the confidence rule (the main job's until the
                                     // forty-third), and with its automatic threshold (scripts/main_job.args).
                                     {"ngram:n=3+eagle", {.k = 3, .adaptive = true, .k_min = 1, .k_max = 6, .max_entropy = 2}},
                                     {"ngram:n=3+eagle", {.k = 4, .adaptive = true, .k_min = 1, .k_max = 4, .min_confidence = 0.3f}},
                                     {"ngram:n=3+eagle",
                                      {.k = 4, .adaptive = true, .k_min = 1, .k_max = 4, .k_max_greedy = 5, .min_confidence = 0.3f,
                                       .min_confidence_greedy = 0.5f, .confidence_auto = true}}};
  for (const Draft& d : drafts) {
    std::unique_ptr<Drafter> drafter = make_drafter(d.spelling, m->files, *m->model, kCtx);
    SpeculativeStats total;
    for (int i = 0; i < kPrompts; ++i) {
      SpeculativeRequest sreq;
      static_cast<GenerateRequest&>(sreq) = reqs[static_cast<size_t>(i)];
      sreq.draft = d.k;
      sreq.mode = mode;
      std::vector<int32_t> got;
      m->kv->truncate_to(m->seq, 0);
      const SpeculativeStats st = speculative_generate(*m->model, *m->kv, m->seq, *drafter, sreq, [&](int32_t t, TokenOrigin) {
        got.push_back(t);
        return true;
      });
      ASSERT_EQ(got, want[static_cast<size_t>(i)]) << drafter->name() << ", prompt " << i;
      total.rounds += st.rounds;
      total.drafted += st.drafted;
      total.accepted += st.accepted;
      total.draft_seconds += st.draft_seconds;
      total.verify_seconds += st.verify_seconds;
    }
    std::printf("[ stats    ] %s: %lld rounds, %lld drafted, %lld accepted (%.1f%%), %.2f tokens per round\n",
                drafter->name().c_str(), static_cast<long long>(total.rounds), static_cast<long long>(total.drafted),
                static_cast<long long>(total.accepted), 100 * total.acceptance_rate(),
                static_cast<double>(kPrompts * max_tokens) / static_cast<double>(total.rounds));
    EXPECT_GT(total.accepted, 0) << drafter->name() << " never had a draft token accepted";
  }
}

TEST(DefaultModelParity, GreedyOutputOfEveryDrafterEqualsTargetOnlyGreedy) {
  expect_parity(SamplingParams{0.0f, 0, 1.0f, 0}, SpecSampling::Exact, 128);
}

TEST(DefaultModelParity, CoupledOutputOfEveryDrafterEqualsTargetOnlySampling) {
  expect_parity(SamplingParams{0.8f, 0, 0.95f, 20240}, SpecSampling::Coupled, 48);
}

// Penalties and logit bias (spec/penalties.h): greedy and coupled text of every drafter with
// them equal target-only text with them.
TEST(DefaultModelParity, WithPenaltiesGreedyAndCoupledOutputOfEveryDrafterEqualsTargetOnlyOutput) {
  SamplingParams greedy{0.0f, 0, 1.0f, 0};
  greedy.frequency_penalty = 0.5f;
  greedy.presence_penalty = 0.3f;
  greedy.repetition_penalty = 1.1f;
  greedy.logit_bias = {{30, 2.0f}, {17, -5.0f}};
  expect_parity(greedy, SpecSampling::Exact, 64);
  SamplingParams coupled{0.8f, 0, 0.95f, 777};
  coupled.presence_penalty = -0.5f;
  coupled.frequency_penalty = 0.8f;
  expect_parity(coupled, SpecSampling::Coupled, 32);
}

// The row property at model level (docs/kernels.md): on the int8 path each row of a forward is
// computed as it would be alone, so one forward over K+1 tokens gives the logits of K+1 decode
// steps bit for bit, and a batch of two sequences gives each its own logits bit for bit. Then
// greedy speculation equals target-only greedy by construction, not by luck with near-ties.
// The row property at model level on `model` (over its device): a verify forward's K+1 rows equal
// K+1 decode steps, and two sequences in one forward equal each alone, bit for bit.
void expect_rows_equal_decode_steps(LlamaModel& model, Ops& ops, const std::vector<std::vector<int32_t>>& prompts) {
  KvCache cache(ops, model.kv_config(kCtx));
  const int seq = cache.create_sequence();
  const int64_t vocab = model.config().vocab_size;
  for (int p = 0; p < 3; ++p) {
    const std::vector<int32_t>& prompt = prompts[static_cast<size_t>(p)];
    for (int k1 : {2, 6, 16, 40}) {  // 40: a prefill's size (the AVX2 path's lane kernel from 32 rows)
      // The next k1 tokens: the prompt's own continuation stand-in (its tokens again), any ids do.
      std::vector<int32_t> next(static_cast<size_t>(k1));
      for (int i = 0; i < k1; ++i) next[static_cast<size_t>(i)] = prompt[static_cast<size_t>(i) % prompt.size()];
      cache.truncate_to(seq, 0);
      std::vector<float> logits;
      ForwardSeq pre{seq, prompt, false};
      model.forward({&pre, 1}, cache, logits);
      const int64_t start = cache.length(seq);
      ForwardSeq verify{seq, next, true};
      std::vector<float> all;
      model.forward({&verify, 1}, cache, all);
      ASSERT_EQ(static_cast<int64_t>(all.size()), k1 * vocab);
      cache.truncate_to(seq, start);
      for (int i = 0; i < k1; ++i) {
        ForwardSeq step{seq, {&next[static_cast<size_t>(i)], 1}, false};
        model.forward({&step, 1}, cache, logits);
        ASSERT_EQ(std::memcmp(logits.data(), all.data() + i * vocab, static_cast<size_t>(vocab) * sizeof(float)), 0)
            << "prompt " << p << ", K+1 = " << k1 << ": row " << i << " of the verify forward differs from decode step " << i;
      }
    }
  }
  // Two sequences in one forward: each row equals that sequence's forward alone.
  KvCache kv(ops, model.kv_config(kCtx));
  const int a = kv.create_sequence(), b = kv.create_sequence();
  const std::vector<int32_t>& pa = prompts[3];
  const std::vector<int32_t>& pb = prompts[4];
  std::vector<float> together, alone_a, alone_b;
  const ForwardSeq both[] = {{a, pa, true}, {b, pb, true}};
  model.forward(both, kv, together);
  kv.truncate_to(a, 0);
  kv.truncate_to(b, 0);
  ForwardSeq fa{a, pa, true}, fb{b, pb, true};
  model.forward({&fa, 1}, kv, alone_a);
  model.forward({&fb, 1}, kv, alone_b);
  ASSERT_EQ(together.size(), alone_a.size() + alone_b.size());
  EXPECT_EQ(std::memcmp(together.data(), alone_a.data(), alone_a.size() * sizeof(float)), 0) << "sequence a in a batch of two";
  EXPECT_EQ(std::memcmp(together.data() + alone_a.size(), alone_b.data(), alone_b.size() * sizeof(float)), 0) << "sequence b in a batch of two";
}

TEST(DefaultModelRows, AVerifyForwardOfKPlusOneTokensEqualsKPlusOneDecodeStepsBitForBit) {
  DefaultModel* m = DefaultModel::get();
  ASSERT_TRUE(m) << "no default model at " << default_model_path() << ": run scripts/setup.sh (the test command always fetches it)";
  if (m->ops.path().reference) GTEST_SKIP() << "SPECULA_SIMD selects the f32 reference path, whose GEMV and GEMM round differently";
  ASSERT_EQ(static_cast<int>(m->prompts.size()), kPrompts) << "chat.jsonl not found under " << SPECULA_SHARED_DIR;
  expect_rows_equal_decode_steps(*m->model, m->ops, m->prompts);
}

TEST(DefaultModelRows, OverAKVCacheInBf16PairsAVerifyForwardEqualsItsDecodeStepsBitForBit) {
  DefaultModel* m = DefaultModel::get();
  ASSERT_TRUE(m) << "no default model at " << default_model_path() << ": run scripts/setup.sh (the test command always fetches it)";
  ASSERT_EQ(static_cast<int>(m->prompts.size()), kPrompts) << "chat.jsonl not found under " << SPECULA_SHARED_DIR;
  // SPECULA_KV=bf16 (docs/kernels.md, "K and V in bf16 pairs"), read when the device is made.
  ::setenv("SPECULA_KV", "bf16", 1);
  HostOps ops(2);
  ::unsetenv("SPECULA_KV");
  if (ops.path().reference) GTEST_SKIP() << "SPECULA_SIMD selects the f32 reference path";
  LlamaModel model(m->files.weights, ops);
  if (!model.kv_config(kCtx).bf16) GTEST_SKIP() << "this path or CPU has no AVX-512 BF16 attention (" << ops.name() << ")";
  expect_rows_equal_decode_steps(model, ops, m->prompts);
}

// Prefill in pieces (LlamaModel::set_max_forward_rows, docs/engine.md "Prefill in pieces"): a
// forward of more rows than a piece holds runs as pieces in turn, and gives what one forward gives
// bit for bit: the logits (last rows and every row), the features of the logits rows and of every
// row (the trained head's, with EAGLE-3's layers), and the K/V the next step reads. Pieces of 7
// rows split a sequence across pieces and put the end of one with the start of the next.
TEST(DefaultModelRows, AForwardInPiecesGivesTheLogitsFeaturesAndCacheOfOneForwardBitForBit) {
  DefaultModel* m = DefaultModel::get();
  ASSERT_TRUE(m) << "no default model at " << default_model_path() << ": run scripts/setup.sh (the test command always fetches it)";
  ASSERT_EQ(static_cast<int>(m->prompts.size()), kPrompts) << "chat.jsonl not found under " << SPECULA_SHARED_DIR;
  HostOps ops(2);
  if (ops.path().reference) GTEST_SKIP() << "SPECULA_SIMD selects the f32 reference path, whose GEMV and GEMM round differently";
  LlamaModel model(m->files.weights, ops);
  model.set_feature_layers({2, 14});
  std::vector<int32_t> longer = m->prompts[0];  // three prompts end to end: a few hundred tokens
  longer.insert(longer.end(), m->prompts[1].begin(), m->prompts[1].end());
  longer.insert(longer.end(), m->prompts[2].begin(), m->prompts[2].end());
  const std::vector<int32_t>& shorter = m->prompts[5];
  const int32_t next[] = {42};
  struct Out {
    std::vector<float> logits, hidden, hidden_all, step;
  };
  const auto run = [&](int64_t piece_rows, bool all_logits, bool all_hidden) {
    model.set_max_forward_rows(piece_rows);
    KvCache kv(ops, model.kv_config(kCtx));
    const int a = kv.create_sequence(), b = kv.create_sequence();
    const ForwardSeq batch[] = {{a, shorter, all_logits, all_hidden}, {b, longer, all_logits, all_hidden}};
    Out o;
    model.forward(batch, kv, o.logits);
    model.last_hidden(o.hidden);
    model.last_hidden_all(o.hidden_all);
    EXPECT_EQ(kv.length(a), static_cast<int64_t>(shorter.size()));
    EXPECT_EQ(kv.length(b), static_cast<int64_t>(longer.size()));
    // A decode step on each sequence reads every position's K/V the forward wrote.
    const ForwardSeq steps[] = {{a, next, false}, {b, next, false}};
    model.forward(steps, kv, o.step);
    return o;
  };
  const int64_t vocab = model.config().vocab_size, F = model.feature_width();
  const int64_t rows = static_cast<int64_t>(shorter.size() + longer.size());
  for (const bool all_logits : {false, true})
    for (const bool all_hidden : {false, true}) {
      const Out whole = run(4096, all_logits, all_hidden);
      const int64_t out_rows = all_logits ? rows : 2;
      ASSERT_EQ(static_cast<int64_t>(whole.logits.size()), out_rows * vocab);
      ASSERT_EQ(static_cast<int64_t>(whole.hidden.size()), out_rows * F);
      ASSERT_EQ(static_cast<int64_t>(whole.hidden_all.size()), all_hidden ? rows * F : 0);
      for (const int64_t piece : {7, 64}) {
        const Out pieces = run(piece, all_logits, all_hidden);
        const std::string what = "pieces of " + std::to_string(piece) + (all_logits ? ", every row's logits" : ", last rows") +
                                 (all_hidden ? ", every row's features" : "");
        EXPECT_EQ(pieces.logits, whole.logits) << what;
        EXPECT_EQ(pieces.hidden, whole.hidden) << what;
        EXPECT_EQ(pieces.hidden_all, whole.hidden_all) << what;
        EXPECT_EQ(pieces.step, whole.step) << what << ": the next step after it";
      }
    }
}

// A forward in pieces that runs out of cache blocks part way leaves the cache as it was, as one
// forward does: the pieces already run are rolled back.
TEST(DefaultModelRows, AForwardInPiecesThatRunsOutOfBlocksPartWayLeavesTheCacheAsItWas) {
  DefaultModel* m = DefaultModel::get();
  ASSERT_TRUE(m) << "no default model at " << default_model_path() << ": run scripts/setup.sh (the test command always fetches it)";
  ASSERT_EQ(static_cast<int>(m->prompts.size()), kPrompts) << "chat.jsonl not found under " << SPECULA_SHARED_DIR;
  const std::vector<int32_t>& prompt = m->prompts[0];
  ASSERT_GT(prompt.size(), 40u);
  KvCache kv(m->ops, m->model->kv_config(32));  // two blocks of 16: the first pieces fit, the rest do not
  const int other = kv.create_sequence(), seq = kv.create_sequence();
  std::vector<float> logits;
  const ForwardSeq first{other, std::span<const int32_t>(prompt).first(3), false};
  m->model->forward({&first, 1}, kv, logits);
  const int64_t free_before = kv.blocks_free();
  m->model->set_max_forward_rows(8);
  const ForwardSeq batch[] = {{other, std::span<const int32_t>(prompt).subspan(3, 5), false}, {seq, prompt, false}};
  EXPECT_THROW(m->model->forward(batch, kv, logits), KvCacheFull);
  m->model->set_max_forward_rows(LlamaModel::kDefaultMaxForwardRows);
  EXPECT_EQ(kv.length(other), 3);
  EXPECT_EQ(kv.length(seq), 0);
  EXPECT_EQ(kv.blocks_free(), free_before);
  EXPECT_THROW(m->model->set_max_forward_rows(0), std::invalid_argument);
}

}  // namespace
}  // namespace specula
