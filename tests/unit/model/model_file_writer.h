// Test helpers that write small GGUF and safetensors files byte by byte, so the readers can be
// checked on valid files and on files cut or corrupted at known places.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/tensor.h"

namespace specula::test {

using Bytes = std::vector<uint8_t>;

// A directory under the system temp dir, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "specula-model-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const Bytes& b) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

inline void write_text(const std::string& path, const std::string& s) {
  std::ofstream out(path, std::ios::binary);
  out << s;
}

template <class T>
void put(Bytes& b, T v) {
  const size_t at = b.size();
  b.resize(at + sizeof(T));
  std::memcpy(b.data() + at, &v, sizeof(T));
}

inline void put_string(Bytes& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}

template <class T>
Bytes as_bytes(const std::vector<T>& v) {
  Bytes b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// GGUF v3 writer. Shapes are given outermost first (as Specula reports them) and written
// innermost first (as GGUF stores them).
class GgufWriter {
 public:
  enum : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 };

  // Positions in the output of the last bytes() call, for cutting and corrupting.
  struct Layout {
    size_t kv_start = 0;        // first metadata entry
    size_t infos_start = 0;     // first tensor info
    size_t data_start = 0;      // aligned start of tensor data
    std::vector<size_t> offset_fields;  // where each tensor's u64 offset is written
    std::vector<size_t> type_fields;    // where each tensor's u32 type is written
  };

  uint32_t version = 3;
  uint64_t alignment = 32;

  void add_raw(const std::string& key, uint32_t type, const Bytes& payload) {
    Bytes kv;
    put_string(kv, key);
    put<uint32_t>(kv, type);
    kv.insert(kv.end(), payload.begin(), payload.end());
    kvs_.push_back(std::move(kv));
  }
  template <class T>
  void add(const std::string& key, uint32_t type, T v) {
    Bytes p;
    put<T>(p, v);
    add_raw(key, type, p);
  }
  void add_u32(const std::string& k, uint32_t v) { add(k, U32, v); }
  void add_f32(const std::string& k, float v) { add(k, F32, v); }
  void add_string(const std::string& k, const std::string& v) {
    Bytes p;
    put_string(p, v);
    add_raw(k, STRING, p);
  }
  void add_strings(const std::string& k, const std::vector<std::string>& v) {
    Bytes p;
    put<uint32_t>(p, STRING);
    put<uint64_t>(p, v.size());
    for (const auto& s : v) put_string(p, s);
    add_raw(k, ARRAY, p);
  }
  void add_i32s(const std::string& k, const std::vector<int32_t>& v) {
    Bytes p;
    put<uint32_t>(p, I32);
    put<uint64_t>(p, v.size());
    for (int32_t x : v) put<int32_t>(p, x);
    add_raw(k, ARRAY, p);
  }
  void add_f32s(const std::string& k, const std::vector<float>& v) {
    Bytes p;
    put<uint32_t>(p, F32);
    put<uint64_t>(p, v.size());
    for (float x : v) put<float>(p, x);
    add_raw(k, ARRAY, p);
  }

  // type_id is a raw GGUF type so tests can write types Specula refuses.
  void add_tensor(const std::string& name, uint32_t type_id, std::vector<int64_t> shape, Bytes data) {
    tensors_.push_back({name, type_id, std::move(shape), std::move(data)});
  }
  void add_tensor(const std::string& name, DType t, std::vector<int64_t> shape, Bytes data) {
    add_tensor(name, static_cast<uint32_t>(t), std::move(shape), std::move(data));
  }
  void add_f32_tensor(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& v) {
    add_tensor(name, DType::F32, std::move(shape), as_bytes(v));
  }

  Bytes bytes() {
    Bytes b;
    layout_ = {};
    b.insert(b.end(), {'G', 'G', 'U', 'F'});
    put<uint32_t>(b, version);
    put<uint64_t>(b, tensors_.size());
    put<uint64_t>(b, kvs_.size());
    layout_.kv_start = b.size();
    for (const Bytes& kv : kvs_) b.insert(b.end(), kv.begin(), kv.end());
    layout_.infos_start = b.size();
    uint64_t offset = 0;
    for (const Tensor& t : tensors_) {
      put_string(b, t.name);
      put<uint32_t>(b, static_cast<uint32_t>(t.shape.size()));
      for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) put<uint64_t>(b, static_cast<uint64_t>(*it));
      layout_.type_fields.push_back(b.size());
      put<uint32_t>(b, t.type);
      layout_.offset_fields.push_back(b.size());
      put<uint64_t>(b, offset);
      offset += (t.data.size() + alignment - 1) / alignment * alignment;
    }
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    layout_.data_start = b.size();
    for (const Tensor& t : tensors_) {
      b.insert(b.end(), t.data.begin(), t.data.end());
      b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    }
    return b;
  }
  const Layout& layout() const { return layout_; }

 private:
  struct Tensor {
    std::string name;
    uint32_t type;
    std::vector<int64_t> shape;
    Bytes data;
  };
  std::vector<Bytes> kvs_;
  std::vector<Tensor> tensors_;
  Layout layout_;
};

// safetensors writer: header JSON (given whole, so tests can write bad ones) then the data.
inline Bytes safetensors_bytes(const std::string& header_json, const Bytes& data) {
  Bytes b(8 + header_json.size() + data.size());
  const uint64_t n = header_json.size();
  std::memcpy(b.data(), &n, 8);
  if (n) std::memcpy(b.data() + 8, header_json.data(), n);
  if (!data.empty()) std::memcpy(b.data() + 8 + n, data.data(), data.size());
  return b;
}

// Builds a well-formed safetensors file tensor by tensor, laying the data out back to back.
class SafetensorsWriter {
 public:
  void add(const std::string& name, const std::string& dtype, const std::vector<int64_t>& shape, const Bytes& data) {
    std::string shape_json;
    for (size_t i = 0; i < shape.size(); ++i) {
      if (i) shape_json += ',';
      shape_json += std::to_string(shape[i]);
    }
    if (!header_.empty()) header_ += ',';
    header_ += '"';
    header_ += name;
    header_ += "\":{\"dtype\":\"";
    header_ += dtype;
    header_ += "\",\"shape\":[";
    header_ += shape_json;
    header_ += "],\"data_offsets\":[";
    header_ += std::to_string(data_.size());
    header_ += ',';
    header_ += std::to_string(data_.size() + data.size());
    header_ += "]}";
    data_.insert(data_.end(), data.begin(), data.end());
  }
  void add_f32(const std::string& name, const std::vector<int64_t>& shape, const std::vector<float>& v) {
    add(name, "F32", shape, as_bytes(v));
  }
  Bytes bytes() const { return safetensors_bytes("{\"__metadata__\":{\"format\":\"pt\"}" + (header_.empty() ? "" : "," + header_) + "}", data_); }

 private:
  std::string header_;
  Bytes data_;
};

}  // namespace specula::test
