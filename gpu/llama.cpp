// Llama forward: RMSNorm -> attention (RoPE, GQA, paged KV) -> residual -> RMSNorm -> SwiGLU
// MLP -> residual, per layer; then the final norm and the output head on the rows wanted.
#include "gpu/llama.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace specula {

LlamaModel::LlamaModel(const ModelWeights& w, Ops& ops) : ops_(ops), cfg_(w.config) {
  int64_t elements = w.embed.numel() + w.output_norm.numel();
  if (w.output.data != w.embed.data) elements += w.output.numel();
  for (const LayerWeights& l : w.layers)
    for (const TensorView* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      elements += t->numel();
  ops.reserve_weights(elements);
  embed_ = ops.upload_table(w.embed);
  output_norm_ = ops.upload(w.output_norm);
  output_ = ops.upload(w.output);
  for (const LayerWeights& l : w.layers) {
    // A layer's matrices are read only through the device from here on, so their stored bytes may
    // go as each layer is uploaded (the process never holds all the weights twice); the output
    // head's may not (its top logits are computed again from stored rows, and a tied head is the
    // embedding table).
    const LlamaLayer& L = layers_.emplace_back(upload_layer(ops, l));
    for (const Weight* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) ops.release_stored(*m);
  }
  inv_freq_ = rope_inv_freq(cfg_);
  const char* graphs = std::getenv("SPECULA_CUDA_GRAPHS");
  recorded_steps_ = graphs && std::strcmp(graphs, "1") == 0;
}

LlamaModel::~LlamaModel() { ops_.forget_recordings(this); }

KvCacheConfig LlamaModel::kv_config(int64_t max_tokens, int64_t block_tokens) const {
  KvCacheConfig c;
  c.layers = cfg_.layers;
  c.kv_heads = cfg_.kv_heads;
  c.head_dim = cfg_.head_dim;
  c.block_tokens = block_tokens;
  c.num_blocks = (max_tokens + block_tokens - 1) / block_tokens;
  c.use_device_layouts(ops_);
  return c;
}

int64_t LlamaModel::weight_bytes_per_token() const {
  int64_t b = static_cast<int64_t>(ops_.read_bytes(output_) + output_norm_.view.nbytes);
  b += static_cast<int64_t>(embed_.view.nbytes / std::max<int64_t>(1, embed_.rows()));  // one embedding row
  for (const LlamaLayer& l : layers_)
    for (const Weight* m : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      b += static_cast<int64_t>(ops_.read_bytes(*m));
  return b;
}

void LlamaModel::set_feature_layers(std::vector<int> layers) {
  for (int l : layers)
    if (l < 0 || l >= cfg_.layers)
      throw std::invalid_argument("feature layer " + std::to_string(l) + " is outside the model's blocks 0.." +
                                  std::to_string(cfg_.layers - 1));
  if (!layers.empty() && ones_.empty()) {
    ones_.assign(static_cast<size_t>(cfg_.hidden), 1.0f);
    TensorView t;
    t.name = "feature_norm.weight";
    t.dtype = DType::F32;
    t.shape = {cfg_.hidden};
    t.data = reinterpret_cast<const std::byte*>(ones_.data());
    t.nbytes = ones_.size() * sizeof(float);
    ones_weight_ = ops_.upload(t);
  }
  feature_layers_ = std::move(layers);
  if (capacity_out_rows_ > 0) ensure_layer_features(capacity_out_rows_);
  ++workspace_generation_;
  ops_.forget_recordings(this);
}

void LlamaModel::ensure_layer_features(int64_t out_rows) {
  if (!feature_layers_.empty())
    layer_feat_.ensure(ops_, out_rows * cfg_.hidden * static_cast<int64_t>(feature_layers_.size()));
}

void LlamaModel::ensure_workspace(int64_t rows, int64_t out_rows) {
  if (out_rows > capacity_out_rows_) {
    logits_rows_.ensure(ops_, out_rows * cfg_.vocab_size);
    ensure_layer_features(out_rows);
    capacity_out_rows_ = out_rows;
    ++workspace_generation_;
    ops_.forget_recordings(this);
  }
  if (rows <= capacity_rows_) return;
  ++workspace_generation_;
  ops_.forget_recordings(this);
  const int64_t H = cfg_.hidden, Q = cfg_.heads * cfg_.head_dim, KV = cfg_.kv_heads * cfg_.head_dim;
  const int64_t I = cfg_.intermediate;
  x_.ensure(ops_, rows * H);
  xn_.ensure(ops_, rows * H);
  q_.ensure(ops_, rows * Q);
  k_.ensure(ops_, rows * KV);
  v_.ensure(ops_, rows * KV);
  att_.ensure(ops_, rows * Q);
  gate_.ensure(ops_, rows * I);
  up_.ensure(ops_, rows * I);
  hidden_.ensure(ops_, rows * H);
  capacity_rows_ = rows;
}

void LlamaModel::forward(std::span<const ForwardSeq> batch, KvCache& kv, std::vector<float>& logits,
                         const std::vector<bool>* skip_layers) {
  const DeviceLogits out = forward_on_device(batch, kv, skip_layers);
  logits.resize(static_cast<size_t>(out.rows * cfg_.vocab_size));
  ops_.copy_to_host(out.data, logits.data(), logits.size());
}

int64_t LlamaModel::checked_start(const ForwardSeq& s, const KvCache& kv) const {
  if (s.tokens.empty()) throw std::invalid_argument("forward: a sequence with no new tokens");
  const int64_t start = kv.length(s.seq), n = static_cast<int64_t>(s.tokens.size());
  if (start + n > cfg_.max_positions && cfg_.max_positions > 0)
    throw std::invalid_argument("context overflow: " + std::to_string(start + n) + " positions > the model's " +
                                std::to_string(cfg_.max_positions));
  return start;
}

void LlamaModel::set_max_forward_rows(int64_t rows) {
  if (rows < 1) throw std::invalid_argument("the rows of a forward's piece must be at least 1, not " + std::to_string(rows));
  max_forward_rows_ = rows;
}

LlamaModel::DeviceLogits LlamaModel::forward_on_device(std::span<const ForwardSeq> batch, KvCache& kv,
                                                       const std::vector<bool>* skip_layers) {
  int64_t rows = 0;
  for (const ForwardSeq& s : batch) rows += static_cast<int64_t>(s.tokens.size());
  return rows > max_forward_rows_ ? forward_in_pieces(batch, kv, skip_layers, rows) : forward_piece(batch, kv, skip_layers);
}

LlamaModel::DeviceLogits LlamaModel::forward_in_pieces(std::span<const ForwardSeq> batch, KvCache& kv,
                                                       const std::vector<bool>* skip_layers, int64_t rows) {
  // What would refuse the whole batch refuses it before any piece has run.
  std::vector<int64_t> start;
  int64_t n_out = 0;
  bool all_hidden = false;
  for (const ForwardSeq& s : batch) {
    const int64_t at = checked_start(s, kv), n = static_cast<int64_t>(s.tokens.size());
    start.push_back(at);
    n_out += s.all_logits ? n : 1;
    all_hidden = all_hidden || s.all_hidden;
  }
  const int64_t H = cfg_.hidden, V = cfg_.vocab_size, C = static_cast<int64_t>(feature_layers_.size());
  pieces_logits_.ensure(ops_, static_cast<size_t>(n_out * V));
  pieces_out_final_.ensure(ops_, static_cast<size_t>(n_out * H));
  if (C > 0) pieces_out_layers_.ensure(ops_, static_cast<size_t>(C * n_out * H));
  if (all_hidden) {
    pieces_all_final_.ensure(ops_, static_cast<size_t>(rows * H));
    if (C > 0) pieces_all_layers_.ensure(ops_, static_cast<size_t>(C * rows * H));
  }
  // Each piece takes the next max_forward_rows_ tokens in batch order, so a sequence's tokens are
  // split only across consecutive pieces. A piece's logits row for a sequence whose tokens go on
  // in the next piece is computed (the piece's forward gives each sequence its last row) and
  // dropped: one row of the output head a piece. With any sequence asking for every row's
  // features, every row of every piece keeps them, as one forward would.
  std::vector<size_t> taken(batch.size(), 0);
  std::vector<ForwardSeq> piece;
  std::vector<int64_t> keep, all_rows;  // all_rows: 0, 1, ... (a piece's every row, gathered as is)
  if (all_hidden)
    for (int64_t r = 0; r < std::min(rows, max_forward_rows_); ++r) all_rows.push_back(r);
  int64_t out_at = 0, row_at = 0;
  size_t i = 0;
  try {
    while (i < batch.size()) {
      piece.clear();
      keep.clear();
      int64_t room = max_forward_rows_, piece_out = 0;
      for (; i < batch.size() && room > 0;) {
        const ForwardSeq& s = batch[i];
        const size_t n = std::min(static_cast<size_t>(room), s.tokens.size() - taken[i]);
        const bool last = taken[i] + n == s.tokens.size();
        piece.push_back({s.seq, s.tokens.subspan(taken[i], n), s.all_logits, all_hidden});
        const int64_t outs = s.all_logits ? static_cast<int64_t>(n) : 1;
        if (s.all_logits || last)
          for (int64_t k = 0; k < outs; ++k) keep.push_back(piece_out + k);
        piece_out += outs;
        taken[i] += n;
        room -= static_cast<int64_t>(n);
        if (last) ++i;
      }
      forward_piece(piece, kv, skip_layers);
      if (!keep.empty()) {  // empty: the piece held only the start of one sequence's tokens
        ops_.gather_rows(logits_rows_.get(), V, keep, pieces_logits_.get() + out_at * V);
        ops_.gather_rows(out_final_, H, keep, pieces_out_final_.get() + out_at * H);
        for (int64_t c = 0; c < C; ++c)
          ops_.gather_rows(out_layers_ + c * out_stride_ * H, H, keep,
                           pieces_out_layers_.get() + (c * n_out + out_at) * H);
        out_at += static_cast<int64_t>(keep.size());
      }
      if (all_hidden) {
        const auto piece_rows = std::span<const int64_t>(all_rows).first(static_cast<size_t>(last_all_hidden_rows_));
        ops_.gather_rows(all_final_, H, piece_rows, pieces_all_final_.get() + row_at * H);
        for (int64_t c = 0; c < C; ++c)
          ops_.gather_rows(all_layers_ + c * all_stride_ * H, H, piece_rows,
                           pieces_all_layers_.get() + (c * rows + row_at) * H);
        row_at += last_all_hidden_rows_;
      }
    }
  } catch (...) {
    for (size_t j = 0; j < batch.size(); ++j) kv.truncate_to(batch[j].seq, start[j]);
    last_out_rows_ = last_all_hidden_rows_ = 0;  // no features of a failed forward
    throw;
  }
  out_final_ = pieces_out_final_.get();
  out_layers_ = pieces_out_layers_.get();
  out_stride_ = n_out;
  last_out_rows_ = n_out;
  if (all_hidden) {
    all_final_ = pieces_all_final_.get();
    all_layers_ = pieces_all_layers_.get();
    all_stride_ = rows;
    last_all_hidden_rows_ = rows;
  }
  return DeviceLogits{pieces_logits_.get(), n_out};
}

LlamaModel::DeviceLogits LlamaModel::forward_piece(std::span<const ForwardSeq> batch, KvCache& kv,
                                                   const std::vector<bool>* skip_layers) {
  // Lay the batch out as rows and reserve KV positions; on failure undo the reservations.
  std::vector<SeqSlice> slices;
  std::vector<int32_t> tokens, positions;
  std::vector<int64_t> out_rows;
  int64_t rows = 0;
  for (const ForwardSeq& s : batch) {
    const int64_t start = checked_start(s, kv), n = static_cast<int64_t>(s.tokens.size());
    slices.push_back(SeqSlice{s.seq, start, n, rows});
    for (int64_t i = 0; i < n; ++i) {
      tokens.push_back(s.tokens[i]);
      positions.push_back(static_cast<int32_t>(start + i));
      if (s.all_logits || i == n - 1) out_rows.push_back(rows + i);
    }
    rows += n;
  }
  for (size_t i = 0; i < slices.size(); ++i) {
    try {
      kv.reserve(slices[i].seq, slices[i].start + slices[i].n);
    } catch (...) {
      for (size_t j = 0; j < i; ++j) kv.truncate_to(slices[j].seq, slices[j].start);
      throw;
    }
  }

  bool all_hidden = false;
  for (const ForwardSeq& s : batch) all_hidden = all_hidden || s.all_hidden;
  try {
    ensure_workspace(rows, static_cast<int64_t>(out_rows.size()));
    last_all_hidden_rows_ = 0;
    if (all_hidden) {
      // Not recorded (a rare step: a drafter's prefill); the rows are normed after the layers.
      hidden_all_.ensure(ops_, rows * cfg_.hidden);
      if (!feature_layers_.empty()) layer_feat_all_.ensure(ops_, rows * cfg_.hidden * static_cast<int64_t>(feature_layers_.size()));
      run_layers(tokens, positions, slices, out_rows, kv, skip_layers, true);
      ops_.rmsnorm(x_.get(), output_norm_, cfg_.rms_eps, rows, cfg_.hidden, hidden_all_.get());
      last_all_hidden_rows_ = rows;
      all_final_ = hidden_all_.get();
      all_layers_ = layer_feat_all_.get();
      all_stride_ = rows;
    } else {
      const Ops::RecordingKey key = recording_key(batch, rows, static_cast<int64_t>(out_rows.size()), kv, skip_layers);
      if (key.shape.empty() || !run_recorded(key, tokens, positions, slices, out_rows, kv, skip_layers))
        run_layers(tokens, positions, slices, out_rows, kv, skip_layers);
    }
  } catch (...) {
    for (const SeqSlice& s : slices) kv.truncate_to(s.seq, s.start);
    throw;
  }
  last_out_rows_ = static_cast<int64_t>(out_rows.size());
  out_final_ = xn_.get();
  out_layers_ = layer_feat_.get();
  out_stride_ = capacity_out_rows_;
  return DeviceLogits{logits_rows_.get(), last_out_rows_};
}

LlamaLayer upload_layer(Ops& ops, const LayerWeights& l) {
  return {ops.upload(l.attn_norm), ops.upload(l.wq),     ops.upload(l.wk),   ops.upload(l.wv),    ops.upload(l.wo),
          ops.upload(l.ffn_norm),  ops.upload(l.w_gate), ops.upload(l.w_up), ops.upload(l.w_down)};
}

void decoder_block(Ops& ops, const LlamaConfig& cfg, const LlamaLayer& L, std::span<const float> inv_freq, int layer,
                   std::span<const int32_t> positions, std::span<const SeqSlice> slices, KvCache& kv, float* x,
                   int64_t rows, const BlockScratch& s, bool refine_down) {
  const int64_t H = cfg.hidden, hd = cfg.head_dim, I = cfg.intermediate;
  ops.rmsnorm(x, L.attn_norm, cfg.rms_eps, rows, H, s.xn);
  {
    const Weight* w[] = {&L.wq, &L.wk, &L.wv};
    float* y[] = {s.q, s.k, s.v};
    ops.matmul_many(s.xn, w, rows, y);
  }
  ops.rope(s.q, rows, cfg.heads, hd, positions, inv_freq, cfg.rope_style);
  ops.rope(s.k, rows, cfg.kv_heads, hd, positions, inv_freq, cfg.rope_style);
  ops.kv_store(kv, layer, s.k, s.v, slices);
  ops.attention(s.q, kv, layer, slices, cfg.heads, s.att);
  ops.matmul(s.att, L.wo, rows, s.tmp);
  ops.add(x, s.tmp, rows * H);

  ops.rmsnorm(x, L.ffn_norm, cfg.rms_eps, rows, H, s.xn);
  {
    const Weight* w[] = {&L.w_gate, &L.w_up};
    float* y[] = {s.gate, s.up};
    ops.matmul_many(s.xn, w, rows, y);
  }
  ops.swiglu(s.gate, s.up, rows * I, s.gate);
  if (refine_down) ops.matmul_refined(s.gate, L.w_down, rows, s.tmp);
  else ops.matmul(s.gate, L.w_down, rows, s.tmp);
  ops.add(x, s.tmp, rows * H);
}

void LlamaModel::run_layers(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                            std::span<const SeqSlice> slices, std::span<const int64_t> out_rows, KvCache& kv,
                            const std::vector<bool>* skip_layers, bool all_rows_features) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  const int64_t H = cfg_.hidden;
  float *x = x_.get(), *xn = xn_.get();
  const BlockScratch scratch{xn, q_.get(), k_.get(), v_.get(), att_.get(), hidden_.get(), gate_.get(), up_.get()};

  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  ops_.embed(embed_, tokens, x);
  for (int64_t li = 0; li < cfg_.layers; ++li) {
    // The last layer's down projection in two int8 rows: its rounding reaches the logits with no
    // layer after it (docs/kernels.md, "The last down projection in two int8 rows").
    const bool last = li + 1 == cfg_.layers;
    if (!skip_layers || !(*skip_layers)[li])
      decoder_block(ops_, cfg_, layers_[li], inv_freq_, static_cast<int>(li), positions, slices, kv, x, rows, scratch, last);
    for (size_t c = 0; c < feature_layers_.size(); ++c) {
      if (feature_layers_[c] != li) continue;
      // The block's scratch is free until the next block: hidden_ holds the gathered rows.
      ops_.gather_rows(x, H, out_rows, hidden_.get());
      ops_.rmsnorm(hidden_.get(), ones_weight_, cfg_.rms_eps, n_out, H,
                   layer_feat_.get() + static_cast<int64_t>(c) * capacity_out_rows_ * H);
      if (all_rows_features)
        ops_.rmsnorm(x, ones_weight_, cfg_.rms_eps, rows, H, layer_feat_all_.get() + static_cast<int64_t>(c) * rows * H);
    }
  }

  // The output head only on the rows whose logits are wanted: prefill pays for one row.
  ops_.gather_rows(x, H, out_rows, hidden_.get());
  ops_.rmsnorm(hidden_.get(), output_norm_, cfg_.rms_eps, n_out, H, xn);
  ops_.matmul_logits(xn, output_, n_out, logits_rows_.get());
}

void LlamaModel::copy_features(const float* final_rows, const float* layer_rows, int64_t rows, int64_t stride,
                               std::vector<float>& out) {
  const int64_t H = cfg_.hidden, F = feature_width();
  out.resize(static_cast<size_t>(rows * F));
  if (rows == 0) return;
  if (feature_layers_.empty()) {
    ops_.copy_to_host(final_rows, out.data(), out.size());
    return;
  }
  std::vector<float>& chunk = feature_chunk_;
  chunk.resize(static_cast<size_t>(rows * H));
  for (size_t c = 0; c <= feature_layers_.size(); ++c) {
    const float* src = c == 0 ? final_rows : layer_rows + static_cast<int64_t>(c - 1) * stride * H;
    ops_.copy_to_host(src, chunk.data(), chunk.size());
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(out.data() + r * F + static_cast<int64_t>(c) * H, chunk.data() + r * H, static_cast<size_t>(H) * sizeof(float));
  }
}

void LlamaModel::last_hidden_all(std::vector<float>& out) {
  copy_features(all_final_, all_layers_, last_all_hidden_rows_, all_stride_, out);
}

void LlamaModel::last_hidden(std::vector<float>& out) {
  copy_features(out_final_, out_layers_, last_out_rows_, out_stride_, out);
}

Ops::RecordingKey LlamaModel::recording_key(std::span<const ForwardSeq> batch, int64_t rows, int64_t n_out,
                                             const KvCache& kv, const std::vector<bool>* skip_layers) const {
  Ops::RecordingKey key{this, {}};
  if (!recorded_steps_ || !ops_.can_record() || batch.size() != 1 || rows > kMaxRecordedRows) return key;
  // Everything the recorded kernels take as fixed: the row counts, the buffers (the activations'
  // generation, the cache's pools and layout) and the layers run.
  const KvCacheConfig& c = kv.config();
  std::string& s = key.shape;
  s = "rows " + std::to_string(rows) + " out " + std::to_string(n_out) + " gen " + std::to_string(workspace_generation_) +
      " kv " + std::to_string(reinterpret_cast<uintptr_t>(kv.k_pool(0))) + "," +
      std::to_string(reinterpret_cast<uintptr_t>(kv.v_pool(0))) + " " + std::to_string(c.layers) + "x" +
      std::to_string(c.num_blocks) + "x" + std::to_string(c.block_tokens) + "x" + std::to_string(c.kv_heads) + "x" +
      std::to_string(c.head_dim) + " skip ";
  if (skip_layers)
    for (bool b : *skip_layers) s += b ? '1' : '0';
  return key;
}

bool LlamaModel::run_recorded(const Ops::RecordingKey& key, std::span<const int32_t> tokens,
                              std::span<const int32_t> positions, std::span<const SeqSlice> slices,
                              std::span<const int64_t> out_rows, KvCache& kv, const std::vector<bool>* skip_layers) {
  if (unrecordable_shapes_.count(key.shape)) return false;
  auto unrecordable = [&] {
    if (unrecordable_shapes_.size() > 256) unrecordable_shapes_.clear();
    unrecordable_shapes_.insert(key.shape);
    return false;
  };
  // A bad argument fails the step as it would unrecorded; a device error while recording or
  // replaying (std::runtime_error: a capture the device refused) runs the step as usual instead.
  try {
    if (ops_.replay_begin(key)) {
      run_layers(tokens, positions, slices, out_rows, kv, skip_layers);  // stages the host arrays only
      return ops_.replay_end();
    }
    // The first time a shape is seen it runs as usual (device scratch grows to fit it); the
    // second time it is recorded.
    if (seen_shapes_.size() > 256) seen_shapes_.clear();  // caches come and go (a drafter's per request)
    if (seen_shapes_.insert(key.shape).second) return false;
    ops_.record_begin();
    run_layers(tokens, positions, slices, out_rows, kv, skip_layers);
    return ops_.record_end(key) || unrecordable();
  } catch (const std::runtime_error&) {
    ops_.recording_cancel();
    return unrecordable();
  } catch (...) {
    ops_.recording_cancel();
    throw;
  }
}

}  // namespace specula
