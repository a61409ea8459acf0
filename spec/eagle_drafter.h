// The trained draft head (issue 13, docs/draft.md): an EAGLE-style decoder layer (or a few) that
// reads the target's final hidden state at position i - 1 and the embedding of token i, and
// predicts the target's next token over a reduced vocabulary. Its file is a GGUF of architecture
// `specula-eagle` whose metadata names the target it was trained for (a hash of the target's
// tensors); a head for another target is refused.
#pragma once
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/kv_cache.h"
#include "gpu/llama.h"
#include "gpu/ops.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/weights.h"
#include "spec/drafter.h"

namespace specula {

// A head trained for another target than the loaded one; the message names both.
class EagleMismatch : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The most decoder layers a head file may have (a draft is meant to be a small fraction of the
// target; one layer is what EAGLE uses and what the shipped head has).
inline constexpr int64_t kEagleMaxLayers = 4;

// A head file, checked against a target and ready to upload.
struct EagleHead {
  std::shared_ptr<const GgufFile> file;  // keeps the mapped tensors alive
  LlamaConfig config;                    // the layers' geometry and count, RoPE and norm eps
  int64_t n_vocab = 0;                   // N, the reduced vocabulary
  std::vector<int32_t> token_map;        // [N] reduced id -> target token id
  std::vector<LayerWeights> layers;      // the decoder blocks ("blk.0.*", "blk.1.*", ...), run in order
  TensorView fc, out_norm, out;
  // EAGLE-3's fused features: the target's layers (0-based blocks) whose RMS-normed residuals
  // follow its final hidden state in a row, and fuse [H, (1 + C) H] mapping such a row to the
  // depth-1 feature. Empty: the head reads the final hidden state alone.
  std::vector<int> feature_layers;
  TensorView fuse;
  int64_t feature_width() const { return config.hidden * (1 + static_cast<int64_t>(feature_layers.size())); }
};

// The hash a head names its target by (model/gguf_hash over the target's GGUF file). Throws
// EagleMismatch for a target that is not a GGUF file (the hash is defined over GGUF tensors).
std::string target_tensor_hash(const LoadedModel& target);

// Loads and checks a head for `target`, whose target_tensor_hash is `target_hash`. Throws
// ModelError for a file that is missing, damaged or not a specula-eagle head (one line naming
// what), EagleMismatch for a head whose target hash, hidden width or vocabulary differs from the
// target's (naming both).
std::shared_ptr<const EagleHead> load_eagle_head(const std::string& path, const LoadedModel& target,
                                                 const std::string& target_hash);

// The head's weights on a device, shared by the drafters of one engine.
struct EagleWeights {
  EagleWeights(std::shared_ptr<const EagleHead> head, const LoadedModel& target, Ops& ops);
  std::shared_ptr<const EagleHead> head;
  Ops& ops;
  Weight embed;  // the target's token embedding (the head has none of its own)
  std::vector<LlamaLayer> layers;
  Weight fc, out_norm, out, fuse;
  std::vector<float> inv_freq;
  int64_t target_vocab = 0;
  std::vector<int32_t> by_id;  // [N] the head's reduced ids in increasing target token id
  // Context tokens (below): the target's output rows, the head's reduced id of each target token
  // (-1 outside the map) and the scale of the target's rows to the head's (the median norm ratio
  // of the head's output rows to the target's rows of the same tokens).
  TensorView target_out;
  std::vector<int32_t> reduced_of;
  float context_scale = 1.0f;
};

// Drafts with the head. Protocol (docs/draft.md, "At run time"): entry i of the head's cache is
// fed (h_{i-1}, x_i) at position i, where h is the target's final hidden state; the target's rows
// arrive through target_hidden() (the loop hands it the committed rows of each verify forward and
// the prompt's rows at prefill). Depth 1 of a round is the output of the last committed entry;
// depth j >= 2 feeds the head's own output g of depth j - 1 with the token it proposed. Those
// entries are speculative: the next round drops them and re-feeds the accepted positions with
// the target's true h. Without the target's rows for the context it proposes nothing, except
// to continue its own last proposal: a context that is the last proposal's context followed by
// all the tokens it proposed (the engine's optimistic continuation under pipelining, drafted while
// those tokens are verified) is drafted on from the head's own features, as deeper depths are.
//
// A catch-up longer than `window` entries (the first draft after a prompt, or the first after
// many rounds without drafting, as the load-adaptive policy's probes are) feeds only the last
// `window` positions: the cache restarts there, as if the context began at the window's start
// (RoPE depends on relative positions only). The head reads the context mostly through the
// target's rows, so this costs no measurable acceptance (docs/draft.md, "The catch-up window")
// and bounds the work of a probe. 0: feed every position.
inline constexpr int64_t kEagleCatchUpWindow = 32;

// Context tokens: the head proposes over its N tokens and, beside them, over up to this many
// distinct tokens outside its map that occur among the context's last kEagleContextScan tokens
// (the most recent kept), each scored with the target's own output row times the median ratio of
// the head's output rows' norms to the target's rows of the same tokens (the head's rows started
// as the target's rows at that scale). A rare name or word piece the text has used is then a
// proposal, not a token q = 0 for ever (docs/draft.md, "Context tokens"). q covers the N + E
// tokens the draft was drawn from, so exactness is the same rule as ever.
//
// Greedy drafting adds kEagleContextBias to their logits before the argmax (and the entropy and
// confidence rules' softmax): the target repeats a token its text has used far more often than
// the untrained row's logit says. Chosen on one held-out file's greedy chain (the lowest value
// within 0.5% of the best) and checked on another (docs/draft.md, "Context tokens"). Sampled drafts
// draw from the unbiased softmax: no held-out measure of their overlap with the target was made.
inline constexpr int64_t kEagleContextTokens = 32;
inline constexpr float kEagleContextBias = 3.0f;
inline constexpr int64_t kEagleMaxContextTokens = 1024;
inline constexpr int64_t kEagleContextScan = 1024;

class EagleDrafter final : public Drafter {
 public:
  // Throws std::invalid_argument for a negative window or context_tokens outside
  // 0..kEagleMaxContextTokens.
  EagleDrafter(std::shared_ptr<const EagleWeights> weights, int64_t max_positions, int64_t window = 0,
               int64_t context_tokens = kEagleContextTokens);
  ~EagleDrafter() override;

  std::string name() const override {
    return context_tokens_ == kEagleContextTokens ? "eagle" : "eagle,context=" + std::to_string(context_tokens_);
  }
  bool wants_target_hidden() const override { return true; }
  std::vector<int> target_feature_layers() const override { return w_->head->feature_layers; }
  void target_hidden(int64_t first, std::span<const float> rows) override;
  void prefill(std::span<const int32_t> context) override;
  void propose(const DraftRequest& req, DraftProposal& out) override;
  void rollback(int64_t length) override;
  // The catch-up window (0: every position); takes effect at the next catch-up.
  void set_catch_up_window(int64_t window);

 private:
  // The request's penalties on the head's logits of the touched tokens it can propose (its own
  // and the context tokens'); `undo` puts the raw values back.
  void penalize(PenaltyHistory* penalties, PenaltyHistory::Undo& undo);
  DraftPenalties penalties_;

  int64_t known_hidden() const { return static_cast<int64_t>(h_.size()) / row_; }
  // The depth-1 features of `n` target rows from `rows` [n, row_]: the rows themselves, or
  // fuse . row for a head with feature layers. Returns a pointer to [n, H].
  const float* depth1_features(const float* rows, int64_t n);
  bool continues_chain(std::span<const int32_t> context) const;
  // entries_ = `entries`; back before the window's start, the cache restarts there.
  void settle(int64_t entries);
  // The cache empties and holds entries from `entry` + 1 on (base_ = entries_ = entry).
  void restart_at(int64_t entry);
  // A draft token from logits_ (false: the entropy rule stops the draft here): sampled, with the
  // head's token ids, log q and q in increasing id left in ids_, logq_ and q_, or greedy. The
  // token's draft probability goes to `confidence`.
  bool draft_reduced(const DraftRequest& req, int64_t i, int32_t& token, DraftConfidence& confidence);
  bool draft_greedy(const DraftRequest& req, int64_t i, int32_t& token, DraftConfidence& confidence);
  // Appends the q row of the token just drafted to out.q (full vocabulary, as the verifier reads it);
  // nothing where the verdict does not read q (DraftRequest::verdict_reads_q).
  void append_q_row(const DraftRequest& req, DraftProposal& out) const;
  // Feeds entries at positions [pos, pos + n) with features f [n, H] and tokens; leaves the
  // layer outputs g [n, H] in g_ and, with `logits`, the reduced logits of the last entry in
  // logits_ [N].
  void run(const float* f, std::span<const int32_t> tokens, int64_t pos, bool logits);

  std::shared_ptr<const EagleWeights> w_;
  int64_t hidden_ = 0, row_ = 0;  // H; a target row's width (H x (1 + feature layers))
  std::unique_ptr<KvCache> kv_;
  int seq_ = -1;
  int64_t entries_ = 0;       // depth-1 entries base_+1..entries_ in the cache (slots 0..entries_-base_-1)
  int64_t base_ = 0;          // entries 1..base_ were skipped by a windowed catch-up (0: none)
  // Positions 0..floor_-1 of the context came with no target rows (the engine's prefix cache
  // shared their K/V, so the target never ran them): h_ holds zeros there, and no entry at or
  // before floor_ is fed, as if the context began at floor_ (a windowed catch-up's restart).
  int64_t floor_ = 0;
  int64_t window_ = 0;        // a catch-up feeds at most this many entries (0: all)
  // The last proposal: its context followed by the tokens proposed, and the head's output g of
  // the entry that proposed the last of them (the feature a continuation starts from).
  std::vector<int32_t> chain_;
  std::vector<float> chain_g_;
  std::vector<float> h_;      // the target's rows h_0.. of the context, [known, row_]
  std::vector<float> fused_;  // depth1_features' output
  DeviceBuffer rows_d_, fused_d_;
  std::vector<float> g_, cat_, e_, logits_, logq_, q_, feat_, red_;
  std::vector<int32_t> ids_;  // the head's token ids in increasing order (with logq_, q_: draft_reduced)
  // Context tokens outside the head's map, proposed with the target's own output rows: their
  // ids in increasing order, their rows [E, H] (times context_scale), and for draft_reduced the
  // N + E logits' indices in increasing token id.
  int64_t context_tokens_ = 0;  // at most this many (0: none)
  std::vector<int32_t> extras_, order_, logits_extras_;  // logits_extras_: the extras logits_ holds
  std::vector<float> extra_rows_, xn_host_;
  // extras_ (and their rows and order_) for a context: its out-of-map tokens, newest first, up to
  // context_tokens_, in increasing id.
  void gather_context_tokens(std::span<const int32_t> context);
  // The target token id of logit r (r < N: the map's; then extras_).
  int32_t token_of(size_t r) const;
  std::vector<int32_t> positions_;
  DeviceBuffer cat_d_, x_d_, xn_d_, q_d_, k_d_, v_d_, att_d_, tmp_d_, gate_d_, up_d_, e_d_, logits_d_;
  int64_t capacity_ = 0;
};

}  // namespace specula
