// GBNF grammars, the vocabulary's trie and the lazily determinized matcher (spec/grammar.h).
#include "spec/grammar.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>

#include "model/tokenizer.h"
#include "spec/utf8.h"

namespace specula {

// --- The vocabulary's trie ---------------------------------------------------------------------

TokenTrie::TokenTrie(const Tokenizer& tokenizer) {
  const int32_t V = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(V));
  for (int32_t v = 0; v < V; ++v)
    if (!tokenizer.is_special(v)) bytes[static_cast<size_t>(v)] = tokenizer.token_bytes(v);
  bytes_ = std::move(bytes);
  build();
}

TokenTrie::TokenTrie(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) { build(); }

void TokenTrie::build() {
  const std::vector<std::string>& token_bytes = bytes_;
  std::vector<int32_t> order;
  for (size_t v = 0; v < token_bytes.size(); ++v)
    if (!token_bytes[v].empty()) order.push_back(static_cast<int32_t>(v));
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_bytes[static_cast<size_t>(a)] < token_bytes[static_cast<size_t>(b)];
  });
  auto bytes = [&](size_t i) -> const std::string& { return token_bytes[static_cast<size_t>(order[i])]; };
  // Node `at` holds the sorted tokens [lo, hi) sharing its first `depth` bytes: those exactly
  // `depth` long end here (they sort first); the rest make its children, one per next byte.
  nodes_.assign(1, Node{});
  struct Pending {
    uint32_t at;
    size_t lo, hi, depth;
  };
  std::vector<Pending> work{{0, 0, order.size(), 0}};
  while (!work.empty()) {
    const Pending p = work.back();
    work.pop_back();
    size_t i = p.lo;
    nodes_[p.at].token_begin = static_cast<uint32_t>(tokens_.size());
    for (; i < p.hi && bytes(i).size() == p.depth; ++i) tokens_.push_back(order[i]);
    nodes_[p.at].token_end = static_cast<uint32_t>(tokens_.size());
    nodes_[p.at].child_begin = static_cast<uint32_t>(nodes_.size());
    while (i < p.hi) {
      const auto b = static_cast<uint8_t>(bytes(i)[p.depth]);
      size_t j = i;
      while (j < p.hi && static_cast<uint8_t>(bytes(j)[p.depth]) == b) ++j;
      Node child;
      child.byte = b;
      nodes_.push_back(child);
      work.push_back({static_cast<uint32_t>(nodes_.size() - 1), i, j, p.depth + 1});
      i = j;
    }
    nodes_[p.at].child_end = static_cast<uint32_t>(nodes_.size());
  }
}

// --- GBNF ----------------------------------------------------------------------------------------

namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kMaxRepeat = 10000;

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

using ByteSet = std::array<uint64_t, 4>;
void add_range(ByteSet& s, uint32_t lo, uint32_t hi) {
  for (uint32_t b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
}

}  // namespace

class GrammarBuilder {
 public:
  explicit GrammarBuilder(std::string_view text) : text_(text) {}

  std::shared_ptr<const Grammar> build() {
    skip(true);
    while (pos_ < text_.size()) {
      const std::string name = parse_name();
      skip(false);
      if (text_.substr(pos_, 3) != "::=") fail("expected ::= after the rule name '" + name + "'");
      pos_ += 3;
      skip(true);
      const uint32_t r = rule(name);
      if (defined_[r]) fail("rule '" + name + "' is defined twice");
      defined_[r] = true;
      bodies_[r] = parse_alternates(false);
      skip(false);
      if (pos_ < text_.size() && text_[pos_] != '\n' && text_[pos_] != '\r') fail(std::string("unexpected '") + text_[pos_] + "'");
      skip(true);
    }
    const auto root = ids_.find("root");
    if (root == ids_.end()) throw std::invalid_argument("grammar: no rule named 'root'");
    for (const auto& [name, r] : ids_)
      if (!defined_[r]) {
        pos_ = first_seen_[r];
        fail("rule '" + name + "' is used but not defined");
      }
    check_left_recursion();
    auto g = std::make_shared<Grammar>();
    g->root_ = root->second;
    g->sets_ = std::move(sets_);
    g->alts_.resize(bodies_.size());
    for (size_t r = 0; r < bodies_.size(); ++r)
      for (const auto& alt : bodies_[r]) {
        g->alts_[r].push_back(static_cast<uint32_t>(g->elems_.size()));
        g->elems_.insert(g->elems_.end(), alt.begin(), alt.end());
        g->elems_.push_back(Grammar::Elem{});
      }
    return g;
  }

 private:
  using Elem = Grammar::Elem;
  using Seq = std::vector<Elem>;
  using Alts = std::vector<Seq>;

  [[noreturn]] void fail(const std::string& what) const {
    const size_t line = 1 + static_cast<size_t>(std::count(text_.begin(), text_.begin() + static_cast<std::ptrdiff_t>(std::min(pos_, text_.size())), '\n'));
    throw std::invalid_argument("grammar: line " + std::to_string(line) + ": " + what);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  // Spaces and comments; newlines too where `newlines`.
  void skip(bool newlines) {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && name_char(text_[pos_])) ++pos_;
    if (pos_ == start) fail(at_end() ? "expected a rule name" : std::string("expected a rule name, got '") + peek() + "'");
    return std::string(text_.substr(start, pos_ - start));
  }

  uint32_t rule(const std::string& name) {
    const auto [it, fresh] = ids_.emplace(name, static_cast<uint32_t>(bodies_.size()));
    if (fresh) {
      bodies_.emplace_back();
      defined_.push_back(false);
      first_seen_.push_back(pos_);
    }
    return it->second;
  }

  uint32_t anonymous(Alts body) {
    std::string name(1, '\x01');  // no GBNF name can collide
    name += std::to_string(bodies_.size());
    const uint32_t r = rule(name);
    defined_[r] = true;
    bodies_[r] = std::move(body);
    return r;
  }

  uint32_t set_index(const ByteSet& s) {
    const auto [it, fresh] = set_ids_.emplace(s, static_cast<uint32_t>(sets_.size()));
    if (fresh) sets_.push_back(s);
    return it->second;
  }

  Elem byte_elem(uint32_t lo, uint32_t hi) {
    ByteSet s{};
    add_range(s, lo, hi);
    return Elem{Elem::Bytes, set_index(s)};
  }

  // One UTF-8 character in the text (the grammar's own bytes are UTF-8).
  uint32_t parse_char_in_text() {
    const std::optional<uint32_t> cp = utf8::decode(text_, pos_);
    if (!cp) fail("the grammar is not UTF-8");
    return *cp;
  }

  uint32_t parse_hex(int digits) {
    const std::optional<uint32_t> v = utf8::hex(text_, pos_, digits);
    if (!v) fail("expected " + std::to_string(digits) + " hex digits");
    return *v;
  }

  // A character of a literal or class, escapes decoded; `raw_byte` is set for \xHH (one byte).
  uint32_t parse_char(bool& raw_byte) {
    raw_byte = false;
    if (at_end()) fail("unexpected end of the grammar");
    if (text_[pos_] != '\\') return parse_char_in_text();
    ++pos_;
    if (at_end()) fail("unexpected end of the grammar after '\\'");
    const char c = text_[pos_++];
    switch (c) {
      case 'n': return '\n';
      case 'r': return '\r';
      case 't': return '\t';
      case '\\': case '"': case '[': case ']': case '-': case '^': case '/': return static_cast<uint8_t>(c);
      case 'x': raw_byte = true; return parse_hex(2);
      case 'u': return parse_hex(4);
      case 'U': {
        const uint32_t cp = parse_hex(8);
        if (cp > kMaxCodePoint) fail("\\U past U+10FFFF");
        return cp;
      }
      default: fail(std::string("unknown escape '\\") + c + "'");
    }
  }

  Seq parse_literal() {
    ++pos_;  // '"'
    Seq seq;
    while (true) {
      if (at_end() || text_[pos_] == '\n') fail("unterminated string literal");
      if (text_[pos_] == '"') break;
      bool raw = false;
      const uint32_t cp = parse_char(raw);
      std::string bytes;
      if (raw) bytes += static_cast<char>(cp);
      else utf8::append(bytes, cp);
      for (const char b : bytes) seq.push_back(byte_elem(static_cast<uint8_t>(b), static_cast<uint8_t>(b)));
    }
    ++pos_;
    return seq;
  }

  // The UTF-8 byte sequences of the code points [lo, hi] (one length, no surrogates), split so
  // that each is a run of byte ranges (the construction regular-expression engines use).
  void utf8_ranges(uint32_t lo, uint32_t hi, Alts& out) {
    if (lo > hi) return;
    for (const uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu})
      if (lo <= edge && hi > edge) {
        utf8_ranges(lo, edge, out);
        utf8_ranges(edge + 1, hi, out);
        return;
      }
    const int n = utf8_length(lo);
    for (int i = 1; i < n; ++i) {
      const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
      if ((lo & ~m) != (hi & ~m)) {
        if ((lo & m) != 0) {
          utf8_ranges(lo, lo | m, out);
          utf8_ranges((lo | m) + 1, hi, out);
          return;
        }
        if ((hi & m) != m) {
          utf8_ranges(lo, (hi & ~m) - 1, out);
          utf8_ranges(hi & ~m, hi, out);
          return;
        }
      }
    }
    std::string a, b;
    utf8::append(a, lo);
    utf8::append(b, hi);
    Seq seq;
    for (size_t k = 0; k < a.size(); ++k) seq.push_back(byte_elem(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])));
    out.push_back(std::move(seq));
  }

  // Code point ranges (sorted, merged) as one element: a byte set where all are ASCII, else a rule.
  Seq class_elems(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
    if (ranges.empty()) fail("a character class that matches nothing");
    if (ranges.back().second < 0x80) {
      ByteSet s{};
      for (const auto& [lo, hi] : ranges) add_range(s, lo, hi);
      return {Elem{Elem::Bytes, set_index(s)}};
    }
    Alts alts;
    for (const auto& [lo, hi] : ranges) {
      // Surrogates are no characters: leave U+D800..U+DFFF out.
      if (lo < 0xD800) utf8_ranges(lo, std::min<uint32_t>(hi, 0xD7FF), alts);
      if (hi > 0xDFFF) utf8_ranges(std::max<uint32_t>(lo, 0xE000), hi, alts);
    }
    return {Elem{Elem::Rule, anonymous(std::move(alts))}};
  }

  static std::vector<std::pair<uint32_t, uint32_t>> normalized(std::vector<std::pair<uint32_t, uint32_t>> r) {
    std::sort(r.begin(), r.end());
    std::vector<std::pair<uint32_t, uint32_t>> out;
    for (const auto& x : r) {
      if (!out.empty() && x.first <= out.back().second + 1) out.back().second = std::max(out.back().second, x.second);
      else out.push_back(x);
    }
    return out;
  }

  Seq parse_class() {
    ++pos_;  // '['
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    bool raw_bytes = false;
    while (true) {
      if (at_end() || text_[pos_] == '\n') fail("unterminated character class");
      if (text_[pos_] == ']') break;
      bool raw = false;
      const uint32_t lo = parse_char(raw);
      raw_bytes = raw_bytes || (raw && lo >= 0x80);
      uint32_t hi = lo;
      if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        if (peek() == '\n') fail("unterminated character class");
        hi = parse_char(raw);
        raw_bytes = raw_bytes || (raw && hi >= 0x80);
        if (hi < lo) fail("a character range whose end comes before its start");
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    if (raw_bytes) fail("\\x escapes past \\x7F in a character class (classes hold characters; write \\u)");
    ranges = normalized(std::move(ranges));
    if (negated) {
      std::vector<std::pair<uint32_t, uint32_t>> rest;
      uint32_t next = 0;
      for (const auto& [lo, hi] : ranges) {
        if (lo > next) rest.emplace_back(next, lo - 1);
        next = hi + 1;
      }
      if (next <= kMaxCodePoint) rest.emplace_back(next, kMaxCodePoint);
      ranges = std::move(rest);
    }
    return class_elems(std::move(ranges));
  }

  uint32_t parse_count() {
    const size_t start = pos_;
    uint64_t v = 0;
    while (!at_end() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
      if (v > kMaxRepeat) fail("a repetition count past " + std::to_string(kMaxRepeat));
    }
    if (pos_ == start) fail("expected a number in { }");
    return static_cast<uint32_t>(v);
  }

  // item{lo, hi} (hi = UINT32_MAX: unbounded) appended to seq, right-recursive (no left recursion).
  void repeat(Seq& seq, const Seq& item, uint32_t lo, uint32_t hi) {
    // Repetitions are what can make a short text a huge grammar: count what they write.
    const uint64_t bounded = hi == std::numeric_limits<uint32_t>::max() ? lo + 1 : hi;
    written_ += bounded * (item.size() + 2);
    if (written_ > kMaxWritten) fail("the grammar's repetitions come to more than " + std::to_string(kMaxWritten) + " elements");
    for (uint32_t k = 0; k < lo; ++k) seq.insert(seq.end(), item.begin(), item.end());
    if (hi == std::numeric_limits<uint32_t>::max()) {  // star ::= item star | ""
      const uint32_t star = anonymous({});
      Seq again = item;
      again.push_back(Elem{Elem::Rule, star});
      bodies_[star] = Alts{again, Seq{}};
      seq.push_back(Elem{Elem::Rule, star});
      return;
    }
    // opt_k ::= item opt_{k-1} | ""  (k = hi - lo ... 1)
    uint32_t inner = std::numeric_limits<uint32_t>::max();
    for (uint32_t k = lo; k < hi; ++k) {
      Seq more = item;
      if (inner != std::numeric_limits<uint32_t>::max()) more.push_back(Elem{Elem::Rule, inner});
      inner = anonymous(Alts{more, Seq{}});
    }
    if (inner != std::numeric_limits<uint32_t>::max()) seq.push_back(Elem{Elem::Rule, inner});
  }

  Seq parse_sequence(bool nested) {
    Seq seq;
    size_t last = 0;  // where the last item starts in seq
    bool have_last = false;
    while (true) {
      skip(nested);
      const char c = peek();
      if (c == '"') {
        last = seq.size();
        const Seq lit = parse_literal();
        seq.insert(seq.end(), lit.begin(), lit.end());
        have_last = true;
      } else if (c == '[') {
        last = seq.size();
        const Seq cls = parse_class();
        seq.insert(seq.end(), cls.begin(), cls.end());
        have_last = true;
      } else if (c == '.') {
        ++pos_;
        last = seq.size();
        const Seq any = class_elems({{0, kMaxCodePoint}});
        seq.insert(seq.end(), any.begin(), any.end());
        have_last = true;
      } else if (c == '(') {
        ++pos_;
        if (++nesting_ > kMaxNesting) fail("groups nested deeper than " + std::to_string(kMaxNesting) + " levels");
        skip(true);
        Alts body = parse_alternates(true);
        skip(true);
        if (peek() != ')') fail("expected ')'");
        ++pos_;
        --nesting_;
        last = seq.size();
        seq.push_back(Elem{Elem::Rule, anonymous(std::move(body))});
        have_last = true;
      } else if (name_char(c)) {
        last = seq.size();
        seq.push_back(Elem{Elem::Rule, rule(parse_name())});
        have_last = true;
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_last) fail(std::string("'") + c + "' with nothing before it to repeat");
        ++pos_;
        const Seq item(seq.begin() + static_cast<std::ptrdiff_t>(last), seq.end());
        seq.resize(last);
        uint32_t lo = 0, hi = std::numeric_limits<uint32_t>::max();
        if (c == '+') lo = 1;
        if (c == '?') hi = 1;
        if (c == '{') {
          skip(false);
          lo = parse_count();
          skip(false);
          hi = lo;
          if (peek() == ',') {
            ++pos_;
            skip(false);
            hi = peek() == '}' ? std::numeric_limits<uint32_t>::max() : parse_count();
            skip(false);
          }
          if (peek() != '}') fail("expected '}'");
          ++pos_;
          if (hi < lo) fail("a repetition {m,n} with n below m");
        }
        // A repeated item is one element, so that the repetition's rules hold it whole.
        const Seq one = item.size() == 1 ? item : Seq{Elem{Elem::Rule, anonymous(Alts{item})}};
        repeat(seq, one, lo, hi);
        have_last = false;
      } else {
        return seq;
      }
    }
  }

  Alts parse_alternates(bool nested) {
    Alts alts{parse_sequence(nested)};
    while (true) {
      if (peek() == '|') {
        ++pos_;
        skip(true);
        alts.push_back(parse_sequence(nested));
        continue;
      }
      // A rule may go on on the next line when that line starts with '|'.
      const size_t here = pos_;
      skip(true);
      if (!nested && peek() == '|') continue;
      if (!nested) pos_ = here;
      return alts;
    }
  }

  void check_left_recursion() const {
    const size_t R = bodies_.size();
    // Nullable rules (those that may match nothing), by a worklist: an alternative of rules only
    // waits for each of them; the last one found nullable makes its rule nullable. Linear in the
    // grammar's size, however its rules chain.
    std::vector<bool> nullable(R, false);
    std::vector<std::vector<uint32_t>> waiting(R);          // per rule, per alternative: rules not yet known nullable
    std::vector<std::vector<std::pair<uint32_t, uint32_t>>> users(R);  // rule -> (rule, alternative) that wait for it
    std::vector<uint32_t> found;
    for (size_t r = 0; r < R; ++r) {
      waiting[r].assign(bodies_[r].size(), 0);
      for (size_t a = 0; a < bodies_[r].size(); ++a) {
        const Seq& alt = bodies_[r][a];
        if (std::any_of(alt.begin(), alt.end(), [](const Elem& e) { return e.kind != Elem::Rule; })) {
          waiting[r][a] = std::numeric_limits<uint32_t>::max();
          continue;
        }
        for (const Elem& e : alt) users[e.arg].emplace_back(static_cast<uint32_t>(r), static_cast<uint32_t>(a));
        waiting[r][a] = static_cast<uint32_t>(alt.size());
        if (alt.empty() && !nullable[r]) {
          nullable[r] = true;
          found.push_back(static_cast<uint32_t>(r));
        }
      }
    }
    while (!found.empty()) {
      const uint32_t x = found.back();
      found.pop_back();
      for (const auto& [r, a] : users[x])
        if (--waiting[r][a] == 0 && !nullable[r]) {
          nullable[r] = true;
          found.push_back(r);
        }
    }
    // r -> s where s can be r's first step with nothing consumed; a tail step (s last in its
    // alternative) ends r's frame first, so a cycle of tail steps only (a repetition of an item
    // that may be empty: (a*)*) comes back to the same parse stack, which the matcher's
    // expansion sees and stops at. A cycle with any other step grows the stack forever: refused.
    struct Step {
      uint32_t to;
      bool tail;
    };
    std::vector<std::vector<Step>> left(R);
    for (size_t r = 0; r < R; ++r)
      for (const Seq& alt : bodies_[r])
        for (size_t j = 0; j < alt.size(); ++j) {
          const Elem& e = alt[j];
          if (e.kind != Elem::Rule) break;
          left[r].push_back({e.arg, j + 1 == alt.size()});
          if (!nullable[e.arg]) break;
        }
    // Strongly connected components (Tarjan's, with its recursion on a stack of its own: a chain
    // of many rules must not overflow the thread's), then any non-tail step inside one.
    std::vector<int64_t> index(R, -1), low(R, 0), comp(R, -1);
    std::vector<uint32_t> stack;
    std::vector<bool> on(R, false);
    int64_t counter = 0, comps = 0;
    struct Frame {
      uint32_t r;
      size_t next;  // the step of left[r] to look at next
    };
    std::vector<Frame> calls;
    auto enter = [&](uint32_t r) {
      index[r] = low[r] = counter++;
      stack.push_back(r);
      on[r] = true;
      calls.push_back({r, 0});
    };
    for (uint32_t root = 0; root < R; ++root) {
      if (index[root] >= 0) continue;
      enter(root);
      while (!calls.empty()) {
        Frame& f = calls.back();
        const uint32_t r = f.r;
        if (f.next < left[r].size()) {
          const uint32_t to = left[r][f.next++].to;
          if (index[to] < 0) enter(to);
          else if (on[to]) low[r] = std::min(low[r], index[to]);
          continue;
        }
        if (low[r] == index[r]) {
          uint32_t x;
          do {
            x = stack.back();
            stack.pop_back();
            on[x] = false;
            comp[x] = comps;
          } while (x != r);
          ++comps;
        }
        calls.pop_back();
        if (!calls.empty()) low[calls.back().r] = std::min(low[calls.back().r], low[r]);
      }
    }
    for (uint32_t r = 0; r < R; ++r)
      for (const Step& st : left[r])
        if (!st.tail && comp[st.to] == comp[r])
          throw std::invalid_argument("grammar: rule '" + shown_name(r == st.to ? r : st.to) + "' is left-recursive");
  }

  std::string shown_name(uint32_t r) const {
    for (const auto& [name, id] : ids_)
      if (id == r) return name[0] == '\x01' ? "(a group or repetition)" : name;
    return "?";
  }

  static constexpr uint64_t kMaxWritten = 1 << 20;
  static constexpr int kMaxNesting = 256;  // ( groups ) inside one another: the parser recurses per level
  uint64_t written_ = 0;
  int nesting_ = 0;
  std::string_view text_;
  size_t pos_ = 0;
  std::map<std::string, uint32_t> ids_;
  std::vector<Alts> bodies_;
  std::vector<bool> defined_;
  std::vector<size_t> first_seen_;  // where each rule's name first came (its line in errors)
  std::vector<ByteSet> sets_;
  std::map<ByteSet, uint32_t> set_ids_;
};

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf) { return GrammarBuilder(gbnf).build(); }

// --- GBNF written around another grammar ---------------------------------------------------------

std::string gbnf_with_root_renamed(std::string_view gbnf, std::string_view name) {
  auto name_char = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  };
  std::string out;
  out.reserve(gbnf.size() + 16);
  size_t i = 0;
  // Copies a literal or a class whole, escapes included (a bad one stays bad: the parse says where).
  auto quoted = [&](char close) {
    out += gbnf[i++];
    while (i < gbnf.size() && gbnf[i] != close && gbnf[i] != '\n') {
      if (gbnf[i] == '\\' && i + 1 < gbnf.size()) out += gbnf[i++];
      out += gbnf[i++];
    }
    if (i < gbnf.size() && gbnf[i] == close) out += gbnf[i++];
  };
  while (i < gbnf.size()) {
    const char c = gbnf[i];
    if (c == '"') {
      quoted('"');
    } else if (c == '[') {
      quoted(']');
    } else if (c == '#') {
      while (i < gbnf.size() && gbnf[i] != '\n') out += gbnf[i++];
    } else if (name_char(c)) {
      const size_t start = i;
      while (i < gbnf.size() && name_char(gbnf[i])) ++i;
      const std::string_view word = gbnf.substr(start, i - start);
      out += word == "root" ? name : word;
    } else {
      out += gbnf[i++];
    }
  }
  return out;
}

namespace {

std::vector<uint32_t> code_points_of(std::string_view text, const char* what) {
  std::vector<uint32_t> out;
  for (size_t pos = 0; pos < text.size();) {
    const std::optional<uint32_t> cp = utf8::decode(text, pos);
    if (!cp) throw std::invalid_argument(std::string(what) + " is not UTF-8");
    out.push_back(*cp);
  }
  return out;
}

std::string escaped(uint32_t cp) {  // one code point as a GBNF escape, in a literal or a class
  char hex[11];
  std::snprintf(hex, sizeof hex, "\\U%08X", cp);
  return hex;
}

}  // namespace

std::string gbnf_text_through(std::string_view prefix, std::string_view marker, std::string_view then, bool may_end) {
  const std::vector<uint32_t> m = code_points_of(marker, "gbnf_text_through: the marker");
  if (m.empty()) throw std::invalid_argument("gbnf_text_through: an empty marker");
  std::vector<uint32_t> distinct = m;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  auto state = [&](size_t i) { return std::string(prefix) + "-" + std::to_string(i); };
  // State i: the text ends with the marker's first i characters (and holds no whole marker). After
  // character c, the longest start of the marker the text then ends with (Knuth-Morris-Pratt's
  // automaton, found directly: markers are short).
  auto next = [&](size_t i, uint32_t c) {
    std::vector<uint32_t> seen(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(i));
    seen.push_back(c);
    for (size_t k = seen.size(); k > 0; --k)
      if (std::equal(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(k), seen.end() - static_cast<std::ptrdiff_t>(k)))
        return k;
    return size_t{0};
  };
  std::string others = "[^";
  for (const uint32_t c : distinct) others += escaped(c);
  others += "]";
  std::string out;
  for (size_t i = 0; i < m.size(); ++i) {
    out += state(i) + " ::= " + others + " " + state(0) + (may_end ? " | \"\"" : "");
    for (const uint32_t c : distinct) {
      const size_t j = next(i, c);
      out += " | \"" + escaped(c) + "\" " + (j == m.size() ? std::string(then) : state(j));
    }
    out += "\n";
  }
  return out;
}

std::string gbnf_fresh_prefix(std::string_view gbnf, std::string_view base) {
  std::string prefix(base);
  while (gbnf.find(prefix) != std::string_view::npos) prefix += "_";
  return prefix;
}

std::string gbnf_lazy(std::string_view gbnf, std::string_view trigger) {
  const std::string prefix = gbnf_fresh_prefix(gbnf, "lazy");
  const std::string after = prefix + "-after";
  return gbnf_with_root_renamed(gbnf, after) + "\n" + gbnf_text_through(prefix, trigger, after, true) + "root ::= " + prefix + "-0\n";
}

std::string gbnf_after_block(std::string_view gbnf, std::string_view open, std::string_view close, bool opened) {
  const std::string prefix = gbnf_fresh_prefix(gbnf, "block");
  const std::string answer = prefix + "-answer";
  std::string out = gbnf_with_root_renamed(gbnf, answer);
  out += "\n" + gbnf_text_through(prefix, close, answer);
  if (opened) {
    out += "root ::= " + prefix + "-0\n";
  } else {
    std::string literal = "\"";
    for (const uint32_t c : code_points_of(open, "gbnf_after_block: the opening marker")) literal += escaped(c);
    literal += "\"";
    out += "root ::= [ \\t\\n\\r]{0,20} " + literal + " " + prefix + "-0 | " + answer + "\n";
  }
  return out;
}

// --- The matcher ---------------------------------------------------------------------------------

struct GrammarMatcher::StateData {
  std::vector<std::vector<uint32_t>> stacks;  // sorted; an empty stack: the grammar may end here
  bool accepting = false;
  std::unique_ptr<std::array<State, 256>> next;  // byte transitions, made on first use
  std::vector<uint64_t> allowed;                 // the token mask, made on first use (bit v: v may follow)
  bool masked = false;
  bool any_allowed = false;
};

namespace {
constexpr GrammarMatcher::State kUnknown = std::numeric_limits<GrammarMatcher::State>::max();
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  states_.push_back(std::make_unique<StateData>());  // kDead: no stacks
  states_.push_back(std::make_unique<StateData>());  // kOverLimit: none either
  std::vector<std::vector<uint32_t>> roots;
  const auto& elems = grammar_->elems();
  for (const uint32_t a : grammar_->alts()[grammar_->root()]) {
    std::vector<uint32_t> st;
    if (elems[a].kind != Grammar::Elem::End) st.push_back(a);
    roots.push_back(std::move(st));
  }
  std::lock_guard lock(mu_);
  start_ = expand_and_intern_locked(std::move(roots));
  if (start_ == kOverLimit)
    throw std::invalid_argument("grammar: more than " + std::to_string(kMaxStacks) +
                                " ways to parse its start, or too much work to find them (a grammar this ambiguous is refused)");
  if (start_ == kDead) throw std::invalid_argument("grammar: it matches nothing");
}

GrammarMatcher::~GrammarMatcher() = default;

// Moves the stacks' top rule references into their alternatives until a byte set (or nothing) is on
// top, and interns the stacks that result. Each stack met is expanded once: one reached again, by
// another route or round a cycle of empty steps (a repetition of an item that may be empty), adds
// nothing new, so the work is bounded by the distinct stacks and never by the routes to them
// (("" | ""){0,60} has 2^60). Past kMaxStacks results or kMaxExpandWork stack elements looked at,
// the state is kOverLimit.
GrammarMatcher::State GrammarMatcher::expand_and_intern_locked(std::vector<std::vector<uint32_t>> work) const {
  const auto& elems = grammar_->elems();
  Stacks out, seen;
  size_t spent = 0;
  while (!work.empty()) {
    std::vector<uint32_t> stack = std::move(work.back());
    work.pop_back();
    if (stack.size() > kMaxStackDepth) continue;  // nested past the limit: this parse is dropped
    spent += stack.size() + 1;
    if (spent > kMaxExpandWork) return kOverLimit;
    if (stack.empty() || elems[stack.back()].kind == Grammar::Elem::Bytes) {
      out.insert(std::move(stack));
      if (out.size() > kMaxStacks) return kOverLimit;
      continue;
    }
    if (!seen.insert(stack).second) continue;
    const uint32_t p = stack.back();
    stack.pop_back();
    if (elems[p + 1].kind != Grammar::Elem::End) stack.push_back(p + 1);
    for (const uint32_t a : grammar_->alts()[elems[p].arg]) {
      std::vector<uint32_t> alt = stack;
      if (elems[a].kind != Grammar::Elem::End) alt.push_back(a);
      work.push_back(std::move(alt));
    }
  }
  return intern_locked(std::move(out));
}

GrammarMatcher::State GrammarMatcher::intern_locked(Stacks set) const {
  if (set.empty()) return kDead;
  std::vector<std::vector<uint32_t>> stacks(std::make_move_iterator(set.begin()), std::make_move_iterator(set.end()));
  std::string key;
  size_t elements = 0;
  for (const auto& st : stacks) {
    for (const uint32_t p : st) key.append(reinterpret_cast<const char*>(&p), sizeof p);
    const uint32_t sep = kUnknown;
    key.append(reinterpret_cast<const char*>(&sep), sizeof sep);
    elements += st.size() + 8;  // and its vector's header and allocation, about 8 elements' worth
  }
  if (const auto it = ids_.find(key); it != ids_.end()) return it->second;
  // Bounded memory: the states' stacks are held twice (as stacks and as the key). (A state's own
  // few hundred bytes, its transitions and its map entry, are bounded by kMaxStates.)
  if (states_.size() >= kMaxStates || held_ + elements > kMaxHeldElements) {
    full_ = true;
    return kOverLimit;
  }
  held_ += elements;
  auto d = std::make_unique<StateData>();
  d->accepting = stacks.front().empty();
  d->stacks = std::move(stacks);
  const auto id = static_cast<State>(states_.size());
  states_.push_back(std::move(d));
  ids_.emplace(std::move(key), id);
  return id;
}

GrammarMatcher::State GrammarMatcher::step_locked(State s, uint8_t byte) const {
  if (s == kDead || s == kOverLimit) return s;
  StateData& d = *states_[s];
  if (!d.next) {
    d.next = std::make_unique<std::array<State, 256>>();
    d.next->fill(kUnknown);
  }
  State& t = (*d.next)[byte];
  if (t != kUnknown) return t;
  std::vector<std::vector<uint32_t>> moved;
  const auto& elems = grammar_->elems();
  for (const auto& st : d.stacks) {
    if (st.empty()) continue;
    const uint32_t p = st.back();
    if (!grammar_->in_set(elems[p].arg, byte)) continue;
    std::vector<uint32_t> m(st.begin(), st.end() - 1);
    if (elems[p + 1].kind != Grammar::Elem::End) m.push_back(p + 1);
    moved.push_back(std::move(m));
  }
  const State next = expand_and_intern_locked(std::move(moved));
  (*states_[s]->next)[byte] = next;  // states_ may have grown: index again
  return next;
}

GrammarMatcher::State GrammarMatcher::feed(State s, std::string_view bytes) const {
  std::lock_guard lock(mu_);
  for (const char c : bytes) {
    s = step_locked(s, static_cast<uint8_t>(c));
    if (s == kDead || s == kOverLimit) break;
  }
  return s;
}

GrammarMatcher::State GrammarMatcher::after(State s, int32_t v) const {
  if (s == kOverLimit) return kOverLimit;
  if (s == kDead || v < 0 || v >= vocabulary_->size()) return kDead;
  std::lock_guard lock(mu_);
  const uint64_t key = uint64_t{s} << 32 | static_cast<uint32_t>(v);
  if (const auto it = token_next_.find(key); it != token_next_.end()) return it->second;
  State t = kDead;
  const std::string& bytes = vocabulary_->bytes(v);
  if (!bytes.empty()) {
    t = s;
    for (const char c : bytes) {
      t = step_locked(t, static_cast<uint8_t>(c));
      if (t == kDead || t == kOverLimit) break;
    }
  }
  if (token_next_.size() >= kMaxTokenSteps) token_next_.clear();  // bounded memory: start the cache over
  token_next_.emplace(key, t);
  return t;
}

bool GrammarMatcher::accepting(State s) const {
  std::lock_guard lock(mu_);
  return states_[s]->accepting;
}

size_t GrammarMatcher::states() const {
  std::lock_guard lock(mu_);
  return states_.size();
}

bool GrammarMatcher::full() const {
  std::lock_guard lock(mu_);
  return full_;
}

const GrammarMatcher::StateData& GrammarMatcher::masked_locked(State s) const {
  if (states_[s]->masked) return *states_[s];
  if (masks_ >= kMaxMasks) {  // bounded memory: start the cache over
    for (auto& d : states_)
      if (d->masked) d->allowed = std::vector<uint64_t>(), d->masked = false;
    masks_ = 0;
  }
  ++masks_;
  const size_t V = static_cast<size_t>(vocabulary_->size());
  std::vector<uint64_t> allowed((V + 63) / 64, 0);
  bool any = false;
  if (s != kDead && s != kOverLimit) {
    const auto& nodes = vocabulary_->nodes();
    const auto& tokens = vocabulary_->tokens();
    std::vector<std::pair<uint32_t, State>> work{{0, s}};
    while (!work.empty()) {
      const auto [n, cur] = work.back();
      work.pop_back();
      for (uint32_t c = nodes[n].child_begin; c < nodes[n].child_end; ++c) {
        const State t = step_locked(cur, nodes[c].byte);
        if (t == kDead) continue;
        // A token into kOverLimit stays: the output meets the limit there and ends with an error,
        // rather than the mask narrowing silently to the tokens whose states fit.
        for (uint32_t k = nodes[c].token_begin; k < nodes[c].token_end; ++k) {
          const auto v = static_cast<size_t>(tokens[k]);
          allowed[v >> 6] |= uint64_t{1} << (v & 63);
          any = true;
        }
        if (t != kOverLimit && nodes[c].child_begin < nodes[c].child_end) work.emplace_back(c, t);
      }
    }
  }
  StateData& d = *states_[s];
  d.allowed = std::move(allowed);
  d.any_allowed = any;
  d.masked = true;
  return d;
}

namespace {
bool any_stop_in(std::span<const int32_t> stop_ids, size_t V) {
  return std::any_of(stop_ids.begin(), stop_ids.end(), [&](int32_t t) { return t >= 0 && static_cast<size_t>(t) < V; });
}
}  // namespace

bool GrammarMatcher::keeps_locked(const StateData& d, int32_t v, std::span<const int32_t> stop_ids, bool stops_allowed) const {
  if (!d.any_allowed && !any_stop_in(stop_ids, static_cast<size_t>(vocabulary_->size())))
    return v >= 0 && v < vocabulary_->size();  // nothing would remain: the row is left as it is (mask())
  for (const int32_t t : stop_ids)
    if (t == v) return (d.accepting && stops_allowed) || !d.any_allowed;
  if (v < 0 || v >= vocabulary_->size()) return false;
  const auto at = static_cast<size_t>(v);
  return (d.allowed[at >> 6] >> (at & 63)) & 1;
}

bool GrammarMatcher::complete(State s) const {
  if (s == kDead || s == kOverLimit) return false;
  std::lock_guard lock(mu_);
  const StateData& d = masked_locked(s);
  return d.accepting && !d.any_allowed;
}

bool GrammarMatcher::keeps(State s, int32_t v, std::span<const int32_t> stop_ids, bool stops_allowed) const {
  std::lock_guard lock(mu_);
  return keeps_locked(masked_locked(s), v, stop_ids, stops_allowed);
}

void GrammarMatcher::mask(State s, std::span<float> row, std::span<const int32_t> stop_ids, bool stops_allowed) const {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::lock_guard lock(mu_);
  const StateData& d = masked_locked(s);
  // Where no token and no stop token would remain (a row after a draft token the grammar refuses,
  // which is never judged; or a grammar that has ended where no stop token may end the text),
  // the row is left as it is rather than emptied.
  if (!d.any_allowed && !any_stop_in(stop_ids, std::min(row.size(), static_cast<size_t>(vocabulary_->size())))) return;
  // A stop token is a stop, whatever its bytes: kept only where the output may end, and then
  // as it was.
  const bool stops = (d.accepting && stops_allowed) || !d.any_allowed;
  std::vector<std::pair<size_t, float>> kept;
  for (const int32_t t : stop_ids)
    if (t >= 0 && static_cast<size_t>(t) < row.size()) kept.emplace_back(static_cast<size_t>(t), row[static_cast<size_t>(t)]);
  const size_t V = std::min(row.size(), static_cast<size_t>(vocabulary_->size()));
  for (size_t w = 0; w * 64 < V; ++w) {
    const uint64_t bits = d.allowed[w];
    if (bits == ~uint64_t{0}) continue;
    const size_t end = std::min(V, w * 64 + 64);
    for (size_t v = w * 64; v < end; ++v)
      if (!((bits >> (v - w * 64)) & 1)) row[v] = kNegInf;
  }
  for (size_t v = V; v < row.size(); ++v) row[v] = kNegInf;
  for (const auto& [v, x] : kept) row[v] = stops ? x : kNegInf;
}

}  // namespace specula
