// Stop strings (held-back text, the cut before the first occurrence) and an engine destroyed
// while a stream is still open: the reader gets an error instead of waiting for ever.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "tests/unit/engine/default_model.h"
#include "actors/engine.h"
#include "actors/sampler.h"
#include "spec/generate.h"

namespace specula::actors {
namespace {

// Feeds `chunks` through release_text the way the sampler does; returns the text shown.
std::string shown_text(const std::vector<std::string>& chunks, const std::vector<std::string>& stops,
                       bool* stopped_out = nullptr) {
  std::string held, shown;
  bool stopped = false;
  for (const std::string& c : chunks) {
    held += c;
    shown += release_text(held, stops, stopped);
    if (stopped) break;
  }
  if (!stopped) shown += held;  // the end of the request: a partial stop string is text after all
  if (stopped_out) *stopped_out = stopped;
  return shown;
}

TEST(StopStrings, TextEndsBeforeTheFirstStopStringEvenWhenItSpansSeveralTokens) {
  bool stopped = false;
  EXPECT_EQ(shown_text({"Hello", " wor", "ld.", " More"}, {"world"}, &stopped), "Hello ");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(shown_text({"a", "bXc", "Yd"}, {"Y", "X"}), "ab");
}

TEST(StopStrings, TextThatMightStartAStopStringIsHeldBackUntilItCannot) {
  std::string held = "The end";
  bool stopped = false;
  EXPECT_EQ(release_text(held, {"ending"}, stopped), "The ");
  EXPECT_EQ(held, "end");
  held += "s";
  EXPECT_EQ(release_text(held, {"ending"}, stopped), "ends");
  EXPECT_EQ(held, "");
  EXPECT_FALSE(stopped);
}

TEST(StopStrings, APartialStopStringAtTheEndOfTheRequestIsShown) {
  bool stopped = true;
  EXPECT_EQ(shown_text({"one ", "two ", "thr"}, {"three"}, &stopped), "one two thr");
  EXPECT_FALSE(stopped);
}

TEST(StopStrings, WithKeepStopTheTextEndsAfterTheFirstStopStringTheFirstListedOnATie) {
  std::string held = "say cats and dogs";
  bool stopped = false;
  EXPECT_EQ(release_text(held, {"dogs", "cats"}, stopped, true), "say cats");
  EXPECT_TRUE(stopped);
  held = "say cats and dogs";
  EXPECT_EQ(release_text(held, {"cat", "cats"}, stopped, true), "say cat");
  held = "say cats and dogs";
  EXPECT_EQ(release_text(held, {"cats", "cat"}, stopped, true), "say cats");
  EXPECT_EQ(held, "");
}

TEST(StopStrings, BadStopListsAreRefusedNamingTheProblem) {
  EXPECT_THROW(validate_stop_strings({""}), std::invalid_argument);
  EXPECT_THROW(validate_stop_strings(std::vector<std::string>(kMaxStopStrings + 1, "x")), std::invalid_argument);
  EXPECT_THROW(validate_stop_strings({std::string(kMaxStopStringBytes + 1, 'x')}), std::invalid_argument);
  EXPECT_NO_THROW(validate_stop_strings({"\n\n", "User:"}));
}

std::unique_ptr<Engine> small_engine() {
  if (!std::filesystem::exists(default_model_path())) return nullptr;
  EngineConfig config;
  config.target = default_model_path();
  config.drafter = "ngram";
  config.device = "host";
  return std::make_unique<Engine>(config);
}

EngineRequest greedy_request(int max_tokens) {
  EngineRequest r;
  r.prompt = "Write three short sentences about the sea.";
  r.chat = true;
  r.max_tokens = max_tokens;
  return r;
}

TEST(EngineStopStrings, AStopStringFromTheGreedyTextEndsTheReplyJustBeforeIt) {
  auto engine = small_engine();
  ASSERT_TRUE(engine) << "the default model is missing: run scripts/setup.sh";
  const GenerateResult full = engine->generate_blocking(greedy_request(24));
  ASSERT_EQ(full.finish_reason, FinishReason::Length) << full.error;
  // A stop string from the middle of the text, starting at a word.
  const size_t at = full.text.find(' ', full.text.size() / 2);
  ASSERT_NE(at, std::string::npos) << full.text;
  const std::string stop = full.text.substr(at, 5);
  EngineRequest r = greedy_request(24);
  r.stop = {stop};
  const GenerateResult cut = engine->generate_blocking(r);
  EXPECT_EQ(cut.finish_reason, FinishReason::Stop);
  EXPECT_EQ(cut.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_LT(cut.tokens.size(), full.tokens.size());
  // The KV of the stopped request is freed.
  // idle() includes the KV release, which the verifier handles after the reply has ended.
  for (int i = 0; i < 1000 && !engine->idle(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(engine->idle());
  EXPECT_EQ(engine->kv_blocks_free(), engine->kv_blocks_total());
}

TEST(EngineStopStrings, AnEmptyStopStringIsRefusedAtSubmission) {
  auto engine = small_engine();
  ASSERT_TRUE(engine) << "the default model is missing: run scripts/setup.sh";
  EngineRequest r = greedy_request(4);
  r.stop = {""};
  EXPECT_THROW(engine->start(r), std::invalid_argument);
}

TEST(EndOfTurnTokens, TheMarkersAChatTemplateWritesThatAreSingleTokensOfTheModelEndGeneration) {
  ASSERT_TRUE(std::filesystem::exists(default_model_path())) << "the default model is missing: run scripts/setup.sh";
  const LoadedModel m = load_model(default_model_path());
  const int32_t im_end = m.tokenizer->token_id("<|im_end|>"), endoftext = m.tokenizer->token_id("<|endoftext|>");
  ASSERT_GE(im_end, 0);
  ASSERT_GE(endoftext, 0);
  auto has = [](const std::vector<int32_t>& ids, int32_t id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); };
  const std::vector<int32_t> own = default_stop_ids(m);
  EXPECT_TRUE(has(own, im_end));
  EXPECT_FALSE(has(own, endoftext));  // SmolLM2's template does not write it: not a stop (the control)
  // A --chat-template ending turns with <|endoftext|> (a token of SmolLM2) and Gemma's
  // <end_of_turn> (not one): the first is added, the second cannot be.
  const ChatTemplate other = ChatTemplate::from_option("{% for m in messages %}{{ m.content }}<|endoftext|>{% endfor %}<end_of_turn>");
  const std::vector<int32_t> with = default_stop_ids(m, &other);
  EXPECT_TRUE(has(with, endoftext));
  EXPECT_EQ(with.size(), own.size() + 1);
}

TEST(EngineShutdown, AStreamStillOpenWhenTheEngineIsDestroyedEndsWithAnError) {
  auto engine = small_engine();
  ASSERT_TRUE(engine) << "the default model is missing: run scripts/setup.sh";
  TokenStream stream = engine->start(greedy_request(200));
  const StreamEvent first = stream.next_blocking();
  ASSERT_EQ(first.kind, StreamEvent::Kind::Token) << first.error;
  // A reader blocked on another thread must be woken by the shutdown.
  std::thread reader([&] {
    for (;;) {
      const StreamEvent ev = stream.next_blocking();
      if (ev.terminal()) {
        EXPECT_EQ(ev.kind, StreamEvent::Kind::Error);
        EXPECT_NE(ev.error.find("shut down"), std::string::npos) << ev.error;
        return;
      }
    }
  });
  engine.reset();
  reader.join();
  EXPECT_TRUE(stream.ended());
  stream.cancel();  // no engine to call any more: nothing happens
}

}  // namespace
}  // namespace specula::actors
