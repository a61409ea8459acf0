// The element types Specula has kernels for, with their block geometry (ggml-common.h).
#include "model/tensor.h"

#include <string>

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
    {DType::Q4_K, {"Q4_K", 256, 144}},  // d, dmin, 12 bytes of 6-bit scales, 128 bytes of nibbles
    {DType::Q6_K, {"Q6_K", 256, 210}},  // 128 low nibbles, 64 high bits, 16 int8 scales, d
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

}  // namespace specula
