// safetensors reader: u64 header length, JSON header, then the raw data; every entry is checked
// against the data section before a view is made.
#include "model/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

namespace specula {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The format caps the header at 100 MB; past that the length field is corrupt.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw ModelError("safetensors file '" + path + "': " + what);
}

bool parse_dtype(const std::string& s, DType& out) {
  if (s == "F32") out = DType::F32;
  else if (s == "F16") out = DType::F16;
  else if (s == "BF16") out = DType::BF16;
  else return false;
  return true;
}

uint64_t as_u64(const json& j, const std::string& path, const std::string& what) {
  if (!j.is_number_unsigned()) bad(path, what + " must be a non-negative integer, got " + j.dump());
  return j.get<uint64_t>();
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) {
  map_ = std::make_shared<MappedFile>(path);
  const std::byte* base = map_->data();
  const size_t size = map_->size();
  if (size < 8) bad(path, "is truncated: " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  uint64_t header_len;
  std::memcpy(&header_len, base, 8);
  if (header_len > kMaxHeaderBytes) bad(path, "header length " + std::to_string(header_len) + " is over the format's 100 MB limit (corrupt file)");
  if (header_len > size - 8)
    bad(path, "is truncated: the header needs " + std::to_string(8 + header_len) + " bytes but the file has " + std::to_string(size));

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + header_len));
  } catch (const json::exception& e) {
    bad(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) bad(path, "header is not a JSON object");

  const std::byte* data = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  // (begin, end, name) of every tensor, to check the data has no overlaps.
  std::vector<std::tuple<uint64_t, uint64_t, std::string>> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      bad(path, "tensor '" + name + "' needs dtype, shape and data_offsets");
    const json& jdtype = entry["dtype"];
    if (!jdtype.is_string()) bad(path, "tensor '" + name + "' has a dtype that is not a string");
    TensorView tv;
    tv.name = name;
    if (!parse_dtype(jdtype.get<std::string>(), tv.dtype))
      bad(path, "tensor '" + name + "' has dtype " + jdtype.get<std::string>() + ", which Specula cannot load (it loads F32, F16, BF16)");
    const json& jshape = entry["shape"];
    if (!jshape.is_array() || jshape.size() > 8) bad(path, "tensor '" + name + "' has a malformed shape " + jshape.dump());
    int64_t numel = 1;
    for (const json& d : jshape) {
      uint64_t v = as_u64(d, path, "a dimension of tensor '" + name + "'");
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(numel, static_cast<int64_t>(v), &numel))
        bad(path, "tensor '" + name + "' has a shape whose size overflows: " + jshape.dump());
      tv.shape.push_back(static_cast<int64_t>(v));
    }
    const json& joff = entry["data_offsets"];
    if (!joff.is_array() || joff.size() != 2) bad(path, "tensor '" + name + "' has malformed data_offsets " + joff.dump());
    uint64_t begin = as_u64(joff[0], path, "data_offsets of tensor '" + name + "'");
    uint64_t end = as_u64(joff[1], path, "data_offsets of tensor '" + name + "'");
    if (begin > end) bad(path, "tensor '" + name + "' has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] that run backwards");
    if (end > data_size)
      bad(path, "tensor '" + name + "' has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                    "] past the end of the data (" + std::to_string(data_size) + " bytes): the file is truncated or corrupt");
    uint64_t expected = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(numel), static_cast<uint64_t>(dtype_info(tv.dtype).block_bytes), &expected) ||
        expected != end - begin)
      bad(path, "tensor '" + name + "' has " + std::to_string(end - begin) + " bytes of data but shape " + jshape.dump() + " of " +
                    jdtype.get<std::string>() + " needs " + std::to_string(expected));
    tv.data = data + begin;
    tv.nbytes = static_cast<size_t>(end - begin);
    spans.emplace_back(begin, end, name);
    index_.emplace(name, tensors_.size());
    tensors_.push_back(std::move(tv));
  }

  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    const auto& [pb, pe, pn] = spans[i - 1];
    const auto& [cb, ce, cn] = spans[i];
    if (cb < pe && ce > cb) bad(path, "tensors '" + pn + "' and '" + cn + "' overlap in the data (corrupt data_offsets)");
  }
}

const TensorView* SafetensorsFile::tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

SafetensorsSet::SafetensorsSet(const std::string& dir) {
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    json index;
    std::ifstream in(index_path);
    if (!in) throw ModelError("cannot read '" + index_path.string() + "'");
    try {
      index = json::parse(in);
    } catch (const json::exception& e) {
      throw ModelError("'" + index_path.string() + "' is not valid JSON: " + e.what());
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw ModelError("'" + index_path.string() + "' has no weight_map object");
    std::map<std::string, size_t> shard_of_file;
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) throw ModelError("'" + index_path.string() + "': weight_map entry '" + name + "' is not a file name");
      const std::string shard = file.get<std::string>();
      // A shard name must stay inside the model directory.
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        throw ModelError("'" + index_path.string() + "': weight_map entry '" + name + "' names '" + shard + "', not a file in the model directory");
      auto it = shard_of_file.find(shard);
      if (it == shard_of_file.end()) {
        const fs::path shard_path = root / shard;
        if (!fs::exists(shard_path))
          throw ModelError("'" + index_path.string() + "' names shard '" + shard + "', which is missing");
        files_.push_back(std::make_unique<SafetensorsFile>(shard_path.string()));
        it = shard_of_file.emplace(shard, files_.size() - 1).first;
      }
      const TensorView* tv = files_[it->second]->tensor(name);
      if (!tv) throw ModelError("'" + index_path.string() + "' places tensor '" + name + "' in '" + shard + "', which does not contain it");
      index_.emplace(name, tv);
    }
    return;
  }
  const fs::path single = root / "model.safetensors";
  if (!fs::exists(single))
    throw ModelError("model directory '" + dir + "' has neither model.safetensors nor model.safetensors.index.json");
  files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
  for (const TensorView& tv : files_.back()->tensors()) index_.emplace(tv.name, &tv);
}

const TensorView* SafetensorsSet::tensor(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<std::string> SafetensorsSet::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, tv] : index_) out.push_back(name);
  return out;
}

}  // namespace specula
