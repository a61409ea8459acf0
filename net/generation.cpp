// A request's token stream read in batches, its statistics and its metrics.
#include "net/generation.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "model/tokenizer.h"

namespace specula::net {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

double ms_between(Generation::Clock::time_point a, Generation::Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A request with one of these is parsed on the preparation thread: compiling a grammar or a JSON
// schema into its matcher can take a few hundred milliseconds within the grammar limits.
constexpr const char* kConstraintFields[] = {"response_format", "guided_json", "json_schema", "guided_choice", "guided_regex",
                                             "guided_grammar",  "grammar",     "tool_choice", "tools",         "structured_outputs"};

// What the template is handed to render, in bytes; tools handed to it count as large (their
// JSON is written out by the template, which the I/O thread should not wait for).
std::size_t prompt_text_bytes(const actors::EngineRequest& r) {
  if (r.tools && !r.tools->empty()) return std::numeric_limits<std::size_t>::max();
  if (r.template_variables && !r.template_variables->empty()) return std::numeric_limits<std::size_t>::max();  // as the tools
  std::size_t bytes = r.prompt.size();
  for (const ChatMessage& m : r.messages) {
    bytes += m.role.size() + m.content.size() + m.tool_call_id.size() + m.name.size() + m.reasoning_content.value_or("").size();
    for (const ToolCall& c : m.tool_calls) bytes += c.id.size() + c.name.size() + c.arguments.size();
  }
  return bytes;
}

}  // namespace

json GenerationStats::to_json() const {
  const double decode_ms = elapsed_ms - ttft_ms;
  return json{{"prompt_tokens", prompt_tokens},
              {"cached_prompt_tokens", cached_prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"rounds", rounds},
              {"drafted", drafted},
              {"accepted", accepted},
              {"acceptance_rate", drafted > 0 ? static_cast<double>(accepted) / drafted : 0.0},
              {"mean_accepted_length", rounds > 0 ? static_cast<double>(accepted) / rounds : 0.0},
              {"mean_confidence_threshold", mean_confidence_threshold},
              {"preemptions", preemptions},
              {"ttft_ms", ttft_ms},
              {"elapsed_ms", elapsed_ms},
              {"tokens_per_second", decode_ms > 0 && completion_tokens > 1 ? (completion_tokens - 1) * 1000.0 / decode_ms
                                    : 0.0}};
}

GenerationStats GenerationStats::combine(const std::vector<GenerationStats>& choices, std::size_t per_prompt) {
  GenerationStats all;
  if (choices.empty()) return all;
  if (per_prompt == 0) per_prompt = choices.size();
  for (std::size_t i = 0; i < choices.size(); i += per_prompt) {
    all.prompt_tokens += choices[i].prompt_tokens;
    all.cached_prompt_tokens += choices[i].cached_prompt_tokens;
  }
  all.ttft_ms = choices.front().ttft_ms;
  double thresholds = 0;
  for (const GenerationStats& c : choices) {
    all.completion_tokens += c.completion_tokens;
    all.rounds += c.rounds;
    all.drafted += c.drafted;
    all.accepted += c.accepted;
    all.preemptions += c.preemptions;
    thresholds += c.mean_confidence_threshold * static_cast<double>(c.rounds);
    all.ttft_ms = std::min(all.ttft_ms, c.ttft_ms);
    all.elapsed_ms = std::max(all.elapsed_ms, c.elapsed_ms);
  }
  all.mean_confidence_threshold = all.rounds > 0 ? thresholds / static_cast<double>(all.rounds) : 0.0;
  return all;
}

asio::awaitable<json> parse_json_text(ServerState& st, std::string_view text) {
  if (!st.prep || text.size() <= kInlineJsonBytes) co_return parse_json(text);
  auto parse = [copy = std::string(text)] { return parse_json(copy); };  // by value: see on_prep_thread
  json parsed = co_await on_prep_thread(st, std::move(parse));
  co_return parsed;
}

asio::awaitable<std::vector<int32_t>> tokenize_prompt(ServerState& st, const actors::EngineRequest& request) {
  if (!st.prep || !request.prompt_ids.empty() || prompt_text_bytes(request) <= kInlinePromptBytes)
    co_return st.engine.tokenize(request);
  actors::EngineRequest text;  // by value: see on_prep_thread
  text.prompt = request.prompt;
  text.chat = request.chat;
  text.messages = request.messages;
  text.tools = request.tools;  // shared, and never changed: safe on the other thread
  text.add_generation_prompt = request.add_generation_prompt;
  text.continue_final_message = request.continue_final_message;
  text.template_variables = request.template_variables;  // shared as the tools
  const actors::Engine& engine = st.engine;
  auto tokenize = [&engine, text = std::move(text)] { return engine.tokenize(text); };
  std::vector<int32_t> ids = co_await on_prep_thread(st, std::move(tokenize));
  co_return ids;
}

asio::awaitable<std::vector<int32_t>> fit_oldest_turns(ServerState& st, actors::EngineRequest& request, std::size_t budget) {
  std::vector<int32_t> ids = co_await tokenize_prompt(st, request);
  if (ids.size() <= budget) co_return ids;
  const std::vector<ChatMessage> all = request.messages;
  std::size_t lead = 0;  // the setup kept: instructions, system and developer messages before the turns
  while (lead < all.size() && (all[lead].role == "system" || all[lead].role == "developer")) ++lead;
  std::vector<std::size_t> starts;  // where a kept conversation may start: at a user message after the first turn's
  for (std::size_t i = lead + 1; i < all.size(); ++i)
    if (all[i].role == "user") starts.push_back(i);
  if (starts.empty()) co_return ids;  // one turn: truncate_prompt_tokens cuts it
  auto from = [&](std::size_t start) {
    std::vector<ChatMessage> kept(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(lead));
    kept.insert(kept.end(), all.begin() + static_cast<std::ptrdiff_t>(start), all.end());
    return kept;
  };
  // Bisection for the first start whose prompt fits (fewer turns, fewer tokens); none: the last.
  std::size_t lo = 0, hi = starts.size();
  std::vector<int32_t> fitting;
  while (lo < hi) {
    const std::size_t mid = (lo + hi) / 2;
    request.messages = from(starts[mid]);
    std::vector<int32_t> tried = co_await tokenize_prompt(st, request);
    if (!tried.empty() && tried.size() <= budget) {
      hi = mid;
      fitting = std::move(tried);
    } else {
      lo = mid + 1;
    }
  }
  if (lo == starts.size()) {  // not even the last turn fits: it alone, cut by truncate_prompt_tokens
    request.messages = from(starts.back());
    std::vector<int32_t> last = co_await tokenize_prompt(st, request);
    co_return last;
  }
  request.messages = from(starts[lo]);
  co_return fitting;
}

namespace {

// parse_generation, on the preparation thread when the request has a constraint to compile.
asio::awaitable<ParsedRequest> parse_request(ServerState& st, json body, PromptKind kind, std::string_view raw) {
  bool constrained = false;
  for (const char* name : kConstraintFields) constrained = constrained || body.contains(name);
  if (!st.prep || !constrained) co_return parse_generation(body, kind, st.engine, st.config.defaults, raw);
  struct Input {  // by value: see on_prep_thread
    json body;
    std::string raw;
    RequestDefaults defaults;
  };
  auto in = std::make_shared<const Input>(Input{std::move(body), std::string(raw), st.config.defaults});
  const actors::Engine& engine = st.engine;
  auto parse = [&engine, in, kind] { return parse_generation(in->body, kind, engine, in->defaults, in->raw); };
  ParsedRequest parsed = co_await on_prep_thread(st, std::move(parse));
  co_return parsed;
}

}  // namespace

asio::awaitable<Generation::Admitted> Generation::admit(ServerState& st, json body, PromptKind kind,
                                                        Clock::time_point received, std::string_view raw, int64_t fit_turns) {
  auto reject = [&](ApiError e) {
    st.metrics.count_request("rejected");
    return e;
  };
  ParsedRequest parsed;
  try {
    ParsedRequest p = co_await parse_request(st, std::move(body), kind, raw);
    parsed = std::move(p);
  } catch (const ApiError& e) {
    throw reject(e);
  }
  if (st.draining) throw reject(ApiError("shutting_down", "the server is shutting down"));
  const int n = parsed.n;
  const int prompts = parsed.batch.empty() ? 1 : static_cast<int>(parsed.batch.size());
  const int total = n * prompts;
  if (total > st.admission_limit())
    throw reject(ApiError("invalid_request",
                          (prompts > 1 ? std::to_string(prompts) + " prompts x " : std::string()) + "n = " +
                              std::to_string(n) + " is more than this server's limit of " +
                              std::to_string(st.admission_limit()) + " running and queued requests",
                          prompts > 1 ? "prompt" : "n"));
  if (st.inflight + total > st.admission_limit())
    throw reject(ApiError("overloaded", "the server is at its limit of " + std::to_string(st.admission_limit()) +
                                            " running and queued requests; retry later"));
  // The choices hold their places while the prompts are tokenized (perhaps on the other thread).
  struct Reservation {
    ServerState& st;
    int64_t n;
    ~Reservation() { st.inflight -= n; }
  } reservation{st, total};
  st.inflight += total;
  int prompt_index = 0;  // which of several prompts a refusal is about
  try {
    // Every prompt as its own request, tokenized before any starts.
    std::vector<actors::EngineRequest> requests;
    std::vector<std::string> echo;
    std::vector<std::vector<int32_t>> prompt_ids;
    for (int p = 0; p < prompts; ++p) {
      prompt_index = p;
      actors::EngineRequest request = prompts == 1 ? std::move(parsed.request) : parsed.request;
      if (prompts > 1) {
        request.prompt = std::move(parsed.batch[p].text);
        request.prompt_ids = std::move(parsed.batch[p].ids);
      }
      std::string sent = parsed.echo && request.prompt_ids.empty() ? request.prompt : std::string();
      const bool fit = fit_turns > 0 && prompts == 1 && !request.messages.empty();
      // (a reasoning model's constrained reply was tokenized already: its turns are fitted again)
      if (fit && request.prompt_ids.size() > static_cast<std::size_t>(fit_turns)) request.prompt_ids.clear();
      if (request.prompt_ids.empty()) {
        std::vector<int32_t> ids;
        if (fit) {
          std::vector<int32_t> fitted = co_await fit_oldest_turns(st, request, static_cast<std::size_t>(fit_turns));
          ids = std::move(fitted);
        } else {
          std::vector<int32_t> whole = co_await tokenize_prompt(st, request);
          ids = std::move(whole);
        }
        if (!ids.empty()) {  // the ids are the prompt now (the messages stay: they name the field)
          request.prompt_ids = std::move(ids);
          request.prompt.clear();
          request.chat = false;
        }
      }
      if (const auto keep = static_cast<std::size_t>(parsed.truncate_prompt_tokens);
          keep > 0 && request.prompt_ids.size() > keep) {
        request.prompt_ids.erase(request.prompt_ids.begin(),
                                 request.prompt_ids.end() - static_cast<std::ptrdiff_t>(keep));
        sent.clear();  // echo shows the prompt the model read
      }
      if (parsed.echo) {
        const std::vector<int32_t>& ids = request.prompt_ids;  // (empty: the engine refuses the prompt)
        if (sent.empty() && st.engine.model().tokenizer) sent = st.engine.model().tokenizer->decode(ids);
        echo.push_back(std::move(sent));
      }
      if (parsed.echo || parsed.prompt_logprobs >= 0) prompt_ids.push_back(request.prompt_ids);
      requests.push_back(std::move(request));
    }
    Admitted out{{}, parsed.stream, parsed.include_usage, requests.front().logprobs >= 0};
    out.continuous_usage = parsed.continuous_usage;
    out.choices_per_prompt = n;
    out.echo = std::move(echo);
    out.prompt_logprobs = parsed.prompt_logprobs;
    out.logprobs_top = std::max(0, requests.front().logprobs);
    out.prompt_ids = std::move(prompt_ids);
    out.prompt_only = parsed.prompt_only;
    out.tool_mode = parsed.tools.mode;
    out.tool_name = parsed.tools.name;
    out.tool_syntax = parsed.tools.syntax;
    out.tool_names = parsed.tools.names;
    out.tool_parallel = parsed.tools.parallel;
    out.tool_held = parsed.tools.held;
    out.tool_arguments_key = parsed.tools.arguments_key;
    out.tool_nine_character_ids = parsed.tools.nine_character_ids;
    {
      const actors::EngineRequest& first = requests.front();
      const bool constrained = first.sampling.grammar || first.sampling.json_object;
      const Tokenizer* tok = st.engine.model().tokenizer.get();
      // (a constrained reply is read apart where its grammar starts after the reasoning; on the
      // WebSocket, a reply to messages, whose grammar holds it whole)
      const bool chat = kind == PromptKind::Chat || (kind == PromptKind::WebSocket && !first.messages.empty());
      out.reasoning = st.config.reasoning && chat && (!constrained || parsed.reasoning_constrained) && tok;
      out.include_reasoning = parsed.include_reasoning;
      if (out.reasoning)  // does the reply start inside the block (the prompt, or a prefill, opened it)?
        out.reasoning_open = parsed.reasoning_constrained ? parsed.reasoning_open
                                                          : reply_opens_reasoning(st.engine, first, first.prompt_ids);
      if (out.reasoning && st.config.reasoning_keeps_special_tokens)
        for (actors::EngineRequest& r : requests) r.skip_special_tokens = false;
    }
    for (int p = 0; p < prompts; ++p) {
      prompt_index = p;
      const uint64_t seed = requests[p].sampling.seed;
      for (int i = 0; i < n; ++i) {
        actors::EngineRequest request = i + 1 < n ? requests[p] : std::move(requests[p]);
        request.sampling.seed = seed + static_cast<uint64_t>(i);
        actors::Admission admission;
        actors::TokenStream stream = st.engine.start(std::move(request), &admission);
        out.choices.push_back(std::shared_ptr<Generation>(
            new Generation(st, std::move(stream), seed + static_cast<uint64_t>(i), admission, received)));
      }
    }
    co_return out;
  } catch (const actors::RequestError& e) {
    throw reject(ApiError(e.code, (prompts > 1 ? "prompt " + std::to_string(prompt_index) + ": " : std::string()) + e.what(),
                          e.field));
  } catch (const std::invalid_argument& e) {
    throw reject(ApiError("invalid_request", e.what()));
  } catch (const std::runtime_error& e) {  // the engine is shutting down
    throw reject(ApiError("shutting_down", e.what()));
  }
}

Generation::Generation(ServerState& st, actors::TokenStream stream, uint64_t seed, const actors::Admission& admission,
                       Clock::time_point received)
    : st_(st),
      stream_(std::move(stream)),
      key_(st.next_key++),
      seed_(seed),
      clamped_(admission.max_tokens_clamped),
      received_(received) {
  stats_.prompt_tokens = admission.prompt_tokens;
  st_.generations.emplace(key_, this);
  ++st_.inflight;
  ++st_.metrics.waiting;
  st_.metrics.prompt_tokens += admission.prompt_tokens;
}

Generation::~Generation() {
  if (!ended_) {  // dropped before its end: the TokenStream cancels it
    ended_ = true;
    st_.metrics.count_request(std::string(finish_reason_name(FinishReason::Cancelled)));
    st_.metrics.e2e.observe(ms_between(received_, Clock::now()) / 1000);
  }
  if (started_)
    --st_.metrics.running;
  else
    --st_.metrics.waiting;
  --st_.inflight;
  st_.generations.erase(key_);
}

void Generation::cancel() {
  if (!ended_) stream_.cancel();
}

boost::asio::awaitable<GenerationUpdate> Generation::next() {
  GenerationUpdate u;
  actors::StreamEvent ev = co_await stream_.next();
  // Tokens of one round arrive together: take whatever else is ready without waiting.
  for (;;) {
    if (ev.terminal()) {
      u.text += ev.text;
      on_end(ev, u);
      break;
    }
    u.text += ev.text;
    if (ev.prompt_logprobs) u.prompt_logprobs = std::move(ev.prompt_logprobs);
    u.tokens.push_back(TokenOut{ev.token, std::move(ev.text), ev.from_draft, std::move(ev.logprobs)});
    std::optional<actors::StreamEvent> more = stream_.try_next();
    if (!more) break;
    ev = std::move(*more);
  }
  if (!u.tokens.empty()) on_tokens(u);
  u.completion_tokens = stats_.completion_tokens;
  co_return u;
}

void Generation::on_tokens(const GenerationUpdate& u) {
  const Clock::time_point now = Clock::now();
  const auto n = static_cast<int64_t>(u.tokens.size());
  Metrics& m = st_.metrics;
  if (!started_) {
    started_ = true;
    --m.waiting;
    ++m.running;
    stats_.ttft_ms = ms_between(received_, now);
    m.ttft.observe(stats_.ttft_ms / 1000);
    // The first token's gap is the TTFT; the rest of this batch came with it.
    for (int64_t i = 1; i < n; ++i) m.inter_token.observe(0);
  } else {
    const double per_token = std::chrono::duration<double>(now - last_token_).count() / n;
    for (int64_t i = 0; i < n; ++i) m.inter_token.observe(per_token);
  }
  last_token_ = now;
  stats_.completion_tokens += n;
  m.generation_tokens += n;
  // A round commits its accepted draft tokens and then one target token (recovered or bonus).
  for (const TokenOut& t : u.tokens) {
    if (t.draft) {
      ++draft_run_;
    } else {
      m.accepted_length.observe(draft_run_);
      draft_run_ = 0;
    }
  }
}

std::string_view openai_finish_reason(FinishReason r) {
  return finish_reason_name(r == FinishReason::Context ? FinishReason::Length : r);
}

void Generation::on_end(const actors::StreamEvent& ev, GenerationUpdate& u) {
  ended_ = true;
  u.terminal = true;
  const Clock::time_point now = Clock::now();
  stats_.elapsed_ms = ms_between(received_, now);
  stats_.rounds = ev.stats.rounds;
  stats_.cached_prompt_tokens = ev.stats.cached_prompt_tokens;
  stats_.drafted = ev.stats.drafted;
  stats_.accepted = ev.stats.accepted;
  stats_.preemptions = ev.stats.preemptions;
  stats_.mean_confidence_threshold = ev.stats.mean_confidence_threshold();
  Metrics& m = st_.metrics;
  if (ev.kind == actors::StreamEvent::Kind::Error) {
    u.error = ev.error.empty() ? "the request failed" : ev.error;
    u.request_fault = ev.request_fault;
    m.count_request("error");
  } else {
    u.finish_reason = ev.finish_reason;
    if (!ev.stop_string.empty()) u.stop_reason = ev.stop_string;
    if (ev.stop_token >= 0) u.stop_reason = ev.stop_token;
    // max_tokens was lowered to fit the context, so running out of it is running out of context.
    if (clamped_ && u.finish_reason == FinishReason::Length) u.finish_reason = FinishReason::Context;
    m.count_request(std::string(finish_reason_name(u.finish_reason)));
  }
  if (draft_run_ > 0) m.accepted_length.observe(draft_run_);  // a round cut short by a stop
  draft_run_ = 0;
  m.draft_tokens += static_cast<uint64_t>(stats_.drafted);
  m.accepted_tokens += static_cast<uint64_t>(stats_.accepted);
  if (stats_.drafted > 0) m.acceptance_rate.observe(static_cast<double>(stats_.accepted) / stats_.drafted);
  if (ev.stats.confidence_rounds > 0) m.confidence_threshold.observe(stats_.mean_confidence_threshold);
  m.e2e.observe(stats_.elapsed_ms / 1000);
}

}  // namespace specula::net
