// The subset of Jinja2 that chat templates are written in, run as Hugging Face runs them
// (`trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`, its `tojson`), so a model's
// own `tokenizer.chat_template` renders the prompt text it was trained on (docs/models.md).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::jinja {

// A template that cannot be parsed, or a render that fails (an undefined value's attribute, a
// type mismatch, an unknown filter): the message names the template's line.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The template's own `raise_exception(message)`: the message is the template author's, e.g.
// "Conversation roles must alternate user/assistant/user/assistant/...".
class Raised : public Error {
 public:
  using Error::Error;
};

class Value;
using Array = std::vector<Value>;

// A dict: insertion order kept (Python's), string keys only (what JSON and chat templates use).
struct Object {
  std::vector<std::pair<std::string, Value>> entries;
  bool is_namespace = false;  // made by namespace(): its attributes may be assigned
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value v);
};

struct Arguments;
// A callable: a global (range, namespace, raise_exception), a bound method or a macro.
struct Function {
  std::string name;
  std::function<Value(Arguments&)> call;
};

class Value {
 public:
  struct Undefined {};
  using Storage = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<Array>,
                               std::shared_ptr<Object>, std::shared_ptr<const Function>>;

  Value() = default;
  Value(std::nullptr_t) : v_(nullptr) {}
  Value(bool b) : v_(b) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(int64_t i) : v_(i) {}
  Value(size_t i) : v_(static_cast<int64_t>(i)) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}
  Value(std::shared_ptr<const Function> f) : v_(std::move(f)) {}
  static Value object() { return Value(std::make_shared<Object>()); }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return std::holds_alternative<Undefined>(v_); }
  bool is_none() const { return std::holds_alternative<std::nullptr_t>(v_); }
  bool is_bool() const { return std::holds_alternative<bool>(v_); }
  bool is_int() const { return std::holds_alternative<int64_t>(v_) || is_bool(); }
  bool is_float() const { return std::holds_alternative<double>(v_); }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return std::holds_alternative<std::string>(v_); }
  bool is_array() const { return std::holds_alternative<std::shared_ptr<Array>>(v_); }
  bool is_object() const { return std::holds_alternative<std::shared_ptr<Object>>(v_); }
  bool is_function() const { return std::holds_alternative<std::shared_ptr<const Function>>(v_); }

  bool boolean() const;  // Python's truth
  int64_t integer() const;  // an int or a bool
  double number() const;  // an int, a bool or a float
  const std::string& string() const { return std::get<std::string>(v_); }
  Array& array() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& object_ref() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const Function& function() const { return *std::get<std::shared_ptr<const Function>>(v_); }

  std::string str() const;  // Python's str(): "None", "True", "1.5", "['a', 1]"
  std::string repr() const;  // Python's repr(): strings quoted
  std::string type_name() const;  // Python's: "str", "int", "list", "dict", "NoneType", "undefined"
  bool operator==(const Value& o) const;  // Python's ==: 1 == 1.0 == True, lists and dicts by value

 private:
  Storage v_;
};

// A call's arguments: positional, then keyword, as written.
struct Arguments {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // Argument `name`, at `index` when passed positionally; `fallback` when absent.
  Value get(size_t index, std::string_view name, Value fallback = {}) const;
};

// Python's json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...): the
// `tojson` Hugging Face's chat templates see. indent < 0: on one line.
std::string to_json(const Value& v, int indent = -1, std::string_view item_sep = ", ", std::string_view key_sep = ": ",
                    bool sort_keys = false);

struct Node;
class Template {
 public:
  // Parses `source`; throws Error naming the line of a syntax error, an unknown tag, filter or test.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context` (an object). Throws Raised for raise_exception and
  // Error for anything else that fails.
  std::string render(const Value& context) const;

 private:
  std::vector<std::unique_ptr<Node>> body_;
};

}  // namespace specula::jinja
