// HostOps::attention (gpu/host/attention.h), f32 and fp16 caches: against softmax(q k^T / sqrt(d)) v
// computed in double here, for contexts that span one and several 256-position chunks, GQA groups, two sequences
// with scattered blocks, on the AVX2 and portable paths; and the row property: a row's output is
// bit-equal whether it is attended alone or among other rows, on 1 or 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/host/attention.h"
#include "gpu/host/host_device.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/quant.h"
#include "gpu/kv_cache.h"

namespace specula {
namespace {

struct Shape {
  int64_t heads, kv_heads, hd;
};

std::vector<host_kernels::HostPath> paths() {
  std::vector<host_kernels::HostPath> v{host_kernels::host_path_for("portable")};
  if (host_kernels::cpu_has_avx2_fma()) v.push_back(host_kernels::host_path_for("avx2"));
  return v;
}

// Fills two sequences (lengths la, lb; their blocks interleaved in the pool) with random K/V.
struct Filled {
  std::unique_ptr<KvCache> kv;
  int a = -1, b = -1;
};

// K/V element at (seq, position) + j, whichever the cache's element type.
float kv_at(const KvCache& kv, bool k, int seq, int64_t p, int64_t j) {
  const int64_t off = kv.offset(seq, p) + j;
  if (kv.config().f16) return fp16_to_f32((k ? kv.k_pool_f16(0) : kv.v_pool_f16(0))[off]);
  return (k ? kv.k_pool(0) : kv.v_pool(0))[off];
}

Filled fill(HostOps& ops, const Shape& s, int64_t la, int64_t lb, uint32_t seed, bool f16 = false) {
  KvCacheConfig c;
  c.layers = 1;
  c.kv_heads = s.kv_heads;
  c.head_dim = s.hd;
  c.block_tokens = 16;
  c.num_blocks = (la + lb) / 16 + 4;
  c.f16 = f16;
  Filled f;
  f.kv = std::make_unique<KvCache>(ops, c);
  f.a = f.kv->create_sequence();
  f.b = f.kv->create_sequence();
  std::mt19937 rng(seed);
  std::normal_distribution<float> val(0.0f, 1.0f);
  const int64_t rf = s.kv_heads * s.hd;
  // Grow both a block at a time so their blocks interleave.
  for (int64_t p = 0; p < std::max(la, lb); p += 16) {
    if (p < la) f.kv->reserve(f.a, std::min(la, p + 16));
    if (p < lb) f.kv->reserve(f.b, std::min(lb, p + 16));
  }
  for (int seq : {f.a, f.b})
    for (int64_t p = 0; p < f.kv->length(seq); ++p) {
      const int64_t off = f.kv->offset(seq, p);
      for (int64_t j = 0; j < rf; ++j) {
        const float kj = val(rng), vj = val(rng);
        if (f16) {
          f.kv->k_pool_f16(0)[off + j] = f32_to_fp16(kj);
          f.kv->v_pool_f16(0)[off + j] = f32_to_fp16(vj);
        } else {
          f.kv->k_pool(0)[off + j] = kj;
          f.kv->v_pool(0)[off + j] = vj;
        }
      }
    }
  return f;
}

// out[heads * hd] for a query at position `pos` of `seq`, in double.
std::vector<double> naive(const KvCache& kv, int seq, const float* q, int64_t pos, const Shape& s) {
  const int64_t group = s.heads / s.kv_heads;
  std::vector<double> out(static_cast<size_t>(s.heads * s.hd));
  for (int64_t h = 0; h < s.heads; ++h) {
    const int64_t kh = h / group;
    std::vector<double> sc(static_cast<size_t>(pos + 1));
    double mx = -INFINITY;
    for (int64_t p = 0; p <= pos; ++p) {
      double d = 0;
      for (int64_t j = 0; j < s.hd; ++j) d += static_cast<double>(q[h * s.hd + j]) * kv_at(kv, true, seq, p, kh * s.hd + j);
      sc[p] = d / std::sqrt(static_cast<double>(s.hd));
      mx = std::max(mx, sc[p]);
    }
    double sum = 0;
    for (double& v : sc) sum += (v = std::exp(v - mx));
    for (int64_t p = 0; p <= pos; ++p) {
      for (int64_t j = 0; j < s.hd; ++j) out[h * s.hd + j] += sc[p] / sum * kv_at(kv, false, seq, p, kh * s.hd + j);
    }
  }
  return out;
}

TEST(HostAttention, MatchesSoftmaxAttentionInDoubleAcrossChunksGroupsAndScatteredBlocks) {
  for (const Shape s : {Shape{9, 3, 64}, Shape{4, 1, 32}, Shape{2, 2, 24}}) {
    for (const auto& path : paths())
     for (bool f16 : {false, true}) {
      HostOps ops(2, path);
      Filled f = fill(ops, s, 700, 300, 5, f16);
      // Rows: the last 3 positions of a (contexts 698..700: three chunks) and of b (298..300).
      std::vector<SeqSlice> slices{{f.a, 697, 3, 0}, {f.b, 297, 3, 3}};
      std::mt19937 rng(9);
      std::normal_distribution<float> val(0.0f, 1.0f);
      std::vector<float> q(static_cast<size_t>(6 * s.heads * s.hd)), out(q.size(), std::nanf(""));
      for (auto& v : q) v = val(rng);
      ops.attention(q.data(), *f.kv, 0, slices, s.heads, out.data());
      for (int64_t r = 0; r < 6; ++r) {
        const int seq = r < 3 ? f.a : f.b;
        const int64_t pos = (r < 3 ? 697 : 297) + r % 3;
        const auto want = naive(*f.kv, seq, q.data() + r * s.heads * s.hd, pos, s);
        for (int64_t j = 0; j < s.heads * s.hd; ++j)
          ASSERT_NEAR(out[r * s.heads * s.hd + j], want[j], 2e-5) << path.name() << (f16 ? " fp16" : " f32") << " heads " << s.heads << " row " << r << " value " << j;
      }
    }
  }
}

TEST(HostAttention, ARowsOutputIsBitEqualAloneOrAmongOtherRowsOnOneOrTwoThreads) {
  const Shape s{9, 3, 64};
  for (const auto& path : paths())
   for (bool f16 : {false, true}) {
    HostOps one(1, path), two(2, path);
    Filled f = fill(two, s, 600, 40, 6, f16);
    std::mt19937 rng(10);
    std::normal_distribution<float> val(0.0f, 1.0f);
    const int64_t width = s.heads * s.hd;
    std::vector<float> q(static_cast<size_t>(8 * width));
    for (auto& v : q) v = val(rng);
    // Together: 6 rows of a (positions 594..599) and 2 of b (38, 39).
    std::vector<SeqSlice> both{{f.a, 594, 6, 0}, {f.b, 38, 2, 6}};
    std::vector<float> together(q.size());
    two.attention(q.data(), *f.kv, 0, both, s.heads, together.data());
    for (int64_t r = 0; r < 8; ++r) {
      const SeqSlice alone{r < 6 ? f.a : f.b, r < 6 ? 594 + r : 38 + (r - 6), 1, 0};
      for (HostOps* ops : {&one, &two}) {
        std::vector<float> o(static_cast<size_t>(width));
        ops->attention(q.data() + r * width, *f.kv, 0, {&alone, 1}, s.heads, o.data());
        ASSERT_EQ(std::memcmp(o.data(), together.data() + r * width, static_cast<size_t>(width) * sizeof(float)), 0)
            << path.name() << " row " << r << " threads " << (ops == &one ? 1 : 2);
      }
    }
  }
}

TEST(HostAttention, AnFp16CacheStoresEachValueRoundedToNearestEvenAsTheReferenceConversion) {
  std::mt19937 rng(11);
  std::vector<float> x;
  for (int i = 0; i < 20000; ++i) x.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), i % 40 - 28));
  for (uint16_t h : {0x3c00, 0x0001, 0x03ff, 0x7bff}) {  // halfway between neighbours: ties to even
    const float a = fp16_to_f32(h), b = fp16_to_f32(static_cast<uint16_t>(h + 1));
    x.push_back((a + b) / 2);
    x.push_back(-(a + b) / 2);
  }
  x.push_back(1e6f);
  x.push_back(0.0f);
  std::vector<uint16_t> got(x.size());
  host_kernels::to_fp16(x.data(), got.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], f32_to_fp16(x[i])) << x[i];
}

}  // namespace
}  // namespace specula
