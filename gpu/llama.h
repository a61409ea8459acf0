// The Llama forward pass, written once against gpu/ops.h: a batch of sequence slices in,
// logits for the rows asked for out.
#pragma once
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "gpu/kv_cache.h"
#include "gpu/ops.h"
#include "model/weights.h"

namespace specula {

// One sequence's new tokens in a batched forward.
struct ForwardSeq {
  int seq = -1;                      // KV cache sequence; tokens append at its current length
  std::span<const int32_t> tokens;   // new tokens
  bool all_logits = false;           // logits for every new token (verification) or only the last
  bool all_hidden = false;           // keep every new token's final hidden state (LlamaModel::last_hidden_all)
};

// One decoder block's weights on a device.
struct LlamaLayer {
  Weight attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
};
LlamaLayer upload_layer(Ops& ops, const LayerWeights& l);

// The activations a decoder block needs beside x, each at least [rows, its width].
struct BlockScratch {
  float *xn, *q, *k, *v, *att, *tmp, *gate, *up;
};

// One Llama decoder block over x [rows, cfg.hidden], in place: x += attention(norm(x)) with RoPE
// at `positions`, this block's K/V stored in `kv` layer `layer` for `slices`; then
// x += SwiGLU MLP(norm(x)). The target's layers and the draft head's one layer both run this.
// refine_down: the down projection through Ops::matmul_refined (the target's last layer).
void decoder_block(Ops& ops, const LlamaConfig& cfg, const LlamaLayer& L, std::span<const float> inv_freq, int layer,
                   std::span<const int32_t> positions, std::span<const SeqSlice> slices, KvCache& kv, float* x,
                   int64_t rows, const BlockScratch& s, bool refine_down = false);

class LlamaModel {
 public:
  // Uploads the weights to the device. `weights` must outlive the model (host views point
  // into its mapped files).
  LlamaModel(const ModelWeights& weights, Ops& ops);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // Recorded steps (Ops::record_begin, CUDA graphs): a forward of one sequence with at most
  // kMaxRecordedRows new tokens (decode, K+1 verification) is recorded the second time its shape
  // is seen and replayed after that. Off by default; SPECULA_CUDA_GRAPHS=1 in the environment
  // turns it on for every model; devices that cannot record ignore it.
  static constexpr int64_t kMaxRecordedRows = 16;
  void set_recorded_steps(bool on) { recorded_steps_ = on; }
  bool recorded_steps() const { return recorded_steps_; }

  // A forward of more new tokens than this runs as forwards of at most this many rows in turn
  // (llama.cpp's ubatch; docs/engine.md, "Prefill in pieces"): the activations' scratch, which
  // is kept at the widest forward seen, stays bounded whatever the prompt's length. The results
  // are those of one forward: every sequence's tokens stay in order, the K/V of a piece is in the
  // cache before the next piece attends to it, and a row's result does not depend on the rows
  // beside it (docs/kernels.md, "Bit-identical rows"). Throws std::invalid_argument below 1.
  static constexpr int64_t kDefaultMaxForwardRows = 512;
  void set_max_forward_rows(int64_t rows);
  int64_t max_forward_rows() const { return max_forward_rows_; }

  const LlamaConfig& config() const { return cfg_; }
  Ops& ops() const { return ops_; }
  // A KV cache sized for `max_tokens` positions across all sequences.
  KvCacheConfig kv_config(int64_t max_tokens, int64_t block_tokens = 16) const;

  // Appends each sequence's tokens to `kv` and writes logits into `logits` (host memory):
  // rows in batch order, one per token of an all_logits sequence and one for the last token
  // of the others; [rows, vocab]. Throws KvCacheFull (cache unchanged) when blocks run out,
  // std::invalid_argument for an empty sequence or a context overflow.
  // `skip_layers` (optional, one flag per layer) runs the model with those blocks skipped,
  // which is how the self-speculative drafter shares the target's weights.
  void forward(std::span<const ForwardSeq> batch, KvCache& kv, std::vector<float>& logits,
               const std::vector<bool>* skip_layers = nullptr);

  // The same forward with the logits left where the device computed them: `rows` x vocab floats
  // at `data` in the device's memory (host memory on the host device), valid until the next
  // forward of this model. The work may still be queued on the device's stream.
  struct DeviceLogits {
    const float* data = nullptr;
    int64_t rows = 0;
  };
  DeviceLogits forward_on_device(std::span<const ForwardSeq> batch, KvCache& kv,
                                 const std::vector<bool>* skip_layers = nullptr);

  // The features an EAGLE-style draft reads (issue 13), per row: the final hidden state (after
  // the final norm: the output head's input), then, for each layer index l of `layers` in order,
  // the residual stream after decoder block l, RMS-normalised without a weight (EAGLE-3's low and
  // middle features). Empty (the default): the final hidden state alone. Rows are
  // feature_width() = hidden x (1 + layers.size()) floats. Throws std::invalid_argument for an
  // index outside the model's blocks.
  void set_feature_layers(std::vector<int> layers);
  const std::vector<int>& feature_layers() const { return feature_layers_; }
  int64_t feature_width() const { return cfg_.hidden * (1 + static_cast<int64_t>(feature_layers_.size())); }
  // The last forward's features, one row per logits row, [rows, feature_width()], copied to the
  // host.
  void last_hidden(std::vector<float>& out);
  // The last forward's features of every row, [rows, feature_width()] in batch order, when a
  // sequence of it asked for all_hidden (empty otherwise). Each row equals last_hidden's row for
  // the same token bit for bit (the same per-row norms).
  void last_hidden_all(std::vector<float>& out);

  // Bytes of weights one decode step reads (every matrix as the device keeps it, the output head,
  // the norms, one embedding row).
  int64_t weight_bytes_per_token() const;

 private:
  void ensure_workspace(int64_t rows, int64_t out_rows);
  // A sequence's first new position in `kv`; throws std::invalid_argument for no new tokens or a
  // context overflow.
  int64_t checked_start(const ForwardSeq& s, const KvCache& kv) const;
  // The batch as one forward, and as forwards of at most max_forward_rows_ rows (`rows` in all).
  DeviceLogits forward_piece(std::span<const ForwardSeq> batch, KvCache& kv, const std::vector<bool>* skip_layers);
  DeviceLogits forward_in_pieces(std::span<const ForwardSeq> batch, KvCache& kv, const std::vector<bool>* skip_layers,
                                 int64_t rows);
  // The feature layers' rows for `out_rows` logits rows (nothing without feature layers).
  void ensure_layer_features(int64_t out_rows);
  // The step's recording key, or an empty shape when the step is not recordable.
  Ops::RecordingKey recording_key(std::span<const ForwardSeq> batch, int64_t rows, int64_t n_out, const KvCache& kv,
                                  const std::vector<bool>* skip_layers) const;
  // Runs the step from a recording (or records it); false: run it as usual.
  bool run_recorded(const Ops::RecordingKey& key, std::span<const int32_t> tokens, std::span<const int32_t> positions,
                    std::span<const SeqSlice> slices, std::span<const int64_t> out_rows, KvCache& kv,
                    const std::vector<bool>* skip_layers);
  // all_rows_features: also write the feature layers' rows of every row (an all_hidden forward).
  void run_layers(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                  std::span<const SeqSlice> slices, std::span<const int64_t> out_rows, KvCache& kv,
                  const std::vector<bool>* skip_layers, bool all_rows_features = false);

  Ops& ops_;
  LlamaConfig cfg_;
  Weight embed_, output_norm_, output_;
  std::vector<LlamaLayer> layers_;
  std::vector<float> inv_freq_;
  // Activations [rows, width] for the widest batch seen so far.
  DeviceBuffer x_, xn_, q_, k_, v_, att_, gate_, up_, hidden_, logits_rows_, hidden_all_;
  // Feature layers: their normed rows, chunk c of the out rows at layer_feat_ + c x capacity_out_rows_
  // x hidden, of all rows (all_hidden) at layer_feat_all_ + c x rows x hidden; `ones_` is the norm's weight.
  std::vector<int> feature_layers_;
  std::vector<float> ones_;
  Weight ones_weight_;
  DeviceBuffer layer_feat_, layer_feat_all_;
  // Interleaves chunk 0 (`final_rows`) and the layer chunks (`layer_rows`, chunk stride `stride`
  // rows) into [rows, feature_width()] on the host.
  void copy_features(const float* final_rows, const float* layer_rows, int64_t rows, int64_t stride, std::vector<float>& out);
  std::vector<float> feature_chunk_;  // copy_features' host staging, kept across forwards
  int64_t last_out_rows_ = 0;         // logits rows of the last forward
  int64_t last_all_hidden_rows_ = 0;  // rows of every-row features the last forward filled (0: none asked)
  // Where the last forward's features are: the logits rows' (final rows, then the layer chunks
  // `out_stride` rows apart) and every row's (`all_stride` rows apart). A one-piece forward's are
  // its workspace (xn_, layer_feat_, hidden_all_, layer_feat_all_); a forward in pieces gathers
  // each piece's into the pieces' buffers below.
  const float *out_final_ = nullptr, *out_layers_ = nullptr, *all_final_ = nullptr, *all_layers_ = nullptr;
  int64_t out_stride_ = 0, all_stride_ = 0;
  DeviceBuffer pieces_logits_, pieces_out_final_, pieces_out_layers_, pieces_all_final_, pieces_all_layers_;
  int64_t max_forward_rows_ = kDefaultMaxForwardRows;
  int64_t capacity_rows_ = 0, capacity_out_rows_ = 0;
  // Recorded steps: bumped when the activations are reallocated (recordings hold their addresses).
  bool recorded_steps_ = false;
  uint64_t workspace_generation_ = 0;
  std::set<std::string> seen_shapes_, unrecordable_shapes_;
};

}  // namespace specula
