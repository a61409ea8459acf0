// Parity on the default model (SmolLM2-135M-Instruct Q4_1): greedy speculative output with each
// drafter (n-gram, layer skip, the model itself as a separate draft model) equals target-only
// greedy output token for token, 10 chat prompts x 128 tokens; coupled sampling (temperature
// 0.8, top-p 0.95, a seed per prompt; 48 tokens, to keep the binary short) equals target-only
// sampling token for token. Skips when
// the model is not on disk ($SPECULA_CACHE/models, /root/.cache/specula by default).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
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
                                     {default_model_path().string(), {.k = 4}}};
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

}  // namespace
}  // namespace specula
