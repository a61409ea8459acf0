// Every CUDA op against the host device (the reference) on fresh random inputs. Tolerances are
// abs + rel per element unless stated, each justified where it is used. Each test skips, with
// the reason, where no CUDA GPU is (or the CUDA parts were not built).
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test.h"

#ifdef SPECULA_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <numeric>

#include <stdexcept>
#include <thread>

#include "gpu/cuda/cuda_ops.h"
#include "gpu/host/host_device.h"
#include "gpu/kv_cache.h"
#include "model/config.h"

namespace specula::test {
namespace {

constexpr double kF32Eps = 1.0 / (1 << 24);  // unit roundoff of float32
constexpr double kBf16U = 1.0 / (1 << 8);     // unit roundoff of bfloat16 (8 significant bits)

class CudaOpsTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    seed_ = fresh_seed();
    rng_.seed(seed_);
    cuda_ = std::make_unique<CudaOps>(0);
  }
  std::string trace() const { return "random seed " + std::to_string(seed_); }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  HostOps host_{1};
  std::unique_ptr<CudaOps> cuda_;
};

TEST_F(CudaOpsTest, EmbeddingOfABf16ExactTableIsExact) {
  SCOPED_TRACE(trace());
  const int64_t vocab = 300, dim = 72;
  std::vector<float> table = uniform(rng_, vocab * dim);
  round_to_bf16(table);  // the device stores BF16: exact for these values
  const TensorView view = f32_view(table, {vocab, dim}, "embed");
  const Weight hw = host_.upload(view), dw = cuda_->upload(view);
  const std::vector<int32_t> tokens = {0, 299, 17, 17, 150};
  std::vector<float> want(tokens.size() * dim);
  host_.embed(hw, tokens, want.data());
  DeviceBuffer out(*cuda_, want.size());
  cuda_->embed(dw, tokens, out.get());
  EXPECT_TRUE(all_close(to_host(*cuda_, out.get(), want.size()), want, 0, 0));
  const std::vector<int32_t> bad = {3, 300};
  EXPECT_THROW(cuda_->embed(dw, bad, out.get()), std::out_of_range);
}

TEST_F(CudaOpsTest, EmbeddingOfAnF32TableIsWithinBf16Rounding) {
  SCOPED_TRACE(trace());
  const int64_t vocab = 64, dim = 40;
  const std::vector<float> table = uniform(rng_, vocab * dim, -3, 3);
  const TensorView view = f32_view(table, {vocab, dim}, "embed");
  const Weight hw = host_.upload(view), dw = cuda_->upload(view);
  std::vector<int32_t> tokens(vocab);
  std::iota(tokens.begin(), tokens.end(), 0);
  std::vector<float> want(table.size());
  host_.embed(hw, tokens, want.data());
  DeviceBuffer out(*cuda_, want.size());
  cuda_->embed(dw, tokens, out.get());
  // Round to nearest BF16: |err| <= 2^-8 |x| (8 significant bits).
  EXPECT_TRUE(all_close(to_host(*cuda_, out.get(), want.size()), want, 0, kBf16U));
}

TEST_F(CudaOpsTest, RmsNormMatchesTheHost) {
  SCOPED_TRACE(trace());
  for (int64_t dim : {16, 576, 3072}) {
    const int64_t n = 7;
    const std::vector<float> x = uniform(rng_, n * dim, -4, 4), g = uniform(rng_, dim, 0.5f, 1.5f);
    const TensorView gv = f32_view(g, {dim}, "norm");
    std::vector<float> want(x.size());
    host_.rmsnorm(x.data(), host_.upload(gv), 1e-5f, n, dim, want.data());
    DeviceBuffer dx = to_device(*cuda_, x), out(*cuda_, x.size());
    cuda_->rmsnorm(dx.get(), cuda_->upload(gv), 1e-5f, n, dim, out.get());
    // Both sum squares in double; the scale is one float rounding, the product two: 4 ulp.
    EXPECT_TRUE(all_close(to_host(*cuda_, out.get(), x.size()), want, 1e-30, 4 * kF32Eps * 2)) << "dim " << dim;
  }
}

TEST_F(CudaOpsTest, RopeMatchesTheHostInBothStylesWithLlama3Frequencies) {
  SCOPED_TRACE(trace());
  LlamaConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 32;
  c.rope_scaling.original_max_position = 8192;
  const std::vector<float> inv = rope_inv_freq(c);
  const int64_t n = 5, heads = 3, hd = c.head_dim;
  const std::vector<int32_t> positions = {0, 1, 17, 4095, 8191};
  for (RopeStyle style : {RopeStyle::HalfSplit, RopeStyle::Interleaved}) {
    std::vector<float> want = uniform(rng_, n * heads * hd, -2, 2);
    DeviceBuffer dx = to_device(*cuda_, want);
    host_.rope(want.data(), n, heads, hd, positions, inv, style);
    cuda_->rope(dx.get(), n, heads, hd, positions, inv, style);
    // The angle is the same float product on both; CUDA's sinf/cosf are within 2 ulp of the
    // true value (CUDA Programming Guide, single-precision functions) and glibc's within 1:
    // |x| <= 2 times 3 ulp of 1 is 4e-7 per term, 8e-7 for two; the products, the difference
    // (which nvcc may fuse into an FMA) and their roundings add up to 1.5 ulp of 4 (7e-7):
    // ~1.5e-6 at worst, so 4e-6 absolute.
    EXPECT_TRUE(all_close(to_host(*cuda_, dx.get(), want.size()), want, 4e-6, 0))
        << (style == RopeStyle::HalfSplit ? "half-split" : "interleaved");
  }
}

TEST_F(CudaOpsTest, SwigluAndAddMatchTheHost) {
  SCOPED_TRACE(trace());
  const int64_t n = 10000;
  const std::vector<float> g = uniform(rng_, n, -8, 8), u = uniform(rng_, n, -2, 2);
  std::vector<float> want(n);
  host_.swiglu(g.data(), u.data(), n, want.data());
  DeviceBuffer dg = to_device(*cuda_, g), du = to_device(*cuda_, u), out(*cuda_, n);
  cuda_->swiglu(dg.get(), du.get(), n, out.get());
  // expf within 2 ulp (CUDA) vs within 1 (glibc), then a division and a product: 6 ulp.
  EXPECT_TRUE(all_close(to_host(*cuda_, out.get(), n), want, 1e-30, 6 * kF32Eps * 2));

  std::vector<float> x = g;
  host_.add(x.data(), u.data(), n);
  cuda_->add(dg.get(), du.get(), n);
  EXPECT_TRUE(all_close(to_host(*cuda_, dg.get(), n), x, 0, 0));  // one correctly rounded add
}

TEST_F(CudaOpsTest, GatherRowsCopiesTheRowsAskedFor) {
  SCOPED_TRACE(trace());
  const int64_t rows = 9, cols = 33;
  const std::vector<float> src = uniform(rng_, rows * cols);
  const std::vector<int64_t> pick = {8, 0, 3, 3};
  std::vector<float> want(pick.size() * cols);
  host_.gather_rows(src.data(), cols, pick, want.data());
  DeviceBuffer ds = to_device(*cuda_, src), out(*cuda_, want.size());
  cuda_->gather_rows(ds.get(), cols, pick, out.get());
  EXPECT_TRUE(all_close(to_host(*cuda_, out.get(), want.size()), want, 0, 0));
}

// y = x W^T on both devices. `bound_scale` * sum_j |x_j w_ij| per output is the tolerance.
void check_matmul(Ops& host, CudaOps& cuda, const std::vector<float>& x, const TensorView& w,
                  const std::vector<float>& w_f32, int64_t n, double bound_scale, const std::string& what) {
  const int64_t rows = w.rows(), cols = w.cols();
  std::vector<float> want(n * rows);
  host.matmul(x.data(), host.upload(w), n, want.data());
  DeviceBuffer dx = to_device(cuda, x), dy(cuda, want.size());
  cuda.matmul(dx.get(), cuda.upload(w), n, dy.get());
  std::vector<double> bound(want.size());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < rows; ++i) {
      double s = 0;
      for (int64_t j = 0; j < cols; ++j) s += std::fabs(x[r * cols + j] * w_f32[i * cols + j]);
      bound[r * rows + i] = bound_scale * s + 1e-30;
    }
  EXPECT_TRUE(all_close(to_host(cuda, dy.get(), want.size()), want, 0, 0, &bound)) << what << ", n = " << n;
}

TEST_F(CudaOpsTest, SkinnyMatmulMatchesTheHostOnBf16WeightsInBothVersions) {
  SCOPED_TRACE(trace());
  const int64_t rows = 203, cols = 1024;  // 203: v2's last warp has rows to spare
  std::vector<float> w = uniform(rng_, rows * cols);
  round_to_bf16(w);  // the device's BF16 copy is then exact; only accumulation order differs
  const TensorView view = f32_view(w, {rows, cols}, "w");
  for (int rows_per_warp : {1, 4}) {
    cuda_->set_skinny_rows_per_warp(rows_per_warp);
    for (int64_t n : {1, 2, 3, 5, 8, 13, 16}) {
      const std::vector<float> x = uniform(rng_, n * cols, -2, 2);
      // Two float32 sums of `cols` products in different orders: each within cols * eps * sum|xw|
      // of the exact value (Higham, Accuracy and Stability, 3.1), so they differ by at most twice that.
      check_matmul(host_, *cuda_, x, view, w, n, 2 * cols * kF32Eps,
                   "skinny v" + std::to_string(rows_per_warp == 1 ? 1 : 2));
    }
  }
  cuda_->set_skinny_rows_per_warp(0);
}

TEST_F(CudaOpsTest, WideMatmulThroughCublasIsWithinBf16RoundingOfActivations) {
  SCOPED_TRACE(trace());
  const int64_t rows = 96, cols = 512;
  std::vector<float> w = uniform(rng_, rows * cols);
  round_to_bf16(w);
  const TensorView view = f32_view(w, {rows, cols}, "w");
  for (int64_t n : {17, 40}) {
    const std::vector<float> x = uniform(rng_, n * cols, -2, 2);
    // Activations are rounded to BF16 (|dx| <= 2^-8 |x|) before the GEMM, which accumulates in
    // F32: |err| <= (2^-8 + 2 cols eps32) sum|xw|.
    check_matmul(host_, *cuda_, x, view, w, n, kBf16U + 2 * cols * kF32Eps, "cuBLAS");
  }
}

TEST_F(CudaOpsTest, QuantizedWeightsAreDequantizedAtUpload) {
  SCOPED_TRACE(trace());
  // Q8_0: 32 values per 34-byte block, y = q * d with d an fp16.
  const int64_t rows = 48, cols = 256;
  std::vector<uint8_t> bytes;
  std::uniform_int_distribution<int> q(-127, 127);
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    const uint16_t d = f32_to_fp16(0.001f + 0.01f * static_cast<float>(b % 7));
    bytes.push_back(static_cast<uint8_t>(d & 0xff));
    bytes.push_back(static_cast<uint8_t>(d >> 8));
    for (int i = 0; i < 32; ++i) bytes.push_back(static_cast<uint8_t>(static_cast<int8_t>(q(rng_))));
  }
  TensorView view;
  view.name = "w_q8";
  view.dtype = DType::Q8_0;
  view.shape = {rows, cols};
  view.data = reinterpret_cast<const std::byte*>(bytes.data());
  view.nbytes = bytes.size();
  std::vector<float> w(rows * cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(DType::Q8_0, view.row(r), w.data() + r * cols, cols);
  const std::vector<float> x = uniform(rng_, 3 * cols);
  // The device rounds each dequantized weight to BF16 (|dw| <= 2^-8 |w|), then accumulates in F32.
  check_matmul(host_, *cuda_, x, view, w, 3, kBf16U + 2 * cols * kF32Eps, "Q8_0");
}

// Reserves positions in several rounds so block tables interleave across sequences (not
// contiguous), the same way on both caches.
struct TwoCaches {
  KvCache host, cuda;
  TwoCaches(Ops& h, Ops& c, const KvCacheConfig& cfg) : host(h, cfg), cuda(c, cfg) {}
  int create() {
    const int a = host.create_sequence(), b = cuda.create_sequence();
    EXPECT_EQ(a, b);
    return a;
  }
  void reserve(int seq, int64_t len) {
    host.reserve(seq, len);
    cuda.reserve(seq, len);
  }
};

TEST_F(CudaOpsTest, PagedAttentionMatchesTheHostForDecodeAndCausalChunks) {
  SCOPED_TRACE(trace());
  for (int64_t hd : {16, 64, 128}) {
    for (auto [heads, kvh] : {std::pair<int64_t, int64_t>{8, 2}, {3, 1}, {4, 4}}) {
      KvCacheConfig cfg;
      cfg.layers = 2;
      cfg.kv_heads = kvh;
      cfg.head_dim = hd;
      cfg.block_tokens = 16;
      cfg.num_blocks = 40;
      TwoCaches kv(host_, *cuda_, cfg);
      const int a = kv.create(), b = kv.create(), c = kv.create();
      // Cached history: a 37 positions, c 100, b none; reserved in turns so blocks interleave.
      const std::vector<std::pair<int, int64_t>> steps = {{a, 10}, {c, 30}, {a, 37}, {c, 100}};
      const int layer = 1;
      const int64_t rf = kvh * hd;
      for (auto [seq, len] : steps) {
        const int64_t start = kv.host.length(seq);
        kv.reserve(seq, len);
        const int64_t m = len - start;
        const std::vector<float> k = uniform(rng_, m * rf, -2, 2), v = uniform(rng_, m * rf, -2, 2);
        const SeqSlice s{seq, start, m, 0};
        host_.kv_store(kv.host, layer, k.data(), v.data(), {&s, 1});
        DeviceBuffer dk = to_device(*cuda_, k), dv = to_device(*cuda_, v);
        cuda_->kv_store(kv.cuda, layer, dk.get(), dv.get(), {&s, 1});
      }
      // One batch: a chunk of 5 after 37 (verification), b's prefill of 20, c's decode of 1.
      const std::vector<SeqSlice> slices = {{a, 37, 5, 0}, {b, 0, 20, 5}, {c, 100, 1, 25}};
      const int64_t rows = 26;
      for (const SeqSlice& s : slices) kv.reserve(s.seq, s.start + s.n);
      const std::vector<float> k = uniform(rng_, rows * rf, -2, 2), v = uniform(rng_, rows * rf, -2, 2);
      const std::vector<float> q = uniform(rng_, rows * heads * hd, -2, 2);
      std::vector<float> want(rows * heads * hd);
      host_.kv_store(kv.host, layer, k.data(), v.data(), slices);
      host_.attention(q.data(), kv.host, layer, slices, heads, want.data());
      DeviceBuffer dk = to_device(*cuda_, k), dv = to_device(*cuda_, v), dq = to_device(*cuda_, q);
      DeviceBuffer out(*cuda_, want.size());
      cuda_->kv_store(kv.cuda, layer, dk.get(), dv.get(), slices);
      cuda_->attention(dq.get(), kv.cuda, layer, slices, heads, out.get());
      const std::string what = "head_dim " + std::to_string(hd) + ", heads " + std::to_string(heads) + "/" +
                               std::to_string(kvh);
      // kv_store copies: the device pool equals the host pool bit for bit.
      const size_t pool = static_cast<size_t>(cfg.num_blocks * cfg.block_tokens * rf);
      std::vector<float> host_k(kv.host.k_pool(layer), kv.host.k_pool(layer) + pool);
      EXPECT_TRUE(all_close(to_host(*cuda_, kv.cuda.k_pool(layer), pool), host_k, 0, 0)) << what << " (K pool)";
      // Each output is a convex combination of |v| <= 2. A score q.k/sqrt(d) (|q|, |k| <= 2,
      // d <= 128) carries an F32 summation error up to d eps32 sum|q k| / sqrt(d) ~ 1e-5 on
      // either device, which moves its weight by that relative amount; the online softmax's
      // rescaling adds ~3 ulp per position a warp takes (<= 27 here). Worst case ~4e-5, typical
      // ~1e-6: 5e-5 absolute.
      EXPECT_TRUE(all_close(to_host(*cuda_, out.get(), want.size()), want, 5e-5, 0)) << what;
    }
  }
}

TEST_F(CudaOpsTest, AttentionRefusesGroupsWiderThanTheKernel) {
  KvCacheConfig cfg{1, 1, 16, 16, 4};
  KvCache kv(*cuda_, cfg);
  const int s = kv.create_sequence();
  kv.reserve(s, 1);
  const SeqSlice slice{s, 0, 1, 0};
  DeviceBuffer q(*cuda_, 9 * 16), out(*cuda_, 9 * 16);
  EXPECT_THROW(cuda_->attention(q.get(), kv, 0, {&slice, 1}, 9, out.get()), std::invalid_argument);
}

TEST_F(CudaOpsTest, QueuesOnAStreamItIsGiven) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  {
    CudaOps ops(0, stream);
    EXPECT_EQ(ops.stream(), static_cast<void*>(stream));
    const std::vector<float> x = {1, 2, 3}, y = {10, 20, 30};
    DeviceBuffer dx = to_device(ops, x), dy = to_device(ops, y);
    ops.add(dx.get(), dy.get(), 3);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(to_host(ops, dx.get(), 3), (std::vector<float>{11, 22, 33}));
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess) << "the device must leave a stream it was given alive";
}

TEST_F(CudaOpsTest, ItsStreamsEventsCompleteOnlyAfterTheKernelsTheLaunchedWorkQueued) {
  // What the draft and verifier actors get from this device (Ops::make_stream): host work on a
  // launch thread, kernels on the device's CUDA stream, an event that waits for those kernels.
  std::unique_ptr<streams::Stream> stream = cuda_->make_stream("verify");
  const size_t n = size_t{1} << 24;
  std::vector<float> ones(n, 1.0f);
  DeviceBuffer a = to_device(*cuda_, ones), b = to_device(*cuda_, ones);
  std::thread::id launched_on;
  stream->enqueue([&] {
    launched_on = std::this_thread::get_id();
    for (int i = 0; i < 50; ++i) cuda_->add(a.get(), b.get(), n);  // queued, not waited for
  });
  streams::Event done = stream->record();
  done.wait();
  EXPECT_NE(launched_on, std::this_thread::get_id());
  EXPECT_EQ(cudaStreamQuery(static_cast<cudaStream_t>(cuda_->stream())), cudaSuccess) << "the event completed before the kernels";
  EXPECT_EQ(to_host(*cuda_, a.get(), 1)[0], 51.0f);
  // And a failure in the launched work reaches the event.
  stream->enqueue([] { throw std::runtime_error("launch failed"); });
  EXPECT_THROW(stream->record().wait(), std::runtime_error);
}

TEST_F(CudaOpsTest, CopyBandwidthIsMeasurable) {
  const double gbs = cuda_->measure_copy_bandwidth_gbs(size_t{64} << 20);
  EXPECT_GT(gbs, 10.0) << "a GPU copies faster than 10 GB/s";
  std::printf("[ measure  ] device-to-device copy %.0f GB/s (read + write)\n", gbs);
}

}  // namespace
}  // namespace specula::test

#else  // built without CUDA

TEST(CudaOps, NeedsTheCudaBuild) {
  GTEST_SKIP() << "no CUDA GPU: " << specula::test::no_gpu_reason();
}

#endif
