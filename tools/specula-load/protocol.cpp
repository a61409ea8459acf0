#include "tools/specula-load/protocol.h"

#include <optional>

namespace specula::load {

using nlohmann::json;

namespace {

void add_sampling(json& body, const Prompt& p, const LoadOptions& o, int index) {
  if (o.max_tokens) body["max_tokens"] = *o.max_tokens;
  else if (p.max_tokens) body["max_tokens"] = *p.max_tokens;
  if (p.priority) body["priority"] = *p.priority;
  if (o.temperature) body["temperature"] = *o.temperature;
  if (o.top_p) body["top_p"] = *o.top_p;
  if (o.top_k) body["top_k"] = *o.top_k;
  // A per-request seed keeps sampled runs repeatable whatever the interleaving.
  if (o.temperature && *o.temperature > 0) body["seed"] = o.seed + static_cast<unsigned long long>(index);
}

json speculation(const LoadOptions& o) {
  json s = json::object();
  if (o.speculation_k) s["k"] = *o.speculation_k;
  if (o.adaptive) s["adaptive"] = true;
  if (!o.speculation_mode.empty()) s["mode"] = o.speculation_mode;
  return s;
}

double number_or(const json& j, const char* key, double fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : fallback;
}

long long integer_or(const json& j, const char* key, long long fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? static_cast<long long>(it->get<double>()) : fallback;
}

std::string string_or(const json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

void fail(RequestRecord& r, double now_s, std::string kind, std::string message) {
  r.error_kind = std::move(kind);
  r.error_message = std::move(message);
  r.end_s = now_s;
}

// A server message as a JSON object, or nullopt after ending `r` as a protocol error.
std::optional<json> parse_object(const std::string& text, const char* what, double now_s, RequestRecord& r) {
  json m = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (m.is_object()) return m;
  fail(r, now_s, "protocol", std::string(what) + (m.is_discarded() ? " that is not JSON: " : " that is not an object: ") +
                                 text.substr(0, 120));
  return std::nullopt;
}

void add_event(RequestRecord& r, double now_s, int tokens) {
  if (tokens < 1) return;
  if (r.first_token_s < 0) r.first_token_s = now_s;
  r.event_s.push_back(now_s);
  r.event_tokens.push_back(tokens);
}

std::string id_string(const json& id) {
  if (id.is_string()) return id.get<std::string>();
  if (id.is_number_integer()) return std::to_string(id.get<long long>());
  return id.dump();
}

std::string error_code(const json& e) {
  for (const char* key : {"code", "type"}) {
    auto it = e.find(key);
    if (it != e.end() && it->is_string() && !it->get<std::string>().empty()) return it->get<std::string>();
    if (it != e.end() && it->is_number_integer()) return std::to_string(it->get<long long>());
  }
  return "unknown";
}

}  // namespace

std::string request_id(int index) {
  std::string id = "r";
  id += std::to_string(index);
  return id;
}

json ws_generate_message(const Prompt& p, const LoadOptions& o, int index) {
  json m = {{"type", "generate"}, {"id", request_id(index)}};
  if (!p.messages.is_null()) m["messages"] = p.messages;
  else m["prompt"] = p.prompt;
  add_sampling(m, p, o, index);
  if (json s = speculation(o); !s.empty()) m["speculation"] = s;
  return m;
}

json http_request_body(const Prompt& p, const LoadOptions& o, int index) {
  if (o.target.path.find("/responses") != std::string::npos) {  // OpenAI's Responses API
    json b = {{"model", o.model}, {"stream", true}, {"store", false}};
    b["input"] = p.messages.is_null() ? json(p.prompt) : p.messages;
    add_sampling(b, p, o, index);
    if (auto it = b.find("max_tokens"); it != b.end()) {  // (its spelling there)
      b["max_output_tokens"] = *it;
      b.erase("max_tokens");
    }
    if (json s = speculation(o); !s.empty()) b["speculation"] = s;
    return b;
  }
  json b = {{"model", o.model}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  const bool completions = o.target.path.find("/completions") != std::string::npos &&
                           o.target.path.find("/chat/") == std::string::npos;
  if (completions) {
    if (p.messages.is_null()) {
      b["prompt"] = p.prompt;
    } else {
      std::string text;
      for (const auto& m : p.messages) text += m["content"].get<std::string>() + "\n";
      b["prompt"] = text;
    }
  } else {
    b["messages"] = p.messages.is_null() ? json::array({{{"role", "user"}, {"content", p.prompt}}}) : p.messages;
  }
  add_sampling(b, p, o, index);
  if (json s = speculation(o); !s.empty()) b["speculation"] = s;
  return b;
}

Outcome apply_ws_message(const std::string& text, const std::string& id, double now_s, RequestRecord& r) {
  const auto parsed = parse_object(text, "a WebSocket message", now_s, r);
  if (!parsed) return Outcome::Failed;
  const json& m = *parsed;
  if (!m.contains("type") || !m["type"].is_string()) {
    fail(r, now_s, "protocol", "server message without a \"type\": " + text.substr(0, 120));
    return Outcome::Failed;
  }
  const std::string type = m["type"].get<std::string>();
  // An error without an id (connection-level, e.g. overloaded) belongs to the request in flight.
  if (m.contains("id") && !m["id"].is_null() && id_string(m["id"]) != id) return Outcome::Pending;
  if (type == "token") {
    int count = 1;
    if (auto it = m.find("tokens"); it != m.end() && it->is_array()) {
      count = static_cast<int>(it->size());
      for (const auto& t : *it)
        if (t.is_object() && t.contains("draft") && t["draft"].is_boolean() && t["draft"].get<bool>()) ++r.draft_tokens;
    }
    count = static_cast<int>(integer_or(m, "count", count));
    add_event(r, now_s, count);
    return Outcome::Pending;
  }
  if (type == "done") {
    r.end_s = now_s;
    if (auto it = m.find("finish_reason"); it != m.end() && it->is_string()) r.finish_reason = it->get<std::string>();
    const json stats = m.value("stats", json::object());
    if (!stats.is_object()) {
      fail(r, now_s, "protocol", "\"done\" with \"stats\" that is not an object");
      return Outcome::Failed;
    }
    ServerStats& s = r.server;
    s.prompt_tokens = integer_or(stats, "prompt_tokens", -1);
    s.completion_tokens = integer_or(stats, "completion_tokens", -1);
    s.rounds = integer_or(stats, "rounds", -1);
    s.drafted = integer_or(stats, "drafted", -1);
    s.accepted = integer_or(stats, "accepted", -1);
    s.acceptance_rate = number_or(stats, "acceptance_rate", -1);
    s.mean_accepted_length = number_or(stats, "mean_accepted_length", -1);
    s.mean_confidence_threshold = number_or(stats, "mean_confidence_threshold", -1);
    s.preemptions = integer_or(stats, "preemptions", -1);
    s.ttft_ms = number_or(stats, "ttft_ms", -1);
    s.elapsed_ms = number_or(stats, "elapsed_ms", -1);
    return Outcome::Done;
  }
  if (type == "error") {
    fail(r, now_s, "server:" + error_code(m), string_or(m, "message", "(no message)"));
    return Outcome::Failed;
  }
  return Outcome::Pending;
}

std::vector<std::string> SseParser::feed(const char* data, size_t n) {
  std::vector<std::string> out;
  pending_.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string line = pending_.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) {  // the event ends
      if (has_data_) out.push_back(data_);
      data_.clear();
      has_data_ = false;
    } else if (line.rfind("data:", 0) == 0) {
      std::string value = line.substr(5);
      if (!value.empty() && value[0] == ' ') value.erase(0, 1);
      if (has_data_) data_ += "\n";
      data_ += value;
      has_data_ = true;
    }  // comments (":"), "event:", "id:", "retry:" carry nothing we measure
  }
  pending_.erase(0, start);
  return out;
}

namespace {

// The speculation counters of a server object that carries them (docs/protocol.md).
void apply_speculation(const json& s, RequestRecord& r) {
  r.server.rounds = integer_or(s, "rounds", r.server.rounds);
  r.server.drafted = integer_or(s, "drafted", r.server.drafted);
  r.server.accepted = integer_or(s, "accepted", r.server.accepted);
  r.server.acceptance_rate = number_or(s, "acceptance_rate", r.server.acceptance_rate);
  r.server.mean_accepted_length = number_or(s, "mean_accepted_length", r.server.mean_accepted_length);
  r.server.mean_confidence_threshold = number_or(s, "mean_confidence_threshold", r.server.mean_confidence_threshold);
  r.server.preemptions = integer_or(s, "preemptions", r.server.preemptions);
}

// A Responses API event (its "type" starts with "response." or is "error"): a text delta is a
// token event; response.completed / response.incomplete end the request with the response's usage
// and speculation counters (finish "stop" / "length"); an error or response.failed fails it.
Outcome apply_response_event(const json& e, const std::string& type, double now_s, RequestRecord& r) {
  if (type == "response.output_text.delta" || type == "response.reasoning_text.delta" ||
      type == "response.function_call_arguments.delta") {
    if (auto d = e.find("delta"); d != e.end() && d->is_string() && !d->get<std::string>().empty()) add_event(r, now_s, 1);
    return Outcome::Pending;
  }
  if (type == "error" || type == "response.failed") {
    if (!r.error_kind.empty()) return Outcome::Failed;  // (response.failed after its error event)
    json err = e;
    err.erase("type");  // (the code is the error's, not the event's name)
    if (auto resp = e.find("response"); resp != e.end() && resp->is_object() && resp->contains("error") &&
                                        (*resp)["error"].is_object())
      err = (*resp)["error"];
    fail(r, now_s, "server:" + error_code(err), string_or(err, "message", "(no message)"));
    return Outcome::Failed;
  }
  if (type != "response.completed" && type != "response.incomplete") return Outcome::Pending;
  const auto resp = e.find("response");
  if (resp == e.end() || !resp->is_object()) {
    fail(r, now_s, "protocol", type + " without a response object");
    return Outcome::Failed;
  }
  r.end_s = now_s;
  r.finish_reason = type == "response.completed" ? "stop" : "length";
  if (auto u = resp->find("usage"); u != resp->end() && u->is_object()) {
    r.server.prompt_tokens = integer_or(*u, "input_tokens", r.server.prompt_tokens);
    r.server.completion_tokens = integer_or(*u, "output_tokens", r.server.completion_tokens);
  }
  if (auto s = resp->find("speculation"); s != resp->end() && s->is_object()) apply_speculation(*s, r);
  return Outcome::Done;
}

}  // namespace

Outcome apply_sse_data(const std::string& payload, double now_s, RequestRecord& r) {
  if (payload == "[DONE]") {
    r.end_s = now_s;
    return Outcome::Done;
  }
  const auto parsed = parse_object(payload, "SSE data", now_s, r);
  if (!parsed) return Outcome::Failed;
  const json& c = *parsed;
  if (auto t = c.find("type"); t != c.end() && t->is_string()) {
    const std::string type = t->get<std::string>();
    if (type.starts_with("response.") || type == "error") return apply_response_event(c, type, now_s, r);
  }
  if (auto e = c.find("error"); e != c.end()) {
    const json err = e->is_object() ? *e : json{{"message", e->dump()}};
    fail(r, now_s, "server:" + error_code(err), string_or(err, "message", "(no message)"));
    return Outcome::Failed;
  }
  if (auto u = c.find("usage"); u != c.end() && u->is_object()) {
    r.server.prompt_tokens = integer_or(*u, "prompt_tokens", r.server.prompt_tokens);
    r.server.completion_tokens = integer_or(*u, "completion_tokens", r.server.completion_tokens);
  }
  // Speculation counters, where the server adds them to a chunk (docs/protocol.md).
  for (const char* key : {"speculation", "stats"})
    if (auto s = c.find(key); s != c.end() && s->is_object()) apply_speculation(*s, r);
  auto choices = c.find("choices");
  if (choices == c.end() || !choices->is_array() || choices->empty()) return Outcome::Pending;  // usage-only chunk
  const json& ch = (*choices)[0];
  if (!ch.is_object()) {
    fail(r, now_s, "protocol", "SSE chunk with a choice that is not an object");
    return Outcome::Failed;
  }
  std::string text;
  if (auto d = ch.find("delta"); d != ch.end() && d->is_object()) {
    if (auto t = d->find("content"); t != d->end() && t->is_string()) text = t->get<std::string>();
  } else if (auto t = ch.find("text"); t != ch.end() && t->is_string()) {
    text = t->get<std::string>();
  }
  if (!text.empty()) add_event(r, now_s, static_cast<int>(integer_or(c, "token_count", 1)));
  if (auto f = ch.find("finish_reason"); f != ch.end() && f->is_string()) r.finish_reason = f->get<std::string>();
  return Outcome::Pending;
}

void apply_http_error(int status, const std::string& body, RequestRecord& r) {
  r.error_kind = "http:" + std::to_string(status);
  r.error_message = "HTTP " + std::to_string(status) + ": " + body.substr(0, 200);
  try {
    const json j = json::parse(body);
    if (j.is_object() && j.contains("error")) {
      const json& e = j["error"];
      if (e.is_object()) {
        r.error_kind = "server:" + error_code(e);
        r.error_message = string_or(e, "message", r.error_message);
      }
    }
  } catch (const json::parse_error&) {
  }
}

}  // namespace specula::load
