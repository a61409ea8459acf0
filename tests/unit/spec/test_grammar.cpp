// Grammars (spec/grammar.h) and JSON Schema compiled to them (spec/json_schema.h): GBNF read as
// llama.cpp reads it, the matcher's verdicts on whole texts and prefixes, its masks against
// feeding each token's bytes one by one, JSON Schema's outputs against nlohmann's parser and the
// schema's rules, and the masks PenaltyHistory writes into a round's rows.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <typeinfo>
#include <vector>

#include <nlohmann/json.hpp>

#include "spec/grammar.h"
#include "spec/json_schema.h"
#include "spec/penalties.h"

namespace specula {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
using State = GrammarMatcher::State;

// A matcher over a vocabulary of the 256 single bytes (enough to feed any text).
std::shared_ptr<const GrammarMatcher> matcher(const std::string& gbnf) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  return std::make_shared<const GrammarMatcher>(Grammar::parse(gbnf), std::make_shared<const TokenTrie>(bytes));
}

bool accepts(const GrammarMatcher& m, const std::string& text) {
  const State s = m.feed(m.start(), text);
  return s != GrammarMatcher::kDead && m.accepting(s);
}
bool continues(const GrammarMatcher& m, const std::string& text) { return m.feed(m.start(), text) != GrammarMatcher::kDead; }

std::string error_of(const std::string& gbnf) {
  try {
    Grammar::parse(gbnf);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Grammar, BadGbnfIsOneClearErrorNamingTheLineAndTheFault) {
  EXPECT_NE(error_of("start ::= \"a\"\n").find("no rule named 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\n  | item\n").find("line 2: rule 'item' is used but not defined"), std::string::npos);
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"\n").find("'root' is left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"\n").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"\n").find("line 2: rule 'root' is defined twice"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"abc\n").find("line 1: unterminated string literal"), std::string::npos);
  EXPECT_NE(error_of("root ::= [a-\n").find("unterminated character class"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\q\"\n").find("unknown escape '\\q'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,1}\n").find("n below m"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{20000}\n").find("past 10000"), std::string::npos);
  std::string huge = "root ::=";
  for (int k = 0; k < 200; ++k) huge += " \"a\"{10000}";
  EXPECT_NE(error_of(huge + "\n").find("more than 1048576 elements"), std::string::npos);
  EXPECT_NE(error_of("root ::= * \"a\"\n").find("nothing before it to repeat"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"\n").find("expected ')'"), std::string::npos);
  EXPECT_NE(error_of("root = \"a\"\n").find("expected ::="), std::string::npos);
  EXPECT_NE(error_of("root ::= [z-a]\n").find("end comes before its start"), std::string::npos);
  EXPECT_EQ(error_of("# a comment\nroot ::= \"a\" # more\n  | \"b\"\n"), "");
}

TEST(Grammar, TextsAreAcceptedWholeAndTheirPrefixesContinue) {
  const auto m = matcher(R"(root ::= "n=" num ("," ws num)*
num ::= "-"? [0-9]+
ws ::= " "?
)");
  for (const std::string ok : {"n=1", "n=-12", "n=1,2", "n=1, 2,-3"}) {
    EXPECT_TRUE(accepts(*m, ok)) << ok;
    for (size_t k = 0; k < ok.size(); ++k) EXPECT_TRUE(continues(*m, ok.substr(0, k))) << ok.substr(0, k);
  }
  for (const std::string bad : {"n=", "n=1,", "n=--1", "n=1,  2", "n=a", "m=1", "n=1;"}) EXPECT_FALSE(accepts(*m, bad)) << bad;
  EXPECT_FALSE(continues(*m, "n=1,  "));
  EXPECT_FALSE(continues(*m, "x"));
}

// Items that may be empty, repeated: no left recursion, and the parse stacks stay bounded (the
// matcher keeps at most kMaxStacks a state; past it the state is dead, never wrong).
TEST(Grammar, RepeatedItemsThatMayBeEmptyAreKept) {
  const auto m = matcher("root ::= (\"a\"?)* \"b\" (\"c\"* \"d\"?){2,3}\n");
  EXPECT_TRUE(accepts(*m, "b"));
  EXPECT_TRUE(accepts(*m, "aaabccdcd"));
  EXPECT_FALSE(accepts(*m, "aaacb"));
  const auto many = matcher("root ::= (\"a\"?){0,500} \"b\"\n");
  EXPECT_TRUE(accepts(*many, "aab"));
  EXPECT_FALSE(continues(*many, "ba"));
  try {
    matcher("root ::= (\"a\"?){0,5000} \"b\"\n");
    ADD_FAILURE() << "a start with 5,001 parses was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "grammar: more than 1024 ways to parse its start, or too much work to find them (a grammar this ambiguous is refused)");
  }
}

TEST(Grammar, RepetitionCountsHoldExactly) {
  const auto m = matcher("root ::= \"x\"{2,4} \"y\"{3} (\"ab\"){1,}\n");
  EXPECT_TRUE(accepts(*m, "xxyyyab"));
  EXPECT_TRUE(accepts(*m, "xxxxyyyababab"));
  EXPECT_FALSE(accepts(*m, "xyyyab"));
  EXPECT_FALSE(continues(*m, "xxxxx"));
  EXPECT_FALSE(accepts(*m, "xxyyy"));
  EXPECT_FALSE(continues(*m, "xxyyyy"));
  EXPECT_FALSE(accepts(*m, "xxyyyaba"));
}

// Character classes hold code points, matched as their UTF-8 bytes: every code point of the
// planes sampled is accepted exactly when the class holds it, and no ill-formed UTF-8 gets by.
TEST(Grammar, ManyRoutesToTheSameParseAreExpandedOnce) {
  // 2^60 routes of empty steps lead to one parse: expanded route by route, this never finishes.
  const auto m = matcher("root ::= (\"\" | \"\"){0,60} \"x\"\n");
  EXPECT_TRUE(accepts(*m, "x"));
  EXPECT_FALSE(continues(*m, "y"));
  const auto r = matcher(gbnf_of_regex("(a?|b?){0,60}c"));
  EXPECT_TRUE(accepts(*r, "c"));
  EXPECT_TRUE(accepts(*r, "abbac"));
  EXPECT_FALSE(continues(*r, "abd"));
}

TEST(Grammar, DeepNestingIsOneClearErrorAndLongRuleChainsWorkWithoutExhaustingTheStack) {
  const auto nested = [](int n, const std::string& inner) { return std::string(static_cast<size_t>(n), '(') + inner + std::string(static_cast<size_t>(n), ')'); };
  EXPECT_NE(error_of("root ::= " + nested(100000, "\"a\"") + "\n").find("line 1: groups nested deeper than 256 levels"), std::string::npos);
  EXPECT_TRUE(accepts(*matcher("root ::= " + nested(200, "\"a\"") + "\n"), "a"));
  try {
    gbnf_of_regex(nested(100000, "a"));
    ADD_FAILURE() << "a pattern nested 100,000 deep was taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("regex: groups nested deeper than 256 levels"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(accepts(*matcher(gbnf_of_regex(nested(200, "a") + "b")), "ab"));
  // 100,000 rules, each nullable only through the next: deeper than a thread's stack for a
  // recursive walk, and 10^10 steps for a fixed-point loop that finds one per pass.
  std::string chain = "root ::= r0 \"x\"\n";
  for (int i = 0; i < 100000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  chain += "r100000 ::= \"a\" | \"\"\n";
  const auto c = matcher(chain);
  EXPECT_TRUE(accepts(*c, "x"));
  EXPECT_TRUE(accepts(*c, "ax"));
  EXPECT_FALSE(continues(*c, "aa"));
  std::string cycle = "root ::= r0\n";
  for (int i = 0; i < 100000; ++i) cycle += "r" + std::to_string(i) + " ::= \"b\" | r" + std::to_string((i + 1) % 100000) + " \"a\"\n";
  EXPECT_NE(error_of(cycle).find("left-recursive"), std::string::npos);
}

TEST(Grammar, AMatcherPastItsLimitsSaysSoKeepsOnlyStopsAndIsSpent) {
  const std::vector<int32_t> stops{0};
  // Too many parses at once: a run of a's cut into a thousand parts of one to ten.
  const auto ambiguous = matcher("root ::= (\"a\"{1,10}){1000}\n");
  State s = ambiguous->start(), before = s;
  int fed = 0;
  while (s != GrammarMatcher::kOverLimit && fed < 1000) {
    before = s;
    s = ambiguous->feed(s, "a");
    ++fed;
    ASSERT_NE(s, GrammarMatcher::kDead) << "after " << fed << " a's";
  }
  EXPECT_EQ(s, GrammarMatcher::kOverLimit) << "after " << fed << " a's";
  EXPECT_FALSE(ambiguous->full()) << "too many parses at once is the grammar's own, not what the matcher has cached";
  EXPECT_TRUE(ambiguous->keeps(before, 'a', stops, true)) << "the token into the limit is kept: the output meets it";
  EXPECT_FALSE(ambiguous->accepting(s));
  EXPECT_EQ(ambiguous->feed(s, "a"), GrammarMatcher::kOverLimit);
  EXPECT_EQ(ambiguous->after(s, 'a'), GrammarMatcher::kOverLimit);
  EXPECT_FALSE(ambiguous->keeps(s, 'a', stops, true));
  EXPECT_TRUE(ambiguous->keeps(s, 0, stops, true));
  // Too many states: seven runs of up to 10,000 a's, each state met once.
  const auto m = matcher("root ::= (\"a\"{0,10000} \"b\"){7}\n");
  EXPECT_FALSE(m->full());
  std::string text;
  for (int k = 0; k < 7; ++k) text += std::string(10000, 'a') + "b";
  EXPECT_TRUE(continues(*m, text.substr(0, 30000)));
  EXPECT_FALSE(m->full());
  EXPECT_EQ(m->feed(m->start(), text), GrammarMatcher::kOverLimit);
  EXPECT_EQ(m->states(), GrammarMatcher::kMaxStates);
  EXPECT_TRUE(m->full());
}

// Random texts in each of the three languages a request may send (GBNF, a regular expression, a
// JSON schema), made of their own syntax's pieces so that most get deep into the readers: each is
// compiled, or refused with std::invalid_argument, never anything else; a grammar that compiles
// is then walked on random bytes with masks made on the way.
namespace fuzz {

std::string pieces(std::mt19937& rng, const std::vector<std::string>& from, int most) {
  std::string out;
  const int n = 1 + static_cast<int>(rng() % static_cast<unsigned>(most));
  for (int i = 0; i < n; ++i) out += from[rng() % from.size()];
  return out;
}

// A GBNF expression made the way people write them: literals, classes, rules, groups, repetitions.
std::string expression(std::mt19937& rng, int depth) {
  static const std::vector<std::string> atoms = {"\"ab\"", "\"a\"", "\"\"", "[a-c]", "[^x]", "[0-9]", ".", "x", "y", "root", "\"\\u00e9\"", "[\\x41-\\x5a]"};
  static const std::vector<std::string> repeats = {"*", "+", "?", "{2}", "{0,3}", "{1,}", "{0,60}"};
  const unsigned pick = depth > 3 ? 0 : rng() % 5;
  if (pick == 0) return atoms[rng() % atoms.size()];
  if (pick == 1) return "(" + expression(rng, depth + 1) + " | " + expression(rng, depth + 1) + ")";
  if (pick == 2) return expression(rng, depth + 1) + " " + expression(rng, depth + 1);
  if (pick == 3) return "(" + expression(rng, depth + 1) + ")" + repeats[rng() % repeats.size()];
  return atoms[rng() % atoms.size()] + repeats[rng() % repeats.size()];
}

// Compiles and walks; returns what went wrong other than a clear refusal ("" where nothing did).
std::string walk(std::mt19937& rng, const std::string& gbnf, int& compiled) {
  static const auto trie = std::make_shared<const TokenTrie>(std::vector<std::string>{
      "a", "b", "x", "y", "ab", "\"", "{", "}", "[", "]", ",", ":", " ", "-", "0", "1", "9", ".", "e", "null", "true", "\xc3\xa9", "\xff", ""});
  const std::vector<int32_t> stops{23};
  try {
    const GrammarMatcher m(Grammar::parse(gbnf), trie);
    ++compiled;
    State s = m.start();
    std::vector<float> row(static_cast<size_t>(trie->size()));
    for (int step = 0; step < 12 && s != GrammarMatcher::kDead; ++step) {
      std::fill(row.begin(), row.end(), 0.0f);
      m.mask(s, row, stops, true);
      s = m.after(s, static_cast<int32_t>(rng() % static_cast<unsigned>(trie->size())));
    }
  } catch (const std::invalid_argument&) {
  } catch (const std::exception& e) {
    return std::string("threw ") + typeid(e).name() + ": " + e.what();
  }
  return "";
}

nlohmann::ordered_json schema(std::mt19937& rng, int depth) {
  using json = nlohmann::ordered_json;
  auto pick = [&](std::initializer_list<json> xs) { return *(xs.begin() + static_cast<std::ptrdiff_t>(rng() % xs.size())); };
  const json odd = pick({json(-1), json(2.5), json("x"), json(nullptr), json::array(), json::object(), json(true), json(1e300), json(3)});
  if (depth > 3 || rng() % 5 == 0) return rng() % 3 ? json{{"type", pick({"string", "integer", "number", "boolean", "null", "array", "object"})}} : odd;
  json s = json::object();
  const int keys = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < keys; ++k) {
    switch (rng() % 22) {
      case 0: s["type"] = pick({"string", "integer", "number", "boolean", "null", "array", "object", "thing"}); break;
      case 1: s["type"] = json::array({pick({"string", "integer", "array"}), pick({"null", "object", "number"})}); break;
      case 2: s["properties"] = json{{"a", schema(rng, depth + 1)}, {"b", schema(rng, depth + 1)}}; break;
      case 3: s["required"] = rng() % 4 ? json::array({"a", pick({"b", "c"})}) : odd; break;
      case 4: s["items"] = rng() % 5 ? schema(rng, depth + 1) : odd; break;
      case 5: s["prefixItems"] = json::array({schema(rng, depth + 1)}); break;
      case 6: s[pick({"minItems", "maxItems", "minLength", "maxLength"})] = pick({json(0), json(2), json(5), json(-1), json(20000), json(1.5), json("3")}); break;
      case 7: s[pick({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})] =
                  pick({json(0), json(-2.5), json(0.1), json(7), json(1e17), json(-1e-7), json(true), json("1"), json(3.4999999999999996)});
        break;
      case 8: s["enum"] = rng() % 4 ? json::array({1, "a", nullptr, json::array({2})}) : odd; break;
      case 9: s["const"] = odd; break;
      case 10: s[pick({"anyOf", "oneOf", "allOf"})] = json::array({schema(rng, depth + 1), schema(rng, depth + 1)}); break;
      case 11: s["$ref"] = pick({"#/$defs/a", "#/$defs/b", "#", "#/properties/a", "other.json", "#/nowhere"}); break;
      case 12: s["$defs"] = json{{"a", schema(rng, depth + 1)}}; break;
      case 13: s["nullable"] = pick({true, false, 1}); break;
      case 14: s["format"] = pick({"date", "date-time", "uuid", "email", "ipv6", "uri", "hostname", "color"}); break;
      case 15: s["pattern"] = pick({"^a+$", "[a-", "(x|y){2,3}", "\\d{3}-\\d{4}", "a(?=b)", "((a)", "\\p{L}", "[^\"]*"}); break;
      case 16: s["additionalProperties"] = rng() % 2 ? json(rng() % 2 == 0) : schema(rng, depth + 1); break;
      case 17: s["multipleOf"] = pick({json(5), json(0.25), json(3), json(0), json(-1), json(1001), json(1e-7), json("2")}); break;
      case 18: s["description"] = "x"; break;
      case 19: s["uniqueItems"] = true; break;
      case 20: s["type"] = "number"; s["minimum"] = pick({json(1), json(0.05)}); s["exclusiveMaximum"] = pick({json(1), json(0.05), json(true)}); break;
      default: s["title"] = odd; break;
    }
  }
  return s;
}

}  // namespace fuzz

TEST(Grammar, RandomGbnfRegexesAndSchemasCompileOrAreOneClearErrorAndWalkWithoutFault) {
  std::mt19937 rng(72);
  const std::vector<std::string> gbnf_pieces = {
      "root", " ::= ", "x", "y", " ", "\n", "\"a\"", "\"", "[", "]", "[^", "a-z", "-", "\\", "\\x41", "\\xff", "\\u00e9", "\\U0010ffff",
      "(", ")", "|", "*", "+", "?", "{", "}", ",", "2", "0", "10000", ".", "#", "\xc3\xa9", "\xff", "\nx ::= ", "\ny ::= ", "\"\"", "x?"};
  const std::vector<std::string> regex_pieces = {"a", "b", "(", ")", "(?:", "(?P<n>", "|", "*", "+", "?", "{2}", "{1,3}", "{,2}", "{2,}", "[",
                                                 "]", "[^", "a-z", "\\d", "\\w", "\\s", "\\", "\\x41", "\\u00e9", ".", "^", "$", "\xc3\xa9", "-", ",", "*?"};
  int gbnfs = 0, regexes = 0, schemas = 0;  // how many compiled: the texts must reach the matcher
  for (int i = 0; i < 3000; ++i) {
    std::string gbnf = "root ::= " + fuzz::expression(rng, 0) + "\nx ::= " + fuzz::expression(rng, 0) + "\ny ::= " + fuzz::expression(rng, 0) + "\n";
    if (rng() % 3 == 0) {  // and now and then a piece put in anywhere
      const size_t at = rng() % (gbnf.size() + 1);
      gbnf.insert(at, fuzz::pieces(rng, gbnf_pieces, 3));
    }
    ASSERT_EQ(fuzz::walk(rng, gbnf, gbnfs), "") << "GBNF: " << gbnf;
    const std::string re = fuzz::pieces(rng, regex_pieces, 16);
    std::string from_re;
    try {
      from_re = gbnf_of_regex(re);
    } catch (const std::invalid_argument&) {
      continue;
    } catch (const std::exception& e) {
      FAIL() << "regex " << re << " threw " << e.what();
    }
    ASSERT_EQ(fuzz::walk(rng, from_re, regexes), "") << "regex: " << re << "\nGBNF: " << from_re;
  }
  for (int i = 0; i < 3000; ++i) {
    const nlohmann::ordered_json s = fuzz::schema(rng, 0);
    std::string gbnf;
    try {
      gbnf = gbnf_of_json_schema(s);
    } catch (const std::invalid_argument&) {
      continue;
    } catch (const std::exception& e) {
      FAIL() << "schema " << s.dump() << " threw " << e.what();
    }
    ASSERT_EQ(fuzz::walk(rng, gbnf, schemas), "") << "schema: " << s.dump() << "\nGBNF: " << gbnf;
  }
  std::printf("compiled: %d of 3,000 GBNF texts, %d regular expressions, %d schemas\n", gbnfs, regexes, schemas);
  EXPECT_GT(gbnfs, 1000);
  EXPECT_GT(regexes, 300);
  EXPECT_GT(schemas, 300);
}

TEST(Grammar, CharacterClassesMatchCodePointsAsWellFormedUtf8) {
  const auto m = matcher("root ::= [^a\\u00e9-\\u00ff\\u4e00-\\u9fff]\n");
  auto utf8 = [](uint32_t cp) {
    std::string s;
    if (cp < 0x80) s += static_cast<char>(cp);
    else if (cp < 0x800) s += static_cast<char>(0xC0 | cp >> 6), s += static_cast<char>(0x80 | (cp & 63));
    else if (cp < 0x10000)
      s += static_cast<char>(0xE0 | cp >> 12), s += static_cast<char>(0x80 | (cp >> 6 & 63)), s += static_cast<char>(0x80 | (cp & 63));
    else
      s += static_cast<char>(0xF0 | cp >> 18), s += static_cast<char>(0x80 | (cp >> 12 & 63)),
          s += static_cast<char>(0x80 | (cp >> 6 & 63)), s += static_cast<char>(0x80 | (cp & 63));
    return s;
  };
  std::mt19937 rng(7);
  std::vector<uint32_t> cps = {0, 'a', 'b', 0x7F, 0x80, 0xE8, 0xE9, 0xFF, 0x100, 0x7FF, 0x800, 0x4DFF, 0x4E00, 0x9FFF, 0xA000,
                               0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF};
  for (int k = 0; k < 3000; ++k) cps.push_back(std::uniform_int_distribution<uint32_t>(0, 0x10FFFF)(rng));
  for (const uint32_t cp : cps) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const bool in = !(cp == 'a' || (cp >= 0xE9 && cp <= 0xFF) || (cp >= 0x4E00 && cp <= 0x9FFF));
    EXPECT_EQ(accepts(*m, utf8(cp)), in) << std::hex << cp;
  }
  for (const std::string bad : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\x80", "\xFF"})
    EXPECT_FALSE(continues(*m, bad));
  EXPECT_TRUE(accepts(*matcher("root ::= \"\\u00e9t\\u00e9\" .\n"), "\xC3\xA9t\xC3\xA9\xF0\x9F\x98\x80"));
}

// The mask of a state (a walk of the vocabulary's trie, cached per state) keeps exactly the tokens
// whose bytes, fed one by one, leave the grammar alive; the stop tokens only where it may end.
TEST(Grammar, AMaskKeepsExactlyTheTokensWhoseBytesContinueTheGrammar) {
  const std::string gbnf = R"(root ::= "[" ws (item (ws "," ws item)*)? ws "]"
item ::= "\"" [a-c]{0,3} "\"" | "0" | [1-9] [0-9]{0,2} | "true"
ws ::= [ \n]{0,2}
)";
  std::mt19937 rng(3);
  const std::string alphabet = "[]\", \nabc019true";
  std::vector<std::string> bytes;
  for (int v = 0; v < 400; ++v) {
    std::string t;
    const int len = 1 + static_cast<int>(rng() % 5);
    for (int k = 0; k < len; ++k) t += alphabet[rng() % alphabet.size()];
    bytes.push_back(v == 7 ? "" : t);  // token 7: special
  }
  auto trie = std::make_shared<const TokenTrie>(bytes);
  const GrammarMatcher m(Grammar::parse(gbnf), trie);
  const std::vector<int32_t> stops{7};
  int checked = 0, ended = 0;
  for (int walk = 0; walk < 40; ++walk) {
    State s = m.start();
    std::string text;
    for (int step = 0; step < 30; ++step) {
      std::vector<float> row(bytes.size(), 1.0f);
      m.mask(s, row, stops, true);
      std::vector<int32_t> kept;
      bool any = false;  // a token other than the stop token continues
      for (int32_t v = 0; v < static_cast<int32_t>(bytes.size()); ++v)
        any = any || (v != 7 && m.feed(s, bytes[static_cast<size_t>(v)]) != GrammarMatcher::kDead);
      for (int32_t v = 0; v < static_cast<int32_t>(bytes.size()); ++v) {
        const bool by_bytes = v == 7 ? m.accepting(s) || !any : m.feed(s, bytes[static_cast<size_t>(v)]) != GrammarMatcher::kDead;
        ASSERT_EQ(row[static_cast<size_t>(v)] != kNegInf, by_bytes) << "after '" << text << "', token '" << bytes[static_cast<size_t>(v)] << "'";
        EXPECT_EQ(m.keeps(s, v, stops, true), by_bytes);
        if (by_bytes) kept.push_back(v);
        ++checked;
      }
      if (m.accepting(s) && (rng() % 4 == 0 || kept.size() == 1)) {
        ++ended;
        EXPECT_TRUE(nlohmann::json::accept(text)) << text;  // this grammar's sentences are JSON
        break;
      }
      if (!any) break;  // a dead end of this vocabulary: only the stop token
      int32_t v = 7;
      while (v == 7) v = kept[rng() % kept.size()];
      text += bytes[static_cast<size_t>(v)];
      s = m.after(s, v);
      ASSERT_EQ(s, m.feed(m.start(), text));
    }
  }
  EXPECT_GT(checked, 10000);
  EXPECT_GT(ended, 5);
  // While min_tokens holds them back, the stop tokens stay only where nothing else may come.
  const GrammarMatcher xs(Grammar::parse("root ::= \"x\"+\n"), std::make_shared<const TokenTrie>(std::vector<std::string>{"x", ""}));
  const std::vector<int32_t> stop1{1};
  std::vector<float> two(2, 1.0f);
  xs.mask(xs.feed(xs.start(), "x"), two, stop1, false);
  EXPECT_EQ(two, (std::vector<float>{1.0f, kNegInf}));
  std::fill(two.begin(), two.end(), 1.0f);
  xs.mask(xs.feed(xs.start(), "x"), two, stop1, true);
  EXPECT_EQ(two, (std::vector<float>{1.0f, 1.0f}));
  std::vector<float> row(bytes.size(), 1.0f);
  const State done = m.feed(m.start(), "[]");
  std::fill(row.begin(), row.end(), 1.0f);
  m.mask(done, row, stops, false);
  EXPECT_EQ(row[7], 1.0f);  // nothing else may follow "[]": the stop token stays
  std::fill(row.begin(), row.end(), 1.0f);
  m.mask(GrammarMatcher::kDead, row, stops, true);
  for (size_t v = 0; v < row.size(); ++v) EXPECT_EQ(row[v] != kNegInf, v == 7);
}

std::string schema_error(const std::string& schema) {
  try {
    gbnf_of_json_schema(nlohmann::ordered_json::parse(schema));
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::shared_ptr<const GrammarMatcher> schema_matcher(const std::string& schema) {
  return matcher(gbnf_of_json_schema(nlohmann::ordered_json::parse(schema)));
}

const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer"},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog", 3]}, "minItems": 1, "maxItems": 2},
    "nick": {"type": ["string", "null"]},
    "home": {"$ref": "#/$defs/place"}
  },
  "required": ["name", "age", "pets"],
  "additionalProperties": false,
  "$defs": {"place": {"type": "object", "properties": {"city": {"const": "Paris"}, "near": {"$ref": "#/$defs/place"}}, "required": ["city"]}}
})";

// --- A grammar after a block of free text (a reasoning model's <think> ... </think>) ---

TEST(GrammarAfterBlock, RenamingRootChangesItsDefinitionAndReferencesOnly) {
  const std::string gbnf =
      "root ::= \"root\" item # root stays in a comment\n"
      "item ::= [root] | root-x | \"\\\"root\" | root\n"
      "root-x ::= \"y\" roots\nroots ::= \"z\"\n";
  EXPECT_EQ(gbnf_with_root_renamed(gbnf, "inner"),
            "inner ::= \"root\" item # root stays in a comment\n"
            "item ::= [root] | root-x | \"\\\"root\" | inner\n"
            "root-x ::= \"y\" roots\nroots ::= \"z\"\n");
}

// Every text of a small alphabet up to 4 characters (and random longer ones), against an oracle
// written from the definition: with the block opened, the text is accepted where its first
// `close` is followed by a sentence of the grammar, and it may continue wherever it holds no
// `close` yet or what follows its first one may continue the grammar; not opened, the text is a
// sentence of the grammar, or at most 20 whitespace characters, `open` and such a block; lazy
// (gbnf_lazy, `close` its trigger), as opened but a text without the trigger may end too. The
// markers overlap themselves (Knuth-Morris-Pratt's fallbacks: "aab" after "aaa", "abab" after
// "ababa") and hold characters of two bytes.
TEST(GrammarAfterBlock, AcceptsExactlyTheBlocksTextWithoutItsEndThenTheGrammarAndLazilyTheTextBeforeATrigger) {
  const std::string inner = "root ::= \"x\" [a-z\\u00e9]*\n";
  auto inner_accepts = [](const std::string& t) { return std::regex_match(t, std::regex("x([a-z]|\xC3\xA9)*")); };
  auto inner_continues = [](const std::string& t) { return t.empty() || std::regex_match(t, std::regex("x([a-z]|\xC3\xA9)*")); };
  struct Markers {
    std::string open, close;
  };
  const std::string e = "\xC3\xA9";  // é
  for (const Markers& mk : {Markers{"<t>", "</t>"}, Markers{"b", "aab"}, Markers{"ab", "abab"}, Markers{"b" + e, e + "a" + e}}) {
    const auto opened = matcher(gbnf_after_block(inner, mk.open, mk.close, true));
    const auto closed = matcher(gbnf_after_block(inner, mk.open, mk.close, false));
    const auto lazy = matcher(gbnf_lazy(inner, mk.close));  // (the closing marker as the trigger)
    auto opened_accepts = [&](const std::string& t) {
      const size_t at = t.find(mk.close);
      return at != std::string::npos && inner_accepts(t.substr(at + mk.close.size()));
    };
    auto opened_continues = [&](const std::string& t) {
      const size_t at = t.find(mk.close);
      return at == std::string::npos || inner_continues(t.substr(at + mk.close.size()));
    };
    auto closed_accepts = [&](const std::string& t) {
      if (inner_accepts(t)) return true;
      const size_t text = t.find_first_not_of(" \t\n\r");
      if (text == std::string::npos || text > 20 || t.compare(text, mk.open.size(), mk.open) != 0) return false;
      return opened_accepts(t.substr(text + mk.open.size()));
    };
    std::vector<std::string> alphabet = {"a", "b", "x", "<", "/", "t", ">", " ", e};
    std::vector<std::string> texts = {""}, layer = {""};
    for (int len = 1; len <= 4; ++len) {
      std::vector<std::string> longer;
      for (const std::string& t : layer)
        for (const std::string& c : alphabet) longer.push_back(t + c);
      texts.insert(texts.end(), longer.begin(), longer.end());
      layer = std::move(longer);
    }
    std::mt19937 rng(11);
    for (int k = 0; k < 10000; ++k) {  // longer ones, with the markers and the grammar's start mixed in
      std::string t;
      const int parts = std::uniform_int_distribution<int>(1, 9)(rng);
      for (int p = 0; p < parts; ++p) {
        const int pick = std::uniform_int_distribution<int>(0, static_cast<int>(alphabet.size()) + 2)(rng);
        t += pick < static_cast<int>(alphabet.size()) ? alphabet[static_cast<size_t>(pick)]
             : pick == static_cast<int>(alphabet.size()) ? mk.close
             : pick == static_cast<int>(alphabet.size()) + 1 ? mk.open
                                                            : "x";
      }
      texts.push_back(t);
    }
    size_t accepted = 0, accepted_closed = 0;
    for (const std::string& t : texts) {
      ASSERT_EQ(accepts(*opened, t), opened_accepts(t)) << mk.close << " opened: '" << t << "'";
      ASSERT_EQ(continues(*opened, t), opened_continues(t)) << mk.close << " opened: '" << t << "'";
      ASSERT_EQ(accepts(*closed, t), closed_accepts(t)) << mk.close << " not opened: '" << t << "'";
      ASSERT_EQ(accepts(*lazy, t), t.find(mk.close) == std::string::npos || opened_accepts(t)) << mk.close << " lazy: '" << t << "'";
      ASSERT_EQ(continues(*lazy, t), opened_continues(t)) << mk.close << " lazy: '" << t << "'";
      accepted += opened_accepts(t);
      accepted_closed += closed_accepts(t) && !inner_accepts(t);
    }
    EXPECT_GT(accepted, 100u) << mk.close;  // the oracle's both sides are met
    EXPECT_GT(accepted_closed, 15u) << mk.close;
  }
  // The block's rules take a name the inner grammar does not use.
  const auto m = matcher(gbnf_after_block("root ::= block-0\nblock-0 ::= \"q\"\n", "<t>", "</t>", true));
  EXPECT_TRUE(accepts(*m, "thinking</t>q"));
  EXPECT_FALSE(accepts(*m, "thinking</t>"));
}

// A long block keeps the matcher's stacks short (its rules recurse in tail position only): ten
// thousand characters, past the matcher's stack depth, and a handful of states in all.
TEST(GrammarAfterBlock, ALongBlockNeedsFewStates) {
  const auto m = matcher(gbnf_after_block("root ::= \"{}\"\n", "<think>", "</think>", true));
  std::string t;
  std::mt19937 rng(3);
  const std::string pieces[] = {"<", "</", "</th", "</think", "hink>", "a", " ", "\n", "<<//"};
  while (t.size() < 10000) t += pieces[std::uniform_int_distribution<int>(0, 8)(rng)];
  ASSERT_EQ(t.find("</think>"), std::string::npos);
  EXPECT_TRUE(continues(*m, t));
  EXPECT_FALSE(accepts(*m, t));
  EXPECT_TRUE(accepts(*m, t + "</think>{}"));
  EXPECT_FALSE(continues(*m, t + "</think>x"));
  EXPECT_LT(m->states(), 20u);
}

TEST(JsonSchema, OutputsFollowTheSchemaInItsOwnOrder) {
  const auto m = schema_matcher(kPerson);
  for (const std::string ok : {
           R"({"name":"Ann","age":31,"pets":["cat"]})",
           R"({ "name": "Bo", "age": -2, "pets": ["dog", 3], "nick": null })",
           "{\n  \"name\": \"\\u00e9\",\n  \"age\": 0,\n  \"pets\": [3],\n  \"nick\": \"b\",\n  \"home\": {\"city\": \"Paris\", \"near\": {\"city\": \"Paris\"}}\n}",
           R"({"name":"12345678","age":5,"pets":[3],"home":{"city":"Paris"}})"})
    EXPECT_TRUE(accepts(*m, ok)) << ok;
  for (const std::string bad : {
           R"({"age":31,"name":"Ann","pets":["cat"]})",          // out of the schema's order
           R"({"name":"Ann","pets":["cat"]})",                   // a required member missing
           R"({"name":"Ann","age":31,"pets":[]})",               // minItems
           R"({"name":"Ann","age":31,"pets":[3,3,3]})",          // maxItems
           R"({"name":"Ann","age":3.5,"pets":[3]})",             // an integer
           R"({"name":"Ann","age":31,"pets":["cow"]})",          // enum
           R"({"name":"123456789","age":1,"pets":[3]})",         // maxLength
           R"({"name":"Ann","age":31,"pets":[3],"x":1})",        // no other members
           R"({"name":"Ann","age":31,"pets":[3],"home":{"city":"Rome"}})",  // const
           R"({"name":"Ann","age":031,"pets":[3]})",             // JSON's numbers
           R"(["name"])"})
    EXPECT_FALSE(accepts(*m, bad)) << bad;
}

// Random sentences of a schema's grammar (each byte drawn among those that keep it alive, ending
// where it may) are JSON that keeps the schema's rules.
TEST(JsonSchema, RandomOutputsOfAnObjectSchemaAreJsonThatKeepsItsRules) {
  const auto m = schema_matcher(kPerson);
  std::mt19937 rng(11);
  int made = 0;
  for (int walk = 0; walk < 300 && made < 60; ++walk) {
    State s = m->start();
    std::string text;
    for (int step = 0; step < 400; ++step) {
      if (m->accepting(s) && rng() % 3 == 0) break;
      std::vector<int> next;
      for (int b = 0; b < 256; ++b)
        if (m->feed(s, std::string(1, static_cast<char>(b))) != GrammarMatcher::kDead) next.push_back(b);
      if (next.empty()) break;
      // Mostly the structural bytes, so that walks end: prefer '"', ',', ']', '}' and digits.
      int b = next[rng() % next.size()];
      for (const int pref : {'"', '}', ']', ',', '1', 'P', 'n', 'c'})
        if (rng() % 2 == 0 && std::find(next.begin(), next.end(), pref) != next.end()) {
          b = pref;
          break;
        }
      text += static_cast<char>(b);
      s = m->feed(s, std::string(1, static_cast<char>(b)));
    }
    if (!m->accepting(s)) continue;
    ++made;
    nlohmann::ordered_json j;
    ASSERT_NO_THROW(j = nlohmann::ordered_json::parse(text)) << text;
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
    EXPECT_TRUE(j.contains("age") && j["age"].is_number_integer()) << text;
    ASSERT_TRUE(j.contains("pets") && j["pets"].is_array()) << text;
    EXPECT_GE(j["pets"].size(), 1u);
    EXPECT_LE(j["pets"].size(), 2u);
    for (const auto& p : j["pets"]) EXPECT_TRUE(p == "cat" || p == "dog" || p == 3) << text;
    for (const auto& [k, _] : j.items()) EXPECT_TRUE(k == "name" || k == "age" || k == "pets" || k == "nick" || k == "home") << text;
    if (j.contains("nick")) {
      EXPECT_TRUE(j["nick"].is_string() || j["nick"].is_null()) << text;
    }
    if (j.contains("home")) {
      EXPECT_EQ(j["home"]["city"], "Paris") << text;
    }
  }
  EXPECT_GE(made, 20);
}

TEST(JsonSchema, WhatItCannotKeepIsOneClearErrorNamingWhere) {
  EXPECT_EQ(schema_error(R"({"type":"object","properties":{"tags":{"type":"array","uniqueItems":true}}})"),
            "json_schema: /properties/tags: uniqueItems is not supported");
  EXPECT_EQ(schema_error(R"({"type":"string","format":"email","uniqueItems":true})"), "json_schema: /: uniqueItems is not supported");
  EXPECT_EQ(schema_error(R"({"type":"thing"})"), "json_schema: /: unknown type \"thing\"");
  EXPECT_EQ(schema_error(R"({"$ref":"#/$defs/missing"})"), "json_schema: /: $ref \"#/$defs/missing\" names nothing in the schema");
  EXPECT_EQ(schema_error(R"({"$ref":"http://example.com/s.json"})"),
            "json_schema: /: $ref must point into this schema (#/...), got \"http://example.com/s.json\"");
  EXPECT_EQ(schema_error(R"({"type":"array","items":{"type":"string"},"minItems":3,"maxItems":2})"), "json_schema: /: minItems above maxItems");
  EXPECT_EQ(schema_error("false"), "json_schema: /: the schema false accepts nothing");
  EXPECT_EQ(schema_error(R"({"allOf":[{"type":"string"},{"type":"integer"}]})"), "json_schema: /: allOf is supported with one schema only");
  EXPECT_EQ(schema_error(R"({"type":"object","properties":{"a":{"title":"A","description":"d","format":"date","type":"string"}}})"), "");
}

// Regular expressions (guided_regex, JSON Schema's pattern) against std::regex (ECMAScript) as the
// oracle: every string of a random set over the patterns' alphabet is accepted whole exactly when
// std::regex_match takes it, and every prefix of an accepted one continues.
TEST(Regex, TextsMatchExactlyWhereStdRegexMatchesThemWhole) {
  const std::vector<std::string> patterns = {
      "[a-c]+x?", "(ab|a)*b", "\\d{2,3}-\\d{1,2}", "[^abc]{1,3}", "a.b", "(?:ab){2}|c*", "\\w+@\\w+\\.(com|org)",
      "x{0,2}y{3}", "[\\d\\s]+", "\\.\\*", "^(a|b|)c$", "[-a]b[a-]", "a{2,}b", "(a*)*b", "[\\W]x", "\\S\\D"};
  const std::string alphabet = "abcxy-.@ 01*\ncomorg";
  std::mt19937 rng(5);
  std::vector<std::string> texts = {"", "b", "abab", "ab", "ccc", "12-3", "a@b.com", "xyyy", "yyy", ".*", "c", "ac", "-ba-", "aab", "aaab", "!x", "x1"};
  for (int k = 0; k < 4000; ++k) {
    std::string t;
    const int len = static_cast<int>(rng() % 9);
    for (int i = 0; i < len; ++i) t += alphabet[rng() % alphabet.size()];
    texts.push_back(t);
  }
  for (const std::string& re : patterns) {
    const auto m = matcher(gbnf_of_regex(re));
    const std::regex oracle(re, std::regex::ECMAScript);
    int matched = 0;
    for (const std::string& t : texts) {
      const bool want = std::regex_match(t, oracle);
      ASSERT_EQ(accepts(*m, t), want) << "/" << re << "/ on \"" << t << "\"";
      if (want) {
        ++matched;
        for (size_t k = 0; k < t.size(); ++k) ASSERT_TRUE(continues(*m, t.substr(0, k))) << re << " " << t;
      }
    }
    EXPECT_GT(matched, 0) << "/" << re << "/ matched none of the texts";
  }
}

TEST(Regex, WhatItCannotKeepIsOneClearError) {
  auto err = [](const std::string& re) {
    try {
      gbnf_of_regex(re);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(err("(a)\\1"), "regex: '\\1' is not supported at byte 4");
  EXPECT_EQ(err("a(?=b)"), "regex: lookahead is not supported at byte 3");
  EXPECT_EQ(err("\\bword"), "regex: word boundaries are not supported at byte 1");
  EXPECT_EQ(err("(?i)a"), "regex: group flags are not supported at byte 2");
  EXPECT_EQ(err("a**"), "regex: a quantifier after a quantifier at byte 2");
  EXPECT_EQ(err("(ab"), "regex: an unterminated group at byte 3");
  EXPECT_EQ(err("ab)"), "regex: an unmatched ')' at byte 2");
  EXPECT_EQ(err("*a"), "regex: '*' with nothing to repeat at byte 0");
  EXPECT_EQ(err("[z-a]"), "regex: a range whose end comes before its start at byte 4");
  EXPECT_EQ(err(""), "regex: the pattern is empty");
}

// A schema's pattern holds the string's characters; those JSON would escape are left out.
TEST(JsonSchema, APatternHoldsTheStringsCharacters) {
  const auto m = schema_matcher(R"({"type":"object","properties":{"id":{"type":"string","pattern":"^[A-Z]{2}-\\d{3}$"},"tag":{"type":"string","pattern":"[^,]+"}},"required":["id","tag"]})");
  EXPECT_TRUE(accepts(*m, R"({"id":"AB-123","tag":"x y"})"));
  EXPECT_FALSE(accepts(*m, R"({"id":"AB-12","tag":"x"})"));
  EXPECT_FALSE(accepts(*m, R"({"id":"ab-123","tag":"x"})"));
  EXPECT_FALSE(accepts(*m, R"({"id":"AB-123","tag":"a,b"})"));
  EXPECT_FALSE(continues(*m, R"({"id":"AB-123","tag":"a\)"));  // no escapes inside a pattern's string
  EXPECT_FALSE(accepts(*m, R"({"id":"AB-123","tag":""})"));
  EXPECT_EQ(schema_error(R"({"type":"string","pattern":"a","maxLength":3})"), "json_schema: /: pattern with minLength or maxLength is not supported");
  EXPECT_EQ(schema_error(R"({"type":"string","pattern":"(a"})"), "json_schema: /pattern: regex: an unterminated group at byte 2");
}

TEST(JsonSchema, ChoicesAreTheOnlyOutputs) {
  const auto m = matcher(gbnf_of_choices({"yes", "no", "yes, \"surely\""}));
  EXPECT_TRUE(accepts(*m, "yes"));
  EXPECT_TRUE(accepts(*m, "no"));
  EXPECT_TRUE(accepts(*m, "yes, \"surely\""));
  EXPECT_FALSE(accepts(*m, "ye"));
  EXPECT_FALSE(continues(*m, "maybe"));
  EXPECT_THROW(gbnf_of_choices({}), std::invalid_argument);
}

// Numbers and integers within minimum / maximum / exclusiveMinimum / exclusiveMaximum: every
// candidate text is accepted exactly when it is a JSON number of the type (without an exponent,
// never "-0") whose value lies within the bounds, strtod's value against the bound's as the
// oracle (the candidates have at most 9 significant digits, so the doubles order them exactly).
TEST(JsonSchema, NumbersAndIntegersAreAcceptedExactlyWithinTheirBounds) {
  struct Case {
    const char* schema;
    bool integer;
    double lo, hi;
    bool lo_strict, hi_strict;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Case> cases = {
      {R"({"type":"integer","minimum":-7,"maximum":12})", true, -7, 12, false, false},
      {R"({"type":"integer","exclusiveMinimum":0})", true, 0, inf, true, false},
      {R"({"type":"integer","minimum":2.5,"exclusiveMaximum":20.5})", true, 2.5, 20.5, false, true},
      {R"({"type":"integer","maximum":-3})", true, -inf, -3, false, false},
      {R"({"type":"integer","exclusiveMaximum":-0.5,"minimum":-120})", true, -120, -0.5, false, true},
      {R"({"type":"integer","minimum":1e3})", true, 1000, inf, false, false},
      {R"({"type":"number","minimum":0,"maximum":1})", false, 0, 1, false, false},
      {R"({"type":"number","exclusiveMinimum":-1.25,"exclusiveMaximum":3.5})", false, -1.25, 3.5, true, true},
      {R"({"type":"number","minimum":0.05,"maximum":0.15})", false, 0.05, 0.15, false, false},
      {R"({"type":"number","exclusiveMinimum":0})", false, 0, inf, true, false},
      {R"({"type":"number","maximum":-0.5})", false, -inf, -0.5, false, false},
      {R"({"type":"number","minimum":10,"exclusiveMinimum":10,"maximum":1000})", false, 10, 1000, true, false},
      {R"({"type":"number","minimum":1,"exclusiveMinimum":true,"maximum":21,"exclusiveMaximum":false})", false, 1, 21, true, false},
      {R"({"type":"number","minimum":-2,"maximum":-2})", false, -2, -2, false, false},
      {R"({"type":"number","minimum":1e-3,"exclusiveMaximum":2.0025e-3})", false, 0.001, 0.0020025, false, true},
      {R"({"type":"number","minimum":-1000.5,"maximum":-999.25})", false, -1000.5, -999.25, false, false},
      {R"({"minimum":3})", false, 3, inf, false, false},
  };
  std::vector<std::string> candidates = {"", "-", "01", "-01", "1.", ".5", "1e3", "00", "-0", "-0.0", "1.5e1", "+1", "0.", "--1"};
  std::mt19937 rng(17);
  const std::vector<std::string> wholes = {"0", "1", "2", "3", "7", "8", "9", "10", "11", "12", "13", "19", "20", "21", "99", "100", "119", "120",
                                           "121", "999", "1000", "1001", "12345"};
  std::vector<std::string> fracs = {"", ".0", ".00", ".05", ".049", ".0500", ".051", ".1", ".15", ".150001", ".149", ".25", ".2499", ".251",
                                    ".5", ".4999", ".50", ".501", ".001", ".0009", ".002", ".0025", ".00200", ".0020025", ".0020024", ".00200251", ".9"};
  for (int k = 0; k < 30; ++k) {
    std::string f = ".";
    const int len = 1 + static_cast<int>(rng() % 5);
    for (int i = 0; i < len; ++i) f += static_cast<char>('0' + rng() % 10);
    fracs.push_back(f);
  }
  for (const std::string sign : {"", "-"})
    for (const auto& w : wholes)
      for (const auto& f : fracs) candidates.push_back(sign + w + f);
  const std::regex number_form("-?(0|[1-9][0-9]*)(\\.[0-9]+)?"), integer_form("-?(0|[1-9][0-9]*)");
  for (const Case& c : cases) {
    const auto m = schema_matcher(c.schema);
    int taken = 0;
    for (const std::string& t : candidates) {
      bool want = std::regex_match(t, c.integer ? integer_form : number_form);
      if (want) {
        const double v = std::strtod(t.c_str(), nullptr);
        want = !(t[0] == '-' && v == 0) && (c.lo_strict ? v > c.lo : v >= c.lo) && (c.hi_strict ? v < c.hi : v <= c.hi);
      }
      if (std::string(c.schema) == R"({"minimum":3})" && !want) continue;  // other types are also values there
      ASSERT_EQ(accepts(*m, t), want) << c.schema << " on \"" << t << "\"";
      if (want) {
        ++taken;
        for (size_t k = 0; k < t.size(); ++k) ASSERT_TRUE(continues(*m, t.substr(0, k))) << c.schema << " " << t;
      }
    }
    EXPECT_GT(taken, 0) << c.schema;
  }
  // Without a type, the bounds hold numbers alone: other values pass.
  const auto any = schema_matcher(R"({"minimum":3,"maxLength":2})");
  for (const std::string ok : {"3", "\"ab\"", "null", "[1]", "{\"a\":1}", "true"}) EXPECT_TRUE(accepts(*any, ok)) << ok;
  for (const std::string bad : {"2.5", "\"abc\"", "-4"}) EXPECT_FALSE(accepts(*any, bad)) << bad;
}

TEST(JsonSchema, BoundsThatCannotBeKeptAreOneClearError) {
  EXPECT_EQ(schema_error(R"({"type":"integer","minimum":3,"maximum":2})"), "json_schema: /: no integer lies between the minimum and the maximum");
  EXPECT_EQ(schema_error(R"({"type":"integer","minimum":2.1,"maximum":2.9})"), "json_schema: /: no integer lies between the minimum and the maximum");
  EXPECT_EQ(schema_error(R"({"type":"number","exclusiveMinimum":1,"exclusiveMaximum":1})"), "json_schema: /: no number lies between the minimum and the maximum");
  EXPECT_EQ(schema_error(R"({"properties":{"n":{"type":"number","minimum":"1"}}})"), "json_schema: /properties/n: minimum must be a number");
  EXPECT_EQ(schema_error(R"({"type":"number","exclusiveMinimum":true})"), "json_schema: /: exclusiveMinimum true needs minimum");
  EXPECT_EQ(schema_error(R"({"type":"number","minimum":1e17})"), "json_schema: /: a bound past 16 digits leaves no number the output can write");
  EXPECT_EQ(schema_error(R"({"type":"number","minimum":-1e17,"maximum":1e300})"), "");
  EXPECT_EQ(schema_error(R"({"type":"string","format":"date","maxLength":3})"), "json_schema: /: format \"date\" with pattern, minLength or maxLength is not supported");
  EXPECT_EQ(schema_error(R"({"type":"string","format":"color"})"), "");  // an unknown format is an annotation
}

// String formats against oracles that are not this grammar: inet_pton for ipv4 and ipv6 (on
// candidates built of groups, "::" and dotted tails), and regular expressions written from the
// RFCs for the rest, on valid and invalid texts; random walks through each format's grammar end
// in texts the oracle takes.
TEST(JsonSchema, AStrictBoundRefusesTheDecimalsThatParseOntoIt) {
  // Validators read the output as a double (Python's json: pydantic, jsonschema): a decimal just
  // inside a strict end that rounds to the end's own double is refused there, so here too.
  const auto m = schema_matcher(R"({"type":"number","exclusiveMinimum":-1.25,"exclusiveMaximum":3.5})");
  for (const std::string t : {"3.4999999999999999", "-1.2499999999999999", "3.5", "-1.25"}) {
    EXPECT_FALSE(accepts(*m, t)) << t;
    EXPECT_FALSE(std::strtod(t.c_str(), nullptr) > -1.25 && std::strtod(t.c_str(), nullptr) < 3.5) << "the oracle disagrees on " << t;
  }
  for (const std::string t : {"3.4999999999999996", "3.499999999999999", "-1.2499999999999998", "0", "-1.2"}) {
    EXPECT_TRUE(accepts(*m, t)) << t;
    EXPECT_TRUE(std::strtod(t.c_str(), nullptr) > -1.25 && std::strtod(t.c_str(), nullptr) < 3.5) << "the oracle disagrees on " << t;
  }
  const auto positive = schema_matcher(R"({"type":"number","exclusiveMinimum":0})");
  EXPECT_TRUE(accepts(*positive, "0.0000000000000001"));
  for (const std::string t : {"0", "0.0", "-0.0000000000000001"}) EXPECT_FALSE(accepts(*positive, t)) << t;
  // Integers are compared exactly (an int against a float in Python): a strict end stays as written.
  const auto whole = schema_matcher(R"({"type":"integer","exclusiveMinimum":0,"exclusiveMaximum":3})");
  EXPECT_TRUE(accepts(*whole, "1"));
  EXPECT_TRUE(accepts(*whole, "2"));
  EXPECT_FALSE(accepts(*whole, "3"));
}

TEST(JsonSchema, DeepOrSelfMultiplyingSchemasAreOneClearErrorOrLinearWork) {
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "{\"items\":";
  deep += "{}" + std::string(100000, '}');
  EXPECT_EQ(schema_error(deep), "json_schema: /: the schema nests deeper than 128 levels");
  std::string deep_const = R"({"const":)" + std::string(200, '[') + std::string(200, ']') + "}";
  EXPECT_EQ(schema_error(deep_const), "json_schema: /: the schema nests deeper than 128 levels");
  // 40 levels of a type list over arrays: each level read twice over, 2^40 conversions if every
  // reading converted its parts anew.
  std::string doubling = R"({"type":"integer"})";
  for (int i = 0; i < 40; ++i) doubling = R"({"type":["array","array"],"items":)" + doubling + "}";
  const std::string gbnf = gbnf_of_json_schema(nlohmann::ordered_json::parse(doubling));
  EXPECT_LT(gbnf.size(), 20000u);
  const auto m = matcher(gbnf);
  EXPECT_TRUE(accepts(*m, "[[[]],[]]"));
  EXPECT_FALSE(continues(*m, "[7"));
  // nullable and a type list, read together.
  const auto n = schema_matcher(R"({"type":["integer","string"],"nullable":true,"maxLength":2})");
  for (const std::string t : {"null", "3", "\"xy\""}) EXPECT_TRUE(accepts(*n, t)) << t;
  for (const std::string t : {"true", "\"xyz\"", "2.5"}) EXPECT_FALSE(accepts(*n, t)) << t;
  EXPECT_EQ(schema_error(R"({"type":[["string"]]})"), "json_schema: /: type must be a string or a list of strings");
}

TEST(JsonSchema, MultiplesAreAcceptedExactlyWithOrWithoutBounds) {
  // Values scaled by 10^4, exactly; a case's candidates are its schema's numbers written plainly.
  struct Case {
    const char* schema;
    bool integer;
    int64_t m;                       // multipleOf x 10^4
    std::optional<int64_t> lo, hi;   // x 10^4
    bool lo_strict = false, hi_strict = false;
  };
  const std::vector<Case> cases = {
      {R"({"type":"integer","multipleOf":5})", true, 50000, {}, {}},
      {R"({"type":"integer","multipleOf":12})", true, 120000, {}, {}},
      {R"({"type":"integer","multipleOf":7,"minimum":0})", true, 70000, 0, {}},
      {R"({"type":"integer","multipleOf":3,"exclusiveMaximum":0})", true, 30000, {}, 0, false, true},
      {R"({"type":"number","multipleOf":0.25})", false, 2500, {}, {}},
      {R"({"type":"number","multipleOf":0.1,"exclusiveMinimum":0})", false, 1000, 0, {}, true},
      {R"({"type":"number","multipleOf":3})", false, 30000, {}, {}},
      {R"({"type":"number","multipleOf":0.5,"minimum":-2,"maximum":3})", false, 5000, -20000, 30000},
      {R"({"type":"number","multipleOf":0.05,"exclusiveMinimum":0.1,"exclusiveMaximum":0.3})", false, 500, 1000, 3000, true, true},
      {R"({"type":"integer","multipleOf":1.5,"minimum":0,"maximum":10})", true, 15000, 0, 100000},
      {R"({"multipleOf":4,"maximum":8,"minimum":-8})", false, 40000, -80000, 80000},
  };
  std::vector<std::string> candidates;
  for (int k = -2500; k <= 2500; k += 5)
    for (int digits : {0, 1, 2}) {
      if (digits == 0 && k % 100 != 0) continue;
      if (digits == 1 && (k % 10 != 0 || k % 100 == 0)) continue;
      if (digits == 2 && k % 10 == 0) continue;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%s%d", k < 0 ? "-" : "", std::abs(k) / 100);
      std::string t = buf;
      if (digits > 0) {
        std::snprintf(buf, sizeof buf, ".%02d", std::abs(k) % 100);
        std::string f = buf;
        if (digits == 1) f.pop_back();
        t += f;
      }
      candidates.push_back(t);
    }
  for (const std::string t : {"0.125", "-0", "05", "1e2", "0.", "+5", "3.0", "2.50", "-1.5000", "0.00", "1.0000000000000000", "1.00000000000000000"})
    candidates.push_back(t);
  const std::regex plain("-?(0|[1-9][0-9]*)(\\.[0-9]{1,16})?");
  for (const Case& c : cases) {
    const auto m = schema_matcher(c.schema);
    int taken = 0;
    for (const std::string& t : candidates) {
      bool want = std::regex_match(t, plain) && t != "-0" && !(c.integer && t.find('.') != std::string::npos);
      if (want) {
        const double x = std::strtod(t.c_str(), nullptr);
        const auto v = static_cast<int64_t>(std::llround(x * 10000));
        want = v % c.m == 0 && (!c.integer || v % 10000 == 0) && (!c.lo || (c.lo_strict ? v > *c.lo : v >= *c.lo)) &&
               (!c.hi || (c.hi_strict ? v < *c.hi : v <= *c.hi));
      }
      if (std::string(c.schema).find("\"type\"") == std::string::npos && !want) continue;  // other types are values there
      ASSERT_EQ(accepts(*m, t), want) << c.schema << " on \"" << t << "\"";
      taken += want;
      if (want)
        for (size_t k = 0; k < t.size(); ++k) ASSERT_TRUE(continues(*m, t.substr(0, k))) << c.schema << " " << t;
    }
    EXPECT_GT(taken, 0) << c.schema;
  }
  EXPECT_EQ(schema_error(R"({"type":"integer","multipleOf":0})"), "json_schema: /: multipleOf must be a number above 0");
  EXPECT_EQ(schema_error(R"({"type":"integer","multipleOf":-2})"), "json_schema: /: multipleOf must be a number above 0");
  EXPECT_EQ(schema_error(R"({"type":"integer","multipleOf":5,"minimum":3})"),
            "json_schema: /: multipleOf with a single bound other than 0 is not supported (give both bounds)");
  EXPECT_EQ(schema_error(R"({"type":"integer","multipleOf":1,"minimum":0,"maximum":5000})"),
            "json_schema: /: multipleOf 1 leaves more than 1000 values between the bounds (not supported)");
  EXPECT_EQ(schema_error(R"({"type":"integer","multipleOf":5,"minimum":1,"maximum":4})"),
            "json_schema: /: no integer multiple of 5 lies between the minimum and the maximum");
  EXPECT_EQ(schema_error(R"({"type":"integer","multipleOf":1001})"),
            "json_schema: /: multipleOf 1001 without both bounds is not supported (its remainders need too many rules)");
  EXPECT_EQ(schema_error(R"({"type":"number","multipleOf":"5"})"), "json_schema: /: multipleOf must be a number above 0");
}

TEST(JsonSchema, StringFormatsAcceptWhatTheirRfcsWrite) {
  const std::map<std::string, std::string> oracle = {
      {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"},
      {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
      {"date-time", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
      {"duration", "P(([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)(T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S))?|T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)|[0-9]+W)"},
      {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
      {"hostname", "[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*"},
      {"email", "[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)*@[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(\\.[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?)*"},
      {"uri", "[a-zA-Z][a-zA-Z0-9+.-]*:([a-zA-Z0-9._~:/?#@!$&'()*+,;=\\[\\]-]|%[0-9a-fA-F]{2})+"},
  };
  const std::map<std::string, std::vector<std::string>> texts = {
      {"date", {"2024-02-29", "1999-12-31", "2024-13-01", "2024-00-10", "2024-1-01", "2024-01-32", "2024-01-00", "24-01-01"}},
      {"time", {"23:59:60Z", "12:00:00+05:30", "12:00:00.123456789z", "12:00:00", "24:00:00Z", "12:60:00Z", "12:00:00.Z", "12:00:00+5:30"}},
      {"date-time", {"2024-05-01T12:30:00Z", "2024-05-01t12:30:00.5-01:00", "2024-05-01 12:30:00Z", "2024-05-01T12:30Z"}},
      {"duration", {"P3Y6M4DT12H30M5S", "P1W", "PT5M", "P4D", "PT1H5S", "P", "PT", "P1Y2W", "P1M1Y", "PT1S2M", "P1DT"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-42661417400", "123e4567e89b12d3a456426614174000"}},
      {"hostname", {"example.com", "a-b.c", "-ab.com", "ab-.com", "a..b", "x", std::string(63, 'a') + ".io", std::string(64, 'a') + ".io"}},
      {"email", {"ann.lee+tag@mail.example.org", "a@b", ".a@b.c", "a..b@c.d", "a@-b.c", "ann@", "@b.c", "a b@c.d"}},
      {"uri", {"https://example.com/a?b=c#d", "urn:isbn:0451450523", "mailto:a@b.c", "http://[::1]:80/", "a%2Fb:c", "1http://x", "http://a b", "x:%zz", "x:%2f"}},
  };
  for (const auto& [format, pattern] : oracle) {
    const auto m = schema_matcher(R"({"type":"string","format":")" + format + "\"}");
    const std::regex re(pattern, std::regex::ECMAScript);
    for (const auto& t : texts.at(format))
      EXPECT_EQ(accepts(*m, "\"" + t + "\""), std::regex_match(t, re)) << format << " on " << t;
    std::mt19937 rng(23);
    int made = 0;
    for (int walk = 0; walk < 200 && made < 30; ++walk) {
      State s = m->feed(m->start(), "\"");
      std::string text;
      for (int step = 0; step < 80; ++step) {
        if (m->accepting(m->feed(s, "\"")) && rng() % 4 == 0) break;
        std::vector<int> next;
        for (int b = 0; b < 256; ++b)
          if (b != '"' && m->feed(s, std::string(1, static_cast<char>(b))) != GrammarMatcher::kDead) next.push_back(b);
        if (next.empty()) break;
        const int b = next[rng() % next.size()];
        text += static_cast<char>(b);
        s = m->feed(s, std::string(1, static_cast<char>(b)));
      }
      if (!m->accepting(m->feed(s, "\""))) continue;
      ++made;
      EXPECT_TRUE(std::regex_match(text, re)) << format << " wrote " << text;
    }
    EXPECT_GE(made, 10) << format;
  }
  // ipv4 and ipv6 against the C library's parser.
  const auto v4 = schema_matcher(R"({"type":"string","format":"ipv4"})");
  const auto v6 = schema_matcher(R"({"type":"string","format":"ipv6"})");
  std::mt19937 rng(29);
  const std::vector<std::string> octets = {"0", "1", "9", "10", "99", "100", "199", "200", "249", "250", "255", "256", "300", "01", "001", "1000"};
  auto hex_group = [&rng] {
    std::string g;
    const int len = 1 + static_cast<int>(rng() % 5);  // 5 digits: too long
    for (int i = 0; i < len; ++i) g += "0a9fF"[rng() % 5];
    return g;
  };
  int v4_taken = 0, v6_taken = 0;
  for (int k = 0; k < 3000; ++k) {
    std::string a;
    const int parts = 3 + static_cast<int>(rng() % 3);
    for (int i = 0; i < parts; ++i) a += (i ? "." : "") + octets[rng() % octets.size()];
    unsigned char buf[16];
    const bool want4 = inet_pton(AF_INET, a.c_str(), buf) == 1;
    ASSERT_EQ(accepts(*v4, "\"" + a + "\""), want4) << a;
    v4_taken += want4;
    std::string b;
    const int groups = 1 + static_cast<int>(rng() % 9);
    const int gap = static_cast<int>(rng() % (groups + 2));  // where "::" goes (past the end: none)
    for (int i = 0; i < groups; ++i) {
      if (i == gap) b += "::";
      else if (i) b += ":";
      b += (i == groups - 1 && rng() % 4 == 0) ? "1.2.3." + octets[rng() % octets.size()] : hex_group();
    }
    if (gap == groups) b += "::";
    const bool want6 = inet_pton(AF_INET6, b.c_str(), buf) == 1;
    ASSERT_EQ(accepts(*v6, "\"" + b + "\""), want6) << b;
    v6_taken += want6;
  }
  EXPECT_GT(v4_taken, 100);
  EXPECT_GT(v6_taken, 100);
}

// PenaltyHistory with a grammar: a round's row i is masked after the output and draft[0..i-1],
// and the raw values come back.
TEST(Grammar, ARoundsRowsAreMaskedAfterTheOutputAndTheDraftBeforeThemAndRestored) {
  // 0 "a", 1 "b", 2 "c", 3 special (the stop token)
  auto trie = std::make_shared<const TokenTrie>(std::vector<std::string>{"a", "b", "c", ""});
  SamplingParams sp;
  sp.grammar = std::make_shared<const GrammarMatcher>(Grammar::parse("root ::= \"a\" \"b\"* \"c\"\n"), trie);
  ASSERT_TRUE(sp.penalized());
  const std::vector<int32_t> stop{3};
  PenaltyHistory h(sp, {}, 4, stop);
  const std::vector<int32_t> draft{0, 1, 2};
  std::vector<float> rows(4 * 4);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  const std::vector<float> raw = rows;
  PenaltyHistory::Undo undo;
  h.apply(rows, draft, undo);
  auto kept = [&](size_t row) {
    std::vector<int32_t> k;
    for (int32_t v = 0; v < 4; ++v)
      if (rows[row * 4 + static_cast<size_t>(v)] != kNegInf) k.push_back(v);
    return k;
  };
  EXPECT_EQ(kept(0), (std::vector<int32_t>{0}));
  EXPECT_EQ(kept(1), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(kept(2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(kept(3), (std::vector<int32_t>{3}));  // ended: the stop token alone
  PenaltyHistory::restore(rows, undo);
  EXPECT_EQ(rows, raw);
  for (int32_t t : draft) h.push(t);
  EXPECT_TRUE(h.constraint_keeps(3));
  EXPECT_FALSE(h.constraint_keeps(0));
  h.pop(2);
  EXPECT_FALSE(h.constraint_keeps(3));
  EXPECT_TRUE(h.constraint_keeps(1));
}

}  // namespace
}  // namespace specula
