// `specula bench decode`: prefill and decode speed, the memory-bandwidth roofline of decode,
// and the cost of scoring n tokens in one forward relative to one — as JSON on stdout.
// `specula bench spec`: a prompt set target-only vs each drafter, speedup against Theorem 3.8.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include <fstream>
#include <memory>
#include <optional>

#include "gpu/host/bandwidth.h"
#include "gpu/host/host_device.h"
#include "spec/generate.h"
#include "spec/grammar.h"
#include "spec/json_mode.h"
#include "spec/lookup_first_drafter.h"
#include "spec/make_drafter.h"
#include "spec/sampling.h"
#include "spec/speculative_generate.h"
#include "tools/specula/common.h"
#include "tools/specula/commands.h"
#include "tools/specula/engine_cli.h"
#include "tools/specula/spec_cli.h"
#include "tools/specula/bench_decode.h"
#include "tools/specula/bench_shape.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula bench decode [--model PATH] [--threads N] [--ubatch-size 512] [--contexts 128,1024,4096] [--decode-tokens N (64)]\n"
    "                            [--repeat R (3)] [--max-verify N (16)] [--paths fast,reference] [--device D]\n"
    "                            [--agreement on|off] [--prompts FILE] [--agreement-tokens N (64)]\n"
    "                            [--agreement-out FILE.jsonl]\n"
    "       specula bench decode --shape llama-3.2-1b|llama-3.2-3b[,...] [--device D] [--prompt-tokens N] [...]\n"
    "  Prints JSON, per host path (fast: int8 activations; reference: f32), each with its own device\n"
    "  and model: load time, resident memory added, repacked bytes; at each context, prefill tokens/s\n"
    "  and decode tokens/s (median of R runs, each timed after 16 untimed steps) and the median of\n"
    "  the runs' fractions of the read roofline (weights + that context's K/V, each run against the\n"
    "  bandwidth measured right after it: a shared machine's bandwidth drifts); the time of one\n"
    "  forward over n = 1..max-verify tokens relative to one (each n timed right after one token,\n"
    "  each over a burst of back-to-back forwards after 0.1 s of untimed ones, the median of the\n"
    "  pairs' ratios), at the first context and at 2048; tokens/s of 1, 4 and 16 sequences\n"
    "  decoding together; the fast/reference ratios; and (both paths) their teacher-forced top-1\n"
    "  agreement and perplexities on the prompt set plus each prompt's 64-token continuation,\n"
    "  with the disagreements counted by the reference's logit gap between the two choices,\n"
    "  the KL divergence from the reference, and the agreement counting each distinct context\n"
    "  once (the chat template's shared opening repeats in every prompt)\n"
    "  (--agreement-out FILE.jsonl: the scored tokens and, per position, both paths' top-1 and\n"
    "  the KL divergence).\n"
    "  --shape: random BF16 weights at that model's exact shape instead of a model file; the\n"
    "  bandwidth is a device-to-device copy on CUDA; two shapes also give the step cost ratio c.\n"
    "  --spec-pair 0.6,0.7,0.8 (with two shapes, draft first): a synthetic pair with those greedy\n"
    "  acceptances; speculative vs target-only decoding and Theorem 3.8's prediction (--spec-k, 4),\n"
    "  through the sequential loop and through the actor engine with pipelining off and on\n"
    "  (--spec-pair-engine off: the sequential loop only). On CUDA the decode and verify timings\n"
    "  are repeated with each step replayed from a CUDA graph (--cuda-graphs both|off, default both).\n"
    "\n"
    "usage: specula bench spec [--model PATH] [--prompts FILE] [--drafts LIST] [--limit N] [--max-tokens N]\n"
    "                          [--spec-k K] [--adaptive] [--spec-k-min K] [--spec-k-max K] [--spec-k-max-greedy K]\n"
    "                          [--draft-entropy NATS] [--draft-confidence P] [--draft-confidence-greedy P]\n"
    "                          [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
    "                          [--presence-penalty X] [--frequency-penalty X] [--repetition-penalty X]\n"
    "                          [--logit-bias ID:BIAS,...] [--min-tokens N] [--json-object | --json-schema FILE | --grammar FILE]\n"
    "                          [--allowed-token-ids ID,...] [--bad-words WORD,...]\n"
    "                          [--spec-sampling exact|block|coupled|both|LIST] [--repeat R] [--threads N] [--device D] [--ctx N] [--ubatch-size 512]\n"
    "  Runs a prompt set (JSON lines with \"messages\" and an optional \"max_tokens\"; default\n"
    "  ../shared/data/prompts/chat.jsonl) target-only and with each drafter, prompt by prompt so that\n"
    "  changes in machine load hit every configuration alike, and prints JSON per configuration:\n"
    "  tokens/s and speedup, acceptance, accepted length and tokens per round, the measured cost ratio\n"
    "  c (draft time per drafted token / target time per token) and verify cost (a round's verify\n"
    "  forward / one target token; also by round size, verify_cost_by_draft_length), and Theorem\n"
    "  3.8's predicted speedup from the measured a and c (with prompt lookup in front of another\n"
    "  drafter, e.g. ngram:n=3+eagle, also the rounds lookup drafted: rounds_by_lookup).\n"
    "  --drafts: ';'-separated drafter spellings as for generate --draft (default \"ngram;skip:4-7\").\n"
    "  --json-object, --json-schema, --grammar, --allowed-token-ids, --bad-words: every request\n"
    "  constrained as by generate's flags.\n"
    "  --spec-k-max-greedy: greedy requests' --spec-k-max (default the same).\n"
    "  --spec-k, --spec-k-max, --spec-k-max-greedy, --draft-entropy, --draft-confidence and\n"
    "  --draft-confidence-greedy may each list values (\"0.3,0.4\"): every drafter then runs once per\n"
    "  combination, in the same pass over the prompts, and each run's JSON names its settings under\n"
    "  \"draft_length\" (as llama-bench runs its lists).\n"
    "  Temperature defaults to 0 (greedy); sampled runs verify both exact and coupled unless\n"
    "  --spec-sampling names one or lists several (\"exact,block\": the token rule against block\n"
    "  verification). Greedy and coupled runs also report whether the text matched.\n"
    "  --repeat R (default 1): each prompt's configurations run R times, every other time in\n"
    "  reverse order, and the order changes from prompt to prompt (a Williams design: each\n"
    "  configuration follows every other equally often); the same seeds give the same text each\n"
    "  time. Besides the totals over all\n"
    "  repeats, each run reports speedup_by_repeat and least_time_speedup: every configuration\n"
    "  timed by each prompt's fastest repeat, for a machine whose load comes and goes.\n"
    "  prefill_seconds: the configuration's time in the prompts' prefills (speedup counts it,\n"
    "  decode_speedup does not).\n"
    "\n"
    "usage: specula bench spec --concurrency 1,4,16,64 [--pipeline on|off|both] [--drafts \"none;ngram\"]\n"
    "                          [--load-adaptive on|off|both] [--requests N] [--repeat R] [--trace PREFIX]\n"
    "                          [--max-tokens N (64)] [--draft-threads N] [--pipeline-always] [--prefix-cache on|off]\n"
    "                          [the options above]\n"
    "  The same prompts through the actor engine, for each concurrency level (that many requests\n"
    "  active at once; --requests, default max(level, 4), in all) and each configuration: drafter x\n"
    "  pipelining (default both) x the load-adaptive K policy (with --adaptive; default on).\n"
    "  Configurations alternate within a level (R times). JSON per run: total and per-request\n"
    "  tokens/s, the total relative to --drafts none, acceptance, time to first token, and from the\n"
    "  engine's trace the draft and verify streams' busy fractions and the overlap (the fraction of\n"
    "  verify time during which the draft stream was busy). --trace keeps each run's trace as\n"
    "  PREFIX-c<level>-<draft>[-pipelined]-<rep>.json (ui.perfetto.dev). --draft-threads: the\n"
    "  pipelined draft stream's compute threads (default --threads). Pipelining runs where the draft\n"
    "  stream has cores of its own (each run's JSON says under \"pipelined\"); --pipeline-always runs\n"
    "  it regardless (docs/engine.md).\n";

using Clock = BenchClock;


// --- bench spec ---------------------------------------------------------------------------

}  // namespace

std::vector<BenchPrompt> read_prompts(const std::string& path, const LoadedModel& m, long long limit, long long max_tokens) {
  std::ifstream in(path);
  if (!in) throw UsageError("--prompts: cannot read " + path);
  std::vector<BenchPrompt> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (limit > 0 && static_cast<long long>(out.size()) >= limit) break;
    try {
      const auto j = nlohmann::json::parse(line);
      std::vector<ChatMessage> msgs;
      for (const auto& msg : j.at("messages")) msgs.push_back({msg.at("role"), msg.at("content")});
      BenchPrompt p;
      p.id = j.value("id", std::to_string(n));
      p.tokens = m.tokenizer->encode(m.chat_template.render(msgs));
      p.max_tokens = j.value("max_tokens", 128);
      if (max_tokens > 0) p.max_tokens = static_cast<int>(std::min<long long>(p.max_tokens, max_tokens));
      out.push_back(std::move(p));
    } catch (const nlohmann::json::exception& e) {
      throw UsageError(path + " line " + std::to_string(n) + ": " + e.what());
    }
  }
  if (out.empty()) throw UsageError("--prompts: no prompts in " + path);
  return out;
}

namespace {

// Tokens written in some wall-clock seconds.
struct Timed {
  int64_t tokens = 0;
  double seconds = 0;
  double tokens_per_second() const { return tokens / seconds; }
  void add(const Timed& t) {
    tokens += t.tokens;
    seconds += t.seconds;
  }
};

// Which of n configurations runs o-th for prompt pi on pass rep: a Williams design, the order
// 0, 1, n-1, 2, n-2, ... shifted by pi, reversed on odd passes. None always runs first, and each
// configuration follows every other equally often (once in n prompts for even n, twice in n
// prompts' two passes for odd n), so whatever a run leaves to the next is spread over all of them
// (docs/benchmarks.md, "The ninth fine-tune beside the eighth").
size_t run_order(size_t o, size_t n, size_t pi, int64_t rep) {
  const size_t slot = rep % 2 ? n - 1 - o : o;
  const size_t base = slot == 0 ? 0 : slot % 2 ? (slot + 1) / 2 : n - slot / 2;
  return (base + pi) % n;
}

// One configuration's sums over the prompt set.
struct SpecTotals {
  std::string draft;          // "none" for target-only
  std::string mode;           // "greedy", "exact", "block" or "coupled"
  SpecSampling sampling = SpecSampling::Exact;
  Drafter* drafter = nullptr;
  DraftLengthConfig length;
  int64_t decode_tokens = 0, mismatched_prompts = 0;
  std::optional<int64_t> lookup_rounds;  // prompt lookup in front of another drafter: the rounds lookup drafted
  double decode = 0;
  double prefill = 0;  // every run's prefill (the prompt's forward; with a drafter, also its prefill)
  // Each pass over the prompts (--repeat), and each prompt's fastest run summed over the prompts
  // (least time: what an undisturbed machine gives).
  std::vector<Timed> passes;
  Timed least;
  SpeculativeStats spec;
  Timed all() const {
    Timed t;
    for (const Timed& p : passes) t.add(p);
    return t;
  }
  void add(const SpeculativeStats& st) {
    spec.rounds += st.rounds;
    spec.drafted += st.drafted;
    spec.accepted += st.accepted;
    spec.rejected += st.rejected;
    for (size_t i = 0; i < spec.drafted_at.size(); ++i) {
      spec.drafted_at[i] += st.drafted_at[i];
      spec.accepted_at[i] += st.accepted_at[i];
    }
    spec.draft_seconds += st.draft_seconds;
    spec.verify_seconds += st.verify_seconds;
    spec.confidence_threshold_sum += st.confidence_threshold_sum;
    spec.confidence_rounds += st.confidence_rounds;
    for (size_t k = 0; k < spec.rounds_by_draft.size(); ++k) {
      spec.rounds_by_draft[k] += st.rounds_by_draft[k];
      spec.verify_seconds_by_draft[k] += st.verify_seconds_by_draft[k];
    }
  }
};

// The draft-length options that `bench spec` (the loop) takes as lists, llama-bench's way.
constexpr const char* kDraftLengthLists[] = {"spec-k", "spec-k-max", "spec-k-max-greedy", "draft-entropy",
                                             "draft-confidence", "draft-confidence-greedy"};

// Every combination of the listed draft-length values, in the order given (the last option
// varying fastest), each checked as generate checks one.
std::vector<DraftLengthConfig> draft_length_grid(const Args& a) {
  std::vector<Args> combos{a};
  for (const char* name : kDraftLengthLists) {
    if (!a.has(name)) continue;
    const std::vector<std::string> values = split(a.str(name), ',');
    if (values.empty()) throw UsageError(std::string("--") + name + " names no value");
    std::vector<Args> next;
    for (const Args& c : combos)
      for (const std::string& v : values) next.push_back(c.with(name, v));
    combos = std::move(next);
  }
  std::vector<DraftLengthConfig> out;
  for (const Args& c : combos) out.push_back(draft_length_from_args(c));
  return out;
}

int bench_spec(const Args& a) {
  SamplingParams base = sampling_from_args(a, kBenchSamplingDefaults);
  const std::string gbnf = grammar_from_args(a);
  const std::vector<DraftLengthConfig> lengths = draft_length_grid(a);
  std::vector<SpecSampling> modes;
  const std::string which = a.str("spec-sampling", "both");
  // One mode, "both" (exact and coupled), or a comma list ("exact,block").
  if (base.greedy()) modes = {SpecSampling::Exact};
  else if (which == "both") modes = {SpecSampling::Exact, SpecSampling::Coupled};
  else
    for (const std::string& m : split(which, ',')) {
      try {
        modes.push_back(parse_spec_sampling(m));
      } catch (const std::invalid_argument&) {
        throw UsageError("--spec-sampling must be exact, block, coupled, both or a comma list of them, got '" + which + "'");
      }
    }

  const int64_t repeat = a.integer("repeat", 1);
  if (repeat < 1 || repeat > 100) throw UsageError("--repeat must be 1..100, got " + std::to_string(repeat));

  Session s = open_session(a);
  token_lists_from_args(a, s.loaded, base);
  // A constraint on every request (JSON mode or a grammar): what its masks cost, and what
  // speculation gives inside it.
  if (a.flag("json-object")) base.json_object = std::make_shared<const JsonVocabulary>(*s.loaded.tokenizer);
  if (!gbnf.empty())
    base.grammar = std::make_shared<const GrammarMatcher>(Grammar::parse(gbnf), std::make_shared<const TokenTrie>(*s.loaded.tokenizer));
  const std::vector<BenchPrompt> prompts =
      read_prompts(a.str("prompts", "../shared/data/prompts/chat.jsonl"), s.loaded, a.integer("limit", 0), a.integer("max-tokens", 0));
  const int64_t max_positions = s.kv->blocks_total() * s.kv->config().block_tokens;
  const std::vector<int32_t> stop_ids = default_stop_ids(s.loaded);

  // Drafters, one per spelling, shared by the exact and coupled runs.
  std::vector<std::unique_ptr<Drafter>> drafters;
  std::vector<SpecTotals> runs(1);
  runs[0].draft = "none";
  runs[0].mode = base.greedy() ? "greedy" : "target";
  std::string list = a.str("drafts", "ngram;skip:4-7");
  for (size_t at = 0; at <= list.size();) {
    const size_t semi = std::min(list.find(';', at), list.size());
    const std::string spelling = list.substr(at, semi - at);
    at = semi + 1;
    if (spelling.empty() || spelling == "none") continue;
    try {
      drafters.push_back(make_drafter(spelling, s.loaded, *s.model, max_positions));
    } catch (const std::invalid_argument& e) {
      throw UsageError("--drafts: " + std::string(e.what()));
    }
    for (const DraftLengthConfig& length : lengths)
      for (SpecSampling m : modes) {
        SpecTotals t;
        t.draft = drafters.back()->name();
        t.mode = base.greedy() ? "greedy" : spec_sampling_name(m);
        t.sampling = m;
        t.drafter = drafters.back().get();
        t.length = length;
        runs.push_back(std::move(t));
      }
  }
  if (runs.size() < 2) throw UsageError("--drafts names no drafter");

  const int seq = s.kv->create_sequence();
  {  // warm-up: page in the weights and size the workspaces, not counted
    GenerateRequest w{prompts[0].tokens, 8, base, {}};
    generate(*s.model, *s.kv, seq, w, [](int32_t) { return true; });
  }
  for (SpecTotals& r : runs) r.passes.assign(static_cast<size_t>(repeat), Timed{});
  std::vector<std::vector<int32_t>> ids(runs.size());
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    GenerateRequest req{prompts[pi].tokens, prompts[pi].max_tokens, base, stop_ids};
    req.sampling.seed = base.seed + pi;
    std::vector<Timed> fastest(runs.size(), Timed{0, std::numeric_limits<double>::infinity()});
    for (int64_t rep = 0; rep < repeat; ++rep) {
      for (size_t o = 0; o < runs.size(); ++o) {
        const size_t ri = run_order(o, runs.size(), pi, rep);
        SpecTotals& r = runs[ri];
        ids[ri].clear();
        s.kv->truncate_to(seq, 0);
        const auto t0 = Clock::now();
        if (!r.drafter) {
          const GenerateStats st = generate(*s.model, *s.kv, seq, req, [&](int32_t t) { ids[ri].push_back(t); return true; });
          r.decode += st.decode_seconds;
          r.prefill += st.prefill_seconds;
          r.decode_tokens += st.generated - 1;  // generate()'s first token comes with the prefill
        } else {
          SpeculativeRequest sreq;
          static_cast<GenerateRequest&>(sreq) = req;
          sreq.draft = r.length;
          sreq.mode = r.sampling;
          const auto* lookup_first = dynamic_cast<const LookupFirstDrafter*>(r.drafter);
          const int64_t lookup_before = lookup_first ? lookup_first->lookup_rounds() : 0;
          const SpeculativeStats st = speculative_generate(*s.model, *s.kv, seq, *r.drafter, sreq, [&](int32_t t, TokenOrigin) {
            ids[ri].push_back(t);
            return true;
          });
          r.decode += st.decode_seconds;
          r.prefill += st.prefill_seconds;
          r.decode_tokens += st.generated;
          r.add(st);
          if (lookup_first) r.lookup_rounds = r.lookup_rounds.value_or(0) + lookup_first->lookup_rounds() - lookup_before;
        }
        const Timed run{static_cast<int64_t>(ids[ri].size()), seconds_since(t0)};
        r.passes[static_cast<size_t>(rep)].add(run);
        if (run.seconds < fastest[ri].seconds) fastest[ri] = run;
      }
      for (size_t ri = 1; ri < runs.size(); ++ri)
        if (ids[ri] != ids[0]) ++runs[ri].mismatched_prompts;
    }
    for (size_t ri = 0; ri < runs.size(); ++ri) runs[ri].least.add(fastest[ri]);
    std::fprintf(stderr, "[bench spec] prompt %zu/%zu (%s) done\n", pi + 1, prompts.size(), prompts[pi].id.c_str());
  }

  const SpecTotals& target = runs[0];
  const double target_tps = target.all().tokens_per_second();
  const double t_token = target.decode / std::max<int64_t>(1, target.decode_tokens);  // one target decode step
  nlohmann::json out = nlohmann::json::array();
  for (const SpecTotals& r : runs) {
    nlohmann::json j;
    j["draft"] = r.draft;
    j["mode"] = r.mode;
    const Timed all = r.all();
    j["tokens"] = all.tokens;
    j["seconds"] = all.seconds;
    j["tokens_per_second"] = all.tokens_per_second();
    j["decode_tokens_per_second"] = r.decode_tokens / r.decode;
    j["prefill_seconds"] = r.prefill;
    j["speedup"] = all.tokens_per_second() / target_tps;
    nlohmann::json by_repeat = nlohmann::json::array();
    for (size_t k = 0; k < r.passes.size(); ++k)
      by_repeat.push_back(r.passes[k].tokens_per_second() / target.passes[k].tokens_per_second());
    j["speedup_by_repeat"] = by_repeat;
    j["least_time_tokens_per_second"] = r.least.tokens_per_second();
    j["least_time_speedup"] = r.least.tokens_per_second() / target.least.tokens_per_second();
    if (!r.drafter) {
      j["ms_per_token"] = 1e3 * t_token;
      out.push_back(j);
      continue;
    }
    const SpeculativeStats& st = r.spec;
    j["draft_length"] = draft_length_json(r.length);
    j["decode_speedup"] = (r.decode_tokens / r.decode) * t_token;
    if (base.greedy() || r.sampling == SpecSampling::Coupled) j["text_matches_target"] = r.mismatched_prompts == 0;
    j.update(spec_stats_json(st));
    const double gamma = st.mean_draft_length(), alpha = st.alpha();
    const double c = st.drafted > 0 ? (st.draft_seconds / st.drafted) / t_token : 0;
    const double verify_cost = (st.verify_seconds / std::max<int64_t>(1, st.rounds)) / t_token;
    j["c"] = c;
    j["verify_cost"] = verify_cost;
    // Each round size as the loop ran it: a verify forward over k drafts (k + 1 rows) against
    // one target decode step of this run.
    nlohmann::json by_draft = nlohmann::json::array();
    for (size_t k = 0; k < st.rounds_by_draft.size(); ++k)
      if (st.rounds_by_draft[k] > 0)
        by_draft.push_back({{"drafts", k},
                            {"rounds", st.rounds_by_draft[k]},
                            {"verify_cost", st.verify_seconds_by_draft[k] / static_cast<double>(st.rounds_by_draft[k]) / t_token}});
    j["verify_cost_by_draft_length"] = by_draft;
    if (r.lookup_rounds) j["rounds_by_lookup"] = *r.lookup_rounds;  // the rest: the drafter behind it
    j["expected_tokens_per_round"] = expected_tokens_per_round(alpha, gamma);
    j["theorem_3_8_speedup"] = theorem_3_8_speedup(alpha, gamma, c);
    j["predicted_speedup_with_verify_cost"] = expected_tokens_per_round(alpha, gamma) / (gamma * c + verify_cost);
    j["overhead_seconds"] = r.decode - st.draft_seconds - st.verify_seconds;
    out.push_back(j);
  }
  nlohmann::json j;
  j["bench"] = "spec";
  j["model"] = s.loaded.path;
  j["device"] = s.ops->name();
  j["threads"] = a.integer("threads", 2);
  j["prompts"] = prompts.size();
  j["repeats"] = repeat;
  j["prompt_file"] = a.str("prompts", "../shared/data/prompts/chat.jsonl");
  j["sampling"] = sampling_json(base);
  j["constraint"] = constraint_name(a);
  if (lengths.size() == 1) j.update(draft_length_json(lengths[0]));  // with a grid, each run names its own
  j["runs"] = out;
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string what = argv[1];
    std::set<std::string> options = kModelOptions;
    std::set<std::string> flags;
    if (what == "spec") {
      options.insert({kChatTemplateOption, "prompts", "drafts", "limit", "max-tokens", "spec-k", "spec-k-min", "spec-k-max", "spec-k-max-greedy", "draft-entropy", "draft-confidence",
                      "draft-confidence-greedy", "temperature", "top-k", "top-p", "min-p", "presence-penalty", "frequency-penalty", "repetition-penalty", "logit-bias", "min-tokens", "seed", "spec-sampling",
                      "json-schema", "grammar", "allowed-token-ids", "bad-words"});
      options.insert(kEngineBenchOptions.begin(), kEngineBenchOptions.end());
      flags.insert({"adaptive", "pipeline-always", "json-object"});
    } else {
      options.insert({"prompt-tokens", "decode-tokens", "repeat", "max-verify", "shape", "spec-pair", "spec-k", "spec-pair-engine",
                      "cuda-graphs", "contexts", "paths", "agreement", "prompts", "agreement-tokens", "agreement-out"});
    }
    const Args a(argc - 1, argv + 1, options, flags);
    if (a.help()) { std::fputs(kUsage, stdout); return 0; }
    if (what == "decode") return a.has("shape") ? bench_decode_shape(a) : bench_decode(a);
    if (what == "spec" && (a.has("concurrency") || a.has("pipeline"))) {
      for (const char* name : kDraftLengthLists)
        if (a.str(name).find(',') != std::string::npos)
          throw UsageError(std::string("--") + name + " takes one value with --concurrency (lists are for the loop's bench spec)");
      return bench_spec_engine(a);
    }
    if (what == "spec") {
      // The engine's options (but --repeat, which the loop takes too) are refused, not ignored.
      std::string engine_only = a.flag("pipeline-always") ? "pipeline-always" : "";
      for (const std::string& name : kEngineBenchOptions)
        if (name != "repeat" && a.has(name)) engine_only = name;
      if (!engine_only.empty())
        throw UsageError("--" + engine_only + " is for the engine's bench spec (with --concurrency or --pipeline)");
      return bench_spec(a);
    }
    throw UsageError("unknown benchmark '" + what + "' (expected: decode or spec)");
  }
  std::fputs(kUsage, argc >= 2 ? stdout : stderr);
  return argc >= 2 ? 0 : 2;
}

}  // namespace specula::cli
