// CUDA runtime probe, built only when nvcc is found.
#include <cuda_runtime.h>

#include "gpu/cuda/cuda_probe.h"

namespace specula {

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why) *why = std::string("no CUDA GPU is usable: ") + cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA GPU is present";
  return n;
}

}  // namespace specula
