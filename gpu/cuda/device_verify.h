// The acceptance step of speculative sampling on the CUDA device (docs/design.md section 1): the
// target's logits [k+1, V] and the draft's q [k, V] stay on the device, and only the verdict
// (accepted count and at most k+1 tokens) crosses to the host. It reproduces spec/'s host rule,
// verify_draft() in spec/speculative_sampling.h, with the same Philox counters: the same
// transform (temperature, top-k, top-p; ties by index), the same acceptance uniform, the same
// Gumbel-max draws for the recovered and bonus tokens. gpu/ cannot depend on spec/, so the
// request's parameters come as plain values here; tests/gpu/device_verify_test.cpp compares
// the two on random inputs.
//
// Where it can differ from the host: the host's top-p cumulative sum runs in sorted order, the
// device's in another, and CUDA's double log/exp may differ from glibc's in the last bit; a
// decision flips only when a comparison sits within rounding of its threshold.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "gpu/device_judge.h"

namespace specula {

class CudaOps;

// target_logits: device [k+1, vocab] raw logits; q: device [k, vocab] draft probabilities after
// the same transform (unused, may be null, for greedy and coupled); draft: host [k] tokens;
// position: the absolute position of t1. Queued on ops' stream; waits for the verdict only.
// Throws std::invalid_argument for a draft token outside the vocabulary or bad parameters.
DeviceVerdict verify_on_device(CudaOps& ops, const float* target_logits, const float* q,
                               std::span<const int32_t> draft, int64_t vocab, const DeviceSampling& sp,
                               int64_t position);

// Test hook: out[i] = philox_uniform(seed, position, stream, first + i) computed on the device.
std::vector<double> device_philox_uniforms(CudaOps& ops, uint64_t seed, int64_t position, uint32_t stream,
                                           uint64_t first, int64_t count);

}  // namespace specula
