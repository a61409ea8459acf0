// A loaded Llama-family model: config, tensor views into the mapped files, and its tokenizer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/chat_template.h"
#include "model/config.h"
#include "model/tensor.h"
#include "model/tokenizer.h"

namespace specula {

struct LayerWeights {
  TensorView attn_norm;  // [hidden] F32
  TensorView wq;         // [heads*head_dim, hidden]
  TensorView wk;         // [kv_heads*head_dim, hidden]
  TensorView wv;         // [kv_heads*head_dim, hidden]
  TensorView wo;         // [hidden, heads*head_dim]
  TensorView ffn_norm;   // [hidden] F32
  TensorView w_gate;     // [intermediate, hidden]
  TensorView w_up;       // [intermediate, hidden]
  TensorView w_down;     // [hidden, intermediate]
};

struct ModelWeights {
  LlamaConfig config;
  TensorView embed;        // [vocab, hidden]
  TensorView output_norm;  // [hidden] F32
  TensorView output;       // [vocab, hidden]; the same view as embed when tied
  std::vector<LayerWeights> layers;
  // Keeps mapped files and any converted tensors alive for the views above.
  std::vector<std::shared_ptr<const void>> storage;
};

struct LoadedModel {
  std::string path;
  std::string format;  // "gguf" or "safetensors"
  ModelWeights weights;
  std::shared_ptr<const Tokenizer> tokenizer;
  ChatTemplate chat_template;
};

// Loads a GGUF file or a Hugging Face directory (config.json, *.safetensors, tokenizer.json).
// Throws ModelError with one line naming the problem: missing path, truncated/corrupt file,
// unsupported tensor type, non-Llama architecture, malformed config.json, missing tensor,
// a tensor of the wrong shape.
// The model's chat template, run as written when it parses; one line on stderr when it does not
// (the built-in format it falls back to, and why).
LoadedModel load_model(const std::string& path);

// `--chat-template SPEC` for a loaded model (ChatTemplate::from_option, with the model's BOS and
// EOS texts); an empty SPEC keeps the model's own. Throws std::invalid_argument naming the problem.
ChatTemplate chat_template_for(const LoadedModel& m, const std::string& spec);

}  // namespace specula
