// Pre-tokenization for byte-level BPE: the regex splits that cut text into the pieces BPE merges
// within, and the byte <-> character alphabet of the ByteLevel step (GPT-2's bytes_to_unicode).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace specula {

// GPT-2's ByteLevel regex as Hugging Face applies it (the trailing `\s+` catches whitespace the
// lookahead alternative leaves behind, e.g. the tab in "\tb").
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// A PCRE2 pattern compiled for UTF-8 with Unicode properties (UCP), JIT-compiled when the
// platform allows. Invalid UTF-8 in a subject never matches, so it ends up in a gap piece.
// Thread-safe: matching uses per-thread scratch.
class Regex {
 public:
  // Throws std::runtime_error quoting the pattern and PCRE2's message and offset.
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the matches of `text` and the non-empty gaps between them, in order (HF behavior
  // "Isolated"); with remove_matches only the gaps (HF "Removed").
  void split(std::string_view text, bool remove_matches, std::vector<std::string_view>& out) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// A sequence of regex splits (Hugging Face's Split / Digits / ByteLevel(use_regex) steps) run
// over one text segment that contains no special tokens. Each step re-splits every piece of the
// previous step, so a lookahead like `\s+(?!\S)` sees the end of its piece, as in HF.
class PreTokenizer {
 public:
  // The steps llama.cpp uses for GGUF `tokenizer.ggml.pre`; throws std::runtime_error naming
  // an unknown value and the supported ones.
  static PreTokenizer for_gguf_pre(const std::string& pre);

  enum class Behavior { Isolated, Removed };
  void add_split(const std::string& pattern, Behavior behavior = Behavior::Isolated);
  // HF ByteLevel(add_prefix_space): a space is prepended to a segment that does not start
  // with one. Only meaningful before any split, which is the only place HF configs put it.
  void set_add_prefix_space(bool on) { add_prefix_space_ = on; }
  bool empty() const { return steps_.empty() && !add_prefix_space_; }

  // Pieces of `text`, as views into `text` or, with a prefix space, into `storage`.
  void split(std::string_view text, std::string& storage, std::vector<std::string_view>& pieces) const;

 private:
  struct Step {
    std::shared_ptr<const Regex> regex;
    Behavior behavior;
  };
  std::vector<Step> steps_;
  bool add_prefix_space_ = false;
};

// GPT-2's reversible map from bytes to printable characters: bytes 0x21-0x7E, 0xA1-0xAC and
// 0xAE-0xFF map to themselves, the other 68 in order to U+0100 + n (space -> 'Ġ').
namespace byte_level {
// UTF-8 of the character standing for byte b.
const std::string& char_of_byte(uint8_t b);
// The byte a code point stands for, or -1 when it is not in the alphabet.
int byte_of_char(uint32_t code_point);
// Byte-level encoding of raw bytes (each byte -> its character).
std::string encode(std::string_view bytes);
// Inverse of encode(); false (out unspecified) when some character is not in the alphabet.
bool decode(std::string_view token, std::string& out);
}  // namespace byte_level

}  // namespace specula
