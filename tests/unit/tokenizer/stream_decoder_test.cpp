// StreamDecoder: text pushed a token at a time comes out whole, never half a UTF-8 character,
// and bytes that can never form a character become U+FFFD. Also the lossy UTF-8 repair itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "model/pretokenizer.h"
#include "model/tokenizer.h"
#include "model/utf8.h"
#include "tokenizer_test_support.h"

namespace specula {
namespace {

const std::string kFffd = "\xef\xbf\xbd";

bool valid_utf8(std::string_view s) { return utf8::to_valid(s) == s; }

// One token per byte (no merges), so every multibyte character arrives split.
std::shared_ptr<const Tokenizer> byte_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::char_of_byte(static_cast<uint8_t>(b))] = b;
  nlohmann::json j = {{"added_tokens", {{{"id", 256}, {"content", "<eos>"}, {"special", true}}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}}};
  return Tokenizer::from_hf_json(test::write_file(test::scratch_dir() / "tokenizer.json", j.dump()).string());
}

std::shared_ptr<const Tokenizer> gpt2_tokenizer() {
  const auto path = test::shared_dir() / "data" / "tokenizer-vectors" / "ggml-vocab-gpt-2.gguf";
  return Tokenizer::from_gguf(GgufFile(path.string()));
}

// Pushes every id, checking each piece is valid UTF-8; returns the concatenation plus flush().
std::string stream(std::shared_ptr<const Tokenizer> tok, const std::vector<int32_t>& ids, bool skip_special = false) {
  StreamDecoder dec(std::move(tok), skip_special);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = dec.push(id);
    EXPECT_TRUE(valid_utf8(piece)) << "piece after id " << id << " is not valid UTF-8";
    all += piece;
  }
  return all + dec.flush();
}

TEST(StreamDecoder, YieldsExactlyTheTextWhenEveryCharacterIsSplitIntoBytes) {
  auto tok = byte_tokenizer();
  const std::string text = "A\xf0\x9f\x98\x80 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e caf\xc3\xa9 \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x92\xbb!";
  const std::vector<int32_t> ids = tok->encode(text);
  ASSERT_EQ(ids.size(), text.size());  // one token per byte
  EXPECT_EQ(stream(tok, ids), text);
}

TEST(StreamDecoder, HoldsBackAnIncompleteCharacterUntilItsLastByte) {
  auto tok = byte_tokenizer();
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(0xF0), "");
  EXPECT_EQ(dec.push(0x9F), "");
  EXPECT_EQ(dec.push(0x98), "");
  EXPECT_EQ(dec.push(0x80), "\xf0\x9f\x98\x80");
  EXPECT_EQ(dec.push('x'), "x");
  EXPECT_EQ(dec.flush(), "");
}

TEST(StreamDecoder, YieldsExactlyTheTextForGpt2TokensThatSplitEmojiAndCjk) {
  auto tok = gpt2_tokenizer();
  const std::string text = "Emoji \xf0\x9f\xa6\x99\xf0\x9f\xa6\x99 and \xe8\x87\xaa\xe7\x84\xb6\xe8\xa8\x80\xe8\xaa\x9e in a line";
  const std::vector<int32_t> ids = tok->encode(text);
  // The test means something only if some token really is a fragment of a character.
  const bool has_fragment = std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return !valid_utf8(tok->token_bytes(id)); });
  ASSERT_TRUE(has_fragment);
  EXPECT_EQ(stream(tok, ids), text);
}

TEST(StreamDecoder, TurnsATruncatedCharacterIntoAReplacementAtFlush) {
  auto tok = byte_tokenizer();
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push('a'), "a");
  EXPECT_EQ(dec.push(0xE6), "");
  EXPECT_EQ(dec.push(0x97), "");
  EXPECT_EQ(dec.flush(), kFffd);
  EXPECT_EQ(dec.flush(), "");
}

TEST(StreamDecoder, ReplacesAByteThatCanNeverStartACharacterAtOnce) {
  auto tok = byte_tokenizer();
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(0xFF), kFffd);
  EXPECT_EQ(dec.push(0xE6), "");
  EXPECT_EQ(dec.push('b'), kFffd + "b");  // the lead byte is cut short by an ASCII byte
}

TEST(StreamDecoder, StreamedTextEqualsDecodeOfTheWholeSequenceEvenWhenInvalid) {
  auto tok = byte_tokenizer();
  const std::vector<int32_t> ids = {'a', 0xE0, 0x80, 0xF0, 0x9F, 0x98, 'b', 0xED, 0xA0, 0x80, 0xC3};
  EXPECT_EQ(stream(tok, ids), tok->decode(ids));
}

TEST(StreamDecoder, SkipsSpecialTokensWhenAsked) {
  auto tok = byte_tokenizer();
  EXPECT_EQ(stream(tok, {'h', 256, 'i'}, /*skip_special=*/true), "hi");
  EXPECT_EQ(stream(tok, {'h', 256, 'i'}, /*skip_special=*/false), "h<eos>i");
}

TEST(Utf8, ReplacesEachMaximalInvalidSubpartOnce) {
  // Expectations as Python's bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy give.
  EXPECT_EQ(utf8::to_valid("a\xff" "b"), "a" + kFffd + "b");
  EXPECT_EQ(utf8::to_valid("\xe0\x80"), kFffd + kFffd);          // overlong lead: E0 needs A0-BF
  EXPECT_EQ(utf8::to_valid("\xed\xa0\x80"), kFffd + kFffd + kFffd);  // a surrogate
  EXPECT_EQ(utf8::to_valid("\xf0\x9f\x98"), kFffd);              // truncated 4-byte sequence
  EXPECT_EQ(utf8::to_valid("\xf4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
  EXPECT_EQ(utf8::to_valid("\xc0\xaf"), kFffd + kFffd);
  EXPECT_EQ(utf8::to_valid("ok \xc3\xa9\xe2\x82\xac\xf0\x90\x8d\x88"), "ok \xc3\xa9\xe2\x82\xac\xf0\x90\x8d\x88");
}

TEST(Utf8, LeavesAnIncompleteTailUnconsumedUnlessFinal) {
  std::string out;
  EXPECT_EQ(utf8::append_lossy("ab\xe2\x82", out, false), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(utf8::append_lossy("ab\xe2\x82", out, true), 4u);
  EXPECT_EQ(out, "ab" + kFffd);
}

}  // namespace
}  // namespace specula
