// CudaOps: device memory (weight arenas, KV pools, scratch), the op boundary's argument checks,
// and the dispatch to kernels.cu and cuBLAS.
#include "gpu/cuda/cuda_ops.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/device_verify.h"
#include "streams/cuda_stream.h"
#include "streams/launch_stream.h"
#include "gpu/cuda/kernels.h"
#include "gpu/host/quant.h"
#include "gpu/kv_cache.h"

namespace specula {

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("cuda op: " + what);
}

}  // namespace

struct CudaOps::Impl {
  cudaStream_t stream = nullptr;
  bool owns_stream = true;
  cublasHandle_t cublas = nullptr;
  std::string name;

  // The weight arena: bump allocation inside one cudaMalloc per reserve_weights (one per
  // model). Every Weight holds the arena it lives in (Weight::owner), so it is freed with the
  // last model that uses it.
  std::shared_ptr<char> arena;
  bool dedupe = false;  // only after reserve_weights: host pointers may be reused otherwise
  size_t arena_size = 0, arena_used = 0, weight_bytes = 0;
  // host tensor -> its device copy, within one reservation (a tied head shares the embedding's)
  // (with the arena it went into: a reservation that overflowed continues in another one)
  std::map<std::tuple<const std::byte*, size_t, std::string>, std::pair<void*, std::shared_ptr<char>>> uploaded;

  struct Slot {
    void* device = nullptr;
    size_t capacity = 0;
    std::vector<unsigned char> last;  // what upload_small put there last (empty: unknown)
    // Recorded steps: a pinned mirror of `capacity` bytes that a recording's copy node reads at
    // each replay, and what this step staged there (staged_bytes 0: nothing yet).
    unsigned char* pinned = nullptr;
    size_t staged_bytes = 0;
  };
  Slot slots[static_cast<int>(Scratch::Count)];

  // Recorded steps (CUDA graphs). Normal: ops queue work. Recording: the stream is captured;
  // ops queue work into the capture and their small arrays are copied from the pinned mirrors.
  // Replaying: ops only stage their arrays in the mirrors; replay_end launches the graph.
  enum class Mode { Normal, Recording, Replaying };
  Mode mode = Mode::Normal;
  bool step_failed = false;                // this step cannot be recorded / replayed
  cudaGraphExec_t replaying = nullptr;
  std::map<RecordingKey, cudaGraphExec_t> graphs;
  cudaEvent_t mirrors_free = nullptr;      // recorded after each graph launch: its copies are done
  size_t launches = 0;

  bool queue_work() const { return mode != Mode::Replaying; }
  void drop_graphs(const void* owner) {  // owner null: all
    for (auto it = graphs.begin(); it != graphs.end();) {
      if (owner && it->first.owner != owner) {
        ++it;
        continue;
      }
      cudaGraphExecDestroy(it->second);  // an in-flight launch completes first
      it = graphs.erase(it);
    }
  }
  // Before a recorded or replayed step (the caller enters the mode once this succeeded).
  void begin_step() {
    if (!mirrors_free) SPECULA_CUDA(cudaEventCreateWithFlags(&mirrors_free, cudaEventDisableTiming));
    SPECULA_CUDA(cudaEventSynchronize(mirrors_free));  // the last launch has read the mirrors
    for (Slot& s : slots) s.staged_bytes = 0;
    step_failed = false;
  }
  // After a launch: what the device slots will hold.
  void launched() {
    ++launches;
    for (Slot& s : slots)
      if (s.staged_bytes) s.last.assign(s.pinned, s.pinned + s.staged_bytes);
    SPECULA_CUDA(cudaEventRecord(mirrors_free, stream));
  }
  // Buffers released while the stream was being captured (by another thread: a drafter's cache
  // freed on an actor's thread): a synchronize then would break the capture, so they are
  // freed at the next release or at destruction.
  std::mutex deferred_mutex;
  std::vector<float*> deferred_frees;

  void new_arena(size_t bytes) {
    char* p = nullptr;
    SPECULA_CUDA(cudaMalloc(&p, bytes));
    // The last model using the arena may go with kernels of any stream still reading it.
    arena = std::shared_ptr<char>(p, [](char* q) {
      if (cuda::in_host_callback) {  // a wait there would never return
        std::fprintf(stderr, "specula: weights released from a stream's host callback: not freed\n");
        return;
      }
      cudaDeviceSynchronize();
      cudaFree(q);
    });
    arena_size = bytes;
    arena_used = 0;
  }

  void* arena_alloc(size_t bytes) {
    bytes = align_up(bytes);
    // No reservation (or it was too small): a chunk of its own, at least 64 MiB.
    if (!arena || arena_size - arena_used < bytes) new_arena(std::max(bytes, size_t{64} << 20));
    void* p = arena.get() + arena_used;
    arena_used += bytes;
    weight_bytes += bytes;
    return p;
  }
};

CudaOps::CudaOps(int device, void* stream) : impl_(std::make_unique<Impl>()), device_(device) {
  SPECULA_CUDA(cudaSetDevice(device));
  cudaDeviceProp prop{};
  SPECULA_CUDA(cudaGetDeviceProperties(&prop, device));
  impl_->name = "cuda:" + std::to_string(device) + " (" + prop.name + ", sm_" + std::to_string(prop.major) +
                std::to_string(prop.minor) + ")";
  impl_->owns_stream = stream == nullptr;
  if (stream)
    impl_->stream = static_cast<cudaStream_t>(stream);
  else
    SPECULA_CUDA(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  SPECULA_CUDA(cublasCreate(&impl_->cublas));
  SPECULA_CUDA(cublasSetStream(impl_->cublas, impl_->stream));
}

CudaOps::~CudaOps() {
  if (cuda::in_host_callback) {  // a wait there would never return: leak instead
    std::fprintf(stderr, "specula: cuda device destroyed from a stream's host callback: not freed\n");
    return;
  }
  cudaSetDevice(device_);
  cudaStreamSynchronize(impl_->stream);
  for (float* p : impl_->deferred_frees) cudaFree(p);
  impl_->drop_graphs(nullptr);
  if (impl_->mirrors_free) cudaEventDestroy(impl_->mirrors_free);
  for (auto& s : impl_->slots) {
    cudaFree(s.device);
    cudaFreeHost(s.pinned);
  }
  if (impl_->cublas) cublasDestroy(impl_->cublas);
  if (impl_->stream && impl_->owns_stream) cudaStreamDestroy(impl_->stream);
}

std::string CudaOps::name() const { return impl_->name; }
void* CudaOps::stream() const { return impl_->stream; }

std::unique_ptr<streams::Stream> CudaOps::make_stream(const std::string& name) {
  return std::make_unique<streams::LaunchStream>(name, std::make_unique<streams::CudaStream>(device_, impl_->stream, name));
}

DeviceVerdict CudaOps::judge(const float* target_logits, const float* q, std::span<const int32_t> draft, int64_t vocab,
                             const DeviceSampling& sp, int64_t position) {
  return verify_on_device(*this, target_logits, q, draft, vocab, sp, position);
}

size_t CudaOps::weight_bytes() const { return impl_->weight_bytes; }

// --- memory ---------------------------------------------------------------------------------

float* CudaOps::alloc(size_t n) {
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
  SPECULA_CUDA(cudaMalloc(&p, bytes));
  SPECULA_CUDA(cudaMemsetAsync(p, 0, bytes, impl_->stream));
  return static_cast<float*>(p);
}

void CudaOps::release(float* p) {
  // Called from destructors (DeviceBuffer): reports instead of throwing.
  if (!p) return;
  if (cuda::in_host_callback) {
    std::fprintf(stderr, "specula: cuda release from a stream's host callback: not freed (it would deadlock)\n");
    return;
  }
  std::vector<float*> free_now{p};
  {
    std::lock_guard lock(impl_->deferred_mutex);
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(impl_->stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone) {
      impl_->deferred_frees.push_back(p);
      return;
    }
    free_now.insert(free_now.end(), impl_->deferred_frees.begin(), impl_->deferred_frees.end());
    impl_->deferred_frees.clear();
  }
  cudaError_t e = cudaStreamSynchronize(impl_->stream);  // queued work may still use them
  for (float* q : free_now)
    if (e == cudaSuccess) e = cudaFree(q);
  if (e != cudaSuccess) std::fprintf(stderr, "specula: cuda release: %s\n", cudaGetErrorString(e));
}

void CudaOps::copy_to_host(const float* src, float* dst, size_t n) {
  SPECULA_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, impl_->stream));
  SPECULA_CUDA(cudaStreamSynchronize(impl_->stream));
}

void CudaOps::copy_to_device(const float* src, float* dst, size_t n) {
  // From pageable memory the copy is staged before the call returns, so `src` may change after.
  SPECULA_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, impl_->stream));
}

void CudaOps::reserve_weights(int64_t elements) {
  // BF16 matrices, F32 vectors: 2 bytes per value plus alignment slack per tensor.
  impl_->new_arena(align_up(static_cast<size_t>(elements) * 2 + (size_t{4} << 20)));
  impl_->uploaded.clear();
  impl_->dedupe = true;
}

// Copies go on the device's stream (ordered before every kernel that reads the weights; a plain
// cudaMemcpy rides the legacy stream, which a non-blocking stream does not wait for). From
// pageable memory each copy is staged before the call returns, so the slab buffer is reusable.
Weight CudaOps::upload(const TensorView& t) {
  Weight w;
  w.view = t;
  if (t.empty()) return w;
  const auto key = std::make_tuple(t.data, t.nbytes, t.name);
  if (auto it = impl_->uploaded.find(key); impl_->dedupe && it != impl_->uploaded.end()) {
    w.device = it->second.first;
    w.owner = it->second.second;
    return w;
  }
  const int64_t rows = t.rows(), cols = t.cols();
  if (t.shape.size() < 2) {
    // Vectors (norm weights) stay F32.
    require(t.dtype == DType::F32, "vector " + t.name + " must be F32, is " + dtype_name(t.dtype));
    w.device = impl_->arena_alloc(t.nbytes);
    SPECULA_CUDA(cudaMemcpyAsync(w.device, t.data, t.nbytes, cudaMemcpyHostToDevice, impl_->stream));
  } else {
    const size_t bytes = static_cast<size_t>(rows * cols) * 2;
    w.device = impl_->arena_alloc(bytes);
    if (t.dtype == DType::BF16) {
      SPECULA_CUDA(cudaMemcpyAsync(w.device, t.data, bytes, cudaMemcpyHostToDevice, impl_->stream));
    } else {
      // Dequantize on the host a slab of rows at a time, round to BF16, copy.
      const int64_t slab = std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(1, cols));
      std::vector<float> f(static_cast<size_t>(cols));
      std::vector<uint16_t> b(static_cast<size_t>(std::min(slab, rows) * cols));
      for (int64_t r0 = 0; r0 < rows; r0 += slab) {
        const int64_t nr = std::min(slab, rows - r0);
        for (int64_t r = 0; r < nr; ++r) {
          dequantize_row(t.dtype, t.row(r0 + r), f.data(), cols);
          for (int64_t c = 0; c < cols; ++c) b[static_cast<size_t>(r * cols + c)] = f32_to_bf16(f[c]);
        }
        SPECULA_CUDA(cudaMemcpyAsync(static_cast<uint16_t*>(w.device) + r0 * cols, b.data(),
                                     static_cast<size_t>(nr * cols) * 2, cudaMemcpyHostToDevice, impl_->stream));
      }
    }
  }
  w.owner = impl_->arena;
  if (impl_->dedupe) impl_->uploaded[key] = {w.device, impl_->arena};
  return w;
}

void* CudaOps::scratch(Scratch slot, size_t bytes) {
  Impl::Slot& s = impl_->slots[static_cast<int>(slot)];
  if (bytes > s.capacity) {
    if (impl_->mode != Impl::Mode::Normal) {
      // No allocation inside a recorded step: the step runs as usual instead (and grows this).
      impl_->step_failed = true;
      return s.device;
    }
    // Recorded steps upload through every slot but these two (and hold the slots' addresses).
    const bool recorded = slot != Scratch::Bf16Activations && slot != Scratch::Verify;
    SPECULA_CUDA(cudaStreamSynchronize(impl_->stream));  // queued work may still read the old one
    if (recorded) impl_->drop_graphs(nullptr);
    s.last.clear();
    s.capacity = 0;
    SPECULA_CUDA(cudaFree(s.device));
    SPECULA_CUDA(cudaFreeHost(s.pinned));
    s.device = nullptr;
    s.pinned = nullptr;
    const size_t capacity = align_up(std::max(bytes, size_t{4096}) * 2);  // room to grow
    SPECULA_CUDA(cudaMalloc(&s.device, capacity));
    if (recorded) SPECULA_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&s.pinned), capacity, 0));
    s.capacity = capacity;
  }
  return s.device;
}

const void* CudaOps::upload_small(Scratch slot, const void* data, size_t bytes) {
  void* dev = scratch(slot, bytes);
  Impl::Slot& s = impl_->slots[static_cast<int>(slot)];
  if (impl_->mode != Impl::Mode::Normal) {
    if (impl_->step_failed || bytes == 0 || !s.pinned) {
      impl_->step_failed = true;
      return dev;
    }
    if (s.staged_bytes) {
      // A second upload to this slot in one step must repeat the first (the block tables for
      // each layer); a recording holds one copy per slot.
      if (s.staged_bytes != bytes || std::memcmp(s.pinned, data, bytes) != 0) impl_->step_failed = true;
      return dev;
    }
    std::memcpy(s.pinned, data, bytes);
    s.staged_bytes = bytes;
    // Recording: the copy node reads the whole mirror at each replay (the arrays may grow, e.g.
    // a block table, up to the slot's capacity without a new recording).
    if (impl_->mode == Impl::Mode::Recording)
      SPECULA_CUDA(cudaMemcpyAsync(dev, s.pinned, s.capacity, cudaMemcpyHostToDevice, impl_->stream));
    return dev;
  }
  if (s.last.size() == bytes && bytes > 0 && std::memcmp(s.last.data(), data, bytes) == 0) return dev;
  // Pageable source: staged before the call returns; ordered after earlier readers on the stream.
  SPECULA_CUDA(cudaMemcpyAsync(dev, data, bytes, cudaMemcpyHostToDevice, impl_->stream));
  s.last.assign(static_cast<const unsigned char*>(data), static_cast<const unsigned char*>(data) + bytes);
  return dev;
}

void CudaOps::synchronize() { SPECULA_CUDA(cudaStreamSynchronize(impl_->stream)); }

// --- recorded steps -------------------------------------------------------------------------

void CudaOps::record_begin() {
  require(impl_->mode == Impl::Mode::Normal, "record_begin inside a recorded step");
  impl_->begin_step();
  SPECULA_CUDA(cudaStreamBeginCapture(impl_->stream, cudaStreamCaptureModeThreadLocal));
  impl_->mode = Impl::Mode::Recording;
}

bool CudaOps::record_end(const RecordingKey& key) {
  require(impl_->mode == Impl::Mode::Recording, "record_end without record_begin");
  impl_->mode = Impl::Mode::Normal;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(impl_->stream, &graph);
  if (ended != cudaSuccess || !graph || impl_->step_failed) {
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // a capture invalidated by an unsupported call leaves its error behind
    return false;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (made != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  if (impl_->graphs.size() >= 64) impl_->drop_graphs(nullptr);
  if (auto it = impl_->graphs.find(key); it != impl_->graphs.end()) {
    cudaGraphExecDestroy(it->second);
    impl_->graphs.erase(it);
  }
  impl_->graphs.emplace(key, exec);
  SPECULA_CUDA(cudaGraphLaunch(exec, impl_->stream));
  impl_->launched();
  return true;
}

bool CudaOps::replay_begin(const RecordingKey& key) {
  require(impl_->mode == Impl::Mode::Normal, "replay_begin inside a recorded step");
  auto it = impl_->graphs.find(key);
  if (it == impl_->graphs.end()) return false;
  impl_->begin_step();
  impl_->mode = Impl::Mode::Replaying;
  impl_->replaying = it->second;
  return true;
}

bool CudaOps::replay_end() {
  require(impl_->mode == Impl::Mode::Replaying, "replay_end without replay_begin");
  impl_->mode = Impl::Mode::Normal;
  if (impl_->step_failed) return false;
  SPECULA_CUDA(cudaGraphLaunch(impl_->replaying, impl_->stream));
  impl_->launched();
  return true;
}

void CudaOps::recording_cancel() {
  if (impl_->mode == Impl::Mode::Recording) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(impl_->stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  impl_->mode = Impl::Mode::Normal;
}

void CudaOps::forget_recordings(const void* owner) { impl_->drop_graphs(owner); }
size_t CudaOps::graph_launches() const { return impl_->launches; }

double CudaOps::measure_copy_bandwidth_gbs(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  SPECULA_CUDA(cudaMalloc(&a, bytes));
  SPECULA_CUDA(cudaMalloc(&b, bytes));
  SPECULA_CUDA(cudaMemsetAsync(a, 1, bytes, impl_->stream));
  cudaEvent_t e0, e1;
  SPECULA_CUDA(cudaEventCreate(&e0));
  SPECULA_CUDA(cudaEventCreate(&e1));
  std::vector<double> gbs;
  for (int i = 0; i < 12; ++i) {
    SPECULA_CUDA(cudaEventRecord(e0, impl_->stream));
    SPECULA_CUDA(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, impl_->stream));
    SPECULA_CUDA(cudaEventRecord(e1, impl_->stream));
    SPECULA_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    SPECULA_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 2) gbs.push_back(2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9);  // read + write
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  std::sort(gbs.begin(), gbs.end());
  return gbs[gbs.size() / 2];
}

// --- compute --------------------------------------------------------------------------------

void CudaOps::embed(const Weight& table, std::span<const int32_t> tokens, float* out) {
  const int64_t dim = table.cols(), vocab = table.rows();
  require(table.view.shape.size() == 2 && table.device, "embed: the table must be an uploaded matrix");
  for (int32_t t : tokens)
    if (t < 0 || t >= vocab)
      throw std::out_of_range("token id " + std::to_string(t) + " outside the vocabulary of " + std::to_string(vocab));
  if (tokens.empty()) return;
  auto* dev = static_cast<const int32_t*>(upload_small(Scratch::Tokens, tokens.data(), tokens.size_bytes()));
  if (!impl_->queue_work()) return;
  cuda::embed(static_cast<const __nv_bfloat16*>(table.device), dev, static_cast<int64_t>(tokens.size()), dim, out,
              impl_->stream);
}

void CudaOps::rmsnorm(const float* x, const Weight& w, float eps, int64_t n, int64_t dim, float* out) {
  require(w.view.numel() == dim && w.device, "rmsnorm: weight has " + std::to_string(w.view.numel()) +
                                                 " values for dim " + std::to_string(dim));
  if (n <= 0 || !impl_->queue_work()) return;
  cuda::rmsnorm(x, static_cast<const float*>(w.device), eps, n, dim, out, impl_->stream);
}

void CudaOps::matmul(const float* x, const Weight& w, int64_t n, float* y) {
  require(w.view.shape.size() == 2 && w.device, "matmul: " + w.view.name + " is not an uploaded matrix");
  if (n <= 0 || !impl_->queue_work()) return;
  const int64_t rows = w.rows(), cols = w.cols();
  const auto* wb = static_cast<const __nv_bfloat16*>(w.device);
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (n <= kSkinnyMaxRows && cols % 8 == 0 && aligned) {
    cuda::matmul_skinny(wb, rows, cols, x, n, y, impl_->stream, skinny_rows_per_warp_);
    return;
  }
  // Wide batches (prefill): activations to BF16, then cuBLAS with F32 accumulation and F32 out.
  // Column-major view: Y^T[rows, n] = W[cols, rows]^T * X^T[cols, n].
  auto* xb = static_cast<__nv_bfloat16*>(scratch(Scratch::Bf16Activations, static_cast<size_t>(n * cols) * 2));
  cuda::to_bf16(x, n * cols, xb, impl_->stream);
  const float alpha = 1.0f, beta = 0.0f;
  SPECULA_CUDA(cublasGemmEx(impl_->cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), static_cast<int>(n),
                            static_cast<int>(cols), &alpha, wb, CUDA_R_16BF, static_cast<int>(cols), xb, CUDA_R_16BF,
                            static_cast<int>(cols), &beta, y, CUDA_R_32F, static_cast<int>(rows),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaOps::rope(float* x, int64_t n, int64_t heads, int64_t head_dim, std::span<const int32_t> positions,
                   std::span<const float> inv_freq, RopeStyle style) {
  require(static_cast<int64_t>(positions.size()) >= n, "rope: " + std::to_string(positions.size()) +
                                                           " positions for " + std::to_string(n) + " rows");
  require(static_cast<int64_t>(inv_freq.size()) >= head_dim / 2 && head_dim % 2 == 0,
          "rope: " + std::to_string(inv_freq.size()) + " frequencies for head_dim " + std::to_string(head_dim));
  if (n <= 0) return;
  auto* pos = static_cast<const int32_t*>(upload_small(Scratch::Positions, positions.data(), n * sizeof(int32_t)));
  auto* inv = static_cast<const float*>(upload_small(Scratch::InvFreq, inv_freq.data(), (head_dim / 2) * sizeof(float)));
  if (!impl_->queue_work()) return;
  cuda::rope(x, n, heads, head_dim, pos, inv, style == RopeStyle::Interleaved, impl_->stream);
}

void CudaOps::swiglu(const float* gate, const float* up, int64_t n, float* out) {
  if (n > 0 && impl_->queue_work()) cuda::swiglu(gate, up, n, out, impl_->stream);
}

void CudaOps::add(float* x, const float* y, int64_t n) {
  if (n > 0 && impl_->queue_work()) cuda::add(x, y, n, impl_->stream);
}

namespace {

// The plan of one forward: a RowPlan per row, then the block tables of its sequences.
// Bytes: [rows * sizeof(RowPlan)][int32 block ids].
std::vector<unsigned char> make_plan(const KvCache& kv, std::span<const SeqSlice> slices, int64_t* rows_out) {
  std::vector<cuda::RowPlan> rows;
  std::vector<int32_t> tables;
  for (const SeqSlice& s : slices) {
    const std::vector<int32_t>& t = kv.block_table(s.seq);
    require(static_cast<int64_t>(t.size()) * kv.config().block_tokens >= s.start + s.n,
            "sequence " + std::to_string(s.seq) + " has no KV reserved for positions up to " +
                std::to_string(s.start + s.n));
    require(s.row == static_cast<int64_t>(rows.size()), "slices must cover consecutive rows from 0");
    const int32_t begin = static_cast<int32_t>(tables.size());
    tables.insert(tables.end(), t.begin(), t.end());
    for (int64_t i = 0; i < s.n; ++i)
      rows.push_back({kv.offset(s.seq, s.start + i), begin, static_cast<int32_t>(s.start + i + 1)});
  }
  std::vector<unsigned char> bytes(rows.size() * sizeof(cuda::RowPlan) + tables.size() * sizeof(int32_t));
  std::memcpy(bytes.data(), rows.data(), rows.size() * sizeof(cuda::RowPlan));
  std::memcpy(bytes.data() + rows.size() * sizeof(cuda::RowPlan), tables.data(), tables.size() * sizeof(int32_t));
  *rows_out = static_cast<int64_t>(rows.size());
  return bytes;
}

}  // namespace

void CudaOps::kv_store(KvCache& kv, int layer, const float* k, const float* v, std::span<const SeqSlice> slices) {
  int64_t rows = 0;
  const std::vector<unsigned char> plan = make_plan(kv, slices, &rows);
  if (rows == 0) return;
  auto* dev = static_cast<const cuda::RowPlan*>(upload_small(Scratch::Plan, plan.data(), plan.size()));
  if (!impl_->queue_work()) return;
  cuda::kv_store(kv.k_pool(layer), kv.v_pool(layer), k, v, dev, rows, kv.row_floats(), impl_->stream);
}

void CudaOps::attention(const float* q, KvCache& kv, int layer, std::span<const SeqSlice> slices, int64_t heads,
                        float* out) {
  const KvCacheConfig& c = kv.config();
  require(heads % c.kv_heads == 0 && heads / c.kv_heads <= 8,
          "attention: " + std::to_string(heads) + " heads over " + std::to_string(c.kv_heads) +
              " kv heads (the kernel takes groups of at most 8)");
  require(c.head_dim <= 256, "attention: head_dim " + std::to_string(c.head_dim) + " > 256");
  int64_t rows = 0;
  const std::vector<unsigned char> plan = make_plan(kv, slices, &rows);
  if (rows == 0) return;
  auto* dev = static_cast<const unsigned char*>(upload_small(Scratch::Plan, plan.data(), plan.size()));
  const auto* rp = reinterpret_cast<const cuda::RowPlan*>(dev);
  const auto* tables = reinterpret_cast<const int32_t*>(dev + rows * sizeof(cuda::RowPlan));
  if (!impl_->queue_work()) return;
  cuda::attention(q, kv.k_pool(layer), kv.v_pool(layer), rp, tables, rows, heads, c.kv_heads, c.head_dim,
                  c.block_tokens, out, impl_->stream);
}

void CudaOps::gather_rows(const float* src, int64_t cols, std::span<const int64_t> rows, float* dst) {
  if (rows.empty()) return;
  auto* dev = static_cast<const int64_t*>(upload_small(Scratch::Rows, rows.data(), rows.size_bytes()));
  if (!impl_->queue_work()) return;
  cuda::gather_rows(src, cols, dev, static_cast<int64_t>(rows.size()), dst, impl_->stream);
}

}  // namespace specula
