// GGUF v2/v3 reader. The whole header is parsed up front from the mapping; every length, count,
// offset and size read from the file is checked against the bytes that remain before it is used.
#include "model/gguf.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>
#include <type_traits>

namespace specula {

namespace {

enum GgufType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

constexpr uint32_t kMaxDims = 4;          // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;       // arrays of arrays are skipped, but not forever
constexpr uint64_t kDefaultAlignment = 32;

// Names of all ggml type ids, so a refusal can say what the file holds (ggml.h, ggml_type).
const char* ggml_type_name(uint32_t id) {
  static const char* const names[] = {
      "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
      "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
      "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
      "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8",
      "IQ4_NL_8_8", "MXFP4"};
  return id < std::size(names) ? names[id] : "unknown";
}

// Smallest encoding of one value of type t, used to refuse counts the file cannot hold.
uint64_t min_value_bytes(uint32_t t) {
  switch (t) {
    case kU8: case kI8: case kBool: return 1;
    case kU16: case kI16: return 2;
    case kU32: case kI32: case kF32: return 4;
    case kU64: case kI64: case kF64: case kString: return 8;  // a string is at least its length
    case kArray: return 12;                                    // element type + count
    default: return 1;
  }
}

// Sequential little-endian reads over the mapping. `context` names what is being read so a
// truncation error can say where it happened.
class Reader {
 public:
  Reader(const std::byte* base, size_t size, const std::string& path) : base_(base), size_(size), path_(path) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  void set_context(std::string c) { context_ = std::move(c); }
  const std::string& context() const { return context_; }

  void need(uint64_t n) const {
    if (n > remaining())
      throw ModelError("GGUF file '" + path_ + "' is truncated: reading " + context_ + " needs " +
                       std::to_string(n) + " bytes at offset " + std::to_string(pos_) + ", so a file of at least " +
                       (n > std::numeric_limits<uint64_t>::max() - pos_ ? std::string("2^64")
                                                                         : std::to_string(pos_ + n)) +
                       " bytes, but the file has " + std::to_string(size_) + " bytes");
  }

  template <class T>
  T read() {
    static_assert(std::is_trivially_copyable_v<T>);
    need(sizeof(T));
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));  // unaligned-safe; GGUF is little-endian like our hosts
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string() {
    uint64_t len = read<uint64_t>();
    need(len);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), static_cast<size_t>(len));
    pos_ += static_cast<size_t>(len);
    return s;
  }

  void skip(uint64_t n) {
    need(n);
    pos_ += static_cast<size_t>(n);
  }

  // Refuses an array count before anything is allocated for it.
  void check_count(uint64_t count, uint64_t min_item_bytes, const char* items) const {
    if (count > remaining() / min_item_bytes)
      throw ModelError("GGUF file '" + path_ + "' is truncated or corrupt: " + context_ + " claims " +
                       std::to_string(count) + " " + items + ", which need at least " +
                       (count > std::numeric_limits<uint64_t>::max() / min_item_bytes
                            ? std::string("2^64")
                            : std::to_string(count * min_item_bytes)) +
                       " bytes from offset " + std::to_string(pos_) + ", but the file has " + std::to_string(size_) +
                       " bytes");
  }

 private:
  const std::byte* base_;
  size_t size_;
  const std::string& path_;
  size_t pos_ = 0;
  std::string context_;
};

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw ModelError("GGUF file '" + path + "': " + what);
}

int64_t read_int_as_i64(Reader& r, uint32_t t, const std::string& path) {
  switch (t) {
    case kU8: return r.read<uint8_t>();
    case kI8: return r.read<int8_t>();
    case kU16: return r.read<uint16_t>();
    case kI16: return r.read<int16_t>();
    case kU32: return r.read<uint32_t>();
    case kI32: return r.read<int32_t>();
    case kI64: return r.read<int64_t>();
    case kBool: return r.read<uint8_t>() != 0;
    case kU64: {
      uint64_t v = r.read<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        corrupt(path, r.context() + " holds " + std::to_string(v) + ", too large for a signed 64-bit integer");
      return static_cast<int64_t>(v);
    }
  }
  assert(false && "read_int_as_i64 called with a non-integer type");
  return 0;
}

// Skips an array of arrays (no model key uses them), bounded in depth and by the file size.
void skip_array(Reader& r, const std::string& path, int depth) {
  if (depth > kMaxArrayNesting) corrupt(path, r.context() + " nests arrays more than " + std::to_string(kMaxArrayNesting) + " deep");
  uint32_t et = r.read<uint32_t>();
  uint64_t count = r.read<uint64_t>();
  if (et > kF64) corrupt(path, r.context() + " is an array of unknown value type " + std::to_string(et));
  r.check_count(count, min_value_bytes(et), "array items");
  for (uint64_t i = 0; i < count; ++i) {
    if (et == kString) r.skip(r.read<uint64_t>());
    else if (et == kArray) skip_array(r, path, depth + 1);
    else r.skip(min_value_bytes(et));
  }
}

// Reads one value; returns false for an array of arrays, which is skipped and not stored.
bool read_value(Reader& r, uint32_t t, const std::string& path, GgufValue& out) {
  switch (t) {
    case kU8: out = uint64_t{r.read<uint8_t>()}; return true;
    case kU16: out = uint64_t{r.read<uint16_t>()}; return true;
    case kU32: out = uint64_t{r.read<uint32_t>()}; return true;
    case kU64: out = uint64_t{r.read<uint64_t>()}; return true;
    case kI8: out = int64_t{r.read<int8_t>()}; return true;
    case kI16: out = int64_t{r.read<int16_t>()}; return true;
    case kI32: out = int64_t{r.read<int32_t>()}; return true;
    case kI64: out = int64_t{r.read<int64_t>()}; return true;
    case kF32: out = double{r.read<float>()}; return true;
    case kF64: out = r.read<double>(); return true;
    case kBool: out = r.read<uint8_t>() != 0; return true;
    case kString: out = r.read_string(); return true;
    case kArray: break;
    default: corrupt(path, r.context() + " has unknown value type " + std::to_string(t));
  }
  uint32_t et = r.read<uint32_t>();
  uint64_t count = r.read<uint64_t>();
  if (et > kF64) corrupt(path, r.context() + " is an array of unknown value type " + std::to_string(et));
  r.check_count(count, min_value_bytes(et), et == kString ? "strings" : "array items");
  const size_t n = static_cast<size_t>(count);
  if (et == kString) {
    std::vector<std::string> v;
    v.reserve(n);
    for (size_t i = 0; i < n; ++i) v.push_back(r.read_string());
    out = std::move(v);
  } else if (et == kF32 || et == kF64) {
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = et == kF32 ? double{r.read<float>()} : r.read<double>();
    out = std::move(v);
  } else if (et == kArray) {
    for (size_t i = 0; i < n; ++i) skip_array(r, path, 1);
    return false;
  } else {
    std::vector<int64_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = read_int_as_i64(r, et, path);
    out = std::move(v);
  }
  return true;
}

const char* held_type(const GgufValue& v) {
  static const char* const names[] = {"an unsigned integer", "a signed integer", "a float", "a bool",
                                      "a string", "an array of strings", "an array of integers", "an array of floats"};
  return names[v.index()];
}

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path) {
  map_ = std::make_shared<MappedFile>(path);
  const std::byte* base = map_->data();
  const size_t size = map_->size();
  Reader r(base, size, path_);

  r.set_context("the magic number");
  r.need(4);
  if (std::memcmp(base, "GGUF", 4) != 0) {
    char shown[5] = {};
    for (int i = 0; i < 4; ++i) {
      char c = static_cast<char>(base[i]);
      shown[i] = (c >= 0x20 && c < 0x7f) ? c : '?';
    }
    throw ModelError("'" + path_ + "' is not a GGUF file: it starts with \"" + shown + "\", not \"GGUF\"");
  }
  r.skip(4);
  r.set_context("the version");
  version_ = r.read<uint32_t>();
  if (version_ != 2 && version_ != 3) {
    if ((version_ & 0xffffu) == 0)
      corrupt(path_, "is big-endian (version field " + std::to_string(version_) + "); Specula reads little-endian files");
    corrupt(path_, "has GGUF version " + std::to_string(version_) + "; Specula reads versions 2 and 3");
  }
  r.set_context("the tensor count");
  uint64_t n_tensors = r.read<uint64_t>();
  r.set_context("the metadata count");
  uint64_t n_kv = r.read<uint64_t>();

  r.set_context("the header");
  r.check_count(n_kv, 8 + 4 + 1, "metadata entries");
  for (uint64_t i = 0; i < n_kv; ++i) {
    r.set_context("the key of metadata entry #" + std::to_string(i));
    std::string key = r.read_string();
    r.set_context("metadata key '" + key + "'");
    uint32_t t = r.read<uint32_t>();
    GgufValue v;
    if (!read_value(r, t, path_, v)) continue;
    if (!kv_.emplace(key, std::move(v)).second) corrupt(path_, "metadata key '" + key + "' appears twice");
  }

  uint64_t alignment = kDefaultAlignment;
  if (has("general.alignment")) {
    int64_t a = get_int("general.alignment");
    if (a <= 0 || (a & (a - 1)) != 0 || a > (1 << 20))
      corrupt(path_, "general.alignment is " + std::to_string(a) + "; it must be a power of two up to 1 MiB");
    alignment = static_cast<uint64_t>(a);
  }

  // A tensor info is at least: name length, n_dims, one dim, type, offset.
  r.set_context("the header");
  r.check_count(n_tensors, 8 + 4 + 8 + 4 + 8, "tensor infos");
  tensors_.reserve(static_cast<size_t>(n_tensors));
  std::vector<uint64_t> offsets;
  offsets.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    r.set_context("the name of tensor #" + std::to_string(i));
    TensorView tv;
    tv.name = r.read_string();
    r.set_context("the info of tensor '" + tv.name + "'");
    uint32_t n_dims = r.read<uint32_t>();
    if (n_dims == 0 || n_dims > kMaxDims)
      corrupt(path_, "tensor '" + tv.name + "' has " + std::to_string(n_dims) + " dimensions; GGUF allows 1 to 4");
    std::vector<int64_t> ne(n_dims);  // innermost first, as stored
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t v = r.read<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        corrupt(path_, "tensor '" + tv.name + "' has dimension " + std::to_string(v) + ", which is not a valid size");
      ne[d] = static_cast<int64_t>(v);
    }
    uint32_t type = r.read<uint32_t>();
    uint64_t offset = r.read<uint64_t>();

    if (!dtype_supported(type))
      corrupt(path_, "tensor '" + tv.name + "' has type " + ggml_type_name(type) + " (" + std::to_string(type) +
                         "), which Specula cannot load (it loads " + dtype_supported_names() + ")");
    tv.dtype = static_cast<DType>(type);
    int64_t numel = 1;
    for (int64_t d : ne)
      if (__builtin_mul_overflow(numel, d, &numel))
        corrupt(path_, "tensor '" + tv.name + "' has dimensions whose product overflows 64 bits");
    const DTypeInfo& info = dtype_info(tv.dtype);
    if (ne[0] % info.block_elems != 0)
      corrupt(path_, "tensor '" + tv.name + "' has rows of " + std::to_string(ne[0]) + " values, not a multiple of the " +
                         info.name + " block of " + std::to_string(info.block_elems));
    uint64_t nbytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel / info.block_elems), static_cast<uint64_t>(info.block_bytes), &nbytes))
      corrupt(path_, "tensor '" + tv.name + "' is too large to address");
    tv.nbytes = static_cast<size_t>(nbytes);
    tv.shape.assign(ne.rbegin(), ne.rend());
    if (!tensor_index_.emplace(tv.name, tensors_.size()).second)
      corrupt(path_, "tensor '" + tv.name + "' appears twice");
    tensors_.push_back(std::move(tv));
    offsets.push_back(offset);
  }

  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    TensorView& tv = tensors_[i];
    const uint64_t offset = offsets[i];
    if (offset % alignment != 0)
      corrupt(path_, "tensor '" + tv.name + "' has offset " + std::to_string(offset) + ", not a multiple of the alignment " +
                         std::to_string(alignment) + " (corrupt file)");
    if (offset > size || data_start > size - offset)
      corrupt(path_, "tensor '" + tv.name + "' has offset " + std::to_string(offset) + ", which points past the end of the file (data starts at byte " +
                         std::to_string(data_start) + ", the file has " + std::to_string(size) + " bytes): the file is corrupt or truncated");
    const uint64_t begin = data_start + offset;
    if (tv.nbytes > size - begin)
      throw ModelError("GGUF file '" + path_ + "' is truncated: tensor '" + tv.name + "' (" + std::to_string(tv.nbytes) +
                       " bytes at byte " + std::to_string(begin) + ") needs a file of " +
                       (tv.nbytes > std::numeric_limits<uint64_t>::max() - begin ? std::string("over 2^64")
                                                                                 : std::to_string(begin + tv.nbytes)) +
                       " bytes, but the file has " + std::to_string(size) + " bytes");
    tv.data = base + begin;
  }

  // Two tensors sharing bytes means an offset was corrupted even though it lands inside the file.
  std::vector<size_t> order(tensors_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return offsets[a] < offsets[b]; });
  for (size_t k = 1; k < order.size(); ++k) {
    const TensorView& prev = tensors_[order[k - 1]];
    const TensorView& cur = tensors_[order[k]];
    if (offsets[order[k - 1]] + prev.nbytes > offsets[order[k]] && cur.nbytes > 0 && prev.nbytes > 0)
      corrupt(path_, "tensors '" + prev.name + "' (offset " + std::to_string(offsets[order[k - 1]]) + ", " +
                         std::to_string(prev.nbytes) + " bytes) and '" + cur.name + "' (offset " +
                         std::to_string(offsets[order[k]]) + ") overlap: a tensor offset is corrupt");
  }
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {

[[noreturn]] void missing_key(const std::string& path, const std::string& key) {
  throw ModelError("GGUF file '" + path + "' has no metadata key '" + key + "'");
}

[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GgufValue& v, const char* expected) {
  throw ModelError("GGUF file '" + path + "': metadata key '" + key + "' is " + held_type(v) + ", expected " + expected);
}

}  // namespace

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing_key(path_, key);
  if (const int64_t* i = std::get_if<int64_t>(v)) return *i;
  if (const uint64_t* u = std::get_if<uint64_t>(v)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw ModelError("GGUF file '" + path_ + "': metadata key '" + key + "' is " + std::to_string(*u) + ", out of range");
    return static_cast<int64_t>(*u);
  }
  wrong_type(path_, key, *v, "an integer");
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing_key(path_, key);
  if (const double* d = std::get_if<double>(v)) return *d;
  if (std::holds_alternative<int64_t>(*v) || std::holds_alternative<uint64_t>(*v)) return static_cast<double>(get_int(key));
  wrong_type(path_, key, *v, "a number");
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing_key(path_, key);
  if (const std::string* s = std::get_if<std::string>(v)) return *s;
  wrong_type(path_, key, *v, "a string");
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key, bool fallback) const {
  const GgufValue* v = find(key);
  if (!v) return fallback;
  if (const bool* b = std::get_if<bool>(v)) return *b;
  wrong_type(path_, key, *v, "a bool");
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing_key(path_, key);
  if (const auto* a = std::get_if<std::vector<std::string>>(v)) return *a;
  wrong_type(path_, key, *v, "an array of strings");
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing_key(path_, key);
  if (const auto* a = std::get_if<std::vector<int64_t>>(v)) return *a;
  wrong_type(path_, key, *v, "an array of integers");
}

std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue* v = find(key);
  if (!v) missing_key(path_, key);
  if (const auto* a = std::get_if<std::vector<double>>(v)) return *a;
  if (const auto* a = std::get_if<std::vector<int64_t>>(v)) return std::vector<double>(a->begin(), a->end());
  wrong_type(path_, key, *v, "an array of numbers");
}

const TensorView* GgufFile::tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace specula
