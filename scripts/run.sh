#!/usr/bin/env bash
# The main job: set up (idempotent), then serve the default model: the chat page, the WebSocket
# protocol and the OpenAI-compatible API on one port (http://127.0.0.1:8080/ unless --port says
# otherwise). The drafter is the one measured best on a CPU (docs/benchmarks.md, Serving): prompt
# lookup where the reply repeats its context's last 3 tokens, and the trained draft head for the
# default model elsewhere (--draft ngram:n=3+eagle, docs/draft.md), each draft up to 4 tokens (5
# for greedy requests) and ended where the product of the draft's probabilities falls below 0.3,
# 0.5 for greedy requests (the confidence rule), and the load-adaptive policy, which drafts only
# where a draft pays (docs/serving.md, "The main job"). The flags live in scripts/main_job.args
# (cluster.sh and the tests read them there). Extra arguments go to `specula serve` and win over
# these (e.g. --port 9000, --draft eagle).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
read -ra MAIN_JOB < scripts/main_job.args
exec "${SPECULA_BUILD:-$PWD/build}/specula" serve "${MAIN_JOB[@]}" "$@"
