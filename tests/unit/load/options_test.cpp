// specula-load's command line, URLs and prompt files: each mistake is a one-line usage error.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "tools/specula-load/options.h"
#include "tools/specula-load/prompts.h"
#include "tools/specula/args.h"

namespace specula::load {
namespace {

LoadOptions parse(std::vector<std::string> args) {
  args.insert(args.begin(), "specula-load");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  return *parse_options(static_cast<int>(argv.size()), argv.data());
}

void expect_usage_error(std::vector<std::string> args, const std::string& fragment) {
  try {
    parse(std::move(args));
    FAIL() << "expected a usage error mentioning " << fragment;
  } catch (const cli::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Url, WebSocketAndHttpUrlsSplitIntoHostPortAndPath) {
  const Target ws = parse_url("ws://127.0.0.1:8080/v1/ws");
  EXPECT_EQ(ws.protocol, Protocol::WebSocket);
  EXPECT_EQ(ws.host, "127.0.0.1");
  EXPECT_EQ(ws.port, "8080");
  EXPECT_EQ(ws.path, "/v1/ws");
  const Target http = parse_url("http://localhost:9000");
  EXPECT_EQ(http.protocol, Protocol::HttpSse);
  EXPECT_EQ(http.path, "/v1/chat/completions");
  const Target v6 = parse_url("ws://[::1]:8080");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.host_header(), "[::1]:8080");
  EXPECT_EQ(parse_url("ws://h/x").port, "80");
}

TEST(Url, BadUrlsAreUsageErrorsThatSayWhatIsWrong) {
  EXPECT_THROW(parse_url("127.0.0.1:8080"), cli::UsageError);
  EXPECT_THROW(parse_url("ftp://h:1/"), cli::UsageError);
  EXPECT_THROW(parse_url("wss://h:1/"), cli::UsageError);
  EXPECT_THROW(parse_url("ws://:8080/"), cli::UsageError);
  EXPECT_THROW(parse_url("ws://h:0/"), cli::UsageError);
  EXPECT_THROW(parse_url("ws://h:70000/"), cli::UsageError);
  EXPECT_THROW(parse_url("ws://h:8o8o/"), cli::UsageError);
}

TEST(Options, DefaultsAndOverrides) {
  const LoadOptions o = parse({"--url", "ws://127.0.0.1:1/v1/ws", "--prompts", "p.jsonl"});
  EXPECT_EQ(o.concurrency, 8);
  EXPECT_EQ(o.requests, 128);
  EXPECT_FALSE(o.max_tokens);
  const LoadOptions d = parse({"--url=ws://h:1", "--prompts=p", "--duration", "10", "--speculation-k", "4",
                               "--concurrency", "32", "--rate", "2.5", "--json"});
  EXPECT_EQ(d.requests, -1);  // unbounded: the duration ends the run
  EXPECT_EQ(d.speculation_k, 4);
  EXPECT_EQ(d.concurrency, 32);
  EXPECT_DOUBLE_EQ(d.rate, 2.5);
  EXPECT_TRUE(d.json);
}

TEST(Options, BadFlagsAreUsageErrors) {
  const std::vector<std::string> base = {"--url", "ws://h:1", "--prompts", "p"};
  auto with = [&](std::vector<std::string> extra) {
    auto a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  expect_usage_error({"--prompts", "p"}, "--url is required");
  expect_usage_error({"--url", "ws://h:1"}, "--prompts is required");
  expect_usage_error(with({"--concurrency", "0"}), "--concurrency");
  expect_usage_error(with({"--concurrency", "lots"}), "expects an integer");
  expect_usage_error(with({"--requests", "0"}), "--requests");
  expect_usage_error(with({"--rate", "-1"}), "--rate");
  expect_usage_error(with({"--temperature", "-0.5"}), "--temperature");
  expect_usage_error(with({"--top-p", "1.5"}), "--top-p");
  expect_usage_error(with({"--speculation-k", "many"}), "expects an integer");
  expect_usage_error(with({"--speculation-k", "off"}), "--draft none");
  expect_usage_error(with({"--speculation-k", "17"}), "[1, 16]");
  expect_usage_error(with({"--speculation-mode", "fast"}), "exact, block or coupled");
  expect_usage_error(with({"--max-tokens", "0"}), "--max-tokens");
  expect_usage_error(with({"--frobnicate"}), "unknown option --frobnicate");
  expect_usage_error(with({"--timeout"}), "needs a value");
}

TEST(Prompts, ReadsMessagesAndPlainPromptsAndSkipsBlankLines) {
  const std::string path = testing::TempDir() + "/load_prompts.jsonl";
  std::ofstream(path) << R"({"id":"a","messages":[{"role":"user","content":"Hi"}],"max_tokens":5})" << "\n\n"
                      << R"({"prompt":"Once"})" << "\n";
  const auto ps = load_prompts(path);
  ASSERT_EQ(ps.size(), 2u);
  EXPECT_EQ(ps[0].id, "a");
  EXPECT_EQ(ps[0].max_tokens, 5);
  EXPECT_EQ(ps[1].prompt, "Once");
  EXPECT_TRUE(ps[1].messages.is_null());
  EXPECT_NE(ps[1].id.find(":3"), std::string::npos);  // named by its line
  std::remove(path.c_str());
}

TEST(Prompts, ALinesPriorityIsReadAndMustBeAnInteger) {
  EXPECT_EQ(parse_prompt_line(nlohmann::json::parse(R"({"prompt":"a","priority":-3})"), "f:1").priority, -3);
  EXPECT_FALSE(parse_prompt_line(nlohmann::json::parse(R"({"prompt":"a"})"), "f:1").priority);
  for (const char* bad : {R"({"prompt":"a","priority":"high"})", R"({"prompt":"a","priority":1.5})",
                          R"({"prompt":"a","priority":9999999999})"}) {
    try {
      parse_prompt_line(nlohmann::json::parse(bad), "f:2");
      FAIL() << bad;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("f:2: \"priority\""), std::string::npos) << e.what();
    }
  }
}

TEST(Prompts, ProblemsNameTheFileAndLine) {
  const std::string path = testing::TempDir() + "/load_bad_prompts.jsonl";
  std::ofstream(path) << R"({"prompt":"ok"})" << "\n" << R"({"messages":"not a list"})" << "\n";
  try {
    load_prompts(path);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_prompts(path + ".missing"), std::runtime_error);
  std::ofstream(path) << "\n";
  EXPECT_THROW(load_prompts(path), std::runtime_error);  // no prompts at all
  std::remove(path.c_str());
}

TEST(Prompts, TheSharedChatSetLoads) {
  const auto ps = load_prompts(std::string(SPECULA_SHARED_DIR) + "/data/prompts/chat.jsonl");
  EXPECT_GE(ps.size(), 8u);
  EXPECT_FALSE(ps[0].messages.is_null());
}

}  // namespace
}  // namespace specula::load
