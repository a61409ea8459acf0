// A reply's reasoning (<think> ... </think>) read apart from its answer, as it grows.
#include "model/reasoning.h"

#include <gtest/gtest.h>

#include <string>

namespace specula {
namespace {

// A split's parts, owned (a split views the text it splits).
struct Split {
  std::optional<std::string> reasoning;
  std::string content;
  bool answering = true;
};

// Splits every start of `reply` a byte at a time: the reasoning and the answer each only grow and
// are starts of the whole reply's. Returns the whole reply's split.
Split split_growing(const std::string& reply, bool open) {
  const ReasoningSplit whole = split_reasoning(reply, open, true);
  ReasoningSplit before{std::nullopt, std::string_view(), false};
  for (size_t n = 0; n <= reply.size(); ++n) {
    const ReasoningSplit now = split_reasoning(std::string_view(reply).substr(0, n), open, false);
    const std::string at = "after " + std::to_string(n) + " bytes of " + reply;
    const std::string_view reasoning = now.reasoning.value_or(""), was = before.reasoning.value_or("");
    EXPECT_TRUE(reasoning.starts_with(was)) << at;
    EXPECT_TRUE(whole.reasoning.value_or("").starts_with(reasoning)) << at;
    EXPECT_TRUE(now.content.starts_with(before.content)) << at;
    EXPECT_TRUE(whole.content.starts_with(now.content)) << at;
    before = now;
  }
  return {whole.reasoning ? std::optional<std::string>(*whole.reasoning) : std::nullopt, std::string(whole.content), whole.answering};
}

TEST(Reasoning, ATemplateThatOpensTheReasoningMakesTheReplyReasoningUntilItCloses) {
  const Split r = split_growing("Paris is in France.\n</think>\n\nThe capital is Paris.", true);
  EXPECT_EQ(r.reasoning, "Paris is in France.\n");
  EXPECT_EQ(r.content, "\n\nThe capital is Paris.");
  EXPECT_TRUE(r.answering);
  // Cut while it reasons: all reasoning, no answer.
  const Split cut = split_growing("Let me think about </thi", true);
  EXPECT_EQ(cut.reasoning, "Let me think about </thi");
  EXPECT_FALSE(cut.answering);
  // An end that may begin </think> is held until it cannot.
  EXPECT_EQ(split_reasoning("Hmm </th", true, false).reasoning, "Hmm ");
}

TEST(Reasoning, AReplyOpeningWithThinkReasonsAndAnyOtherIsAllAnswer) {
  const Split r = split_growing("\n<think>x < y</think>Yes.", false);
  EXPECT_EQ(r.reasoning, "x < y");
  EXPECT_EQ(r.content, "Yes.");
  const Split plain = split_growing("  <thinking> is a word; so is </think>.", false);
  EXPECT_FALSE(plain.reasoning);
  EXPECT_EQ(plain.content, "  <thinking> is a word; so is </think>.");
  EXPECT_TRUE(plain.answering);
  // While the reply may still open one, nothing is the answer yet.
  EXPECT_EQ(split_reasoning(" <thi", false, false).content, "");
  EXPECT_EQ(split_reasoning(" <thi", false, true).content, " <thi");
}

TEST(Reasoning, APromptOpensTheReasoningWhenItEndsInsideAThinkBlock) {
  EXPECT_TRUE(opens_reasoning("<｜Assistant｜><think>\n"));
  EXPECT_FALSE(opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));  // Qwen3 with enable_thinking false
  EXPECT_FALSE(opens_reasoning("<|im_start|>assistant\n"));
  EXPECT_TRUE(leaves_reasoning_open("<think>\nFirst, I should"));
  EXPECT_FALSE(leaves_reasoning_open("<think>done</think> The answer"));
  EXPECT_FALSE(leaves_reasoning_open("The answer"));
}

}  // namespace
}  // namespace specula
