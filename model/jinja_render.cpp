// Runs a parsed template (jinja_ast.h) over a context: Jinja2's scoping (each loop iteration
// and each macro call a frame of its own, `namespace()` attributes shared), Python's operators.
#include <climits>
#include <cmath>
#include <optional>

#include "model/jinja_ast.h"

namespace specula::jinja {
namespace {

constexpr int kMaxCallDepth = 16;  // macro calls inside macro calls (times 100 nested blocks: the stack's bound)

constexpr size_t kMaxOutput = 256u << 20;   // bytes of a render's text
constexpr int64_t kMaxSteps = 10'000'000;   // loop iterations of one render
constexpr int kMaxValueDepth = 256;         // a namespace attribute's nesting (repr, == and destruction recurse)

enum class Flow { Normal, Break, Continue };

std::string bounded(std::string s) {
  check_size(s);
  return s;
}

// Whether v nests deeper than `limit` (a walk that stops there, so it is bounded itself).
bool deeper_than(const Value& v, int limit) {
  if (limit < 0) return true;
  if (v.is_array()) {
    for (const Value& x : v.array())
      if (deeper_than(x, limit - 1)) return true;
  } else if (v.is_object()) {
    for (const auto& [k, x] : v.object_ref().entries)
      if (deeper_than(x, limit - 1)) return true;
  }
  return false;
}

[[noreturn]] void fail_at(int line, const std::string& what) {
  throw Error("chat template line " + std::to_string(line) + ": " + what);
}

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) throw Error("an undefined value in '" + op + "'");
  throw Error("unsupported operand types for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

int compare_values(const std::string& op, const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
    return a.integer() < b.integer() ? -1 : a.integer() > b.integer() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.string().compare(b.string()) < 0 ? -1 : a.string() == b.string() ? 0 : 1;
  if (a.is_array() && b.is_array()) {
    const Array &x = a.array(), &y = b.array();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!(x[i] == y[i])) return compare_values(op, x[i], y[i]);
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  throw Error("'" + op + "' is not supported between '" + a.type_name() + "' and '" + b.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) throw Error("'in <string>' requires a string on the left, not '" + item.type_name() + "'");
    return container.string().find(item.string()) != std::string::npos;
  }
  if (container.is_array()) {
    for (const Value& v : container.array())
      if (v == item) return true;
    return false;
  }
  if (container.is_object()) return item.is_string() && container.object_ref().find(item.string()) != nullptr;
  if (container.is_undefined()) return false;  // Undefined iterates as empty
  throw Error("'in' is not supported on a '" + container.type_name() + "'");
}

// a op b for a comparison operator (==, !=, <, >, <=, >=, in, not in); none for any other.
std::optional<bool> comparison(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return a == b;
  if (op == "!=") return !(a == b);
  if (op == "<") return compare_values(op, a, b) < 0;
  if (op == ">") return compare_values(op, a, b) > 0;
  if (op == "<=") return compare_values(op, a, b) <= 0;
  if (op == ">=") return compare_values(op, a, b) >= 0;
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  return std::nullopt;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(bounded(a.string() + b.string()));
    if (a.is_array() && b.is_array()) {
      if (a.array().size() + b.array().size() > (1u << 20)) throw Error("a list longer than 1 Mi items");
      Array out = a.array();
      out.insert(out.end(), b.array().begin(), b.array().end());
      return Value(std::move(out));
    }
  }
  if (op == "*" && (a.is_string() || a.is_array()) && b.is_int()) {
    const Value& seq = a;
    const int64_t times = b.integer();
    const size_t unit = seq.is_string() ? seq.string().size() : seq.array().size();
    if (times <= 0 || unit == 0) return seq.is_string() ? Value(std::string()) : Value(Array{});
    const size_t limit = seq.is_string() ? (64u << 20) : (1u << 20);  // bytes of a string, items of a list
    if (static_cast<uint64_t>(times) > limit / unit) throw Error("a string or list repeated past 64 MiB or 1 Mi items");
    if (seq.is_string()) {
      std::string out;
      for (int64_t i = 0; i < times; ++i) out += seq.string();
      return Value(std::move(out));
    }
    Array out;
    for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.array().begin(), seq.array().end());
    return Value(std::move(out));
  }
  if (op == "%" && a.is_string()) return Value(percent_format(a.string(), b));  // Python's printf-style formatting
  if (!a.is_number() || !b.is_number()) type_error(op, a, b);
  const bool ints = a.is_int() && b.is_int();
  if (op == "/") {
    if (b.number() == 0) throw Error("division by zero");
    return Value(a.number() / b.number());
  }
  if (op == "//" || op == "%") {
    if (b.number() == 0) throw Error("division by zero");
    if (ints) {
      const int64_t x = a.integer(), y = b.integer();
      if (y == -1) {  // x / -1 traps for the smallest int64
        if (op == "%") return Value(int64_t{0});
        int64_t neg = 0;
        if (__builtin_sub_overflow(int64_t{0}, x, &neg)) throw Error("integer overflow");
        return Value(neg);
      }
      int64_t q = x / y, r = x % y;
      if (r != 0 && ((r < 0) != (y < 0))) {  // Python floors
        q -= 1;
        r += y;
      }
      return Value(op == "//" ? q : r);
    }
    const double x = a.number(), y = b.number();
    const double q = std::floor(x / y);
    return Value(op == "//" ? q : x - q * y);
  }
  if (op == "**") {
    if (ints && b.integer() >= 0) {
      const int64_t x = a.integer(), n = b.integer();
      if (x == 0 || x == 1) return Value(n == 0 ? int64_t{1} : x);
      if (x == -1) return Value(n % 2 ? int64_t{-1} : int64_t{1});
      int64_t r = 1;  // |x| >= 2: overflows within 63 steps
      for (int64_t i = 0; i < n; ++i)
        if (__builtin_mul_overflow(r, x, &r)) throw Error("integer overflow");
      return Value(r);
    }
    return Value(std::pow(a.number(), b.number()));
  }
  if (ints) {  // Python's ints do not overflow; ours refuse to
    int64_t r = 0;
    const bool over = op == "+"   ? __builtin_add_overflow(a.integer(), b.integer(), &r)
                      : op == "-" ? __builtin_sub_overflow(a.integer(), b.integer(), &r)
                      : op == "*" ? __builtin_mul_overflow(a.integer(), b.integer(), &r)
                                  : (type_error(op, a, b), false);
    if (over) throw Error("integer overflow");
    return Value(r);
  } else {
    if (op == "+") return Value(a.number() + b.number());
    if (op == "-") return Value(a.number() - b.number());
    if (op == "*") return Value(a.number() * b.number());
  }
  type_error(op, a, b);
}

class Renderer {
 public:
  explicit Renderer(const Value& context) {
    scopes_.emplace_back();
    if (context.is_object())
      for (const auto& [k, v] : context.object_ref().entries) scopes_.back().emplace_back(k, v);
  }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

 private:
  using Frame = std::vector<std::pair<std::string, Value>>;

  Flow exec(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::Text: out += n.text; return Flow::Normal;
      case Node::Kind::Output:
        out += eval(*n.expr).str();
        if (out.size() > kMaxOutput) fail_at(n.line, "the rendered text is longer than 256 MiB");
        return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond).boolean()) return exec(body, out);
        return Flow::Normal;
      case Node::Kind::For: return run_for(n, out);
      case Node::Kind::Set: {
        Value v = eval(*n.expr);
        if (!n.name.empty()) {
          Value target = lookup(n.targets[0]);
          if (!target.is_object() || !target.object_ref().is_namespace)
            fail_at(n.line, "'" + n.targets[0] + "." + n.name + "' can be assigned only on a namespace()");
          if (deeper_than(v, kMaxValueDepth)) fail_at(n.line, "a value nested deeper than 256 levels");
          target.object_ref().set(n.name, std::move(v));
        } else {
          bind(n.targets, v, n.line);
        }
        return Flow::Normal;
      }
      case Node::Kind::SetBlock: {
        std::string captured;
        exec(n.body, captured);
        assign(n.targets[0], Value(std::move(captured)));
        return Flow::Normal;
      }
      case Node::Kind::Macro: {
        auto f = std::make_shared<Function>();
        f->name = n.name;
        const Node* def = &n;
        f->call = [this, def](Arguments& args) { return call_macro(*def, args); };
        assign(n.name, Value(std::shared_ptr<const Function>(std::move(f))));
        return Flow::Normal;
      }
      case Node::Kind::Break:
      case Node::Kind::Continue:
        if (loops_ == 0) fail_at(n.line, "{% break %} or {% continue %} outside a loop");
        return n.kind == Node::Kind::Break ? Flow::Break : Flow::Continue;
      case Node::Kind::Scope: {
        if (n.name.empty()) return exec(n.body, out);
        std::string captured;
        const Flow f = exec(n.body, captured);
        Arguments none;
        out += filter(n.name, Value(std::move(captured)), none).str();
        return f;
      }
    }
    return Flow::Normal;
  }

  Flow run_for(const Node& n, std::string& out) {
    Array items;
    try {
      items = iterate(eval(*n.expr));
    } catch (const Raised&) {
      throw;
    } catch (const Error& e) {
      rethrow(n.line, e);
    }
    if (n.filter) {
      Array kept;
      for (const Value& item : items) {
        scopes_.emplace_back();
        bind(n.targets, item, n.line);
        const bool keep = eval(*n.filter).boolean();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, out);
    ++loops_;
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      if (++steps_ > kMaxSteps) fail_at(n.line, "the template runs more than 10,000,000 loop iterations");
      scopes_.emplace_back();
      Value loop = Value::object();
      Object& l = loop.object_ref();
      l.set("index", Value(i + 1));
      l.set("index0", Value(i));
      l.set("revindex", Value(len - i));
      l.set("revindex0", Value(len - i - 1));
      l.set("first", Value(i == 0));
      l.set("last", Value(i == len - 1));
      l.set("length", Value(len));
      l.set("depth", Value(1));
      l.set("depth0", Value(0));
      l.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value());
      l.set("nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value());
      l.set("cycle", Value(std::make_shared<const Function>(Function{"loop.cycle", [i](Arguments& a) {
              if (!a.keyword.empty()) throw Error("loop.cycle takes no keyword arguments");
              if (a.positional.empty()) throw Error("loop.cycle: no items for cycling given");
              return a.positional[static_cast<size_t>(i) % a.positional.size()];
            }})));
      assign("loop", std::move(loop));
      bind(n.targets, items[static_cast<size_t>(i)], n.line);
      const Flow f = exec(n.body, out);
      scopes_.pop_back();
      if (f == Flow::Break) break;
    }
    --loops_;
    return Flow::Normal;
  }

  Value call_macro(const Node& def, Arguments& args) {
    if (calls_ >= kMaxCallDepth) fail_at(def.line, "macros call each other too deeply");
    if (args.positional.size() > def.params.size())
      fail_at(def.line, "macro '" + def.name + "' takes " + std::to_string(def.params.size()) + " arguments, got " +
                            std::to_string(args.positional.size()));
    for (const auto& [k, v] : args.keyword) {
      bool known = false;
      for (const auto& p : def.params) known = known || p.first == k;
      if (!known) fail_at(def.line, "macro '" + def.name + "' has no argument '" + k + "'");
    }
    // The body sees the template's top level and a frame of its own for the arguments, not the
    // caller's frames. An error ends the whole render, so nothing needs restoring then.
    const size_t saved_base = base_;
    const int saved_loops = loops_;
    scopes_.emplace_back();
    base_ = scopes_.size() - 1;
    loops_ = 0;
    ++calls_;
    for (size_t i = 0; i < def.params.size(); ++i) {
      const auto& [name, dflt] = def.params[i];
      Value v = args.get(i, name, Value());
      if (v.is_undefined() && dflt) v = eval(*dflt);
      assign(name, std::move(v));
    }
    std::string out;
    exec(def.body, out);
    --calls_;
    loops_ = saved_loops;
    base_ = saved_base;
    scopes_.pop_back();
    return Value(std::move(out));
  }

  void bind(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    if (!v.is_array() || v.array().size() != targets.size())
      fail_at(line, "cannot unpack a " + v.type_name() + " into " + std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], v.array()[i]);
  }

  void assign(const std::string& name, Value v) {
    for (auto& [k, old] : scopes_.back())
      if (k == name) {
        old = std::move(v);
        return;
      }
    scopes_.back().emplace_back(name, std::move(v));
  }

  // The visible frames, innermost first: those from base_ up, then the top level.
  Value lookup(const std::string& name) const {
    for (size_t s = scopes_.size(); s-- > 0;) {
      if (s < base_ && s != 0) continue;
      for (const auto& [k, v] : scopes_[s])
        if (k == name) return v;
    }
    return global(name);
  }

  [[noreturn]] static void rethrow(int line, const Error& e) {
    const std::string what = e.what();
    if (what.rfind("chat template line ", 0) == 0) throw e;
    fail_at(line, what);
  }

  Value filter(const std::string& name, const Value& subject, Arguments& args) {
    return apply_filter(
        name, subject, args, [this](const std::string& f, const Value& v, Arguments& a) { return filter(f, v, a); },
        [](const std::string& t, const Value& v, Arguments& a) { return apply_test(t, v, a); });
  }

  Arguments arguments(const Expr& e) {
    Arguments args;
    for (const auto& x : e.items) args.positional.push_back(eval(*x));
    for (const auto& [k, x] : e.kwargs) args.keyword.emplace_back(k, eval(*x));
    return args;
  }

  Value eval(const Expr& e) {
    try {
      return eval_unguarded(e);
    } catch (const Raised&) {
      throw;
    } catch (const Error& err) {
      rethrow(e.line, err);
    }
  }

  Value eval_unguarded(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.literal;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::List: {
        Array a;
        for (const auto& x : e.items) a.push_back(eval(*x));
        return Value(std::move(a));
      }
      case Expr::Kind::Dict: {
        Value o = Value::object();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          Value k = eval(*e.items[i]);
          if (!k.is_string()) throw Error("dict keys must be strings, got a " + k.type_name());
          o.object_ref().set(k.string(), eval(*e.items[i + 1]));
        }
        return o;
      }
      case Expr::Kind::GetAttr: return get_attr(eval(*e.a), e.name);
      case Expr::Kind::GetItem: return get_item(eval(*e.a), eval(*e.b));
      case Expr::Kind::Slice: {
        Value subject = eval(*e.a);
        Arguments args;
        for (const auto& p : e.items) args.positional.push_back(p ? eval(*p) : Value(nullptr));
        return apply_filter("__slice__", subject, args, nullptr, nullptr);
      }
      case Expr::Kind::Call: {
        Value f = eval(*e.a);
        Arguments args = arguments(e);
        if (!f.is_function()) {
          if (f.is_undefined()) throw Error("calling an undefined value");
          throw Error("a '" + f.type_name() + "' is not callable");
        }
        return f.function().call(args);
      }
      case Expr::Kind::Filter: {
        Value subject = eval(*e.a);
        Arguments args = arguments(e);
        return filter(e.name, subject, args);
      }
      case Expr::Kind::Test: {
        Value subject = eval(*e.a);
        Arguments args = arguments(e);
        return Value(apply_test(e.name, subject, args) != e.negated);
      }
      case Expr::Kind::Unary: {
        Value v = eval(*e.a);
        if (e.name == "not") return Value(!v.boolean());
        if (!v.is_number()) throw Error("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
        if (e.name == "+") return v.is_float() ? Value(v.number()) : Value(v.integer());
        if (v.is_int() && v.integer() == INT64_MIN) throw Error("integer overflow");
        return v.is_float() ? Value(-v.number()) : Value(-v.integer());
      }
      case Expr::Kind::Binary: {
        const std::string& op = e.name;
        Value a = eval(*e.a);
        if (op == "and") return a.boolean() ? eval(*e.b) : a;
        if (op == "or") return a.boolean() ? a : eval(*e.b);
        Value b = eval(*e.b);
        if (op == "~") return Value(bounded(a.str() + b.str()));
        if (const std::optional<bool> c = comparison(op, a, b)) return Value(*c);
        return arithmetic(op, a, b);
      }
      case Expr::Kind::Chain: {
        Value a = eval(*e.items[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value b = eval(*e.items[k + 1]);
          if (!*comparison(e.ops[k], a, b)) return Value(false);
          a = std::move(b);
        }
        return Value(true);
      }
      case Expr::Kind::Cond:
        if (eval(*e.b).boolean()) return eval(*e.a);
        return e.c ? eval(*e.c) : Value();
    }
    return Value();
  }

  std::vector<Frame> scopes_;
  int loops_ = 0;
  int calls_ = 0;
  int64_t steps_ = 0;
  size_t base_ = 0;  // inside a macro call: its arguments' frame (the frames below it but the top level are the caller's)
};

}  // namespace

struct Node;

Template::Template(std::string_view source) : body_(parse_template(source)) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  Renderer r(context);
  std::string out;
  r.exec(body_, out);
  return out;
}

}  // namespace specula::jinja
