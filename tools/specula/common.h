// What several subcommands share: the default model path, model + device set-up, .npy output.
#pragma once
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gpu/kv_cache.h"
#include "gpu/llama.h"
#include "model/weights.h"
#include "spec/sampling.h"
#include "tools/specula/args.h"

namespace specula::cli {

// $SPECULA_MODEL, else $SPECULA_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
// (SPECULA_CACHE defaults to ~/.cache/specula), where scripts/setup.sh puts it.
std::string default_model_path();

// Options every model-running command takes.
inline const std::set<std::string> kModelOptions = {"model", "device", "threads", "ctx"};

// A model loaded onto a device with one KV cache.
struct Session {
  LoadedModel loaded;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<KvCache> kv;
};
// --model (default model), --device (auto), --threads (2), --ctx (KV positions; default the
// model's context, at most 8192).
Session open_session(const Args& a);

// --temperature (0.8), --top-k (40), --top-p (0.95), --seed (random): llama.cpp's defaults.
SamplingParams sampling_from_args(const Args& a);

// Writes a float32 array of the given shape as a NumPy .npy file.
void write_npy(const std::string& path, const std::vector<float>& data, const std::vector<int64_t>& shape);

// The non-empty items of a `sep`-separated list ("a;b;;c" -> a, b, c).
std::vector<std::string> split(const std::string& list, char sep);

// Benchmarks' timing: seconds since t0 on the steady clock, and the median of a sample (the
// upper middle of an even count; 0 for none).
using BenchClock = std::chrono::steady_clock;
double seconds_since(BenchClock::time_point t0);
double median_of(std::vector<double> v);

// Reads one line from a stdin that may be closed; false at end of input.
bool read_line(std::string& line);

}  // namespace specula::cli
