// `specula info`: load a model (GGUF file or Hugging Face directory) and print its configuration
// and how many of its tensors are stored in each type. A bad model is a one-line error (main.cpp).
#include <cstdio>
#include <map>
#include <set>
#include <string>

#include "model/weights.h"
#include "tools/specula/args.h"
#include "tools/specula/commands.h"
#include "tools/specula/common.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula info [--model PATH]\n"
    "  --model PATH   a GGUF file or a Hugging Face model directory (default: the SmolLM2 model)\n";

const char* chat_kind(ChatTemplate::Kind k) {
  switch (k) {
    case ChatTemplate::Kind::ChatML: return "ChatML";
    case ChatTemplate::Kind::Llama3: return "Llama 3";
    case ChatTemplate::Kind::Plain: return "none (plain text)";
  }
  return "?";
}

std::string rope_line(const LlamaConfig& c) {
  char theta[32];
  std::snprintf(theta, sizeof theta, "%g", c.rope_theta);
  std::string s = std::string("theta ") + theta + ", " +
                  (c.rope_style == RopeStyle::Interleaved ? "adjacent pairs (GGUF)" : "half-split pairs (HF)");
  const RopeScaling& r = c.rope_scaling;
  if (r.type.empty()) return s + ", no scaling";
  if (!r.freq_factors.empty()) return s + ", " + r.type + " scaling from rope_freqs.weight";
  char buf[160];
  std::snprintf(buf, sizeof buf, ", %s scaling (factor %g, low %g, high %g, original context %lld)", r.type.c_str(), r.factor,
                r.low_freq_factor, r.high_freq_factor, static_cast<long long>(r.original_max_position));
  return s + buf;
}

}  // namespace

int cmd_info(int argc, char** argv) {
  Args a(argc, argv, {"model"}, {});
  if (a.help()) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const LoadedModel m = load_model(a.str("model", default_model_path()));
  const LlamaConfig& c = m.weights.config;

  // Every distinct tensor the forward pass reads (a tied output is the embedding, counted once).
  std::set<const std::byte*> seen;
  std::map<std::string, int> by_type;
  size_t bytes = 0;
  auto count = [&](const TensorView& t) {
    if (!seen.insert(t.data).second) return;
    ++by_type[dtype_name(t.dtype)];
    bytes += t.nbytes;
  };
  count(m.weights.embed);
  count(m.weights.output_norm);
  count(m.weights.output);
  for (const LayerWeights& l : m.weights.layers)
    for (const TensorView* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down}) count(*t);

  std::string types;
  for (const auto& [name, n] : by_type) types += (types.empty() ? "" : ", ") + name + " " + std::to_string(n);
  std::string eos;
  for (int32_t id : c.eos_ids) eos += (eos.empty() ? "" : " ") + std::to_string(id);

  std::printf("model         %s (%s)\n", m.path.c_str(), m.format.c_str());
  std::printf("name          %s\n", c.name.empty() ? "-" : c.name.c_str());
  std::printf("architecture  %s\n", c.architecture.c_str());
  std::printf("layers        %lld\n", static_cast<long long>(c.layers));
  std::printf("hidden        %lld\n", static_cast<long long>(c.hidden));
  std::printf("intermediate  %lld\n", static_cast<long long>(c.intermediate));
  std::printf("heads         %lld (kv heads %lld, head_dim %lld)\n", static_cast<long long>(c.heads),
              static_cast<long long>(c.kv_heads), static_cast<long long>(c.head_dim));
  std::printf("vocab         %lld (tokenizer %d)\n", static_cast<long long>(c.vocab_size), m.tokenizer->vocab_size());
  std::printf("context       %lld\n", static_cast<long long>(c.max_positions));
  std::printf("rope          %s\n", rope_line(c).c_str());
  std::printf("rms_eps       %g\n", c.rms_eps);
  std::printf("embeddings    %s\n", c.tied_embeddings ? "tied" : "separate output");
  std::printf("bos / eos     %d / %s\n", c.bos_id, eos.empty() ? "-" : eos.c_str());
  if (m.chat_template.runs_jinja())
    std::printf("chat format   the model's Jinja template (%s family)\n", chat_kind(m.chat_template.kind()));
  else if (!m.chat_template.problem().empty())
    std::printf("chat format   built-in %s (the model's template is not run: %s)\n", chat_kind(m.chat_template.kind()),
                m.chat_template.problem().c_str());
  else
    std::printf("chat format   built-in %s\n", chat_kind(m.chat_template.kind()));
  // How tool_choice "auto" is served (docs/protocol.md, "Tools").
  const ChatTemplate& ct = m.chat_template;
  if (ct.reads_own_tool_calls())
    std::printf("tool calls    the model's own: %s syntax, tools written by its template\n", tool_syntax_name(ct.tool_syntax()));
  else
    std::printf("tool calls    llama.cpp's generic JSON format%s\n",
                ct.supports_tools() ? " (the template writes tools, in a call syntax not recognised)" : "");
  std::printf("tensors       %zu: %s (%.1f MB; norms as loaded, F32)\n", seen.size(), types.c_str(), bytes / 1e6);
  return 0;
}

}  // namespace specula::cli
