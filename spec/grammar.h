// Grammar-constrained output: a context-free grammar over the output's bytes, written in GBNF
// (llama.cpp's grammar format), masks each row to the tokens whose bytes keep the output a prefix
// of a sentence of the grammar, and to the request's stop tokens once the grammar may end there.
// JSON Schema (spec/json_schema.h) and OpenAI's strict structured outputs compile to it.
//
// As with JSON mode (spec/json_mode.h) and the penalties, the mask is one more adjustment of a
// row that reads the output before it (spec/penalties.h), so speculation stays exact: row i of a
// round is masked by the output plus the round's drafts t1..ti, which is the mask target-only
// sampling would use wherever that row is judged.
//
// The matcher is a pushdown automaton determinized lazily: a state is the set of parse stacks
// after a prefix, interned as it is first met, with its byte transitions and its token mask
// cached. Inside a long string, a number or a repeated element the output comes back to the same
// state, so a mask is computed once per state (a walk of the vocabulary's trie) and reused.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace specula {

class Tokenizer;

// The vocabulary's tokens as a trie of their bytes (special tokens left out: never grammar text).
class TokenTrie {
 public:
  explicit TokenTrie(const Tokenizer& tokenizer);
  // Token v's bytes at token_bytes[v]; an empty string stands for a special token.
  explicit TokenTrie(std::vector<std::string> token_bytes);
  int64_t size() const { return static_cast<int64_t>(bytes_.size()); }
  const std::string& bytes(int32_t v) const { return bytes_[static_cast<size_t>(v)]; }  // "" for a special token

  struct Node {
    uint32_t child_begin = 0, child_end = 0;  // children, contiguous in nodes()
    uint32_t token_begin = 0, token_end = 0;  // the tokens whose bytes end here, in tokens()
    uint8_t byte = 0;                         // the edge from the parent
  };
  const std::vector<Node>& nodes() const { return nodes_; }  // nodes()[0]: the root
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  void build();
  std::vector<std::string> bytes_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
};

// A context-free grammar over bytes. GBNF as llama.cpp reads it:
//   rule-name ::= alternative | alternative ...     (one rule per line; `|`, `(`...`)` may span lines)
//   "literal" with \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH escapes, [a-z_] and [^"\\] classes of
//   Unicode code points (matched as their UTF-8 bytes), `.` any code point, rule names,
//   ( groups ), and x*  x+  x?  x{m}  x{m,}  x{m,n} repetition; # comments.
// The start rule is `root`. Left recursion, undefined rules and counts past 10,000 are refused
// (a repetition of an item that may be empty, (x?)*, is not left recursion: it is kept).
class Grammar {
 public:
  // Throws std::invalid_argument naming the line and what is wrong.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf);

  struct Elem {
    enum Kind : uint8_t { End, Bytes, Rule } kind = End;
    uint32_t arg = 0;  // Bytes: the set's index in sets(); Rule: the rule
  };
  // Every alternative of every rule, back to back, each closed by End.
  const std::vector<Elem>& elems() const { return elems_; }
  // alts()[r]: where rule r's alternatives start in elems().
  const std::vector<std::vector<uint32_t>>& alts() const { return alts_; }
  bool in_set(uint32_t set, uint8_t byte) const { return (sets_[set][byte >> 6] >> (byte & 63)) & 1; }
  uint32_t root() const { return root_; }

 private:
  friend class GrammarBuilder;
  std::vector<Elem> elems_;
  std::vector<std::vector<uint32_t>> alts_;
  std::vector<std::array<uint64_t, 4>> sets_;
  uint32_t root_ = 0;
};

// A grammar over one vocabulary. Thread-safe: its caches are shared by the actors that mask rows,
// advance the output and draft, under one lock.
class GrammarMatcher {
 public:
  using State = uint32_t;
  static constexpr State kDead = 0;  // no sentence of the grammar continues so
  // The grammar needs more than this matcher's limits allow to go on (kMaxStates states, or their
  // stacks past kMaxHeldElements, or one step past kMaxStacks or kMaxExpandWork): masked as kDead,
  // so the output can only stop, and a request that meets it ends with an error (actors/sampler).
  static constexpr State kOverLimit = 1;

  // Throws std::invalid_argument where the grammar matches nothing or its start is past the limits.
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> vocabulary);
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  State start() const { return start_; }
  State feed(State s, std::string_view bytes) const;
  // The state after token v's bytes (kDead for a special token or one the grammar refuses).
  State after(State s, int32_t v) const;
  // The grammar may end after s (the output is a whole sentence).
  bool accepting(State s) const;
  // The grammar has ended after s: s is accepting and no token may follow it (only a stop token).
  bool complete(State s) const;
  // Whether mask() keeps token v after s (a drafter's few tokens, without a whole row).
  bool keeps(State s, int32_t v, std::span<const int32_t> stop_ids, bool stops_allowed) const;
  // Writes -inf into `row` for every token that may not follow s. The stop tokens stay where s
  // is accepting and `stops_allowed` (min_tokens reached), and wherever nothing else may come
  // (the grammar has ended, or s is dead: a row after a refused draft, never judged). Where not
  // even a stop token would stay (no stop tokens: ignore_eos), the row is left as it is: a row
  // after a refused draft, or after the grammar's end, where the request has already finished
  // (FinishRule::after with complete()).
  void mask(State s, std::span<float> row, std::span<const int32_t> stop_ids, bool stops_allowed) const;
  // States met so far (a grammar whose states pass kMaxStates stops growing: new ones are kOverLimit).
  size_t states() const;
  // Some state came out kOverLimit: this matcher is spent for new requests (the engine builds a
  // fresh one for the next request with the same grammar; those that hold this one keep it).
  bool full() const;

  static constexpr size_t kMaxStates = 1 << 16;
  static constexpr size_t kMaxHeldElements = size_t{1} << 22;  // stack elements in all states (16 MB, held twice)
  static constexpr size_t kMaxExpandWork = size_t{1} << 20;    // stack elements looked at in one step
  static constexpr size_t kMaxTokenSteps = size_t{1} << 20;    // (state, token) steps cached; past it all are dropped
  static constexpr size_t kMaxMasks = 2048;       // masks cached at once (a vocabulary's bits each); past it all are dropped
  static constexpr size_t kMaxStacks = 1024;      // parse stacks in one state
  static constexpr size_t kMaxStackDepth = 1024;  // rules open in one stack

 private:
  struct StateData;
  State step_locked(State s, uint8_t byte) const;
  using Stacks = std::set<std::vector<uint32_t>>;  // parse stacks, each once
  State expand_and_intern_locked(std::vector<std::vector<uint32_t>> stacks) const;
  State intern_locked(Stacks stacks) const;
  const StateData& masked_locked(State s) const;
  bool keeps_locked(const StateData& d, int32_t v, std::span<const int32_t> stop_ids, bool stops_allowed) const;

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> vocabulary_;
  mutable std::mutex mu_;
  mutable std::vector<std::unique_ptr<StateData>> states_;
  mutable std::unordered_map<std::string, State> ids_;
  mutable std::unordered_map<uint64_t, State> token_next_;
  mutable size_t masks_ = 0;
  mutable size_t held_ = 0;  // stack elements in states_
  mutable bool full_ = false;
  State start_ = kDead;
};

// --- GBNF written around another grammar ---

// `gbnf` with its start rule `root` named `name`: its definition and every reference to it
// (literals, classes and comments are left as they are).
std::string gbnf_with_root_renamed(std::string_view gbnf, std::string_view name);

// Rules `prefix`-0, `prefix`-1, ... for any text that does not hold `marker`, then the marker,
// then rule `then`; `prefix`-0 starts it (Knuth-Morris-Pratt's automaton over the marker's code
// points: state i, the text so far ends with the marker's first i characters). Right recursion
// only, in tail position, so a long text keeps the matcher's stacks short. With `may_end`, the
// text may also end without the marker.
std::string gbnf_text_through(std::string_view prefix, std::string_view marker, std::string_view then, bool may_end = false);

// A name prefix, `base` or `base` with underscores after it, that occurs nowhere in `gbnf` (so
// rules named with it cannot collide with the grammar's).
std::string gbnf_fresh_prefix(std::string_view gbnf, std::string_view base);

// llama.cpp's lazy grammar: any text that does not hold `trigger`, which may end the output, or
// such a text, the trigger, then a sentence of `gbnf` (the grammar holds what follows the
// trigger; e.g. a Hermes model's calls after "<tool_call>", held to the tools' schemas).
std::string gbnf_lazy(std::string_view gbnf, std::string_view trigger);

// `gbnf` after a block of free text from `open` to `close`, as vLLM starts a request's grammar
// after a reasoning model's </think>: with `opened` (the prompt opened the block) the output is
// the block's text, `close`, then a sentence of `gbnf`; otherwise either whitespace, `open`,
// the block and `close` before that sentence, or the sentence alone. The block's text holds no
// `close`. Its rules take a name prefix that occurs nowhere in `gbnf`.
std::string gbnf_after_block(std::string_view gbnf, std::string_view open, std::string_view close, bool opened);

}  // namespace specula
