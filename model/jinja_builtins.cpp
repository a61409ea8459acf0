// Jinja2's filters and tests that chat templates use, Python's str/dict methods that Hugging
// Face's sandbox lets them call (none that mutate), and the globals (range, namespace, dict,
// raise_exception, strftime_now).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <set>

#include "model/jinja_ast.h"
#include "model/utf8.h"

namespace specula::jinja {
namespace {

const std::set<std::string> kFilters = {
    "abs",     "attr",   "capitalize", "count",  "d",       "default",  "dictsort",   "e",      "escape", "first",
    "float",   "indent", "int",        "items",  "join",    "last",     "length",     "list",   "lower",  "map",
    "max",     "min",    "reject",     "rejectattr", "replace", "reverse", "round",   "safe",   "select", "selectattr",
    "sort",    "string", "sum",        "title",  "tojson",  "trim",     "unique",     "upper",  "wordcount",
    "format"};

const std::set<std::string> kTests = {
    "boolean", "callable", "defined", "divisibleby", "eq",     "equalto", "escaped", "even",     "false",
    "float",   "ge",       "gt",      "in",          "integer", "iterable", "le",     "lower",    "lt",
    "mapping", "ne",       "none",    "number",      "odd",    "sameas",  "sequence", "string", "true",
    "undefined", "upper",  "==",      "!=",          "<",      ">",       "<=",     ">="};

const char* const kSpace = " \t\n\r\v\f";

std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::string set = chars.is_string() ? chars.string() : std::string(kSpace);
  size_t b = 0, e = s.size();
  if (left) while (b < e && set.find(s[b]) != std::string::npos) ++b;
  if (right) while (e > b && set.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
// Python's str.title(): a letter after a non-letter is upper case, the others lower.
std::string title(std::string s) {
  bool prev_letter = false;
  for (char& c : s) {
    const bool letter = std::isalpha(static_cast<unsigned char>(c));
    c = static_cast<char>(letter && !prev_letter ? std::toupper(static_cast<unsigned char>(c))
                                                 : std::tolower(static_cast<unsigned char>(c)));
    prev_letter = letter;
  }
  return s;
}
// Jinja's `title` filter (not str.title): each run of characters between '-', whitespace, '(',
// '{', '[' and '<' capitalized, its first character upper and the rest lower case.
std::string title_filter(std::string s) {
  bool start = true;
  for (char& c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '-' || std::isspace(u) || c == '(' || c == '{' || c == '[' || c == '<') {
      start = true;
      continue;
    }
    c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
    start = false;
  }
  return s;
}
std::string capitalize(std::string s) {
  s = lower(std::move(s));
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return s;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (count == 0) return s;
  if (from.empty()) {  // Python inserts `to` before every character and at the end, `count` times at most
    std::string out;
    int64_t n = 0;
    size_t i = 0;
    for (; i <= s.size() && (count < 0 || n < count); ++i, ++n) {
      out += to;
      if (i < s.size()) out += s[i];
      check_size(out);
    }
    return i < s.size() ? out + s.substr(i) : out;
  }
  std::string out;
  size_t pos = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t at = s.find(from, pos);
    if (at == std::string::npos) break;
    out += s.substr(pos, at - pos) + to;
    check_size(out);
    pos = at + from.size();
  }
  return out + s.substr(pos);
}

Array split(const std::string& s, const Value& sep, int64_t maxsplit) {
  Array out;
  if (sep.is_none() || sep.is_undefined()) {  // runs of whitespace, none at the ends
    size_t i = 0;
    while (true) {
      while (i < s.size() && s[i] && std::strchr(kSpace, s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {  // the rest as it stands
        out.push_back(Value(s.substr(i)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !(s[j] && std::strchr(kSpace, s[j]))) ++j;
      out.push_back(Value(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  if (!sep.is_string() || sep.string().empty()) throw Error("split: the separator must be a non-empty string");
  const std::string& d = sep.string();
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t at = s.find(d, pos);
    if (at == std::string::npos) break;
    out.push_back(Value(s.substr(pos, at - pos)));
    pos = at + d.size();
  }
  out.push_back(Value(s.substr(pos)));
  return out;
}

bool affix(const std::string& s, const Value& what, bool prefix) {
  auto one = [&](const Value& v) {
    if (!v.is_string()) throw Error(std::string(prefix ? "startswith" : "endswith") + ": the argument must be a string");
    const std::string& a = v.string();
    return a.size() <= s.size() && (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
  };
  if (what.is_array()) return std::any_of(what.array().begin(), what.array().end(), one);
  return one(what);
}

std::shared_ptr<const Function> fn(std::string name, std::function<Value(Arguments&)> f) {
  auto out = std::make_shared<Function>();
  out->name = std::move(name);
  out->call = std::move(f);
  return out;
}

// A string's characters (code points), not bytes.
size_t code_points(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

int64_t length(const Value& v) {
  if (v.is_string()) return static_cast<int64_t>(code_points(v.string()));
  if (v.is_array()) return static_cast<int64_t>(v.array().size());
  if (v.is_object()) return static_cast<int64_t>(v.object_ref().entries.size());
  if (v.is_undefined()) return 0;
  throw Error("a '" + v.type_name() + "' has no length");
}

std::string need_string(const Value& v, const char* what) {
  if (v.is_string()) return v.string();
  throw Error(std::string(what) + " needs a string, got a '" + v.type_name() + "'");
}

// Jinja's sort key: strings compared without case unless case_sensitive.
bool less_than(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_string() && b.is_string() && !case_sensitive) return lower(a.string()) < lower(b.string());
  if (a.is_number() && b.is_number()) return a.number() < b.number();
  if (a.is_string() && b.is_string()) return a.string() < b.string();
  throw Error("cannot order a '" + a.type_name() + "' and a '" + b.type_name() + "'");
}

// `attribute` of a filter: "a.b" walks in; an int picks an item.
Value attribute_of(const Value& v, const Value& attribute) {
  if (attribute.is_int()) return get_item(v, attribute);
  Value out = v;
  for (const Value& part : split(need_string(attribute, "attribute"), Value("."), -1)) {
    const std::string& p = part.string();
    const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    int64_t index = 0;
    if (digits && out.is_array()) {
      try {
        index = static_cast<int64_t>(std::stoll(p));
      } catch (const std::exception&) {
        return Value();  // past any list's end
      }
    }
    out = digits && out.is_array() ? get_item(out, Value(index)) : get_item(out, Value(p));
  }
  return out;
}

Value slice(const Value& subject, const Arguments& args) {
  auto bound = [](const Value& v, int64_t dflt) {
    if (v.is_none() || v.is_undefined()) return dflt;
    if (!v.is_int()) throw Error("slice indices must be integers");
    return v.integer();
  };
  const int64_t step = bound(args.positional[2], 1);
  if (step == 0) throw Error("slice step cannot be zero");
  if (!subject.is_string() && !subject.is_array()) throw Error("a '" + subject.type_name() + "' cannot be sliced");
  const Array items = iterate(subject);  // a string's characters, not its bytes
  const int64_t n = static_cast<int64_t>(items.size());
  auto clamp = [&](int64_t i) {
    if (i < 0) i += n;
    return step > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = args.positional[0].is_none() ? (step > 0 ? 0 : n - 1) : clamp(bound(args.positional[0], 0));
  const int64_t stop = args.positional[1].is_none() ? (step > 0 ? n : -1) : clamp(bound(args.positional[1], 0));
  Array out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    out.push_back(items[static_cast<size_t>(i)]);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  if (subject.is_string()) {
    std::string s;
    for (const Value& c : out) s += c.string();
    return Value(std::move(s));
  }
  return Value(std::move(out));
}

// JSON text with every non-ASCII character as \uXXXX (a surrogate pair above U+FFFF): json.dumps's
// ensure_ascii, applied after the fact since such bytes occur only inside JSON strings.
std::string ascii_escaped(const std::string& s) {
  std::string out;
  auto hex = [&out](unsigned u) {
    char b[16];  // "\\uXXXX" and its NUL; room for any unsigned the compiler imagines
    std::snprintf(b, sizeof b, "\\u%04x", u);
    out += b;
  };
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += s[i++];
      continue;
    }
    const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    unsigned cp = n == 1 ? c : c & (0x7F >> n);
    for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    i += n;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      hex(0xD800 + (cp >> 10));
      hex(0xDC00 + (cp & 0x3FF));
    } else {
      hex(cp);
    }
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

bool has_filter(const std::string& name) { return kFilters.count(name) > 0; }

void check_size(const std::string& s) {
  if (s.size() > (64u << 20)) throw Error("a string longer than 64 MiB");
}
bool has_test(const std::string& name) { return kTests.count(name) > 0; }

Array iterate(const Value& v) {
  if (v.is_array()) return v.array();
  if (v.is_undefined()) return {};
  if (v.is_object()) {
    Array keys;
    for (const auto& [k, x] : v.object_ref().entries) keys.push_back(Value(k));
    return keys;
  }
  if (v.is_string()) {  // characters: a UTF-8 sequence stays whole
    Array out;
    const std::string& s = v.string();
    for (size_t i = 0; i < s.size();) {
      size_t n = 1;
      while (i + n < s.size() && (static_cast<unsigned char>(s[i + n]) & 0xC0) == 0x80) ++n;
      out.push_back(Value(s.substr(i, n)));
      i += n;
    }
    return out;
  }
  throw Error("a '" + v.type_name() + "' is not iterable");
}

Value get_item(const Value& subject, const Value& key) {
  if (subject.is_object()) {
    if (!key.is_string()) return Value();
    const Value* v = subject.object_ref().find(key.string());
    return v ? *v : method(subject, key.string());
  }
  if ((subject.is_array() || subject.is_string()) && key.is_int()) {
    const Array chars = subject.is_string() ? iterate(subject) : Array{};  // a string's characters, not bytes
    const Array& items = subject.is_array() ? subject.array() : chars;
    const int64_t n = static_cast<int64_t>(items.size());
    int64_t i = key.integer();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();  // Jinja gives undefined, not an IndexError
    return items[static_cast<size_t>(i)];
  }
  if (subject.is_undefined()) throw Error("reading an item of an undefined value");
  if (key.is_string()) return method(subject, key.string());
  return Value();
}

Value get_attr(const Value& subject, const std::string& name) {
  if (subject.is_undefined()) throw Error("reading '" + name + "' of an undefined value");
  const bool ns = subject.is_object() && subject.object_ref().is_namespace;  // a namespace's attributes are its own
  if (Value m = ns ? Value() : method(subject, name); !m.is_undefined()) return m;
  if (subject.is_object()) {
    const Value* v = subject.object_ref().find(name);
    return v ? *v : Value();
  }
  return Value();
}

Value method(const Value& subject, const std::string& name) {
  if (subject.is_string()) {
    const std::string s = subject.string();
    if (name == "strip" || name == "lstrip" || name == "rstrip")
      return Value(fn(name, [s, name](Arguments& a) {
        return Value(strip(s, a.get(0, "chars"), name != "rstrip", name != "lstrip"));
      }));
    if (name == "split")
      return Value(fn(name, [s](Arguments& a) {
        const Value m = a.get(1, "maxsplit", Value(-1));
        return Value(split(s, a.get(0, "sep", Value(nullptr)), m.is_int() ? m.integer() : -1));
      }));
    if (name == "startswith" || name == "endswith")
      return Value(fn(name, [s, name](Arguments& a) { return Value(affix(s, a.get(0, "prefix"), name == "startswith")); }));
    if (name == "upper") return Value(fn(name, [s](Arguments&) { return Value(upper(s)); }));
    if (name == "lower") return Value(fn(name, [s](Arguments&) { return Value(lower(s)); }));
    if (name == "title") return Value(fn(name, [s](Arguments&) { return Value(title(s)); }));
    if (name == "capitalize") return Value(fn(name, [s](Arguments&) { return Value(capitalize(s)); }));
    if (name == "replace")
      return Value(fn(name, [s](Arguments& a) {
        const Value c = a.get(2, "count", Value(-1));
        return Value(replace(s, need_string(a.get(0, "old"), "replace"), need_string(a.get(1, "new"), "replace"),
                             c.is_int() ? c.integer() : -1));
      }));
    if (name == "find")
      return Value(fn(name, [s](Arguments& a) {
        const size_t at = s.find(need_string(a.get(0, "sub"), "find"));
        return Value(at == std::string::npos ? int64_t{-1} : static_cast<int64_t>(at));
      }));
    if (name == "count")
      return Value(fn(name, [s](Arguments& a) {
        const std::string sub = need_string(a.get(0, "sub"), "count");
        int64_t n = 0;
        if (sub.empty()) return Value(static_cast<int64_t>(s.size()) + 1);
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value(n);
      }));
    if (name == "join")
      return Value(fn(name, [s](Arguments& a) {
        std::string out;
        bool first = true;
        for (const Value& v : iterate(a.get(0, "iterable"))) {
          out += (first ? "" : s) + need_string(v, "join");
          check_size(out);
          first = false;
        }
        return Value(std::move(out));
      }));
    if (name == "splitlines")
      return Value(fn(name, [s](Arguments&) {
        Array out;
        size_t pos = 0;
        while (pos < s.size()) {
          size_t nl = s.find_first_of("\r\n", pos);
          if (nl == std::string::npos) nl = s.size();
          out.push_back(Value(s.substr(pos, nl - pos)));
          pos = nl + (s.compare(nl, 2, "\r\n") == 0 ? 2 : 1);
        }
        return Value(std::move(out));
      }));
    if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum" || name == "isupper" ||
        name == "islower")
      return Value(fn(name, [s, name](Arguments&) {
        if (s.empty()) return Value(false);
        auto all = [&](int (*f)(int)) {
          return std::all_of(s.begin(), s.end(), [f](char c) { return f(static_cast<unsigned char>(c)) != 0; });
        };
        if (name == "isdigit") return Value(all(::isdigit));
        if (name == "isspace") return Value(all(::isspace));
        if (name == "isalpha") return Value(all(::isalpha));
        if (name == "isalnum") return Value(all(::isalnum));
        const bool any_cased = std::any_of(s.begin(), s.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
        return Value(any_cased && s == (name == "isupper" ? upper(s) : lower(s)));
      }));
    return Value();
  }
  if (subject.is_object()) {
    const Value self = subject;
    if (name == "items")
      return Value(fn(name, [self](Arguments&) {
        Array out;
        for (const auto& [k, v] : self.object_ref().entries) out.push_back(Value(Array{Value(k), v}));
        return Value(std::move(out));
      }));
    if (name == "keys") return Value(fn(name, [self](Arguments&) { return Value(iterate(self)); }));
    if (name == "values")
      return Value(fn(name, [self](Arguments&) {
        Array out;
        for (const auto& [k, v] : self.object_ref().entries) out.push_back(v);
        return Value(std::move(out));
      }));
    if (name == "get")
      return Value(fn(name, [self](Arguments& a) {
        const Value key = a.get(0, "key");
        const Value* v = key.is_string() ? self.object_ref().find(key.string()) : nullptr;
        return v ? *v : a.get(1, "default", Value(nullptr));
      }));
    return Value();
  }
  return Value();
}

Value global(const std::string& name) {
  if (name == "range")
    return Value(fn(name, [](Arguments& a) {
      for (const Value& v : a.positional)
        if (!v.is_int()) throw Error("range() needs integers");
      int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) stop = a.positional[0].integer();
      else if (a.positional.size() >= 2) {
        start = a.positional[0].integer();
        stop = a.positional[1].integer();
        if (a.positional.size() >= 3) step = a.positional[2].integer();
      }
      if (step == 0) throw Error("range() step must not be zero");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
        if (out.size() >= 1'000'000) throw Error("range() is longer than 1,000,000 items");
        out.push_back(Value(i));
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      return Value(std::move(out));
    }));
  if (name == "namespace" || name == "dict")
    return Value(fn(name, [name](Arguments& a) {
      Value o = Value::object();
      o.object_ref().is_namespace = name == "namespace";
      for (const Value& p : a.positional)  // namespace(other) / dict(other) copy a dict's entries
        if (p.is_object())
          for (const auto& [k, v] : p.object_ref().entries) o.object_ref().set(k, v);
      for (const auto& [k, v] : a.keyword) o.object_ref().set(k, v);
      return o;
    }));
  if (name == "raise_exception")
    return Value(fn(name, [](Arguments& a) -> Value { throw Raised(a.get(0, "message").str()); }));
  if (name == "strftime_now")
    return Value(fn(name, [](Arguments& a) {
      const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, need_string(a.get(0, "format"), "strftime_now").c_str(), &tm);
      return Value(std::string(buf, n));
    }));
  return Value();
}

bool apply_test(const std::string& name, const Value& v, Arguments& args) {
  const Value arg = args.get(0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.boolean();
  if (name == "false") return v.is_bool() && !v.boolean();
  if (name == "integer") return v.is_int() && !v.is_bool();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_array() || v.is_object() || v.is_string();
  if (name == "sequence") return v.is_array() || v.is_object() || v.is_string();
  if (name == "callable") return v.is_function();
  if (name == "escaped") return false;
  if (name == "lower") return v.is_string() && v.string() == lower(v.string());
  if (name == "upper") return v.is_string() && v.string() == upper(v.string());
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!v.is_int()) throw Error("the '" + name + "' test needs an integer");
    if (name == "divisibleby") {
      if (!arg.is_int() || arg.integer() == 0) throw Error("divisibleby needs a non-zero integer");
      return arg.integer() == -1 || v.integer() % arg.integer() == 0;  // INT64_MIN % -1 traps
    }
    return (v.integer() % 2 == 0) == (name == "even");
  }
  if (name == "eq" || name == "equalto" || name == "==") return v == arg;
  if (name == "ne" || name == "!=") return !(v == arg);
  if (name == "sameas") return v == arg && v.type_name() == arg.type_name();
  if (name == "in") {
    if (arg.is_string()) return v.is_string() && arg.string().find(v.string()) != std::string::npos;
    for (const Value& x : iterate(arg))
      if (x == v) return true;
    return false;
  }
  if (name == "lt" || name == "<") return less_than(v, arg, true);
  if (name == "gt" || name == ">") return less_than(arg, v, true);
  if (name == "le" || name == "<=") return !less_than(arg, v, true);
  if (name == "ge" || name == ">=") return !less_than(v, arg, true);
  throw Error("unknown test '" + name + "'");
}

namespace {

// The first n code points of s.
std::string_view first_code_points(std::string_view s, size_t n) {
  size_t i = 0;
  for (size_t seen = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80 && seen++ == n) break;
  return s.substr(0, i);
}

// Python's ascii(): repr() with every code point past ASCII escaped (\xNN, \uNNNN, \UNNNNNNNN).
std::string ascii_of(const std::string& repr) {
  std::string out;
  for (size_t i = 0; i < repr.size();) {
    const size_t len = utf8::sequence_length(repr, i);
    if (len <= 1) {
      out += repr[i++];
      continue;
    }
    const uint32_t cp = utf8::decode_at(repr, i, len);
    char buf[16];
    std::snprintf(buf, sizeof buf, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", cp);
    out += buf;
    i += len;
  }
  return out;
}

constexpr int64_t kMaxWidth = 100000;  // the widest field and the longest precision formatted

// One conversion's flags, width and precision.
struct Spec {
  bool left = false, plus = false, space = false, alt = false, zero = false;
  int64_t width = -1, precision = -1;
};

// An int for %d / %x / %o / %c: Python takes ints and bools, and floats for %d (truncated).
int64_t integer_of(const Value& v, char conv) {
  if (v.is_int()) return v.integer();
  if (v.is_float() && (conv == 'd' || conv == 'i' || conv == 'u')) {
    const double d = v.number();
    if (!std::isfinite(d)) throw Error("cannot convert float " + v.str() + " to integer");
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) throw Error("an integer past 64 bits in '%' formatting");
    return static_cast<int64_t>(d);
  }
  throw Error(std::string("%") + conv + " format: " + (conv == 'd' || conv == 'i' || conv == 'u' ? "a real number" : "an integer") +
              " is required, not " + v.type_name());
}

// The digits of a number with its sign, padded to the width as Python's % pads it.
std::string pad_number(std::string sign, std::string prefix, std::string digits, const Spec& sp) {
  const int64_t len = static_cast<int64_t>(sign.size() + prefix.size() + digits.size());
  if (sp.width <= len) return sign + prefix + digits;
  const std::string fill(static_cast<size_t>(sp.width - len), sp.zero && !sp.left ? '0' : ' ');
  if (sp.left) return sign + prefix + digits + std::string(fill.size(), ' ');
  if (sp.zero) return sign + prefix + fill + digits;
  return fill + sign + prefix + digits;
}

std::string pad_text(std::string_view s, const Spec& sp) {
  const int64_t len = static_cast<int64_t>(code_points(s));
  if (sp.width <= len) return std::string(s);
  const std::string fill(static_cast<size_t>(sp.width - len), ' ');
  return sp.left ? std::string(s) + fill : fill + std::string(s);
}

std::string convert(char conv, const Value& v, const Spec& sp) {
  switch (conv) {
    case 's':
    case 'r':
    case 'a': {
      std::string s = conv == 's' ? v.str() : conv == 'r' ? v.repr() : ascii_of(v.repr());
      if (sp.precision >= 0) s = std::string(first_code_points(s, static_cast<size_t>(sp.precision)));
      return pad_text(s, sp);
    }
    case 'c': {
      std::string s;
      if (v.is_string()) {
        if (code_points(v.string()) != 1) throw Error("%c requires an int or a unicode character, not a string of length " +
                                                       std::to_string(code_points(v.string())));
        s = v.string();
      } else {
        const int64_t cp = integer_of(v, 'c');
        if (cp < 0 || cp > 0x10FFFF) throw Error("%c arg not in range(0x110000)");
        utf8::append(s, static_cast<uint32_t>(cp));
      }
      return pad_text(s, sp);
    }
    case 'd':
    case 'i':
    case 'u':
    case 'x':
    case 'X':
    case 'o': {
      const int64_t n = integer_of(v, conv);
      const uint64_t mag = n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
      char buf[32];
      const char* f = conv == 'x' ? "%llx" : conv == 'X' ? "%llX" : conv == 'o' ? "%llo" : "%llu";
      std::snprintf(buf, sizeof buf, f, static_cast<unsigned long long>(mag));
      std::string digits = buf;
      if (sp.precision > static_cast<int64_t>(digits.size()))
        digits.insert(0, static_cast<size_t>(sp.precision) - digits.size(), '0');
      const std::string sign = n < 0 ? "-" : sp.plus ? "+" : sp.space ? " " : "";
      const std::string prefix = !sp.alt ? "" : conv == 'x' ? "0x" : conv == 'X' ? "0X" : conv == 'o' ? "0o" : "";
      return pad_number(sign, prefix, digits, sp);
    }
    case 'e':
    case 'E':
    case 'f':
    case 'F':
    case 'g':
    case 'G': {
      if (!v.is_number()) throw Error(std::string("must be real number, not ") + v.type_name());
      const double d = v.number();
      if (!std::isfinite(d)) {
        const bool upper = conv == 'E' || conv == 'F' || conv == 'G';
        std::string word = std::isnan(d) ? "nan" : "inf";
        if (upper) std::transform(word.begin(), word.end(), word.begin(), ::toupper);
        return pad_number(std::signbit(d) && !std::isnan(d) ? "-" : sp.plus ? "+" : sp.space ? " " : "", "", word, sp);
      }
      const int precision = static_cast<int>(sp.precision < 0 ? 6 : sp.precision);  // (at most kMaxWidth)
      const std::string f = std::string("%") + (sp.alt ? "#" : "") + ".*" + conv;
      const int n = std::snprintf(nullptr, 0, f.c_str(), precision, std::fabs(d));
      std::string digits(static_cast<size_t>(n) + 1, '\0');
      std::snprintf(digits.data(), digits.size(), f.c_str(), precision, std::fabs(d));
      digits.resize(static_cast<size_t>(n));
      return pad_number(std::signbit(d) ? "-" : sp.plus ? "+" : sp.space ? " " : "", "", digits, sp);
    }
    default:
      throw Error(std::string("unsupported format character '") + conv + "'");
  }
}

}  // namespace

std::string percent_format(const std::string& fmt, const Value& args) {
  // (Python's: a dict is the mapping of %(name)s and, for a conversion without a name, one
  // argument; Undefined counts as a mapping, as Jinja's does, so that nothing left over fails)
  const bool mapping = (args.is_object() && !args.object_ref().is_namespace) || args.is_undefined();
  const Array positional = args.is_array() ? args.array() : Array{args};
  size_t next = 0;
  bool named = false;  // a %(name) came: a conversion without one then has nothing to take (Python's)
  auto take = [&]() -> const Value& {
    if (named || next >= positional.size()) throw Error("not enough arguments for format string");
    return positional[next++];
  };
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) throw Error("incomplete format");
    const Value* keyed = nullptr;
    if (fmt[i] == '(') {  // %(name)s: the mapping's member
      if (!mapping) throw Error("format requires a mapping");
      int depth = 1;
      const size_t start = ++i;
      for (; i < fmt.size() && depth > 0; ++i) depth += fmt[i] == '(' ? 1 : fmt[i] == ')' ? -1 : 0;
      if (depth > 0) throw Error("incomplete format key");
      const std::string key = fmt.substr(start, i - 1 - start);
      keyed = args.object_ref().find(key);
      if (!keyed) throw Error("KeyError: " + Value(key).repr());
      named = true;
    }
    Spec sp;
    for (; i < fmt.size(); ++i) {
      const char c = fmt[i];
      if (c == '-') sp.left = true;
      else if (c == '+') sp.plus = true;
      else if (c == ' ') sp.space = true;
      else if (c == '#') sp.alt = true;
      else if (c == '0') sp.zero = true;
      else break;
    }
    auto number = [&](int64_t& into, bool width) {
      if (i < fmt.size() && fmt[i] == '*') {
        const Value& w = take();
        if (!w.is_int()) throw Error("* wants int");
        into = w.integer();
        if (into < 0 && width) {  // a negative width: left-aligned
          sp.left = true;
          into = into == INT64_MIN ? INT64_MAX : -into;
        }
        into = std::max<int64_t>(into, 0);
        if (into > kMaxWidth) throw Error("a width or precision past 100000 in '%' formatting");
        ++i;
        return;
      }
      if (i >= fmt.size() || !std::isdigit(static_cast<unsigned char>(fmt[i]))) return;
      into = 0;
      for (; i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i])); ++i) {
        into = into * 10 + (fmt[i] - '0');
        if (into > kMaxWidth) throw Error("a width or precision past 100000 in '%' formatting");
      }
    };
    number(sp.width, true);
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      sp.precision = 0;
      number(sp.precision, false);
    }
    if (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;  // (one, ignored, as Python's)
    if (i >= fmt.size()) throw Error("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {  // only as "%%": with a key, flags or a width it is not a conversion
      if (fmt[i - 1] != '%') throw Error("unsupported format character '%'");
      out += '%';
      continue;
    }
    out += convert(conv, keyed ? *keyed : take(), sp);
    check_size(out);
  }
  if (!mapping && next < positional.size()) throw Error("not all arguments converted during string formatting");
  return out;
}

Value apply_filter(const std::string& name, const Value& v, Arguments& args,
                   const std::function<Value(const std::string&, const Value&, Arguments&)>& filter,
                   const std::function<bool(const std::string&, const Value&, Arguments&)>& test) {
  if (name == "__slice__") return slice(v, args);
  if (name == "safe") return v;
  if (name == "string") return Value(v.str());
  if (name == "format") {  // Jinja's: value % (args or kwargs), not both
    if (!args.positional.empty() && !args.keyword.empty()) throw Error("the format filter takes positional or keyword arguments, not both");
    if (!args.keyword.empty()) {
      Value mapping = Value::object();
      for (auto& [k, x] : args.keyword) mapping.object_ref().set(k, x);
      return Value(percent_format(v.str(), mapping));
    }
    return Value(percent_format(v.str(), Value(Array(args.positional))));
  }
  if (name == "trim") return Value(strip(v.str(), args.get(0, "chars"), true, true));
  if (name == "upper") return Value(upper(v.str()));
  if (name == "lower") return Value(lower(v.str()));
  if (name == "title") return Value(title_filter(v.str()));
  if (name == "capitalize") return Value(capitalize(v.str()));
  if (name == "e" || name == "escape") return Value(html_escape(v.str()));
  if (name == "length" || name == "count") return Value(length(v));
  if (name == "wordcount") {  // Jinja's: runs of word characters (\w+)
    int64_t words = 0;
    bool in_word = false;
    for (unsigned char c : v.str()) {
      const bool w = std::isalnum(c) || c == '_' || c >= 0x80;
      words += w && !in_word;
      in_word = w;
    }
    return Value(words);
  }
  if (name == "default" || name == "d") {
    const bool boolean = args.get(1, "boolean", Value(false)).boolean();
    return v.is_undefined() || (boolean && !v.boolean()) ? args.get(0, "default_value", Value("")) : v;
  }
  if (name == "replace") {
    const Value c = args.get(2, "count", Value(nullptr));
    return Value(replace(v.str(), args.get(0, "old").str(), args.get(1, "new").str(), c.is_int() ? c.integer() : -1));
  }
  if (name == "tojson") {  // Hugging Face's: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    const Value indent = args.get(1, "indent", Value(nullptr));
    const Value seps = args.get(2, "separators", Value(nullptr));
    std::string item_sep = indent.is_int() ? "," : ", ", key_sep = ": ";
    if (seps.is_array() && seps.array().size() == 2) {
      item_sep = need_string(seps.array()[0], "separators");
      key_sep = need_string(seps.array()[1], "separators");
    }
    if (indent.is_int() && indent.integer() > 4096) throw Error("tojson: indent above 4096");
    std::string out = to_json(v, indent.is_int() ? static_cast<int>(std::max<int64_t>(0, indent.integer())) : -1, item_sep, key_sep,
                              args.get(3, "sort_keys", Value(false)).boolean());
    return Value(args.get(0, "ensure_ascii", Value(false)).boolean() ? ascii_escaped(out) : out);
  }
  if (name == "indent") {  // Jinja's: every line but the first, blank ones only with blank=true
    const Value width = args.get(0, "width", Value(4));
    if (!width.is_string() && (!width.is_int() || width.integer() > 4096)) throw Error("indent: width must be a string or an int up to 4096");
    const std::string pad = width.is_string() ? width.string() : std::string(static_cast<size_t>(std::max<int64_t>(0, width.integer())), ' ');
    const bool first = args.get(1, "first", Value(false)).boolean();
    const bool blank = args.get(2, "blank", Value(false)).boolean();
    const Array lines = method(Value(v.str() + "\n"), "splitlines").function().call(args).array();
    std::string out = lines.empty() ? "" : lines[0].string();
    for (size_t i = 1; i < lines.size(); ++i) {
      const std::string& line = lines[i].string();
      out += "\n" + ((blank || !line.empty()) ? pad : "") + line;
      check_size(out);
    }
    return Value(first ? pad + out : out);
  }
  if (name == "int") {
    if (v.is_int()) return Value(v.integer());
    if (v.is_float()) {
      if (!(std::fabs(v.number()) < 9.2e18)) throw Error("int: the float is out of range");
      return Value(static_cast<int64_t>(v.number()));
    }
    try {
      return Value(static_cast<int64_t>(std::stoll(strip(v.str(), Value(), true, true))));
    } catch (const std::exception&) {
      return args.get(0, "default", Value(0));
    }
  }
  if (name == "float") {
    if (v.is_number()) return Value(v.number());
    try {
      return Value(std::stod(v.str()));
    } catch (const std::exception&) {
      return args.get(0, "default", Value(0.0));
    }
  }
  if (name == "abs") {
    if (!v.is_number()) throw Error("abs needs a number");
    if (v.is_int() && v.integer() == INT64_MIN) throw Error("integer overflow");
    return v.is_float() ? Value(std::fabs(v.number())) : Value(v.integer() < 0 ? -v.integer() : v.integer());
  }
  if (name == "round") {
    if (!v.is_number() || !args.get(0, "precision", Value(0)).is_int()) throw Error("round needs a number and an integer precision");
    const int64_t precision = args.get(0, "precision", Value(0)).integer();
    const std::string method = args.get(1, "method", Value("common")).str();
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = v.number() * scale;
    const double r = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);  // Python's round: half to even
    return Value(r / scale);
  }
  if (name == "attr") return get_attr(v, need_string(args.get(0, "name"), "attr"));
  if (name == "first" || name == "last") {
    Array items = iterate(v);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value(iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value(Array{});
    if (!v.is_object()) throw Error("items needs a mapping, got a '" + v.type_name() + "'");
    return method(v, "items").function().call(args);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      Array chars = iterate(v);
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->string();
      return Value(std::move(out));
    }
    Array items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "join") {
    const Value attribute = args.get(1, "attribute", Value(nullptr));
    const std::string sep = args.get(0, "d", Value("")).str();
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v)) {
      out += (first ? "" : sep) + (attribute.is_none() ? x : attribute_of(x, attribute)).str();
      check_size(out);
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "sum" || name == "min" || name == "max") {
    const Value attribute = args.get(name == "sum" ? 0 : 1, "attribute", Value(nullptr));
    Array items = iterate(v);
    if (!attribute.is_none())
      for (Value& x : items) x = attribute_of(x, attribute);
    if (name == "sum") {
      Value total = args.get(1, "start", Value(0));
      for (const Value& x : items) {
        if (!x.is_number() || !total.is_number()) throw Error("sum needs numbers");
        int64_t r = 0;
        if (!total.is_float() && !x.is_float() && __builtin_add_overflow(total.integer(), x.integer(), &r)) throw Error("integer overflow");
        total = total.is_float() || x.is_float() ? Value(total.number() + x.number()) : Value(r);
      }
      return total;
    }
    if (items.empty()) return Value();
    const bool cs = args.get(0, "case_sensitive", Value(false)).boolean();
    Value best = items.front();
    for (const Value& x : items)
      if (name == "min" ? less_than(x, best, cs) : less_than(best, x, cs)) best = x;
    return best;
  }
  if (name == "unique") {
    Array out;
    for (const Value& x : iterate(v)) {
      bool seen = false;
      for (const Value& y : out) seen = seen || (x.is_string() && y.is_string() ? lower(x.string()) == lower(y.string()) : x == y);
      if (!seen) out.push_back(x);
    }
    return Value(std::move(out));
  }
  if (name == "sort") {
    Array items = iterate(v);
    const bool reverse = args.get(0, "reverse", Value(false)).boolean();
    const bool cs = args.get(1, "case_sensitive", Value(false)).boolean();
    const Value attribute = args.get(2, "attribute", Value(nullptr));
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const Value x = attribute.is_none() ? a : attribute_of(a, attribute);
      const Value y = attribute.is_none() ? b : attribute_of(b, attribute);
      return reverse ? less_than(y, x, cs) : less_than(x, y, cs);
    });
    return Value(std::move(items));
  }
  if (name == "dictsort") {
    if (!v.is_object()) throw Error("dictsort needs a mapping, got a '" + v.type_name() + "'");
    const bool cs = args.get(0, "case_sensitive", Value(false)).boolean();
    const bool by_value = args.get(1, "by", Value("key")).str() == "value";
    const bool reverse = args.get(2, "reverse", Value(false)).boolean();
    Array items = method(v, "items").function().call(args).array();
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      const Value& x = a.array()[by_value ? 1 : 0];
      const Value& y = b.array()[by_value ? 1 : 0];
      return reverse ? less_than(y, x, cs) : less_than(x, y, cs);
    });
    return Value(std::move(items));
  }
  if (name == "map") {
    Array out;
    const Value attribute = args.get(99, "attribute", Value(nullptr));
    if (!attribute.is_none()) {
      const Value dflt = args.get(99, "default");
      for (const Value& x : iterate(v)) {
        Value a = attribute_of(x, attribute);
        out.push_back(a.is_undefined() && !dflt.is_undefined() ? dflt : a);
      }
      return Value(std::move(out));
    }
    if (args.positional.empty()) throw Error("map needs a filter name or attribute=");
    const std::string f = need_string(args.positional[0], "map");
    if (!has_filter(f)) throw Error("unknown filter '" + f + "'");
    Arguments rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
    for (const Value& x : iterate(v)) out.push_back(filter(f, x, rest));
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_if = name == "select" || name == "selectattr";
    size_t i = 0;
    Value attribute;
    if (by_attr) {
      if (args.positional.empty()) throw Error(name + " needs an attribute name");
      attribute = args.positional[i++];
    }
    std::string t;
    if (i < args.positional.size()) t = need_string(args.positional[i++], name.c_str());
    if (!t.empty() && !has_test(t)) throw Error("unknown test '" + t + "'");
    Arguments rest{{args.positional.begin() + static_cast<long>(i), args.positional.end()}, {}};
    Array out;
    for (const Value& x : iterate(v)) {
      const Value subject = by_attr ? attribute_of(x, attribute) : x;
      const bool pass = t.empty() ? subject.boolean() : test(t, subject, rest);
      if (pass == keep_if) out.push_back(x);
    }
    return Value(std::move(out));
  }
  throw Error("unknown filter '" + name + "'");
}

}  // namespace specula::jinja
