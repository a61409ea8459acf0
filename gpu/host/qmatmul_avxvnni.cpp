// AVX-VNNI kernels of the int8 path (this file alone is built with -mavxvnni; call only where
// cpu_has_avx_vnni()): the vpdpbusd variant of the 256-bit kernels (qmatmul_ymm.h), for CPUs
// with AVX-VNNI but no AVX-512.
#define SPECULA_YMM_VNNI 1
#include "gpu/host/qmatmul_ymm.h"

namespace specula::host_kernels {

PackedKernel avxvnni_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &kernel<FormatQ4<false>>;
    case DType::Q4_1: return &kernel<FormatQ4<true>>;
    case DType::Q8_0: return &kernel<FormatQ8>;
    case DType::Q4_K: return &kernel<FormatQ4<true, true>>;
    case DType::Q6_K: return &kernel<FormatQ6K<>>;
    default: return nullptr;
  }
}

}  // namespace specula::host_kernels
