// The GPT-2 tokenizer test vectors from llama.cpp (expected ids made with Hugging Face
// tokenizers), run through Tokenizer::from_gguf on the vocabulary-only GGUF.
#include <gtest/gtest.h>

#include <atomic>
#include <sstream>
#include <thread>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "tokenizer_test_support.h"

namespace specula {
namespace {

struct Vector {
  std::string text;
  std::vector<int32_t> ids;
};

// .inp holds the inputs, each followed by a line `__ggml_vocab_test__`; .out holds one line of
// space-separated ids per input.
std::vector<Vector> load_vectors(const std::filesystem::path& inp, const std::filesystem::path& out) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  const std::string text = test::read_file(inp);
  std::vector<Vector> v;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = text.find(sep, pos);
    if (end == std::string::npos) break;
    v.push_back({text.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(test::read_file(out));
  std::string line;
  for (Vector& e : v) {
    if (!std::getline(lines, line)) break;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) e.ids.push_back(id);
  }
  return v;
}

class Gpt2Vectors : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const auto dir = test::shared_dir() / "data" / "tokenizer-vectors";
    ASSERT_TRUE(std::filesystem::exists(dir / "ggml-vocab-gpt-2.gguf")) << "missing shared data in " << dir;
    tok_ = Tokenizer::from_gguf(GgufFile((dir / "ggml-vocab-gpt-2.gguf").string()));
    vectors_ = load_vectors(dir / "ggml-vocab-gpt-2.gguf.inp", dir / "ggml-vocab-gpt-2.gguf.out");
  }
  static inline std::shared_ptr<Tokenizer> tok_;
  static inline std::vector<Vector> vectors_;
};

TEST_F(Gpt2Vectors, AllFortySixVectorsAreRead) {
  ASSERT_EQ(vectors_.size(), 46u);
  EXPECT_EQ(vectors_[0].text, "ied 4 \xc2\xbd months");
  EXPECT_EQ(vectors_[0].ids, (std::vector<int32_t>{798, 604, 25208, 1933}));
  EXPECT_EQ(vectors_[2].text, "");
  EXPECT_TRUE(vectors_[2].ids.empty());
}

TEST_F(Gpt2Vectors, EncodeGivesTheReferenceIds) {
  for (const Vector& v : vectors_) EXPECT_EQ(tok_->encode(v.text), v.ids) << "input: [" << v.text << "]";
}

TEST_F(Gpt2Vectors, DecodeGivesBackTheInput) {
  for (const Vector& v : vectors_) EXPECT_EQ(tok_->decode(v.ids), v.text);
}

TEST_F(Gpt2Vectors, VocabularyAndSpecialTokensComeFromTheMetadata) {
  EXPECT_EQ(tok_->vocab_size(), 50257);
  EXPECT_EQ(tok_->bos_id(), 50256);
  EXPECT_EQ(tok_->eos_ids(), (std::vector<int32_t>{50256}));
  EXPECT_TRUE(tok_->is_special(50256));
  EXPECT_FALSE(tok_->is_special(50255));
  EXPECT_EQ(tok_->token_string(50256), "<|endoftext|>");
  EXPECT_EQ(tok_->token_id("\xc4\xa0the"), 262);  // "Ġthe"
  EXPECT_EQ(tok_->token_bytes(262), " the");
  EXPECT_EQ(tok_->token_id("no such token"), -1);
}

TEST_F(Gpt2Vectors, SpecialTokenTextBecomesOneIdOnlyWhenParsingSpecials) {
  const std::string text = "a<|endoftext|>b";
  EXPECT_EQ(tok_->encode(text, true), (std::vector<int32_t>{64, 50256, 65}));
  const std::vector<int32_t> literal = tok_->encode(text, false);
  EXPECT_EQ(std::count(literal.begin(), literal.end(), 50256), 0);
  EXPECT_EQ(tok_->decode(literal), text);
  EXPECT_EQ(tok_->decode(std::vector<int32_t>{64, 50256, 65}, /*skip_special=*/true), "ab");
}

TEST_F(Gpt2Vectors, EncodesBytesThatAreNotUtf8AsByteTokens) {
  const std::string text = std::string("ok \xff\xfe bad \xe6\x97 cut ") + '\0' + " nul";
  std::string bytes;
  for (int32_t id : tok_->encode(text)) bytes += tok_->token_bytes(id);
  EXPECT_EQ(bytes, text);
}

TEST_F(Gpt2Vectors, EncodesTheSameFromManyThreadsAtOnce) {
  std::vector<std::vector<int32_t>> expected;
  for (const Vector& v : vectors_) expected.push_back(v.ids);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) {
        for (size_t i = 0; i < vectors_.size(); ++i) mismatches += tok_->encode(vectors_[i].text) != expected[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST_F(Gpt2Vectors, DecodingAnIdOutsideTheVocabularyThrowsNamingIt) {
  test::expect_error<std::out_of_range>([&] { tok_->decode(std::vector<int32_t>{50257}); }, {"50257", "50257 tokens"});
  test::expect_error<std::out_of_range>([&] { tok_->token_bytes(-1); }, {"-1"});
}

}  // namespace
}  // namespace specula
