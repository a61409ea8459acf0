// JSON mode's grammar and masks (spec/json_mode.h).
#include "spec/json_mode.h"

#include <limits>

#include "model/tokenizer.h"

namespace specula {

namespace {

constexpr uint8_t kPlain = 1;    // ASCII that may sit inside a string as it is (no '"', '\', control byte)
constexpr uint8_t kBlank = 2;    // whitespace only
constexpr uint8_t kSpecial = 4;  // a special token (never JSON text)

bool blank(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool hex(uint8_t c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

constexpr std::string_view kLiterals[3] = {"true", "false", "null"};

JsonState refused() {
  JsonState d;
  d.mode = JsonState::Dead;
  return d;
}

}  // namespace

JsonState JsonState::feed(uint8_t c) const {
  JsonState s = *this;
  if (blank(c) && mode != String && mode != Escape && mode != Unicode && mode != Literal && mode != Minus &&
      mode != Point && mode != Exp && mode != ExpSign) {
    if (mode == Zero || mode == Int || mode == Frac || mode == ExpDigits) s.mode = After;  // the number ends
    if (s.mode == Done) return s;
    if (s.mode == Dead || s.ws >= kMaxWhitespace) return refused();
    ++s.ws;
    return s;
  }
  s.ws = 0;
  const bool in_object = depth > 0 && ((stack >> (depth - 1)) & 1);
  auto open = [&](bool object) -> JsonState {
    if (s.depth >= kMaxDepth) return refused();
    if (object)
      s.stack |= uint64_t{1} << s.depth;
    else
      s.stack &= ~(uint64_t{1} << s.depth);
    ++s.depth;
    s.mode = object ? KeyOrClose : ValueOrClose;
    return s;
  };
  auto close = [&](bool object) -> JsonState {
    if (s.depth == 0 || (((s.stack >> (s.depth - 1)) & 1) != 0) != object) return refused();
    --s.depth;
    s.mode = s.depth == 0 ? Done : After;
    return s;
  };
  auto value = [&]() -> JsonState {
    switch (c) {
      case '{': return open(true);
      case '[': return open(false);
      case '"': s.mode = String, s.sub = 0; return s;
      case '-': s.mode = Minus; return s;
      case '0': s.mode = Zero; return s;
      case 't': s.mode = Literal, s.sub = 0 << 4 | 1; return s;
      case 'f': s.mode = Literal, s.sub = 1 << 4 | 1; return s;
      case 'n': s.mode = Literal, s.sub = 2 << 4 | 1; return s;
      default:
        if (digit(c)) {
          s.mode = Int;
          return s;
        }
        return refused();
    }
  };
  auto after = [&]() -> JsonState {  // a value has ended: c follows it
    switch (c) {
      case ',': s.mode = in_object ? Key : Value; return s;
      case '}': return close(true);
      case ']': return close(false);
      default: return refused();
    }
  };
  switch (mode) {
    case Start: return c == '{' ? open(true) : refused();
    case KeyOrClose:
      if (c == '}') return close(true);
      [[fallthrough]];
    case Key:
      if (c != '"') return refused();
      s.mode = String, s.sub = 1;
      return s;
    case Colon:
      if (c != ':') return refused();
      s.mode = Value;
      return s;
    case ValueOrClose:
      if (c == ']') return close(false);
      return value();
    case Value: return value();
    case After: return after();
    case String:
      if (utf8_left > 0) {  // a character's next byte
        if (c < utf8_lo || c > utf8_hi) return refused();
        --s.utf8_left, s.utf8_lo = 0x80, s.utf8_hi = 0xBF;
        return s;
      }
      if (c >= 0x80) {  // a character's first byte
        if (c >= 0xC2 && c <= 0xDF) s.utf8_left = 1;
        else if (c >= 0xE0 && c <= 0xEF) s.utf8_left = 2;
        else if (c >= 0xF0 && c <= 0xF4) s.utf8_left = 3;
        else return refused();
        if (c == 0xE0) s.utf8_lo = 0xA0;
        if (c == 0xED) s.utf8_hi = 0x9F;
        if (c == 0xF0) s.utf8_lo = 0x90;
        if (c == 0xF4) s.utf8_hi = 0x8F;
        return s;
      }
      if (c == '"') {
        s.mode = (sub & 1) ? Colon : After;
        s.sub = 0;
        return s;
      }
      if (c == '\\') {
        s.mode = Escape;
        return s;
      }
      return c < 0x20 ? refused() : s;
    case Escape:
      if (c == 'u') {
        s.mode = Unicode, s.sub = static_cast<uint8_t>((sub & 1) | 4 << 1);
        return s;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        s.mode = String;
        return s;
      }
      return refused();
    case Unicode: {
      if (!hex(c)) return refused();
      const int left = (sub >> 1) - 1;
      s.sub = static_cast<uint8_t>((sub & 1) | left << 1);
      if (left == 0) s.mode = String;
      return s;
    }
    case Literal: {
      const std::string_view word = kLiterals[sub >> 4];
      const size_t at = sub & 15;
      if (c != static_cast<uint8_t>(word[at])) return refused();
      if (at + 1 == word.size()) {
        s.mode = After, s.sub = 0;
      } else {
        s.sub = static_cast<uint8_t>(sub + 1);
      }
      return s;
    }
    case Minus:
      if (c == '0') s.mode = Zero;
      else if (digit(c)) s.mode = Int;
      else return refused();
      return s;
    case Zero:
    case Int:
    case Frac:
      if (digit(c) && mode != Zero) return s;
      if (c == '.' && mode != Frac) {
        s.mode = Point;
        return s;
      }
      if (c == 'e' || c == 'E') {
        s.mode = Exp;
        return s;
      }
      return after();
    case Point:
      if (!digit(c)) return refused();
      s.mode = Frac;
      return s;
    case Exp:
      if (c == '+' || c == '-') s.mode = ExpSign;
      else if (digit(c)) s.mode = ExpDigits;
      else return refused();
      return s;
    case ExpSign:
      if (!digit(c)) return refused();
      s.mode = ExpDigits;
      return s;
    case ExpDigits:
      if (digit(c)) return s;
      return after();
    case Done:
    case Dead: return refused();
  }
  return refused();
}

JsonState JsonState::feed(std::string_view bytes) const {
  JsonState s = *this;
  for (const char c : bytes) {
    s = s.feed(static_cast<uint8_t>(c));
    if (s.dead()) break;
  }
  return s;
}

JsonVocabulary::JsonVocabulary(const Tokenizer& tokenizer) {
  const int32_t V = tokenizer.vocab_size();
  bytes_.resize(static_cast<size_t>(V));
  for (int32_t v = 0; v < V; ++v)
    if (!tokenizer.is_special(v)) bytes_[static_cast<size_t>(v)] = tokenizer.token_bytes(v);
  classify();
}

JsonVocabulary::JsonVocabulary(std::vector<std::string> token_bytes) : bytes_(std::move(token_bytes)) { classify(); }

void JsonVocabulary::classify() {
  kind_.assign(bytes_.size(), 0);
  after_blank_.assign(bytes_.size(), 0);
  for (size_t at = 0; at < bytes_.size(); ++at) {
    if (bytes_[at].empty()) {  // a special token, or nothing to feed: never JSON text
      kind_[at] = kSpecial;
      continue;
    }
    bool plain = true, all_blank = true;
    for (const char ch : bytes_[at]) {
      const auto c = static_cast<uint8_t>(ch);
      plain = plain && c >= 0x20 && c < 0x80 && c != '"' && c != '\\';
      all_blank = all_blank && blank(c);
    }
    kind_[at] = static_cast<uint8_t>((plain ? kPlain : 0) | (all_blank ? kBlank : 0));
    const size_t lead = bytes_[at].find_first_not_of(" \t\n\r");
    if (lead != std::string::npos && lead > 0) after_blank_[at] = static_cast<uint8_t>(bytes_[at][lead]);
  }
}

bool JsonVocabulary::allows(const JsonState& s, int32_t v) const { return !after(s, v).dead(); }

JsonState JsonVocabulary::after(const JsonState& s, int32_t v) const {
  const auto at = static_cast<size_t>(v);
  if (v < 0 || at >= bytes_.size() || (kind_[at] & kSpecial)) return refused();
  if (s.mode == JsonState::String && s.utf8_left == 0 && (kind_[at] & kPlain)) return s;
  return s.feed(bytes_[at]);
}

bool JsonVocabulary::keeps(const JsonState& s, int32_t v, std::span<const int32_t> stop_ids, bool stops_allowed) const {
  const bool closed = s.done() || s.dead();
  for (const int32_t t : stop_ids)
    if (t == v) return closed && stops_allowed;
  if (v < 0 || static_cast<size_t>(v) >= bytes_.size()) return false;
  if (closed) return (kind_[static_cast<size_t>(v)] & kBlank) != 0;
  return allows(s, v);
}

void JsonVocabulary::mask(const JsonState& s, std::span<float> row, std::span<const int32_t> stop_ids,
                          bool stops_allowed) const {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t V = std::min(row.size(), bytes_.size());
  // Which first bytes can follow s; a token is fed in full only when its first byte can.
  bool first[256];
  for (int b = 0; b < 256; ++b) first[b] = !s.dead() && !s.feed(static_cast<uint8_t>(b)).dead();
  // And which can follow whitespace there (outside strings whitespace moves only the run's count):
  // " the" after a value is refused at 't' without being fed.
  bool after_blank[256];
  const JsonState blank1 = s.feed(static_cast<uint8_t>(' '));
  for (int b = 0; b < 256; ++b) after_blank[b] = !blank1.dead() && !blank1.feed(static_cast<uint8_t>(b)).dead();
  const bool structural = !s.done() && !s.dead() && s.mode != JsonState::String;
  auto is_stop = [&](size_t v) {
    for (const int32_t t : stop_ids)
      if (static_cast<size_t>(t) == v) return true;
    return false;
  };
  for (size_t v = 0; v < V; ++v) {
    // Quick refusals while the object is open (a special token, a first byte that cannot come, or
    // a first byte that cannot come after whitespace); keeps() decides the rest.
    const bool refused = !s.done() && !s.dead() && !is_stop(v) &&
                         ((kind_[v] & kSpecial) || !first[static_cast<uint8_t>(bytes_[v][0])] ||
                          (structural && after_blank_[v] != 0 && !after_blank[after_blank_[v]]));
    const bool keep = !refused && keeps(s, static_cast<int32_t>(v), stop_ids, stops_allowed);
    if (!keep) row[v] = kNegInf;
  }
}

}  // namespace specula
