// Device selection: --device auto|host|cuda; what every device has by default (a host stream,
// no judging on the device).
#include <cstdlib>
#include <stdexcept>

#include "gpu/cuda/cuda_probe.h"
#ifdef SPECULA_HAVE_CUDA
#include "gpu/cuda/cuda_ops.h"
#endif
#include "gpu/host/host_device.h"
#include "gpu/host/matmul_kernels.h"
#include "gpu/ops.h"
#include "streams/host_stream.h"

namespace specula {

#ifndef SPECULA_HAVE_CUDA
int cuda_device_count(std::string* why) {
  if (why) *why = "this build has no CUDA device (nvcc was not found when it was configured)";
  return 0;
}
#endif

namespace {
host_kernels::HostPath host_path_of(const DeviceOptions& opt) {
  return host_kernels::host_path_for(opt.host_path.empty() ? std::getenv("SPECULA_SIMD") : opt.host_path.c_str());
}
}  // namespace

std::unique_ptr<streams::Stream> Ops::make_stream(const std::string& name) {
  return std::make_unique<streams::HostStream>(name);
}

DeviceVerdict Ops::judge(const float*, const float*, std::span<const int32_t>, int64_t, const DeviceSampling&, int64_t) {
  throw std::logic_error("device " + this->name() + " does not judge rounds; the host does (spec/speculative_sampling.h)");
}

std::unique_ptr<Ops> make_device(const DeviceOptions& opt) {
  if (opt.threads < 1 || opt.threads > 256)
    throw std::invalid_argument("--threads must be between 1 and 256, got " + std::to_string(opt.threads));
  if (opt.device == "host" || opt.device == "cpu") return std::make_unique<HostOps>(opt.threads, host_path_of(opt));
  if (opt.device == "cuda" || opt.device == "auto") {
    std::string why;
    const int gpus = cuda_device_count(&why);
    if (gpus > 0) {
#ifdef SPECULA_HAVE_CUDA
      return std::make_unique<CudaOps>(0);
#endif
    } else if (opt.device == "cuda") {
      throw std::runtime_error("--device cuda: " + why);
    }
    return std::make_unique<HostOps>(opt.threads, host_path_of(opt));
  }
  throw std::invalid_argument("unknown --device '" + opt.device + "' (expected auto, host or cuda)");
}

}  // namespace specula
