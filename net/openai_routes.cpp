// POST /v1/chat/completions and /v1/completions: OpenAI's request and response shapes, with
// `stream: true` as server-sent events (docs/protocol.md). A client that goes away cancels.
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <functional>
#include <stdexcept>
#include <utility>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/experimental/channel.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "model/reasoning.h"
#include "model/tool_calls.h"
#include "net/auth.h"
#include "net/generation.h"
#include "net/http_util.h"
#include "net/openai_routes.h"
#include "net/responses.h"

namespace specula::net {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using nlohmann::json;

namespace {

constexpr auto kAwait = asio::as_tuple(asio::use_awaitable);
constexpr std::chrono::seconds kWriteTimeout{30};  // a streaming client that stops reading is dropped

// Waits until the client's side of the socket closes (readable with nothing to read) and then
// cancels the generations. Pipelined bytes of a next request end the watch without cancelling.
asio::awaitable<void> watch_disconnect(asio::ip::tcp::socket& socket, std::vector<std::weak_ptr<Generation>> weak,
                                       std::shared_ptr<bool> finished) {
  auto [ec] = co_await socket.async_wait(asio::ip::tcp::socket::wait_read, kAwait);
  if (ec || *finished) co_return;
  boost::system::error_code ignored;
  if (socket.available(ignored) == 0)
    for (const auto& w : weak)
      if (auto g = w.lock()) g->cancel();
}

// A streamed request's choices read side by side: each choice's updates, tagged with its index,
// through one channel the route reads in arrival order.
using ChoiceChannel = asio::experimental::channel<void(boost::system::error_code, std::size_t, GenerationUpdate)>;

asio::awaitable<void> pump_choice(std::shared_ptr<Generation> g, std::size_t index, std::shared_ptr<ChoiceChannel> ch) {
  for (;;) {
    GenerationUpdate u = co_await g->next();
    const bool terminal = u.terminal;
    auto [ec] = co_await ch->async_send(boost::system::error_code{}, index, std::move(u), kAwait);
    if (ec || terminal) co_return;  // closed: the route is gone, and cancelled what was left
  }
}

std::string openai_finish(FinishReason r) { return std::string(openai_finish_reason(r)); }

json usage_json(const GenerationStats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"total_tokens", s.prompt_tokens + s.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", s.cached_prompt_tokens}}}};
}

json speculation_json(const GenerationStats& s) {
  json j = s.to_json();
  return {{"rounds", j["rounds"]},
          {"drafted", j["drafted"]},
          {"accepted", j["accepted"]},
          {"acceptance_rate", j["acceptance_rate"]},
          {"mean_accepted_length", j["mean_accepted_length"]},
          {"mean_confidence_threshold", j["mean_confidence_threshold"]},
          {"preemptions", j["preemptions"]},
          {"ttft_ms", j["ttft_ms"]},
          {"tokens_per_second", j["tokens_per_second"]}};
}

// vLLM's prompt_logprobs: null for the first prompt token (nothing scores it), then for each token
// an object from token ids (as strings) to {logprob, rank, decoded_token}: the token's own entry
// and its `top` likeliest alternatives (ranks 1..top; the token itself once if it is among them).
// Entries the engine did not send (a one-token prompt has none) are null. As JSON text, each
// entry serialized as it is made (a tree of a long prompt's entries would hold ~0.5 KB an alternative).
std::string prompt_logprobs_json(const Tokenizer& tok, const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& lps,
                                 int top) {
  std::string out = "[";
  for (std::size_t k = 0; k < ids.size(); ++k) {
    if (k > 0) out += ',';
    if (k == 0 || k > lps.size()) {
      out += "null";
      continue;
    }
    const TokenLogprobs& lp = lps[k - 1];
    json entry = json::object();
    const auto put = [&](int32_t id, float logprob, int32_t rank) {
      const std::string key = std::to_string(id);
      if (!entry.contains(key)) entry[key] = {{"logprob", logprob}, {"rank", rank}, {"decoded_token", tok.token_bytes(id)}};
    };
    put(ids[k], lp.logprob, lp.rank);
    for (std::size_t j = 0; j < lp.top.size() && j < static_cast<std::size_t>(top); ++j)
      put(lp.top[j].first, lp.top[j].second, static_cast<int32_t>(j + 1));
    out += dump_json(entry);
  }
  return out + ']';
}

// The log-probabilities of a response's tokens in OpenAI's two shapes (docs/protocol.md): chat's
// `logprobs.content` (a token's text, its bytes, its log-probability and the alternatives) and
// the legacy completions' parallel lists (`tokens`, `token_logprobs`, `top_logprobs` as
// text -> log-probability, `text_offset`: where each token's text starts in the completion, in
// bytes; with echo the prompt's tokens come first, the first with nulls, and the offsets count
// from the prompt's start). Built token by token; a streamed chunk takes the tokens it carries. A whole response's
// (`compact`) is kept as JSON text, each token's entries serialized as they come: as a JSON tree
// it held ~16 KB a token with 20 alternatives (an n = 16 request to the context's end: ~2 GB),
// as text ~1.6 KB.
class LogprobsJson {
 public:
  LogprobsJson(const Tokenizer& tok, bool chat, bool compact = false) : tok_(tok), chat_(chat), compact_(compact) {
    clear();
  }
  void add(const TokenOut& t) {
    if (t.logprobs) add(t.id, &*t.logprobs);
  }
  // echo's prompt tokens (legacy lists only): the first with null entries, token k with lps[k - 1]
  // and its first `top` alternatives (the engine may have listed more for prompt_logprobs).
  void add_prompt(const std::vector<int32_t>& ids, const std::vector<TokenLogprobs>& lps, std::size_t top) {
    for (std::size_t k = 0; k < ids.size(); ++k) {
      if (k == 0 || k > lps.size()) {
        add(ids[k], nullptr);
        continue;
      }
      const TokenLogprobs* lp = &lps[k - 1];
      TokenLogprobs fewer;  // only when the engine listed more alternatives than echo shows
      if (lp->top.size() > top) {
        fewer = {lp->logprob, lp->rank, {lp->top.begin(), lp->top.begin() + static_cast<std::ptrdiff_t>(top)}};
        lp = &fewer;
      }
      add(ids[k], lp);
    }
  }
  bool any() const { return any_; }
  // Appends a compact one's object as JSON text (what dump_json(take()) would give) to `out`, and
  // lets its text go.
  void move_text_to(std::string& out) {
    static constexpr const char* kChat[] = {"{\"content\":["};
    static constexpr const char* kLegacy[] = {"{\"text_offset\":[", "],\"token_logprobs\":[", "],\"tokens\":[",
                                              "],\"top_logprobs\":["};
    const std::size_t lists = chat_ ? 1 : 4;
    for (std::size_t i = 0; i < lists; ++i) {
      out += chat_ ? kChat[i] : kLegacy[i];
      out += lists_[i];
      std::string().swap(lists_[i]);
    }
    out += chat_ ? "],\"refusal\":null}" : "]}";
  }
  // The object so far, and a fresh one for the next chunk (the text offsets run on).
  json take() {
    json out = std::move(j_);
    clear();
    return out;
  }

 private:
  // One token's entries; lp null: the legacy lists' nulls (echo's first prompt token).
  void add(int32_t id, const TokenLogprobs* lp) {
    const std::string text = tok_.token_bytes(id);
    if (chat_) {
      json top = json::array();
      for (const auto& [alt_id, alt_lp] : lp->top) {
        const std::string alt = tok_.token_bytes(alt_id);
        top.push_back({{"token", alt}, {"logprob", alt_lp}, {"bytes", bytes(alt)}});
      }
      json entry{{"token", text}, {"logprob", lp->logprob}, {"bytes", bytes(text)}, {"top_logprobs", std::move(top)}};
      if (compact_)
        append(lists_[0], entry);
      else
        j_["content"].push_back(std::move(entry));
    } else {
      json top = nullptr, logprob = nullptr;
      if (lp) {
        top = json::object();
        for (const auto& [id, alt] : lp->top) top[tok_.token_bytes(id)] = alt;
        logprob = lp->logprob;
      }
      if (compact_) {  // in the order of the keys' names, as a json object dumps them
        append(lists_[0], offset_);
        append(lists_[1], logprob);
        append(lists_[2], text);
        append(lists_[3], top);
      } else {
        j_["tokens"].push_back(text);
        j_["token_logprobs"].push_back(std::move(logprob));
        j_["top_logprobs"].push_back(std::move(top));
        j_["text_offset"].push_back(offset_);
      }
    }
    offset_ += static_cast<int64_t>(text.size());
    any_ = true;
  }
  static void append(std::string& list, const json& value) {
    if (!list.empty()) list += ',';
    list += dump_json(value);
  }
  static json bytes(const std::string& s) {
    json b = json::array();
    for (const unsigned char c : s) b.push_back(static_cast<int>(c));
    return b;
  }
  void clear() {
    any_ = false;
    j_ = chat_ ? json{{"content", json::array()}, {"refusal", nullptr}}
               : json{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()},
                      {"text_offset", json::array()}};
  }
  const Tokenizer& tok_;
  bool chat_;
  bool compact_;
  std::string lists_[4];  // compact: the lists' items as JSON text, in the order text() writes them
  bool any_ = false;
  int64_t offset_ = 0;
  json j_;
};

struct Shape {
  bool chat;
  std::string id;
  std::string model;
  int64_t created;

  json base(const char* object) const {
    return {{"id", id}, {"object", object}, {"created", created}, {"model", model}};
  }
  // One streamed chunk carrying `text` (chat: as delta.content), an optional finish reason and
  // the log-probabilities of its tokens (null when the request asked for none).
  json chunk(std::size_t index, const std::string& text, const json& finish, bool role = false,
             json logprobs = nullptr) const {
    json j = base(chat ? "chat.completion.chunk" : "text_completion");
    json choice = {{"index", index}, {"logprobs", std::move(logprobs)}, {"finish_reason", finish}};
    if (chat) {
      json delta = json::object();
      if (role) delta["role"] = "assistant";
      if (role || !text.empty() || finish.is_null()) delta["content"] = text;
      choice["delta"] = std::move(delta);
    } else {
      choice["text"] = text;
    }
    j["choices"] = json::array({std::move(choice)});
    return j;
  }
};

// A call id of 9 letters and digits, as Mistral's chat templates require of the ids a
// conversation carries back ("Tool call IDs should be alphanumeric strings with length 9!"):
// `id` hashed (FNV-1a) and written in base 62.
std::string nine_character_id(const std::string& id) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  const char* digits = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::string out(9, '0');
  for (char& c : out) {
    c = digits[h % 62];
    h /= 62;
  }
  return out;
}

// A chat reply to a request with tools as OpenAI's message shows it: its content and its calls
// (ids numbered from `id_prefix`), read from the text generated so far; `whole` says its calls
// are complete. Until the reply ends (`final` false) it is what may stream already: in the
// model's own syntax the content that is content whatever follows (tool_reply_streamable) and no
// calls, unless its calls are held to the tools' schemas (read_held_calls); in a held reply (a
// named function, "required", the generic format, held calls in the model's own syntax) the
// calls whose names have closed with their arguments so far, or the "response" so far.
// Each reading extends the one before, so a stream sends what a reading adds.
struct ReplyMessage {
  json message;
  bool whole = false;
};

ReplyMessage tool_message(const Generation::Admitted& a, const std::string& text, const std::string& id_prefix, bool final) {
  json calls = json::array();
  auto call = [&](const std::string& name, std::string arguments) {
    std::string id = id_prefix + std::to_string(calls.size());
    if (a.tool_nine_character_ids) id = nine_character_id(id);  // Mistral's templates refuse any other
    calls.push_back({{"id", std::move(id)},
                     {"type", "function"},
                     {"function", {{"name", name}, {"arguments", std::move(arguments)}}}});
  };
  auto with_calls = [&](json content, bool whole) {
    return ReplyMessage{{{"role", "assistant"}, {"content", std::move(content)}, {"tool_calls", std::move(calls)}}, whole};
  };
  auto text_only = [&](std::string content) { return ReplyMessage{{{"role", "assistant"}, {"content", std::move(content)}}}; };
  if (a.tool_mode == ToolCalls::Mode::Auto && a.tool_held) {
    // Calls held to the tools' schemas: each as far as it is written, the text before the first
    // the content (none where it is only whitespace); no call begun, the text alone.
    PartialToolReply reply = read_held_calls(a.tool_syntax, text, a.tool_arguments_key);
    if (reply.calls.empty()) return text_only(final ? text : text.substr(0, tool_reply_streamable(a.tool_syntax, text)));
    if (!a.tool_parallel) reply.calls.resize(1);  // (the grammar holds it to one)
    for (PartialCall& c : reply.calls) call(c.name, std::move(c.arguments));
    // (Llama 3's calls open the reply: no content)
    const std::string_view before = std::string_view(text).substr(0, a.tool_syntax == ToolSyntax::Hermes ? text.find("<tool_call>") : 0);
    const bool blank = before.find_first_not_of(" \t\n\r") == std::string_view::npos;
    return with_calls(blank ? json() : json(before), reply.closed);
  }
  if (a.tool_mode == ToolCalls::Mode::Auto && a.tool_syntax != ToolSyntax::Generic) {
    // The model's own call syntax (model/tool_calls.h); text beside the calls is the content.
    if (!final) return text_only(text.substr(0, tool_reply_streamable(a.tool_syntax, text)));
    ToolReply reply = parse_tool_reply(a.tool_syntax, text, a.tool_names);
    if (!a.tool_parallel && reply.calls.size() > 1) reply.calls.resize(1);  // parallel_tool_calls: false
    for (ToolCall& c : reply.calls) call(c.name, std::move(c.arguments));
    if (calls.empty()) return text_only(text);
    return with_calls(reply.content ? json(*reply.content) : json(), true);
  }
  const ToolJson shape = a.tool_mode == ToolCalls::Mode::Named      ? ToolJson::Arguments
                         : a.tool_mode == ToolCalls::Mode::Required ? ToolJson::List
                                                                    : ToolJson::Wrapped;
  PartialToolReply reply = read_tool_json(shape, text, a.tool_name);
  for (PartialCall& c : reply.calls) call(c.name, std::move(c.arguments));
  if (!calls.empty()) return with_calls(json(), reply.closed);
  if (reply.content) return text_only(std::move(*reply.content));
  // Nothing of the shape read (a reply cut before its first call's name or its response opened):
  // the text as it is, once it has ended.
  return text_only(final ? text : std::string());
}

// A chat reply read so far as its message (tool_message), its reasoning apart where the server
// reads it (model/reasoning.h): "reasoning_content" beside the content and calls of the answer
// after it (left out with include_reasoning false); while the reasoning has not closed, no
// answer yet, and at the end content null.
ReplyMessage reply_message(const Generation::Admitted& a, const std::string& text, const std::string& id_prefix, bool final) {
  if (!a.reasoning) return tool_message(a, text, id_prefix, final);
  const ReasoningSplit split = split_reasoning(text, a.reasoning_open, final);
  ReplyMessage m;
  // (content null at the end where the reasoning never closed or nothing followed it, as vLLM's)
  if (!split.answering || (final && split.reasoning && split.content.empty()))
    m.message = {{"role", "assistant"}, {"content", final ? json() : json("")}};
  else if (a.tool_mode != ToolCalls::Mode::None)
    m = tool_message(a, std::string(split.content), id_prefix, final);
  else
    m.message = {{"role", "assistant"}, {"content", split.content}};
  if (split.reasoning && a.include_reasoning) m.message["reasoning_content"] = *split.reasoning;
  return m;
}

// What of a reply's reading has gone out on a stream: its content's and reasoning's bytes and
// each call's arguments' bytes (a call once listed).
struct ReplySent {
  std::size_t content = 0, reasoning = 0;
  std::vector<std::size_t> arguments;
};

// Sets `delta`'s content, reasoning_content and tool_calls to what `m` adds to what has gone out
// (`sent`, brought up to date): a call first sent whole (its index, id, type, name and arguments
// so far), then its arguments' new text, as OpenAI's and vLLM's streams send them.
// Puts in `delta[key]` what of `now` has not gone out (`sent` bytes), and counts it out.
void text_delta(std::string_view now, std::size_t& sent, const char* key, json& delta) {
  if (now.size() > sent) delta[key] = std::string(now.substr(sent));
  sent = std::max(sent, now.size());
}

void reply_delta(const json& m, ReplySent& sent, json& delta) {
  for (const auto& [key, at] : {std::pair<const char*, std::size_t*>{"content", &sent.content}, {"reasoning_content", &sent.reasoning}}) {
    const auto v = m.find(key);
    text_delta(v != m.end() && v->is_string() ? std::string_view(v->get_ref<const std::string&>()) : std::string_view(), *at, key, delta);
  }
  json pieces = json::array();
  if (m.contains("tool_calls")) {
    const json& calls = m["tool_calls"];
    for (std::size_t k = 0; k < calls.size(); ++k) {
      const std::string& args = calls[k]["function"]["arguments"].get_ref<const std::string&>();
      if (k >= sent.arguments.size()) {
        json piece = calls[k];
        piece["index"] = k;
        pieces.push_back(std::move(piece));
        sent.arguments.push_back(args.size());
      } else if (args.size() > sent.arguments[k]) {
        pieces.push_back({{"index", k}, {"function", {{"arguments", args.substr(sent.arguments[k])}}}});
        sent.arguments[k] = args.size();
      }
    }
  }
  if (!pieces.empty()) delta["tool_calls"] = std::move(pieces);
}

// What a held reply read so far (`text`; all of it where `final`) adds to what has gone out
// (`sent`), into `pieces` (content, reasoning_content, tool_calls): a reasoning reply without tools
// from the split's views (it may be long, and is read at every update), else from the message the
// chat route reads, which is returned (an empty one for the split).
ReplyMessage held_delta(const Generation::Admitted& a, const std::string& text, const std::string& call_prefix, bool final,
                        ReplySent& sent, json& pieces) {
  if (a.reasoning && a.tool_mode == ToolCalls::Mode::None && !final) {
    const ReasoningSplit split = split_reasoning(text, a.reasoning_open, false);
    text_delta(split.content, sent.content, "content", pieces);
    if (split.reasoning && a.include_reasoning) text_delta(*split.reasoning, sent.reasoning, "reasoning_content", pieces);
    return {};
  }
  ReplyMessage message = reply_message(a, text, call_prefix, final);
  reply_delta(message.message, sent, pieces);
  return message;
}

// A 200 whose chunked body is server-sent events: its head written (`status` set), or false.
asio::awaitable<bool> start_event_stream(beast::tcp_stream& stream, const HttpRequest& req, const CorsAnswer& cors, bool keep_alive,
                                         unsigned& status) {
  http::response<http::empty_body> head{http::status::ok, req.version()};
  head.set(http::field::server, "specula");
  apply_cors(head, cors);
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.keep_alive(keep_alive);
  head.chunked(true);
  http::response_serializer<http::empty_body> serializer{head};
  stream.expires_after(kWriteTimeout);
  if (auto [ec, bytes] = co_await http::async_write_header(stream, serializer, kAwait); ec) co_return false;
  status = head.result_int();
  co_return true;
}

asio::awaitable<bool> write_response(beast::tcp_stream& stream, HttpResponse res, const CorsAnswer& cors, unsigned& status) {
  apply_cors(res, cors);
  stream.expires_after(kWriteTimeout);
  auto [ec, n] = co_await http::async_write(stream, res, kAwait);
  stream.expires_never();
  if (!ec) status = res.result_int();
  co_return !ec && res.keep_alive();
}

}  // namespace

asio::awaitable<bool> serve_openai_completion(ServerState& st, beast::tcp_stream& stream, const HttpRequest& req,
                                              bool chat, unsigned& status, const CorsAnswer& cors) {
  const auto received = Generation::Clock::now();
  const bool keep_alive = req.keep_alive();
  Generation::Admitted admitted;
  std::optional<ApiError> refused;
  try {
    const std::string_view text = req.body();  // (named: no temporaries in a co_await)
    json body = co_await parse_json_text(st, text);
    if (!body.is_object()) throw ApiError("invalid_json", "the request body must be a JSON object");
    const PromptKind kind = chat ? PromptKind::Chat : PromptKind::Completion;
    Generation::Admitted a = co_await Generation::admit(st, std::move(body), kind, received, req.body());
    admitted = std::move(a);
  } catch (const ApiError& e) {
    refused = e;
  } catch (const std::exception& e) {  // a value of a type the reader did not expect: the request's fault
    refused = ApiError("invalid_request", std::string("the request could not be read: ") + e.what());
  }
  if (refused) {
    HttpResponse res = error_response(*refused, keep_alive, req.version());
    co_return co_await write_response(stream, std::move(res), cors, status);
  }
  const std::vector<std::shared_ptr<Generation>>& choices = admitted.choices;
  const std::size_t n = choices.size();

  const Shape shape{chat, std::string(chat ? "chatcmpl-" : "cmpl-") + std::to_string(st.next_key++), st.model_name,
                    static_cast<int64_t>(std::time(nullptr))};
  auto finished = std::make_shared<bool>(false);
  asio::co_spawn(stream.get_executor(),
                 watch_disconnect(stream.socket(), {choices.begin(), choices.end()}, finished), asio::detached);
  struct StopWatch {  // whatever way this returns, the watcher stops and what is left is cancelled
    beast::tcp_stream& stream;
    std::shared_ptr<bool> finished;
    const std::vector<std::shared_ptr<Generation>>& choices;
    std::shared_ptr<ChoiceChannel> channel;
    ~StopWatch() {
      *finished = true;
      boost::system::error_code ignored;
      stream.socket().cancel(ignored);
      if (channel) channel->close();
      for (const auto& g : choices) g->cancel();
    }
  } stop_watch{stream, finished, choices, nullptr};

  const bool want_logprobs = admitted.logprobs;
  std::vector<LogprobsJson> logprobs(n, LogprobsJson(*st.engine.model().tokenizer, chat, !admitted.stream));
  // Tool calls and reasoning: a choice's text is kept and read as its message (reply_message);
  // streamed, what each reading adds goes out as it comes (reply_delta), `sent` keeping what has.
  const bool held = chat && (admitted.tool_mode != ToolCalls::Mode::None || admitted.reasoning);
  std::vector<std::string> held_text(held ? n : 0);
  std::vector<ReplySent> sent(held ? n : 0);
  auto call_prefix = [&](std::size_t i) { return "call_" + shape.id.substr(shape.id.find('-') + 1) + "_" + std::to_string(i) + "_"; };
  // "auto" whose whole calls end the reply ends with "tool_calls", as OpenAI's does; otherwise
  // the generation's reason (a call cut by max_tokens: "length").
  auto finish_of = [&](const GenerationUpdate& u, const ReplyMessage& m) {
    const bool called = admitted.tool_mode == ToolCalls::Mode::Auto && m.whole && m.message.contains("tool_calls");
    return called ? std::string("tool_calls") : openai_finish(u.finish_reason);
  };
  // echo: a choice's first update starts with its prompt's text and, with logprobs, its tokens.
  std::vector<bool> echoed(n, admitted.echo.empty());
  auto echo_into = [&](std::size_t i, GenerationUpdate& u) {
    if (admitted.prompt_only) {  // the one token the engine ran is not shown
      u.text.clear();
      u.tokens.clear();
      if (u.terminal && u.error.empty() && u.finish_reason != FinishReason::Cancelled) u.finish_reason = FinishReason::Length;
    }
    if (echoed[i]) return;
    echoed[i] = true;
    const std::size_t prompt = i / admitted.choices_per_prompt;
    u.text.insert(0, admitted.echo[prompt]);
    if (want_logprobs && u.prompt_logprobs)
      logprobs[i].add_prompt(admitted.prompt_ids[prompt], *u.prompt_logprobs, admitted.logprobs_top);
  };
  auto combined_stats = [&] {
    std::vector<GenerationStats> all;
    for (const auto& g : choices) {
      all.push_back(g->stats());
      if (admitted.prompt_only) all.back().completion_tokens = 0;
    }
    return GenerationStats::combine(all, admitted.choices_per_prompt);
  };
  if (!admitted.stream) {
    // The engine runs the choices side by side; their streams are read one after another. The
    // body is written as text, each choice's log-probabilities spliced in as they were kept
    // (LogprobsJson's compact form), in the keys' order as a json object dumps them.
    std::string body = "{\"choices\":[";
    // prompt_logprobs: each choice's prompt's entries, as the engine sent them with its first update.
    std::vector<std::vector<TokenLogprobs>> prompt_lps(admitted.prompt_logprobs >= 0 ? n : 0);
    const auto prompt_lps_json = [&](std::size_t i) {
      return prompt_logprobs_json(*st.engine.model().tokenizer, admitted.prompt_ids[i / admitted.choices_per_prompt],
                                  prompt_lps[i], admitted.prompt_logprobs);
    };
    for (std::size_t i = 0; i < n; ++i) {
      std::string text;
      GenerationUpdate u;
      do {
        u = co_await choices[i]->next();
        echo_into(i, u);
        if (!prompt_lps.empty() && u.prompt_logprobs) prompt_lps[i] = std::move(*u.prompt_logprobs);
        text += u.text;
        for (const TokenOut& t : u.tokens) logprobs[i].add(t);
      } while (!u.terminal);
      if (!u.error.empty()) {
        HttpResponse res = error_response(ApiError(u.request_fault ? "invalid_request" : "internal", u.error), keep_alive,
                                          req.version());
        co_return co_await write_response(stream, std::move(res), cors, status);
      }
      if (u.finish_reason == FinishReason::Cancelled) co_return false;  // the client went away (or shutdown)
      if (i > 0) body += ',';
      const ReplyMessage message = held   ? reply_message(admitted, text, call_prefix(i), true)
                                  : chat ? ReplyMessage{json{{"role", "assistant"}, {"content", text}}}
                                         : ReplyMessage{};
      body += "{\"finish_reason\":" + dump_json(finish_of(u, message)) + ",\"index\":" + std::to_string(i) +
              ",\"logprobs\":";
      if (want_logprobs)
        logprobs[i].move_text_to(body);
      else
        body += "null";
      if (chat) body += ",\"message\":" + dump_json(message.message);
      // (vLLM's: a completion choice carries its prompt's, a chat response one list for all.)
      if (!chat && !prompt_lps.empty()) body += ",\"prompt_logprobs\":" + prompt_lps_json(i);
      body += ",\"stop_reason\":" + dump_json(u.stop_reason);
      if (!chat) body += ",\"text\":" + dump_json(text);
      body += '}';
    }
    json res = shape.base(chat ? "chat.completion" : "text_completion");
    const GenerationStats all = combined_stats();
    res["usage"] = usage_json(all);
    res["speculation"] = speculation_json(all);
    std::string rest = dump_json(res);  // {"created":...}: "choices" sorts first
    if (chat && !prompt_lps.empty()) rest.insert(rest.size() - 1, ",\"prompt_logprobs\":" + prompt_lps_json(0));
    body += "],";
    body.append(rest, 1);
    HttpResponse ok = make_response(200, std::move(body), "application/json", keep_alive, req.version());
    co_return co_await write_response(stream, std::move(ok), cors, status);
  }

  // --- stream: true ---
  if (!co_await start_event_stream(stream, req, cors, keep_alive, status)) co_return false;
  auto send_event = [&](const std::string& data) -> asio::awaitable<bool> {
    std::string event = "data: " + data + "\n\n";
    stream.expires_after(kWriteTimeout);
    auto [ec, bytes] = co_await asio::async_write(stream, http::make_chunk(asio::buffer(event)), kAwait);
    co_return !ec;
  };
  // include_usage: every chunk has "usage", null, but with vLLM's continuous_usage_stats choice
  // i's counts so far (its prompt and the `generated` tokens until this chunk).
  auto with_usage = [&](json j, std::size_t i, int64_t generated = 0) {
    if (admitted.continuous_usage) {
      const int64_t prompt = choices[i]->stats().prompt_tokens, completion = admitted.prompt_only ? 0 : generated;
      j["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion}};
    } else if (admitted.include_usage) {
      j["usage"] = nullptr;
    }
    return j;
  };
  if (chat)
    for (std::size_t i = 0; i < n; ++i)
      if (!co_await send_event(dump_json(with_usage(shape.chunk(i, "", nullptr, /*role=*/true), i)))) co_return false;
  auto channel = std::make_shared<ChoiceChannel>(stream.get_executor(), n);
  stop_watch.channel = channel;
  for (std::size_t i = 0; i < n; ++i) asio::co_spawn(stream.get_executor(), pump_choice(choices[i], i, channel), asio::detached);
  for (std::size_t open = n; open > 0;) {
    auto [ec, i, u] = co_await channel->async_receive(kAwait);
    if (ec) co_return false;
    echo_into(i, u);
    // A held reply read so far (the whole of it at the end): its content, reasoning and calls
    // that have not gone out yet go in this update's chunk.
    ReplyMessage message;
    json pieces = json::object();
    if (held) {
      held_text[i] += u.text;
      const bool final = u.terminal && u.error.empty();
      message = held_delta(admitted, held_text[i], call_prefix(i), final, sent[i], pieces);
      u.text = pieces.value("content", std::string());
      pieces.erase("content");
    }
    // A chunk for the update's text, and with log-probabilities asked for, for its tokens even
    // where their text is still held back (mid-character, or maybe a stop string).
    for (const TokenOut& t : u.tokens) logprobs[i].add(t);
    if (!u.text.empty() || logprobs[i].any() || !pieces.empty()) {
      json lp = want_logprobs && logprobs[i].any() ? logprobs[i].take() : json(nullptr);
      json chunk = with_usage(shape.chunk(i, u.text, nullptr, false, std::move(lp)), i, u.completion_tokens);
      if (!pieces.empty()) {  // reasoning_content, tool_calls
        json& delta = chunk["choices"][0]["delta"];
        if (u.text.empty()) delta.erase("content");
        delta.update(pieces);
      }
      if (!co_await send_event(dump_json(chunk))) co_return false;
    }
    if (!u.terminal) continue;
    --open;
    if (!u.error.empty()) {  // the request fails as a whole: the other choices are cancelled on return
      if (!co_await send_event(dump_json(openai_error(ApiError(u.request_fault ? "invalid_request" : "internal", u.error))))) co_return false;
      break;
    }
    json last = with_usage(shape.chunk(i, "", finish_of(u, message)), i, u.completion_tokens);
    last["choices"][0]["stop_reason"] = u.stop_reason;
    last["speculation"] = speculation_json(choices[i]->stats());
    if (!co_await send_event(dump_json(last))) co_return false;
    if (open == 0 && admitted.include_usage) {
      json usage = shape.base(chat ? "chat.completion.chunk" : "text_completion");
      usage["choices"] = json::array();
      usage["usage"] = usage_json(combined_stats());
      if (!co_await send_event(dump_json(usage))) co_return false;
    }
  }
  if (!co_await send_event("[DONE]")) co_return false;
  auto [ec, bytes] = co_await asio::async_write(stream, http::make_chunk_last(), kAwait);
  stream.expires_never();
  co_return !ec && keep_alive;
}

namespace {

// A response id no other client can guess (GET /v1/responses/{id} reads a kept one back): 128
// bits from the kernel's random source.
std::string new_response_id() {
  unsigned char bytes[16];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    const ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(std::string("getrandom failed: ") + std::strerror(errno));
    got += static_cast<std::size_t>(n);
  }
  std::string id = "resp_";
  for (const unsigned char b : bytes) {
    id += "0123456789abcdef"[b >> 4];
    id += "0123456789abcdef"[b & 15];
  }
  return id;
}

std::string lenient_dump(const auto& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }
json plain(const nlohmann::ordered_json& v) { return json::parse(lenient_dump(v)); }
// A float setting as it was written (0.95, not 0.949999988079071).
double tidy(float x) { return std::stod(std::to_string(x)); }
nlohmann::ordered_json plain_ordered(const json& v) { return nlohmann::ordered_json::parse(lenient_dump(v)); }

// The Responses API's response object: the request's settings as it echoes them, the output
// items, the usage (null until the end of a stream) and the status.
struct ResponseShape {
  std::string id;
  int64_t created;
  std::string model;
  const nlohmann::ordered_json& request;
  const RequestDefaults& defaults;

  json object(const char* status, json output, json usage, json incomplete = nullptr, json error = nullptr) const {
    auto echo = [&](const char* key, json fallback) {
      const auto it = request.find(key);
      return it == request.end() || it->is_null() ? fallback : plain(*it);
    };
    return {{"id", id},
            {"object", "response"},
            {"created_at", created},
            {"status", status},
            {"background", echo("background", false)},
            {"error", std::move(error)},
            {"incomplete_details", std::move(incomplete)},
            {"instructions", echo("instructions", nullptr)},
            {"max_output_tokens", echo("max_output_tokens", nullptr)},
            {"metadata", echo("metadata", json::object())},
            {"model", model},
            {"output", std::move(output)},
            {"parallel_tool_calls", echo("parallel_tool_calls", true)},
            {"previous_response_id", echo("previous_response_id", nullptr)},
            {"reasoning", echo("reasoning", nullptr)},
            {"store", echo("store", true)},
            {"temperature", echo("temperature", tidy(defaults.temperature))},
            {"text", echo("text", {{"format", {{"type", "text"}}}})},
            {"tool_choice", echo("tool_choice", "auto")},
            {"tools", echo("tools", json::array())},
            {"top_logprobs", echo("top_logprobs", 0)},
            {"top_p", echo("top_p", tidy(defaults.top_p))},
            {"truncation", echo("truncation", "disabled")},
            {"usage", std::move(usage)},
            {"user", echo("user", nullptr)}};
  }
};

json response_usage(const GenerationStats& s, int64_t reasoning_tokens) {
  return {{"input_tokens", s.prompt_tokens},
          {"input_tokens_details", {{"cached_tokens", s.cached_prompt_tokens}}},
          {"output_tokens", s.completion_tokens},
          {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens}}},
          {"total_tokens", s.prompt_tokens + s.completion_tokens}};
}

// Server-sent events of a streamed response, gathered into `out` and written once per update:
// each output item opened when its first text comes (reasoning, then the message, then each
// call), its deltas, and its done events once the next one opens or the reply ends. With
// `logprobs` (include's message.output_text.logprobs), the tokens' entries given to logprobs()
// go out with the message's next text delta, and all those given before it closes with its done
// events.
class ResponseEvents {
 public:
  ResponseEvents(std::string id, bool logprobs) : suffix_(id.substr(5)), logprobs_(logprobs) {}
  std::string out;

  // Log-probability entries of tokens that came since the last text delta.
  void logprobs(json entries) {
    for (json& e : entries) pending_.push_back(std::move(e));
  }

  void emit(const char* type, json payload) {
    payload["type"] = type;
    payload["sequence_number"] = sequence_++;
    out += "event: ";
    out += type;
    out += "\ndata: ";
    out += dump_json(payload);
    out += "\n\n";
  }
  void reasoning(const std::string& delta) {
    open_item(reasoning_, Kind::Reasoning);
    reasoning_.text += delta;
    emit("response.reasoning_text.delta",
         {{"item_id", reasoning_.id}, {"output_index", reasoning_.index}, {"content_index", 0}, {"delta", delta}});
  }
  void content(const std::string& delta) {
    close(reasoning_);
    open_item(message_, Kind::Message);
    message_.text += delta;
    for (const json& e : pending_) message_.logprobs.push_back(e);
    emit("response.output_text.delta", {{"item_id", message_.id},
                                        {"output_index", message_.index},
                                        {"content_index", 0},
                                        {"delta", delta},
                                        {"logprobs", std::exchange(pending_, json::array())}});
  }
  // A chat delta's tool_calls pieces (reply_delta's): a new call opens its item, its arguments so
  // far its first delta; a known one's piece is more of its arguments.
  void calls(const json& pieces) {
    close(reasoning_);
    close(message_);
    for (const json& piece : pieces) {
      const std::size_t k = piece["index"].get<std::size_t>();
      if (k >= calls_.size()) {
        for (Item& before : calls_) close(before);  // one item at a time, as OpenAI's stream
        Item& c = calls_.emplace_back();
        c.call_id = piece["id"].get<std::string>();
        c.name = piece["function"]["name"].get<std::string>();
        open_item(c, Kind::Call, k);
      }
      Item& c = calls_[k];
      const std::string delta = piece["function"].value("arguments", std::string());
      if (delta.empty() || c.done) continue;
      c.text += delta;
      emit("response.function_call_arguments.delta", {{"item_id", c.id}, {"output_index", c.index}, {"delta", delta}});
    }
  }
  // The reply's end: every item of the final output opened (with its whole text where it never
  // streamed) and closed with the final texts, in the output's order; then any other opened item
  // closed (its item status `status`).
  void finish(const json& output, const char* status) {
    status_ = status;
    for (const json& item : output) {
      const std::string type = item["type"].get<std::string>();
      if (type == "reasoning" || type == "message") {
        const bool reasoned = type == "reasoning";
        Item& it = reasoned ? reasoning_ : message_;
        const std::string text = item["content"][0]["text"].get<std::string>();
        if (it.index < 0) {
          if (!reasoned) close(reasoning_);
          open_item(it, reasoned ? Kind::Reasoning : Kind::Message);
        }
        if (text.size() > it.text.size() && !it.done) {  // (a reading only extends the one before)
          const std::string rest = text.substr(it.text.size());
          if (reasoned) reasoning(rest);
          else content(rest);
        }
        close(it);
      } else {
        const std::string id = item["id"].get<std::string>();
        const std::size_t k = std::stoul(id.substr(id.rfind('_') + 1));
        const std::string arguments = item["arguments"].get<std::string>();
        if (k >= calls_.size()) {
          json piece = {{"index", k}, {"id", item["call_id"]}, {"function", {{"name", item["name"]}, {"arguments", arguments}}}};
          calls(json::array({std::move(piece)}));
        } else if (arguments.size() > calls_[k].text.size() && !calls_[k].done) {
          calls(json::array({{{"index", k}, {"function", {{"arguments", arguments.substr(calls_[k].text.size())}}}}}));
        }
        close(calls_[k]);
      }
    }
    close(reasoning_);
    close(message_);
    for (Item& c : calls_) close(c);
  }
  // A reply that failed: the items opened close as "incomplete"; returns them, in order.
  json fail() {
    status_ = "incomplete";
    std::vector<Item*> opened;
    for (Item* it : {&reasoning_, &message_})
      if (it->index >= 0) opened.push_back(it);
    for (Item& c : calls_) opened.push_back(&c);
    std::sort(opened.begin(), opened.end(), [](const Item* a, const Item* b) { return a->index < b->index; });
    json out = json::array();
    for (Item* it : opened) {
      close(*it);
      out.push_back(item_json(*it, status_));
    }
    return out;
  }

 private:
  enum class Kind { Reasoning, Message, Call };
  struct Item {
    Kind kind = Kind::Message;
    std::string id, text, call_id, name;
    int index = -1;  // output_index; -1: not opened
    bool done = false;
    json logprobs = json::array();  // a message's, with include's logprobs
  };

  json item_json(const Item& it, const char* status) const {
    switch (it.kind) {
      case Kind::Reasoning:
        return {{"type", "reasoning"}, {"id", it.id}, {"summary", json::array()}, {"status", status},
                {"content", it.done ? json::array({{{"type", "reasoning_text"}, {"text", it.text}}}) : json::array()}};
      case Kind::Message:
        return {{"type", "message"}, {"id", it.id}, {"status", status}, {"role", "assistant"},
                {"content", it.done ? json::array({part(it)}) : json::array()}};
      case Kind::Call:
        return {{"type", "function_call"}, {"id", it.id}, {"call_id", it.call_id}, {"name", it.name},
                {"arguments", it.done ? it.text : std::string()}, {"status", status}};
    }
    return nullptr;
  }
  json part(const Item& it) const {
    if (it.kind == Kind::Reasoning) return {{"type", "reasoning_text"}, {"text", it.text}};
    json p = {{"type", "output_text"}, {"text", it.text}, {"annotations", json::array()}};
    if (logprobs_) p["logprobs"] = it.logprobs;
    return p;
  }
  void open_item(Item& it, Kind kind, std::size_t k = 0) {
    if (it.index >= 0) return;
    it.kind = kind;
    it.id = kind == Kind::Reasoning ? "rs_" + suffix_ : kind == Kind::Message ? "msg_" + suffix_ : "fc_" + suffix_ + "_" + std::to_string(k);
    it.index = next_index_++;
    emit("response.output_item.added", {{"output_index", it.index}, {"item", item_json(it, "in_progress")}});
    if (kind != Kind::Call)
      emit("response.content_part.added",
           {{"item_id", it.id}, {"output_index", it.index}, {"content_index", 0}, {"part", part(it)}});
  }
  void close(Item& it) {
    if (it.index < 0 || it.done) return;
    it.done = true;
    if (it.kind == Kind::Message)  // (tokens whose text never came: a stop string's start, a call's)
      for (json& e : std::exchange(pending_, json::array())) it.logprobs.push_back(std::move(e));
    if (it.kind == Kind::Reasoning)
      emit("response.reasoning_text.done", {{"item_id", it.id}, {"output_index", it.index}, {"content_index", 0}, {"text", it.text}});
    if (it.kind == Kind::Message)
      emit("response.output_text.done",
           {{"item_id", it.id}, {"output_index", it.index}, {"content_index", 0}, {"text", it.text}, {"logprobs", it.logprobs}});
    if (it.kind == Kind::Call)
      emit("response.function_call_arguments.done",
           {{"item_id", it.id}, {"output_index", it.index}, {"name", it.name}, {"arguments", it.text}});
    else
      emit("response.content_part.done", {{"item_id", it.id}, {"output_index", it.index}, {"content_index", 0}, {"part", part(it)}});
    emit("response.output_item.done", {{"output_index", it.index}, {"item", item_json(it, status_)}});
  }

  std::string suffix_;
  bool logprobs_;
  json pending_ = json::array();  // entries not yet sent with a text delta
  const char* status_ = "completed";  // an item's when it closes (the reply's end may say "incomplete")
  int64_t sequence_ = 0;
  int next_index_ = 0;
  Item reasoning_, message_;
  std::vector<Item> calls_;
};

// A kept conversation with the reply's message after it (its text and calls, as a later
// previous_response_id continues it).
nlohmann::ordered_json conversation_with_reply(nlohmann::ordered_json conversation, const json& message) {
  nlohmann::ordered_json reply = {{"role", "assistant"}, {"content", plain_ordered(message.value("content", json()))}};
  if (message.contains("tool_calls")) reply["tool_calls"] = plain_ordered(message["tool_calls"]);
  conversation.push_back(std::move(reply));
  return conversation;
}

// One response's reply as it comes (its text and log-probabilities gathered) and its end as the
// Responses API shows it (its items, status and usage, kept in the store where asked): the
// request's own, or in background mode the coroutine's that runs on after the request is answered.
struct ResponseRun {
  ResponseRun(ServerState& st_, Generation::Admitted a, nlohmann::ordered_json request_, nlohmann::ordered_json conversation_,
              std::string owner_)
      : st(st_),
        admitted(std::move(a)),
        g(admitted.choices.at(0)),
        request(std::move(request_)),
        conversation(std::move(conversation_)),
        owner(std::move(owner_)),
        shape{new_response_id(), static_cast<int64_t>(std::time(nullptr)), st.model_name, request, st.config.defaults},
        held(admitted.tool_mode != ToolCalls::Mode::None || admitted.reasoning),
        want_logprobs(admitted.logprobs),
        call_prefix("call_" + shape.id.substr(5) + "_"),
        step_logprobs(*st.engine.model().tokenizer, /*chat=*/true) {
    const auto store_field = request.find("store");  // (a boolean or null: chat_request_of_response)
    store = store_field == request.end() || !store_field->is_boolean() || store_field->get<bool>();
    const auto bg = request.find("background");
    background = bg != request.end() && bg->is_boolean() && bg->get<bool>();
  }
  ResponseRun(const ResponseRun&) = delete;
  ResponseRun& operator=(const ResponseRun&) = delete;

  ServerState& st;
  Generation::Admitted admitted;
  std::shared_ptr<Generation> g;
  nlohmann::ordered_json request, conversation;
  std::string owner;
  ResponseShape shape;  // (reads `request`)
  bool held, want_logprobs, store = true, background = false;
  std::string call_prefix, text;
  json all_logprobs = json::array();  // include's logprobs: every token's entry (the chat route's logprobs.content)
  LogprobsJson step_logprobs;
  std::function<void()> on_start;  // run by to_end with the first update (a background response's status)

  // The entries of an update's tokens, also gathered for the end.
  json take_logprobs(const GenerationUpdate& u) {
    for (const TokenOut& t : u.tokens) step_logprobs.add(t);
    json entries = std::move(step_logprobs.take()["content"]);
    for (const json& e : entries) all_logprobs.push_back(e);
    return entries;
  }
  // The reply's message as the chat route reads it at its end.
  json final_message() const {
    return held ? reply_message(admitted, text, call_prefix, true).message : json{{"role", "assistant"}, {"content", text}};
  }
  // The reply to its end, its text and log-probabilities gathered; its last update.
  asio::awaitable<GenerationUpdate> to_end() {
    GenerationUpdate u;
    do {
      u = co_await g->next();
      if (on_start) std::exchange(on_start, {})();
      text += u.text;
      if (want_logprobs) take_logprobs(u);
    } while (!u.terminal);
    co_return u;
  }
  // The response of a reply that ended well (`u`, its last update): its items, its status
  // ("incomplete" for one cut short), its usage; kept where asked.
  json completed(const GenerationUpdate& u) {
    const json message = final_message();
    const bool cut = u.finish_reason == FinishReason::Length || u.finish_reason == FinishReason::Context;
    json output = response_output_items(message, shape.id, cut ? "incomplete" : "completed");
    if (want_logprobs)
      for (json& item : output)
        if (item["type"] == "message") item["content"][0]["logprobs"] = all_logprobs;
    int64_t reasoning_tokens = 0;
    if (message.contains("reasoning_content") && message["reasoning_content"].is_string())
      reasoning_tokens = static_cast<int64_t>(st.engine.model().tokenizer->encode(message["reasoning_content"].get<std::string>(), false).size());
    json response = shape.object(cut ? "incomplete" : "completed", output, response_usage(g->stats(), reasoning_tokens),
                                 cut ? json{{"reason", "max_output_tokens"}} : json());
    response["speculation"] = speculation_json(g->stats());
    if (store) {
      ResponseStore::Stored kept;
      kept.conversation = conversation_with_reply(conversation, message);
      kept.response = response;
      kept.owner = owner;
      st.responses.put(shape.id, std::move(kept));
    }
    return response;
  }
  // A failed reply's error object, in the Responses API's codes.
  static json error_of(const GenerationUpdate& u) {
    return {{"code", u.request_fault ? "invalid_prompt" : "server_error"}, {"message", u.error}};
  }
};

// A background response's entry at its end, in place of the running one: `response`, or where
// that is too large to keep (or the end could not be written), a small failed response saying so.
void keep_background_end(ResponseRun& run, json response) {
  ServerState& st = run.st;
  const std::string& id = run.shape.id;
  const ResponseStore::Stored* running = st.responses.find(id, run.owner);
  if (!running) return;  // deleted while it ran
  ResponseStore::Stored end;
  const bool replied = response["status"] == "completed" || response["status"] == "incomplete";  // (its reply joins it)
  end.conversation = replied ? conversation_with_reply(running->conversation, run.final_message()) : running->conversation;
  end.response = std::move(response);
  end.owner = run.owner;
  const json usage = end.response["usage"];
  if (st.responses.put(id, std::move(end))) return;
  ResponseStore::Stored* still = st.responses.find_mutable(id, run.owner);  // (put changed nothing)
  still->response = run.shape.object(
      "failed", json::array(), usage, nullptr,
      {{"code", "server_error"},
       {"message", "the response is too large to keep (over " + std::to_string(ResponseStore::kMaxEntryBytes >> 20) +
                       " MiB of JSON with its conversation): ask without background to receive it"}});
  still->response["speculation"] = speculation_json(run.g->stats());
  still->pinned = false;
}

// A background response (`background: true`) run to its end after the request was answered: its
// kept entry goes "in_progress" with the first update and becomes the finished response, or
// "failed" with its error, or "cancelled" (POST .../cancel, DELETE, or shutdown) with the items so
// far; a response deleted while it ran is not kept again. Its entry is pinned while it runs (not
// pushed out by newer ones) and unpinned at its end, whatever way it ends.
asio::awaitable<void> run_in_background(std::shared_ptr<ResponseRun> run) {
  ServerState& st = run->st;
  const std::string id = run->shape.id;
  run->on_start = [&st, id, owner = run->owner] {
    if (ResponseStore::Stored* kept = st.responses.find_mutable(id, owner); kept && kept->response["status"] == "queued")
      kept->response["status"] = "in_progress";
  };
  const GenerationUpdate u = co_await run->to_end();
  st.background_runs.erase(id);
  try {
    const ResponseStore::Stored* kept = st.responses.find(id, run->owner);
    if (!kept) co_return;  // deleted while it ran
    // (a cancel that came as it ended, before this ran, still stands)
    const bool cancelled = kept->response["status"] == "cancelled" || (u.error.empty() && u.finish_reason == FinishReason::Cancelled);
    run->store = false;  // (its end is kept here, in place of the running entry)
    if (!cancelled && u.error.empty()) {
      keep_background_end(*run, run->completed(u));
      co_return;
    }
    const bool failed = !cancelled;
    json output = response_output_items(run->final_message(), id, "incomplete");
    if (run->want_logprobs)
      for (json& item : output)
        if (item["type"] == "message") item["content"][0]["logprobs"] = run->all_logprobs;
    json response = run->shape.object(failed ? "failed" : "cancelled", output, response_usage(run->g->stats(), 0), nullptr,
                                      failed ? ResponseRun::error_of(u) : json());
    response["speculation"] = speculation_json(run->g->stats());
    keep_background_end(*run, std::move(response));
  } catch (const std::exception& e) {  // (its end could not be written: it is not left running for ever)
    if (ResponseStore::Stored* kept = st.responses.find_mutable(id, run->owner)) {
      kept->response["status"] = "failed";
      kept->response["error"] = {{"code", "server_error"}, {"message", std::string("the response's end could not be kept: ") + e.what()}};
      kept->pinned = false;
    }
  }
}

}  // namespace

asio::awaitable<bool> serve_openai_response(ServerState& st, beast::tcp_stream& stream, const HttpRequest& req, unsigned& status,
                                            const CorsAnswer& cors) {
  const auto received = Generation::Clock::now();
  const bool keep_alive = req.keep_alive();
  Generation::Admitted admitted;
  std::optional<ApiError> refused;
  nlohmann::ordered_json request, conversation;
  const std::string owner = key_owner(st.config.access, req);
  try {
    // Through the routes' own reader first (its depth and width limits; a long body on the
    // preparation thread), then again keeping the members' order.
    const std::string_view text = req.body();
    const json checked = co_await parse_json_text(st, text);
    if (!checked.is_object()) throw ApiError("invalid_json", "the request body must be a JSON object");
    if (st.prep && text.size() > kInlineJsonBytes) {  // (as parse_json_text: a long body off the I/O thread)
      auto copy = std::make_shared<const std::string>(text);
      auto parse = [copy] { return nlohmann::ordered_json::parse(*copy); };
      nlohmann::ordered_json parsed = co_await on_prep_thread(st, std::move(parse));
      request = std::move(parsed);
    } else {
      request = nlohmann::ordered_json::parse(text);
    }
    const nlohmann::ordered_json chat = chat_request_of_response(request, st.responses, owner, st.engine.context_length(),
                                                                 st.config.defaults.max_tokens, conversation);
    // truncation "auto" (and no truncate_prompt_tokens of the client's): whole turns first.
    const auto truncation = request.find("truncation");
    const auto own = request.find("truncate_prompt_tokens");
    const bool fit = truncation != request.end() && *truncation == "auto" && (own == request.end() || own->is_null());
    const int64_t fit_turns = fit ? chat["truncate_prompt_tokens"].get<int64_t>() : 0;
    const std::string chat_text = chat.dump();
    json body = json::parse(chat_text);
    Generation::Admitted a = co_await Generation::admit(st, std::move(body), PromptKind::Chat, received, chat_text, fit_turns);
    admitted = std::move(a);
  } catch (const ApiError& e) {
    refused = e;
    // The chat route's names for what the request spelled its own way.
    for (const auto& [chat, own] : {std::pair<const char*, const char*>{"max_tokens", "max_output_tokens"}, {"messages", "input"},
                                    {"response_format", "text.format"}})
      if (refused->param == chat) refused->param = own;
  } catch (const std::exception& e) {  // a value of a type the reader did not expect: the request's fault
    refused = ApiError("invalid_request", std::string("the request could not be read: ") + e.what());
  }
  if (refused) {
    HttpResponse res = error_response(*refused, keep_alive, req.version());
    co_return co_await write_response(stream, std::move(res), cors, status);
  }
  const auto run = std::make_shared<ResponseRun>(st, std::move(admitted), std::move(request), std::move(conversation), owner);
  const std::shared_ptr<Generation>& g = run->g;
  const ResponseShape& shape = run->shape;
  if (run->background) {  // answered at once; the reply runs on, read back with GET, stopped with cancel
    ResponseStore::Stored kept;
    kept.conversation = run->conversation;  // (the input: a later request may not continue it until it ends)
    kept.response = shape.object("queued", json::array(), nullptr);
    kept.owner = owner;
    kept.pinned = true;  // (kept while it runs, whatever comes after it)
    const json queued = kept.response;
    if (!st.responses.put(shape.id, std::move(kept))) {
      g->cancel();
      HttpResponse res = error_response(ApiError("invalid_request", "the conversation is too large to keep, and a background response "
                                                                    "must be kept to be read: ask without background", "background"),
                                        keep_alive, req.version());
      co_return co_await write_response(stream, std::move(res), cors, status);
    }
    st.background_runs[shape.id] = g;
    asio::co_spawn(stream.get_executor(), run_in_background(run), asio::detached);
    HttpResponse ok = make_response(200, dump_json(queued), "application/json", keep_alive, req.version());
    co_return co_await write_response(stream, std::move(ok), cors, status);
  }
  auto finished = std::make_shared<bool>(false);
  asio::co_spawn(stream.get_executor(), watch_disconnect(stream.socket(), {g}, finished), asio::detached);
  struct StopWatch {  // whatever way this returns, the watcher stops and the generation is cancelled
    beast::tcp_stream& stream;
    std::shared_ptr<bool> finished;
    std::shared_ptr<Generation> g;
    ~StopWatch() {
      *finished = true;
      boost::system::error_code ignored;
      stream.socket().cancel(ignored);
      g->cancel();
    }
  } stop_watch{stream, finished, g};

  if (!run->admitted.stream) {
    const GenerationUpdate u = co_await run->to_end();
    if (!u.error.empty()) {
      HttpResponse res = error_response(ApiError(u.request_fault ? "invalid_request" : "internal", u.error), keep_alive, req.version());
      co_return co_await write_response(stream, std::move(res), cors, status);
    }
    if (u.finish_reason == FinishReason::Cancelled) co_return false;  // the client went away (or shutdown)
    const json response = run->completed(u);
    HttpResponse ok = make_response(200, dump_json(response), "application/json", keep_alive, req.version());
    co_return co_await write_response(stream, std::move(ok), cors, status);
  }

  if (!co_await start_event_stream(stream, req, cors, keep_alive, status)) co_return false;
  ResponseEvents events(shape.id, run->want_logprobs);
  auto flush = [&]() -> asio::awaitable<bool> {
    if (events.out.empty()) co_return true;
    stream.expires_after(kWriteTimeout);
    auto [ec, bytes] = co_await asio::async_write(stream, http::make_chunk(asio::buffer(events.out)), kAwait);
    events.out.clear();
    co_return !ec;
  };
  events.emit("response.created", {{"response", shape.object("in_progress", json::array(), nullptr)}});
  events.emit("response.in_progress", {{"response", shape.object("in_progress", json::array(), nullptr)}});
  if (!co_await flush()) co_return false;
  ReplySent sent;
  for (;;) {
    GenerationUpdate u = co_await g->next();
    run->text += u.text;
    if (run->want_logprobs) events.logprobs(run->take_logprobs(u));
    if (u.terminal && u.finish_reason == FinishReason::Cancelled && u.error.empty()) co_return false;
    if (u.terminal && u.error.empty()) {
      const json response = run->completed(u);
      events.finish(response["output"], response["status"] == "incomplete" ? "incomplete" : "completed");
      events.emit(response["status"] == "incomplete" ? "response.incomplete" : "response.completed", {{"response", response}});
      break;
    }
    // What this update adds goes out (a failing update's text too, before its error).
    json pieces = json::object();
    if (run->held) {
      held_delta(run->admitted, run->text, run->call_prefix, /*final=*/false, sent, pieces);
    } else if (!u.text.empty()) {
      pieces["content"] = u.text;
    }
    if (pieces.contains("reasoning_content")) events.reasoning(pieces["reasoning_content"].get<std::string>());
    if (pieces.contains("content")) events.content(pieces["content"].get<std::string>());
    if (pieces.contains("tool_calls")) events.calls(pieces["tool_calls"]);
    if (u.terminal) {  // an error: the items streamed close as incomplete, and the response fails
      const json output = events.fail();
      const json error = ResponseRun::error_of(u);
      events.emit("error", {{"code", error["code"]}, {"message", u.error}, {"param", nullptr}});
      events.emit("response.failed", {{"response", shape.object("failed", output, response_usage(g->stats(), 0), nullptr, error)}});
      break;
    }
    if (!co_await flush()) co_return false;
  }
  if (!co_await flush()) co_return false;
  auto [ec, bytes] = co_await asio::async_write(stream, http::make_chunk_last(), kAwait);
  stream.expires_never();
  co_return !ec && keep_alive;
}

}  // namespace specula::net
