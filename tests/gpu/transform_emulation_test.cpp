// The device's sort-free logits transform (gpu/cuda/device_verify.cu: radix select of the top-k /
// top-p cut on a 32-bit order key, ties at the cut by index) emulated sequentially on the host,
// step for step, against spec/sampling.cpp's transform_logits. It runs without a GPU: it checks
// the algorithm, not the kernel (tests/gpu/device_verify_test.cpp does that on a GPU), and it
// fails when the host rule changes in a way the device algorithm does not follow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "spec/sampling.h"

namespace specula::test {
namespace {

// device_verify.cu's order_key / key_value.
uint32_t order_key(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
float key_value(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
double exp_term(float logit, float inv_t, float mx) { return std::exp(static_cast<double>(logit) * inv_t - mx); }

struct Cut {
  float mx = 0;
  double log_sum = 0;
  bool all = true;
  uint32_t cut = 0;
  int tie_limit = 0;
  bool kept(float logit, int v) const {
    if (all) return true;
    const uint32_t k = order_key(logit);
    return k > cut || (k == cut && v < tie_limit);
  }
};

uint32_t radix_select(const std::vector<float>& x, float inv_t, float mx, bool by_mass, double target) {
  uint32_t prefix = 0, mask = 0;
  double remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    double hist[256] = {};
    for (float l : x) {
      const uint32_t k = order_key(l);
      if ((k & mask) == prefix) hist[(k >> shift) & 255] += by_mass ? exp_term(l, inv_t, mx) : 1.0;
    }
    double acc = 0;
    int digit = -1, lowest = -1;
    for (int b = 255; b >= 0; --b) {
      if (hist[b] <= 0) continue;
      lowest = b;
      if (acc + hist[b] >= remaining) {
        digit = b;
        break;
      }
      acc += hist[b];
    }
    if (digit < 0) digit = lowest, acc -= hist[lowest];
    remaining -= acc;
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}

int tie_limit(const std::vector<float>& x, uint32_t cut, int m) {
  int seen = 0;
  for (size_t v = 0; v < x.size(); ++v)
    if (order_key(x[v]) == cut && ++seen == m) return static_cast<int>(v) + 1;
  return -1;
}

// device_verify.cu's transform_row.
Cut transform_row(const std::vector<float>& x, float inv_t, int top_k, float top_p) {
  const int V = static_cast<int>(x.size());
  float mxl = -INFINITY;
  for (float l : x) mxl = std::fmax(mxl, l);
  Cut c;
  c.mx = mxl * inv_t;
  c.tie_limit = V;
  const bool use_k = top_k > 0 && top_k < V, use_p = top_p < 1.0f;
  if (use_k) {
    const uint32_t cut = radix_select(x, inv_t, c.mx, false, top_k);
    int above = 0;
    for (float l : x) above += order_key(l) > cut;
    c.all = false, c.cut = cut, c.tie_limit = tie_limit(x, cut, top_k - above);
  }
  if (use_p) {
    double s = 0;
    for (int v = 0; v < V; ++v)
      if (c.kept(x[v], v)) s += exp_term(x[v], inv_t, c.mx);
    const double target = static_cast<double>(top_p) * s;
    const uint32_t cut = radix_select(x, inv_t, c.mx, true, target);
    int above = 0, ties = 0;
    double mass_gt = 0;
    for (float l : x) {
      const uint32_t k = order_key(l);
      if (k > cut) ++above, mass_gt += exp_term(l, inv_t, c.mx);
      ties += k == cut;
    }
    int m = static_cast<int>(std::ceil((target - mass_gt) / exp_term(key_value(cut), inv_t, c.mx)));
    m = m < 1 ? 1 : (m > ties ? ties : m);
    if (!use_k || above + m < top_k) c.all = false, c.cut = cut, c.tie_limit = tie_limit(x, cut, m);
  }
  double s = 0;
  for (int v = 0; v < V; ++v)
    if (c.kept(x[v], v)) s += exp_term(x[v], inv_t, c.mx);
  c.log_sum = std::log(s);
  return c;
}

TEST(DeviceTransformEmulation, GivesTheHostsLogProbabilitiesBitForBit) {
  std::mt19937_64 rng(20261122);
  std::normal_distribution<float> g(0.0f, 1.0f);
  const float temps[] = {0.7f, 1.0f, 1.3f};
  const int ks[] = {0, 1, 5, 40, 300};
  const float ps[] = {1.0f, 0.9f, 0.5f, 0.05f};
  std::vector<float> want;
  for (int trial = 0; trial < 4000; ++trial) {
    const int V = 50 + static_cast<int>(rng() % 2000);
    const bool ties = trial % 2;  // a 0.5 grid: equal logits (and -0.0 beside +0.0) straddle the cuts
    std::vector<float> x(V);
    for (float& l : x) l = ties ? std::round(3.0f * g(rng) * 2.0f) / 2.0f : 3.0f * g(rng);
    const SamplingParams sp{temps[rng() % 3], ks[rng() % 5], ps[rng() % 4], 0};
    transform_logits(x, sp, want);
    const float inv_t = 1.0f / sp.temperature;
    const Cut c = transform_row(x, inv_t, sp.top_k, sp.top_p);
    for (int v = 0; v < V; ++v) {
      const float got = c.kept(x[v], v) ? static_cast<float>(static_cast<double>(x[v]) * inv_t - c.mx - c.log_sum)
                                        : -INFINITY;
      ASSERT_EQ(got, want[v]) << "trial " << trial << ", token " << v << " of " << V << ", T " << sp.temperature
                              << " top_k " << sp.top_k << " top_p " << sp.top_p << (ties ? ", ties" : "");
    }
  }
}

// The one known difference: the host accumulates top-p's cumulative sum token by token, so when
// top_p * sum falls exactly on a multiple of a tie group's mass (here: all logits equal, top_p
// 0.5, an even vocabulary) rounding can make it keep one token more than the exact cut.
TEST(DeviceTransformEmulation, MayKeepOneTokenFewerThanTheHostAtAnExactTopPBoundary) {
  const std::vector<float> x(862, 1.0f);
  std::vector<float> want;
  transform_logits(x, SamplingParams{1.0f, 0, 0.5f, 0}, want);
  const Cut c = transform_row(x, 1.0f, 0, 0.5f);
  int host = 0, device = 0;
  for (int v = 0; v < 862; ++v) host += want[v] != -INFINITY, device += c.kept(x[v], v);
  EXPECT_EQ(device, 431);
  EXPECT_GE(host, device);
  EXPECT_LE(host, device + 1);
}

}  // namespace
}  // namespace specula::test
