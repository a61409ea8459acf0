// `specula draft-eval`: the runtime's own measure of a draft head on a draft data file
// (docs/draft.md): teacher-forced over each sequence, the head's greedy depth-1 proposal at every
// position against the target's argmax stored in the file, the figure train.py reports as
// validation top-1 at depth 1. It holds the C++ drafter to the trainer (oracle test) and measures
// a head on data it was not trained on. With --depth D it also drafts D tokens at each position
// (the run-time protocol: depths 2..D read the head's own features and proposals) and reports how
// far the chain matches the target's greedy continuation, the greedy acceptance per depth that
// `bench spec` measures, on positions where the file's tokens are that greedy continuation.
// With --ranks N it reports how often the target's argmax is among the head's N likeliest depth-1
// tokens: what a tree of candidates (several children at the root) could accept at depth 1.
// With --proposals FILE it also writes, for each sequence, its tokens and at every chain position
// the head's proposal beside the target's greedy chain: the input for measuring another drafter
// against the head on the same positions (docs/draft.md, "A datastore of the target's own text").
#include <algorithm>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "gpu/host/quant.h"
#include "spec/eagle_drafter.h"
#include "spec/make_drafter.h"
#include "tools/specula/common.h"
#include "tools/specula/commands.h"
#include "tools/specula/draft_data.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula draft-eval [--model PATH] --draft eagle[:PATH] --data FILE.spd [--limit N] [--responses-only] [--depth D]\n"
    "                          [--ranks N] [--proposals FILE.jsonl]\n"
    "  Prints JSON: depth-1 top-1 agreement of the head's greedy proposal with the target's argmax\n"
    "  at every position of the file's sequences (or only where the next token is a response token),\n"
    "  teacher-forced with the file's tokens and hidden states. The file needs top-k (K >= 1).\n"
    "  --depth D (default 1): draft D tokens at each position and report the greedy chain's\n"
    "  acceptance per depth (accepted[j]: the first j + 1 drafts all equal the target's argmax chain)\n"
    "  and the mean accepted length, over positions whose next D file tokens are that chain.\n"
    "  --ranks N (1..64): also the fraction of positions whose target argmax is among the head's j\n"
    "  likeliest depth-1 tokens, j = 1..N (in_top_j; ranked by q at temperature 1, which has no greedy\n"
    "  bias on context tokens; ties to the lower id; a token the head cannot propose never), also\n"
    "  split by the head's largest q (below 0.3, 0.3-0.6, above).\n"
    "  --proposals FILE: also write one JSON line per sequence: its tokens, n_prompt, and at each\n"
    "  position of the chain measure the head's D drafts and the target's greedy chain there\n"
    "  ({\"position\": m, \"draft\": [...], \"target\": [...]}: the drafts follow tokens[0..m]).\n";

}  // namespace

int cmd_draft_eval(int argc, char** argv) {
  std::set<std::string> options = kModelOptions;
  options.insert({"draft", "data", "limit", "depth", "ranks", "proposals"});
  const Args a(argc, argv, options, {"responses-only"});
  if (a.help()) { std::fputs(kUsage, stdout); return 0; }
  if (!a.has("draft") || !a.has("data")) throw UsageError("--draft and --data are required");
  Session s = open_session(a);
  std::unique_ptr<Drafter> d;
  try {
    d = make_drafter(a.str("draft"), s.loaded, *s.model, s.kv->blocks_total() * s.kv->config().block_tokens);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--draft: ") + e.what());
  }
  if (!d || !d->wants_target_hidden()) throw UsageError("--draft: draft-eval measures a trained head (eagle or eagle:PATH)");
  // The head as trained: every position of a record in its cache (the runtime's catch-up window
  // would restart it at the first response position).
  if (auto* eagle = dynamic_cast<EagleDrafter*>(d.get())) eagle->set_catch_up_window(0);
  const std::string path = a.str("data");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("--data " + path + ": cannot open");
  const draft_data::Header hd = draft_data::read_header(in, "--data " + path);
  const int64_t H = hd.hidden, K = hd.topk, W = hd.row_width();
  if (H != s.model->config().hidden) throw UsageError("--data: hidden width " + std::to_string(H) + " is not the target's");
  // The head's row: the final hidden state, then its feature layers, each taken from the file's
  // chunk of that layer.
  std::vector<int64_t> chunks{0};
  for (int l : d->target_feature_layers()) {
    const auto at = std::find(hd.feature_layers.begin(), hd.feature_layers.end(), static_cast<uint32_t>(l));
    if (at == hd.feature_layers.end())
      throw UsageError("--data: the head reads the target's layer " + std::to_string(l) + ", which the file does not hold");
    chunks.push_back(1 + (at - hd.feature_layers.begin()));
  }
  if (K < 1) throw UsageError("--data: the file stores no top-k, so it has no target argmax to compare with");
  const long long limit = a.integer("limit", 1LL << 40);
  const bool responses_only = a.flag("responses-only");
  const long long depth = a.integer("depth", 1);
  if (depth < 1 || depth > 16) throw UsageError("--depth must be 1..16");
  const long long ranks = a.integer("ranks", 0);
  if (ranks < 0 || ranks > 64) throw UsageError("--ranks must be 0..64");
  // The head's depth-1 distribution: one token sampled at T 1 brings its q row.
  DraftRequest rank_req;
  rank_req.max_tokens = 1;
  rank_req.sampling = SamplingParams{1.0f, 0, 1.0f, 0};
  DraftProposal ranked;
  // Counted by the head's confidence (its largest q): where a second candidate would pay.
  constexpr double kBinEdges[] = {0.3, 0.6};
  struct Bin { int64_t positions = 0; std::vector<int64_t> in_top; };
  std::vector<Bin> bins(3, Bin{0, std::vector<int64_t>(static_cast<size_t>(ranks), 0)});

  int64_t positions = 0, agree = 0, sequences = 0;
  draft_data::Record rec;
  std::vector<float> h;
  DraftRequest req;
  req.max_tokens = static_cast<int>(depth);
  req.sampling = SamplingParams{0.0f, 0, 1.0f, 0};
  DraftProposal out;
  // The chain measure: positions whose next `depth` file tokens are the target's greedy chain.
  int64_t chains = 0;
  std::ofstream proposals;
  if (a.has("proposals")) {
    proposals.open(a.str("proposals"));
    if (!proposals) throw UsageError("--proposals " + a.str("proposals") + ": cannot create the file");
  }
  nlohmann::json chain_rows = nlohmann::json::array();
  std::vector<int64_t> accepted(static_cast<size_t>(depth), 0);
  while (sequences < limit && draft_data::read_record(in, hd, rec, "--data " + path)) {
    const std::vector<int32_t>& tokens = rec.tokens;
    const int64_t T = static_cast<int64_t>(tokens.size()), P = rec.n_prompt;
    h.resize(static_cast<size_t>(T) * chunks.size() * static_cast<size_t>(H));
    for (int64_t t = 0, o = 0; t < T; ++t)
      for (int64_t c : chunks)
        for (int64_t i = 0; i < H; ++i) h[static_cast<size_t>(o++)] = fp16_to_f32(rec.hidden[static_cast<size_t>(t * W + c * H + i)]);
    // Position m (context x_0..x_m): the head proposes x_{m+1}; the target's argmax there is ids[m][0].
    d->prefill({tokens.data(), 1});
    d->target_hidden(0, h);
    for (int64_t m = 1; m < T; ++m) {
      if (responses_only && m + 1 < P) continue;
      req.context = {tokens.data(), static_cast<size_t>(m + 1)};
      req.position = m + 1;
      d->propose(req, out);
      ++positions;
      auto argmax_at = [&](int64_t i) { return rec.topk_ids[static_cast<size_t>(i * K)]; };
      agree += out.k() >= 1 && out.tokens[0] == argmax_at(m);
      if (ranks > 0) {
        // the head's cache is left as the chain proposal left it: propose drops speculative entries
        rank_req.context = req.context;
        rank_req.position = req.position;
        d->propose(rank_req, ranked);
        const int32_t t = argmax_at(m);
        const std::span<const float> q(ranked.q.data(), ranked.q.size());
        const float qt = q.empty() ? 0.0f : q[static_cast<size_t>(t)];
        const float q_max = q.empty() ? 0.0f : *std::max_element(q.begin(), q.end());
        Bin& bin = bins[q_max < kBinEdges[0] ? 0 : q_max < kBinEdges[1] ? 1 : 2];
        ++bin.positions;
        if (qt > 0.0f) {
          int64_t ahead = 0;  // tokens ranked before t
          for (size_t v = 0; v < q.size() && ahead < ranks; ++v)
            ahead += q[v] > qt || (q[v] == qt && static_cast<int32_t>(v) < t);
          for (int64_t j = ahead; j < ranks; ++j) ++bin.in_top[static_cast<size_t>(j)];
        }
      }
      if (m + depth > T) continue;
      bool greedy_chain = true;  // x_{m+i} = argmax at m + i - 1 for i = 1..depth - 1
      for (int64_t i = 1; i < depth && greedy_chain; ++i) greedy_chain = tokens[static_cast<size_t>(m + i)] == argmax_at(m + i - 1);
      if (!greedy_chain) continue;
      ++chains;
      for (int64_t i = 0; i < out.k() && out.tokens[static_cast<size_t>(i)] == argmax_at(m + i); ++i) ++accepted[static_cast<size_t>(i)];
      if (proposals.is_open()) {
        nlohmann::json target = nlohmann::json::array();
        for (int64_t i = 0; i < depth; ++i) target.push_back(argmax_at(m + i));
        chain_rows.push_back({{"position", m}, {"draft", out.tokens}, {"target", target}});
      }
    }
    if (proposals.is_open()) {
      proposals << nlohmann::json{{"sequence", sequences}, {"n_prompt", P}, {"tokens", tokens}, {"chains", chain_rows}}.dump()
                << '\n';
      chain_rows = nlohmann::json::array();
    }
    ++sequences;
  }
  nlohmann::json j;
  j["draft"] = d->name();
  j["sequences"] = sequences;
  j["positions"] = positions;
  // n of d as a fraction (0 when there is nothing to count).
  const auto share = [](int64_t n, int64_t d) { return d ? static_cast<double>(n) / static_cast<double>(d) : 0.0; };
  j["top1_depth1"] = share(agree, positions);
  if (ranks > 0) {
    nlohmann::json top = nlohmann::json::array();
    for (int64_t r = 0; r < ranks; ++r) {
      int64_t n = 0;
      for (const Bin& b : bins) n += b.in_top[static_cast<size_t>(r)];
      top.push_back(share(n, positions));
    }
    j["in_top"] = top;
    nlohmann::json by = nlohmann::json::array();
    for (size_t b = 0; b < bins.size(); ++b) {
      nlohmann::json tb = nlohmann::json::array();
      for (int64_t n : bins[b].in_top)
        tb.push_back(share(n, bins[b].positions));
      by.push_back({{"head_top_q_from", b == 0 ? 0.0 : kBinEdges[b - 1]}, {"head_top_q_below", b < 2 ? kBinEdges[b] : 1.0},
                    {"positions", bins[b].positions}, {"in_top", tb}});
    }
    j["in_top_by_confidence"] = by;
  }
  if (depth > 1) {
    nlohmann::json acc = nlohmann::json::array();
    double mean = 0.0;
    for (int64_t n : accepted) {
      const double f = share(n, chains);
      acc.push_back(f);
      mean += f;
    }
    j["depth"] = depth;
    j["chain_positions"] = chains;
    j["accepted"] = acc;
    j["mean_accepted_length"] = mean;
  }
  if (proposals.is_open() && !proposals.flush()) throw std::runtime_error("--proposals: write failed");
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace specula::cli
