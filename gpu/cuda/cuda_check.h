// CUDA and cuBLAS status checks for the .cu files: a failure throws std::runtime_error naming the
// call, file:line and the library's own error text.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace specula::cuda {

// True on CUDA's callback thread while streams::CudaStream runs host work there. CUDA must not
// be called from a cudaLaunchHostFunc callback (cudaErrorNotPermitted), and a wait on the stream
// that is running the callback would never return; so every call through SPECULA_CUDA refuses
// there, with a message, instead of failing obscurely or hanging. (Device work belongs on the
// actor's own thread; only record() and async_wait() go through the stream.)
inline thread_local bool in_host_callback = false;

inline void refuse_in_host_callback(const char* call) {
  if (in_host_callback)
    throw std::logic_error(std::string(call) +
                           ": CUDA called from a stream's host callback (run device work on the actor's thread, "
                           "and only record events on a CUDA stream)");
}

inline void check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cudaGetErrorString(status));
}

inline void check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cublasGetStatusString(status));
}

}  // namespace specula::cuda

#define SPECULA_CUDA(call) \
  (::specula::cuda::refuse_in_host_callback(#call), ::specula::cuda::check((call), #call, __FILE__, __LINE__))
// After a kernel launch: a bad configuration shows here, a fault at the next synchronization.
#define SPECULA_CUDA_LAUNCHED() ::specula::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
