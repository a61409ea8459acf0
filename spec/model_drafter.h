// Drafting with a model: a smaller model sharing the target's vocabulary, or the target itself
// with some layers skipped (self-speculation). Either way it has a KV cache of its own.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/kv_cache.h"
#include "gpu/llama.h"
#include "model/weights.h"
#include "spec/drafter.h"

namespace specula {

// A draft model whose vocabulary differs from the target's; the message names the first
// difference (logit width, token count, a token string, BOS/EOS ids, a special flag).
class VocabularyMismatch : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Throws VocabularyMismatch unless both models have the same output width, the same token
// strings in the same order, the same BOS / EOS ids and the same special tokens.
void check_same_vocabulary(const LoadedModel& target, const LoadedModel& draft);

// "10-19", "3,5,7-9" (inclusive ranges of 0-based layers) -> one flag per layer. Throws
// std::invalid_argument for bad syntax, a layer outside 0..layers-1, or a set that skips every
// layer (the draft would be the embedding alone).
std::vector<bool> parse_skip_layers(std::string_view spec, int64_t layers);

class ModelDrafter final : public Drafter {
 public:
  // A separate draft model: checks the vocabularies (VocabularyMismatch), uploads `draft`'s
  // weights to `ops` (the drafter keeps `draft` alive) and sizes a cache for max_positions.
  ModelDrafter(const LoadedModel& target, std::shared_ptr<const LoadedModel> draft, Ops& ops, int64_t max_positions);
  // `model` (not owned; the caller vouches for its vocabulary) with a cache of its own. With
  // `skip_layers` (one flag per layer) the skipped blocks are not run: the target's own
  // weights as a cheaper draft. Throws std::invalid_argument for a wrong-length or all-layer set.
  ModelDrafter(LlamaModel& model, int64_t max_positions, std::vector<bool> skip_layers = {}, std::string name = "model");
  ~ModelDrafter() override;

  std::string name() const override { return name_; }
  void prefill(std::span<const int32_t> context) override;
  void propose(const DraftRequest& req, DraftProposal& out) override;
  void rollback(int64_t length) override;

  // The tokens the draft cache holds (a prefix of the context); for tests and statistics.
  int64_t cached_length() const { return static_cast<int64_t>(cached_.size()); }
  const KvCache& cache() const { return *kv_; }

 private:
  // Makes the cache hold context[0, n) and leaves logits_ for its last token.
  void catch_up(std::span<const int32_t> context);
  void feed(std::span<const int32_t> tokens);
  int64_t max_positions() const;

  std::shared_ptr<const LoadedModel> loaded_;  // a separate draft model's files and weights
  std::unique_ptr<LlamaModel> owned_;          // ... uploaded to the device
  LlamaModel* model_ = nullptr;
  std::unique_ptr<KvCache> kv_;
  int seq_ = -1;
  std::vector<bool> skip_;             // empty = run every layer
  std::string name_;
  std::vector<int32_t> cached_;        // the tokens in the cache, in order
  std::vector<float> logits_, logq_, q_;
  DraftPenalties penalties_;  // the request's penalties on its rows (spec/drafter.h)
};

}  // namespace specula
