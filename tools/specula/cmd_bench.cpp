// `specula bench decode`: prefill and decode speed, the memory-bandwidth roofline of decode,
// and the cost of scoring n tokens in one forward relative to one — as JSON on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "gpu/host/bandwidth.h"
#include "gpu/host/host_device.h"
#include "spec/sampling.h"
#include "tools/specula/common.h"
#include "tools/specula/commands.h"

namespace specula::cli {

namespace {

const char* kUsage =
    "usage: specula bench decode [--model PATH] [--threads N] [--prompt-tokens N] [--decode-tokens N]\n"
    "                            [--repeat R] [--max-verify N] [--device D] [--ctx N]\n"
    "  Prints JSON: prefill and decode tokens/s (median of R runs), bytes read per decode step,\n"
    "  the read bandwidth measured in the same run, the fraction of that roofline decode reaches,\n"
    "  and the time of one forward over n tokens relative to one token (n = 1..max-verify).\n";

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// A deterministic prompt of n tokens: English text from the tokenizer, repeated.
std::vector<int32_t> bench_prompt(const Tokenizer& tok, int64_t n) {
  const std::vector<int32_t> base = tok.encode(
      "The history of computing is a story of people building machines that remember, calculate and "
      "communicate. Early mechanical calculators gave way to electronic computers, and those to the "
      "small, fast processors that now sit in every pocket. ");
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < n) out.insert(out.end(), base.begin(), base.end());
  out.resize(static_cast<size_t>(n));
  return out;
}

int bench_decode(const Args& a) {
  const int64_t n_prompt = a.integer("prompt-tokens", 128), n_decode = a.integer("decode-tokens", 128);
  const int repeat = static_cast<int>(a.integer("repeat", 3));
  const int max_verify = static_cast<int>(a.integer("max-verify", 9));
  if (n_prompt < 1 || n_decode < 2 || repeat < 1 || max_verify < 1)
    throw UsageError("--prompt-tokens >= 1, --decode-tokens >= 2, --repeat >= 1 and --max-verify >= 1");
  Session s = open_session(a);
  const LlamaConfig& cfg = s.model->config();
  const std::vector<int32_t> prompt = bench_prompt(*s.loaded.tokenizer, n_prompt);
  std::vector<float> logits;
  const int seq = s.kv->create_sequence();

  // Prefill and greedy decode, R times; the median of each.
  std::vector<double> prefill_tps, decode_tps;
  for (int r = 0; r < repeat + 1; ++r) {  // run 0 warms caches and page-ins, not counted
    s.kv->truncate_to(seq, 0);
    auto t0 = Clock::now();
    ForwardSeq fs{seq, prompt, false};
    s.model->forward({&fs, 1}, *s.kv, logits);
    const double tp = since(t0);
    int32_t tok = argmax(logits);
    t0 = Clock::now();
    for (int64_t i = 0; i < n_decode; ++i) {
      ForwardSeq step{seq, {&tok, 1}, false};
      s.model->forward({&step, 1}, *s.kv, logits);
      tok = argmax(logits);
    }
    const double td = since(t0);
    if (r == 0) continue;
    prefill_tps.push_back(n_prompt / tp);
    decode_tps.push_back(n_decode / td);
  }

  // Verification cost: one forward over n tokens at the same context, relative to n = 1.
  nlohmann::json verify = nlohmann::json::array();
  double t_one = 0;
  for (int n = 1; n <= max_verify; ++n) {
    std::vector<double> times;
    std::vector<int32_t> toks(prompt.begin(), prompt.begin() + std::min<int64_t>(n, n_prompt));
    toks.resize(n, prompt[0]);
    for (int r = 0; r < std::max(5, repeat * 3); ++r) {
      s.kv->truncate_to(seq, n_prompt);
      ForwardSeq fs{seq, toks, true};
      const auto t0 = Clock::now();
      s.model->forward({&fs, 1}, *s.kv, logits);
      times.push_back(since(t0));
    }
    const double t = median(times);
    if (n == 1) t_one = t;
    verify.push_back({{"tokens", n}, {"seconds", t}, {"cost_vs_one_token", t / t_one}});
  }

  // Roofline: bytes one decode step must read (weights + the K/V of the average context).
  const double avg_ctx = n_prompt + n_decode / 2.0;
  const double kv_bytes = avg_ctx * cfg.layers * 2.0 * cfg.kv_heads * cfg.head_dim * sizeof(float);
  const double weight_bytes = static_cast<double>(s.model->weight_bytes_per_token());
  double bandwidth_gbs = 0;
  if (auto* host = dynamic_cast<HostOps*>(s.ops.get())) bandwidth_gbs = measure_read_bandwidth_gbs(host->pool());
  const double bytes = weight_bytes + kv_bytes;
  const double roofline_tps = bandwidth_gbs > 0 ? bandwidth_gbs * 1e9 / bytes : 0;
  const double decode = median(decode_tps);

  nlohmann::json j;
  j["bench"] = "decode";
  j["model"] = s.loaded.path;
  j["device"] = s.ops->name();
  j["threads"] = a.integer("threads", 2);
  j["prompt_tokens"] = n_prompt;
  j["decode_tokens"] = n_decode;
  j["repeat"] = repeat;
  j["prefill_tokens_per_second"] = median(prefill_tps);
  j["decode_tokens_per_second"] = decode;
  j["decode_runs_tokens_per_second"] = decode_tps;
  j["weight_bytes_per_token"] = weight_bytes;
  j["kv_bytes_per_token"] = kv_bytes;
  j["measured_read_bandwidth_gb_per_s"] = bandwidth_gbs;
  j["roofline_tokens_per_second"] = roofline_tps;
  j["roofline_fraction"] = roofline_tps > 0 ? decode / roofline_tps : 0;
  j["achieved_gb_per_s"] = decode * bytes / 1e9;
  j["verify_cost"] = verify;
  std::cout << j.dump(2) << "\n";
  return 0;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  if (argc >= 2 && argv[1][0] != '-') {
    const std::string what = argv[1];
    std::set<std::string> options = kModelOptions;
    options.insert({"prompt-tokens", "decode-tokens", "repeat", "max-verify"});
    const Args a(argc - 1, argv + 1, options, {});
    if (a.help()) { std::fputs(kUsage, stdout); return 0; }
    if (what == "decode") return bench_decode(a);
    throw UsageError("unknown benchmark '" + what + "' (expected: decode)");
  }
  std::fputs(kUsage, argc >= 2 ? stdout : stderr);
  return argc >= 2 ? 0 : 2;
}

}  // namespace specula::cli
