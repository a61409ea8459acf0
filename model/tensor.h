// Tensor element types (GGUF ids) and a non-owning view of a stored tensor.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace specula {

// A failure caused by a model file or directory: missing, truncated, corrupt or unsupported.
// The message names the file and the problem in one line.
// What a model file or directory did wrong, as one printable line: control characters and bytes
// that are not UTF-8 (a corrupt file's names can hold anything) are escaped as \xNN, and the
// message is cut at 600 bytes, so it is safe to print as the single line of an error report.
class ModelError : public std::runtime_error {
 public:
  explicit ModelError(const std::string& what);
};

// `s` made printable on one line as ModelError does it (escapes, no cut).
std::string printable(std::string_view s);

// Values are GGUF's type ids so a GGUF tensor type converts directly.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,  // read as Q8_0 (kernel_dtype); as a packed layout, qmatmul.h's five bits
  Q5_1 = 7,  // what llama.cpp writes for Q5_K in rows that are not whole super-blocks (a Q5_K_M file)
  Q8_0 = 8,
  Q2_K = 10,  // 16-value sub-blocks of 2-bit quants, each with a 4-bit scale and min
  Q3_K = 11,  // read as Q6_K (kernel_dtype)
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,  // read as Q8_0 (kernel_dtype); as a packed layout, qmatmul.h's indices
  IQ4_XS = 23,  // IQ4_NL's levels in 256-value super-blocks with a 6-bit scale per 32 values
  // The IQ1, IQ2 and IQ3 types: groups of 4 or 8 values indexing a fixed grid (gpu/host/iq_grids.h);
  // no fast kernel reads them (the reference path's f32 kernels do, through dequantize_row).
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ1_M = 29,
  BF16 = 30,
};

// IQ4_NL's sixteen levels (ggml's kvalues_iq4nl): value j of a block is d * level[index j].
inline constexpr int8_t kIq4NlLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

struct DTypeInfo {
  const char* name;
  int64_t block_elems;  // values per block (1 for plain floats)
  int64_t block_bytes;  // bytes per block
};

// Throws ModelError for a type id Specula cannot load, naming it.
const DTypeInfo& dtype_info(DType t);
bool dtype_supported(uint32_t gguf_type_id);
// The names of the types Specula loads, comma-separated ("F32, F16, BF16, Q8_0, ...").
std::string dtype_supported_names();
const char* dtype_name(DType t);
// Bytes of one row of `cols` values; cols must be a multiple of the block size.
size_t dtype_row_bytes(DType t, int64_t cols);

// A tensor as stored: row-major, shape outermost first (a matrix is [rows, cols], i.e. an
// HF [out, in] weight; GGUF dims are reversed into this order by the loader).
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;

  bool empty() const { return data == nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t rows() const { return shape.size() >= 2 ? numel() / shape.back() : 1; }
  int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
  const std::byte* row(int64_t r) const { return data + static_cast<size_t>(r) * dtype_row_bytes(dtype, cols()); }
};

// Whether the kernels read type t as stored. The loadable types they do not are what llama.cpp
// writes where a K-quant's rows are not whole 256-value super-blocks (a model 576 or 960 wide,
// SmolLM2-135M and -360M): Q5_0 for Q4_K (most of a Q4_K_M file), IQ4_NL for Q2_K and Q3_K (most
// of a Q2_K or Q3_K file); and Q3_K itself (the ffn_down of those files). Loading keeps them as
// stored (views into the mapped file); each device reads them through their exact conversion:
// the host's int8 packer a block at a time (gpu/host/qmatmul.h), its f32 kernels a converted
// copy of the device's own (kernel_view), the CUDA upload through dequantize_row.
bool dtype_has_kernels(DType t);
// The type t is read as: Q8_0 for Q5_0 and IQ4_NL, Q6_K for Q3_K, t itself for the others.
DType kernel_dtype(DType t);
// One stored block of a type no kernel reads (`in`, dtype_info(from).block_bytes) as one block of
// kernel_dtype(from) (`out`), every value the same float. Q5_0 becomes Q8_0: the same fp16 scale
// per 32 values, each 5-bit quant minus 16 as an int8, so every value d * (q - 16) is the same
// float (34 bytes a block instead of 22). IQ4_NL becomes Q8_0: the same scale, each 4-bit index as
// its int8 level (34 bytes instead of 18). Q3_K becomes Q6_K: the same fp16 d, each 16-value
// sub-block's 6-bit scale s as the int8 s - 32, each 3-bit quant q as q + 28 (so q6 - 32 = q - 4):
// 210 bytes a super-block instead of 110.
void convert_block(DType from, const std::byte* in, std::byte* out);

// `tv` as the kernels read it: `tv` itself when they read its type; else every block converted
// (convert_block) into memory appended to `storage` (which must outlive the view).
TensorView kernel_view(const TensorView& tv, std::vector<std::shared_ptr<const void>>& storage);

}  // namespace specula
