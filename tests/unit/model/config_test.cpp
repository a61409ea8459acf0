// LlamaConfig::validate and the RoPE inverse frequencies, with and without llama3 scaling.
#include "model/config.h"

#include <gtest/gtest.h>

#include <cmath>

#include "model/tensor.h"

namespace specula {
namespace {

LlamaConfig smollm2() {
  LlamaConfig c;
  c.vocab_size = 49152;
  c.hidden = 576;
  c.intermediate = 1536;
  c.layers = 30;
  c.heads = 9;
  c.kv_heads = 3;
  c.head_dim = 64;
  c.max_positions = 8192;
  c.rope_theta = 100000.0f;
  c.bos_id = 1;
  c.eos_ids = {2};
  return c;
}

LlamaConfig llama32_1b() {
  LlamaConfig c = smollm2();
  c.vocab_size = 128256;
  c.hidden = 2048;
  c.heads = 32;
  c.kv_heads = 8;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {"llama3", 32.0f, 1.0f, 4.0f, 8192, {}};
  c.bos_id = 128000;
  c.eos_ids = {128001, 128008, 128009};
  return c;
}

std::string validation_error(const LlamaConfig& c) {
  try {
    c.validate("test");
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

TEST(LlamaConfig, AcceptsTheShapesOfRealModels) {
  EXPECT_NO_THROW(smollm2().validate("smollm2"));
  EXPECT_NO_THROW(llama32_1b().validate("llama"));
}

TEST(LlamaConfig, NamesTheFieldThatIsInconsistent) {
  LlamaConfig c = smollm2();
  c.kv_heads = 4;
  EXPECT_NE(validation_error(c).find("kv_heads (4)"), std::string::npos) << validation_error(c);
  c = smollm2();
  c.head_dim = 63;
  EXPECT_NE(validation_error(c).find("head_dim 63"), std::string::npos);
  c = smollm2();
  c.layers = 0;
  EXPECT_NE(validation_error(c).find("layers is 0"), std::string::npos);
  c = smollm2();
  c.eos_ids = {2, 49152};
  EXPECT_NE(validation_error(c).find("eos id 49152"), std::string::npos);
  c = smollm2();
  c.rms_eps = 0.0f;
  EXPECT_NE(validation_error(c).find("rms_eps"), std::string::npos);
  c = smollm2();
  c.rope_scaling.type = "yarn";
  EXPECT_NE(validation_error(c).find("'yarn'"), std::string::npos);
  c = llama32_1b();
  c.rope_scaling.freq_factors = {1.0f, 2.0f};
  EXPECT_NE(validation_error(c).find("2 values, expected head_dim/2 = 32"), std::string::npos) << validation_error(c);
}

TEST(RopeInvFreq, IsThetaToTheMinusTwoIOverDWithoutScaling) {
  LlamaConfig c = smollm2();
  std::vector<float> inv = rope_inv_freq(c);
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_EQ(inv[0], 1.0f);
  // Successive frequencies shrink by theta^(-2/d) = 100000^(-1/32).
  const double ratio = std::exp(-std::log(100000.0) / 32.0);
  for (size_t i = 1; i < inv.size(); ++i) EXPECT_NEAR(inv[i] / inv[i - 1], ratio, 1e-6) << i;
  EXPECT_NEAR(inv[31], 1.0 / std::pow(100000.0, 62.0 / 64.0), 1e-12);
}

TEST(RopeInvFreq, MatchesTransformersLlama3ScalingForLlama32) {
  // transformers 5.23 ROPE_INIT_FUNCTIONS["llama3"] for theta 500000, head_dim 64, factor 32,
  // low 1, high 4, original 8192: indices 0-10 kept, 15-17 blended, 18 and up divided by 32.
  const std::pair<int, double> golden[] = {
      {0, 1.0},
      {1, 0.663601279258728},
      {10, 0.016560440883040428},
      {15, 0.0012905480107292533},
      {16, 0.000429556705057621},
      {17, 9.708286233944818e-05},
      {18, 1.9461638657958247e-05},
      {24, 1.6619674170215148e-06},
      {31, 9.418306490260875e-08},
  };
  std::vector<float> inv = rope_inv_freq(llama32_1b());
  ASSERT_EQ(inv.size(), 32u);
  // transformers computes in float32; 2e-6 relative covers its rounding of base^(i/d).
  for (auto [i, want] : golden) EXPECT_NEAR(inv[static_cast<size_t>(i)], want, want * 2e-6) << "index " << i;
}

TEST(RopeInvFreq, DividesByFrequencyFactorsWhenTheFileBakesThemIn) {
  LlamaConfig plain = llama32_1b();
  plain.rope_scaling = {};
  LlamaConfig baked = llama32_1b();
  baked.rope_scaling.freq_factors.assign(32, 1.0f);
  baked.rope_scaling.freq_factors[5] = 4.0f;
  baked.rope_scaling.freq_factors[31] = 32.0f;
  std::vector<float> a = rope_inv_freq(plain), b = rope_inv_freq(baked);
  EXPECT_FLOAT_EQ(b[0], a[0]);
  EXPECT_FLOAT_EQ(b[5], a[5] / 4.0f);
  EXPECT_FLOAT_EQ(b[31], a[31] / 32.0f);
}

}  // namespace
}  // namespace specula
