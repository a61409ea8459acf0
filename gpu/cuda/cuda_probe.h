// Asks the CUDA runtime how many GPUs are present, without needing one to build or run.
#pragma once
#include <string>

namespace specula {

// Number of CUDA devices; 0 with *why set when there are none, the driver is missing, or the
// CUDA parts were not built (nvcc absent at configure time).
int cuda_device_count(std::string* why);

}  // namespace specula
