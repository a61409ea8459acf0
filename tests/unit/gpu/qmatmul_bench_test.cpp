// Microbenchmark, not a test (DISABLED_: run with --gtest_also_run_disabled_tests
// --gtest_filter='QmatmulBench.*'): the int8 kernels on cache-resident weights (one 576 x 576
// matrix, 0.2 MB, called again and again on one thread), GB/s of weights and the cost of n rows
// against one, so a kernel that is compute-bound shows here whatever the machine's DRAM does.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gpu/host/hmatmul.h"
#include "gpu/host/matmul.h"
#include "gpu/host/qmatmul.h"
#include "gpu/host/quant.h"

namespace specula {
namespace {

// A rows x cols matrix of type t with random bytes, each block's first four bytes set to two fp16
// 2^-7 (the scale and min of Q4_0/Q4_1/Q8_0 blocks, Q4_K's d and dmin), so that no scale is a NaN
// or infinity. Both benchmarks below start from it.
std::vector<std::byte> random_blocks(DType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<std::byte> bytes(dtype_row_bytes(t, cols) * rows);
  for (auto& b : bytes) b = std::byte(rng() & 0xff);
  for (size_t o = 0; o < bytes.size(); o += dtype_info(t).block_bytes) {
    bytes[o] = std::byte(0);
    bytes[o + 1] = std::byte(0x20);
    bytes[o + 2] = std::byte(0);
    bytes[o + 3] = std::byte(0x20);
    if (t == DType::Q2_K)  // d and dmin are its last four bytes
      for (size_t k = 80; k < 84; ++k) bytes[o + k] = bytes[o + k - 80];
    if (t == DType::Q3_K)  // d is its last two
      for (size_t k = 108; k < 110; ++k) bytes[o + k] = bytes[o + k - 108];
  }
  return bytes;
}

TEST(QmatmulBench, DISABLED_CacheResidentKernelsPerRowCount) {
  using host_kernels::Int8Kernel;
  for (Int8Kernel kernel : {Int8Kernel::kAvx2, Int8Kernel::kAvxVnni, Int8Kernel::kAvx512Vnni, Int8Kernel::kAmx})
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::IQ4_NL, DType::Q2_K, DType::Q3_K,
                  DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS}) {
    if (!host_kernels::cpu_has_int8_kernel(kernel)) continue;
    const bool k_quant = t == DType::Q2_K || t == DType::Q3_K || t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K ||
                         t == DType::IQ4_XS;
    const int64_t rows = 576, cols = k_quant ? 768 : 576;  // K-quants: rows of 256
    std::mt19937 rng(1);
    const std::vector<std::byte> bytes = random_blocks(t, rows, cols, rng);
    const TensorView view{"w", t, {rows, cols}, bytes.data(), bytes.size()};
    ThreadPool pool(1);
    auto m = pack_matrix(view, pool, nullptr, /*narrow=*/true);  // as the device packs
    double t1 = 0;
    for (int64_t n : {1, 2, 3, 4, 5, 6, 8, 9, 12, 16}) {
      std::vector<float> x(n * cols), y(n * rows);
      for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 300.0f;
      const PackedMatrix* w = m.get();
      float* out = y.data();
      std::vector<double> times;
      for (int rep = 0; rep < 15; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int k = 0; k < 200; ++k) qmatmul({&w, 1}, x.data(), n, {&out, 1}, pool, kernel);
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 200);
      }
      std::sort(times.begin(), times.end());
      const double best = times[0];
      if (n == 1) t1 = best;
      std::printf("{\"kernel\":\"%s\",\"dtype\":\"%s\",\"n\":%lld,\"us\":%.2f,\"weight_gbs\":%.1f,\"vs_n1\":%.2f}\n", host_kernels::int8_kernel_name(kernel), dtype_name(t), static_cast<long long>(n),
                  best * 1e6, m->bytes() / best / 1e9, best / t1);
    }
  }
}

// The 16-bit path (hmatmul.h) against the f32 kernels the same weights run on otherwise (the
// reference path's AVX-512 kernels), same matrix, same thread.
TEST(QmatmulBench, DISABLED_CacheResidentHalfKernelsAgainstTheF32Kernels) {
  for (DType t : {DType::F16, DType::BF16}) {
    if (!hmatmul_supports(t, false)) continue;
    const int64_t rows = 576, cols = 576;
    std::vector<uint16_t> bits(static_cast<size_t>(rows * cols));
    std::mt19937 rng(1);
    std::normal_distribution<float> val(0.0f, 0.05f);
    for (auto& b : bits) {
      const float v = val(rng);
      if (t == DType::F16) {
        b = f32_to_fp16(v);
      } else {
        uint32_t u;
        std::memcpy(&u, &v, 4);
        b = static_cast<uint16_t>(u >> 16);
      }
    }
    const TensorView view{"w", t, {rows, cols}, reinterpret_cast<const std::byte*>(bits.data()), bits.size() * 2};
    ThreadPool pool(1);
    auto m = pack_matrix16(view, pool);
    double h1 = 0, f1 = 0;
    for (int64_t n : {1, 2, 5, 9, 16}) {
      std::vector<float> x(n * cols), y(n * rows);
      for (auto& v : x) v = val(rng) * 20;
      const PackedMatrix* w = m.get();
      float* out = y.data();
      auto best = [&](auto&& call) {
        double b = 1e9;
        for (int rep = 0; rep < 15; ++rep) {
          const auto t0 = std::chrono::steady_clock::now();
          for (int k = 0; k < 100; ++k) call();
          b = std::min(b, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 100);
        }
        return b;
      };
      const double h = best([&] { hmatmul({&w, 1}, x.data(), n, {&out, 1}, pool, false); });
      const double f = best([&] { matmul(view, x.data(), n, y.data(), pool, host_kernels::Isa::kAvx512); });
      if (n == 1) { h1 = h; f1 = f; }
      std::printf("{\"dtype\":\"%s\",\"n\":%lld,\"half_us\":%.2f,\"f32_us\":%.2f,\"half_vs_n1\":%.2f,\"f32_vs_n1\":%.2f,\"f32_over_half\":%.2f}\n",
                  dtype_name(t), static_cast<long long>(n), h * 1e6, f * 1e6, h / h1, f / f1, f / h);
    }
  }
}


// The same kernel streaming its weights from DRAM, as a forward does: `count` distinct 1536 x 576
// Q4_1 matrices (about 0.5 MB each; 768 MB in all, past any cache) run one after the other on the
// pool of 2 threads, n activation rows each. Against the same calls on one matrix again and
// again (cache-resident), this shows how much of the weight read the kernel hides under its
// arithmetic: if it overlapped perfectly, time(n) would be max(read, arithmetic), not the sum.
TEST(QmatmulBench, DISABLED_StreamingFromDramAgainstCacheResident) {
  const DType t = DType::Q4_1;
  const int64_t rows = 1536, cols = 576, count = 1536;
  const int threads = 2;
  std::mt19937 rng(1);
  const std::vector<std::byte> bytes = random_blocks(t, rows, cols, rng);
  const TensorView view{"w", t, {rows, cols}, bytes.data(), bytes.size()};
  ThreadPool pool(threads);
  std::vector<std::shared_ptr<PackedMatrix>> ms;
  for (int64_t i = 0; i < count; ++i) ms.push_back(pack_matrix(view, pool));
  using host_kernels::Int8Kernel;
  const Int8Kernel kernel = host_kernels::cpu_has_int8_kernel(Int8Kernel::kAvx512Vnni) ? Int8Kernel::kAvx512Vnni : Int8Kernel::kAvx2;
  double s1 = 0, c1 = 0;
  for (int64_t n : {1, 2, 3, 5, 9, 16}) {
    std::vector<float> x(n * cols), y(n * rows);
    for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 300.0f;
    float* out = y.data();
    double stream = 1e9, cached = 1e9;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < count; ++i) {
        const PackedMatrix* w = ms[static_cast<size_t>(i)].get();
        qmatmul({&w, 1}, x.data(), n, {&out, 1}, pool, kernel);
      }
      stream = std::min(stream, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / count);
      const PackedMatrix* w = ms[0].get();
      t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < count; ++i) qmatmul({&w, 1}, x.data(), n, {&out, 1}, pool, kernel);
      cached = std::min(cached, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / count);
    }
    if (n == 1) { s1 = stream; c1 = cached; }
    std::printf("{\"kernel\":\"%s\",\"n\":%lld,\"stream_us\":%.2f,\"stream_gbs\":%.1f,\"cached_us\":%.2f,\"stream_vs_n1\":%.2f,\"cached_vs_n1\":%.2f}\n",
                host_kernels::int8_kernel_name(kernel), static_cast<long long>(n), stream * 1e6, ms[0]->bytes() / stream / 1e9,
                cached * 1e6, stream / s1, cached / c1);
  }
}

// SmolLM2-135M's seven matrices of one decoder block ([rows, cols]: q, k, v, o, gate, up, down).
constexpr int64_t kSmolShapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
using SmolLayer = std::array<std::shared_ptr<PackedMatrix>, 7>;

// One block's matrices as stored (random Q4_1 blocks, one vector a matrix in kSmolShapes' order), and
// packed into `arena` (nullptr: each matrix in its own allocation).
std::vector<std::vector<std::byte>> random_smol_layer(std::mt19937& rng) {
  std::vector<std::vector<std::byte>> stored;
  for (const auto& shape : kSmolShapes) stored.push_back(random_blocks(DType::Q4_1, shape[0], shape[1], rng));
  return stored;
}
SmolLayer pack_smol_layer(const std::vector<std::vector<std::byte>>& stored, ThreadPool& pool, WeightArena* arena) {
  SmolLayer m;
  for (int i = 0; i < 7; ++i)
    m[i] = pack_matrix(TensorView{"w", DType::Q4_1, {kSmolShapes[i][0], kSmolShapes[i][1]}, stored[i].data(), stored[i].size()},
                       pool, arena);
  return m;
}

// The kernel the two step benchmarks below time: the 512-bit one where the CPU has it.
host_kernels::Int8Kernel step_kernel() {
  using host_kernels::Int8Kernel;
  return host_kernels::cpu_has_int8_kernel(Int8Kernel::kAvx512Vnni) ? Int8Kernel::kAvx512Vnni : Int8Kernel::kAvx2;
}

// One block's products as the forward fuses them: q, k and v in one call, o, gate and up in one,
// down; outputs into a, b, c (16 x 1536 floats each).
void run_smol_layer(const SmolLayer& m, const float* x, int64_t n, float* a, float* b, float* c, ThreadPool& pool,
                    host_kernels::Int8Kernel kernel) {
  const PackedMatrix* qkv[3] = {m[0].get(), m[1].get(), m[2].get()};
  float* yqkv[3] = {a, b, c};
  qmatmul(qkv, x, n, yqkv, pool, kernel);
  const PackedMatrix* o = m[3].get();
  qmatmul({&o, 1}, x, n, {&a, 1}, pool, kernel);
  const PackedMatrix* gu[2] = {m[4].get(), m[5].get()};
  float* ygu[2] = {a, b};
  qmatmul(gu, x, n, ygu, pool, kernel);
  const PackedMatrix* d = m[6].get();
  qmatmul({&d, 1}, x, n, {&c, 1}, pool, kernel);
}

// One SmolLM2-135M decode step's matrices on the int8 path, random values, in model order and
// fused as the forward fuses them (q, k, v in one call; gate and up in one), then the 49152 x 576
// Q8_0 output head: ~96 MB, past the L3, so every call streams its weights from DRAM. Time of
// n activation rows against one: what the matrices alone charge a verify round for its rows,
// beside `bench decode`'s forward cost, which adds attention, norms and the rest. The same
// matrices twice, taking turns: packed into a WeightArena (huge pages, as HostOps packs them)
// and each in its own allocation (4 KiB pages where THP is "madvise"); docs/kernels.md, "Huge
// pages for the weights".
TEST(QmatmulBench, DISABLED_SmolLM2StepMatricesByRowCount) {
  const host_kernels::Int8Kernel kernel = step_kernel();
  std::mt19937 rng(1);
  ThreadPool pool(2);
  WeightArena arena;
  struct Step { std::vector<SmolLayer> layers; std::shared_ptr<PackedMatrix> head; };
  Step steps[2];  // [0] the arena, [1] own allocations
  for (int l = 0; l < 30; ++l) {
    const std::vector<std::vector<std::byte>> stored = random_smol_layer(rng);
    for (int k = 0; k < 2; ++k) steps[k].layers.push_back(pack_smol_layer(stored, pool, k == 0 ? &arena : nullptr));
  }
  {
    const std::vector<std::byte> stored = random_blocks(DType::Q8_0, 49152, 576, rng);
    for (int k = 0; k < 2; ++k)
      steps[k].head = pack_matrix(TensorView{"w", DType::Q8_0, {49152, 576}, stored.data(), stored.size()}, pool, k == 0 ? &arena : nullptr);
  }
  const int64_t nmax = 16;
  std::vector<float> x(nmax * 1536), a(nmax * 1536), b(nmax * 1536), c(nmax * 1536), logits(nmax * 49152);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 300.0f;
  auto step = [&](const Step& s, int64_t n) {
    for (const SmolLayer& m : s.layers) run_smol_layer(m, x.data(), n, a.data(), b.data(), c.data(), pool, kernel);
    const PackedMatrix* h = s.head.get();
    float* yl = logits.data();
    qmatmul({&h, 1}, x.data(), n, {&yl, 1}, pool, kernel);
  };
  const std::vector<int64_t> ns = {1, 2, 3, 4, 5, 6, 9, 16};
  std::vector<double> best[2] = {std::vector<double>(ns.size(), 1e9), std::vector<double>(ns.size(), 1e9)};
  for (int rep = 0; rep < 20; ++rep)  // the row counts and the two allocations take turns, so drift hits them alike
    for (size_t i = 0; i < ns.size(); ++i)
      for (int k = 0; k < 2; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        step(steps[k], ns[i]);
        best[k][i] = std::min(best[k][i], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
  for (size_t i = 0; i < ns.size(); ++i)
    std::printf("{\"kernel\":\"%s\",\"n\":%lld,\"step_matrices_ms\":%.3f,\"vs_n1\":%.3f,\"own_allocations_ms\":%.3f,"
                "\"arena_vs_own_allocations\":%.3f}\n",
                host_kernels::int8_kernel_name(kernel), static_cast<long long>(ns[i]), best[0][i] * 1e3, best[0][i] / best[0][0],
                best[1][i] * 1e3, best[0][i] / best[1][i]);
}

// Whether a verify round's extra rows wait on memory or on arithmetic: the 30 layers' matrices
// of SmolLM2-135M (Q4_1, as above, 66 MB, no output head) at n rows, each layer's own
// ("streamed": they come from the L3 or DRAM) against the first layer's seven matrices used 30
// times (2.2 MB, "resident": split between two cores' L2). Each (n, layout) is timed after 30
// untimed passes of its own (a pass's speed depends on the passes before it: docs/kernels.md,
// "What a forward costs depends on the forward before it"), the median of 30, in three turns.
// Where streamed equals resident, the rows cost arithmetic alone and no prefetch or cache hint
// can lower them (docs/kernels.md, "Streamed against resident weights").
TEST(QmatmulBench, DISABLED_StepMatricesStreamedAgainstResident) {
  const host_kernels::Int8Kernel kernel = step_kernel();
  std::mt19937 rng(1);
  ThreadPool pool(2);
  WeightArena arena;
  std::vector<SmolLayer> layers;
  for (int l = 0; l < 30; ++l) layers.push_back(pack_smol_layer(random_smol_layer(rng), pool, &arena));
  std::vector<float> x(16 * 1536), a(16 * 1536), b(16 * 1536), c(16 * 1536);
  for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) / 300.0f;
  auto pass = [&](bool resident, int64_t n) {
    for (size_t l = 0; l < layers.size(); ++l)
      run_smol_layer(layers[resident ? 0 : l], x.data(), n, a.data(), b.data(), c.data(), pool, kernel);
  };
  const int64_t ns[] = {1, 2, 3, 5, 9};
  for (int turn = 0; turn < 3; ++turn)
    for (int64_t n : ns) {
      double ms[2];
      for (int resident = 0; resident < 2; ++resident) {
        for (int k = 0; k < 30; ++k) pass(resident == 1, n);
        std::vector<double> t;
        for (int k = 0; k < 30; ++k) {
          const auto t0 = std::chrono::steady_clock::now();
          pass(resident == 1, n);
          t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::nth_element(t.begin(), t.begin() + 15, t.end());
        ms[resident] = t[15];
      }
      std::printf("{\"kernel\":\"%s\",\"turn\":%d,\"n\":%lld,\"streamed_ms\":%.3f,\"resident_ms\":%.3f,\"streamed_vs_resident\":%.3f}\n",
                  host_kernels::int8_kernel_name(kernel), turn, static_cast<long long>(n), ms[0], ms[1], ms[0] / ms[1]);
    }
}

// What one core's vector pipes do per nanosecond (disabled: a measurement, run as above), to
// tell how far the 512-bit kernel is from its arithmetic floor: eight independent vpdpbusd (the
// product) alone, eight FMAs alone, and the kernel's per-block mixes of six vpdpbusd with two
// FMAs (the float work per block and row: the scale product and the accumulating FMAs) or with a
// conversion and an integer add. On Zen 4 (docs/kernels.md, "Zen 4's vector pipes") vpdpbusd and
// the FMA share two pipes, one 512-bit instruction a cycle between them; the conversion and the
// add run beside them. Inline assembly, so the compiler's scheduling is not measured.
#if defined(__x86_64__)
template <class Body>
double ops_per_ns(Body body, long iters) {
  const auto t0 = std::chrono::steady_clock::now();
  body(iters);
  return iters * 8.0 / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
}

// Eight independent instructions per iteration, as one asm statement that writes zmm0..zmm7.
#define SPECULA_DP(r) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #r "\n"
#define SPECULA_FMA(r) "vfmadd231ps %%zmm28, %%zmm29, %%zmm" #r "\n"
#define SPECULA_SIX_DP SPECULA_DP(0) SPECULA_DP(1) SPECULA_DP(2) SPECULA_DP(3) SPECULA_DP(4) SPECULA_DP(5)
#define SPECULA_PIPE_LOOP(code) \
  [](long k) { while (k--) __asm__ volatile(code ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7"); }

TEST(QmatmulBench, DISABLED_VectorPipeThroughputOfTheKernelsInstructions) {
  if (!host_kernels::cpu_has_int8_kernel(host_kernels::Int8Kernel::kAvx512Vnni)) GTEST_SKIP() << "no AVX-512 VNNI on this CPU";
  const long n = 50'000'000;
  const double dp = ops_per_ns(SPECULA_PIPE_LOOP(SPECULA_SIX_DP SPECULA_DP(6) SPECULA_DP(7)), n);
  const double fma = ops_per_ns(SPECULA_PIPE_LOOP(SPECULA_FMA(0) SPECULA_FMA(1) SPECULA_FMA(2) SPECULA_FMA(3) SPECULA_FMA(4)
                                                      SPECULA_FMA(5) SPECULA_FMA(6) SPECULA_FMA(7)),
                                n);
  const double dp_fma = ops_per_ns(SPECULA_PIPE_LOOP(SPECULA_SIX_DP SPECULA_FMA(6) SPECULA_FMA(7)), n);
  const double dp_cvt =
      ops_per_ns(SPECULA_PIPE_LOOP(SPECULA_SIX_DP "vcvtdq2ps %%zmm29, %%zmm6\n vpaddd %%zmm28, %%zmm29, %%zmm7\n"), n);
  std::printf("{\"vpdpbusd_zmm_per_ns\":%.2f,\"fma_zmm_per_ns\":%.2f,\"six_dp_two_fma_per_ns\":%.2f,\"six_dp_cvt_add_per_ns\":%.2f}\n", dp, fma,
              dp_fma, dp_cvt);
}
#undef SPECULA_PIPE_LOOP
#undef SPECULA_SIX_DP
#undef SPECULA_FMA
#undef SPECULA_DP
#endif

}  // namespace
}  // namespace specula
