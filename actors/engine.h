// The in-process C++ coroutine API: an Engine wires the scheduler, draft, verifier and sampler
// actors around one target model; generate() returns a token stream.
//
//   EngineConfig config;  config.target = path;  config.drafter = "ngram";
//   Engine engine(config);
//   EngineRequest request;  request.prompt = "Hello";  request.max_tokens = 32;
//   TokenStream stream = co_await engine.generate(std::move(request));
//   for (;;) {
//     StreamEvent ev = co_await stream.next();
//     if (ev.kind == StreamEvent::Kind::Token) std::cout << ev.text;
//     if (ev.terminal()) break;   // Done (ev.finish_reason, ev.stats) or Error (ev.error)
//   }
// (Name the request: GCC 12 destroys a temporary aggregate inside a co_await expression twice.)
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "actors/messages.h"
#include "actors/token_stream.h"
#include "gpu/ops.h"
#include "model/weights.h"
#include "spec/adaptive_k.h"
#include "spec/sampling.h"
#include "spec/speculative_sampling.h"

namespace specula::actors {

struct EngineConfig {
  std::string target;                  // model path (GGUF file or Hugging Face directory)
  std::string drafter = "ngram";       // none | ngram[:n=N] | skip:LAYERS | eagle[:PATH] | draft model path | ngram:n=N+eagle (spec/make_drafter.h)
  std::string device = "auto";         // auto | host | cuda
  // `--chat-template`: a built-in name (chatml, llama3, plain), a Jinja template file, or its text;
  // empty: the model's own (ChatTemplate::from_option; a bad one fails the engine's construction).
  std::string chat_template;
  // `--tool-call-parser`: auto (what the template writes), generic, hermes, llama3_json, mistral
  // (ChatTemplate::set_tool_call_parser).
  std::string tool_call_parser = "auto";
  // Models already in memory (benchmarks on random weights at real shapes): target_model is used
  // instead of loading `target`; draft_model, with the target's vocabulary, is the drafter
  // instead of `drafter`.
  std::shared_ptr<const LoadedModel> target_model;
  std::shared_ptr<const LoadedModel> draft_model;
  DraftLengthConfig draft;             // default K (fixed or adaptive) for requests that set none
  int max_batch = 16;                  // active requests per round
  int64_t kv_tokens = 16384;           // target KV positions shared by all requests (the admission budget)
  // A request's KV blocks reserved for its whole prompt + max_tokens at admission (llama.cpp's
  // slots), instead of as it grows with the latest admitted request preempted when the pool runs
  // out (vLLM's; the default: docs/engine.md, "Admission").
  bool reserve_max_tokens = false;
  int threads = 2;                     // compute threads of the host device
  // The most prompt rows a round prefills, and the most rows one target forward runs at a time
  // (llama.cpp's ubatch): a longer prompt is prefilled in pieces of this many, one a round, while
  // the other requests keep decoding; the activations' scratch stays bounded by it
  // (docs/engine.md, "Prefill in pieces"). A prompt whose log-probabilities are asked for is
  // prefilled whole in its first round (in 64-row forwards).
  int64_t ubatch = LlamaModel::kDefaultMaxForwardRows;
  int draft_threads = 0;               // with pipelining, the draft device's threads (0 = `threads`)
  int io_threads = 1;                  // threads running the actors (they only route; compute is on streams)
  // Two rounds in flight over disjoint halves of the active set (ping-pong micro-batches), so the
  // draft stream works while the verify stream does; with one active request, the optimistic
  // continuation (its next round drafted while this one is verified). The draft then gets its own
  // device and model instance (the skip drafter must not share the target's workspace with a
  // concurrent verify).
  bool pipeline = false;
  // Pipelining runs only where the draft stream has compute of its own: on a GPU, or where the
  // verify and draft pools' host threads together fit the CPUs this process may run on. Where the
  // two pools share cores, each keeps every core busy while it works, so the streams take turns
  // (measured: the draft stream busy during 2% of the verify's time) and pipelining only adds
  // cost: an optimistic draft adds its whole time to the round to save the next, shorter one only
  // when every draft is accepted, and the draft pool's idle spin takes a core from the verify
  // (docs/engine.md, "Pipelining"). True: pipeline there too (tests, comparisons).
  bool pipeline_on_shared_cores = false;
  // Requests with adaptive K (draft.adaptive) get K per round from the scheduler's cost model
  // over the whole batch, down to 0 under load (actors/load_policy.h); off: each request's own
  // adaptive K.
  bool load_adaptive = true;
  // The prefix cache (vLLM's automatic prefix caching; docs/engine.md, "The prefix cache"): full
  // KV blocks of committed tokens outlive their request and a new prompt that starts with the
  // same tokens shares them instead of prefilling them again.
  bool prefix_cache = true;
  std::string trace_path;              // write Chrome trace-event JSON here when the engine closes ("" = off)
  FaultHook fault_hook;                // tests only: throw from it to fail a round
  JudgeRule judge_rule;                // tests only: replaces the acceptance rule (a planted bug)
  // Tests only: makes the devices instead of make_device (the target's, then with pipelining the
  // draft's), e.g. a double that records the streams and events each actor uses.
  std::function<std::unique_ptr<Ops>(const DeviceOptions&)> device_factory;
};

// Whether a pipelined draft stream has compute of its own: on a device that is not the host, or
// when the verify and draft pools' host threads together fit `cpus`.
bool draft_stream_has_own_compute(DeviceKind device, int verify_threads, int draft_threads, int cpus);
// The CPUs this process may run on: its affinity mask (hardware_concurrency where that fails),
// and no more than a container's CPU quota allows (cgroup v2 cpu.max, or v1's cfs quota).
int usable_cpus();
// The CPUs a quota of `quota` per `period` microseconds amounts to, rounded up; 0 for no quota
// ("max", -1) or text that is not a number.
int cpus_of_quota(const std::string& quota, const std::string& period);

// A request the engine refuses, naming the field: `code` is "invalid_request" or
// "context_length_exceeded" (the server sends both as 400 with this message).
struct RequestError : std::invalid_argument {
  RequestError(std::string code_, std::string field_, const std::string& message)
      : std::invalid_argument(message), code(std::move(code_)), field(std::move(field_)) {}
  std::string code;
  std::string field;  // "messages", "prompt", "max_tokens", "stop", "sampling", "speculation"
};

// The most alternatives a token's log-probabilities list (OpenAI's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

// The most ids EngineRequest::stop_token_ids may hold.
inline constexpr std::size_t kMaxStopTokenIds = 64;

struct EngineRequest {
  std::string prompt;                          // text, used when prompt_ids is empty
  std::vector<int32_t> prompt_ids;             // token ids (taken as they are)
  bool chat = false;                           // apply the model's chat template to `prompt` (one user message)
  std::vector<ChatMessage> messages;           // a conversation in the chat template (instead of `prompt`)
  // OpenAI's tool list, for a chat template that writes tools (ChatTemplate::render's `tools`).
  std::shared_ptr<const nlohmann::ordered_json> tools;
  // How `messages` are rendered (RenderOptions: vLLM's add_generation_prompt,
  // continue_final_message and chat_template_kwargs, the last as an object or null).
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  std::shared_ptr<const nlohmann::ordered_json> template_variables;
  // max_tokens beyond the room the context leaves after the prompt: cut to that room (the server's
  // rule; Admission::max_tokens_clamped says so) instead of running into the context's end.
  bool fit_to_context = false;
  int max_tokens = 256;
  SamplingParams sampling{0.0f, 0, 1.0f, 0};   // greedy by default
  SpecSampling mode = SpecSampling::Exact;
  std::optional<DraftLengthConfig> draft;      // default: the engine's
  bool speculate = true;                       // false: plain decode rounds (K = 0) through the same actors
  std::optional<std::vector<int32_t>> stop_ids;  // default: the model's end tokens
  // vLLM's stop_token_ids: more tokens that end the request as the end tokens do (their text left
  // out), on top of stop_ids (so with ignore_eos's empty stop_ids too).
  std::vector<int32_t> stop_token_ids;
  // vLLM's include_stop_str_in_output: the stop string, or the stop token's text, that ends the
  // request stays at the end of its text.
  bool include_stop_str_in_output = false;
  // vLLM's skip_special_tokens: false puts special tokens' text (such as "<|im_start|>") in the text.
  bool skip_special_tokens = true;
  // Stop strings: the text ends before the first one that appears (it is not shown), with
  // FinishReason::Stop. Text that might still become one is held back until it cannot.
  std::vector<std::string> stop;
  // Log-probabilities: -1 = none; 0..20 = each generated token's log-probability under the
  // target's own distribution at its position (spec/sampling.h, token_logprobs) and that many
  // most probable alternatives, on its StreamEvent (not on the stop token that ends the request,
  // which is not part of its text either).
  int logprobs = -1;
  // The prompt's log-probabilities (vLLM's prompt_logprobs; what /v1/completions lists with echo):
  // -1 = none; 0..20 = each prompt token but the first under the target's distribution given the
  // tokens before it, and that many alternatives, on the request's first StreamEvent. Such a
  // prompt is prefilled alone, in pieces of kPromptLogprobsRows (actors/messages.h), past the prefix cache (cached
  // positions have no logits).
  int prompt_logprobs = -1;
  // The stop token that ends the request keeps its log-probabilities (its text stays out). vLLM
  // lists it; the server asks for this with echo, whose clients drop the generated tokens' entries
  // by count (lm-evaluation-harness's max_tokens 1).
  bool stop_token_logprobs = false;
  // Among requests waiting for a place in the batch, a lower priority is admitted first (vLLM's
  // sense), equal ones first come first served; one that does not fit preempts requests in the batch
  // of higher values between rounds, which wait again and resume where they stopped
  // (docs/engine.md, "Preemption").
  int priority = 0;
};

// What Engine::start settled for a request it took.
struct Admission {
  int64_t prompt_tokens = 0;
  bool max_tokens_clamped = false;  // fit_to_context cut max_tokens
};

// What the blocking wrapper returns.
struct GenerateResult {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<bool> from_draft;
  std::vector<TokenLogprobs> logprobs;  // when the request asked: one a token but a final stop token
  std::vector<TokenLogprobs> prompt_logprobs;  // when the request asked: one a prompt token but the first
  FinishReason finish_reason = FinishReason::None;  // None on error
  std::string error;
  SpeculativeStats stats;

  // Adds one event of a stream; true when it was the last (done or error).
  bool add(StreamEvent ev);
};

class Engine {
 public:
  // Loads the target and the drafter and starts the actors. Throws ModelError / invalid_argument
  // for a bad file or setting, naming it.
  explicit Engine(EngineConfig config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Any thread. Submits the request: templates (messages, or `prompt` with `chat`), tokenizes,
  // checks it against the limits. Throws RequestError naming the field for a bad one (empty
  // prompt, a prompt that fills the context, bad sampling, K or stop strings), runtime_error
  // when the engine is shutting down.
  boost::asio::awaitable<TokenStream> generate(EngineRequest request) { co_return start(std::move(request)); }
  TokenStream start(EngineRequest request, Admission* admission = nullptr);
  // Blocking wrapper: runs one request to its end.
  GenerateResult generate_blocking(EngineRequest request);

  // Any thread.
  void cancel(RequestId id);
  const EngineConfig& config() const;
  const LoadedModel& model() const;
  // The chat template requests' messages are rendered with (the model's, or EngineConfig::chat_template).
  const ChatTemplate& chat_template() const;
  std::string device_name() const;  // the target's device, e.g. "host (avx512-vnni, 2 threads)"
  // Whether the engine pipelines: `pipeline`, where the draft stream has compute of its own or
  // `pipeline_on_shared_cores` says so regardless.
  bool pipelined() const;
  // Why `pipeline` was asked for and the engine does not pipeline ("" otherwise): the CPUs and
  // threads the two streams would share.
  const std::string& why_not_pipelined() const;
  std::vector<int32_t> tokenize(const EngineRequest& request) const;
  // The vocabulary as JSON mode reads it (SamplingParams::json_object), made on the first call;
  // nullptr for a model without a tokenizer.
  std::shared_ptr<const JsonVocabulary> json_vocabulary() const;
  // The vocabulary as grammars read it (spec/grammar.h), made on the first call; nullptr for a
  // model without a tokenizer.
  std::shared_ptr<const TokenTrie> token_trie() const;
  // The matcher of a GBNF grammar over this vocabulary (SamplingParams::grammar), compiled on first
  // use and kept for the next requests that send the same text (the last 16). Throws
  // std::invalid_argument for bad GBNF or a model without a tokenizer.
  std::shared_ptr<const GrammarMatcher> grammar(const std::string& gbnf) const;
  // The positions a request may fill: the model's context, and no more than the KV pool can
  // ever give one request.
  int64_t context_length() const;
  bool idle() const;                // nothing queued, active or in flight, every finished request's KV freed
  int64_t kv_blocks_free() const;   // the target pool as the verifier last left it
  int64_t kv_blocks_total() const;
  // Prompt tokens the engine prefilled or found in the prefix cache, and those it found, so far.
  int64_t prefix_queried_tokens() const;
  int64_t prefix_hit_tokens() const;
  // Running requests preempted so far, for waiting ones of lower priority values or for the KV
  // blocks of their own or an earlier admitted request's next round (docs/engine.md, "Preemption").
  std::uint64_t preemptions() const;
  // Preempted requests with committed tokens waiting to resume now (the server shows them as
  // waiting, not running).
  int64_t preempted_waiting() const;
  std::uint64_t failures() const;   // rounds that failed in any actor
  std::string trace_json() const;   // the trace so far ("" when trace_path is empty)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula::actors
