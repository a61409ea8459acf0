// load_model on tiny Llama models written in both formats, on broken ones, and on the real
// default model when it is present.
#include "model/weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>

#include "model/gguf.h"
#include "model_file_writer.h"
#include "tiny_gguf.h"

namespace specula {
namespace {

// The tiny GGUF Llama and the file writers (tiny_gguf.h, model_file_writer.h).
using namespace test;

std::string load_error(const std::string& path) {
  try {
    load_model(path);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_CONTAINS(haystack, needle) EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST(LoadModel, LoadsATinyGgufLlamaWithEveryTensorInPlace) {
  TempDir dir;
  GgufModel g;
  LoadedModel m = load_model(g.write(dir));
  const LlamaConfig& c = m.weights.config;
  EXPECT_EQ(m.format, "gguf");
  EXPECT_EQ(c.name, "tiny");
  EXPECT_EQ(c.vocab_size, 260);
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.intermediate, 96);
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.heads, 4);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_positions, 128);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_EQ(c.rope_style, RopeStyle::Interleaved);
  EXPECT_TRUE(c.rope_scaling.type.empty());
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, (std::vector<int32_t>{2}));

  ASSERT_EQ(m.weights.layers.size(), 2u);
  EXPECT_EQ(m.weights.embed.shape, (std::vector<int64_t>{260, 64}));
  EXPECT_EQ(m.weights.output.data, m.weights.embed.data) << "tied: output is the embedding";
  const LayerWeights& l1 = m.weights.layers[1];
  EXPECT_EQ(l1.wq.name, "blk.1.attn_q.weight");
  EXPECT_EQ(l1.wk.shape, (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(l1.wo.shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(l1.w_down.shape, (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(l1.ffn_norm.dtype, DType::F32);
  std::vector<float> want = values(96 * 64, name_seed("blk.1.ffn_gate.weight"));
  EXPECT_EQ(std::memcmp(l1.w_gate.data, want.data(), want.size() * 4), 0) << "the view holds the bytes written";

  ASSERT_NE(m.tokenizer, nullptr);
  EXPECT_EQ(m.tokenizer->vocab_size(), 260);
  EXPECT_EQ(m.chat_template.kind(), ChatTemplate::Kind::ChatML);
}

TEST(LoadModel, UsesTheOutputTensorWhenTheGgufHasOne) {
  TempDir dir;
  GgufModel g;
  g.shapes = tiny_shapes(g.t, true);
  LoadedModel m = load_model(g.write(dir));
  EXPECT_FALSE(m.weights.config.tied_embeddings);
  EXPECT_EQ(m.weights.output.name, "output.weight");
  EXPECT_NE(m.weights.output.data, m.weights.embed.data);
}

TEST(LoadModel, KeepsQuantizedMatricesInTheirStoredType) {
  TempDir dir;
  GgufModel g;
  g.types["token_embd.weight"] = static_cast<uint32_t>(DType::Q8_0);
  g.types["blk.0.attn_q.weight"] = static_cast<uint32_t>(DType::Q4_1);
  g.types["blk.0.ffn_down.weight"] = static_cast<uint32_t>(DType::Q4_0);
  LoadedModel m = load_model(g.write(dir));
  EXPECT_EQ(m.weights.embed.dtype, DType::Q8_0);
  EXPECT_EQ(m.weights.layers[0].wq.dtype, DType::Q4_1);
  EXPECT_EQ(m.weights.layers[0].w_down.dtype, DType::Q4_0);
  EXPECT_EQ(m.weights.layers[0].w_down.nbytes, 64u * (96 / 32) * 18);
}

// Q5_0 is what llama.cpp writes for a Q4_K tensor whose rows are not whole super-blocks (most of
// a Q4_K_M file of SmolLM2). No kernel reads it as stored, but loading keeps it so: a view into the
// mapped file, with no converted copy beside it (each device reads it through its conversion:
// qmatmul_test's HostPath and Int8Kernels tests).
TEST(LoadModel, KeepsQ5_0MatricesAsViewsOfTheFile) {
  TempDir dir;
  GgufModel g;
  g.types["token_embd.weight"] = static_cast<uint32_t>(DType::Q5_0);
  g.types["blk.1.ffn_down.weight"] = static_cast<uint32_t>(DType::Q5_0);
  Bytes q5(64 * (96 / 32) * 22);
  for (size_t i = 0; i < q5.size(); ++i) q5[i] = static_cast<uint8_t>(i * 37 % 251);
  g.data["blk.1.ffn_down.weight"] = q5;
  LoadedModel m = load_model(g.write(dir));
  EXPECT_EQ(m.weights.embed.dtype, DType::Q5_0);
  const TensorView& down = m.weights.layers[1].w_down;
  ASSERT_EQ(down.dtype, DType::Q5_0);
  ASSERT_EQ(down.nbytes, q5.size());
  EXPECT_EQ(std::memcmp(down.data, q5.data(), q5.size()), 0);
  GgufFile f(dir.file("tiny.gguf"));
  EXPECT_EQ(f.tensor("blk.1.ffn_down.weight")->dtype, DType::Q5_0);
}

TEST(LoadModel, WidensF16AndBf16NormsToF32) {
  TempDir dir;
  GgufModel g;
  Bytes f16, bf16;
  for (int i = 0; i < 64; ++i) {
    test::put<uint16_t>(f16, i % 2 ? 0xc000 : 0x3c00);  // -2.0, 1.0
    test::put<uint16_t>(bf16, 0x3f00);                  // 0.5
  }
  g.types["output_norm.weight"] = static_cast<uint32_t>(DType::F16);
  g.data["output_norm.weight"] = f16;
  g.types["blk.0.attn_norm.weight"] = static_cast<uint32_t>(DType::BF16);
  g.data["blk.0.attn_norm.weight"] = bf16;
  LoadedModel m = load_model(g.write(dir));
  const TensorView& out = m.weights.output_norm;
  const TensorView& attn = m.weights.layers[0].attn_norm;
  ASSERT_EQ(out.dtype, DType::F32);
  ASSERT_EQ(attn.dtype, DType::F32);
  EXPECT_EQ(out.nbytes, 64u * 4);
  const float* o = reinterpret_cast<const float*>(out.data);
  const float* a = reinterpret_cast<const float*>(attn.data);
  EXPECT_EQ(o[0], 1.0f);
  EXPECT_EQ(o[1], -2.0f);
  EXPECT_EQ(a[63], 0.5f);
}

TEST(LoadModel, RefusesAQuantizedNorm) {
  TempDir dir;
  GgufModel g;
  g.types["blk.1.ffn_norm.weight"] = static_cast<uint32_t>(DType::Q8_0);
  EXPECT_CONTAINS(load_error(g.write(dir)), "norm tensor 'blk.1.ffn_norm.weight' has type Q8_0");
}

TEST(LoadModel, TakesLlama3RopeScalingFromRopeFreqsWeight) {
  TempDir dir;
  GgufModel g;
  std::vector<float> factors = {1, 1, 1, 2, 4, 8, 32, 32};
  g.shapes["rope_freqs.weight"] = {8};
  g.data["rope_freqs.weight"] = test::as_bytes(factors);
  LoadedModel m = load_model(g.write(dir));
  const RopeScaling& s = m.weights.config.rope_scaling;
  EXPECT_EQ(s.type, "llama3");
  EXPECT_EQ(s.freq_factors, factors);
  std::vector<float> inv = rope_inv_freq(m.weights.config);
  EXPECT_FLOAT_EQ(inv[7], static_cast<float>(std::pow(10000.0, -14.0 / 16.0) / 32.0));
}

TEST(LoadModel, ReadsLlama3RopeScalingKeys) {
  TempDir dir;
  GgufModel g;
  g.extra = [](GgufWriter& w) {
    w.add_string("llama.rope.scaling.type", "llama3");
    w.add_f32("llama.rope.scaling.factor", 8.0f);
    w.add_u32("llama.rope.scaling.original_context_length", 64);
  };
  LoadedModel m = load_model(g.write(dir));
  const RopeScaling& s = m.weights.config.rope_scaling;
  EXPECT_EQ(s.type, "llama3");
  EXPECT_EQ(s.factor, 8.0f);
  EXPECT_EQ(s.original_max_position, 64);
}

TEST(LoadModel, RefusesARopeScalingTypeItCannotApply) {
  TempDir dir;
  GgufModel g;
  g.extra = [](GgufWriter& w) { w.add_string("llama.rope.scaling.type", "yarn"); };
  EXPECT_CONTAINS(load_error(g.write(dir)), "'yarn'");
}

TEST(LoadModel, RefusesANonLlamaArchitecture) {
  TempDir dir;
  GgufModel g;
  g.arch = "qwen2";
  EXPECT_CONTAINS(load_error(g.write(dir)), "unsupported architecture 'qwen2' (Specula runs the Llama family)");
}

TEST(LoadModel, SaysWhenTheModelPathDoesNotExist) {
  EXPECT_EQ(load_error("/no/such/model.gguf"), "model not found: /no/such/model.gguf");
}

TEST(LoadModel, NamesAMissingTensor) {
  TempDir dir;
  GgufModel g;
  g.shapes.erase("blk.1.ffn_down.weight");
  EXPECT_CONTAINS(load_error(g.write(dir)), "tensor 'blk.1.ffn_down.weight' is missing");
}

TEST(LoadModel, NamesATensorOfTheWrongShapeWithBothShapes) {
  TempDir dir;
  GgufModel g;
  g.shapes["blk.0.attn_k.weight"] = {64, 64};
  EXPECT_CONTAINS(load_error(g.write(dir)), "tensor 'blk.0.attn_k.weight' has shape [64, 64], expected [32, 64]");
}

TEST(LoadModel, NamesAnUnsupportedTensorType) {
  TempDir dir;
  GgufModel g;
  g.types["blk.0.attn_q.weight"] = 34;
  EXPECT_CONTAINS(load_error(g.write(dir)), "tensor 'blk.0.attn_q.weight' has type TQ1_0 (34), which Specula cannot load");
}

TEST(LoadModel, SaysATruncatedGgufIsTruncated) {
  TempDir dir;
  GgufModel g;
  Bytes b = g.bytes();
  b.resize(b.size() / 2);
  std::string p = dir.file("cut.gguf");
  test::write_file(p, b);
  EXPECT_CONTAINS(load_error(p), "truncated");
  EXPECT_CONTAINS(load_error(p), std::to_string(b.size()));
}

TEST(LoadModel, RefusesAHeadCountThatDoesNotDivideTheKvHeads) {
  TempDir dir;
  GgufModel g;
  g.t.kv_heads = 3;
  g.shapes = tiny_shapes(g.t, false);
  EXPECT_CONTAINS(load_error(g.write(dir)), "kv_heads (3)");
}

// ---- Hugging Face directories ----------------------------------------------------------------

// The same tiny model as a Hugging Face directory (BF16 matrices, F32 or BF16 norms).
struct HfModel {
  Tiny t;
  bool with_lm_head = false;
  std::string config = R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,)"
                       R"("intermediate_size":96,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,)"
                       R"("max_position_embeddings":128,"rope_theta":10000.0,"rms_norm_eps":1e-05,"vocab_size":260,)"
                       R"("tie_word_embeddings":true,"bos_token_id":1,"eos_token_id":[2,0],)"
                       R"("rope_scaling":{"rope_type":"llama3","factor":4.0,"low_freq_factor":1.0,"high_freq_factor":4.0,)"
                       R"("original_max_position_embeddings":64}})";
  std::map<std::string, std::string> rename;  // HF name -> name actually written

  void write(const TempDir& dir) const {
    test::SafetensorsWriter w;
    std::map<std::string, std::vector<int64_t>> shapes = tiny_shapes(t, with_lm_head);
    for (const auto& [gguf_name, shape] : shapes) {
      std::string name = hf_name(gguf_name);
      if (rename.count(name)) name = rename.at(name);
      if (name.empty()) continue;
      std::vector<float> v = values(numel(shape), name_seed(gguf_name));
      if (shape.size() == 1) {
        w.add_f32(name, shape, v);
      } else {
        Bytes bf;
        for (float x : v) {
          uint32_t bits;
          std::memcpy(&bits, &x, 4);
          test::put<uint16_t>(bf, static_cast<uint16_t>(bits >> 16));
        }
        w.add(name, "BF16", shape, bf);
      }
    }
    test::write_file(dir.file("model.safetensors"), w.bytes());
    test::write_text(dir.file("config.json"), config);
    test::write_text(dir.file("tokenizer.json"), tokenizer_json());
    test::write_text(dir.file("tokenizer_config.json"), std::string(R"({"chat_template":")") + escape(kChatml) + "\"}");
  }

  static std::string hf_name(const std::string& g) {
    if (g == "token_embd.weight") return "model.embed_tokens.weight";
    if (g == "output_norm.weight") return "model.norm.weight";
    if (g == "output.weight") return "lm_head.weight";
    static const std::map<std::string, std::string> parts = {
        {"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"}, {"attn_k", "self_attn.k_proj"},
        {"attn_v", "self_attn.v_proj"}, {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
        {"ffn_gate", "mlp.gate_proj"}, {"ffn_up", "mlp.up_proj"}, {"ffn_down", "mlp.down_proj"}};
    const size_t a = g.find('.', 4), b = g.rfind('.');
    return "model.layers." + g.substr(4, a - 4) + "." + parts.at(g.substr(a + 1, b - a - 1)) + ".weight";
  }

  static std::string escape(const std::string& s) {
    std::string o;
    for (char c : s) {
      if (c == '"' || c == '\\') o += '\\';
      o += c;
    }
    return o;
  }

  static std::string tokenizer_json() {
    std::vector<std::string> toks = tiny_tokens();
    std::string vocab;
    for (size_t i = 0; i < toks.size(); ++i) {
      if (i) vocab += ',';
      vocab += '"';
      vocab += escape(toks[i]);
      vocab += "\":";
      vocab += std::to_string(i);
    }
    std::string added;
    for (int i = 0; i < 3; ++i) {
      if (i) added += ',';
      added += "{\"id\":";
      added += std::to_string(i);
      added += ",\"content\":\"";
      added += toks[static_cast<size_t>(i)];
      added += "\",\"special\":true}";
    }
    return R"({"version":"1.0","added_tokens":[)" + added + R"(],"normalizer":null,)" +
           R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},)" +
           R"("decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{)" + vocab + R"(},"merges":["t h"]}})";
  }
};

TEST(LoadModel, LoadsATinyHuggingFaceDirectory) {
  TempDir dir;
  HfModel h;
  h.write(dir);
  LoadedModel m = load_model(dir.path().string());
  const LlamaConfig& c = m.weights.config;
  EXPECT_EQ(m.format, "safetensors");
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.layers, 2);
  EXPECT_EQ(c.kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 260);
  EXPECT_EQ(c.rope_style, RopeStyle::HalfSplit);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.eos_ids, (std::vector<int32_t>{2, 0}));
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 4.0f);
  EXPECT_EQ(c.rope_scaling.original_max_position, 64);
  EXPECT_EQ(m.weights.embed.dtype, DType::BF16);
  EXPECT_EQ(m.weights.layers[1].wq.name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(m.weights.layers[1].wq.shape, (std::vector<int64_t>{64, 64}));
  std::vector<float> norm = values(64, name_seed("blk.0.ffn_norm.weight"));
  EXPECT_EQ(std::memcmp(m.weights.layers[0].ffn_norm.data, norm.data(), 64 * 4), 0);
  EXPECT_EQ(m.tokenizer->vocab_size(), 260);
  EXPECT_EQ(m.chat_template.kind(), ChatTemplate::Kind::ChatML);
}

TEST(LoadModel, TreatsAHuggingFaceModelWithoutLmHeadAsTied) {
  TempDir dir;
  HfModel h;
  h.config.replace(h.config.find("\"tie_word_embeddings\":true"), 26, "\"tie_word_embeddings\":false");
  h.write(dir);
  LoadedModel m = load_model(dir.path().string());
  EXPECT_TRUE(m.weights.config.tied_embeddings);
  EXPECT_EQ(m.weights.output.data, m.weights.embed.data);
}

TEST(LoadModel, UsesLmHeadWhenPresentAndUntied) {
  TempDir dir;
  HfModel h;
  h.with_lm_head = true;
  h.config.replace(h.config.find("\"tie_word_embeddings\":true"), 26, "\"tie_word_embeddings\":false");
  h.write(dir);
  LoadedModel m = load_model(dir.path().string());
  EXPECT_FALSE(m.weights.config.tied_embeddings);
  EXPECT_EQ(m.weights.output.name, "lm_head.weight");
}

TEST(LoadModel, NamesTheFileAndJsonErrorOfAMalformedConfig) {
  TempDir dir;
  HfModel h;
  h.config = R"({"architectures":["LlamaForCausalLM"], "hidden_size": 64,)";
  h.write(dir);
  std::string e = load_error(dir.path().string());
  EXPECT_CONTAINS(e, "config.json");
  EXPECT_CONTAINS(e, "not valid JSON");
  EXPECT_CONTAINS(e, "parse error");
}

TEST(LoadModel, NamesAMissingConfigField) {
  TempDir dir;
  HfModel h;
  h.config.replace(h.config.find("\"num_hidden_layers\":2,"), 22, "");
  h.write(dir);
  EXPECT_CONTAINS(load_error(dir.path().string()), "missing the field 'num_hidden_layers'");
}

TEST(LoadModel, NamesAConfigFieldOfTheWrongType) {
  TempDir dir;
  HfModel h;
  h.config.replace(h.config.find("\"hidden_size\":64"), 16, "\"hidden_size\":\"64\"");
  h.write(dir);
  EXPECT_CONTAINS(load_error(dir.path().string()), "field 'hidden_size' is \"64\", expected an integer");
}

TEST(LoadModel, RefusesAHuggingFaceModelOfAnotherArchitecture) {
  TempDir dir;
  HfModel h;
  h.config = R"({"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":64})";
  h.write(dir);
  EXPECT_CONTAINS(load_error(dir.path().string()), "unsupported architecture 'Qwen2ForCausalLM' (Specula runs the Llama family)");
}

TEST(LoadModel, NamesAMissingSafetensorsTensor) {
  TempDir dir;
  HfModel h;
  h.rename["model.layers.0.mlp.up_proj.weight"] = "";
  h.write(dir);
  EXPECT_CONTAINS(load_error(dir.path().string()), "tensor 'model.layers.0.mlp.up_proj.weight' is missing");
}

TEST(LoadModel, RefusesSafetensorsWithBadOffsets) {
  TempDir dir;
  HfModel h;
  h.write(dir);
  test::write_file(dir.file("model.safetensors"),
                   test::safetensors_bytes(R"({"model.norm.weight":{"dtype":"F32","shape":[64],"data_offsets":[0,256]}})", Bytes(100, 0)));
  std::string e = load_error(dir.path().string());
  EXPECT_CONTAINS(e, "model.safetensors");
  EXPECT_CONTAINS(e, "tensor 'model.norm.weight' has data_offsets [0, 256] past the end of the data (100 bytes)");
}

// ---- the real default model --------------------------------------------------------------------

std::string default_model_path() {
  const char* cache = std::getenv("SPECULA_CACHE");
  return std::string(cache && *cache ? cache : "/root/.cache/specula") + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(DefaultModel, HasSmolLM2sTensorTypesInItsGgufFile) {
  const std::string path = default_model_path();
  // scripts/setup.sh always fetches it; a missing model is a broken set-up, not a skip.
  ASSERT_TRUE(std::filesystem::exists(path)) << "default model not fetched (run scripts/setup.sh): " << path;
  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.tensors().size(), 2u + 30u * 9u);
  std::map<std::string, int> by_type;
  for (const TensorView& t : f.tensors()) ++by_type[dtype_name(t.dtype)];
  EXPECT_EQ(by_type["Q8_0"], 1);
  EXPECT_EQ(by_type["Q4_1"], 30 * 7);
  EXPECT_EQ(by_type["F32"], 30 * 2 + 1);
  EXPECT_EQ(f.tensor("token_embd.weight")->dtype, DType::Q8_0);
  EXPECT_EQ(f.tensor("token_embd.weight")->shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(f.tensor("output.weight"), nullptr);
}

TEST(DefaultModel, LoadsAsSmolLM2_135M) {
  const std::string path = default_model_path();
  // scripts/setup.sh always fetches it; a missing model is a broken set-up, not a skip.
  ASSERT_TRUE(std::filesystem::exists(path)) << "default model not fetched (run scripts/setup.sh): " << path;
  LoadedModel m = load_model(path);
  const LlamaConfig& c = m.weights.config;
  EXPECT_EQ(c.layers, 30);
  EXPECT_EQ(c.hidden, 576);
  EXPECT_EQ(c.intermediate, 1536);
  EXPECT_EQ(c.heads, 9);
  EXPECT_EQ(c.kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.max_positions, 8192);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_TRUE(c.rope_scaling.type.empty());
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.bos_id, 1);
  EXPECT_EQ(c.eos_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(m.weights.embed.dtype, DType::Q8_0);
  for (const LayerWeights& l : m.weights.layers) {
    for (const TensorView* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) EXPECT_EQ(t->dtype, DType::Q4_1) << t->name;
    EXPECT_EQ(l.attn_norm.dtype, DType::F32);
  }
  EXPECT_EQ(m.tokenizer->vocab_size(), 49152);
  EXPECT_EQ(m.chat_template.kind(), ChatTemplate::Kind::ChatML);
}

}  // namespace
}  // namespace specula
