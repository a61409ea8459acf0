// include/specula/specula.h, the public API, over the engine of actors/engine.h.
#include "specula/specula.h"

#include <random>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "actors/engine.h"
#include "spec/penalties.h"

namespace specula {

namespace {

Stats stats_of(const SpeculativeStats& s) {
  return {s.prompt_tokens, s.generated, s.rounds, s.drafted, s.accepted, s.preemptions};
}

Event event_of(actors::StreamEvent ev) {
  Event out;
  out.kind = ev.kind == actors::StreamEvent::Kind::Token  ? Event::Kind::Token
             : ev.kind == actors::StreamEvent::Kind::Done ? Event::Kind::Done
                                                          : Event::Kind::Error;
  out.text = std::move(ev.text);
  out.token = ev.token;
  out.from_draft = ev.from_draft;
  if (ev.logprobs) {
    out.logprob = ev.logprobs->logprob;
    for (const auto& [id, lp] : ev.logprobs->top) out.top_logprobs.push_back({id, lp});
  }
  if (ev.prompt_logprobs)
    for (const TokenLogprobs& t : *ev.prompt_logprobs) {
      PromptTokenLogprob& p = out.prompt_logprobs.emplace_back();
      p.logprob = t.logprob;
      p.rank = t.rank;
      for (const auto& [id, lp] : t.top) p.top.push_back({id, lp});
    }
  out.finish_reason = std::string(finish_reason_name(ev.finish_reason));
  out.stop_string = std::move(ev.stop_string);
  if (ev.stop_token >= 0) out.stop_token = ev.stop_token;
  out.error = std::move(ev.error);
  out.stats = stats_of(ev.stats);
  return out;
}

actors::EngineRequest request_of(Request r, const LoadedModel& model) {
  actors::EngineRequest e;
  e.prompt = std::move(r.prompt);
  e.chat = r.chat;
  for (Message& m : r.messages) e.messages.push_back({std::move(m.role), std::move(m.content)});
  e.add_generation_prompt = r.add_generation_prompt;
  e.continue_final_message = r.continue_final_message;
  if (!r.chat_template_kwargs.empty()) {
    auto kwargs = nlohmann::ordered_json::parse(r.chat_template_kwargs, nullptr, false);
    if (!kwargs.is_object())
      throw std::invalid_argument("chat_template_kwargs must be a JSON object of template variables, got '" +
                                  r.chat_template_kwargs.substr(0, 80) + "'");
    for (const char* own : {"messages", "tools", "add_generation_prompt", "continue_final_message"})  // as the server
      if (kwargs.contains(own))
        throw std::invalid_argument(std::string("chat_template_kwargs may not set '") + own + "': set the Request's own field");
    e.template_variables = std::make_shared<const nlohmann::ordered_json>(std::move(kwargs));
  }
  e.max_tokens = r.max_tokens;
  e.sampling.temperature = r.temperature;
  e.sampling.top_k = r.top_k;
  e.sampling.top_p = r.top_p;
  e.sampling.min_p = r.min_p;
  e.sampling.presence_penalty = r.presence_penalty;
  e.sampling.frequency_penalty = r.frequency_penalty;
  e.sampling.repetition_penalty = r.repetition_penalty;
  e.sampling.logit_bias = std::move(r.logit_bias);
  e.sampling.allowed_token_ids = std::move(r.allowed_token_ids);
  if (!r.bad_words.empty()) {  // as the server does (spec/penalties.h)
    if (!model.tokenizer) throw std::invalid_argument("bad_words needs the model's tokenizer");
    e.sampling.bad_words = bad_words_token_ids(*model.tokenizer, r.bad_words);
  }
  e.sampling.min_tokens = r.min_tokens;
  if (r.ignore_eos) e.stop_ids = std::vector<int32_t>{};
  if (r.seed) {
    e.sampling.seed = *r.seed;
  } else {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    e.sampling.seed = rng();
  }
  // As the server does (docs/protocol.md, "The seed promise"): a named seed means coupled.
  if (r.mode.empty()) r.mode = r.seed ? "coupled" : "exact";
  try {
    e.mode = parse_spec_sampling(r.mode);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("mode must be \"exact\", \"block\" or \"coupled\", got \"" + r.mode + "\"");
  }
  e.stop = std::move(r.stop);
  e.stop_token_ids = std::move(r.stop_token_ids);
  e.include_stop_str_in_output = r.include_stop_str_in_output;
  e.skip_special_tokens = r.skip_special_tokens;
  e.logprobs = r.top_logprobs;
  e.prompt_logprobs = r.prompt_logprobs;
  e.priority = r.priority;
  return e;
}

}  // namespace

Stream::Stream(std::unique_ptr<actors::TokenStream> s) : s_(std::move(s)) {}
Stream::Stream(Stream&&) noexcept = default;
Stream& Stream::operator=(Stream&&) noexcept = default;
Stream::~Stream() = default;

boost::asio::awaitable<Event> Stream::next() { co_return event_of(co_await s_->next()); }
Event Stream::next_blocking() { return event_of(s_->next_blocking()); }
void Stream::cancel() { s_->cancel(); }

Engine::Engine(EngineOptions o) {
  if (o.model.empty()) throw std::invalid_argument("EngineOptions::model is empty: give a GGUF file or a model directory");
  actors::EngineConfig c;
  c.target = std::move(o.model);
  c.drafter = std::move(o.drafter);
  c.device = std::move(o.device);
  c.threads = o.threads;
  c.max_batch = o.max_batch;
  c.kv_tokens = o.kv_tokens;
  c.reserve_max_tokens = o.reserve_max_tokens;
  c.ubatch = o.ubatch_size;
  c.pipeline = o.pipeline;
  c.draft.k = o.spec_k;
  c.draft.adaptive = o.adaptive;
  c.draft.k_max = std::max(c.draft.k_max, o.spec_k);
  c.draft.validate();
  engine_ = std::make_unique<actors::Engine>(std::move(c));
}

Engine::~Engine() = default;

Stream Engine::start(Request request) {
  return Stream(std::make_unique<actors::TokenStream>(engine_->start(request_of(std::move(request), engine_->model()))));
}

boost::asio::awaitable<Stream> Engine::generate(Request request) { co_return start(std::move(request)); }

Result Engine::generate_blocking(Request request) {
  Stream s = start(std::move(request));
  Result r;
  for (;;) {
    Event ev = s.next_blocking();
    r.text += ev.text;
    if (ev.kind == Event::Kind::Token) {
      r.tokens.push_back(ev.token);
      continue;
    }
    r.finish_reason = ev.kind == Event::Kind::Done ? ev.finish_reason : "";
    r.error = std::move(ev.error);
    r.stats = ev.stats;
    return r;
  }
}

}  // namespace specula
