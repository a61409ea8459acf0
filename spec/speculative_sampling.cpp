// Speculative sampling: the acceptance test, the residual, the greedy and coupled rules.
#include "spec/speculative_sampling.h"

#include <cassert>
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "spec/gumbel_max.h"

namespace specula {

namespace {

std::span<const float> row(std::span<const float> m, int64_t vocab, int64_t i) {
  return m.subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab));
}

int32_t drawn(int32_t token) {
  if (token < 0) throw std::logic_error("speculative sampling: a draw over a row with no mass");
  return token;
}

// The Gumbel-max draw over the row of log probabilities std::log(p[v]) (float; -inf where p[v] is 0),
// taking the logarithm only for the tokens that can win (sample_gumbel_of_weights).
int32_t sample_log_of(std::span<const float> p, uint64_t seed, int64_t position, RngStream stream) {
  return drawn(sample_gumbel_of_weights(
      p, [&](int32_t v) { return static_cast<double>(p[static_cast<size_t>(v)]); },
      [&](int32_t v) { return std::log(p[static_cast<size_t>(v)]); }, argmax(p), seed, position, stream));
}

}  // namespace

const char* spec_sampling_name(SpecSampling m) {
  switch (m) {
    case SpecSampling::Coupled: return "coupled";
    case SpecSampling::Block: return "block";
    default: return "exact";
  }
}

SpecSampling parse_spec_sampling(std::string_view s) {
  if (s == "exact") return SpecSampling::Exact;
  if (s == "coupled") return SpecSampling::Coupled;
  if (s == "block") return SpecSampling::Block;
  throw std::invalid_argument("speculative sampling must be 'exact', 'block' or 'coupled', got '" + std::string(s) + "'");
}

bool accept_draft_token(double p_t, double q_t, double u) {
  if (!(q_t > 0.0)) return false;
  return u * q_t < p_t;  // u < p/q without the division; p >= q always accepts (u < 1)
}

double acceptance_uniform(uint64_t seed, int64_t position) {
  return philox_uniform(seed, position, RngStream::Accept, 0);
}

int32_t sample_recovered(std::span<const float> p, std::span<const float> q, uint64_t seed, int64_t position) {
  return sample_recovered(p, q, 1.0, seed, position);
}

int32_t sample_recovered(std::span<const float> p, std::span<const float> q, double w, uint64_t seed, int64_t position) {
  assert(p.size() == q.size());
  // The draw over the row float(log r), r = w p - q in double where positive (-inf elsewhere;
  // norm() is a constant shift: argmax unchanged); the logarithm only for the tokens that can win.
  // (w = 1 multiplies exactly: the token rule's residual to the bit.)
  auto residual = [&](int32_t v) {
    return w * static_cast<double>(p[static_cast<size_t>(v)]) - static_cast<double>(q[static_cast<size_t>(v)]);
  };
  double mass = 0, top_r = 0;
  int32_t top = -1;  // a likely winner: the largest r
  for (size_t v = 0; v < p.size(); ++v) {
    const double r = residual(static_cast<int32_t>(v));
    if (r > 0) {
      mass += r;
      if (r > top_r) top_r = r, top = static_cast<int32_t>(v);
    }
  }
  if (mass < kResidualFloor) return sample_log_of(p, seed, position, RngStream::Residual);
  return drawn(sample_gumbel_of_weights(
      p, residual, [&](int32_t v) { return static_cast<float>(std::log(residual(v))); }, top,
      seed, position, RngStream::Residual));
}

namespace {

// The exact rule over a round's target rows. `rows.prob(i, t)` is p_i(t), the one value a row's
// acceptance test reads; `rows.probs(i)` the whole row [vocab], fetched only where a draw needs
// it (a rejection's residual, the bonus token), so an accepted row of a verifier that transforms
// logits on demand costs one exp instead of a vocabulary's.
// `bonus` false: there is no row after the last draft token, so when every token passes none is
// drawn (the pipeline's optimistic continuation).
template <class Rows>
RoundOutcome speculative_sample_rows(std::span<const int32_t> draft, std::span<const float> q, int64_t vocab,
                                     uint64_t seed, int64_t position, Rows& rows, bool bonus = true) {
  const int64_t k = static_cast<int64_t>(draft.size());
  assert(static_cast<int64_t>(q.size()) == k * vocab);
  RoundOutcome out;
  for (int64_t i = 0; i < k; ++i) {
    const int32_t t = draft[i];
    const std::span<const float> q_i = row(q, vocab, i);
    // accept t_i with probability min(1, p(t_i) / q(t_i)); else draw from norm(max(0, p - q)) and stop
    if (accept_draft_token(rows.prob(i, t), q_i[t], acceptance_uniform(seed, position + i))) {
      out.tokens.push_back(t);
      ++out.accepted;
      continue;
    }
    out.tokens.push_back(rows.recovered(i, q_i, seed, position + i));
    return out;
  }
  if (!bonus) return out;
  out.tokens.push_back(rows.draw(k, seed, position + k));
  out.bonus = true;
  return out;
}

// sum_v max(0, w p_v - q_v) as w - sum_{q_v > 0} min(w p_v, q_v) (p sums to 1), reading p_v
// (`p(v)`) only where q_v > 0: the head's N tokens, one for a one-hot q.
template <class P>
double weighted_residual_mass(std::span<const float> q, double w, P&& p) {
  double kept = 0;
  for (size_t v = 0; v < q.size(); ++v)
    if (q[v] > 0) kept += std::min(w * static_cast<double>(p(v)), static_cast<double>(q[v]));
  return std::max(0.0, w - kept);
}

// Block verification (Sun et al., "Block verification accelerates speculative decoding", ICLR
// 2025): the draft judged as a whole. With w_0 = 1 and w_j = min(1, w_{j-1} p_{j-1}(t_j) /
// q_{j-1}(t_j)) (rows 0-based: row j is the distribution of the token after t_1..t_j), the round
// keeps t_1..t_tau for the largest tau in 1..k whose uniform u_tau (RngStream::BlockAccept: keyed
// by the round, speculative_sampling.h) falls below
//   h_k = w_k,   h_j = s_j / (s_j + 1 - w_j) with s_j = sum_x max(0, w_j p_j(x) - q_j(x)) for j < k,
// or tau = 0 if none does; then draws the bonus token from p_k (tau = k) or the recovered token
// from the weighted residual norm(max(0, w_tau p_tau - q_tau)). The output keeps the target's
// distribution (the paper's theorem; tests/unit/spec/test_speculative_exactness.cpp by chi-square)
// and the expected number of accepted tokens is never below the token rule's; at k = 1 the two
// rules agree in law (h_1 = w_1, u < w_1 tested as the token rule's u q < p, so with the token
// rule's uniform the verdict would be the same). Rows past the last kept one are read for their
// draft token's probability only, and a row's s_j only where the scan reaches it with w_j < 1
// (w_j = 1 makes h_j = 1: s_j > 0 unless p_j = q_j exactly, when the residual's floor applies as
// in the token rule), over q_j's support only (weighted_residual_mass).
template <class Rows>
RoundOutcome block_verify_rows(std::span<const int32_t> draft, std::span<const float> q, int64_t vocab, uint64_t seed,
                               int64_t position, Rows& rows, bool bonus = true) {
  const int64_t k = static_cast<int64_t>(draft.size());
  assert(static_cast<int64_t>(q.size()) == k * vocab);
  std::vector<double> w(static_cast<size_t>(k) + 1, 1.0);
  std::vector<double> pt(static_cast<size_t>(k)), qt(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    pt[j] = rows.prob(j, draft[j]);
    qt[j] = row(q, vocab, j)[static_cast<size_t>(draft[j])];
    // A token the draft gave no mass is never kept (accept_draft_token's rule): w 0 from there.
    w[j + 1] = qt[j] > 0 ? std::min(1.0, w[j] * pt[j] / qt[j]) : 0.0;
  }
  int64_t tau = 0;
  for (int64_t j = k; j >= 1 && tau == 0; --j) {
    const double u = philox_uniform(seed, position, RngStream::BlockAccept, static_cast<uint64_t>(j - 1));
    if (j == k) {
      // u < min(1, w_{k-1} p / q) as u q < w_{k-1} p: at w_{k-1} = 1 the token rule's arithmetic.
      if (qt[k - 1] > 0 && u * qt[k - 1] < w[k - 1] * pt[k - 1]) tau = k;
      continue;
    }
    if (w[j] >= 1.0) {
      tau = j;
      continue;
    }
    const double s_j = rows.residual_mass(j, row(q, vocab, j), w[j]);
    if (u * (s_j + 1.0 - w[j]) < s_j) tau = j;
  }
  RoundOutcome out;
  out.tokens.assign(draft.begin(), draft.begin() + tau);
  out.accepted = static_cast<int>(tau);
  if (tau < k) {
    out.tokens.push_back(rows.recovered(tau, row(q, vocab, tau), seed, position + tau, w[tau]));
  } else if (bonus) {
    out.tokens.push_back(rows.draw(k, seed, position + k));
    out.bonus = true;
  }
  return out;
}

// Rows given as probabilities.
struct ProbRows {
  std::span<const float> p;
  int64_t vocab;
  float prob(int64_t i, int32_t t) const { return row(p, vocab, i)[static_cast<size_t>(t)]; }
  std::span<const float> probs(int64_t i) const { return row(p, vocab, i); }
  // The recovered token: the draw from the residual norm(max(0, w p_i - q_i)).
  int32_t recovered(int64_t i, std::span<const float> q_i, uint64_t seed, int64_t position, double w = 1.0) const {
    return sample_recovered(probs(i), q_i, w, seed, position);
  }
  // The bonus token: the Gumbel-max draw over log p_i.
  int32_t draw(int64_t i, uint64_t seed, int64_t position) const { return sample_log_of(probs(i), seed, position, RngStream::Token); }
  double residual_mass(int64_t i, std::span<const float> q_i, double w) const {
    return weighted_residual_mass(q_i, w, [&](size_t v) { return probs(i)[v]; });
  }
};

// Rows given as logits, transformed as the round reaches them: transform_logits, then
// prob_from_log for the token a test reads, or probs_from_log over the row for a draw (the values
// transform_to_probs gives, to the bit).
// A row is transformed into one of `slots` buffers (row i into slot i % slots) and kept there
// until another row needs the slot: the token rule visits its rows once each, in order, and takes
// one slot; the block rule reads every drafted row and comes back to some, and takes one a row.
struct LogitRows {
  LogitRows(std::span<const float> l, const SamplingParams& s, int64_t v, int64_t slots = 1)
      : logits(l), sp(s), vocab(v), held(static_cast<size_t>(std::max<int64_t>(1, slots))) {}
  struct Slot {
    int64_t row = -1;
    std::vector<float> values;  // log p of `row`, or p once `probs` is set
    bool probs = false;
  };
  std::span<const float> logits;
  const SamplingParams& sp;
  int64_t vocab;
  std::vector<Slot> held;
  Slot* cur = nullptr;  // the slot of the row last fetched
  void fetch(int64_t i) {
    if (cur != nullptr && cur->row == i) return;
    cur = &held[static_cast<size_t>(i) % held.size()];
    if (cur->row == i) return;
    transform_logits(row(logits, vocab, i), sp, cur->values);
    cur->row = i;
    cur->probs = false;
  }
  float prob(int64_t i, int32_t t) {
    fetch(i);
    const float x = cur->values[static_cast<size_t>(t)];
    return cur->probs ? x : prob_from_log(x);
  }
  std::span<const float> probs(int64_t i) {
    fetch(i);
    if (!cur->probs) probs_from_log(cur->values);
    cur->probs = true;
    return cur->values;
  }
  // ProbRows::draw's token without making the row probabilities: each weight p_v =
  // prob_from_log(log p_v) and its float log are the values probs() and sample_log_of would
  // compute, taken only for the tokens the draw visits; a 64-token block is bounded by the
  // probability of its largest log p (prob_from_log is monotone; the margin covers an exp that
  // is not correctly rounded), so the draw skips what sample_log_of skips or less.
  // Each block's log p also bounds the log weights token by token (the filter in
  // sample_gumbel_of_weights_by_block: log of prob_from_log(x) is within 1e-5 of x where the
  // probability is not 0), so most tokens are ruled out before their exp is taken.
  int32_t draw(int64_t i, uint64_t seed, int64_t position) {
    fetch(i);
    if (cur->probs) return sample_log_of(cur->values, seed, position, RngStream::Token);
    const std::span<const float> logp = cur->values;
    auto p = [&](int32_t v) { return prob_from_log(logp[static_cast<size_t>(v)]); };
    return drawn(sample_gumbel_of_weights_by_block(
        logp.size(), [&](size_t b) { return block_cover(b); }, [&](int32_t v) { return static_cast<double>(p(v)); },
        [&](int32_t v) { return std::log(p(v)); }, argmax(logp), seed, position, RngStream::Token, logp.data()));
  }
  // ProbRows::recovered's token without making the row probabilities either: the residual
  // r_v = p_v - q_v (in double, p_v = prob_from_log(log p_v), the value probs() holds) is at most
  // p_v, so the bonus draw's block covers and bounds hold for it. sample_recovered falls back to a
  // draw from p when the residual's mass is below kResidualFloor; the mass is at least any one
  // positive r_v (a sum of non-negative doubles never falls below a term), so when the draw met an
  // r_v of at least the floor its token stands, and otherwise (p and q all but equal) the row is
  // made probabilities and sample_recovered decides as the definition does.
  // With a weight w <= 1 (the block rule's), the residual w p_v - q_v is at most p_v as well.
  int32_t recovered(int64_t i, std::span<const float> q_i, uint64_t seed, int64_t position, double w = 1.0) {
    fetch(i);
    if (cur->probs) return sample_recovered(cur->values, q_i, w, seed, position);
    const std::span<const float> logp = cur->values;
    double largest = 0;  // the largest residual the draw computed
    auto r = [&](int32_t v) {
      const double x = w * static_cast<double>(prob_from_log(logp[static_cast<size_t>(v)])) -
                       static_cast<double>(q_i[static_cast<size_t>(v)]);
      largest = std::max(largest, x);
      return x;
    };
    const int32_t t = sample_gumbel_of_weights_by_block(
        logp.size(), [&](size_t b) { return block_cover(b); }, r,
        [&](int32_t v) { return static_cast<float>(std::log(r(v))); }, argmax(logp), seed, position,
        RngStream::Residual, logp.data());
    if (largest >= kResidualFloor) return drawn(t);
    return sample_recovered(probs(i), q_i, w, seed, position);
  }
  // The block rule's s = sum_v max(0, w p_v - q_v), with p_v taken only where q_v > 0.
  double residual_mass(int64_t i, std::span<const float> q_i, double w) {
    fetch(i);
    if (cur->probs) return weighted_residual_mass(q_i, w, [&](size_t v) { return cur->values[v]; });
    return weighted_residual_mass(q_i, w, [&](size_t v) { return prob_from_log(cur->values[v]); });
  }
  // At least every probability of the 64 tokens from b (cur->values holds log p): exp of the largest,
  // widened for a float exp that is not correctly rounded (prob_from_log is monotone).
  double block_cover(size_t b) const {
    const float m = block_max(cur->values.data() + b, kGumbelBlock);
    return m == -std::numeric_limits<float>::infinity() ? 0.0 : std::exp(static_cast<double>(m)) * (1 + 1e-6);
  }
};

}  // namespace

RoundOutcome speculative_sample(std::span<const int32_t> draft, std::span<const float> q, std::span<const float> p,
                                int64_t vocab, uint64_t seed, int64_t position) {
  assert(static_cast<int64_t>(p.size()) == (static_cast<int64_t>(draft.size()) + 1) * vocab);
  ProbRows rows{p, vocab};
  return speculative_sample_rows(draft, q, vocab, seed, position, rows);
}

RoundOutcome block_sample(std::span<const int32_t> draft, std::span<const float> q, std::span<const float> p,
                          int64_t vocab, uint64_t seed, int64_t position) {
  assert(p.size() == (draft.size() + 1) * static_cast<size_t>(vocab));
  ProbRows rows{p, vocab};
  return block_verify_rows(draft, q, vocab, seed, position, rows);
}

namespace {

// The greedy rule over `rows` target rows (k + 1 with the bonus row, k without).
RoundOutcome greedy_rows(std::span<const int32_t> draft, std::span<const float> target_logits, int64_t vocab,
                         int64_t rows) {
  const int64_t k = static_cast<int64_t>(draft.size());
  assert(static_cast<int64_t>(target_logits.size()) == rows * vocab);
  RoundOutcome out;
  for (int64_t i = 0; i < rows; ++i) {
    const int32_t best = argmax(row(target_logits, vocab, i));
    out.tokens.push_back(best);
    if (i == k) { out.bonus = true; break; }
    if (draft[i] != best) break;
    ++out.accepted;
  }
  return out;
}

// The coupled rule over `rows` target rows (k + 1 with the bonus row, k without).
RoundOutcome coupled_rows(std::span<const int32_t> draft, std::span<const float> target_logits, int64_t vocab,
                          const SamplingParams& sp, int64_t position, int64_t rows) {
  const int64_t k = static_cast<int64_t>(draft.size());
  assert(static_cast<int64_t>(target_logits.size()) == rows * vocab);
  RoundOutcome out;
  std::vector<float> log_p;
  for (int64_t i = 0; i < rows; ++i) {
    // the draw target-only sampling makes at this position (sample_token's exact arithmetic)
    transform_logits(row(target_logits, vocab, i), sp, log_p);
    const int32_t y = sample_gumbel(log_p, sp.seed, position + i, RngStream::Token);
    out.tokens.push_back(y);
    if (i == k) { out.bonus = true; break; }
    if (draft[i] != y) break;
    ++out.accepted;
  }
  return out;
}

}  // namespace

RoundOutcome greedy_verify(std::span<const int32_t> draft, std::span<const float> target_logits, int64_t vocab) {
  return greedy_rows(draft, target_logits, vocab, static_cast<int64_t>(draft.size()) + 1);
}

RoundOutcome coupled_verify(std::span<const int32_t> draft, std::span<const float> target_logits, int64_t vocab,
                            const SamplingParams& sp, int64_t position) {
  return coupled_rows(draft, target_logits, vocab, sp, position, static_cast<int64_t>(draft.size()) + 1);
}

namespace {

// verify_draft and verify_draft_without_bonus: `rows` is k + 1 or k.
RoundOutcome verify_rows(const DraftProposal& draft, std::span<const float> target_logits, const SamplingParams& sp,
                         int64_t position, SpecSampling mode, int64_t rows) {
  const int64_t k = draft.k();
  const bool bonus = rows == k + 1;
  if (target_logits.empty() || rows < 1 || target_logits.size() % static_cast<size_t>(rows) != 0)
    throw std::invalid_argument("verify_draft: " + std::to_string(target_logits.size()) + " target logits are not " +
                                (bonus ? "k+1 = " : "k = ") + std::to_string(rows) + " rows");
  const int64_t vocab = static_cast<int64_t>(target_logits.size()) / rows;
  for (int32_t t : draft.tokens)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument("verify_draft: draft token " + std::to_string(t) + " is outside the vocabulary of " +
                                  std::to_string(vocab));
  if (sp.greedy()) return greedy_rows(draft.tokens, target_logits, vocab, rows);
  if (mode == SpecSampling::Coupled) return coupled_rows(draft.tokens, target_logits, vocab, sp, position, rows);
  if (static_cast<int64_t>(draft.q.size()) != k * vocab)
    throw std::invalid_argument("verify_draft: the draft has " + std::to_string(draft.q.size()) +
                                " q values for k = " + std::to_string(k) + " rows of " + std::to_string(vocab));
  if (mode == SpecSampling::Block) {
    LogitRows p(target_logits, sp, vocab, rows);
    return block_verify_rows(draft.tokens, draft.q, vocab, sp.seed, position, p, bonus);
  }
  LogitRows p(target_logits, sp, vocab);
  return speculative_sample_rows(draft.tokens, draft.q, vocab, sp.seed, position, p, bonus);
}

}  // namespace

RoundOutcome verify_draft(const DraftProposal& draft, std::span<const float> target_logits,
                          const SamplingParams& sp, int64_t position, SpecSampling mode) {
  return verify_rows(draft, target_logits, sp, position, mode, draft.k() + 1);
}

RoundOutcome verify_draft_without_bonus(const DraftProposal& draft, std::span<const float> target_logits,
                                        const SamplingParams& sp, int64_t position, SpecSampling mode) {
  if (draft.k() < 1) throw std::invalid_argument("verify_draft_without_bonus: the draft is empty");
  return verify_rows(draft, target_logits, sp, position, mode, draft.k());
}

}  // namespace specula
