// JSON mode (spec/json_mode.h): the grammar against nlohmann's parser as the oracle of what
// continues a JSON object, its limits, and the masks PenaltyHistory writes into a round's rows.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/tokenizer.h"
#include "spec/json_mode.h"
#include "spec/penalties.h"

namespace specula {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Whether nlohmann's parser takes `text` whole, or as far as the input goes: it fails only at the
// end of the input, for want of more.
bool parses_to_the_end(const std::string& text) {
  try {
    (void)nlohmann::json::parse(text);
    return true;
  } catch (const nlohmann::json::parse_error& e) {
    return e.byte > text.size() && std::string(e.what()).find("unexpected end of input") != std::string::npos;
  }
}

// An exponent of three digits or more in the last bytes of `text`: nlohmann refuses numbers a
// double cannot hold (out_of_range 406) where the grammar, as RFC 8259, takes them; the random
// texts below stay clear of them.
bool long_exponent(const std::string& text) {
  const size_t from = text.size() > 16 ? text.size() - 16 : 0;
  for (size_t i = from; i < text.size(); ++i) {
    if (text[i] != 'e' && text[i] != 'E') continue;
    size_t j = i + 1;
    if (j < text.size() && (text[j] == '+' || text[j] == '-')) ++j;
    size_t digits = 0;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j, ++digits;
    if (digits >= 3) return true;
  }
  return false;
}

// The oracle: `text` begins a JSON object (RFC 8259) that more bytes could finish. nlohmann's
// lexer reports a token cut by the end of the input (a literal, a number, an escape, a string, a
// UTF-8 character) as an error of its own, so the text is also tried with the rest of such a
// token: it continues JSON if any of these completions leaves the parser wanting only more input.
bool continues_json(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\n\r");
  if (first != std::string::npos && text[first] != '{') return false;  // JSON mode's top level is an object
  static const std::vector<std::string> tokens = {
      "", "0", "00", "000", "0000", "e", "ue", "rue", "se", "lse", "alse", "l", "ll", "ull",
      "\x80", "\x80\x80", "\x80\x80\x80", "\xa0\x80", "\x90\x80\x80"};
  for (const std::string& rest : tokens)
    for (const char* quote : {"", "\""})
      if (parses_to_the_end(text + rest + quote)) return true;
  return false;
}

TEST(JsonMode, EveryPrefixOfAValidObjectIsAliveAndOnlyTheWholeIsDone) {
  const std::vector<std::string> docs = {
      "{}",
      "{ }",
      "{\"a\":1}",
      "{\"a\": [1, -2.5e3, 0, 0.25, 1E+2, true, false, null, {\"b\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"}], \"c\": {}}",
      "{\n  \"k\": \"caf\xc3\xa9\",\n  \"n\": [[], [[]], {\"\": -0}]\n}",
  };
  for (const std::string& doc : docs) {
    ASSERT_TRUE(continues_json(doc)) << doc;
    JsonState s;
    for (size_t i = 0; i < doc.size(); ++i) {
      s = s.feed(static_cast<uint8_t>(doc[i]));
      ASSERT_FALSE(s.dead()) << doc << " refused at byte " << i;
      EXPECT_EQ(s.done(), i + 1 == doc.size()) << doc << " at byte " << i;
    }
    EXPECT_TRUE(s.feed(" \n").done()) << "whitespace after the object";
    EXPECT_TRUE(s.feed("x").dead()) << "text after the object";
  }
}

TEST(JsonMode, TheFirstByteNoObjectContinuesWithIsRefused) {
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"[1]", 0},          {"\"a\"", 0},          {"{\"a\" 1}", 5},       {"{\"a\": 01}", 7},
      {"{\"a\": tru}", 9}, {"{\"a\": 1,}", 8},    {"{\"a\":\"\x01\"}", 6}, {"{\"a\": \"\\q\"}", 8},
      {"{\"a\": 1.}", 8},  {"{\"a\": -}", 7},     {"{} x", 3},            {"{]", 1},
      {"{\"a\": [1}", 8},  {"{\"a\": \"\\u12g4\"}", 11}, {"{1: 2}", 1},    {"{\"a\": +1}", 6},
  };
  for (const auto& [text, at] : bad) {
    JsonState s;
    for (size_t i = 0; i < text.size(); ++i) {
      s = s.feed(static_cast<uint8_t>(text[i]));
      if (s.dead()) {
        EXPECT_EQ(i, at) << text;
        break;
      }
    }
    EXPECT_TRUE(s.dead()) << text << " was never refused";
    EXPECT_FALSE(continues_json(text.substr(0, at + 1))) << "the oracle takes " << text.substr(0, at + 1);
  }
}

TEST(JsonMode, WhitespaceRunsAndNestingHaveLimits) {
  JsonState s = JsonState{}.feed("{\"a\":");
  EXPECT_FALSE(s.feed(std::string(JsonState::kMaxWhitespace, ' ')).dead());
  EXPECT_TRUE(s.feed(std::string(JsonState::kMaxWhitespace + 1, ' ')).dead());
  EXPECT_FALSE(s.feed(std::string(JsonState::kMaxWhitespace, ' ') + "1" + std::string(JsonState::kMaxWhitespace, ' ')).dead())
      << "a value starts a new run";
  const std::string deep = "{\"a\":" + std::string(JsonState::kMaxDepth - 1, '[');
  EXPECT_FALSE(JsonState{}.feed(deep).dead());
  EXPECT_TRUE(JsonState{}.feed(deep + "[").dead());
  EXPECT_TRUE(JsonState{}.feed(deep + std::string(JsonState::kMaxDepth - 1, ']') + "}").done());
}

// A random walk over JSON's bytes: from a prefix both sides take, each step tries a byte; the
// grammar and the oracle must agree on whether it continues a JSON object, and the walk goes on
// from it when it does (restarting at "{" after a closed object or 200 bytes). Controls,
// whitespace and depth stay inside the grammar's limits, which the oracle does not have.
TEST(JsonMode, TheGrammarAgreesWithNlohmannsParserOnEveryByteOfARandomWalk) {
  // ASCII of JSON's syntax, and bytes of UTF-8 characters well formed and not (inside strings).
  const std::string alphabet = "{}[]\",:0123456789-+.eEtrufalsn \n\\/bu\xc3\xa9\xe0\xed\xf0\xf4\x80\xbf\xa0\x90\xc0\xff";
  std::mt19937 rng(7);
  std::string text = "{";
  JsonState s = JsonState{}.feed('{');
  int alive_steps = 0, refusals = 0, closed = 0;
  for (int step = 0; step < 15000; ++step) {
    const char c = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
    const JsonState next = s.feed(static_cast<uint8_t>(c));
    const bool ours = !next.dead() && !(next.ws > 8);  // long whitespace runs: the grammar's own limit
    if (next.ws > 8 || long_exponent(text + c)) continue;
    const bool theirs = continues_json(text + c);
    ASSERT_EQ(ours, theirs) << "after \"" << text << "\" the byte " << static_cast<int>(static_cast<uint8_t>(c)) << ", last bytes " << static_cast<int>(static_cast<uint8_t>(text[text.size() - 2])) << " " << static_cast<int>(static_cast<uint8_t>(text.back()));
    if (!ours) {
      ++refusals;
      continue;
    }
    text += c;
    s = next;
    ++alive_steps;
    if (s.done() || text.size() > 200 || s.depth > 20) {
      closed += s.done();
      text = "{";
      s = JsonState{}.feed('{');
    }
  }
  EXPECT_GT(alive_steps, 2000);
  EXPECT_GT(refusals, 2000);
  EXPECT_GT(closed, 20) << "the walk never closed an object";
}

// Tokens of several bytes on the numbered vocabulary (256 byte tokens, then " t<i>"): the mask
// keeps exactly the tokens whose bytes continue the text (the oracle's verdict on text + bytes, for
// a seventh of the vocabulary at each step, a different seventh the next), and text built from
// masked draws alone parses as one object.
TEST(JsonMode, AMaskedRowKeepsExactlyTheTokensThatContinueTheObject) {
  const std::shared_ptr<Tokenizer> tok = Tokenizer::numbered(300);
  const JsonVocabulary vocab(*tok);
  std::mt19937 rng(11);
  int finished = 0;
  for (int doc = 0; doc < 8; ++doc) {
    std::string text;
    JsonState s;
    for (int step = 0; step < 150 && !s.done(); ++step) {
      std::vector<float> row(300, 0.0f);
      vocab.mask(s, row, {}, true);
      std::vector<int32_t> kept;
      for (int32_t v = 0; v < 300; ++v) {
        const std::string bytes = tok->token_bytes(v);
        const bool ours = row[static_cast<size_t>(v)] != kNegInf;
        ASSERT_EQ(ours, !vocab.after(s, v).dead()) << "the mask and the grammar differ on token " << v;
        if (v % 7 != step % 7 || long_exponent(text + bytes)) {  // the oracle on a seventh of the tokens a step
          if (ours && !long_exponent(text + bytes)) kept.push_back(v);
          continue;
        }
        const bool theirs = s.done() ? bytes.find_first_not_of(" \t\n\r") == std::string::npos : continues_json(text + bytes);
        ASSERT_EQ(ours, theirs) << "after \"" << text << "\" token " << v << " \"" << bytes << "\"";
        if (ours) kept.push_back(v);
      }
      ASSERT_FALSE(kept.empty()) << "nothing may follow \"" << text << "\"";
      // Lean towards closing: structural tokens eight times as often as the rest.
      std::vector<double> w;
      for (int32_t v : kept) w.push_back(v < 256 && std::string("}]\",:1").find(static_cast<char>(v)) != std::string::npos ? 8.0 : 1.0);
      const int32_t t = kept[std::discrete_distribution<size_t>(w.begin(), w.end())(rng)];
      text += tok->token_bytes(t);
      s = vocab.after(s, t);
      ASSERT_FALSE(s.dead());
    }
    if (!s.done()) continue;
    ++finished;
    const nlohmann::json j = nlohmann::json::parse(text);
    EXPECT_TRUE(j.is_object()) << text;
  }
  EXPECT_GT(finished, 3);
}

// PenaltyHistory in JSON mode: a round's row i is masked after the output and draft[0..i-1], the
// raw values come back, special tokens never pass, and a closed object leaves only whitespace and
// the stop tokens (those while min_tokens holds them back: whitespace alone).
TEST(JsonMode, ARoundsRowsAreMaskedAfterTheOutputAndTheDraftBeforeThemAndRestored) {
  // 0 "{", 1 "}", 2 "\"a\"", 3 ":", 4 "1", 5 " ", 6 special, 7 "x"
  auto vocab = std::make_shared<const JsonVocabulary>(std::vector<std::string>{"{", "}", "\"a\"", ":", "1", " ", "", "x"});
  SamplingParams sp;
  sp.json_object = vocab;
  ASSERT_TRUE(sp.penalized());
  const std::vector<int32_t> stop{6};
  PenaltyHistory h(sp, {}, 8, stop);
  h.push(0);  // "{"
  const std::vector<int32_t> draft{2, 3, 4};  // "a" : 1
  std::vector<float> rows(4 * 8);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  const std::vector<float> raw = rows;
  PenaltyHistory::Undo undo;
  h.apply(rows, draft, undo);
  auto kept = [&](size_t row) {
    std::vector<int32_t> k;
    for (int32_t v = 0; v < 8; ++v)
      if (rows[row * 8 + static_cast<size_t>(v)] != kNegInf) k.push_back(v);
    return k;
  };
  EXPECT_EQ(kept(0), (std::vector<int32_t>{1, 2, 5}));  // after "{": "}", a key, whitespace
  EXPECT_EQ(kept(1), (std::vector<int32_t>{3, 5}));     // after the key: ":" or whitespace
  EXPECT_EQ(kept(2), (std::vector<int32_t>{0, 2, 4, 5}));  // a value
  EXPECT_EQ(kept(3), (std::vector<int32_t>{1, 4, 5}));  // after 1: close, more digits or whitespace
  PenaltyHistory::restore(rows, undo);
  EXPECT_EQ(rows, raw);

  for (int32_t t : draft) h.push(t);
  h.push(1);  // "}": closed
  std::vector<float> row(8, 0.5f);
  h.apply(row, {}, undo);
  std::vector<int32_t> after_close;
  for (int32_t v = 0; v < 8; ++v)
    if (row[static_cast<size_t>(v)] != kNegInf) after_close.push_back(v);
  EXPECT_EQ(after_close, (std::vector<int32_t>{5, 6}));  // whitespace and the stop token
  PenaltyHistory::restore(row, undo);

  SamplingParams held = sp;
  held.min_tokens = 20;
  PenaltyHistory g(held, {}, 8, stop);
  for (int32_t t : {0, 1}) g.push(t);
  std::fill(row.begin(), row.end(), 0.5f);
  g.apply(row, {}, undo);
  EXPECT_EQ(row[5], 0.5f);
  EXPECT_EQ(row[6], kNegInf) << "min_tokens holds the stop token back";
}

}  // namespace
}  // namespace specula
