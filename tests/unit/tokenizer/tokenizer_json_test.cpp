// Tokenizer::from_hf_json on small hand-built tokenizer.json files: merge order, ignore_merges,
// added tokens, the pre-tokenizer steps, bos/eos from the files beside it, and clear errors
// for files it cannot use.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/pretokenizer.h"
#include "model/tensor.h"
#include "model/tokenizer.h"
#include "tokenizer_test_support.h"

namespace specula {
namespace {

using json = nlohmann::json;

// A byte-level BPE tokenizer.json: the 256 byte characters (ids 0-255, in byte order), then
// `extra` tokens, the given merges, GPT-2's ByteLevel pre-tokenizer unless `pre` says otherwise.
json make_tokenizer(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                    json pre = json::object()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::char_of_byte(static_cast<uint8_t>(b))] = b;
  for (size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
  if (pre.empty()) pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", false}}}};
}

std::shared_ptr<Tokenizer> load(const json& j, const std::string& name = "tokenizer.json") {
  const auto dir = test::scratch_dir();
  return Tokenizer::from_hf_json(test::write_file(dir / name, j.dump()).string());
}

// Token strings of an encoding, for readable expectations.
std::vector<std::string> pieces(const Tokenizer& tok, std::string_view text, bool parse_special = true) {
  std::vector<std::string> out;
  for (int32_t id : tok.encode(text, parse_special)) out.push_back(tok.token_string(id));
  return out;
}

using Strings = std::vector<std::string>;

TEST(TokenizerJson, MergesTheLowestRankedPairFirst) {
  EXPECT_EQ(pieces(*load(make_tokenizer({"bc", "ab"}, {"b c", "a b"})), "abc"), (Strings{"a", "bc"}));
  EXPECT_EQ(pieces(*load(make_tokenizer({"bc", "ab"}, {"a b", "b c"})), "abc"), (Strings{"ab", "c"}));
}

TEST(TokenizerJson, MergesTheLeftmostPairAmongEqualRanks) {
  EXPECT_EQ(pieces(*load(make_tokenizer({"aa"}, {"a a"})), "aaa"), (Strings{"aa", "a"}));
}

TEST(TokenizerJson, BuildsLongTokensThroughChainsOfMerges) {
  const Strings vocab = {"ab", "abc", "abcd", "cd"};
  auto tok = load(make_tokenizer(vocab, {"a b", "ab c", "c d", "abc d"}));
  EXPECT_EQ(pieces(*tok, "abcd"), (Strings{"abcd"}));
  EXPECT_EQ(pieces(*tok, "abcdcd"), (Strings{"abcd", "cd"}));
  // With "c d" ranked before "ab c", the chain to "abcd" is cut off.
  EXPECT_EQ(pieces(*load(make_tokenizer(vocab, {"a b", "c d", "ab c", "abc d"})), "abcd"), (Strings{"ab", "cd"}));
}

TEST(TokenizerJson, AcceptsMergesWrittenAsPairs) {
  json j = make_tokenizer({"bc"}, {});
  j["model"]["merges"] = json::array({json::array({"b", "c"})});
  EXPECT_EQ(pieces(*load(j), "abc"), (Strings{"a", "bc"}));
}

TEST(TokenizerJson, IgnoreMergesTakesAPieceThatIsInTheVocabularyWhole) {
  json j = make_tokenizer({"bc", "abc"}, {"b c"});
  EXPECT_EQ(pieces(*load(j), "abc"), (Strings{"a", "bc"}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(pieces(*load(j), "abc"), (Strings{"abc"}));
}

TEST(TokenizerJson, SplitsOnTheGpt2RegexBeforeMerging) {
  // Without the regex split " b" and "a" would be one word and "a Ġ" could merge.
  auto tok = load(make_tokenizer({"a\xc4\xa0", "\xc4\xa0" "b"}, {"a \xc4\xa0", "\xc4\xa0 b"}));
  EXPECT_EQ(pieces(*tok, "a b"), (Strings{"a", "\xc4\xa0" "b"}));
  EXPECT_EQ(tok->decode(tok->encode("a b")), "a b");
}

TEST(TokenizerJson, SplitsDigitsIndividuallyWhenTheDigitsStepSaysSo) {
  const json pre = {{"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Digits"}, {"individual_digits", true}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
  EXPECT_EQ(pieces(*load(make_tokenizer({"12"}, {"1 2"}, pre)), "12"), (Strings{"1", "2"}));
  EXPECT_EQ(pieces(*load(make_tokenizer({"12"}, {"1 2"})), "12"), (Strings{"12"}));
}

TEST(TokenizerJson, SplitRegexWithLookaheadSeesTheEndOfEachPiece) {
  // Llama 3's shape: Split(regex, Isolated) then ByteLevel without its own regex.
  const json pre = {{"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  const std::string sp = "\xc4\xa0";
  auto tok = load(make_tokenizer({sp + sp, sp + "x"}, {sp + " " + sp, sp + " x"}, pre));
  // "   x": `\s+(?!\S)` takes two spaces and leaves " x" together.
  EXPECT_EQ(pieces(*tok, "   x"), (Strings{sp + sp, sp + "x"}));
  EXPECT_EQ(pieces(*tok, "x  "), (Strings{"x", sp + sp}));
}

TEST(TokenizerJson, AddPrefixSpacePutsASpaceBeforeTheText) {
  json j = make_tokenizer({"\xc4\xa0" "a"}, {"\xc4\xa0 a"});
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(pieces(*load(j), "a"), (Strings{"\xc4\xa0" "a"}));
}

TEST(TokenizerJson, AddedTokensMatchLongestFirstAndSpecialOnesOnlyWhenParsing) {
  json j = make_tokenizer({}, {});
  j["added_tokens"] = json::array({
      {{"id", 300}, {"content", "<s>"}, {"special", true}, {"lstrip", false}, {"rstrip", false}},
      {{"id", 301}, {"content", "<s>x"}, {"special", true}, {"lstrip", false}, {"rstrip", false}},
      {{"id", 302}, {"content", "[tool]"}, {"special", false}, {"lstrip", false}, {"rstrip", false}},
  });
  auto tok = load(j);
  EXPECT_EQ(tok->vocab_size(), 303);
  EXPECT_EQ(tok->encode("<s>x<s>"), (std::vector<int32_t>{301, 300}));
  EXPECT_EQ(tok->encode("a[tool]", false), (std::vector<int32_t>{'a', 302}));
  EXPECT_EQ(tok->encode("<s>", false), (std::vector<int32_t>{'<', 's', '>'}));
  EXPECT_TRUE(tok->is_special(300));
  EXPECT_FALSE(tok->is_special(302));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{300, 302}, /*skip_special=*/true), "[tool]");
}

TEST(TokenizerJson, LstripAndRstripSwallowTheSpacesAroundAnAddedToken) {
  json j = make_tokenizer({}, {});
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<m>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}}});
  EXPECT_EQ(load(j)->encode("a  <m>  b"), (std::vector<int32_t>{'a', 300, 'b'}));
}

TEST(TokenizerJson, ReadsBosAndEosFromTheConfigFilesBesideIt) {
  json j = make_tokenizer({}, {});
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 301}, {"content", "</s>"}, {"special", true}},
                                   {{"id", 302}, {"content", "<eot>"}, {"special", true}}});
  const auto dir = test::scratch_dir();
  test::write_file(dir / "tokenizer_config.json", R"({"bos_token": "<s>", "eos_token": {"content": "</s>"}})");
  auto tok = Tokenizer::from_hf_json(test::write_file(dir / "tokenizer.json", j.dump()).string());
  EXPECT_EQ(tok->bos_id(), 300);
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{301}));
  test::write_file(dir / "generation_config.json", R"({"bos_token_id": 300, "eos_token_id": [301, 302]})");
  tok = Tokenizer::from_hf_json((dir / "tokenizer.json").string());
  EXPECT_EQ(tok->eos_ids(), (std::vector<int32_t>{301, 302}));
}

// ---- files it must refuse, with a message that says why ----

void expect_refused_text(const std::string& text, std::initializer_list<std::string> parts) {
  const auto path = test::write_file(test::scratch_dir() / "tokenizer.json", text);
  test::expect_error<ModelError>([&] { Tokenizer::from_hf_json(path.string()); }, parts);
}

void expect_refused(const json& j, std::initializer_list<std::string> parts) { expect_refused_text(j.dump(), parts); }

TEST(TokenizerJson, RefusesAMissingFile) {
  test::expect_error<ModelError>([] { Tokenizer::from_hf_json("/nonexistent/tokenizer.json"); },
                                 {"/nonexistent/tokenizer.json", "cannot open"});
}

TEST(TokenizerJson, RefusesTextThatIsNotJson) { expect_refused_text("{\"model\": [1, 2", {"tokenizer.json", "not valid JSON"}); }

TEST(TokenizerJson, RefusesAModelThatIsNotBpe) {
  json j = make_tokenizer({}, {});
  j["model"]["type"] = "Unigram";
  expect_refused(j, {"model.type", "Unigram", "only BPE"});
}

TEST(TokenizerJson, RefusesAFileWithoutMerges) {
  json j = make_tokenizer({}, {});
  j["model"].erase("merges");
  expect_refused(j, {"model.merges is missing"});
}

TEST(TokenizerJson, RefusesAnAddedTokenIdSoLargeItWouldSizeAHugeTable) {
  json j = make_tokenizer({}, {});
  j["added_tokens"] = json::array({{{"id", 2000000000}, {"content", "<huge>"}, {"special", true}}});
  expect_refused(j, {"token id 2000000000", "larger than any vocabulary"});
}

TEST(TokenizerJson, RefusesAMergeOfTokensNotInTheVocabulary) {
  expect_refused(make_tokenizer({}, {"a zz"}), {"merge #0", "'zz'", "not in the vocabulary"});
  expect_refused(make_tokenizer({}, {"a b"}), {"merge #0", "'ab'", "not in the vocabulary"});
}

TEST(TokenizerJson, RefusesAVocabularyEntryThatIsNotAnId) {
  json j = make_tokenizer({}, {});
  j["model"]["vocab"]["hello"] = "seven";
  expect_refused(j, {"model.vocab[\"hello\"]", "not a token id", "\"seven\""});
}

TEST(TokenizerJson, RefusesAnUnsupportedPreTokenizer) {
  expect_refused(make_tokenizer({}, {}, {{"type", "Whitespace"}}), {"pre_tokenizer.type", "'Whitespace'", "not supported"});
}

TEST(TokenizerJson, RefusesAPreTokenizerWithoutByteLevel) {
  const json pre = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}}}};
  expect_refused(make_tokenizer({}, {}, pre), {"no ByteLevel", "byte-level BPE"});
}

TEST(TokenizerJson, RefusesARegexThatDoesNotCompile) {
  const json pre = {{"type", "Sequence"},
                    {"pretokenizers",
                     {{{"type", "Split"}, {"pattern", {{"Regex", "(ab"}}}, {"behavior", "Isolated"}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}}}}};
  expect_refused(make_tokenizer({}, {}, pre), {"pre_tokenizer.pretokenizers[0]", "/(ab/", "does not compile"});
}

TEST(TokenizerJson, RefusesANormalizerItWouldIgnore) {
  json j = make_tokenizer({}, {});
  j["normalizer"] = {{"type", "NFC"}};
  expect_refused(j, {"normalizer 'NFC'", "not supported"});
}

}  // namespace
}  // namespace specula
