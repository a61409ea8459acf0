// safetensors reader (single file or sharded index), memory-mapped and bounds-checked.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/mapped_file.h"
#include "model/tensor.h"

namespace specula {

class SafetensorsFile {
 public:
  // Throws ModelError: missing/short file, header length past the end, malformed JSON, an
  // unsupported dtype (naming tensor and dtype), data_offsets outside the data or not matching
  // shape x dtype size.
  explicit SafetensorsFile(const std::string& path);
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const TensorView* tensor(const std::string& name) const;
  std::shared_ptr<const MappedFile> mapping() const { return map_; }

 private:
  std::shared_ptr<const MappedFile> map_;
  std::vector<TensorView> tensors_;
  std::map<std::string, size_t> index_;
};

// All tensors of a Hugging Face model directory: model.safetensors, or the shards named by
// model.safetensors.index.json.
class SafetensorsSet {
 public:
  explicit SafetensorsSet(const std::string& dir);
  const TensorView* tensor(const std::string& name) const;
  std::vector<std::string> names() const;

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

}  // namespace specula
