// The CUDA device's kernels, version 1: simple, each checked against the host device
// (gpu/host/host_device.cpp) by tests/gpu/cuda_ops_test.cpp. Activations are F32, weights BF16,
// accumulation F32 (the RMSNorm sum of squares in F64, as the host does it).
#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/kernels.h"

#include <cmath>
#include <cstdlib>

namespace specula::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n, int threads = kThreads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void embed_kernel(const __nv_bfloat16* table, const int32_t* tokens, int64_t dim, float* out) {
  const int64_t r = blockIdx.x;
  const __nv_bfloat16* src = table + static_cast<int64_t>(tokens[r]) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = __bfloat162float(src[i]);
}

// One block per row: the sum of squares in double (as the host), then scale.
__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int64_t dim, float* out) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * dim;
  double ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  __shared__ double partial[kThreads / 32];
  __shared__ float inv;
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int i = 0; i < kThreads / 32; ++i) t += partial[i];
    inv = static_cast<float>(1.0 / sqrt(t / dim + eps));
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = xr[i] * inv * w[i];
}

// One thread per (token, head, pair).
__global__ void rope_kernel(float* x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* positions,
                            const float* inv_freq, bool interleaved) {
  const int64_t half = head_dim / 2;
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= n * heads * half) return;
  const int64_t i = id % half, th = id / half, t = th / heads;
  // The angle in float32, as the host and the reference implementations compute it.
  const float a = static_cast<float>(positions[t]) * inv_freq[i];
  float sn, cs;
  sincosf(a, &sn, &cs);
  float* v = x + th * head_dim;
  const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
  const float x0 = v[ia], x1 = v[ib];
  v[ia] = x0 * cs - x1 * sn;
  v[ib] = x0 * sn + x1 * cs;
}

__global__ void swiglu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void kv_store_kernel(float* kp, float* vp, const float* k, const float* v, const RowPlan* plan,
                                int64_t rf) {
  const int64_t r = blockIdx.x, off = plan[r].kv_offset;
  for (int64_t j = threadIdx.x; j < rf; j += blockDim.x) {
    kp[off + j] = k[r * rf + j];
    vp[off + j] = v[r * rf + j];
  }
}

// Paged attention, one block per (token row, kv head), kAttnWarps warps. The `group` query heads
// that share the kv head are done together so each cached K/V row is read once for all of them.
// Warp w takes positions w, w + kAttnWarps, ...; lane l holds dims l + 32 j (j < DJ) of q and of
// its running output; scores use an online softmax (running max m, sum l) per head; the warps'
// partial results are merged through shared memory at the end.
constexpr int kAttnWarps = 4;
constexpr int kMaxGroup = 8;

template <int DJ>
__global__ void attention_kernel(const float* q, const float* kp, const float* vp, const RowPlan* plan,
                                 const int32_t* tables, int64_t heads, int64_t kvh, int64_t hd, int64_t bt,
                                 float scale, float* out) {
  extern __shared__ float smem[];  // [warps][group][hd] acc, then [warps][group] m and l
  const int64_t row = blockIdx.x, kh = blockIdx.y;
  const int group = static_cast<int>(heads / kvh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const RowPlan p = plan[row];
  const int64_t rf = kvh * hd;

  float qv[kMaxGroup][DJ], acc[kMaxGroup][DJ], m[kMaxGroup], l[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < DJ; ++j) {
      const int64_t d = lane + 32 * j;
      acc[g][j] = 0.0f;
      qv[g][j] = (g < group && d < hd) ? q[(row * heads + kh * group + g) * hd + d] : 0.0f;
    }
  }

  for (int pos = warp; pos < p.ctx; pos += kAttnWarps) {
    const int64_t block = tables[p.table_begin + pos / bt];
    const int64_t base = (block * bt + pos % bt) * rf + kh * hd;
    float kv[DJ], vv[DJ];
#pragma unroll
    for (int j = 0; j < DJ; ++j) {
      const int64_t d = lane + 32 * j;
      kv[j] = d < hd ? kp[base + d] : 0.0f;
      vv[j] = d < hd ? vp[base + d] : 0.0f;
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g >= group) break;
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < DJ; ++j) dot += qv[g][j] * kv[j];
      const float s = warp_sum(dot) * scale;
      const float m_new = fmaxf(m[g], s);
      const float corr = expf(m[g] - m_new), e = expf(s - m_new);
      l[g] = l[g] * corr + e;
#pragma unroll
      for (int j = 0; j < DJ; ++j) acc[g][j] = acc[g][j] * corr + e * vv[j];
      m[g] = m_new;
    }
  }

  float* s_acc = smem;
  float* s_m = smem + kAttnWarps * group * hd;
  float* s_l = s_m + kAttnWarps * group;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
#pragma unroll
    for (int j = 0; j < DJ; ++j) {
      const int64_t d = lane + 32 * j;
      if (d < hd) s_acc[(warp * group + g) * hd + d] = acc[g][j];
    }
    if (lane == 0) {
      s_m[warp * group + g] = m[g];
      s_l[warp * group + g] = l[g];
    }
  }
  __syncthreads();
  for (int64_t gd = threadIdx.x; gd < group * hd; gd += blockDim.x) {
    const int64_t g = gd / hd, d = gd % hd;
    float mx = -INFINITY;
    for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, s_m[w * group + g]);
    float sum = 0.0f, o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      const float mw = s_m[w * group + g];
      if (mw == -INFINITY) continue;  // a warp that saw no position
      const float f = expf(mw - mx);
      sum += s_l[w * group + g] * f;
      o += s_acc[(w * group + g) * hd + d] * f;
    }
    out[(row * heads + kh * group + g) * hd + d] = o / sum;
  }
}

__global__ void gather_rows_kernel(const float* src, int64_t cols, const int64_t* rows, float* dst) {
  const int64_t i = blockIdx.x;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[i * cols + c] = src[rows[i] * cols + c];
}

__global__ void to_bf16_kernel(const float* src, int64_t n, __nv_bfloat16* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = __float2bfloat16_rn(src[i]);
}

// Skinny GEMM. v1 (R = 1): one warp per weight row; each lane reads 8 BF16 weights (16 bytes)
// per step and applies them to the n <= MAXN activation rows, so the weights are read exactly
// once whatever n is (the activations, n * cols * 4 bytes, come from L1/L2). F32 accumulation
// per row and lane, then a warp reduction. v2 (R = 4): each warp takes 4 weight rows, so each
// activation load serves 4 rows (a quarter of the L1 traffic for wide n, 4 independent weight
// loads in flight per lane) at the price of 4x fewer warps. Which is faster is for the GPU run
// to show (SPECULA_SKINNY_ROWS=1|4 picks; docs/cuda.md).
template <int MAXN, int R>
__global__ void __launch_bounds__(kThreads) matmul_skinny_kernel(const __nv_bfloat16* w, int64_t rows, int64_t cols,
                                                                 const float* x, int n, float* y) {
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32) * R;
  const int lane = threadIdx.x % 32;
  if (row0 >= rows) return;
  const uint4* wr[R];
#pragma unroll
  for (int q = 0; q < R; ++q) wr[q] = reinterpret_cast<const uint4*>(w + (row0 + q < rows ? row0 + q : rows - 1) * cols);
  float acc[R][MAXN];
#pragma unroll
  for (int q = 0; q < R; ++q)
#pragma unroll
    for (int r = 0; r < MAXN; ++r) acc[q][r] = 0.0f;
  const int64_t steps = cols / 8;
#pragma unroll(R == 1 ? 4 : 1)
  for (int64_t s = lane; s < steps; s += 32) {
    float wf[R][8];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const uint4 packed = __ldg(wr[q] + s);
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        wf[q][2 * j] = f.x;
        wf[q][2 * j + 1] = f.y;
      }
    }
#pragma unroll
    for (int r = 0; r < MAXN; ++r) {
      if (r >= n) break;
      const float4* xr = reinterpret_cast<const float4*>(x + r * cols) + 2 * s;
      const float4 a = xr[0], b = xr[1];
#pragma unroll
      for (int q = 0; q < R; ++q)
        acc[q][r] += wf[q][0] * a.x + wf[q][1] * a.y + wf[q][2] * a.z + wf[q][3] * a.w + wf[q][4] * b.x +
                     wf[q][5] * b.y + wf[q][6] * b.z + wf[q][7] * b.w;
    }
  }
#pragma unroll
  for (int q = 0; q < R; ++q) {
    if (row0 + q >= rows) break;
#pragma unroll
    for (int r = 0; r < MAXN; ++r) {
      if (r >= n) break;
      const float t = warp_sum(acc[q][r]);
      if (lane == 0) y[r * rows + row0 + q] = t;
    }
  }
}

template <int R>
void launch_skinny(const __nv_bfloat16* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
                   cudaStream_t s) {
  const unsigned grid = blocks_for((rows + R - 1) / R, kThreads / 32);
  const int nn = static_cast<int>(n);
  if (n <= 1)
    matmul_skinny_kernel<1, R><<<grid, kThreads, 0, s>>>(w, rows, cols, x, nn, y);
  else if (n <= 2)
    matmul_skinny_kernel<2, R><<<grid, kThreads, 0, s>>>(w, rows, cols, x, nn, y);
  else if (n <= 4)
    matmul_skinny_kernel<4, R><<<grid, kThreads, 0, s>>>(w, rows, cols, x, nn, y);
  else if (n <= 8)
    matmul_skinny_kernel<8, R><<<grid, kThreads, 0, s>>>(w, rows, cols, x, nn, y);
  else
    matmul_skinny_kernel<16, R><<<grid, kThreads, 0, s>>>(w, rows, cols, x, nn, y);
}

int skinny_rows_per_warp() {
  static const int r = [] {
    const char* e = std::getenv("SPECULA_SKINNY_ROWS");
    return e && std::atoi(e) == 4 ? 4 : 1;
  }();
  return r;
}

}  // namespace

void embed(const __nv_bfloat16* table, const int32_t* tokens, int64_t n, int64_t dim, float* out, cudaStream_t s) {
  embed_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(table, tokens, dim, out);
  SPECULA_CUDA_LAUNCHED();
}

void rmsnorm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out, cudaStream_t s) {
  rmsnorm_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(x, w, eps, dim, out);
  SPECULA_CUDA_LAUNCHED();
}

void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* positions, const float* inv_freq,
          bool interleaved, cudaStream_t s) {
  const int64_t work = n * heads * (head_dim / 2);
  rope_kernel<<<blocks_for(work), kThreads, 0, s>>>(x, n, heads, head_dim, positions, inv_freq, interleaved);
  SPECULA_CUDA_LAUNCHED();
}

void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s) {
  swiglu_kernel<<<blocks_for(n), kThreads, 0, s>>>(gate, up, n, out);
  SPECULA_CUDA_LAUNCHED();
}

void add(float* x, const float* y, int64_t n, cudaStream_t s) {
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(x, y, n);
  SPECULA_CUDA_LAUNCHED();
}

void kv_store(float* k_pool, float* v_pool, const float* k, const float* v, const RowPlan* plan, int64_t rows,
              int64_t row_floats, cudaStream_t s) {
  kv_store_kernel<<<static_cast<unsigned>(rows), 128, 0, s>>>(k_pool, v_pool, k, v, plan, row_floats);
  SPECULA_CUDA_LAUNCHED();
}

void attention(const float* q, const float* k_pool, const float* v_pool, const RowPlan* plan, const int32_t* tables,
               int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_tokens, float* out,
               cudaStream_t s) {
  const int64_t group = heads / kv_heads;
  const size_t smem = static_cast<size_t>(kAttnWarps * group * (head_dim + 2)) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(kv_heads));
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  const int threads = kAttnWarps * 32;
  if (head_dim <= 32)
    attention_kernel<1><<<grid, threads, smem, s>>>(q, k_pool, v_pool, plan, tables, heads, kv_heads, head_dim,
                                                    block_tokens, scale, out);
  else if (head_dim <= 64)
    attention_kernel<2><<<grid, threads, smem, s>>>(q, k_pool, v_pool, plan, tables, heads, kv_heads, head_dim,
                                                    block_tokens, scale, out);
  else if (head_dim <= 128)
    attention_kernel<4><<<grid, threads, smem, s>>>(q, k_pool, v_pool, plan, tables, heads, kv_heads, head_dim,
                                                    block_tokens, scale, out);
  else
    attention_kernel<8><<<grid, threads, smem, s>>>(q, k_pool, v_pool, plan, tables, heads, kv_heads, head_dim,
                                                    block_tokens, scale, out);
  SPECULA_CUDA_LAUNCHED();
}

void gather_rows(const float* src, int64_t cols, const int64_t* rows, int64_t n, float* dst, cudaStream_t s) {
  gather_rows_kernel<<<static_cast<unsigned>(n), kThreads, 0, s>>>(src, cols, rows, dst);
  SPECULA_CUDA_LAUNCHED();
}

void to_bf16(const float* src, int64_t n, __nv_bfloat16* dst, cudaStream_t s) {
  to_bf16_kernel<<<blocks_for(n), kThreads, 0, s>>>(src, n, dst);
  SPECULA_CUDA_LAUNCHED();
}

void matmul_skinny(const __nv_bfloat16* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
                   cudaStream_t s, int rows_per_warp) {
  if ((rows_per_warp ? rows_per_warp : skinny_rows_per_warp()) == 4)
    launch_skinny<4>(w, rows, cols, x, n, y, s);
  else
    launch_skinny<1>(w, rows, cols, x, n, y, s);
  SPECULA_CUDA_LAUNCHED();
}

}  // namespace specula::cuda
