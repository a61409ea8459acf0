// Tiny random Llama models built in memory (F32 weights over owned buffers), so a forward takes
// microseconds and the speculative loop can run hundreds of thousands of times in a test.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/weights.h"
#include "spec/philox.h"

namespace specula::test {

struct TinyLlamaShape {
  int64_t vocab = 16;
  int64_t hidden = 32;
  int64_t intermediate = 32;
  int64_t layers = 2;
  int64_t heads = 2;
  int64_t kv_heads = 1;
  int64_t head_dim = 16;
  int64_t max_positions = 4096;
  float logit_scale = 1.5f;  // the standard deviation of the logits over random contexts
};

// Gaussian weights from Philox keyed by `seed` (Box-Muller), so a model is the same everywhere.
class TinyLlamaBuilder {
 public:
  explicit TinyLlamaBuilder(uint64_t seed) : seed_(seed) {}

  ModelWeights build(const TinyLlamaShape& s) {
    ModelWeights w;
    LlamaConfig& c = w.config;
    c.name = "tiny-" + std::to_string(seed_);
    c.vocab_size = s.vocab;
    c.hidden = s.hidden;
    c.intermediate = s.intermediate;
    c.layers = s.layers;
    c.heads = s.heads;
    c.kv_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.max_positions = s.max_positions;
    c.rope_theta = 10000.0f;
    c.rms_eps = 1e-5f;
    c.rope_style = RopeStyle::HalfSplit;
    const float mat = 1.0f;  // scaled by 1/sqrt(cols) below
    w.embed = tensor(w, "embed", {s.vocab, s.hidden}, 1.0f, false);
    w.output_norm = tensor(w, "output_norm", {s.hidden}, 0.0f, true);
    w.output = tensor(w, "output", {s.vocab, s.hidden}, s.logit_scale / std::sqrt(static_cast<float>(s.hidden)), false);
    const int64_t q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
    for (int64_t l = 0; l < s.layers; ++l) {
      LayerWeights L;
      L.attn_norm = tensor(w, "attn_norm", {s.hidden}, 0.0f, true);
      L.wq = tensor(w, "wq", {q, s.hidden}, mat / std::sqrt(static_cast<float>(s.hidden)), false);
      L.wk = tensor(w, "wk", {kv, s.hidden}, mat / std::sqrt(static_cast<float>(s.hidden)), false);
      L.wv = tensor(w, "wv", {kv, s.hidden}, mat / std::sqrt(static_cast<float>(s.hidden)), false);
      L.wo = tensor(w, "wo", {s.hidden, q}, mat / std::sqrt(static_cast<float>(q)), false);
      L.ffn_norm = tensor(w, "ffn_norm", {s.hidden}, 0.0f, true);
      L.w_gate = tensor(w, "w_gate", {s.intermediate, s.hidden}, mat / std::sqrt(static_cast<float>(s.hidden)), false);
      L.w_up = tensor(w, "w_up", {s.intermediate, s.hidden}, mat / std::sqrt(static_cast<float>(s.hidden)), false);
      L.w_down = tensor(w, "w_down", {s.hidden, s.intermediate}, mat / std::sqrt(static_cast<float>(s.intermediate)), false);
      w.layers.push_back(L);
    }
    return w;
  }

 // A norm weight is 1 + a little noise; a matrix is N(0, std^2). `w` keeps the data alive.
  TensorView tensor(ModelWeights& w, const std::string& name, std::vector<int64_t> shape, float std, bool norm) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto data = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
    for (float& x : *data) x = norm ? 1.0f + 0.1f * static_cast<float>(gaussian()) : std * static_cast<float>(gaussian());
    TensorView v;
    v.name = name;
    v.dtype = DType::F32;
    v.shape = std::move(shape);
    v.data = reinterpret_cast<const std::byte*>(data->data());
    v.nbytes = data->size() * sizeof(float);
    w.storage.push_back(data);
    return v;
  }

 private:
  double gaussian() {
    const double u1 = philox_uniform(seed_, counter_, RngStream::Token, 0);
    const double u2 = philox_uniform(seed_, counter_, RngStream::Token, 1);
    ++counter_;
    return std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  uint64_t seed_;
  int64_t counter_ = 0;
};

inline ModelWeights tiny_llama(uint64_t seed, const TinyLlamaShape& shape = {}) {
  return TinyLlamaBuilder(seed).build(shape);
}

}  // namespace specula::test
