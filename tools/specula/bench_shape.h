// `specula bench decode --shape NAME[,NAME]`: decode speed at a published model's exact shape
// with random BF16 weights built in memory (no file), its fraction of the memory roofline
// measured in the same run, and the cost of verifying n tokens relative to one.
#pragma once
#include <string>
#include <vector>

#include "model/weights.h"
#include "tools/specula/args.h"

namespace specula::cli {

// "llama-3.2-1b" or "llama-3.2-3b" (../shared/MODELS.md); throws UsageError for another name.
LlamaConfig shape_config(const std::string& name);

// Random weights at `c`'s shape: every matrix BF16 (uniform, std 0.02), every norm 1.0 F32.
// The matrices' host views share one random buffer (the device copies are distinct), so even
// the 3B shape needs only one embedding-sized host buffer.
//
// With `successor` (a permutation of the vocabulary) the model is built to predict it: the
// output head is untied, head row successor[x] = embedding row x, and the blocks' output
// projections (attn_output, ffn_down) are scaled by 1e-4, so every block still costs its full
// time but the residual stream stays ~ the current token's embedding and greedy decoding
// follows x -> successor[x]. Two models (any hidden sizes) agree exactly where their successor
// maps agree: a draft/target pair with controlled acceptance.
ModelWeights random_bf16_weights(const LlamaConfig& c, uint64_t seed, const std::vector<int32_t>* successor = nullptr);

// Options: --shape, --device, --threads, --prompt-tokens, --decode-tokens, --repeat, --max-verify,
// --spec-pair A[,A...] (acceptances; needs --shape llama-3.2-1b,llama-3.2-3b), --spec-k K.
int bench_decode_shape(const Args& a);

}  // namespace specula::cli
