// Specula's public C++ API: the engine in your own process, one header. Stream a reply with C++20
// coroutines on your own Asio executor, or call the blocking wrapper. Installed by
// `cmake --install`; find it with `find_package(Specula)` and link `Specula::engine`
// (docs/engine.md, "Using the engine from your program").
//
//   specula::Engine engine({.model = "SmolLM2-135M-Instruct.Q4_1.gguf"});
//   specula::Request request;  request.prompt = "Hello";  request.chat = true;
//   specula::Stream stream = co_await engine.generate(std::move(request));
//   for (specula::Event ev = co_await stream.next();; ev = co_await stream.next()) {
//     std::cout << ev.text;
//     if (ev.terminal()) break;   // Done (ev.finish_reason, ev.stats) or Error (ev.error)
//   }
//
// Only this header is public: the actors, devices and models behind it are not part of the API.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>

namespace specula {

namespace actors {
class Engine;
class TokenStream;
}  // namespace actors

struct EngineOptions {
  std::string model;                 // a GGUF file or a Hugging Face directory
  std::string drafter = "ngram";     // none | ngram[:n=N] | skip:LAYERS | eagle[:PATH] | a draft model path | ngram:n=N+eagle (make_drafter.h)
  std::string device = "auto";       // auto | host | cuda
  int threads = 2;                   // compute threads of the host device
  int max_batch = 16;                // requests decoded together
  std::int64_t kv_tokens = 16384;    // KV positions shared by all requests
  bool reserve_max_tokens = false;   // reserve each request's prompt + max_tokens at admission
                                     // (a running request never waits) instead of as it grows
                                     // (the latest admitted preempted when the pool runs out)
  bool pipeline = false;             // draft round n+1 while round n is verified, where the draft
                                     // has cores of its own (a GPU, or 2 x threads fitting the CPUs)
  int spec_k = 4;                    // draft tokens per round, for requests that set none
  bool adaptive = false;             // K per round from the running acceptance
  std::int64_t ubatch_size = 512;    // the most prompt rows a round prefills (a longer prompt goes
                                     // in over several rounds while others decode) and the most
                                     // rows of one forward, as llama.cpp's --ubatch-size
};

struct Message {
  std::string role;     // system | user | assistant
  std::string content;
};

struct Request {
  std::string prompt;                 // text; with `chat`, one user message in the model's chat template
  bool chat = false;
  std::vector<Message> messages;      // a whole conversation (instead of `prompt`), templated
  // How `messages` are templated (vLLM's chat fields, docs/protocol.md): the prompt ends with the
  // assistant's header; or, with add_generation_prompt false and continue_final_message true, the
  // last message is left open and the text continues it (a prefill of the reply).
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  // More variables for the model's Jinja template, as a JSON object (e.g. {"enable_thinking":
  // false}); "" = none. Not JSON, or not an object: std::invalid_argument from start().
  std::string chat_template_kwargs;
  int max_tokens = 256;
  float temperature = 0.0f;           // 0 = greedy
  int top_k = 0;                      // 0 = off
  float top_p = 1.0f;
  float min_p = 0.0f;                 // 0 = off; keep tokens at least min_p x the most probable (after temperature)
  // Over the request's own tokens, before the temperature (vLLM's definitions; docs/speculative.md,
  // "Penalties"): presence and frequency in [-2, 2] over the output, repetition in (0, 2] over the
  // prompt and the output, and a bias in [-100, 100] added to chosen tokens' logits.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::pair<std::int32_t, float>> logit_bias;  // token id, bias
  int min_tokens = 0;                 // vLLM's: no end token (nor stop string) before this many tokens
  bool ignore_eos = false;            // vLLM's: the model's end tokens do not end the text
  std::optional<std::uint64_t> seed;  // none: a random seed
  std::string mode;                   // "exact" (rejection sampling), "block" (block verification) or "coupled"; "" = coupled with a seed, else exact
  std::vector<std::string> stop;      // the text ends before the first of these
  std::vector<std::int32_t> stop_token_ids;  // vLLM's: more tokens that end the text (their text left out)
  bool include_stop_str_in_output = false;   // vLLM's: the stop string or stop token's text stays
  bool skip_special_tokens = true;           // vLLM's: false shows special tokens' text
  // -1: none; 0..20: each token's log-probability under the model's own distribution (log
  // softmax of its raw logits) on its Event, with that many most probable alternatives.
  int top_logprobs = -1;
  // -1: none; 0..20: each prompt token but the first, its log-probability given the tokens before
  // it and that many most probable alternatives there, on the first Event (vLLM's prompt_logprobs).
  // Such a prompt is prefilled on its own, past the prefix cache.
  int prompt_logprobs = -1;
  // Among requests waiting for a place in the batch (Options::max_batch), a lower value is admitted
  // first, equal values first come first served (vLLM's `priority`); one that finds the batch or
  // the KV pool full preempts running requests of higher values, which resume later with the same
  // text (docs/engine.md, "Preemption").
  int priority = 0;
  // vLLM's: when not empty, only these tokens may be generated (the end tokens too only if listed).
  std::vector<std::int32_t> allowed_token_ids;
  // vLLM's: words tokenized as vLLM does (the word, and the word after a space where that is as
  // many tokens), each one's last token never drawn where the text ends with its other tokens (the
  // same text written with other tokens is not caught, as in vLLM). A word of whitespace:
  // std::invalid_argument from start().
  std::vector<std::string> bad_words;
};

struct TokenLogprob {
  std::int32_t token = -1;
  float logprob = 0;
};

struct PromptTokenLogprob {
  float logprob = 0;              // the prompt token's
  std::int32_t rank = 1;          // 1 + the tokens more probable there (vLLM's rank)
  std::vector<TokenLogprob> top;  // the most probable tokens at its position, most probable first
};

struct Stats {
  std::int64_t prompt_tokens = 0;
  std::int64_t generated = 0;
  std::int64_t rounds = 0;     // target forwards
  std::int64_t drafted = 0;    // draft tokens proposed
  std::int64_t accepted = 0;   // draft tokens accepted
  std::int64_t preemptions = 0;  // times preempted for a request of a lower priority value
};

struct Event {
  enum class Kind { Token, Done, Error };
  Kind kind = Kind::Token;
  std::string text;            // the text this token completes (Done: what was held back)
  std::int32_t token = -1;     // Token: its id
  bool from_draft = false;     // Token: an accepted draft token
  std::optional<float> logprob;            // Token, when the request asked (Request::top_logprobs)
  std::vector<TokenLogprob> top_logprobs;  // Token: the most probable tokens there, most probable first
  // The first event, when the request asked (Request::prompt_logprobs): prompt tokens 1, 2, ...
  std::vector<PromptTokenLogprob> prompt_logprobs;
  std::string finish_reason;   // Done: stop | length | context | cancelled
  // Done with finish_reason stop (vLLM's stop_reason): the stop string that ended the text, or the
  // token of Request::stop_token_ids that did; neither for the model's end tokens.
  std::string stop_string;
  std::optional<std::int32_t> stop_token;
  std::string error;           // Error: what failed, in one line
  Stats stats;                 // Done and Error
  bool terminal() const { return kind != Kind::Token; }
};

// One request's events, in order; dropping it before the end cancels the request.
class Stream {
 public:
  Stream(Stream&&) noexcept;
  Stream& operator=(Stream&&) noexcept;
  ~Stream();
  boost::asio::awaitable<Event> next();  // the next event; after the terminal one, that again
  Event next_blocking();                 // the same for a plain thread
  void cancel();                         // any thread; a Done with "cancelled" follows

 private:
  friend class Engine;
  explicit Stream(std::unique_ptr<actors::TokenStream> s);
  std::unique_ptr<actors::TokenStream> s_;
};

struct Result {
  std::string text;
  std::vector<std::int32_t> tokens;
  std::string finish_reason;  // "" on error
  std::string error;
  Stats stats;
};

class Engine {
 public:
  // Loads the model and the drafter and starts the engine's threads. Throws std::exception with
  // one line naming what is wrong (a missing or corrupt file, a bad setting).
  explicit Engine(EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Any thread. Throws std::invalid_argument naming the field for a bad request.
  boost::asio::awaitable<Stream> generate(Request request);
  Stream start(Request request);
  Result generate_blocking(Request request);

 private:
  std::unique_ptr<actors::Engine> engine_;
};

}  // namespace specula
