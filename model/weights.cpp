// load_model: a GGUF file or a Hugging Face directory -> config, checked tensor views, tokenizer.
// Both formats meet in assemble(), which checks every tensor's presence, shape and type once.
#include "model/weights.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "model/gguf.h"
#include "model/safetensors.h"

namespace specula {

namespace {

// The BOS and EOS texts a chat template writes (the tokenizer's; "" where it has none).
SpecialTokens special_tokens(const Tokenizer& t) {
  SpecialTokens out;
  if (t.bos_id() >= 0) out.bos = t.token_string(t.bos_id());
  if (!t.eos_ids().empty()) out.eos = t.token_string(t.eos_ids().front());
  return out;
}

namespace fs = std::filesystem;
using nlohmann::json;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- tensors, whatever their format --------------------------------------------------------

using Lookup = std::function<const TensorView*(const std::string&)>;

struct TensorNames {
  std::string embed, output_norm, output;
  std::function<std::string(int64_t layer, const char* part)> layer;
};

// Per-layer parts in LayerWeights order: GGUF name, HF name.
constexpr const char* kLayerParts[][2] = {
    {"attn_norm", "input_layernorm"},  {"attn_q", "self_attn.q_proj"},  {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},    {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},     {"ffn_up", "mlp.up_proj"},       {"ffn_down", "mlp.down_proj"},
};

TensorNames gguf_names() {
  return {"token_embd.weight", "output_norm.weight", "output.weight", [](int64_t i, const char* part) {
            for (const auto& p : kLayerParts)
              if (!std::strcmp(p[0], part)) return "blk." + std::to_string(i) + "." + p[0] + ".weight";
            return std::string();
          }};
}

TensorNames hf_names() {
  return {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight", [](int64_t i, const char* part) {
            for (const auto& p : kLayerParts)
              if (!std::strcmp(p[0], part)) return "model.layers." + std::to_string(i) + "." + p[1] + ".weight";
            return std::string();
          }};
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal half: renormalise
    exp = 113;
    while (!(mant & 0x400u)) { mant <<= 1; --exp; }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

class Assembler {
 public:
  Assembler(std::string source, Lookup lookup, ModelWeights& w) : source_(std::move(source)), lookup_(std::move(lookup)), w_(w) {}

  // The tensor as stored, checked for presence and shape.
  TensorView find(const std::string& name, std::vector<int64_t> shape) const {
    const TensorView* tv = lookup_(name);
    if (!tv) fail("tensor '" + name + "' is missing (expected shape " + shape_str(shape) + ")");
    if (tv->shape != shape)
      fail("tensor '" + name + "' has shape " + shape_str(tv->shape) + ", expected " + shape_str(shape));
    return *tv;
  }

  // A matrix as stored: a type no kernel reads (Q5_0, IQ4_NL, Q3_K) too, which each device reads
  // through its exact conversion (model/tensor.h, dtype_has_kernels), so no converted copy is
  // kept here beside the device's own.
  TensorView require(const std::string& name, std::vector<int64_t> shape) { return find(name, std::move(shape)); }

  // Norm weights are read by every kernel as F32; other float types are widened once here.
  TensorView require_norm(const std::string& name, int64_t n) {
    TensorView tv = find(name, {n});
    if (tv.dtype == DType::F32) return tv;
    if (tv.dtype != DType::F16 && tv.dtype != DType::BF16)
      fail("norm tensor '" + name + "' has type " + dtype_name(tv.dtype) + "; norms must be F32, F16 or BF16");
    auto owned = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, tv.data + 2 * i, 2);
      if (tv.dtype == DType::F16) {
        (*owned)[static_cast<size_t>(i)] = half_to_float(h);
      } else {
        uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(&(*owned)[static_cast<size_t>(i)], &bits, 4);
      }
    }
    tv.dtype = DType::F32;
    tv.data = reinterpret_cast<const std::byte*>(owned->data());
    tv.nbytes = owned->size() * sizeof(float);
    w_.storage.push_back(std::move(owned));
    return tv;
  }

  void assemble(const TensorNames& names) {
    const LlamaConfig& c = w_.config;
    const int64_t q_dim = c.heads * c.head_dim, kv_dim = c.kv_heads * c.head_dim;
    w_.embed = require(names.embed, {c.vocab_size, c.hidden});
    w_.output_norm = require_norm(names.output_norm, c.hidden);
    w_.output = c.tied_embeddings ? w_.embed : require(names.output, {c.vocab_size, c.hidden});
    // One layer at a time: a corrupt block count fails at the first layer whose tensors are
    // missing, instead of sizing an allocation by a number from the file.
    w_.layers.clear();
    for (int64_t i = 0; i < c.layers; ++i) {
      LayerWeights& l = w_.layers.emplace_back();
      l.attn_norm = require_norm(names.layer(i, "attn_norm"), c.hidden);
      l.wq = require(names.layer(i, "attn_q"), {q_dim, c.hidden});
      l.wk = require(names.layer(i, "attn_k"), {kv_dim, c.hidden});
      l.wv = require(names.layer(i, "attn_v"), {kv_dim, c.hidden});
      l.wo = require(names.layer(i, "attn_output"), {c.hidden, q_dim});
      l.ffn_norm = require_norm(names.layer(i, "ffn_norm"), c.hidden);
      l.w_gate = require(names.layer(i, "ffn_gate"), {c.intermediate, c.hidden});
      l.w_up = require(names.layer(i, "ffn_up"), {c.intermediate, c.hidden});
      l.w_down = require(names.layer(i, "ffn_down"), {c.hidden, c.intermediate});
    }
  }

  [[noreturn]] void fail(const std::string& what) const { throw ModelError("'" + source_ + "': " + what); }

 private:
  std::string source_;
  Lookup lookup_;
  ModelWeights& w_;
};

[[noreturn]] void unsupported_architecture(const std::string& source, const std::string& arch) {
  throw ModelError("'" + source + "': unsupported architecture '" + arch + "' (Specula runs the Llama family)");
}

void check_tokenizer_fits(const std::string& source, const Tokenizer& tok, const LlamaConfig& c) {
  if (tok.vocab_size() > c.vocab_size)
    throw ModelError("'" + source + "': the tokenizer has " + std::to_string(tok.vocab_size()) +
                     " tokens but the embedding has only " + std::to_string(c.vocab_size) + " rows");
}

// ---- GGUF ----------------------------------------------------------------------------------

LoadedModel load_gguf(const std::string& path) {
  auto f = std::make_shared<GgufFile>(path);
  const std::string arch = f->get_string("general.architecture");
  if (arch != "llama") unsupported_architecture(path, arch);

  LoadedModel m;
  m.path = path;
  m.format = "gguf";
  LlamaConfig& c = m.weights.config;
  c.architecture = arch;
  c.name = f->get_string("general.name", "");
  c.hidden = f->get_int("llama.embedding_length");
  c.intermediate = f->get_int("llama.feed_forward_length");
  c.layers = f->get_int("llama.block_count");
  c.heads = f->get_int("llama.attention.head_count");
  c.kv_heads = f->get_int("llama.attention.head_count_kv", c.heads);
  c.head_dim = f->get_int("llama.attention.key_length", c.heads > 0 ? c.hidden / c.heads : 0);
  if (f->get_int("llama.attention.value_length", c.head_dim) != c.head_dim)
    throw ModelError("'" + path + "': llama.attention.value_length differs from key_length, which Specula does not support");
  if (int64_t rot = f->get_int("llama.rope.dimension_count", c.head_dim); rot != c.head_dim)
    throw ModelError("'" + path + "': llama.rope.dimension_count is " + std::to_string(rot) + " but head_dim is " +
                     std::to_string(c.head_dim) + "; partial rotary embeddings are not supported");
  c.max_positions = f->get_int("llama.context_length");
  c.rope_theta = static_cast<float>(f->get_float("llama.rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(f->get_float("llama.attention.layer_norm_rms_epsilon", 1e-5));
  c.rope_style = RopeStyle::Interleaved;

  if (f->has("llama.vocab_size")) c.vocab_size = f->get_int("llama.vocab_size");
  else if (f->has("tokenizer.ggml.tokens")) c.vocab_size = static_cast<int64_t>(f->get_string_array("tokenizer.ggml.tokens").size());
  else if (const TensorView* e = f->tensor("token_embd.weight"); e && e->shape.size() == 2) c.vocab_size = e->shape[0];

  c.bos_id = static_cast<int32_t>(f->get_int("tokenizer.ggml.bos_token_id", -1));
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (!f->has(key)) continue;
    int32_t id = static_cast<int32_t>(f->get_int(key));
    if (std::find(c.eos_ids.begin(), c.eos_ids.end(), id) == c.eos_ids.end()) c.eos_ids.push_back(id);
  }

  // llama3 scaling: converters bake the divisors into rope_freqs.weight; the scaling keys are
  // honoured too for files that carry them instead.
  if (const TensorView* rf = f->tensor("rope_freqs.weight")) {
    if (rf->dtype != DType::F32 || rf->shape != std::vector<int64_t>{c.head_dim / 2})
      throw ModelError("'" + path + "': tensor 'rope_freqs.weight' is " + dtype_name(rf->dtype) + " " + shape_str(rf->shape) +
                       ", expected F32 [" + std::to_string(c.head_dim / 2) + "]");
    c.rope_scaling.type = "llama3";
    c.rope_scaling.freq_factors.resize(static_cast<size_t>(rf->numel()));
    std::memcpy(c.rope_scaling.freq_factors.data(), rf->data, rf->nbytes);
    c.rope_scaling.factor = *std::max_element(c.rope_scaling.freq_factors.begin(), c.rope_scaling.freq_factors.end());
  } else if (std::string type = f->get_string("llama.rope.scaling.type", "none"); type != "none") {
    RopeScaling& s = c.rope_scaling;
    s.type = type;  // validate() refuses anything but llama3, naming it
    s.factor = static_cast<float>(f->get_float("llama.rope.scaling.factor", s.factor));
    s.low_freq_factor = static_cast<float>(f->get_float("llama.rope.scaling.low_freq_factor", s.low_freq_factor));
    s.high_freq_factor = static_cast<float>(f->get_float("llama.rope.scaling.high_freq_factor", s.high_freq_factor));
    s.original_max_position = f->get_int("llama.rope.scaling.original_context_length", s.original_max_position);
  }

  c.tied_embeddings = f->tensor("output.weight") == nullptr;
  c.validate(path);

  m.weights.storage.push_back(f->mapping());
  Assembler a(path, [&](const std::string& n) { return f->tensor(n); }, m.weights);
  a.assemble(gguf_names());

  m.tokenizer = Tokenizer::from_gguf(*f);
  check_tokenizer_fits(path, *m.tokenizer, c);
  if (f->has("tokenizer.chat_template"))
    m.chat_template = ChatTemplate::from_template_text(f->get_string("tokenizer.chat_template"), special_tokens(*m.tokenizer));
  return m;
}

// ---- Hugging Face directory ------------------------------------------------------------------

json read_json_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw ModelError("cannot read '" + p.string() + "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw ModelError("'" + p.string() + "' is not valid JSON: " + e.what());
  }
}

// Typed access to config.json fields, each failure naming the file and the field.
class ConfigJson {
 public:
  ConfigJson(json j, std::string path) : j_(std::move(j)), path_(std::move(path)) {
    if (!j_.is_object()) fail("is not a JSON object");
  }
  bool has(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }
  const json& at(const char* k) const { return j_[k]; }
  int64_t integer(const char* k) const {
    if (!has(k)) fail(std::string("is missing the field '") + k + "'");
    return as_int(j_[k], k);
  }
  int64_t integer(const char* k, int64_t fallback) const { return has(k) ? as_int(j_[k], k) : fallback; }
  double number(const char* k, double fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_number()) fail(std::string("field '") + k + "' is " + j_[k].dump() + ", expected a number");
    return j_[k].get<double>();
  }
  bool boolean(const char* k, bool fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_boolean()) fail(std::string("field '") + k + "' is " + j_[k].dump() + ", expected true or false");
    return j_[k].get<bool>();
  }
  std::string string(const char* k, const std::string& fallback) const {
    if (!has(k)) return fallback;
    if (!j_[k].is_string()) fail(std::string("field '") + k + "' is " + j_[k].dump() + ", expected a string");
    return j_[k].get<std::string>();
  }
  int64_t as_int(const json& v, const std::string& k) const {
    if (!v.is_number_integer()) fail("field '" + k + "' is " + v.dump() + ", expected an integer");
    return v.get<int64_t>();
  }
  ConfigJson sub(const char* k) const { return ConfigJson(j_[k], path_ + " (" + k + ")"); }
  [[noreturn]] void fail(const std::string& what) const { throw ModelError("'" + path_ + "' " + what); }

 private:
  json j_;
  std::string path_;
};

LlamaConfig read_hf_config(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  if (!fs::exists(path)) throw ModelError("model directory '" + dir.string() + "' has no config.json");
  ConfigJson j(read_json_file(path), path.string());

  bool llama = j.string("model_type", "") == "llama";
  std::string arch = j.string("model_type", "");
  if (j.has("architectures")) {
    const json& a = j.at("architectures");
    if (!a.is_array()) j.fail("field 'architectures' is " + a.dump() + ", expected a list");
    for (const json& name : a)
      if (name.is_string()) {
        if (name.get<std::string>() == "LlamaForCausalLM") llama = true;
        if (&name == &a.front()) arch = name.get<std::string>();  // the class name says more than model_type
      }
  }
  if (!llama) unsupported_architecture(path.string(), arch.empty() ? "unknown" : arch);
  if (j.boolean("attention_bias", false) || j.boolean("mlp_bias", false))
    j.fail("asks for attention or MLP biases, which Specula's Llama does not have");
  if (std::string act = j.string("hidden_act", "silu"); act != "silu") j.fail("has hidden_act '" + act + "'; Specula's Llama uses silu");

  LlamaConfig c;
  c.architecture = "llama";
  c.name = dir.filename().string();
  if (c.name.empty()) c.name = dir.parent_path().filename().string();
  c.hidden = j.integer("hidden_size");
  c.intermediate = j.integer("intermediate_size");
  c.layers = j.integer("num_hidden_layers");
  c.heads = j.integer("num_attention_heads");
  c.kv_heads = j.integer("num_key_value_heads", c.heads);
  c.head_dim = j.integer("head_dim", c.heads > 0 ? c.hidden / c.heads : 0);
  c.vocab_size = j.integer("vocab_size");
  // Defaults are transformers' LlamaConfig defaults.
  c.max_positions = j.integer("max_position_embeddings", 2048);
  c.rope_theta = static_cast<float>(j.number("rope_theta", 10000.0));
  c.rms_eps = static_cast<float>(j.number("rms_norm_eps", 1e-6));
  c.tied_embeddings = j.boolean("tie_word_embeddings", false);
  c.rope_style = RopeStyle::HalfSplit;
  c.bos_id = static_cast<int32_t>(j.integer("bos_token_id", -1));
  if (j.has("eos_token_id")) {
    const json& e = j.at("eos_token_id");
    if (e.is_array()) {
      for (const json& id : e) c.eos_ids.push_back(static_cast<int32_t>(j.as_int(id, "eos_token_id")));
    } else {
      c.eos_ids.push_back(static_cast<int32_t>(j.as_int(e, "eos_token_id")));
    }
  }
  if (j.has("rope_scaling")) {
    if (!j.at("rope_scaling").is_object()) j.fail("field 'rope_scaling' is " + j.at("rope_scaling").dump() + ", expected an object");
    ConfigJson s = j.sub("rope_scaling");
    std::string type = s.string("rope_type", s.string("type", ""));
    if (type != "default") {
      c.rope_scaling.type = type;
      c.rope_scaling.factor = static_cast<float>(s.number("factor", c.rope_scaling.factor));
      c.rope_scaling.low_freq_factor = static_cast<float>(s.number("low_freq_factor", c.rope_scaling.low_freq_factor));
      c.rope_scaling.high_freq_factor = static_cast<float>(s.number("high_freq_factor", c.rope_scaling.high_freq_factor));
      c.rope_scaling.original_max_position =
          s.integer("original_max_position_embeddings", c.rope_scaling.original_max_position);
    }
  }
  c.validate(path.string());
  return c;
}

ChatTemplate read_hf_chat_template(const fs::path& dir, const SpecialTokens& tokens) {
  const fs::path path = dir / "tokenizer_config.json";
  if (!fs::exists(path)) return {};
  json j = read_json_file(path);
  if (!j.is_object() || !j.contains("chat_template")) return {};
  const json& t = j["chat_template"];
  if (t.is_string()) return ChatTemplate::from_template_text(t.get<std::string>(), tokens);
  // Newer files keep a list of named templates; the one named "default" is the chat format.
  if (t.is_array())
    for (const json& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
        return ChatTemplate::from_template_text(e["template"].get<std::string>(), tokens);
  return {};
}

LoadedModel load_hf_dir(const fs::path& dir) {
  LoadedModel m;
  m.path = dir.string();
  m.format = "safetensors";
  m.weights.config = read_hf_config(dir);
  LlamaConfig& c = m.weights.config;

  auto set = std::make_shared<SafetensorsSet>(dir.string());
  if (!set->tensor("lm_head.weight")) c.tied_embeddings = true;
  m.weights.storage.push_back(set);
  Assembler a(dir.string(), [&](const std::string& n) { return set->tensor(n); }, m.weights);
  a.assemble(hf_names());

  const fs::path tok = dir / "tokenizer.json";
  if (!fs::exists(tok)) throw ModelError("model directory '" + dir.string() + "' has no tokenizer.json");
  m.tokenizer = Tokenizer::from_hf_json(tok.string());
  check_tokenizer_fits(dir.string(), *m.tokenizer, c);
  m.chat_template = read_hf_chat_template(dir, special_tokens(*m.tokenizer));
  return m;
}

}  // namespace

LoadedModel load_model(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw ModelError("model not found: " + path);
  if (fs::path(path).extension() == ".safetensors" && !fs::is_directory(st))
    throw ModelError("'" + path + "' is a single safetensors file; pass the model directory (with config.json and tokenizer.json)");
  LoadedModel m = fs::is_directory(st) ? load_hf_dir(fs::path(path)) : load_gguf(path);
  if (!m.chat_template.problem().empty()) {
    static const char* const kNames[] = {"ChatML", "Llama 3", "plain text"};
    std::fprintf(stderr, "specula: the chat template of '%s' is not run (%s); prompts use the built-in %s format\n",
                 path.c_str(), m.chat_template.problem().c_str(), kNames[static_cast<int>(m.chat_template.kind())]);
  }
  return m;
}

ChatTemplate chat_template_for(const LoadedModel& m, const std::string& spec) {
  if (spec.empty()) return m.chat_template;
  return ChatTemplate::from_option(spec, m.tokenizer ? special_tokens(*m.tokenizer) : SpecialTokens{});
}

}  // namespace specula
