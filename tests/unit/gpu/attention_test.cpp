// HostOps::attention (gpu/host/attention.h), f32 and fp16 caches: against softmax(q k^T / sqrt(d)) v
// computed in double here, for contexts that span one and several 256-position chunks (and chunks
// of 1, 6 and exactly 256 positions), GQA groups of 1 to 8, head sizes of one to eight 16-value
// slices and one that only AVX2 handles, two sequences with scattered blocks, on the AVX-512, AVX2
// and portable paths (those the CPU has); the row property: a row's output is bit-equal whether it
// is attended alone or among other rows, on 1 or 2 threads; the AVX2 and AVX-512 chunk kernels' m, l
// and o against the portable kernel's, item by item, and their joint kernels' rows against each row
// alone. On the AVX2 and AVX-512 paths an fp16 cache keeps K transposed (KvCacheConfig::k_transposed)
// where the head size is a multiple of 16, so every test above covers that layout there too; on
// the AVX-512 path of a CPU with AVX-512 BF16, with SPECULA_KV=bf16, the cache holds K and V in
// bf16 pairs (KvCacheConfig::bf16): the tests through HostOps take that device too where the CPU
// has it, and the chunk-kernel tests take its layout explicitly.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gpu/host/attention.h"
#include "gpu/host/attention_next.h"
#include "gpu/host/hmatmul.h"
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
  if (host_kernels::cpu_has_avx512()) v.push_back(host_kernels::host_path_for("avx512"));
  return v;
}

// A device on `path`; with `bf16`, made under SPECULA_KV=bf16 (K and V in bf16 pairs where the
// path and CPU can multiply them).
std::unique_ptr<HostOps> device(int threads, const host_kernels::HostPath& path, bool bf16) {
  if (bf16) ::setenv("SPECULA_KV", "bf16", 1);
  auto ops = std::make_unique<HostOps>(threads, path);
  ::unsetenv("SPECULA_KV");
  return ops;
}

// Fills two sequences (lengths la, lb; their blocks interleaved in the pool) with random K/V.
struct Filled {
  std::unique_ptr<KvCache> kv;
  int a = -1, b = -1;
};

// K/V element at (seq, position) + j, whichever the cache's element type and layout.
float kv_at(const KvCache& kv, bool k, int seq, int64_t p, int64_t j) {
  const int64_t off = k ? kv.k_offset(seq, p, j) : kv.v_offset(seq, p, j);
  if (kv.config().bf16) return bf16_to_f32((k ? kv.k_pool_f16(0) : kv.v_pool_f16(0))[off]);
  if (kv.config().f16) return fp16_to_f32((k ? kv.k_pool_f16(0) : kv.v_pool_f16(0))[off]);
  return (k ? kv.k_pool(0) : kv.v_pool(0))[off];
}

// The cache head-major where the device wants it, unless `head_major` says (0 or 1).
Filled fill(HostOps& ops, const Shape& s, int64_t la, int64_t lb, uint32_t seed, bool f16 = false, int head_major = -1) {
  KvCacheConfig c;
  c.layers = 1;
  c.kv_heads = s.kv_heads;
  c.head_dim = s.hd;
  c.block_tokens = 16;
  c.num_blocks = (la + lb) / 16 + 4;
  c.f16 = f16;
  c.k_transposed = f16 && ops.kv_k_transposed(s.hd, c.block_tokens);
  c.bf16 = c.k_transposed && ops.kv_bf16(s.hd, c.block_tokens);
  c.head_major = head_major < 0 ? ops.kv_head_major() : head_major == 1;
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
      for (int64_t j = 0; j < rf; ++j) {
        const float kj = val(rng), vj = val(rng);
        if (f16) {
          f.kv->k_pool_f16(0)[f.kv->k_offset(seq, p, j)] = c.bf16 ? f32_to_bf16(kj) : f32_to_fp16(kj);
          f.kv->v_pool_f16(0)[f.kv->v_offset(seq, p, j)] = c.bf16 ? f32_to_bf16(vj) : f32_to_fp16(vj);
        } else {
          f.kv->k_pool(0)[f.kv->k_offset(seq, p, j)] = kj;
          f.kv->v_pool(0)[f.kv->v_offset(seq, p, j)] = vj;
        }
      }
    }
  return f;
}

// out[heads * hd] for a query at position `pos` of `seq`, in double (over bf16 pairs with q rounded
// to bf16, as the kernel multiplies it).
std::vector<double> naive(const KvCache& kv, int seq, const float* q, int64_t pos, const Shape& s) {
  std::vector<float> qb(q, q + s.heads * s.hd);
  if (kv.config().bf16)
    for (float& x : qb) x = bf16_to_f32(host_kernels::f32_to_bf16_ftz(x));
  q = qb.data();
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

TEST(HostAttention, MatchesSoftmaxAttentionInDoubleAcrossChunksGroupsHeadSizesAndScatteredBlocks) {
  // Groups 3, 4, 8 (two pieces of 4 on AVX-512), 5 (3 + 2) and 1; head sizes of 4, 2, 2 + 1, 4 + 4,
  // 4 + 1 and 1 slices of 16 values, and 24 (AVX2 even on the AVX-512 path).
  for (const Shape s : {Shape{9, 3, 64}, Shape{4, 1, 32}, Shape{8, 1, 48}, Shape{6, 2, 128}, Shape{3, 3, 80},
                        Shape{5, 1, 16}, Shape{2, 2, 24}}) {
    for (const auto& path : paths())
     for (int cache = 0; cache < 3; ++cache) {  // f32, fp16, bf16 pairs (where the path has them)
      const bool f16 = cache > 0;
      const auto dev = device(2, path, cache == 2);
      HostOps& ops = *dev;
      if (cache == 2 && !ops.kv_bf16(s.hd, 16)) continue;
      Filled f = fill(ops, s, 700, 300, 5, f16);
      // Rows: the last 3 positions of a (contexts 698..700: three chunks, the last of 186..188
      // positions) and of b (298..300); a at 512 (a last chunk of 1 position) and 255 (one chunk of
      // exactly 256); b at 5 (one chunk of 6, shorter than a 16-position block).
      const std::vector<SeqSlice> slices{{f.a, 697, 3, 0}, {f.b, 297, 3, 3}, {f.a, 512, 1, 6}, {f.b, 5, 1, 7}, {f.a, 255, 1, 8}};
      const int64_t rows = 9;
      std::mt19937 rng(9);
      std::normal_distribution<float> val(0.0f, 1.0f);
      std::vector<float> q(static_cast<size_t>(rows * s.heads * s.hd)), out(q.size(), std::nanf(""));
      for (auto& v : q) v = val(rng);
      ops.attention(q.data(), *f.kv, 0, slices, s.heads, out.data());
      // Over bf16 pairs the kernel also rounds each weight exp(s - m) to bf16 (up to 2^-9 of it),
      // so an output moves by up to ~2^-9 of the largest |v| it averages (~4 for N(0, 1) values):
      // 1e-2, where a swapped pair, lane or offset moves it by ~1.
      const double tol = f.kv->config().bf16 ? 1e-2 : 2e-5;
      for (const SeqSlice& sl : slices)
        for (int64_t i = 0; i < sl.n; ++i) {
          const int64_t r = sl.row + i;
          const auto want = naive(*f.kv, sl.seq, q.data() + r * s.heads * s.hd, sl.start + i, s);
          for (int64_t j = 0; j < s.heads * s.hd; ++j)
            ASSERT_NEAR(out[r * s.heads * s.hd + j], want[j], tol)
                << path.name() << (f.kv->config().bf16 ? " bf16" : f16 ? " fp16" : " f32") << " heads " << s.heads << "/" << s.kv_heads << " head_dim " << s.hd
                << " row " << r << " value " << j;
        }
    }
  }
}

TEST(HostAttention, ARowsOutputIsBitEqualAloneOrAmongOtherRowsOnOneOrTwoThreads) {
  const Shape s{9, 3, 64};
  for (const auto& path : paths())
   for (int cache = 0; cache < 3; ++cache) {  // f32, fp16, bf16 pairs (where the path has them)
    const bool f16 = cache > 0;
    const auto one_dev = device(1, path, cache == 2), two_dev = device(2, path, cache == 2);
    HostOps &one = *one_dev, &two = *two_dev;
    if (cache == 2 && !two.kv_bf16(s.hd, 16)) continue;
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
            << path.name() << " cache " << cache << " row " << r << " threads " << (ops == &one ? 1 : 2);
      }
    }
  }
}

TEST(HostAttention, AHeadMajorCacheGivesEveryRowTheBitsOfTheBlockLayoutOnEveryPathAndCache) {
  // The same values in a cache with the heads inside each block and in a head-major one
  // (KvCacheConfig::head_major): the kernels read the same values in the same order through
  // other addresses, so every row's output must be the same bits; a wrong head base or row stride
  // reads other values. A verify round of 6 rows, a round of 2 and a single row, contexts of one and
  // three chunks.
  const Shape s{9, 3, 64};
  for (const auto& path : paths())
    for (int cache = 0; cache < 3; ++cache) {  // f32, fp16, bf16 pairs (where the path has them)
      const auto dev = device(2, path, cache == 2);
      HostOps& ops = *dev;
      if (cache == 2 && !ops.kv_bf16(s.hd, 16)) continue;
      Filled blocks = fill(ops, s, 600, 40, 8, cache > 0, 0), head_major = fill(ops, s, 600, 40, 8, cache > 0, 1);
      ASSERT_FALSE(blocks.kv->config().head_major);
      ASSERT_TRUE(head_major.kv->config().head_major);
      std::mt19937 rng(11);
      std::normal_distribution<float> val(0.0f, 1.0f);
      const int64_t width = s.heads * s.hd;
      std::vector<float> q(static_cast<size_t>(9 * width));
      for (auto& v : q) v = val(rng);
      std::vector<float> got[2];
      for (int layout = 0; layout < 2; ++layout) {
        const Filled& f = layout ? head_major : blocks;
        const std::vector<SeqSlice> slices{{f.a, 594, 6, 0}, {f.b, 38, 2, 6}, {f.a, 100, 1, 8}};
        got[layout].assign(q.size(), std::nanf(""));
        ops.attention(q.data(), *f.kv, 0, slices, s.heads, got[layout].data());
      }
      for (const float x : got[0]) ASSERT_TRUE(std::isfinite(x)) << path.name() << " cache " << cache;
      ASSERT_EQ(std::memcmp(got[0].data(), got[1].data(), q.size() * sizeof(float)), 0) << path.name() << " cache " << cache;
    }
}

// Work items on kv head 1 of a two-head pool whose 16-position blocks are scattered (block i of the
// sequence is pool block (7 i + 3) mod 23): q for up to 8 query heads, K and V as f32 and fp16.
struct ChunkInputs {
  int64_t hd = 0;
  std::vector<float> q, kf, vf;
  std::vector<uint16_t> kh, vh, kt;  // kt: kh transposed within each block (KvCacheConfig::k_transposed)
  std::vector<uint16_t> kp, vp;      // the values in bf16 pairs (KvCacheConfig::bf16)
  std::vector<int32_t> blocks;
};

// The K layouts a chunk kernel reads.
enum class Layout { kF32, kF16, kF16Transposed, kBf16Pairs };
const char* name(Layout l) {
  return l == Layout::kF32 ? "f32" : l == Layout::kF16 ? "fp16" : l == Layout::kF16Transposed ? "fp16, K transposed" : "bf16 pairs";
}

ChunkInputs chunk_inputs(int64_t hd, uint32_t seed) {
  const int64_t bt = 16, pool_blocks = 23, rf = 2 * hd;
  ChunkInputs in;
  in.hd = hd;
  std::mt19937 rng(seed);
  std::normal_distribution<float> val(0.0f, 1.0f);
  in.q.resize(static_cast<size_t>(8 * hd));
  in.kf.resize(static_cast<size_t>(pool_blocks * bt * rf));
  in.vf.resize(in.kf.size());
  for (auto* v : {&in.q, &in.kf, &in.vf})
    for (float& x : *v) x = val(rng);
  for (size_t i = 0; i < in.kf.size(); ++i) {
    in.kh.push_back(f32_to_fp16(in.kf[i]));
    in.vh.push_back(f32_to_fp16(in.vf[i]));
  }
  in.kt.resize(in.kh.size());
  for (int64_t b = 0; b < pool_blocks; ++b)
    for (int64_t i = 0; i < bt; ++i)
      for (int64_t j = 0; j < rf; ++j) in.kt[static_cast<size_t>(b * bt * rf + j * bt + i)] = in.kh[static_cast<size_t>((b * bt + i) * rf + j)];
  in.kp.resize(in.kh.size());
  in.vp.resize(in.kh.size());
  for (int64_t b = 0; b < pool_blocks; ++b)
    for (int64_t i = 0; i < bt; ++i)
      for (int64_t j = 0; j < rf; ++j) {
        const size_t from = static_cast<size_t>((b * bt + i) * rf + j);
        in.kp[static_cast<size_t>(b * bt * rf + (j & ~int64_t{1}) * bt + 2 * i + (j & 1))] = f32_to_bf16(in.kf[from]);
        in.vp[static_cast<size_t>((b * bt + (i & ~int64_t{1})) * rf + 2 * j + (i & 1))] = f32_to_bf16(in.vf[from]);
      }
  for (int64_t i = 0; i < pool_blocks; ++i) in.blocks.push_back(static_cast<int32_t>((7 * i + 3) % pool_blocks));
  return in;
}

struct ChunkResult {
  std::vector<float> m, l, o;
};

// A chunk of kv head 1 of `in` over positions [p0, p1) for `group` query heads at q; outputs unset.
host_kernels::AttentionChunk chunk_of(const ChunkInputs& in, Layout layout, int64_t group, const float* q, int64_t p0,
                                      int64_t p1) {
  const int64_t hd = in.hd;
  const bool f16 = layout != Layout::kF32;
  host_kernels::AttentionChunk c;
  c.q = q;
  const bool bf16 = layout == Layout::kBf16Pairs;
  c.k = layout == Layout::kF32 ? static_cast<const void*>(in.kf.data() + hd)
        : layout == Layout::kF16 ? static_cast<const void*>(in.kh.data() + hd)
        : bf16                   ? static_cast<const void*>(in.kp.data() + hd * 16)
                                 : static_cast<const void*>(in.kt.data() + hd * 16);
  c.v = bf16 ? static_cast<const void*>(in.vp.data() + 2 * hd) : f16 ? static_cast<const void*>(in.vh.data() + hd) : in.vf.data() + hd;
  c.f16 = f16;
  c.k_transposed = layout == Layout::kF16Transposed || bf16;
  c.bf16 = bf16;
  c.blocks = in.blocks.data();
  c.block_tokens = 16;
  c.row_stride = 2 * hd;
  c.head_dim = hd;
  c.group = group;
  c.p0 = p0;
  c.p1 = p1;
  c.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  return c;
}

// Positions [p0, p1) (p1 <= 368) for the first `group` query heads, through `kernel`.
ChunkResult run_chunk(void (*kernel)(const host_kernels::AttentionChunk&), const ChunkInputs& in, Layout layout,
                      int64_t group, int64_t p0, int64_t p1) {
  const int64_t hd = in.hd;
  const size_t g = static_cast<size_t>(group);
  ChunkResult r{std::vector<float>(g, std::nanf("")), std::vector<float>(g, std::nanf("")), std::vector<float>(g * hd, std::nanf(""))};
  std::vector<float> scores(g * static_cast<size_t>(p1 - p0), std::nanf(""));
  host_kernels::AttentionChunk c = chunk_of(in, layout, group, in.q.data(), p0, p1);
  c.m = r.m.data();
  c.l = r.l.data();
  c.o = r.o.data();
  c.scores = scores.data();
  kernel(c);
  return r;
}

// The vector chunk kernels this CPU can run, with their joint (round) kernels, the K layouts each
// joint kernel reads, and where a chunk over a transposed K starts in the tests: where attention
// starts one (a multiple of 256, so of 16), 48 (block 3); the AVX2 kernel, which walks 8-position
// halves of a block, also at 40 (block 2, half 1). Over a row K chunks start at 37 (block 2,
// position 5), so that the rows cross scattered blocks mid-block.
struct VectorKernel {
  const char* name;
  void (*chunk)(const host_kernels::AttentionChunk&);
  void (*joint)(std::span<const host_kernels::AttentionChunk>);
  std::vector<Layout> joint_layouts;
  std::vector<int64_t> transposed_starts;
  std::vector<int64_t> starts(Layout layout) const {
    return layout == Layout::kF32 || layout == Layout::kF16 ? std::vector<int64_t>{37} : transposed_starts;
  }
};

std::vector<VectorKernel> vector_kernels() {
  std::vector<VectorKernel> v;
  if (host_kernels::cpu_has_avx2_fma())
    v.push_back({"avx2", host_kernels::attention_chunk_avx2, host_kernels::attention_chunks_avx2, {Layout::kF16Transposed}, {48, 40}});
  if (host_kernels::cpu_has_avx512())
    v.push_back({"avx512", host_kernels::attention_chunk_avx512, host_kernels::attention_chunks_avx512,
                 {Layout::kF32, Layout::kF16, Layout::kF16Transposed}, {48}});
  if (host_kernels::cpu_has_avx512_bf16())
    v.push_back({"avx512bf16", host_kernels::attention_chunk_avx512bf16, host_kernels::attention_chunks_avx512bf16,
                 {Layout::kBf16Pairs}, {48}});
  return v;
}

TEST(HostAttention, TheVectorChunkKernelsGiveThePortableKernelsMaximumSumAndOutputForAnyHeadSizeGroupAndLength) {
  if (vector_kernels().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA+F16C nor AVX-512";
  // The kernels sum in f32 in different orders: over up to 256 products of N(0, 1) values a score
  // differs by ~1e-6, which moves m by as much and l, o by as much relative; 2e-5 leaves 20x margin
  // while a wrong scale, lane, tail mask, head or slice offset is off by 1e-2 or more.
  const double tol = 2e-5;
  for (const VectorKernel& kernel : vector_kernels())
    for (int64_t hd : {16, 32, 48, 64, 80, 128, 256}) {
      const ChunkInputs in = chunk_inputs(hd, static_cast<uint32_t>(hd));
      for (int64_t group : {1, 2, 3, 4, 5, 7, 8})
        for (int64_t n : {1, 7, 15, 16, 17, 100, 256})
          for (Layout layout : kernel.joint_layouts == std::vector<Layout>{Layout::kBf16Pairs}
                                   ? kernel.joint_layouts
                                   : std::vector<Layout>{Layout::kF32, Layout::kF16, Layout::kF16Transposed})
            for (int64_t p0 : kernel.starts(layout)) {
              const int64_t p1 = p0 + n;
              const ChunkResult want = run_chunk(host_kernels::attention_chunk_portable, in, layout, group, p0, p1);
              const ChunkResult got = run_chunk(kernel.chunk, in, layout, group, p0, p1);
              // Over bf16 pairs the scores are the emulation's bits (so m is), and each weight is
              // rounded to bf16 after an exponential that differs from std::exp by ~1e-7: a weight
              // near a rounding boundary may round the other way (2^-8 of it), so o / l within 1e-2
              // (a swapped pair, lane or offset is off by ~1); "TheBf16KernelsVSums..." below holds
              // the V sums to the bit.
              const bool bf16 = layout == Layout::kBf16Pairs;
              for (int64_t g = 0; g < group; ++g) {
                const size_t gi = static_cast<size_t>(g);
                const auto where = [&] {
                  return ::testing::Message() << kernel.name << ", " << name(layout) << " from " << p0 << " head_dim " << hd
                                              << " group " << group << " positions " << n << " head " << g;
                };
                if (bf16)
                  ASSERT_EQ(got.m[gi], want.m[gi]) << where() << ": m";
                else
                  ASSERT_NEAR(got.m[gi], want.m[gi], tol * (1 + std::fabs(want.m[gi]))) << where() << ": m";
                ASSERT_NEAR(got.l[gi], want.l[gi], tol * want.l[gi]) << where() << ": l";
                for (int64_t d = 0; d < hd; ++d) {
                  const size_t i = static_cast<size_t>(g * hd + d);
                  ASSERT_NEAR(got.o[i] / got.l[gi], want.o[i] / want.l[gi], bf16 ? 1e-2 : tol) << where() << ": o / l at " << d;
                }
              }
            }
    }
}

TEST(HostAttention, TheBf16KernelsVSumsAreThePortableEmulationsBitForBitWhenTheWeightsAreExact) {
  if (!host_kernels::cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  // q = 0 makes every score 0 and every weight exp(0) = 1 in both kernels, so o is the sum of the
  // V values in the kernel's pair order, which the portable emulation (dpbf16_pair) must give to
  // the bit for every length (odd ones end with a half pair), head size and group.
  for (int64_t hd : {16, 48, 64, 128})
    for (int64_t group : {1, 3, 5})
      for (int64_t n : {1, 2, 7, 16, 17, 100, 255, 256}) {
        ChunkInputs in = chunk_inputs(hd, static_cast<uint32_t>(hd + n));
        std::fill(in.q.begin(), in.q.end(), 0.0f);
        const ChunkResult want = run_chunk(host_kernels::attention_chunk_portable, in, Layout::kBf16Pairs, group, 48, 48 + n);
        const ChunkResult got = run_chunk(host_kernels::attention_chunk_avx512bf16, in, Layout::kBf16Pairs, group, 48, 48 + n);
        ASSERT_EQ(std::memcmp(got.o.data(), want.o.data(), got.o.size() * sizeof(float)), 0)
            << "head_dim " << hd << " group " << group << " positions " << n;
        for (int64_t g = 0; g < group; ++g) ASSERT_EQ(got.l[static_cast<size_t>(g)], static_cast<float>(n));
      }
}

TEST(HostAttention, TheJointKernelsGiveEveryRowOfARoundTheBitsOfThatRowAlone) {
  if (vector_kernels().empty()) GTEST_SKIP() << "this CPU has neither AVX2+FMA+F16C nor AVX-512";
  // A verify round's rows share a chunk's p0 but end at consecutive positions (and the last chunk
  // of a long context starts after some rows' ends: those rows are not passed). The joint kernel
  // runs their query heads in passes across rows; each row must get what it gets alone.
  std::mt19937 rng(77);
  std::normal_distribution<float> val(0.0f, 1.0f);
  for (const VectorKernel& kernel : vector_kernels())
    for (int64_t hd : {16, 64, 80, 128})
      for (int64_t group : {1, 2, 3, 5})
        for (int64_t rows : {1, 2, 5, 9, 13})
          for (int64_t first_n : {1, 15, 16, 100, 256 - 8})
            for (Layout layout : kernel.joint_layouts)
              for (int64_t p0 : kernel.starts(layout)) {
                if (rows * group > host_kernels::kMaxJointQueries) continue;
                const ChunkInputs in = chunk_inputs(hd, static_cast<uint32_t>(hd + group));
                std::vector<float> q(static_cast<size_t>(rows * group * hd));
                for (float& x : q) x = val(rng);
                const size_t per = static_cast<size_t>(group * (2 + hd));
                std::vector<float> joint(static_cast<size_t>(rows) * per, std::nanf(""));
                std::vector<float> alone(joint.size(), std::nanf(""));
                std::vector<float> scores(static_cast<size_t>(rows * group * host_kernels::kChunkTokens), std::nanf(""));
                std::vector<host_kernels::AttentionChunk> cs;
                for (int64_t r = 0; r < rows; ++r) {
                  host_kernels::AttentionChunk c = chunk_of(in, layout, group, q.data() + r * group * hd, p0,
                                                            p0 + std::min<int64_t>(first_n + r, host_kernels::kChunkTokens));
                  float* out = joint.data() + static_cast<size_t>(r) * per;
                  c.m = out, c.l = out + group, c.o = out + 2 * group;
                  c.scores = scores.data();
                  cs.push_back(c);
                }
                kernel.joint(cs);
                for (int64_t r = 0; r < rows; ++r) {
                  host_kernels::AttentionChunk c = cs[static_cast<size_t>(r)];
                  float* out = alone.data() + static_cast<size_t>(r) * per;
                  c.m = out, c.l = out + group, c.o = out + 2 * group;
                  kernel.chunk(c);
                }
                ASSERT_EQ(std::memcmp(joint.data(), alone.data(), joint.size() * sizeof(float)), 0)
                    << kernel.name << ", " << name(layout) << " from " << p0 << " head_dim " << hd << " group " << group
                    << " rows " << rows << " first row's positions " << first_n;
              }
}

TEST(HostAttention, KvStorePutsEveryValueWhereTheCachesOffsetsSayInEveryLayout) {
  // Two sequences whose blocks interleave, rows stored through HostOps::kv_store in two calls, then
  // read back element by element through KvCache::v_offset and k_offset: f32, fp16, and fp16
  // with K transposed (which a planted mix-up of position and dimension would scatter).
  const Shape s{6, 2, 32};
  const int64_t rf = s.kv_heads * s.hd;
  // And bf16 pairs (layout 3: K's dimension pairs, V's position pairs, each value rounded to bf16).
  // Each with the heads inside the blocks and head-major (KvCacheConfig::head_major).
  for (int variant = 0; variant < 8; ++variant) {
    const int layout = variant % 4;
    HostOps ops(1, host_kernels::host_path_for("portable"));
    KvCacheConfig c;
    c.head_major = variant >= 4;
    c.layers = 2;
    c.kv_heads = s.kv_heads;
    c.head_dim = s.hd;
    c.num_blocks = 8;
    c.f16 = layout > 0;
    c.k_transposed = layout >= 2;
    c.bf16 = layout == 3;
    KvCache kv(ops, c);
    const int a = kv.create_sequence(), b = kv.create_sequence();
    kv.reserve(a, 16);
    kv.reserve(b, 20);
    kv.reserve(a, 40);
    std::mt19937 rng(3);
    std::normal_distribution<float> val(0.0f, 1.0f);
    std::vector<float> k(static_cast<size_t>(60 * rf)), v(k.size());
    for (auto* x : {&k, &v})
      for (float& e : *x) e = val(rng);
    const std::vector<SeqSlice> first{{a, 0, 30, 0}, {b, 0, 12, 30}}, second{{a, 30, 10, 42}, {b, 12, 8, 52}};
    ops.kv_store(kv, 1, k.data(), v.data(), first);
    ops.kv_store(kv, 1, k.data(), v.data(), second);
    for (const auto* sl : {&first, &second})
      for (const SeqSlice& x : *sl)
        for (int64_t i = 0; i < x.n; ++i)
          for (int64_t j = 0; j < rf; ++j) {
            const size_t at = static_cast<size_t>((x.row + i) * rf + j);
            const auto stored = [&](float x, bool bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(x)) : c.f16 ? fp16_to_f32(f32_to_fp16(x)) : x; };
            const auto read = [&](const uint16_t* pool, int64_t o, bool bf16) { return bf16 ? bf16_to_f32(pool[o]) : fp16_to_f32(pool[o]); };
            const float want_k = stored(k[at], c.bf16), want_v = stored(v[at], c.bf16);
            const int64_t ko = kv.k_offset(x.seq, x.start + i, j), vo = kv.v_offset(x.seq, x.start + i, j);
            const float got_k = c.f16 ? read(kv.k_pool_f16(1), ko, c.bf16) : kv.k_pool(1)[ko];
            const float got_v = c.f16 ? read(kv.v_pool_f16(1), vo, c.bf16) : kv.v_pool(1)[vo];
            ASSERT_EQ(got_k, want_k) << "layout " << variant << " seq " << x.seq << " position " << x.start + i << " K " << j;
            ASSERT_EQ(got_v, want_v) << "layout " << variant << " seq " << x.seq << " position " << x.start + i << " V " << j;
          }
  }
}

TEST(HostAttention, TheNextChunksPrefetchedLinesAreTheLinesItsKAndVOccupyInBothTransposedLayouts) {
  // NextLines (attention_next.h) walks the chunk a thread computes next, as attention() describes
  // it to the kernels; the lines it walks must be the lines the cache's own offsets put that
  // chunk's K (its runs of 16 positions, as the kernels read them) and V (its positions, or pairs
  // of positions with bf16 pairs) in: fp16 with K transposed and bf16 pairs, blocks of 16, 32 and
  // 64 positions scattered over two sequences, head sizes 16 to 128, every kv head, chunks short,
  // long and past the first. A wrong stride, piece or block offset leaves lines out or adds others.
  for (const bool head_major : {false, true})
  for (const bool bf16 : {false, true})
    for (const int64_t bt : {16, 32, 64})
      for (const int64_t hd : {16, 64, 128}) {
        HostOps ops(1, host_kernels::host_path_for("portable"));
        KvCacheConfig c;
        c.head_major = head_major;
        c.layers = 1;
        c.kv_heads = 3;
        c.head_dim = hd;
        c.block_tokens = bt;
        c.num_blocks = 2 * 600 / bt + 4;
        c.f16 = true;
        c.k_transposed = true;
        c.bf16 = bf16;
        KvCache kv(ops, c);
        const int a = kv.create_sequence(), b = kv.create_sequence();
        for (int64_t len = bt; len <= 600; len += bt) kv.reserve(a, len), kv.reserve(b, len);  // interleaved blocks
        const char* k_pool = reinterpret_cast<const char*>(kv.k_pool_f16(0));
        const char* v_pool = reinterpret_cast<const char*>(kv.v_pool_f16(0));
        for (int64_t kh = 0; kh < c.kv_heads; ++kh)
          for (const auto& [p0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {0, 17}, {256, 256}, {512, 75}}) {
            host_kernels::AttentionChunk ch;  // as attention() makes it for the kv head
            ch.k = k_pool + kv.k_head_base(kh) * 2;
            ch.v = v_pool + kv.v_head_base(kh) * 2;
            ch.f16 = ch.k_transposed = true;
            ch.bf16 = bf16;
            ch.blocks = kv.block_table(b).data();
            ch.block_tokens = bt;
            ch.row_stride = kv.row_stride();
            ch.head_dim = hd;
            ch.p0 = p0;
            ch.p1 = p0 + n;
            const auto line = [](const char* at) { return reinterpret_cast<uintptr_t>(at) / 64; };
            std::set<uintptr_t> want, got;
            for (int64_t p = p0; p < p0 + (n + 15) / 16 * 16; ++p)
              for (int64_t d = 0; d < hd; ++d) want.insert(line(k_pool + 2 * kv.k_offset(b, p, kh * hd + d)));
            for (int64_t p = p0; p < p0 + (bf16 ? (n + 1) / 2 * 2 : n); ++p)
              for (int64_t d = 0; d < hd; ++d) want.insert(line(v_pool + 2 * kv.v_offset(b, p, kh * hd + d)));
            host_kernels::NextLines next(&ch);
            int64_t walked = 0;
            for (int64_t step = 0; step < next.lines() + 3; step += 3)
              next.walk(3, [&](const char* at) { got.insert(line(at)), ++walked; });
            ASSERT_EQ(walked, next.lines());
            ASSERT_EQ(got, want) << (head_major ? "head-major, " : "") << (bf16 ? "bf16 pairs" : "fp16") << ", blocks of " << bt << ", head size " << hd << ", kv head "
                                 << kh << ", positions " << p0 << " + " << n;
          }
        // Nothing to walk without a chunk, for a row K, or for an empty chunk.
        EXPECT_EQ(host_kernels::NextLines(nullptr).lines(), 0);
      }
  host_kernels::AttentionChunk rows;
  rows.k_transposed = false;
  rows.p0 = 0, rows.p1 = 16, rows.block_tokens = 16;
  EXPECT_EQ(host_kernels::NextLines(&rows).lines(), 0);
}

TEST(HostAttention, ATransposedKNeedsAnFp16CacheAndBlocksAndHeadsOfMultiplesOf16) {
  HostOps ops(1, host_kernels::host_path_for("portable"));
  KvCacheConfig c;
  c.layers = 1;
  c.kv_heads = 1;
  c.head_dim = 64;
  c.num_blocks = 4;
  c.k_transposed = true;
  EXPECT_THROW(KvCache(ops, c), std::invalid_argument);  // f32
  c.f16 = true;
  c.block_tokens = 8;
  EXPECT_THROW(KvCache(ops, c), std::invalid_argument);
  c.block_tokens = 16;
  c.head_dim = 24;
  EXPECT_THROW(KvCache(ops, c), std::invalid_argument);
  c.head_dim = 64;
  EXPECT_NO_THROW(KvCache(ops, c));
  c.bf16 = true;  // bf16 pairs: on the transposed K's layout only
  EXPECT_NO_THROW(KvCache(ops, c));
  c.k_transposed = false;
  EXPECT_THROW(KvCache(ops, c), std::invalid_argument);
  // The device asks for it exactly where its AVX-512 and AVX2 attention kernels read it.
  EXPECT_FALSE(ops.kv_k_transposed(64, 16));
  for (const auto& path : paths()) {  // the vector paths the CPU has
    if (path.isa == host_kernels::Isa::kPortable) continue;
    HostOps fast(1, path);
    EXPECT_TRUE(fast.kv_k_transposed(64, 16)) << path.name();
    EXPECT_FALSE(fast.kv_k_transposed(24, 16)) << path.name();
    EXPECT_FALSE(fast.kv_k_transposed(64, 8)) << path.name();
    EXPECT_FALSE(fast.kv_k_transposed(1024, 16)) << path.name();
    EXPECT_FALSE(fast.kv_bf16(64, 16)) << path.name();  // fp16 unless SPECULA_KV=bf16 asks
  }
}

TEST(HostAttention, SpeculaKvAsksForBf16PairsOrTheFp16CacheAndRefusesAnUnknownValueInOneLine) {
  if (!host_kernels::cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512";
  const auto path = host_kernels::host_path_for("avx512");
  ::setenv("SPECULA_KV", "fp16", 1);
  EXPECT_FALSE(HostOps(1, path).kv_bf16(64, 16));
  ::setenv("SPECULA_KV", "bf16", 1);  // where the AVX-512 attention can multiply the pairs
  EXPECT_EQ(HostOps(1, path).kv_bf16(64, 16), host_kernels::cpu_has_avx512_bf16());
  EXPECT_FALSE(HostOps(1, path).kv_bf16(24, 16));
  EXPECT_FALSE(HostOps(1, host_kernels::host_path_for("avx2")).kv_bf16(64, 16));
  ::setenv("SPECULA_KV", "int8", 1);
  try {
    HostOps ops(1, path);
    ADD_FAILURE() << "SPECULA_KV=int8 was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "SPECULA_KV=int8: expected fp16 or bf16");
  }
  ::unsetenv("SPECULA_KV");
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
