// `specula logits`: logits at every position of a token sequence, as .npy — the numerics
// oracle's window into the forward pass (chunked feeding and KV rollback included).
#include <algorithm>
#include <cstdio>

#include "tools/specula/common.h"
#include "tools/specula/commands.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula logits [--model PATH] --tokens 1,2,3 --out FILE.npy [--hidden-out FILE.npy] [--chunk C]\n"
    "                      [--truncate-at T] [--feature-layers L1,L2,...] [--device D] [--threads N] [--ctx N]\n"
    "  Writes float32 logits [n_tokens, vocab]. Tokens are fed in chunks of C (default: all).\n"
    "  --hidden-out also writes the final hidden states (after the final norm) [n_tokens, hidden];\n"
    "  with --feature-layers, each row is followed by the RMS-normed residual after each of those\n"
    "  decoder blocks (0-based): the rows a fused-feature draft head reads.\n"
    "  --truncate-at T feeds all tokens, rolls the KV cache back to T, re-feeds tokens[T:] in\n"
    "  chunks of C; rows >= T come from the re-feed.\n";

// Feeds tokens[from, to) in chunks, writing each row's logits into out and its final hidden
// state into hidden.
void feed(LlamaModel& m, KvCache& kv, int seq, const std::vector<int32_t>& tokens, size_t from, size_t to, size_t chunk,
          std::vector<float>& out, std::vector<float>& hidden) {
  const int64_t V = m.config().vocab_size, H = m.feature_width();
  std::vector<float> logits, h;
  for (size_t i = from; i < to; i += chunk) {
    const size_t n = std::min(chunk, to - i);
    ForwardSeq fs{seq, {tokens.data() + i, n}, true};
    m.forward({&fs, 1}, kv, logits);
    std::copy(logits.begin(), logits.end(), out.begin() + static_cast<int64_t>(i) * V);
    m.last_hidden(h);
    std::copy(h.begin(), h.end(), hidden.begin() + static_cast<int64_t>(i) * H);
  }
}

}  // namespace

int cmd_logits(int argc, char** argv) {
  std::set<std::string> options = kModelOptions;
  options.insert({"tokens", "out", "hidden-out", "chunk", "truncate-at", "feature-layers"});
  const Args a(argc, argv, options, {});
  if (a.help()) { std::fputs(kUsage, stdout); return 0; }
  if (!a.has("tokens") || !a.has("out")) throw UsageError("--tokens and --out are required");
  Session s = open_session(a);
  if (a.has("feature-layers")) {
    try {
      s.model->set_feature_layers(a.int_list("feature-layers"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--feature-layers: ") + e.what());
    }
  }
  std::vector<int32_t> tokens;
  for (int t : a.int_list("tokens")) tokens.push_back(t);
  if (tokens.empty()) throw UsageError("--tokens is empty");
  const long long chunk_arg = a.integer("chunk", static_cast<long long>(tokens.size()));
  if (chunk_arg < 1) throw UsageError("--chunk must be >= 1");
  const size_t chunk = static_cast<size_t>(chunk_arg);
  const int64_t V = s.model->config().vocab_size;
  const int64_t H = s.model->feature_width();
  std::vector<float> out(tokens.size() * V), hidden(tokens.size() * H);
  const int seq = s.kv->create_sequence();
  if (a.has("truncate-at")) {
    const long long t = a.integer("truncate-at", 0);
    if (t < 0 || t >= static_cast<long long>(tokens.size())) throw UsageError("--truncate-at must be in [0, n_tokens)");
    feed(*s.model, *s.kv, seq, tokens, 0, tokens.size(), tokens.size(), out, hidden);
    s.kv->truncate_to(seq, t);
    feed(*s.model, *s.kv, seq, tokens, static_cast<size_t>(t), tokens.size(), chunk, out, hidden);
  } else {
    feed(*s.model, *s.kv, seq, tokens, 0, tokens.size(), chunk, out, hidden);
  }
  write_npy(a.str("out"), out, {static_cast<int64_t>(tokens.size()), V});
  if (a.has("hidden-out")) write_npy(a.str("hidden-out"), hidden, {static_cast<int64_t>(tokens.size()), H});
  return 0;
}

}  // namespace specula::cli
