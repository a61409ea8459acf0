// Request fields -> EngineRequest, with errors that name the field (docs/protocol.md).
#include "net/api_request.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <tuple>
#include <utility>

#include "actors/sampler.h"
#include "model/reasoning.h"
#include "spec/grammar.h"
#include "spec/penalties.h"
#include "spec/json_schema.h"

namespace specula::net {

using nlohmann::json;

int ApiError::http_status() const {
  if (code == "message_too_large") return 413;
  if (code == "overloaded") return 429;
  if (code == "shutting_down") return 503;
  if (code == "not_found") return 404;
  if (code == "missing_api_key" || code == "invalid_api_key") return 401;
  if (code == "forbidden_origin") return 403;
  if (code == "method_not_allowed") return 405;
  if (code == "internal") return 500;
  return 400;
}

namespace {

// A field that is absent or null counts as not given.
const json* field(const json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError("invalid_request", message, param);
}

std::string shown(const json& v) {
  std::string s = v.dump();
  return s.size() > 40 ? s.substr(0, 37) + "..." : s;
}

int64_t integer(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad(name, name + " must be an integer, got " + shown(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    bad(name, name + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + shown(v));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad(name, name + " must be between " + std::to_string(lo) + " and " + std::to_string(hi) + ", got " + shown(v));
  return x;
}

double number(const json& v, const std::string& name) {
  if (!v.is_number()) bad(name, name + " must be a number, got " + shown(v));
  const double x = v.get<double>();
  if (!std::isfinite(x)) bad(name, name + " must be finite");
  return x;
}

// OpenAI's logit_bias: {"token id": bias}, the ids this model's (as vLLM takes them), each bias in
// [-100, 100], at most kMaxLogitBias entries.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const json& v, int64_t vocab) {
  if (!v.is_object()) bad("logit_bias", "logit_bias must be an object of token ids to numbers, got " + shown(v));
  if (v.size() > kMaxLogitBias)
    bad("logit_bias", "logit_bias has " + std::to_string(v.size()) + " entries; the limit is " + std::to_string(kMaxLogitBias));
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, value] : v.items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || key.empty())
      bad("logit_bias", "logit_bias keys must be token ids, got \"" + key + "\"");
    if (id < 0 || id >= vocab)
      bad("logit_bias", "logit_bias: token id " + key + " is outside the vocabulary of " + std::to_string(vocab));
    if (!value.is_number()) bad("logit_bias", "logit_bias: the bias of token " + key + " must be a number, got " + shown(value));
    const double b = value.get<double>();
    if (!(b >= -100 && b <= 100))
      bad("logit_bias", "logit_bias: the bias of token " + key + " must be in [-100, 100], got " + shown(value));
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return out;
}

std::string text_content(const json& content, const std::string& name, bool parts_allowed) {
  if (content.is_string()) return content.get<std::string>();
  if (parts_allowed && content.is_array()) {  // OpenAI content parts: [{"type":"text","text":...}]
    std::string s;
    for (const json& part : content) {
      const auto type = part.is_object() ? part.find("type") : part.end();
      if (!part.is_object() || type == part.end() || *type != "text" || !part.contains("text") || !part["text"].is_string())
        bad(name, name + ": only text parts ({\"type\":\"text\",\"text\":...}) are supported");
      s += part["text"].get<std::string>();
    }
    return s;
  }
  bad(name, name + " must be a string" + std::string(parts_allowed ? " or an array of text parts" : "") + ", got " +
                shown(content));
}

std::vector<ChatMessage> parse_messages(const json& v, bool openai) {
  if (!v.is_array() || v.empty()) bad("messages", "messages must be a non-empty array of {\"role\",\"content\"}");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string where = "messages[" + std::to_string(i) + "]";
    const json& m = v[i];
    if (!m.is_object()) bad(where, where + " must be an object with role and content");
    const json* role = field(m, "role");
    if (!role || !role->is_string()) bad(where + ".role", where + ".role must be a string");
    std::string r = role->get<std::string>();
    if (openai && r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      bad(where + ".role", where + ".role must be system, user, assistant or tool, got " + shown(*role));
    const json* content = field(m, "content");
    if (content && content->is_null() && r == "assistant") content = nullptr;
    std::string text;
    if (content)
      text = text_content(*content, where + ".content", openai);
    else if (r != "assistant")
      bad(where + ".content", where + ".content is missing");
    ChatMessage msg{r, std::move(text)};
    // An assistant's earlier tool calls: the chat template writes them (ChatTemplate::render: as
    // the model's own template does, or as the generic format's JSON after the text).
    if (const json* calls = r == "assistant" ? field(m, "tool_calls") : nullptr; calls && !calls->is_null()) {
      if (!calls->is_array()) bad(where + ".tool_calls", where + ".tool_calls must be an array");
      for (const json& c : *calls) {
        const json* fn = c.is_object() ? field(c, "function") : nullptr;
        const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
        const json* args = fn && fn->is_object() ? field(*fn, "arguments") : nullptr;
        if (!name || !name->is_string() || !args || !args->is_string())
          bad(where + ".tool_calls", where + ".tool_calls items must be {\"function\": {\"name\": string, \"arguments\": string}}");
        try {  // through the body's limits: a value nested past them would overflow the printer's stack
          parse_json(args->get<std::string>());
        } catch (const ApiError& e) {
          bad(where + ".tool_calls", where + ".tool_calls: arguments must be a JSON text (" + e.what() + ")");
        }
        const json* id = field(c, "id");
        msg.tool_calls.push_back({id && id->is_string() ? id->get<std::string>() : "", name->get<std::string>(), args->get<std::string>()});
      }
    }
    if (r == "assistant") {  // its reasoning, for a template that writes it (Qwen3's); vLLM's newer name too
      for (const char* key : {"reasoning_content", "reasoning"})
        if (const json* rc = field(m, key); rc && !rc->is_null()) {
          if (!rc->is_string()) bad(where + "." + key, where + "." + key + " must be a string, got " + shown(*rc));
          if (!msg.reasoning_content) msg.reasoning_content = rc->get<std::string>();
        }
    }
    if (r == "tool") {  // the call this answers, and its function's name, for templates that write them
      if (const json* id = field(m, "tool_call_id"); id && id->is_string()) msg.tool_call_id = id->get<std::string>();
      if (const json* name = field(m, "name"); name && name->is_string()) msg.name = name->get<std::string>();
    }
    out.push_back(std::move(msg));
  }
  return out;
}

// A schema moved to `base` (a JSON pointer) of another: its "#..." references made "#<base>...".
void rebase_refs(nlohmann::ordered_json& s, const std::string& base) {
  if (s.is_array()) {
    for (nlohmann::ordered_json& v : s) rebase_refs(v, base);
  } else if (s.is_object()) {
    for (auto& [key, v] : s.items()) {
      if (key == "$ref" && v.is_string() && v.get<std::string>().starts_with("#"))
        v = "#" + base + v.get<std::string>().substr(1);
      else
        rebase_refs(v, base);
    }
  }
}

// OpenAI's tools and tool_choice on /v1/chat/completions (docs/protocol.md, "Tools"): a named
// function or "required" is guided decoding of a schema, as vLLM serves them; "auto" is the
// model's own format where its chat template writes tools and calls in a syntax we read
// (tool_calls.h: the reply unconstrained, its calls parsed, as vLLM's --tool-call-parser and
// llama.cpp's --jinja), llama.cpp's generic format otherwise (the tools described in a system
// message, the reply one JSON object: calls or a response); "none" generates text.
ToolCalls parse_tools(const json& body, std::string_view raw, const ChatTemplate& chat) {
  ToolCalls out;
  const json* tools = field(body, "tools");
  const json* choice = field(body, "tool_choice");
  if (tools && tools->is_null()) tools = nullptr;
  if (choice && choice->is_null()) choice = nullptr;
  if (tools && !tools->is_array()) bad("tools", "tools must be an array of {\"type\": \"function\", \"function\": {...}}");
  if (!tools || tools->empty()) {
    if (choice && !(choice->is_string() && choice->get<std::string>() == "none"))
      bad("tool_choice", "tool_choice needs tools");
    return out;
  }
  if (tools->size() > 128) bad("tools", "at most 128 tools, got " + std::to_string(tools->size()));
  // The parameters' members in the order the request wrote them (as response_format's schema).
  nlohmann::ordered_json written = raw.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json::parse(raw, nullptr, false);
  const bool in_order = written.is_object() && written.contains("tools") && written["tools"].is_array() &&
                        written["tools"].size() == tools->size();
  std::vector<std::string> names;
  std::vector<nlohmann::ordered_json> params;
  // The tools as the request wrote them, for a chat template that writes tools (Hugging Face
  // hands a template the list as given); its call ids as such a template needs them.
  if (chat.supports_tools())
    out.template_tools = std::make_shared<const nlohmann::ordered_json>(in_order ? written["tools"]
                                                                                 : nlohmann::ordered_json::parse(tools->dump()));
  out.nine_character_ids = chat.supports_tool_calls() && chat.tool_syntax() == ToolSyntax::Mistral;
  std::string described;  // "auto": each tool as the system message lists it
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const json& t = (*tools)[i];
    const json* type = t.is_object() ? field(t, "type") : nullptr;
    if (!type || *type != "function") bad("tools", where + ".type must be \"function\"");
    const json* fn = field(t, "function");
    if (!fn || !fn->is_object()) bad("tools", where + ".function must be an object with a name");
    const json* name = field(*fn, "name");
    if (!name || !name->is_string()) bad("tools", where + ".function.name must be a string");
    const std::string n = name->get<std::string>();
    if (n.empty() || n.size() > 64 ||
        !std::all_of(n.begin(), n.end(), [](unsigned char c) { return std::isalnum(c) || c == '_' || c == '-'; }))
      bad("tools", where + ".function.name must be 1-64 letters, digits, '_' or '-', got " + shown(*name));
    if (std::find(names.begin(), names.end(), n) != names.end()) bad("tools", "two tools are named '" + n + "'");
    names.push_back(n);
    const json* p = field(*fn, "parameters");
    if (p && !p->is_null() && !p->is_object()) bad("tools", where + ".function.parameters must be a JSON schema object");
    if (!p || p->is_null() || p->empty())  // {} as vLLM takes it: no parameters
      params.push_back({{"type", "object"}, {"properties", nlohmann::ordered_json::object()}});
    else if (in_order && written["tools"][i].is_object() && written["tools"][i].contains("function") &&
             written["tools"][i]["function"].contains("parameters"))
      params.push_back(written["tools"][i]["function"]["parameters"]);
    else
      params.push_back(nlohmann::ordered_json::parse(p->dump()));
    nlohmann::ordered_json d = {{"name", n}};
    if (const json* desc = field(*fn, "description"); desc && desc->is_string()) d["description"] = *desc;
    d["parameters"] = params.back();
    described += d.dump() + "\n";
  }
  std::string mode = "auto";
  if (choice && choice->is_string()) {
    mode = choice->get<std::string>();
    if (mode != "none" && mode != "auto" && mode != "required")
      bad("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}, got " +
                             shown(*choice));
  } else if (choice) {
    const json* fn = choice->is_object() ? field(*choice, "function") : nullptr;
    const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    if (!name || !name->is_string())
      bad("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    const auto it = std::find(names.begin(), names.end(), name->get<std::string>());
    if (it == names.end()) bad("tool_choice", "tool_choice names '" + name->get<std::string>() + "', which is not among the tools");
    out.mode = ToolCalls::Mode::Named;
    out.name = *it;
    out.schema = params[static_cast<size_t>(it - names.begin())];
    return out;
  }
  if (mode == "none") return ToolCalls{};  // as if no tools were sent
  bool parallel = true;
  if (const json* v = field(body, "parallel_tool_calls"); v && !v->is_null()) {
    if (!v->is_boolean()) bad("parallel_tool_calls", "parallel_tool_calls must be true or false, got " + shown(*v));
    parallel = v->get<bool>();
  }
  out.names = names;
  out.parallel = parallel;
  // One call, {"name": N, `arguments`: {...}}, of any tool. Each tool's parameters sit at
  // #/$defs/tool_I of the schema, their own $refs rebased there.
  nlohmann::ordered_json any = nlohmann::ordered_json::array(), defs = nlohmann::ordered_json::object();
  auto one_call = [&](const char* arguments) {
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string def = "tool_" + std::to_string(i);
      rebase_refs(params[i], "/$defs/" + def);
      defs[def] = std::move(params[i]);
      any.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", names[i]}}}, {arguments, {{"$ref", "#/$defs/" + def}}}}},
                     {"required", {"name", arguments}}});
    }
  };
  if (mode == "auto" && chat.reads_own_tool_calls()) {
    out.mode = ToolCalls::Mode::Auto;  // the model's own format
    out.syntax = chat.tool_syntax();
    if (out.syntax == ToolSyntax::Hermes || out.syntax == ToolSyntax::Llama3Json) {  // its calls may be held
      out.arguments_key = out.syntax == ToolSyntax::Hermes ? "arguments" : chat.tool_arguments_key();
      one_call(out.arguments_key.c_str());
      out.schema = {{"anyOf", std::move(any)}, {"$defs", std::move(defs)}};
    }
    return out;
  }
  // "required": [{"name": N, "parameters": {...}}, ...], one item per call (vLLM's format).
  one_call("parameters");
  nlohmann::ordered_json calls = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", std::move(any)}}}};
  if (!parallel) calls["maxItems"] = 1;
  if (mode == "required") {
    out.mode = ToolCalls::Mode::Required;
    out.schema = std::move(calls);
    out.schema["$defs"] = std::move(defs);
    return out;
  }
  // "auto": {"tool_calls": [...]} or {"response": "..."}; the tools described in the system
  // message instead of by the template.
  out.mode = ToolCalls::Mode::Auto;
  out.template_tools = nullptr;
  out.schema = {{"anyOf",
                 {{{"type", "object"}, {"properties", {{"tool_calls", std::move(calls)}}}, {"required", {"tool_calls"}}},
                  {{"type", "object"},
                   {"properties", {{"response", {{"type", "string"}}}}},
                   {"required", {"response"}}}}},
                {"$defs", std::move(defs)}};
  out.system = "You can call these tools (their parameters as JSON Schema):\n" + described +
               "Reply with one JSON object: {\"tool_calls\": [{\"name\": <a tool's name>, \"parameters\": {...}}]} to "
               "call tools, or {\"response\": \"<your reply>\"} to answer without them.";
  return out;
}

std::vector<int32_t> parse_token_ids(const json& v, int64_t vocab) {
  std::vector<int32_t> ids;
  for (const json& t : v) ids.push_back(static_cast<int32_t>(integer(t, "prompt", 0, vocab - 1)));
  return ids;
}

std::vector<std::string> parse_stop(const json& v) {
  std::vector<std::string> stops;
  if (v.is_string()) {
    stops.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const json& s : v) {
      if (!s.is_string()) bad("stop", "stop must be a string or an array of strings, got an element " + shown(s));
      stops.push_back(s.get<std::string>());
    }
  } else {
    bad("stop", "stop must be a string or an array of strings, got " + shown(v));
  }
  try {
    actors::validate_stop_strings(stops);  // the engine's limits, checked before anything starts
  } catch (const std::invalid_argument& e) {
    bad("stop", e.what());
  }
  return stops;
}

DraftLengthConfig parse_speculation(const json& v, DraftLengthConfig c) {
  if (!v.is_object()) bad("speculation", "speculation must be an object {\"k\",\"adaptive\",\"mode\"}, got " + shown(v));
  if (const json* k = field(v, "k")) {
    c.k = static_cast<int>(integer(*k, "speculation.k", 1, kMaxDraftTokens));
    if (c.k > c.k_max) c.k_max = c.k;
    if (c.k_max_greedy > 0 && c.k > c.k_max_greedy) c.k_max_greedy = c.k;
    if (c.k < c.k_min) c.k_min = c.k;
  }
  if (const json* a = field(v, "adaptive")) {
    if (!a->is_boolean()) bad("speculation.adaptive", "speculation.adaptive must be true or false, got " + shown(*a));
    c.adaptive = a->get<bool>();
  }
  return c;
}

}  // namespace

json parse_json(std::string_view text) {
  // Nesting, which a recursive reader of the value would follow; and an object's members, which
  // the order-keeping parse of a schema's request (nlohmann::ordered_json finds each key by a
  // linear search) reads in time quadratic in their number: 90,000 keys were 15 s of the I/O thread.
  constexpr int kMaxDepth = 64;
  constexpr int kMaxMembers = 4096;
  int depth = 0;
  int members[kMaxDepth + 1] = {};  // per open object, the commas seen (-1: an array)
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth)
        throw ApiError("invalid_json", "the JSON nests deeper than " + std::to_string(kMaxDepth) + " levels");
      members[depth] = c == '{' ? 0 : -1;
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    } else if (c == ',' && depth > 0 && members[depth] >= 0 && ++members[depth] >= kMaxMembers) {
      throw ApiError("invalid_json", "a JSON object has more than " + std::to_string(kMaxMembers) + " members");
    }
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError("invalid_json", "the message is not valid JSON");
  return j;
}

std::string model_name_from_path(const std::string& path) {
  std::filesystem::path p(path);
  if (p.filename().empty()) p = p.parent_path();
  std::string name = p.filename().string();
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name;
}

namespace {

// vLLM's chat request fields for how its messages become the prompt (ChatTemplate's RenderOptions).
// chat_template_kwargs' members in the order the request wrote them (`raw`, as the tools').
void render_options_into(const json& body, std::string_view raw, actors::EngineRequest& r) {
  auto flag = [&](const char* name, bool& out) {
    if (const json* v = field(body, name); v && !v->is_null()) {
      if (!v->is_boolean()) bad(name, std::string(name) + " must be true or false, got " + shown(*v));
      out = v->get<bool>();
    }
  };
  flag("add_generation_prompt", r.add_generation_prompt);
  flag("continue_final_message", r.continue_final_message);
  if (r.continue_final_message && r.add_generation_prompt)  // (vLLM refuses the two together too)
    bad("continue_final_message", "continue_final_message leaves the last message open for the reply to continue; send it "
                                  "with add_generation_prompt: false");
  if (const json* v = field(body, "chat_template_kwargs"); v && !v->is_null()) {
    if (!v->is_object()) bad("chat_template_kwargs", "chat_template_kwargs must be an object of the template's variables, got " + shown(*v));
    // (vLLM lets these override its own; here the request's fields say it, once)
    for (const char* own : {"messages", "tools", "add_generation_prompt", "continue_final_message"})
      if (v->contains(own))
        bad("chat_template_kwargs", std::string("chat_template_kwargs may not set '") + own + "': send it as the request's own field");
    if (!v->empty()) {
      nlohmann::ordered_json written = raw.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json::parse(raw, nullptr, false);
      const bool in_order = written.is_object() && written.contains("chat_template_kwargs") && written["chat_template_kwargs"].is_object();
      r.template_variables = std::make_shared<const nlohmann::ordered_json>(
          in_order ? std::move(written["chat_template_kwargs"]) : nlohmann::ordered_json::parse(v->dump()));
    }
  }
  // vLLM's documents, for a template that writes them (retrieval templates: Command R's, Granite's):
  // the template's `documents` variable, unless chat_template_kwargs sets one (as vLLM's merge).
  if (const json* d = field(body, "documents"); d && !d->is_null()) {
    auto refuse = [&] { bad("documents", "documents must be an array of objects whose values are strings, got " + shown(*d)); };
    if (!d->is_array()) refuse();
    for (const json& doc : *d) {
      if (!doc.is_object()) refuse();
      for (const auto& [key, value] : doc.items())
        if (!value.is_string()) refuse();
    }
    nlohmann::ordered_json vars = nlohmann::ordered_json::object();
    vars["documents"] = nlohmann::ordered_json::parse(d->dump());
    if (r.template_variables)
      for (const auto& [key, value] : r.template_variables->items()) vars[key] = value;
    r.template_variables = std::make_shared<const nlohmann::ordered_json>(std::move(vars));
  }
}

// A model's calls in its own syntax held to the tools' schemas, as llama.cpp holds them with its
// lazy grammar: Hermes' from <tool_call> on (the text before it free), Llama 3's where the reply
// opens with '{' (a reply that does not is free text). The grammar, or "" where the calls cannot
// be held and are read unconstrained, as vLLM reads them: another syntax (Mistral's
// [TOOL_CALLS] is a special token), Llama 3's where the reasoning is read apart and the grammar
// put after it (`reasoning_grammar`: the text alternative could open with <think> too, and calls
// written after such a block would not be held), tools' parameters that JSON Schema's grammar
// cannot keep, or a grammar past its limits. (Markers that are special tokens: serve start.)
std::string gbnf_of_held_calls(const ToolCalls& tools, const actors::Engine& engine, bool reasoning_grammar) {
  if (tools.syntax != ToolSyntax::Hermes && (tools.syntax != ToolSyntax::Llama3Json || reasoning_grammar)) return {};
  constexpr const char* kSpace = "[ \\t\\n\\r]{0,20}";
  try {
    const std::string call = gbnf_of_json_schema(tools.schema);
    const std::string prefix = gbnf_fresh_prefix(call, "held");
    const std::string name = prefix + "-call";
    std::string gbnf = gbnf_with_root_renamed(call, name) + "\n";
    if (tools.syntax == ToolSyntax::Hermes) {
      gbnf += "root ::= " + name + " \"</tool_call>\"";
      if (tools.parallel) gbnf += std::string(" ( ") + kSpace + " \"<tool_call>\" " + name + " \"</tool_call>\" )*";
      gbnf = gbnf_lazy(gbnf + " " + kSpace + "\n", "<tool_call>");
    } else {  // calls (a call's own grammar starts and ends with whitespace), or text that does not open with '{'
      gbnf += "root ::= " + std::string(kSpace) + " ( " + name + (tools.parallel ? " ( \";\" " + name + " )*" : std::string()) +
              " | " + prefix + "-text )\n" + prefix + "-text ::= [^{ \\t\\n\\r] " + prefix + "-rest | \"\"\n" + prefix +
              "-rest ::= . " + prefix + "-rest | \"\"\n";
    }
    (void)engine.grammar(gbnf);  // compiled (and kept) here, so that one past the limits is not held
    return gbnf;
  } catch (const std::invalid_argument&) {
    return {};
  }
}

// A chat request's tools, as its prompt shows them: handed to the template (r.tools), or for the
// generic format's "auto" described in the system message.
ToolCalls tools_into_prompt(const json& body, std::string_view raw, const actors::Engine& engine, actors::EngineRequest& r) {
  ToolCalls tools = parse_tools(body, raw, engine.chat_template());
  r.tools = tools.template_tools;
  if (!tools.system.empty()) {
    if (r.messages.front().role == "system")
      r.messages.front().content += "\n\n" + tools.system;
    else
      r.messages.insert(r.messages.begin(), ChatMessage{"system", tools.system});
  }
  return tools;
}

// vLLM's allowed_token_ids (ids of this model) and bad_words (words, tokenized as vLLM does:
// spec/penalties.h, bad_words_token_ids), on both routes and the WebSocket.
void parse_token_lists(const json& body, const LoadedModel& model, SamplingParams& sp) {
  const int64_t vocab = model.weights.config.vocab_size;
  std::vector<int32_t> allowed;
  if (const json* v = field(body, "allowed_token_ids"); v && !v->is_null()) {
    if (!v->is_array()) bad("allowed_token_ids", "allowed_token_ids must be an array of token ids, got " + shown(*v));
    if (v->empty()) bad("allowed_token_ids", "allowed_token_ids is empty, so no token could be generated");
    for (const json& t : *v) allowed.push_back(static_cast<int32_t>(integer(t, "allowed_token_ids", 0, vocab - 1)));
  }
  std::vector<std::string> words;
  if (const json* v = field(body, "bad_words"); v && !v->is_null()) {
    const auto refuse = [&](const json& got) { bad("bad_words", "bad_words must be an array of strings, got " + shown(got)); };
    if (!v->is_array()) refuse(*v);
    if (v->size() > kMaxBadWords)  // (before the words are read: set_token_lists says the same)
      bad("bad_words", "bad_words has " + std::to_string(v->size()) + " words; the limit is " + std::to_string(kMaxBadWords));
    for (const json& w : *v) {
      if (!w.is_string()) refuse(w);
      words.push_back(w.get<std::string>());
    }
  }
  if (allowed.empty() && words.empty()) return;
  try {  // the words tokenized, the lists' limits, and whether they leave any token at all
    set_token_lists(sp, std::move(allowed), words, model.tokenizer.get(), vocab);
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    bad(what.rfind("allowed_token_ids", 0) == 0 ? "allowed_token_ids" : "bad_words", what);
  }
}

}  // namespace

actors::EngineRequest parse_tokenize(const json& body, const actors::Engine& engine, std::string_view raw) {
  if (!body.is_object()) throw ApiError("invalid_json", "the request must be a JSON object");
  const json* messages = field(body, "messages");
  const json* prompt = field(body, "prompt");
  if ((messages != nullptr) == (prompt != nullptr)) bad("messages", "give exactly one of messages or prompt");
  actors::EngineRequest r;
  if (messages) {
    r.messages = parse_messages(*messages, true);
    render_options_into(body, raw, r);
    tools_into_prompt(body, raw, engine, r);  // vLLM's tools: as the chat request would show them
  } else if (prompt->is_string()) {
    r.prompt = prompt->get<std::string>();
  } else {
    bad("prompt", "prompt must be a string, got " + shown(*prompt));
  }
  return r;
}

json tokenize_reply(const std::vector<int32_t>& ids, const actors::Engine& engine) {
  return {{"count", ids.size()}, {"max_model_len", engine.context_length()}, {"tokens", ids}};
}

json detokenize_body(const json& body, const actors::Engine& engine) {
  if (!body.is_object()) throw ApiError("invalid_json", "the request must be a JSON object");
  const json* tokens = field(body, "tokens");
  if (!tokens || !tokens->is_array()) bad("tokens", "tokens must be an array of token ids");
  const LoadedModel& model = engine.model();
  if (!model.tokenizer) bad("tokens", "the model has no tokenizer");
  const int64_t vocab = model.weights.config.vocab_size;
  // A text is at most a context's tokens (and its bytes some ten times its ids' JSON).
  if (static_cast<int64_t>(tokens->size()) > engine.context_length())
    bad("tokens", "tokens holds " + std::to_string(tokens->size()) + " ids; at most " + std::to_string(engine.context_length()) +
                      " (the context)");
  std::vector<int32_t> ids;
  for (const json& t : *tokens) ids.push_back(static_cast<int32_t>(integer(t, "tokens", 0, vocab - 1)));
  return {{"prompt", model.tokenizer->decode(ids)}};
}

bool reply_opens_reasoning(const actors::Engine& engine, const actors::EngineRequest& request,
                           const std::vector<int32_t>& prompt_ids) {
  if (request.continue_final_message && !request.messages.empty())  // a prefill that stops while it reasons?
    return leaves_reasoning_open(request.messages.back().content);
  const Tokenizer* tok = engine.model().tokenizer.get();
  if (!tok) return false;
  const std::size_t tail = std::min<std::size_t>(prompt_ids.size(), 8);
  return opens_reasoning(tok->decode(std::vector<int32_t>(prompt_ids.end() - static_cast<std::ptrdiff_t>(tail), prompt_ids.end())));
}

ParsedRequest parse_generation(const json& body, PromptKind kind, const actors::Engine& engine,
                               const RequestDefaults& defaults, std::string_view raw) {
  if (!body.is_object()) throw ApiError("invalid_json", "the request must be a JSON object");
  ParsedRequest out;
  actors::EngineRequest& r = out.request;
  const bool openai = kind != PromptKind::WebSocket;
  const LoadedModel& model = engine.model();
  const int64_t vocab = model.weights.config.vocab_size;

  // --- the prompt ---
  const json* messages = field(body, "messages");
  const json* prompt = field(body, "prompt");
  if (kind == PromptKind::Chat && !messages) bad("messages", "messages is required");
  if (kind == PromptKind::Completion && !prompt) bad("prompt", "prompt is required");
  if (kind == PromptKind::WebSocket && (messages != nullptr) == (prompt != nullptr))
    bad("messages", "give exactly one of messages or prompt");
  if (kind == PromptKind::Chat) prompt = nullptr;
  if (kind == PromptKind::Completion) messages = nullptr;
  // The engine templates, tokenizes and checks the prompt against the context (Engine::start).
  if (messages) {
    r.messages = parse_messages(*messages, openai);
    render_options_into(body, raw, r);
  } else {
    const json& p = *prompt;
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (openai && p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (openai && p.is_array() && p.size() == 1 && p[0].is_array()) {
      r.prompt_ids = parse_token_ids(p[0], vocab);
    } else if (openai && p.is_array() && !p.empty() && p[0].is_number()) {
      r.prompt_ids = parse_token_ids(p, vocab);
    } else if (openai && p.is_array() && p.size() > 1) {
      if (p.size() > static_cast<std::size_t>(kMaxPrompts))
        bad("prompt", "prompt holds " + std::to_string(p.size()) + " prompts; at most " + std::to_string(kMaxPrompts));
      for (const json& one : p) {
        if (one.is_string())
          out.batch.push_back({one.get<std::string>(), {}});
        else if (one.is_array() && !one.empty())
          out.batch.push_back({{}, parse_token_ids(one, vocab)});
        else
          bad("prompt", "each of several prompts must be a string or a non-empty array of token ids, got " + shown(one));
      }
    } else {
      bad("prompt", std::string("prompt must be a string") + (openai ? " or an array of token ids" : "") + ", got " +
                        shown(p));
    }
  }

  // --- length and sampling ---
  int64_t max_tokens = defaults.max_tokens;
  const char* max_name = "max_tokens";
  const json* mt = field(body, "max_tokens");
  if (!mt && openai && (mt = field(body, "max_completion_tokens"))) max_name = "max_completion_tokens";
  // 0 is the prompt alone, with echo (checked below, where echo is read): the engine runs one
  // token, which the route does not show.
  if (mt) max_tokens = integer(*mt, max_name, openai && kind != PromptKind::Chat ? 0 : 1, engine.context_length());
  r.max_tokens = static_cast<int>(std::max<int64_t>(max_tokens, 1));
  if (const json* v = field(body, "truncate_prompt_tokens"); v && !v->is_null()) {
    // -1: as many as the context holds with room for one token (vLLM's "the model's length").
    const int64_t k = integer(*v, "truncate_prompt_tokens", -1, engine.context_length() - 1);
    if (k == 0) bad("truncate_prompt_tokens", "truncate_prompt_tokens must be -1 or at least 1, got 0");
    out.truncate_prompt_tokens = k < 0 ? engine.context_length() - 1 : k;
  }
  r.fit_to_context = true;  // cut to the room the prompt leaves; the finish reason is then "context"

  SamplingParams& sp = r.sampling;
  sp.temperature = defaults.temperature;
  sp.top_k = defaults.top_k;
  sp.top_p = defaults.top_p;
  if (const json* v = field(body, "temperature")) {
    const double t = number(*v, "temperature");
    if (t < 0) bad("temperature", "temperature must be >= 0, got " + shown(*v));
    sp.temperature = static_cast<float>(t);
  }
  if (const json* v = field(body, "top_p")) {
    const double p = number(*v, "top_p");
    if (!(p > 0 && p <= 1)) bad("top_p", "top_p must be in (0, 1], got " + shown(*v));
    sp.top_p = static_cast<float>(p);
  }
  if (const json* v = field(body, "min_p")) {  // vLLM's and llama.cpp's extension; 0 = off
    const double p = number(*v, "min_p");
    if (!(p >= 0 && p <= 1)) bad("min_p", "min_p must be in [0, 1] (0 = off), got " + shown(*v));
    sp.min_p = static_cast<float>(p);
  }
  // Penalties over the request's own tokens and logit bias (spec/penalties.h; OpenAI's ranges,
  // vLLM's definitions; repetition_penalty is vLLM's and llama.cpp's extension).
  for (const auto& [name, lo, hi, out_of] :
       {std::tuple{"presence_penalty", -2.0, 2.0, &sp.presence_penalty}, std::tuple{"frequency_penalty", -2.0, 2.0, &sp.frequency_penalty}})
    if (const json* v = field(body, name)) {
      const double x = number(*v, name);
      if (!(x >= lo && x <= hi)) bad(name, std::string(name) + " must be in [-2, 2] (0 = off), got " + shown(*v));
      *out_of = static_cast<float>(x);
    }
  if (const json* v = field(body, "repetition_penalty")) {
    const double x = number(*v, "repetition_penalty");
    if (!(x > 0 && x <= 2)) bad("repetition_penalty", "repetition_penalty must be in (0, 2] (1 = off), got " + shown(*v));
    sp.repetition_penalty = static_cast<float>(x);
  }
  if (const json* v = field(body, "logit_bias")) sp.logit_bias = parse_logit_bias(*v, vocab);
  parse_token_lists(body, model, sp);
  // vLLM's extensions: no stop token (nor stop string) before min_tokens tokens; ignore_eos: the
  // model's end tokens do not end the text (stop strings still do).
  if (const json* v = field(body, "min_tokens")) {
    sp.min_tokens = static_cast<int>(integer(*v, "min_tokens", 0, engine.context_length()));
    if (sp.min_tokens > r.max_tokens)
      bad("min_tokens", "min_tokens (" + std::to_string(sp.min_tokens) + ") must be at most max_tokens (" +
                            std::to_string(r.max_tokens) + ")");
  }
  if (const json* v = field(body, "ignore_eos")) {
    if (!v->is_boolean()) bad("ignore_eos", "ignore_eos must be true or false, got " + shown(*v));
    if (v->get<bool>()) r.stop_ids = std::vector<int32_t>{};
  }
  // stop_token_ids: more tokens that end the text (left out of it, as the end tokens are);
  // include_stop_str_in_output: the stop string or token that ended it stays; skip_special_tokens
  // false: special tokens' text is shown.
  if (const json* v = field(body, "stop_token_ids"); v && !v->is_null()) {
    if (!v->is_array()) bad("stop_token_ids", "stop_token_ids must be an array of token ids, got " + shown(*v));
    if (v->size() > actors::kMaxStopTokenIds)
      bad("stop_token_ids", "stop_token_ids has " + std::to_string(v->size()) + " ids; the limit is " +
                                std::to_string(actors::kMaxStopTokenIds));
    for (const json& t : *v) r.stop_token_ids.push_back(static_cast<int32_t>(integer(t, "stop_token_ids", 0, vocab - 1)));
  }
  const auto flag = [&](const char* name, bool& to) {
    if (const json* v = field(body, name); v && !v->is_null()) {
      if (!v->is_boolean()) bad(name, std::string(name) + " must be true or false, got " + shown(*v));
      to = v->get<bool>();
    }
  };
  flag("include_stop_str_in_output", r.include_stop_str_in_output);
  flag("skip_special_tokens", r.skip_special_tokens);
  if (const json* v = field(body, "top_k")) sp.top_k = static_cast<int>(std::max<int64_t>(0, integer(*v, "top_k", -1, vocab)));
  if (const json* v = field(body, "seed")) {
    if (!v->is_number_integer()) bad("seed", "seed must be an integer, got " + shown(*v));
    sp.seed = v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
  } else {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    sp.seed = rng() & ((uint64_t{1} << 53) - 1);  // exact in a JavaScript number, so the page can echo it
  }
  if (const json* v = field(body, "stop")) r.stop = parse_stop(*v);
  if (const json* v = field(body, "priority")) {
    r.priority = static_cast<int>(integer(*v, "priority", std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
    if (r.priority != 0 && !defaults.priority_scheduling)
      bad("priority", "priority needs the server started with --scheduling-policy priority (it serves first come, first served)");
  }

  // --- speculation ---
  DraftLengthConfig draft = defaults.draft;
  // A request that names its seed is judged in coupled mode unless it asks for exact: coupled
  // output is the target's own sample at that seed whatever K, the drafts or the server's load
  // are, so the same seed and settings give the same text (docs/protocol.md, "seed"). Exact mode's
  // draws follow the drafts and K, which adaptive K sets from load and timing.
  r.mode = field(body, "seed") ? SpecSampling::Coupled : SpecSampling::Exact;
  if (const json* v = field(body, "speculation")) {
    draft = parse_speculation(*v, draft);
    if (const json* m = field(*v, "mode")) {
      auto refuse = [&] { bad("speculation.mode", "speculation.mode must be \"exact\", \"block\" or \"coupled\", got " + shown(*m)); };
      if (!m->is_string()) refuse();
      try {
        r.mode = parse_spec_sampling(m->get<std::string>());
      } catch (const std::invalid_argument&) {
        refuse();
      }
    }
  }
  try {
    draft.validate();
  } catch (const std::invalid_argument& e) {
    bad("speculation", std::string("speculation: ") + e.what());
  }
  r.draft = draft;

  // --- Constrained output: JSON mode (spec/json_mode.h) or a grammar (spec/grammar.h) ---
  // OpenAI's response_format (json_object, json_schema), vLLM's guided_json / guided_choice /
  // guided_regex / guided_grammar and llama.cpp's json_schema / grammar; at most one per request.
  std::string gbnf, constraint;  // the grammar's text, and the field it came from
  auto constrain = [&](const std::string& name) {
    if (!constraint.empty()) bad(name, name + " and " + constraint + " cannot both constrain one request");
    constraint = name;
  };
  // A schema's members in the order the request wrote them: read again from the raw text, since
  // nlohmann::json keeps an object's keys sorted.
  auto ordered = [&](const json& schema, const std::vector<std::string>& path) {
    if (!raw.empty()) {
      nlohmann::ordered_json full = nlohmann::ordered_json::parse(raw, nullptr, false);
      const nlohmann::ordered_json* at = &full;
      for (const std::string& key : path) {
        if (!at->is_object() || !at->contains(key)) {
          at = nullptr;
          break;
        }
        at = &(*at)[key];
      }
      if (at != nullptr) return *at;
    }
    return nlohmann::ordered_json::parse(schema.dump());
  };
  auto from_schema = [&](const json& schema, const std::vector<std::string>& path, const std::string& name) {
    nlohmann::ordered_json s = ordered(schema, path);
    if (s.is_string()) {  // vLLM takes guided_json as a JSON string too
      s = nlohmann::ordered_json::parse(s.get<std::string>(), nullptr, false);
      if (s.is_discarded()) bad(name, name + " is a string that is not JSON");
    }
    try {
      gbnf = gbnf_of_json_schema(s);
    } catch (const std::invalid_argument& e) {
      bad(name, e.what());
    }
  };
  auto json_mode = [&](const std::string& name) {
    r.sampling.json_object = engine.json_vocabulary();
    if (!r.sampling.json_object) bad(name, "JSON mode needs the model's tokenizer");
  };
  // vLLM's choice, regex and grammar, as the field `name` (or structured_outputs' member) gives them.
  auto from_choices = [&](const json& v, const std::string& name) {
    std::vector<std::string> choices;
    if (!v.is_array()) bad(name, name + " must be an array of strings");
    for (const json& c : v) {
      if (!c.is_string()) bad(name, name + " must be an array of strings");
      choices.push_back(c.get<std::string>());
    }
    try {
      gbnf = gbnf_of_choices(choices);
    } catch (const std::invalid_argument& e) {
      bad(name, e.what());
    }
  };
  auto from_regex = [&](const json& v, const std::string& name) {
    if (!v.is_string()) bad(name, name + " must be a string");
    try {
      gbnf = gbnf_of_regex(v.get<std::string>());
    } catch (const std::invalid_argument& e) {
      bad(name, e.what());
    }
  };
  auto from_grammar = [&](const json& v, const std::string& name) {
    if (!v.is_string()) bad(name, name + " must be a string of GBNF");
    gbnf = v.get<std::string>();
  };
  if (const json* v = field(body, "response_format")) {
    const json* type = v->is_object() ? field(*v, "type") : nullptr;
    const std::string t = !v->is_object() ? "" : !type ? "text" : type->is_string() ? type->get<std::string>() : "";
    if (t == "json_object") {
      constrain("response_format");
      json_mode("response_format");
    } else if (t == "json_schema") {
      constrain("response_format");
      const json* js = field(*v, "json_schema");
      const json* schema = js && js->is_object() ? field(*js, "schema") : nullptr;
      if (!schema) bad("response_format", "response_format json_schema needs {\"json_schema\": {\"name\": ..., \"schema\": {...}}}");
      from_schema(*schema, {"response_format", "json_schema", "schema"}, "response_format");
    } else if (t != "text") {
      bad("response_format", "response_format must be {\"type\":\"text\"}, {\"type\":\"json_object\"} or {\"type\":\"json_schema\", ...}, got " +
                                 shown(*v));
    }
  }
  for (const char* name : {"guided_json", "json_schema"})
    if (const json* v = field(body, name); v && !v->is_null()) {
      constrain(name);
      from_schema(*v, {name}, name);
    }
  if (const json* v = field(body, "guided_choice"); v && !v->is_null()) {
    constrain("guided_choice");
    from_choices(*v, "guided_choice");
  }
  if (const json* v = field(body, "guided_regex"); v && !v->is_null()) {
    constrain("guided_regex");
    from_regex(*v, "guided_regex");
  }
  for (const char* name : {"guided_grammar", "grammar"})
    if (const json* v = field(body, name); v && !v->is_null()) {
      constrain(name);
      from_grammar(*v, name);
    }
  // vLLM's structured_outputs (since its v0.12 the only spelling: the guided_* fields above were
  // removed there): exactly one of json, regex, choice, grammar and json_object. What it cannot
  // keep is refused, naming it, rather than ignored.
  if (const json* v = field(body, "structured_outputs"); v && !v->is_null()) {
    const std::string so = "structured_outputs";
    constexpr const char* kKinds = "json, regex, choice, grammar or json_object";
    if (!v->is_object()) bad(so, so + " must be an object with one of " + kKinds + ", got " + shown(*v));
    constrain(so);
    if (const json* t = field(*v, "structural_tag"); t && !t->is_null())
      bad(so, "structured_outputs.structural_tag is not supported (use json, regex, choice or grammar)");
    if (const json* w = field(*v, "whitespace_pattern"); w && !w->is_null())
      bad(so, "structured_outputs.whitespace_pattern is not supported (JSON holds at most 20 whitespace bytes between tokens)");
    for (const char* flag : {"disable_any_whitespace", "disable_fallback", "disable_additional_properties"})
      if (const json* w = field(*v, flag); w && !w->is_null() && !w->is_boolean())
        bad(so, so + "." + flag + " must be true or false, got " + shown(*w));
    if (const json* w = field(*v, "disable_any_whitespace"); w && w->is_boolean() && w->get<bool>())
      bad(so, "structured_outputs.disable_any_whitespace is not supported (JSON holds at most 20 whitespace bytes between tokens)");
    std::vector<std::string> given;
    for (const char* k : {"json", "regex", "choice", "grammar"})
      if (const json* m = field(*v, k); m && !m->is_null()) given.push_back(k);
    const json* object = field(*v, "json_object");
    if (object && !object->is_null() && !object->is_boolean())
      bad(so, "structured_outputs.json_object must be true or false, got " + shown(*object));
    if (object && object->is_boolean() && object->get<bool>()) given.push_back("json_object");
    if (given.size() != 1) {
      std::string named;
      for (const std::string& g : given) named += (named.empty() ? "" : " and ") + g;
      bad(so, so + " needs exactly one of " + kKinds + ", got " + (given.empty() ? "none" : named));
    }
    const std::string& k = given.front();
    const std::string name = so + "." + k;
    constraint = name;  // (later faults, a grammar's among them, name the member)
    if (k == "json") from_schema(*field(*v, "json"), {so, "json"}, name);
    if (k == "regex") from_regex(*field(*v, "regex"), name);
    if (k == "choice") from_choices(*field(*v, "choice"), name);
    if (k == "grammar") from_grammar(*field(*v, "grammar"), name);
    if (k == "json_object") json_mode(name);
  }
  if (const json* v = field(body, "include_reasoning"); v && !v->is_null() && kind != PromptKind::Completion) {  // vLLM's
    if (!v->is_boolean()) bad("include_reasoning", "include_reasoning must be true or false, got " + shown(*v));
    out.include_reasoning = v->get<bool>();
  }
  if (kind == PromptKind::Chat) {
    out.tools = tools_into_prompt(body, raw, engine, r);
    // A call's marker may be a special token (Mistral's [TOOL_CALLS], <tool_call> in some Hermes
    // models): the reply keeps special tokens' text so that it can be read (as vLLM's parsers do).
    if (out.tools.syntax != ToolSyntax::Generic) r.skip_special_tokens = false;
    if (out.tools.mode != ToolCalls::Mode::None) {
      constrain("tool_choice");
      try {
        if (out.tools.syntax == ToolSyntax::Generic) gbnf = gbnf_of_json_schema(out.tools.schema);
      } catch (const std::invalid_argument& e) {
        bad("tools", std::string("tools: ") + e.what());
      }
      if (out.tools.mode == ToolCalls::Mode::Auto && out.tools.syntax != ToolSyntax::Generic && defaults.tool_call_grammar) {
        gbnf = gbnf_of_held_calls(out.tools, engine, defaults.reasoning_grammar);
        out.tools.held = !gbnf.empty();
      }
    }
  }
  // A reasoning model's constrained reply reasons first, its constraint starting after </think>
  // (vLLM's structured outputs with a reasoning parser; docs/protocol.md, "Reasoning"). JSON mode
  // becomes the grammar of any object for it. The prompt is tokenized here to see whether it
  // opens the block, and the ids kept as the prompt.
  if (kind == PromptKind::Chat && defaults.reasoning_grammar && (!gbnf.empty() || r.sampling.json_object)) {
    try {  // the request's own grammar's faults named as its own, before it is wrapped
      if (!gbnf.empty()) (void)Grammar::parse(gbnf);
    } catch (const std::invalid_argument& e) {
      bad(constraint, e.what());
    }
    if (r.sampling.json_object) {
      gbnf = gbnf_of_json_schema(nlohmann::ordered_json{{"type", "object"}});
      r.sampling.json_object = nullptr;
    }
    try {
      std::vector<int32_t> ids = engine.tokenize(r);
      out.reasoning_open = reply_opens_reasoning(engine, r, ids);
      r.prompt_ids = std::move(ids);
      r.prompt.clear();
      r.chat = false;
    } catch (const actors::RequestError& e) {
      throw ApiError(e.code, e.what(), e.field);
    }
    out.reasoning_constrained = true;
    gbnf = gbnf_after_block(gbnf, "<think>", "</think>", out.reasoning_open);
  }
  if (!gbnf.empty()) {
    try {
      r.sampling.grammar = engine.grammar(gbnf);
    } catch (const std::invalid_argument& e) {
      bad(constraint, e.what());
    }
  }

  // --- OpenAI-only switches ---
  if (openai) {
    if (const json* v = field(body, "n"); v && !v->is_null()) out.n = static_cast<int>(integer(*v, "n", 1, kMaxChoices));
    // best_of > n would rank candidates the client never sees; vLLM's V1 engine dropped it too.
    if (const json* v = field(body, "best_of"); v && !v->is_null() && integer(*v, "best_of", 1, 1000) > out.n)
      bad("best_of", "best_of above n is not supported");
    // Log-probabilities of the target's own distribution at each token (docs/protocol.md). Chat:
    // logprobs true/false and top_logprobs 0..20 alternatives; completions: the legacy logprobs,
    // 0..5 alternatives (null: none).
    if (kind == PromptKind::Chat) {
      bool on = false;
      if (const json* v = field(body, "logprobs"); v && !v->is_null()) {
        if (!v->is_boolean()) bad("logprobs", "logprobs must be true or false, got " + shown(*v));
        on = v->get<bool>();
      }
      int top = 0;
      if (const json* v = field(body, "top_logprobs"); v && !v->is_null()) {
        top = static_cast<int>(integer(*v, "top_logprobs", 0, actors::kMaxTopLogprobs));
        if (!on && top > 0) bad("top_logprobs", "top_logprobs needs logprobs: true");
      }
      r.logprobs = on ? top : -1;
    } else if (const json* v = field(body, "logprobs"); v && !v->is_null() && !(v->is_boolean() && !v->get<bool>())) {
      r.logprobs = static_cast<int>(integer(*v, "logprobs", 0, 5));
    }
    // echo: the prompt's text before each choice's, and with logprobs its tokens' entries first
    // (the first token's null), as vLLM gives them; the stop token that ends a choice keeps its
    // entry, so that a client dropping the generated tokens' entries by count finds them all.
    if (const json* v = field(body, "echo"); v && !v->is_null()) {
      if (!v->is_boolean()) bad("echo", "echo must be true or false, got " + shown(*v));
      out.echo = v->get<bool>();
      if (out.echo && kind == PromptKind::Chat) bad("echo", "echo is served by /v1/completions only");
      out.prompt_only = out.echo && max_tokens == 0;
      if (out.echo && r.logprobs >= 0) {
        r.prompt_logprobs = r.logprobs;
        r.stop_token_logprobs = true;
      }
    }
    // vLLM's extension in its own shape: each prompt token's log-probability, rank and decoded
    // text, with that many alternatives (docs/protocol.md, "Prompt log-probabilities"). Whole
    // responses only, as vLLM has it.
    if (const json* v = field(body, "prompt_logprobs"); v && !v->is_null()) {
      out.prompt_logprobs = static_cast<int>(integer(*v, "prompt_logprobs", 0, actors::kMaxTopLogprobs));
      r.prompt_logprobs = std::max(r.prompt_logprobs, out.prompt_logprobs);
    }
    if (max_tokens == 0 && !out.echo)
      bad(max_name, std::string(max_name) + " must be at least 1 (0 only with echo: the prompt alone)");
    if (const json* v = field(body, "suffix"); v && !(v->is_string() && v->get<std::string>().empty()))
      bad("suffix", "suffix is not supported");
    if (const json* v = field(body, "tools"); kind != PromptKind::Chat && v && !v->is_null() && !(v->is_array() && v->empty()))
      bad("tools", "tools are served by /v1/chat/completions");
    if (const json* v = field(body, "stream")) {
      if (!v->is_boolean()) bad("stream", "stream must be true or false, got " + shown(*v));
      out.stream = v->get<bool>();
    }
    if (const json* v = field(body, "stream_options")) {
      if (!v->is_object()) bad("stream_options", "stream_options must be an object");
      if (const json* u = field(*v, "include_usage")) {
        if (!u->is_boolean()) bad("stream_options.include_usage", "stream_options.include_usage must be true or false");
        out.include_usage = u->get<bool>();
      }
      if (const json* u = field(*v, "continuous_usage_stats"); u && !u->is_null()) {  // vLLM's: usage in every chunk
        if (!u->is_boolean()) bad("stream_options.continuous_usage_stats", "stream_options.continuous_usage_stats must be true or false");
        out.continuous_usage = u->get<bool>();
      }
    }
    out.continuous_usage = out.continuous_usage && out.include_usage;  // (vLLM's: with include_usage only)
    if (out.stream && out.prompt_logprobs >= 0)
      bad("prompt_logprobs", "prompt_logprobs is not available with stream: true (as in vLLM)");
  }
  return out;
}

}  // namespace specula::net
