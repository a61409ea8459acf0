// A drafter from its command-line spelling: "none", "ngram", "ngram:n=N", "skip:LAYERS" or
// the path of a draft model with the target's vocabulary.
#pragma once
#include <cstdint>
#include <memory>
#include <string_view>

#include "gpu/llama.h"
#include "model/weights.h"
#include "spec/drafter.h"

namespace specula {

// nullptr for "none". Throws std::invalid_argument for a malformed spelling or skip set,
// VocabularyMismatch for a draft model with another vocabulary, ModelError for a bad file.
// The skip drafter runs `target` itself; `max_positions` sizes a drafter's own cache.
std::unique_ptr<Drafter> make_drafter(std::string_view spec, const LoadedModel& target_files, LlamaModel& target,
                                      int64_t max_positions);

}  // namespace specula
