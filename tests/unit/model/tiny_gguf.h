// A tiny GGUF Llama written byte by byte (2 layers, GQA, the 256 byte tokens plus one merge, a
// ChatML template), shared by the loader tests and the GGUF fuzz test. Tests edit its maps to
// break one thing at a time.
#pragma once
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "model/tensor.h"
#include "model_file_writer.h"

namespace specula::test {

// Vocabulary: 3 specials, the 256 byte tokens in GPT-2's byte-to-unicode spelling, one merge.
inline std::vector<std::string> tiny_tokens() {
  std::vector<std::string> t = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    const uint32_t cp = keep ? static_cast<uint32_t>(b) : 0x100u + static_cast<uint32_t>(n++);
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else s += {static_cast<char>(0xc0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3f))};
    t.push_back(s);
  }
  t.push_back("th");
  return t;
}

inline const char* kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

struct Tiny {
  int64_t vocab = 260, hidden = 64, inter = 96, layers = 2, heads = 4, kv_heads = 2, head_dim = 16, ctx = 128;
};

// Deterministic values in [-1, 1), so a view can be checked against what was written.
inline std::vector<float> values(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (float& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  return v;
}

// Tensors of the tiny model by GGUF name, outermost-first shapes.
inline std::map<std::string, std::vector<int64_t>> tiny_shapes(const Tiny& t, bool with_output) {
  std::map<std::string, std::vector<int64_t>> s = {{"token_embd.weight", {t.vocab, t.hidden}}, {"output_norm.weight", {t.hidden}}};
  if (with_output) s["output.weight"] = {t.vocab, t.hidden};
  for (int64_t i = 0; i < t.layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    s[p + "attn_norm.weight"] = {t.hidden};
    s[p + "attn_q.weight"] = {t.heads * t.head_dim, t.hidden};
    s[p + "attn_k.weight"] = {t.kv_heads * t.head_dim, t.hidden};
    s[p + "attn_v.weight"] = {t.kv_heads * t.head_dim, t.hidden};
    s[p + "attn_output.weight"] = {t.hidden, t.heads * t.head_dim};
    s[p + "ffn_norm.weight"] = {t.hidden};
    s[p + "ffn_gate.weight"] = {t.inter, t.hidden};
    s[p + "ffn_up.weight"] = {t.inter, t.hidden};
    s[p + "ffn_down.weight"] = {t.hidden, t.inter};
  }
  return s;
}

inline size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

inline uint32_t name_seed(const std::string& name) {  // FNV-1a, so each tensor has its own values
  uint32_t h = 2166136261u;
  for (char c : name) h = (h ^ static_cast<uint8_t>(c)) * 16777619u;
  return h;
}

inline size_t stored_bytes(uint32_t type, const std::vector<int64_t>& shape) {
  if (!dtype_supported(type)) return numel(shape) * 2;  // any size: the loader must refuse the type first
  return dtype_row_bytes(static_cast<DType>(type), shape.back()) * (numel(shape) / static_cast<size_t>(shape.back()));
}

// A tiny GGUF Llama. Tensors are F32 filled with values(n, name_seed(name)) unless `types` or
// `data` say otherwise; tests edit the maps to break one thing at a time.
struct GgufModel {
  Tiny t;
  std::string arch = "llama";
  std::map<std::string, std::vector<int64_t>> shapes = tiny_shapes(t, false);
  std::map<std::string, uint32_t> types;
  std::map<std::string, Bytes> data;
  std::function<void(GgufWriter&)> extra;  // more metadata

  Bytes bytes() const {
    GgufWriter w;
    w.add_string("general.architecture", arch);
    w.add_string("general.name", "tiny");
    w.add_u32(arch + ".block_count", static_cast<uint32_t>(t.layers));
    w.add_u32(arch + ".context_length", static_cast<uint32_t>(t.ctx));
    w.add_u32(arch + ".embedding_length", static_cast<uint32_t>(t.hidden));
    w.add_u32(arch + ".feed_forward_length", static_cast<uint32_t>(t.inter));
    w.add_u32(arch + ".attention.head_count", static_cast<uint32_t>(t.heads));
    w.add_u32(arch + ".attention.head_count_kv", static_cast<uint32_t>(t.kv_heads));
    w.add_f32(arch + ".rope.freq_base", 10000.0f);
    w.add_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
    w.add_u32(arch + ".rope.dimension_count", static_cast<uint32_t>(t.head_dim));
    w.add_string("tokenizer.ggml.model", "gpt2");
    w.add_string("tokenizer.ggml.pre", "smollm");
    std::vector<std::string> toks = tiny_tokens();
    std::vector<int32_t> tok_types(toks.size(), 1);
    tok_types[0] = tok_types[1] = tok_types[2] = 3;
    w.add_strings("tokenizer.ggml.tokens", toks);
    w.add_i32s("tokenizer.ggml.token_type", tok_types);
    w.add_strings("tokenizer.ggml.merges", {"t h"});
    w.add_u32("tokenizer.ggml.bos_token_id", 1);
    w.add_u32("tokenizer.ggml.eos_token_id", 2);
    w.add_string("tokenizer.chat_template", kChatml);
    if (extra) extra(w);
    for (const auto& [name, shape] : shapes) {
      const uint32_t type = types.count(name) ? types.at(name) : static_cast<uint32_t>(DType::F32);
      Bytes b = data.count(name) ? data.at(name)
                : type == static_cast<uint32_t>(DType::F32) ? test::as_bytes(values(numel(shape), name_seed(name)))
                                                            : Bytes(stored_bytes(type, shape), 0);
      w.add_tensor(name, type, shape, std::move(b));
    }
    return w.bytes();
  }
  std::string write(const TempDir& dir, const std::string& name = "tiny.gguf") const {
    std::string p = dir.file(name);
    test::write_file(p, bytes());
    return p;
  }
};

}  // namespace specula::test
