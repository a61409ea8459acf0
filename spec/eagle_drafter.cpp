#include "spec/eagle_drafter.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "gpu/host/quant.h"
#include "model/gguf_hash.h"
#include "spec/sampling.h"

namespace specula {

namespace {

constexpr const char* kArch = "specula-eagle";

// sum_i a[i] b[i] in 16 interleaved partial sums (so the compiler keeps them in one vector), then
// their sum in order: a fixed order, whatever the caller.
float dot16(const float* a, const float* b, int64_t n) {
  float part[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) part[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) part[j] += a[i] * b[i];
  float s = 0.0f;
  for (float p : part) s += p;
  return s;
}

// The tensor as stored (a type no kernel reads is converted by the device: model/tensor.h).
TensorView need(const GgufFile& f, const std::string& name, std::vector<int64_t> shape) {
  const TensorView* t = f.tensor(name);
  if (t == nullptr) throw ModelError(f.path() + ": the draft head has no tensor '" + name + "'");
  if (t->shape != shape) {
    std::string want, got;
    for (int64_t d : shape) want += (want.empty() ? "" : " x ") + std::to_string(d);
    for (int64_t d : t->shape) got += (got.empty() ? "" : " x ") + std::to_string(d);
    throw ModelError(f.path() + ": tensor '" + name + "' is " + got + ", expected " + want);
  }
  if (shape.size() == 1 && t->dtype != DType::F32)
    throw ModelError(f.path() + ": tensor '" + name + "' is " + dtype_name(t->dtype) + ", expected F32");
  return *t;
}

}  // namespace

std::string target_tensor_hash(const LoadedModel& target) {
  if (target.format != "gguf")
    throw EagleMismatch("a draft head names its target by a hash of GGUF tensors; the target " + target.path + " is " +
                        target.format);
  return gguf_tensor_hash(GgufFile(target.path));
}

std::shared_ptr<const EagleHead> load_eagle_head(const std::string& path, const LoadedModel& target,
                                                 const std::string& target_hash) {
  auto f = std::make_shared<GgufFile>(path);
  const std::string arch = f->get_string("general.architecture", "");
  if (arch != kArch)
    throw ModelError(path + ": not a draft head (general.architecture is '" + arch + "', expected '" + kArch + "')");
  const LlamaConfig& tc = target.weights.config;
  auto h = std::make_shared<EagleHead>();
  h->file = f;
  LlamaConfig& c = h->config;
  c.architecture = kArch;
  c.name = f->get_string("draft.target_name", "");
  c.layers = f->get_int(std::string(kArch) + ".block_count");
  c.hidden = f->get_int(std::string(kArch) + ".embedding_length");
  c.intermediate = f->get_int(std::string(kArch) + ".feed_forward_length");
  c.heads = f->get_int(std::string(kArch) + ".attention.head_count");
  c.kv_heads = f->get_int(std::string(kArch) + ".attention.head_count_kv");
  c.head_dim = f->get_int(std::string(kArch) + ".rope.dimension_count");
  c.rope_theta = static_cast<float>(f->get_float(std::string(kArch) + ".rope.freq_base"));
  c.rms_eps = static_cast<float>(f->get_float(std::string(kArch) + ".attention.layer_norm_rms_epsilon"));
  c.rope_style = RopeStyle::Interleaved;  // q/k rows permuted as llama.cpp's converter does
  c.vocab_size = f->get_int(std::string(kArch) + ".vocab_size");
  c.max_positions = tc.max_positions;
  h->n_vocab = c.vocab_size;
  if (c.layers < 1 || c.layers > kEagleMaxLayers)
    throw ModelError(path + ": a draft head has 1 to " + std::to_string(kEagleMaxLayers) + " layers, this file says " +
                     std::to_string(c.layers));
  if (c.hidden <= 0 || c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 || c.intermediate <= 0 || c.heads % c.kv_heads != 0 ||
      c.head_dim % 2 != 0 || h->n_vocab <= 0)
    throw ModelError(path + ": the draft head's dimensions are inconsistent");

  // The target it was trained for.
  const std::string want = f->get_string("draft.target_hash");
  const std::string& have = target_hash;
  if (want != have)
    throw EagleMismatch("draft head " + path + " was trained for '" + c.name + "' (tensor hash " + want.substr(0, 16) +
                        "...), not for the loaded target " + target.path + " ('" + tc.name + "', tensor hash " +
                        have.substr(0, 16) + "...)");
  if (c.hidden != tc.hidden)
    throw EagleMismatch("draft head " + path + " has width " + std::to_string(c.hidden) + "; the target's is " + std::to_string(tc.hidden));

  const std::vector<int64_t> map = f->get_int_array("draft.token_map");
  if (static_cast<int64_t>(map.size()) != h->n_vocab)
    throw ModelError(path + ": draft.token_map has " + std::to_string(map.size()) + " ids for a vocabulary of " + std::to_string(h->n_vocab));
  std::vector<bool> seen(static_cast<size_t>(tc.vocab_size), false);
  for (int64_t t : map) {
    if (t < 0 || t >= tc.vocab_size || seen[static_cast<size_t>(t)])
      throw ModelError(path + ": draft.token_map holds " + std::to_string(t) + ", not a distinct id of the target's " +
                       std::to_string(tc.vocab_size) + "-token vocabulary");
    seen[static_cast<size_t>(t)] = true;
    h->token_map.push_back(static_cast<int32_t>(t));
  }

  const int64_t H = c.hidden, I = c.intermediate, q = c.heads * c.head_dim, kvw = c.kv_heads * c.head_dim;
  h->fc = need(*f, "fc.weight", {H, 2 * H});
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    LayerWeights& lw = h->layers.emplace_back();
    lw.attn_norm = need(*f, b + "attn_norm.weight", {H});
    lw.wq = need(*f, b + "attn_q.weight", {q, H});
    lw.wk = need(*f, b + "attn_k.weight", {kvw, H});
    lw.wv = need(*f, b + "attn_v.weight", {kvw, H});
    lw.wo = need(*f, b + "attn_output.weight", {H, q});
    lw.ffn_norm = need(*f, b + "ffn_norm.weight", {H});
    lw.w_gate = need(*f, b + "ffn_gate.weight", {I, H});
    lw.w_up = need(*f, b + "ffn_up.weight", {I, H});
    lw.w_down = need(*f, b + "ffn_down.weight", {H, I});
  }
  h->out_norm = need(*f, "output_norm.weight", {H});
  h->out = need(*f, "output.weight", {h->n_vocab, H});
  if (f->has("draft.feature_layers")) {
    for (int64_t l : f->get_int_array("draft.feature_layers")) {
      if (l < 0 || l >= tc.layers)
        throw EagleMismatch("draft head " + path + " reads the target's layer " + std::to_string(l) + "; the target has " +
                            std::to_string(tc.layers) + " layers");
      h->feature_layers.push_back(static_cast<int>(l));
    }
    h->fuse = need(*f, "fuse.weight", {H, h->feature_width()});
  }
  return h;
}

EagleWeights::EagleWeights(std::shared_ptr<const EagleHead> h, const LoadedModel& target, Ops& o)
    : head(std::move(h)), ops(o), target_vocab(target.weights.config.vocab_size) {
  embed = ops.upload_table(target.weights.embed);
  fc = ops.upload(head->fc);
  if (!head->feature_layers.empty()) fuse = ops.upload(head->fuse);
  for (const LayerWeights& l : head->layers) layers.push_back(upload_layer(ops, l));
  out_norm = ops.upload(head->out_norm);
  out = ops.upload(head->out);
  inv_freq = rope_inv_freq(head->config);
  const std::vector<int32_t>& map = head->token_map;
  by_id.resize(map.size());
  for (size_t r = 0; r < by_id.size(); ++r) by_id[r] = static_cast<int32_t>(r);
  std::sort(by_id.begin(), by_id.end(), [&](int32_t a, int32_t b) { return map[a] < map[b]; });
  target_out = target.weights.output;
  reduced_of.assign(static_cast<size_t>(target_vocab), -1);
  for (size_t r = 0; r < map.size(); ++r) reduced_of[static_cast<size_t>(map[r])] = static_cast<int32_t>(r);
  const int64_t H = head->config.hidden;
  std::vector<float> a(static_cast<size_t>(H)), b(static_cast<size_t>(H));
  std::vector<float> ratio;
  for (size_t r = 0; r < map.size(); ++r) {
    dequantize_row(head->out.dtype, head->out.row(static_cast<int64_t>(r)), a.data(), H);
    dequantize_row(target_out.dtype, target_out.row(map[r]), b.data(), H);
    double na = 0, nb = 0;
    for (int64_t i = 0; i < H; ++i) na += double(a[i]) * a[i], nb += double(b[i]) * b[i];
    if (nb > 0) ratio.push_back(static_cast<float>(std::sqrt(na / nb)));
  }
  if (!ratio.empty()) {
    std::nth_element(ratio.begin(), ratio.begin() + ratio.size() / 2, ratio.end());
    context_scale = ratio[ratio.size() / 2];
  }
}

EagleDrafter::EagleDrafter(std::shared_ptr<const EagleWeights> weights, int64_t max_positions, int64_t window,
                           int64_t context_tokens)
    : w_(std::move(weights)), hidden_(w_->head->config.hidden), row_(w_->head->feature_width()), context_tokens_(context_tokens) {
  set_catch_up_window(window);
  if (context_tokens < 0 || context_tokens > kEagleMaxContextTokens)
    throw std::invalid_argument("eagle drafter: " + std::to_string(context_tokens) + " context tokens (0.." +
                                std::to_string(kEagleMaxContextTokens) + ")");
  const LlamaConfig& c = w_->head->config;
  KvCacheConfig kc;
  kc.layers = c.layers;
  kc.kv_heads = c.kv_heads;
  kc.head_dim = c.head_dim;
  kc.block_tokens = 16;
  kc.num_blocks = (std::max<int64_t>(max_positions, 1) + kc.block_tokens - 1) / kc.block_tokens + 1;
  kc.use_device_layouts(w_->ops);
  kv_ = std::make_unique<KvCache>(w_->ops, kc);
  seq_ = kv_->create_sequence();
}

EagleDrafter::~EagleDrafter() = default;

void EagleDrafter::set_catch_up_window(int64_t window) {
  if (window < 0) throw std::invalid_argument("eagle drafter: a catch-up window of " + std::to_string(window));
  window_ = window;
}

void EagleDrafter::target_hidden(int64_t first, std::span<const float> rows) {
  const int64_t n = static_cast<int64_t>(rows.size()) / row_;
  if (first > known_hidden()) {
    // Rows arrive in order; a gap (rows the loop did not hand over) leaves the later ones
    // unusable, except at a new context's start, where the prefix cache held the first ones.
    if (known_hidden() > 0 || entries_ > 0) return;
    h_.assign(static_cast<size_t>(first * row_), 0.0f);
    floor_ = first;
    restart_at(floor_);
  }
  h_.resize(static_cast<size_t>(first * row_));
  h_.insert(h_.end(), rows.begin(), rows.begin() + n * row_);
}

const float* EagleDrafter::depth1_features(const float* rows, int64_t n) {
  if (w_->head->feature_layers.empty()) return rows;
  Ops& ops = w_->ops;
  rows_d_.ensure(ops, static_cast<size_t>(n * row_));
  fused_d_.ensure(ops, static_cast<size_t>(n * hidden_));
  ops.copy_to_device(rows, rows_d_.get(), static_cast<size_t>(n * row_));
  ops.matmul(rows_d_.get(), w_->fuse, n, fused_d_.get());
  fused_.resize(static_cast<size_t>(n * hidden_));
  ops.copy_to_host(fused_d_.get(), fused_.data(), fused_.size());
  return fused_.data();
}

void EagleDrafter::prefill(std::span<const int32_t>) {
  // A new context: its rows come through target_hidden().
  rollback(0);
}

void EagleDrafter::rollback(int64_t length) {
  length = std::max<int64_t>(0, length);
  if (known_hidden() > length) h_.resize(static_cast<size_t>(length * row_));
  if (length <= floor_) {  // back into the rows that never came: a new context
    h_.clear();
    floor_ = 0;
  }
  settle(std::min(entries_, std::max<int64_t>(0, length - 1)));
  // The cache keeps the last proposal's speculative entries (propose drops them before feeding
  // committed positions) while a continuation of that proposal is still possible.
  if (length + 1 < static_cast<int64_t>(chain_.size())) chain_.clear();
  if (chain_.empty()) kv_->truncate_to(seq_, entries_ - base_);
}

void EagleDrafter::settle(int64_t entries) {
  entries_ = entries;
  // Back before the window's start (a rollback that long): the next catch-up feeds the window
  // before `entries` again.
  if (entries_ < base_) restart_at(std::max<int64_t>(floor_, entries - window_));
}

void EagleDrafter::restart_at(int64_t entry) {
  base_ = entries_ = entry;
  chain_.clear();
  kv_->truncate_to(seq_, 0);
}

void EagleDrafter::run(const float* f, std::span<const int32_t> tokens, int64_t pos, bool logits) {
  Ops& ops = w_->ops;
  const LlamaConfig& c = w_->head->config;
  const int64_t n = static_cast<int64_t>(tokens.size()), H = hidden_, I = c.intermediate;
  const int64_t qw = c.heads * c.head_dim, kvw = c.kv_heads * c.head_dim;
  if (n > capacity_) {
    cat_d_.ensure(ops, n * 2 * H);
    x_d_.ensure(ops, n * H);
    xn_d_.ensure(ops, n * H);
    e_d_.ensure(ops, n * H);
    q_d_.ensure(ops, n * qw);
    k_d_.ensure(ops, n * kvw);
    v_d_.ensure(ops, n * kvw);
    att_d_.ensure(ops, n * qw);
    tmp_d_.ensure(ops, n * H);
    gate_d_.ensure(ops, n * I);
    up_d_.ensure(ops, n * I);
    capacity_ = n;
  }
  logits_d_.ensure(ops, static_cast<size_t>(w_->head->n_vocab));
  // x = fc . concat(f, embed(token)), row by row.
  ops.embed(w_->embed, tokens, e_d_.get());
  e_.resize(static_cast<size_t>(n * H));
  ops.copy_to_host(e_d_.get(), e_.data(), e_.size());
  cat_.resize(static_cast<size_t>(n * 2 * H));
  for (int64_t i = 0; i < n; ++i) {
    std::copy(f + i * H, f + (i + 1) * H, cat_.begin() + i * 2 * H);
    std::copy(e_.begin() + i * H, e_.begin() + (i + 1) * H, cat_.begin() + i * 2 * H + H);
  }
  ops.copy_to_device(cat_.data(), cat_d_.get(), cat_.size());
  float *x = x_d_.get(), *xn = xn_d_.get();
  ops.matmul(cat_d_.get(), w_->fc, n, x);

  // The head's llama layers over its own cache, entries at positions pos..pos+n-1.
  positions_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions_[static_cast<size_t>(i)] = static_cast<int32_t>(pos + i);
  kv_->reserve(seq_, pos - base_ + n);
  const SeqSlice slice{seq_, pos - base_, n, 0};  // cache slot s holds entry base_ + s + 1
  const BlockScratch scratch{xn, q_d_.get(), k_d_.get(), v_d_.get(), att_d_.get(), tmp_d_.get(), gate_d_.get(), up_d_.get()};
  for (size_t l = 0; l < w_->layers.size(); ++l)
    decoder_block(ops, c, w_->layers[l], w_->inv_freq, static_cast<int>(l), positions_, {&slice, 1}, *kv_, x, n, scratch);
  g_.resize(static_cast<size_t>(n * H));
  ops.copy_to_host(x, g_.data(), g_.size());
  if (logits) {
    ops.rmsnorm(x + (n - 1) * H, w_->out_norm, c.rms_eps, 1, H, xn);
    ops.matmul(xn, w_->out, 1, logits_d_.get());
    const size_t N = static_cast<size_t>(w_->head->n_vocab);
    logits_.resize(N + extras_.size());
    logits_extras_ = extras_;
    ops.copy_to_host(logits_d_.get(), logits_.data(), N);
    if (!extras_.empty()) {
      xn_host_.resize(static_cast<size_t>(H));
      ops.copy_to_host(xn, xn_host_.data(), xn_host_.size());
      for (size_t e = 0; e < extras_.size(); ++e) {
        const float* row = extra_rows_.data() + e * static_cast<size_t>(H);
        logits_[N + e] = dot16(xn_host_.data(), row, H);
      }
    }
  }
}

bool EagleDrafter::draft_greedy(const DraftRequest& req, int64_t i, int32_t& token, DraftConfidence& confidence) {
  // The argmax of the row over the vocabulary, found among the head's N logits and the context
  // tokens' (every other token is -inf), the context tokens' with kEagleContextBias added: ties go
  // to the smaller token id, as argmax over the full row does. The entropy and confidence rules
  // judge the untempered softmax of those logits. No q row is written (append_q_row).
  const size_t N = w_->head->token_map.size();
  const auto logit = [&](size_t r) { return r < N ? logits_[r] : logits_[r] + kEagleContextBias; };
  size_t best = 0;
  for (size_t r = 1; r < logits_.size(); ++r)
    if (logit(r) > logit(best) || (logit(r) == logit(best) && token_of(r) < token_of(best))) best = r;
  const bool judge_entropy = req.max_entropy > 0 && i >= req.min_tokens;
  if (judge_entropy || confidence.on()) {
    // H = log Z - E[x - max] / 1 over the softmax, in one pass: Z = sum e^(x - max); the top
    // token's probability is 1 / Z.
    const float top = logit(best);
    double z = 0, ez = 0;
    for (size_t r = 0; r < logits_.size(); ++r) {
      const float d = logit(r) - top;
      const float e = std::exp(d);
      z += e;
      ez += static_cast<double>(e) * d;
    }
    if (judge_entropy && std::log(z) - ez / z > req.max_entropy) return false;
    confidence.take(1 / z);
  }
  token = token_of(best);
  return true;
}

bool EagleDrafter::draft_reduced(const DraftRequest& req, int64_t i, int32_t& token, DraftConfidence& confidence) {
  // The sampling transform on the head's N logits: the tokens outside the head's N have q = 0
  // either way, so this is the transform of the full row (up to which of two equal logits top-k
  // keeps), at a sixth of the sort and exp work. q, its entropy and the draw visit the N tokens in
  // increasing id, so they are entropy_nats and sample_gumbel over the scattered row, without it
  // (the draw keyed by the token ids as every drafter's is); append_q_row scatters q once.
  const std::vector<int32_t>& by_id = extras_.empty() ? w_->by_id : order_;
  transform_logits(logits_, req.sampling, red_);
  ids_.resize(by_id.size());
  logq_.resize(by_id.size());
  for (size_t j = 0; j < by_id.size(); ++j) {
    ids_[j] = token_of(static_cast<size_t>(by_id[j]));
    logq_[j] = red_[static_cast<size_t>(by_id[j])];
  }
  q_.assign(logq_.begin(), logq_.end());
  probs_from_log(q_);
  if (req.max_entropy > 0 && i >= req.min_tokens && entropy_nats(q_) > req.max_entropy) return false;
  const DrawKey key = draft_draw_key(req, i);
  token = sample_gumbel_among(ids_, logq_, req.sampling.seed, key.position, key.stream);
  if (confidence.on()) confidence.take(q_[static_cast<size_t>(std::lower_bound(ids_.begin(), ids_.end(), token) - ids_.begin())]);
  return true;
}

void EagleDrafter::append_q_row(const DraftRequest& req, DraftProposal& out) const {
  // Row k of out.q: draft_reduced's q on the head's N tokens (q_ at ids_) and 0 elsewhere. None
  // where the verdict does not read it (greedy or coupled: DraftProposal::q): a row is a
  // vocabulary's worth of writes a token, ~8% of the greedy drafting time in a profile.
  if (!req.verdict_reads_q()) return;
  const size_t base = out.q.size();
  out.q.resize(base + static_cast<size_t>(w_->target_vocab), 0.0f);
  float* row = out.q.data() + base;
  for (size_t j = 0; j < ids_.size(); ++j) row[ids_[j]] = q_[j];
}

void EagleDrafter::penalize(PenaltyHistory* penalties, PenaltyHistory::Undo& undo) {
  if (penalties == nullptr) return;
  const size_t N = w_->head->token_map.size();
  for (int32_t t : penalties->touched()) {
    size_t r = 0;
    if (static_cast<size_t>(t) < w_->reduced_of.size() && w_->reduced_of[static_cast<size_t>(t)] >= 0) {
      r = static_cast<size_t>(w_->reduced_of[static_cast<size_t>(t)]);
    } else {
      const auto e = std::lower_bound(extras_.begin(), extras_.end(), t);
      if (e == extras_.end() || *e != t) continue;  // a token the head cannot propose
      r = N + static_cast<size_t>(e - extras_.begin());
    }
    if (r >= logits_.size()) continue;
    undo.saved.emplace_back(r, logits_[r]);
    logits_[r] = penalties->adjusted(logits_[r], t);
  }
  // JSON mode, a grammar, allowed_token_ids or bad_words: the tokens it can propose that they
  // refuse (spec/penalties.h) at -inf, so that its drafts are ones the target's masked rows can accept.
  if (penalties->constrained())
    for (size_t r = 0; r < logits_.size(); ++r)
      if (!penalties->constraint_keeps(token_of(r))) {
        undo.saved.emplace_back(r, logits_[r]);
        logits_[r] = -std::numeric_limits<float>::infinity();
      }
}

int32_t EagleDrafter::token_of(size_t r) const {
  const size_t N = w_->head->token_map.size();
  return r < N ? w_->head->token_map[r] : extras_[r - N];
}

void EagleDrafter::gather_context_tokens(std::span<const int32_t> context) {
  std::vector<int32_t> found;
  // The most recent first, so that the cap keeps the nearest; at most context_tokens_ (<= 1,024)
  // of them, so a linear search dedups.
  const size_t from = context.size() > static_cast<size_t>(kEagleContextScan) ? context.size() - kEagleContextScan : 0;
  for (size_t i = context.size(); i-- > from && static_cast<int64_t>(found.size()) < context_tokens_;) {
    const int32_t t = context[i];
    if (t >= 0 && static_cast<size_t>(t) < w_->reduced_of.size() && w_->reduced_of[static_cast<size_t>(t)] < 0 &&
        std::find(found.begin(), found.end(), t) == found.end())
      found.push_back(t);
  }
  std::sort(found.begin(), found.end());
  if (found == extras_) return;
  extras_ = std::move(found);
  const int64_t H = hidden_;
  const size_t N = w_->head->token_map.size();
  extra_rows_.resize(extras_.size() * static_cast<size_t>(H));
  for (size_t e = 0; e < extras_.size(); ++e) {
    float* row = extra_rows_.data() + e * static_cast<size_t>(H);
    dequantize_row(w_->target_out.dtype, w_->target_out.row(extras_[e]), row, H);
    for (int64_t i = 0; i < H; ++i) row[i] *= w_->context_scale;
  }
  // by_id merged with the extras (indices N + e), in increasing token id.
  order_.clear();
  size_t e = 0;
  for (int32_t r : w_->by_id) {
    while (e < extras_.size() && extras_[e] < w_->head->token_map[static_cast<size_t>(r)]) order_.push_back(static_cast<int32_t>(N + e++));
    order_.push_back(r);
  }
  while (e < extras_.size()) order_.push_back(static_cast<int32_t>(N + e++));
}

bool EagleDrafter::continues_chain(std::span<const int32_t> context) const {
  return !chain_.empty() && chain_g_.size() == static_cast<size_t>(hidden_) && context.size() == chain_.size() &&
         std::equal(context.begin(), context.end(), chain_.begin());
}

void EagleDrafter::propose(const DraftRequest& req, DraftProposal& out) {
  out.clear();
  const int64_t L = static_cast<int64_t>(req.context.size()), m = L - 1;
  // Entry m needs h_0..h_{m-1}; depth j's entry m + j - 1 must fit the cache.
  const int64_t room = kv_->blocks_total() * kv_->config().block_tokens - (m - base_) + 1;
  const int64_t k = std::min<int64_t>(req.max_tokens, room);
  if (m < 1 || k <= 0) return;
  gather_context_tokens(req.context);
  if (known_hidden() >= m) {
    // Drop the last round's speculative entries, then feed the committed positions not cached
    // (entry m at least: its output is depth 1).
    settle(std::min(entries_, m - 1));
    // A long catch-up (the first draft after the prompt, or after many rounds without one): the
    // cache restarts at the window's start, as if the context began there.
    if (window_ > 0 && m - entries_ > window_) restart_at(m - window_);
    if (entries_ < floor_) restart_at(floor_);
    kv_->truncate_to(seq_, entries_ - base_);
    const int64_t first = entries_ + 1;
    run(depth1_features(h_.data() + (first - 1) * row_, m - first + 1),
        req.context.subspan(static_cast<size_t>(first), static_cast<size_t>(m - first + 1)), first - 1, true);
    entries_ = m;
  } else if (continues_chain(req.context)) {
    // The optimistic continuation: entry m reads the head's own output for position m - 1 (the
    // entry that proposed the chain's last token), unless the last proposal already ran it.
    const int64_t cached = base_ + kv_->length(seq_);
    if (cached == m - 1) {
      feat_ = chain_g_;
      run(feat_.data(), req.context.subspan(static_cast<size_t>(m), 1), m - 1, true);
    } else if (cached != m || logits_extras_ != extras_) {  // the logits were for other context tokens
      return;
    }
  } else {
    return;  // no target rows for this context
  }

  PenaltyHistory* penalties = penalties_.sync(req, w_->target_vocab);
  DraftConfidence confidence(req, &out.confidence);
  for (int64_t i = 0; i < k; ++i) {
    // q over the target's vocabulary: the head's logits on its N tokens, -inf elsewhere (q = 0
    // there: never proposed, and the verifier's residual covers those tokens).
    int32_t t = 0;
    PenaltyHistory::Undo undo;
    penalize(penalties, undo);
    // A constraint may leave none of the head's tokens (its rows are over a reduced vocabulary):
    // then the draft ends here.
    const bool any = penalties == nullptr || !penalties->constrained() ||
                     std::any_of(logits_.begin(), logits_.end(), [](float x) { return x != -std::numeric_limits<float>::infinity(); });
    const bool drafted = any && (req.sampling.greedy() ? draft_greedy(req, i, t, confidence) : draft_reduced(req, i, t, confidence));
    PenaltyHistory::restore(logits_, undo);  // a continuation may draft from these logits again
    if (!drafted) break;
    penalties_.push_draft(t);
    out.tokens.push_back(t);
    append_q_row(req, out);
    // The head's own output of the entry just run: the feature of the next depth, or of a
    // continuation of this proposal.
    feat_.assign(g_.end() - hidden_, g_.end());
    if (i + 1 >= k || !confidence.may_reach(i + 1)) break;
    run(feat_.data(), {&t, 1}, m + i, true);  // depth i + 2, with the token proposed
  }
  chain_.assign(req.context.begin(), req.context.end());
  chain_.insert(chain_.end(), out.tokens.begin(), out.tokens.end());
  // Without a run after the last token, a continuation feeds it with the output that proposed it.
  const int64_t cached = base_ + kv_->length(seq_);
  if (cached == static_cast<int64_t>(chain_.size()) - 2) chain_g_ = feat_;
  else if (cached != static_cast<int64_t>(chain_.size()) - 1) chain_.clear();
}

}  // namespace specula
