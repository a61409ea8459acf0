// Drafter spellings -> drafters.
#include "spec/make_drafter.h"

#include <charconv>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "spec/model_drafter.h"
#include "spec/ngram_drafter.h"

namespace specula {

std::unique_ptr<Drafter> make_drafter(std::string_view spec, const LoadedModel& target_files, LlamaModel& target,
                                      int64_t max_positions) {
  const int64_t vocab = target.config().vocab_size;
  if (spec == "none") return nullptr;
  if (spec == "ngram") return std::make_unique<NgramDrafter>(vocab);
  if (spec.starts_with("ngram:")) {
    std::string_view n = spec.substr(6);
    if (n.starts_with("n=")) n.remove_prefix(2);
    int value = 0;
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), value);
    if (ec != std::errc() || end != n.data() + n.size() || n.empty())
      throw std::invalid_argument("draft '" + std::string(spec) + "': expected ngram:n=N with N a number");
    return std::make_unique<NgramDrafter>(vocab, value);
  }
  if (spec.starts_with("skip:")) {
    auto skip = parse_skip_layers(spec.substr(5), target.config().layers);
    return std::make_unique<ModelDrafter>(target, max_positions, std::move(skip), std::string(spec));
  }
  if (spec.empty()) throw std::invalid_argument("--draft is empty (expected none, ngram[:n=N], skip:LAYERS or a model path)");
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(spec), ec))
    throw std::invalid_argument("draft model not found: " + std::string(spec) +
                                " (expected none, ngram[:n=N], skip:LAYERS or the path of a model file or directory)");
  auto draft = std::make_shared<LoadedModel>(load_model(std::string(spec)));
  return std::make_unique<ModelDrafter>(target_files, std::move(draft), target.ops(), max_positions);
}

}  // namespace specula
