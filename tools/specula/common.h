// What several subcommands share: the default model path, model + device set-up, .npy output.
#pragma once
#include <chrono>
#include <memory>
#include <optional>
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

// --chat-template NAME|FILE|TEXT: the commands that render chat prompts take it (ChatTemplate::from_option).
inline const std::string kChatTemplateOption = "chat-template";
// --model (default model), with --chat-template applied when given (a UsageError naming a bad one).
LoadedModel load_model_from_args(const Args& a);

// Options every model-running command takes.
inline const std::set<std::string> kModelOptions = {"model", "device", "threads", "ctx", "ubatch-size"};

// --ubatch-size: the most rows one forward runs at a time, longer prompts going in pieces of that
// many (LlamaModel::set_max_forward_rows; as llama.cpp's option of that name).
int64_t ubatch_from_args(const Args& a);

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

// --temperature, --top-k, --top-p, --min-p (0, off), --seed; what each is when the flag is absent. The CLI's are
// llama.cpp's (0.8, 40, 0.95, a random seed); the benchmarks' are greedy with seed 1.
struct SamplingDefaults {
  double temperature = 0.8;
  int top_k = 40;
  double top_p = 0.95;
  std::optional<uint64_t> seed;  // none: a random seed
};
inline const SamplingDefaults kBenchSamplingDefaults{0.0, 0, 1.0, 1};
// The flags as SamplingParams; a value out of range is a UsageError naming it.
SamplingParams sampling_from_args(const Args& a, const SamplingDefaults& defaults = {});
// --allowed-token-ids ID,... and --bad-words WORD,... (or a JSON array of strings, for words with
// commas) into `sp`, as vLLM's allowed_token_ids and bad_words: the words tokenized with the
// model's tokenizer (spec/penalties.h), the lists checked against its vocabulary; UsageError
// naming the flag otherwise. After the model is loaded. Defined in cmd_generate.cpp.
void token_lists_from_args(const Args& a, const LoadedModel& model, SamplingParams& sp);
// The GBNF of --json-schema FILE or --grammar FILE ("" for neither; at most one of them and
// --json-object, else a UsageError, as for a bad file). Defined in cmd_generate.cpp.
std::string grammar_from_args(const Args& a);
// "none", "json_object", "json_schema FILE" or "grammar FILE": the constraint the flags ask for.
std::string constraint_name(const Args& a);
// --max-tokens in 1..1,000,000 (default `fallback`); UsageError otherwise. Defined in cmd_generate.cpp.
long long max_tokens_from_args(const Args& a, long long fallback);

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
