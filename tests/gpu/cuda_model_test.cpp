// The tiny random Llama on the CUDA device against the host device: logits, greedy generation
// token for token, and speculative greedy generation token for token. The weights are rounded to
// BF16 first (the device computes with BF16 weights), so both devices run the same function and
// only float32 rounding separates them. Skips, with the reason, where no CUDA GPU is.
#include <gtest/gtest.h>

#include <cstring>

#include "tests/gpu/gpu_test.h"

#ifdef SPECULA_HAVE_CUDA

#include "gpu/cuda/cuda_ops.h"
#include "gpu/host/host_device.h"
#include "gpu/llama.h"
#include "spec/generate.h"
#include "spec/model_drafter.h"
#include "spec/ngram_drafter.h"
#include "spec/speculative_generate.h"
#include "tests/unit/spec/tiny_llama.h"

namespace specula::test {
namespace {

const TinyLlamaShape kShape{320, 64, 128, 2, 4, 2, 16, 4096, 3.0f};

// Rounds every matrix of `w` to BF16 values in place (norm vectors stay F32).
ModelWeights bf16_exact(ModelWeights w) {
  auto round = [](const TensorView& t) {
    if (t.shape.size() < 2 || t.dtype != DType::F32) return;
    auto* p = reinterpret_cast<float*>(const_cast<std::byte*>(t.data));
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_f32(f32_to_bf16(p[i]));
  };
  round(w.embed);
  if (w.output.data != w.embed.data) round(w.output);
  for (const LayerWeights& l : w.layers)
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) round(*t);
  return w;
}

struct Device {
  std::unique_ptr<Ops> ops;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvCache> kv;
  int seq = -1;
  Device(std::unique_ptr<Ops> o, const ModelWeights& w) : ops(std::move(o)) {
    model = std::make_unique<LlamaModel>(w, *ops);
    kv = std::make_unique<KvCache>(*ops, model->kv_config(1024));
    seq = kv->create_sequence();
  }
  std::vector<float> forward(std::span<const int32_t> tokens, bool all) {
    std::vector<float> logits;
    ForwardSeq fs{seq, tokens, all};
    model->forward({&fs, 1}, *kv, logits);
    return logits;
  }
};

class CudaModelTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    weights_ = bf16_exact(tiny_llama(7, kShape));
    host_ = std::make_unique<Device>(std::make_unique<HostOps>(2), weights_);
    cuda_ = std::make_unique<Device>(std::make_unique<CudaOps>(0), weights_);
  }
  ModelWeights weights_;
  std::unique_ptr<Device> host_, cuda_;
};

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return p;
}

// An 8-token prompt (every matmul on the F32-activation path), `max_tokens` to generate.
GenerateRequest request_of(int max_tokens, SamplingParams sampling) {
  GenerateRequest g;
  g.prompt = prompt_of(8, kShape.vocab);
  g.max_tokens = max_tokens;
  g.sampling = sampling;
  return g;
}

TEST_F(CudaModelTest, TinyModelLogitsMatchTheHostForAChunkAndForDecodeSteps) {
  const std::vector<int32_t> prompt = prompt_of(12, kShape.vocab);
  // 12 rows (the skinny matmul keeps F32 activations): only F32 summation order and the last
  // bit of expf/sinf differ. Logits have std ~3 and 2 layers amplify little, so errors are
  // ~1e-6; 1e-4 leaves a 100x margin while any indexing or masking bug moves logits by O(1).
  EXPECT_TRUE(all_close(cuda_->forward(prompt, true), host_->forward(prompt, true), 1e-4, 0)) << "prompt chunk";
  for (int32_t t : {5, 99, 319, 0}) {
    const std::vector<int32_t> one = {t};
    EXPECT_TRUE(all_close(cuda_->forward(one, false), host_->forward(one, false), 1e-4, 0)) << "decode " << t;
  }
  // Roll back and re-verify a chunk of K+1 = 6 after the rollback (the KV truncate path).
  host_->kv->truncate_to(host_->seq, 10);
  cuda_->kv->truncate_to(cuda_->seq, 10);
  const std::vector<int32_t> chunk = {1, 2, 3, 4, 5, 6};
  EXPECT_TRUE(all_close(cuda_->forward(chunk, true), host_->forward(chunk, true), 1e-4, 0)) << "after rollback";
}

TEST_F(CudaModelTest, ALongPromptThroughCublasIsWithinBf16Tolerance) {
  const std::vector<int32_t> prompt = prompt_of(40, kShape.vocab);
  const std::vector<float> want = host_->forward(prompt, true), got = cuda_->forward(prompt, true);
  // 40 rows go through cuBLAS with activations rounded to BF16 at every matmul input (2^-8 at
  // most per rounding). On the golden tiny checkpoints that rounding alone moved logits by 5e-3
  // relative (transformers emulation, tests/gpu/hf_compare.py's note), so 2e-2.
  const double err = relative_l2(got, want);
  EXPECT_LT(err, 2e-2);
  std::printf("[ measure  ] 40-token prefill logits: relative L2 error %.2e vs the host\n", err);
}

TEST_F(CudaModelTest, GreedyGenerationEqualsTheHostTokenForToken) {
  GenerateRequest req;
  req.prompt = prompt_of(8, kShape.vocab);
  req.max_tokens = 64;
  req.sampling = SamplingParams{0.0f, 0, 1.0f, 0};
  std::vector<int32_t> want, got;
  generate(*host_->model, *host_->kv, host_->seq, req, [&](int32_t t) { want.push_back(t); return true; });
  generate(*cuda_->model, *cuda_->kv, cuda_->seq, req, [&](int32_t t) { got.push_back(t); return true; });
  EXPECT_EQ(got, want);
  EXPECT_EQ(got.size(), 64u);
}

TEST_F(CudaModelTest, SpeculativeGreedyGenerationOnTheDeviceEqualsHostGreedy) {
  const GenerateRequest g = request_of(48, SamplingParams{0.0f, 0, 1.0f, 0});
  std::vector<int32_t> want;
  generate(*host_->model, *host_->kv, host_->seq, g, [&](int32_t t) { want.push_back(t); return true; });

  // Drafters on the device: the target itself (always accepted), the target with a layer
  // skipped, an unrelated tiny model, and prompt lookup.
  const ModelWeights other = bf16_exact(tiny_llama(8, kShape));
  LlamaModel other_model(other, *cuda_->ops);
  ModelDrafter itself(*cuda_->model, 1024), skip(*cuda_->model, 1024, {false, true}), unrelated(other_model, 1024);
  NgramDrafter ngram(kShape.vocab, 3);
  SpeculativeRequest s;
  static_cast<GenerateRequest&>(s) = g;
  s.draft.k = 5;
  for (Drafter* d : std::initializer_list<Drafter*>{&itself, &skip, &unrelated, &ngram}) {
    std::vector<int32_t> got;
    cuda_->kv->truncate_to(cuda_->seq, 0);
    const SpeculativeStats st = speculative_generate(*cuda_->model, *cuda_->kv, cuda_->seq, *d, s,
                                                     [&](int32_t t, TokenOrigin) { got.push_back(t); return true; });
    EXPECT_EQ(got, want) << d->name();
    if (d == &itself) {
      EXPECT_EQ(st.accepted, st.drafted) << "the target drafting for itself is always accepted";
    }
  }
}

// Coupled mode at temperature > 0: the acceptance step on the device draws the target's own
// Gumbel-max token (Philox, as the host does), so the text equals host sampling at the same seed.
// (A flip needs two Gumbel scores within ~1e-6 of each other: the devices' logits differ by F32
// rounding only; about 1e-5 per token.)
TEST_F(CudaModelTest, CoupledSpeculativeSamplingOnTheDeviceEqualsHostSamplingAtTheSameSeed) {
  const GenerateRequest g = request_of(48, SamplingParams{0.8f, 0, 0.95f, 1234});
  std::vector<int32_t> want;
  host_->kv->truncate_to(host_->seq, 0);
  generate(*host_->model, *host_->kv, host_->seq, g, [&](int32_t t) { want.push_back(t); return true; });

  ModelDrafter skip(*cuda_->model, 1024, {false, true});
  NgramDrafter ngram(kShape.vocab, 3);
  SpeculativeRequest s;
  static_cast<GenerateRequest&>(s) = g;
  s.draft.k = 4;
  s.mode = SpecSampling::Coupled;
  for (Drafter* d : std::initializer_list<Drafter*>{&skip, &ngram}) {
    std::vector<int32_t> got;
    cuda_->kv->truncate_to(cuda_->seq, 0);
    speculative_generate(*cuda_->model, *cuda_->kv, cuda_->seq, *d, s,
                         [&](int32_t t, TokenOrigin) { got.push_back(t); return true; });
    EXPECT_EQ(got, want) << d->name();
  }
}

// Recorded steps (CUDA graphs) replay the same kernels on the same buffers with freshly staged
// positions and block tables, so their logits equal launched steps' bit for bit: through decode
// steps whose block table grows past the recording's, verification chunks, a rollback, and a
// wide prefill in between that reallocates the activations (its recordings must be dropped).
TEST_F(CudaModelTest, RecordedStepsGiveExactlyTheLogitsOfLaunchedSteps) {
  Device recorded(std::make_unique<CudaOps>(0), weights_);
  recorded.model->set_recorded_steps(true);
  cuda_->model->set_recorded_steps(false);
  int step = 0;
  auto both = [&](const std::vector<int32_t>& tokens, bool all) {
    const std::vector<float> want = cuda_->forward(tokens, all), got = recorded.forward(tokens, all);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << "step " << step;
    ++step;
  };
  auto decode = [&](int n) {
    for (int i = 0; i < n; ++i) both({static_cast<int32_t>((step * 13 + 5) % kShape.vocab)}, false);
  };
  both(prompt_of(8, kShape.vocab), false);
  decode(40);  // positions 8..47: the block table grows at 16 and 32
  for (int r = 0; r < 4; ++r) {  // verification chunks of K+1 = 5, rolled back as after a rejection
    const int64_t at = cuda_->kv->length(cuda_->seq);
    both(prompt_of(5, kShape.vocab), true);
    cuda_->kv->truncate_to(cuda_->seq, at + 2);
    recorded.kv->truncate_to(recorded.seq, at + 2);
  }
  both(prompt_of(30, kShape.vocab), true);  // cuBLAS: wider activations, recordings dropped
  decode(20);
  both(prompt_of(5, kShape.vocab), true);
  both(prompt_of(5, kShape.vocab), true);
  const auto& ops = static_cast<const CudaOps&>(*recorded.ops);
  EXPECT_GT(ops.graph_launches(), 50u) << "the recorded model launched too few graphs: the test would prove nothing";
  EXPECT_EQ(static_cast<const CudaOps&>(*cuda_->ops).graph_launches(), 0u);
}

// Recorded steps of several models interleaved on one device: the target's verification
// chunks, its skip-layer self-draft and a separate draft model, each with its own recordings
// and caches on the same CudaOps. Greedy output equals the same loop without recordings.
TEST_F(CudaModelTest, SpeculativeGreedyGenerationWithRecordedStepsEqualsItWithout) {
  const GenerateRequest g = request_of(48, SamplingParams{0.0f, 0, 1.0f, 0});
  SpeculativeRequest s;
  static_cast<GenerateRequest&>(s) = g;
  s.draft.k = 4;
  const ModelWeights other = bf16_exact(tiny_llama(8, kShape));
  auto run = [&](Device& d, bool recorded, bool separate_draft) {
    d.model->set_recorded_steps(recorded);
    LlamaModel draft_model(other, *d.ops);
    draft_model.set_recorded_steps(recorded);
    ModelDrafter skip(*d.model, 1024, {false, true}), separate(draft_model, 1024);
    std::vector<int32_t> got;
    d.kv->truncate_to(d.seq, 0);
    speculative_generate(*d.model, *d.kv, d.seq, separate_draft ? static_cast<Drafter&>(separate) : skip, s,
                         [&](int32_t t, TokenOrigin) { got.push_back(t); return true; });
    return got;
  };
  Device recorded(std::make_unique<CudaOps>(0), weights_);
  for (bool separate : {false, true}) {
    const std::vector<int32_t> want = run(*cuda_, false, separate);
    EXPECT_EQ(run(recorded, true, separate), want) << (separate ? "separate draft model" : "skip drafter");
  }
  EXPECT_GT(static_cast<const CudaOps&>(*recorded.ops).graph_launches(), 20u);
}

TEST_F(CudaModelTest, AutoPicksTheCudaDeviceWhenAGpuIsPresent) {
  DeviceOptions opt;
  opt.device = "auto";
  EXPECT_EQ(make_device(opt)->kind(), DeviceKind::Cuda);
  opt.device = "cuda";
  EXPECT_EQ(make_device(opt)->kind(), DeviceKind::Cuda);
}

}  // namespace
}  // namespace specula::test

#else  // built without CUDA

TEST(CudaModel, NeedsTheCudaBuild) {
  GTEST_SKIP() << "no CUDA GPU: " << specula::test::no_gpu_reason();
}

#endif
