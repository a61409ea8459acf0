// Speculative acceptance on the device, version 1: one block of 1024 threads walks the k+1 rows
// in order, exactly as spec/speculative_sampling.cpp does on the host, and stops at the first
// rejection, so only the rows a round reaches are transformed.
//
// The transform without sorting: the kept set of top-k / top-p is a prefix of the order
// (logit descending, index ascending). Its cut is found by radix select over a monotone 32-bit
// key of the logit (four 8-bit passes with shared-memory histograms: counts for top-k, exp-mass
// for top-p), then, among logits equal to the cut value, the lowest indices by a block scan. A
// token is kept when key > cut, or key == cut and index < tie_limit.
#include "gpu/cuda/device_verify.h"

#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "gpu/cuda/cuda_check.h"
#include "gpu/cuda/cuda_ops.h"

namespace specula {

namespace {

constexpr int kBlock = 1024;
constexpr int kWarps = kBlock / 32;
constexpr uint32_t kStreamToken = 0, kStreamAccept = 1, kStreamResidual = 2;  // spec/philox.h RngStream

// spec/philox.h, line for line.
__device__ double philox_uniform(uint64_t seed, int64_t position, uint32_t stream, uint64_t index) {
  constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(index >> 2), c1 = static_cast<uint32_t>(position),
           c2 = static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32), c3 = stream;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(M0) * c0, p1 = static_cast<uint64_t>(M1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0, n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1, n3 = static_cast<uint32_t>(p0);
    c0 = n0, c1 = n1, c2 = n2, c3 = n3;
    k0 += W0;
    k1 += W1;
  }
  const uint32_t out[4] = {c0, c1, c2, c3};
  return (static_cast<double>(out[index & 3]) + 0.5) * (1.0 / 4294967296.0);
}

// A 32-bit key whose unsigned order is the float order; -0.0 and +0.0 get one key, since the
// host's comparisons treat them as equal (a tie, broken by index).
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t u = __float_as_uint(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// --- block reductions (all kBlock threads call them; the result is returned to every thread) --

struct Shared {
  double dred[kWarps];
  float fred[kWarps];
  int ired[kWarps];
  unsigned cnt[256];
  double mass[256];
  // the transform of the current row
  float mx;          // max logit * inv_t (float, as the host)
  double log_sum;    // log of the kept set's sum of exp(logit * inv_t - mx)
  bool all;          // nothing cut
  uint32_t cut;      // kept: key > cut, or key == cut and index < tie_limit
  int tie_limit;
  // the verdict
  int accepted, bonus, done;
};

__device__ double block_sum(double v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.dred[threadIdx.x / 32] = v;
  __syncthreads();
  double t = 0;
  for (int w = 0; w < kWarps; ++w) t += sh.dred[w];
  return t;
}

__device__ float block_max(float v, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if (threadIdx.x % 32 == 0) sh.fred[threadIdx.x / 32] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int w = 0; w < kWarps; ++w) t = fmaxf(t, sh.fred[w]);
  return t;
}

// The index of the largest score, lowest index on ties (-1 when every score is -inf).
__device__ int block_argmax(double score, int idx, Shared& sh) {
  for (int o = 16; o > 0; o >>= 1) {
    const double s2 = __shfl_xor_sync(0xffffffffu, score, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (s2 > score || (s2 == score && i2 >= 0 && (idx < 0 || i2 < idx))) score = s2, idx = i2;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) {
    sh.dred[threadIdx.x / 32] = score;
    sh.ired[threadIdx.x / 32] = idx;
  }
  __syncthreads();
  double best = -INFINITY;
  int bi = -1;
  for (int w = 0; w < kWarps; ++w) {
    const double s = sh.dred[w];
    const int i = sh.ired[w];
    if (i < 0) continue;
    if (bi < 0 || s > best || (s == best && i < bi)) best = s, bi = i;
  }
  return bi;
}

// A per-thread best (score, index) over the thread's strided elements, lowest index on ties
// because each thread visits indices in increasing order and keeps only strictly better ones.
struct Best {
  double score = -INFINITY;
  int idx = -1;
  __device__ void offer(double s, int i) {
    if (idx < 0 || s > score) score = s, idx = i;
  }
};

// --- the transform ---------------------------------------------------------------------------

__device__ __forceinline__ double exp_term(float logit, float inv_t, float mx) {
  return exp(static_cast<double>(logit) * inv_t - mx);  // spec/sampling.cpp's expression
}

__device__ __forceinline__ bool kept(const Shared& sh, float logit, int v) {
  if (sh.all) return true;
  const uint32_t k = order_key(logit);
  return k > sh.cut || (k == sh.cut && v < sh.tie_limit);
}

// Radix select over keys: the cut key T with weight(key > T) < target <= weight(key >= T),
// weights 1 (by_mass false) or exp_term (true). Returns T.
__device__ uint32_t radix_select(const float* x, int V, float inv_t, float mx, bool by_mass, double target,
                                 Shared& sh) {
  uint32_t prefix = 0, mask = 0;
  double remaining = target;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kBlock) sh.cnt[b] = 0, sh.mass[b] = 0;
    __syncthreads();
    for (int v = threadIdx.x; v < V; v += kBlock) {
      const uint32_t k = order_key(x[v]);
      if ((k & mask) != prefix) continue;
      const int b = (k >> shift) & 255;
      if (by_mass)
        atomicAdd(&sh.mass[b], exp_term(x[v], inv_t, mx));
      else
        atomicAdd(&sh.cnt[b], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double acc = 0;
      int digit = -1, lowest = -1;
      for (int b = 255; b >= 0; --b) {
        const double w = by_mass ? sh.mass[b] : static_cast<double>(sh.cnt[b]);
        if (w <= 0) continue;
        lowest = b;
        if (acc + w >= remaining) {
          digit = b;
          break;
        }
        acc += w;
      }
      if (digit < 0) {  // rounding left the total just under the target: take the lowest bucket
        digit = lowest;
        acc -= by_mass ? sh.mass[lowest] : static_cast<double>(sh.cnt[lowest]);
      }
      sh.dred[0] = remaining - acc;
      sh.ired[0] = digit;
    }
    __syncthreads();
    remaining = sh.dred[0];
    prefix |= static_cast<uint32_t>(sh.ired[0]) << shift;
    mask |= 255u << shift;
    __syncthreads();
  }
  return prefix;
}

// Index + 1 of the m-th (1-based) element with key == cut, in index order.
__device__ int tie_limit(const float* x, int V, uint32_t cut, int m, Shared& sh) {
  int base = 0;
  for (int v0 = 0; v0 < V; v0 += kBlock) {
    const int v = v0 + threadIdx.x;
    const bool f = v < V && order_key(x[v]) == cut;
    const unsigned ballot = __ballot_sync(0xffffffffu, f);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0) sh.ired[warp] = __popc(ballot);
    __syncthreads();
    int before = base;
    for (int w = 0; w < warp; ++w) before += sh.ired[w];
    before += __popc(ballot & ((1u << lane) - 1u));
    if (f && before + 1 == m) sh.tie_limit = v + 1;
    int total = 0;
    for (int w = 0; w < kWarps; ++w) total += sh.ired[w];
    base += total;
    if (base >= m) break;  // uniform: every thread computed the same base
  }
  __syncthreads();
  return sh.tie_limit;
}

// Fills sh.{mx, log_sum, all, cut, tie_limit} for one row: spec/sampling.cpp transform_logits.
__device__ void transform_row(const float* x, int V, float inv_t, int top_k, float top_p, Shared& sh) {
  float local = -INFINITY;
  for (int v = threadIdx.x; v < V; v += kBlock) local = fmaxf(local, x[v]);
  const float mx = block_max(local, sh) * inv_t;
  const bool use_k = top_k > 0 && top_k < V, use_p = top_p < 1.0f;
  if (threadIdx.x == 0) sh.mx = mx, sh.all = true, sh.cut = 0, sh.tie_limit = V;
  __syncthreads();

  // The top-k cut: n_k = top_k elements.
  uint32_t cut_k = 0;
  int m_k = 0, above_k = 0;
  if (use_k) {
    cut_k = radix_select(x, V, inv_t, mx, false, top_k, sh);
    double gt = 0;
    for (int v = threadIdx.x; v < V; v += kBlock) gt += order_key(x[v]) > cut_k ? 1.0 : 0.0;
    above_k = static_cast<int>(block_sum(gt, sh));
    m_k = top_k - above_k;
    const int lim = tie_limit(x, V, cut_k, m_k, sh);
    if (threadIdx.x == 0) sh.all = false, sh.cut = cut_k, sh.tie_limit = lim;
    __syncthreads();
  }
  if (use_p) {
    // The mass of the top-k set (everything without top-k), then the smallest prefix whose
    // mass reaches top_p of it; the final cut is the shorter of the two prefixes.
    double s = 0;
    for (int v = threadIdx.x; v < V; v += kBlock)
      if (kept(sh, x[v], v)) s += exp_term(x[v], inv_t, mx);
    const double sum_k = block_sum(s, sh);
    const double target = static_cast<double>(top_p) * sum_k;
    const uint32_t cut_p = radix_select(x, V, inv_t, mx, true, target, sh);
    double gt = 0, mass_gt = 0, eq = 0;
    for (int v = threadIdx.x; v < V; v += kBlock) {
      const uint32_t k = order_key(x[v]);
      if (k > cut_p) gt += 1.0, mass_gt += exp_term(x[v], inv_t, mx);
      if (k == cut_p) eq += 1.0;
    }
    const int above_p = static_cast<int>(block_sum(gt, sh));
    mass_gt = block_sum(mass_gt, sh);
    const int ties = static_cast<int>(block_sum(eq, sh));
    const double e = exp_term(key_value(cut_p), inv_t, mx);
    int m_p = static_cast<int>(ceil((target - mass_gt) / e));
    m_p = m_p < 1 ? 1 : (m_p > ties ? ties : m_p);
    const int n_p = above_p + m_p;
    if (!use_k || n_p < top_k) {
      const int lim = tie_limit(x, V, cut_p, m_p, sh);
      if (threadIdx.x == 0) sh.all = false, sh.cut = cut_p, sh.tie_limit = lim;
      __syncthreads();
    }
  }
  double s = 0;
  for (int v = threadIdx.x; v < V; v += kBlock)
    if (kept(sh, x[v], v)) s += exp_term(x[v], inv_t, mx);
  const double total = block_sum(s, sh);
  if (threadIdx.x == 0) sh.log_sum = log(total);
  __syncthreads();
}

// log p(v) after the transform, as a float (spec/sampling.cpp: logp[v]); -inf when cut.
__device__ __forceinline__ float logp_of(const Shared& sh, float logit, int v, float inv_t) {
  if (!kept(sh, logit, v)) return -INFINITY;
  return static_cast<float>(static_cast<double>(logit) * inv_t - sh.mx - sh.log_sum);
}

__device__ __forceinline__ double gumbel(uint64_t seed, int64_t position, uint32_t stream, int v) {
  return -log(-log(philox_uniform(seed, position, stream, static_cast<uint64_t>(v))));
}

struct Params {
  const float* logits;  // [k+1, V]
  const float* q;       // [k, V]
  const int32_t* draft; // [k]
  int k, V;
  float inv_t;
  int top_k;
  float top_p;
  uint64_t seed;
  int64_t position;
  bool greedy, coupled;
  int32_t* out;  // [3 + k + 1]: accepted, bonus, count, tokens
};

__global__ void __launch_bounds__(kBlock) verify_kernel(Params P) {
  __shared__ Shared sh;
  const int V = P.V;
  if (threadIdx.x == 0) sh.accepted = 0, sh.bonus = 0, sh.done = 0;
  __syncthreads();
  int count = 0;
  for (int i = 0; i <= P.k; ++i) {
    const float* x = P.logits + static_cast<int64_t>(i) * V;
    const int64_t pos = P.position + i;
    int chosen = -1;  // the target's token at this row (greedy / coupled), or the final token
    bool accept = false;
    if (P.greedy || P.coupled) {
      Best b;
      if (P.greedy) {
        for (int v = threadIdx.x; v < V; v += kBlock) b.offer(x[v], v);
      } else {
        transform_row(x, V, P.inv_t, P.top_k, P.top_p, sh);
        for (int v = threadIdx.x; v < V; v += kBlock) {
          const float lp = logp_of(sh, x[v], v, P.inv_t);
          if (lp != -INFINITY) b.offer(static_cast<double>(lp) + gumbel(P.seed, pos, kStreamToken, v), v);
        }
      }
      chosen = block_argmax(b.score, b.idx, sh);
      accept = i < P.k && P.draft[i] == chosen;
    } else {
      transform_row(x, V, P.inv_t, P.top_k, P.top_p, sh);
      if (i == P.k) {
        // bonus: Gumbel-max over log p (spec: log_of(p), i.e. logf(expf(logp)))
        Best b;
        for (int v = threadIdx.x; v < V; v += kBlock) {
          const float p = expf(logp_of(sh, x[v], v, P.inv_t));
          if (p > 0.0f) b.offer(static_cast<double>(logf(p)) + gumbel(P.seed, pos, kStreamToken, v), v);
        }
        chosen = block_argmax(b.score, b.idx, sh);
      } else {
        const int t = P.draft[i];
        const float* qi = P.q + static_cast<int64_t>(i) * V;
        const double p_t = expf(logp_of(sh, x[t], t, P.inv_t)), q_t = qi[t];
        const double u = philox_uniform(P.seed, pos, kStreamAccept, 0);
        accept = q_t > 0.0 && u * q_t < p_t;  // accept_draft_token
        if (accept) {
          chosen = t;
        } else {
          // recovered token: Gumbel-max over log max(0, p - q), or over log p when that mass
          // is below kResidualFloor (spec: sample_recovered)
          double m = 0;
          for (int v = threadIdx.x; v < V; v += kBlock) {
            const double r = static_cast<double>(expf(logp_of(sh, x[v], v, P.inv_t))) - qi[v];
            if (r > 0) m += r;
          }
          const bool use_p = block_sum(m, sh) < 1e-7;
          Best b;
          for (int v = threadIdx.x; v < V; v += kBlock) {
            const float p = expf(logp_of(sh, x[v], v, P.inv_t));
            float lr = -INFINITY;
            if (use_p) {
              if (p > 0.0f) lr = logf(p);
            } else {
              const double r = static_cast<double>(p) - qi[v];
              if (r > 0) lr = static_cast<float>(log(r));
            }
            if (lr != -INFINITY) b.offer(static_cast<double>(lr) + gumbel(P.seed, pos, kStreamResidual, v), v);
          }
          chosen = block_argmax(b.score, b.idx, sh);
        }
      }
    }
    if (threadIdx.x == 0) P.out[3 + count] = chosen;
    ++count;
    if (i == P.k) {
      if (threadIdx.x == 0) P.out[1] = 1;
      break;
    }
    if (!accept) break;
    if (threadIdx.x == 0) ++sh.accepted;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    P.out[0] = sh.accepted;
    P.out[2] = count;
    if (count != P.k + 1 || sh.accepted != P.k) P.out[1] = 0;
  }
}

__global__ void philox_kernel(uint64_t seed, int64_t position, uint32_t stream, uint64_t first, int64_t n,
                              double* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = philox_uniform(seed, position, stream, first + static_cast<uint64_t>(i));
}

}  // namespace

DeviceVerdict verify_on_device(CudaOps& ops, const float* target_logits, const float* q,
                               std::span<const int32_t> draft, int64_t vocab, const DeviceSampling& sp,
                               int64_t position) {
  const int k = static_cast<int>(draft.size());
  if (vocab <= 0 || vocab > (int64_t{1} << 30))
    throw std::invalid_argument("verify_on_device: vocabulary of " + std::to_string(vocab));
  for (int32_t t : draft)
    if (t < 0 || t >= vocab)
      throw std::invalid_argument("verify_on_device: draft token " + std::to_string(t) +
                                  " is outside the vocabulary of " + std::to_string(vocab));
  const bool greedy = sp.temperature <= 0.0f;
  if (!greedy && !(sp.top_p > 0.0f && sp.top_p <= 1.0f))
    throw std::invalid_argument("verify_on_device: top_p must be in (0, 1], got " + std::to_string(sp.top_p));
  if (!greedy && !sp.coupled && k > 0 && q == nullptr)
    throw std::invalid_argument("verify_on_device: exact sampling needs the draft's q");

  // [draft tokens | verdict] in one scratch region; the tokens go up, the verdict comes back.
  const size_t bytes = static_cast<size_t>(2 * k + 4) * sizeof(int32_t);
  std::vector<int32_t> host(static_cast<size_t>(2 * k + 4), 0);
  std::copy(draft.begin(), draft.end(), host.begin());
  auto* dev = static_cast<int32_t*>(ops.scratch(CudaOps::Scratch::Verify, bytes));
  auto stream = static_cast<cudaStream_t>(ops.stream());
  SPECULA_CUDA(cudaMemcpyAsync(dev, host.data(), bytes, cudaMemcpyHostToDevice, stream));

  Params P{};
  P.logits = target_logits;
  P.q = q;
  P.draft = dev;
  P.k = k;
  P.V = static_cast<int>(vocab);
  P.inv_t = greedy ? 1.0f : 1.0f / sp.temperature;  // spec/sampling.cpp: float division
  P.top_k = sp.top_k;
  P.top_p = sp.top_p;
  P.seed = sp.seed;
  P.position = position;
  P.greedy = greedy;
  P.coupled = sp.coupled;
  P.out = dev + k;
  verify_kernel<<<1, kBlock, 0, stream>>>(P);
  SPECULA_CUDA_LAUNCHED();
  SPECULA_CUDA(cudaMemcpyAsync(host.data() + k, dev + k, static_cast<size_t>(k + 4) * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, stream));
  SPECULA_CUDA(cudaStreamSynchronize(stream));

  DeviceVerdict v;
  v.accepted = host[k];
  v.bonus = host[k + 1] != 0;
  const int count = host[k + 2];
  v.tokens.assign(host.begin() + k + 3, host.begin() + k + 3 + count);
  return v;
}

std::vector<double> device_philox_uniforms(CudaOps& ops, uint64_t seed, int64_t position, uint32_t stream,
                                           uint64_t first, int64_t count) {
  std::vector<double> out(static_cast<size_t>(count));
  if (count <= 0) return out;
  auto* dev = static_cast<double*>(ops.scratch(CudaOps::Scratch::Verify, out.size() * sizeof(double)));
  auto s = static_cast<cudaStream_t>(ops.stream());
  philox_kernel<<<static_cast<unsigned>((count + 255) / 256), 256, 0, s>>>(seed, position, stream, first, count, dev);
  SPECULA_CUDA_LAUNCHED();
  SPECULA_CUDA(cudaMemcpyAsync(out.data(), dev, out.size() * sizeof(double), cudaMemcpyDeviceToHost, s));
  SPECULA_CUDA(cudaStreamSynchronize(s));
  return out;
}

}  // namespace specula
