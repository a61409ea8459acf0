// `specula bench decode` on a model file: for each host path (the int8 path and the f32 reference,
// in one run) load time and memory, decode speed and its fraction of the read roofline at three
// contexts, the cost of a forward over n = 1..16 tokens against one, prefill, batched decode of
// 1/4/16 sequences; then the two paths' agreement on the prompt set (top-1, perplexity).
#include "tools/specula/bench_decode.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "gpu/host/bandwidth.h"
#include "gpu/host/host_device.h"
#include "spec/generate.h"
#include "spec/sampling.h"
#include "tools/specula/common.h"
#include "tools/specula/engine_cli.h"

namespace specula::cli {

namespace {

using Clock = BenchClock;

// Untimed decode steps between a prefill and the timed ones.
constexpr int64_t kDecodeSettleTokens = 16;

// Resident memory of this process, from /proc/self/statm (0 where there is none).
double resident_mb() {
  std::ifstream f("/proc/self/statm");
  long long pages = 0, resident = 0;
  if (!(f >> pages >> resident)) return 0;
  return static_cast<double>(resident) * 4096 / 1e6;
}

// A deterministic prompt of n tokens: English text from the tokenizer, repeated.
std::vector<int32_t> text_tokens(const Tokenizer& tok, int64_t n) {
  const std::vector<int32_t> base = tok.encode(
      "The history of computing is a story of people building machines that remember, calculate and "
      "communicate. Early mechanical calculators gave way to electronic computers, and those to the "
      "small, fast processors that now sit in every pocket. ");
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < n) out.insert(out.end(), base.begin(), base.end());
  out.resize(static_cast<size_t>(n));
  return out;
}

struct Options {
  std::vector<int64_t> contexts;
  int64_t decode_tokens = 64;
  int repeat = 3;
  int max_verify = 16;
  std::vector<int> batches{1, 4, 16};
};

// One path: its own device, model and caches, so its load time and memory are its own.
class PathBench {
 public:
  PathBench(const LoadedModel& files, const DeviceOptions& dev, int64_t max_ctx, int64_t ubatch) {
    const double rss0 = resident_mb();
    const auto t0 = Clock::now();
    ops_ = make_device(dev);
    model_ = std::make_unique<LlamaModel>(files.weights, *ops_);
    model_->set_max_forward_rows(ubatch);
    load_seconds_ = seconds_since(t0);
    kv_ = std::make_unique<KvCache>(*ops_, model_->kv_config(max_ctx + 32));
    rss_added_mb_ = resident_mb() - rss0;
    host_ = dynamic_cast<HostOps*>(ops_.get());
  }
  LlamaModel& model() { return *model_; }
  KvCache& kv() { return *kv_; }
  Ops& ops() { return *ops_; }

  nlohmann::json run(const Tokenizer& tok, const Options& o) {
    nlohmann::json j;
    j["device"] = ops_->name();
    j["load_seconds"] = load_seconds_;
    j["resident_mb_added_by_load"] = rss_added_mb_;
    j["repacked_weight_mb"] = host_ ? host_->packed_bytes() / 1e6 : 0.0;
    const LlamaConfig& cfg = model_->config();
    const double weight_bytes = static_cast<double>(model_->weight_bytes_per_token());
    j["weight_bytes_per_token"] = weight_bytes;
    j["kv_element_bytes"] = kv_->element_bytes();
    const KvCacheConfig& kc = kv_->config();
    j["kv_cache"] = std::string(kc.bf16 ? "bf16 pairs" : kc.k_transposed ? "fp16, K transposed" : kc.f16 ? "fp16" : "f32") +
                    (kc.head_major ? ", head-major" : "");
    const int seq = kv_->create_sequence();
    std::vector<float> logits;

    // Decode at each context: prefill the context (timed: prefill tok/s at that length), then
    // greedy decode, timed after kDecodeSettleTokens untimed steps; each run held to the read
    // bandwidth measured right after it. On a host whose L3 holds the weights the first steps
    // after a prefill take up to ~1.8x a settled one, recovering over ~10-15 steps (docs/kernels.md,
    // "What a forward costs depends on the forward before it").
    nlohmann::json contexts = nlohmann::json::array();
    for (int64_t ctx : o.contexts) {
      const std::vector<int32_t> prompt = text_tokens(tok, ctx);
      std::vector<double> prefill, decode, fraction, bandwidth;
      const double kv_bytes = (ctx + kDecodeSettleTokens + o.decode_tokens / 2.0) * cfg.layers * 2.0 * cfg.kv_heads * cfg.head_dim *
                              static_cast<double>(kv_->element_bytes());
      for (int r = 0; r < o.repeat + 1; ++r) {  // run 0 warms caches and page-ins, not counted
        kv_->truncate_to(seq, 0);
        auto t0 = Clock::now();
        ForwardSeq fs{seq, prompt, false};
        model_->forward({&fs, 1}, *kv_, logits);
        const double tp = seconds_since(t0);
        int32_t t = argmax(logits);
        const auto step = [&] {
          ForwardSeq fs{seq, {&t, 1}, false};
          model_->forward({&fs, 1}, *kv_, logits);
          t = argmax(logits);
        };
        for (int64_t i = 0; i < kDecodeSettleTokens; ++i) step();
        t0 = Clock::now();
        for (int64_t i = 0; i < o.decode_tokens; ++i) step();
        const double td = seconds_since(t0);
        if (r == 0) continue;
        prefill.push_back(ctx / tp);
        decode.push_back(o.decode_tokens / td);
        if (host_) {
          bandwidth.push_back(measure_read_bandwidth_gbs(host_->pool()));
          fraction.push_back(decode.back() * (weight_bytes + kv_bytes) / (bandwidth.back() * 1e9));
        }
      }
      contexts.push_back({{"context", ctx},
                          {"prefill_tokens_per_second", median_of(prefill)},
                          {"decode_tokens_per_second", median_of(decode)},
                          {"decode_runs_tokens_per_second", decode},
                          {"kv_bytes_per_token", kv_bytes},
                          {"read_bandwidth_runs_gb_per_s", bandwidth},
                          {"roofline_fraction", median_of(fraction)},
                          {"roofline_fraction_runs", fraction}});
    }
    j["contexts"] = contexts;

    // A forward over n tokens at a context, relative to one token. The row counts take turns
    // (every n once per pass, passes repeated) and each is timed over a burst of back-to-back
    // forwards after settling (below), as rounds run: so drift in the machine's speed and the
    // wake-up of an idle pool weigh on every n alike (timing n = 1 first and alone made its
    // forward ~1.4x a decode step).
    nlohmann::json verify = nlohmann::json::object();
    for (int64_t ctx : {o.contexts.front(), std::min<int64_t>(2048, o.contexts.back())}) {
      const std::vector<int32_t> prompt = text_tokens(tok, ctx + o.max_verify);
      kv_->truncate_to(seq, 0);
      ForwardSeq pre{seq, {prompt.data(), static_cast<size_t>(ctx)}, false};
      model_->forward({&pre, 1}, *kv_, logits);
      constexpr int kBurst = 4;
      std::vector<std::vector<double>> times(static_cast<size_t>(o.max_verify) + 1);
      const auto forward = [&](int n) {
        kv_->truncate_to(seq, ctx);
        ForwardSeq fs{seq, {prompt.data() + ctx, static_cast<size_t>(n)}, true};
        const auto t0 = Clock::now();
        model_->forward({&fs, 1}, *kv_, logits);
        return seconds_since(t0);
      };
      const auto burst = [&](int n) {
        // Settle first: untimed forwards of the same n, at least kSettleForwards of them and
        // kSettleSeconds in all. A forward's time depends on what ran just before it: on a host
        // whose L3 holds the weights, the first one-token forwards after a 16-token one take up to
        // 1.45x a settled one, recovering over ~10 forwards (docs/kernels.md, "What a forward
        // costs depends on the forward before it"), so an unsettled burst times the row count
        // before it as much as its own.
        constexpr int kSettleForwards = 4;
        constexpr double kSettleSeconds = 0.1;
        double settled = 0;
        for (int f = 0; f < kSettleForwards || settled < kSettleSeconds; ++f) settled += forward(n);
        double total = 0;
        for (int b = 0; b < kBurst; ++b) total += forward(n);
        return total / kBurst;
      };
      // Each n > 1 is timed right after a burst of one token, and its cost is the median over the
      // passes of the pair's ratio: the host's speed drifts over the seconds a pass takes.
      std::vector<std::vector<double>> ratios(static_cast<size_t>(o.max_verify) + 1);
      for (int r = 0; r < std::max(5, o.repeat * 3); ++r) {
        if (o.max_verify == 1) times[1].push_back(burst(1));
        for (int n = 2; n <= o.max_verify; ++n) {
          const double one = burst(1), t = burst(n);
          times[1].push_back(one);
          times[static_cast<size_t>(n)].push_back(t);
          ratios[static_cast<size_t>(n)].push_back(t / one);
        }
      }
      nlohmann::json rows = nlohmann::json::array();
      for (int n = 1; n <= o.max_verify; ++n) {
        const double t = median_of(times[static_cast<size_t>(n)]);
        rows.push_back({{"tokens", n}, {"seconds", t}, {"cost_vs_one_token", n == 1 ? 1.0 : median_of(ratios[static_cast<size_t>(n)])}});
      }
      verify[std::to_string(ctx)] = rows;
    }
    j["forward_cost_vs_one_token_at_context"] = verify;

    // Sequences decoding together: each at 128 positions, one token each per batched forward.
    nlohmann::json batches = nlohmann::json::array();
    for (int b : o.batches) {
      KvCache kv(*ops_, model_->kv_config(b * (128 + kDecodeSettleTokens + o.decode_tokens + 16)));
      std::vector<int> seqs;
      std::vector<int32_t> next(static_cast<size_t>(b));
      const std::vector<int32_t> prompt = text_tokens(tok, 128);
      for (int i = 0; i < b; ++i) {
        seqs.push_back(kv.create_sequence());
        ForwardSeq fs{seqs.back(), prompt, false};
        model_->forward({&fs, 1}, kv, logits);
        next[static_cast<size_t>(i)] = argmax(logits);
      }
      const int64_t steps = std::max<int64_t>(8, o.decode_tokens / 2);
      const auto step = [&] {
        std::vector<ForwardSeq> batch;
        for (int i = 0; i < b; ++i) batch.push_back(ForwardSeq{seqs[static_cast<size_t>(i)], {&next[static_cast<size_t>(i)], 1}, false});
        model_->forward(batch, kv, logits);
        for (int i = 0; i < b; ++i)
          next[static_cast<size_t>(i)] = argmax({logits.data() + static_cast<size_t>(i) * cfg.vocab_size, static_cast<size_t>(cfg.vocab_size)});
      };
      for (int64_t s = 0; s < kDecodeSettleTokens; ++s) step();  // after the prefills, as decode above
      const auto t0 = Clock::now();
      for (int64_t s = 0; s < steps; ++s) step();
      const double t = seconds_since(t0);
      batches.push_back({{"sequences", b}, {"tokens_per_second_total", b * steps / t}});
    }
    j["batched_decode"] = batches;
    kv_->free_sequence(seq);
    return j;
  }

 private:
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> kv_;
  HostOps* host_ = nullptr;
  double load_seconds_ = 0, rss_added_mb_ = 0;
};

// A row's log-softmax normaliser, kept as its maximum and the log of the shifted sum, so that
// every log-probability of the row is v - max - log_sum.
struct LogSoftmax {
  double max = -INFINITY, log_sum = 0;
  explicit LogSoftmax(std::span<const float> row) {
    for (float v : row) max = std::max(max, static_cast<double>(v));
    double sum = 0;
    for (float v : row) sum += std::exp(static_cast<double>(v) - max);
    log_sum = std::log(sum);
  }
  double operator()(float v) const { return static_cast<double>(v) - max - log_sum; }
};

// KL(p_ref || p_fast) of the two rows' softmaxes, in nats (what llama.cpp's perplexity tool reports
// with --kl-divergence): a continuous measure of how far the fast path moves the whole
// distribution, where the top-1 count only sees the near-ties that flip.
double kl_divergence(std::span<const float> ref, const LogSoftmax& lref, std::span<const float> fast, const LogSoftmax& lfast) {
  double kl = 0;
  for (size_t v = 0; v < ref.size(); ++v) {
    const double lr = lref(ref[v]);
    kl += std::exp(lr) * (lr - lfast(fast[v]));
  }
  return std::max(kl, 0.0);
}

// Teacher-forced agreement of two paths on the prompt set: each prompt plus the reference path's
// greedy continuation, every position scored by both.
// With `out_path`, one JSON line per prompt: the scored tokens and, per position, both paths'
// top-1 and the reference's logit gap between its top two (to score another engine against the
// same reference on the same positions: tools/compare/llama_cpp_agreement.py).
nlohmann::json agreement(PathBench& fast, PathBench& ref, const LoadedModel& files, const std::string& prompts_path,
                         int64_t continuation, const std::string& out_path) {
  const std::vector<BenchPrompt> prompts = read_prompts(prompts_path, files, 0, 0);
  std::ofstream out;
  if (!out_path.empty()) {
    out.open(out_path);
    if (!out) throw std::runtime_error("bench decode: cannot write --agreement-out " + out_path);
  }
  const int64_t vocab = files.weights.config.vocab_size;
  int64_t positions = 0, same_top1 = 0;
  double nll_fast = 0, nll_ref = 0, kl_sum = 0, kl_max = 0;
  // Where the paths disagree, how far apart the reference puts the two choices (its logit of its
  // own top-1 minus its logit of the fast path's): near-ties that any rounding moves, or not.
  const double margins[] = {0.01, 0.03, 0.1, 0.3};
  int64_t within[4] = {0, 0, 0, 0}, clear_positions = 0, clear_same = 0;
  // Every prompt opens with the chat template's same tokens, so a position there is the same
  // context in every prompt and one flip counts once per prompt: also count each distinct
  // context (the tokens up to the position) once.
  std::set<std::vector<int32_t>> contexts_seen;
  int64_t distinct_positions = 0, distinct_same = 0;
  for (const BenchPrompt& p : prompts) {
    std::vector<int32_t> text = p.tokens;
    GenerateRequest greedy;
    greedy.prompt = p.tokens;
    greedy.max_tokens = static_cast<int>(continuation);
    greedy.sampling = SamplingParams{0.0f, 0, 1.0f, 0};
    const int sr = ref.kv().create_sequence();
    generate(ref.model(), ref.kv(), sr, greedy, [&](int32_t t) {
      text.push_back(t);
      return true;
    });
    ref.kv().free_sequence(sr);
    std::vector<float> lf, lr;
    for (PathBench* b : {&fast, &ref}) {
      const int s = b->kv().create_sequence();
      ForwardSeq all{s, text, true};
      b->model().forward({&all, 1}, b->kv(), b == &fast ? lf : lr);
      b->kv().free_sequence(s);
    }
    nlohmann::json line = {{"tokens", text}, {"fast_top1", nlohmann::json::array()}, {"reference_top1", nlohmann::json::array()},
                           {"reference_top2_gap", nlohmann::json::array()}, {"kl_divergence", nlohmann::json::array()}};
    for (size_t i = 0; i + 1 < text.size(); ++i) {
      const std::span<const float> rf(lf.data() + i * vocab, static_cast<size_t>(vocab)), rr(lr.data() + i * vocab, static_cast<size_t>(vocab));
      const int32_t tf = argmax(rf), tr = argmax(rr);
      same_top1 += tf == tr;
      if (contexts_seen.emplace(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(i + 1)).second) {
        ++distinct_positions;
        distinct_same += tf == tr;
      }
      // The reference's gap between its best and second-best logits.
      float second = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v)
        if (v != tr) second = std::max(second, rr[static_cast<size_t>(v)]);
      if (out.is_open()) {
        line["fast_top1"].push_back(tf);
        line["reference_top1"].push_back(tr);
        line["reference_top2_gap"].push_back(rr[static_cast<size_t>(tr)] - second);
      }
      if (rr[static_cast<size_t>(tr)] - second >= 0.1f) {
        ++clear_positions;
        clear_same += tf == tr;
      }
      if (tf != tr)
        for (int k = 0; k < 4; ++k) within[k] += rr[static_cast<size_t>(tr)] - rr[static_cast<size_t>(tf)] < margins[k];
      const LogSoftmax log_fast(rf), log_ref(rr);
      const double kl = kl_divergence(rr, log_ref, rf, log_fast);
      kl_sum += kl;
      if (out.is_open()) line["kl_divergence"].push_back(kl);
      kl_max = std::max(kl_max, kl);
      nll_fast -= log_fast(rf[static_cast<size_t>(text[i + 1])]);
      nll_ref -= log_ref(rr[static_cast<size_t>(text[i + 1])]);
      ++positions;
    }
    if (out.is_open()) out << line.dump() << "\n";
  }
  const double ppl_fast = std::exp(nll_fast / positions), ppl_ref = std::exp(nll_ref / positions);
  return {{"prompts", prompts.size()},
          {"positions", positions},
          {"top1_agreement", static_cast<double>(same_top1) / positions},
          {"top1_disagreements", positions - same_top1},
          {"distinct_contexts", distinct_positions},
          {"top1_agreement_over_distinct_contexts", static_cast<double>(distinct_same) / distinct_positions},
          {"top1_disagreements_over_distinct_contexts", distinct_positions - distinct_same},
          {"disagreements_within_reference_logit_gap", {{"0.01", within[0]}, {"0.03", within[1]}, {"0.1", within[2]}, {"0.3", within[3]}}},
          {"top1_agreement_where_reference_top2_gap_at_least_0.1", clear_positions ? static_cast<double>(clear_same) / clear_positions : 1.0},
          {"positions_where_reference_top2_gap_at_least_0.1", clear_positions},
          {"kl_divergence_mean", kl_sum / positions},
          {"kl_divergence_max", kl_max},
          {"perplexity_fast", ppl_fast},
          {"perplexity_reference", ppl_ref},
          {"perplexity_ratio", ppl_fast / ppl_ref}};
}

}  // namespace

int bench_decode(const Args& a) {
  Options o;
  o.decode_tokens = a.integer("decode-tokens", 64);
  o.repeat = static_cast<int>(a.integer("repeat", 3));
  o.max_verify = static_cast<int>(a.integer("max-verify", 16));
  for (int c : a.has("contexts") ? a.int_list("contexts") : std::vector<int>{128, 1024, 4096}) {
    if (c < 1) throw UsageError("--contexts: each context must be >= 1");
    o.contexts.push_back(c);
  }
  if (o.decode_tokens < 2 || o.repeat < 1 || o.max_verify < 1 || o.contexts.empty())
    throw UsageError("--decode-tokens >= 2, --repeat >= 1, --max-verify >= 1 and at least one context");
  std::sort(o.contexts.begin(), o.contexts.end());
  const std::vector<std::string> paths = split(a.str("paths", "fast,reference"), ',');
  if (paths.empty()) throw UsageError("--paths: 'fast' and/or 'reference'");
  if (!a.str("agreement-out", "").empty() && (paths.size() != 2 || a.str("agreement", "on") != "on"))
    throw UsageError("--agreement-out needs the agreement: --paths fast,reference and --agreement on");
  if (const std::string f = a.str("agreement-out", ""); !f.empty() && !std::ofstream(f))  // before minutes of benchmarks
    throw std::runtime_error("bench decode: cannot write --agreement-out " + f);
  const std::string device = a.str("device", "auto");
  LoadedModel files = load_model(a.str("model", default_model_path()));

  nlohmann::json out;
  out["bench"] = "decode";
  out["model"] = files.path;
  out["threads"] = a.integer("threads", 2);
  out["contexts"] = o.contexts;
  const int64_t ubatch = ubatch_from_args(a);
  out["ubatch_size"] = ubatch;
  std::vector<std::unique_ptr<PathBench>> benches;
  nlohmann::json results = nlohmann::json::array();
  for (const std::string& p : paths) {
    if (p != "fast" && p != "reference") throw UsageError("--paths: 'fast' and/or 'reference', got '" + p + "'");
    DeviceOptions dev;
    dev.device = device;
    dev.threads = static_cast<int>(a.integer("threads", 2));
    dev.host_path = p == "reference" ? "reference" : "";
    const int64_t ctx_max = std::max<int64_t>(o.contexts.back() + o.max_verify, 2048 + o.max_verify) + kDecodeSettleTokens + o.decode_tokens;
    auto b = std::make_unique<PathBench>(files, dev, ctx_max, ubatch);
    nlohmann::json r = b->run(*files.tokenizer, o);
    r["path"] = p;
    results.push_back(r);
    benches.push_back(std::move(b));
  }
  out["paths"] = results;
  if (benches.size() == 2 && a.str("agreement", "on") == "on")
    out["agreement"] = agreement(*benches[0], *benches[1], files, a.str("prompts", "../shared/data/prompts/chat.jsonl"),
                                 a.integer("agreement-tokens", 64), a.str("agreement-out", ""));
  if (results.size() == 2) {
    const auto& f = results[0];
    const auto& r = results[1];
    nlohmann::json ratio;
    for (size_t i = 0; i < o.contexts.size(); ++i)
      ratio["decode_at_" + std::to_string(o.contexts[i])] = f["contexts"][i]["decode_tokens_per_second"].get<double>() /
                                                              r["contexts"][i]["decode_tokens_per_second"].get<double>();
    ratio["prefill_at_" + std::to_string(o.contexts[0])] = f["contexts"][0]["prefill_tokens_per_second"].get<double>() /
                                                            r["contexts"][0]["prefill_tokens_per_second"].get<double>();
    out["fast_over_reference"] = ratio;
  }
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace specula::cli
