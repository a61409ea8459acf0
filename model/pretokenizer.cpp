// PCRE2-backed pre-tokenizer splits and the ByteLevel byte alphabet (see pretokenizer.h).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "model/pretokenizer.h"

#include <pcre2.h>

#include <stdexcept>

#include "model/utf8.h"

namespace specula {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0) return "PCRE2 error " + std::to_string(code);
  return reinterpret_cast<const char*>(buf);
}

// Per-thread match scratch. The JIT stack is grown past PCRE2's 32 KiB default because
// `\s+(?!\S)` backtracks over whitespace runs, which user text can make arbitrarily long.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() {
    if (!data || !context || !jit_stack) throw std::runtime_error("PCRE2: out of memory for match scratch");
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_offset, nullptr);
  if (!code) {
    throw std::runtime_error("pre-tokenizer regex /" + pattern + "/ does not compile: " + pcre2_message(err) +
                             " at offset " + std::to_string(err_offset));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  // the interpreter is the fallback
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::split(std::string_view text, bool remove_matches, std::vector<std::string_view>& out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  MatchScratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0, pos = 0;
  while (pos < text.size()) {
    const int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, 0, s.data, s.context)
                        : pcre2_match(code, subject, text.size(), pos, 0, s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      throw std::runtime_error("pre-tokenizer regex /" + pattern_ + "/ failed on " + std::to_string(text.size()) +
                               " bytes of text: " + pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    const size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match splits nothing; step over one character
      const size_t n = utf8::sequence_length(text, begin);
      pos = begin + (n ? n : 1);
      continue;
    }
    if (begin > gap_start) out.push_back(text.substr(gap_start, begin - gap_start));
    if (!remove_matches) out.push_back(text.substr(begin, end - begin));
    gap_start = pos = end;
  }
  if (gap_start < text.size()) out.push_back(text.substr(gap_start));
}

PreTokenizer PreTokenizer::for_gguf_pre(const std::string& pre) {
  PreTokenizer p;
  if (pre == "smollm") {
    p.add_split(R"(\p{N})");  // digits one by one, as HF Digits(individual_digits=true)
    p.add_split(kGpt2Pattern);
  } else if (pre == "gpt-2" || pre == "gpt2") {
    p.add_split(kGpt2Pattern);
  } else if (pre == "llama-bpe" || pre == "llama3") {
    p.add_split(kLlama3Pattern);
  } else {
    throw std::runtime_error("unsupported tokenizer.ggml.pre '" + pre +
                             "' (supported: smollm, gpt-2, gpt2, llama-bpe, llama3)");
  }
  return p;
}

void PreTokenizer::add_split(const std::string& pattern, Behavior behavior) {
  steps_.push_back(Step{std::make_shared<const Regex>(pattern), behavior});
}

void PreTokenizer::split(std::string_view text, std::string& storage, std::vector<std::string_view>& pieces) const {
  pieces.clear();
  if (add_prefix_space_ && !text.empty() && text.front() != ' ') {
    storage.resize(text.size() + 1);
    storage[0] = ' ';
    text.copy(storage.data() + 1, text.size());
    text = storage;
  }
  if (text.empty()) return;
  pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : pieces) step.regex->split(piece, step.behavior == Behavior::Removed, next);
    pieces.swap(next);
  }
}

namespace byte_level {
namespace {

struct Alphabet {
  std::array<std::string, 256> chars;
  std::array<int16_t, 324> bytes;  // code points 0..323 cover the whole alphabet
  Alphabet() {
    bytes.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const uint32_t cp = printable ? b : 0x100 + extra++;
      bytes[cp] = static_cast<int16_t>(b);
      std::string& s = chars[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

const std::string& char_of_byte(uint8_t b) { return alphabet().chars[b]; }

int byte_of_char(uint32_t cp) { return cp < alphabet().bytes.size() ? alphabet().bytes[cp] : -1; }

std::string encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) out += char_of_byte(static_cast<uint8_t>(c));
  return out;
}

bool decode(std::string_view token, std::string& out) {
  out.clear();
  for (size_t pos = 0; pos < token.size();) {
    const size_t n = utf8::sequence_length(token, pos);
    if (n == 0) return false;
    const int b = byte_of_char(utf8::decode_at(token, pos, n));
    if (b < 0) return false;
    out.push_back(static_cast<char>(b));
    pos += n;
  }
  return true;
}

}  // namespace byte_level
}  // namespace specula
