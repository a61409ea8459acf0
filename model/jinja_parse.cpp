// Jinja source to the tree of jinja_ast.h: the tags with Hugging Face's whitespace rules
// (trim_blocks, lstrip_blocks, `-` and `+` markers), then expressions by Jinja2's precedence
// (conditional, or, and, not, comparisons, + -, ~, * / // %, **, unary, postfix, filters and tests).
#include <cctype>
#include <set>

#include "model/jinja_ast.h"
#include "model/utf8.h"

namespace specula::jinja {
namespace {

constexpr int kMaxNesting = 100;  // of expressions and blocks: a template deeper than this is refused
constexpr int kMaxHeight = 400;   // of one expression's tree (a + b + ... chains, filter chains)

struct Token {
  enum class Kind { Name, String, Int, Float, Op, End } kind;
  std::string text;
  int line;
};

// One piece of the source: text, or a tag's tokens.
struct Piece {
  enum class Kind { Text, Output, Statement } kind;
  std::string text;
  std::vector<Token> tokens;
  int line;
};

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error("chat template line " + std::to_string(line) + ": " + what);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

void rstrip_all(std::string& s) {
  while (!s.empty() && is_space(s.back())) s.pop_back();
}

// The tokens of one tag, from `pos` (just past its opening) to its closing `close` ("}}" or "%}");
// sets `pos` past the closing and `strip_after` to the marker before it ('-', '+' or 0).
std::vector<Token> lex_tag(std::string_view src, size_t& pos, int& line, std::string_view close, char& strip_after) {
  std::vector<Token> out;
  int open_brackets = 0;  // ( [ { not yet closed: a "}}" inside a dict literal does not end the tag
  static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "=", "|", ".", ",", ":", "(", ")", "[", "]", "{", "}"};
  while (true) {
    while (pos < src.size() && is_space(src[pos])) line += src[pos++] == '\n';
    if (pos >= src.size()) fail(line, "the tag is not closed with '" + std::string(close) + "'");
    if (open_brackets == 0 && (src[pos] == '-' || src[pos] == '+') && src.substr(pos + 1, close.size()) == close) {
      strip_after = src[pos];
      pos += 1 + close.size();
      return out;
    }
    if (open_brackets == 0 && src.substr(pos, close.size()) == close) {
      strip_after = 0;
      pos += close.size();
      return out;
    }
    const char c = src[pos];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = pos;
      while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
      out.push_back({Token::Kind::Name, std::string(src.substr(pos, e - pos)), line});
      pos = e;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t e = pos;
      bool is_float = false;
      while (e < src.size() && (std::isdigit(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
      if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
        is_float = true;
        ++e;
        while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
      }
      if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
        size_t x = e + 1;
        if (x < src.size() && (src[x] == '+' || src[x] == '-')) ++x;
        if (x < src.size() && std::isdigit(static_cast<unsigned char>(src[x]))) {
          is_float = true;
          e = x;
          while (e < src.size() && std::isdigit(static_cast<unsigned char>(src[e]))) ++e;
        }
      }
      std::string text;
      for (char d : src.substr(pos, e - pos))
        if (d != '_') text += d;
      out.push_back({is_float ? Token::Kind::Float : Token::Kind::Int, text, line});
      pos = e;
    } else if (c == '\'' || c == '"') {
      const int start = line;
      std::string s;
      size_t i = pos + 1;
      for (;; ++i) {
        if (i >= src.size()) fail(start, "a string is not closed");
        char d = src[i];
        if (d == c) break;
        if (d == '\n') ++line;
        if (d != '\\' || i + 1 >= src.size()) {
          s += d;
          continue;
        }
        const char n = src[++i];
        switch (n) {
          case 'n': s += '\n'; break;
          case 't': s += '\t'; break;
          case 'r': s += '\r'; break;
          case 'b': s += '\b'; break;
          case 'f': s += '\f'; break;
          case 'v': s += '\v'; break;
          case '0': s += '\0'; break;
          case '\\': s += '\\'; break;
          case '\'': s += '\''; break;
          case '"': s += '"'; break;
          case '\n': ++line; break;  // a line continuation
          case 'x':
          case 'u':
          case 'U': {
            const size_t n_hex = n == 'x' ? 2 : n == 'u' ? 4 : 8;
            if (i + n_hex >= src.size()) fail(line, "a truncated \\" + std::string(1, n) + " escape");
            unsigned long cp = 0;
            for (char h : src.substr(i + 1, n_hex)) {
              if (!std::isxdigit(static_cast<unsigned char>(h))) fail(line, "a bad \\" + std::string(1, n) + " escape");
              cp = cp * 16 + static_cast<unsigned long>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
            }
            if (cp > 0x10FFFF) fail(line, "a \\U escape past U+10FFFF");
            i += n_hex;
            utf8::append(s, static_cast<uint32_t>(cp));
            break;
          }
          default:  // Python keeps an unknown escape as written
            s += '\\';
            s += n;
        }
      }
      out.push_back({Token::Kind::String, std::move(s), start});
      pos = i + 1;
    } else {
      bool matched = false;
      for (const char* op : kOps) {
        const std::string_view o(op);
        if (src.substr(pos, o.size()) == o) {
          out.push_back({Token::Kind::Op, std::string(o), line});
          if (o == "(" || o == "[" || o == "{") ++open_brackets;
          if ((o == ")" || o == "]" || o == "}") && open_brackets > 0) --open_brackets;
          pos += o.size();
          matched = true;
          break;
        }
      }
      if (!matched) fail(line, std::string("unexpected character '") + c + "'");
    }
  }
}

std::vector<Piece> lex(std::string_view src) {
  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;  // the text ahead starts a line (for lstrip_blocks)
  char strip_next = 0;        // the marker that ended the last tag
  bool last_was_block = false;
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string_view::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open != std::string_view::npos && open + 1 >= src.size()) open = std::string_view::npos;
    std::string text(src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    // What the previous tag asked of the text after it.
    if (strip_next == '-') {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    } else if (strip_next != '+' && last_was_block && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);  // trim_blocks
    }
    const int text_line = line;
    for (char ch : src.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos)) line += ch == '\n';
    if (open == std::string_view::npos) {
      if (!text.empty()) pieces.push_back({Piece::Kind::Text, std::move(text), {}, text_line});
      break;
    }
    const char type = src[open + 1];
    size_t at = open + 2;
    const char marker = at < src.size() && (src[at] == '-' || src[at] == '+') ? src[at] : 0;
    if (marker) ++at;
    if (marker == '-') {
      rstrip_all(text);
    } else if (marker != '+' && type != '{') {  // lstrip_blocks
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      if (nl != std::string::npos || line_starting) {
        bool blank = from < text.size();
        for (size_t k = from; k < text.size(); ++k) blank = blank && is_space(text[k]);
        if (blank) text.erase(from);
      }
    }
    if (!text.empty()) pieces.push_back({Piece::Kind::Text, std::move(text), {}, text_line});
    const int tag_line = line;
    if (type == '#') {
      const size_t close = src.find("#}", at);
      if (close == std::string_view::npos) fail(tag_line, "a comment is not closed with '#}'");
      for (size_t k = at; k < close; ++k) line += src[k] == '\n';
      strip_next = close > at && (src[close - 1] == '-' || src[close - 1] == '+') ? src[close - 1] : 0;
      pos = close + 2;
      last_was_block = true;
    } else {
      pos = at;
      Piece p{type == '{' ? Piece::Kind::Output : Piece::Kind::Statement, {}, {}, tag_line};
      p.tokens = lex_tag(src, pos, line, type == '{' ? "}}" : "%}", strip_next);
      if (p.kind == Piece::Kind::Statement && !p.tokens.empty() && p.tokens[0].kind == Token::Kind::Name &&
          p.tokens[0].text == "raw") {
        // {% raw %}...{% endraw %}: the text between as it stands.
        size_t end = src.find("endraw", pos);
        size_t tag = end == std::string_view::npos ? end : src.rfind("{%", end);
        if (tag == std::string_view::npos || tag < pos) fail(tag_line, "{% raw %} is not closed with {% endraw %}");
        std::string raw(src.substr(pos, tag - pos));
        if (src[tag + 2] == '-') rstrip_all(raw);
        for (size_t k = pos; k < end; ++k) line += src[k] == '\n';
        pieces.push_back({Piece::Kind::Text, std::move(raw), {}, tag_line});
        pos = end + 6;
        lex_tag(src, pos, line, "%}", strip_next);
      } else {
        pieces.push_back(std::move(p));
      }
      last_was_block = type == '%';
    }
    // line_starting: the tag's consumed suffix ends a line (trim_blocks took its newline).
    line_starting = last_was_block && strip_next != '+' && strip_next != '-' && pos < src.size() && src[pos] == '\n';
    if (strip_next == '-') {
      size_t k = pos;
      while (k < src.size() && is_space(src[k])) ++k;
      line_starting = k > pos && src[k - 1] == '\n';
    }
  }
  return pieces;
}

// ---- expressions -----------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(const std::vector<Token>& t, size_t start, int line) : t_(t), i_(start), line_(line) {}

  bool done() const { return i_ >= t_.size(); }
  const Token* peek(size_t ahead = 0) const { return i_ + ahead < t_.size() ? &t_[i_ + ahead] : nullptr; }
  bool at_op(std::string_view op) const { return peek() && peek()->kind == Token::Kind::Op && peek()->text == op; }
  bool at_name(std::string_view n) const { return peek() && peek()->kind == Token::Kind::Name && peek()->text == n; }
  bool take_op(std::string_view op) {
    if (!at_op(op)) return false;
    ++i_;
    return true;
  }
  bool take_name(std::string_view n) {
    if (!at_name(n)) return false;
    ++i_;
    return true;
  }
  void expect_op(std::string_view op) {
    if (!take_op(op)) fail(line(), "expected '" + std::string(op) + "'" + found());
  }
  std::string expect_name() {
    if (!peek() || peek()->kind != Token::Kind::Name) fail(line(), "expected a name" + found());
    return t_[i_++].text;
  }
  void expect_end() {
    if (!done()) fail(line(), "unexpected '" + peek()->text + "'");
  }
  int line() const { return peek() ? peek()->line : line_; }
  std::string found() const { return peek() ? ", found '" + peek()->text + "'" : " before the end of the tag"; }

  ExprPtr expression() {
    Guard g(depth_, line());
    ExprPtr e = or_expr();
    if (at_name("if")) {
      ++i_;
      auto c = make(Expr::Kind::Cond);
      c->a = std::move(e);
      c->b = or_expr();
      if (take_name("else")) c->c = expression();
      return seal(std::move(c));
    }
    return e;
  }
  // An expression without the conditional form (for's iterable, where `if` filters).
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (at_name("or")) {
      ++i_;
      e = binary("or", std::move(e), and_expr());
    }
    return e;
  }
  // `a, b` or a single name: the targets of for and set.
  std::vector<std::string> targets() {
    std::vector<std::string> out;
    const bool paren = take_op("(");
    do {
      out.push_back(expect_name());
    } while (take_op(","));
    if (paren) expect_op(")");
    return out;
  }
  // Call arguments after '(' up to ')'.
  void arguments(Expr& call) {
    while (!take_op(")")) {
      if (peek() && peek()->kind == Token::Kind::Name && peek(1) && peek(1)->kind == Token::Kind::Op &&
          peek(1)->text == "=") {
        std::string name = t_[i_].text;
        i_ += 2;
        call.kwargs.emplace_back(std::move(name), expression());
      } else {
        if (!call.kwargs.empty()) fail(line(), "a positional argument follows a keyword argument");
        call.items.push_back(expression());
      }
      if (!at_op(")")) expect_op(",");
    }
  }

 private:
  struct Guard {
    int& d;
    Guard(int& depth, int line) : d(depth) {
      if (++d > kMaxNesting) fail(line, "the expression is nested too deeply");
    }
    ~Guard() { --d; }
  };

  // Sets e's height from its children's; refuses a tree too tall to evaluate safely.
  ExprPtr seal(ExprPtr e) {
    int h = 0;
    for (const ExprPtr* c : {&e->a, &e->b, &e->c})
      if (*c) h = std::max(h, (*c)->height);
    for (const ExprPtr& c : e->items)
      if (c) h = std::max(h, c->height);
    for (const auto& [k, c] : e->kwargs) h = std::max(h, c->height);
    e->height = h + 1;
    if (e->height > kMaxHeight) fail(e->line, "the expression is nested too deeply");
    return e;
  }
  ExprPtr make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line();
    return e;
  }
  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::Binary);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return seal(std::move(e));
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (at_name("and")) {
      ++i_;
      e = binary("and", std::move(e), not_expr());
    }
    return e;
  }
  ExprPtr not_expr() {
    if (at_name("not")) {
      Guard g(depth_, line());
      ++i_;
      auto e = make(Expr::Kind::Unary);
      e->name = "not";
      e->a = not_expr();
      return seal(std::move(e));
    }
    return compare();
  }
  // Comparisons chain as in Python: a < b < c is a < b and b < c, b evaluated once.
  ExprPtr compare() {
    ExprPtr first = math1();
    std::vector<ExprPtr> operands;
    std::vector<std::string> ops;
    while (true) {
      std::string op;
      if (peek() && peek()->kind == Token::Kind::Op &&
          (peek()->text == "==" || peek()->text == "!=" || peek()->text == "<" || peek()->text == ">" ||
           peek()->text == "<=" || peek()->text == ">=")) {
        op = t_[i_++].text;
      } else if (at_name("in")) {
        ++i_;
        op = "in";
      } else if (at_name("not") && peek(1) && peek(1)->kind == Token::Kind::Name && peek(1)->text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      ops.push_back(std::move(op));
      operands.push_back(math1());
    }
    if (ops.empty()) return first;
    if (ops.size() == 1) return binary(ops[0], std::move(first), std::move(operands[0]));
    auto e = make(Expr::Kind::Chain);
    e->line = first->line;
    e->items.push_back(std::move(first));
    for (ExprPtr& x : operands) e->items.push_back(std::move(x));
    e->ops = std::move(ops);
    return seal(std::move(e));
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    while (at_op("+") || at_op("-")) {
      std::string op = t_[i_++].text;
      e = binary(op, std::move(e), concat());
    }
    return e;
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (take_op("~")) e = binary("~", std::move(e), math2());
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = t_[i_++].text;
      e = binary(op, std::move(e), power());
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary();
    while (take_op("**")) e = binary("**", std::move(e), unary());
    return e;
  }
  ExprPtr unary() {
    Guard g(depth_, line());
    if (at_op("-") || at_op("+")) {
      auto e = make(Expr::Kind::Unary);
      e->name = t_[i_++].text;
      e->a = unary_no_filter();
      return filters(seal(std::move(e)));
    }
    return filters(postfix(primary()));
  }
  ExprPtr unary_no_filter() {
    Guard g(depth_, line());
    if (at_op("-") || at_op("+")) {
      auto e = make(Expr::Kind::Unary);
      e->name = t_[i_++].text;
      e->a = unary_no_filter();
      return seal(std::move(e));
    }
    return postfix(primary());
  }
  ExprPtr primary() {
    const Token* t = peek();
    if (!t) fail(line_, "an expression is missing");
    if (t->kind == Token::Kind::String) {
      auto e = make(Expr::Kind::Literal);
      std::string s;
      while (peek() && peek()->kind == Token::Kind::String) s += t_[i_++].text;  // adjacent strings join
      e->literal = Value(std::move(s));
      return e;
    }
    if (t->kind == Token::Kind::Int || t->kind == Token::Kind::Float) {
      auto e = make(Expr::Kind::Literal);
      try {
        e->literal = t->kind == Token::Kind::Int ? Value(static_cast<int64_t>(std::stoll(t->text))) : Value(std::stod(t->text));
      } catch (const std::exception&) {
        fail(t->line, "the number " + t->text + " is out of range");
      }
      ++i_;
      return e;
    }
    if (t->kind == Token::Kind::Name) {
      const std::string& n = t->text;
      auto e = make(Expr::Kind::Literal);
      if (n == "true" || n == "True") e->literal = Value(true);
      else if (n == "false" || n == "False") e->literal = Value(false);
      else if (n == "none" || n == "None") e->literal = Value(nullptr);
      else {
        e->kind = Expr::Kind::Name;
        e->name = n;
      }
      ++i_;
      return e;
    }
    if (take_op("(")) {
      ExprPtr first = expression();
      if (take_op(")")) return first;
      auto e = make(Expr::Kind::List);  // a tuple
      e->items.push_back(std::move(first));
      while (take_op(",")) {
        if (at_op(")")) break;
        e->items.push_back(expression());
      }
      expect_op(")");
      return seal(std::move(e));
    }
    if (take_op("[")) {
      auto e = make(Expr::Kind::List);
      while (!take_op("]")) {
        e->items.push_back(expression());
        if (!at_op("]")) expect_op(",");
      }
      return seal(std::move(e));
    }
    if (take_op("{")) {
      auto e = make(Expr::Kind::Dict);
      while (!take_op("}")) {
        e->items.push_back(expression());
        expect_op(":");
        e->items.push_back(expression());
        if (!at_op("}")) expect_op(",");
      }
      return seal(std::move(e));
    }
    fail(t->line, "unexpected '" + t->text + "'");
  }
  ExprPtr postfix(ExprPtr e) {
    while (true) {
      if (take_op(".")) {
        auto g = make(Expr::Kind::GetAttr);
        if (peek() && peek()->kind == Token::Kind::Int) {  // a.0 is a[0]
          g->kind = Expr::Kind::GetItem;
          g->b = make(Expr::Kind::Literal);
          try {
            g->b->literal = Value(static_cast<int64_t>(std::stoll(t_[i_].text)));
          } catch (const std::exception&) {
            fail(line(), "the index " + t_[i_].text + " is out of range");
          }
          ++i_;
        } else {
          g->name = expect_name();
        }
        g->a = std::move(e);
        e = seal(std::move(g));
      } else if (take_op("[")) {
        ExprPtr parts[3];
        int colons = 0;
        while (!at_op("]")) {
          if (take_op(":")) {
            if (++colons > 2) fail(line(), "a slice has at most two ':'");
            continue;
          }
          if (parts[colons]) fail(line(), "expected ':' or ']'" + found());
          parts[colons] = expression();
        }
        expect_op("]");
        if (colons == 0) {
          if (!parts[0]) fail(line(), "a subscript is empty");
          auto g = make(Expr::Kind::GetItem);
          g->a = std::move(e);
          g->b = std::move(parts[0]);
          e = seal(std::move(g));
        } else {
          auto s = make(Expr::Kind::Slice);
          s->a = std::move(e);
          for (auto& p : parts) s->items.push_back(std::move(p));
          e = seal(std::move(s));
        }
      } else if (take_op("(")) {
        auto c = make(Expr::Kind::Call);
        c->a = std::move(e);
        arguments(*c);
        e = seal(std::move(c));
      } else {
        return e;
      }
    }
  }
  ExprPtr filters(ExprPtr e) {
    while (true) {
      if (take_op("|")) {
        auto f = make(Expr::Kind::Filter);
        f->name = expect_name();
        if (!has_filter(f->name)) fail(f->line, "unknown filter '" + f->name + "'");
        f->a = std::move(e);
        if (take_op("(")) arguments(*f);
        e = seal(std::move(f));
      } else if (at_name("is")) {
        ++i_;
        auto t = make(Expr::Kind::Test);
        t->negated = take_name("not");
        t->name = expect_name();
        if (!has_test(t->name)) fail(t->line, "unknown test '" + t->name + "'");
        t->a = std::move(e);
        if (take_op("(")) {
          arguments(*t);
        } else if (peek() && (peek()->kind == Token::Kind::String || peek()->kind == Token::Kind::Int ||
                              peek()->kind == Token::Kind::Float || at_op("[") || at_op("{") ||
                              (peek()->kind == Token::Kind::Name && peek()->text != "and" && peek()->text != "or" &&
                               peek()->text != "if" && peek()->text != "else" && peek()->text != "is" &&
                               peek()->text != "in" && peek()->text != "not"))) {
          t->items.push_back(postfix(primary()));  // `x is divisibleby 3`, `x is sameas none`
        }
        e = seal(std::move(t));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  size_t i_;
  int line_;
  int depth_ = 0;
};

// ---- statements ------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  Body parse() {
    std::string stop;
    Body b = body({}, stop);
    return b;
  }

 private:
  // Parses nodes until a statement whose keyword is in `ends` (returned in `stop`, its piece
  // left at p_[i_ - 1]), or the end of the source when `ends` is empty.
  Body body(const std::set<std::string>& ends, std::string& stop) {
    if (++depth_ > kMaxNesting) fail(p_.empty() ? 1 : p_[std::min(i_, p_.size() - 1)].line, "the blocks are nested too deeply");
    Body out;
    while (i_ < p_.size()) {
      Piece& piece = p_[i_++];
      if (piece.kind == Piece::Kind::Text) {
        auto n = node(Node::Kind::Text, piece.line);
        n->text = std::move(piece.text);
        out.push_back(std::move(n));
        continue;
      }
      ExprParser x(piece.tokens, 0, piece.line);
      if (piece.kind == Piece::Kind::Output) {
        auto n = node(Node::Kind::Output, piece.line);
        n->expr = x.expression();
        x.expect_end();
        out.push_back(std::move(n));
        continue;
      }
      if (x.done()) fail(piece.line, "an empty {% %} tag");
      const std::string keyword = x.expect_name();
      if (ends.count(keyword)) {
        stop = keyword;
        --depth_;
        return out;
      }
      out.push_back(statement(keyword, x, piece.line));
    }
    if (!ends.empty()) {
      std::string want;
      for (const std::string& e : ends) want += (want.empty() ? "" : " or ") + ("{% " + e + " %}");
      fail(p_.empty() ? 1 : p_.back().line, "the template ends before " + want);
    }
    --depth_;
    return out;
  }

  std::unique_ptr<Node> node(Node::Kind k, int line) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = line;
    return n;
  }

  std::unique_ptr<Node> statement(const std::string& keyword, ExprParser& x, int line) {
    std::string stop;
    if (keyword == "if") {
      auto n = node(Node::Kind::If, line);
      ExprPtr cond = x.expression();
      x.expect_end();
      while (true) {
        Body b = body({"elif", "else", "endif"}, stop);
        n->branches.emplace_back(std::move(cond), std::move(b));
        ExprParser y(p_[i_ - 1].tokens, 1, p_[i_ - 1].line);
        if (stop == "endif") {
          y.expect_end();
          return n;
        }
        if (stop == "else") {
          y.expect_end();
          Body e = body({"endif"}, stop);
          n->branches.emplace_back(nullptr, std::move(e));
          ExprParser(p_[i_ - 1].tokens, 1, p_[i_ - 1].line).expect_end();
          return n;
        }
        cond = y.expression();
        y.expect_end();
      }
    }
    if (keyword == "for") {
      auto n = node(Node::Kind::For, line);
      n->targets = x.targets();
      if (!x.take_name("in")) fail(line, "expected 'in' in the for tag" + x.found());
      n->expr = x.or_expr();
      if (x.take_name("if")) n->filter = x.or_expr();
      if (x.take_name("recursive")) fail(line, "recursive loops are not supported");
      x.expect_end();
      n->body = body({"else", "endfor"}, stop);
      if (stop == "else") {
        ExprParser(p_[i_ - 1].tokens, 1, p_[i_ - 1].line).expect_end();
        n->else_body = body({"endfor"}, stop);
      }
      ExprParser(p_[i_ - 1].tokens, 1, p_[i_ - 1].line).expect_end();
      return n;
    }
    if (keyword == "set") {
      auto n = node(Node::Kind::Set, line);
      n->targets.push_back(x.expect_name());
      if (x.take_op(".")) {
        n->name = x.expect_name();
      } else {
        while (x.take_op(",")) n->targets.push_back(x.expect_name());
      }
      if (x.done() && n->targets.size() == 1 && n->name.empty()) {  // {% set x %}...{% endset %}
        n->kind = Node::Kind::SetBlock;
        n->body = body({"endset"}, stop);
        ExprParser(p_[i_ - 1].tokens, 1, p_[i_ - 1].line).expect_end();
        return n;
      }
      x.expect_op("=");
      n->expr = x.expression();
      if (x.at_op(",")) {  // set a, b = 1, 2
        auto tuple = std::make_unique<Expr>();
        tuple->kind = Expr::Kind::List;
        tuple->line = line;
        tuple->items.push_back(std::move(n->expr));
        while (x.take_op(",")) tuple->items.push_back(x.expression());
        n->expr = std::move(tuple);
      }
      x.expect_end();
      return n;
    }
    if (keyword == "macro") {
      auto n = node(Node::Kind::Macro, line);
      n->name = x.expect_name();
      x.expect_op("(");
      while (!x.take_op(")")) {
        std::string p = x.expect_name();
        ExprPtr dflt;
        if (x.take_op("=")) dflt = x.expression();
        n->params.emplace_back(std::move(p), std::move(dflt));
        if (!x.at_op(")")) x.expect_op(",");
      }
      x.expect_end();
      n->body = body({"endmacro"}, stop);
      return n;
    }
    if (keyword == "break" || keyword == "continue") {
      x.expect_end();  // outside a loop it fails at render time (a macro's body may be called in one)
      return node(keyword == "break" ? Node::Kind::Break : Node::Kind::Continue, line);
    }
    if (keyword == "generation") {  // Hugging Face's marker of the assistant's tokens: rendered as is
      x.expect_end();
      auto n = node(Node::Kind::Scope, line);
      n->body = body({"endgeneration"}, stop);
      return n;
    }
    if (keyword == "filter") {
      auto n = node(Node::Kind::Scope, line);
      n->name = x.expect_name();
      if (!has_filter(n->name)) fail(line, "unknown filter '" + n->name + "'");
      x.expect_end();
      n->body = body({"endfilter"}, stop);
      return n;
    }
    fail(line, "unknown tag '" + keyword + "'");
  }

  std::vector<Piece> p_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) {
  // As Jinja2 reads a source: "\r\n" and "\r" are newlines, and one trailing newline is dropped
  // (keep_trailing_newline is off in Hugging Face's environment).
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text += source[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return Parser(lex(text)).parse();
}

}  // namespace specula::jinja
