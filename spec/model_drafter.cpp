// Model drafting: K autoregressive draft steps on the draft's own cache, q kept per step.
#include "spec/model_drafter.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace specula {

namespace {

// A token string made printable for a one-line message.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') { out += '\\'; out += static_cast<char>(c); }
    else if (c < 0x20 || c == 0x7f) { char buf[8]; std::snprintf(buf, sizeof buf, "\\x%02x", c); out += buf; }
    else out += static_cast<char>(c);
  }
  return out + "\"";
}

std::string ids(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

std::vector<int32_t> sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

int64_t parse_layer(std::string_view s, std::string_view whole) {
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty())
    throw std::invalid_argument("skip layers '" + std::string(whole) + "': '" + std::string(s) +
                                "' is not a layer number (expected e.g. 10-19 or 3,5,7-9)");
  return v;
}

void check_skip_set(const std::vector<bool>& skip, int64_t layers) {
  if (skip.empty()) return;
  if (static_cast<int64_t>(skip.size()) != layers)
    throw std::invalid_argument("skip set has " + std::to_string(skip.size()) + " flags for a model of " +
                                std::to_string(layers) + " layers");
  if (std::all_of(skip.begin(), skip.end(), [](bool b) { return b; }))
    throw std::invalid_argument("skip set skips every one of the model's " + std::to_string(layers) +
                                " layers; a self-draft needs at least one layer");
}

}  // namespace

void check_same_vocabulary(const LoadedModel& target, const LoadedModel& draft) {
  const std::string who = "draft model " + draft.path + " does not share the target's vocabulary: ";
  auto fail = [&](const std::string& what) { throw VocabularyMismatch(who + what); };
  const int64_t tv = target.weights.config.vocab_size, dv = draft.weights.config.vocab_size;
  if (tv != dv) fail("its output has " + std::to_string(dv) + " logits, the target's " + std::to_string(tv));
  if (!target.tokenizer || !draft.tokenizer) fail("a tokenizer is missing, so the token strings cannot be compared");
  const Tokenizer &t = *target.tokenizer, &d = *draft.tokenizer;
  if (t.vocab_size() != d.vocab_size())
    fail("its tokenizer has " + std::to_string(d.vocab_size()) + " tokens, the target's " +
         std::to_string(t.vocab_size()));
  for (int32_t id = 0; id < t.vocab_size(); ++id) {
    if (t.token_string(id) != d.token_string(id))
      fail("token " + std::to_string(id) + " is " + quoted(d.token_string(id)) + " in the draft, " +
           quoted(t.token_string(id)) + " in the target");
    if (t.is_special(id) != d.is_special(id))
      fail("token " + std::to_string(id) + " " + quoted(t.token_string(id)) + " is special in the " +
           (t.is_special(id) ? "target" : "draft") + " only");
  }
  if (t.bos_id() != d.bos_id())
    fail("BOS is " + std::to_string(d.bos_id()) + " in the draft, " + std::to_string(t.bos_id()) + " in the target");
  const auto te = sorted(t.eos_ids()), de = sorted(d.eos_ids());
  if (te != de) fail("EOS ids are " + ids(de) + " in the draft, " + ids(te) + " in the target");
}

std::vector<bool> parse_skip_layers(std::string_view spec, int64_t layers) {
  if (spec.empty()) throw std::invalid_argument("skip layers: empty set (expected e.g. 10-19 or 3,5,7-9)");
  std::vector<bool> skip(static_cast<size_t>(layers), false);
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string_view item = spec.substr(at, comma - at);
    const size_t dash = item.find('-');
    const int64_t lo = parse_layer(item.substr(0, dash), spec);
    const int64_t hi = dash == std::string_view::npos ? lo : parse_layer(item.substr(dash + 1), spec);
    if (lo > hi) throw std::invalid_argument("skip layers '" + std::string(spec) + "': range " + std::string(item) + " is empty");
    if (hi >= layers)
      throw std::invalid_argument("skip layers '" + std::string(spec) + "': layer " + std::to_string(hi) +
                                  " is outside 0.." + std::to_string(layers - 1));
    for (int64_t l = lo; l <= hi; ++l) skip[static_cast<size_t>(l)] = true;
    at = comma + 1;
  }
  check_skip_set(skip, layers);
  return skip;
}

ModelDrafter::ModelDrafter(const LoadedModel& target, std::shared_ptr<const LoadedModel> draft, Ops& ops,
                           int64_t max_positions)
    : loaded_(std::move(draft)) {
  check_same_vocabulary(target, *loaded_);
  owned_ = std::make_unique<LlamaModel>(loaded_->weights, ops);
  model_ = owned_.get();
  kv_ = std::make_unique<KvCache>(ops, model_->kv_config(max_positions));
  seq_ = kv_->create_sequence();
  name_ = "model:" + loaded_->path;
}

ModelDrafter::ModelDrafter(LlamaModel& model, int64_t max_positions, std::vector<bool> skip_layers, std::string name)
    : model_(&model), skip_(std::move(skip_layers)), name_(std::move(name)) {
  check_skip_set(skip_, model.config().layers);
  kv_ = std::make_unique<KvCache>(model.ops(), model.kv_config(max_positions));
  seq_ = kv_->create_sequence();
}

ModelDrafter::~ModelDrafter() = default;

int64_t ModelDrafter::max_positions() const {
  int64_t n = kv_->blocks_total() * kv_->config().block_tokens;
  if (model_->config().max_positions > 0) n = std::min(n, model_->config().max_positions);
  return n;
}

void ModelDrafter::feed(std::span<const int32_t> tokens) {
  ForwardSeq fs{seq_, tokens, false};
  model_->forward({&fs, 1}, *kv_, logits_, skip_.empty() ? nullptr : &skip_);
  cached_.insert(cached_.end(), tokens.begin(), tokens.end());
}

void ModelDrafter::catch_up(std::span<const int32_t> context) {
  // Keep the longest prefix the cache shares with the context, but always feed at least the
  // last token: its logits are q_1.
  const size_t n = context.size();
  size_t common = 0;
  while (common < cached_.size() && common + 1 < n && cached_[common] == context[common]) ++common;
  rollback(static_cast<int64_t>(common));
  feed(context.subspan(common));
}

void ModelDrafter::prefill(std::span<const int32_t> context) {
  // Everything but the last token, which the first propose() feeds.
  if (context.size() < 2) { rollback(0); return; }
  const auto head = context.first(context.size() - 1);
  size_t common = 0;
  while (common < cached_.size() && common < head.size() && cached_[common] == head[common]) ++common;
  rollback(static_cast<int64_t>(common));
  if (common < head.size()) feed(head.subspan(common));
}

void ModelDrafter::propose(const DraftRequest& req, DraftProposal& out) {
  out.clear();
  const int64_t n = static_cast<int64_t>(req.context.size());
  // Drafting k tokens puts context + t1..t_{k-1} in the cache.
  const int64_t k = std::min<int64_t>(req.max_tokens, max_positions() - n + 1);
  if (n == 0 || k <= 0) return;
  catch_up(req.context);
  PenaltyHistory* penalties = penalties_.sync(req, static_cast<int64_t>(logits_.size()));
  DraftConfidence confidence(req, &out.confidence);
  for (int64_t i = 0; i < k; ++i) {
    int32_t t = 0;
    bool drafted = false;
    {
      const PenalizedRows adjusted(penalties, logits_, {});  // logits_ raw again after the draw
      drafted = draft_from_logits(logits_, req, i, q_, logq_, t, confidence);
    }
    if (!drafted) break;
    penalties_.push_draft(t);
    out.tokens.push_back(t);
    out.q.insert(out.q.end(), q_.begin(), q_.end());
    if (i + 1 >= k || !confidence.may_reach(i + 1)) break;
    feed({&t, 1});
  }
}

void ModelDrafter::rollback(int64_t length) {
  if (length >= static_cast<int64_t>(cached_.size())) return;
  kv_->truncate_to(seq_, std::max<int64_t>(0, length));
  cached_.resize(static_cast<size_t>(std::max<int64_t>(0, length)));
}

}  // namespace specula
