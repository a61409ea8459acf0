// The interface the Llama forward pass is written against. Each device (gpu/host, gpu/cuda)
// implements it; `gpu/llama.cpp` never names a device.
//
// Activations are float32 in the device's memory (float* below are device pointers); weights
// are uploaded once as `Weight` handles in whatever form the device computes with (the host
// device keeps the stored, possibly quantized, bytes and dequantizes in registers).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/device_judge.h"
#include "model/config.h"
#include "model/tensor.h"
#include "streams/stream.h"

namespace specula {

class KvCache;

enum class DeviceKind { Host, Cuda };

struct Weight {
  TensorView view;                    // the stored tensor (shape, dtype, host bytes)
  void* device = nullptr;             // device copy, when the device is not the host
  std::shared_ptr<void> owner;        // keeps `device` alive
  int64_t rows() const { return view.rows(); }
  int64_t cols() const { return view.cols(); }
};

// One sequence's slice of a batched forward: `n` new tokens appended at position `start`.
struct SeqSlice {
  int seq = -1;       // KV cache sequence id
  int64_t start = 0;  // position of the first new token (= the sequence's cached length)
  int64_t n = 0;      // new tokens; their rows are consecutive in the batch
  int64_t row = 0;    // first row of this slice in the batch's activations
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // e.g. "host (avx2, 2 threads)"

  // --- memory ---------------------------------------------------------------
  virtual float* alloc(size_t n_floats) = 0;  // zero-initialised
  virtual void release(float* p) = 0;
  virtual void copy_to_host(const float* src, float* dst, size_t n) = 0;
  virtual void copy_to_device(const float* src, float* dst, size_t n) = 0;
  virtual Weight upload(const TensorView& t) = 0;
  // A table read by row (the token embedding), never multiplied: a device that repacks matmul
  // weights (the host's int8 path) keeps it as stored.
  virtual Weight upload_table(const TensorView& t) { return upload(t); }
  // The caller reads w only through the device (no stored row of it again): a device that keeps a
  // copy of its own may let the stored bytes go (the host drops a packed matrix's pages of the
  // mapped file, so the process does not hold the weights twice). No-op by default.
  virtual void release_stored(const Weight& w) {}
  // A hint before a model's uploads: they hold about `elements` values in all, so a device can
  // take one allocation for them (the CUDA device's weight arena). No-op on the host.
  virtual void reserve_weights(int64_t elements) {}
  // Bytes of w a matrix product reads: the device's own copy where it keeps one in another layout
  // (the host's repacked matrices), else the stored tensor's.
  virtual size_t read_bytes(const Weight& w) const { return w.view.nbytes; }
  // Whether this device keeps K/V in fp16 (KvCacheConfig::f16); its kv_store and attention
  // handle the caches it asks for.
  virtual bool kv_f16() const { return false; }
  // Whether this device wants K transposed in its caches of this head size and block length
  // (KvCacheConfig::k_transposed; only asked when kv_f16()).
  virtual bool kv_k_transposed(int64_t head_dim, int64_t block_tokens) const { return false; }
  // Whether this device wants its transposed-K caches of this shape in bf16 pairs
  // (KvCacheConfig::bf16; only asked when kv_k_transposed()).
  virtual bool kv_bf16(int64_t head_dim, int64_t block_tokens) const { return false; }
  // Whether this device wants its caches head-major (KvCacheConfig::head_major).
  virtual bool kv_head_major() const { return false; }

  // --- compute; shapes in comments are [rows, cols], row-major --------------
  // out[n, dim] = table[tokens[i]] ; tokens live on the host.
  virtual void embed(const Weight& table, std::span<const int32_t> tokens, float* out) = 0;
  // out[n, dim] = x / rms(x) * w
  virtual void rmsnorm(const float* x, const Weight& w, float eps, int64_t n, int64_t dim, float* out) = 0;
  // y[n, W.rows] = x[n, W.cols] * W^T
  virtual void matmul(const float* x, const Weight& w, int64_t n, float* y) = 0;
  // The output head's product: as matmul, where a device may spend more arithmetic on precision
  // (the host's int8 path computes each row's top logits again with f32 activations:
  // qmatmul_logits, gpu/host/qmatmul.h).
  virtual void matmul_logits(const float* x, const Weight& w, int64_t n, float* y) { matmul(x, w, n, y); }
  // As matmul, where a device may spend more arithmetic on precision: the host's int8 path takes
  // each activation row as two int8 rows (qmatmul_refined). The last layer's down projection.
  virtual void matmul_refined(const float* x, const Weight& w, int64_t n, float* y) { matmul(x, w, n, y); }
  // ys[k][n, ws[k].rows] = x[n, cols] * ws[k]^T for every k: the matmuls of one input (q/k/v,
  // gate/up) in one call, so a device can prepare x once and run them in one parallel region.
  virtual void matmul_many(const float* x, std::span<const Weight* const> ws, int64_t n, std::span<float* const> ys) {
    for (size_t k = 0; k < ws.size(); ++k) matmul(x, *ws[k], n, ys[k]);
  }
  // Rotates x[n, heads, head_dim] in place; positions[n] live on the host.
  virtual void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, std::span<const int32_t> positions,
                    std::span<const float> inv_freq, RopeStyle style) = 0;
  // out[i] = silu(gate[i]) * up[i] for i < n
  virtual void swiglu(const float* gate, const float* up, int64_t n, float* out) = 0;
  // x[i] += y[i] for i < n
  virtual void add(float* x, const float* y, int64_t n) = 0;
  // Writes k, v [rows, kv_heads*head_dim] into the layer's cache at each slice's positions.
  virtual void kv_store(KvCache& kv, int layer, const float* k, const float* v, std::span<const SeqSlice> slices) = 0;
  // out[rows, heads*head_dim] = softmax(q k^T / sqrt(d)) v, causal: the token at position p
  // sees cached positions 0..p of its own sequence (GQA: head h reads kv head h / (heads/kv_heads)).
  virtual void attention(const float* q, KvCache& kv, int layer, std::span<const SeqSlice> slices, int64_t heads,
                         float* out) = 0;
  // dst[i, :] = src[rows[i], :], cols wide; rows live on the host (gathers logits rows).
  virtual void gather_rows(const float* src, int64_t cols, std::span<const int64_t> rows, float* dst) = 0;
  // Blocks until queued work is done (no-op on the host).
  virtual void synchronize() = 0;

  // --- recorded steps (CUDA graphs); optional, off on the host ----------------
  // A fixed-shape step (a decode or verify forward: the same kernels on the same buffers, only
  // small host arrays such as positions and block tables change) can be recorded once and
  // replayed without launching each kernel from the host:
  //   record_begin(); <the ops, as usual>; record_end(key)  -> true: recorded and run;
  //     false: neither (something could not be recorded): run the ops as usual.
  //   replay_begin(key) -> true when a recording exists; the same ops calls then only check
  //     their arguments and stage their host arrays, queueing no device work, and
  //     replay_end() runs the recording with those arrays -> false when staging failed (an
  //     array outgrew its slot): nothing ran, run the ops as usual.
  // recording_cancel() leaves either mode after an exception; forget_recordings(owner) drops
  // the recordings of one owner (its buffers are going away). Between begin and end, the ops
  // may not allocate, free or copy.
  struct RecordingKey {
    const void* owner = nullptr;  // the model whose buffers the step uses
    std::string shape;            // everything else that fixes the step's kernels and pointers
    bool operator<(const RecordingKey& o) const { return owner != o.owner ? owner < o.owner : shape < o.shape; }
  };
  virtual bool can_record() const { return false; }
  virtual void record_begin() {}
  virtual bool record_end(const RecordingKey& key) { return false; }
  virtual bool replay_begin(const RecordingKey& key) { return false; }
  virtual bool replay_end() { return false; }
  virtual void recording_cancel() {}
  virtual void forget_recordings(const void* owner) {}

  // --- streams and judging (docs/design.md sections 1 and 3) ------------------
  // A stream for an actor that drives this device (the draft, the verifier): its work runs in
  // order, and its events complete once the device has done everything queued before them, so
  // an actor co_awaits them. The host: a worker thread (streams::HostStream). CUDA: a launch
  // thread queuing ops on this device's CUDA stream, whose events are CUDA events
  // (streams::LaunchStream over streams::CudaStream).
  virtual std::unique_ptr<streams::Stream> make_stream(const std::string& name);
  // Whether judge() runs the acceptance step where the logits are (the host judges in spec/).
  virtual bool judges_on_device() const { return false; }
  // The acceptance step on the device: target_logits device [k + 1, vocab] raw logits, q device
  // [k, vocab] draft probabilities after the same transform (null for greedy and coupled),
  // draft host [k] tokens, position the absolute position of t1. Only the verdict crosses.
  // Throws std::logic_error where judges_on_device() is false.
  virtual DeviceVerdict judge(const float* target_logits, const float* q, std::span<const int32_t> draft,
                              int64_t vocab, const DeviceSampling& sp, int64_t position);
};

// A device buffer of floats, released with its device.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Ops& ops, size_t n) : ops_(&ops), p_(ops.alloc(n)), n_(n) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ops_(o.ops_), p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) { reset(); ops_ = o.ops_; p_ = o.p_; n_ = o.n_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  void reset() { if (p_) ops_->release(p_); p_ = nullptr; n_ = 0; }
  // Grows (never shrinks) to at least n floats; contents are not kept.
  void ensure(Ops& ops, size_t n) { if (n > n_) { reset(); ops_ = &ops; p_ = ops.alloc(n); n_ = n; } }
  float* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  Ops* ops_ = nullptr;
  float* p_ = nullptr;
  size_t n_ = 0;
};

struct DeviceOptions {
  std::string device = "auto";  // "auto", "host" or "cuda"
  int threads = 2;              // host threads (the caller included)
  // The host path (docs/kernels.md): "" takes SPECULA_SIMD from the environment; otherwise one of
  // its values ("reference" keeps activations in f32, "avx2", ...).
  std::string host_path;
};

// Makes the device the options ask for. "auto" picks CUDA when a GPU is present and the CUDA
// device is built, else the host. Throws std::runtime_error with a clear reason otherwise.
std::unique_ptr<Ops> make_device(const DeviceOptions& opt);

}  // namespace specula
