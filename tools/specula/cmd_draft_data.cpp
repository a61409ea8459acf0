// `specula draft-data`: self-distillation data for the trained draft head (issue 13,
// docs/draft.md). The Magpie recipe, batched: each slot of the batch samples a user prompt from
// the target right after the user-turn header of its chat template, closes the turn, samples the
// target's answer, and every token fed on the way leaves its final hidden state (after the final
// norm, on the serving path) and the target's top-k next-token probabilities in a record of the
// `.spd` file that tools/draft/ trains on. Up to --batch sequences decode together in one forward,
// each at its own phase; a row's numbers do not depend on its batch (the int8 path's row property).
// With --prompts, the user turns come from a file of chat prompts (tools/draft/prompts.py writes
// one) instead of being sampled: the answers are still the target's own.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/host/quant.h"
#include "spec/generate.h"
#include "tools/specula/common.h"
#include "tools/specula/commands.h"
#include "tools/specula/draft_data.h"
#include "tools/specula/engine_cli.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula draft-data [--model PATH] --out FILE.spd --samples N [--seed S] [--batch B (16)]\n"
    "                          [--prompt-tokens N (96)] [--response-tokens N (384)] [--prompt-temperature T (1.0)]\n"
    "                          [--response-temperatures LIST (0,0.8)] [--topk K (8)] [--keep-unfinished-prompts]\n"
    "                          [--prompts FILE.jsonl | --user-prefixes FILE.txt] [--feature-layers L1,L2,...]\n"
    "                          [--log FILE] [--device D] [--threads N]\n"
    "       specula draft-data [--model PATH] --from IN.spd --out FILE.spd --feature-layers L1,L2,... [--batch B]\n"
    "  Appends N sequences written by the target itself (Magpie: a user prompt sampled after the\n"
    "  chat template's user-turn header, then the answer, at the response temperatures in turn;\n"
    "  0 = greedy) to FILE in the draft data format of docs/draft.md: tokens, the final hidden state\n"
    "  of every position and the top-K next-token probabilities (softmax at temperature 1). A new\n"
    "  file gets a header; an existing one must have the same hidden width, K and vocabulary.\n"
    "  Prompts that do not end their turn within --prompt-tokens are dropped (kept with\n"
    "  --keep-unfinished-prompts), and so are empty and repeated ones. Sample i uses the seed\n"
    "  S * 1000003 + i, so a run is reproducible.\n"
    "  --prompts FILE.jsonl: sample i answers line i of FILE (JSON lines with \"messages\", as\n"
    "  `bench spec` reads) instead of a sampled prompt; N is at most the file's line count. The\n"
    "  benchmark's prompt set is refused: the draft is never trained on it.\n"
    "  --user-prefixes FILE.txt: sample i's user turn starts with line i mod n of FILE (e.g. \"Why\",\n"
    "  \"Write a\"), and the target samples the rest of it: Magpie steered toward kinds of request.\n"
    "  --feature-layers L1,L2,...: each row also holds the residual stream after those decoder\n"
    "  blocks (0-based), RMS-normalised (EAGLE-3's low and middle features; data format version 2).\n"
    "  --from IN.spd: no sampling; re-feeds every record of IN (same tokens, prompt length and top-k)\n"
    "  and writes it with the features of --feature-layers. Rows whose final hidden state differs\n"
    "  from IN's are counted in the log (0 when IN was written by the same build).\n";

constexpr char kSentinel[] = "MAGPIEQUERY";

// The chat template around one user message: the tokens before it (ending with the user-turn
// header, where Magpie samples) and after it (closing the turn, opening the assistant's). The
// rendered text is split at a sentinel message and each side tokenized alone.
void chat_frame(const LoadedModel& m, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  const std::string text = m.chat_template.render({{"user", kSentinel}});
  const size_t at = text.find(kSentinel);
  if (at == std::string::npos) throw std::runtime_error("the chat template dropped the user message");
  prefix = m.tokenizer->encode(text.substr(0, at));
  suffix = m.tokenizer->encode(text.substr(at + std::strlen(kSentinel)));
}

// One sequence being written: its record so far (every token fed, with its hidden row and
// top-k; the tail from pending_from on goes into the next forward) and where it stands.
struct Slot {
  enum class Phase { kFree, kPrompt, kResponse } phase = Phase::kFree;
  int seq = -1;
  uint64_t seed = 0;
  float response_temperature = 0;
  draft_data::Record rec;
  size_t pending_from = 0;  // rec.tokens[pending_from..] go into the next forward
  size_t user_from = 0;     // the generated user message starts here
};

// The K most probable tokens of softmax(logits) (temperature 1), most probable first.
void top_k(std::span<const float> logits, int k, std::vector<int32_t>& ids, std::vector<uint16_t>& probs,
           std::vector<int32_t>& order) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (float v : logits) z += std::exp(static_cast<double>(v) - mx);
  order.resize(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (int j = 0; j < k; ++j) {
    ids.push_back(order[j]);
    probs.push_back(f32_to_fp16(static_cast<float>(std::exp(static_cast<double>(logits[order[j]]) - mx) / z)));
  }
}

// --from: the records of `in_path` again, with the features of the model's feature layers.
int refeature(const Args& a, Session& s, long long batch) {
  const std::string in_path = a.str("from"), out_path = a.str("out");
  std::ifstream in(in_path, std::ios::binary);
  if (!in) throw UsageError("--from " + in_path + ": cannot open");
  const draft_data::Header ih = draft_data::read_header(in, "--from " + in_path);
  const LlamaConfig& cfg = s.model->config();
  if (ih.hidden != static_cast<uint32_t>(cfg.hidden) || ih.vocab != static_cast<uint32_t>(cfg.vocab_size))
    throw UsageError("--from " + in_path + ": hidden " + std::to_string(ih.hidden) + ", vocabulary " + std::to_string(ih.vocab) +
                     " were not written by this target");
  draft_data::Header oh{ih.hidden, ih.topk, ih.vocab, {}};
  for (int l : s.model->feature_layers()) oh.feature_layers.push_back(static_cast<uint32_t>(l));
  if (std::filesystem::exists(out_path) && std::filesystem::file_size(out_path) > 0)
    throw UsageError("--out " + out_path + ": exists; --from writes a new file");
  std::FILE* out = draft_data::open_for_append(out_path, oh);
  std::FILE* log = a.has("log") ? std::fopen(a.str("log").c_str(), "a") : stderr;
  if (log == nullptr) throw UsageError("--log: cannot open " + a.str("log"));
  const int64_t H = cfg.hidden, F = s.model->feature_width(), iw = ih.row_width();
  std::vector<draft_data::Record> recs;
  std::vector<float> rows;
  long long written = 0, tokens = 0, differing = 0;
  const auto t0 = BenchClock::now();
  bool more = true;
  while (more) {
    recs.clear();
    int64_t longest = 0, total = 0;
    while (static_cast<long long>(recs.size()) < batch) {
      draft_data::Record r;
      if (!draft_data::read_record(in, ih, r, "--from " + in_path)) { more = false; break; }
      if (r.tokens.empty()) continue;
      longest = std::max<int64_t>(longest, static_cast<int64_t>(r.tokens.size()));
      total += static_cast<int64_t>(r.tokens.size());
      recs.push_back(std::move(r));
    }
    if (recs.empty()) break;
    const int64_t block = 16;
    KvCache kv(*s.ops, s.model->kv_config((longest + block) * static_cast<int64_t>(recs.size()), block));
    std::vector<ForwardSeq> fwd;
    for (const draft_data::Record& r : recs) {
      ForwardSeq f;
      f.seq = kv.create_sequence();
      f.tokens = r.tokens;
      f.all_hidden = true;
      fwd.push_back(f);
    }
    std::vector<float> logits;
    s.model->forward(fwd, kv, logits);
    s.model->last_hidden_all(rows);
    int64_t row = 0;
    for (draft_data::Record& r : recs) {
      std::vector<uint16_t> feat;
      feat.reserve(r.tokens.size() * static_cast<size_t>(F));
      for (size_t t = 0; t < r.tokens.size(); ++t, ++row) {
        const float* f = rows.data() + row * F;
        bool same = true;
        for (int64_t c = 0; c < F; ++c) {
          const uint16_t v = f32_to_fp16(f[c]);
          if (c < H) same = same && v == r.hidden[t * static_cast<size_t>(iw) + static_cast<size_t>(c)];
          feat.push_back(v);
        }
        differing += !same;
      }
      r.hidden = std::move(feat);
      draft_data::append(out, r);
      ++written;
      tokens += static_cast<long long>(r.tokens.size());
    }
    std::fprintf(log, "[draft-data] %lld sequences, %lld tokens re-fed, %.1f tokens/s; %lld rows whose final hidden state differs from --from's\n",
                 written, tokens, tokens / seconds_since(t0), differing);
    std::fflush(log);
  }
  std::fclose(out);
  if (log != stderr) std::fclose(log);
  return 0;
}

}  // namespace

int cmd_draft_data(int argc, char** argv) {
  std::set<std::string> options = kModelOptions;
  options.insert({kChatTemplateOption, "out", "samples", "seed", "batch", "prompt-tokens", "response-tokens", "prompt-temperature",
                  "response-temperatures", "topk", "log", "prompts", "from", "feature-layers", "user-prefixes"});
  const Args a(argc, argv, options, {"keep-unfinished-prompts"});
  if (a.help()) { std::fputs(kUsage, stdout); return 0; }
  if (a.has("from")) {
    if (!a.has("out") || !a.has("feature-layers")) throw UsageError("--from needs --out and --feature-layers");
    const long long batch = a.integer("batch", 16);
    if (batch < 1 || batch > 256) throw UsageError("--batch must be in 1..256");
    Session s = open_session(a);
    try {
      s.model->set_feature_layers(a.int_list("feature-layers"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--feature-layers: ") + e.what());
    }
    return refeature(a, s, batch);
  }
  if (!a.has("out") || !a.has("samples")) throw UsageError("--out and --samples are required");
  const long long samples = a.integer("samples", 0), batch = a.integer("batch", 16);
  const long long prompt_tokens = a.integer("prompt-tokens", 96), response_tokens = a.integer("response-tokens", 384);
  const long long topk = a.integer("topk", 8);
  const uint64_t seed = static_cast<uint64_t>(a.integer("seed", 0));
  if (samples < 1) throw UsageError("--samples must be >= 1");
  if (batch < 1 || batch > 256) throw UsageError("--batch must be in 1..256");
  if (prompt_tokens < 1 || response_tokens < 1) throw UsageError("--prompt-tokens and --response-tokens must be >= 1");
  SamplingParams prompt_sp;
  prompt_sp.temperature = static_cast<float>(a.number("prompt-temperature", 1.0));
  if (prompt_sp.temperature <= 0) throw UsageError("--prompt-temperature must be > 0 (greedy prompts would all be the same)");
  std::vector<float> temps;
  for (const std::string& t : split(a.str("response-temperatures", "0,0.8"), ',')) {
    char* end = nullptr;
    const float v = std::strtof(t.c_str(), &end);
    if (end == t.c_str() || *end != '\0' || !(v >= 0)) throw UsageError("--response-temperatures: '" + t + "' is not a temperature >= 0");
    temps.push_back(v);
  }
  if (temps.empty()) throw UsageError("--response-temperatures is empty");
  const bool keep_unfinished = a.flag("keep-unfinished-prompts");

  Session s = open_session(a);
  if (a.has("feature-layers")) {
    try {
      s.model->set_feature_layers(a.int_list("feature-layers"));
    } catch (const std::invalid_argument& e) {
      throw UsageError(std::string("--feature-layers: ") + e.what());
    }
  }
  const LlamaConfig& cfg = s.model->config();
  std::vector<BenchPrompt> given;
  if (a.has("prompts")) {
    const std::string path = a.str("prompts");
    std::error_code ec;
    const std::string canon = std::filesystem::weakly_canonical(path, ec).string();
    if (canon.find("/data/prompts/") != std::string::npos)
      throw UsageError("--prompts " + path + ": that is the benchmark's prompt set, which the draft must never be trained on");
    given = read_prompts(path, s.loaded, 0, 0);
    if (given.empty()) throw UsageError("--prompts " + path + ": no prompts");
    if (samples > static_cast<long long>(given.size()))
      throw UsageError("--samples " + std::to_string(samples) + " is more than the " + std::to_string(given.size()) +
                       " prompts of " + path);
  }
  std::vector<std::vector<int32_t>> user_prefixes;
  if (a.has("user-prefixes")) {
    if (!given.empty()) throw UsageError("--user-prefixes and --prompts exclude each other (given prompts are not sampled)");
    const std::string path = a.str("user-prefixes");
    std::ifstream in(path);
    if (!in) throw UsageError("--user-prefixes: cannot open " + path);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) throw UsageError("--user-prefixes " + path + ": line " + std::to_string(n) + " is empty");
      user_prefixes.push_back(s.loaded.tokenizer->encode(line));
      if (static_cast<long long>(user_prefixes.back().size()) >= prompt_tokens)
        throw UsageError("--user-prefixes " + path + ": line " + std::to_string(n) + " is --prompt-tokens long or longer");
    }
    if (user_prefixes.empty()) throw UsageError("--user-prefixes " + path + ": no prefixes");
  }
  if (topk < 0 || topk > cfg.vocab_size) throw UsageError("--topk must be in 0..vocabulary size");
  std::vector<int32_t> prefix, suffix;
  chat_frame(s.loaded, prefix, suffix);
  const std::vector<int32_t> stop = default_stop_ids(s.loaded);
  const auto is_stop = [&](int32_t t) { return std::find(stop.begin(), stop.end(), t) != stop.end(); };
  // A cache that holds every slot at its longest.
  int64_t longest_prompt = static_cast<int64_t>(prefix.size() + suffix.size()) + prompt_tokens;
  for (const BenchPrompt& p : given) longest_prompt = std::max(longest_prompt, static_cast<int64_t>(p.tokens.size()));
  const int64_t longest = longest_prompt + response_tokens + 1;
  if (longest > cfg.max_positions && cfg.max_positions > 0)
    throw UsageError("the longest prompt + --response-tokens exceed the model's context");
  // Blocks are per sequence: each slot rounds up to whole blocks.
  const int64_t block = s.model->kv_config(16).block_tokens;
  KvCache kv(*s.ops, s.model->kv_config((longest + block - 1) / block * block * batch));

  draft_data::Header header{static_cast<uint32_t>(cfg.hidden), static_cast<uint32_t>(topk),
                            static_cast<uint32_t>(cfg.vocab_size), {}};
  for (int l : s.model->feature_layers()) header.feature_layers.push_back(static_cast<uint32_t>(l));
  std::FILE* out = draft_data::open_for_append(a.str("out"), header);
  std::FILE* log = a.has("log") ? std::fopen(a.str("log").c_str(), "a") : stderr;
  if (log == nullptr) throw UsageError("--log: cannot open " + a.str("log"));

  const int64_t H = s.model->feature_width(), V = cfg.vocab_size;
  std::vector<Slot> slots(static_cast<size_t>(batch));
  std::set<std::vector<int32_t>> seen;
  long long next_sample = 0, written = 0, tokens_written = 0, dropped = 0;
  const long long max_tries = given.empty() ? 4 * samples + 16 : samples;
  std::vector<float> logits, hidden;
  std::vector<int32_t> order;
  std::vector<ForwardSeq> fwd;
  std::vector<Slot*> in_batch;
  const auto t0 = BenchClock::now();

  const auto start = [&](Slot& sl) {
    if (sl.seq < 0) sl.seq = kv.create_sequence();
    kv.truncate_to(sl.seq, 0);
    sl.phase = Slot::Phase::kPrompt;
    sl.seed = seed * 1000003 + static_cast<uint64_t>(next_sample);
    sl.response_temperature = temps[static_cast<size_t>(next_sample) % temps.size()];
    ++next_sample;
    sl.rec.tokens = prefix;
    sl.pending_from = 0;
    sl.user_from = prefix.size();
    if (!user_prefixes.empty()) {
      const std::vector<int32_t>& up = user_prefixes[static_cast<size_t>(next_sample - 1) % user_prefixes.size()];
      sl.rec.tokens.insert(sl.rec.tokens.end(), up.begin(), up.end());
    }
    sl.rec.hidden.clear();
    sl.rec.topk_ids.clear();
    sl.rec.topk_probs.clear();
    if (!given.empty()) {  // the prompt is given: straight to the answer
      sl.rec.tokens = given[static_cast<size_t>(next_sample - 1)].tokens;
      sl.rec.n_prompt = static_cast<uint32_t>(sl.rec.tokens.size());
      sl.phase = Slot::Phase::kResponse;
    }
  };
  const auto finish = [&](Slot& sl) {
    // The last sampled token was not fed; the record holds the fed tokens only.
    draft_data::append(out, sl.rec);
    ++written;
    tokens_written += static_cast<long long>(sl.rec.tokens.size());
    std::fprintf(log, "[draft-data] %lld/%lld sequences, %lld tokens, %.1f tokens/s (%lld prompts dropped)\n", written, samples,
                 tokens_written, tokens_written / seconds_since(t0), dropped);
    std::fflush(log);
    sl.phase = Slot::Phase::kFree;
  };

  while (written < samples) {
    // Fill free slots while samples remain to be started (a dropped prompt starts another).
    long long active = 0;
    for (Slot& sl : slots) active += sl.phase != Slot::Phase::kFree;
    for (Slot& sl : slots)
      if (sl.phase == Slot::Phase::kFree && written + active < samples && next_sample < max_tries) {
        start(sl);
        ++active;
      }
    if (active == 0)
      throw std::runtime_error("only " + std::to_string(written) + " usable prompts after " + std::to_string(next_sample) +
                               " tries: the target rarely ends a user turn (--keep-unfinished-prompts keeps them)");
    fwd.clear();
    in_batch.clear();
    for (Slot& sl : slots)
      if (sl.phase != Slot::Phase::kFree) {
        fwd.push_back({sl.seq, {sl.rec.tokens.data() + sl.pending_from, sl.rec.tokens.size() - sl.pending_from}, true});
        in_batch.push_back(&sl);
      }
    s.model->forward(fwd, kv, logits);
    s.model->last_hidden(hidden);
    size_t row = 0;
    for (Slot* slp : in_batch) {
      Slot& sl = *slp;
      const size_t fed = sl.rec.tokens.size() - sl.pending_from;
      for (size_t j = 0; j < fed; ++j, ++row) {
        const float* h = hidden.data() + row * static_cast<size_t>(H);
        for (int64_t c = 0; c < H; ++c) sl.rec.hidden.push_back(f32_to_fp16(h[c]));
        if (topk > 0) top_k({logits.data() + row * static_cast<size_t>(V), static_cast<size_t>(V)}, static_cast<int>(topk), sl.rec.topk_ids, sl.rec.topk_probs, order);
      }
      const std::span<const float> last{logits.data() + (row - 1) * static_cast<size_t>(V), static_cast<size_t>(V)};
      const int64_t position = static_cast<int64_t>(sl.rec.tokens.size());
      sl.pending_from = sl.rec.tokens.size();
      if (sl.phase == Slot::Phase::kPrompt) {
        prompt_sp.seed = sl.seed;
        const int32_t t = sample_token(last, prompt_sp, position);
        const size_t user_len = sl.rec.tokens.size() - sl.user_from;
        const bool ended = is_stop(t);
        if (ended || static_cast<long long>(user_len + 1) > prompt_tokens) {
          std::vector<int32_t> user(sl.rec.tokens.begin() + static_cast<int64_t>(sl.user_from), sl.rec.tokens.end());
          if (!ended && !keep_unfinished) user.clear();
          else if (!ended) user.push_back(t);  // kept unfinished: the last sampled token belongs to it
          if (user.empty() || !seen.insert(user).second) {
            ++dropped;
            sl.phase = Slot::Phase::kFree;
            continue;
          }
          if (!ended) sl.rec.tokens.push_back(t);  // fed with the suffix
          sl.rec.tokens.insert(sl.rec.tokens.end(), suffix.begin(), suffix.end());
          sl.rec.n_prompt = static_cast<uint32_t>(sl.rec.tokens.size());
          sl.phase = Slot::Phase::kResponse;
        } else {
          sl.rec.tokens.push_back(t);
        }
      } else {
        SamplingParams sp;
        sp.temperature = sl.response_temperature;
        if (!sp.greedy()) { sp.top_k = 40; sp.top_p = 0.95f; }  // the CLI's defaults
        sp.seed = sl.seed;
        const int32_t t = sample_token(last, sp, position);
        // A stop token ends the answer unfed (the last row's top-k carries it as a label).
        const long long answered = static_cast<long long>(sl.rec.tokens.size() - sl.rec.n_prompt);
        if (is_stop(t) || answered >= response_tokens) {
          finish(sl);
        } else {
          sl.rec.tokens.push_back(t);
        }
      }
    }
  }
  std::fclose(out);
  std::fprintf(log, "[draft-data] wrote %lld sequences, %lld tokens to %s in %.1f s (%lld prompts dropped)\n", written,
               tokens_written, a.str("out").c_str(), seconds_since(t0), dropped);
  if (log != stderr) std::fclose(log);
  return 0;
}

}  // namespace specula::cli
