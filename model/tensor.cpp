// The element types Specula loads, with their block geometry (ggml-common.h), and the exact
// conversion of the types no kernel reads (Q5_0, IQ4_NL, Q3_K) into ones they do.
#include "model/tensor.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "model/utf8.h"

namespace specula {

namespace {

struct Entry {
  DType type;
  DTypeInfo info;
};

// Block sizes follow ggml: fp16 scales (d, m, dmin) plus packed quants.
constexpr Entry kTypes[] = {
    {DType::F32, {"F32", 1, 4}},
    {DType::F16, {"F16", 1, 2}},
    {DType::BF16, {"BF16", 1, 2}},
    {DType::Q8_0, {"Q8_0", 32, 34}},    // d + 32 int8
    {DType::Q4_0, {"Q4_0", 32, 18}},    // d + 16 bytes of nibbles
    {DType::Q4_1, {"Q4_1", 32, 20}},    // d, m + 16 bytes of nibbles
    {DType::Q5_0, {"Q5_0", 32, 22}},    // d, 4 bytes of fifth bits + 16 bytes of nibbles
    {DType::Q5_1, {"Q5_1", 32, 24}},    // d, m, 4 bytes of fifth bits + 16 bytes of nibbles
    {DType::IQ4_NL, {"IQ4_NL", 32, 18}},  // d + 16 bytes of nibbles indexing 16 non-linear levels
    {DType::IQ4_XS, {"IQ4_XS", 256, 136}},  // d, 2 + 4 bytes of 6-bit scales, 128 bytes of IQ4_NL's nibbles
    {DType::Q2_K, {"Q2_K", 256, 84}},   // 16 bytes of 4-bit scale and min pairs, 64 of 2-bit quants, d, dmin
    {DType::Q3_K, {"Q3_K", 256, 110}},  // 32 bytes of high bits, 64 of 2-bit pairs, 12 of 6-bit scales, d
    {DType::Q4_K, {"Q4_K", 256, 144}},  // d, dmin, 12 bytes of 6-bit scales, 128 bytes of nibbles
    {DType::Q5_K, {"Q5_K", 256, 176}},  // d, dmin, 12 bytes of 6-bit scales, 32 bytes of fifth bits, 128 of nibbles
    {DType::Q6_K, {"Q6_K", 256, 210}},  // 128 low nibbles, 64 high bits, 16 int8 scales, d
    {DType::IQ2_XXS, {"IQ2_XXS", 256, 66}},  // d, 8 x (4 grid indices, 4 sign indices and a scale)
    {DType::IQ2_XS, {"IQ2_XS", 256, 74}},    // d, 32 x (9-bit index, 7-bit sign index), 8 bytes of scales
    {DType::IQ2_S, {"IQ2_S", 256, 82}},      // d, 32 index bytes, 32 sign bytes, 8 of index bits, 8 of scales
    {DType::IQ3_XXS, {"IQ3_XXS", 256, 98}},  // d, 64 grid indices, 8 x (4 sign indices and a scale)
    {DType::IQ3_S, {"IQ3_S", 256, 110}},     // d, 64 index bytes, 8 of index bits, 32 sign bytes, 4 of scales
    {DType::IQ1_S, {"IQ1_S", 256, 50}},      // d, 32 index bytes, 8 x (index bits, scale, delta sign)
    {DType::IQ1_M, {"IQ1_M", 256, 56}},      // 32 index bytes, 16 of index bits and delta signs, scales and d
};

const DTypeInfo* lookup(uint32_t id) {
  for (const Entry& e : kTypes)
    if (static_cast<uint32_t>(e.type) == id) return &e.info;
  return nullptr;
}

}  // namespace

const DTypeInfo& dtype_info(DType t) {
  if (const DTypeInfo* info = lookup(static_cast<uint32_t>(t))) return *info;
  throw ModelError("tensor type id " + std::to_string(static_cast<uint32_t>(t)) + " is not one Specula can load");
}

bool dtype_supported(uint32_t gguf_type_id) { return lookup(gguf_type_id) != nullptr; }

std::string dtype_supported_names() {
  std::string names;
  for (const Entry& e : kTypes) names += (names.empty() ? "" : ", ") + std::string(e.info.name);
  return names;
}

const char* dtype_name(DType t) {
  const DTypeInfo* info = lookup(static_cast<uint32_t>(t));
  return info ? info->name : "unknown";
}

size_t dtype_row_bytes(DType t, int64_t cols) {
  const DTypeInfo& info = dtype_info(t);
  if (cols < 0 || cols % info.block_elems != 0)
    throw ModelError(std::string("a row of ") + std::to_string(cols) + " values is not a whole number of " + info.name +
                     " blocks (" + std::to_string(info.block_elems) + " values each)");
  return static_cast<size_t>(cols / info.block_elems) * static_cast<size_t>(info.block_bytes);
}

bool dtype_has_kernels(DType t) { return t != DType::Q5_0 && t != DType::IQ4_NL && t != DType::Q3_K; }

namespace {

// One Q5_0 block (ggml's block_q5_0: fp16 d, qh as a little-endian u32, 16 bytes of nibbles) as
// a Q8_0 block (fp16 d, 32 int8). Value j < 16 is the low nibble of qs[j] with bit j of qh above
// it, value j + 16 the high nibble with bit j + 16; each minus 16.
void q5_0_to_q8_0(const std::byte* in, std::byte* out) {
  std::memcpy(out, in, 2);
  uint32_t qh;
  std::memcpy(&qh, in + 2, 4);
  const auto* qs = reinterpret_cast<const uint8_t*>(in + 6);
  auto* q = reinterpret_cast<int8_t*>(out + 2);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4)) - 16);
    q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16);
  }
}

// One IQ4_NL block (fp16 d, 16 bytes of indices: value j < 16 the low nibble of qs[j], j + 16 the
// high one) as a Q8_0 block: the same d, each level as the int8.
void iq4_nl_to_q8_0(const std::byte* in, std::byte* out) {
  std::memcpy(out, in, 2);
  const auto* qs = reinterpret_cast<const uint8_t*>(in + 2);
  auto* q = reinterpret_cast<int8_t*>(out + 2);
  for (int j = 0; j < 16; ++j) {
    q[j] = kIq4NlLevels[qs[j] & 0x0f];
    q[j + 16] = kIq4NlLevels[qs[j] >> 4];
  }
}

// One Q3_K super-block (ggml's block_q3_K: hmask[32], qs[64], scales[12], fp16 d) as a Q6_K one
// (ql[128], qh[64], int8 scales[16], fp16 d). Q3_K's value v is d * (s - 32) * (q - 4): q's two low
// bits are bits 2 ((v % 128) / 32) of qs[32 (v / 128) + v % 32], its third bit is bit v / 32 of
// hmask[v % 32]; the 6-bit s of sub-block j = v / 16 has its low four bits in scales[j % 8] (the
// high nibble for j >= 8) and its top two at bit 2 (j / 4) of scales[8 + j % 4]. Q6_K's value is
// d * sc * (q6 - 32) with the same sub-blocks: sc = s - 32, q6 = q + 28, stored as
// q6_k_superblock (gpu/host/quant.h) reads them.
void q3_k_to_q6_k(const std::byte* in, std::byte* out) {
  const auto* hmask = reinterpret_cast<const uint8_t*>(in);
  const uint8_t* qs = hmask + 32;
  const uint8_t* scales = hmask + 96;
  uint8_t q6[256];
  for (int v = 0; v < 256; ++v) {
    const int low = (qs[32 * (v / 128) + v % 32] >> (2 * ((v % 128) / 32))) & 3;
    const int high = (hmask[v % 32] >> (v / 32)) & 1;
    q6[v] = static_cast<uint8_t>((low | high << 2) + 28);
  }
  auto* o = reinterpret_cast<uint8_t*>(out);
  for (int n = 0; n < 2; ++n) {  // each 128 values: 64 bytes of low nibbles, 32 of high bit pairs
    const uint8_t* y = q6 + 128 * n;
    for (int l = 0; l < 32; ++l) {
      o[64 * n + l] = static_cast<uint8_t>((y[l] & 15) | (y[l + 64] & 15) << 4);
      o[64 * n + l + 32] = static_cast<uint8_t>((y[l + 32] & 15) | (y[l + 96] & 15) << 4);
      o[128 + 32 * n + l] = static_cast<uint8_t>(y[l] >> 4 | (y[l + 32] >> 4) << 2 | (y[l + 64] >> 4) << 4 | (y[l + 96] >> 4) << 6);
    }
  }
  for (int j = 0; j < 16; ++j) {
    const int low = (j < 8 ? scales[j] : scales[j - 8] >> 4) & 15;
    const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    o[192 + j] = static_cast<uint8_t>(static_cast<int8_t>((low | high << 4) - 32));
  }
  std::memcpy(o + 208, hmask + 108, 2);
}

}  // namespace

DType kernel_dtype(DType t) {
  switch (t) {
    case DType::Q5_0: case DType::IQ4_NL: return DType::Q8_0;
    case DType::Q3_K: return DType::Q6_K;
    default: return t;
  }
}

void convert_block(DType from, const std::byte* in, std::byte* out) {
  switch (from) {
    case DType::Q5_0: return q5_0_to_q8_0(in, out);
    case DType::IQ4_NL: return iq4_nl_to_q8_0(in, out);
    case DType::Q3_K: return q3_k_to_q6_k(in, out);
    default: throw std::invalid_argument(std::string("convert_block: the kernels read ") + dtype_name(from) + " as stored");
  }
}

TensorView kernel_view(const TensorView& tv, std::vector<std::shared_ptr<const void>>& storage) {
  if (dtype_has_kernels(tv.dtype)) return tv;
  const DType target = kernel_dtype(tv.dtype);
  const DTypeInfo& from = dtype_info(tv.dtype);
  const DTypeInfo& to = dtype_info(target);
  const size_t blocks = tv.nbytes / static_cast<size_t>(from.block_bytes);
  auto owned = std::make_shared<std::vector<std::byte>>(blocks * static_cast<size_t>(to.block_bytes));
  for (size_t b = 0; b < blocks; ++b)
    convert_block(tv.dtype, tv.data + b * static_cast<size_t>(from.block_bytes), owned->data() + b * static_cast<size_t>(to.block_bytes));
  TensorView out = tv;
  out.dtype = target;
  out.data = owned->data();
  out.nbytes = owned->size();
  storage.push_back(std::move(owned));
  return out;
}

std::string printable(std::string_view s) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    // A well-formed UTF-8 sequence is kept whole; a control byte or any other byte is escaped.
    const size_t len = utf8::sequence_length(s, i);
    if (len == 0 || (len == 1 && (c < 0x20 || c == 0x7f))) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

namespace {

std::string one_line(const std::string& what) {
  constexpr size_t kMax = 600;
  std::string p = printable(what);
  if (p.size() <= kMax) return p;
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(p[cut]) & 0xc0) == 0x80) --cut;  // not inside a UTF-8 sequence
  const size_t esc = p.rfind("\\x", cut);
  if (esc != std::string::npos && cut - esc < 4) cut = esc;  // not inside an escape
  return p.substr(0, cut) + "...";
}

}  // namespace

ModelError::ModelError(const std::string& what) : std::runtime_error(one_line(what)) {}

}  // namespace specula
