// The verify cost fit and the draft-length choice of actors/load_policy.h.
#include "actors/load_policy.h"

#include <algorithm>
#include <cmath>
#include <queue>

namespace specula::actors {

double expected_committed(double a, int k) {
  if (a >= 1.0) return k + 1;
  return (1 - std::pow(a, k + 1)) / (1 - a);
}

std::vector<int> choose_draft_lengths(std::span<const PolicyRequest> requests, const RoundCosts& costs) {
  std::vector<int> k(requests.size(), 0);
  double tokens = 0, seconds = costs.verify_intercept;  // E and the round's cost so far
  // The next draft token of each chosen request: its gain a^(K+1) (the chance that it is accepted,
  // i.e. that the round commits one more token).
  using Next = std::pair<double, size_t>;
  std::priority_queue<Next> next;
  for (size_t i = 0; i < requests.size(); ++i) {
    const PolicyRequest& r = requests[i];
    const double a = std::clamp(r.acceptance, 0.0, 1.0);
    k[i] = r.fixed ? std::max(r.k_max, 0) : 0;
    tokens += expected_committed(a, k[i]);
    seconds += costs.verify_per_row * (k[i] + 1) + costs.draft_per_token * k[i];
    if (!r.fixed && r.k_max > 0) next.push({a, i});
  }
  const double cost = costs.verify_per_row + costs.draft_per_token;  // of one more draft token
  while (!next.empty()) {
    const auto [gain, i] = next.top();
    // Worth it while gain / cost beats tokens / seconds; when costs are unknown (all 0) every
    // token with a chance of acceptance is.
    const bool worth = cost > 0 ? gain * seconds > tokens * cost : gain > 0;
    if (!worth) break;
    next.pop();
    ++k[i];
    tokens += gain;
    seconds += cost;
    if (k[i] < requests[i].k_max) next.push({gain * std::clamp(requests[i].acceptance, 0.0, 1.0), i});
  }
  for (size_t i = 0; i < requests.size(); ++i)
    if (requests[i].rule_sets_length && !requests[i].fixed && k[i] > 0) k[i] = requests[i].k_max;
  return k;
}

}  // namespace specula::actors
