// Logits transforms and counter-based sampling.
#include "spec/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace specula {

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    throw std::invalid_argument("temperature must be >= 0, got " + std::to_string(temperature));
  if (top_k < 0) throw std::invalid_argument("top_k must be >= 0 (0 = off), got " + std::to_string(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f))
    throw std::invalid_argument("top_p must be in (0, 1], got " + std::to_string(top_p));
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

void transform_logits(std::span<const float> logits, const SamplingParams& sp, std::vector<float>& logp) {
  const size_t V = logits.size();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  logp.assign(V, kNegInf);
  if (sp.greedy()) {
    logp[argmax(logits)] = 0.0f;
    return;
  }
  // Candidates in descending order of logit, cut by top-k; ties broken by index so the set is
  // a deterministic function of the logits.
  const float inv_t = 1.0f / sp.temperature;
  std::vector<int32_t> idx(V);
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  size_t keep = V;
  if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < V) keep = static_cast<size_t>(sp.top_k);
  const bool need_sorted = sp.top_p < 1.0f;
  // Sort a prefix only: top-p rarely needs more than a few hundred candidates; widen if so.
  size_t sorted = keep < V ? keep : std::min<size_t>(V, 256);
  if (need_sorted || keep < V) {
    for (;;) {
      std::partial_sort(idx.begin(), idx.begin() + sorted, idx.end(), by_logit);
      if (!need_sorted || sorted >= keep) break;
      // Check whether the sorted prefix already covers top_p of the mass.
      const float mx = logits[idx[0]] * inv_t;
      double total = 0, prefix = 0;
      for (size_t i = 0; i < V; ++i) total += std::exp(static_cast<double>(logits[i]) * inv_t - mx);
      for (size_t i = 0; i < sorted; ++i) prefix += std::exp(static_cast<double>(logits[idx[i]]) * inv_t - mx);
      if (prefix / total >= sp.top_p) break;
      sorted = std::min(keep, sorted * 4);
    }
  }
  const float mx = logits[need_sorted || keep < V ? idx[0] : argmax(logits)] * inv_t;
  // Softmax over the top-k set.
  double sum = 0;
  for (size_t i = 0; i < keep; ++i) sum += std::exp(static_cast<double>(logits[idx[i]]) * inv_t - mx);
  if (need_sorted) {
    // Smallest prefix whose mass reaches top_p (at least one token), as in HF's TopPLogitsWarper.
    double cum = 0;
    size_t n = 0;
    while (n < sorted) {
      cum += std::exp(static_cast<double>(logits[idx[n]]) * inv_t - mx) / sum;
      ++n;
      if (cum >= sp.top_p) break;
    }
    keep = n;
    sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += std::exp(static_cast<double>(logits[idx[i]]) * inv_t - mx);
  }
  const double log_sum = std::log(sum);
  for (size_t i = 0; i < keep; ++i) {
    const int32_t v = idx[i];
    logp[v] = static_cast<float>(static_cast<double>(logits[v]) * inv_t - mx - log_sum);
  }
}

void transform_to_probs(std::span<const float> logits, const SamplingParams& sp, std::vector<float>& probs) {
  transform_logits(logits, sp, probs);
  for (float& x : probs) x = std::exp(x);
}

int32_t sample_gumbel(std::span<const float> logp, uint64_t seed, int64_t position, RngStream stream) {
  int32_t best = -1;
  double best_score = -std::numeric_limits<double>::infinity();
  for (size_t v = 0; v < logp.size(); ++v) {
    if (logp[v] == -std::numeric_limits<float>::infinity()) continue;
    const double u = philox_uniform(seed, position, stream, v);
    const double score = static_cast<double>(logp[v]) - std::log(-std::log(u));
    if (score > best_score) {
      best_score = score;
      best = static_cast<int32_t>(v);
    }
  }
  if (best < 0) throw std::logic_error("sample_gumbel: every token is excluded");
  return best;
}

int32_t sample_token(std::span<const float> logits, const SamplingParams& sp, int64_t position) {
  if (sp.greedy()) return argmax(logits);
  std::vector<float> logp;
  transform_logits(logits, sp, logp);
  return sample_gumbel(logp, sp.seed, position, RngStream::Token);
}

}  // namespace specula
