// UTF-8 walking and lossy repair (see utf8.h).
#include "model/utf8.h"

namespace specula::utf8 {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

enum class Scan { Complete, Incomplete, Invalid };

// Reads the sequence at s[pos]. `len` is the sequence length when Complete, otherwise the
// length of the maximal subpart: the longest prefix that some well-formed sequence starts with
// (at least 1).
Scan scan(std::string_view s, size_t pos, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[pos]);
  size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
  if (b0 < 0x80) {
    len = 1;
    return Scan::Complete;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    len = 1;
    return Scan::Invalid;
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (pos + k >= s.size()) {
      len = k;
      return Scan::Incomplete;
    }
    const auto b = static_cast<unsigned char>(s[pos + k]);
    const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      len = k;
      return Scan::Invalid;
    }
  }
  len = need;
  return Scan::Complete;
}

}  // namespace

size_t sequence_length(std::string_view s, size_t pos) {
  size_t len = 0;
  return scan(s, pos, len) == Scan::Complete ? len : 0;
}

uint32_t decode_at(std::string_view s, size_t pos, size_t len) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(s[pos + i])); };
  switch (len) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default: return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

size_t append_lossy(std::string_view in, std::string& out, bool final_chunk) {
  size_t pos = 0;
  while (pos < in.size()) {
    size_t len = 0;
    switch (scan(in, pos, len)) {
      case Scan::Complete:
        out.append(in.substr(pos, len));
        break;
      case Scan::Incomplete:
        if (!final_chunk) return pos;
        out.append(kReplacement);
        break;
      case Scan::Invalid:
        out.append(kReplacement);
        break;
    }
    pos += len;
  }
  return pos;
}

}  // namespace specula::utf8
