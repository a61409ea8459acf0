// UTF-8 helpers for the tokenizer: walking code points and repairing byte strings that are not
// (yet) valid UTF-8, the way a streaming detokenizer must.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace specula::utf8 {

// Length of the valid UTF-8 sequence starting at s[pos], or 0 when the bytes there are not one
// (a stray continuation byte, an overlong form, a surrogate, a truncated sequence).
size_t sequence_length(std::string_view s, size_t pos);

// The code point of the valid sequence at s[pos] (check sequence_length first).
uint32_t decode_at(std::string_view s, size_t pos, size_t len);

// Appends `in` to `out`, replacing each maximal invalid subpart with U+FFFD (the WHATWG /
// Rust from_utf8_lossy convention, so the result matches Hugging Face's decode). When
// `final_chunk` is false, a trailing sequence that is incomplete but could still become valid
// is not consumed. Returns the number of bytes of `in` consumed.
size_t append_lossy(std::string_view in, std::string& out, bool final_chunk);

inline std::string to_valid(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  append_lossy(in, out, true);
  return out;
}

// Appends code point `cp` as UTF-8 (cp is not checked: a surrogate is written as one).
inline void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A hex digit's value, or -1.
inline int hex_digit(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

// `digits` hex digits at text[pos] as a number, pos moved past them; nullopt if one is not.
inline std::optional<uint32_t> hex(std::string_view text, size_t& pos, int digits) {
  uint32_t v = 0;
  for (int k = 0; k < digits; ++k, ++pos) {
    const int d = pos < text.size() ? hex_digit(text[pos]) : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<uint32_t>(d);
  }
  return v;
}

}  // namespace specula::utf8
