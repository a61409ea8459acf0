// What a device that judges a round where the logits are (docs/design.md section 1) takes and
// gives back: the request's sampling as plain values (gpu/ cannot depend on spec/) and the
// verdict, the only thing that crosses to the host. The CUDA device implements it
// (gpu/cuda/device_verify.h); the host judges in spec/ on the host logits.
#pragma once
#include <cstdint>
#include <vector>

namespace specula {

struct DeviceSampling {
  float temperature = 1.0f;  // <= 0: greedy (accept while argmax p == t_i)
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  uint64_t seed = 0;
  bool coupled = false;      // SpecSampling::Coupled: accept while t_i == the target's own Gumbel draw
};

struct DeviceVerdict {
  int accepted = 0;             // n draft tokens kept
  std::vector<int32_t> tokens;  // [n + 1]: t1..tn, then the recovered or bonus token
  bool bonus = false;           // all k were accepted and the last token is the bonus token
};

}  // namespace specula
