// The engine: loads the target, builds the four actors on one io_context and wires them.
#include "actors/engine.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <thread>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "actors/draft_actor.h"
#include "actors/sampler.h"
#include "actors/scheduler.h"
#include "actors/trace.h"
#include "actors/verifier.h"
#include "gpu/llama.h"
#include "spec/eagle_drafter.h"
#include "spec/grammar.h"
#include "spec/json_mode.h"
#include "spec/generate.h"
#include "spec/make_drafter.h"

namespace specula::actors {

// The event channels of requests whose streams may still be read, so that closing the engine can
// end them (a reader then gets an Error, never waits for ever), and the flag that tells a stream
// outliving its engine not to call back into it.
struct StreamRegistry {
  std::mutex mu;
  bool closed = false;
  std::unordered_map<RequestId, std::weak_ptr<EventChannel>> open;

  void forget(RequestId id) {
    std::lock_guard lock(mu);
    open.erase(id);
  }
  // Calls engine->cancel(id) unless the engine has closed.
  void cancel(Engine* engine, RequestId id) {
    std::lock_guard lock(mu);
    if (!closed) engine->cancel(id);
  }
};

struct Engine::Impl {
  EngineConfig cfg;
  std::unique_ptr<Ops> ops;
  std::shared_ptr<const LoadedModel> files;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Ops> draft_ops;            // pipelining only: the draft's own device and
  std::unique_ptr<LlamaModel> draft_model;   // target instance, used concurrently with the verifier's
  bool pipelined = false;                    // cfg.pipeline where the streams can overlap
  std::string why_not_pipelined;             // cfg.pipeline declined: the cores the streams would share
  ChatTemplate chat;  // the model's, or EngineConfig::chat_template
  std::vector<int32_t> default_stop;
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work = boost::asio::make_work_guard(io);
  std::unique_ptr<Trace> trace;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<DraftActor> draft;
  std::unique_ptr<Verifier> verifier;
  std::unique_ptr<Sampler> sampler;
  std::vector<std::thread> threads;
  std::atomic<RequestId> next_id{1};
  std::shared_ptr<StreamRegistry> streams = std::make_shared<StreamRegistry>();
  std::once_flag json_once;
  std::shared_ptr<const JsonVocabulary> json;
  std::once_flag trie_once;
  std::shared_ptr<const TokenTrie> trie;
  // The grammars compiled lately, by their text, most recent last: a schema sent again finds its
  // matcher with the masks it has cached.
  std::mutex grammars_mu;
  std::vector<std::pair<std::string, std::shared_ptr<const GrammarMatcher>>> grammars;
};

Engine::Engine(EngineConfig config) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.cfg = std::move(config);
  m.cfg.draft.validate();
  if (m.cfg.max_batch < 1) throw std::invalid_argument("max_batch must be >= 1, got " + std::to_string(m.cfg.max_batch));
  if (m.cfg.io_threads < 1) throw std::invalid_argument("io_threads must be >= 1, got " + std::to_string(m.cfg.io_threads));
  if (m.cfg.ubatch < 1) throw std::invalid_argument("ubatch must be >= 1, got " + std::to_string(m.cfg.ubatch));
  if (m.cfg.kv_tokens < 16)
    throw std::invalid_argument("kv_tokens must be >= 16, got " + std::to_string(m.cfg.kv_tokens));
  const auto device = [&](const DeviceOptions& o) { return m.cfg.device_factory ? m.cfg.device_factory(o) : make_device(o); };
  m.ops = device(DeviceOptions{m.cfg.device, m.cfg.threads, ""});
  m.files = m.cfg.target_model ? m.cfg.target_model : std::make_shared<const LoadedModel>(load_model(m.cfg.target));
  m.model = std::make_unique<LlamaModel>(m.files->weights, *m.ops);
  m.model->set_max_forward_rows(m.cfg.ubatch);
  m.chat = chat_template_for(*m.files, m.cfg.chat_template);
  m.chat.set_tool_call_parser(m.cfg.tool_call_parser);
  m.default_stop = default_stop_ids(*m.files, &m.chat);
  LlamaModel* draft_target = m.model.get();
  const int draft_threads = m.cfg.draft_threads > 0 ? m.cfg.draft_threads : m.cfg.threads;
  if (m.cfg.pipeline) {
    const int cpus = usable_cpus();
    m.pipelined = m.cfg.pipeline_on_shared_cores || draft_stream_has_own_compute(m.ops->kind(), m.cfg.threads, draft_threads, cpus);
    if (!m.pipelined)
      m.why_not_pipelined = "the draft and verify streams would share this machine's " + std::to_string(cpus) + " CPUs (" +
                            std::to_string(m.cfg.threads) + " + " + std::to_string(draft_threads) +
                            " threads), where they take turns and overlap costs more than it saves";
  }
  if (m.pipelined) {
    m.draft_ops = device(DeviceOptions{m.cfg.device, draft_threads, ""});
    m.draft_model = std::make_unique<LlamaModel>(m.files->weights, *m.draft_ops);
    m.draft_model->set_max_forward_rows(m.cfg.ubatch);
    draft_target = m.draft_model.get();
  }
  // A bad spelling or draft model fails here, not per request; a draft model is uploaded once,
  // to the device the draft runs on.
  auto drafters = m.cfg.draft_model ? std::make_unique<DrafterFactory>(m.cfg.draft_model, *m.files, *draft_target)
                                    : std::make_unique<DrafterFactory>(m.cfg.drafter, *m.files, *draft_target);

  // A head that reads more of the target than its final hidden state (EAGLE-3's fused features)
  // gets those rows from the verifier's model.
  m.model->set_feature_layers(drafters->target_feature_layers());
  const auto ex = m.io.get_executor();
  m.verifier = std::make_unique<Verifier>(ex, *m.model, m.cfg.kv_tokens, m.cfg.fault_hook, drafters->wants_target_hidden(),
                                          /*device_judge=*/!m.cfg.judge_rule);
  // The head reads the target's rows of the last kEagleCatchUpWindow prompt positions at its first
  // draft: those are computed even where the cache holds them, so it drafts as without the cache.
  const int64_t prefix_tail = drafters->wants_target_hidden() ? kEagleCatchUpWindow : 0;
  m.verifier->set_prefix_cache(m.cfg.prefix_cache, prefix_tail);
  m.verifier->set_prefill_budget(m.cfg.ubatch);
  SchedulerLimits limits{.max_batch = m.cfg.max_batch,
                         .kv_blocks = m.verifier->blocks_total(),
                         .block_tokens = m.verifier->block_tokens(),
                         .max_positions = m.model->config().max_positions,
                         .reserve_max_tokens = m.cfg.reserve_max_tokens,
                         .pipeline = m.pipelined,
                         .load_adaptive = m.cfg.load_adaptive,
                         .prefill_budget = m.cfg.ubatch,
                         .prefix_cache = m.cfg.prefix_cache,
                         .prefix_tail = prefix_tail};
  m.scheduler = std::make_unique<Scheduler>(ex, limits);
  // Each actor drives its device through a stream that device makes: two on the host (worker
  // threads), two CUDA streams on a GPU when pipelining gives the draft its own device.
  m.draft = std::make_unique<DraftActor>(ex, std::move(drafters), draft_target->ops().make_stream("draft"), m.cfg.fault_hook);
  m.sampler = std::make_unique<Sampler>(ex, m.files->tokenizer, m.model->config().max_positions, m.cfg.fault_hook);
  if (m.cfg.judge_rule) m.sampler->set_judge_rule(m.cfg.judge_rule);
  if (!m.cfg.trace_path.empty()) {
    m.trace = std::make_unique<Trace>();
    m.scheduler->set_trace(m.trace.get());
    m.draft->set_trace(m.trace.get());
    m.verifier->set_trace(m.trace.get());
    m.sampler->set_trace(m.trace.get());
  }
  m.scheduler->connect(m.draft->make_sender(), m.verifier->make_sender(), m.sampler->make_sender());
  m.draft->connect(m.scheduler->make_sender());
  m.verifier->connect(m.scheduler->make_sender(), m.sampler->make_sender());
  m.sampler->connect(m.scheduler->make_sender());
  m.scheduler->start();
  m.draft->start();
  m.verifier->start();
  m.sampler->start();
  for (int i = 0; i < m.cfg.io_threads; ++i) m.threads.emplace_back([&m] { m.io.run(); });
}

Engine::~Engine() {
  Impl& m = *impl_;
  std::vector<std::shared_ptr<EventChannel>> unfinished;
  {
    std::lock_guard lock(m.streams->mu);
    m.streams->closed = true;
    for (auto& [id, weak] : m.streams->open)
      if (auto channel = weak.lock()) unfinished.push_back(std::move(channel));
    m.streams->open.clear();
  }
  // The scheduler first, so that no new round starts; then the rest finish what they hold.
  m.scheduler->stop();
  m.scheduler->wait_stopped();
  m.draft->stop();
  m.draft->wait_stopped();
  m.verifier->stop();
  m.verifier->wait_stopped();
  m.sampler->stop();
  m.sampler->wait_stopped();
  m.work.reset();
  m.io.stop();
  for (std::thread& t : m.threads) t.join();
  // Streams still open now read their events so far, then an Error (TokenStream::take).
  for (const auto& channel : unfinished) channel->close();
  if (m.trace) {
    try {
      m.trace->write(m.cfg.trace_path);
    } catch (const std::exception& e) {
      report_to_stderr("engine", e.what());
    }
  }
}

std::string Engine::trace_json() const { return impl_->trace ? impl_->trace->json() : std::string(); }

const EngineConfig& Engine::config() const { return impl_->cfg; }
const LoadedModel& Engine::model() const { return *impl_->files; }
const ChatTemplate& Engine::chat_template() const { return impl_->chat; }
std::string Engine::device_name() const { return impl_->ops->name(); }
bool Engine::pipelined() const { return impl_->pipelined; }
const std::string& Engine::why_not_pipelined() const { return impl_->why_not_pipelined; }

bool Engine::idle() const {
  // The scheduler first (its idle state is published after the releases it sent are counted),
  // then whether the verifier has handled each of those releases, so that an idle engine's
  // kv_blocks_free() already counts every finished request's blocks.
  if (!impl_->scheduler->idle()) return false;
  return impl_->verifier->releases_done() == impl_->scheduler->releases_sent();
}
int64_t Engine::kv_blocks_free() const { return impl_->verifier->blocks_free(); }
int64_t Engine::prefix_queried_tokens() const { return impl_->verifier->prefix_queried_tokens(); }
int64_t Engine::prefix_hit_tokens() const { return impl_->verifier->prefix_hit_tokens(); }
std::uint64_t Engine::preemptions() const { return impl_->scheduler->preemptions(); }
int64_t Engine::preempted_waiting() const { return impl_->scheduler->preempted_waiting(); }
int64_t Engine::kv_blocks_total() const { return impl_->verifier->blocks_total(); }
std::uint64_t Engine::failures() const {
  const Impl& m = *impl_;
  return m.scheduler->failures() + m.draft->failures() + m.verifier->failures() + m.sampler->failures();
}

std::vector<int32_t> Engine::tokenize(const EngineRequest& request) const {
  if (!request.prompt_ids.empty()) {
    const int64_t vocab = impl_->model->config().vocab_size;
    for (int32_t id : request.prompt_ids)
      if (id < 0 || id >= vocab)
        throw RequestError("invalid_request", "prompt",
                           "token " + std::to_string(id) + " is outside the vocabulary of " + std::to_string(vocab));
    return request.prompt_ids;
  }
  const LoadedModel& f = *impl_->files;
  const char* field = request.messages.empty() ? "prompt" : "messages";
  if (!f.tokenizer) throw RequestError("invalid_request", field, "the model has no tokenizer; pass prompt_ids");
  std::string text = request.prompt;
  try {
    if (!request.messages.empty())
      text = impl_->chat.render(request.messages, RenderOptions{request.add_generation_prompt, request.continue_final_message,
                                                                request.tools.get(), request.template_variables.get()});
    else if (request.chat)
      text = impl_->chat.render({ChatMessage{"user", request.prompt}});
  } catch (const std::invalid_argument& e) {
    const bool kwargs = request.template_variables && !request.template_variables->empty();
    throw RequestError("invalid_request", field,
                       std::string(e.what()) + (kwargs ? " (with the request's chat_template_kwargs or documents)" : ""));
  }
  return f.tokenizer->encode(text);
}

std::shared_ptr<const JsonVocabulary> Engine::json_vocabulary() const {
  std::call_once(impl_->json_once, [this] {
    if (impl_->files->tokenizer) impl_->json = std::make_shared<const JsonVocabulary>(*impl_->files->tokenizer);
  });
  return impl_->json;
}

std::shared_ptr<const TokenTrie> Engine::token_trie() const {
  std::call_once(impl_->trie_once, [this] {
    if (impl_->files->tokenizer) impl_->trie = std::make_shared<const TokenTrie>(*impl_->files->tokenizer);
  });
  return impl_->trie;
}

std::shared_ptr<const GrammarMatcher> Engine::grammar(const std::string& gbnf) const {
  constexpr size_t kKept = 16;
  {
    std::lock_guard lock(impl_->grammars_mu);
    auto& g = impl_->grammars;
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i].first == gbnf) {
        // A matcher past its limits is spent: the next request starts a fresh one (those running
        // keep theirs).
        if (g[i].second->full()) {
          g.erase(g.begin() + static_cast<std::ptrdiff_t>(i));
          break;
        }
        std::rotate(g.begin() + static_cast<std::ptrdiff_t>(i), g.begin() + static_cast<std::ptrdiff_t>(i) + 1, g.end());
        return g.back().second;
      }
  }
  auto trie = token_trie();
  if (!trie) throw std::invalid_argument("a grammar needs the model's tokenizer");
  auto matcher = std::make_shared<const GrammarMatcher>(Grammar::parse(gbnf), std::move(trie));
  std::lock_guard lock(impl_->grammars_mu);
  auto& g = impl_->grammars;
  if (g.size() >= kKept) g.erase(g.begin());
  g.emplace_back(gbnf, matcher);
  return matcher;
}

int64_t Engine::context_length() const {
  int64_t ctx = impl_->model->config().max_positions;
  // A request may come to hold prompt + max_tokens + kMaxDraftTokens + 1 positions in whole blocks
  // (reserved at admission, or as it grows), so the scheduler refuses one whose need passes the pool.
  const int64_t blocks = kv_blocks_total();
  if (blocks > 0) {
    const int64_t block_tokens = std::max<int64_t>(1, impl_->cfg.kv_tokens / blocks);
    const int64_t room = blocks * block_tokens - (kMaxDraftTokens + 1);
    if (ctx <= 0 || room < ctx) ctx = room;
  }
  return ctx;
}

TokenStream Engine::start(EngineRequest request, Admission* admission) {
  Impl& m = *impl_;
  auto info = std::make_shared<RequestInfo>();
  SpeculativeRequest& r = info->request;
  const char* prompt_field = request.messages.empty() ? "prompt" : "messages";
  r.prompt = tokenize(request);
  r.max_tokens = request.max_tokens;
  r.sampling = request.sampling;
  r.stop_ids = request.stop_ids ? *request.stop_ids : m.default_stop;
  const int64_t vocab = m.model->config().vocab_size;
  if (request.stop_token_ids.size() > kMaxStopTokenIds)
    throw RequestError("invalid_request", "stop_token_ids",
                       "stop_token_ids has " + std::to_string(request.stop_token_ids.size()) + " ids; the limit is " +
                           std::to_string(kMaxStopTokenIds));
  for (const int32_t id : request.stop_token_ids) {
    if (id < 0 || id >= vocab)
      throw RequestError("invalid_request", "stop_token_ids",
                         "stop_token_ids: " + std::to_string(id) + " is not a token id (0 .. " + std::to_string(vocab - 1) + ")");
    if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) == r.stop_ids.end()) r.stop_ids.push_back(id);
  }
  r.draft = request.draft ? *request.draft : m.cfg.draft;
  r.mode = request.mode;
  auto check = [](const char* field, auto&& validate) {
    try {
      validate();
    } catch (const RequestError&) {
      throw;
    } catch (const std::invalid_argument& e) {
      throw RequestError("invalid_request", field, e.what());
    }
  };
  check("sampling", [&] { r.sampling.validate(m.model->config().vocab_size); });
  check("speculation", [&] { r.draft.validate(); });
  r.draft = r.draft.resolved(r.sampling.greedy());  // the actors read one threshold
  check("stop", [&] { validate_stop_strings(request.stop); });
  if (request.logprobs < -1 || request.logprobs > kMaxTopLogprobs)
    throw RequestError("invalid_request", "top_logprobs",
                       "top_logprobs must be between 0 and " + std::to_string(kMaxTopLogprobs) + ", got " +
                           std::to_string(request.logprobs));
  if (request.prompt_logprobs < -1 || request.prompt_logprobs > kMaxTopLogprobs)
    throw RequestError("invalid_request", "prompt_logprobs",
                       "prompt_logprobs must be between 0 and " + std::to_string(kMaxTopLogprobs) + ", got " +
                           std::to_string(request.prompt_logprobs));
  if (r.max_tokens < 1)
    throw RequestError("invalid_request", "max_tokens", "max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  check("min_tokens", [&] { r.check_min_tokens(); });
  if (r.prompt.empty()) throw RequestError("invalid_request", prompt_field, "the prompt is empty");
  const auto prompt_tokens = static_cast<int64_t>(r.prompt.size());
  const int64_t ctx = context_length();
  if (ctx > 0 && prompt_tokens >= ctx)
    throw RequestError("context_length_exceeded", prompt_field,
                       "this model's maximum context length is " + std::to_string(ctx) + " tokens; the prompt has " +
                           std::to_string(prompt_tokens) + " tokens");
  bool clamped = false;
  if (request.fit_to_context && ctx > 0 && prompt_tokens + r.max_tokens > ctx) {
    r.max_tokens = static_cast<int>(ctx - prompt_tokens);
    clamped = true;
  }
  if (admission) *admission = {prompt_tokens, clamped};
  info->id = m.next_id.fetch_add(1);
  info->events = std::make_shared<EventChannel>();
  info->stop = std::move(request.stop);
  info->include_stop = request.include_stop_str_in_output;
  info->stop_token_ids = std::move(request.stop_token_ids);
  info->skip_special_tokens = request.skip_special_tokens;
  info->speculate = request.speculate && m.cfg.drafter != "none";
  info->logprobs = request.logprobs;
  info->prompt_logprobs = request.prompt_logprobs;
  info->stop_token_logprobs = request.stop_token_logprobs;
  info->priority = request.priority;
  {
    std::lock_guard lock(m.streams->mu);
    if (m.streams->closed) throw std::runtime_error("the engine is shutting down");
    m.streams->open.emplace(info->id, info->events);
  }
  TokenStream stream(this, m.streams, info->id, info->events);
  if (!accepted(m.scheduler->send(SchedulerMessage(SubmitRequest{std::move(info)}))))
    throw std::runtime_error("the engine is shutting down");
  return stream;
}

bool GenerateResult::add(StreamEvent ev) {
  text += ev.text;
  if (ev.prompt_logprobs) prompt_logprobs = std::move(*ev.prompt_logprobs);
  if (ev.kind == StreamEvent::Kind::Token) {
    tokens.push_back(ev.token);
    from_draft.push_back(ev.from_draft);
    if (ev.logprobs) logprobs.push_back(std::move(*ev.logprobs));
    return false;
  }
  finish_reason = ev.finish_reason;
  error = std::move(ev.error);
  stats = std::move(ev.stats);
  return true;
}

GenerateResult Engine::generate_blocking(EngineRequest request) {
  TokenStream stream = start(std::move(request));
  GenerateResult out;
  while (!out.add(stream.next_blocking())) {
  }
  return out;
}

void Engine::cancel(RequestId id) { impl_->scheduler->send(SchedulerMessage(Cancel{id})); }

// --- TokenStream ---------------------------------------------------------------------------

TokenStream::TokenStream(Engine* engine, std::shared_ptr<StreamRegistry> registry, RequestId id,
                         std::shared_ptr<EventChannel> events)
    : engine_(engine), registry_(std::move(registry)), id_(id), events_(std::move(events)) {}

TokenStream::TokenStream(TokenStream&& o) noexcept
    : engine_(std::exchange(o.engine_, nullptr)),
      registry_(std::move(o.registry_)),
      id_(o.id_),
      events_(std::move(o.events_)),
      last_(std::move(o.last_)) {}

TokenStream& TokenStream::operator=(TokenStream&& o) noexcept {
  if (this != &o) {
    release();
    engine_ = std::exchange(o.engine_, nullptr);
    registry_ = std::move(o.registry_);
    id_ = o.id_;
    events_ = std::move(o.events_);
    last_ = std::move(o.last_);
  }
  return *this;
}

TokenStream::~TokenStream() { release(); }

void TokenStream::release() {
  if (!engine_) return;
  if (!last_) registry_->cancel(engine_, id_);
  registry_->forget(id_);
  engine_ = nullptr;
}

void TokenStream::cancel() {
  if (engine_ && !last_) registry_->cancel(engine_, id_);
}

StreamEvent TokenStream::take(std::optional<StreamEvent> ev) {
  if (!ev) {
    StreamEvent err;
    err.kind = StreamEvent::Kind::Error;
    err.error = "the engine shut down before the request finished";
    ev = std::move(err);
  }
  if (ev->terminal()) last_ = *ev;
  return std::move(*ev);
}

boost::asio::awaitable<StreamEvent> TokenStream::next() {
  if (last_) co_return *last_;
  co_return take(co_await events_->receive());
}

std::optional<StreamEvent> TokenStream::try_next() {
  if (last_) return *last_;
  std::optional<StreamEvent> ev = events_->try_receive();
  if (!ev) return std::nullopt;
  return take(std::move(ev));
}

StreamEvent TokenStream::next_blocking() {
  if (last_) return *last_;
  return take(events_->receive_blocking());
}

bool draft_stream_has_own_compute(DeviceKind device, int verify_threads, int draft_threads, int cpus) {
  return device != DeviceKind::Host || verify_threads + draft_threads <= cpus;
}

int cpus_of_quota(const std::string& quota, const std::string& period) {
  char* end = nullptr;
  const double q = std::strtod(quota.c_str(), &end);
  if (end == quota.c_str() || q <= 0) return 0;  // "max", -1 or unreadable: no quota
  const double p = std::strtod(period.c_str(), &end);
  if (end == period.c_str() || p <= 0) return 0;
  return std::max(1, static_cast<int>(std::ceil(q / p)));
}

namespace {

// The first two whitespace-separated words of a file ("" for those it lacks).
std::pair<std::string, std::string> read_two_words(const char* path) {
  std::ifstream in(path);
  std::pair<std::string, std::string> words;
  in >> words.first >> words.second;
  return words;
}

std::string read_word(const char* path) { return read_two_words(path).first; }

}  // namespace

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set)
                                                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // A container's CPU quota (cgroup v2's cpu.max, v1's cfs quota and period) may allow fewer.
  const auto [max, period] = read_two_words("/sys/fs/cgroup/cpu.max");  // "QUOTA PERIOD" or "max PERIOD"
  int quota = cpus_of_quota(max, period);
  if (quota == 0)
    quota = cpus_of_quota(read_word("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), read_word("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
  return quota > 0 ? std::min(cpus, quota) : cpus;
}

}  // namespace specula::actors
