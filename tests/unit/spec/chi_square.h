// Pearson's chi-square goodness-of-fit test for the statistical exactness tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace specula::test {

struct ChiSquare {
  double stat = 0;
  int dof = 0;
  double critical = 0;
  bool pass() const { return stat < critical; }
  std::string str() const {
    return "chi2 " + std::to_string(stat) + " (dof " + std::to_string(dof) + ", critical " + std::to_string(critical) + ")";
  }
};

// Upper quantile of chi-square with `dof` degrees of freedom by Wilson-Hilferty; z = 3.719 is
// the 0.9999 normal quantile. The tests use 0.9999 rather than 0.999 because a binary runs
// dozens of them: a false failure stays below ~0.5% for the whole binary.
inline double chi_square_critical(int dof, double z = 3.719) {
  const double k = std::max(dof, 1);
  return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
}

// Counts over bins against expected probabilities p (sum 1). Bins expecting fewer than 5 draws
// are merged into one; a draw in a bin of probability 0 fails the test outright.
inline ChiSquare chi_square_test(const std::vector<int64_t>& counts, const std::vector<double>& p, int64_t n) {
  ChiSquare r;
  double rest_obs = 0, rest_exp = 0;
  int bins = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) {
      if (counts[i] > 0) r.stat = std::numeric_limits<double>::infinity();
      continue;
    }
    const double e = p[i] * static_cast<double>(n);
    if (e < 5) { rest_obs += static_cast<double>(counts[i]); rest_exp += e; continue; }
    r.stat += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
    ++bins;
  }
  if (rest_exp > 0) { r.stat += (rest_obs - rest_exp) * (rest_obs - rest_exp) / rest_exp; ++bins; }
  r.dof = std::max(bins - 1, 1);
  r.critical = chi_square_critical(r.dof);
  return r;
}

}  // namespace specula::test
