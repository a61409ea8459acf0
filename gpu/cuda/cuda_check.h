// CUDA and cuBLAS status checks for the .cu files: a failure throws std::runtime_error naming the
// call, file:line and the library's own error text.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace specula::cuda {

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

#define SPECULA_CUDA(call) ::specula::cuda::check((call), #call, __FILE__, __LINE__)
// After a kernel launch: a bad configuration shows here, a fault at the next synchronization.
#define SPECULA_CUDA_LAUNCHED() ::specula::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
