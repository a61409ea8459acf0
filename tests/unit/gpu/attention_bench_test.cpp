// Microbenchmark, not a test (DISABLED_: run with --gtest_also_run_disabled_tests
// --gtest_filter='AttentionBench.*'): the AVX-512 and AVX2 attention kernels over a row K and over a
// transposed K (KvCacheConfig::k_transposed), one kv head of the default model's shape (3 query
// heads of 64 values) over 2,048 positions in 8 chunks of 256, cache-resident (0.5 MB of fp16 K
// and V), one thread: microseconds per call for the rows of a verify round, and what each row
// adds, which at long context is what a verify round's extra rows cost in attention. Over a row K the
// AVX2 kernel has no joint form: each row's chunks run alone, as attention() runs them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "gpu/host/attention.h"
#include "gpu/host/hmatmul.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/host/quant.h"

namespace specula {
namespace {

TEST(AttentionBench, DISABLED_ChunkKernelPerRowCountAt2048Positions) {
  if (!host_kernels::cpu_has_avx2_fma()) GTEST_SKIP() << "this CPU has neither AVX2+FMA+F16C nor AVX-512";
  const int64_t hd = 64, group = 3, bt = 16, ctx = 2048, blocks = ctx / bt + 1, rf = hd;  // one kv head
  std::mt19937 rng(1);
  std::normal_distribution<float> val(0.0f, 1.0f);
  std::vector<uint16_t> k(static_cast<size_t>(blocks * bt * rf)), kt(k.size()), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_fp16(val(rng)), v[i] = f32_to_fp16(val(rng));
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < bt; ++i)
      for (int64_t j = 0; j < rf; ++j) kt[static_cast<size_t>(b * bt * rf + j * bt + i)] = k[static_cast<size_t>((b * bt + i) * rf + j)];
  // The same values in bf16 pairs (KvCacheConfig::bf16): K's dimension pairs and V's position pairs.
  std::vector<uint16_t> kp(k.size()), vp(k.size());
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < bt; ++i)
      for (int64_t j = 0; j < rf; ++j) {
        const size_t from = static_cast<size_t>((b * bt + i) * rf + j);
        kp[static_cast<size_t>(b * bt * rf + (j & ~int64_t{1}) * bt + 2 * i + (j & 1))] = f32_to_bf16(fp16_to_f32(k[from]));
        vp[static_cast<size_t>((b * bt + (i & ~int64_t{1})) * rf + 2 * j + (i & 1))] = f32_to_bf16(fp16_to_f32(v[from]));
      }
  std::vector<int32_t> table;
  for (int64_t b = 0; b < blocks; ++b) table.push_back(static_cast<int32_t>((b * 37) % blocks));  // scattered
  const int64_t max_rows = 16;
  std::vector<float> q(static_cast<size_t>(max_rows * group * hd));
  for (float& x : q) x = val(rng);
  std::vector<float> out(static_cast<size_t>(max_rows * group * (2 + hd)));
  std::vector<float> scores(static_cast<size_t>(max_rows * group * host_kernels::kChunkTokens));
  for (const bool avx512 : {false, true})
  for (const int layout : {0, 1, 2}) {  // rows, transposed, bf16 pairs
    const bool transposed = layout >= 1, bf16 = layout == 2;
    if (avx512 && !host_kernels::cpu_has_avx512()) continue;
    if (bf16 && (!avx512 || !host_kernels::cpu_has_avx512_bf16())) continue;
    double t1 = 0;
    for (int64_t rows : {1, 2, 3, 5, 9, 16}) {
      // The rows of a round at the end of a 2,048-position context: row r sees ctx - rows + 1 + r.
      std::vector<std::vector<host_kernels::AttentionChunk>> per_chunk(ctx / host_kernels::kChunkTokens);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = ctx - rows + 1 + r;
        for (int64_t ch = 0; ch * host_kernels::kChunkTokens < n; ++ch) {
          host_kernels::AttentionChunk c;
          c.q = q.data() + r * group * hd;
          c.k = bf16 ? kp.data() : transposed ? kt.data() : k.data();
          c.v = bf16 ? vp.data() : v.data();
          c.f16 = true;
          c.k_transposed = transposed;
          c.bf16 = bf16;
          c.blocks = table.data();
          c.block_tokens = bt;
          c.row_stride = rf;
          c.head_dim = hd;
          c.group = group;
          c.p0 = ch * host_kernels::kChunkTokens;
          c.p1 = std::min(n, c.p0 + host_kernels::kChunkTokens);
          c.scale = 0.125f;
          float* o = out.data() + r * group * (2 + hd);
          c.m = o, c.l = o + group, c.o = o + 2 * group;
          c.scores = scores.data();
          per_chunk[static_cast<size_t>(ch)].push_back(c);
        }
      }
      std::vector<double> times;
      for (int rep = 0; rep < 15; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int it = 0; it < 10; ++it)
          for (const auto& cs : per_chunk) {
            if (bf16)
              host_kernels::attention_chunks_avx512bf16(cs);
            else if (avx512)
              host_kernels::attention_chunks_avx512(cs);
            else if (transposed)
              host_kernels::attention_chunks_avx2(cs);
            else
              for (const auto& c : cs) host_kernels::attention_chunk_avx2(c);
          }
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 10);
      }
      std::sort(times.begin(), times.end());
      if (rows == 1) t1 = times[0];
      std::printf("{\"isa\":\"%s\",\"k\":\"%s\",\"rows\":%lld,\"us\":%.1f,\"vs_one_row\":%.2f,\"us_per_extra_row\":%.1f,\"cycles_per_position_and_query_at_3.5GHz\":%.2f}\n",
                  avx512 ? "avx512" : "avx2", bf16 ? "bf16 pairs" : transposed ? "transposed" : "rows", static_cast<long long>(rows), times[0] * 1e6, times[0] / t1,
                  rows > 1 ? (times[0] - t1) / static_cast<double>(rows - 1) * 1e6 : 0.0,
                  times[0] * 3.5e9 / static_cast<double>(ctx * rows * group));
    }
  }
}

// The reads alone of a forward's K and V at 2,048 positions (the default model's 30 layers, 3 kv
// heads of 64 values, fp16, 47 MB: past the L3), two threads each reading its half of a layer's
// items (kv head, 256 positions) a line at a time, in the cache's layout (blocks of 16 positions,
// K [kv heads][64][16] and V [16][kv heads][64], so one head's V is 128 bytes of every 384) and in a
// head-major one (each kv head's K and V contiguous over the positions), with and without asking
// for the next item's lines ahead as attention() does (docs/kernels.md, "Where the attention's
// time goes at 2,048 positions"). Milliseconds a forward, the caches flushed between forwards.
TEST(AttentionBench, DISABLED_KAndVReadsAt2048PositionsInBlocksAgainstHeadMajor) {
  constexpr int kLayers = 30, kKvHeads = 3, kHd = 64, kBt = 16, kPos = 2048, kChunk = 256, kBlocks = kPos / kBt;
  constexpr size_t kBlockBytes = size_t{kKvHeads} * kHd * kBt * 2, kLayerBytes = size_t{kBlocks} * kBlockBytes;
  const size_t total = kLayers * kLayerBytes;
  std::vector<uint64_t> kbuf(total / 8, 1), vbuf(total / 8, 2), flush(size_t{64} << 17, 3);
  const char* kb = reinterpret_cast<const char*>(kbuf.data());
  const char* vb = reinterpret_cast<const char*>(vbuf.data());
  // An item's lines in read order: K's 16 runs, then V's 256 rows (two lines each). A head's run
  // (its 64 dimensions of a block's 16 positions) and a position's row are kRun and kRow bytes.
  constexpr size_t kRun = size_t{kHd} * kBt * 2, kRow = size_t{kHd} * 2, kHeadPlane = kLayerBytes / kKvHeads;
  auto lines_of = [&](size_t layer, size_t kh, size_t chunk, bool head_major, std::vector<const char*>& out) {
    out.clear();
    const size_t b0 = chunk * (kChunk / kBt), b1 = b0 + kChunk / kBt;
    for (size_t b = b0; b < b1; ++b) {
      const char* k = kb + layer * kLayerBytes + (head_major ? kh * kHeadPlane + b * kRun : b * kBlockBytes + kh * kRun);
      for (size_t i = 0; i < kRun; i += 64) out.push_back(k + i);
    }
    for (size_t b = b0; b < b1; ++b)
      for (size_t p = 0; p < kBt; ++p) {
        const char* v = vb + layer * kLayerBytes +
                        (head_major ? kh * kHeadPlane + (b * kBt + p) * kRow : b * kBlockBytes + (p * kKvHeads + kh) * kRow);
        out.push_back(v);
        out.push_back(v + 64);
      }
  };
  auto forward = [&](bool head_major, bool ahead) {
    uint64_t f = 0;
    for (size_t i = 0; i < flush.size(); i += 8) f += flush[i];
    std::atomic<uint64_t> sink{f};
    const auto t0 = std::chrono::steady_clock::now();
    auto half = [&](int t) {
      std::vector<const char*> cur, next;
      uint64_t acc = 0;
      constexpr size_t kChunks = kPos / kChunk, kItems = kKvHeads * kChunks;  // items: (kv head, chunk)
      for (size_t layer = 0; layer < kLayers; ++layer) {
        const size_t b = t ? kItems / 2 : 0, e = t ? kItems : kItems / 2;
        for (size_t i = b; i < e; ++i) {
          lines_of(layer, i / kChunks, i % kChunks, head_major, cur);
          if (i + 1 < e) lines_of(layer, (i + 1) / kChunks, (i + 1) % kChunks, head_major, next);
          else next.clear();
          size_t at = 0;
          for (const char* line : cur) {
            acc += *reinterpret_cast<const uint64_t*>(line);
            if (ahead && at < next.size()) __builtin_prefetch(next[at++], 0, 2);
          }
        }
      }
      sink += acc;
    };
    std::thread worker(half, 1);
    half(0);
    worker.join();
    EXPECT_GT(sink.load(), 0u);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const char* names[] = {"blocks", "head-major", "blocks, next item ahead", "head-major, next item ahead"};
  std::vector<double> ms[4];
  for (int rep = 0; rep < 200; ++rep)
    for (int mode = 0; mode < 4; ++mode) ms[mode].push_back(forward(mode & 1, mode & 2));
  for (int mode = 0; mode < 4; ++mode) {
    std::sort(ms[mode].begin(), ms[mode].end());
    const double median = ms[mode][ms[mode].size() / 2];
    std::printf("{\"layout\":\"%s\",\"median_ms\":%.3f,\"best_ms\":%.3f,\"gb_per_s\":%.1f}\n", names[mode], median, ms[mode][0],
                2.0 * static_cast<double>(total) / median / 1e6);
  }
}

}  // namespace
}  // namespace specula
