// Published chat templates beyond the conversation: what a template is found to do with tools,
// the conversation it is handed, replies read as calls in the model's own syntax, and the
// end-of-turn markers it writes.
#include "model/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "model/chat_template.h"

namespace specula {
namespace {

ChatTemplate fixture(const std::string& name, const std::string& dir = "chat_templates") {
  std::ifstream in(std::string(SPECULA_FIXTURE_DIR) + "/" + dir + "/" + name + ".jinja", std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  EXPECT_TRUE(in) << name;
  ChatTemplate t = ChatTemplate::from_template_text(s.str(), SpecialTokens{"<s>", "</s>"});
  EXPECT_TRUE(t.runs_jinja()) << name << ": " << t.problem();
  return t;
}

const nlohmann::ordered_json kTools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {
  "name": "get_weather", "description": "The weather in a city.",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])");

std::vector<ChatMessage> conversation_with_a_call() {
  ChatMessage call("assistant", "");
  call.tool_calls.push_back({"call12345", "get_weather", R"({"city": "Paris", "days": [1, 2]})"});
  ChatMessage result("tool", "Sunny, 21 C");
  result.tool_call_id = "call12345";
  result.name = "get_weather";
  return {{"user", "Weather in Paris?"}, call, result};
}

TEST(ToolTemplates, ToolSupportAndTheCallSyntaxAreReadFromWhatEachTemplateWrites) {
  struct Case {
    const char* name;
    bool tools, calls;
    ToolSyntax syntax;
  };
  for (const Case& c : {Case{"qwen2.5", true, true, ToolSyntax::Hermes}, Case{"chatml-tools-hermes", true, true, ToolSyntax::Hermes},
                        Case{"llama3.1", true, true, ToolSyntax::Llama3Json}, Case{"mistral-instruct", false, false, ToolSyntax::Generic},
                        Case{"zephyr", false, false, ToolSyntax::Generic}, Case{"gemma", false, false, ToolSyntax::Generic}}) {
    const ChatTemplate t = fixture(c.name);
    EXPECT_EQ(t.supports_tools(), c.tools) << c.name;
    EXPECT_EQ(t.supports_tool_calls(), c.calls) << c.name;
    EXPECT_EQ(t.tool_syntax(), c.syntax) << c.name << ": " << tool_syntax_name(t.tool_syntax());
  }
  const ChatTemplate mistral = fixture("mistral-tools-like", "tool_templates");
  EXPECT_TRUE(mistral.supports_tools() && mistral.supports_tool_calls());
  EXPECT_EQ(mistral.tool_syntax(), ToolSyntax::Mistral);
  // The key a Llama 3 call's arguments go under, as the template writes it.
  EXPECT_EQ(fixture("llama3.1").tool_arguments_key(), "parameters");
  const ChatTemplate keyed = ChatTemplate::from_template_text(
      "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}"
      "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}{% endfor %}"
      "{% else %}{{ m.content }}{% endif %}{% endfor %}",
      SpecialTokens{"<s>", "</s>"});
  EXPECT_EQ(keyed.tool_syntax(), ToolSyntax::Llama3Json);
  EXPECT_EQ(keyed.tool_arguments_key(), "arguments");
  const ChatTemplate built_in(ChatTemplate::Kind::ChatML);
  EXPECT_FALSE(built_in.supports_tools());
  EXPECT_EQ(built_in.tool_syntax(), ToolSyntax::Generic);
}

TEST(ToolTemplates, TheToolCallParserOptionOverridesWhatTheProbeFoundOrRefusesNamingWhy) {
  ChatTemplate qwen = fixture("qwen2.5");
  qwen.set_tool_call_parser("auto");
  EXPECT_EQ(qwen.tool_syntax(), ToolSyntax::Hermes);
  qwen.set_tool_call_parser("llama3_json");
  EXPECT_EQ(qwen.tool_syntax(), ToolSyntax::Llama3Json);
  EXPECT_EQ(qwen.tool_arguments_key(), "arguments");  // the key its template writes calls with
  EXPECT_TRUE(qwen.supports_tools());
  qwen.set_tool_call_parser("generic");  // as a template without tools: no tools, calls as the generic JSON
  EXPECT_EQ(qwen.tool_syntax(), ToolSyntax::Generic);
  EXPECT_FALSE(qwen.supports_tools() || qwen.supports_tool_calls());
  EXPECT_EQ(qwen.render(conversation_with_a_call(), true, &kTools).find("<tool_call>"), std::string::npos);
  ChatTemplate zephyr = fixture("zephyr");
  for (const char* bad : {"hermes", "pythonic"}) {
    try {
      zephyr.set_tool_call_parser(bad);
      ADD_FAILURE() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(zephyr.tool_syntax(), ToolSyntax::Generic);
}

TEST(ToolTemplates, ATemplateThatWritesToolResultsButNotCallsIsNotTakenToWriteCalls) {
  const ChatTemplate t = ChatTemplate::from_template_text(
      "{% for m in messages %}{% if m.role == 'tool' %}[{{ m.name }}: {{ m.content }}]{% else %}{{ m.content }}{% endif %}{% endfor %}");
  EXPECT_FALSE(t.supports_tool_calls());
  EXPECT_FALSE(t.supports_tools());
  // So an assistant's calls are written as the generic format's JSON, not lost.
  EXPECT_NE(t.render(conversation_with_a_call()).find("{\"tool_calls\":[{\"name\":\"get_weather\""), std::string::npos);
}

TEST(ToolTemplates, ATemplateThatWritesToolsAndCallsIsHandedThemAsHuggingFaceHandsThem) {
  const ChatTemplate t = fixture("qwen2.5");
  const std::string with = t.render(conversation_with_a_call(), true, &kTools);
  // The tool as the request wrote it, in the template's own system text.
  EXPECT_NE(with.find(R"({"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.")"),
            std::string::npos)
      << with;
  // The call with its arguments parsed (tojson re-writes them), and the result as a tool turn.
  EXPECT_NE(with.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call><|im_end|>"),
            std::string::npos)
      << with;
  EXPECT_NE(with.find("<tool_response>\nSunny, 21 C\n</tool_response>"), std::string::npos) << with;
  // Without the tools the template writes no tool system text (the control).
  const std::string without = t.render(conversation_with_a_call(), true, nullptr);
  EXPECT_EQ(without.find("get_weather\", \"description\""), std::string::npos);
  EXPECT_NE(without.find("<tool_call>"), std::string::npos);
}

TEST(ToolTemplates, AFormatThatDoesNotWriteCallsGetsThemAsTheGenericJsonAfterTheText) {
  std::vector<ChatMessage> c = conversation_with_a_call();
  c[1].content = "Let me look.";
  const std::string chatml = ChatTemplate(ChatTemplate::Kind::ChatML).render(c);
  EXPECT_NE(chatml.find("<|im_start|>assistant\nLet me look.\n{\"tool_calls\":[{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\",\"days\":[1,2]}}]}<|im_end|>"),
            std::string::npos)
      << chatml;
  const std::string zephyr = fixture("zephyr").render(c);
  EXPECT_NE(zephyr.find("Let me look.\n{\"tool_calls\":[{\"name\":\"get_weather\""), std::string::npos) << zephyr;
}

TEST(ToolTemplates, ACallWhoseArgumentsAreNotJsonIsAnInvalidArgumentNamingTheFunction) {
  std::vector<ChatMessage> c = conversation_with_a_call();
  c[1].tool_calls[0].arguments = "{\"city\": ";
  for (const ChatTemplate& t : {fixture("qwen2.5"), ChatTemplate(ChatTemplate::Kind::ChatML)}) {
    try {
      t.render(c);
      ADD_FAILURE() << "rendered";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("'get_weather' are not JSON"), std::string::npos) << e.what();
    }
  }
}

TEST(TemplateMarkers, EachTemplatesEndOfTurnMarkersAreTheKnownOnesItWrites) {
  using V = std::vector<std::string>;
  EXPECT_EQ(fixture("gemma").end_of_turn_markers(), V{"<end_of_turn>"});
  EXPECT_EQ(fixture("phi3").end_of_turn_markers(), V{"<|end|>"});
  EXPECT_EQ(fixture("llama3.1").end_of_turn_markers(), (V{"<|eot_id|>", "<|eom_id|>"}));
  EXPECT_EQ(fixture("qwen2.5").end_of_turn_markers(), V{"<|im_end|>"});
  EXPECT_EQ(fixture("deepseek-r1").end_of_turn_markers(), V{"<｜end▁of▁sentence｜>"});
  EXPECT_EQ(fixture("mistral-instruct").end_of_turn_markers(), V{});  // its turns end with eos_token
  EXPECT_EQ(ChatTemplate(ChatTemplate::Kind::Llama3).end_of_turn_markers(), V{"<|eot_id|>"});
}

const std::vector<std::string> kNames = {"get_weather", "search"};

TEST(ToolReplies, HermesBlocksBecomeCallsAndTheTextBeforeThemTheContent) {
  const ToolReply r = parse_tool_reply(ToolSyntax::Hermes,
                                       "I will check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
                                       "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a } \\\" {\"}}\n</tool_call>",
                                       kNames);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "I will check.\n");  // as written, as vLLM's parser gives it
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Paris\"}");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.calls[1].arguments, "{\"q\":\"a } \\\" {\"}");
}

TEST(ToolReplies, AHermesBlockCutAtTheEndOfTheTurnStillCountsAndNoTextIsNoContent) {
  const ToolReply r = parse_tool_reply(ToolSyntax::Hermes, "<tool_call>\n{\"name\": \"search\", \"parameters\": {}}\n", kNames);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_FALSE(r.content.has_value());
  EXPECT_EQ(r.calls[0].arguments, "{}");
}

TEST(ToolReplies, AReplyWithAnyMalformedCallIsAllContent) {
  const std::string good = "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>";
  for (const std::string& text : std::vector<std::string>{
           "Just text.",
           "<tool_call>{\"name\": \"search\", \"arguments\": {</tool_call>",           // not JSON
           "<tool_call>{\"name\": \"delete_all\", \"arguments\": {}}</tool_call>",     // not a tool
           "<tool_call>{\"name\": \"search\", \"arguments\": \"q\"}</tool_call>",      // arguments not an object
           "<tool_call>[{\"name\": \"search\", \"arguments\": {}}]</tool_call>",       // not an object
           good + " and then more text " + good,                                       // text between calls
       }) {
    const ToolReply r = parse_tool_reply(ToolSyntax::Hermes, text, kNames);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  EXPECT_EQ(parse_tool_reply(ToolSyntax::Hermes, good, kNames).calls.size(), 1u);  // the control
  EXPECT_TRUE(parse_tool_reply(ToolSyntax::Generic, good, kNames).calls.empty());
}

// Arguments nested `depth` objects deep, or holding `members` members.
std::string nested(int depth) {
  std::string s;
  for (int i = 0; i < depth; ++i) s += "{\"a\": ";
  return s + "1" + std::string(static_cast<size_t>(depth), '}');
}
std::string wide(int members) {
  std::string s = "{";
  for (int i = 0; i < members; ++i) s += (i ? ", \"k" : "\"k") + std::to_string(i) + "\": 1";
  return s + "}";
}

TEST(ToolReplies, ACallNestedOrWiderThanARequestBodyMayBeIsNotReadInAnySyntax) {
  for (const auto& [args, ok] : std::vector<std::pair<std::string, bool>>{
           {nested(60), true}, {nested(70), false}, {nested(100000), false}, {wide(4000), true}, {wide(5000), false}}) {
    const std::string call = "{\"name\": \"search\", \"arguments\": " + args + "}";
    for (const auto& [syntax, text] : std::vector<std::pair<ToolSyntax, std::string>>{
             {ToolSyntax::Hermes, "<tool_call>" + call + "</tool_call>"},
             {ToolSyntax::Llama3Json, call},
             {ToolSyntax::Mistral, "[TOOL_CALLS] [" + call + "]"}}) {
      const ToolReply r = parse_tool_reply(syntax, text, kNames);
      EXPECT_EQ(r.calls.size(), ok ? 1u : 0u) << tool_syntax_name(syntax) << " " << args.size();
      if (!ok) {
        EXPECT_EQ(r.content, text);
      }
    }
  }
}

TEST(ToolReplies, Llama3JsonIsObjectsSeparatedBySemicolonsAfterAnOptionalPythonTag) {
  const ToolReply r = parse_tool_reply(
      ToolSyntax::Llama3Json,
      "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}; {\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}",
      kNames);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_FALSE(r.content.has_value());
  EXPECT_EQ(r.calls[0].arguments, "{\"city\":\"Rome\"}");
  EXPECT_EQ(r.calls[1].name, "search");
  for (const std::string& text : {std::string("Sure: {\"name\": \"search\", \"parameters\": {}}"),
                                  std::string("{\"name\": \"search\", \"parameters\": {}} trailing"),
                                  std::string("{\"name\": \"search\", \"parameters\": {}")})
    EXPECT_TRUE(parse_tool_reply(ToolSyntax::Llama3Json, text, kNames).calls.empty()) << text;
}

TEST(ToolReplies, MistralIsAnArrayAfterTheToolCallsMarker) {
  const ToolReply r = parse_tool_reply(
      ToolSyntax::Mistral, "Checking. [TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"get_weather\", \"arguments\": {}}]",
      kNames);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.content, "Checking. ");
  EXPECT_TRUE(parse_tool_reply(ToolSyntax::Mistral, "[TOOL_CALLS] []", kNames).calls.empty());
  EXPECT_TRUE(parse_tool_reply(ToolSyntax::Mistral, "[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {}}] x", kNames).calls.empty());
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// Streams `reply` a byte at a time: what tool_reply_streamable lets out never shrinks, and
// ends as a start of the content parse_tool_reply gives (all of it when there are no calls).
std::string streamed(ToolSyntax syntax, const std::string& reply) {
  size_t out = 0;
  for (size_t n = 1; n <= reply.size(); ++n) {
    const size_t now = tool_reply_streamable(syntax, std::string_view(reply).substr(0, n));
    EXPECT_GE(now, out) << reply.substr(0, n);
    out = std::max(out, now);
  }
  const ToolReply parsed = parse_tool_reply(syntax, reply, kNames);
  const std::string content = parsed.content.value_or("");
  EXPECT_EQ(content.substr(0, out), reply.substr(0, out)) << reply;
  return reply.substr(0, out);
}

TEST(ToolStreaming, TextBeforeACallsMarkerStreamsAndTheMarkerAndCallsAreHeldBack) {
  const std::string call = "<tool_call>\n{\"name\": \"search\", \"arguments\": {}}\n</tool_call>";
  EXPECT_EQ(streamed(ToolSyntax::Hermes, "Let me see. <tool_c"), "Let me see. ");
  EXPECT_EQ(streamed(ToolSyntax::Hermes, "Let me see. " + call), "Let me see. ");
  EXPECT_EQ(streamed(ToolSyntax::Hermes, "\n  " + call), "");  // whitespace and calls: no content
  EXPECT_EQ(streamed(ToolSyntax::Hermes, "A plain answer < 3 and <b>."), "A plain answer < 3 and <b>.");
  EXPECT_EQ(streamed(ToolSyntax::Mistral, "Hi [TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {}}]"), "Hi ");
  EXPECT_EQ(streamed(ToolSyntax::Llama3Json, " {\"name\": \"search\", \"parameters\": {}}"), "");
  EXPECT_EQ(streamed(ToolSyntax::Llama3Json, "<|python_tag|>{\"name\": \"search\", \"parameters\": {}}"), "");
  EXPECT_EQ(streamed(ToolSyntax::Llama3Json, "<b>Sure</b>, {\"a\": 1}"), "<b>Sure</b>, {\"a\": 1}");
  EXPECT_EQ(streamed(ToolSyntax::Generic, "{\"response\": \"x\"}"), "");
}

// Reads every start of `reply` a byte at a time, checking that each reading extends the one
// before (calls only added, a listed call's name kept, arguments and content only growing, and
// each a start of the whole reply's), and that only the whole reply is closed. Returns the whole
// reply's reading.
template <class Read>
PartialToolReply read_growing_by(Read read, const std::string& reply) {
  const PartialToolReply whole = read(std::string_view(reply));
  PartialToolReply before;
  for (size_t n = 0; n < reply.size(); ++n) {
    const PartialToolReply now = read(std::string_view(reply).substr(0, n));
    const std::string at = "after " + std::to_string(n) + " bytes of " + reply;
    EXPECT_GE(now.calls.size(), before.calls.size()) << at;
    EXPECT_LE(now.calls.size(), whole.calls.size()) << at;
    for (size_t k = 0; k < now.calls.size() && k < whole.calls.size(); ++k) {
      EXPECT_EQ(now.calls[k].name, whole.calls[k].name) << at;
      EXPECT_TRUE(whole.calls[k].arguments.starts_with(now.calls[k].arguments)) << at << ": " << now.calls[k].arguments;
      if (k < before.calls.size()) {
        EXPECT_TRUE(now.calls[k].arguments.starts_with(before.calls[k].arguments)) << at;
      }
    }
    EXPECT_TRUE(!before.content || now.content) << at;
    if (now.content) {
      EXPECT_TRUE(whole.content && whole.content->starts_with(*now.content)) << at << ": " << *now.content;
      if (before.content) {
        EXPECT_TRUE(now.content->starts_with(*before.content)) << at;
      }
    }
    before = now;
  }
  return whole;
}

PartialToolReply read_growing(ToolJson shape, const std::string& reply, const std::string& name = "f") {
  return read_growing_by([&](std::string_view text) { return read_tool_json(shape, text, name); }, reply);
}

TEST(ToolJsonReading, TheGenericFormatsResponseIsItsStringDecodedAndGrowsAsItIsWritten) {
  const std::string reply = "\n{ \"response\" : \"Caf\\u00e9 \\\"ol\u00e9\\\"\\n\\ud83d\\ude00 \\/ done\" }\n";
  const PartialToolReply r = read_growing(ToolJson::Wrapped, reply);
  EXPECT_TRUE(r.closed);
  EXPECT_TRUE(r.calls.empty());
  ASSERT_TRUE(r.content);
  EXPECT_EQ(*r.content, nlohmann::json::parse(reply)["response"].get<std::string>());
  EXPECT_EQ(*r.content, "Caf\u00e9 \"ol\u00e9\"\n\U0001F600 / done");
  // Held back until whole: an escape, a surrogate pair, a UTF-8 character.
  EXPECT_EQ(read_tool_json(ToolJson::Wrapped, "{\"response\": \"ab\\u00").content, "ab");
  EXPECT_EQ(read_tool_json(ToolJson::Wrapped, "{\"response\": \"ab\\").content, "ab");
  EXPECT_EQ(read_tool_json(ToolJson::Wrapped, "{\"response\": \"ab\\ud83d").content, "ab");
  EXPECT_EQ(read_tool_json(ToolJson::Wrapped, "{\"response\": \"ab\\ud83d\\ude").content, "ab");
  EXPECT_EQ(read_tool_json(ToolJson::Wrapped, "{\"response\": \"ab\xC3").content, "ab");
  EXPECT_FALSE(read_tool_json(ToolJson::Wrapped, "{\"response\": \"ab\"").closed);
  // A lone surrogate reads as U+FFFD; text that stops being JSON stops the reading.
  EXPECT_EQ(read_tool_json(ToolJson::Wrapped, "{\"response\": \"a\\ud83dz\\udc00\"}").content, "a\uFFFDz\uFFFD");
  const PartialToolReply bad = read_growing(ToolJson::Wrapped, "{\"response\": \"ab\\x more\"}");
  EXPECT_EQ(bad.content, "ab");
  EXPECT_FALSE(bad.closed);
  // Not yet opened, or not the shape: no content (the server then shows the text as it is).
  EXPECT_FALSE(read_tool_json(ToolJson::Wrapped, "{\"response\": ").content);
  EXPECT_FALSE(read_tool_json(ToolJson::Wrapped, "[\"response\"]").content);
}

TEST(ToolJsonReading, CallsAreListedOnceTheirNamesCloseWithTheirArgumentsAsWritten) {
  const std::string list = R"([ {"name": "get_weather", "parameters": {"city": "Paris, \"FR\"", "days": [1, 2]}},
    {"note": [1, {"x": "]}"}], "parameters" : { } , "name" : "get_time"}, 7, "x", {"other": 1} ])";
  const PartialToolReply r = read_growing(ToolJson::List, list);
  EXPECT_TRUE(r.closed);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris, \"FR\"", "days": [1, 2]})");
  EXPECT_TRUE(r.calls[0].closed);
  EXPECT_EQ(r.calls[1].name, "get_time");  // its arguments came before its name
  EXPECT_EQ(r.calls[1].arguments, "{ }");
  EXPECT_FALSE(r.content);
  // Part way: the first call with the arguments so far, the second not listed until its name closes.
  const PartialToolReply part = read_tool_json(ToolJson::List, list.substr(0, list.find("[1, 2]") + 3));
  ASSERT_EQ(part.calls.size(), 1u);
  EXPECT_EQ(part.calls[0].arguments, R"({"city": "Paris, \"FR\"", "days": [1,)");
  EXPECT_FALSE(part.calls[0].closed);
  EXPECT_FALSE(part.closed);
  EXPECT_TRUE(read_tool_json(ToolJson::List, R"([{"name": "get_wea)").calls.empty());

  const std::string wrapped = R"({"tool_calls": [{"name": "search", "parameters": {"q": "caf\u00e9"}}]})";
  const PartialToolReply w = read_growing(ToolJson::Wrapped, wrapped);
  EXPECT_TRUE(w.closed);
  ASSERT_EQ(w.calls.size(), 1u);
  EXPECT_EQ(w.calls[0].arguments, R"({"q": "caf\u00e9"})");  // as written: escapes kept
  EXPECT_FALSE(w.content);
}

TEST(ToolJsonReading, HermesBlocksCallsAreListedOnceTheirNamesCloseAndGrowAsTheyAreWritten) {
  const std::string reply =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Caf\u00e9 \\\"P\\\"\"}}\n</tool_call>\n"
      "<tool_call>{\"arguments\" : {\"q\": [1, \"}</tool_call>\"]}, \"name\": \"search\"}</tool_call>\n";
  const PartialToolReply r = read_growing_by(read_hermes_calls, reply);
  EXPECT_TRUE(r.closed);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Caf\u00e9 \\\"P\\\"\"}");  // as written
  EXPECT_EQ(r.calls[1].name, "search");  // its arguments came before its name
  EXPECT_EQ(r.calls[1].arguments, "{\"q\": [1, \"}</tool_call>\"]}");  // the tag inside a string is text
  EXPECT_FALSE(r.content);  // (the caller's: the text before the first block)
  // Part way: cut inside the first call's arguments, then before the second block's name closes.
  const PartialToolReply part = read_hermes_calls(reply.substr(0, reply.find("Caf")));
  ASSERT_EQ(part.calls.size(), 1u);
  EXPECT_EQ(part.calls[0].arguments, "{\"city\": \"");
  EXPECT_FALSE(part.closed);
  const PartialToolReply one = read_hermes_calls(reply.substr(0, reply.find("\"search")));
  EXPECT_EQ(one.calls.size(), 1u);
  EXPECT_FALSE(one.closed);  // the second block is open
  EXPECT_TRUE(read_hermes_calls(reply.substr(0, reply.find("<tool_call>") + 11)).calls.empty());
  EXPECT_FALSE(read_hermes_calls("Just text.").closed);
}

TEST(ToolJsonReading, Llama3CallsOpenTheReplyAndGrowAsTheyAreWritten) {
  const std::string reply =
      " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris; {x}\"}} ;\n{\"parameters\": {}, \"name\": \"search\"} ";
  const PartialToolReply r = read_growing_by([](std::string_view t) { return read_llama3_calls(t); }, reply);
  EXPECT_TRUE(r.closed);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Paris; {x}\"}");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  const PartialToolReply one = read_llama3_calls(reply.substr(0, reply.find(" ;") + 2));
  EXPECT_EQ(one.calls.size(), 1u);
  EXPECT_FALSE(one.closed);  // another call follows the ';'
  EXPECT_TRUE(read_llama3_calls(reply.substr(0, reply.find(" ;"))).closed);
  EXPECT_TRUE(read_llama3_calls("Sure: {\"name\": \"search\", \"parameters\": {}}").calls.empty());  // text
  // A JSON answer is not calls, nor is anything after it; a template's "arguments" key.
  EXPECT_TRUE(read_llama3_calls("{\"a\": 1} ; {\"name\": \"search\", \"parameters\": {}}").calls.empty());
  const PartialToolReply keyed = read_held_calls(ToolSyntax::Llama3Json, "{\"name\": \"search\", \"arguments\": {\"q\": 1}}", "arguments");
  ASSERT_EQ(keyed.calls.size(), 1u);
  EXPECT_EQ(keyed.calls[0].arguments, "{\"q\": 1}");
  EXPECT_TRUE(read_held_calls(ToolSyntax::Mistral, "[TOOL_CALLS] [{\"name\": \"search\", \"arguments\": {}}]").calls.empty());
}

TEST(ToolJsonReading, ANamedFunctionsReplyIsItsArgumentsFromTheFirstByte) {
  const std::string reply = "\n{\"city\": \"Rome\", \"unit\": \"celsius\"}";
  const PartialToolReply r = read_growing(ToolJson::Arguments, reply, "get_weather");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, reply);
  EXPECT_TRUE(r.closed);
  const PartialToolReply start = read_tool_json(ToolJson::Arguments, "", "get_weather");
  ASSERT_EQ(start.calls.size(), 1u);
  EXPECT_EQ(start.calls[0].arguments, "");
  EXPECT_FALSE(start.closed);
}

TEST(ToolJsonReading, RandomResponsesAndArgumentsReadAsJsonParsesThemAtEveryLength) {
  std::mt19937 rng(7);
  const std::vector<std::string> pieces = {"a", " ", "\"", "\\", "/", "\n", "\t", "\x01", "\u00e9", "\u20ac", "\U0001F600", "}", "]", "{", ","};
  for (int round = 0; round < 60; ++round) {
    std::string text;
    for (int k = 0, len = static_cast<int>(rng() % 12); k < len; ++k) text += pieces[rng() % pieces.size()];
    const bool ascii = rng() % 2;
    const std::string value = nlohmann::json(text).dump(-1, ' ', ascii);
    const std::string space(rng() % 3, ' ');
    const std::string response = "{" + space + "\"response\":" + space + value + space + "}";
    const PartialToolReply r = read_growing(ToolJson::Wrapped, response);
    EXPECT_EQ(r.content, text) << response;
    EXPECT_TRUE(r.closed);
    const std::string args = "{\"k\":" + space + value + "}";
    const std::string call = "[{\"name\":" + space + "\"f\", \"parameters\": " + args + "}]";
    const PartialToolReply c = read_growing(ToolJson::List, call);
    ASSERT_EQ(c.calls.size(), 1u) << call;
    EXPECT_EQ(c.calls[0].arguments, args);
    EXPECT_EQ(nlohmann::json::parse(c.calls[0].arguments)["k"], text);
  }
}

TEST(ToolJsonReading, AKeyWrittenTwiceCountsOnceAndAValueThatStopsBeingJsonIsCutWhereItStops) {
  const PartialToolReply twice = read_growing(ToolJson::List, R"([{"name": "f", "name": "g", "parameters": {"a": 1}, "parameters": {"b": 2}}])");
  ASSERT_EQ(twice.calls.size(), 1u);
  EXPECT_EQ(twice.calls[0].name, "f");
  EXPECT_EQ(twice.calls[0].arguments, R"({"a": 1})");
  const PartialToolReply bad = read_growing(ToolJson::List, R"([{"name": "f", "parameters": {"a": "x\q"}}, {"name": "g", "parameters": {}}])");
  ASSERT_EQ(bad.calls.size(), 1u);
  EXPECT_EQ(bad.calls[0].arguments, R"({"a": "x\)");
  EXPECT_FALSE(bad.calls[0].closed);
  EXPECT_FALSE(bad.closed);
  const PartialToolReply hex = read_growing(ToolJson::List, R"([{"name": "f", "parameters": {"a": "\u00zz"}}])");
  EXPECT_EQ(hex.calls.at(0).arguments, R"({"a": "\u00)");
  const PartialToolReply brackets = read_growing(ToolJson::List, R"([{"name": "f", "parameters": {"a": [1}}])");
  EXPECT_EQ(brackets.calls.at(0).arguments, R"({"a": [1)");
  EXPECT_FALSE(brackets.calls[0].closed);
  // A named function's reply: after its closed value, the rest as text so far (a UTF-8 character whole only).
  EXPECT_EQ(read_tool_json(ToolJson::Arguments, "{} \xC3", "f").calls.at(0).arguments, "{} ");
  EXPECT_EQ(read_tool_json(ToolJson::Arguments, "{} \xC3\xA9", "f").calls.at(0).arguments, "{} \xC3\xA9");
}

// Every start of replies with bytes changed, put in or taken out at random still reads as the
// start of the whole (read_growing's checks), whatever the bytes.
TEST(ToolJsonReading, MangledRepliesStillReadAsTheirWholesStart) {
  const std::vector<std::pair<ToolJson, std::string>> replies = {
      {ToolJson::List, R"([{"name": "get_weather", "parameters": {"city": "Caf\u00e9 \"x\"", "n": [1, {"a": null}]}}, {"name": "t", "parameters": {}}])"},
      {ToolJson::Wrapped, R"({"tool_calls": [{"parameters": {"q": "\ud83d\ude00"}, "name": "search"}]})"},
      {ToolJson::Wrapped, "{\"response\": \"Hello \\\"w\\u00f6rld\\\" \xC3\xA9\\n\\ud83d\\ude00 done\"}"},
      {ToolJson::Arguments, R"({"city": "Rome", "days": [1, 2, 3]})"}};
  const std::string alphabet = "{}[]\":,\\u0aZ \n\xC3\xA9\xFF";
  std::mt19937 rng(11);
  for (const auto& [shape, base] : replies)
    for (int round = 0; round < 150; ++round) {
      std::string text = base;
      for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
        const size_t at = rng() % (text.size() + 1);
        const char c = alphabet[rng() % alphabet.size()];
        switch (rng() % 3) {
          case 0: if (at < text.size()) text[at] = c; break;
          case 1: text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), c); break;
          default: if (at < text.size()) text.erase(at, 1); break;
        }
      }
      read_growing(shape, text);
      if (HasFailure()) return;
    }
}

}  // namespace
}  // namespace specula
