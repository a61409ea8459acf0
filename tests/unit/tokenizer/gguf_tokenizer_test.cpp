// Tokenizer::from_gguf on tiny vocabulary-only GGUF files: the pre-tokenizer chosen by
// tokenizer.ggml.pre, token types, and the metadata it refuses.
#include <gtest/gtest.h>

#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "model/tensor.h"
#include "model/tokenizer.h"
#include "tokenizer_test_support.h"

namespace specula {
namespace {

// The 256 byte characters (id = byte), then `extra` tokens; merges as given.
test::VocabGgufWriter vocab_gguf(const std::string& pre, const std::vector<std::string>& extra,
                                 const std::vector<std::string>& merges) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_level::char_of_byte(static_cast<uint8_t>(b)));
  tokens.insert(tokens.end(), extra.begin(), extra.end());
  test::VocabGgufWriter w;
  w.set("tokenizer.ggml.model", std::string("gpt2"));
  if (!pre.empty()) w.set("tokenizer.ggml.pre", pre);
  w.set("tokenizer.ggml.tokens", tokens);
  w.set("tokenizer.ggml.token_type", std::vector<int32_t>(tokens.size(), 1));
  w.set("tokenizer.ggml.merges", merges);
  return w;
}

std::shared_ptr<Tokenizer> load(const test::VocabGgufWriter& w) {
  const auto path = test::scratch_dir() / "vocab.gguf";
  w.write(path);
  return Tokenizer::from_gguf(GgufFile(path.string()));
}

void expect_refused(const test::VocabGgufWriter& w, std::initializer_list<std::string> parts) {
  const auto path = test::scratch_dir() / "vocab.gguf";
  w.write(path);
  test::expect_error<ModelError>([&] { Tokenizer::from_gguf(GgufFile(path.string())); }, parts);
}

TEST(GgufTokenizer, LlamaBpeTakesAPieceThatIsInTheVocabularyWhole) {
  // ignore_merges: "abc" is a token, so it is not built from the "b c" merge.
  EXPECT_EQ(load(vocab_gguf("llama-bpe", {"bc", "abc"}, {"b c"}))->encode("abc"), (std::vector<int32_t>{257}));
  EXPECT_EQ(load(vocab_gguf("gpt-2", {"bc", "abc"}, {"b c"}))->encode("abc"), (std::vector<int32_t>{'a', 256}));
}

TEST(GgufTokenizer, LlamaBpeSplitsNumbersIntoGroupsOfThree) {
  // "12345" is "123" + "45" for Llama 3, so the "3 4" merge cannot apply; GPT-2 keeps one run.
  EXPECT_EQ(load(vocab_gguf("llama-bpe", {"34"}, {"3 4"}))->encode("12345"),
            (std::vector<int32_t>{'1', '2', '3', '4', '5'}));
  EXPECT_EQ(load(vocab_gguf("gpt-2", {"34"}, {"3 4"}))->encode("12345"), (std::vector<int32_t>{'1', '2', 256, '5'}));
}

TEST(GgufTokenizer, SmollmSplitsEveryDigit) {
  auto tok = load(vocab_gguf("smollm", {"12"}, {"1 2"}));
  EXPECT_EQ(tok->encode("12"), (std::vector<int32_t>{'1', '2'}));
}

TEST(GgufTokenizer, ControlAndUserDefinedTokensAreRecognisedInText) {
  auto w = vocab_gguf("gpt-2", {"<ctl>", "<usr>"}, {});
  std::vector<int32_t> types(258, 1);
  types[256] = 3;
  types[257] = 4;
  w.set("tokenizer.ggml.token_type", types);
  auto tok = load(w);
  EXPECT_EQ(tok->encode("<ctl><usr>"), (std::vector<int32_t>{256, 257}));
  // Without parse_special only the control token is taken literally.
  const std::vector<int32_t> literal = tok->encode("<ctl><usr>", false);
  EXPECT_EQ(literal.back(), 257);
  EXPECT_EQ(literal.size(), 6u);
  EXPECT_TRUE(tok->is_special(256));
  EXPECT_FALSE(tok->is_special(257));
}

TEST(GgufTokenizer, ReadsBosAndEveryEndOfTurnIdAsEos) {
  auto w = vocab_gguf("gpt-2", {}, {});
  w.set("tokenizer.ggml.bos_token_id", uint32_t{10});
  w.set("tokenizer.ggml.eos_token_id", uint32_t{11});
  w.set("tokenizer.ggml.eot_token_id", uint32_t{12});
  auto tok = load(w);
  EXPECT_EQ(tok->bos_id(), 10);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{11, 12}));
}

TEST(GgufTokenizer, RefusesAnUnknownPreTokenizerNamingIt) {
  expect_refused(vocab_gguf("mystery-pre", {}, {}), {"tokenizer.ggml.pre", "'mystery-pre'", "smollm"});
}

TEST(GgufTokenizer, RefusesAFileWithoutAPreTokenizer) {
  expect_refused(vocab_gguf("", {}, {}), {"tokenizer.ggml.pre is missing"});
}

TEST(GgufTokenizer, RefusesSentencePieceVocabularies) {
  auto w = vocab_gguf("gpt-2", {}, {});
  w.set("tokenizer.ggml.model", std::string("llama"));
  expect_refused(w, {"'llama'", "SentencePiece"});
}

TEST(GgufTokenizer, RefusesMergesOfUnknownTokens) {
  expect_refused(vocab_gguf("gpt-2", {}, {"a b"}), {"merge #0", "'ab'", "not in the vocabulary"});
  expect_refused(vocab_gguf("gpt-2", {}, {"ab"}), {"tokenizer.ggml.merges[0]", "'ab'"});
}

TEST(GgufTokenizer, RefusesTokenTypesThatDoNotMatchTheTokens) {
  auto w = vocab_gguf("gpt-2", {}, {});
  w.set("tokenizer.ggml.token_type", std::vector<int32_t>(3, 1));
  expect_refused(w, {"token_type has 3 entries for 256 tokens"});
}

TEST(GgufTokenizer, RefusesAnEosIdOutsideTheVocabulary) {
  auto w = vocab_gguf("gpt-2", {}, {});
  w.set("tokenizer.ggml.eos_token_id", uint32_t{999});
  expect_refused(w, {"eos id 999", "256 tokens"});
}

// The stand-in vocabulary of `bench decode --shape` (random weights at Llama 3.2's 128256 logits).
TEST(NumberedTokenizer, DecodesEveryIdAndEncodesTextIntoByteTokens) {
  const auto tok = Tokenizer::numbered(128256);
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_TRUE(tok->eos_ids().empty());
  const std::vector<int32_t> ids = {256, 128255, 'h', 'i'};
  EXPECT_EQ(tok->decode(ids), " t256 t128255hi");
  EXPECT_EQ(tok->encode("ok"), (std::vector<int32_t>{'o', 'k'}));
  test::expect_error<std::invalid_argument>([] { Tokenizer::numbered(255); }, {"256 byte tokens", "255"});
}

}  // namespace
}  // namespace specula
