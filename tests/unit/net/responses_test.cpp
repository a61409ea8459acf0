// The Responses API's reading as a chat request and its kept responses (net/responses.h): the
// translation field by field against chat requests written by hand, and the store's bounds.
#include "net/responses.h"

#include <gtest/gtest.h>

#include <string>

#include "net/api_request.h"

namespace specula::net {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

ordered_json chat_of(const std::string& body, const ResponseStore& store = ResponseStore()) {
  ordered_json conversation;
  return chat_request_of_response(ordered_json::parse(body), store, "", 1000, 100, conversation);
}

std::string refusal(const std::string& body) {
  try {
    chat_of(body);
  } catch (const ApiError& e) {
    return e.param + ": " + e.what();
  }
  return "accepted";
}

TEST(ResponsesRequest, ReadsAsTheChatRequestItStandsFor) {
  const ordered_json chat = chat_of(R"({
    "model": "m", "instructions": "Be brief.", "max_output_tokens": 30, "temperature": 0, "top_k": 5, "store": false,
    "metadata": {"a": "b"}, "n": 3, "max_tokens": 7, "stream": true,
    "input": [
      {"role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
      {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
      {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "noon"}]}],
    "tools": [{"type": "function", "name": "get_weather", "description": "d", "parameters": {"type": "object"}, "strict": true}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "text": {"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": true}},
    "truncation": "auto"})");
  const ordered_json want = ordered_json::parse(R"({
    "model": "m", "temperature": 0, "top_k": 5, "stream": true,
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
        {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
      {"role": "tool", "tool_call_id": "c2", "content": "noon"}],
    "max_tokens": 30,
    "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": true}},
    "truncate_prompt_tokens": 970,
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})");
  EXPECT_EQ(chat, want) << chat.dump(2);
  EXPECT_EQ(chat_of(R"({"input": "hi", "text": {"format": {"type": "json_object"}}, "tool_choice": "none"})"),
            ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"},
                                    "tool_choice": "none"})"));
}

TEST(ResponsesRequest, IncludesLogprobsAreTheChatRoutesLogprobsAndTopLogprobsAloneAsksForNone) {
  EXPECT_EQ(chat_of(R"({"input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 3})"),
            ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 3})"));
  EXPECT_EQ(chat_of(R"({"input": "hi", "include": ["reasoning.encrypted_content", "message.output_text.logprobs"]})"),
            ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true})"));
  EXPECT_EQ(chat_of(R"({"input": "hi", "top_logprobs": 5})"), ordered_json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"));
}

TEST(ResponsesRequest, APreviousResponsesConversationComesFirstWithoutItsInstructions) {
  ResponseStore store;
  ResponseStore::Stored kept;
  kept.conversation = ordered_json::parse(R"([{"role": "user", "content": "I am Ada."}, {"role": "assistant", "content": "Hi Ada."}])");
  kept.response = json{{"id", "resp_1"}};
  ASSERT_TRUE(store.put("resp_1", kept));
  ordered_json conversation;
  const ordered_json chat = chat_request_of_response(
      ordered_json::parse(R"({"previous_response_id": "resp_1", "instructions": "Now terse.", "input": "Who am I?"})"), store, "", 1000,
      100, conversation);
  EXPECT_EQ(chat["messages"], ordered_json::parse(R"([{"role": "system", "content": "Now terse."}, {"role": "user", "content": "I am Ada."},
      {"role": "assistant", "content": "Hi Ada."}, {"role": "user", "content": "Who am I?"}])"));
  EXPECT_EQ(conversation, ordered_json::parse(R"([{"role": "user", "content": "I am Ada."}, {"role": "assistant", "content": "Hi Ada."},
      {"role": "user", "content": "Who am I?"}])"));
}

TEST(ResponsesRequest, WhatTheRouteCannotServeIsRefusedNamingTheField) {
  EXPECT_EQ(refusal(R"({})"), "input: input is required");
  EXPECT_EQ(refusal(R"({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]})").rfind(
                "input: input[0].content[0].type \"input_image\" is not served", 0),
            0u);
  EXPECT_EQ(refusal(R"({"input": "x", "tools": [{"type": "web_search"}]})").rfind("tools: tools[0].type must be \"function\"", 0), 0u);
  EXPECT_EQ(refusal(R"({"input": "x", "previous_response_id": "resp_gone"})").rfind(
                "previous_response_id: Previous response with id 'resp_gone' not found", 0),
            0u);
  EXPECT_EQ(refusal(R"({"input": [{"role": "tool", "content": "x"}]})").rfind("input: input[0].role must be", 0), 0u);
  EXPECT_EQ(refusal(R"({"input": "x", "include": ["reasoning.encrypted_content"]})"), "accepted");
  EXPECT_NE(refusal(R"({"input": "x", "include": ["file_search_call.results"]})").find("include: "), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "x", "top_logprobs": 21})").find("top_logprobs: "), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "x", "top_logprobs": -1})").find("top_logprobs: "), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "x", "background": 1})").find("background: "), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "x", "background": true, "store": false})").find("store: "), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "x", "background": true, "stream": true})").find("stream: "), std::string::npos);
  EXPECT_EQ(refusal(R"({"input": "x", "background": true})"), "accepted");
  EXPECT_NE(refusal(R"({"input": "x", "store": 1})").find("store: "), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "x", "truncation": "later"})").find("truncation: "), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "x", "text": {"format": {"type": "xml"}}})").find("text.format: "), std::string::npos);
  EXPECT_NE(refusal(R"({"input": "x", "tool_choice": {"type": "allowed_tools"}})").find("tool_choice: "), std::string::npos);
}

TEST(ResponseOutput, AReplysMessageIsItsReasoningTextAndCallItemsInThatOrder) {
  const json message = json::parse(R"({"role": "assistant", "content": "Let me check.", "reasoning_content": "Think.",
      "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})");
  const json items = response_output_items(message, "resp_ab", "incomplete");
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[0], json::parse(R"({"type": "reasoning", "id": "rs_ab", "summary": [], "status": "incomplete",
      "content": [{"type": "reasoning_text", "text": "Think."}]})"));
  EXPECT_EQ(items[1], json::parse(R"({"type": "message", "id": "msg_ab", "status": "incomplete", "role": "assistant",
      "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]})"));
  EXPECT_EQ(items[2], json::parse(R"({"type": "function_call", "id": "fc_ab_0", "call_id": "call_1", "name": "f", "arguments": "{}",
      "status": "incomplete"})"));
  // Calls alone: no message; an empty reasoning block: no item; nothing at all: an empty message.
  EXPECT_EQ(response_output_items(json::parse(R"({"content": null, "tool_calls": [{"id": "c", "function": {"name": "f",
      "arguments": "{}"}}]})"), "resp_x", "completed").size(), 1u);
  const json empty = response_output_items(json::parse(R"({"content": "", "reasoning_content": ""})"), "resp_x", "completed");
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(empty[0]["type"], "message");
}

TEST(ResponseStore, KeepsTheLatestWithinItsBoundsAndForgetsWhatIsDeleted) {
  ResponseStore store;
  ResponseStore::Stored small;
  small.conversation = ordered_json::array();
  small.response = json{{"x", 1}};
  for (std::size_t i = 0; i < ResponseStore::kMaxResponses + 5; ++i) ASSERT_TRUE(store.put("r" + std::to_string(i), small));
  EXPECT_EQ(store.size(), ResponseStore::kMaxResponses);
  EXPECT_EQ(store.find("r4", ""), nullptr);
  ASSERT_NE(store.find("r5", ""), nullptr);
  // Deleting forgets it at once; the rest keep their order (the oldest still goes first).
  EXPECT_TRUE(store.erase("r5", ""));
  EXPECT_FALSE(store.erase("r5", ""));
  ASSERT_TRUE(store.put("new", small));
  EXPECT_NE(store.find("r6", ""), nullptr);
  ASSERT_TRUE(store.put("newer", small));
  EXPECT_EQ(store.find("r6", ""), nullptr);
  EXPECT_EQ(store.size(), ResponseStore::kMaxResponses);
  // Many kept and deleted leave nothing behind: the bound still counts only what is kept.
  ASSERT_TRUE(store.erase("r100", ""));
  for (int i = 0; i < 5000; ++i) {
    ASSERT_TRUE(store.put("tmp", small));
    ASSERT_TRUE(store.erase("tmp", ""));
  }
  EXPECT_EQ(store.size(), ResponseStore::kMaxResponses - 1);
  EXPECT_NE(store.find("r7", ""), nullptr);
  // By bytes: entries of 1 MiB push the oldest out past 64 MiB; one over an eighth of that is
  // not kept, and pushes nothing out.
  ResponseStore big;
  ResponseStore::Stored mib;
  mib.conversation = ordered_json::array({std::string(1 << 20, 'a')});
  mib.response = json::object();
  for (int i = 0; i < 70; ++i) ASSERT_TRUE(big.put("m" + std::to_string(i), mib));
  EXPECT_LT(big.size(), 64u);
  EXPECT_GT(big.size(), 60u);
  EXPECT_NE(big.find("m69", ""), nullptr);
  const std::size_t before = big.size();
  ResponseStore::Stored huge;
  huge.conversation = ordered_json::array({std::string(ResponseStore::kMaxEntryBytes, 'b')});
  huge.response = json::object();
  EXPECT_FALSE(big.put("huge", huge));
  EXPECT_EQ(big.size(), before);
  EXPECT_EQ(big.find("huge", ""), nullptr);
}

TEST(ResponsesRequest, AResponseStillInProgressCannotBeContinued) {
  ResponseStore store;
  ResponseStore::Stored kept;
  kept.conversation = ordered_json::parse(R"([{"role": "user", "content": "Hi."}])");
  kept.response = json{{"id", "resp_bg"}, {"status", "in_progress"}};
  ASSERT_TRUE(store.put("resp_bg", kept));
  ordered_json conversation;
  const ordered_json body = ordered_json::parse(R"({"previous_response_id": "resp_bg", "input": "And?"})");
  EXPECT_THROW(chat_request_of_response(body, store, "", 1000, 100, conversation), ApiError);
  store.find_mutable("resp_bg", "")->response["status"] = "cancelled";  // ended: its input is continued
  EXPECT_EQ(chat_request_of_response(body, store, "", 1000, 100, conversation)["messages"].size(), 2u);
}

TEST(ResponseStore, AFloodingOwnerPushesOutItsOwnFirstAndPinnedOnesStay) {
  ResponseStore store;
  ResponseStore::Stored small;
  small.conversation = ordered_json::array();
  small.response = json{{"x", 1}};
  small.owner = "b";
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(store.put("b" + std::to_string(i), small));
  ResponseStore::Stored running = small;
  running.owner = "a";
  running.pinned = true;  // the oldest of all, and a's
  ASSERT_TRUE(store.put("a-running", running));
  small.owner = "a";
  for (std::size_t i = 0; i < ResponseStore::kMaxResponses + 50; ++i) ASSERT_TRUE(store.put("a" + std::to_string(i), small));
  EXPECT_EQ(store.size(), ResponseStore::kMaxResponses);
  for (int i = 0; i < 10; ++i) EXPECT_NE(store.find("b" + std::to_string(i), "b"), nullptr) << i;  // b's all stay
  EXPECT_NE(store.find("a-running", "a"), nullptr);
  EXPECT_EQ(store.find("a0", "a"), nullptr);  // a's oldest went
  EXPECT_NE(store.find("a" + std::to_string(ResponseStore::kMaxResponses + 49), "a"), nullptr);
  // Unpinned (it ended), it goes as the others do.
  store.find_mutable("a-running", "a")->pinned = false;
  ASSERT_TRUE(store.put("a-last", small));
  EXPECT_EQ(store.find("a-running", "a"), nullptr);
  // One owner alone: the oldest first, as before.
  ResponseStore one;
  small.owner = "";
  for (std::size_t i = 0; i < ResponseStore::kMaxResponses + 1; ++i) ASSERT_TRUE(one.put("r" + std::to_string(i), small));
  EXPECT_EQ(one.find("r0", ""), nullptr);
  EXPECT_NE(one.find("r1", ""), nullptr);
}

TEST(ResponseStore, TheResponseJustKeptIsNotPushedOutWhereOnlyRunningOnesAreLeft) {
  ResponseStore store;
  ResponseStore::Stored running;
  running.conversation = ordered_json::array({std::string(ResponseStore::kMaxEntryBytes - 4096, 'r')});
  running.response = json::object();
  running.owner = "a";
  running.pinned = true;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(store.put("run" + std::to_string(i), running));
  ResponseStore::Stored done;
  done.conversation = ordered_json::array({std::string(1 << 20, 'd')});
  done.response = json::object();
  done.owner = "a";
  ASSERT_TRUE(store.put("done", done));  // over 64 MiB with the running ones, and it stays
  EXPECT_NE(store.find("done", "a"), nullptr);
  EXPECT_EQ(store.size(), 9u);
  ASSERT_TRUE(store.put("later", done));  // the next one pushes out the older unpinned one
  EXPECT_EQ(store.find("done", "a"), nullptr);
  EXPECT_NE(store.find("later", "a"), nullptr);
  for (int i = 0; i < 8; ++i) EXPECT_NE(store.find("run" + std::to_string(i), "a"), nullptr);
}

TEST(ResponseStore, AResponseIsItsOwnersAndToAnotherIsNotThere) {
  ResponseStore store;
  ResponseStore::Stored kept;
  kept.conversation = ordered_json::parse(R"([{"role": "user", "content": "I am Ada."}, {"role": "assistant", "content": "Hi."}])");
  kept.response = json{{"id", "resp_a"}};
  kept.owner = "key a";
  ASSERT_TRUE(store.put("resp_a", kept));
  EXPECT_NE(store.find("resp_a", "key a"), nullptr);
  EXPECT_EQ(store.find("resp_a", "key b"), nullptr);
  EXPECT_EQ(store.find("resp_a", ""), nullptr);
  // Another's previous_response_id is refused as one never kept, and its delete deletes nothing.
  for (const std::string other : {"key b", ""}) {
    ordered_json conversation;
    try {
      chat_request_of_response(ordered_json::parse(R"({"previous_response_id": "resp_a", "input": "Who am I?"})"), store, other,
                               1000, 100, conversation);
      ADD_FAILURE() << "another owner continued the response";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, "previous_response_id");
      EXPECT_EQ(std::string(e.what()).rfind("Previous response with id 'resp_a' not found", 0), 0u) << e.what();
    }
    EXPECT_FALSE(store.erase("resp_a", other));
  }
  ordered_json conversation;
  chat_request_of_response(ordered_json::parse(R"({"previous_response_id": "resp_a", "input": "Who am I?"})"), store, "key a", 1000,
                           100, conversation);
  EXPECT_EQ(conversation.size(), 3u);
  EXPECT_TRUE(store.erase("resp_a", "key a"));
  EXPECT_EQ(store.size(), 0u);
}

}  // namespace
}  // namespace specula::net
