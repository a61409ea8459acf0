// JSON Schema to GBNF (spec/json_schema.h).
#include "spec/json_schema.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
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
      const std::string inner = alternation();
      if (peek() != ')') fail("an unterminated group");
      ++pos_;
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

  std::string_view re_;
  bool json_;
  size_t pos_ = 0;
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
                                          "const", "anyOf", "oneOf", "allOf", "$ref", "nullable"};
  return k;
}

class Converter {
 public:
  explicit Converter(const json& root) : root_(root) {}

  std::string run() {
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
    return "s" + std::to_string(next_++) + (clean.empty() ? "" : "-" + clean);
  }

  std::string define(const std::string& hint, const std::string& body) {
    const std::string name = fresh(hint);
    rules_[name] = body;
    return name;
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

  std::string visit(const json& s, const std::string& path) {
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
      return name;
    }
    if (const auto n = s.find("nullable"); n != s.end() && n->is_boolean() && n->get<bool>()) {
      json rest = s;
      rest.erase("nullable");
      return define("nullable", visit(rest, path) + " | " + use("null"));
    }
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

    const auto type = s.find("type");
    if (type == s.end()) {
      // No type: by the keywords that imply one, else any value.
      if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required"))
        return object(s, path);
      if (s.contains("items") || s.contains("prefixItems")) return array(s, path);
      return use("value");
    }
    if (type->is_array()) {
      if (type->empty()) fail(path, "type must not be an empty list");
      std::string body;
      for (const auto& t : *type) {
        json one = s;
        one["type"] = t;
        body += (body.empty() ? "" : " | ") + visit(one, path);
      }
      return define("types", body);
    }
    if (!type->is_string()) fail(path, "type must be a string or a list of strings");
    const std::string t = type->get<std::string>();
    if (t == "object") return object(s, path);
    if (t == "array") return array(s, path);
    if (t == "string") return string(s, path);
    if (t == "number" || t == "integer" || t == "boolean" || t == "null") return use(t);
    fail(path, "unknown type \"" + t + "\"");
  }

  std::string string(const json& s, const std::string& path) {
    const int64_t lo = count(s, "minLength", path), hi = count(s, "maxLength", path);
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

  const json& root_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> refs_;
  int next_ = 0;
};

}  // namespace

std::string gbnf_of_json_schema(const nlohmann::ordered_json& schema) { return Converter(schema).run(); }

}  // namespace specula
