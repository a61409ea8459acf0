// UTF-8 and hex digits, as the grammar readers (spec/grammar.cpp, spec/json_schema.cpp) need them.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "model/utf8.h"  // append, hex_digit, hex

namespace specula::utf8 {

// The code point whose UTF-8 starts at text[pos], pos moved past it; nullopt (pos where it was
// cut) for a byte that starts none or a sequence cut short. Overlong forms are not checked: the
// text is the user's own pattern, read only for its characters.
inline std::optional<uint32_t> decode(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<uint8_t>(text[pos++]);
  if (b0 < 0x80) return b0;
  const int n = b0 >= 0xF0 ? 3 : b0 >= 0xE0 ? 2 : b0 >= 0xC0 ? 1 : -1;
  if (n < 0) return std::nullopt;
  uint32_t cp = b0 & (0x3F >> n);
  for (int k = 0; k < n; ++k) {
    if (pos >= text.size() || (static_cast<uint8_t>(text[pos]) & 0xC0) != 0x80) return std::nullopt;
    cp = cp << 6 | (static_cast<uint8_t>(text[pos++]) & 0x3F);
  }
  return cp;
}


}  // namespace specula::utf8
