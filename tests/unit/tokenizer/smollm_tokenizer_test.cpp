// The default model's tokenizer (SmolLM2, GGUF pre "smollm"): digit splitting, its special
// tokens, and its chat template turned into ids. Full parity with Hugging Face over thousands
// of strings is tests/oracle/test_tokenizer_parity.py.
#include <gtest/gtest.h>

#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tokenizer_test_support.h"

namespace specula {
namespace {

class SmolLM : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto path = test::default_model_path();
    ASSERT_TRUE(std::filesystem::exists(path)) << "the default model is missing at " << path
                                               << "; scripts/setup.sh fetches it";
    gguf_ = std::make_unique<GgufFile>(path.string());
    tok_ = Tokenizer::from_gguf(*gguf_);
  }
  static void TearDownTestSuite() {
    tok_.reset();
    gguf_.reset();
  }
  int32_t id(const std::string& token) const {
    const int32_t i = tok_->token_id(token);
    EXPECT_GE(i, 0) << "'" << token << "' is not in the vocabulary";
    return i;
  }
  static inline std::unique_ptr<GgufFile> gguf_;
  static inline std::shared_ptr<Tokenizer> tok_;
};

TEST_F(SmolLM, SplitsDigitsOneByOneForSmolLM) {
  EXPECT_EQ(tok_->encode("2024"), (std::vector<int32_t>{id("2"), id("0"), id("2"), id("4")}));
  // The space before a number stays its own piece, because the digit split comes first.
  EXPECT_EQ(tok_->encode(" 12"), (std::vector<int32_t>{id("\xc4\xa0"), id("1"), id("2")}));
  // SmolLM2 has no multi-digit tokens, so for ASCII digits the split hardly shows; "½" is a
  // number too, and only the digit step keeps its space from merging with its first byte.
  EXPECT_EQ(tok_->encode(" \xc2\xbd"), (std::vector<int32_t>{id("\xc4\xa0"), id("\xc3\x82\xc2\xbd")}));
}

TEST_F(SmolLM, KeepsALeadingSpaceWithTheWordAfterIt) {
  EXPECT_EQ(tok_->encode("Hello world"), (std::vector<int32_t>{id("Hello"), id("\xc4\xa0world")}));
}

TEST_F(SmolLM, KnowsItsSpecialTokens) {
  EXPECT_EQ(tok_->vocab_size(), 49152);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_ids(), (std::vector<int32_t>{2}));
  for (int32_t i = 0; i <= 16; ++i) EXPECT_TRUE(tok_->is_special(i)) << i;
  EXPECT_FALSE(tok_->is_special(17));
  EXPECT_EQ(tok_->token_string(1), "<|im_start|>");
}

TEST_F(SmolLM, ParsesSpecialTokensWrittenInTheTextOnlyWhenAsked) {
  const std::string text = "<|im_start|>user\nhi<|im_end|>";
  const std::vector<int32_t> parsed = tok_->encode(text, true);
  ASSERT_GE(parsed.size(), 3u);
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  const std::vector<int32_t> literal = tok_->encode(text, false);
  for (int32_t i : literal) EXPECT_FALSE(tok_->is_special(i)) << i;
  EXPECT_EQ(tok_->decode(parsed), text);
  EXPECT_EQ(tok_->decode(literal), text);
  EXPECT_EQ(tok_->decode(parsed, /*skip_special=*/true), "user\nhi");
}

TEST_F(SmolLM, ChatPromptStartsWithTheDefaultSystemTurn) {
  const ChatTemplate tpl = ChatTemplate::from_template_text(gguf_->get_string("tokenizer.chat_template"));
  ASSERT_EQ(tpl.kind(), ChatTemplate::Kind::ChatML);
  const std::string prompt = tpl.render({{"user", "What is 2+2?"}});
  EXPECT_EQ(prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  const std::vector<int32_t> ids = tok_->encode(prompt);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], id("system"));
  EXPECT_EQ(ids[2], id("\xc4\x8a"));  // "\n"
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 3);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
  EXPECT_EQ(tok_->decode(ids), prompt);
}

TEST_F(SmolLM, RoundTripsMixedScriptsAndWhitespace) {
  const std::string text = "Caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80\t\t x  \n\n  3.14159 def f(x):\r\n";
  EXPECT_EQ(tok_->decode(tok_->encode(text)), text);
}

}  // namespace
}  // namespace specula
