// Logits transforms and counter-based sampling.
#include "spec/sampling.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "gpu/host/vector_math.h"
#include "spec/gumbel_max.h"

namespace specula {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    throw std::invalid_argument("temperature must be >= 0, got " + std::to_string(temperature));
  if (top_k < 0) throw std::invalid_argument("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    throw std::invalid_argument("top_p must be in (0, 1], got " + std::to_string(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    throw std::invalid_argument("min_p must be in [0, 1] (0 = off), got " + std::to_string(min_p));
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    throw std::invalid_argument("presence_penalty must be in [-2, 2] (0 = off), got " + std::to_string(presence_penalty));
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    throw std::invalid_argument("frequency_penalty must be in [-2, 2] (0 = off), got " + std::to_string(frequency_penalty));
  if (!(repetition_penalty > 0.0f && repetition_penalty <= 2.0f))
    throw std::invalid_argument("repetition_penalty must be in (0, 2] (1 = off), got " + std::to_string(repetition_penalty));
  if (min_tokens < 0) throw std::invalid_argument("min_tokens must be >= 0 (0 = off), got " + std::to_string(min_tokens));
  if (logit_bias.size() > kMaxLogitBias)
    throw std::invalid_argument("logit_bias: at most " + std::to_string(kMaxLogitBias) + " tokens, got " +
                                std::to_string(logit_bias.size()));
  if (json_object && grammar) throw std::invalid_argument("JSON mode and a grammar cannot both constrain one request");
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0) throw std::invalid_argument("logit_bias: token id " + std::to_string(token) + " is negative");
    if (!(bias >= -100.0f && bias <= 100.0f))
      throw std::invalid_argument("logit_bias: the bias of token " + std::to_string(token) + " must be in [-100, 100], got " +
                                  std::to_string(bias));
  }
  validate_lists();
}

void SamplingParams::validate(int64_t vocab) const {
  validate();
  for (const auto& [token, bias] : logit_bias)
    if (token >= vocab)
      throw std::invalid_argument("logit_bias: token id " + std::to_string(token) + " is outside the vocabulary of " +
                                  std::to_string(vocab));
  lists_within(vocab);
}

void SamplingParams::validate_lists() const {
  for (int32_t t : allowed_token_ids)
    if (t < 0) throw std::invalid_argument("allowed_token_ids: token id " + std::to_string(t) + " is negative");
  if (bad_words.size() > kMaxBadWords)
    throw std::invalid_argument("bad_words: at most " + std::to_string(kMaxBadWords) + " token sequences, got " +
                                std::to_string(bad_words.size()));
  size_t bad_tokens = 0;
  std::vector<int32_t> banned;  // the one-token words
  for (const auto& w : bad_words) {
    if (w.empty()) throw std::invalid_argument("bad_words: a token sequence is empty");
    for (int32_t t : w)
      if (t < 0) throw std::invalid_argument("bad_words: token id " + std::to_string(t) + " is negative");
    bad_tokens += w.size();
    if (w.size() == 1) banned.push_back(w[0]);
  }
  if (bad_tokens > kMaxBadWordTokens)
    throw std::invalid_argument("bad_words: at most " + std::to_string(kMaxBadWordTokens) + " tokens in all, got " +
                                std::to_string(bad_tokens));
  // Every allowed token banned outright would leave no token to draw at the first position.
  std::sort(banned.begin(), banned.end());
  if (!allowed_token_ids.empty() && std::all_of(allowed_token_ids.begin(), allowed_token_ids.end(), [&](int32_t t) {
        return std::binary_search(banned.begin(), banned.end(), t);
      }))
    throw std::invalid_argument("bad_words: every token of allowed_token_ids is a one-token bad word, so no token may be generated");
}

void SamplingParams::validate_lists(int64_t vocab) const {
  validate_lists();
  lists_within(vocab);
}

void SamplingParams::lists_within(int64_t vocab) const {
  for (int32_t t : allowed_token_ids)
    if (t >= vocab)
      throw std::invalid_argument("allowed_token_ids: token id " + std::to_string(t) + " is outside the vocabulary of " +
                                  std::to_string(vocab));
  for (const auto& w : bad_words)
    for (int32_t t : w)
      if (t >= vocab)
        throw std::invalid_argument("bad_words: token id " + std::to_string(t) + " is outside the vocabulary of " +
                                    std::to_string(vocab));
}

int32_t argmax(std::span<const float> x) {
  // The first index of the largest value, as the plain scan `if (x[i] > x[best]) best = i` gives,
  // without its load-compare chain per element (that took ~0.1 ms over a 49,152-token vocabulary):
  // each block's maximum with independent lanes (the compiler vectorizes them), then the first
  // block holding the overall maximum is scanned for its first index.
  constexpr size_t kBlock = 256, kLanes = 16;
  const size_t n = x.size();
  if (n == 0) return 0;
  float best = x[0];
  size_t best_block = 0;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t end = std::min(n, b + kBlock);
    float lane[kLanes];
    for (size_t j = 0; j < kLanes; ++j) lane[j] = -std::numeric_limits<float>::infinity();  // NaN never wins
    size_t i = b;
    for (; i + kLanes <= end; i += kLanes)
      for (size_t j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    float m = lane[0];
    for (size_t j = 1; j < kLanes; ++j) m = lane[j] > m ? lane[j] : m;
    for (; i < end; ++i) m = x[i] > m ? x[i] : m;
    if (m > best) best = m, best_block = b;
  }
  const size_t end = std::min(n, best_block + kBlock);
  for (size_t i = best_block; i < end; ++i)
    if (x[i] == best) return static_cast<int32_t>(i);
  return 0;  // x[0] is NaN: the plain scan never moves from it either
}

namespace {

// A token as the transform orders them: larger logit first, then lower index.
struct Candidate {
  float x;
  int32_t v;
};
inline bool ahead(const Candidate& a, const Candidate& b) { return a.x > b.x || (a.x == b.x && a.v < b.v); }

// The first m (<= V) tokens of that order, in order. One pass keeps the candidates above a running
// threshold (the m-th best so far) in a buffer of up to 2m, skipping whole blocks whose maximum
// does not beat it; a token equal to the threshold that comes later has a higher index, so it
// ranks behind the m-th and is rightly skipped. Most of a vocabulary is skipped a block at a time.
void leading_tokens(std::span<const float> x, size_t m, std::vector<Candidate>& out) {
  const size_t n = x.size();
  out.clear();
  if (m >= n) {
    for (size_t i = 0; i < n; ++i) out.push_back({x[i], static_cast<int32_t>(i)});
    std::sort(out.begin(), out.end(), ahead);
    return;
  }
  out.reserve(2 * m + 1);
  constexpr size_t kBlock = 64;
  bool have_threshold = false;
  float threshold = 0;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t end = std::min(n, b + kBlock);
    if (have_threshold && !(block_max(x.data() + b, end - b) > threshold)) continue;
    for (size_t i = b; i < end; ++i) {
      if (have_threshold ? !(x[i] > threshold) : std::isnan(x[i])) continue;
      out.push_back({x[i], static_cast<int32_t>(i)});
      if (out.size() == 2 * m) {
        std::nth_element(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(m - 1), out.end(), ahead);
        out.resize(m);
        threshold = out[m - 1].x;
        have_threshold = true;
      }
    }
  }
  std::sort(out.begin(), out.end(), ahead);
  if (out.size() > m) out.resize(m);
}


// Top-p's cut over the first n of the leading tokens' terms e (in order) for the normaliser z: the
// smallest count whose cumulative sum of e_i / z (accumulated in that order, in double) reaches
// top_p; 0 when the n terms run out first. Each e_i / z is non-increasing in z and so is the
// running sum: the cut is non-decreasing in z, which lets a bracket [z_lo, z_hi] of the
// normaliser decide it.
size_t top_p_cut(const std::vector<double>& e, size_t n, double z, float top_p) {
  double cum = 0;
  for (size_t i = 0; i < n; ++i) {
    cum += e[i] / z;
    if (cum >= top_p) return i + 1;
  }
  return 0;
}

}  // namespace

void transform_logits(std::span<const float> logits, const SamplingParams& sp, std::vector<float>& logp) {
  // The definition (tests/unit/spec/test_sampling.cpp holds a plain implementation of it, and
  // this one to it bit for bit): order the tokens by logit, larger first, then lower index; mx =
  // float(top logit * inv_t); e_v = sampler_exp(a_v), a_v = sampler_arg(x_v) = fma(x_v, inv_t, -mx)
  // in double (gpu/host/vector_math.h, which fixes every operation). Min-p: M = the longest
  // prefix of the order whose every e_v >= min_p * e_first, in double (all tokens without min-p).
  // K = the first top_k tokens of M (all of M without top-k). Top-p: z = sum of e over K (in
  // order) when top-k or min-p is on, over the whole vocabulary in sampler_exp_sum's order when
  // neither is; the kept set P is the shortest prefix of K whose running sum of e / z reaches
  // top_p (all of K if none does); without top-p, P = K. Then log p_v = float(a_v - log S) for v in
  // P, S the sum of e over P (in order; sampler_exp_sum when P is the whole vocabulary); -inf
  // elsewhere. (Min-p first, then top-k, then top-p over what is left: vLLM's order. Min-p and
  // top-k both keep prefixes, so their order does not matter; top-p's mass is taken after both.)
  const size_t V = logits.size();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (sp.greedy()) {
    logp.assign(V, kNegInf);
    logp[argmax(logits)] = 0.0f;
    return;
  }
  const float inv_t = 1.0f / sp.temperature;
  const bool use_k = sp.top_k > 0 && static_cast<size_t>(sp.top_k) < V, use_p = sp.top_p < 1.0f, use_m = sp.min_p > 0.0f;
  if (!use_k && !use_p && !use_m) {
    logp.resize(V);  // every entry is written below
    const float mx = logits[argmax(logits)] * inv_t;
    const double log_sum = std::log(host_kernels::sampler_exp_sum(logits.data(), static_cast<int64_t>(V), inv_t, mx));
    host_kernels::sampler_log_probs(logits.data(), static_cast<int64_t>(V), inv_t, mx, log_sum, logp.data());
    return;
  }
  logp.assign(V, kNegInf);
  thread_local std::vector<Candidate> cand;
  thread_local std::vector<float> cx;
  thread_local std::vector<double> e;
  // Top-k needs its k tokens; top-p or min-p alone rarely more than a few hundred (widened when
  // they do).
  size_t m = use_k ? static_cast<size_t>(sp.top_k) : std::min<size_t>(V, 256);
  float mx = 0;
  auto lead = [&] {
    leading_tokens(logits, m, cand);
    if (cand.empty()) return;
    mx = cand[0].x * inv_t;
    cx.resize(cand.size());
    e.resize(cand.size());
    for (size_t i = 0; i < cand.size(); ++i) cx[i] = cand[i].x;
    host_kernels::sampler_exp_terms(cx.data(), static_cast<int64_t>(cx.size()), inv_t, mx, e.data());
  };
  lead();
  if (cand.empty()) return;  // every logit NaN: nothing to keep
  size_t n = cand.size();    // |K| once min-p has cut
  if (use_m) {
    // M's end; without top-k it may lie past the leading tokens: widen until it does not.
    for (;;) {
      const double floor = static_cast<double>(sp.min_p) * e[0];
      n = 0;
      while (n < cand.size() && e[n] >= floor) ++n;
      if (n < cand.size() || use_k || m >= V) break;
      m = std::min(V, 4 * m);
      lead();
    }
  }
  if (use_p && (use_k || use_m)) {
    double z = 0;
    for (size_t i = 0; i < n; ++i) z += e[i];
    if (const size_t cut = top_p_cut(e, n, z, sp.top_p); cut != 0) n = cut;
  } else if (use_p) {
    // z over the whole vocabulary; the cut may lie past the leading tokens: widen until it does not.
    const double z = host_kernels::sampler_exp_sum(logits.data(), static_cast<int64_t>(V), inv_t, mx);
    for (;;) {
      n = top_p_cut(e, e.size(), z, sp.top_p);
      if (n != 0) break;
      if (m >= V) {
        n = cand.size();  // every token a candidate, and the running sum never reached top_p
        break;
      }
      m = std::min(V, 4 * m);
      lead();
    }
  }
  double sum = 0;
  if (n == V) {
    sum = host_kernels::sampler_exp_sum(logits.data(), static_cast<int64_t>(V), inv_t, mx);
  } else {
    for (size_t i = 0; i < n; ++i) sum += e[i];
  }
  const double log_sum = std::log(sum);
  for (size_t i = 0; i < n; ++i) {
    const int32_t v = cand[i].v;
    logp[static_cast<size_t>(v)] = static_cast<float>(host_kernels::sampler_arg(cand[i].x, inv_t, mx) - log_sum);
  }
}

void transform_to_probs(std::span<const float> logits, const SamplingParams& sp, std::vector<float>& probs) {
  transform_logits(logits, sp, probs);
  probs_from_log(probs);
}

void probs_from_log(std::span<float> logp) {
  for (float& x : logp) x = prob_from_log(x);
}

int32_t sample_gumbel_among(std::span<const int32_t> ids, std::span<const float> logp, uint64_t seed, int64_t position,
                            RngStream stream) {
  GumbelMax g{seed, position, stream};
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (!ids.empty()) {
    const size_t top = static_cast<size_t>(argmax(logp));  // a likely winner first
    if (logp[top] != kNegInf) g.visit(ids[top], logp[top]);
  }
  // 64 entries at a time, the filter ruling out at once those that cannot beat the best score
  // so far (out of reach, or far below it with a small uniform, 16 uniforms a vector on the
  // AVX-512 path): a drafter's 2,048 ids took ~20 us one by one. The best only rises, so the
  // filter's thresholds from a chunk's start drop no token the visits would have let win.
  const GumbelFilter filter = g.filter();
  for (size_t b = 0; b < ids.size(); b += kGumbelBlock) {
    const int count = static_cast<int>(std::min(kGumbelBlock, ids.size() - b));
    for (uint64_t left = filter.candidates_among(logp.data() + b, ids.data() + b, count, g.best_score); left != 0; left &= left - 1) {
      const size_t i = b + static_cast<size_t>(std::countr_zero(left));
      if (logp[i] != kNegInf) g.visit(ids[i], logp[i]);
    }
  }
  if (g.best < 0) throw std::logic_error("sample_gumbel: every token is excluded");
  return g.best;
}

int32_t sample_gumbel(std::span<const float> logp, uint64_t seed, int64_t position, RngStream stream) {
  GumbelMax g{seed, position, stream};
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr size_t kBlock = kGumbelBlock;
  if (!logp.empty()) {
    const int32_t top = argmax(logp);  // a likely winner first
    if (logp[static_cast<size_t>(top)] != kNegInf) g.visit(top, logp[static_cast<size_t>(top)]);
  }
  auto visit = [&](size_t v) {
    if (logp[v] != kNegInf) g.visit(static_cast<int32_t>(v), logp[v]);
  };
  const GumbelFilter filter = g.filter();
  for (size_t b = 0; b < logp.size(); b += kBlock) {
    if (b + kBlock > logp.size()) {  // the tail, token by token
      for (size_t v = b; v < logp.size(); ++v) visit(v);
      break;
    }
    // Blocks of excluded or hopeless tokens (most of a top-k / top-p row, and most of a full
    // vocabulary's) are passed over whole; in the rest, the filter rules out at once the tokens
    // whose uniforms are too small for them to win (most of a full vocabulary's in-reach tokens).
    const float m = block_max(logp.data() + b, kBlock);
    if (!(m > kNegInf) || g.out_of_reach(m)) continue;
    for (uint64_t left = filter.candidates(logp.data() + b, b, g.best_score); left != 0; left &= left - 1)
      visit(b + static_cast<size_t>(std::countr_zero(left)));
  }
  if (g.best < 0) throw std::logic_error("sample_gumbel: every token is excluded");
  return g.best;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& sp, int64_t position) {
  if (sp.greedy()) return argmax(logits);
  std::vector<float> logp;
  transform_logits(logits, sp, logp);
  return sample_gumbel(logp, sp.seed, position, RngStream::Token);
}

TokenLogprobs token_logprobs(std::span<const float> logits, int32_t token, int top) {
  if (logits.empty() || token < 0 || static_cast<size_t>(token) >= logits.size())
    throw std::invalid_argument("token_logprobs: token " + std::to_string(token) + " is outside the row of " +
                                std::to_string(logits.size()));
  // transform_logits's log softmax at temperature 1 (no top-k / top-p), entry by entry: the same
  // bits as the sampler's row, from the same vectorized sum (gpu/host/vector_math.h), without the
  // row itself.
  const float mx = logits[static_cast<size_t>(argmax(logits))];
  const double log_sum = std::log(host_kernels::sampler_exp_sum(logits.data(), static_cast<int64_t>(logits.size()), 1.0f, mx));
  auto lp = [&](size_t v) { return static_cast<float>(host_kernels::sampler_arg(logits[v], 1.0f, mx) - log_sum); };
  TokenLogprobs out;
  out.logprob = lp(static_cast<size_t>(token));
  const float mine = logits[static_cast<size_t>(token)];
  out.rank = 1 + static_cast<int32_t>(std::count_if(logits.begin(), logits.end(), [&](float x) { return x > mine; }));
  if (top <= 0) return out;
  thread_local std::vector<Candidate> best;
  leading_tokens(logits, std::min(static_cast<size_t>(top), logits.size()), best);  // larger first, then lower id
  out.top.reserve(best.size());
  for (const Candidate& c : best) out.top.emplace_back(c.v, lp(static_cast<size_t>(c.v)));
  return out;
}

}  // namespace specula
