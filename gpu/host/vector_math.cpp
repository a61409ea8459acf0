// gpu/host/vector_math.h: dispatch to the AVX2 file where the CPU has it.
#include "gpu/host/vector_math.h"

#include "gpu/host/matmul_kernels.h"

namespace specula::host_kernels {

bool exp_sum_with_bound(const float* x, int64_t n, float inv_t, float mx, double* sum, double* bound) {
  if (!cpu_has_avx2_fma()) return false;
  exp_sum_bound_avx2(x, n, inv_t, mx, sum, bound);
  // The exact sum's own error: each std::exp within an ulp, each of n additions within half of
  // one, in whatever order it is summed; the same again for this sum's additions in double.
  *bound += 4.0 * static_cast<double>(n + 2) * 1.1102230246251565e-16 * *sum;
  return true;
}

}  // namespace specula::host_kernels
