// Philox4x32-10 (Salmon et al., SC'11): a counter-based generator. Random numbers are a pure
// function of (key, counter), so a request's draws depend only on its seed and the token
// position, never on what else runs or in which order.
#pragma once
#include <array>
#include <cstdint>

namespace specula {

using PhiloxBlock = std::array<uint32_t, 4>;

// The generator's multipliers, key increments ("Weyl" constants) and rounds; the vector version
// (spec/gumbel_filter_avx2.cpp) uses the same.
namespace philox_constants {
inline constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
inline constexpr int kRounds = 10;
}  // namespace philox_constants

inline PhiloxBlock philox4x32(PhiloxBlock c, uint64_t key) {
  using namespace philox_constants;
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// What a draw is for; each purpose has its own stream so they never share numbers.
enum class RngStream : uint32_t {
  Token = 0,     // Gumbel noise that picks a token from the target distribution
  Accept = 1,    // the uniform of the speculative acceptance test
  Residual = 2,  // Gumbel noise that samples the residual max(0, p - q)
  Draft = 3,     // Gumbel noise of the draft model's own sampling
  // Block verification's (SpecSampling::Block): keyed by the round, not by a token's position
  // (spec/speculative_sampling.h, "Block verification's randomness").
  BlockAccept = 4,  // the round's uniforms, at the position of its first draft token, index j - 1 for u_j
  BlockDraft = 5,   // the draft's noise, at block_draw_position(round start, i)
};

// The four words behind indices 4 * block .. 4 * block + 3 of (seed, position, stream).
inline PhiloxBlock philox_block(uint64_t seed, int64_t position, RngStream stream, uint64_t block) {
  return philox4x32({static_cast<uint32_t>(block), static_cast<uint32_t>(position),
                     static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32), static_cast<uint32_t>(stream)},
                    seed);
}

// A word of philox_block as a uniform in the open interval (0, 1).
inline double philox_word_uniform(uint32_t word) { return (static_cast<double>(word) + 0.5) * (1.0 / 4294967296.0); }

// A uniform in the open interval (0, 1) for (seed, position, stream, index).
inline double philox_uniform(uint64_t seed, int64_t position, RngStream stream, uint64_t index) {
  return philox_word_uniform(philox_block(seed, position, stream, index >> 2)[index & 3]);
}

}  // namespace specula
