// `specula bench decode` on a model file (tools/specula/bench_decode.cpp).
#pragma once
#include "tools/specula/args.h"

namespace specula::cli {

// Options: --model, --device, --threads, --contexts (128,1024,4096), --decode-tokens (64),
// --repeat (3), --max-verify (16), --paths (fast,reference), --agreement on|off, --prompts FILE,
// --agreement-tokens (64).
int bench_decode(const Args& a);

}  // namespace specula::cli
