// `specula generate`: one prompt in, streamed text out, speeds at the end; with --draft, exact
// speculative decoding, with acceptance statistics at the end. It runs through the actor engine,
// the path the server and the C++ API take (docs/engine.md, "The CLI"); --sequential runs the
// sequential loop of spec/ instead, the literal statement of the method that the tests hold the
// engine to.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <random>

#include "actors/engine.h"
#include "spec/generate.h"
#include "spec/grammar.h"
#include "spec/penalties.h"
#include "spec/json_schema.h"
#include "spec/json_mode.h"
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
    "                        [--max-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]\n"
    "                        [--presence-penalty X] [--frequency-penalty X] [--repetition-penalty X]\n"
    "                        [--logit-bias ID:BIAS,...] [--min-tokens N] [--ignore-eos] [--json-object]\n"
    "                        [--json-schema FILE | --grammar FILE] [--allowed-token-ids ID,...] [--bad-words WORD,...]\n"
    "                        [--json] [--device auto|host|cuda] [--threads N] [--ctx N] [--ubatch-size 512]\n"
    "                        [--draft none|ngram[:n=3]|skip:LAYERS|eagle[:PATH]|PATH|ngram:n=3+eagle] [--spec-k K] [--adaptive]\n"
    "                        [--spec-k-min K] [--spec-k-max K] [--spec-k-max-greedy K] [--draft-entropy NATS]\n"
    "                        [--draft-confidence P] [--draft-confidence-greedy P]\n"
    "                        [--spec-sampling exact|block|coupled] [--pipeline off|on|always] [--trace FILE] [--sequential]\n"
    "                        [--prefix-cache on|off] [--chat-template chatml|llama3|plain|FILE|TEXT]\n"
    "  Streams the continuation to stdout and ends with prefill and decode tokens/s on stderr.\n"
    "  --chat applies the model's chat template to the prompt (as one user message; --system adds a\n"
    "  system message), or --chat-template's (as `specula serve --chat-template`).\n"
    "  Defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0 (off), max-tokens 256, a random seed (printed);\n"
    "  penalties off (presence and frequency 0, in [-2, 2]; repetition 1, in (0, 2]: docs/speculative.md).\n"
    "  --logit-bias adds BIAS (in [-100, 100]) to token ID's logit; --min-tokens N holds the stop tokens\n"
    "  back until N tokens are out; --ignore-eos lets no stop token end the text (as vLLM's fields).\n"
    "  --allowed-token-ids ID,...: only these tokens may be generated; --bad-words WORD,... (or a JSON array\n"
    "  of strings): never these words (vLLM's allowed_token_ids and bad_words; docs/speculative.md).\n"
    "  --json-object: JSON mode, the text is one JSON object (OpenAI's response_format json_object).\n"
    "  --json-schema FILE: the text is JSON that the schema in FILE accepts (response_format json_schema);\n"
    "  --grammar FILE: the text is a sentence of the GBNF grammar in FILE (llama.cpp's format; docs/speculative.md).\n"
    "  --json prints one JSON object {prompt_ids, ids, text, finish_reason, ...} instead.\n"
    "  --draft runs exact speculative decoding: ngram (prompt lookup, n = 3 by default), skip:LAYERS\n"
    "  (the model itself with layers skipped, e.g. skip:10-19 or skip:3,5,7-9), eagle (the trained\n"
    "  draft head shipped for this model; eagle:PATH for a head file; ,context=N after either: how\n"
    "  many recent context tokens outside the head's vocabulary it may propose, default 32, 0 = none;\n"
    "  docs/draft.md) or a draft model\n"
    "  with the same vocabulary; ngram:n=N+OTHER puts prompt lookup in front of one of the others (a\n"
    "  round is lookup's where the last N tokens recur, OTHER's elsewhere). --spec-k: draft tokens\n"
    "  per round (1-16, default 4); --adaptive picks K per round in [--spec-k-min, --spec-k-max]\n"
    "  (1, 8) from the running acceptance (--spec-k-max-greedy K: greedy requests' --spec-k-max,\n"
    "  default the same); --draft-entropy ends a draft where its distribution's\n"
    "  entropy exceeds NATS, --draft-confidence where the product of its tokens' draft probabilities\n"
    "  falls below P (--draft-confidence-greedy P: greedy requests' threshold, default the same;\n"
    "  --draft-confidence auto: each request sets P every round from its measured acceptance and\n"
    "  costs, starting at 0.3 or at the greedy P).\n"
    "  --spec-sampling coupled makes sampled output identical to target-only\n"
    "  output for the seed (exact, the default, accepts more); block judges each round's draft as\n"
    "  a whole (block verification, also exact in distribution). Acceptance statistics follow on\n"
    "  stderr (or under \"speculative\").\n"
    "  The generation runs through the actor engine, as the server does. --pipeline on drafts the\n"
    "  next round while this one is verified (default off) where the draft stream has cores of its\n"
    "  own (a GPU, or twice --threads fitting the CPUs; else it says so and does not), --pipeline\n"
    "  always regardless (docs/engine.md); --trace FILE writes Chrome trace-event\n"
    "  JSON with a lane per stream and actor (ui.perfetto.dev). --sequential runs the sequential\n"
    "  loop (the method's reference, one round after another on one thread of control) instead.\n"
    "  --prefix-cache off: no KV blocks kept for later requests' prompts (docs/engine.md).\n";


// --prompt-ids checked against the vocabulary, so the message names the option.
std::vector<int32_t> prompt_ids_from_args(const Args& a, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int id : a.int_list("prompt-ids")) {
    if (id < 0 || id >= vocab)
      throw UsageError("--prompt-ids: token " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab));
    ids.push_back(id);
  }
  return ids;
}

// The reference: the sequential loop of spec/ on one session.
int generate_sequential(const Args& a);
// The product path: one request through the engine.
int generate_through_engine(const Args& a);

// --logit-bias ID:BIAS[,ID:BIAS...]: the range and count are SamplingParams::validate's, the
// vocabulary the engine's (or the loop's) check.
std::vector<std::pair<int32_t, float>> logit_bias_from_arg(const std::string& text) {
  auto refuse = [](const std::string& item) {
    return UsageError("--logit-bias: expected TOKEN_ID:BIAS pairs separated by commas (e.g. 2:-100,1017:5), got \"" +
                      item + "\"");
  };
  std::vector<std::pair<int32_t, float>> out;
  for (const std::string& item : split(text, ',')) {
    const char* end = item.data() + item.size();
    int32_t id = -1;
    float bias = 0;
    const auto [after_id, id_error] = std::from_chars(item.data(), end, id);
    if (id_error != std::errc{} || id < 0 || after_id == end || *after_id != ':') throw refuse(item);
    const char* bias_at = after_id + 1;
    if (bias_at != end && *bias_at == '+') ++bias_at;  // from_chars takes no plus sign; stod did
    const auto [after_bias, bias_error] = std::from_chars(bias_at, end, bias);
    if (bias_error != std::errc{} || after_bias != end) throw refuse(item);
    out.emplace_back(id, bias);
  }
  if (out.empty()) throw refuse(text);
  return out;
}

}  // namespace

SamplingParams sampling_from_args(const Args& a, const SamplingDefaults& d) {
  SamplingParams sp;
  sp.temperature = static_cast<float>(a.number("temperature", d.temperature));
  sp.top_k = static_cast<int>(a.integer("top-k", d.top_k));
  sp.top_p = static_cast<float>(a.number("top-p", d.top_p));
  sp.min_p = static_cast<float>(a.number("min-p", 0.0));
  sp.presence_penalty = static_cast<float>(a.number("presence-penalty", 0.0));
  sp.frequency_penalty = static_cast<float>(a.number("frequency-penalty", 0.0));
  sp.repetition_penalty = static_cast<float>(a.number("repetition-penalty", 1.0));
  if (a.has("logit-bias")) sp.logit_bias = logit_bias_from_arg(a.str("logit-bias"));
  const long long min_tokens = a.integer("min-tokens", 0);
  if (min_tokens < 0 || min_tokens > 1'000'000) throw UsageError("--min-tokens must be between 0 and 1000000");
  sp.min_tokens = static_cast<int>(min_tokens);
  sp.seed = a.has("seed") ? static_cast<uint64_t>(a.integer("seed", 0)) : d.seed ? *d.seed : std::random_device{}();
  try {
    sp.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return sp;
}

void token_lists_from_args(const Args& a, const LoadedModel& model, SamplingParams& sp) {
  const int64_t vocab = model.weights.config.vocab_size;
  std::vector<int32_t> allowed;
  std::vector<std::string> words;
  if (a.has("allowed-token-ids")) {
    for (const int id : a.int_list("allowed-token-ids")) {
      if (id < 0 || id >= vocab)
        throw UsageError("--allowed-token-ids: token " + std::to_string(id) + " is outside the vocabulary (0.." +
                         std::to_string(vocab - 1) + ")");
      allowed.push_back(id);
    }
    if (allowed.empty()) throw UsageError("--allowed-token-ids names no token, so none could be generated");
  }
  if (a.has("bad-words")) {
    const std::string text = a.str("bad-words");
    if (text.starts_with("[")) {  // a JSON array of strings, for words with commas in them
      const nlohmann::json parsed = nlohmann::json::parse(text, nullptr, false);
      if (!parsed.is_array()) throw UsageError("--bad-words: \"" + text + "\" starts with '[' but is not a JSON array of strings");
      for (const nlohmann::json& w : parsed) {
        if (!w.is_string()) throw UsageError("--bad-words: the JSON array holds " + w.dump() + ", not a string");
        words.push_back(w.get<std::string>());
      }
    } else {
      words = split(text, ',');
    }
    if (words.empty()) throw UsageError("--bad-words names no word");
  }
  if (allowed.empty() && words.empty()) return;
  try {  // the words tokenized, their limits, and that they leave some token to begin with
    set_token_lists(sp, std::move(allowed), words, model.tokenizer.get(), vocab);
  } catch (const std::invalid_argument& e) {
    std::string what = e.what();
    const bool about_ids = what.starts_with("allowed_token_ids");
    if (what.starts_with("bad_words: ")) what.erase(0, 11);  // (the flag names it)
    throw UsageError((about_ids ? "--allowed-token-ids: " : "--bad-words: ") + what);
  }
}

long long max_tokens_from_args(const Args& a, long long fallback) {
  const long long max_tokens = a.integer("max-tokens", fallback);
  if (max_tokens < 1 || max_tokens > 1'000'000) throw UsageError("--max-tokens must be between 1 and 1000000");
  return max_tokens;
}

SpecSampling spec_sampling_from_args(const Args& a) {
  try {
    return parse_spec_sampling(a.str("spec-sampling", "exact"));
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--spec-sampling: ") + e.what());
  }
}

DraftLengthConfig draft_length_from_args(const Args& a) {
  DraftLengthConfig c;
  c.k = static_cast<int>(a.integer("spec-k", 4));
  c.adaptive = a.flag("adaptive");
  c.k_min = static_cast<int>(a.integer("spec-k-min", 1));
  c.k_max = static_cast<int>(a.integer("spec-k-max", std::max(8, c.k)));
  c.k_max_greedy = static_cast<int>(a.integer("spec-k-max-greedy", 0));
  c.max_entropy = static_cast<float>(a.number("draft-entropy", 0));
  // `auto`: the threshold set per round from the request's measurements, starting at 0.3 (or at
  // --draft-confidence-greedy for greedy requests).
  c.confidence_auto = a.str("draft-confidence") == "auto";
  if (c.confidence_auto && !c.adaptive)
    throw UsageError("--draft-confidence auto sets the threshold each round from measured times, as --adaptive sets K: "
                     "give --adaptive too (with a fixed K the drafts stay a function of the request alone)");
  c.min_confidence = c.confidence_auto ? kAutoConfidenceStart : static_cast<float>(a.number("draft-confidence", 0));
  c.min_confidence_greedy = static_cast<float>(a.number("draft-confidence-greedy", 0));
  DraftLengthConfig lengths = c;  // K and its range alone, then the rules
  lengths.max_entropy = lengths.min_confidence = lengths.min_confidence_greedy = 0;
  lengths.confidence_auto = false;
  try {
    lengths.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--spec-k: ") + e.what());
  }
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--draft-entropy / --draft-confidence / --draft-confidence-greedy: ") + e.what());
  }
  return c;
}

std::string grammar_from_args(const Args& a) {
  if (a.has("json-schema") + a.has("grammar") + a.flag("json-object") > 1)
    throw UsageError("give at most one of --json-object, --json-schema and --grammar");
  const char* opt = a.has("json-schema") ? "json-schema" : a.has("grammar") ? "grammar" : nullptr;
  if (opt == nullptr) return "";
  const std::string path = a.str(opt);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(std::string("--") + opt + ": cannot read " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  try {
    if (a.has("grammar")) {
      (void)Grammar::parse(text);  // its errors here, before the model loads
      return text;
    }
    const auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
    if (schema.is_discarded()) throw std::invalid_argument(path + " is not JSON");
    return gbnf_of_json_schema(schema);
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string("--") + opt + ": " + e.what());
  }
}

std::string constraint_name(const Args& a) {
  if (a.flag("json-object")) return "json_object";
  if (a.has("json-schema")) return "json_schema " + a.str("json-schema");
  return a.has("grammar") ? "grammar " + a.str("grammar") : "none";
}

int cmd_generate(int argc, char** argv) {
  std::set<std::string> options = kModelOptions;
  options.insert({kChatTemplateOption, "json-schema", "grammar", "prompt", "prompt-ids", "system", "max-tokens", "temperature", "top-k", "top-p", "min-p", "presence-penalty", "frequency-penalty", "repetition-penalty", "logit-bias", "allowed-token-ids", "bad-words", "min-tokens", "seed"});
  options.insert(kEngineRunOptions.begin(), kEngineRunOptions.end());
  const Args a(argc, argv, options, {"chat", "json", "adaptive", "sequential", "ignore-eos", "json-object"});
  if (a.help()) { std::fputs(kUsage, stdout); return 0; }
  if (a.has("prompt") == a.has("prompt-ids")) throw UsageError("give exactly one of --prompt or --prompt-ids");
  (void)grammar_from_args(a);
  if (a.flag("sequential") && (a.has("pipeline") || a.has("trace") || a.has("prefix-cache")))
    throw UsageError("--pipeline, --trace and --prefix-cache are the engine's; --sequential runs without it");
  return a.flag("sequential") ? generate_sequential(a) : generate_through_engine(a);
}

namespace {

int generate_sequential(const Args& a) {
  const SamplingParams sp = sampling_from_args(a);
  const long long max_tokens = max_tokens_from_args(a, 256);
  const std::string draft_spec = a.str("draft", "none");
  const DraftLengthConfig draft_length = draft_length_from_args(a);
  const SpecSampling spec_sampling = spec_sampling_from_args(a);

  Session s = open_session(a);
  const Tokenizer& tok = *s.loaded.tokenizer;
  GenerateRequest req;
  if (a.has("prompt-ids")) {
    req.prompt = prompt_ids_from_args(a, tok.vocab_size());
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
  token_lists_from_args(a, s.loaded, req.sampling);
  if (a.flag("json-object")) req.sampling.json_object = std::make_shared<const JsonVocabulary>(tok);
  if (const std::string gbnf = grammar_from_args(a); !gbnf.empty())
    req.sampling.grammar = std::make_shared<const GrammarMatcher>(Grammar::parse(gbnf), std::make_shared<const TokenTrie>(tok));
  req.stop_ids = a.flag("ignore-eos") ? std::vector<int32_t>{} : default_stop_ids(s.loaded);

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

int generate_through_engine(const Args& a) {
  const long long max_tokens = max_tokens_from_args(a, 256);
  const SpecSampling mode = spec_sampling_from_args(a);
  auto files = std::make_shared<const LoadedModel>(load_model_from_args(a));
  actors::EngineConfig cfg = engine_config_from_args(a, files);
  actors::EngineRequest req;
  if (a.has("prompt-ids")) {
    req.prompt_ids = prompt_ids_from_args(a, files->weights.config.vocab_size);
  } else if (a.flag("chat")) {
    if (a.has("system")) req.messages.push_back({"system", a.str("system")});
    req.messages.push_back({"user", a.str("prompt")});
  } else {
    req.prompt = a.str("prompt");
  }
  req.max_tokens = static_cast<int>(max_tokens);
  const SamplingParams sp = sampling_from_args(a);
  req.sampling = sp;
  token_lists_from_args(a, *files, req.sampling);
  req.mode = mode;
  if (a.flag("ignore-eos")) req.stop_ids = std::vector<int32_t>{};

  std::unique_ptr<actors::Engine> engine = open_engine(cfg);
  if (a.flag("json-object")) req.sampling.json_object = engine->json_vocabulary();
  if (const std::string gbnf = grammar_from_args(a); !gbnf.empty()) req.sampling.grammar = engine->grammar(gbnf);
  std::optional<actors::TokenStream> stream;
  std::vector<int32_t> prompt_ids;
  try {
    prompt_ids = engine->tokenize(req);
    req.prompt_ids = prompt_ids;  // tokenized once
    stream.emplace(engine->start(std::move(req)));
  } catch (const actors::RequestError& e) {
    throw UsageError(std::string(e.field == "prompt" && a.has("prompt-ids") ? "--prompt-ids: " : "") + e.what());
  }
  const bool json = a.flag("json");
  const uint64_t seed = sp.seed;
  const StreamRead got = read_stream(*stream, !json);
  const actors::StreamEvent& ev = got.last;
  const std::vector<int32_t>& ids = got.ids;
  const double first = got.first;
  if (ev.kind == actors::StreamEvent::Kind::Error) throw std::runtime_error(ev.error);
  // The first token comes with the prompt's forward (and the first round): prefill speed is the
  // prompt over the time to it; decode speed covers the tokens after it.
  const double prefill_tps = first > 0 ? static_cast<double>(prompt_ids.size()) / first : 0;
  const double decode_tps = got.decode_tokens_per_second();
  const bool speculative = cfg.drafter != "none";
  const std::string sampling = sp.greedy() ? "greedy" : spec_sampling_name(mode);
  if (json) {
    nlohmann::json j;
    j["prompt_ids"] = prompt_ids;
    j["ids"] = ids;
    j["text"] = engine->model().tokenizer->decode(ids, /*skip_special=*/true);
    j["finish_reason"] = finish_reason_name(ev.finish_reason);
    j["seed"] = seed;
    j["time_to_first_token_seconds"] = first;
    j["prefill_tokens_per_second"] = prefill_tps;
    j["decode_tokens_per_second"] = decode_tps;
    j["device"] = engine->device_name();
    j["pipeline"] = cfg.pipeline;
    j["pipelined"] = engine->pipelined();
    if (speculative) {
      j["speculative"] = spec_stats_json(ev.stats);
      j["speculative"]["draft"] = cfg.drafter;
      j["speculative"]["k"] = cfg.draft.k;
      j["speculative"]["adaptive"] = cfg.draft.adaptive;
      j["speculative"]["sampling"] = sampling;
    }
    std::cout << j.dump() << "\n";
  } else {
    std::fprintf(stderr, "\n[prefill %zu tokens at %.1f tok/s; decode %zu tokens at %.1f tok/s; %s; seed %llu; %s%s]\n",
                 prompt_ids.size(), prefill_tps, ids.size(), decode_tps, std::string(finish_reason_name(ev.finish_reason)).c_str(),
                 static_cast<unsigned long long>(seed), engine->device_name().c_str(), cfg.pipeline ? "; pipelined" : "");
    if (speculative)
      std::fprintf(stderr, "[%s, K %d%s, %s: %s]\n", cfg.drafter.c_str(), cfg.draft.k, cfg.draft.adaptive ? " adaptive" : "",
                   sampling.c_str(), spec_stats_line(ev.stats).c_str());
  }
  stream.reset();
  const std::string trace = engine->trace_json();
  engine.reset();  // writes the trace file
  if (!cfg.trace_path.empty()) {
    const StreamOverlap o = stream_overlap(trace);
    std::fprintf(stderr, "[trace %s: draft stream busy %.3fs, verify stream busy %.3fs, overlap %.2f of verify time]\n",
                 cfg.trace_path.c_str(), o.draft_busy, o.verify_busy, o.overlap());
  }
  return 0;
}

}  // namespace

std::unique_ptr<actors::Engine> open_engine(const actors::EngineConfig& config) {
  try {
    auto engine = std::make_unique<actors::Engine>(config);
    report_pipelining(*engine);
    return engine;
  } catch (const std::invalid_argument& e) {
    throw UsageError(std::string(config.drafter != "none" ? "--draft: " : "") + e.what());
  }
}

StreamRead read_stream(actors::TokenStream& stream, bool echo) {
  StreamRead r;
  const auto t0 = BenchClock::now();
  for (;;) {
    r.last = stream.next_blocking();
    if (echo) {
      std::fputs(r.last.text.c_str(), stdout);
      std::fflush(stdout);
    }
    r.text += r.last.text;
    if (r.last.terminal()) break;
    if (r.ids.empty()) r.first = seconds_since(t0);
    r.ids.push_back(r.last.token);
  }
  r.total = seconds_since(t0);
  return r;
}

void pipelining_from_args(const Args& a, actors::EngineConfig& cfg) {
  const std::string pipeline = a.str("pipeline", "off");
  if (pipeline != "on" && pipeline != "off" && pipeline != "always")
    throw UsageError("--pipeline must be off, on or always, got '" + pipeline + "'");
  cfg.pipeline = pipeline != "off";
  cfg.pipeline_on_shared_cores = pipeline == "always";
}

void prefix_cache_from_args(const Args& a, actors::EngineConfig& cfg) {
  const std::string on = a.str("prefix-cache", "on");
  if (on != "on" && on != "off") throw UsageError("--prefix-cache must be on or off, got '" + on + "'");
  cfg.prefix_cache = on == "on";
}

void report_pipelining(const actors::Engine& engine) {
  if (!engine.why_not_pipelined().empty())
    std::fprintf(stderr, "specula: not pipelining: %s; --pipeline always runs it anyway\n", engine.why_not_pipelined().c_str());
}

actors::EngineConfig engine_config_from_args(const Args& a, std::shared_ptr<const LoadedModel> target) {
  actors::EngineConfig cfg;
  cfg.target = target->path;
  cfg.target_model = std::move(target);
  cfg.drafter = a.str("draft", "none");
  cfg.device = a.str("device", "auto");
  cfg.draft = draft_length_from_args(a);
  cfg.max_batch = 1;
  cfg.threads = static_cast<int>(a.integer("threads", 2));
  cfg.ubatch = ubatch_from_args(a);
  pipelining_from_args(a, cfg);
  prefix_cache_from_args(a, cfg);
  cfg.trace_path = a.str("trace", "");
  const int64_t model_ctx = cfg.target_model->weights.config.max_positions > 0 ? cfg.target_model->weights.config.max_positions : 8192;
  const int64_t ctx = a.integer("ctx", std::min<int64_t>(model_ctx, 8192));
  if (ctx < 16 || ctx > model_ctx)
    throw UsageError("--ctx must be between 16 and the model's context " + std::to_string(model_ctx) + ", got " + std::to_string(ctx));
  // The KV pool holds the context and the longest draft's rows beyond it.
  cfg.kv_tokens = ctx + kMaxDraftTokens + 1;
  return cfg;
}

}  // namespace specula::cli
