// The device's acceptance step against the host's verify_draft (spec/speculative_sampling.h) on
// random rounds: the same accepted count, tokens and bonus flag, for greedy, exact and coupled
// verification, with and without top-k / top-p, ties in the logits included. Skips, with the
// reason, where no CUDA GPU is.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test.h"

#ifdef SPECULA_HAVE_CUDA

#include <cmath>

#include "gpu/cuda/cuda_ops.h"
#include "gpu/cuda/device_verify.h"
#include "spec/philox.h"
#include "spec/sampling.h"
#include "spec/speculative_sampling.h"

namespace specula::test {
namespace {

class DeviceVerifyTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    seed_ = fresh_seed();
    rng_.seed(seed_);
    cuda_ = std::make_unique<CudaOps>(0);
  }
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::unique_ptr<CudaOps> cuda_;
};

TEST_F(DeviceVerifyTest, PhiloxUniformsAreTheHostsBitForBit) {
  for (uint32_t stream : {0u, 1u, 2u, 3u})
    for (int64_t position : {int64_t{0}, int64_t{7}, int64_t{1} << 33}) {
      const uint64_t seed = rng_();
      const std::vector<double> got = device_philox_uniforms(*cuda_, seed, position, stream, 5, 1000);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], philox_uniform(seed, position, static_cast<RngStream>(stream), 5 + i))
            << "seed " << seed << " position " << position << " stream " << stream << " index " << 5 + i;
    }
}

struct Case {
  SamplingParams sp;
  SpecSampling mode;
  int64_t vocab;
  int k;
  bool ties;  // logits on a coarse grid, so equal values straddle the top-k / top-p cut
};

// One random round: draft logits, target logits = draft + noise (agreement controlled by the
// noise), q = the draft's transformed distribution, draft tokens drawn from q.
void check_round(CudaOps& cuda, std::mt19937_64& rng, const Case& c, int trial) {
  const int64_t V = c.vocab;
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> noise_scale(0.0f, 1.5f);
  const float noise = noise_scale(rng);
  auto grid = [&](float x) { return c.ties ? std::round(x * 2.0f) / 2.0f : x; };
  std::vector<float> target((c.k + 1) * V), q(c.k * V);
  DraftProposal draft;
  std::vector<float> probs;
  const int64_t position = static_cast<int64_t>(rng() % 5000);
  for (int i = 0; i <= c.k; ++i) {
    std::vector<float> dl(V);
    for (int64_t v = 0; v < V; ++v) {
      dl[v] = grid(3.0f * g(rng));
      target[i * V + v] = grid(dl[v] + noise * g(rng));
    }
    if (i == c.k) break;
    SamplingParams dsp = c.sp;
    if (dsp.greedy()) dsp.temperature = 1.0f;
    transform_to_probs(dl, dsp, probs);
    std::copy(probs.begin(), probs.end(), q.begin() + i * V);
    std::vector<float> logq;
    transform_logits(dl, dsp, logq);
    // Mostly the draft's own draw; sometimes the target's argmax (accepted by greedy).
    const int32_t t = (rng() % 3 == 0) ? argmax(std::span<const float>(target).subspan(i * V, V))
                                       : sample_gumbel(logq, rng(), position + i, RngStream::Draft);
    draft.tokens.push_back(t);
  }
  draft.q = q;
  const RoundOutcome want = verify_draft(draft, target, c.sp, position, c.mode);

  DeviceBuffer dt = to_device(cuda, target), dq(cuda, std::max<size_t>(1, q.size()));
  if (!q.empty()) cuda.copy_to_device(q.data(), dq.get(), q.size());
  DeviceSampling ds{c.sp.temperature, c.sp.top_k, c.sp.top_p, c.sp.seed, c.mode == SpecSampling::Coupled};
  const DeviceVerdict got = verify_on_device(cuda, dt.get(), dq.get(), draft.tokens, V, ds, position);
  ASSERT_EQ(got.accepted, want.accepted) << "trial " << trial;
  ASSERT_EQ(got.tokens, want.tokens) << "trial " << trial;
  ASSERT_EQ(got.bonus, want.bonus) << "trial " << trial;
}

TEST_F(DeviceVerifyTest, MatchesTheHostRuleOnRandomRounds) {
  SCOPED_TRACE("random seed " + std::to_string(seed_));
  const std::vector<SamplingParams> params = {
      {0.0f, 0, 1.0f, 0},  {1.0f, 0, 1.0f, 0},   {0.7f, 0, 1.0f, 0},  {1.3f, 40, 1.0f, 0},
      {1.0f, 1, 1.0f, 0},  {0.8f, 0, 0.9f, 0},   {1.0f, 20, 0.5f, 0}, {1.0f, 0, 0.05f, 0},
  };
  int trial = 0;
  for (const SamplingParams& base : params)
    for (SpecSampling mode : {SpecSampling::Exact, SpecSampling::Coupled})
      for (bool ties : {false, true})
        for (int rep = 0; rep < 6; ++rep, ++trial) {
          Case c{base, mode, 0, static_cast<int>(rng_() % 9), ties};
          c.sp.seed = rng_();
          c.vocab = rep == 5 ? 128256 : 100 + static_cast<int64_t>(rng_() % 3000);
          ASSERT_NO_FATAL_FAILURE(check_round(*cuda_, rng_, c, trial))
              << "temperature " << c.sp.temperature << " top_k " << c.sp.top_k << " top_p " << c.sp.top_p
              << " mode " << spec_sampling_name(mode) << " ties " << ties << " vocab " << c.vocab << " k " << c.k;
        }
}

TEST_F(DeviceVerifyTest, RefusesADraftTokenOutsideTheVocabulary) {
  DeviceBuffer logits(*cuda_, 2 * 10);
  const std::vector<int32_t> draft = {10};
  EXPECT_THROW(verify_on_device(*cuda_, logits.get(), nullptr, draft, 10, DeviceSampling{0.0f}, 0),
               std::invalid_argument);
}

}  // namespace
}  // namespace specula::test

#else  // built without CUDA

TEST(DeviceVerify, NeedsTheCudaBuild) {
  GTEST_SKIP() << "no CUDA GPU: " << specula::test::no_gpu_reason();
}

#endif
