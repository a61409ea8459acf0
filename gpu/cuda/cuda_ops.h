// The CUDA device: gpu/ops.h on one GPU and one cudaStream_t. Weights live in BF16 in one device
// allocation per model (a bump arena), KV pools are one allocation each (Ops::alloc), and the
// small per-forward host arrays (tokens, positions, block tables) go through a reusable
// workspace, so a decode step calls no cudaMalloc once the first step of its shape has run.
// Built only when nvcc is found (SPECULA_HAVE_CUDA); this header needs no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gpu/ops.h"

namespace specula {

class CudaOps final : public Ops {
 public:
  // Throws std::runtime_error naming the CUDA error when `device` cannot be used. With
  // `stream` (a cudaStream_t, e.g. streams::CudaStream::native(), not owned) every op is queued
  // there, so events recorded on that stream mark points in this device's work; otherwise the
  // device makes a non-blocking stream of its own.
  explicit CudaOps(int device = 0, void* stream = nullptr);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  DeviceKind kind() const override { return DeviceKind::Cuda; }
  std::string name() const override;  // e.g. "cuda:0 (NVIDIA H100 80GB HBM3, sm_90)"

  float* alloc(size_t n_floats) override;  // cudaMalloc + zero; one allocation per call
  void release(float* p) override;
  void copy_to_host(const float* src, float* dst, size_t n) override;    // waits for the stream
  void copy_to_device(const float* src, float* dst, size_t n) override;  // ordered on the stream
  // Matrices (2-D) become BF16 (GGUF types dequantized on the host, then rounded to nearest
  // even); vectors (norm weights) stay F32. A tensor already uploaded (a tied output head) is
  // shared, not copied twice.
  // Matrices are kept as BF16 (upload); vectors as stored.
  size_t read_bytes(const Weight& w) const override {
    return w.view.shape.size() < 2 ? w.view.nbytes : static_cast<size_t>(w.rows() * w.cols()) * 2;
  }
  Weight upload(const TensorView& t) override;
  void reserve_weights(int64_t elements) override;

  void embed(const Weight& table, std::span<const int32_t> tokens, float* out) override;
  void rmsnorm(const float* x, const Weight& w, float eps, int64_t n, int64_t dim, float* out) override;
  void matmul(const float* x, const Weight& w, int64_t n, float* y) override;
  void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, std::span<const int32_t> positions,
            std::span<const float> inv_freq, RopeStyle style) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void add(float* x, const float* y, int64_t n) override;
  void kv_store(KvCache& kv, int layer, const float* k, const float* v, std::span<const SeqSlice> slices) override;
  void attention(const float* q, KvCache& kv, int layer, std::span<const SeqSlice> slices, int64_t heads,
                 float* out) override;
  void gather_rows(const float* src, int64_t cols, std::span<const int64_t> rows, float* dst) override;
  void synchronize() override;

  // Recorded steps as CUDA graphs (gpu/ops.h): the stream captured into a graph, the small host
  // arrays copied from pinned mirrors of the scratch slots by the graph's own copy nodes.
  bool can_record() const override { return true; }
  void record_begin() override;
  bool record_end(const RecordingKey& key) override;
  bool replay_begin(const RecordingKey& key) override;
  bool replay_end() override;
  void recording_cancel() override;
  void forget_recordings(const void* owner) override;
  // Graph launches so far (recorded steps run), for tests and reports.
  size_t graph_launches() const;

  // --- CUDA only -------------------------------------------------------------
  int device() const { return device_; }
  // A launch thread over this device's CUDA stream (streams::LaunchStream, events are CUDA
  // events), and the acceptance step on the device (gpu/cuda/device_verify.h).
  std::unique_ptr<streams::Stream> make_stream(const std::string& name) override;
  bool judges_on_device() const override { return true; }
  DeviceVerdict judge(const float* target_logits, const float* q, std::span<const int32_t> draft, int64_t vocab,
                      const DeviceSampling& sp, int64_t position) override;
  void* stream() const;  // the cudaStream_t every op is queued on
  // Device-to-device copy bandwidth in GB/s (bytes read + bytes written per second), the median
  // of several cudaMemcpyAsync of `bytes`, timed with events; the decode roofline's denominator.
  double measure_copy_bandwidth_gbs(size_t bytes = size_t{1} << 30);
  // Bytes of device memory taken by uploads so far (BF16 matrices, F32 vectors), for reports.
  size_t weight_bytes() const;
  // Matmuls with at most this many rows use the skinny kernel (F32 activations, each weight row
  // read once for all rows); wider ones convert activations to BF16 and call cuBLAS.
  static constexpr int64_t kSkinnyMaxRows = 16;
  // The skinny kernel's version (gpu/cuda/kernels.h): 1 or 4 weight rows per warp, 0 = the
  // default (SPECULA_SKINNY_ROWS); `bench decode --shape` times both in one run. Takes effect for
  // steps launched after it (recordings keep the version they were recorded with).
  void set_skinny_rows_per_warp(int rows) {
    if (rows != 0 && rows != 1 && rows != 4) throw std::invalid_argument("skinny rows per warp must be 0, 1 or 4");
    skinny_rows_per_warp_ = rows;
  }

  // A device scratch region of at least `bytes`, reused across calls (grows, never shrinks;
  // growing waits for the stream). Valid until the next call with the same slot.
  enum class Scratch { Bf16Activations, Tokens, Positions, InvFreq, Plan, Rows, Verify, Count };
  void* scratch(Scratch slot, size_t bytes);
  // Copies host bytes into a scratch slot unless the slot already holds exactly those bytes
  // (so the block tables of one forward are uploaded once, not once per layer).
  const void* upload_small(Scratch slot, const void* data, size_t bytes);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int device_ = 0;
  int skinny_rows_per_warp_ = 0;
};

}  // namespace specula
