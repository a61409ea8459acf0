// Launchers of the CUDA device's kernels (gpu/cuda/kernels.cu). Pointers are device pointers;
// shapes are [rows, cols] row-major as in gpu/ops.h. Each launcher queues one kernel on `stream`
// and checks the launch; the caller checks arguments (the op boundary, cuda_ops.cu).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace specula::cuda {

// One row of the paged-attention plan (built on the host per forward, uploaded once).
struct RowPlan {
  int64_t kv_offset;    // floats into a layer pool of this row's own position (kv_store)
  int32_t table_begin;  // index of its sequence's first block id in the plan's table array
  int32_t ctx;          // positions it attends to: 0..ctx-1 (causal: its own position + 1)
};

// out[n, dim] = table[tokens[i], :] (BF16 -> F32)
void embed(const __nv_bfloat16* table, const int32_t* tokens, int64_t n, int64_t dim, float* out, cudaStream_t s);
// out[n, dim] = x / rms(x) * w
void rmsnorm(const float* x, const float* w, float eps, int64_t n, int64_t dim, float* out, cudaStream_t s);
// x[n, heads, head_dim] rotated in place; interleaved pairs (2i, 2i+1), else (i, i + d/2).
void rope(float* x, int64_t n, int64_t heads, int64_t head_dim, const int32_t* positions, const float* inv_freq,
          bool interleaved, cudaStream_t s);
void swiglu(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s);
void add(float* x, const float* y, int64_t n, cudaStream_t s);
// k_pool[plan[r].kv_offset + j] = k[r, j] (and v), j < row_floats
void kv_store(float* k_pool, float* v_pool, const float* k, const float* v, const RowPlan* plan, int64_t rows,
              int64_t row_floats, cudaStream_t s);
// out[rows, heads*head_dim]; q the same shape; tables: block ids; GQA group = heads / kv_heads
// (at most 8); head_dim at most 256.
void attention(const float* q, const float* k_pool, const float* v_pool, const RowPlan* plan, const int32_t* tables,
               int64_t rows, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t block_tokens, float* out,
               cudaStream_t s);
// dst[i, :] = src[rows[i], :]
void gather_rows(const float* src, int64_t cols, const int64_t* rows, int64_t n, float* dst, cudaStream_t s);
// dst[i] = bf16(src[i]), round to nearest even
void to_bf16(const float* src, int64_t n, __nv_bfloat16* dst, cudaStream_t s);
// y[n, rows] = x[n, cols] * W^T with W BF16 [rows, cols], x and y F32, n <= 16, cols % 8 == 0,
// x 16-byte aligned: every weight row is read once for all n activation rows. rows_per_warp:
// 1 (v1: a warp per weight row) or 4 (v2: each activation load serves four rows); 0: v1 unless
// SPECULA_SKINNY_ROWS=4.
void matmul_skinny(const __nv_bfloat16* w, int64_t rows, int64_t cols, const float* x, int64_t n, float* y,
                   cudaStream_t s, int rows_per_warp = 0);

}  // namespace specula::cuda
