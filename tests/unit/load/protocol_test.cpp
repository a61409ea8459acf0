// specula-load's side of the wire, fed by hand: request bodies, WebSocket events, SSE framing.
#include <gtest/gtest.h>

#include "tools/specula-load/protocol.h"

namespace specula::load {
namespace {

using nlohmann::json;

Prompt chat_prompt() {
  Prompt p;
  p.id = "c00";
  p.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
  p.max_tokens = 96;
  return p;
}

TEST(GenerateMessage, CarriesTheIdMessagesAndOnlyTheSettingsGiven) {
  LoadOptions o;
  const json m = ws_generate_message(chat_prompt(), o, 7);
  EXPECT_EQ(m["type"], "generate");
  EXPECT_EQ(m["id"], "r7");
  EXPECT_EQ(m["messages"][0]["content"], "Hi");
  EXPECT_EQ(m["max_tokens"], 96);  // the prompt's own
  EXPECT_FALSE(m.contains("temperature"));
  EXPECT_FALSE(m.contains("speculation"));
}

TEST(GenerateMessage, OptionsOverrideThePromptAndSampledRequestsGetDistinctSeeds) {
  LoadOptions o;
  o.max_tokens = 16;
  o.temperature = 0.8;
  o.speculation_k = 3;
  o.speculation_mode = "coupled";
  o.seed = 100;
  const json a = ws_generate_message(chat_prompt(), o, 1), b = ws_generate_message(chat_prompt(), o, 2);
  EXPECT_EQ(a["max_tokens"], 16);
  EXPECT_EQ(a["speculation"]["k"], 3);
  EXPECT_EQ(a["speculation"]["mode"], "coupled");
  EXPECT_EQ(a["seed"], 101);
  EXPECT_EQ(b["seed"], 102);
}

TEST(GenerateMessage, APromptsPriorityGoesWithItsRequestsOnBothProtocols) {
  LoadOptions o;
  Prompt p = chat_prompt();
  EXPECT_FALSE(ws_generate_message(p, o, 0).contains("priority"));
  p.priority = -2;
  EXPECT_EQ(ws_generate_message(p, o, 0)["priority"], -2);
  o.target = parse_url("http://127.0.0.1:8080/v1/chat/completions");
  EXPECT_EQ(http_request_body(p, o, 0)["priority"], -2);
}

TEST(HttpBody, ChatCompletionsStreamWithUsageAndAPlainPromptBecomesAUserMessage) {
  LoadOptions o;
  o.target = parse_url("http://127.0.0.1:8080/v1/chat/completions");
  Prompt p;
  p.prompt = "Once upon a time";
  const json b = http_request_body(p, o, 0);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(b["messages"][0]["role"], "user");
  EXPECT_EQ(b["messages"][0]["content"], "Once upon a time");
  o.target = parse_url("http://127.0.0.1:8080/v1/completions");
  EXPECT_EQ(http_request_body(p, o, 0)["prompt"], "Once upon a time");
}

TEST(HttpBody, TheResponsesApiGetsInputMaxOutputTokensAndStoreFalse) {
  LoadOptions o;
  o.target = parse_url("http://127.0.0.1:8080/v1/responses");
  o.temperature = 0.5;
  const json b = http_request_body(chat_prompt(), o, 3);
  EXPECT_EQ(b["stream"], true);
  EXPECT_EQ(b["store"], false);
  EXPECT_EQ(b["input"], chat_prompt().messages);
  EXPECT_EQ(b["max_output_tokens"], 96);
  EXPECT_FALSE(b.contains("max_tokens") || b.contains("messages") || b.contains("stream_options"));
  EXPECT_EQ(b["temperature"], 0.5);
  Prompt plain;
  plain.prompt = "Once upon a time";
  EXPECT_EQ(http_request_body(plain, o, 0)["input"], "Once upon a time");
}

TEST(WsMessages, TokenEventsAccumulateAndDoneFillsTheStats) {
  RequestRecord r;
  r.start_s = 1.0;
  const std::string tok2 = R"({"type":"token","id":"r3","text":"ab","count":2,"tokens":[{"id":5,"draft":true},{"id":6,"draft":false}]})";
  EXPECT_EQ(apply_ws_message(tok2, "r3", 1.2, r), Outcome::Pending);
  EXPECT_EQ(apply_ws_message(R"({"type":"token","id":"r3","text":"c","tokens":[{"id":7}]})", "r3", 1.3, r), Outcome::Pending);
  EXPECT_EQ(apply_ws_message(R"({"type":"token","id":"r9","text":"x","count":1})", "r3", 1.35, r), Outcome::Pending);
  const std::string done = R"({"type":"done","id":"r3","finish_reason":"length","stats":{"prompt_tokens":10,
      "completion_tokens":3,"rounds":2,"drafted":4,"accepted":1,"acceptance_rate":0.25,"mean_accepted_length":0.5,"mean_confidence_threshold":0.42,"preemptions":1}})";
  EXPECT_EQ(apply_ws_message(done, "r3", 1.4, r), Outcome::Done);
  EXPECT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r.first_token_s, 1.2);
  EXPECT_EQ(r.event_tokens, (std::vector<int>{2, 1}));  // r9's event is not ours
  EXPECT_EQ(r.draft_tokens, 1);
  EXPECT_DOUBLE_EQ(r.end_s, 1.4);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.server.completion_tokens, 3);
  EXPECT_EQ(r.server.drafted, 4);
  EXPECT_DOUBLE_EQ(r.server.acceptance_rate, 0.25);
  EXPECT_DOUBLE_EQ(r.server.mean_confidence_threshold, 0.42);
  EXPECT_EQ(r.server.preemptions, 1);
}

TEST(WsMessages, AnErrorEventIsAServerErrorNamedByItsCode) {
  RequestRecord r;
  EXPECT_EQ(apply_ws_message(R"({"type":"error","id":"r1","code":"overloaded","message":"queue full"})", "r1", 2, r),
            Outcome::Failed);
  EXPECT_EQ(r.error_kind, "server:overloaded");
  EXPECT_EQ(r.error_message, "queue full");
}

TEST(WsMessages, AnErrorWithANullIdBelongsToTheRequestInFlight) {
  RequestRecord r;
  EXPECT_EQ(apply_ws_message(R"({"type":"error","id":null,"code":"invalid_json","message":"bad"})", "r1", 2, r),
            Outcome::Failed);
  EXPECT_EQ(r.error_kind, "server:invalid_json");
}

TEST(WsMessages, NonJsonOrUntypedMessagesAreProtocolErrors) {
  RequestRecord a, b;
  EXPECT_EQ(apply_ws_message("not json", "r1", 0, a), Outcome::Failed);
  EXPECT_EQ(a.error_kind, "protocol");
  EXPECT_EQ(apply_ws_message(R"({"id":"r1"})", "r1", 0, b), Outcome::Failed);
  EXPECT_EQ(b.error_kind, "protocol");
}

TEST(SseParser, SplitsEventsAcrossArbitraryChunkBoundaries) {
  const std::string stream = "data: {\"a\":1}\r\n\r\n: comment\n\ndata: one\ndata: two\n\ndata: [DONE]\n\n";
  SseParser p;
  std::vector<std::string> got;
  for (char c : stream)
    for (auto& d : p.feed(&c, 1)) got.push_back(d);
  EXPECT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "one\ntwo", "[DONE]"}));
}

TEST(SseData, ContentChunksAreEventsUsageIsCountedAndDoneEnds) {
  RequestRecord r;
  r.start_s = 0;
  EXPECT_EQ(apply_sse_data(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})", 0.1, r), Outcome::Pending);
  EXPECT_EQ(r.event_s.size(), 0u);  // a role-only chunk carries no token
  EXPECT_EQ(apply_sse_data(R"({"choices":[{"index":0,"delta":{"content":"Hi"}}]})", 0.2, r), Outcome::Pending);
  EXPECT_EQ(apply_sse_data(R"({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":null,
      "speculation":{"rounds":1,"drafted":3,"accepted":1,"acceptance_rate":0.33,"mean_accepted_length":1,
      "mean_confidence_threshold":0.6,"preemptions":2}})", 0.3, r),
            Outcome::Pending);
  EXPECT_EQ(apply_sse_data(R"({"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2}})", 0.3, r), Outcome::Pending);
  EXPECT_EQ(apply_sse_data("[DONE]", 0.4, r), Outcome::Done);
  EXPECT_DOUBLE_EQ(r.first_token_s, 0.2);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.output_tokens(), 2);
  EXPECT_EQ(r.server.drafted, 3);
  EXPECT_EQ(r.server.accepted, 1);
  EXPECT_DOUBLE_EQ(r.server.mean_confidence_threshold, 0.6);
  EXPECT_EQ(r.server.preemptions, 2);
  EXPECT_TRUE(r.ok());
}

TEST(SseData, ResponsesEventsTextDeltasAreEventsAndTheCompletedResponseEndsWithItsUsage) {
  RequestRecord r;
  r.start_s = 0;
  EXPECT_EQ(apply_sse_data(R"({"type":"response.created","sequence_number":0,"response":{"status":"in_progress"}})", 0.1, r),
            Outcome::Pending);
  EXPECT_EQ(apply_sse_data(R"({"type":"response.output_text.delta","delta":"Hi","item_id":"m"})", 0.2, r), Outcome::Pending);
  EXPECT_EQ(apply_sse_data(R"({"type":"response.output_text.delta","delta":" there","item_id":"m"})", 0.25, r), Outcome::Pending);
  EXPECT_EQ(apply_sse_data(R"({"type":"response.output_text.done","text":"Hi there"})", 0.3, r), Outcome::Pending);
  EXPECT_EQ(apply_sse_data(R"({"type":"response.incomplete","response":{"status":"incomplete",
      "usage":{"input_tokens":9,"output_tokens":3},"speculation":{"rounds":2,"drafted":4,"accepted":1}}})", 0.4, r),
            Outcome::Done);
  EXPECT_DOUBLE_EQ(r.first_token_s, 0.2);
  EXPECT_EQ(r.event_s.size(), 2u);
  EXPECT_EQ(r.finish_reason, "length");
  EXPECT_EQ(r.server.prompt_tokens, 9);
  EXPECT_EQ(r.server.completion_tokens, 3);
  EXPECT_EQ(r.server.drafted, 4);
  EXPECT_DOUBLE_EQ(r.end_s, 0.4);
  EXPECT_TRUE(r.ok());
  // A reply that fails: its error event names the code, and response.failed after it keeps it.
  RequestRecord f;
  EXPECT_EQ(apply_sse_data(R"({"type":"error","code":"invalid_prompt","message":"no token left"})", 0.1, f), Outcome::Failed);
  EXPECT_EQ(f.error_kind, "server:invalid_prompt");
  EXPECT_EQ(apply_sse_data(R"({"type":"response.failed","response":{"error":{"code":"server_error","message":"x"}}})", 0.2, f),
            Outcome::Failed);
  EXPECT_EQ(f.error_kind, "server:invalid_prompt");
  RequestRecord g;
  EXPECT_EQ(apply_sse_data(R"({"type":"response.completed"})", 0.1, g), Outcome::Failed);
  EXPECT_EQ(g.error_kind, "protocol");
}

TEST(HttpError, AnOpenAiErrorBodyNamesTheCodeOtherwiseTheStatus) {
  RequestRecord a, b;
  apply_http_error(429, R"({"error":{"code":"overloaded","message":"try later"}})", a);
  EXPECT_EQ(a.error_kind, "server:overloaded");
  EXPECT_EQ(a.error_message, "try later");
  apply_http_error(502, "<html>bad gateway</html>", b);
  EXPECT_EQ(b.error_kind, "http:502");
}

}  // namespace
}  // namespace specula::load
