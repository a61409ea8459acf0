// Drafter spellings -> drafters.
#include "spec/make_drafter.h"

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "spec/eagle_drafter.h"
#include "spec/lookup_first_drafter.h"
#include "spec/model_drafter.h"
#include "spec/ngram_drafter.h"

namespace specula {

namespace {

bool is_model_path(std::string_view spec) {
  return spec != "none" && spec != "ngram" && !spec.starts_with("ngram:") && !spec.starts_with("skip:") && spec != "eagle" &&
         !spec.starts_with("eagle:") && !spec.starts_with("eagle,");
}

// `--draft eagle`: the shipped head trained for this target (whose target_tensor_hash is `want`),
// found among the *.gguf files of the heads folder (SPECULA_DRAFT_HEADS, else the source tree's
// tools/draft/heads) by the target hash in its metadata.
std::string shipped_head_for(const LoadedModel& target, const std::string& want) {
  const char* env = std::getenv("SPECULA_DRAFT_HEADS");
  const std::filesystem::path dir = env && *env ? env : SPECULA_DRAFT_HEADS_DIR;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".gguf") continue;
    try {
      if (GgufFile(e.path().string()).get_string("draft.target_hash", "") == want) return e.path().string();
    } catch (const ModelError&) {
      // not a head: keep looking
    }
  }
  throw std::invalid_argument("--draft eagle: no draft head in " + dir.string() + " was trained for " + target.path +
                              " (tensor hash " + want.substr(0, 16) + "...); train one with scripts/train_draft.sh and pass "
                              "--draft eagle:PATH");
}

// A draft model's spelling -> its files, loaded (not uploaded).
std::shared_ptr<const LoadedModel> load_draft(std::string_view spec) {
  if (spec.empty()) throw std::invalid_argument("--draft is empty (expected none, ngram[:n=N], skip:LAYERS or a model path)");
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::path(spec), ec))
    throw std::invalid_argument("draft model not found: " + std::string(spec) +
                                " (expected none, ngram[:n=N], skip:LAYERS or the path of a model file or directory)");
  return std::make_shared<LoadedModel>(load_model(std::string(spec)));
}

// The whole of `text` as a number into `out`; false for anything else (an empty text too).
template <class Int>
bool number(std::string_view text, Int& out) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

// "ngram", "ngram:n=N" or "ngram:n=N,min=M" -> N and M (M defaults to `default_min`, or to N
// when that is 0). Throws std::invalid_argument naming `whole` for anything else.
void parse_ngram(std::string_view spec, std::string_view whole, int default_min, int& n, int& min_n) {
  n = 3;
  bool has_min = false;
  if (spec.starts_with("ngram:")) {
    const std::string_view rest = spec.substr(6);
    const size_t comma = rest.find(',');
    std::string_view nn = rest.substr(0, comma);
    if (nn.starts_with("n=")) nn.remove_prefix(2);
    bool ok = number(nn, n);
    if (ok && comma != std::string_view::npos) {
      const std::string_view m = rest.substr(comma + 1);
      ok = m.starts_with("min=") && number(m.substr(4), min_n);
      has_min = true;
    }
    if (!ok) throw std::invalid_argument("draft '" + std::string(whole) + "': expected ngram:n=N or ngram:n=N,min=M with N, M numbers");
  } else if (spec != "ngram") {
    throw std::invalid_argument("draft '" + std::string(whole) + "': expected ngram[:n=N[,min=M]] before '+'");
  }
  if (!has_min) min_n = default_min > 0 ? default_min : n;
}

}  // namespace

DrafterFactory::DrafterFactory(std::string_view spec, const LoadedModel& target_files, LlamaModel& target)
    : spec_(spec), target_(target) {
  if (const size_t plus = spec.find('+'); spec.starts_with("ngram") && plus != std::string_view::npos) {
    // Prompt lookup in front of another drafter: lookup needs its full n-gram unless min= says less.
    const std::string_view back = spec.substr(plus + 1);
    parse_ngram(spec.substr(0, plus), spec, 0, lookup_n_, lookup_min_);
    NgramDrafter check(target.config().vocab_size, lookup_n_, lookup_min_);  // out of range fails here
    if (back.empty() || back == "none" || back == "ngram" || back.starts_with("ngram:"))
      throw std::invalid_argument("draft '" + std::string(spec) +
                                  "': prompt lookup goes in front of one other drafter (eagle[:PATH], skip:LAYERS or a draft "
                                  "model), as in ngram:n=3+eagle");
    init(back, target_files, target);
    spec_ = std::string(spec.substr(0, plus)) + "+" + spec_;
  } else {
    init(spec, target_files, target);
  }
}

void DrafterFactory::init(std::string_view spec, const LoadedModel& target_files, LlamaModel& target) {
  spec_ = spec;
  if (spec == "none") {
    kind_ = Kind::None;
  } else if (spec == "ngram" || spec.starts_with("ngram:")) {
    parse_ngram(spec, spec, 1, ngram_n_, ngram_min_);
    kind_ = Kind::Ngram;
    NgramDrafter check(target.config().vocab_size, ngram_n_, ngram_min_);  // N out of range fails here, not per request
  } else if (spec.starts_with("skip:")) {
    kind_ = Kind::Skip;
    skip_ = parse_skip_layers(spec.substr(5), target.config().layers);
  } else if (spec == "eagle" || spec.starts_with("eagle:") || spec.starts_with("eagle,")) {
    // ",context=N" at the end: how many context tokens outside the head's map it may propose.
    eagle_context_ = kEagleContextTokens;
    if (const size_t at = spec.rfind(",context="); at != std::string_view::npos) {
      if (!number(spec.substr(at + 9), eagle_context_) || eagle_context_ < 0 || eagle_context_ > kEagleMaxContextTokens)
        throw std::invalid_argument("draft '" + std::string(spec) + "': expected eagle[:PATH][,context=N] with N in 0.." +
                                    std::to_string(kEagleMaxContextTokens));
      spec = spec.substr(0, at);
    }
    if (spec != "eagle" && !spec.starts_with("eagle:"))
      throw std::invalid_argument("draft '" + std::string(spec) + "': expected eagle[:PATH][,context=N]");
    const std::string path = spec == "eagle" ? std::string() : std::string(spec.substr(6));
    std::error_code ec;
    if (spec != "eagle" && (path.empty() || !std::filesystem::exists(path, ec)))
      throw std::invalid_argument("draft head not found: '" + path + "' (expected eagle or eagle:PATH of a specula-eagle GGUF)");
    const std::string hash = target_tensor_hash(target_files);  // one pass over the target's weights
    const std::string head = spec == "eagle" ? shipped_head_for(target_files, hash) : path;
    kind_ = Kind::Eagle;
    eagle_ = std::make_shared<EagleWeights>(load_eagle_head(head, target_files, hash), target_files, target.ops());
    spec_ = "eagle:" + head + (eagle_context_ != kEagleContextTokens ? ",context=" + std::to_string(eagle_context_) : "");
  } else {
    use_draft_model(load_draft(spec), target_files);
  }
  one_spec_ = spec_;
}

DrafterFactory::DrafterFactory(std::shared_ptr<const LoadedModel> draft, const LoadedModel& target_files,
                               LlamaModel& target)
    : spec_(draft->path), target_(target) {
  use_draft_model(std::move(draft), target_files);
}

DrafterFactory::~DrafterFactory() = default;

void DrafterFactory::use_draft_model(std::shared_ptr<const LoadedModel> draft, const LoadedModel& target_files) {
  check_same_vocabulary(target_files, *draft);
  kind_ = Kind::Model;
  draft_files_ = std::move(draft);
  draft_model_ = std::make_unique<LlamaModel>(draft_files_->weights, target_.ops());
  draft_model_->set_max_forward_rows(target_.max_forward_rows());
}

std::vector<int> DrafterFactory::target_feature_layers() const {
  return eagle_ ? eagle_->head->feature_layers : std::vector<int>{};
}

std::unique_ptr<Drafter> DrafterFactory::make(int64_t max_positions) const {
  if (lookup_n_ > 0)
    return std::make_unique<LookupFirstDrafter>(NgramDrafter(target_.config().vocab_size, lookup_n_, lookup_min_),
                                                make_one(max_positions));
  return make_one(max_positions);
}

std::unique_ptr<Drafter> DrafterFactory::make_one(int64_t max_positions) const {
  switch (kind_) {
    case Kind::None: return nullptr;
    case Kind::Ngram: return std::make_unique<NgramDrafter>(target_.config().vocab_size, ngram_n_, ngram_min_);
    case Kind::Skip: return std::make_unique<ModelDrafter>(target_, max_positions, skip_, one_spec_);
    case Kind::Model: return std::make_unique<ModelDrafter>(*draft_model_, max_positions, std::vector<bool>{},
                                                            "model:" + draft_files_->path);
    case Kind::Eagle: return std::make_unique<EagleDrafter>(eagle_, max_positions, kEagleCatchUpWindow, eagle_context_);
  }
  return nullptr;
}

std::unique_ptr<Drafter> make_drafter(std::string_view spec, const LoadedModel& target_files, LlamaModel& target,
                                      int64_t max_positions) {
  if (is_model_path(spec))  // the drafter owns its model: nothing outlives it
    return std::make_unique<ModelDrafter>(target_files, load_draft(spec), target.ops(), max_positions);
  return DrafterFactory(spec, target_files, target).make(max_positions);
}

}  // namespace specula
