// UTF-8 helpers for the tokenizer: walking code points and repairing byte strings that are not
// (yet) valid UTF-8, the way a streaming detokenizer must.
#pragma once
#include <cstddef>
#include <cstdint>
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

}  // namespace specula::utf8
