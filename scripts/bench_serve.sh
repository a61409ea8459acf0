#!/usr/bin/env bash
# Serving benchmark (issue 5): a specula-load concurrency sweep against `specula serve` on the
# default model with speculation off (--draft none), on (--draft ngram, fixed K) and adaptive
# (--draft ngram --adaptive), and with CONFIGS naming it the trained head adaptive (eagle: --draft
# eagle --adaptive --draft-entropy 2; lookup+eagle: the main job's flags, scripts/main_job.args). Prints one JSON on stdout; per-run JSON and HTML reports and the
# server logs stay in a temporary folder named on stderr.
#
# All servers start first and each concurrency level runs every configuration back to back, so
# load from elsewhere on a shared machine hits the configurations of one level alike; compare
# within a level (the "vs_none" ratios), not across runs.
#
# Settings (environment): SPECULA_BUILD (build dir, default ./build), SPECULA_MODEL,
# PROMPTS (../shared/data/prompts/chat.jsonl), CONCURRENCY ("1 8 32 64"), MAX_TOKENS (64),
# REQUESTS_PER_SESSION (2; at least MIN_REQUESTS=16 requests per run), TEMPERATURE (0: greedy,
# so every configuration generates the same tokens), MAX_BATCH (64: every session runs, none
# queues), THREADS (2), SPEC_K (4), CONFIGS ("none ngram adaptive"; also "eagle", "lookup+eagle").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${SPECULA_BUILD:-$ROOT/build}
CACHE=${SPECULA_CACHE:-$HOME/.cache/specula}
MODEL=${SPECULA_MODEL:-$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf}
PROMPTS=${PROMPTS:-$ROOT/../shared/data/prompts/chat.jsonl}
CONCURRENCY=${CONCURRENCY:-"1 8 32 64"}
MAX_TOKENS=${MAX_TOKENS:-64}
REQUESTS_PER_SESSION=${REQUESTS_PER_SESSION:-2}
MIN_REQUESTS=${MIN_REQUESTS:-16}
TEMPERATURE=${TEMPERATURE:-0}
MAX_BATCH=${MAX_BATCH:-64}
THREADS=${THREADS:-2}
SPEC_K=${SPEC_K:-4}
CONFIGS=${CONFIGS:-"none ngram adaptive"}
log() { printf '[bench_serve] %s\n' "$*" >&2; }

for f in "$BUILD/specula" "$BUILD/specula-load" "$MODEL" "$PROMPTS"; do
  [ -e "$f" ] || { log "missing $f (build with scripts/setup.sh, or set SPECULA_BUILD / SPECULA_MODEL / PROMPTS)"; exit 1; }
done
OUT=$(mktemp -d "${TMPDIR:-/tmp}/bench_serve.XXXXXX")
log "results and server logs in $OUT"

server_flags() {
  case $1 in
    none) echo "--draft none" ;;
    ngram) echo "--draft ngram --spec-k $SPEC_K" ;;
    adaptive) echo "--draft ngram --spec-k $SPEC_K --adaptive" ;;
    eagle) echo "--draft eagle --spec-k $SPEC_K --adaptive --draft-entropy 2" ;;
    lookup+eagle) cat "$ROOT/scripts/main_job.args" ;;
    *) log "unknown configuration '$1' (none, ngram, adaptive, eagle, lookup+eagle)"; exit 2 ;;
  esac
}

declare -A PORT PID
cleanup() {
  for c in "${!PID[@]}"; do kill -TERM "${PID[$c]}" 2>/dev/null || true; done
  for c in "${!PID[@]}"; do wait "${PID[$c]}" 2>/dev/null || true; done
}
trap cleanup EXIT

for c in $CONFIGS; do
  PORT[$c]=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # shellcheck disable=SC2046
  "$BUILD/specula" serve --model "$MODEL" $(server_flags "$c") --host 127.0.0.1 --port "${PORT[$c]}" \
    --threads "$THREADS" --max-batch "$MAX_BATCH" --max-queue 1024 >"$OUT/serve-$c.log" 2>&1 &
  PID[$c]=$!
done
for c in $CONFIGS; do
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:${PORT[$c]}/health" >/dev/null 2>&1 && break
    kill -0 "${PID[$c]}" 2>/dev/null || { log "server '$c' exited:"; cat "$OUT/serve-$c.log" >&2; exit 1; }
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:${PORT[$c]}/health" >/dev/null || { log "server '$c' is not healthy"; exit 1; }
  log "server '$c' ($(server_flags "$c")) on port ${PORT[$c]}"
done

for n in $CONCURRENCY; do
  requests=$((n * REQUESTS_PER_SESSION)); [ "$requests" -ge "$MIN_REQUESTS" ] || requests=$MIN_REQUESTS
  for c in $CONFIGS; do
    log "concurrency $n, $c: $requests requests of up to $MAX_TOKENS tokens"
    rc=0
    "$BUILD/specula-load" --url "ws://127.0.0.1:${PORT[$c]}/v1/ws" --prompts "$PROMPTS" --concurrency "$n" \
      --requests "$requests" --max-tokens "$MAX_TOKENS" --temperature "$TEMPERATURE" --quiet \
      --out "$OUT/$c-$n.json" --report "$OUT/$c-$n.html" >/dev/null || rc=$?
    [ "$rc" -eq 0 ] || [ "$rc" -eq 3 ] || { log "specula-load failed (exit $rc)"; exit 1; }
  done
done

python3 - "$OUT" "$MODEL" "$MAX_TOKENS" "$TEMPERATURE" "$MAX_BATCH" "$THREADS" "$SPEC_K" "$CONCURRENCY" "$CONFIGS" <<'EOF'
import json, os, platform, sys
out, model, max_tokens, temperature, max_batch, threads, spec_k, levels, configs = sys.argv[1:]
levels, configs = [int(x) for x in levels.split()], configs.split()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
runs, table = [], {}
for n in levels:
    for c in configs:
        r = json.load(open(os.path.join(out, f"{c}-{n}.json")))
        s = r["summary"]
        row = {"config": c, "concurrency": n, "requests": s["requests"], "failed": s["failed"],
               "errors_by_kind": {k: v["count"] for k, v in s["errors_by_kind"].items()},
               "output_tokens": s["output_tokens"], "wall_s": round(s["wall_s"], 2),
               "total_tokens_per_s": round(s["total_tokens_per_s"], 1),
               "session_tokens_per_s_p50": round(s["session_tokens_per_s"].get("p50", 0), 1)}
        for m in ("ttft_ms", "itl_ms", "e2e_ms"):
            for q in ("p50", "p99"):
                row[f"{m[:-3]}_{q}_ms"] = round(s[m].get(q, 0), 1)
        a = s["acceptance"]
        row["acceptance_rate"] = None if a["acceptance_rate"] is None else round(a["acceptance_rate"], 3)
        row["mean_accepted_length"] = None if a["mean_accepted_length"] is None else round(a["mean_accepted_length"], 2)
        runs.append(row)
        table[(c, n)] = row
ratios = {}
if "none" in configs:
    for n in levels:
        base = table[("none", n)]["total_tokens_per_s"]
        ratios[str(n)] = {f"{c}_vs_none": round(table[(c, n)]["total_tokens_per_s"] / base, 3) if base else None
                          for c in configs if c != "none"}
print(json.dumps({"bench": "serve", "model": os.path.basename(model), "cpu": cpu, "cores": os.cpu_count(),
                  "max_tokens": int(max_tokens), "temperature": float(temperature), "max_batch": int(max_batch),
                  "threads": int(threads), "spec_k": int(spec_k), "protocol": "websocket",
                  "runs": runs, "throughput_ratios": ratios, "results_dir": out}, indent=1))
EOF
