// Jinja values as Python sees them: truth, str(), repr(), ==, and json.dumps (model/jinja.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "model/jinja.h"

namespace specula::jinja {
namespace {

// Python's repr(float): the shortest digits that read back the same, fixed notation for
// exponents -4..15 ("0.0001", "1e+16", "1.5e-05"), and always a ".0" on an integral value.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, end);
  const size_t e = s.find('e');
  std::string mant = s.substr(0, e);
  const int exp = std::stoi(s.substr(e + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  if (exp < -4 || exp >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ex[16];
    std::snprintf(ex, sizeof ex, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return out + ex;
  }
  if (exp < 0) return sign + "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  const size_t point = static_cast<size_t>(exp) + 1;
  if (digits.size() <= point) return sign + digits + std::string(point - digits.size(), '0') + ".0";
  return sign + digits.substr(0, point) + "." + digits.substr(point);
}

std::string string_repr(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\' || c == q) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonWriter {
  int indent;
  std::string_view item_sep, key_sep;
  bool sort_keys;
  std::string out;

  void newline(int depth) {
    out += '\n';
    out.append(static_cast<size_t>(indent * depth), ' ');
  }
  void write(const Value& v, int depth) {
    if (depth > 256) throw Error("tojson: the value is nested too deeply");
    if (v.is_undefined() || v.is_none()) {
      out += "null";
    } else if (v.is_bool()) {
      out += v.boolean() ? "true" : "false";
    } else if (v.is_int()) {
      out += std::to_string(v.integer());
    } else if (v.is_float()) {
      const double d = v.number();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : float_repr(d);
    } else if (v.is_string()) {
      json_string(out, v.string());
    } else if (v.is_array()) {
      const Array& a = v.array();
      if (a.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < a.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        write(a[i], depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += ']';
    } else if (v.is_object()) {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.object_ref().entries) entries.push_back(&e);
      if (sort_keys) std::stable_sort(entries.begin(), entries.end(), [](auto* x, auto* y) { return x->first < y->first; });
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        json_string(out, entries[i]->first);
        out += key_sep;
        write(entries[i]->second, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += '}';
    } else {
      throw Error("tojson: a " + v.type_name() + " is not JSON serializable");
    }
  }
};

}  // namespace

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : entries)
    if (k == key) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value(nullptr);
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_json(e));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value o = object();
      for (const auto& [k, e] : j.items()) o.object_ref().entries.emplace_back(k, from_json(e));
      return o;
    }
    default: return Value();
  }
}

bool Value::boolean() const {
  if (auto* b = std::get_if<bool>(&v_)) return *b;
  if (auto* i = std::get_if<int64_t>(&v_)) return *i != 0;
  if (auto* d = std::get_if<double>(&v_)) return *d != 0;
  if (auto* s = std::get_if<std::string>(&v_)) return !s->empty();
  if (is_array()) return !array().empty();
  if (is_object()) return !object_ref().entries.empty();
  return is_function();
}

int64_t Value::integer() const {
  if (auto* b = std::get_if<bool>(&v_)) return *b;
  return std::get<int64_t>(v_);
}

double Value::number() const {
  if (auto* d = std::get_if<double>(&v_)) return *d;
  return static_cast<double>(integer());
}

std::string Value::type_name() const {
  switch (v_.index()) {
    case 0: return "undefined";
    case 1: return "NoneType";
    case 2: return "bool";
    case 3: return "int";
    case 4: return "float";
    case 5: return "str";
    case 6: return "list";
    case 7: return "dict";
    default: return "function";
  }
}

std::string Value::str() const {
  if (is_undefined()) return "";
  if (is_string()) return string();
  return repr();
}

std::string Value::repr() const {
  if (is_undefined()) return "";
  if (is_none()) return "None";
  if (is_bool()) return boolean() ? "True" : "False";
  if (is_int()) return std::to_string(integer());
  if (is_float()) return float_repr(number());
  if (is_string()) return string_repr(string());
  if (is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < array().size(); ++i) out += (i ? ", " : "") + array()[i].repr();
    return out + "]";
  }
  if (is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [k, v] : object_ref().entries) {
      out += (first ? "" : ", ") + string_repr(k) + ": " + v.repr();
      first = false;
    }
    return out + "}";
  }
  return "<function " + function().name + ">";
}

bool Value::operator==(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (is_float() || o.is_float()) return number() == o.number();
    return integer() == o.integer();
  }
  if (v_.index() != o.v_.index()) return false;
  if (is_undefined() || is_none()) return true;
  if (is_string()) return string() == o.string();
  if (is_array()) {
    const Array &x = array(), &y = o.array();
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!(x[i] == y[i])) return false;
    return true;
  }
  if (is_object()) {
    const Object &x = object_ref(), &y = o.object_ref();
    if (x.entries.size() != y.entries.size()) return false;
    for (const auto& [k, v] : x.entries) {
      const Value* w = y.find(k);
      if (!w || !(v == *w)) return false;
    }
    return true;
  }
  return &function() == &o.function();
}

Value Arguments::get(size_t index, std::string_view name, Value fallback) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return v;
  if (index < positional.size()) return positional[index];
  return fallback;
}

std::string to_json(const Value& v, int indent, std::string_view item_sep, std::string_view key_sep, bool sort_keys) {
  JsonWriter w{indent, item_sep, key_sep, sort_keys, {}};
  w.write(v, 0);
  return std::move(w.out);
}

}  // namespace specula::jinja
