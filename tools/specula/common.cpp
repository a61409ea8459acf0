#include "tools/specula/common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>

namespace specula::cli {

std::string default_model_path() {
  if (const char* m = std::getenv("SPECULA_MODEL"); m && *m) return m;
  std::string cache;
  if (const char* c = std::getenv("SPECULA_CACHE"); c && *c)
    cache = c;
  else if (const char* h = std::getenv("HOME"); h && *h)
    cache = std::string(h) + "/.cache/specula";
  else
    cache = ".cache/specula";
  return cache + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

int64_t ubatch_from_args(const Args& a) {
  const long long rows = a.integer("ubatch-size", LlamaModel::kDefaultMaxForwardRows);
  if (rows < 1 || rows > 65536) throw UsageError("--ubatch-size must be between 1 and 65536, got " + std::to_string(rows));
  return rows;
}

LoadedModel load_model_from_args(const Args& a) {
  LoadedModel m = load_model(a.str("model", default_model_path()));
  if (a.has(kChatTemplateOption)) {
    try {
      m.chat_template = chat_template_for(m, a.str(kChatTemplateOption));
    } catch (const std::invalid_argument& e) {
      throw UsageError("--chat-template: " + std::string(e.what()));
    }
  }
  return m;
}

Session open_session(const Args& a) {
  Session s;
  DeviceOptions dev;
  dev.device = a.str("device", "auto");
  dev.threads = static_cast<int>(a.integer("threads", 2));
  s.ops = make_device(dev);  // argument errors before the (slower) model load
  s.loaded = load_model_from_args(a);
  s.model = std::make_unique<LlamaModel>(s.loaded.weights, *s.ops);
  s.model->set_max_forward_rows(ubatch_from_args(a));
  const int64_t model_ctx = s.loaded.weights.config.max_positions > 0 ? s.loaded.weights.config.max_positions : 8192;
  const int64_t ctx = a.integer("ctx", std::min<int64_t>(model_ctx, 8192));
  if (ctx < 16 || ctx > model_ctx)
    throw UsageError("--ctx must be between 16 and the model's context " + std::to_string(model_ctx) + ", got " +
                     std::to_string(ctx));
  s.kv = std::make_unique<KvCache>(*s.ops, s.model->kv_config(ctx));
  return s;
}

std::vector<std::string> split(const std::string& list, char sep) {
  std::vector<std::string> out;
  for (size_t at = 0; at <= list.size();) {
    const size_t end = std::min(list.find(sep, at), list.size());
    if (end > at) out.push_back(list.substr(at, end - at));
    at = end + 1;
  }
  return out;
}

double seconds_since(BenchClock::time_point t0) { return std::chrono::duration<double>(BenchClock::now() - t0).count(); }

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void write_npy(const std::string& path, const std::vector<float>& data, const std::vector<int64_t>& shape) {
  std::string dims;
  for (size_t i = 0; i < shape.size(); ++i) dims += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot write " + path);
  const uint16_t len = static_cast<uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.write(reinterpret_cast<const char*>(&len), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size() * sizeof(float)));
  if (!f) throw std::runtime_error("failed writing " + path);
}

bool read_line(std::string& line) { return static_cast<bool>(std::getline(std::cin, line)); }

}  // namespace specula::cli
