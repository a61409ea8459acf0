// AVX-VNNI kernels of the int8 path (this file alone is built with -mavxvnni; call only where
// cpu_has_avx_vnni()): the vpdpbusd variant of the 256-bit kernels (qmatmul_ymm.h), for CPUs
// with AVX-VNNI but no AVX-512. The formats with a streaming variant run it from 5 rows
// (stream_kernel); Q6_K, Q3_K and Q2_K, whose sub-block scales apply per row, the holding tile.
#define SPECULA_YMM_VNNI 1
#include "gpu/host/qmatmul_ymm.h"

namespace specula::host_kernels {

PackedKernel avxvnni_packed_kernel(DType t) {
  switch (t) {
    case DType::Q4_0: return &stream_kernel<StreamQ4<false>>;
    case DType::Q4_1: return &stream_kernel<StreamQ4<true>>;
    case DType::Q8_0: return &stream_kernel<StreamQ8>;
    case DType::Q4_K: return &stream_kernel<StreamQ4<true, true>>;
    case DType::Q5_0: return &stream_kernel<StreamQ4<false, false, true>>;
    case DType::Q5_1: return &stream_kernel<StreamQ4<true, false, true>>;
    case DType::Q5_K: return &stream_kernel<StreamQ4<true, true, true>>;
    case DType::IQ4_NL: return &stream_kernel<StreamIQ4NL<>>;
    case DType::IQ4_XS: return &stream_kernel<StreamIQ4NL<true>>;
    case DType::Q6_K: return &kernel<FormatQ6K<>>;
    case DType::Q3_K: return &kernel<FormatQ6K<true>>;
    case DType::Q2_K: return &kernel<FormatQ2K>;
    default: return nullptr;
  }
}

}  // namespace specula::host_kernels
