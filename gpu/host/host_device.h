// The host (CPU) device: gpu/ops.h on plain memory, matmuls in the stored weight types.
#pragma once
#include <map>
#include <memory>
#include <mutex>

#include "gpu/host/matmul_kernels.h"
#include "gpu/host/qmatmul.h"
#include "gpu/host/thread_pool.h"
#include "gpu/ops.h"

namespace specula {

class HostOps : public Ops {  // not final: tests derive device doubles from it
 public:
  // The path from SPECULA_SIMD (throws std::invalid_argument for a bad value), or the one given.
  explicit HostOps(int threads);
  HostOps(int threads, host_kernels::HostPath path);
  const host_kernels::HostPath& path() const { return path_; }
  DeviceKind kind() const override { return DeviceKind::Host; }
  std::string name() const override;
  ThreadPool& pool() { return pool_; }

  float* alloc(size_t n_floats) override;
  void release(float* p) override;
  void copy_to_host(const float* src, float* dst, size_t n) override;
  void copy_to_device(const float* src, float* dst, size_t n) override;
  // On the int8 path, the quantized matrices are repacked (gpu/host/qmatmul.h) into memory of the
  // device's own, once per tensor, and so are F16/BF16 matrices where the CPU has their AVX-512
  // kernels (gpu/host/hmatmul.h); the mapped file is left as it is. Other types, and every weight
  // on the reference path, are used in place, but for the types the f32 kernels do not read
  // (Q5_0, IQ4_NL, Q3_K), read as their exact conversion (model/tensor.h kernel_view) kept here.
  Weight upload(const TensorView& t) override;
  // A packed matrix's mapped pages are dropped from this process (release_mapped_pages: the page
  // cache keeps them, a later read faults them back in); a matrix used in place keeps them.
  void release_stored(const Weight& w) override;
  Weight upload_table(const TensorView& t) override;
  // The int8 path keeps K/V in fp16; the reference path in f32.
  bool kv_f16() const override;
  bool kv_k_transposed(int64_t head_dim, int64_t block_tokens) const override;
  bool kv_bf16(int64_t head_dim, int64_t block_tokens) const override;
  bool kv_head_major() const override { return true; }
  // Bytes of repacked weights held (for the benchmark's memory report).
  size_t packed_bytes() const;
  size_t read_bytes(const Weight& w) const override;

  void embed(const Weight& table, std::span<const int32_t> tokens, float* out) override;
  void rmsnorm(const float* x, const Weight& w, float eps, int64_t n, int64_t dim, float* out) override;
  void matmul(const float* x, const Weight& w, int64_t n, float* y) override;
  void matmul_logits(const float* x, const Weight& w, int64_t n, float* y) override;
  void matmul_refined(const float* x, const Weight& w, int64_t n, float* y) override;
  void matmul_many(const float* x, std::span<const Weight* const> ws, int64_t n, std::span<float* const> ys) override;
  void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, std::span<const int32_t> positions,
            std::span<const float> inv_freq, RopeStyle style) override;
  void swiglu(const float* gate, const float* up, int64_t n, float* out) override;
  void add(float* x, const float* y, int64_t n) override;
  void kv_store(KvCache& kv, int layer, const float* k, const float* v, std::span<const SeqSlice> slices) override;
  void attention(const float* q, KvCache& kv, int layer, std::span<const SeqSlice> slices, int64_t heads,
                 float* out) override;
  void gather_rows(const float* src, int64_t cols, std::span<const int64_t> rows, float* dst) override;
  void synchronize() override {}

 private:
  static constexpr size_t kMapThreshold = size_t{1} << 20;
  host_kernels::HostPath path_;
  bool kv_bf16_wanted_ = false;  // SPECULA_KV=bf16: K and V in bf16 pairs where the CPU can multiply them
  host_kernels::Int8Kernel int8_;  // the int8 path's kernel for path_.isa on this CPU
  ThreadPool pool_;
  mutable std::mutex packed_mutex_;
  std::map<const void*, std::weak_ptr<PackedMatrix>> packed_;  // by stored data, shared by uploads
  WeightArena arena_;  // the packed matrices' memory (huge pages), under packed_mutex_
  std::map<const void*, TensorView> converted_;  // by stored data: the f32 kernels' views, under packed_mutex_
  std::vector<std::shared_ptr<const void>> converted_storage_;  // their bytes
  std::mutex mapped_mutex_;
  std::map<void*, size_t> mapped_;  // mmap'd allocations and their sizes
};

}  // namespace specula
