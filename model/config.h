// Hyper-parameters of a Llama-family model, read from GGUF metadata or config.json.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace specula {

// "llama3" rope scaling (Llama 3.1/3.2); type empty = none.
struct RopeScaling {
  std::string type;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position = 8192;
  // Per-dimension divisors of inv_freq (head_dim/2 values) as GGUF stores them in
  // rope_freqs.weight; when set they replace the computation from the factors above.
  std::vector<float> freq_factors;
};

// How RoPE pairs dimensions. GGUF converters permute q/k rows so that adjacent pairs
// (2i, 2i+1) rotate; Hugging Face checkpoints rotate (i, i + d/2). We keep the stored
// weights untouched and rope each format its own way.
enum class RopeStyle { Interleaved /* GGUF */, HalfSplit /* HF */ };

struct LlamaConfig {
  std::string architecture = "llama";
  std::string name;
  int64_t vocab_size = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_positions = 0;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  RopeScaling rope_scaling;
  RopeStyle rope_style = RopeStyle::HalfSplit;
  bool tied_embeddings = false;
  int32_t bos_id = -1;
  std::vector<int32_t> eos_ids;

  // Throws ModelError naming the first inconsistent field.
  void validate(const std::string& source) const;
};

// Inverse frequencies (head_dim/2 values) with llama3 scaling applied when configured.
std::vector<float> rope_inv_freq(const LlamaConfig& c);

}  // namespace specula
