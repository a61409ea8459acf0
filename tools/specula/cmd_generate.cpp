// `specula generate`: one prompt in, streamed text out, speeds at the end; with --draft, the
// same through the speculative loop, with acceptance statistics at the end.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "spec/generate.h"
#include "spec/make_drafter.h"
#include "spec/speculative_generate.h"
#include "tools/specula/common.h"
#include "tools/specula/commands.h"
#include "tools/specula/engine_cli.h"
#include "tools/specula/spec_cli.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula generate [--model PATH] (--prompt TEXT | --prompt-ids 1,2,3) [--chat] [--system TEXT]\n"
    "                        [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
    "                        [--json] [--device auto|host|cuda] [--threads N] [--ctx N]\n"
    "                        [--draft none|ngram[:n=3]|skip:LAYERS|eagle[:PATH]|PATH] [--spec-k K] [--adaptive]\n"
    "                        [--spec-k-min K] [--spec-k-max K] [--draft-entropy NATS] [--spec-sampling exact|coupled]\n"
    "  Streams the continuation to stdout and ends with prefill and decode tokens/s on stderr.\n"
    "  --chat applies the model's chat template to the prompt (as one user message).\n"
    "  Defaults: temperature 0.8, top-k 40, top-p 0.95, max-tokens 256, a random seed (printed).\n"
    "  --json prints one JSON object {prompt_ids, ids, text, finish_reason, ...} instead.\n"
    "  --draft runs exact speculative decoding: ngram (prompt lookup, n = 3 by default), skip:LAYERS\n"
    "  (the model itself with layers skipped, e.g. skip:10-19 or skip:3,5,7-9), eagle (the trained\n"
    "  draft head shipped for this model; eagle:PATH for a head file, docs/draft.md) or a draft model\n"
    "  with the same vocabulary. --spec-k: draft tokens per round (1-16, default 4); --adaptive\n"
    "  picks K per round in [--spec-k-min, --spec-k-max] (1, 8) from the running acceptance;\n"
    "  --draft-entropy ends a draft where its distribution's entropy exceeds NATS. --spec-sampling\n"
    "  coupled makes sampled output identical to target-only output for the seed (exact, the\n"
    "  default, accepts more). Acceptance statistics follow on stderr (or under \"speculative\").\n"
    "  --pipeline on|off and --trace FILE run the generation through the actor engine instead of the\n"
    "  sequential loop: pipelined, the next round is drafted while this one is verified; the trace is\n"
    "  Chrome trace-event JSON with a lane per stream and actor (ui.perfetto.dev).\n";

}  // namespace

SamplingParams sampling_from_args(const Args& a, const SamplingDefaults& d) {
  SamplingParams sp;
  sp.temperature = static_cast<float>(a.number("temperature", d.temperature));
  sp.top_k = static_cast<int>(a.integer("top-k", d.top_k));
  sp.top_p = static_cast<float>(a.number("top-p", d.top_p));
  sp.seed = a.has("seed") ? static_cast<uint64_t>(a.integer("seed", 0)) : d.seed ? *d.seed : std::random_device{}();
  try {
    sp.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return sp;
}

DraftLengthConfig draft_length_from_args(const Args& a) {
  DraftLengthConfig c;
  c.k = static_cast<int>(a.integer("spec-k", 4));
  c.adaptive = a.flag("adaptive");
  c.k_min = static_cast<int>(a.integer("spec-k-min", 1));
  c.k_max = static_cast<int>(a.integer("spec-k-max", std::max(8, c.k)));
  c.max_entropy = static_cast<float>(a.number("draft-entropy", 0));
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--spec-k: ") + e.what());
  }
  return c;
}

int cmd_generate(int argc, char** argv) {
  std::set<std::string> options = kModelOptions;
  options.insert({"prompt", "prompt-ids", "system", "max-tokens", "temperature", "top-k", "top-p", "seed", "draft",
                  "spec-k", "spec-k-min", "spec-k-max", "draft-entropy", "spec-sampling"});
  options.insert({"pipeline", "trace"});
  const Args a(argc, argv, options, {"chat", "json", "adaptive"});
  if (a.help()) { std::fputs(kUsage, stdout); return 0; }
  if (a.has("prompt") == a.has("prompt-ids")) throw UsageError("give exactly one of --prompt or --prompt-ids");
  if (a.has("pipeline") || a.has("trace")) return generate_with_engine(a);
  const SamplingParams sp = sampling_from_args(a);
  const long long max_tokens = a.integer("max-tokens", 256);
  if (max_tokens < 1 || max_tokens > 1'000'000) throw UsageError("--max-tokens must be between 1 and 1000000");
  const std::string draft_spec = a.str("draft", "none");
  const DraftLengthConfig draft_length = draft_length_from_args(a);
  SpecSampling spec_sampling = SpecSampling::Exact;
  try {
    spec_sampling = parse_spec_sampling(a.str("spec-sampling", "exact"));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--spec-sampling: ") + e.what());
  }

  Session s = open_session(a);
  const Tokenizer& tok = *s.loaded.tokenizer;
  GenerateRequest req;
  if (a.has("prompt-ids")) {
    for (int id : a.int_list("prompt-ids")) {
      if (id < 0 || id >= tok.vocab_size())
        throw UsageError("--prompt-ids: token " + std::to_string(id) + " is outside the vocabulary of " +
                         std::to_string(tok.vocab_size()));
      req.prompt.push_back(id);
    }
  } else if (a.flag("chat")) {
    std::vector<ChatMessage> msgs;
    if (a.has("system")) msgs.push_back({"system", a.str("system")});
    msgs.push_back({"user", a.str("prompt")});
    req.prompt = tok.encode(s.loaded.chat_template.render(msgs));
  } else {
    req.prompt = tok.encode(a.str("prompt"));
  }
  if (req.prompt.empty()) throw UsageError("the prompt is empty");
  req.max_tokens = static_cast<int>(max_tokens);
  req.sampling = sp;
  req.stop_ids = default_stop_ids(s.loaded);

  std::unique_ptr<Drafter> drafter;
  try {
    drafter = make_drafter(draft_spec, s.loaded, *s.model, s.kv->blocks_total() * s.kv->config().block_tokens);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--draft: ") + e.what());
  }

  const int seq = s.kv->create_sequence();
  const bool json = a.flag("json");
  std::vector<int32_t> ids;
  StreamDecoder dec(s.loaded.tokenizer, /*skip_special=*/true);
  auto emit = [&](int32_t t) {
    ids.push_back(t);
    if (!json) {
      std::fputs(dec.push(t).c_str(), stdout);
      std::fflush(stdout);
    }
    return true;
  };
  GenerateStats st;
  SpeculativeStats spec;
  if (drafter) {
    SpeculativeRequest sreq;
    static_cast<GenerateRequest&>(sreq) = req;
    sreq.draft = draft_length;
    sreq.mode = spec_sampling;
    spec = speculative_generate(*s.model, *s.kv, seq, *drafter, sreq, [&](int32_t t, TokenOrigin) { return emit(t); });
    st = spec;
  } else {
    st = generate(*s.model, *s.kv, seq, req, emit);
  }
  // Speculative decode time covers every token (the first comes from a round, not prefill).
  const double decode_tps = drafter ? spec.speculative_tokens_per_second() : st.decode_tokens_per_second();

  if (json) {
    nlohmann::json j;
    j["prompt_ids"] = req.prompt;
    j["ids"] = ids;
    j["text"] = tok.decode(ids, /*skip_special=*/true);
    j["finish_reason"] = finish_reason_name(st.finish_reason);
    j["seed"] = sp.seed;
    j["prefill_tokens_per_second"] = st.prefill_tokens_per_second();
    j["decode_tokens_per_second"] = decode_tps;
    j["device"] = s.ops->name();
    if (drafter) {
      j["speculative"] = spec_stats_json(spec);
      j["speculative"]["draft"] = drafter->name();
      j["speculative"]["k"] = draft_length.k;
      j["speculative"]["adaptive"] = draft_length.adaptive;
      j["speculative"]["sampling"] = sp.greedy() ? "greedy" : spec_sampling_name(spec_sampling);
    }
    std::cout << j.dump() << "\n";
  } else {
    std::fputs(dec.flush().c_str(), stdout);
    std::fprintf(stderr, "\n[prefill %lld tokens at %.1f tok/s; decode %lld tokens at %.1f tok/s; %s; seed %llu; %s]\n",
                 static_cast<long long>(st.prompt_tokens), st.prefill_tokens_per_second(),
                 static_cast<long long>(st.generated), decode_tps, std::string(finish_reason_name(st.finish_reason)).c_str(),
                 static_cast<unsigned long long>(sp.seed), s.ops->name().c_str());
    if (drafter)
      std::fprintf(stderr, "[%s, K %d%s, %s: %s]\n", drafter->name().c_str(), draft_length.k,
                   draft_length.adaptive ? " adaptive" : "", sp.greedy() ? "greedy" : spec_sampling_name(spec_sampling),
                   spec_stats_line(spec).c_str());
  }
  return 0;
}

}  // namespace specula::cli
