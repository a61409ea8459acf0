// The CUDA device's stream: a cudaStream_t whose events are cudaEvent_t, completed on the host
// by a cudaLaunchHostFunc callback that posts the waiting continuations (it never calls CUDA).
// Built only when nvcc is found (SPECULA_HAVE_CUDA); this header needs no CUDA headers.
#pragma once

#include <memory>
#include <string>

#include "streams/stream.h"

namespace specula::streams {

class CudaStream final : public Stream {
 public:
  // Throws std::runtime_error (naming the CUDA error) when `device` cannot be used.
  explicit CudaStream(int device = 0, std::string name = "cuda");
  // Adopts `native` (a cudaStream_t of `device`, e.g. the one a CudaOps launches on): events mark
  // points in that stream's work; the stream is synchronized, not destroyed, with this object.
  CudaStream(int device, void* native, std::string name);
  // Synchronizes (every event completes), then destroys the stream.
  ~CudaStream() override;

  const std::string& name() const override;
  void enqueue(std::function<void()> work) override;
  Event record() override;
  // A CUDA event makes the GPU wait (cudaStreamWaitEvent; the host is not involved). An event of
  // another device must be complete already: a CUDA stream cannot wait on the host without
  // blocking CUDA's callback thread, so an unfinished one is refused (std::invalid_argument).
  void wait(const Event& event) override;

  int device() const;
  // The cudaStream_t, for kernel launches.
  void* native() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula::streams
