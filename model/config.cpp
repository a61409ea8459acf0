// Consistency checks on a Llama config and the RoPE inverse frequencies it implies.
#include "model/config.h"

#include <cmath>
#include <numbers>

#include "model/tensor.h"

namespace specula {

namespace {

[[noreturn]] void invalid(const std::string& source, const std::string& what) {
  throw ModelError(source + ": invalid model config: " + what);
}

}  // namespace

void LlamaConfig::validate(const std::string& source) const {
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) invalid(source, std::string(field) + " is " + std::to_string(v) + ", it must be positive");
  };
  positive("vocab_size", vocab_size);
  positive("hidden", hidden);
  positive("intermediate", intermediate);
  positive("layers", layers);
  positive("heads", heads);
  positive("kv_heads", kv_heads);
  positive("head_dim", head_dim);
  positive("max_positions", max_positions);
  if (heads % kv_heads != 0)
    invalid(source, "heads (" + std::to_string(heads) + ") is not a multiple of kv_heads (" + std::to_string(kv_heads) + ")");
  if (head_dim % 2 != 0) invalid(source, "head_dim " + std::to_string(head_dim) + " is odd; RoPE rotates pairs");
  if (!(rope_theta > 0.0f) || !std::isfinite(rope_theta)) invalid(source, "rope_theta " + std::to_string(rope_theta) + " is not a positive number");
  if (!(rms_eps > 0.0f) || !std::isfinite(rms_eps)) invalid(source, "rms_eps " + std::to_string(rms_eps) + " is not a positive number");
  if (!rope_scaling.type.empty()) {
    if (rope_scaling.type != "llama3")
      invalid(source, "rope scaling type '" + rope_scaling.type + "' is not supported (Specula supports llama3)");
    const RopeScaling& s = rope_scaling;
    if (!s.freq_factors.empty()) {
      if (static_cast<int64_t>(s.freq_factors.size()) != head_dim / 2)
        invalid(source, "rope frequency factors have " + std::to_string(s.freq_factors.size()) + " values, expected head_dim/2 = " +
                            std::to_string(head_dim / 2));
      for (float f : s.freq_factors)
        if (!(f > 0.0f) || !std::isfinite(f)) invalid(source, "a rope frequency factor is " + std::to_string(f) + ", not a positive number");
    } else {
      if (!(s.factor > 0.0f)) invalid(source, "rope scaling factor " + std::to_string(s.factor) + " is not positive");
      if (!(s.low_freq_factor > 0.0f) || !(s.high_freq_factor > s.low_freq_factor))
        invalid(source, "rope scaling needs 0 < low_freq_factor < high_freq_factor, got " + std::to_string(s.low_freq_factor) +
                            " and " + std::to_string(s.high_freq_factor));
      positive("rope_scaling.original_max_position", s.original_max_position);
    }
  }
  if (bos_id < -1 || bos_id >= vocab_size)
    invalid(source, "bos_id " + std::to_string(bos_id) + " is outside the vocabulary of " + std::to_string(vocab_size));
  for (int32_t e : eos_ids)
    if (e < 0 || e >= vocab_size)
      invalid(source, "eos id " + std::to_string(e) + " is outside the vocabulary of " + std::to_string(vocab_size));
}

std::vector<float> rope_inv_freq(const LlamaConfig& c) {
  const int64_t half = c.head_dim / 2;
  const RopeScaling& s = c.rope_scaling;
  std::vector<float> out(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // inv_i = theta^(-2i/d), in double so the float result is correctly rounded.
    double inv = std::pow(static_cast<double>(c.rope_theta), -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
    if (s.type == "llama3") {
      if (!s.freq_factors.empty()) {
        inv /= s.freq_factors[static_cast<size_t>(i)];  // GGUF bakes the llama3 divisors into rope_freqs.weight
      } else {
        // transformers' _compute_llama3_parameters: long wavelengths are slowed by `factor`,
        // short ones kept, and the band between blended linearly in old_ctx / wavelength.
        const double wavelen = 2.0 * std::numbers::pi / inv;
        const double old_ctx = static_cast<double>(s.original_max_position);
        const double low_wavelen = old_ctx / s.low_freq_factor;
        const double high_wavelen = old_ctx / s.high_freq_factor;
        if (wavelen > low_wavelen) {
          inv /= s.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          inv = (1.0 - smooth) * inv / s.factor + smooth * inv;
        }
      }
    }
    out[static_cast<size_t>(i)] = static_cast<float>(inv);
  }
  return out;
}

}  // namespace specula
