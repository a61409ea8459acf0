// Helpers for the tokenizer tests: where the shared data and the default model live, scratch
// files, and a writer for tiny vocabulary-only GGUF files (to test loader errors).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include <unistd.h>

namespace specula::test {

inline std::filesystem::path shared_dir() { return SPECULA_SHARED_DIR; }

inline std::filesystem::path default_model_path() {
  const char* cache = std::getenv("SPECULA_CACHE");
  return std::filesystem::path(cache && *cache ? cache : "/root/.cache/specula") / "models" /
         "SmolLM2-135M-Instruct.Q4_1.gguf";
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh directory under the system temp dir, named after the running test.
inline std::filesystem::path scratch_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("specula-tok-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
              std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::filesystem::path write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

// Writes a GGUF v3 file with metadata only (no tensors).
class VocabGgufWriter {
 public:
  using Value = std::variant<uint32_t, std::string, std::vector<std::string>, std::vector<int32_t>>;
  // Sets or replaces a key (GGUF keys are unique).
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : kv_) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    kv_.emplace_back(key, std::move(v));
  }

  void write(const std::filesystem::path& p) const {
    std::string b = "GGUF";
    u32(b, 3);
    u64(b, 0);  // tensors
    u64(b, kv_.size());
    for (const auto& [key, v] : kv_) {
      str(b, key);
      if (auto* x = std::get_if<uint32_t>(&v)) {
        u32(b, 4);
        u32(b, *x);
      } else if (auto* s = std::get_if<std::string>(&v)) {
        u32(b, 8);
        str(b, *s);
      } else if (auto* a = std::get_if<std::vector<std::string>>(&v)) {
        u32(b, 9);
        u32(b, 8);
        u64(b, a->size());
        for (const auto& e : *a) str(b, e);
      } else if (auto* n = std::get_if<std::vector<int32_t>>(&v)) {
        u32(b, 9);
        u32(b, 5);
        u64(b, n->size());
        for (int32_t e : *n) u32(b, static_cast<uint32_t>(e));
      }
    }
    write_file(p, b);
  }

 private:
  static void u32(std::string& b, uint32_t v) { b.append(reinterpret_cast<const char*>(&v), 4); }
  static void u64(std::string& b, uint64_t v) { b.append(reinterpret_cast<const char*>(&v), 8); }
  static void str(std::string& b, const std::string& s) {
    u64(b, s.size());
    b += s;
  }
  std::vector<std::pair<std::string, Value>> kv_;
};

// Runs `fn`, expecting an exception of type E whose one-line message contains every one of `parts`.
template <class E, class Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "error should be one line: " << msg;
  }
}

}  // namespace specula::test
