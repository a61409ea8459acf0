// JSON Schema to GBNF (spec/json_schema.h).
#include "spec/json_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <stdexcept>
#include <vector>

#include <nlohmann/json.hpp>

#include "spec/utf8.h"

namespace specula {

using json = nlohmann::ordered_json;  // members in the order the schema lists them

std::string gbnf_literal(const std::string& bytes) {
  static const char* hex = "0123456789ABCDEF";
  std::string out = "\"";
  for (const char ch : bytes) {
    const auto c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += ch;  // UTF-8 passes as it is: the grammar's text is UTF-8
    }
  }
  return out + "\"";
}

std::string gbnf_of_choices(const std::vector<std::string>& choices) {
  if (choices.empty()) throw std::invalid_argument("guided_choice: needs at least one choice");
  std::string root = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) throw std::invalid_argument("guided_choice: a choice is empty");
    root += (i ? " | " : "") + gbnf_literal(choices[i]);
  }
  return root + "\n";
}


namespace {

// A regular expression read into GBNF, as json_schema.h says.
class RegexReader {
 public:
  RegexReader(std::string_view re, bool json_string) : re_(re), json_(json_string) {}

  std::string run() {
    if (peek() == '^') ++pos_;
    std::string out = alternation();
    if (pos_ < re_.size()) {
      if (re_[pos_] == ')') fail("an unmatched ')'");
      fail("unexpected '" + std::string(1, re_[pos_]) + "'");
    }
    return out;
  }

 private:
  using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::invalid_argument("regex: " + what + " at byte " + std::to_string(pos_));
  }
  char peek() const { return pos_ < re_.size() ? re_[pos_] : '\0'; }
  bool at_end() const { return pos_ >= re_.size(); }

  // One UTF-8 character of the pattern.
  uint32_t next_char() {
    const std::optional<uint32_t> cp = utf8::decode(re_, pos_);
    if (!cp) fail("the pattern is not UTF-8");
    return *cp;
  }

  uint32_t hex(int digits) {
    const std::optional<uint32_t> v = utf8::hex(re_, pos_, digits);
    if (!v) fail("expected " + std::to_string(digits) + " hex digits");
    return *v;
  }

  static Ranges complement(const Ranges& r) {
    Ranges out;
    uint32_t next = 0;
    for (const auto& [lo, hi] : r) {
      if (lo > next) out.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= 0x10FFFF) out.emplace_back(next, 0x10FFFF);
    return out;
  }
  static Ranges normalized(Ranges r) {
    std::sort(r.begin(), r.end());
    Ranges out;
    for (const auto& x : r) {
      if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
      else out.push_back(x);
    }
    return out;
  }

  // \d \w \s and their negations as ranges; false for another escape.
  static bool class_escape(char c, Ranges& out) {
    const Ranges d = {{'0', '9'}}, w = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                 sp = {{'\t', '\r'}, {' ', ' '}};  // \t \n \v \f \r and space
    switch (c) {
      case 'd': out = d; return true;
      case 'w': out = w; return true;
      case 's': out = sp; return true;
      case 'D': out = complement(d); return true;
      case 'W': out = complement(w); return true;
      case 'S': out = complement(sp); return true;
      default: return false;
    }
  }

  // An escape's one character (after the backslash).
  uint32_t escaped_char() {
    if (at_end()) fail("a pattern ending in '\\'");
    const char c = re_[pos_++];
    switch (c) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case 'f': return '\f';
      case 'v': return '\v';
      case '0': return 0;
      case 'x': return hex(2);
      case 'u': return hex(4);
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
          --pos_;
          fail(std::string("'\\") + c + "' is not supported");
        }
        return static_cast<uint8_t>(c);  // \. \* \\ \/ and the like: the character itself
    }
  }

  // A class's ranges in GBNF, JSON's escaped characters left out where json_.
  std::string ranges_gbnf(Ranges r) {
    r = normalized(std::move(r));
    if (json_) {  // take out '"', '\\' and U+0000..U+001F
      Ranges keep;
      for (auto [lo, hi] : r) {
        Ranges pieces{{lo, hi}};
        for (const auto& cut : Ranges{{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}) {
          Ranges next;
          for (const auto& [a, b] : pieces) {
            if (b < cut.first || a > cut.second) {
              next.emplace_back(a, b);
              continue;
            }
            if (a < cut.first) next.emplace_back(a, cut.first - 1);
            if (b > cut.second) next.emplace_back(cut.second + 1, b);
          }
          pieces = std::move(next);
        }
        keep.insert(keep.end(), pieces.begin(), pieces.end());
      }
      r = std::move(keep);
    }
    if (r.empty()) fail("a class or character that matches nothing here");
    std::string out = "[";
    auto code = [](uint32_t cp) {
      char buf[16];
      if (cp < 0x80) std::snprintf(buf, sizeof buf, "\\x%02X", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04X", cp);
      else std::snprintf(buf, sizeof buf, "\\U%08X", cp);
      return std::string(buf);
    };
    for (const auto& [lo, hi] : r) out += lo == hi ? code(lo) : code(lo) + "-" + code(hi);
    return out + "]";
  }

  std::string char_class() {
    ++pos_;  // '['
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    Ranges r;
    bool first = true;
    while (true) {
      if (at_end()) fail("an unterminated character class");
      if (re_[pos_] == ']' && !first) break;
      first = false;
      uint32_t lo;
      if (re_[pos_] == '\\') {
        ++pos_;
        Ranges cls;
        if (!at_end() && class_escape(re_[pos_], cls)) {
          ++pos_;
          r.insert(r.end(), cls.begin(), cls.end());
          continue;
        }
        lo = escaped_char();
      } else {
        lo = next_char();
      }
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < re_.size() && re_[pos_ + 1] != ']') {
        ++pos_;
        if (re_[pos_] == '\\') {
          ++pos_;
          hi = escaped_char();
        } else {
          hi = next_char();
        }
        if (hi < lo) fail("a range whose end comes before its start");
      }
      r.emplace_back(lo, hi);
    }
    ++pos_;
    r = normalized(std::move(r));
    return ranges_gbnf(negated ? complement(r) : r);
  }

  std::string atom() {
    const char c = peek();
    if (c == '(') {
      ++pos_;
      if (peek() == '?') {
        ++pos_;
        if (peek() == ':') {
          ++pos_;
        } else if (peek() == 'P' || peek() == '<') {
          if (peek() == 'P') ++pos_;
          if (peek() != '<' || (pos_ + 1 < re_.size() && (re_[pos_ + 1] == '=' || re_[pos_ + 1] == '!')))
            fail("lookaround is not supported");
          while (!at_end() && re_[pos_] != '>') ++pos_;
          if (at_end()) fail("an unterminated group name");
          ++pos_;
        } else {
          fail(peek() == '=' || peek() == '!' ? "lookahead is not supported" : "group flags are not supported");
        }
      }
      // The reader recurses per group: nesting is bounded, so a pattern cannot exhaust the stack.
      if (++nesting_ > kMaxNesting) fail("groups nested deeper than " + std::to_string(kMaxNesting) + " levels");
      const std::string inner = alternation();
      if (peek() != ')') fail("an unterminated group");
      ++pos_;
      --nesting_;
      return "(" + inner + ")";
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return ranges_gbnf(complement({{'\n', '\n'}}));
    }
    if (c == '\\') {
      ++pos_;
      Ranges cls;
      if (!at_end() && class_escape(re_[pos_], cls)) {
        ++pos_;
        return ranges_gbnf(cls);
      }
      if (!at_end() && (re_[pos_] == 'b' || re_[pos_] == 'B')) fail("word boundaries are not supported");
      return literal(escaped_char());
    }
    if (c == '^') fail("'^' inside the pattern is not supported");
    if (c == '$') {
      ++pos_;
      if (!at_end()) {
        --pos_;
        fail("'$' inside the pattern is not supported");
      }
      return "";
    }
    if (c == '*' || c == '+' || c == '?') fail(std::string("'") + c + "' with nothing to repeat");
    return literal(next_char());
  }

  std::string literal(uint32_t cp) {
    if (json_) return ranges_gbnf({{cp, cp}});  // refused where JSON would need an escape
    std::string bytes;
    utf8::append(bytes, cp);
    return gbnf_literal(bytes);
  }

  // A quantifier after an atom, or "" (a '{' that does not start one is a literal, as Python reads it).
  std::string quantifier() {
    std::string q;
    const char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      q = std::string(1, c);
    } else if (c == '{') {
      size_t p = pos_ + 1;
      auto digits = [&] {
        const size_t from = p;
        while (p < re_.size() && re_[p] >= '0' && re_[p] <= '9') ++p;
        return std::string(re_.substr(from, p - from));
      };
      const std::string lo = digits();
      std::string hi = lo;
      bool comma = false;
      if (p < re_.size() && re_[p] == ',') {
        comma = true;
        ++p;
        hi = digits();
      }
      if (lo.empty() || p >= re_.size() || re_[p] != '}') return "";
      pos_ = p + 1;
      q = "{" + lo + (comma ? "," + hi : "") + "}";
    } else {
      return "";
    }
    if (peek() == '?') ++pos_;  // lazy: the same texts
    else if (peek() == '+') fail("possessive quantifiers are not supported");
    return q;
  }

  std::string sequence() {
    std::string out;
    while (!at_end() && peek() != '|' && peek() != ')') {
      const std::string a = atom();
      if (a.empty()) continue;  // a final '$'
      const std::string q = quantifier();
      if (!q.empty()) {
        const size_t here = pos_;
        if (peek() == '*' || peek() == '+' || !quantifier().empty()) {
          pos_ = here;
          fail("a quantifier after a quantifier");
        }
        pos_ = here;
      }
      out += (out.empty() ? "" : " ") + a + q;
    }
    return out.empty() ? "\"\"" : out;
  }

  std::string alternation() {
    std::string out = sequence();
    bool several = false;
    while (peek() == '|') {
      ++pos_;
      out += " | " + sequence();
      several = true;
    }
    return several ? "(" + out + ")" : out;
  }

  static constexpr int kMaxNesting = 256;
  std::string_view re_;
  bool json_;
  size_t pos_ = 0;
  int nesting_ = 0;
};

}  // namespace

std::string gbnf_expression_of_regex(std::string_view pattern, bool json_string) {
  return RegexReader(pattern, json_string).run();
}

std::string gbnf_of_regex(std::string_view pattern) {
  if (pattern.empty()) throw std::invalid_argument("regex: the pattern is empty");
  return "root ::= " + gbnf_expression_of_regex(pattern) + "\n";
}

namespace {

constexpr int64_t kMaxCount = 10000;  // the grammar's repetition limit

// The primitives, written once each where used.
const std::map<std::string, std::string>& primitives() {
  static const std::map<std::string, std::string> p = {
      {"ws", R"([ \t\n\r]{0,20})"},
      {"char", R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))"},
      {"string", R"("\"" char* "\"")"},
      {"int-part", R"("-"? ([0-9] | [1-9] [0-9]{1,15}))"},
      {"integer", R"(int-part)"},
      {"number", R"(int-part ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?)"},
      {"boolean", R"("true" | "false")"},
      {"null", R"("null")"},
      {"value", R"(object | array | string | number | boolean | null)"},
      {"object", R"("{" ws (member (ws "," ws member)* ws)? "}")"},
      {"member", R"(string ws ":" ws value)"},
      {"array", R"("[" ws (value (ws "," ws value)* ws)? "]")"},
  };
  return p;
}

// What each primitive uses.
const std::map<std::string, std::vector<std::string>>& uses() {
  static const std::map<std::string, std::vector<std::string>> u = {
      {"string", {"char"}},           {"integer", {"int-part"}},
      {"number", {"int-part"}},       {"value", {"object", "array", "string", "number", "boolean", "null"}},
      {"object", {"ws", "member"}},   {"member", {"string", "ws", "value"}},
      {"array", {"ws", "value"}},
  };
  return u;
}

const std::set<std::string>& annotations() {
  static const std::set<std::string> a = {"title", "description", "default", "examples", "format", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "contentMediaType",
                                          "contentEncoding", "$defs", "definitions", "$anchor", "discriminator",
                                          "unevaluatedProperties", "strict"};
  return a;
}

const std::set<std::string>& kept() {
  static const std::set<std::string> k = {"type", "properties", "required", "additionalProperties", "items",
                                          "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "enum",
                                          "const", "anyOf", "oneOf", "allOf", "$ref", "nullable", "minimum", "maximum",
                                          "exclusiveMinimum", "exclusiveMaximum", "multipleOf"};
  return k;
}

// ---- Numeric bounds (minimum, maximum, exclusiveMinimum, exclusiveMaximum) ----
//
// A bound is read exactly, as the decimal the schema wrote (0.1 is 0.1, not the double nearest
// it), and the numbers between the bounds are written as a grammar of their digits: a number's
// magnitude compared with a bound's digit by digit, the integer parts first (a longer one is the
// larger), then the fraction's digits (a shorter fraction is read as padded with zeros).

constexpr int kMaxWholeDigits = 16;  // as int-part: at most 16 digits before the point
constexpr int kMaxFracDigits = 16;   // as number: at most 16 after it

// A decimal's magnitude: whole digits without leading zeros ("0" for none), fraction digits
// without trailing zeros.
struct Magnitude {
  std::string whole = "0", frac;
};

int compare(const Magnitude& a, const Magnitude& b) {
  if (a.whole.size() != b.whole.size()) return a.whole.size() < b.whole.size() ? -1 : 1;
  if (const int c = a.whole.compare(b.whole); c != 0) return c < 0 ? -1 : 1;
  const size_t n = std::max(a.frac.size(), b.frac.size());
  for (size_t i = 0; i < n; ++i) {
    const char x = i < a.frac.size() ? a.frac[i] : '0', y = i < b.frac.size() ? b.frac[i] : '0';
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

bool is_zero(const Magnitude& m) { return m.whole == "0" && m.frac.empty(); }

// One end of an interval: a signed decimal, and whether the end itself is left out.
struct End {
  bool negative = false;
  Magnitude m;
  bool strict = false;
};

// A JSON number (as nlohmann writes it: 12, -3, 0.25, 1e-05, 1.5e+20) as a signed decimal.
// Returns false where it is not a number.
bool read_decimal(const json& v, bool& negative, Magnitude& m) {
  if (!v.is_number()) return false;
  std::string text = v.dump();
  negative = !text.empty() && text[0] == '-';
  if (negative) text.erase(0, 1);
  int exponent = 0;
  if (const size_t e = text.find_first_of("eE"); e != std::string::npos) {
    exponent = std::stoi(text.substr(e + 1));
    text.resize(e);
  }
  std::string digits = text;
  int point = static_cast<int>(digits.size());
  if (const size_t p = digits.find('.'); p != std::string::npos) {
    digits.erase(p, 1);
    point = static_cast<int>(p);
  }
  point += exponent;  // the point sits before digits[point]
  if (point <= 0) {
    digits.insert(0, static_cast<size_t>(-point), '0');
    point = 0;
  }
  if (point > static_cast<int>(digits.size())) digits.append(static_cast<size_t>(point) - digits.size(), '0');
  m.whole = digits.substr(0, static_cast<size_t>(point));
  m.frac = digits.substr(static_cast<size_t>(point));
  m.whole.erase(0, std::min(m.whole.find_first_not_of('0'), m.whole.size()));
  if (m.whole.empty()) m.whole = "0";
  while (!m.frac.empty() && m.frac.back() == '0') m.frac.pop_back();
  if (is_zero(m)) negative = false;
  return true;
}

std::string join_alternatives(const std::vector<std::string>& alts) {
  if (alts.empty()) return "";
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

std::string digit_class(char lo, char hi) {
  if (lo == hi) return std::string("\"") + lo + "\"";
  return std::string("[") + lo + "-" + hi + "]";
}

std::string any_digits(int lo, int hi) {
  if (hi <= 0) return "\"\"";
  return "[0-9]{" + std::to_string(lo) + "," + std::to_string(hi) + "}";
}

// The strings of lo.size() digits between lo and hi (same length; compared digit by digit),
// from position p on, where `tl` / `th` say the digits so far equal lo's / hi's.
std::string digits_between(const std::string& lo, const std::string& hi, size_t p, bool tl, bool th) {
  const size_t left = lo.size() - p;
  if (left == 0) return "\"\"";
  if (!tl && !th) return "[0-9]{" + std::to_string(left) + "}";
  const char a = tl ? lo[p] : '0', b = th ? hi[p] : '9';
  std::vector<std::string> alts;
  if (tl && th && a == b) return join_alternatives({std::string("\"") + a + "\" " + digits_between(lo, hi, p + 1, true, true)});
  if (tl) alts.push_back(std::string("\"") + a + "\" " + digits_between(lo, hi, p + 1, true, false));
  const char from = tl ? static_cast<char>(a + 1) : a, to = th ? static_cast<char>(b - 1) : b;
  if (from <= to) alts.push_back(digit_class(from, to) + (left > 1 ? " [0-9]{" + std::to_string(left - 1) + "}" : ""));
  if (th) alts.push_back(std::string("\"") + b + "\" " + digits_between(lo, hi, p + 1, false, true));
  return join_alternatives(alts);
}

// Whole numbers from lo to hi (decimal strings without leading zeros; hi empty: no end but the
// 16 digits), written without leading zeros. Empty where there are none.
std::string whole_between(const std::string& lo, const std::string& hi) {
  if (lo.size() > static_cast<size_t>(kMaxWholeDigits)) return "";
  if (!hi.empty() && (hi.size() < lo.size() || (hi.size() == lo.size() && hi < lo))) return "";
  std::vector<std::string> alts;
  const size_t last = hi.empty() ? kMaxWholeDigits : hi.size();
  for (size_t len = lo.size(); len <= last; ++len) {
    const std::string from = len == lo.size() ? lo : std::string(1, '1').append(len - 1, '0');
    if (hi.empty() && len > lo.size()) {  // every longer length at once
      alts.push_back("[1-9] [0-9]{" + std::to_string(len - 1) + "," + std::to_string(kMaxWholeDigits - 1) + "}");
      break;
    }
    const std::string to = !hi.empty() && len == hi.size() ? hi : std::string(len, '9');
    alts.push_back(digits_between(from, to, 0, true, true));
  }
  return join_alternatives(alts);
}

// A decimal string of whole digits plus one (or minus one).
std::string plus_one(std::string s) {
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '9') {
      ++s[i];
      return s;
    }
    s[i] = '0';
  }
  return "1" + s;
}
std::string minus_one(std::string s) {  // s > 0
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '0') {
      --s[i];
      break;
    }
    s[i] = '9';
  }
  s.erase(0, std::min(s.find_first_not_of('0'), s.size() - 1));
  return s;
}

// The fraction written after a whole part that equals a bound's (`tl`: the lower's, `th`: the
// upper's): nothing, or "." and 1-16 digits, such that the value stays within the bounds.
// p digits are written so far.
std::string fraction(const End* lo, const End* hi, int p, bool tl, bool th) {
  auto rest_zero = [p](const End* e) { return static_cast<int>(e->m.frac.size()) <= p; };
  auto digit = [p](const End* e) { return p < static_cast<int>(e->m.frac.size()) ? e->m.frac[static_cast<size_t>(p)] : '0'; };
  std::vector<std::string> alts;
  if (!tl && !th) return p == 0 ? "(\".\" [0-9]{1," + std::to_string(kMaxFracDigits) + "})?" : any_digits(0, kMaxFracDigits - p);
  // Stopping here reads the rest as zeros.
  bool stop = true;
  if (tl) stop = stop && rest_zero(lo) && !lo->strict;
  if (th) stop = stop && !(rest_zero(hi) && hi->strict);
  if (stop) alts.push_back("\"\"");
  if (p < kMaxFracDigits) {
    const std::string dot = p == 0 ? "\".\" " : "";
    const char a = tl ? digit(lo) : '0', b = th ? digit(hi) : '9';
    if (tl && th && a == b) {
      const std::string next = fraction(lo, hi, p + 1, true, true);
      if (!next.empty()) alts.push_back(dot + "\"" + a + "\" " + next);
    } else if (a <= b) {
      if (tl) {
        const std::string next = fraction(lo, hi, p + 1, true, false);
        if (!next.empty()) alts.push_back(dot + "\"" + a + "\" " + next);
      }
      const char from = tl ? static_cast<char>(a + 1) : a, to = th ? static_cast<char>(b - 1) : b;
      if (from <= to) alts.push_back(dot + digit_class(from, to) + " " + any_digits(0, kMaxFracDigits - p - 1));
      if (th) {
        const std::string next = fraction(lo, hi, p + 1, false, true);
        if (!next.empty()) alts.push_back(dot + "\"" + b + "\" " + next);
      }
    }
  }
  return join_alternatives(alts);
}

// Magnitudes from lo to hi (hi null: no end but the digits' limits), as a number's digits
// without a sign or an exponent; with `whole_only`, integers only. Empty where there are none.
std::string magnitudes_between(const End& lo, const End* hi, bool whole_only) {
  if (hi) {
    const int c = compare(lo.m, hi->m);
    if (c > 0 || (c == 0 && (lo.strict || hi->strict))) return "";
  }
  if (whole_only) {  // the bounds are whole numbers here (the caller rounds them inward)
    std::string from = lo.m.whole, to = hi ? hi->m.whole : "";
    if (lo.strict) from = plus_one(from);
    if (hi && hi->strict) {
      if (to == "0") return "";
      to = minus_one(to);
    }
    return whole_between(from, to);
  }
  std::vector<std::string> alts;
  auto whole_then = [&](const std::string& whole, const std::string& frac) {
    if (!frac.empty() && whole.size() <= static_cast<size_t>(kMaxWholeDigits)) alts.push_back(gbnf_literal(whole) + " " + frac);
  };
  if (hi && lo.m.whole == hi->m.whole) {
    whole_then(lo.m.whole, fraction(&lo, hi, 0, true, true));
    return join_alternatives(alts);
  }
  whole_then(lo.m.whole, fraction(&lo, nullptr, 0, true, false));
  const std::string from = plus_one(lo.m.whole);
  if (!hi) {
    if (const std::string mid = whole_between(from, ""); !mid.empty()) alts.push_back(mid + " " + fraction(nullptr, nullptr, 0, false, false));
  } else {
    if (hi->m.whole != from) {
      const std::string to = minus_one(hi->m.whole);
      if (const std::string mid = whole_between(from, to); !mid.empty()) alts.push_back(mid + " " + fraction(nullptr, nullptr, 0, false, false));
    }
    whole_then(hi->m.whole, fraction(nullptr, hi, 0, false, true));
  }
  return join_alternatives(alts);
}

// The numbers (integers with `whole_only`) between the bounds: non-negative ones as they are,
// negative ones after "-" (never "-0"). Empty where there are none.
std::string signed_between(const End* lo, const End* hi, bool whole_only) {
  static const End zero{};
  std::vector<std::string> alts;
  // Non-negative values: from max(lo, 0) to hi.
  if (!hi || !hi->negative) {
    End from = zero;
    if (lo && !lo->negative) from = *lo;
    if (const std::string s = magnitudes_between(from, hi, whole_only); !s.empty()) alts.push_back(s);
  }
  // Negative values: magnitudes from max(-hi, 0) (0 itself left out) to -lo.
  if (!lo || lo->negative) {
    End from = zero;
    from.strict = true;
    if (hi && hi->negative) from = End{false, hi->m, hi->strict};
    const End to = lo ? End{false, lo->m, lo->strict} : End{};
    if (const std::string s = magnitudes_between(from, lo ? &to : nullptr, whole_only); !s.empty()) alts.push_back("\"-\" " + s);
  }
  return join_alternatives(alts);
}

// An end rounded inward to a whole number (for "integer"): 2.5 as a lower end is 3; a strict end
// stays strict only where it was whole.
End whole_end(End e, bool lower) {
  if (e.m.frac.empty()) return e;
  // The magnitude rounds up where the value moves away from zero: a positive lower end, a
  // negative upper one.
  const bool up = lower != e.negative;
  e.m.frac.clear();
  if (up) e.m.whole = plus_one(e.m.whole);
  e.strict = false;
  if (e.m.whole == "0") e.negative = false;
  return e;
}

// A strict end of a "number", for validators that read the output as a double (Python's json
// module, so pydantic and jsonschema): a decimal just inside the end may round to the end's own
// double, 3.4999999999999999 < 3.5 but not once parsed, and be refused there. The end becomes the
// nearest double inside it, written shortest (nlohmann writes doubles so), and no longer strict:
// every decimal up to it parses to a double inside the end, since rounding keeps order. What is
// lost are decimals between that double and the end that round to it, a few at the 17th digit.
End inside_as_double(const End& e, bool lower) {
  if (!e.strict) return e;
  const std::string text = (e.negative ? "-" : "") + e.m.whole + (e.m.frac.empty() ? "" : "." + e.m.frac);
  double d = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(d)) return e;
  const double in = std::nextafter(d, lower ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity());
  End out;
  if (!std::isfinite(in) || !read_decimal(json(in), out.negative, out.m)) return e;
  return out;
}

int compare_signed(const End& a, const End& b) {
  if (a.negative != b.negative) return a.negative ? -1 : 1;
  const int c = compare(a.m, b.m);
  return a.negative ? -c : c;
}

// ---- String formats ----
//
// The formats of JSON Schema's vocabulary that models are asked for most (pydantic writes them for
// datetime, date, time, timedelta, UUID, EmailStr, IPv4Address, IPv6Address, AnyUrl), as the RFCs
// their definitions cite write them: RFC 3339 for date, time, date-time and duration (its
// appendix A), RFC 4122 for uuid, RFC 3986 for ipv6 and uri, RFC 1123 for hostname; email is a
// dot-atom local part, "@" and a hostname (RFC 5321 without quoted local parts or address literals).
// What these grammars leave to the validator: a day past its month's end (2023-02-30), a leap
// second's date, a hostname's 253-byte total. A format not listed is an annotation, as JSON Schema
// 2020-12 has every format by default: read past.
const std::map<std::string, std::string>& formats() {
  static const std::map<std::string, std::string> f = [] {
    const std::string date = R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]))";
    const std::string time =
        R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" ([0-5] [0-9] | "60") ("." [0-9]{1,9})? ([Zz] | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))";
    const std::string n = "[0-9]{1,9}";
    const std::string second = n + " \"S\"", minute = n + " \"M\" (" + second + ")?", hour = n + " \"H\" (" + minute + ")?";
    const std::string dtime = "\"T\" (" + hour + " | " + minute + " | " + second + ")";
    const std::string day = n + " \"D\"", month = n + " \"M\" (" + day + ")?", year = n + " \"Y\" (" + month + ")?";
    const std::string duration = "\"P\" ((" + day + " | " + month + " | " + year + ") (" + dtime + ")? | " + dtime + " | " + n + " \"W\")";
    const std::string octet = R"(("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9]))";
    const std::string ipv4 = octet + " \".\" " + octet + " \".\" " + octet + " \".\" " + octet;
    const std::string h16 = "[0-9a-fA-F]{1,4}";
    const std::string ls32 = "(" + h16 + " \":\" " + h16 + " | " + ipv4 + ")";
    auto groups = [&](int k) { return k == 0 ? std::string() : "(" + h16 + " \":\"){" + std::to_string(k) + "} "; };
    auto before = [&](int k) {  // [ *k( h16 ":" ) h16 ]
      return "(" + (k > 0 ? "(" + h16 + " \":\"){0," + std::to_string(k) + "} " : std::string()) + h16 + ")?";
    };
    std::string ipv6 = "(" + groups(6) + ls32 + " | \"::\" " + groups(5) + ls32 + " | " + before(0) + " \"::\" " + groups(4) + ls32;
    ipv6 += " | " + before(1) + " \"::\" " + groups(3) + ls32 + " | " + before(2) + " \"::\" " + groups(2) + ls32;
    ipv6 += " | " + before(3) + " \"::\" " + h16 + " \":\" " + ls32 + " | " + before(4) + " \"::\" " + ls32;
    ipv6 += " | " + before(5) + " \"::\" " + h16 + " | " + before(6) + " \"::\")";
    const std::string label = R"([a-zA-Z0-9] ([a-zA-Z0-9-]{0,61} [a-zA-Z0-9])?)";
    const std::string hostname = label + " (\".\" " + label + ")*";
    const std::string atom = R"([a-zA-Z0-9!#$%&'*+/=?^_`{|}~-]+)";
    const std::string hex = "[0-9a-fA-F]";
    const std::string uri_char = R"(([a-zA-Z0-9._~:/?#@!$&'()*+,;=-] | "[" | "]" | "%" )" + hex + " " + hex + ")";
    return std::map<std::string, std::string>{
        {"date", date},
        {"time", time},
        {"date-time", date + " [Tt] " + time},
        {"duration", duration},
        {"uuid", hex + "{8} \"-\" " + hex + "{4} \"-\" " + hex + "{4} \"-\" " + hex + "{4} \"-\" " + hex + "{12}"},
        {"ipv4", ipv4},
        {"ipv6", ipv6},
        {"hostname", hostname},
        {"email", atom + " (\".\" " + atom + ")* \"@\" " + hostname},
        {"uri", "[a-zA-Z] [a-zA-Z0-9+.-]* \":\" " + uri_char + "+"},
    };
  }();
  return f;
}

class Converter {
 public:
  explicit Converter(const json& root) : root_(root) {}

  std::string run() {
    // The converter recurses per level of the schema (and writes const and enum values back out,
    // which recurses too): a schema nested deeper than any real one is refused before either.
    std::vector<std::pair<const json*, int>> work{{&root_, 1}};
    while (!work.empty()) {
      const auto [v, depth] = work.back();
      work.pop_back();
      if (depth > kMaxDepth) fail("", "the schema nests deeper than " + std::to_string(kMaxDepth) + " levels");
      if (v->is_structured())
        for (const auto& child : *v) work.emplace_back(&child, depth + 1);
    }
    const std::string top = visit(root_, "");
    std::string out = "root ::= ws " + top + " ws\n";
    use("ws");
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  [[noreturn]] static void fail(const std::string& path, const std::string& what) {
    throw std::invalid_argument("json_schema: " + (path.empty() ? std::string("/") : path) + ": " + what);
  }

  // Adds a primitive (and what it uses); returns its name.
  std::string use(const std::string& name) {
    if (rules_.count(name)) return name;
    rules_[name] = primitives().at(name);
    if (const auto it = uses().find(name); it != uses().end())
      for (const auto& n : it->second) use(n);
    return name;
  }

  std::string fresh(const std::string& hint) {
    std::string clean;
    for (const char c : hint)
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) clean += c;
      else if (!clean.empty() && clean.back() != '-') clean += '-';
    if (clean.size() > 24) clean.resize(24);
    std::string name = std::string(1, 's').append(std::to_string(next_++));
    if (!clean.empty()) name.append(1, '-').append(clean);
    return name;
  }

  std::string define(const std::string& hint, const std::string& body) {
    const std::string name = fresh(hint);
    rules_[name] = body;
    written(body);
    return name;
  }

  // Bounded output: the grammar's text, past kMaxBytes, is refused.
  void written(const std::string& body) {
    bytes_ += body.size();
    if (bytes_ > kMaxBytes) fail("", "the schema's grammar comes to more than " + std::to_string(kMaxBytes >> 20) + " MB");
  }

  static int64_t count(const json& s, const char* key, const std::string& path) {
    const auto it = s.find(key);
    if (it == s.end()) return -1;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) fail(path, std::string(key) + " must be a non-negative integer");
    const int64_t v = it->get<int64_t>();
    if (v > kMaxCount) fail(path, std::string(key) + " past " + std::to_string(kMaxCount) + " is not supported");
    return v;
  }

  static std::string repeat(const std::string& item, int64_t lo, int64_t hi) {  // hi < 0: unbounded
    if (hi < 0) return "(" + item + "){" + std::to_string(lo) + ",}";
    return "(" + item + "){" + std::to_string(lo) + "," + std::to_string(hi) + "}";
  }

  const json& resolve(const std::string& ref, const std::string& path) const {
    if (ref.empty() || ref[0] != '#') fail(path, "$ref must point into this schema (#/...), got \"" + ref + "\"");
    try {
      return root_.at(json::json_pointer(ref.substr(1)));
    } catch (const json::exception&) {
      fail(path, "$ref \"" + ref + "\" names nothing in the schema");
    }
  }

  // A subschema is converted once for each way it is read (as written, with a type of a type list,
  // or without nullable): a schema whose parts are read from several places (a type list over
  // arrays of arrays of ...) stays linear rather than doubling per level.
  std::string visit(const json& s, const std::string& path, const json* type_of_list = nullptr, bool skip_nullable = false) {
    const auto key = std::make_tuple(&s, type_of_list, skip_nullable);
    if (const auto it = visited_.find(key); it != visited_.end()) return it->second;
    std::string name = visit_once(s, path, type_of_list, skip_nullable);
    visited_.emplace(key, name);
    return name;
  }

  std::string visit_once(const json& s, const std::string& path, const json* type_of_list, bool skip_nullable) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) fail(path, "the schema false accepts nothing");
      return use("value");
    }
    if (!s.is_object()) fail(path, "a schema must be an object or a boolean");
    for (const auto& [key, _] : s.items())
      if (!kept().count(key) && !annotations().count(key)) fail(path, key + " is not supported");

    if (const auto ref = s.find("$ref"); ref != s.end()) {
      if (!ref->is_string()) fail(path, "$ref must be a string");
      const std::string r = ref->get<std::string>();
      if (const auto it = refs_.find(r); it != refs_.end()) return it->second;
      const std::string name = fresh(r.substr(r.find_last_of('/') + 1));
      refs_[r] = name;
      rules_[name] = "";  // reserved, so a recursive $ref finds it
      rules_[name] = visit(resolve(r, path), r.substr(1));
      written(rules_[name]);
      return name;
    }
    if (const auto n = s.find("nullable"); !skip_nullable && n != s.end() && n->is_boolean() && n->get<bool>())
      return define("nullable", visit(s, path, type_of_list, true) + " | " + use("null"));
    if (const auto c = s.find("const"); c != s.end()) return define("const", gbnf_literal(c->dump()));
    if (const auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) fail(path, "enum must be a non-empty array");
      std::string body;
      for (const auto& v : *e) body += (body.empty() ? "" : " | ") + gbnf_literal(v.dump());
      return define("enum", body);
    }
    for (const char* key : {"anyOf", "oneOf"})
      if (const auto a = s.find(key); a != s.end()) {
        if (!a->is_array() || a->empty()) fail(path, std::string(key) + " must be a non-empty array");
        std::string body;
        for (size_t i = 0; i < a->size(); ++i)
          body += (i ? " | " : "") + visit((*a)[i], path + "/" + key + "/" + std::to_string(i));
        return define(key, body);
      }
    if (const auto a = s.find("allOf"); a != s.end()) {
      if (!a->is_array() || a->size() != 1) fail(path, "allOf is supported with one schema only");
      return visit((*a)[0], path + "/allOf/0");
    }

    const auto found = s.find("type");
    const json* type = type_of_list ? type_of_list : found == s.end() ? nullptr : &*found;
    if (!type) {
      // No type: by the keywords that imply one, else any value.
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
        return object(s, path);
      if (s.contains("items") || s.contains("prefixItems")) return array(s, path);
      // Assertions on strings or numbers hold for the values of that type alone.
      const bool on_strings = s.contains("minLength") || s.contains("maxLength") || s.contains("pattern") || known_format(s);
      const bool on_numbers = s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
                              s.contains("exclusiveMaximum") || s.contains("multipleOf");
      if (!on_strings && !on_numbers) return use("value");
      const std::string str = on_strings ? string(s, path) : use("string");
      const std::string num = on_numbers ? number(s, path, false) : use("number");
      return define("value", use("object") + " | " + use("array") + " | " + str + " | " + num + " | " + use("boolean") + " | " + use("null"));
    }
    if (type->is_array()) {
      if (type->empty()) fail(path, "type must not be an empty list");
      std::string body;
      for (const auto& t : *type) {
        if (t.is_array()) fail(path, "type must be a string or a list of strings");
        body += (body.empty() ? "" : " | ") + visit(s, path, &t, skip_nullable);
      }
      return define("types", body);
    }
    if (!type->is_string()) fail(path, "type must be a string or a list of strings");
    const std::string t = type->get<std::string>();
    if (t == "object") return object(s, path);
    if (t == "array") return array(s, path);
    if (t == "string") return string(s, path);
    if (t == "number" || t == "integer") return number(s, path, t == "integer");
    if (t == "boolean" || t == "null") return use(t);
    fail(path, "unknown type \"" + t + "\"");
  }

  static bool known_format(const json& s) {
    const auto f = s.find("format");
    return f != s.end() && f->is_string() && formats().count(f->get<std::string>()) > 0;
  }

  // One end of the interval of numbers a schema allows: minimum or exclusiveMinimum (the tighter
  // where both are written), or their maximums; exclusiveMinimum as draft 4's boolean too.
  static std::optional<End> end_of(const json& s, const std::string& path, bool lower) {
    const char* plain = lower ? "minimum" : "maximum";
    const char* strict = lower ? "exclusiveMinimum" : "exclusiveMaximum";
    std::optional<End> out;
    auto take = [&](const json& v, const char* key, bool is_strict) {
      End e;
      if (!read_decimal(v, e.negative, e.m)) fail(path, std::string(key) + " must be a number");
      e.strict = is_strict;
      if (!out) {
        out = e;
        return;
      }
      const int c = compare_signed(e, *out);
      if ((lower && c > 0) || (!lower && c < 0) || (c == 0 && is_strict)) out = e;
    };
    const auto p = s.find(plain), x = s.find(strict);
    const bool draft4 = x != s.end() && x->is_boolean();
    if (p != s.end()) take(*p, plain, draft4 && x->get<bool>());
    else if (draft4 && x->get<bool>()) fail(path, std::string(strict) + " true needs " + plain);
    if (x != s.end() && !draft4) take(*x, strict, true);
    return out;
  }

  // A number or an integer, within its bounds where it has any (then written without an
  // exponent: an exponent's digits would put any number within any bound's reach).
  // multipleOf m (m = a / 10^n, a whole): x is a multiple where x * 10^n is a whole multiple of a.
  // Between two bounds, the multiples there are listed (at most kMaxListed), as a trie of their
  // digits. Otherwise a grammar of the digits' remainder mod a (a finite automaton: a rules of
  // whole digits, a * n of fraction digits, fractions of at most n digits), with at most a bound
  // of 0 (minimum 0: no sign; exclusiveMinimum 0: and not zero; maximum 0 and exclusiveMaximum 0
  // alike below). Other one-sided bounds with multipleOf are refused, as is a modulus past kMaxModulus.
  std::string multiple(const json& v, const std::string& path, bool whole_only, const std::optional<End>& lo,
                       const std::optional<End>& hi) {
    bool negative = false;
    Magnitude m;
    if (!read_decimal(v, negative, m) || negative || is_zero(m)) fail(path, "multipleOf must be a number above 0");
    std::string digits = (m.whole == "0" ? "" : m.whole) + m.frac;
    digits.erase(0, std::min(digits.find_first_not_of('0'), digits.size()));
    const size_t n = m.frac.size();
    if (digits.size() > 9 || n > kMaxFracDigits) fail(path, "multipleOf " + v.dump() + " is not supported (at most 9 significant digits and 16 after the point)");
    const auto a = static_cast<uint32_t>(std::stoul(digits));
    if (lo && hi) return listed_multiples(path, whole_only, a, n, *lo, *hi, v.dump());
    for (const auto& e : {lo, hi})
      if (e && !is_zero(e->m)) fail(path, "multipleOf with a single bound other than 0 is not supported (give both bounds)");
    if (a > kMaxModulus || (!whole_only && static_cast<uint64_t>(a) * (n + 1) > kMaxModulus * 2))
      fail(path, "multipleOf " + v.dump() + " without both bounds is not supported (its remainders need too many rules)");
    return define("multiple", modular_multiples(whole_only, a, n, lo, hi));
  }

  // The grammar of the digits' remainder (see multiple()); its rules are defined here, the sign and
  // start returned.
  std::string modular_multiples(bool whole_only, uint32_t a, size_t n, const std::optional<End>& lo, const std::optional<End>& hi) {
    const size_t F = whole_only ? 0 : n;  // fraction digits the grammar may write
    std::vector<uint32_t> pow10(n + 1, 1 % a);
    for (size_t j = 1; j <= n; ++j) pow10[j] = static_cast<uint32_t>(uint64_t{pow10[j - 1]} * 10 % a);
    // r after f fraction digits may end the number where r * 10^(n - f) = 0 (mod a).
    auto may_end = [&](uint32_t r, size_t f) { return uint64_t{r} * pow10[n - f] % a == 0; };
    // Where the number may end after f fraction digits: zeros may still follow (they change
    // nothing), up to 16 fraction digits in all, as the other numbers of the grammar.
    auto end_here = [&](size_t f) { return end_suffix(whole_only, f, f > 0); };
    // Fraction states (r, f) from which an end is reachable within F digits (whole-digit states
    // always reach one: any prefix extends to a multiple of a).
    std::vector<std::vector<bool>> alive(F + 2, std::vector<bool>(a, false));
    for (size_t f = F; f >= 1; --f)
      for (uint32_t r = 0; r < a; ++r) {
        bool ok = may_end(r, f);
        for (uint32_t d = 0; d < 10 && !ok && f < F; ++d) ok = alive[f + 1][(uint64_t{r} * 10 + d) % a];
        alive[f][r] = ok;
      }
    const std::string base = fresh("mult");
    std::map<std::string, std::string> made;  // rules to define, by name
    std::vector<std::pair<uint32_t, size_t>> todo;  // (r, f): f = 0 whole digits (the W rules), else fraction digits (H)
    auto name = [&](uint32_t r, size_t f) {
      const std::string nm = base + (f == 0 ? "-w" + std::to_string(r) : "-h" + std::to_string(r) + "-" + std::to_string(f));
      if (!made.count(nm)) {
        made[nm] = "";
        todo.emplace_back(r, f);
      }
      return nm;
    };
    // The digits d from `from` (each to the rule of (10 r + d) mod a at f), grouped by where they go.
    auto next_digits = [&](uint32_t r, char from, size_t f) {
      std::map<uint32_t, std::string> by_target;
      for (char d = from; d <= '9'; ++d) {
        const auto t = static_cast<uint32_t>((uint64_t{r} * 10 + static_cast<uint32_t>(d - '0')) % a);
        if (f == 0 || alive[f][t]) by_target[t] += d;
      }
      std::vector<std::string> alts;
      for (const auto& [t, ds] : by_target) alts.push_back((ds.size() == 1 ? "\"" + ds + "\"" : "[" + ds + "]") + " " + name(t, f));
      return alts;
    };
    // After the whole part, with remainder r: the end, or "." and at least one digit.
    auto after_whole = [&](uint32_t r) {
      std::vector<std::string> alts;
      if (may_end(r, 0)) alts.push_back(end_here(0));
      if (const std::string frac = F >= 1 ? join_alternatives(next_digits(r, '0', 1)) : ""; !frac.empty()) alts.push_back("\".\" " + frac);
      return alts;
    };
    const std::string nonzero_start = join_alternatives(next_digits(0, '1', 0));
    const std::string zero = "\"0\" " + join_alternatives(after_whole(0));  // (0 may always end)
    // A positive value from "0.": a fraction with a digit other than 0 (r stays 0 through zeros).
    std::string zero_point;
    if (F >= 1) {
      const std::string z = base + "-z";
      std::string body;
      // z_f: f - 1 zeros read after the point; live while a digit other than 0 can still end it.
      std::vector<bool> live(F + 2, false);
      for (size_t f = F; f >= 1; --f) {
        std::vector<std::string> alts = next_digits(0, '1', f);
        if (f < F && live[f + 1]) alts.push_back("\"0\" " + z + std::to_string(f + 1));
        live[f] = !alts.empty();
        if (live[f]) made[z + std::to_string(f)] = join_alternatives(alts);
      }
      if (live[1]) zero_point = "\"0\" \".\" " + z + "1";
    }
    const std::string positive = zero_point.empty() ? nonzero_start : "(" + nonzero_start + " | " + zero_point + ")";
    std::string top;
    if (lo) top = lo->strict ? positive : "(" + nonzero_start + " | " + zero + ")";
    else if (hi) top = hi->strict ? "\"-\" " + positive : "(\"-\" " + positive + " | \"0\" " + end_here(0) + ")";
    else top = "(\"-\" " + positive + " | " + nonzero_start + " | " + zero + ")";
    while (!todo.empty()) {
      const auto [r, f] = todo.back();
      todo.pop_back();
      const std::string nm = base + (f == 0 ? "-w" + std::to_string(r) : "-h" + std::to_string(r) + "-" + std::to_string(f));
      std::vector<std::string> alts;
      if (f == 0) {
        alts = next_digits(r, '0', 0);
        for (const std::string& x : after_whole(r)) alts.push_back(x);
      } else {
        if (may_end(r, f)) alts.push_back(end_here(f));
        if (f < F)
          for (const std::string& x : next_digits(r, '0', f + 1)) alts.push_back(x);
      }
      made[nm] = join_alternatives(alts);  // never empty: only live states are named
    }
    for (const auto& [nm, body] : made) {
      rules_[nm] = body;
      written(body);
    }
    return top;
  }

  // The multiples of a / 10^n between lo and hi, listed: a trie of their texts.
  std::string listed_multiples(const std::string& path, bool whole_only, uint32_t a, size_t n, const End& lo, const End& hi,
                               const std::string& shown) {
    using Wide = __int128;
    const size_t N = std::max({n, lo.m.frac.size(), hi.m.frac.size()});
    if (N > 18 || lo.m.whole.size() > 18 || hi.m.whole.size() > 18)
      fail(path, "multipleOf with bounds of more than 18 digits either side of the point is not supported");
    Wide scale = 1;
    for (size_t i = 0; i < N; ++i) scale *= 10;
    auto scaled = [&](const End& e) {
      Wide x = 0;
      for (const char c : e.m.whole) x = x * 10 + (c - '0');
      for (size_t i = 0; i < N; ++i) x = x * 10 + (i < e.m.frac.size() ? e.m.frac[i] - '0' : 0);
      return e.negative ? -x : x;
    };
    Wide step = a;
    for (size_t i = n; i < N; ++i) step *= 10;
    auto floor_div = [](Wide x, Wide y) { return x >= 0 ? x / y : -((-x + y - 1) / y); };
    const Wide lo_s = scaled(lo), hi_s = scaled(hi);
    Wide k_lo = -floor_div(-lo_s, step), k_hi = floor_div(hi_s, step);
    if (lo.strict && k_lo * step == lo_s) ++k_lo;
    if (hi.strict && k_hi * step == hi_s) --k_hi;
    if (k_hi - k_lo + 1 > static_cast<Wide>(kMaxListed))
      fail(path, "multipleOf " + shown + " leaves more than " + std::to_string(kMaxListed) + " values between the bounds (not supported)");
    std::vector<std::string> texts;
    for (Wide k = k_lo; k <= k_hi; ++k) {
      const Wide x = k * step;
      const Wide mag = x < 0 ? -x : x;
      if (whole_only && mag % scale != 0) continue;
      std::string whole, frac;
      for (Wide w = mag / scale; w > 0; w /= 10) whole.insert(whole.begin(), static_cast<char>('0' + static_cast<int>(w % 10)));
      if (whole.empty()) whole = "0";
      Wide f = mag % scale;
      for (size_t i = 0; i < N; ++i, f /= 10) frac.insert(frac.begin(), static_cast<char>('0' + static_cast<int>(f % 10)));
      while (!frac.empty() && frac.back() == '0') frac.pop_back();
      texts.push_back((x < 0 ? "-" : "") + whole + (frac.empty() ? "" : "." + frac));
    }
    if (texts.empty()) fail(path, std::string("no ") + (whole_only ? "integer" : "number") + " multiple of " + shown + " lies between the minimum and the maximum");
    std::sort(texts.begin(), texts.end());
    return define("multiple", trie_of(texts, 0, texts.size(), 0, whole_only));
  }

  // The end of a number with `f` fraction digits written (`point`: the point among them): zeros
  // may follow, up to kMaxFracDigits after the point, unless it is an integer.
  static std::string end_suffix(bool whole_only, size_t f, bool point) {
    if (whole_only || f >= static_cast<size_t>(kMaxFracDigits)) return "\"\"";
    if (!point) return "(\".\" \"0\"{1," + std::to_string(kMaxFracDigits) + "})?";
    return "\"0\"{0," + std::to_string(kMaxFracDigits - static_cast<int>(f)) + "}";
  }

  // Sorted texts [from, to) sharing their first `depth` bytes, as a grammar that reads each once
  // (and the zeros that may follow each).
  static std::string trie_of(const std::vector<std::string>& texts, size_t from, size_t to, size_t depth, bool whole_only) {
    std::vector<std::string> alts;
    size_t i = from;
    if (texts[i].size() == depth) {  // the shared prefix is itself one of the texts (it sorts first)
      const size_t point = texts[i].find('.');
      alts.push_back(end_suffix(whole_only, point == std::string::npos ? 0 : depth - point - 1, point != std::string::npos));
      ++i;
    }
    while (i < to) {
      size_t j = i;
      while (j < to && texts[j][depth] == texts[i][depth]) ++j;
      const std::string rest = trie_of(texts, i, j, depth + 1, whole_only);
      alts.push_back(gbnf_literal(std::string(1, texts[i][depth])) + (rest == "\"\"" ? "" : " " + rest));
      i = j;
    }
    return join_alternatives(alts);
  }

  std::string number(const json& s, const std::string& path, bool whole_only) {
    std::optional<End> lo = end_of(s, path, true), hi = end_of(s, path, false);
    if (const auto mo = s.find("multipleOf"); mo != s.end()) return multiple(*mo, path, whole_only, lo, hi);
    if (!lo && !hi) return use(whole_only ? "integer" : "number");
    if (!whole_only) {  // (integers are read exactly: Python compares an int with a float exactly)
      if (lo) lo = inside_as_double(*lo, true);
      if (hi) hi = inside_as_double(*hi, false);
    }
    // Past 16 digits a bound is beyond every number the grammar writes.
    static const std::string kFar = "1" + std::string(kMaxWholeDigits, '0');
    auto beyond = [](const Magnitude& m) { return compare(m, Magnitude{kFar, ""}) >= 0; };
    if (lo && beyond(lo->m) && lo->negative) lo.reset();
    if (hi && beyond(hi->m) && !hi->negative) hi.reset();
    if ((lo && beyond(lo->m)) || (hi && beyond(hi->m)))
      fail(path, "a bound past 16 digits leaves no number the output can write");
    if (whole_only) {
      if (lo) lo = whole_end(*lo, true);
      if (hi) hi = whole_end(*hi, false);
    }
    const std::string body = signed_between(lo ? &*lo : nullptr, hi ? &*hi : nullptr, whole_only);
    if (body.empty()) fail(path, std::string("no ") + (whole_only ? "integer" : "number") + " lies between the minimum and the maximum");
    return define(whole_only ? "integer" : "number", body);
  }

  std::string string(const json& s, const std::string& path) {
    const int64_t lo = count(s, "minLength", path), hi = count(s, "maxLength", path);
    if (known_format(s)) {
      const std::string f = s["format"].get<std::string>();
      if (s.contains("pattern") || lo >= 0 || hi >= 0) fail(path, "format \"" + f + "\" with pattern, minLength or maxLength is not supported");
      return define(f, "\"\\\"\" " + formats().at(f) + " \"\\\"\"");
    }
    if (const auto p = s.find("pattern"); p != s.end()) {
      if (!p->is_string()) fail(path, "pattern must be a string");
      if (lo >= 0 || hi >= 0) fail(path, "pattern with minLength or maxLength is not supported");
      try {
        return define("pattern", "\"\\\"\" " + gbnf_expression_of_regex(p->get<std::string>(), true) + " \"\\\"\"");
      } catch (const std::invalid_argument& e) {
        fail(path + "/pattern", e.what());
      }
    }
    if (lo < 0 && hi < 0) return use("string");
    if (hi >= 0 && lo > hi) fail(path, "minLength above maxLength");
    use("char");
    return define("string", "\"\\\"\" " + repeat("char", std::max<int64_t>(lo, 0), hi) + " \"\\\"\"");
  }

  std::string array(const json& s, const std::string& path) {
    const int64_t lo = std::max<int64_t>(count(s, "minItems", path), 0), hi = count(s, "maxItems", path);
    if (hi >= 0 && lo > hi) fail(path, "minItems above maxItems");
    use("ws");
    std::vector<std::string> fixed;  // prefixItems
    if (const auto p = s.find("prefixItems"); p != s.end()) {
      if (!p->is_array()) fail(path, "prefixItems must be an array");
      for (size_t i = 0; i < p->size(); ++i) fixed.push_back(visit((*p)[i], path + "/prefixItems/" + std::to_string(i)));
    }
    std::string item;
    if (const auto it = s.find("items"); it != s.end()) {
      if (it->is_boolean() && !it->get<bool>()) item.clear();
      else item = visit(*it, path + "/items");
    } else {
      item = fixed.empty() ? use("value") : "";  // past prefixItems, write no more
    }
    if (!fixed.empty()) {
      // The tuple, then items up to the counts.
      if (hi >= 0 && static_cast<int64_t>(fixed.size()) > hi) fail(path, "prefixItems longer than maxItems");
      std::string body = "\"[\" ws";
      for (size_t i = 0; i < fixed.size(); ++i) body += (i ? " ws \",\" ws " : " ") + fixed[i];
      const int64_t more_lo = std::max<int64_t>(lo - static_cast<int64_t>(fixed.size()), 0);
      const int64_t more_hi = hi < 0 ? -1 : hi - static_cast<int64_t>(fixed.size());
      if (!item.empty() && more_hi != 0) body += " " + repeat("ws \",\" ws " + item, more_lo, more_hi);
      else if (more_lo > 0) fail(path, "minItems above what prefixItems and items allow");
      return define("tuple", body + " ws \"]\"");
    }
    if (item.empty()) {
      if (lo > 0) fail(path, "minItems above what items allows");
      return define("array", "\"[\" ws \"]\"");
    }
    if (hi == 0) return define("array", "\"[\" ws \"]\"");
    const std::string rest = repeat("ws \",\" ws " + item, std::max<int64_t>(lo - 1, 0), hi < 0 ? -1 : hi - 1);
    const std::string body = item + " " + rest + " ws";
    return define("array", lo > 0 ? "\"[\" ws " + body + " \"]\"" : "\"[\" ws (" + body + ")? \"]\"");
  }

  std::string object(const json& s, const std::string& path) {
    use("ws");
    std::vector<std::pair<std::string, const json*>> props;
    static const json any = json::object();
    if (const auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) fail(path, "properties must be an object");
      for (const auto& [k, v] : p->items()) props.emplace_back(k, &v);
    }
    std::set<std::string> required;
    if (const auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) fail(path, "required must be an array of strings");
      for (const auto& name : *r) {
        if (!name.is_string()) fail(path, "required must be an array of strings");
        required.insert(name.get<std::string>());
      }
    }
    for (const auto& name : required) {  // required but not described: any value
      bool listed = false;
      for (const auto& [k, _] : props) listed = listed || k == name;
      if (!listed) props.emplace_back(name, &any);
    }
    const auto extra = s.find("additionalProperties");
    if (props.empty()) {
      if (extra != s.end() && extra->is_boolean() && !extra->get<bool>()) return define("object", "\"{\" ws \"}\"");
      const std::string value = extra == s.end() || extra->is_boolean() ? use("value") : visit(*extra, path + "/additionalProperties");
      const std::string member = use("string") + " ws \":\" ws " + value;
      return define("map", "\"{\" ws (" + member + " (ws \",\" ws " + member + ")* ws)? \"}\"");
    }
    const size_t n = props.size();
    std::vector<std::string> kv(n);
    for (size_t i = 0; i < n; ++i)
      kv[i] = gbnf_literal(json(props[i].first).dump()) + " ws \":\" ws " + visit(*props[i].second, path + "/properties/" + props[i].first);
    // first[i]: the members from i on when none is written yet; rest[i]: when one is.
    std::vector<std::string> first(n + 1), rest(n + 1);
    const std::string base = fresh("obj");
    first[n] = base + "-f" + std::to_string(n);
    rest[n] = base + "-r" + std::to_string(n);
    rules_[first[n]] = "\"\"";
    rules_[rest[n]] = "ws";
    for (size_t i = n; i-- > 0;) {
      first[i] = base + "-f" + std::to_string(i);
      rest[i] = base + "-r" + std::to_string(i);
      const bool req = required.count(props[i].first) > 0;
      rules_[first[i]] = kv[i] + " " + rest[i + 1] + (req ? "" : " | " + first[i + 1]);
      rules_[rest[i]] = "ws \",\" ws " + kv[i] + " " + rest[i + 1] + (req ? "" : " | " + rest[i + 1]);
    }
    return define("object", "\"{\" ws " + first[0] + " \"}\"");
  }

  static constexpr int kMaxDepth = 128;
  static constexpr uint32_t kMaxModulus = 1000;  // multipleOf's a without both bounds (a rules, and a * n for fractions up to twice that)
  static constexpr int64_t kMaxListed = 1000;    // multiples listed between two bounds
  static constexpr size_t kMaxBytes = size_t{8} << 20;
  const json& root_;
  std::map<std::tuple<const json*, const json*, bool>, std::string> visited_;
  size_t bytes_ = 0;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> refs_;
  int next_ = 0;
};

}  // namespace

std::string gbnf_of_json_schema(const nlohmann::ordered_json& schema) { return Converter(schema).run(); }

}  // namespace specula
