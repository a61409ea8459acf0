// A drafter from its command-line spelling: "none", "ngram", "ngram:n=N[,min=M]", "skip:LAYERS",
// "eagle" (the shipped head trained for the target), "eagle:PATH" (a head file), either followed by
// ",context=N" (how many context tokens outside the head's map it may propose; 0 = none, the
// default kEagleContextTokens; spec/eagle_drafter.h), or the path of a
// draft model with the target's vocabulary; or prompt lookup in front of one of the last four,
// "ngram:n=N[,min=M]+OTHER" (spec/lookup_first_drafter.h: lookup's draft where the context's last
// N..M tokens occur earlier, M = N unless given; OTHER's elsewhere).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/llama.h"
#include "model/weights.h"
#include "spec/drafter.h"

namespace specula {

// A spelling resolved once, for many sequences: the spelling is checked, and a draft model is
// loaded, checked against the target's vocabulary and uploaded to the target's device once;
// make() then gives each sequence a drafter with a cache of its own over those shared weights
// (a per-request load would re-read the file and, on a GPU, upload the weights per request).
// Drafters from make() use the factory's models: they must not outlive it, and they share the
// device with `target` (one thread drives them at a time, as the draft stream does).
class DrafterFactory {
 public:
  // Throws std::invalid_argument for a malformed spelling or skip set, VocabularyMismatch for a
  // draft model with another vocabulary, EagleMismatch for a head trained for another target,
  // ModelError for a bad file. The skip drafter runs `target`.
  DrafterFactory(std::string_view spec, const LoadedModel& target_files, LlamaModel& target);
  // A draft model already in memory (benchmarks on random weights at real shapes); same checks.
  DrafterFactory(std::shared_ptr<const LoadedModel> draft, const LoadedModel& target_files, LlamaModel& target);
  ~DrafterFactory();

  // nullptr for "none"; `max_positions` sizes a model drafter's cache.
  std::unique_ptr<Drafter> make(int64_t max_positions) const;
  const std::string& spelling() const { return spec_; }
  // Whether its drafters read the target's hidden states (the trained head).
  bool wants_target_hidden() const { return kind_ == Kind::Eagle; }
  // The target's layers whose residuals its drafters read beside the final hidden state
  // (LlamaModel::set_feature_layers on the model that hands them the rows).
  std::vector<int> target_feature_layers() const;

 private:
  enum class Kind { None, Ngram, Skip, Model, Eagle };
  void init(std::string_view spec, const LoadedModel& target_files, LlamaModel& target);
  std::unique_ptr<Drafter> make_one(int64_t max_positions) const;
  void use_draft_model(std::shared_ptr<const LoadedModel> draft, const LoadedModel& target_files);

  Kind kind_ = Kind::None;
  std::string spec_;
  std::string one_spec_;  // the drafter behind prompt lookup's spelling (spec_ without it)
  LlamaModel& target_;
  int ngram_n_ = 3, ngram_min_ = 1;
  int lookup_n_ = 0, lookup_min_ = 0;  // > 0: prompt lookup in front of the drafter above
  int64_t eagle_context_ = 0;          // the head's context tokens (kEagleContextTokens unless the spelling says)
  std::vector<bool> skip_;
  std::shared_ptr<const LoadedModel> draft_files_;
  std::unique_ptr<LlamaModel> draft_model_;  // draft_files_'s weights on target's device
  std::shared_ptr<const struct EagleWeights> eagle_;  // a draft head's weights on target's device
};

// One drafter (the sequential loop's single sequence): DrafterFactory(...).make(max_positions),
// except that a model drafter keeps its factory's models alive itself.
std::unique_ptr<Drafter> make_drafter(std::string_view spec, const LoadedModel& target_files, LlamaModel& target,
                                      int64_t max_positions);

}  // namespace specula
