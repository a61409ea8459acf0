// GGUF v3 reader: memory-mapped, every offset and size bounds-checked.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "model/mapped_file.h"
#include "model/tensor.h"

namespace specula {

// One metadata value. Arrays of strings and of numbers are the only arrays GGUF model files use.
using GgufValue = std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<std::string>,
                               std::vector<int64_t>, std::vector<double>>;

class GgufFile {
 public:
  // Throws ModelError: missing file, bad magic, unsupported version, truncation, a tensor whose
  // offset or size runs past the file, an unsupported tensor type (naming tensor and type).
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  const GgufValue* find(const std::string& key) const;
  // Typed getters throw ModelError naming the key when missing or of another type.
  // Integer getters accept any integer type (u32 or u64 counts).
  int64_t get_int(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_float(const std::string& key) const;
  double get_float(const std::string& key, double fallback) const;
  std::string get_string(const std::string& key) const;
  std::string get_string(const std::string& key, const std::string& fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;

  const std::map<std::string, GgufValue>& metadata() const { return kv_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* tensor(const std::string& name) const;  // nullptr when absent
  std::shared_ptr<const MappedFile> mapping() const { return map_; }

 private:
  std::string path_;
  uint32_t version_ = 0;
  std::shared_ptr<const MappedFile> map_;
  std::map<std::string, GgufValue> kv_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

}  // namespace specula
