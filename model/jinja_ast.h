// The parsed form of a Jinja template (model/jinja.h): expressions and statements, as
// jinja_parse.cpp builds them and jinja_render.cpp runs them.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/jinja.h"

namespace specula::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // literal
    Name,     // name
    List,     // items
    Dict,     // items: key, value, key, value, ...
    GetAttr,  // a.name
    GetItem,  // a[b]
    Slice,    // a[items[0] : items[1] : items[2]], each may be null
    Call,     // a(items..., kwargs...)
    Filter,   // a | name(items..., kwargs...)
    Test,     // a is [not] name(items...)
    Unary,    // name a: "not", "-", "+"
    Binary,   // a name b: "or", "and", "==", "+", "~", "in", "not in", ...
    Cond,     // a if b else c (c may be null: undefined)
    Chain,    // items[0] ops[0] items[1] ops[1] items[2] ...: chained comparisons, as Python's
  };
  Kind kind;
  int line = 0;
  int height = 1;  // of the tree below: evaluation recurses this deep
  Value literal;
  std::string name;
  bool negated = false;  // Test: "is not"
  ExprPtr a, b, c;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Chain: the comparisons
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // branches: (condition, body); the else branch's condition is null
    For,       // for targets in expr [if filter]: body [else else_body]
    Set,       // set targets = expr, or set targets[0].attr = expr
    SetBlock,  // set targets[0] %} body {% endset
    Macro,     // macro name(params): body
    Break,
    Continue,
    Scope,     // a block rendered as it stands: {% generation %} (Hugging Face's), {% filter %} has a name
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;  // Macro's name; Set's attribute; Scope's filter ("" for none)
  ExprPtr expr, filter;
  std::vector<std::string> targets;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro: name and default (may be null)
  Body body, else_body;
};

// The parser's entry point (jinja_parse.cpp).
Body parse_template(std::string_view source);

// Filters, tests, methods and globals (jinja_builtins.cpp). Each throws Error with a message
// that does not name the line; the renderer adds it.
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value apply_filter(const std::string& name, const Value& subject, Arguments& args,
                   const std::function<Value(const std::string&, const Value&, Arguments&)>& filter,
                   const std::function<bool(const std::string&, const Value&, Arguments&)>& test);
bool apply_test(const std::string& name, const Value& subject, Arguments& args);
Value method(const Value& subject, const std::string& name);  // a bound method, or undefined
Value global(const std::string& name);                        // range, namespace, ...; or undefined
Value get_attr(const Value& subject, const std::string& name);  // a.name
Value get_item(const Value& subject, const Value& key);         // a[key]
Array iterate(const Value& v);  // for's items: a list's, a dict's keys, a string's characters
void check_size(const std::string& s);  // Error past 64 MiB, the most a string a template builds may hold
// Python's printf-style `format % args` (the `%` operator on a string, and the `format` filter):
// a list (a tuple) is the arguments, a dict the mapping of %(name)s, anything else one argument.
std::string percent_format(const std::string& format, const Value& args);

}  // namespace specula::jinja
