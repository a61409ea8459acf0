// JSON mode (OpenAI's response_format {"type": "json_object"}): the output is one JSON object.
// The request's rows are masked, as its penalties adjust them (spec/penalties.h), to the tokens
// whose bytes keep the output a prefix of a JSON object (RFC 8259), then to its stop tokens once
// the object is closed. Speculation stays exact: the masked row is the target's distribution the
// verifier judges against, whatever the draft proposed (a token outside the mask has p = 0 and is
// rejected; the residual never proposes one).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace specula {

class Tokenizer;

// The grammar's state after a prefix, byte by byte; a few bytes, copied freely.
struct JsonState {
  enum Mode : uint8_t {
    Start,        // before the object: whitespace or '{'
    KeyOrClose,   // after '{': whitespace, '"' or '}'
    Key,          // after ',' in an object: whitespace or '"'
    Colon,        // after a key: whitespace or ':'
    Value,        // after ':' or ',' in an array: whitespace or a value
    ValueOrClose, // after '[': whitespace, a value or ']'
    After,        // after a value: whitespace, ',' or the container's close
    String,       // inside a string (sub: 1 for a key)
    Escape,       // after '\' in a string
    Unicode,      // in \uXXXX (sub: hex digits still to come)
    Literal,      // in true / false / null (sub: which, and how far)
    Minus,        // after '-': a digit
    Zero,         // a number's leading 0
    Int,          // its integer digits
    Point,        // after '.': a digit
    Frac,         // fraction digits
    Exp,          // after 'e': sign or digit
    ExpSign,      // after the exponent's sign: a digit
    ExpDigits,    // exponent digits
    Done,         // the object is closed: only whitespace
    Dead,         // a byte no JSON object continues with
  };
  uint64_t stack = 0;   // bit d: container d (from the outermost) is an object
  uint8_t depth = 0;    // open containers
  Mode mode = Start;
  uint8_t sub = 0;
  uint8_t ws = 0;       // whitespace bytes in a row (more than kMaxWhitespace is refused)
  // Inside a string, a UTF-8 character begun: its bytes still to come, and the range the next
  // one must fall in (Unicode's table of well-formed sequences: no overlong forms, surrogates or
  // code points past U+10FFFF).
  uint8_t utf8_left = 0, utf8_lo = 0x80, utf8_hi = 0xBF;

  static constexpr int kMaxDepth = 64;
  static constexpr int kMaxWhitespace = 32;

  // The state after one more byte (Dead if no JSON object continues so).
  JsonState feed(uint8_t byte) const;
  JsonState feed(std::string_view bytes) const;
  bool dead() const { return mode == Dead; }
  bool done() const { return mode == Done; }
};

// The vocabulary as JSON mode reads it: each token's bytes, with what lets most tokens be judged
// without feeding them byte by byte. Built once per tokenizer (Engine::json_vocabulary).
class JsonVocabulary {
 public:
  explicit JsonVocabulary(const Tokenizer& tokenizer);
  // Token v's bytes at token_bytes[v]; an empty string stands for a special token (tests).
  explicit JsonVocabulary(std::vector<std::string> token_bytes);
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  // Whether token v may come next after state s (special tokens never; stop tokens are the
  // caller's).
  bool allows(const JsonState& s, int32_t v) const;
  JsonState after(const JsonState& s, int32_t v) const;
  // Whether mask() keeps token v after s (a drafter's few tokens, without a whole row).
  bool keeps(const JsonState& s, int32_t v, std::span<const int32_t> stop_ids, bool stops_allowed) const;
  // Writes -inf into `row` (one vocabulary-wide row) for every token that may not follow s; once
  // s is done (or dead) only whitespace tokens and, when `stops_allowed`, `stop_ids` stay. Before
  // that the stop tokens are masked too.
  void mask(const JsonState& s, std::span<float> row, std::span<const int32_t> stop_ids, bool stops_allowed) const;

 private:
  void classify();  // kind_ from bytes_ (an empty token: special)
  std::vector<std::string> bytes_;
  std::vector<uint8_t> kind_;  // kPlain | kBlank | kSpecial
  std::vector<uint8_t> after_blank_;  // the first byte after the token's leading whitespace (0: none, or none leading)
};

}  // namespace specula
