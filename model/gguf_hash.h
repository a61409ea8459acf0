// The hash that ties a trained draft head to the target it was trained for (docs/draft.md,
// "Target hash"): sha256 over every tensor of a GGUF file in its tensor-info order, of
//   u64 name length | name | u32 n_dims | u64 dims (innermost first) | u32 ggml type | u64 n_bytes | data
// all little-endian. Metadata is not hashed.
#pragma once
#include <string>

#include "model/gguf.h"

namespace specula {

// Lower-case hex. One pass over the weights (about 0.1 s per 100 MB with SHA-NI).
std::string gguf_tensor_hash(const GgufFile& f);

}  // namespace specula
