// Llama forward: RMSNorm -> attention (RoPE, GQA, paged KV) -> residual -> RMSNorm -> SwiGLU
// MLP -> residual, per layer; then the final norm and the output head on the rows wanted.
#include "gpu/llama.h"

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
  embed_ = ops.upload(w.embed);
  output_norm_ = ops.upload(w.output_norm);
  output_ = ops.upload(w.output);
  for (const LayerWeights& l : w.layers)
    layers_.push_back(Layer{ops.upload(l.attn_norm), ops.upload(l.wq), ops.upload(l.wk), ops.upload(l.wv),
                            ops.upload(l.wo), ops.upload(l.ffn_norm), ops.upload(l.w_gate), ops.upload(l.w_up),
                            ops.upload(l.w_down)});
  inv_freq_ = rope_inv_freq(cfg_);
}

KvCacheConfig LlamaModel::kv_config(int64_t max_tokens, int64_t block_tokens) const {
  KvCacheConfig c;
  c.layers = cfg_.layers;
  c.kv_heads = cfg_.kv_heads;
  c.head_dim = cfg_.head_dim;
  c.block_tokens = block_tokens;
  c.num_blocks = (max_tokens + block_tokens - 1) / block_tokens;
  return c;
}

int64_t LlamaModel::weight_bytes_per_token() const {
  int64_t b = static_cast<int64_t>(output_.view.nbytes + output_norm_.view.nbytes);
  b += static_cast<int64_t>(embed_.view.nbytes / std::max<int64_t>(1, embed_.rows()));  // one embedding row
  for (const Layer& l : layers_)
    for (const Weight* m : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
      b += static_cast<int64_t>(m->view.nbytes);
  return b;
}

void LlamaModel::ensure_workspace(int64_t rows) {
  if (rows <= capacity_rows_) return;
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

LlamaModel::DeviceLogits LlamaModel::forward_on_device(std::span<const ForwardSeq> batch, KvCache& kv,
                                                       const std::vector<bool>* skip_layers) {
  // Lay the batch out as rows and reserve KV positions; on failure undo the reservations.
  std::vector<SeqSlice> slices;
  std::vector<int32_t> tokens, positions;
  std::vector<int64_t> out_rows;
  int64_t rows = 0;
  for (const ForwardSeq& s : batch) {
    if (s.tokens.empty()) throw std::invalid_argument("forward: a sequence with no new tokens");
    const int64_t start = kv.length(s.seq), n = static_cast<int64_t>(s.tokens.size());
    if (start + n > cfg_.max_positions && cfg_.max_positions > 0)
      throw std::invalid_argument("context overflow: " + std::to_string(start + n) + " positions > the model's " +
                                  std::to_string(cfg_.max_positions));
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

  try {
    run_layers(tokens, positions, slices, out_rows, kv, skip_layers);
  } catch (...) {
    for (const SeqSlice& s : slices) kv.truncate_to(s.seq, s.start);
    throw;
  }
  return DeviceLogits{logits_rows_.get(), static_cast<int64_t>(out_rows.size())};
}

void LlamaModel::run_layers(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                            std::span<const SeqSlice> slices, std::span<const int64_t> out_rows, KvCache& kv,
                            const std::vector<bool>* skip_layers) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  ensure_workspace(rows);
  const int64_t H = cfg_.hidden, hd = cfg_.head_dim, I = cfg_.intermediate;
  float *x = x_.get(), *xn = xn_.get(), *q = q_.get(), *k = k_.get(), *v = v_.get(), *att = att_.get();

  ops_.embed(embed_, tokens, x);
  for (int64_t li = 0; li < cfg_.layers; ++li) {
    if (skip_layers && (*skip_layers)[li]) continue;
    const Layer& L = layers_[li];
    ops_.rmsnorm(x, L.attn_norm, cfg_.rms_eps, rows, H, xn);
    ops_.matmul(xn, L.wq, rows, q);
    ops_.matmul(xn, L.wk, rows, k);
    ops_.matmul(xn, L.wv, rows, v);
    ops_.rope(q, rows, cfg_.heads, hd, positions, inv_freq_, cfg_.rope_style);
    ops_.rope(k, rows, cfg_.kv_heads, hd, positions, inv_freq_, cfg_.rope_style);
    ops_.kv_store(kv, static_cast<int>(li), k, v, slices);
    ops_.attention(q, kv, static_cast<int>(li), slices, cfg_.heads, att);
    ops_.matmul(att, L.wo, rows, hidden_.get());
    ops_.add(x, hidden_.get(), rows * H);

    ops_.rmsnorm(x, L.ffn_norm, cfg_.rms_eps, rows, H, xn);
    ops_.matmul(xn, L.w_gate, rows, gate_.get());
    ops_.matmul(xn, L.w_up, rows, up_.get());
    ops_.swiglu(gate_.get(), up_.get(), rows * I, gate_.get());
    ops_.matmul(gate_.get(), L.w_down, rows, hidden_.get());
    ops_.add(x, hidden_.get(), rows * H);
  }

  // The output head only on the rows whose logits are wanted: prefill pays for one row.
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  logits_rows_.ensure(ops_, n_out * cfg_.vocab_size);
  ops_.gather_rows(x, H, out_rows, hidden_.get());
  ops_.rmsnorm(hidden_.get(), output_norm_, cfg_.rms_eps, n_out, H, xn);
  ops_.matmul(xn, output_, n_out, logits_rows_.get());
}

}  // namespace specula
