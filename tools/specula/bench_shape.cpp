// `specula bench decode --shape`: random BF16 weights at Llama 3.2 shapes, decode tokens/s at
// batch 1, the roofline fraction against the bandwidth measured in the same run, verify cost.
#include "tools/specula/bench_shape.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include <filesystem>

#include "actors/engine.h"
#include "gpu/host/bandwidth.h"
#include "gpu/host/host_device.h"
#include "gpu/host/quant.h"
#include "gpu/kv_cache.h"
#include "gpu/llama.h"
#include "spec/generate.h"
#include "spec/model_drafter.h"
#include "spec/philox.h"
#include "spec/sampling.h"
#include "spec/speculative_generate.h"
#include "tools/specula/common.h"
#include "tools/specula/engine_cli.h"
#ifdef SPECULA_HAVE_CUDA
#include "gpu/cuda/cuda_ops.h"
#endif

namespace specula::cli {

namespace {

using Clock = BenchClock;

// The device's bandwidth ceiling: a device-to-device copy on CUDA (bytes read + written), the
// multi-threaded read bandwidth on the host.
double measure_bandwidth_gbs(Ops& ops) {
#ifdef SPECULA_HAVE_CUDA
  if (auto* cuda = dynamic_cast<CudaOps*>(&ops)) return cuda->measure_copy_bandwidth_gbs();
#endif
  if (auto* host = dynamic_cast<HostOps*>(&ops)) return measure_read_bandwidth_gbs(host->pool());
  return 0;
}

}  // namespace

LlamaConfig shape_config(const std::string& name) {
  LlamaConfig c;
  c.name = name + " (random BF16 weights)";
  c.vocab_size = 128256;
  c.intermediate = 8192;
  c.kv_heads = 8;
  c.max_positions = 131072;
  c.rope_theta = 500000.0f;
  c.rms_eps = 1e-5f;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 32.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_max_position = 8192;
  c.rope_style = RopeStyle::HalfSplit;
  c.tied_embeddings = true;
  c.bos_id = 128000;
  c.eos_ids = {128001, 128008, 128009};
  if (name == "llama-3.2-1b") {
    c.hidden = 2048, c.layers = 16, c.heads = 32, c.head_dim = 64;
  } else if (name == "llama-3.2-3b") {
    c.hidden = 3072, c.layers = 28, c.heads = 24, c.head_dim = 128;
  } else if (name == "tiny-1" || name == "tiny-2") {
    // Small shapes of the same family, for smoke tests of the benchmark without a GPU.
    const bool two = name == "tiny-2";
    c.vocab_size = 4096, c.intermediate = 512, c.kv_heads = 2;
    c.hidden = two ? 256 : 128, c.layers = two ? 4 : 2, c.heads = 4, c.head_dim = two ? 64 : 32;
  } else {
    throw UsageError("--shape must be llama-3.2-1b or llama-3.2-3b (comma-separated for both; tiny-1, tiny-2 "
                     "for smoke tests), got '" + name + "'");
  }
  return c;
}

namespace {

// `n` BF16 values uniform on [-a, a], a = std sqrt(3), from Philox keyed by `seed`.
std::shared_ptr<std::vector<uint16_t>> random_bf16(int64_t n, uint64_t seed, float std) {
  auto out = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(n));
  const float a = std * 1.7320508f;
  for (int64_t i = 0; i < n; i += 4) {
    const PhiloxBlock r = philox4x32({static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32), 0, 0}, seed);
    for (int j = 0; j < 4 && i + j < n; ++j)
      (*out)[static_cast<size_t>(i + j)] = f32_to_bf16(a * (2.0f * (static_cast<float>(r[j]) * 2.3283064e-10f) - 1.0f));
  }
  return out;
}

}  // namespace

ModelWeights random_bf16_weights(const LlamaConfig& c, uint64_t seed, const std::vector<int32_t>* successor) {
  ModelWeights w;
  w.config = c;
  const int64_t H = c.hidden, Q = c.heads * c.head_dim, KV = c.kv_heads * c.head_dim, I = c.intermediate;
  const int64_t V = c.vocab_size;
  // Standard deviation 0.02, as Llama's initialiser; the blocks' matrices share one buffer.
  const auto mats = random_bf16(std::max({I * H, Q * H}), seed, 0.02f);
  auto out_proj = mats;
  std::shared_ptr<std::vector<uint16_t>> embed = mats, head;
  if (successor) {
    if (static_cast<int64_t>(successor->size()) != V) throw std::invalid_argument("successor map of the wrong size");
    out_proj = random_bf16(std::max(H * Q, H * I), seed + 1, 0.02f * 1e-4f);
    embed = random_bf16(V * H, seed + 2, 0.02f);
    head = std::make_shared<std::vector<uint16_t>>(static_cast<size_t>(V * H));
    for (int64_t x = 0; x < V; ++x)
      std::copy_n(embed->begin() + x * H, H, head->begin() + static_cast<int64_t>((*successor)[x]) * H);
  } else {
    embed = random_bf16(V * H, seed + 2, 0.02f);
  }
  auto ones = std::make_shared<std::vector<float>>(static_cast<size_t>(H), 1.0f);
  w.storage = {mats, out_proj, embed, ones};
  if (head) w.storage.push_back(head);
  auto mat = [&](const std::shared_ptr<std::vector<uint16_t>>& buf, const std::string& name, int64_t rows,
                 int64_t cols) {
    TensorView v;
    v.name = name;
    v.dtype = DType::BF16;
    v.shape = {rows, cols};
    v.data = reinterpret_cast<const std::byte*>(buf->data());
    v.nbytes = static_cast<size_t>(rows * cols) * 2;
    return v;
  };
  auto norm = [&](const std::string& name) {
    TensorView v;
    v.name = name;
    v.dtype = DType::F32;
    v.shape = {H};
    v.data = reinterpret_cast<const std::byte*>(ones->data());
    v.nbytes = static_cast<size_t>(H) * sizeof(float);
    return v;
  };
  w.embed = mat(embed, "token_embd", V, H);
  w.output = head ? mat(head, "output", V, H) : w.embed;  // tied, as both Llama 3.2 models, unless a successor map
  w.config.tied_embeddings = !head;
  w.output_norm = norm("output_norm");
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    w.layers.push_back(LayerWeights{norm(p + "attn_norm"), mat(mats, p + "attn_q", Q, H), mat(mats, p + "attn_k", KV, H),
                                    mat(mats, p + "attn_v", KV, H), mat(out_proj, p + "attn_output", H, Q),
                                    norm(p + "ffn_norm"), mat(mats, p + "ffn_gate", I, H), mat(mats, p + "ffn_up", I, H),
                                    mat(out_proj, p + "ffn_down", H, I)});
  }
  return w;
}

namespace {

// Random weights as a loaded model for the engine, with a numbered stand-in vocabulary.
std::shared_ptr<const LoadedModel> as_loaded(ModelWeights w, const std::string& name) {
  auto m = std::make_shared<LoadedModel>();
  m->path = "random " + name;
  m->format = "random bf16";
  m->tokenizer = Tokenizer::numbered(static_cast<int32_t>(w.config.vocab_size));
  m->weights = std::move(w);
  return m;
}

// One greedy request through the engine: its events (GenerateResult) and its decode tokens/s
// (first token to done).
struct EngineRun {
  actors::GenerateResult result;
  double tokens_per_second = 0;
};
EngineRun engine_run(actors::Engine& engine, const GenerateRequest& g, bool speculate, int k) {
  actors::EngineRequest req;
  req.prompt_ids = g.prompt;
  req.max_tokens = g.max_tokens;
  req.sampling = g.sampling;
  req.speculate = speculate;
  req.draft = DraftLengthConfig{.k = k};
  req.stop_ids = std::vector<int32_t>{};  // the numbered vocabulary has no end token; run to max_tokens
  actors::TokenStream stream = engine.start(req);
  EngineRun r;
  std::optional<Clock::time_point> first;
  for (bool done = false; !done;) {
    done = r.result.add(stream.next_blocking());
    if (!first && !r.result.tokens.empty()) first = Clock::now();
  }
  if (!r.result.error.empty()) throw std::runtime_error("engine run: " + r.result.error);
  const double s = first ? seconds_since(*first) : 0;
  if (r.result.tokens.size() > 1 && s > 0) r.tokens_per_second = static_cast<double>(r.result.tokens.size() - 1) / s;
  return r;
}

// The pair through the actor engine, pipelining off and on: plain decode rounds (K = 0) and
// speculative rounds in the same engine, each after a warm-up request; with pipelining, the
// draft runs on its own device instance (its own stream on CUDA). From the engine's trace: the
// busy time of the draft and verify streams and how much of the verify time the draft overlapped.
nlohmann::json bench_spec_pair_engine(const std::string& device, int threads, std::shared_ptr<const LoadedModel> target,
                                      std::shared_ptr<const LoadedModel> draft, const GenerateRequest& g, int spec_k,
                                      const std::vector<int32_t>& want) {
  nlohmann::json out = nlohmann::json::array();
  for (bool pipeline : {false, true}) {
    const std::string trace_path = (std::filesystem::temp_directory_path() /
                                    ("specula-spec-pair-" + std::to_string(::getpid()) + ".json")).string();
    actors::EngineConfig cfg;
    cfg.target_model = target;
    cfg.draft_model = draft;
    cfg.device = device;
    cfg.threads = threads;
    cfg.pipeline = pipeline;
    cfg.pipeline_on_shared_cores = true;  // the comparison is the point, whatever the machine
    cfg.kv_tokens = std::max<int64_t>(1024, 2 * (static_cast<int64_t>(g.prompt.size()) + g.max_tokens + 32));
    cfg.max_batch = 1;
    cfg.trace_path = trace_path;
    EngineRun plain, spec;
    std::string trace;
    {
      actors::Engine engine(cfg);
      GenerateRequest warm = g;
      warm.max_tokens = std::min(16, g.max_tokens);
      engine_run(engine, warm, true, spec_k);
      plain = engine_run(engine, g, false, spec_k);
      spec = engine_run(engine, g, true, spec_k);
      trace = engine.trace_json();
    }
    std::error_code ec;
    std::filesystem::remove(trace_path, ec);
    const StreamOverlap o = stream_overlap(trace);
    out.push_back({{"pipeline", pipeline},
                   {"target_only_tokens_per_second", plain.tokens_per_second},
                   {"speculative_tokens_per_second", spec.tokens_per_second},
                   {"speedup", plain.tokens_per_second > 0 ? spec.tokens_per_second / plain.tokens_per_second : 0},
                   {"acceptance_alpha", spec.result.stats.alpha()},
                   {"tokens_per_round", spec.result.stats.tokens_per_round()},
                   {"draft_stream_busy_seconds", o.draft_busy},
                   {"verify_stream_busy_seconds", o.verify_busy},
                   {"verify_time_overlapped_by_draft", o.overlap()},
                   {"matches_target_only", spec.result.tokens == want && plain.result.tokens == want}});
    std::fprintf(stderr, "  engine, pipelining %s: speedup %.2f, overlap %.2f, matches %d\n", pipeline ? "on" : "off",
                 out.back()["speedup"].get<double>(), o.overlap(), static_cast<int>(spec.result.tokens == want && plain.result.tokens == want));
  }
  return out;
}

// The synthetic pair: the first shape drafts for the second; the target follows a random
// permutation of the vocabulary, the draft the same permutation except on a random fraction
// 1 - a of the tokens (permuted among themselves), so greedy acceptance is about a. For each a:
// target-only greedy decoding vs speculative greedy decoding with K = spec_k, the measured
// acceptance and cost ratio c, and Theorem 3.8's predicted speedup from them.
nlohmann::json bench_spec_pair(Ops& ops, const DeviceOptions& dev, bool with_engine, const LlamaConfig& draft_cfg,
                               const LlamaConfig& target_cfg, const std::vector<double>& acceptances, int spec_k,
                               int64_t n_prompt, int64_t n_decode) {
  const int64_t V = target_cfg.vocab_size;
  std::vector<int32_t> succ(static_cast<size_t>(V));
  std::iota(succ.begin(), succ.end(), 0);
  uint64_t state = 0x5eed;
  auto next = [&]() { return philox4x32({static_cast<uint32_t>(state++), 0, 0, 1}, 42)[0]; };
  for (int64_t i = V - 1; i > 0; --i) std::swap(succ[i], succ[next() % (i + 1)]);  // Fisher-Yates

  const auto target_files = as_loaded(random_bf16_weights(target_cfg, 77, &succ), "target");
  LlamaModel target(target_files->weights, ops);
  const int64_t ctx = std::max<int64_t>(n_prompt + n_decode + spec_k + 16, 256);
  KvCache kv(ops, target.kv_config(ctx));
  const int seq = kv.create_sequence();
  GenerateRequest g;
  for (int64_t i = 0; i < n_prompt; ++i) g.prompt.push_back(static_cast<int32_t>((i * 7919 + 13) % V));
  g.max_tokens = static_cast<int>(n_decode);
  g.sampling = SamplingParams{0.0f, 0, 1.0f, 0};
  std::vector<int32_t> want;
  GenerateStats base;
  for (int r = 0; r < 2; ++r) {  // the first run warms up
    want.clear();
    kv.truncate_to(seq, 0);
    base = generate(target, kv, seq, g, [&](int32_t t) { want.push_back(t); return true; });
  }
  const double target_step = base.decode_seconds / std::max<int64_t>(1, base.generated - 1);

  nlohmann::json runs = nlohmann::json::array();
  for (double a : acceptances) {
    // The draft's map: succ o pi, pi a cycle through a random (1 - a) fraction of the tokens.
    std::vector<int32_t> moved;
    for (int64_t x = 0; x < V; ++x)
      if (static_cast<double>(next()) / 4294967296.0 >= a) moved.push_back(static_cast<int32_t>(x));
    std::vector<int32_t> dsucc = succ;
    for (size_t i = 0; i < moved.size(); ++i) dsucc[moved[i]] = succ[moved[(i + 1) % moved.size()]];
    const auto draft_files = as_loaded(random_bf16_weights(draft_cfg, 78, &dsucc), "draft");
    LlamaModel draft(draft_files->weights, ops);
    ModelDrafter drafter(draft, ctx);
    SpeculativeRequest s;
    static_cast<GenerateRequest&>(s) = g;
    s.draft.k = spec_k;
    std::vector<int32_t> got;
    SpeculativeStats st;
    for (int r = 0; r < 2; ++r) {
      got.clear();
      kv.truncate_to(seq, 0);
      st = speculative_generate(target, kv, seq, drafter, s, [&](int32_t t, TokenOrigin) { got.push_back(t); return true; });
    }
    const double alpha = st.alpha();
    const double c = st.drafted > 0 ? (st.draft_seconds / st.drafted) / target_step : 0;
    const double g_ = spec_k;
    const double predicted = alpha < 1 ? (1 - std::pow(alpha, g_ + 1)) / ((1 - alpha) * (g_ * c + 1)) : (g_ + 1) / (g_ * c + 1);
    const double spec_tps = st.speculative_tokens_per_second();
    runs.push_back({{"planned_acceptance", a},
                    {"acceptance_alpha", alpha},
                    {"k", spec_k},
                    {"cost_ratio_c", c},
                    {"verify_cost_vs_one_token", st.rounds > 0 ? (st.verify_seconds / st.rounds) / target_step : 0},
                    {"target_only_tokens_per_second", base.decode_tokens_per_second()},
                    {"speculative_tokens_per_second", spec_tps},
                    {"speedup", base.decode_tokens_per_second() > 0 ? spec_tps / base.decode_tokens_per_second() : 0},
                    {"theorem_3_8_speedup", predicted},
                    {"tokens_per_round", st.tokens_per_round()},
                    {"matches_target_only", got == want}});
    std::fprintf(stderr, "spec pair a=%.2f: alpha %.3f, speedup %.2f (theorem %.2f)\n", a, alpha,
                 runs.back()["speedup"].get<double>(), predicted);
    if (with_engine) runs.back()["engine"] = bench_spec_pair_engine(dev.device, dev.threads, target_files, draft_files, g, spec_k, want);
  }
  return runs;
}

// One shape's decode and verify timings, with the step recordings (CUDA graphs) off or on.
struct ShapeTimes {
  std::vector<double> prefill_tps, decode_tps;
  nlohmann::json verify = nlohmann::json::array();
};

ShapeTimes time_shape(LlamaModel& model, KvCache& kv, int seq, const std::vector<int32_t>& prompt, int64_t n_decode,
                      int repeat, int max_verify, bool graphs) {
  const auto n_prompt = static_cast<int64_t>(prompt.size());
  std::vector<float> logits;
  model.set_recorded_steps(graphs);
  ShapeTimes out;
  for (int r = 0; r < repeat + 1; ++r) {  // run 0 warms up (scratch growth, cuBLAS, caches, recordings)
    kv.truncate_to(seq, 0);
    auto t0 = Clock::now();
    ForwardSeq fs{seq, prompt, false};
    model.forward({&fs, 1}, kv, logits);  // forward copies the logits to the host: synchronous
    const double tp = seconds_since(t0);
    int32_t tok = argmax(logits);
    t0 = Clock::now();
    for (int64_t i = 0; i < n_decode; ++i) {
      ForwardSeq step{seq, {&tok, 1}, false};
      model.forward({&step, 1}, kv, logits);
      tok = argmax(logits);
    }
    const double td = seconds_since(t0);
    if (r == 0) continue;
    out.prefill_tps.push_back(n_prompt / tp);
    out.decode_tps.push_back(n_decode / td);
  }
  double t_one = 0;
  for (int n = 1; n <= max_verify; ++n) {
    std::vector<double> times;
    const std::vector<int32_t> toks(prompt.begin(), prompt.begin() + std::min<int64_t>(n, n_prompt));
    std::vector<int32_t> chunk = toks;
    chunk.resize(n, prompt[0]);
    for (int r = 0; r < std::max(7, repeat * 3); ++r) {
      kv.truncate_to(seq, n_prompt);
      ForwardSeq fs{seq, chunk, true};
      const auto t0 = Clock::now();
      model.forward({&fs, 1}, kv, logits);
      times.push_back(seconds_since(t0));
    }
    const double t = median_of(times);
    if (n == 1) t_one = t;
    out.verify.push_back({{"tokens", n}, {"seconds", t}, {"cost_vs_one_token", t / t_one}});
  }
  return out;
}

// On CUDA the skinny matmul's two versions are timed (rows per warp 1, then 4; 0 = the default).
void set_skinny_rows(Ops& ops, int rows_per_warp) {
#ifdef SPECULA_HAVE_CUDA
  if (ops.kind() == DeviceKind::Cuda) static_cast<CudaOps&>(ops).set_skinny_rows_per_warp(rows_per_warp);
#endif
  (void)ops;
  (void)rows_per_warp;
}

// One shape's JSON: decode against the read roofline (weights plus the average K/V), verify cost,
// and the variants measured beside the launched steps.
nlohmann::json shape_json(const std::string& name, const LlamaConfig& cfg, const LlamaModel& model, double upload_s,
                          int64_t n_prompt, int64_t n_decode, double bandwidth_gbs, const ShapeTimes& launched,
                          const std::optional<ShapeTimes>& recorded, const std::optional<ShapeTimes>& v2) {
  const double avg_ctx = n_prompt + n_decode / 2.0;
  const double kv_bytes = avg_ctx * cfg.layers * 2.0 * cfg.kv_heads * cfg.head_dim * sizeof(float);
  const double weight_bytes = static_cast<double>(model.weight_bytes_per_token());
  const double bytes = weight_bytes + kv_bytes;
  const double roofline_tps = bandwidth_gbs > 0 ? bandwidth_gbs * 1e9 / bytes : 0;
  const double decode = median_of(launched.decode_tps);

  nlohmann::json j;
  j["shape"] = name;
  j["layers"] = cfg.layers;
  j["hidden"] = cfg.hidden;
  j["upload_seconds"] = upload_s;
  j["prompt_tokens"] = n_prompt;
  j["decode_tokens"] = n_decode;
  j["prefill_tokens_per_second"] = median_of(launched.prefill_tps);
  j["decode_tokens_per_second"] = decode;
  j["decode_runs_tokens_per_second"] = launched.decode_tps;
  j["decode_step_seconds"] = decode > 0 ? 1.0 / decode : 0;
  j["weight_bytes_per_token"] = weight_bytes;
  j["kv_bytes_per_token"] = kv_bytes;
  j["roofline_tokens_per_second"] = roofline_tps;
  j["roofline_fraction"] = roofline_tps > 0 ? decode / roofline_tps : 0;
  j["achieved_gb_per_s"] = decode * bytes / 1e9;
  j["verify_cost"] = launched.verify;
  if (v2) {
    const double d = median_of(v2->decode_tps);
    j["skinny_v2"] = {{"decode_tokens_per_second", d},
                      {"roofline_fraction", roofline_tps > 0 ? d / roofline_tps : 0},
                      {"decode_speedup_vs_v1", decode > 0 ? d / decode : 0},
                      {"verify_cost", v2->verify}};
  }
  if (recorded) {
    const double d = median_of(recorded->decode_tps);
    j["cuda_graphs"] = {{"decode_tokens_per_second", d},
                        {"decode_runs_tokens_per_second", recorded->decode_tps},
                        {"roofline_fraction", roofline_tps > 0 ? d / roofline_tps : 0},
                        {"decode_speedup_vs_launched", decode > 0 ? d / decode : 0},
                        {"verify_cost", recorded->verify}};
  }
  std::fprintf(stderr, "%s: %.1f tokens/s, %.0f%% of the roofline\n", name.c_str(), decode,
               roofline_tps > 0 ? 100 * decode / roofline_tps : 0.0);
  return j;
}

}  // namespace

int bench_decode_shape(const Args& a) {
  const int64_t n_prompt = a.integer("prompt-tokens", 128), n_decode = a.integer("decode-tokens", 128);
  const int repeat = static_cast<int>(a.integer("repeat", 3));
  const int max_verify = static_cast<int>(a.integer("max-verify", 9));
  if (n_prompt < 1 || n_decode < 2 || repeat < 1 || max_verify < 1)
    throw UsageError("--prompt-tokens >= 1, --decode-tokens >= 2, --repeat >= 1 and --max-verify >= 1");
  const std::vector<std::string> names = split(a.str("shape"), ',');
  std::vector<LlamaConfig> configs;
  for (const std::string& n : names) configs.push_back(shape_config(n));  // usage errors first

  DeviceOptions dev;
  dev.device = a.str("device", "auto");
  dev.threads = static_cast<int>(a.integer("threads", 2));
  std::unique_ptr<Ops> ops = make_device(dev);
  const double bandwidth_gbs = measure_bandwidth_gbs(*ops);
  // Step recordings (CUDA graphs): measured beside the launched steps on a device that records.
  const std::string graphs_opt = a.str("cuda-graphs", ops->can_record() ? "both" : "off");
  if (graphs_opt != "both" && graphs_opt != "off") throw UsageError("--cuda-graphs must be both or off, got '" + graphs_opt + "'");
  const bool graphs_too = graphs_opt == "both" && ops->can_record();

  nlohmann::json shapes = nlohmann::json::array();
  std::vector<double> step_seconds;
  for (size_t si = 0; si < configs.size(); ++si) {
    const LlamaConfig& cfg = configs[si];
    const ModelWeights weights = random_bf16_weights(cfg, 1234 + si);
    auto t_load = Clock::now();
    LlamaModel model(weights, *ops);
    ops->synchronize();
    const double upload_s = seconds_since(t_load);
    KvCache kv(*ops, model.kv_config(std::max<int64_t>(n_prompt + n_decode + max_verify, 256)));
    const int seq = kv.create_sequence();
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < n_prompt; ++i) prompt.push_back(static_cast<int32_t>((i * 7919 + 13) % cfg.vocab_size));
    set_skinny_rows(*ops, 1);
    const ShapeTimes launched = time_shape(model, kv, seq, prompt, n_decode, repeat, max_verify, false);
    std::optional<ShapeTimes> recorded, v2;
    if (graphs_too) recorded = time_shape(model, kv, seq, prompt, n_decode, repeat, max_verify, true);
    if (ops->kind() == DeviceKind::Cuda) {
      set_skinny_rows(*ops, 4);
      v2 = time_shape(model, kv, seq, prompt, n_decode, repeat, max_verify, false);
    }
    set_skinny_rows(*ops, 0);
    model.set_recorded_steps(false);
    shapes.push_back(shape_json(names[si], cfg, model, upload_s, n_prompt, n_decode, bandwidth_gbs, launched, recorded, v2));
    step_seconds.push_back(shapes.back()["decode_step_seconds"].get<double>());
  }

  nlohmann::json out;
  out["bench"] = "decode_shape";
  out["device"] = ops->name();
  out["bandwidth_gb_per_s"] = bandwidth_gbs;
  out["bandwidth_method"] = ops->kind() == DeviceKind::Cuda ? "cudaMemcpy device-to-device, (read + write) / time"
                                                            : "multi-threaded read";
  out["shapes"] = shapes;
  if (a.has("spec-pair")) {
    if (configs.size() != 2) throw UsageError("--spec-pair needs --shape DRAFT,TARGET (llama-3.2-1b,llama-3.2-3b)");
    std::vector<double> acc;
    for (const std::string& x : split(a.str("spec-pair"), ',')) acc.push_back(std::stod(x));
    out["spec_pair"] = bench_spec_pair(*ops, dev, a.str("spec-pair-engine", "on") != "off", configs[0], configs[1], acc,
                                       static_cast<int>(a.integer("spec-k", 4)), std::min<int64_t>(n_prompt, 32), n_decode);
  }
  // c of Theorem 3.8 when a draft shape is followed by its target: draft step / target step.
  if (step_seconds.size() == 2 && step_seconds[1] > 0) out["draft_target_cost_ratio"] = step_seconds[0] / step_seconds[1];
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace specula::cli
