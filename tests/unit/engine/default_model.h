// The default model's path for the engine tests: $SPECULA_CACHE/models/..., as scripts/setup.sh
// caches it (tests skip when it is missing).
#pragma once
#include <cstdlib>
#include <filesystem>
#include <string>

namespace specula::actors {

inline std::string default_model_path() {
  const char* cache = std::getenv("SPECULA_CACHE");
  return (std::filesystem::path(cache && *cache ? cache : "/root/.cache/specula") / "models" /
          "SmolLM2-135M-Instruct.Q4_1.gguf")
      .string();
}

}  // namespace specula::actors
